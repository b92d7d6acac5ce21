//! The MLP's checkpoints: `mnist` writes `OUT/mlp.ckpt` where a run is stopped (Ctrl-C,
//! SIGTERM, SIGHUP, `--stop-after`), at its end, and after an epoch once 30 s have passed
//! since the last; `--resume` continues
//! from one to the table and the bits of the run that was never stopped. The file is small
//! (three arrays of the MLP's size at most), so it is read whole and checked before use.
//!
//! ```text
//! offset  size      field (all integers little-endian)
//! 0       8         magic b"GPT2MLPK"
//! 8       4         u32 format version (1)
//! 12      4         u32 reserved (0)
//! 16      8         u64 meta length L
//! 24      L         JSON: Meta (the settings that fix the run, the steps done, the log)
//! 24+L    8         u64 parameter count N (= the layers' of settings.widths)
//! 32+L    4N        params  f32
//!         4N × k    the optimiser's state, f32: SGD's velocity (k = 1), AdamW's m and v (k = 2)
//!         8         u64 xxHash64 (seed 0) of every byte above
//! ```
//!
//! The layout is the one GPT-2's checkpoints have too: [`envelope`] writes and reads it.

use super::data::Dataset;
use super::{OptimizerKind, RunSettings};
use crate::checkpoint::envelope::{self, MLP};
use crate::error::{io_err, Error, Result};
use crate::report::log::LogState;
use serde::{Deserialize, Serialize};
use std::path::Path;
use xxhash_rust::xxh64::Xxh64;

pub const MAGIC: [u8; 8] = MLP.magic;
pub const FORMAT_VERSION: u32 = MLP.version;
/// The checkpoint's name in a run's `--out`.
pub const FILE: &str = "mlp.ckpt";

/// What fixes a run's values: a run resumes only with the same (each shown as its flag).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Input width, hidden widths, classes.
    pub widths: Vec<usize>,
    /// "sgd" | "adamw".
    pub optimizer: String,
    pub lr: f32,
    /// SGD's momentum; none with AdamW.
    pub momentum: Option<f32>,
    pub weight_decay: f32,
    pub seed: u64,
    pub batch: usize,
    pub epochs: u64,
    /// The training and the test set, as [`fingerprint`] describes them.
    pub train_set: String,
    pub test_set: String,
}

impl Settings {
    /// The settings of a run of `run` on these sets with these layer widths.
    pub fn of(run: &RunSettings, widths: &[usize], train: &Dataset, test: &Dataset) -> Settings {
        Settings {
            widths: widths.to_vec(),
            optimizer: run.optimizer.name().into(),
            lr: run.lr,
            momentum: (run.optimizer == OptimizerKind::Sgd).then_some(run.momentum),
            weight_decay: run.weight_decay,
            seed: run.seed,
            batch: run.batch,
            epochs: run.epochs,
            train_set: fingerprint(train),
            test_set: fingerprint(test),
        }
    }

    /// Each setting as the flag (or the data) that gives it, and its value.
    fn shown(&self) -> [(&'static str, String); 10] {
        let hidden = self.widths.get(1..self.widths.len().saturating_sub(1)).unwrap_or(&[]);
        let hidden: Vec<String> = hidden.iter().map(|w| w.to_string()).collect();
        [
            ("--hidden", hidden.join(",")),
            ("--optimizer", self.optimizer.clone()),
            ("--lr", self.lr.to_string()),
            ("--momentum", self.momentum.map_or("none".into(), |m| m.to_string())),
            ("--weight-decay", self.weight_decay.to_string()),
            ("--seed", self.seed.to_string()),
            ("--batch", self.batch.to_string()),
            ("--epochs", self.epochs.to_string()),
            ("training set", self.train_set.clone()),
            ("test set", self.test_set.clone()),
        ]
    }

    /// Arrays of optimiser state the checkpoint holds after the parameters.
    fn state_arrays(&self) -> Option<usize> {
        match self.optimizer.as_str() {
            "sgd" => Some(1),
            "adamw" => Some(2),
            _ => None,
        }
    }
}

/// A data set in a few words that change with any pixel or label: "600 images of 12×12,
/// xxh64 0x…".
pub fn fingerprint(set: &Dataset) -> String {
    let im = &set.images;
    let mut h = Xxh64::new(0);
    for n in [im.count, im.rows, im.cols] {
        h.update(&(n as u64).to_le_bytes());
    }
    h.update(&im.pixels);
    h.update(&set.labels);
    format!(
        "{} images of {}×{}, xxh64 {:#018x}",
        im.count,
        im.rows,
        im.cols,
        h.digest()
    )
}

/// Everything but the arrays, as JSON in the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub settings: Settings,
    /// Optimiser steps done.
    pub step: u64,
    /// Where `loss.tsv` stood: its rows, the time so far, the epoch's steps not yet in a row.
    pub log: LogState,
}

