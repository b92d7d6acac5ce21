//! What a run writes and watches while it goes, beside the steps themselves: the loss
//! table and its open window, the progress bar, the clock (continued from a checkpoint),
//! checkpoints, the count of skipped steps, the watchdog, and how the run ends (its last
//! step, Ctrl-C, `--stop-after`, or too many non-finite steps).

use super::Run;
use crate::atomic_file;
use crate::backend::Backend;
use crate::checkpoint::{BackgroundWriter, HostState, SaveReport};
use crate::cli::{TrainArgs, DEFAULT_COMM_TIMEOUT};
use crate::comm::{agree, leave_together, Comm, Ranks, Watchdog};
use crate::error::{Error, Result};
use crate::optim::StepStats;
use crate::report::log::{set_aside_earlier_run, LogState, LossLog, LossRow, Window};
use crate::report::progress;
use indicatif::ProgressBar;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Why a run stops before its last step.
pub enum Stop {
    Interrupted,
    StopAfter,
}

/// Training time: seconds before this process (a resumed run's), and since it started.
struct Clock {
    earlier_s: f64,
    started: Instant,
}

impl Clock {
    fn elapsed(&self) -> f64 {
        self.earlier_s + self.started.elapsed().as_secs_f64()
    }
}

pub struct Session<'a> {
    comm: &'a dyn Comm,
    args: &'a TrainArgs,
    /// Rank 0's loss table.
    log: Option<LossLog>,
    bar: ProgressBar,
    watchdog: Option<Watchdog>,
    ckpt: PathBuf,
    window: Window,
    clock: Clock,
    /// Seconds inside steps, for the summary's tokens/s.
    pub step_time: f64,
    pub last_val: f32,
    bad_in_a_row: u64,
    /// The step of the last checkpoint whose file is complete (on rank 0 as its write ends;
    /// on the others from rank 0, at the next step's stop check).
    saved_at: Option<u64>,
    /// Rank 0's checkpoint writes, in the background.
    writer: BackgroundWriter,
    /// The memory that checkpoints' snapshots on the device keep has been named.
    snapshot_said: bool,
    /// Seconds spent before the first step making checkpoints' host memory ready.
    prepared_s: f64,
}

/// The files of a run in its `--out`, which a new run there writes anew: the checkpoint last,
/// so that a move cut short leaves it with the files not yet moved.
const RUN_FILES: [&str; 4] = ["summary.json", "loss.tsv", "init.ckpt", "model.ckpt"];

impl<'a> Session<'a> {
    /// Opens the loss table (kept up to the checkpoint when resuming), prints the run's
    /// first lines and starts the bar, the clock and the watchdog.
    pub fn open<B: Backend>(run: &Run<B>, comm: &'a dyn Comm, args: &'a TrainArgs) -> Result<Self> {
        let root = comm.is_root();
        let ckpt = args.out.join("model.ckpt");
        let keep_rows = args.resume.is_some().then_some(run.log_state.rows);
        let open_log = || {
            if args.resume.is_none() {
                set_aside_earlier_run(&args.out, &RUN_FILES)?;
            }
            LossLog::open(&args.out, keep_rows)
        };
        let log = agree(comm, root.then(open_log).transpose())?;
        // Before the first step: pinned host memory for checkpoints' copies takes a while.
        let preparing = Instant::now();
        run.trainer.prepare_checkpoints();
        let prepared_s = preparing.elapsed().as_secs_f64();
        // Every rank takes part in the PID table; a rank stopped from outside ends the job.
        let ranks = Ranks::exchange(comm)?;
        let timeout = Duration::from_secs(args.comm_timeout.unwrap_or(DEFAULT_COMM_TIMEOUT));
        let watchdog = Watchdog::start(comm, Some(timeout), ranks.as_ref())?;
        if root {
            let removed = atomic_file::remove_stale_temps(&ckpt);
            if removed > 0 {
                crate::say!(
                    "note: removed {removed} temporary file(s) that interrupted checkpoint writes left in {}",
                    args.out.display()
                );
            }
            crate::say!("{}", run.describe());
            ranks.iter().for_each(|r| crate::say!("{}", r.table()));
            crate::say!("{}", LossLog::header());
        }
        Ok(Session {
            comm,
            args,
            log,
            bar: progress::bar(root, run.total_steps, run.start_step),
            watchdog,
            ckpt,
            window: run.log_state.window,
            clock: Clock {
                earlier_s: run.log_state.elapsed_s,
                started: Instant::now(),
            },
            step_time: 0.0,
            last_val: f32::NAN,
            bad_in_a_row: run.log_state.bad_in_a_row,
            saved_at: None,
            writer: match root && !run.trainer.snapshots_checkpoints() {
                // Rank 0 copies the state into host memory at every checkpoint (one at the end
                // at least): that memory is made ready meanwhile. (A snapshot on the device is
                // brought to host memory of its own, by the writer.)
                true => {
                    let mut w = BackgroundWriter::default();
                    w.prepare_arrays(run.config.num_params());
                    w
                }
                false => BackgroundWriter::default(),
            },
            snapshot_said: false,
            prepared_s,
        })
    }

