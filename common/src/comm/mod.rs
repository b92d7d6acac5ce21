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

use crate::backend::{bf16, DevPtr, DeviceStream};
use crate::error::{Error, Result};
use std::ops::Range;

pub use agree::{agree, broadcast_f32, check_same_everywhere, everywhere, from_root, on_root};
pub use watchdog::{leave_together, Ranks, Watchdog};

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
    /// Whether this communicator's collectives run on the device and can be ordered after a
    /// backend's queued work there ([`DeviceStream`]) without the host waiting (NCCL). Only
    /// then may `Some` stream be passed to the `start_*` calls and
    /// [`Comm::finish_all_reduces`].
    fn orders_on_device(&self) -> bool {
        false
    }
    /// Starts summing `n` values at `buf` over all ranks and returns at once, so the
    /// caller can go on computing (gradient buckets during backward). With `after` (only
    /// where [`Comm::orders_on_device`]), the sum reads `buf` only once the work queued so far
    /// on that stream is done, with no host wait; with `None`, `buf` must hold its final
    /// values now (the caller has synchronised its backend). Default: the blocking sum.
    ///
    /// # Safety
    /// As [`Comm::all_reduce_sum`], and `buf` must be neither read, written nor freed (other
    /// than by the work queued on `after` before this call) until
    /// [`Comm::finish_all_reduces`] returns, or, when that is given a stream, until work
    /// queued on that stream after it runs.
    unsafe fn start_all_reduce_sum(&self, buf: DevPtr, n: usize, after: Option<DeviceStream>) -> Result<()> {
        host_ordered(self, after)?;
        self.all_reduce_sum(buf, n)
    }
    /// Waits for every collective started with the `start_*` calls (sums, reduce-scatters,
    /// all-gathers). With `then` (only where
    /// [`Comm::orders_on_device`]) the host does not wait: work queued on that stream from
    /// now on runs after the sums (the summed values are read there).
    fn finish_all_reduces(&self, then: Option<DeviceStream>) -> Result<()> {
        host_ordered(self, then)
    }
    /// Sums the f32 values of `parts` over all ranks and leaves the sum of `parts[r]` on
    /// rank r, in place (ZeRO-1's gradient reduce-scatter): `parts` holds one range per
    /// rank, in rank order, contiguous, offsets from `buf`, the same on every rank (a part
    /// may be empty). What the other parts of `buf` hold afterwards is unspecified. Each
    /// part is summed in a fixed order (no float atomics), the same at every call of the
    /// same parts (parts cut otherwise may order the sums of 3 or more ranks otherwise; on 2
    /// ranks a sum is one addition, always the same).
    ///
    /// # Safety
    /// `buf` addresses the values `parts` cover, backend memory as in
    /// [`Comm::all_reduce_sum`], which nothing else reads or writes during the call.
    unsafe fn reduce_scatter_sum(&self, buf: DevPtr, parts: &[Range<usize>]) -> Result<()>;
    /// Starts [`Comm::reduce_scatter_sum`] and returns at once, ordered after
    /// `after` as [`Comm::start_all_reduce_sum`] is; [`Comm::finish_all_reduces`] waits for
    /// it. Default: the blocking call.
    ///
    /// # Safety
    /// As [`Comm::reduce_scatter_sum`], and `buf` is left alone as for
    /// [`Comm::start_all_reduce_sum`].
    unsafe fn start_reduce_scatter_sum(
        &self,
        buf: DevPtr,
        parts: &[Range<usize>],
        after: Option<DeviceStream>,
    ) -> Result<()> {
        host_ordered(self, after)?;
        self.reduce_scatter_sum(buf, parts)
    }
    /// `--grad-comm bf16`: as [`Comm::start_all_reduce_sum`] over `n` bf16 values, each
    /// addition formed in f32 and rounded to bf16 (half the bytes of f32 sums on the wire).
    /// Default: refused, for a communicator without bf16 sums.
    ///
    /// # Safety
    /// As [`Comm::start_all_reduce_sum`], for bf16 values.
    unsafe fn start_all_reduce_sum_bf16(
        &self,
        _buf: DevPtr<bf16>,
        _n: usize,
        _after: Option<DeviceStream>,
    ) -> Result<()> {
        Err(no_bf16_sums())
    }
    /// `--grad-comm bf16`: as [`Comm::start_reduce_scatter_sum`] over bf16 values, rounded as
    /// [`Comm::start_all_reduce_sum_bf16`] rounds. Default: refused.
    ///
    /// # Safety
    /// As [`Comm::start_reduce_scatter_sum`], for bf16 values.
    unsafe fn start_reduce_scatter_sum_bf16(
        &self,
        _buf: DevPtr<bf16>,
        _parts: &[Range<usize>],
        _after: Option<DeviceStream>,
    ) -> Result<()> {
        Err(no_bf16_sums())
    }
    /// Starts taking, for each of the `n` f32 values at `buf`, the largest over all ranks, in
    /// place, comparing their bits as 32-bit integers; ordered after `after` as
    /// [`Comm::start_all_reduce_sum`] is, and waited for by [`Comm::finish_all_reduces`]. The
    /// values must have their sign bit clear (non-negative, or a NaN without sign): then that
    /// is the largest value, a NaN above infinity, and every rank ends with the same bits
    /// whatever the order (FP8's amax values, agreed before the scales are derived from them).
    /// Default: refused, for a communicator without it.
    ///
    /// # Safety
    /// As [`Comm::start_all_reduce_sum`].
    unsafe fn start_all_reduce_max_bits(&self, _buf: DevPtr, _n: usize, _after: Option<DeviceStream>) -> Result<()> {
        Err(Error::Device(format!(
            "{}: this communicator has no max reduction",
            self.describe()
        )))
    }
    /// Rank r's `parts[r]` of `buf` replaces that part on every rank, in place (ZeRO-1's
    /// all-gather of the updated weights: f32, or their bf16 copy). `parts` as in
    /// [`Comm::reduce_scatter_sum`], counted in `buf`'s values, except that gaps may lie
    /// between them (a piece of every rank's shard), left alone.
    ///
    /// # Safety
    /// As [`Comm::reduce_scatter_sum`].
    unsafe fn all_gather(&self, buf: Words, parts: &[Range<usize>]) -> Result<()>;
    /// Starts [`Comm::all_gather`] and returns at once, ordered after `after` as
    /// [`Comm::start_all_reduce_sum`] is; [`Comm::finish_all_reduces`] waits for it.
    /// Default: the blocking call.
    ///
    /// # Safety
    /// As [`Comm::all_gather`], and `buf` is left alone as for [`Comm::start_all_reduce_sum`].
    unsafe fn start_all_gather(&self, buf: Words, parts: &[Range<usize>], after: Option<DeviceStream>) -> Result<()> {
        host_ordered(self, after)?;
        self.all_gather(buf, parts)
    }
    /// How the all-gathers so far ran, where the communicator has more than one way (NCCL:
    /// `"copy engines"` or `"thread blocks"`, both where some ran each way); `None` where it
    /// has one, or before any.
    fn gather_means(&self) -> Option<&'static str> {
        None
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

