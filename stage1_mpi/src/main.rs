//! Stage 1: GPT-2 on the CPU, data parallel over MPI (`mpirun -n 2 stage1_mpi train ...`).
//! Each rank trains on its share of every global batch and the gradients are summed with
//! MPI_Allreduce, so the run reproduces stage 0's losses. Rank 0 alone prints and writes.

use common::app::{self, Stage};
use common::backend::cpu::CpuBackend;
use common::cli::StageKind;
use common::comm::mpi::MpiComm;
use std::process::ExitCode;

const NAME: &str = "stage1_mpi";
const KIND: StageKind = StageKind {
    gpu: false,
    distributed: true,
};

fn main() -> ExitCode {
    let comm = match MpiComm::init() {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("{NAME}: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cli = match app::parse_cli(NAME, KIND, &comm) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let stage = Stage {
        name: NAME,
        kind: KIND,
        // By default the ranks on a host share its cores evenly.
        backend: &|device, _comm| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let threads = match device.threads() {
                0 => (cores / comm.local_size()).max(1),
                n => n,
            };
            CpuBackend::new(threads)
        },
    };
    app::main(stage, &comm, cli)
}
