//! The file layout that GPT-2's checkpoints ([`crate::checkpoint`]) and the MLP's
//! ([`crate::mnist::checkpoint`]) share, written and read here, and the kinds of file that
//! use it, each known by its magic ([`GPT2`], [`MLP`]): a file of one kind given where
//! another is read is named as what it is.
//!
//! ```text
//! offset  size      field (all integers little-endian)
//! 0       8         magic: the kind of file
//! 8       4         u32 format version (the kind's)
//! 12      4         u32 reserved (0)
//! 16      8         u64 meta length L
//! 24      L         JSON metadata (the kind's)
//! 24+L    8         u64 value count N
//! 32+L    4N × k    k arrays of N f32 (the kind says how many)
//!         8         u64 xxHash64 (seed 0) of every byte above
//! ```

use crate::atomic_file;
use crate::error::{io_err, Error, Result};
use serde::de::DeserializeOwned;
use std::fmt::Display;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use xxhash_rust::xxh64::{xxh64, Xxh64};

// The arrays are written as the machine's own bytes (no per-element conversion), which is
// the little-endian layout the format promises only on little-endian machines.
#[cfg(not(target_endian = "little"))]
compile_error!("the checkpoint formats store f32 arrays as raw little-endian bytes");

/// A kind of file in this layout: its magic and version, and how errors name it.
pub struct Kind {
    pub magic: [u8; 8],
    /// The format version this build writes and reads (no other).
    pub version: u32,
    /// The file, in errors: "checkpoint".
    file: &'static str,
    /// The same with its article: "a checkpoint".
    a_file: &'static str,
    /// The model it holds, with its article, where it is given for another kind: "a GPT-2".
    a_model: &'static str,
    /// The subcommand that writes it.
    writer: &'static str,
    /// Whether an error for an unknown magic shows the bytes found.
    shows_found: bool,
}

/// GPT-2's checkpoints (`train` writes them). Version 1 (FNV-1a checksum) is refused: its
/// checksum missed paired bit flips.
pub const GPT2: Kind = Kind {
    magic: *b"GPT2RSCK",
    version: 2,
    file: "checkpoint",
    a_file: "a checkpoint",
    a_model: "a GPT-2",
    writer: "train",
    shows_found: true,
};

/// The MLP's checkpoints (`mnist` writes them).
pub const MLP: Kind = Kind {
    magic: *b"GPT2MLPK",
    version: 1,
    file: "MLP checkpoint",
    a_file: "an MLP checkpoint",
    a_model: "an MLP",
    writer: "mnist",
    shows_found: false,
};

/// Every kind of file in this layout.
const KINDS: [&Kind; 2] = [&GPT2, &MLP];

/// Magic, version, reserved and meta length.
pub const HEADER_LEN: u64 = 24;
/// Large enough that the big arrays are read in few system calls.
const IO_BUF: usize = 1 << 20;

/// Writes, atomically (see [`crate::atomic_file`]: a crash leaves the old file or the new
/// one), a file of `kind`: its metadata's `json`, the value count `n` and the `arrays` (n f32
/// each), with the checksum. Returns the time its syncs to disk took.
pub fn write(path: &Path, kind: &Kind, json: &[u8], n: usize, arrays: &[&[f32]]) -> Result<std::time::Duration> {
    atomic_file::write_timed(path, |file| {
        let mut out = HashingWriter {
            inner: file,
            sum: Xxh64::new(0),
        };
        let mut header = Vec::with_capacity(HEADER_LEN as usize);
        header.extend_from_slice(&kind.magic);
        header.extend_from_slice(&kind.version.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.put(&header)?;
        out.put(json)?;
        out.put(&(n as u64).to_le_bytes())?;
        for array in arrays {
            out.put(bytemuck::cast_slice(array))?;
        }
        let sum = out.sum.digest();
        out.inner.write_all(&sum.to_le_bytes())
    })
}

/// A file of `kind` read whole ([`parse`]): the metadata, the value count, and the arrays'
/// bytes (their length unchecked: the kind knows how many arrays it holds).
pub struct Parts<'a, M> {
    pub meta: M,
    pub count: u64,
    pub arrays: &'a [u8],
}

