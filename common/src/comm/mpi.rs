//! The MPI communicator of stage 1 (and stage 3's bootstrap), through rsmpi over MPICH.
//! Sums run in place on host memory: rsmpi has no in-place or borrow-free nonblocking
//! collectives, so those few calls go straight to `mpi::ffi`, each wrapped and checked here.

use super::{Comm, Words};
use crate::backend::{bf16, DevPtr, DeviceStream};
use crate::error::{Error, Result};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, Root};
use mpi::Threading;
use std::cell::RefCell;
use std::ops::Range;
use std::os::raw::{c_int, c_void};

extern "C" {
    /// `MPI_IN_PLACE` of the MPI library built against (common/src/comm/mpi_shim.c).
    fn gpt2rs_mpi_in_place() -> *mut c_void;
}

/// hwloc components that MPI_Init leaves out unless the user's environment names its own.
const HWLOC_COMPONENTS: (&str, &str) = ("HWLOC_COMPONENTS", "-opencl,-gl");

/// MPICH asks hwloc for the host's topology at MPI_Init. hwloc's OpenCL and GL plugins then
/// open every OpenCL platform and X display: on the GPU hosts that loads pocl and LLVM into
/// each rank, which slowed every start-up there and brought LLVM's signal handlers (see
/// `stop::take_back_termination_signals`).
/// MPICH needs only the cores, caches and PCI devices, so the two are left out, unless the
/// user set `HWLOC_COMPONENTS`, which is then kept as it is.
fn keep_hwloc_off_opencl_and_gl() {
    let (name, value) = HWLOC_COMPONENTS;
    if std::env::var_os(name).is_none() {
        // Setting the environment races with threads reading it; `init` runs first in main,
        // before this process starts any thread.
        std::env::set_var(name, value);
    }
}

/// Most elements one MPI call takes (its count is a C int): longer buffers go in pieces.
const MAX_COUNT: usize = 1 << 30;

/// One process of an `mpirun` job. Works on HOST memory only: pair it with the CPU backend,
/// whose [`DevPtr`]s are host addresses.
pub struct MpiComm {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    host: String,
    /// Sums started by `start_all_reduce_sum` and not yet waited for.
    pending: RefCell<Vec<ffi::MPI_Request>>,
    /// Reduce-scatters started and not yet waited for: where each one's sum lands, the part
    /// of the caller's buffer to copy it into then, and the counts MPI may read until then.
    scattered: RefCell<Vec<Scattered>>,
    /// The sum of bf16 values (`--grad-comm bf16`): an MPI operation of ours on 16-bit words.
    bf16_sum: ffi::MPI_Op,
    /// Finalizes MPI when dropped, so it is declared (and dropped) last.
    _universe: mpi::environment::Universe,
}

