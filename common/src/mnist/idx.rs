//! idx files (LeCun's format for MNIST and Fashion-MNIST), plain or gzipped. A header of
//! two zero bytes, a type code (0x08: unsigned bytes, the only one these data sets use) and
//! the number of dimensions, then each dimension as a big-endian u32, then the values.
//! Images are 3-dimensional (count, rows, columns), labels 1-dimensional (count).
//!
//! Every way a file can be wrong is one `Input` error naming the file: a bad magic, a
//! dimension count other than expected, a size that disagrees with the header, a label
//! outside 0..classes, images and labels of different counts. Nothing is allocated from the
//! header's word alone: sizes are checked against the bytes actually there, and a gzipped
//! file is inflated no further than its header allows (so a small file cannot claim gigabytes).

use crate::bail_input;
use crate::error::{io_err, Result};
use std::io::Read;
use std::path::Path;

/// The largest file, inflated, this reader accepts (the MNIST training images are 47 MB).
pub const MAX_BYTES: u64 = 1 << 28;

/// Unsigned-byte values, the only type code MNIST's files use.
const UBYTE: u8 = 0x08;

/// `count` images of `rows` × `cols` pixels, row-major, one byte each.
#[derive(Clone, Debug, PartialEq)]
pub struct Images {
    pub count: usize,
    pub rows: usize,
    pub cols: usize,
    pub pixels: Vec<u8>,
}

impl Images {
    /// Pixels per image (the MLP's input width).
    pub fn size(&self) -> usize {
        self.rows * self.cols
    }
}

/// The images of an idx file (`.gz` or not).
pub fn read_images(path: &Path) -> Result<Images> {
    parse_images(&path.display().to_string(), &read_file(path)?)
}

/// The labels of an idx file (`.gz` or not), each below `classes`.
pub fn read_labels(path: &Path, classes: usize) -> Result<Vec<u8>> {
    parse_labels(&path.display().to_string(), &read_file(path)?, classes)
}

