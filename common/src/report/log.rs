//! What a run writes as it goes: `OUT/loss.tsv` (one row per evaluation, flushed at once
//! so an interrupted run keeps its table) and the window of training steps each row
//! summarises. A checkpoint carries the open window and the row count, so a resumed run
//! writes the rows an uninterrupted one would have written.

use crate::atomic_file;
use crate::error::{io_err, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The steps since the last `loss.tsv` row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Sum of the training losses of the steps that updated the model.
    loss_sum: f64,
    steps: u64,
    /// Steps skipped for a non-finite loss or gradient norm.
    bad_steps: u64,
    seconds: f64,
}

impl Window {
    /// A step's loss: it counts unless the step was skipped.
    pub fn add(&mut self, loss: f32, skipped: bool) {
        if skipped {
            self.bad_steps += 1;
        } else {
            self.loss_sum += loss as f64;
            self.steps += 1;
        }
    }

    /// Time spent in steps (their stats may come later).
    pub fn add_time(&mut self, seconds: f64) {
        self.seconds += seconds;
    }

    /// (mean training loss, skipped steps, tokens/s) over the window; the next one starts empty.
    pub fn take(&mut self, tokens_per_step: usize) -> (f32, u64, f64) {
        let w = std::mem::take(self);
        let all_steps = w.steps + w.bad_steps;
        let mean = (w.loss_sum / w.steps as f64) as f32;
        (
            mean,
            w.bad_steps,
            (all_steps * tokens_per_step as u64) as f64 / w.seconds,
        )
    }
}

/// One row of `loss.tsv`.
#[derive(Clone, Copy, Debug)]
pub struct LossRow {
    pub epoch: f64,
    pub train_loss: f32,
    pub val_loss: f32,
    pub bad_steps: u64,
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
}

impl LossRow {
    fn tsv(&self) -> String {
        format!(
            "{:.3}\t{:.4}\t{:.4}\t{}\t{:.0}\t{:.1}",
            self.epoch, self.train_loss, self.val_loss, self.bad_steps, self.tokens_per_s, self.elapsed_s
        )
    }

    /// The row as the terminal shows it, under [`LossLog::header`].
    pub fn display(&self) -> String {
        format!(
            "{:>5.3}  {:>10.4}  {:>8.4}  {:>9}  {:>12.0}  {:>9.1}",
            self.epoch, self.train_loss, self.val_loss, self.bad_steps, self.tokens_per_s, self.elapsed_s
        )
    }
}

/// `OUT/loss.tsv`, flushed after every row.
pub struct LossLog {
    file: std::fs::File,
    path: PathBuf,
    rows: u64,
}

impl LossLog {
    pub const HEADER: &'static str = "epoch\ttrain_loss\tval_loss\tbad_steps\ttokens_per_s\telapsed_s";

    /// The column names as the terminal shows them.
    pub fn header() -> String {
        Self::HEADER.replace('\t', "  ")
    }

    /// Opens `dir/loss.tsv`. A new run starts it anew; a resumed one (`keep_rows`: the rows
    /// its checkpoint had seen written) keeps that many rows and drops any written after
    /// the checkpoint, so the table continues as if the run had never stopped.
    pub fn open(dir: &Path, keep_rows: Option<u64>) -> Result<Self> {
        Self::open_table(dir, Self::HEADER, keep_rows)
    }

    /// As [`LossLog::open`], for a table of other columns (`header`, tab-separated): the
    /// MLP workload's, whose rows it writes with [`LossLog::append_line`].
    pub fn open_table(dir: &Path, header: &str, keep_rows: Option<u64>) -> Result<Self> {
        crate::atomic_file::create_dir(dir)?;
        let path = dir.join("loss.tsv");
        let kept: Vec<String> = match keep_rows {
            // A FIFO or a device in its place is refused, not read.
            Some(n) if path.exists() => {
                let text = crate::input::read_text(&path, "a loss table", crate::input::MAX_LOSS_TABLE, false)?;
                text.lines().skip(1).take(n as usize).map(str::to_string).collect()
            }
            // The table went missing: rows continue in a new one.
            _ => Vec::new(),
        };
        if let Some(n) = keep_rows.filter(|&n| n > kept.len() as u64) {
            eprintln!(
                "note: {} holds {} of the {n} rows the checkpoint counted (lost since it was written): the table goes on from there",
                path.display(),
                kept.len()
            );
        }
        atomic_file::write(&path, |f| {
            writeln!(f, "{header}")?;
            kept.iter().try_for_each(|row| writeln!(f, "{row}"))
        })?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        Ok(LossLog {
            file,
            path,
            rows: kept.len() as u64,
        })
    }