impl MpiComm {
    /// Initialises MPI. Only the main thread calls MPI while the CPU backend's workers
    /// compute, so `MPI_THREAD_FUNNELED` is the level we need, and refuse to run without.
    /// Call it first thing in `main`, before any other thread starts: it may set an
    /// environment variable (see `keep_hwloc_off_opencl_and_gl`).
    pub fn init() -> Result<Self> {
        keep_hwloc_off_opencl_and_gl();
        let (universe, provided) = mpi::initialize_with_threading(Threading::Funneled)
            .ok_or_else(|| Error::Device("MPI is already initialised in this process".into()))?;
        if provided < Threading::Funneled {
            return Err(Error::Device(format!(
                "the MPI library offers thread level {provided:?}; MPI_THREAD_FUNNELED is needed (CPU worker threads run beside MPI calls)"
            )));
        }
        let world = universe.world();
        let (rank, size) = (world.rank(), world.size());
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "unknown host".into());
        if size > 1 {
            pause_before_aborting();
        }
        // Ranks sharing this host's memory: their count splits the cores (stage 1) and the
        // node-local rank picks the GPU (stage 3).
        let local = world.split_shared(rank);
        let (local_rank, local_size) = (local.rank() as usize, local.size() as usize);
        drop(local);
        abort_job_on_panic();
        // SAFETY: MPI is initialised; `add_bf16` has MPI_User_function's signature. The
        // operation lives until MPI_Finalize (MpiComm's lifetime).
        let mut bf16_sum: ffi::MPI_Op = unsafe { std::mem::zeroed() };
        check("MPI_Op_create", unsafe {
            ffi::MPI_Op_create(Some(add_bf16), 1, &mut bf16_sum)
        })?;
        Ok(MpiComm {
            world,
            rank: rank as usize,
            size: size as usize,
            local_rank,
            local_size,
            host,
            pending: RefCell::new(Vec::new()),
            scattered: RefCell::new(Vec::new()),
            bf16_sum,
            _universe: universe,
        })
    }

    /// This process's rank among the ranks on its host.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// How many ranks run on this host.
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    /// Each of `parts` of `buf` (values of MPI type `words`) from its rank to every rank: a
    /// broadcast per part and piece (no arithmetic: exact).
    ///
    /// SAFETY: `buf` addresses host memory covering `parts`, which nothing else touches
    /// during the call; `words` is the MPI type of `T`.
    unsafe fn broadcast_parts<T>(&self, buf: *mut T, words: ffi::MPI_Datatype, parts: &[Range<usize>]) -> Result<()> {
        for (root, part) in parts.iter().enumerate() {
            for (piece, count) in pieces(buf.wrapping_add(part.start), part.len()) {
                // SAFETY: `piece` lies inside the caller's host buffer.
                check("MPI_Bcast", unsafe {
                    ffi::MPI_Bcast(piece, count, words, root as c_int, self.world.as_raw())
                })?;
            }
        }
        Ok(())
    }

    /// The world communicator (e.g. to bootstrap NCCL).
    pub fn world(&self) -> &SimpleCommunicator {
        &self.world
    }

    /// Sums `n` f32 at `ptr` over all ranks in place, blocking.
    ///
    /// SAFETY: `ptr` must address `n` live, writable f32 of host memory.
    unsafe fn all_reduce_in_place(&self, ptr: *mut f32, n: usize) -> Result<()> {
        for (piece, count) in pieces(ptr, n) {
            check("MPI_Allreduce", unsafe {
                ffi::MPI_Allreduce(
                    gpt2rs_mpi_in_place(),
                    piece,
                    count,
                    ffi::RSMPI_FLOAT,
                    ffi::RSMPI_SUM,
                    self.world.as_raw(),
                )
            })?;
        }
        Ok(())
    }
}

impl MpiComm {
    /// Sums `parts` (offsets from `buf`) over all ranks into `own`, this rank's part:
    /// MPI_Reduce_scatter, or MPI_Ireduce_scatter when `request` takes the request. Not in
    /// place: MPICH 4.0's in-place MPI_Reduce crashed at a root other than 0 and used a
    /// non-root's receive buffer as scratch, so the sum lands in `own` and the caller copies
    /// it into the part. MPI's reduction order is fixed for a given world size and count,
    /// so the sums are the same at every call.
    ///
    /// SAFETY: `buf` must address the live host values that `parts` cover, of MPI type
    /// `float` (which `op` adds); `own` holds this rank's part's length; `counts` is [`part_counts`] of `parts`; all three stay untouched
    /// until the call (or its request) completes.
    unsafe fn reduce_scatter_into<T>(
        &self,
        buf: *const T,
        (parts, counts): (&[Range<usize>], &[c_int]),
        own: &mut [T],
        (float, op): (ffi::MPI_Datatype, ffi::MPI_Op),
        request: Option<&mut ffi::MPI_Request>,
    ) -> Result<()> {
        let send = buf.wrapping_add(parts[0].start) as *const c_void;
        let recv = own.as_mut_ptr() as *mut c_void;
        let world = self.world.as_raw();
        // SAFETY: the caller's buffers and counts (above).
        match request {
            None => check("MPI_Reduce_scatter", unsafe {
                ffi::MPI_Reduce_scatter(send, recv, counts.as_ptr(), float, op, world)
            }),
            Some(request) => check("MPI_Ireduce_scatter", unsafe {
                ffi::MPI_Ireduce_scatter(send, recv, counts.as_ptr(), float, op, world, request)
            }),
        }
    }

