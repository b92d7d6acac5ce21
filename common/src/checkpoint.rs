//! Checkpoints: everything needed to continue a training run exactly (config, parameters,
//! AdamW moments, step, data cursor, run settings) in one versioned, checksummed file that
//! is replaced atomically, so a crash mid-save never costs the previous checkpoint.
//!
//! ```text
//! offset  size      field (all integers little-endian)
//! 0       8         magic b"GPT2RSCK"
//! 8       4         u32 format version (2)
//! 12      4         u32 reserved (0)
//! 16      8         u64 meta length L
//! 24      L         JSON: CheckpointMeta's fields, and "tensors": the parameter table
//!                   as laid out for this config, [[name, offset, rows, cols], ...]
//! 24+L    8         u64 parameter count N (= ParamLayout::new(&meta.config).total)
//! 32+L    4N        params  f32
//!         4N        m       f32 (AdamW first moment)
//!         4N        v       f32 (AdamW second moment)
//!         8         u64 xxHash64 (seed 0) of every byte above
//! ```
//!
//! The layout is the one the MLP's checkpoints have too: [`envelope`] writes and reads it.

pub mod envelope;

use crate::backend::{Snapshot, SnapshotTimes};
use crate::error::{Error, Result};
use crate::model::params::{ParamEntry, ParamSpec, Scope, PARAMS};
use crate::model::{ModelConfig, ParamLayout};
use envelope::{first_non_finite, GPT2};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const MAGIC: [u8; 8] = GPT2.magic;
/// The one format version this build writes and reads (see [`envelope::GPT2`]).
pub const FORMAT_VERSION: u32 = GPT2.version;

/// Everything but the three big arrays. Serialized as JSON inside the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub config: ModelConfig,
    /// "byte" | "gpt2".
    pub tokenizer: String,
    /// Optimizer steps completed.
    pub step: u64,
    /// Data cursor: the epoch and the step within it where the next batch starts.
    pub data_epoch: u64,
    pub data_step_in_epoch: u64,
    /// The order the cursor counts windows in (`data::DataOrder::name`); absent from imported
    /// checkpoints and from those written before it was recorded (Fisher–Yates then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_order: Option<String>,
    pub seed: u64,
    /// The run's settings (lr, batch, seq_len, ...), opaque to this module.
    pub train: serde_json::Value,
    /// Where the run's log stood (rows written, time so far, the steps since the last
    /// row), opaque to this module.
    pub progress: serde_json::Value,
    /// The corpus the run trained on (absent from imported checkpoints and from those
    /// written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<crate::data::DataIdentity>,
    /// `--precision fp8`: the FP8 scale slots and their amax histories
    /// ([`crate::model::Fp8State::save`]), so that a resumed run scales as the uninterrupted
    /// one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8: Option<Vec<f32>>,
}

/// The checkpoint's header JSON: the metadata and the tensor list it was written with.
#[derive(Serialize)]
struct HeaderOut<'a> {
    #[serde(flatten)]
    meta: &'a CheckpointMeta,
    tensors: Vec<TensorRecord>,
}

#[derive(Deserialize)]
struct HeaderIn {
    #[serde(flatten)]
    meta: CheckpointMeta,
    tensors: Vec<TensorRecord>,
}

/// One tensor of the parameter table: name, offset in the flat arrays, (rows, cols).
type TensorRecord = (String, usize, usize, usize);

/// The length of [`tensor_records`] for `config`, without building the layout.
pub(crate) fn tensor_count(config: &ModelConfig) -> usize {
    let per_scope = |s: &ParamSpec| match s.scope {
        Scope::Model => 1,
        Scope::Block => config.n_layer,
    };
    PARAMS.iter().map(per_scope).sum()
}

fn tensor_records(layout: &ParamLayout) -> Vec<TensorRecord> {
    let record = |e: &ParamEntry| (e.name.clone(), e.range.start, e.shape[0], e.shape[1]);
    layout.entries.iter().map(record).collect()
}

