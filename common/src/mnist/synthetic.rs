//! Made-up data sets of MNIST's form, for tests and speed figures where the real files are
//! not at hand: each class brightens its own band of rows and columns over noise, so an MLP
//! learns them in a few epochs. Deterministic from a seed.

use super::data::{Dataset, CLASSES};
use super::idx::{self, Images};
use crate::error::{io_err, Result};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::path::Path;

/// `count` images of `side` × `side` pixels with labels cycling through the classes in a
/// seeded order. Class c lights row band c and column band c (bands of side / 10 pixels,
/// at least one), each pixel with noise.
pub fn dataset(count: usize, side: usize, seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let band = (side / CLASSES).max(1);
    let lit = |c: usize, i: usize| (i / band) % CLASSES == c;
    let mut pixels = Vec::with_capacity(count * side * side);
    let mut labels = Vec::with_capacity(count);
    for _ in 0..count {
        let c = (rng.next_u32() % CLASSES as u32) as usize;
        for r in 0..side {
            for col in 0..side {
                let noise = (rng.next_u32() % 96) as u8;
                let signal = if lit(c, r) || lit(c, col) { 140 } else { 0 };
                pixels.push(noise + signal);
            }
        }
        labels.push(c as u8);
    }
    Dataset {
        images: Images {
            count,
            rows: side,
            cols: side,
            pixels,
        },
        labels,
    }
}

/// Writes `set` as two idx files, gzipped when the name ends in `.gz`.
pub fn write_idx(set: &Dataset, images: &Path, labels: &Path) -> Result<()> {
    let im = &set.images;
    let dims = [im.count as u32, im.rows as u32, im.cols as u32];
    write(images, &idx::encode(&dims, &im.pixels))?;
    write(labels, &idx::encode(&[set.labels.len() as u32], &set.labels))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    let bytes = if path.extension().is_some_and(|e| e == "gz") {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(bytes).and_then(|_| gz.finish()).map_err(io_err(path))?
    } else {
        bytes.to_vec()
    };
    std::fs::write(path, bytes).map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_up_set_reads_back_from_its_files_plain_or_gzipped() {
        let set = dataset(30, 12, 5);
        assert_eq!(set, dataset(30, 12, 5));
        assert!(set.labels.iter().all(|&l| (l as usize) < CLASSES));
        let dir = std::env::temp_dir().join(format!("mnist-synthetic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (im, lb) in [("i.idx", "l.idx"), ("i.gz", "l.gz")] {
            let (im, lb) = (dir.join(im), dir.join(lb));
            write_idx(&set, &im, &lb).unwrap();
            assert_eq!(Dataset::read(&im, &lb).unwrap(), set);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
