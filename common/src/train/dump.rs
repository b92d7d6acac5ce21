//! `train --dump-batches FILE`: every step's batch, in the order the steps trained on them,
//! and every step's loss, learning rate and gradient norm, so that another implementation
//! can train the same model on the same data and compare (gpu/py/pytorch_train_compare.py).
//!
//! `FILE` holds raw little-endian `i32` token ids, step after step: the step's inputs, B×T
//! row-major, then its targets, B×T. `FILE.json` (written at the end of the run, or where it
//! stops early) describes it: [`DumpMeta`], with the run's optimiser settings and one entry per
//! step in `loss`, `lr`, `grad_norm` and `skipped`.

use super::Run;
use crate::backend::Backend;
use crate::data::Batch;
use crate::error::{io_err, Error, Result};
use crate::optim::{OptimConfig, StepStats};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// `FILE.json`'s `format`.
pub const DUMP_FORMAT: &str = "gpt2-rs batch dump 1";

/// What `FILE.json` says about `FILE`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DumpMeta {
    pub format: String,
    /// How `FILE` is laid out, in words.
    pub layout: String,
    /// Rows and positions of every step's batch (the whole step's, micro-batches together).
    pub batch: usize,
    pub seq_len: usize,
    /// The 0-based step of the first batch (0 unless the run was resumed).
    pub first_step: u64,
    /// Steps in `FILE`.
    pub steps: u64,
    pub tokenizer: String,
    pub vocab_size: usize,
    pub padded_vocab_size: usize,
    /// Micro-batches per step: the loss is their mean, the gradient their sum's.
    pub grad_accum: usize,
    /// The backend's arithmetic (`fp32`, `tf32`, `bf16`; the CPU's is fp32).
    pub precision: String,
    pub device: String,
    pub optimizer: OptimConfig,
    /// Per step: the mean loss over the batch, the learning rate it was updated with, the
    /// gradients' global norm before clipping, whether the update was skipped (a non-finite
    /// loss or norm, which JSON writes as null).
    #[serde(deserialize_with = "nan_for_null")]
    pub loss: Vec<f32>,
    pub lr: Vec<f32>,
    #[serde(deserialize_with = "nan_for_null")]
    pub grad_norm: Vec<f32>,
    pub skipped: Vec<bool>,
}

/// Reads back the nulls JSON has for non-finite numbers, as NaN.
fn nan_for_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<f32>, D::Error> {
    let values: Vec<Option<f32>> = serde::Deserialize::deserialize(d)?;
    Ok(values.into_iter().map(|x| x.unwrap_or(f32::NAN)).collect())
}

/// A dump being written: the batches go to the file as the steps take them, the stats as
/// they are read back, and the description at [`BatchDump::finish`].
pub struct BatchDump {
    path: PathBuf,
    /// The new dump, which replaces `path` only when finished (an interrupted run leaves the
    /// earlier dump and its description as they were).
    file: crate::atomic_file::Pending,
    meta: DumpMeta,
    /// Steps whose batch is in the file.
    batches: u64,
}

/// The description of a dump of `run`'s steps (the per-step lists empty).
pub fn meta_of<B: Backend>(run: &Run<B>) -> DumpMeta {
    let be = run.trainer.be;
    DumpMeta {
        format: DUMP_FORMAT.into(),
        layout: "little-endian int32; per step: the inputs (batch x seq_len, row-major), then the targets (the same)"
            .into(),
        batch: run.batch,
        seq_len: run.seq_len,
        first_step: run.start_step,
        steps: 0,
        tokenizer: run.tok.kind().name().into(),
        vocab_size: run.config.vocab_size,
        padded_vocab_size: run.config.padded_vocab_size,
        grad_accum: run.trainer.micro_batches(),
        precision: be.precision().name().into(),
        device: be.name(),
        optimizer: run.trainer.opt.config,
        loss: Vec::new(),
        lr: Vec::new(),
        grad_norm: Vec::new(),
        skipped: Vec::new(),
    }
}

/// `FILE.json`, for `FILE`.
pub fn meta_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".json");
    PathBuf::from(p)
}

impl BatchDump {
    /// Starts a dump that replaces `path` when finished. `meta`'s per-step lists and counts
    /// start empty.
    pub fn create(path: &Path, meta: DumpMeta) -> Result<Self> {
        if path.is_dir() {
            crate::bail_input!("--dump-batches {}: is a directory; give a file name", path.display());
        }
        Ok(BatchDump {
            path: path.to_path_buf(),
            file: crate::atomic_file::Pending::create(path)?,
            meta: DumpMeta {
                steps: 0,
                loss: Vec::new(),
                lr: Vec::new(),
                grad_norm: Vec::new(),
                skipped: Vec::new(),
                ..meta
            },
            batches: 0,
        })
    }

