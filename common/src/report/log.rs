//! What a run writes as it goes: `OUT/loss.tsv` (one row per evaluation, flushed at once
//! so an interrupted run keeps its table) and the window of training losses and step times
//! each row summarises.

use crate::error::{io_err, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Training losses and step time since the last `loss.tsv` row.
#[derive(Default)]
pub struct Window {
    loss: f64,
    steps: u64,
    seconds: f64,
}

impl Window {
    pub fn add(&mut self, loss: f32, seconds: f64) {
        self.loss += loss as f64;
        self.steps += 1;
        self.seconds += seconds;
    }

    /// Mean training loss and tokens/s over the window; the next window starts empty.
    pub fn take(&mut self, tokens_per_step: usize) -> (f32, f64) {
        let w = std::mem::take(self);
        (
            (w.loss / w.steps as f64) as f32,
            (w.steps * tokens_per_step as u64) as f64 / w.seconds,
        )
    }
}

/// One row of `loss.tsv`.
#[derive(Clone, Copy, Debug)]
pub struct LossRow {
    pub epoch: f64,
    pub train_loss: f32,
    pub val_loss: f32,
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
}

impl LossRow {
    fn tsv(&self) -> String {
        format!(
            "{:.3}\t{:.4}\t{:.4}\t{:.0}\t{:.1}",
            self.epoch, self.train_loss, self.val_loss, self.tokens_per_s, self.elapsed_s
        )
    }

    /// The row as the terminal shows it, under [`LossLog::header`].
    pub fn display(&self) -> String {
        format!(
            "{:>5.3}  {:>10.4}  {:>8.4}  {:>12.0}  {:>9.1}",
            self.epoch, self.train_loss, self.val_loss, self.tokens_per_s, self.elapsed_s
        )
    }
}

/// `OUT/loss.tsv`, flushed after every row.
pub struct LossLog {
    file: std::fs::File,
    path: PathBuf,
}

impl LossLog {
    const HEADER: &'static str = "epoch\ttrain_loss\tval_loss\ttokens_per_s\telapsed_s";

    /// The column names as the terminal shows them.
    pub fn header() -> String {
        Self::HEADER.replace('\t', "  ")
    }

    /// Opens `dir/loss.tsv`: appended to when `append` and it exists, else started anew.
    pub fn open(dir: &Path, append: bool) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let path = dir.join("loss.tsv");
        let keep = append && path.exists();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(keep)
            .write(true)
            .truncate(!keep)
            .open(&path)
            .map_err(io_err(&path))?;
        if !keep {
            writeln!(file, "{}", Self::HEADER).map_err(io_err(&path))?;
        }
        Ok(LossLog { file, path })
    }

    pub fn append(&mut self, row: &LossRow) -> Result<()> {
        writeln!(self.file, "{}", row.tsv())
            .and_then(|_| self.file.flush())
            .map_err(io_err(&self.path))
    }
}
