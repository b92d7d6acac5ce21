//! Windows streamed from `.bin` shards ([`ShardWindows`], batched by [`ShardLoader`]), and
//! [`Batches`]: the run's batches, prepared ahead on a thread of their own so that reading
//! never shows in the step time.

use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;

use super::loader::{EpochOrder, WindowLoader, Windows};
use super::order::WindowOrder;
use super::shards::{ShardFiles, ShardSet};
use super::{Batch, BatchSource, DataCursor, DataOrder};
use crate::error::{Error, Result};

/// The windows of a set of shards, read as needed: shard `s` of `n_s` tokens is cut into
/// `(n_s - 1) / T` windows of `T + 1` tokens (a window never spans two shards), numbered across
/// the shards in their order, and visited in the [`WindowOrder`] of `(seed, epoch)`, which holds
/// no per-window state. Each rank reads only the windows of its own rows.
pub struct ShardWindows {
    files: ShardFiles,
    seq_len: usize,
    /// The number of the first window of each shard (its windows run to the next one's).
    first_window: Vec<u64>,
    num_windows: u64,
    /// The shards' tokens, all told.
    tokens: u64,
}

impl ShardWindows {
    pub fn new(set: ShardSet, vocab_size: usize, seq_len: usize) -> ShardWindows {
        let mut first_window = Vec::with_capacity(set.shards.len());
        let mut num_windows = 0u64;
        for shard in &set.shards {
            first_window.push(num_windows);
            // (seq_len 0 is refused by the loader before a window is counted or read.)
            num_windows += shard.tokens.saturating_sub(1) / seq_len.max(1) as u64;
        }
        ShardWindows {
            tokens: set.tokens(),
            files: ShardFiles::new(set, vocab_size),
            seq_len,
            first_window,
            num_windows,
        }
    }
}

impl Windows for ShardWindows {
    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn count(&self) -> u64 {
        self.num_windows
    }

    fn read(&mut self, w: u64, out: &mut Vec<u32>) -> Result<()> {
        let shard = self.first_window.partition_point(|&f| f <= w) - 1;
        let start = (w - self.first_window[shard]) * self.seq_len as u64;
        self.files.read_tokens(shard, start, self.seq_len as u64 + 1, out)
    }

    fn order(&self, n: u64, seed: u64, epoch: u64) -> EpochOrder {
        EpochOrder::Keyed(WindowOrder::new(n, seed, epoch))
    }

    fn describe(&self) -> String {
        format!(
            "{} shard(s) of {} tokens (a window does not span two shards)",
            self.first_window.len(),
            self.tokens
        )
    }
}

/// Batches over the windows of a set of shards.
pub type ShardLoader = WindowLoader<ShardWindows>;

impl ShardLoader {
    pub fn new(
        set: ShardSet,
        vocab_size: usize,
        seq_len: usize,
        global_batch: usize,
        rank: usize,
        world: usize,
        seed: u64,
    ) -> Result<ShardLoader> {
        WindowLoader::over(
            ShardWindows::new(set, vocab_size, seq_len),
            global_batch,
            rank,
            world,
            seed,
        )
    }
}

/// Batches queued ahead of the steps.
const AHEAD: usize = 2;

/// Where the batch source is: here, or on the thread that prepares batches ahead.
enum State {
    Idle(Box<dyn BatchSource>),
    Running {
        batches: Receiver<Result<Batch>>,
        thread: JoinHandle<Box<dyn BatchSource>>,
    },
    /// The thread ended without handing the source back (it panicked).
    Lost,
}

/// The run's batches, in order, from a [`BatchSource`] that a thread of its own runs
/// two batches ahead of the steps (started at the first batch). The cursor is the one
/// of the batch to be taken next, whatever the thread has prepared.
pub struct Batches {
    order: DataOrder,
    cursor: DataCursor,
    steps_per_epoch: u64,
    num_windows: u64,
    state: State,
    /// The next batch, taken from the thread already by [`Batches::peek`].
    ready: Option<Batch>,
}