/// A file of `kind` from its `bytes` (`path` names it in errors), checked in this order: the
/// magic and the version, the length of an empty file, the checksum, the metadata's length,
/// the metadata (JSON of `M`).
pub fn parse<'a, M: DeserializeOwned>(bytes: &'a [u8], kind: &Kind, path: &Path) -> Result<Parts<'a, M>> {
    let shown = path.display();
    check_start(kind, &bytes[..bytes.len().min(12)], &shown)?;
    let len = bytes.len() as u64;
    if len < HEADER_LEN + 8 + 8 {
        return Err(truncated(&shown, HEADER_LEN + 16, len));
    }
    let (body, stored) = bytes.split_at(bytes.len() - 8);
    if xxh64(body, 0) != u64::from_le_bytes(stored.try_into().unwrap()) {
        return Err(corrupt(&shown));
    }
    let meta_len = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    let arrays_at = HEADER_LEN.saturating_add(meta_len).saturating_add(8);
    if arrays_at > body.len() as u64 {
        return Err(truncated(&shown, arrays_at.saturating_add(8), len));
    }
    let (at, header) = (arrays_at as usize, HEADER_LEN as usize);
    let meta = parse_meta(&body[header..at - 8], &shown)?;
    Ok(Parts {
        meta,
        count: u64::from_le_bytes(body[at - 8..at].try_into().unwrap()),
        arrays: &body[at..],
    })
}

/// A file of `kind` opened to be read in order ([`open`]; GPT-2's arrays run to gigabytes):
/// the metadata and the value count read and checked, the arrays next.
pub struct Stream<M> {
    pub meta: M,
    pub count: u64,
    /// The file's length in bytes.
    pub file_len: u64,
    /// Where the arrays start: the bytes before them.
    pub arrays_at: u64,
    input: HashingReader,
}

/// Opens the file of `kind` at `path` and reads its start, checked in this order: the magic
/// and the version, the header's length, the metadata's length (with the value count's
/// against the file's), the metadata (JSON of `M`). The checksum is checked once the arrays
/// are read ([`Stream::read_arrays`]).
pub fn open<M: DeserializeOwned>(path: &Path, kind: &Kind) -> Result<Stream<M>> {
    let shown = path.display();
    crate::input::refuse_special(path, "a checkpoint file")?;
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::bail_input!("{shown}: no such checkpoint file")
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    let file_len = file.metadata().map_err(io_err(path))?.len();
    let mut input = HashingReader {
        inner: BufReader::with_capacity(IO_BUF, file),
        sum: Xxh64::new(0),
    };
    // Judge magic and version on whatever is there, so a short foreign file is called foreign.
    let mut header = [0u8; HEADER_LEN as usize];
    let got = file_len.min(HEADER_LEN) as usize;
    input.take(&mut header[..got]).map_err(io_err(path))?;
    check_start(kind, &header[..got.min(12)], &shown)?;
    if got < HEADER_LEN as usize {
        return Err(truncated(&shown, HEADER_LEN, file_len));
    }
    let meta_len = u64::from_le_bytes(header[16..24].try_into().unwrap());
    // Meta plus the value count must fit before anything is allocated from meta_len.
    let arrays_at = HEADER_LEN.saturating_add(meta_len).saturating_add(8);
    if arrays_at > file_len {
        return Err(truncated(&shown, arrays_at, file_len));
    }
    let mut json = vec![0u8; meta_len as usize];
    input.take(&mut json).map_err(io_err(path))?;
    let mut count = [0u8; 8];
    input.take(&mut count).map_err(io_err(path))?;
    Ok(Stream {
        meta: parse_meta(&json, &shown)?,
        count: u64::from_le_bytes(count),
        file_len,
        arrays_at,
        input,
    })
}