    /// The batch of the next step.
    pub fn add_batch(&mut self, batch: &Batch) -> Result<()> {
        let n = self.meta.batch * self.meta.seq_len;
        assert!(
            batch.inputs.len() == n && batch.targets.len() == n,
            "a dumped batch is {}×{}",
            self.meta.batch,
            self.meta.seq_len
        );
        for ids in [&batch.inputs, &batch.targets] {
            let bytes: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.file.write_all(&bytes)?;
        }
        self.batches += 1;
        Ok(())
    }

    /// The stats of steps read back, in order (each step once, as the loop records them).
    pub fn add_stats(&mut self, finished: &[(u64, StepStats)]) {
        for (step, s) in finished {
            let expected = self.meta.first_step + self.meta.loss.len() as u64;
            debug_assert_eq!(*step, expected, "steps recorded in order");
            self.meta.loss.push(s.loss);
            self.meta.lr.push(s.lr);
            self.meta.grad_norm.push(s.grad_norm);
            self.meta.skipped.push(s.skipped);
        }
    }

    /// Puts the batches in place of an earlier dump and writes `FILE.json` for the steps
    /// whose batch and stats are both in hand; returns its path and the steps it describes.
    /// The earlier description goes first, so that no moment pairs it with the new batches.
    pub fn finish(self) -> Result<(PathBuf, u64)> {
        let sidecar = meta_path(&self.path);
        crate::atomic_file::remove_if_present(&sidecar)?;
        self.file.commit()?;
        let steps = self.batches.min(self.meta.loss.len() as u64);
        let mut meta = self.meta;
        meta.steps = steps;
        for list in [&mut meta.loss, &mut meta.lr, &mut meta.grad_norm] {
            list.truncate(steps as usize);
        }
        meta.skipped.truncate(steps as usize);
        let json = serde_json::to_vec_pretty(&meta).expect("plain data serialises");
        crate::atomic_file::write(&sidecar, |f| f.write_all(&json))?;
        Ok((sidecar, steps))
    }
}

