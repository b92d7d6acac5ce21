//! Communication between ranks, behind one small trait. `Single` is the one-process
//! no-op used by stages 0 and 2; `mpi` (stage 1) and `nccl` (stage 3) live in their own
//! feature-gated modules; `agree` holds what keeps ranks in step (one outcome for all,
//! rank 0's data for all, the same configuration everywhere).

mod agree;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
mod watchdog;

use crate::backend::DevPtr;
use crate::error::Result;

pub use agree::{agree, broadcast_f32, check_same_everywhere, from_root};
pub use watchdog::{pid_table, Watchdog};

pub trait Comm {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sums `n` f32 values at `buf` over all ranks, in place. `buf` is backend memory:
    /// host memory for the CPU backend, device memory for NCCL.
    ///
    /// # Safety
    /// `buf` addresses `n` live values of the backend this communicator serves, which
    /// nothing else reads or writes during the call.
    unsafe fn all_reduce_sum(&self, buf: DevPtr, n: usize) -> Result<()>;
    /// Starts summing `n` values at `buf` over all ranks and returns at once, so the
    /// caller can go on computing (gradient buckets during backward). Default: the
    /// blocking sum.
    ///
    /// # Safety
    /// As [`Comm::all_reduce_sum`], and `buf` must hold its final values now and be neither
    /// read, written nor freed until [`Comm::finish_all_reduces`] returns.
    unsafe fn start_all_reduce_sum(&self, buf: DevPtr, n: usize) -> Result<()> {
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
    /// A function that ends the whole job from any thread (a watchdog's): `None` where
    /// there is one process.
    fn job_abort(&self) -> Option<fn(u8)> {
        None
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
    unsafe fn all_reduce_sum(&self, _buf: DevPtr, _n: usize) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_host(&self, _v: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn broadcast_bytes(&self, _data: &mut Vec<u8>) -> Result<()> {
        Ok(())
    }
}