impl<M> Stream<M> {
    /// Reads the arrays (each filling its slice) and the checksum, which must match every
    /// byte of the file before it. `path` names the file in errors.
    pub fn read_arrays(&mut self, arrays: &mut [&mut [f32]], path: &Path) -> Result<()> {
        for array in arrays {
            self.input.take(bytemuck::cast_slice_mut(array)).map_err(io_err(path))?;
        }
        let computed = self.input.sum.digest();
        let mut stored = [0u8; 8];
        self.input.inner.read_exact(&mut stored).map_err(io_err(path))?;
        match u64::from_le_bytes(stored) == computed {
            true => Ok(()),
            false => Err(corrupt(&path.display())),
        }
    }
}

/// The first value of the named `arrays` that is not finite, described (`params[7] = NaN`).
pub fn first_non_finite<'a>(arrays: impl IntoIterator<Item = (&'a str, &'a [f32])>) -> Option<String> {
    arrays.into_iter().find_map(|(name, a)| {
        let i = a.iter().position(|x| !x.is_finite())?;
        Some(format!("{name}[{i}] = {}", a[i]))
    })
}

/// Refuses a file whose named `arrays` hold a value that is not finite: a diverged model.
pub fn check_finite<'a>(arrays: impl IntoIterator<Item = (&'a str, &'a [f32])>, path: &Path) -> Result<()> {
    match first_non_finite(arrays) {
        Some(bad) => crate::bail_input!(
            "{}: checkpoint holds {bad}: refusing to load a diverged model",
            path.display()
        ),
        None => Ok(()),
    }
}

/// Checks a file's first bytes (`seen`, up to 12: fewer where the file is shorter) for
/// `kind`: the magic (another kind's is named as such) and, where there, the version.
fn check_start(kind: &Kind, seen: &[u8], shown: &dyn Display) -> Result<()> {
    let magic = &seen[..seen.len().min(8)];
    if magic != &kind.magic[..magic.len()] {
        let expected = kind.magic.escape_ascii();
        match KINDS.iter().find(|other| other.magic[..] == *magic) {
            Some(other) => crate::bail_input!(
                "{shown}: {} checkpoint (`{}` writes it), not {} one",
                other.a_model,
                other.writer,
                kind.a_model
            ),
            None if kind.shows_found => crate::bail_input!(
                "{shown}: not {} (expected magic \"{expected}\", found \"{}\")",
                kind.a_file,
                magic.escape_ascii()
            ),
            None => crate::bail_input!("{shown}: not {} (expected magic \"{expected}\")", kind.a_file),
        }
    }
    if seen.len() >= 12 {
        let version = u32::from_le_bytes(seen[8..12].try_into().unwrap());
        if version != kind.version {
            crate::bail_input!(
                "{shown}: unsupported {} format version {version} (this build reads version {})",
                kind.file,
                kind.version
            );
        }
    }
    Ok(())
}

fn parse_meta<M: DeserializeOwned>(json: &[u8], shown: &dyn Display) -> Result<M> {
    serde_json::from_slice(json).map_err(|e| Error::Input(format!("{shown}: checkpoint metadata is invalid: {e}")))
}

fn truncated(shown: &dyn Display, at_least: u64, found: u64) -> Error {
    Error::Input(format!(
        "{shown}: checkpoint is truncated (expected at least {at_least} bytes, found {found})"
    ))
}

fn corrupt(shown: &dyn Display) -> Error {
    Error::Input(format!(
        "{shown}: checkpoint is corrupt (its checksum does not match its contents)"
    ))
}

struct HashingWriter<'a> {
    inner: &'a mut BufWriter<File>,
    sum: Xxh64,
}

impl HashingWriter<'_> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(bytes)?;
        self.sum.update(bytes);
        Ok(())
    }
}

struct HashingReader {
    inner: BufReader<File>,
    sum: Xxh64,
}

impl HashingReader {
    fn take(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact(buf)?;
        self.sum.update(buf);
        Ok(())
    }
}
