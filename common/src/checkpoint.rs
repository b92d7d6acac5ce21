//! Checkpoints: everything needed to continue a training run exactly (config, parameters,
//! AdamW moments, step, data cursor, run settings) in one versioned, checksummed file that
//! is replaced atomically, so a crash mid-save never costs the previous checkpoint.
//!
//! ```text
//! offset  size      field (all integers little-endian)
//! 0       8         magic b"GPT2RSCK"
//! 8       4         u32 format version (1)
//! 12      4         u32 reserved (0)
//! 16      8         u64 meta length L
//! 24      L         CheckpointMeta as JSON
//! 24+L    8         u64 parameter count N (= ParamLayout::new(&meta.config).total)
//! 32+L    4N        params  f32
//!         4N        m       f32 (AdamW first moment)
//!         4N        v       f32 (AdamW second moment)
//!         8         u64 checksum of every byte above (see `Checksum`)
//! ```

use crate::error::{io_err, Error, Result};
use crate::model::{ModelConfig, ParamLayout};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

// The arrays are written as the machine's own bytes (no per-element conversion), which is
// the little-endian layout the format promises only on little-endian machines.
#[cfg(not(target_endian = "little"))]
compile_error!("the checkpoint format stores f32 arrays as raw little-endian bytes");

pub const MAGIC: [u8; 8] = *b"GPT2RSCK";
pub const FORMAT_VERSION: u32 = 1;
/// Magic, version, reserved and meta length.
const HEADER_LEN: u64 = 24;
/// Large enough that the big arrays are written and read in few system calls.
const IO_BUF: usize = 1 << 20;

/// Everything but the three big arrays. Serialized as JSON inside the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub config: ModelConfig,
    /// "byte" | "gpt2".
    pub tokenizer: String,
    /// Optimizer steps completed.
    pub step: u64,
    /// Data cursor: the epoch and the step within it where the next batch starts.
    pub data_epoch: u64,
    pub data_step_in_epoch: u64,
    pub seed: u64,
    /// The run's settings (lr, batch, seq_len, ...), opaque to this module.
    pub train: serde_json::Value,
}

pub struct Checkpoint {
    pub meta: CheckpointMeta,
    pub params: Vec<f32>,
    /// AdamW first moment, same layout as `params`.
    pub m: Vec<f32>,
    /// AdamW second moment, same layout as `params`.
    pub v: Vec<f32>,
}

/// Write a checkpoint. Atomic: writes `<path>.tmp` in the same directory, fsyncs it,
/// renames it over `path` and fsyncs the directory, so a crash leaves either the old or
/// the new file, never a torn one. The slices are borrowed so a backend can pass its own
/// memory without copying.
pub fn save(path: &Path, meta: &CheckpointMeta, params: &[f32], m: &[f32], v: &[f32]) -> Result<()> {
    let shown = path.display();
    meta.config
        .validate()
        .map_err(|e| Error::Input(format!("{shown}: cannot save checkpoint: model config is invalid: {e}")))?;
    let n = ParamLayout::new(&meta.config).total;
    let wrong: Vec<String> = [("params", params.len()), ("m", m.len()), ("v", v.len())]
        .iter()
        .filter(|&&(_, len)| len != n)
        .map(|(name, len)| format!("{name} has {len} values"))
        .collect();
    if !wrong.is_empty() {
        crate::bail_input!(
            "{shown}: cannot save checkpoint: {} but the model config needs {n}",
            wrong.join(", ")
        );
    }
    let json = serde_json::to_vec(meta)
        .map_err(|e| Error::Input(format!("{shown}: cannot encode checkpoint metadata: {e}")))?;

    let Some(tmp) = tmp_path(path) else {
        crate::bail_input!("{shown}: checkpoint path must name a file");
    };
    let written = write_file(&tmp, &json, n, [params, m, v]);
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path).map_err(io_err(path))) {
        let _ = std::fs::remove_file(&tmp); // best effort: the error above is the one to report
        return Err(e);
    }
    // The rename is durable only once the directory entry is on disk.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    sync_dir(dir)
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

/// Directories cannot be opened for syncing here; the rename is as durable as the OS makes it.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<()> {
    Ok(())
}

