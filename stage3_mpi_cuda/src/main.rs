//! Stage 3: one rank per GPU (`mpirun -n 8 -f hostfile stage3_mpi_cuda train ...`). MPI
//! starts the ranks and bootstraps NCCL; gradients are summed on the GPUs over NCCL;
//! rank 0 alone prints, evaluates and writes checkpoints. Each rank drives the GPU whose
//! index is its rank among the ranks on its host.

use common::app::{self, Stage};
use common::backend::cuda::CudaBackend;
use common::cli::StageKind;
use common::comm::mpi::MpiComm;
use common::comm::nccl::NcclComm;
use std::process::ExitCode;

const NAME: &str = "stage3_mpi_cuda";
const KIND: StageKind = StageKind {
    gpu: true,
    distributed: true,
};

fn main() -> ExitCode {
    let mpi = match MpiComm::init() {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("{NAME}: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cli = match app::parse_cli(NAME, KIND, &mpi) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let comm = match NcclComm::init(mpi) {
        Ok(comm) => comm,
        Err((e, mpi)) => return app::fail(NAME, &mpi, e),
    };
    let (device, peer) = (comm.device(), comm.peer_memory());
    let stage = Stage {
        name: NAME,
        kind: KIND,
        // The weights' bf16 copy in memory the other GPUs can map: ZeRO-1's gathers into it
        // then run on copy engines (common/src/comm/nccl.rs).
        backend: &|args, _comm| {
            let be = CudaBackend::new(device, args.precision())?;
            if let Some(peer) = peer {
                be.share_memory_with(peer);
            }
            Ok(be)
        },
    };
    let code = app::main(stage, &comm, cli);
    drop(comm);
    code
}
