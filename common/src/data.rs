//! Training data: llm.c's `.bin` token files, the train/validation split, the shuffled
//! per-rank batch loader (resumable through [`DataCursor`]) and fixed evaluation batches.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::bail_input;
use crate::error::{io_err, Error, Result};
use crate::tokenizer::Tokenizer;

/// llm.c's header: 256 little-endian i32 = [magic, version, token count, 0...].
pub const BIN_MAGIC: i32 = 20240520;
pub const BIN_VERSION: i32 = 1;
const HEADER_BYTES: usize = 256 * 4;

/// Spreads consecutive epoch numbers over the seed space (2^64 / golden ratio).
const EPOCH_SEED_MIX: u64 = 0x9E3779B97F4A7C15;

/// Write `tokens` as uint16 after the llm.c header, atomically (see [`crate::atomic_file`]).
pub fn write_bin(path: &Path, tokens: &[u32]) -> Result<()> {
    if let Some((i, &t)) = tokens.iter().enumerate().find(|(_, &t)| t > u16::MAX as u32) {
        bail_input!(
            "{}: token {t} at index {i} does not fit the .bin format's uint16",
            path.display()
        );
    }
    let count = i32::try_from(tokens.len()).map_err(|_| {
        Error::Input(format!(
            "{}: {} tokens exceed the .bin header's i32 count",
            path.display(),
            tokens.len()
        ))
    })?;
    let mut bytes = Vec::with_capacity(HEADER_BYTES + 2 * tokens.len());
    for v in [BIN_MAGIC, BIN_VERSION, count] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.resize(HEADER_BYTES, 0);
    for &t in tokens {
        bytes.extend_from_slice(&(t as u16).to_le_bytes());
    }

    crate::atomic_file::write(path, |file| file.write_all(&bytes))
}

/// Read an llm.c `.bin` file, checking the header, the exact size and every token id.
pub fn read_bin(path: &Path, vocab_size: usize) -> Result<Vec<u32>> {
    crate::input::refuse_special(path, "a .bin token file")?;
    let bytes = fs::read(path).map_err(io_err(path))?;
    parse_bin(path, &bytes, vocab_size)
}

fn parse_bin(path: &Path, bytes: &[u8], vocab_size: usize) -> Result<Vec<u32>> {
    let p = path.display();
    if bytes.len() < HEADER_BYTES {
        bail_input!(
            "{p}: {} bytes is shorter than the {HEADER_BYTES}-byte .bin header",
            bytes.len()
        );
    }
    let header = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    let (magic, version, count) = (header(0), header(1), header(2));
    if magic != BIN_MAGIC {
        bail_input!("{p}: bad .bin magic {magic} (expected {BIN_MAGIC}); not an llm.c token file");
    }
    if version != BIN_VERSION {
        bail_input!("{p}: unsupported .bin version {version} (expected {BIN_VERSION}, uint16 tokens)");
    }
    if count < 0 {
        bail_input!("{p}: negative token count {count} in the .bin header");
    }
    let count = count as usize;
    let expected = HEADER_BYTES + 2 * count;
    if bytes.len() != expected {
        bail_input!(
            "{p}: header says {count} tokens, so the file should be {expected} bytes, but it is {} bytes",
            bytes.len()
        );
    }
    let tokens: Vec<u32> = bytes[HEADER_BYTES..]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
        .collect();
    if let Some((i, &t)) = tokens.iter().enumerate().find(|(_, &t)| t as usize >= vocab_size) {
        // `tokenize` writes GPT-2 tokens by default, `train` reads bytes by default.
        let gpt2 = crate::tokenizer::GPT2_VOCAB;
        let hint = match tokens.iter().all(|&t| (t as usize) < gpt2) && vocab_size < gpt2 {
            true => " (GPT-2 tokens? train on them with --tokenizer gpt2)",
            false => "",
        };
        bail_input!("{p}: token {t} at index {i} is outside the vocabulary of {vocab_size}{hint}");
    }
    Ok(tokens)
}

