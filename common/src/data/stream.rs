//! Batches streamed from `.bin` shards ([`ShardLoader`]), and [`Batches`]: the run's batches,
//! prepared ahead on a thread of their own so that reading never shows in the step time.

use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;

use super::order::WindowOrder;
use super::shards::{ShardFiles, ShardSet};
use super::{check_shape, Batch, BatchSource, DataCursor, DataOrder};
use crate::bail_input;
use crate::error::{Error, Result};

/// Shuffled, sharded batches over the windows of a set of shards, reading only the windows of
/// this rank's rows.
///
/// Shard `s` of `n_s` tokens is cut into `(n_s - 1) / T` windows of `T + 1` tokens (a window
/// never spans two shards), numbered across the shards in their order. Epoch `e` visits them
/// in the [`WindowOrder`] of `(seed, e)`; a global batch is the next `B` windows of it, and rank
/// `r` of `world` takes rows `[r*B/world, (r+1)*B/world)`, so the batches are the same for any
/// number of ranks. The `windows % B` windows left at the end of an epoch are skipped.
pub struct ShardLoader {
    files: ShardFiles,
    /// The number of the first window of each shard (its windows run to the next one's).
    first_window: Vec<u64>,
    num_windows: u64,
    seq_len: usize,
    global_batch: usize,
    local_batch: usize,
    rank: usize,
    seed: u64,
    /// The order of `cursor.epoch`.
    order: WindowOrder,
    cursor: DataCursor,
    /// One window's tokens, as read.
    window: Vec<u32>,
}

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
        check_shape(seq_len, global_batch, rank, world)?;
        let mut first_window = Vec::with_capacity(set.shards.len());
        let mut num_windows = 0u64;
        for shard in &set.shards {
            first_window.push(num_windows);
            num_windows += shard.tokens.saturating_sub(1) / seq_len as u64;
        }
        if num_windows < global_batch as u64 {
            bail_input!(
                "corpus too short: {} shard(s) of {} tokens make {num_windows} windows of seq-len + 1 = {} tokens \
                 (a window does not span two shards), fewer than the global batch of {global_batch}",
                set.shards.len(),
                set.tokens(),
                seq_len + 1
            );
        }
        Ok(ShardLoader {
            files: ShardFiles::new(set, vocab_size),
            first_window,
            num_windows,
            seq_len,
            global_batch,
            local_batch: global_batch / world,
            rank,
            seed,
            order: WindowOrder::new(num_windows, seed, 0),
            cursor: DataCursor::default(),
            window: Vec::with_capacity(seq_len + 1),
        })
    }

    /// Appends window `w` to `batch` as one row.
    fn push_window(&mut self, w: u64, batch: &mut Batch) -> Result<()> {
        let shard = self.first_window.partition_point(|&f| f <= w) - 1;
        let start = (w - self.first_window[shard]) * self.seq_len as u64;
        self.window.clear();
        self.files
            .read_tokens(shard, start, self.seq_len as u64 + 1, &mut self.window)?;
        batch
            .inputs
            .extend(self.window[..self.seq_len].iter().map(|&t| t as i32));
        batch.targets.extend(self.window[1..].iter().map(|&t| t as i32));
        Ok(())
    }
}

impl BatchSource for ShardLoader {
    fn next_batch(&mut self) -> Result<Batch> {
        let n = self.local_batch * self.seq_len;
        let mut batch = Batch {
            inputs: Vec::with_capacity(n),
            targets: Vec::with_capacity(n),
        };
        let start = self.cursor.step_in_epoch * self.global_batch as u64 + (self.rank * self.local_batch) as u64;
        for i in start..start + self.local_batch as u64 {
            let w = self.order.at(i);
            self.push_window(w, &mut batch)?;
        }
        let epoch = self.cursor.epoch;
        self.cursor = self.cursor.after_step(self.steps_per_epoch());
        if self.cursor.epoch != epoch {
            self.order = WindowOrder::new(self.num_windows, self.seed, self.cursor.epoch);
        }
        Ok(batch)
    }

    fn cursor(&self) -> DataCursor {
        self.cursor
    }

    fn set_cursor(&mut self, c: DataCursor) -> Result<()> {
        super::check_cursor(c, self.steps_per_epoch())?;
        self.order = WindowOrder::new(self.num_windows, self.seed, c.epoch);
        self.cursor = c;
        Ok(())
    }

    fn steps_per_epoch(&self) -> u64 {
        self.num_windows / self.global_batch as u64
    }

    fn num_windows(&self) -> u64 {
        self.num_windows
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
