//! Stage 2: GPT-2 on one GPU (cudarc: NVRTC-compiled kernels, cuBLAS matmuls). The model
//! and the training loop are stage 0's; only the backend differs.

use clap::Parser;
use common::app::{self, Stage};
use common::backend::cuda::CudaBackend;
use common::cli::Cli;
use common::comm::Single;
use std::process::ExitCode;

fn main() -> ExitCode {
    let stage = Stage {
        name: "stage2_cuda",
        gpu: true,
        backend: &|exec, _comm| CudaBackend::new(0, exec.precision),
    };
    app::main(stage, &Single, Cli::parse())
}