/// Tokens from `path`: an llm.c `.bin` file (recognised by its magic or a `.bin` extension)
/// is read as is; anything else must be UTF-8 text and is encoded with `tok`.
pub fn load_tokens(path: &Path, tok: &Tokenizer) -> Result<Vec<u32>> {
    let p = path.display();
    // A device (/dev/zero) never ends, a FIFO may never be written: neither is opened.
    crate::input::refuse_special(path, "a corpus file")?;
    let bytes = fs::read(path).map_err(io_err(path))?;
    if bytes.is_empty() {
        bail_input!("{p}: file is empty");
    }
    let has_magic = bytes.len() >= 4 && bytes[..4] == BIN_MAGIC.to_le_bytes();
    let tokens = if has_magic || path.extension().is_some_and(|e| e == "bin") {
        parse_bin(path, &bytes, tok.vocab_size())?
    } else {
        match std::str::from_utf8(&bytes) {
            Ok(text) => tok.encode(text).map_err(|e| Error::Input(format!("{p}: {e}")))?,
            Err(e) => bail_input!(
                "{p}: neither UTF-8 text (invalid byte at offset {}) nor an llm.c .bin token file",
                e.valid_up_to()
            ),
        }
    };
    if tokens.is_empty() {
        bail_input!("{p}: contains no tokens");
    }
    Ok(tokens)
}

/// Which corpus a run trained on, as its checkpoints record it, so that a resumed run can refuse
/// another: the file's name, its size and the xxHash64 of its first and of its last MiB (of the
/// whole of a smaller file), which reads two MiB of a corpus of any size.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataIdentity {
    /// The file's name, without its directory (shown in messages; not compared).
    pub name: String,
    pub bytes: u64,
    /// xxHash64 (seed 0) of the first MiB, as `0x` and 16 hex digits.
    pub head_xxh64: String,
    /// xxHash64 (seed 0) of the last MiB, as `0x` and 16 hex digits.
    pub tail_xxh64: String,
}

impl DataIdentity {
    /// The bytes hashed at each end: a MiB.
    const PART: u64 = 1 << 20;

    /// The identity of the corpus at `path` (a regular file, as [`load_tokens`] wants).
    pub fn of(path: &Path) -> Result<Self> {
        use std::io::{Read, Seek, SeekFrom};
        const MIB: u64 = DataIdentity::PART;
        crate::input::refuse_special(path, "a corpus file")?;
        let mut file = fs::File::open(path).map_err(io_err(path))?;
        let bytes = file.metadata().map_err(io_err(path))?.len();
        let mut hash_from = |at: u64| -> std::io::Result<String> {
            let mut part = Vec::new();
            file.seek(SeekFrom::Start(at))?;
            (&mut file).take(MIB).read_to_end(&mut part)?;
            Ok(format!("{:#018x}", xxhash_rust::xxh64::xxh64(&part, 0)))
        };
        let head_xxh64 = hash_from(0).map_err(io_err(path))?;
        let tail_xxh64 = hash_from(bytes.saturating_sub(MIB)).map_err(io_err(path))?;
        let name = path
            .file_name()
            .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        Ok(DataIdentity {
            name,
            bytes,
            head_xxh64,
            tail_xxh64,
        })
    }

    /// Whether `other` holds the same data: its size and both hashes (a corpus moved or
    /// renamed is the same corpus).
    pub fn same_data(&self, other: &DataIdentity) -> bool {
        (self.bytes, &self.head_xxh64, &self.tail_xxh64) == (other.bytes, &other.head_xxh64, &other.tail_xxh64)
    }
}

impl std::fmt::Display for DataIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, bytes) = (&self.name, self.bytes);
        match bytes <= DataIdentity::PART {
            true => write!(f, "{name} ({bytes} bytes, xxh64 {})", self.head_xxh64),
            false => write!(
                f,
                "{name} ({bytes} bytes, xxh64 of its first and last MiB {} and {})",
                self.head_xxh64, self.tail_xxh64
            ),
        }
    }
}

/// Training and validation tokens: the validation set is the tail of the corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub train: Vec<u32>,
    pub val: Vec<u32>,
}

/// Hold out the last `val_fraction` of `tokens` (rounded to whole tokens) for validation.
/// Both parts must hold at least one window of `seq_len + 1` tokens.
pub fn split(mut tokens: Vec<u32>, val_fraction: f32, seq_len: usize) -> Result<Split> {
    if !(val_fraction > 0.0 && val_fraction < 1.0) {
        bail_input!("validation fraction must be strictly between 0 and 1, got {val_fraction}");
    }
    if seq_len == 0 {
        bail_input!("sequence length must be positive");
    }
    let total = tokens.len();
    let n_val = (total as f64 * val_fraction as f64).round() as usize;
    let n_train = total - n_val;
    let window = seq_len + 1;
    if n_train < window || n_val < window {
        bail_input!(
            "corpus too short: {total} tokens split into {n_train} training and {n_val} validation tokens \
             (validation fraction {val_fraction}), but each needs at least seq-len + 1 = {window}"
        );
    }
    let val = tokens.split_off(n_train);
    Ok(Split { train: tokens, val })
}