    /// Starts summing `n` values at `ptr` (MPI type and operation `types`) over all ranks in
    /// place, in pieces of at most [`MAX_COUNT`]; `finish_all_reduces` waits.
    ///
    /// SAFETY: `ptr` addresses `n` live host values of that type, left alone until then.
    unsafe fn start_sum<T>(&self, ptr: *mut T, n: usize, (words, op): (ffi::MPI_Datatype, ffi::MPI_Op)) -> Result<()> {
        let mut pending = self.pending.borrow_mut();
        for (piece, count) in pieces(ptr, n) {
            let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
            // SAFETY: `piece` lies inside the caller's buffer.
            check("MPI_Iallreduce", unsafe {
                ffi::MPI_Iallreduce(
                    gpt2rs_mpi_in_place(),
                    piece,
                    count,
                    words,
                    op,
                    self.world.as_raw(),
                    &mut request,
                )
            })?;
            pending.push(request);
        }
        self.progress(&mut pending)
    }

    /// Starts [`MpiComm::reduce_scatter_into`] a buffer of this rank's part; returns it, where
    /// it goes in `buf` once done, and the counts MPI may read until then (both kept, with
    /// their heap memory in place, until `finish_all_reduces`).
    ///
    /// SAFETY: `buf` addresses the live host values `parts` covers, of MPI type `types.0`,
    /// left alone until then.
    unsafe fn start_scatter<T: Copy + Default>(
        &self,
        buf: *mut T,
        parts: &[Range<usize>],
        types: (ffi::MPI_Datatype, ffi::MPI_Op),
    ) -> Result<(Vec<T>, *mut T, Vec<c_int>)> {
        let counts = part_counts(self, parts)?;
        let mut own = vec![T::default(); parts[self.rank].len()];
        let mut pending = self.pending.borrow_mut();
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: the caller's buffer; `own` and `counts` outlive the request (above).
        unsafe { self.reduce_scatter_into(buf, (parts, &counts), &mut own, types, Some(&mut request))? };
        pending.push(request);
        self.progress(&mut pending)?;
        Ok((own, buf.wrapping_add(parts[self.rank].start), counts))
    }

    /// MPICH moves nonblocking collectives on only inside MPI calls (no progress thread):
    /// testing them lets those started earlier advance while the backward pass computes.
    fn progress(&self, pending: &mut [ffi::MPI_Request]) -> Result<()> {
        let mut all_done: c_int = 0;
        // SAFETY: `pending` holds valid (or already null) requests.
        check("MPI_Testall", unsafe {
            ffi::MPI_Testall(
                pending.len() as c_int,
                pending.as_mut_ptr(),
                &mut all_done,
                ffi::RSMPI_STATUSES_IGNORE,
            )
        })
    }
}

/// A started reduce-scatter's sum, where to copy it once done, and its counts (which MPI may
/// read until then).
enum Scattered {
    F32 {
        own: Vec<f32>,
        into: *mut f32,
        _counts: Vec<c_int>,
    },
    Bf16 {
        own: Vec<u16>,
        into: *mut u16,
        _counts: Vec<c_int>,
    },
}

