//! Communication between ranks, behind one small trait. `Single` is the one-process
//! no-op used by stages 0 and 2; `mpi` (stage 1) and `nccl` (stage 3) live in their own
//! feature-gated modules.

#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;

use crate::backend::DevPtr;
use crate::error::{Error, Result};

pub trait Comm {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sums `n` f32 values at `buf` over all ranks, in place. `buf` is backend memory:
    /// host memory for the CPU backend, device memory for NCCL.
    fn all_reduce_sum(&self, buf: DevPtr, n: usize) -> Result<()>;
    /// Starts summing `n` values at `buf` over all ranks and returns at once, so the
    /// caller can go on computing (gradient buckets during backward). `buf` must hold its
    /// final values now, and must be neither read nor written until
    /// [`Comm::finish_all_reduces`] returns. Default: the blocking sum.
    fn start_all_reduce_sum(&self, buf: DevPtr, n: usize) -> Result<()> {
        self.all_reduce_sum(buf, n)
    }
    /// Waits for every sum started with [`Comm::start_all_reduce_sum`].
    fn finish_all_reduces(&self) -> Result<()> {
        Ok(())
    }
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
    /// Ends the whole job with `exit_code`, after an error on this rank alone: the other
    /// ranks would otherwise wait forever in their next collective. Returns only where
    /// there are no other ranks (one process: exiting normally is enough).
    fn abort(&self, _exit_code: u8) {}
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

/// Broadcasts a host f32 array from rank 0 (through `broadcast_bytes`), in pieces: the
/// byte copies stay small next to a 500 MB parameter array.
pub fn broadcast_f32(comm: &dyn Comm, v: &mut Vec<f32>) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let mut len = (v.len() as u64).to_le_bytes().to_vec();
    comm.broadcast_bytes(&mut len)?;
    let len = <[u8; 8]>::try_from(len.as_slice())
        .map_err(|_| Error::Device("broadcast from rank 0: a length of unexpected size".into()))?;
    v.resize(u64::from_le_bytes(len) as usize, 0.0);
    for piece in v.chunks_mut(1 << 22) {
        let mut bytes = bytemuck::cast_slice::<f32, u8>(piece).to_vec();
        comm.broadcast_bytes(&mut bytes)?;
        if bytes.len() != piece.len() * 4 {
            return Err(Error::Device(
                "broadcast from rank 0: pieces of unexpected length".into(),
            ));
        }
        bytemuck::cast_slice_mut::<f32, u8>(piece).copy_from_slice(&bytes);
    }
    Ok(())
}

/// Settles a step that each rank ran on its own (parsing its flags, reading a file): if
/// it failed on any rank, every rank returns an error together (its own, or one naming the
/// ranks that failed), so none is left waiting in a collective for a rank that quit.
pub fn agree<T>(comm: &dyn Comm, result: Result<T>) -> Result<T> {
    if comm.size() == 1 {
        return result;
    }
    let mut failed = vec![0.0f32; comm.size()];
    failed[comm.rank()] = result.is_err() as u8 as f32;
    comm.all_reduce_sum_host(&mut failed)?;
    let ranks: Vec<String> = (0..failed.len())
        .filter(|&r| failed[r] > 0.0)
        .map(|r| r.to_string())
        .collect();
    match result {
        Err(e) => Err(e.on_every_rank()),
        Ok(_) if !ranks.is_empty() => {
            Err(Error::Input(format!("rank {} failed (its message says why)", ranks.join(", "))).on_every_rank())
        }
        ok => ok,
    }
}