/// Where the loader stands; saved in checkpoints so a resumed run sees the same batches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataCursor {
    pub epoch: u64,
    pub step_in_epoch: u64,
}

/// One rank's share of a batch: `rows * seq_len` ids each, row-major; `targets` are `inputs`
/// shifted left by one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub inputs: Vec<i32>,
    pub targets: Vec<i32>,
}

/// Copy window `w` (tokens `[w*T, w*T + T]`) into the batch as one row.
fn push_window(batch: &mut Batch, tokens: &[u32], w: usize, seq_len: usize) {
    let window = &tokens[w * seq_len..w * seq_len + seq_len + 1];
    batch.inputs.extend(window[..seq_len].iter().map(|&t| t as i32));
    batch.targets.extend(window[1..].iter().map(|&t| t as i32));
}

/// Shuffled, sharded batches over the training tokens.
///
/// The tokens are cut into `num_windows = (len - 1) / T` non-overlapping windows of `T + 1`
/// tokens. Each epoch visits them in a Fisher–Yates order that depends only on `(seed, epoch)`;
/// a global batch is the next `B` windows of that order, and rank `r` of `world` takes rows
/// `[r*B/world, (r+1)*B/world)` of it. The `num_windows % B` windows left at the end of an
/// epoch are skipped, so `steps_per_epoch = num_windows / B`; the next epoch reshuffles, so
/// different windows are skipped each time.
pub struct Loader {
    tokens: Arc<[u32]>,
    seq_len: usize,
    global_batch: usize,
    local_batch: usize,
    rank: usize,
    seed: u64,
    /// Window indices in this epoch's visiting order (always the order for `cursor.epoch`).
    order: Vec<usize>,
    cursor: DataCursor,
}

/// Shape and position only: the token buffer is far too long to print.
impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("tokens", &self.tokens.len())
            .field("seq_len", &self.seq_len)
            .field("global_batch", &self.global_batch)
            .field("local_batch", &self.local_batch)
            .field("rank", &self.rank)
            .field("seed", &self.seed)
            .field("cursor", &self.cursor)
            .finish()
    }
}

impl Loader {
    pub fn new(
        tokens: impl Into<Arc<[u32]>>,
        seq_len: usize,
        global_batch: usize,
        rank: usize,
        world: usize,
        seed: u64,
    ) -> Result<Loader> {
        let tokens = tokens.into();
        if seq_len == 0 || global_batch == 0 || world == 0 {
            bail_input!(
                "sequence length ({seq_len}), batch size ({global_batch}) and world size ({world}) must be positive"
            );
        }
        if rank >= world {
            bail_input!("rank {rank} is outside a world of {world} ranks");
        }
        if !global_batch.is_multiple_of(world) {
            bail_input!("global batch size {global_batch} is not divisible by the number of ranks {world}");
        }
        let num_windows = tokens.len().saturating_sub(1) / seq_len;
        if num_windows < global_batch {
            bail_input!(
                "corpus too short: {} training tokens make {num_windows} windows of seq-len + 1 = {} tokens, \
                 fewer than the global batch of {global_batch}",
                tokens.len(),
                seq_len + 1
            );
        }
        let mut loader = Loader {
            tokens,
            seq_len,
            global_batch,
            local_batch: global_batch / world,
            rank,
            seed,
            order: Vec::with_capacity(num_windows),
            cursor: DataCursor::default(),
        };
        loader.shuffle_for(0, num_windows);
        Ok(loader)
    }

    /// Rebuild the order from scratch so it depends on `(seed, epoch)` alone, not on history:
    /// that is what lets [`Loader::set_cursor`] jump to any epoch.
    fn shuffle_for(&mut self, epoch: u64, num_windows: usize) {
        epoch_order(&mut self.order, num_windows, self.seed, epoch);
    }