/// `inout[i] = bf16(in[i] + inout[i])` over `len` bf16 values (16-bit words): each sum formed
/// in f32 (exact for two bf16 values but for rounding) and rounded to the nearest bf16, ties to
/// even, as NCCL's bf16 sums round. MPI_User_function's signature (MPI_Op_create).
unsafe extern "C" fn add_bf16(input: *mut c_void, inout: *mut c_void, len: *mut c_int, _: *mut ffi::MPI_Datatype) {
    // SAFETY: MPI passes two arrays of `*len` 16-bit words (the datatype given with the op).
    let n = unsafe { *len } as usize;
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(input as *const u16, n),
            std::slice::from_raw_parts_mut(inout as *mut u16, n),
        )
    };
    for (x, y) in a.iter().zip(b.iter_mut()) {
        let sum = half::bf16::from_bits(*x).to_f32() + half::bf16::from_bits(*y).to_f32();
        *y = half::bf16::from_f32(sum).to_bits();
    }
}

/// Each part's length as MPI's count, after checking the parts (one per rank, contiguous).
fn part_counts(comm: &MpiComm, parts: &[Range<usize>]) -> Result<Vec<c_int>> {
    super::check_parts(comm, parts)?;
    parts
        .iter()
        .map(|p| c_int::try_from(p.len()))
        .collect::<std::result::Result<Vec<c_int>, _>>()
        .map_err(|_| Error::Device(format!("a reduce-scatter part holds more than {} values", c_int::MAX)))
}

/// The message a rank printed just before MPI_Abort travels through the launcher's pipes;
/// tearing the job down at once can lose it (seen with Hydra). A short pause lets it through.
fn let_launcher_forward_output() {
    std::thread::sleep(std::time::Duration::from_millis(300));
}

/// Ends the whole job from any thread: MPI_Abort on the world, after letting this rank's
/// last message through.
fn abort_world(exit_code: u8) {
    let_launcher_forward_output();
    // SAFETY: called while MPI is initialised (MpiComm's lifetime); like the panic hook's,
    // a last resort from a thread FUNNELED does not cover, which need not return.
    unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, exit_code as c_int) };
    // MPI_Abort may return where the launcher does not end the job (Hydra's
    // -disable-auto-cleanup): this process ends all the same, at once (no exit handlers,
    // with other threads inside MPI).
    // SAFETY: _exit ends the process; it cannot fail.
    unsafe { libc::_exit(exit_code as c_int) }
}

/// How long a rank that aborts (its transport's reaction to a dead rank) waits first.
const GRACE_BEFORE_ABORTING: std::time::Duration = std::time::Duration::from_secs(5);

/// When a rank dies, a survivor's transport may fail at once on the broken link and abort
/// the process (UCX does, on reading a dead process's memory): the launcher would then
/// name that survivor as the first process that failed. A survivor that aborts waits a few
/// seconds first, so the launcher, which saw the death, names the dead rank and ends the
/// job meanwhile. (A rank that aborts alone is named after the pause.)
fn pause_before_aborting() {
    extern "C" fn pause(sig: c_int) {
        // SAFETY: only async-signal-safe calls: errno is saved and restored around nanosleep,
        // and raise delivers the signal again (blocked during this handler, so on return),
        // now with its default action (SA_RESETHAND): a SIGABRT sent from outside ends the
        // process too, not only abort()'s.
        unsafe {
            let errno = *libc::__errno_location();
            let wait = libc::timespec {
                tv_sec: GRACE_BEFORE_ABORTING.as_secs() as libc::time_t,
                tv_nsec: 0,
            };
            libc::nanosleep(&wait, std::ptr::null_mut());
            libc::raise(sig);
            *libc::__errno_location() = errno;
        }
    }
    // SAFETY: a zeroed sigaction is valid; the handler only sleeps and raises the signal
    // again; SA_RESETHAND leaves the default action in place after the first SIGABRT.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = pause as extern "C" fn(c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGABRT, &action, std::ptr::null_mut());
    }
}

