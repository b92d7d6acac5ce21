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

use crate::backend::Backend;
use crate::cli::MnistArgs;
use crate::comm::{check_same_everywhere, Comm};
use crate::error::Result;

/// The `mnist` subcommand: trains ([`train()`]), or times steps with `--bench` ([`bench::bench`]).
pub fn run<B: Backend>(be: &B, comm: &dyn Comm, args: &MnistArgs) -> Result<()> {
    // The same flags and binary on every rank (the thread count aside).
    let mut same_everywhere = args.clone();
    same_everywhere.device.threads = None;
    check_same_everywhere(comm, &format!("mnist {same_everywhere:?}"))?;
    match args.bench {
        true => bench::bench(be, comm, args),
        false => train(be, comm, args),
    }
}