pub struct Checkpoint {
    pub meta: CheckpointMeta,
    pub params: Vec<f32>,
    /// AdamW first moment, same layout as `params`.
    pub m: Vec<f32>,
    /// AdamW second moment, same layout as `params`.
    pub v: Vec<f32>,
}

/// Write a checkpoint, atomically (see [`crate::atomic_file`]): a crash leaves either the
/// old file or the new one. The slices are borrowed so a backend can pass its own memory
/// without copying.
pub fn save(path: &Path, meta: &CheckpointMeta, params: &[f32], m: &[f32], v: &[f32]) -> Result<()> {
    save_timed(path, meta, params, m, v).map(|_| ())
}

/// [`save`], returning the seconds its syncs to disk took (the rest of its time is checking,
/// checksumming and writing into the OS's cache).
fn save_timed(path: &Path, meta: &CheckpointMeta, params: &[f32], m: &[f32], v: &[f32]) -> Result<f64> {
    let shown = path.display();
    meta.config
        .validate()
        .map_err(|e| Error::Input(format!("{shown}: cannot save checkpoint: model config is invalid: {e}")))?;
    let layout = ParamLayout::new(&meta.config);
    let n = layout.total;
    let wrong: Vec<String> = [("params", params.len()), ("m", m.len()), ("v", v.len())]
        .iter()
        .filter(|&&(_, len)| len != n)
        .map(|(name, len)| format!("{name} has {len} values"))
        .collect();
    if !wrong.is_empty() {
        crate::bail_input!(
            "{shown}: cannot save checkpoint: {} but the model config needs {n}",
            wrong.join(", ")
        );
    }
    if let Some(bad) = first_non_finite(named([params, m, v])) {
        return Err(Error::Training(format!(
            "{shown}: not saving a checkpoint that holds {bad}: the model has diverged"
        )));
    }
    let header = HeaderOut {
        meta,
        tensors: tensor_records(&layout),
    };
    let json = serde_json::to_vec(&header)
        .map_err(|e| Error::Input(format!("{shown}: cannot encode checkpoint metadata: {e}")))?;
    let synced = envelope::write(path, &GPT2, &json, n, &[params, m, v])?;
    Ok(synced.as_secs_f64())
}

/// A checkpoint's training state on its way to the file: parameters, m and v.
pub enum HostState {
    /// Copied into host memory already (while training waited).
    Arrays([Vec<f32>; 3]),
    /// A copy on the device ([`crate::backend::Backend::snapshot`]), which the writer's thread
    /// brings into host memory first, while training goes on.
    Snapshot(Box<dyn Snapshot>),
}

impl From<[Vec<f32>; 3]> for HostState {
    fn from(arrays: [Vec<f32>; 3]) -> Self {
        HostState::Arrays(arrays)
    }
}

/// Checkpoints written by a background thread, so training stalls only while the state is
/// copied (to host memory, or within the device: [`HostState`]): one write at a time
/// (starting one waits for the one before), and dropping the writer waits too, so a run that
/// ends or fails leaves a complete file (the write itself is atomic, as [`save`]'s).
#[derive(Default)]
pub struct BackgroundWriter {
    pending: Option<(SaveReport, std::thread::JoinHandle<Written>)>,
    /// The host arrays of the last write, kept for the next copy (fresh memory costs page
    /// faults: most of the copy's time for GPT-2 124M).
    spare: Option<[Vec<f32>; 3]>,
    /// The first checkpoint's arrays, being allocated and touched on a thread of their own
    /// from the start of the run ([`BackgroundWriter::prepare_arrays`]), so that not even the
    /// first checkpoint stalls training for page faults (1.2 s of a 124M checkpoint's copy).
    preparing: Option<std::thread::JoinHandle<[Vec<f32>; 3]>>,
}

/// What the writer thread hands back: its times (or error) and, when the state came as
/// arrays, the arrays, for reuse.
type Written = (Result<WriteTimes>, Option<[Vec<f32>; 3]>);