/// A panic on one rank (a bug) would unwind into MPI_Finalize while the other ranks wait
/// in a collective: after the usual message, abort the job instead (exit code 101, Rust's
/// for a panic).
fn abort_job_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        if !mpi::environment::is_finalized() {
            let_launcher_forward_output();
            // SAFETY: MPI is initialised (the hook is set after MPI_Init) and not finalized.
            // The panicking thread may be a CPU worker, not the one FUNNELED allows to call
            // MPI; MPI_Abort is a last resort that need not return either way.
            unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 101) };
        }
    }));
}

/// Splits `n` f32 at `ptr` into (address, count) pieces of at most [`MAX_COUNT`].
fn pieces<T>(ptr: *mut T, n: usize) -> impl Iterator<Item = (*mut c_void, c_int)> {
    (0..n).step_by(MAX_COUNT).map(move |start| {
        let count = (n - start).min(MAX_COUNT);
        (ptr.wrapping_add(start) as *mut c_void, count as c_int)
    })
}

fn check(call: &str, code: c_int) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(Error::Device(format!("{call} failed with MPI error code {code}")))
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    unsafe fn all_reduce_sum(&self, buf: DevPtr, n: usize) -> Result<()> {
        // The Comm contract makes `buf` backend memory of `n` f32, and MpiComm is only
        // paired with the CPU backend, whose DevPtr is a host address.
        self.all_reduce_in_place(buf.addr() as *mut f32, n)
    }

    fn all_reduce_sum_host(&self, v: &mut [f32]) -> Result<()> {
        // SAFETY: `v` is a live, exclusively borrowed slice of `v.len()` f32.
        unsafe { self.all_reduce_in_place(v.as_mut_ptr(), v.len()) }
    }

    unsafe fn start_all_reduce_sum(&self, buf: DevPtr, n: usize, after: Option<DeviceStream>) -> Result<()> {
        super::host_ordered(self, after)?;
        // SAFETY: as in `all_reduce_sum`; the caller leaves the memory alone until
        // `finish_all_reduces` has waited (the trait's contract).
        unsafe { self.start_sum(buf.addr() as *mut f32, n, (ffi::RSMPI_FLOAT, ffi::RSMPI_SUM)) }
    }

    unsafe fn start_all_reduce_max_bits(&self, buf: DevPtr, n: usize, after: Option<DeviceStream>) -> Result<()> {
        super::host_ordered(self, after)?;
        // SAFETY: as in `start_all_reduce_sum`, for `n` words taken as 32-bit integers (signed:
        // MPICH 4.0 compares unsigned ones as signed too; the sign bits are clear).
        unsafe { self.start_sum(buf.addr() as *mut i32, n, (ffi::RSMPI_INT32_T, ffi::RSMPI_MAX)) }
    }

    unsafe fn reduce_scatter_sum(&self, buf: DevPtr, parts: &[Range<usize>]) -> Result<()> {
        let counts = part_counts(self, parts)?;
        let mut own = vec![0.0f32; parts[self.rank].len()];
        let buf = buf.addr() as *mut f32;
        // SAFETY: the Comm contract; MpiComm's DevPtrs are host addresses (CPU backend), and
        // the own part lies inside the buffer.
        unsafe {
            self.reduce_scatter_into(
                buf,
                (parts, &counts),
                &mut own,
                (ffi::RSMPI_FLOAT, ffi::RSMPI_SUM),
                None,
            )?;
            std::ptr::copy_nonoverlapping(own.as_ptr(), buf.add(parts[self.rank].start), own.len());
        }
        Ok(())
    }

    unsafe fn start_reduce_scatter_sum(
        &self,
        buf: DevPtr,
        parts: &[Range<usize>],
        after: Option<DeviceStream>,
    ) -> Result<()> {
        super::host_ordered(self, after)?;
        let types = (ffi::RSMPI_FLOAT, ffi::RSMPI_SUM);
        // SAFETY: as in `reduce_scatter_sum`; the caller leaves the memory alone until
        // `finish_all_reduces`.
        let (own, into, counts) = unsafe { self.start_scatter(buf.addr() as *mut f32, parts, types)? };
        self.scattered.borrow_mut().push(Scattered::F32 {
            own,
            into,
            _counts: counts,
        });
        Ok(())
    }

    unsafe fn start_all_reduce_sum_bf16(&self, buf: DevPtr<bf16>, n: usize, after: Option<DeviceStream>) -> Result<()> {
        super::host_ordered(self, after)?;
        // SAFETY: as in `start_all_reduce_sum`, for `n` bf16 values (16-bit words).
        unsafe { self.start_sum(buf.addr() as *mut u16, n, (ffi::RSMPI_UINT16_T, self.bf16_sum)) }
    }

    unsafe fn start_reduce_scatter_sum_bf16(
        &self,
        buf: DevPtr<bf16>,
        parts: &[Range<usize>],
        after: Option<DeviceStream>,
    ) -> Result<()> {
        super::host_ordered(self, after)?;
        let types = (ffi::RSMPI_UINT16_T, self.bf16_sum);
        // SAFETY: as in `start_reduce_scatter_sum`, for bf16 values (16-bit words).
        let (own, into, counts) = unsafe { self.start_scatter(buf.addr() as *mut u16, parts, types)? };
        self.scattered.borrow_mut().push(Scattered::Bf16 {
            own,
            into,
            _counts: counts,
        });
        Ok(())
    }

    unsafe fn all_gather(&self, buf: Words, parts: &[Range<usize>]) -> Result<()> {
        super::check_gather_parts(self, parts)?;
        // SAFETY (both): the Comm contract; MpiComm's DevPtrs are host addresses. bf16 values
        // travel as 16-bit words (a gather copies bits).
        unsafe {
            match buf {
                Words::F32(p) => self.broadcast_parts(p.addr() as *mut f32, ffi::RSMPI_FLOAT, parts),
                Words::Bf16(p) => self.broadcast_parts(p.addr() as *mut u16, ffi::RSMPI_UINT16_T, parts),
            }
        }
    }

    fn finish_all_reduces(&self, then: Option<DeviceStream>) -> Result<()> {
        super::host_ordered(self, then)?;
        let mut pending = self.pending.borrow_mut();
        if pending.is_empty() {
            return Ok(());
        }
        // SAFETY: `pending` holds valid (or already null) requests.
        let code =
            unsafe { ffi::MPI_Waitall(pending.len() as c_int, pending.as_mut_ptr(), ffi::RSMPI_STATUSES_IGNORE) };
        pending.clear();
        check("MPI_Waitall", code)?;
        for scattered in self.scattered.borrow_mut().drain(..) {
            // SAFETY: `into` is this rank's part of the buffer given to
            // `start_reduce_scatter_sum(_bf16)`, which the caller has left alone until now.
            match scattered {
                Scattered::F32 { own, into, .. } => unsafe {
                    std::ptr::copy_nonoverlapping(own.as_ptr(), into, own.len())
                },
                Scattered::Bf16 { own, into, .. } => unsafe {
                    std::ptr::copy_nonoverlapping(own.as_ptr(), into, own.len())
                },
            }
        }
        Ok(())
    }

    fn broadcast_bytes(&self, data: &mut Vec<u8>) -> Result<()> {
        // The size first, so every rank can make room for the data.
        let root = self.world.process_at_rank(0);
        let mut len = data.len() as u64;
        root.broadcast_into(&mut len);
        let len = usize::try_from(len).map_err(|_| {
            Error::Device(format!(
                "rank 0 broadcasts {len} bytes, more than this host can address"
            ))
        })?;
        data.resize(len, 0);
        for piece in data.chunks_mut(MAX_COUNT) {
            root.broadcast_into(piece);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("rank {} of {} on {}", self.rank, self.size, self.host)
    }

    fn abort(&self, exit_code: u8) {
        // MPI_Abort makes mpirun end every rank, with this exit code.
        abort_world(exit_code)
    }

    fn job_abort(&self) -> Option<fn(u8)> {
        Some(abort_world)
    }
}