    fn disarm(&self) {
        if let Some(w) = &self.watchdog {
            w.disarm();
        }
    }

    /// Every rank stops here (an error they all see, or the run's end): another rank's end
    /// is no news from now on.
    fn leaving(&self) {
        if let Some(w) = &self.watchdog {
            w.leaving();
        }
    }

    /// The run ends here on every rank: the ranks leave together (a rank's end is no news
    /// from now on; the timeout watches the barrier), then no more timeouts.
    fn end_together(&self) -> Result<()> {
        self.leaving();
        leave_together(self.comm, "")?;
        self.disarm();
        Ok(())
    }

    pub fn elapsed(&self) -> f64 {
        self.clock.elapsed()
    }

    /// `--save-init`: the weights before the first step as OUT/init.ckpt, a checkpoint at
    /// step 0 (written now, by rank 0; every rank takes part in gathering the state).
    pub fn save_init<B: Backend>(&self, run: &Run<B>) -> Result<()> {
        let arrays = run.trainer.state_on_root([Vec::new(), Vec::new(), Vec::new()])?;
        let saved = match (&self.log, arrays) {
            (Some(_), Some([p, m, v])) => {
                let path = self.args.out.join("init.ckpt");
                let meta = run.checkpoint_meta(run.start_step, &LogState::default())?;
                crate::checkpoint::save(&path, &meta, &p, &m, &v).map(|()| Some(path))
            }
            _ => Ok(None),
        };
        if let Some(path) = agree(self.comm, saved)? {
            self.bar
                .suspend(|| crate::say!("saved {} (the weights before step 0)", path.display()));
        }
        Ok(())
    }

    /// Step `step` is about to run.
    /// Rank 0 announces a checkpoint whose background write has finished.
    pub fn starting(&mut self, step: u64) -> Result<()> {
        if let Some(w) = &self.watchdog {
            w.at_step(step);
        }
        let written = self.writer.poll()?;
        self.announce(written);
        Ok(())
    }

    /// Rank 0: one line for a checkpoint written (step, stall, write time, file), which is
    /// from now on the one a failure names.
    fn announce(&mut self, written: Option<SaveReport>) {
        if let Some(report) = written {
            self.bar.suspend(|| crate::say!("{report}"));
            self.now_saved(report.step);
        }
    }

    /// The checkpoint of `step` steps is complete: the one a failure names from now on.
    fn now_saved(&mut self, step: u64) {
        self.saved_at = Some(step);
        if let Some(w) = &self.watchdog {
            w.saved(&self.ckpt, step);
        }
    }

    /// A step (or the wait for steps queued before) took `seconds`: into the window and the
    /// summary's step time; a step done moves the bar.
    pub fn add_time(&mut self, seconds: f64, steps_done: u64) {
        self.window.add_time(seconds);
        self.step_time += seconds;
        self.bar.inc(steps_done);
    }

