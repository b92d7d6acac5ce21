//! Training data: where it comes from (one file read whole, or llm.c `.bin` shards streamed
//! window by window), the train/validation split, the shuffled per-rank batches (resumable
//! through [`DataCursor`]) and fixed evaluation batches.
//!
//! - [`bin`]: the `.bin` format, whole files and headers;
//! - [`shards`]: what `--data` and `--val-data` name, resolved into files;
//! - [`sharding`]: text documents into shards (`tokenize --output-dir`);
//! - [`order`]: the keyed permutation that orders a streamed corpus's windows;
//! - [`loader`]: the shuffled per-rank batches over any corpus's windows ([`WindowLoader`]),
//!   and the in-memory [`Loader`] (one file, Fisher–Yates);
//! - [`stream`]: windows read from shards, and the thread that prepares batches ahead;
//! - here: the split, the cursor, evaluation batches.

pub mod bin;
mod identity;
pub mod loader;
pub mod order;
pub mod sharding;
pub mod shards;
pub mod stream;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::bail_input;
use crate::error::Result;

pub use bin::{load_tokens, read_bin, write_bin, BIN_MAGIC, BIN_VERSION};
pub use identity::DataIdentity;
pub use loader::{EpochOrder, InMemory, Loader, WindowLoader, Windows};
pub use shards::{resolve, DataPlan, Shard, ShardSet, TrainSource, ValSource};
pub use stream::{Batches, ShardLoader, ShardWindows};

/// Spreads consecutive epoch numbers over the seed space (2^64 / golden ratio).
const EPOCH_SEED_MIX: u64 = 0x9E3779B97F4A7C15;

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

impl DataCursor {
    /// The cursor one global batch on, in epochs of `steps_per_epoch` steps.
    pub fn after_step(self, steps_per_epoch: u64) -> DataCursor {
        match self.step_in_epoch + 1 == steps_per_epoch {
            true => DataCursor {
                epoch: self.epoch + 1,
                step_in_epoch: 0,
            },
            false => DataCursor {
                epoch: self.epoch,
                step_in_epoch: self.step_in_epoch + 1,
            },
        }
    }
}

/// The order an epoch visits its windows in, which a checkpoint's data cursor counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataOrder {
    /// A Fisher–Yates shuffle of `(seed, epoch)` ([`epoch_order`]): one file held in memory.
    FisherYates,
    /// The keyed permutation of [`order::WindowOrder`]: shards streamed.
    Feistel,
}

impl DataOrder {
    /// The name checkpoints record.
    pub fn name(self) -> &'static str {
        match self {
            DataOrder::FisherYates => "fisher-yates",
            DataOrder::Feistel => "feistel-v1",
        }
    }

    /// The order a checkpoint records; one that records none (written before orders were
    /// recorded) is Fisher–Yates, the only order there was.
    pub fn from_checkpoint(name: Option<&str>) -> Result<DataOrder> {
        match name {
            None | Some("fisher-yates") => Ok(DataOrder::FisherYates),
            Some("feistel-v1") => Ok(DataOrder::Feistel),
            Some(other) => bail_input!(
                "cannot resume: the checkpoint's data order {:?} is not one this build knows (fisher-yates, feistel-v1)",
                other
            ),
        }
    }

    /// How a run of this order reads its data, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            DataOrder::FisherYates => "one file held in memory, its windows shuffled by Fisher–Yates",
            DataOrder::Feistel => "shards streamed, their windows in a keyed permutation",
        }
    }
}

/// What [`Batches`] draws from: a run's batches in order, from any cursor.
pub trait BatchSource: Send {
    /// This rank's share of the next global batch; moves the cursor.
    fn next_batch(&mut self) -> Result<Batch>;
    fn cursor(&self) -> DataCursor;
    /// Resume from a saved cursor. The checkpoint must come from a run over the same windows
    /// with the same seq-len and batch size, which is what makes `step_in_epoch` meaningful.
    fn set_cursor(&mut self, c: DataCursor) -> Result<()>;
    /// Global batches per epoch.
    fn steps_per_epoch(&self) -> u64;
    fn num_windows(&self) -> u64;
}

/// Refuses a cursor past the end of an epoch of `steps` steps.
fn check_cursor(c: DataCursor, steps: u64) -> Result<()> {
    if c.step_in_epoch >= steps {
        bail_input!(
            "data cursor step {} is past the {steps} steps of an epoch; was the checkpoint made with other data or batch size?",
            c.step_in_epoch
        );
    }
    Ok(())
}

/// Refuses a batch shape that cannot be cut into windows and spread over the ranks.
fn check_shape(seq_len: usize, global_batch: usize, rank: usize, world: usize) -> Result<()> {
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
    Ok(())
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