/// A background write's times, in seconds.
struct WriteTimes {
    /// The whole write: from the thread's start to the file synced and renamed.
    total_s: f64,
    /// Of which syncing the file to disk.
    sync_s: f64,
    /// A snapshot's copies: within the device (training's stall), and to host memory.
    snapshot: Option<SnapshotTimes>,
}

/// One checkpoint written: its step and file, how long training stalled for it (the copy
/// of the state; the wait for the write before, if still running, apart) and how long the
/// background write took.
#[derive(Clone, Debug)]
pub struct SaveReport {
    pub step: u64,
    pub path: std::path::PathBuf,
    /// Seconds the training loop was held on the host: the copy to host memory, or queueing
    /// the copy within the device.
    pub stall_s: f64,
    pub waited_s: f64,
    pub write_s: f64,
    /// Of `write_s`, syncing the file to disk.
    pub sync_s: f64,
    /// When the state went through a device snapshot: the copy within the device (which the
    /// steps queued after it waited for: a stall too) and the copy to host memory (part of
    /// `write_s`).
    pub snapshot: Option<SnapshotTimes>,
}

impl SaveReport {
    /// How long training stalled for this checkpoint: held on the host, plus the copy within
    /// the device that the next steps waited for (an upper bound: the host's part may overlap
    /// work the device still had).
    pub fn total_stall_s(&self) -> f64 {
        self.stall_s + self.snapshot.map_or(0.0, |t| t.device_s)
    }
}

/// `s` seconds in milliseconds, with a decimal under 10 ms.
fn ms(s: f64) -> String {
    match s < 0.00995 {
        true => format!("{:.1} ms", s * 1e3),
        false => format!("{:.0} ms", s * 1e3),
    }
}

impl std::fmt::Display for SaveReport {
    /// "checkpoint: step 20 (training stalled 3 ms, written in the background in 41 ms) saved
    /// to PATH", the wait for the write before named too when there was one ("stalled 3 ms +
    /// 900 ms waiting for the write before"); through a device snapshot, the parts of both
    /// after them: "...in 1742 ms; stall: 0.2 ms on the host + 1.1 ms copying on the device;
    /// write: 45 ms to pinned host memory, 600 ms into the file, 1097 ms syncing it to disk)".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waited = match self.waited_s >= 5e-4 {
            true => format!(" + {} waiting for the write before", ms(self.waited_s)),
            false => String::new(),
        };
        let parts = match self.snapshot {
            Some(t) => format!(
                "; stall: {} on the host + {} copying on the device; write: {} to {}host memory, {} into the \
                 file, {} syncing it to disk",
                ms(self.stall_s),
                ms(t.device_s),
                ms(t.to_host_s),
                if t.pinned { "pinned " } else { "" },
                ms((self.write_s - t.to_host_s - self.sync_s).max(0.0)),
                ms(self.sync_s)
            ),
            None => String::new(),
        };
        write!(
            f,
            "checkpoint: step {} (training stalled {}{waited}, written in the background in {}{parts}) saved to {}",
            self.step,
            ms(self.total_stall_s()),
            ms(self.write_s),
            self.path.display()
        )
    }
}

impl BackgroundWriter {
    /// Host arrays to copy the next checkpoint's state into: the last write's, once it is
    /// done (call [`BackgroundWriter::wait`] first), else empty ones.
    pub fn take_arrays(&mut self) -> [Vec<f32>; 3] {
        if let Some(prepared) = self.preparing.take().and_then(|h| h.join().ok()) {
            return prepared;
        }
        self.spare.take().unwrap_or_default()
    }

    /// Starts making three host arrays of `n` values ready for the first checkpoint's copy,
    /// on a thread: allocated and every page written once, so the copy into them runs at
    /// memory speed. Where the thread cannot start, the copy allocates as before.
    pub fn prepare_arrays(&mut self, n: usize) {
        let prepare = move || {
            std::array::from_fn(|_| {
                let mut a = vec![0.0f32; n];
                // One write a page (zeroed memory is mapped lazily): volatile, so it stays.
                for i in (0..n).step_by(1024) {
                    // SAFETY: i < n, inside the array.
                    unsafe { std::ptr::write_volatile(a.as_mut_ptr().add(i), 0.0) };
                }
                a
            })
        };
        self.preparing = std::thread::Builder::new()
            .name("checkpoint-memory".into())
            .spawn(prepare)
            .ok();
    }