fn no_bf16_sums() -> Error {
    Error::Device("this communicator has no bf16 sums (--grad-comm bf16)".into())
}

/// Backend memory that a gather copies: f32 values, or bf16 ones (a gather moves bits and
/// computes nothing, so either is exact; bf16 moves half the bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Words {
    F32(DevPtr),
    Bf16(DevPtr<bf16>),
}

impl Words {
    /// The address of the first value.
    pub fn addr(self) -> u64 {
        match self {
            Words::F32(p) => p.addr(),
            Words::Bf16(p) => p.addr(),
        }
    }

    /// Bytes a value takes.
    pub fn size(self) -> usize {
        match self {
            Words::F32(_) => 4,
            Words::Bf16(_) => 2,
        }
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
    unsafe fn reduce_scatter_sum(&self, _buf: DevPtr, parts: &[Range<usize>]) -> Result<()> {
        check_parts(self, parts)
    }
    unsafe fn all_gather(&self, _buf: Words, parts: &[Range<usize>]) -> Result<()> {
        check_gather_parts(self, parts)
    }
    fn all_reduce_sum_host(&self, _v: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn broadcast_bytes(&self, _data: &mut Vec<u8>) -> Result<()> {
        Ok(())
    }
    unsafe fn start_all_reduce_max_bits(&self, _buf: DevPtr, _n: usize, after: Option<DeviceStream>) -> Result<()> {
        host_ordered(self, after)
    }
}

/// The backend's stream when `comm` can order its collectives after the work queued there
/// on the device (NCCL on the GPU: no host waits, and a step can be recorded whole as a
/// CUDA graph); `None` where the host must wait for the backend first.
pub fn device_order<B: crate::backend::Backend>(be: &B, comm: &(impl Comm + ?Sized)) -> Option<DeviceStream> {
    be.device_stream().filter(|_| comm.orders_on_device())
}

/// Refuses a device stream to order against where `comm` cannot (a caller's bug: its
/// collectives would race the stream's work).
pub(crate) fn host_ordered(comm: &(impl Comm + ?Sized), stream: Option<DeviceStream>) -> Result<()> {
    match stream {
        Some(_) if !comm.orders_on_device() => Err(crate::error::Error::Device(format!(
            "{}: this communicator cannot order its collectives after a device stream",
            comm.describe()
        ))),
        _ => Ok(()),
    }
}

/// Checks that `parts` holds one range per rank of `comm`, in rank order and contiguous, as
/// [`Comm::reduce_scatter_sum`] requires (a caller's bug otherwise).
pub(crate) fn check_parts(comm: &(impl Comm + ?Sized), parts: &[Range<usize>]) -> Result<()> {
    check_rank_parts(comm, parts, false)
}

/// The parts of an all-gather ([`Comm::all_gather`]): as [`check_parts`], but gaps may lie
/// between them.
pub(crate) fn check_gather_parts(comm: &(impl Comm + ?Sized), parts: &[Range<usize>]) -> Result<()> {
    check_rank_parts(comm, parts, true)
}

/// One range per rank, in rank order, none overlapping the next; without `gaps`, each
/// ending where the next starts.
fn check_rank_parts(comm: &(impl Comm + ?Sized), parts: &[Range<usize>], gaps: bool) -> Result<()> {
    let ordered = parts
        .windows(2)
        .all(|w| w[0].end == w[1].start || (gaps && w[0].end < w[1].start));
    let forward = parts.iter().all(|p| p.start <= p.end);
    if parts.len() != comm.size() || !ordered || !forward {
        let how = if gaps {
            "in order, not overlapping"
        } else {
            "contiguous"
        };
        return Err(crate::error::Error::Device(format!(
            "{}: a scatter/gather needs one part per rank ({} ranks), {how}; got {parts:?}",
            comm.describe(),
            comm.size()
        )));
    }
    Ok(())
}

/// The rank counts up to 64 that split every one of `batches` evenly, as words ("1, 2 or 4"),
/// for a line that says which to run on where the batch cannot change.
pub fn ranks_dividing(batches: &[usize]) -> String {
    let fit: Vec<String> = (1..=64)
        .filter(|n| batches.iter().all(|b| b.is_multiple_of(*n)))
        .map(|n| n.to_string())
        .collect();
    match fit.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => fit.join(""),
    }
}

/// `n` values cut into `ranks` contiguous parts, in rank order, as even as `align` allows:
/// every part but the last starts at a multiple of `align` values (so a part's vectorised
/// kernels see aligned memory); the last part takes what is left, and parts past the end are
/// empty. Equal parts whenever `n` is a multiple of `ranks · align` (NCCL's native
/// reduce-scatter and all-gather then apply).
pub fn even_parts(n: usize, ranks: usize, align: usize) -> Vec<Range<usize>> {
    let ranks = ranks.max(1);
    let align = align.max(1);
    let each = n.div_ceil(ranks).div_ceil(align) * align;
    (0..ranks).map(|r| (r * each).min(n)..((r + 1) * each).min(n)).collect()
}

/// `parts` seen through the window `within` of the buffer: each part cut to the window
/// and its offsets taken from the window's start (a bucket's share of each rank's shard).
pub fn parts_within(parts: &[Range<usize>], within: &Range<usize>) -> Vec<Range<usize>> {
    parts
        .iter()
        .map(|p| {
            let (start, end) = (
                p.start.clamp(within.start, within.end),
                p.end.clamp(within.start, within.end),
            );
            start - within.start..end - within.start
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_parts_cover_the_buffer_in_order() {
        for (n, ranks, align) in [
            (10, 3, 1),
            (10, 3, 4),
            (0, 2, 32),
            (7, 8, 1),
            (1024, 2, 32),
            (1000, 4, 32),
        ] {
            let parts = even_parts(n, ranks, align);
            assert_eq!(parts.len(), ranks);
            assert_eq!(parts[0].start, 0);
            assert_eq!(parts[ranks - 1].end, n, "{n} {ranks} {align}: {parts:?}");
            assert!(parts
                .windows(2)
                .all(|w| w[0].end == w[1].start && w[0].start <= w[0].end));
            assert!(parts.iter().all(|p| p.start % align == 0 || p.is_empty()));
            check_parts(&Fake(ranks), &parts).unwrap();
        }
        assert_eq!(
            even_parts(1024, 2, 32),
            vec![0..512, 512..1024],
            "equal when they can be"
        );
    }

    #[test]
    fn parts_within_a_window_are_cut_and_shifted() {
        let parts = vec![0..10, 10..20, 20..25];
        assert_eq!(parts_within(&parts, &(5..15)), vec![0..5, 5..10, 10..10]);
        assert_eq!(parts_within(&parts, &(20..25)), vec![0..0, 0..0, 0..5]);
    }

    #[test]
    fn bad_parts_are_refused() {
        assert!(
            check_parts(&Fake(2), &even_parts(5, 1, 1)).is_err(),
            "one part per rank"
        );
        assert!(check_parts(&Fake(2), &[0..5, 6..9]).is_err(), "contiguous");
        // SAFETY: Single's collectives touch no memory.
        assert!(unsafe { Single.reduce_scatter_sum(DevPtr::default(), &even_parts(4, 1, 1)) }.is_ok());
    }

    #[test]
    fn a_host_communicator_refuses_a_device_stream() {
        let stream = Some(DeviceStream::from_raw(1));
        // SAFETY: Single's collectives touch no memory.
        unsafe {
            assert!(Single.start_all_reduce_sum(DevPtr::default(), 4, stream).is_err());
            assert!(Single
                .start_reduce_scatter_sum(DevPtr::default(), &even_parts(4, 1, 1), stream)
                .is_err());
            assert!(Single.start_all_reduce_sum(DevPtr::default(), 4, None).is_ok());
        }
        assert!(Single.finish_all_reduces(stream).is_err());
        assert!(Single.finish_all_reduces(None).is_ok());
    }

    /// A communicator of `.0` ranks, never called (for `check_parts`).
    struct Fake(usize);
    impl Comm for Fake {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            self.0
        }
        unsafe fn all_reduce_sum(&self, _: DevPtr, _: usize) -> Result<()> {
            unreachable!()
        }
        unsafe fn reduce_scatter_sum(&self, _: DevPtr, _: &[Range<usize>]) -> Result<()> {
            unreachable!()
        }
        unsafe fn all_gather(&self, _: Words, _: &[Range<usize>]) -> Result<()> {
            unreachable!()
        }
        fn all_reduce_sum_host(&self, _: &mut [f32]) -> Result<()> {
            unreachable!()
        }
        fn broadcast_bytes(&self, _: &mut Vec<u8>) -> Result<()> {
            unreachable!()
        }
    }
}
