//! The MLP workload (Fashion-MNIST and MNIST): the data sets' idx files, read and checked.
//! The model, the `mnist` subcommand and its training loop come next (see the issue on the MLP
//! workload); this is the input side they build on.

pub mod idx;

pub use idx::{parse_images, parse_labels, read_images, read_labels, Images};