    /// The stats of steps read back, in order (see [`Session::record`]).
    pub fn record_all(&mut self, finished: &[(u64, StepStats)]) -> Result<()> {
        finished.iter().try_for_each(|(step, s)| self.record(*step, s))
    }

    /// The stats of step `step`: into the window and the bar's message; an error once
    /// `--max-bad-steps` steps in a row were skipped (every rank sees the same stats).
    pub fn record(&mut self, step: u64, s: &StepStats) -> Result<()> {
        self.window.add(s.loss, s.skipped);
        self.bar
            .set_message(format!("loss {:.4} lr {:.2e} norm {:.2}", s.loss, s.lr, s.grad_norm));
        self.bad_in_a_row = if s.skipped { self.bad_in_a_row + 1 } else { 0 };
        if self.bad_in_a_row < self.args.max_bad_steps {
            return Ok(());
        }
        self.leaving(); // every rank sees the same stats, so all stop here
                        // A checkpoint still being written ends first, and every rank learns rank 0's last
                        // complete one: the line names the file on disk, and reads the same on every rank.
        let written = agree(self.comm, self.writer.wait())?;
        self.announce(written);
        self.learn_saved_on_root()?;
        self.bar.abandon();
        let last = match self.saved_at {
            Some(s) => format!("the last good checkpoint is {} (step {s})", self.ckpt.display()),
            None => "no checkpoint was written in this run".to_string(),
        };
        let msg = format!(
            "{} steps in a row (to step {step}) had a non-finite loss or gradient norm and were skipped; \
             stopping: {last}. Lower --lr, or raise --max-bad-steps",
            self.bad_in_a_row
        );
        Err(Error::Training(msg).on_every_rank())
    }

    /// Has the run been asked to stop after `done` steps? (Ctrl-C on any rank, agreed over
    /// all ranks so they stop at the same step; or `--stop-after`.)
    /// The same sum tells the other ranks which checkpoint rank 0 has finished writing.
    pub fn stop_requested<B: Backend>(&mut self, run: &Run<B>, done: u64) -> Result<Option<Stop>> {
        let stop = crate::stop::asked() as u8 as f32;
        let [high, low] = self.saved_on_root_parts();
        let mut v = [stop, high, low];
        self.comm.all_reduce_sum_host(&mut v)?;
        self.learn_saved([v[1], v[2]]);
        Ok(if v[0] > 0.0 {
            Some(Stop::Interrupted)
        } else {
            (run.stop_after == Some(done)).then_some(Stop::StopAfter)
        })
    }

    /// Rank 0's last complete checkpoint as two whole floats, for a sum over the ranks (exact
    /// below 2^36 steps); 0 on the other ranks.
    fn saved_on_root_parts(&self) -> [f32; 2] {
        let written = match self.comm.is_root() {
            true => self.saved_at.unwrap_or(0),
            false => 0,
        };
        [(written >> 12) as f32, (written & 0xfff) as f32]
    }

    /// Notes the checkpoint that [`Session::saved_on_root_parts`] summed over the ranks names.
    fn learn_saved(&mut self, [high, low]: [f32; 2]) {
        let written = ((high as u64) << 12) | low as u64;
        if written > 0 && self.saved_at != Some(written) {
            self.now_saved(written);
        }
    }

    /// Every rank learns rank 0's last complete checkpoint (a host collective every rank calls).
    fn learn_saved_on_root(&mut self) -> Result<()> {
        let mut v = self.saved_on_root_parts();
        self.comm.all_reduce_sum_host(&mut v)?;
        self.learn_saved(v);
        Ok(())
    }