    /// Rows written so far (kept ones included).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn append(&mut self, row: &LossRow) -> Result<()> {
        self.append_line(&row.tsv())
    }

    /// Writes one row (tab-separated values) and syncs it to disk, so that a checkpoint that
    /// counts it never outlives it (a row comes with an evaluation, which takes far longer).
    pub fn append_line(&mut self, tsv: &str) -> Result<()> {
        writeln!(self.file, "{tsv}")
            .and_then(|_| self.file.flush())
            .and_then(|_| self.file.sync_data())
            .map_err(io_err(&self.path))?;
        self.rows += 1;
        Ok(())
    }
}

/// Where a new run finds an earlier run's `files` in `out` (its checkpoint last, so that a move
/// cut short leaves it with the files not yet moved), moves them to `out/earlier/` (whose own
/// are dropped first), so that no checkpoint of one run stays beside another run's table (a
/// resume would join the two) and the earlier run is not lost: `--resume
/// out/earlier/CHECKPOINT --out out/earlier` continues it. Rank 0, before the table opens.
pub fn set_aside_earlier_run(out: &Path, files: &[&str]) -> Result<()> {
    if !files.iter().any(|f| out.join(f).exists()) {
        return Ok(());
    }
    let earlier = out.join("earlier");
    atomic_file::create_dir(&earlier)?;
    for f in files {
        atomic_file::remove_if_present(&earlier.join(f))?;
    }
    for f in files.iter().filter(|f| out.join(f).exists()) {
        std::fs::rename(out.join(f), earlier.join(f)).map_err(io_err(out.join(f)))?;
    }
    let checkpoint = files.last().map_or(earlier.clone(), |f| earlier.join(f));
    crate::say!(
        "note: {} held an earlier run's files: moved to {} (--resume {} --out {} continues that run)",
        out.display(),
        earlier.display(),
        checkpoint.display(),
        earlier.display()
    );
    Ok(())
}

/// Where a run's log stands, saved in every checkpoint so that a resumed run continues the
/// same table: the rows written, the training time so far, the open window, and the steps
/// skipped in a row up to it (`--max-bad-steps` goes on counting them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogState {
    pub rows: u64,
    pub elapsed_s: f64,
    pub window: Window,
    /// Absent from checkpoints written before it was kept: 0.
    #[serde(default)]
    pub bad_in_a_row: u64,
}

impl LogState {
    /// Why no run could have written this state after `step` steps, if none could: its
    /// counters are past the steps run, or a time or loss sum is not a finite number. (A
    /// checkpoint's checksum covers what was written, not whether it makes sense; counters
    /// past their range would overflow as the run goes on.)
    pub fn impossible_after(&self, step: u64) -> Option<String> {
        let w = &self.window;
        let counted = w.steps.checked_add(w.bad_steps);
        if counted.is_none_or(|n| n > step) || self.bad_in_a_row > step {
            return Some(format!(
                "its log counts more steps ({} in the open window, {} skipped, {} skipped in a row) than the {step} it has run",
                w.steps, w.bad_steps, self.bad_in_a_row
            ));
        }
        let times = [self.elapsed_s, w.seconds];
        if !(times.iter().all(|t| t.is_finite() && *t >= 0.0) && w.loss_sum.is_finite()) {
            return Some("its log holds a time or loss sum that is not a finite number".into());
        }
        None
    }
}
