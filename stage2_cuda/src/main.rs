//! Stage 2: GPT-2 on one GPU (cudarc: NVRTC-compiled kernels, cuBLAS matmuls). The model
//! and the training loop are stage 0's; only the backend differs.

use common::app::{self, Stage};
use common::backend::cuda::CudaBackend;
use common::cli::StageKind;
use common::comm::Single;
use std::process::ExitCode;

const NAME: &str = "stage2_cuda";
const KIND: StageKind = StageKind {
    gpu: true,
    distributed: false,
};

fn main() -> ExitCode {
    let stage = Stage {
        name: NAME,
        kind: KIND,
        backend: &|device, _comm| CudaBackend::new(0, device.precision()),
    };
    match app::parse_cli(NAME, KIND, &Single) {
        Ok(cli) => app::main(stage, &Single, cli),
        Err(code) => code,
    }
}