/// The file's bytes, inflated when they start with gzip's magic (1f 8b): no further than the
/// idx header inside claims (plus one byte, so that trailing data shows), and never past
/// [`MAX_BYTES`]. A regular file only (a FIFO would wait for a writer, a device never end), its
/// size checked before it is read.
fn read_file(path: &Path) -> Result<Vec<u8>> {
    let name = path.display();
    crate::input::refuse_special(path, "an idx file")?;
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    if len > MAX_BYTES {
        bail_input!("{name}: {len} bytes is larger than an idx file can be here ({MAX_BYTES})");
    }
    // The file may grow while it is read: never past the limit.
    let mut raw = Vec::with_capacity(len as usize);
    file.take(MAX_BYTES + 1).read_to_end(&mut raw).map_err(io_err(path))?;
    if raw.len() as u64 > MAX_BYTES {
        bail_input!("{name}: grew past {MAX_BYTES} bytes while it was read");
    }
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let mut gz = flate2::read::GzDecoder::new(&raw[..]);
    let mut out = Vec::new();
    let mut inflate = |out: &mut Vec<u8>, n: u64| match (&mut gz).take(n).read_to_end(out) {
        Ok(_) => Ok(()),
        Err(e) => Err(crate::Error::Input(format!("{name}: not a valid gzip file ({e})"))),
    };
    inflate(&mut out, 4)?;
    if out.len() == 4 {
        let header = 4 * out[3] as u64;
        inflate(&mut out, header)?;
    }
    let dims = if out.len() >= 4 { out[3] as usize } else { 0 };
    let claimed = if out.len() == 4 + 4 * dims {
        let values = (0..dims)
            .map(|i| u32::from_be_bytes(out[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as u128)
            .product::<u128>();
        out.len() as u128 + values
    } else {
        out.len() as u128 // a short header: `header` says so
    };
    if claimed > MAX_BYTES as u128 {
        bail_input!("{name}: the idx header claims {claimed} bytes, more than an idx file can be here ({MAX_BYTES})");
    }
    let rest = claimed as u64 + 1 - out.len() as u64;
    inflate(&mut out, rest)?;
    Ok(out)
}

/// The dimensions of an idx header with `dims` dimensions of unsigned bytes, and where the
/// values start; checks that exactly their product of bytes follows.
fn header(name: &str, bytes: &[u8], dims: usize, what: &str) -> Result<(Vec<usize>, usize)> {
    if bytes.len() < 4 {
        bail_input!("{name}: {} bytes is too short for an idx header", bytes.len());
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        bail_input!(
            "{name}: bad idx magic {:02x} {:02x} (expected 00 00): not an idx file",
            bytes[0],
            bytes[1]
        );
    }
    if bytes[2] != UBYTE {
        bail_input!(
            "{name}: idx type code {:#04x}; MNIST's files hold unsigned bytes ({UBYTE:#04x})",
            bytes[2]
        );
    }
    if bytes[3] as usize != dims {
        bail_input!(
            "{name}: {} dimensions where {what} have {dims}: is this the {} file?",
            bytes[3],
            if dims == 1 { "images" } else { "labels" }
        );
    }
    let start = 4 + 4 * dims;
    if bytes.len() < start {
        bail_input!(
            "{name}: {} bytes is too short for the header of {dims} dimensions",
            bytes.len()
        );
    }
    let shape: Vec<usize> = (0..dims)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize)
        .collect();
    // u32s: their product fits u128, and is checked against the bytes there before any use.
    let expected = shape.iter().map(|&d| d as u128).product::<u128>();
    let actual = (bytes.len() - start) as u128;
    if expected != actual {
        let dims_text: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        bail_input!(
            "{name}: the header says {} ({expected} bytes of values), but {actual} bytes follow it",
            dims_text.join(" x ")
        );
    }
    Ok((shape, start))
}

/// Images from an idx file's bytes; `name` names it in errors.
pub fn parse_images(name: &str, bytes: &[u8]) -> Result<Images> {
    let (shape, start) = header(name, bytes, 3, "images")?;
    let (count, rows, cols) = (shape[0], shape[1], shape[2]);
    if count == 0 || rows == 0 || cols == 0 {
        bail_input!("{name}: {count} images of {rows} x {cols} pixels: nothing to train on");
    }
    Ok(Images {
        count,
        rows,
        cols,
        pixels: bytes[start..].to_vec(),
    })
}

/// Labels from an idx file's bytes, each below `classes`; `name` names it in errors.
pub fn parse_labels(name: &str, bytes: &[u8], classes: usize) -> Result<Vec<u8>> {
    let (_, start) = header(name, bytes, 1, "labels")?;
    let labels = &bytes[start..];
    if let Some((i, &l)) = labels.iter().enumerate().find(|(_, &l)| l as usize >= classes) {
        bail_input!("{name}: label {l} at index {i} is outside the {classes} classes");
    }
    Ok(labels.to_vec())
}

/// An idx file of unsigned bytes: `dims` then `values` (the inverse of the readers, for
/// tests and made-up data sets; a shape that disagrees with the values is written as asked).
pub fn encode(dims: &[u32], values: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0, 0, UBYTE, dims.len() as u8];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(values);
    bytes
}

