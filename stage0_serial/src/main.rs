//! Stage 0: GPT-2 on the CPU in one process. The correctness reference for the others.

use common::app::{self, Stage};
use common::backend::cpu::CpuBackend;
use common::cli::StageKind;
use common::comm::Single;
use std::process::ExitCode;

const NAME: &str = "stage0_serial";
const KIND: StageKind = StageKind {
    gpu: false,
    distributed: false,
};

fn main() -> ExitCode {
    let stage = Stage {
        name: NAME,
        kind: KIND,
        backend: &|device, _comm| CpuBackend::new(device.threads()),
    };
    match app::parse_cli(NAME, KIND, &Single) {
        Ok(cli) => app::main(stage, &Single, cli),
        Err(code) => code,
    }
}
