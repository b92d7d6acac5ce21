//! The shuffled, per-rank training batches, one skeleton for every corpus: a [`WindowLoader`]
//! over [`Windows`], which say how many windows a corpus has, how to read one, and the order
//! an epoch visits them in. One file held in memory ([`Loader`]: Fisher–Yates) and shards read
//! window by window ([`crate::data::ShardLoader`]: a keyed permutation) are its two kinds.

use std::sync::Arc;

use super::order::WindowOrder;
use super::{check_cursor, check_shape, epoch_order, Batch, BatchSource, DataCursor};
use crate::bail_input;
use crate::error::Result;

/// The order one epoch visits a corpus's windows in: `at(i)` is the `i`-th window visited.
pub enum EpochOrder {
    /// Every index, shuffled (Fisher–Yates; memory grows with the corpus).
    Shuffled(Vec<usize>),
    /// A keyed permutation computed one index at a time (no per-window state).
    Keyed(WindowOrder),
}

impl EpochOrder {
    fn at(&self, i: u64) -> u64 {
        match self {
            EpochOrder::Shuffled(order) => order[i as usize] as u64,
            EpochOrder::Keyed(order) => order.at(i),
        }
    }
}

/// Where a loader's windows come from. Window `w` is `seq_len + 1` consecutive tokens of the
/// corpus (inputs and, shifted by one, targets); windows do not overlap.
pub trait Windows: Send {
    /// T: a window holds `seq_len + 1` tokens.
    fn seq_len(&self) -> usize;
    /// How many windows the corpus holds.
    fn count(&self) -> u64;
    /// Appends window `w`'s `seq_len + 1` tokens to `out`. A window that cannot be read (a
    /// token outside the vocabulary, a shard gone) is the error.
    fn read(&mut self, w: u64, out: &mut Vec<u32>) -> Result<()>;
    /// Epoch `epoch`'s order of `n` windows, from `seed` and `epoch` alone (so that a run can
    /// resume at any epoch).
    fn order(&self, n: u64, seed: u64, epoch: u64) -> EpochOrder;
    /// The corpus, for the message that it holds fewer windows than one global batch.
    fn describe(&self) -> String;
}

/// Shuffled, sharded batches over a corpus's windows.
///
/// Epoch `e` visits the windows in the order [`Windows::order`] gives for `(seed, e)`; a global
/// batch is the next `B` windows of that order, and rank `r` of `world` takes rows
/// `[r*B/world, (r+1)*B/world)` of it, so the batches are the same for any number of ranks. The
/// `windows % B` windows left at the end of an epoch are skipped, so `steps_per_epoch =
/// windows / B`; the next epoch's order differs, so different windows are skipped each time.
pub struct WindowLoader<W: Windows> {
    windows: W,
    num_windows: u64,
    seq_len: usize,
    global_batch: usize,
    local_batch: usize,
    rank: usize,
    seed: u64,
    /// The order of `cursor.epoch`.
    order: EpochOrder,
    cursor: DataCursor,
    /// One window's tokens, as read.
    window: Vec<u32>,
}

/// Shape and position only: the corpus is far too long to print.
impl<W: Windows> std::fmt::Debug for WindowLoader<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowLoader")
            .field("windows", &self.num_windows)
            .field("seq_len", &self.seq_len)
            .field("global_batch", &self.global_batch)
            .field("local_batch", &self.local_batch)
            .field("rank", &self.rank)
            .field("seed", &self.seed)
            .field("cursor", &self.cursor)
            .finish()
    }
}

impl<W: Windows> WindowLoader<W> {
    /// Rank `rank` of `world`'s batches of `global_batch` windows.
    pub fn over(windows: W, global_batch: usize, rank: usize, world: usize, seed: u64) -> Result<Self> {
        let seq_len = windows.seq_len();
        check_shape(seq_len, global_batch, rank, world)?;
        let num_windows = windows.count();
        if num_windows < global_batch as u64 {
            bail_input!(
                "corpus too short: {} make {num_windows} windows of seq-len + 1 = {} tokens, fewer than the global batch of {global_batch}",
                windows.describe(),
                seq_len + 1
            );
        }
        Ok(WindowLoader {
            order: windows.order(num_windows, seed, 0),
            windows,
            num_windows,
            seq_len,
            global_batch,
            local_batch: global_batch / world,
            rank,
            seed,
            cursor: DataCursor::default(),
            window: Vec::with_capacity(seq_len + 1),
        })
    }

    /// Windows in the corpus.
    pub fn num_windows(&self) -> u64 {
        self.num_windows
    }