/// Images and labels that belong together: the same count.
pub fn check_pair(images: &Images, labels: &[u8], what: &str) -> Result<()> {
    if images.count != labels.len() {
        bail_input!(
            "{what}: {} images but {} labels: the files do not belong together",
            images.count,
            labels.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use encode as idx;

    fn input_error(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(crate::Error::Input(msg)) => {
                assert_eq!(msg.lines().count(), 1, "one line: {msg}");
                msg
            }
            other => panic!("expected an input error, got {other:?}"),
        }
    }

    #[test]
    fn images_and_labels_read_back() {
        let pixels: Vec<u8> = (0..2 * 3 * 4).map(|i| i as u8).collect();
        let images = parse_images("x", &idx(&[2, 3, 4], &pixels)).unwrap();
        assert_eq!((images.count, images.rows, images.cols, images.size()), (2, 3, 4, 12));
        assert_eq!(images.pixels, pixels);
        assert_eq!(parse_labels("y", &idx(&[3], &[0, 9, 4]), 10).unwrap(), vec![0, 9, 4]);
        check_pair(&images, &[1, 2], "pair").unwrap();
    }

    #[test]
    fn gzipped_files_read_like_plain_ones() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("idx-gz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = idx(&[4], &[1, 2, 3, 4]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&plain).unwrap();
        let path = dir.join("labels.gz");
        std::fs::write(&path, gz.finish().unwrap()).unwrap();
        assert_eq!(read_labels(&path, 10).unwrap(), vec![1, 2, 3, 4]);
        // A small gzip whose header claims gigabytes is refused before it is inflated.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&idx(&[60_000, 28_000, 28_000], &[0; 16])).unwrap();
        let huge = dir.join("huge.gz");
        std::fs::write(&huge, gz.finish().unwrap()).unwrap();
        assert!(input_error(read_images(&huge)).contains("claims"));
        let bad = dir.join("bad.gz");
        std::fs::write(&bad, [0x1f, 0x8b, 1, 2, 3]).unwrap();
        assert!(input_error(read_labels(&bad, 10)).contains("not a valid gzip file"));
        let missing = input_error_or_io(read_labels(&dir.join("none"), 10));
        assert!(missing.contains("none"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn input_error_or_io(r: Result<Vec<u8>>) -> String {
        r.expect_err("must fail").to_string()
    }

    #[test]
    fn every_malformed_header_is_one_line() {
        let good = idx(&[2, 2, 2], &[0; 8]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "too short"),
            (vec![1, 0, 8, 3], "bad idx magic"),
            (vec![0, 0, 0x0d, 3], "type code"),
            (idx(&[8], &[0; 8]), "1 dimensions where images have 3"),
            (good[..10].to_vec(), "too short for the header"),
            (idx(&[2, 2, 2], &[0; 7]), "but 7 bytes follow"),
            (idx(&[2, 2, 2], &[0; 9]), "but 9 bytes follow"),
            (idx(&[u32::MAX, u32::MAX, u32::MAX], &[0; 8]), "but 8 bytes follow"),
            (idx(&[0, 28, 28], &[]), "nothing to train on"),
        ];
        for (bytes, needle) in cases {
            let msg = input_error(parse_images("f.idx", &bytes));
            assert!(msg.contains(needle) && msg.starts_with("f.idx: "), "{needle}: {msg}");
        }
        let msg = input_error(parse_labels("l.idx", &idx(&[3], &[0, 10, 2]), 10));
        assert!(msg.contains("label 10 at index 1 is outside the 10 classes"), "{msg}");
        let msg = input_error(parse_labels("l.idx", &good, 10));
        assert!(msg.contains("is this the images file?"), "{msg}");
        let images = parse_images("i", &good).unwrap();
        assert!(input_error(check_pair(&images, &[1, 2, 3], "train").map(|_| ())).contains("2 images but 3 labels"));
    }

    proptest! {
        // Arbitrary bytes, and valid files with bytes flipped or cut: never a panic, never an
        // allocation beyond the input, and an accepted file always matches its header.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(images) = parse_images("p", &bytes) {
                prop_assert_eq!(images.pixels.len(), images.count * images.size());
            }
            if let Ok(labels) = parse_labels("p", &bytes, 10) {
                prop_assert!(labels.iter().all(|&l| l < 10));
            }
        }

        #[test]
        fn damaged_files_are_refused_or_consistent(at in 0usize..40, value in any::<u8>(), cut in 0usize..40) {
            let mut bytes = idx(&[2, 3, 4], &[7; 24]);
            let at = at % bytes.len();
            bytes[at] = value;
            bytes.truncate(bytes.len() - cut % bytes.len());
            if let Ok(images) = parse_images("p", &bytes) {
                prop_assert_eq!(images.pixels.len(), images.count * images.size());
            }
        }
    }
}