pub struct MlpCheckpoint {
    pub meta: Meta,
    pub params: Vec<f32>,
    /// SGD's velocity, or AdamW's m and v; each in the parameters' layout.
    pub state: Vec<Vec<f32>>,
}

/// Writes a checkpoint atomically (a crash leaves the old file or the new one), in the layout
/// GPT-2's checkpoints have ([`envelope::write`]).
pub fn save(path: &Path, meta: &Meta, params: &[f32], state: &[&[f32]]) -> Result<()> {
    let json = serde_json::to_vec(meta)
        .map_err(|e| Error::Input(format!("{}: cannot encode checkpoint metadata: {e}", path.display())))?;
    let arrays: Vec<&[f32]> = std::iter::once(params).chain(state.iter().copied()).collect();
    envelope::write(path, &MLP, &json, params.len(), &arrays).map(|_| ())
}

/// Reads a checkpoint's bytes (see [`parse`]): a regular file (a FIFO or a device would block
/// or never end: [`crate::input::refuse_special`]).
pub fn read(path: &Path) -> Result<Vec<u8>> {
    let shown = path.display();
    crate::input::refuse_special(path, "an MLP checkpoint file")?;
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => crate::bail_input!("{shown}: is a directory, not an MLP checkpoint file"),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => crate::bail_input!("{shown}: no such checkpoint file"),
        Err(e) => return Err(io_err(path)(e)),
    }
    std::fs::read(path).map_err(io_err(path))
}

/// A checkpoint from its bytes, every part checked: magic, version, lengths, checksum, the
/// settings, the parameter count against the widths, the steps against the schedule, the log,
/// and that every value is finite. `path` names it in errors.
pub fn parse(bytes: &[u8], path: &Path) -> Result<MlpCheckpoint> {
    let shown = path.display();
    let bad = |why: String| Error::Input(format!("{shown}: {why}"));
    let envelope::Parts { meta, count, arrays } = envelope::parse::<Meta>(bytes, &MLP, path)?;
    let s = &meta.settings;
    let Some(k) = s.state_arrays() else {
        return Err(bad(format!(
            "checkpoint names an unknown optimiser \"{}\"",
            s.optimizer.escape_default()
        )));
    };
    let widths_ok = s.widths.len() >= 2
        && s.widths.iter().all(|&w| w > 0)
        && s.widths.windows(2).all(|p| {
            p[0].checked_mul(p[1])
                .is_some_and(|n| n < crate::backend::MAX_TENSOR_VALUES)
        });
    if !widths_ok || s.batch == 0 || s.epochs == 0 {
        return Err(bad(format!(
            "checkpoint settings no run could have: widths {:?}, batch {}, epochs {}",
            s.widths, s.batch, s.epochs
        )));
    }
    // Each layer's weights and biases (each below 2^31, checked above); the sum checked, as the
    // count of layers is the file's word.
    let n = s
        .widths
        .windows(2)
        .try_fold(0usize, |n, p| n.checked_add(p[0] * p[1] + p[1]));
    let Some(n) = n else {
        return Err(bad(format!(
            "checkpoint widths {:?} hold more parameters than any file can",
            s.widths
        )));
    };
    if count != n as u64 {
        return Err(bad(format!(
            "checkpoint holds {count} parameters but its widths {:?} need {n}",
            s.widths
        )));
    }
    let needed = n.checked_mul(4 * (1 + k));
    if needed != Some(arrays.len()) {
        let needed = needed.map_or("more".to_string(), |b| b.to_string());
        return Err(bad(format!(
            "checkpoint holds {} bytes of arrays where its settings need {needed} ({n} parameters, {} array(s))",
            arrays.len(),
            1 + k
        )));
    }
    if let Some(why) = meta.log.impossible_after(meta.step) {
        return Err(bad(format!("cannot resume: {why}")));
    }
    // n > 0 (the widths are positive), and the arrays fill the rest exactly (checked above).
    let mut arrays: Vec<Vec<f32>> = arrays.chunks_exact(4 * n).map(bytemuck::pod_collect_to_vec).collect();
    let names = match k {
        1 => ["params", "velocity", ""],
        _ => ["params", "m", "v"],
    };
    envelope::check_finite(names.into_iter().zip(arrays.iter().map(Vec::as_slice)), path)?;
    let params = arrays.remove(0);
    Ok(MlpCheckpoint {
        meta,
        params,
        state: arrays,
    })
}