/// Reads a dump back: its description and every step's batch. Refuses, in one line, a file
/// whose size or description does not match.
pub fn read(path: &Path) -> Result<(DumpMeta, Vec<Batch>)> {
    let sidecar = meta_path(path);
    crate::input::refuse_special(&sidecar, "a batch dump description")?;
    crate::input::refuse_special(path, "a batch dump")?;
    let json = std::fs::read(&sidecar).map_err(io_err(&sidecar))?;
    let meta: DumpMeta = serde_json::from_slice(&json)
        .map_err(|e| Error::Input(format!("{}: not a batch dump description ({e})", sidecar.display())))?;
    if meta.format != DUMP_FORMAT {
        crate::bail_input!(
            "{}: format {:?}, expected {DUMP_FORMAT:?}",
            sidecar.display(),
            meta.format
        );
    }
    let per_step = 2 * 4 * (meta.batch as u64).saturating_mul(meta.seq_len as u64);
    let expected = per_step.checked_mul(meta.steps);
    let mut file = File::open(path).map_err(io_err(path))?;
    let actual = file.metadata().map_err(io_err(path))?.len();
    if expected.is_none_or(|e| actual < e) || meta.loss.len() as u64 != meta.steps {
        crate::bail_input!(
            "{}: {actual} bytes and {} losses for {} steps of {}×{} (expected {} bytes)",
            path.display(),
            meta.loss.len(),
            meta.steps,
            meta.batch,
            meta.seq_len,
            expected.map_or("too many".into(), |e| e.to_string())
        );
    }
    let n = meta.batch * meta.seq_len;
    let mut bytes = vec![0u8; 4 * n];
    let mut ids = || -> Result<Vec<i32>> {
        file.read_exact(&mut bytes).map_err(io_err(path))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    };
    let batches = (0..meta.steps)
        .map(|_| {
            Ok(Batch {
                inputs: ids()?,
                targets: ids()?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((meta, batches))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> DumpMeta {
        DumpMeta {
            format: DUMP_FORMAT.into(),
            layout: "test".into(),
            batch: 2,
            seq_len: 3,
            first_step: 0,
            steps: 99, // reset by create
            tokenizer: "byte".into(),
            vocab_size: 256,
            padded_vocab_size: 256,
            grad_accum: 1,
            precision: "fp32".into(),
            device: "cpu".into(),
            optimizer: OptimConfig::gpt2(1e-3, 2, 10),
            loss: vec![1.0],
            lr: vec![],
            grad_norm: vec![],
            skipped: vec![],
        }
    }

    fn batch(k: i32) -> Batch {
        Batch {
            inputs: (0..6).map(|i| k * 10 + i).collect(),
            targets: (0..6).map(|i| -(k * 10 + i) - 1).collect(),
        }
    }

    fn stats(loss: f32) -> StepStats {
        StepStats {
            loss,
            grad_norm: 2.0 * loss,
            lr: 0.5 * loss,
            skipped: false,
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpt2-dump-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.join("batches.bin")
    }

    #[test]
    fn a_dump_reads_back_as_written() {
        let path = tmp("roundtrip");
        let mut dump = BatchDump::create(&path, meta()).unwrap();
        dump.add_batch(&batch(1)).unwrap();
        dump.add_batch(&batch(2)).unwrap();
        dump.add_stats(&[(0, stats(3.25))]);
        dump.add_batch(&batch(3)).unwrap();
        let skipped = StepStats {
            loss: f32::NAN,
            skipped: true,
            ..stats(1.0)
        };
        dump.add_stats(&[(1, stats(1.0 / 3.0)), (2, stats(f32::MIN_POSITIVE)), (3, skipped)]);
        assert_eq!(dump.finish().unwrap(), (meta_path(&path), 3));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 * 2 * 6 * 4);

        let (m, batches) = read(&path).unwrap();
        assert_eq!(m.steps, 3);
        assert_eq!(batches, vec![batch(1), batch(2), batch(3)]);
        // f32 values survive JSON exactly; the stats of a step whose batch is not in the file
        // are left out.
        assert_eq!(m.loss, vec![3.25, 1.0 / 3.0, f32::MIN_POSITIVE]);
        assert_eq!(m.lr[1], 0.5 / 3.0);
        assert_eq!(m.grad_norm[0], 6.5);
        assert_eq!(m.optimizer, meta().optimizer);
        // Little-endian i32, inputs then targets per step.
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(raw[..4], 10i32.to_le_bytes());
        assert_eq!(raw[24..28], (-11i32).to_le_bytes());
    }

    #[test]
    fn a_skipped_step_reads_back_as_nan() {
        let path = tmp("nan");
        let mut dump = BatchDump::create(&path, meta()).unwrap();
        dump.add_batch(&batch(1)).unwrap();
        let nan = StepStats {
            loss: f32::NAN,
            grad_norm: f32::INFINITY,
            skipped: true,
            ..stats(1.0)
        };
        dump.add_stats(&[(0, nan)]);
        dump.finish().unwrap();
        let (m, _) = read(&path).unwrap();
        assert!(m.loss[0].is_nan() && m.grad_norm[0].is_nan() && m.skipped[0]);
    }

    #[test]
    fn a_step_without_its_stats_is_left_out() {
        // The run stopped between a batch and its stats: the description covers what is whole.
        let path = tmp("partial");
        let mut dump = BatchDump::create(&path, meta()).unwrap();
        dump.add_batch(&batch(1)).unwrap();
        dump.add_batch(&batch(2)).unwrap();
        dump.add_stats(&[(0, stats(1.0))]);
        dump.finish().unwrap();
        let (m, batches) = read(&path).unwrap();
        assert_eq!((m.steps, batches.len(), m.loss.len()), (1, 1, 1));
    }

    #[test]
    fn bad_paths_and_short_files_are_one_clear_error() {
        let path = tmp("bad");
        let missing_dir = path.parent().unwrap().join("no-such-dir").join("b.bin");
        let err = BatchDump::create(&missing_dir, meta()).err().unwrap();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(err.to_string().contains("no-such-dir"), "{err}");
        assert_eq!(err.exit_code(), 2);
        let err = BatchDump::create(path.parent().unwrap(), meta()).err().unwrap();
        assert!(err.to_string().contains("is a directory"), "{err}");

        let mut dump = BatchDump::create(&path, meta()).unwrap();
        dump.add_batch(&batch(1)).unwrap();
        dump.add_stats(&[(0, stats(1.0))]);
        dump.finish().unwrap();
        std::fs::write(&path, [0u8; 10]).unwrap(); // cut short
        let err = read(&path).err().unwrap();
        assert!(err.to_string().contains("10 bytes"), "{err}");
        assert_eq!(err.to_string().lines().count(), 1);
        std::fs::write(meta_path(&path), b"{}").unwrap();
        let err = read(&path).err().unwrap();
        assert!(err.to_string().contains("not a batch dump"), "{err}");
    }
}