    /// A `loss.tsv` row for the window that ends at this step (rank 0 evaluates).
    pub fn log_row<B: Backend>(&mut self, run: &mut Run<B>) -> Result<()> {
        let (train_loss, bad_steps, tokens_per_s) = self.window.take(run.batch * run.seq_len);
        let Some(log) = self.log.as_mut() else {
            return Ok(());
        };
        self.last_val = run.trainer.evaluate(&run.eval_set, run.seq_len)?;
        let row = LossRow {
            epoch: run.loader.epochs_done(),
            train_loss,
            val_loss: self.last_val,
            bad_steps,
            tokens_per_s,
            elapsed_s: self.clock.elapsed(),
        };
        self.bar.suspend(|| crate::say!("{}", row.display()));
        log.append(&row)
    }

    /// Rank 0 writes the checkpoint of `done` steps with where the log stands, in the
    /// background once the state is copied (into host memory, or on the GPU within the device,
    /// whence the writer copies it to host memory; announced when written); every rank notes
    /// it (the rule that decides is the same everywhere).
    pub fn checkpoint<B: Backend>(&mut self, run: &Run<B>, done: u64) -> Result<()> {
        let waiting = Instant::now();
        let before = self.writer.wait()?; // one write at a time
        let waited_s = waiting.elapsed().as_secs_f64();
        self.announce(before);
        let stalled = Instant::now();
        // Every rank takes part: under ZeRO-1 the moments are gathered from their shards.
        let writer = &mut self.writer;
        let state = run.trainer.checkpoint_state(|| writer.take_arrays())?;
        if let (Some(log), Some(state)) = (&self.log, state) {
            let log_state = LogState {
                rows: log.rows(),
                elapsed_s: self.clock.elapsed(),
                window: self.window,
                bad_in_a_row: self.bad_in_a_row,
            };
            let meta = run.checkpoint_meta(done, &log_state)?;
            let kept = match &state {
                HostState::Snapshot(s) if !self.snapshot_said => Some(s.bytes()),
                _ => None,
            };
            self.writer.start(&self.ckpt, meta, state, (stalled, waited_s))?;
            if let Some(bytes) = kept {
                self.snapshot_said = true;
                let (gb, ms) = (bytes as f64 / 1e9, self.prepared_s * 1e3);
                self.bar.suspend(|| {
                    crate::say!(
                        "checkpoints: the state is copied within the GPU, then to host memory and the file in the \
                         background ({gb:.2} GB of GPU memory and as much host memory kept for it; the host memory \
                         took {ms:.0} ms to make, before the first step)"
                    )
                });
            }
        } else if let Some(w) = &self.watchdog {
            w.writing(&self.ckpt, done); // complete once rank 0 says so (`stop_requested`)
        }
        Ok(())
    }

    /// Ends a run stopped early after `done` steps: Ctrl-C is an error (exit 130), the
    /// stop asked for by `--stop-after` is not.
    pub fn stop(mut self, why: Stop, done: u64) -> Result<()> {
        self.end_together()?;
        self.last_write()?;
        self.bar.abandon();
        let how = format!("saved {0} (continue with --resume {0})", self.ckpt.display());
        match why {
            Stop::Interrupted => Err(Error::Interrupted(format!("stopped after step {done}; {how}")).on_every_rank()),
            Stop::StopAfter => {
                if self.log.is_some() {
                    crate::say!("stopped after step {done} as --stop-after asked; {how}");
                }
                Ok(())
            }
        }
    }

    /// Rank 0 waits for the last checkpoint's write to end, and every rank learns how it
    /// ended: a failed write ends every rank with its error, not rank 0 alone after the others
    /// have left.
    fn last_write(&mut self) -> Result<()> {
        let written = agree(self.comm, self.writer.wait())?;
        self.announce(written);
        Ok(())
    }

    /// After the last step: waits for the last checkpoint's write, clears the bar and names
    /// the checkpoint (rank 0). Rank 0 may sample for a while now, with the other ranks gone:
    /// no more timeouts.
    pub fn finish(&mut self) -> Result<()> {
        self.end_together()?;
        self.last_write()?;
        self.bar.finish_and_clear();
        if self.log.is_some() {
            crate::say!("saved {}", self.ckpt.display());
        }
        Ok(())
    }
}