impl std::fmt::Debug for Batches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batches")
            .field("order", &self.order)
            .field("cursor", &self.cursor)
            .field("steps_per_epoch", &self.steps_per_epoch)
            .field("num_windows", &self.num_windows)
            .finish()
    }
}

impl Batches {
    /// The batches of `source`, whose windows are visited in `order`.
    pub fn new(source: Box<dyn BatchSource>, order: DataOrder) -> Batches {
        Batches {
            order,
            cursor: source.cursor(),
            steps_per_epoch: source.steps_per_epoch(),
            num_windows: source.num_windows(),
            state: State::Idle(source),
            ready: None,
        }
    }

    pub fn order(&self) -> DataOrder {
        self.order
    }

    pub fn cursor(&self) -> DataCursor {
        self.cursor
    }

    /// Global batches per epoch; the `num_windows % B` leftover windows are skipped.
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    pub fn num_windows(&self) -> u64 {
        self.num_windows
    }

    /// Epochs completed, fractional: `epoch + step_in_epoch / steps_per_epoch`.
    pub fn epochs_done(&self) -> f64 {
        self.cursor.epoch as f64 + self.cursor.step_in_epoch as f64 / self.steps_per_epoch as f64
    }

    /// This rank's share of the next global batch. A window that cannot be read (a token
    /// outside the vocabulary, a shard gone) is this call's error.
    pub fn next_batch(&mut self) -> Result<Batch> {
        let batch = match self.ready.take() {
            Some(batch) => batch,
            None => self.receive()?,
        };
        self.cursor = self.cursor.after_step(self.steps_per_epoch);
        Ok(batch)
    }

    /// Reads the next batch now (starting the thread), so that a window that cannot be read
    /// is refused before the run starts; [`Batches::next_batch`] then returns it.
    pub fn peek(&mut self) -> Result<()> {
        if self.ready.is_none() {
            self.ready = Some(self.receive()?);
        }
        Ok(())
    }

    /// The next batch from the thread, started if it is not running.
    fn receive(&mut self) -> Result<Batch> {
        if let State::Idle(_) = self.state {
            let State::Idle(mut source) = std::mem::replace(&mut self.state, State::Lost) else {
                unreachable!("matched above")
            };
            let (send, batches) = sync_channel(AHEAD);
            let thread = std::thread::Builder::new()
                .name("batches".into())
                .spawn(move || {
                    loop {
                        let batch = source.next_batch();
                        let failed = batch.is_err();
                        // The receiver is gone when the batches are dropped or repositioned.
                        if send.send(batch).is_err() || failed {
                            return source;
                        }
                    }
                })
                .map_err(|e| Error::Device(format!("cannot start the thread that prepares batches: {e}")))?;
            self.state = State::Running { batches, thread };
        }
        let State::Running { batches, .. } = &self.state else {
            return Err(lost());
        };
        batches.recv().map_err(|_| lost())?
    }

    /// Resume from a saved cursor (see [`BatchSource::set_cursor`]).
    pub fn set_cursor(&mut self, c: DataCursor) -> Result<()> {
        self.ready = None;
        let mut source = self.stop()?;
        let set = source.set_cursor(c);
        self.state = State::Idle(source);
        set?;
        self.cursor = c;
        Ok(())
    }

    /// The source back from the thread, which stops once its queue is dropped.
    fn stop(&mut self) -> Result<Box<dyn BatchSource>> {
        match std::mem::replace(&mut self.state, State::Lost) {
            State::Idle(source) => Ok(source),
            State::Running { batches, thread } => {
                drop(batches);
                thread.join().map_err(|_| lost())
            }
            State::Lost => Err(lost()),
        }
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn lost() -> Error {
    Error::Device("the thread that prepares batches stopped".into())
}
