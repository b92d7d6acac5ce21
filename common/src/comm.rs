//! Communication between ranks, behind one small trait. `Single` is the one-process
//! no-op used by stages 0 and 2; `mpi` (stage 1) and `nccl` (stage 3) live in their own
//! feature-gated modules.

use crate::backend::DevPtr;
use crate::error::Result;

pub trait Comm {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sums `n` f32 values at `buf` over all ranks, in place. `buf` is backend memory:
    /// host memory for the CPU backend, device memory for NCCL.
    fn all_reduce_sum(&self, buf: DevPtr, n: usize) -> Result<()>;
    /// Sums a small host array over all ranks, in place.
    fn all_reduce_sum_host(&self, v: &mut [f32]) -> Result<()>;
    /// Rank 0's bytes replace every other rank's (`data` is resized to match).
    fn broadcast_bytes(&self, data: &mut Vec<u8>) -> Result<()>;
    /// Names the process in messages, e.g. "rank 3 of 8 on host-b".
    fn describe(&self) -> String {
        format!("rank {} of {}", self.rank(), self.size())
    }
    fn is_root(&self) -> bool {
        self.rank() == 0
    }
}

/// One process: every collective is the identity.
pub struct Single;

impl Comm for Single {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _buf: DevPtr, _n: usize) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_host(&self, _v: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn broadcast_bytes(&self, _data: &mut Vec<u8>) -> Result<()> {
        Ok(())
    }
}

/// Broadcasts a host f32 array from rank 0 (through `broadcast_bytes`).
pub fn broadcast_f32(comm: &dyn Comm, v: &mut Vec<f32>) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let mut bytes = bytemuck::cast_slice::<f32, u8>(v).to_vec();
    comm.broadcast_bytes(&mut bytes)?;
    *v = bytemuck::pod_collect_to_vec(&bytes);
    Ok(())
}
