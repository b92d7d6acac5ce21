//! Stand-in for the CUDA backend when the crate is built without the `cuda` feature:
//! asking for a GPU says plainly what is missing instead of failing to link.

use crate::error::{Error, Result};

/// Never constructed: the `cuda` feature is off.
pub enum CudaBackend {}

impl CudaBackend {
    pub fn new(_device: usize, _precision: crate::cli::Precision) -> Result<Self> {
        Err(Error::Device(
            "this binary was built without CUDA support (cargo feature `cuda`)".into(),
        ))
    }
}