    pub fn num_windows(&self) -> usize {
        self.order.len()
    }

    /// Rows of this rank's batches (`global_batch / world`).
    pub fn local_batch(&self) -> usize {
        self.local_batch
    }

    /// Global batches per epoch; the `num_windows % B` leftover windows are skipped.
    pub fn steps_per_epoch(&self) -> u64 {
        (self.num_windows() / self.global_batch) as u64
    }

    /// This rank's share of the next global batch; moves the cursor and reshuffles at the end
    /// of an epoch.
    pub fn next_batch(&mut self) -> Batch {
        let n = self.local_batch * self.seq_len;
        let mut batch = Batch {
            inputs: Vec::with_capacity(n),
            targets: Vec::with_capacity(n),
        };
        let start = self.cursor.step_in_epoch as usize * self.global_batch + self.rank * self.local_batch;
        for &w in &self.order[start..start + self.local_batch] {
            push_window(&mut batch, &self.tokens, w, self.seq_len);
        }
        self.cursor.step_in_epoch += 1;
        if self.cursor.step_in_epoch == self.steps_per_epoch() {
            self.cursor = DataCursor {
                epoch: self.cursor.epoch + 1,
                step_in_epoch: 0,
            };
            self.shuffle_for(self.cursor.epoch, self.num_windows());
        }
        batch
    }

    pub fn cursor(&self) -> DataCursor {
        self.cursor
    }

    /// Resume from a saved cursor. The checkpoint must come from a run over the same tokens
    /// with the same seq-len and batch size, which is what makes `step_in_epoch` meaningful.
    pub fn set_cursor(&mut self, c: DataCursor) -> Result<()> {
        let steps = self.steps_per_epoch();
        if c.step_in_epoch >= steps {
            bail_input!(
                "data cursor step {} is past the {steps} steps of an epoch; was the checkpoint made with other data or batch size?",
                c.step_in_epoch
            );
        }
        if c.epoch != self.cursor.epoch {
            self.shuffle_for(c.epoch, self.num_windows());
        }
        self.cursor = c;
        Ok(())
    }

    /// Epochs completed, fractional: `epoch + step_in_epoch / steps_per_epoch`.
    pub fn epochs_done(&self) -> f64 {
        self.cursor.epoch as f64 + self.cursor.step_in_epoch as f64 / self.steps_per_epoch() as f64
    }
}

/// Sets `order` to 0..n in the Fisher–Yates order of `(seed, epoch)`: the order in which an
/// epoch visits the training examples (windows here, images in the MLP workload).
pub fn epoch_order(order: &mut Vec<usize>, n: usize, seed: u64, epoch: u64) {
    order.clear();
    order.extend(0..n);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ epoch.wrapping_mul(EPOCH_SEED_MIX));
    for i in (1..n).rev() {
        let j = uniform_below(&mut rng, i as u64 + 1) as usize;
        order.swap(i, j);
    }
}

/// Uniform integer in `[0, n)` for `n > 0`, without modulo bias (Lemire's multiply-and-reject;
/// the division only runs in the rare case a rejection is possible).
fn uniform_below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    let mut m = rng.next_u64() as u128 * n as u128;
    if (m as u64) < n {
        let threshold = n.wrapping_neg() % n;
        while (m as u64) < threshold {
            m = rng.next_u64() as u128 * n as u128;
        }
    }
    (m >> 64) as u64
}

/// Deterministic evaluation batches over the validation set: consecutive windows from the
/// start, `B_eval = min(batch, windows)` rows each, at most `max_batches` batches (fewer if the
/// set is small). Empty when the set holds no full window.
pub fn eval_batches(val: &[u32], seq_len: usize, batch: usize, max_batches: usize) -> Vec<Batch> {
    if seq_len == 0 || batch == 0 {
        return Vec::new();
    }
    let windows = val.len().saturating_sub(1) / seq_len;
    let rows = batch.min(windows);
    if rows == 0 {
        return Vec::new();
    }
    let n_batches = max_batches.min(windows / rows);
    (0..n_batches)
        .map(|k| {
            let mut b = Batch {
                inputs: Vec::with_capacity(rows * seq_len),
                targets: Vec::with_capacity(rows * seq_len),
            };
            for w in k * rows..(k + 1) * rows {
                push_window(&mut b, val, w, seq_len);
            }
            b
        })
        .collect()
}