/// Refuses to resume a run whose settings differ from the checkpoint's, naming each one.
pub fn check_same_run(saved: &Settings, asked: &Settings) -> Result<()> {
    let conflicts: Vec<String> = saved
        .shown()
        .into_iter()
        .zip(asked.shown())
        .filter(|(a, b)| a.1 != b.1)
        .map(|((flag, was), (_, now))| format!("{flag} {was} (this run: {now})"))
        .collect();
    if !conflicts.is_empty() {
        crate::bail_input!(
            "cannot resume: the checkpoint's run had {}; resume with the flags and data it was started with",
            conflicts.join("; ")
        );
    }
    // The input and output widths follow from the data and the classes; a file may say others.
    if saved.widths != asked.widths {
        crate::bail_input!(
            "cannot resume: the checkpoint's layers are {:?} where this run's are {:?}",
            saved.widths,
            asked.widths
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use xxhash_rust::xxh64::xxh64;

    /// A valid file: widths 3 → 2, SGD (one state array), 4 steps done.
    fn valid() -> Vec<u8> {
        let settings = Settings {
            widths: vec![3, 2],
            optimizer: "sgd".into(),
            lr: 0.05,
            momentum: Some(0.9),
            weight_decay: 0.0,
            seed: 1,
            batch: 2,
            epochs: 2,
            train_set: "t".into(),
            test_set: "s".into(),
        };
        let meta = Meta {
            settings,
            step: 4,
            log: LogState::default(),
        };
        let dir = std::env::temp_dir().join(format!("mlp-ckpt-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("valid.ckpt");
        save(&path, &meta, &[0.5; 8], &[&[0.25; 8]]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        bytes
    }

    /// `bytes` with its checksum recomputed, so that the checks behind it are reached.
    fn resealed(mut bytes: Vec<u8>) -> Vec<u8> {
        let body = bytes.len() - 8;
        let sum = xxh64(&bytes[..body], 0);
        bytes[body..].copy_from_slice(&sum.to_le_bytes());
        bytes
    }

    fn refused(bytes: Vec<u8>, needle: &str) {
        let e = parse(&resealed(bytes), Path::new("c.ckpt"))
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.starts_with("c.ckpt: ") && e.contains(needle) && !e.contains('\n'),
            "{e}"
        );
    }

    #[test]
    fn the_checks_behind_the_checksum_refuse_in_one_line() {
        let ok = parse(&valid(), Path::new("c.ckpt")).unwrap();
        assert_eq!(
            (ok.meta.step, ok.params, ok.state),
            (4, vec![0.5; 8], vec![vec![0.25; 8]])
        );
        let meta_len_at = 16..24;
        let mut huge = valid();
        huge[meta_len_at.clone()].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
        refused(huge, "truncated");
        let mut short = valid();
        short[meta_len_at].copy_from_slice(&3u64.to_le_bytes());
        refused(short, "metadata is invalid");
        let mut nan = valid();
        let last = nan.len() - 12;
        nan[last..last + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        refused(nan, "velocity[7] = NaN");
        let mut count = valid();
        let len = u64::from_le_bytes(count[16..24].try_into().unwrap()) as usize;
        count[24 + len..32 + len].copy_from_slice(&9u64.to_le_bytes());
        refused(count, "holds 9 parameters");
        let mut extra = valid();
        extra.splice(extra.len() - 8..extra.len() - 8, [0u8; 4]);
        refused(extra, "bytes of arrays");
        let text = String::from_utf8_lossy(&valid()[24..24 + len]).replace("\"sgd\"", "\"sga\"");
        let other = [&valid()[..24], text.as_bytes(), &valid()[24 + len..]].concat();
        refused(other, "unknown optimiser");
    }
}
