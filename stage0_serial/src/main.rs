//! Stage 0: GPT-2 on the CPU in one process. The correctness reference for the others.

use clap::Parser;
use common::app::{self, Stage};
use common::backend::cpu::CpuBackend;
use common::cli::Cli;
use common::comm::Single;
use std::process::ExitCode;

fn main() -> ExitCode {
    let stage = Stage {
        name: "stage0_serial",
        gpu: false,
        backend: &|exec, _comm| CpuBackend::new(exec.threads),
    };
    app::main(stage, &Single, Cli::parse())
}
