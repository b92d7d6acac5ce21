//! The MLP workload's data: a training and a test set of images with their labels, read by
//! rank 0 from idx files (the flags', or Debian's `dataset-fashion-mnist`) and sent to every
//! rank, and the batches an epoch cuts from them.

use super::idx::{self, Images};
use crate::comm::{from_root, Comm};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Classes of MNIST and Fashion-MNIST: labels are 0..CLASSES.
pub const CLASSES: usize = 10;

/// Where Debian's `dataset-fashion-mnist` puts its files (`make run-mnist` installs it).
pub const DEBIAN_DIR: &str = "/usr/share/datasets/fashion-mnist";
/// Test hook: look for the package's files here instead of [`DEBIAN_DIR`].
pub const DIR_VAR: &str = "GPT2RS_FASHION_MNIST_DIR";

/// Images and their labels (the same count).
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    pub images: Images,
    pub labels: Vec<u8>,
}

/// The four files of a run: training images and labels, test images and labels.
pub struct Files {
    pub train: (PathBuf, PathBuf),
    pub test: (PathBuf, PathBuf),
    /// Where the files were looked for when no flag named them (Debian's package).
    pub package_dir: Option<PathBuf>,
}

impl Files {
    /// The files `given` (training images and labels, test images and labels), or else the
    /// Debian package's.
    pub fn new(given: Option<&[PathBuf; 4]>) -> Files {
        if let Some([a, b, c, d]) = given {
            return Files {
                train: (a.clone(), b.clone()),
                test: (c.clone(), d.clone()),
                package_dir: None,
            };
        }
        let dir = PathBuf::from(std::env::var_os(DIR_VAR).unwrap_or_else(|| DEBIAN_DIR.into()));
        let file = |name: &str| dir.join(format!("{name}-ubyte.gz"));
        Files {
            train: (file("train-images-idx3"), file("train-labels-idx1")),
            test: (file("t10k-images-idx3"), file("t10k-labels-idx1")),
            package_dir: Some(dir),
        }
    }

    /// An Input error saying what to do when the package's files are not there.
    fn check_package(&self) -> Result<()> {
        match &self.package_dir {
            Some(dir) if !self.train.0.exists() => Err(Error::Input(format!(
                "no --train-images given and Fashion-MNIST is not in {}: run `make run-mnist` \
                 (it installs Debian's dataset-fashion-mnist and trains on it), or give the four idx files",
                dir.display()
            ))),
            _ => Ok(()),
        }
    }
}

impl Dataset {
    /// Reads and checks an images file and its labels file.
    pub fn read(images: &Path, labels: &Path) -> Result<Dataset> {
        let set = Dataset {
            images: idx::read_images(images)?,
            labels: idx::read_labels(labels, CLASSES)?,
        };
        let what = format!("{} and {}", images.display(), labels.display());
        idx::check_pair(&set.images, &set.labels, &what)?;
        Ok(set)
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The images `rows` as pixels scaled to [0, 1] (appended to `pixels`) and their labels
    /// (to `labels`).
    pub fn gather(&self, rows: &[usize], pixels: &mut Vec<f32>, labels: &mut Vec<i32>) {
        let size = self.images.size();
        for &r in rows {
            let image = &self.images.pixels[r * size..(r + 1) * size];
            pixels.extend(image.iter().map(|&p| p as f32 / 255.0));
            labels.push(self.labels[r] as i32);
        }
    }

    /// count, rows, cols (u32 little-endian), pixels, labels: how rank 0 sends it.
    fn to_bytes(&self) -> Vec<u8> {
        let im = &self.images;
        let mut out: Vec<u8> = [im.count, im.rows, im.cols]
            .iter()
            .flat_map(|&d| (d as u32).to_le_bytes())
            .collect();
        out.extend_from_slice(&im.pixels);
        out.extend_from_slice(&self.labels);
        out
    }

    fn from_bytes(bytes: &[u8]) -> Result<Dataset> {
        let bad = || Error::Device(format!("the data set from rank 0 is malformed ({} bytes)", bytes.len()));
        let dim = |i: usize| -> Result<usize> {
            let b = bytes.get(4 * i..4 * i + 4).ok_or_else(bad)?;
            Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        };
        let (count, rows, cols) = (dim(0)?, dim(1)?, dim(2)?);
        let pixels = count * rows * cols;
        if bytes.len() != 12 + pixels + count {
            return Err(bad());
        }
        Ok(Dataset {
            images: Images {
                count,
                rows,
                cols,
                pixels: bytes[12..12 + pixels].to_vec(),
            },
            labels: bytes[12 + pixels..].to_vec(),
        })
    }
}

/// The training and test sets: rank 0 reads and checks the files, every rank receives them
/// (a bad file fails every rank together, with rank 0's message).
pub fn load(comm: &dyn Comm, files: &Files) -> Result<(Dataset, Dataset)> {
    let mut sets = Vec::with_capacity(2);
    for (images, labels) in [&files.train, &files.test] {
        let bytes = from_root(comm, || {
            files.check_package()?;
            Ok(Dataset::read(images, labels)?.to_bytes())
        })?;
        sets.push(Dataset::from_bytes(&bytes)?);
    }
    let test = sets.pop().expect("two sets");
    let train = sets.pop().expect("two sets");
    if test.images.size() != train.images.size() {
        let e = Error::Input(format!(
            "the test images are {} x {} pixels but the training images {} x {}: the files do not belong together",
            test.images.rows, test.images.cols, train.images.rows, train.images.cols
        ));
        return Err(e.on_every_rank()); // every rank has both sets
    }
    Ok((train, test))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_set_travels_as_bytes_and_gathers_scaled_pixels() {
        let set = Dataset {
            images: Images {
                count: 3,
                rows: 1,
                cols: 2,
                pixels: vec![0, 255, 51, 102, 7, 8],
            },
            labels: vec![4, 0, 9],
        };
        assert_eq!(Dataset::from_bytes(&set.to_bytes()).unwrap(), set);
        assert!(Dataset::from_bytes(&set.to_bytes()[..13]).is_err());
        let (mut pixels, mut labels) = (Vec::new(), Vec::new());
        set.gather(&[1, 0], &mut pixels, &mut labels);
        assert_eq!(pixels, vec![0.2, 0.4, 0.0, 1.0]);
        assert_eq!(labels, vec![0, 4]);
    }
}
