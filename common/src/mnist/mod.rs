//! The MLP workload (Fashion-MNIST and MNIST), the `mnist` subcommand of every stage. Read in
//! this order: `idx` (the data sets' files, read and checked), `data` (the training and test
//! sets, read by rank 0 and sent to every rank), `mlp` (the model: Linear and ReLU layers as
//! autograd ops, softmax cross-entropy), `train` (the loop: batches split over ranks,
//! gradients summed, SGD with momentum or AdamW, a loss and accuracy row per epoch),
//! `checkpoint` (the run's state at a stop, at the end and every 30 s, for `--resume`), `fused`
//! (on one GPU with SGD: the data set on the device, each step one CUDA graph replay, the
//! update fused into backward), `bench` (`mnist --bench`: steps timed, `--sweep` over shapes),
//! and `synthetic` (made-up data sets of the same form, for tests and speed figures).

pub mod bench;
pub mod checkpoint;
pub mod data;
pub mod fused;
pub mod idx;
pub mod mlp;
pub mod synthetic;
pub mod train;

pub use data::{Dataset, CLASSES};
pub use idx::{parse_images, parse_labels, read_images, read_labels, Images};
pub use mlp::Mlp;
pub use train::{train, MlpTrainer};

use crate::backend::FusedMlp;
use crate::comm::Comm;
use crate::error::Result;
use std::path::PathBuf;

/// The MLP's optimiser.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerKind {
    /// SGD with momentum.
    Sgd,
    /// AdamW (betas 0.9, 0.999).
    AdamW,
}

impl OptimizerKind {
    /// Its name in checkpoints and `--trace`'s settings: "sgd" or "adamw".
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::AdamW => "adamw",
        }
    }

    /// Its name in the run's first line: "Sgd" or "Adamw".
    pub fn shown(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "Sgd",
            OptimizerKind::AdamW => "Adamw",
        }
    }
}

/// What an `mnist` run is asked to do, every default filled in (the command line makes it of
/// its flags).
#[derive(Clone, Debug)]
pub struct RunSettings {
    /// Training images and labels, test images and labels (idx files), where named; else
    /// Debian's package's files ([`data::Files::new`]).
    pub files: Option<[PathBuf; 4]>,
    /// Made-up data sets instead of files ([`train::synthetic_sets`]).
    pub synthetic: bool,
    /// Where `loss.tsv`, the checkpoint and the trace go.
    pub out: PathBuf,
    /// The checkpoint to continue from.
    pub resume: Option<PathBuf>,
    /// The step to end at (counted from the run's start), with a checkpoint.
    pub stop_after: Option<u64>,
    /// Widths of the hidden layers.
    pub hidden: Vec<usize>,
    pub epochs: u64,
    /// Global batch, in images, split over ranks.
    pub batch: usize,
    pub optimizer: OptimizerKind,
    /// Peak learning rate.
    pub lr: f32,
    /// SGD's momentum (unused by AdamW).
    pub momentum: f32,
    pub weight_decay: f32,
    pub seed: u64,
    /// Write what another framework needs to repeat the run (`OUT/trace/`).
    pub trace: bool,
    /// Time steps instead of training.
    pub bench: Option<BenchSettings>,
}

/// What `mnist --bench` times.
#[derive(Clone, Copy, Debug)]
pub struct BenchSettings {
    /// The sweep's shapes instead of `batch` and `hidden`.
    pub sweep: bool,
    /// Untimed steps, then timed ones.
    pub warmup: u64,
    pub steps: u64,
}

/// The `mnist` subcommand: trains ([`train()`]), or times steps with `bench` ([`bench::bench`]).
pub fn run<B: FusedMlp>(be: &B, comm: &dyn Comm, settings: &RunSettings) -> Result<()> {
    match &settings.bench {
        Some(b) => bench::bench(be, comm, settings, b),
        None => train(be, comm, settings),
    }
}
