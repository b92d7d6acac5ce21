//! `bench --allreduce`: the gradient sum's bandwidth against message size, on the stage's own
//! communicator and memory (MPI on host memory for stage 1, NCCL on device memory for stage
//! 3), in nccl-tests' conventions: algorithm bandwidth = bytes / time, bus bandwidth =
//! algorithm bandwidth × 2(n-1)/n (what each link carries in a ring all-reduce of n ranks).

use crate::backend::{Backend, DeviceBuffer};
use crate::comm::Comm;
use crate::error::Result;
use std::time::Instant;

/// One message size's figures.
#[derive(Debug, serde::Serialize)]
pub struct AllreduceRow {
    pub device: String,
    pub ranks: usize,
    /// Bytes of f32 values summed.
    pub bytes: usize,
    /// Mean time of one blocking all-reduce, microseconds.
    pub time_us: f64,
    pub algbw_gb_s: f64,
    pub busbw_gb_s: f64,
}

/// Message sizes from 4 KiB (each ×4) to `max_bytes`, which is always the last (the
/// gradient buffer of GPT-2 124M, 498 MB, within reach at the top).
fn sizes(max_bytes: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = std::iter::successors(Some(4usize << 10), |&b| Some(b * 4))
        .take_while(|&b| b < max_bytes)
        .collect();
    sizes.push(max_bytes);
    sizes
}

/// Times `reps` blocking all-reduces of each size after `warmup` untimed ones; every rank
/// takes part, every rank gets the rows (rank 0 prints them).
pub fn allreduce<B: Backend>(
    be: &B,
    comm: &dyn Comm,
    max_bytes: usize,
    reps: usize,
    warmup: usize,
) -> Result<Vec<AllreduceRow>> {
    let n_ranks = comm.size();
    if n_ranks < 2 {
        // Every rank sees the same size: the same error everywhere.
        let e = crate::error::Error::Input(
            "bench --allreduce sums across ranks: run it on 2 or more (mpirun -n 2 ...)".into(),
        );
        return Err(e.on_every_rank());
    }
    let sizes = sizes(max_bytes);
    let largest = sizes.last().copied().unwrap_or(0) / 4;
    // Every rank allocates alike: where it fails, all leave together, in one line.
    let buf = be
        .alloc::<f32>(largest.max(1))
        .map_err(|e| crate::error::Error::Device(format!("{e} (a smaller --allreduce-max-mb needs less)")));
    let buf = crate::comm::agree(comm, buf)?;
    let mut rows = Vec::with_capacity(sizes.len());
    for bytes in sizes {
        let n = bytes / 4;
        let sum = || -> Result<()> {
            // SAFETY: `buf` holds at least n values and nothing else uses it meanwhile; the
            // call returns once the sum is done.
            unsafe { comm.all_reduce_sum(buf.ptr(), n) }
        };
        for _ in 0..warmup {
            sum()?;
        }
        be.synchronize()?;
        let started = Instant::now();
        for _ in 0..reps {
            sum()?;
        }
        let secs = started.elapsed().as_secs_f64() / reps as f64;
        let algbw = bytes as f64 / secs / 1e9;
        rows.push(AllreduceRow {
            device: be.name(),
            ranks: n_ranks,
            bytes,
            time_us: secs * 1e6,
            algbw_gb_s: algbw,
            busbw_gb_s: algbw * 2.0 * (n_ranks as f64 - 1.0) / n_ranks as f64,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_largest_message_asked_for_is_timed() {
        assert_eq!(super::sizes(1 << 20), [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]);
        assert_eq!(super::sizes(3 << 20).last(), Some(&(3 << 20)));
        assert_eq!(super::sizes(3 << 20).len(), 6);
    }
}