    /// Rows of this rank's batches (`global_batch / world`).
    pub fn local_batch(&self) -> usize {
        self.local_batch
    }

    /// Global batches per epoch; the `num_windows % B` leftover windows are skipped.
    pub fn steps_per_epoch(&self) -> u64 {
        self.num_windows / self.global_batch as u64
    }

    pub fn cursor(&self) -> DataCursor {
        self.cursor
    }

    /// Epochs completed, fractional: `epoch + step_in_epoch / steps_per_epoch`.
    pub fn epochs_done(&self) -> f64 {
        self.cursor.epoch as f64 + self.cursor.step_in_epoch as f64 / self.steps_per_epoch() as f64
    }

    /// This rank's share of the next global batch; moves the cursor, and takes the next
    /// epoch's order at the end of an epoch.
    pub fn read_next(&mut self) -> Result<Batch> {
        let n = self.local_batch * self.seq_len;
        let mut batch = Batch {
            inputs: Vec::with_capacity(n),
            targets: Vec::with_capacity(n),
        };
        let start = self.cursor.step_in_epoch * self.global_batch as u64 + (self.rank * self.local_batch) as u64;
        for i in start..start + self.local_batch as u64 {
            self.window.clear();
            self.windows.read(self.order.at(i), &mut self.window)?;
            batch
                .inputs
                .extend(self.window[..self.seq_len].iter().map(|&t| t as i32));
            batch.targets.extend(self.window[1..].iter().map(|&t| t as i32));
        }
        let epoch = self.cursor.epoch;
        self.cursor = self.cursor.after_step(self.steps_per_epoch());
        if self.cursor.epoch != epoch {
            self.order = self.windows.order(self.num_windows, self.seed, self.cursor.epoch);
        }
        Ok(batch)
    }

    /// Resume from a saved cursor. The checkpoint must come from a run over the same windows
    /// with the same seq-len and batch size, which is what makes `step_in_epoch` meaningful.
    pub fn set_cursor(&mut self, c: DataCursor) -> Result<()> {
        check_cursor(c, self.steps_per_epoch())?;
        if c.epoch != self.cursor.epoch {
            self.order = self.windows.order(self.num_windows, self.seed, c.epoch);
        }
        self.cursor = c;
        Ok(())
    }
}

impl<W: Windows> BatchSource for WindowLoader<W> {
    fn next_batch(&mut self) -> Result<Batch> {
        self.read_next()
    }

    fn cursor(&self) -> DataCursor {
        WindowLoader::cursor(self)
    }

    fn set_cursor(&mut self, c: DataCursor) -> Result<()> {
        WindowLoader::set_cursor(self, c)
    }

    fn steps_per_epoch(&self) -> u64 {
        WindowLoader::steps_per_epoch(self)
    }

    fn num_windows(&self) -> u64 {
        self.num_windows
    }
}

/// One file's training tokens held in memory: `(len - 1) / T` windows, visited in a
/// Fisher–Yates order of `(seed, epoch)` ([`epoch_order`]).
pub struct InMemory {
    tokens: Arc<[u32]>,
    seq_len: usize,
}

impl Windows for InMemory {
    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn count(&self) -> u64 {
        (self.tokens.len().saturating_sub(1) / self.seq_len) as u64
    }

    fn read(&mut self, w: u64, out: &mut Vec<u32>) -> Result<()> {
        let start = w as usize * self.seq_len;
        out.extend_from_slice(&self.tokens[start..start + self.seq_len + 1]);
        Ok(())
    }

    fn order(&self, n: u64, seed: u64, epoch: u64) -> EpochOrder {
        let mut order = Vec::with_capacity(n as usize);
        epoch_order(&mut order, n as usize, seed, epoch);
        EpochOrder::Shuffled(order)
    }

    fn describe(&self) -> String {
        format!("{} training tokens", self.tokens.len())
    }
}

/// Batches over one file's tokens held in memory.
pub type Loader = WindowLoader<InMemory>;

impl Loader {
    pub fn new(
        tokens: impl Into<Arc<[u32]>>,
        seq_len: usize,
        global_batch: usize,
        rank: usize,
        world: usize,
        seed: u64,
    ) -> Result<Loader> {
        let windows = InMemory {
            tokens: tokens.into(),
            seq_len,
        };
        WindowLoader::over(windows, global_batch, rank, world, seed)
    }

    /// [`WindowLoader::read_next`], which cannot fail on tokens in memory.
    pub fn next_batch(&mut self) -> Batch {
        self.read_next().expect("windows in memory are always read")
    }
}