    /// Writes `state` (parameters, m, v) with `meta` to `path` on a thread, after the write
    /// before (call [`BackgroundWriter::wait`] first); a snapshot is brought to host memory on
    /// that thread first. `stalled`: when training stopped for this checkpoint (after the
    /// wait for the write before, which took `waited_s`); the stall is counted until the
    /// thread has started, here.
    pub fn start(
        &mut self,
        path: &Path,
        meta: CheckpointMeta,
        state: HostState,
        (stalled, waited_s): (std::time::Instant, f64),
    ) -> Result<()> {
        assert!(
            self.pending.is_none(),
            "one checkpoint write at a time: wait for the one before"
        );
        let mut report = SaveReport {
            step: meta.step,
            path: path.to_path_buf(),
            stall_s: 0.0,
            waited_s,
            write_s: 0.0,
            sync_s: 0.0,
            snapshot: None,
        };
        let path = path.to_path_buf();
        let handle = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || write_state(&path, &meta, state))
            .map_err(|e| Error::Device(format!("cannot start the checkpoint writer thread: {e}")))?;
        report.stall_s = stalled.elapsed().as_secs_f64();
        self.pending = Some((report, handle));
        Ok(())
    }

    /// The report of the write in progress if it has finished (its error if it failed);
    /// `None` while it runs or when there is none.
    pub fn poll(&mut self) -> Result<Option<SaveReport>> {
        match &self.pending {
            Some((_, handle)) if handle.is_finished() => self.wait(),
            _ => Ok(None),
        }
    }

    /// Waits for the write in progress, if any: its report, or its error.
    pub fn wait(&mut self) -> Result<Option<SaveReport>> {
        let Some((mut report, handle)) = self.pending.take() else {
            return Ok(None);
        };
        let (written, arrays) = handle
            .join()
            .map_err(|_| Error::Device(format!("{}: the checkpoint writer panicked", report.path.display())))?;
        if arrays.is_some() {
            self.spare = arrays;
        }
        let times = written?;
        report.write_s = times.total_s;
        report.sync_s = times.sync_s;
        report.snapshot = times.snapshot;
        Ok(Some(report))
    }
}

/// The writer thread's work: `state` into host memory if it is not there yet, then [`save`].
fn write_state(path: &Path, meta: &CheckpointMeta, state: HostState) -> Written {
    let started = std::time::Instant::now();
    match state {
        HostState::Arrays(arrays) => {
            let [params, m, v] = &arrays;
            let written = save_timed(path, meta, params, m, v).map(|sync_s| WriteTimes {
                total_s: started.elapsed().as_secs_f64(),
                sync_s,
                snapshot: None,
            });
            (written, Some(arrays))
        }
        HostState::Snapshot(snapshot) => {
            let mut sync_s = 0.0;
            let written = snapshot
                .read(&mut |parts| match parts {
                    [params, m, v] => save_timed(path, meta, params, m, v).map(|s| sync_s = s),
                    _ => Err(Error::Device(format!(
                        "{}: a checkpoint snapshot of {} arrays, expected 3",
                        path.display(),
                        parts.len()
                    ))),
                })
                .map(|times| WriteTimes {
                    total_s: started.elapsed().as_secs_f64(),
                    sync_s,
                    snapshot: Some(times),
                });
            (written, None)
        }
    }
}

impl Drop for BackgroundWriter {
    fn drop(&mut self) {
        if let Err(e) = self.wait() {
            eprintln!("error: {e}"); // the run is ending on another error already
        }
    }
}