fn write_file(tmp: &Path, json: &[u8], n: usize, arrays: [&[f32]; 3]) -> Result<()> {
    let file = File::create(tmp).map_err(io_err(tmp))?;
    let mut out = HashingWriter {
        inner: BufWriter::with_capacity(IO_BUF, file),
        sum: Checksum::new(),
    };
    let mut header = Vec::with_capacity(HEADER_LEN as usize);
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.put(&header).map_err(io_err(tmp))?;
    out.put(json).map_err(io_err(tmp))?;
    out.put(&(n as u64).to_le_bytes()).map_err(io_err(tmp))?;
    for array in arrays {
        out.put(bytemuck::cast_slice(array)).map_err(io_err(tmp))?;
    }
    let sum = out.sum.finish();
    let mut writer = out.inner;
    writer.write_all(&sum.to_le_bytes()).map_err(io_err(tmp))?;
    let file = writer.into_inner().map_err(|e| e.into_error()).map_err(io_err(tmp))?;
    file.sync_all().map_err(io_err(tmp))
}

/// Read a whole checkpoint, validating header, metadata, config, sizes and checksum.
pub fn load(path: &Path) -> Result<Checkpoint> {
    let mut head = read_head(path)?;
    let n = head.n;
    let mut arrays = [vec![0f32; n], vec![0f32; n], vec![0f32; n]];
    for array in &mut arrays {
        head.input.take(bytemuck::cast_slice_mut(array)).map_err(io_err(path))?;
    }
    let computed = head.input.sum.finish();
    let mut stored = [0u8; 8];
    head.input.inner.read_exact(&mut stored).map_err(io_err(path))?;
    let stored = u64::from_le_bytes(stored);
    if stored != computed {
        crate::bail_input!(
            "{}: checkpoint is corrupt (checksum mismatch: stored {stored:016x}, computed {computed:016x})",
            path.display()
        );
    }
    let [params, m, v] = arrays;
    Ok(Checkpoint {
        meta: head.meta,
        params,
        m,
        v,
    })
}

/// Read only the header and metadata (cheap: the arrays are neither read nor checksummed),
/// e.g. to build the model before loading. Sizes are still checked against the file length.
pub fn load_meta(path: &Path) -> Result<CheckpointMeta> {
    Ok(read_head(path)?.meta)
}

/// Return an Input error naming every field where the checkpoint disagrees with the model
/// the flags describe (used by `train --resume` when model flags are also given).
pub fn check_compatible(meta: &CheckpointMeta, config: &ModelConfig, tokenizer: &str) -> Result<()> {
    // Destructured so that a new config field cannot be forgotten here.
    let ModelConfig {
        vocab_size,
        padded_vocab_size,
        n_layer,
        n_head,
        n_embd,
        max_seq_len,
    } = *config;
    let have = &meta.config;
    let mut conflicts = Vec::new();
    if meta.tokenizer != tokenizer {
        conflicts.push(format!(
            "tokenizer={} but the flags ask for tokenizer={tokenizer}",
            meta.tokenizer
        ));
    }
    for (name, ckpt, flag) in [
        ("vocab_size", have.vocab_size, vocab_size),
        ("padded_vocab_size", have.padded_vocab_size, padded_vocab_size),
        ("n_layer", have.n_layer, n_layer),
        ("n_head", have.n_head, n_head),
        ("n_embd", have.n_embd, n_embd),
        ("max_seq_len", have.max_seq_len, max_seq_len),
    ] {
        if ckpt != flag {
            conflicts.push(format!("{name}={ckpt} but the flags ask for {name}={flag}"));
        }
    }
    if !conflicts.is_empty() {
        crate::bail_input!("cannot resume: checkpoint has {}", conflicts.join("; "));
    }
    Ok(())
}

/// A checkpoint whose header and metadata have been read and validated; `input` is
/// positioned at the start of the arrays.
struct Head {
    meta: CheckpointMeta,
    n: usize,
    input: HashingReader,
}