/// Read a whole checkpoint, validating header, metadata, config, sizes and checksum.
pub fn load(path: &Path) -> Result<Checkpoint> {
    let (mut stream, n) = read_head(path)?;
    let [mut params, mut m, mut v] = [vec![0f32; n], vec![0f32; n], vec![0f32; n]];
    stream.read_arrays(&mut [&mut params, &mut m, &mut v], path)?;
    envelope::check_finite(named([&params, &m, &v]), path)?;
    Ok(Checkpoint {
        meta: stream.meta.meta,
        params,
        m,
        v,
    })
}

/// Read only the header and metadata (cheap: the arrays are neither read nor checksummed),
/// e.g. to build the model before loading. Sizes are still checked against the file length.
pub fn load_meta(path: &Path) -> Result<CheckpointMeta> {
    Ok(read_head(path)?.0.meta.meta)
}

/// The three arrays with their names, for errors.
fn named(arrays: [&[f32]; 3]) -> impl Iterator<Item = (&str, &[f32])> {
    ["params", "m", "v"].into_iter().zip(arrays)
}

/// Return an Input error naming every field where the checkpoint disagrees with the model
/// the flags describe (used by `train --resume` when model flags are also given).
pub fn check_compatible(meta: &CheckpointMeta, config: &ModelConfig, tokenizer: &str) -> Result<()> {
    let mut conflicts = Vec::new();
    if meta.tokenizer != tokenizer {
        conflicts.push(format!(
            "tokenizer={} but the flags ask for tokenizer={tokenizer}",
            meta.tokenizer
        ));
    }
    for ((name, ckpt), (_, flag)) in meta.config.fields().into_iter().zip(config.fields()) {
        if ckpt != flag {
            conflicts.push(format!("{name}={ckpt} but the flags ask for {name}={flag}"));
        }
    }
    if !conflicts.is_empty() {
        crate::bail_input!("cannot resume: checkpoint has {}", conflicts.join("; "));
    }
    Ok(())
}

/// Opens a checkpoint and reads its header and metadata, validated against this build's
/// parameter table and the file's length; the stream is positioned at the start of the
/// arrays, of the returned count of values each.
fn read_head(path: &Path) -> Result<(envelope::Stream<HeaderIn>, usize)> {
    let shown = path.display();
    if path.is_dir() {
        crate::bail_input!(
            "{shown} is a directory, not a checkpoint file (a Hugging Face model? `import --from {shown} --out FILE` \
             makes one of it)"
        );
    }
    let stream = envelope::open::<HeaderIn>(path, &GPT2)?;
    let HeaderIn { meta, tensors } = &stream.meta;
    meta.config
        .validate()
        .map_err(|e| Error::Input(format!("{shown}: checkpoint model config is invalid: {e}")))?;
    // The table below grows with n_layer: compare the list's length first, so that a header
    // claiming thousands of layers costs no more memory than the list the file holds.
    let expected_count = tensor_count(&meta.config);
    if tensors.len() != expected_count {
        crate::bail_input!(
            "{shown}: checkpoint's tensors differ from this build's parameter table: it lists {} tensors, this build {expected_count}",
            tensors.len()
        );
    }
    let layout = ParamLayout::new(&meta.config);
    let expected_tensors = tensor_records(&layout);
    if let Some((have, want)) = tensors.iter().zip(&expected_tensors).find(|(a, b)| a != b) {
        crate::bail_input!(
            "{shown}: checkpoint's tensors differ from this build's parameter table: it has {have:?} where this build has {want:?}"
        );
    }
    let (n, stored_n, file_len) = (layout.total, stream.count, stream.file_len);
    if stored_n != n as u64 {
        crate::bail_input!("{shown}: checkpoint holds {stored_n} parameters but its model config needs {n}");
    }
    let expected = stream.arrays_at + 3 * 4 * n as u64 + 8;
    if file_len < expected {
        crate::bail_input!("{shown}: checkpoint is truncated (expected {expected} bytes, found {file_len})");
    }
    if file_len > expected {
        crate::bail_input!(
            "{shown}: checkpoint has {} trailing bytes (expected {expected} bytes, found {file_len})",
            file_len - expected
        );
    }
    Ok((stream, n))
}