fn read_head(path: &Path) -> Result<Head> {
    let shown = path.display();
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
        sum: Checksum::new(),
    };
    let truncated_min = |expected: u64| {
        Error::Input(format!(
            "{shown}: checkpoint is truncated (expected at least {expected} bytes, found {file_len})"
        ))
    };

    // Judge magic and version on whatever is there, so a short foreign file is called foreign.
    let mut header = [0u8; HEADER_LEN as usize];
    let got = file_len.min(HEADER_LEN) as usize;
    input.take(&mut header[..got]).map_err(io_err(path))?;
    let magic = &header[..got.min(8)];
    if magic != &MAGIC[..magic.len()] {
        crate::bail_input!(
            "{shown}: not a checkpoint (expected magic \"{}\", found \"{}\")",
            MAGIC.escape_ascii(),
            magic.escape_ascii()
        );
    }
    if got >= 12 {
        let version = u32::from_le_bytes(header[8..12].try_into().unwrap());
        if version != FORMAT_VERSION {
            crate::bail_input!(
                "{shown}: unsupported checkpoint format version {version} (this build reads version {FORMAT_VERSION})"
            );
        }
    }
    if got < HEADER_LEN as usize {
        return Err(truncated_min(HEADER_LEN));
    }
    let meta_len = u64::from_le_bytes(header[16..24].try_into().unwrap());
    // Meta plus the parameter count must fit before anything is allocated from meta_len.
    let arrays_at = HEADER_LEN.saturating_add(meta_len).saturating_add(8);
    if arrays_at > file_len {
        return Err(truncated_min(arrays_at));
    }

    let mut json = vec![0u8; meta_len as usize];
    input.take(&mut json).map_err(io_err(path))?;
    let mut count = [0u8; 8];
    input.take(&mut count).map_err(io_err(path))?;
    let stored_n = u64::from_le_bytes(count);

    let meta: CheckpointMeta = serde_json::from_slice(&json)
        .map_err(|e| Error::Input(format!("{shown}: checkpoint metadata is invalid: {e}")))?;
    meta.config
        .validate()
        .map_err(|e| Error::Input(format!("{shown}: checkpoint model config is invalid: {e}")))?;
    let n = ParamLayout::new(&meta.config).total;
    if stored_n != n as u64 {
        crate::bail_input!("{shown}: checkpoint holds {stored_n} parameters but its model config needs {n}");
    }
    let expected = arrays_at + 3 * 4 * n as u64 + 8;
    if file_len < expected {
        crate::bail_input!("{shown}: checkpoint is truncated (expected {expected} bytes, found {file_len})");
    }
    if file_len > expected {
        crate::bail_input!(
            "{shown}: checkpoint has {} trailing bytes (expected {expected} bytes, found {file_len})",
            file_len - expected
        );
    }
    Ok(Head { meta, n, input })
}

struct HashingWriter {
    inner: BufWriter<File>,
    sum: Checksum,
}

impl HashingWriter {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(bytes)?;
        self.sum.update(bytes);
        Ok(())
    }
}

struct HashingReader {
    inner: BufReader<File>,
    sum: Checksum,
}

impl HashingReader {
    fn take(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact(buf)?;
        self.sum.update(buf);
        Ok(())
    }
}

/// FNV-1a 64 over little-endian u64 words instead of bytes (8x fewer dependent multiplies,
/// which matters at gigabytes per save): the tail is zero-padded to a word and the total
/// byte count is mixed in last. Every step is a bijection of the state, so any single
/// changed word, hence any flipped byte, changes the result.
#[derive(Clone, Debug)]
struct Checksum {
    state: u64,
    pending: [u8; 8],
    pending_len: usize,
    total: u64,
}

impl Checksum {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Checksum {
            state: Self::OFFSET,
            pending: [0; 8],
            pending_len: 0,
            total: 0,
        }
    }

    fn mix(&mut self, word: u64) {
        self.state = (self.state ^ word).wrapping_mul(Self::PRIME);
    }

    fn update(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.pending_len > 0 {
            let k = (8 - self.pending_len).min(bytes.len());
            self.pending[self.pending_len..self.pending_len + k].copy_from_slice(&bytes[..k]);
            self.pending_len += k;
            bytes = &bytes[k..];
            if self.pending_len < 8 {
                return;
            }
            self.mix(u64::from_le_bytes(self.pending));
            self.pending_len = 0;
        }
        let words = bytes.chunks_exact(8);
        let tail = words.remainder();
        for word in words {
            self.mix(u64::from_le_bytes(word.try_into().unwrap()));
        }
        self.pending[..tail.len()].copy_from_slice(tail);
        self.pending_len = tail.len();
    }

    fn finish(&self) -> u64 {
        let mut end = self.clone();
        if end.pending_len > 0 {
            end.pending[end.pending_len..].fill(0);
            end.mix(u64::from_le_bytes(end.pending));
        }
        end.mix(end.total);
        end.state
    }
}

/// `<dir>/<name>.tmp`: beside the target, so the rename never crosses file systems.
fn tmp_path(path: &Path) -> Option<PathBuf> {
    let mut name = path.file_name()?.to_os_string();
    name.push(".tmp");
    Some(path.with_file_name(name))
}
