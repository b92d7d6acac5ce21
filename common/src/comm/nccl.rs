//! NCCL communicator for stage 3 (one rank per GPU): gradients are summed on the devices
//! with ncclAllReduce (ncclReduceScatter under ZeRO-1); everything else (start-up
//! broadcasts, small host sums, aborting the job) goes through the MPI communicator that
//! bootstrapped it.
//!
//! The collectives run on a communication stream of their own. Blocking calls wait for it
//! on the host. Started ones (`--overlap`'s buckets) are ordered on the device instead: the
//! caller's compute stream records an event, the communication stream waits for it
//! (cuStreamWaitEvent) and then queues the collective, so backward goes on while a bucket is
//! summed; at the end the compute stream waits for an event recorded on the communication
//! stream after the last collective, before anything reads the sums.
//!
//! ZeRO-1's gathers into the weights' bf16 copy run on copy engines where NCCL can (2.28 or
//! later, every GPU joined by NVLink): that buffer comes from `ncclMemAlloc`
//! ([`NcclComm::peer_memory`], which the CUDA backend's `alloc_shared` takes), is registered
//! once as a symmetric window, and is gathered through a communicator of its own whose CTA
//! policy is zero (no thread blocks): the multiprocessors stay with the optimiser's update
//! beside it.

use super::mpi::MpiComm;
use super::{agree, everywhere, Comm, Words};
use crate::backend::cuda::PeerMemory;
use crate::backend::{bf16, DevPtr, DeviceStream};
use crate::error::{Error, Result};
use cudarc::driver::{result as driver, sys as driver_sys, CudaContext, CudaEvent, CudaStream};
use cudarc::nccl::{result as nccl, sys};
use std::cell::RefCell;
use std::ffi::c_void;
use std::ops::Range;
use std::sync::{Arc, Mutex};

pub struct NcclComm {
    mpi: MpiComm,
    comm: sys::ncclComm_t,
    /// The same ranks with CTA policy zero: the gathers into peer memory, on copy engines.
    /// `None` (NCCL before 2.28, one rank): every gather uses `comm`.
    copy: Option<sys::ncclComm_t>,
    /// For each run gathered so far (address, bytes): whether it goes through `copy`, as every
    /// rank agreed at its first gather (see `gather_comm`).
    gathers: RefCell<Vec<(u64, usize, bool)>>,
    /// NCCL's own stream on this rank's GPU (the communication stream). Before a blocking
    /// collective the trainer synchronises its backend, and the collective waits for this
    /// stream before returning; a started one is ordered by the two events below. Either
    /// way the two streams never race.
    stream: Arc<CudaStream>,
    /// Recorded on the caller's compute stream before a started collective; the
    /// communication stream waits for it (re-recording it later leaves earlier waits alone).
    ready: CudaEvent,
    /// Recorded on the communication stream after the last started collective; the compute
    /// stream waits for it in `finish_all_reduces`.
    done: CudaEvent,
    _ctx: Arc<CudaContext>,
    device: usize,
}

/// This rank's GPU and a stream on it.
fn open_device(mpi: &MpiComm) -> Result<(Arc<CudaContext>, Arc<CudaStream>, usize)> {
    // SAFETY: each only tries to dlopen the library's candidate names.
    let (driver_ok, nccl_ok) = unsafe { (cudarc::driver::sys::is_culib_present(), sys::is_culib_present()) };
    if !driver_ok {
        return Err(Error::Device(
            "libcuda.so (the NVIDIA driver) not found: no NVIDIA GPU on this host".into(),
        ));
    }
    if !nccl_ok {
        return Err(Error::Device(
            "libnccl.so not found: install NCCL and put it on LD_LIBRARY_PATH".into(),
        ));
    }
    // One rank per GPU: the rank among this host's ranks picks the GPU (modulo the GPUs
    // visible, for launchers that give each rank its own CUDA_VISIBLE_DEVICES).
    cudarc::driver::result::init().map_err(|e| {
        nccl_err(
            "CUDA driver initialisation failed (is a GPU visible? CUDA_VISIBLE_DEVICES may hide them)",
            e,
        )
    })?;
    let count = cudarc::driver::result::device::get_count()
        .map_err(|e| nccl_err("counting GPUs", e))?
        .max(1);
    let device = mpi.local_rank() % count as usize;
    let ctx = CudaContext::new(device).map_err(|e| {
        Error::Device(format!(
            "{}: cannot open GPU {device} (one rank per GPU on each host): {e:?}",
            mpi.describe()
        ))
    })?;
    let stream = ctx.new_stream().map_err(|e| nccl_err("creating a stream", e))?;
    Ok((ctx, stream, device))
}

fn nccl_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("NCCL: {what}: {e:?}"))
}

/// NCCL's version as a number (2.28.9: 22809).
fn nccl_version() -> Result<i32> {
    let mut version = 0;
    // SAFETY: writes one int.
    unsafe { sys::ncclGetVersion(&mut version) }
        .result()
        .map_err(|e| nccl_err("ncclGetVersion", e))?;
    Ok(version)
}

/// NCCL_CTA_POLICY_ZERO: no thread blocks where NCCL can (copy engines), from 2.28.
const CTA_POLICY_ZERO: i32 = 2;
/// The first NCCL with copy-engine collectives (2.28.0).
const COPY_ENGINES_SINCE: i32 = 22800;
/// NCCL_WIN_COLL_SYMMETRIC: every rank registers the same layout, collectives use the same
/// offsets everywhere.
const WIN_COLL_SYMMETRIC: i32 = 1;

/// A communicator of the same ranks as `comm` that uses no thread blocks where NCCL can do
/// without (CTA policy zero): copy engines (ncclCommSplit with a config). Every rank calls it.
fn split_copy_engines(comm: sys::ncclComm_t, version: i32) -> Result<sys::ncclComm_t> {
    // NCCL_CONFIG_INITIALIZER: every field undefined (NCCL's defaults) but the CTA policy.
    const UNDEF: i32 = i32::MIN;
    let mut config = sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: version as u32,
        blocking: UNDEF,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: CTA_POLICY_ZERO,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    };
    let mut split = std::ptr::null_mut();
    // SAFETY: `comm` is live; every rank splits with the same colour (one group, ranks in
    // the same order); NCCL writes `split` and reads `config` during the call.
    unsafe { sys::ncclCommSplit(comm, 0, 0, &mut split, &mut config) }
        .result()
        .map_err(|e| nccl_err("ncclCommSplit (CTA policy zero)", e))?;
    Ok(split)
}

/// A buffer from `ncclMemAlloc` ([`NcclComm::peer_memory`]), and its window once a gather has
/// registered it.
struct PeerBuffer {
    addr: u64,
    bytes: usize,
    /// (the copy-engine communicator, the window), as addresses (raw pointers are not Send).
    window: Option<(usize, usize)>,
}

/// Every live buffer of this process from `ncclMemAlloc`.
static PEER_BUFFERS: Mutex<Vec<PeerBuffer>> = Mutex::new(Vec::new());

fn peer_buffers() -> std::sync::MutexGuard<'static, Vec<PeerBuffer>> {
    PEER_BUFFERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Test hook (feature `fault-injection`): `GPT2RS_NO_NCCL_MEMORY_RANK=r` has `ncclMemAlloc`
/// refused on rank r (set by [`NcclComm::peer_memory`]), so that rank holds the bf16 copy in
/// plain memory and every rank must fall back to thread blocks (`gather_comm`).
#[cfg(feature = "fault-injection")]
static REFUSE_PEER_MEMORY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn alloc_peer(bytes: usize) -> std::result::Result<u64, String> {
    #[cfg(feature = "fault-injection")]
    if REFUSE_PEER_MEMORY.load(std::sync::atomic::Ordering::Relaxed) {
        return Err("refused on purpose (GPT2RS_NO_NCCL_MEMORY_RANK test hook)".into());
    }
    let mut ptr = std::ptr::null_mut();
    // SAFETY: NCCL writes the address of `bytes` bytes on the current context's GPU.
    unsafe { sys::ncclMemAlloc(&mut ptr, bytes) }
        .result()
        .map_err(|e| format!("ncclMemAlloc: {e:?}"))?;
    let addr = ptr as u64;
    peer_buffers().push(PeerBuffer {
        addr,
        bytes,
        window: None,
    });
    Ok(addr)
}

/// Which buffer from `ncclMemAlloc` holds the `bytes` bytes at `addr`, if one does.
fn peer_buffer_index(addr: u64, bytes: usize) -> Option<usize> {
    let within = |b: &PeerBuffer| b.addr <= addr && addr + bytes as u64 <= b.addr + b.bytes as u64;
    peer_buffers().iter().position(within)
}

/// Registers the buffer from `ncclMemAlloc` that holds the `bytes` bytes at `addr` as a
/// symmetric window on `copy` (once; a collective every rank calls together).
fn register_window(copy: sys::ncclComm_t, addr: u64, bytes: usize) -> Result<()> {
    let at = peer_buffer_index(addr, bytes).ok_or_else(|| nccl_err("ncclCommWindowRegister", "not NCCL memory"))?;
    let mut buffers = peer_buffers();
    let buffer = &mut buffers[at];
    if buffer.window.is_none() {
        let mut win = std::ptr::null_mut();
        // SAFETY: the buffer is live device memory from `ncclMemAlloc` on this GPU, of
        // `buffer.bytes` bytes; every rank registers its own such buffer here, together.
        unsafe {
            sys::ncclCommWindowRegister(
                copy,
                buffer.addr as *mut c_void,
                buffer.bytes,
                &mut win,
                WIN_COLL_SYMMETRIC,
            )
        }
        .result()
        .map_err(|e| nccl_err("ncclCommWindowRegister", e))?;
        buffer.window = Some((copy as usize, win as usize));
    }
    Ok(())
}

/// Takes back a window (the communicator it was registered on, the window), taken out of its
/// `PeerBuffer` so that it is deregistered once. Its communicator is live: NcclComm's drop
/// deregisters the windows still held before destroying it; every rank takes its own back at
/// the same point (a failed registration, a freed model, the communicator's end).
fn deregister((comm, win): (usize, usize)) {
    // SAFETY: as above.
    unsafe {
        let _ = sys::ncclCommWindowDeregister(comm as sys::ncclComm_t, win as sys::ncclWindow_t);
    }
}

/// Takes back the window of the buffer holding the `bytes` bytes at `addr`, if it has one.
fn deregister_window(addr: u64, bytes: usize) {
    if let Some(at) = peer_buffer_index(addr, bytes) {
        if let Some(window) = peer_buffers()[at].window.take() {
            deregister(window);
        }
    }
}

fn free_peer(addr: u64) {
    let mut buffers = peer_buffers();
    if let Some(at) = buffers.iter().position(|b| b.addr == addr) {
        if let Some(window) = buffers.swap_remove(at).window {
            deregister(window);
        }
    }
    // SAFETY: from `ncclMemAlloc`, freed once; the caller waited for the work on it.
    unsafe {
        let _ = sys::ncclMemFree(addr as *mut c_void);
    }
}

/// What [`NcclComm::init`] opens beside the MPI communicator it keeps.
struct Opened {
    comm: sys::ncclComm_t,
    copy: Option<sys::ncclComm_t>,
    stream: Arc<CudaStream>,
    ready: CudaEvent,
    done: CudaEvent,
    ctx: Arc<CudaContext>,
    device: usize,
}

impl NcclComm {
    /// Picks GPU `local rank` on this host, makes the NCCL communicator (rank 0 creates the
    /// unique id, MPI broadcasts its 128 bytes) and keeps `mpi` for host-side collectives.
    /// On an error `mpi` comes back, for the ranks to leave together (see `app::fail`): an
    /// error every rank met alike (no GPU, no driver) is then one line.
    // The error hands back the MPI communicator itself (large, and used once, to leave).
    #[allow(clippy::result_large_err)]
    pub fn init(mpi: MpiComm) -> std::result::Result<Self, (Error, MpiComm)> {
        match Self::open(&mpi) {
            Ok(o) => Ok(NcclComm {
                mpi,
                comm: o.comm,
                copy: o.copy,
                gathers: RefCell::new(Vec::new()),
                stream: o.stream,
                ready: o.ready,
                done: o.done,
                _ctx: o.ctx,
                device: o.device,
            }),
            Err(e) => Err((e, mpi)),
        }
    }

    fn open(mpi: &MpiComm) -> Result<Opened> {
        // Every rank must get this far before any waits in the id broadcast.
        let (ctx, stream, device) = agree(mpi, open_device(mpi))?;
        // Rank 0 makes the id; all ranks agree it worked before any waits in the broadcast.
        let id = if mpi.is_root() {
            nccl::get_uniqueid().map(Some)
        } else {
            Ok(None)
        };
        let id = agree(mpi, id.map_err(|e| nccl_err("ncclGetUniqueId", e)))?;
        let mut id_bytes: Vec<u8> = id.map_or_else(Vec::new, |id| id.internal.iter().map(|&c| c as u8).collect());
        mpi.broadcast_bytes(&mut id_bytes)?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        if id_bytes.len() != id.internal.len() {
            return Err(nccl_err(
                "unique id from rank 0",
                format!("{} bytes, expected 128", id_bytes.len()),
            ));
        }
        for (dst, &b) in id.internal.iter_mut().zip(&id_bytes) {
            *dst = b as _;
        }
        let mut comm = std::ptr::null_mut();
        let init = ctx
            .bind_to_thread()
            .map_err(|e| nccl_err("binding the CUDA context", e))
            .and_then(|()| {
                // SAFETY: `comm` is written by NCCL; the id is the one every rank received.
                unsafe { nccl::comm_init_rank(&mut comm, mpi.size() as i32, id, mpi.rank() as i32) }
                    .map(|_| ())
                    .map_err(|e| nccl_err("ncclCommInitRank", e))
            });
        if let Err(e) = init {
            // The other ranks may be waiting inside ncclCommInitRank: end the whole job.
            eprintln!("stage3_mpi_cuda ({}): error: {e}", mpi.describe());
            mpi.abort(1);
            return Err(e);
        }
        // The gathers run on copy engines where NCCL has them and there is someone to gather
        // from (ncclCommSplit waits for every rank, which all decide by this rule).
        let version = match nccl_version() {
            Ok(version) => version,
            Err(e) => {
                // SAFETY: made above, destroyed once, used by nothing else.
                unsafe {
                    let _ = nccl::comm_destroy(comm);
                }
                return Err(e);
            }
        };
        let copy_engines = version >= COPY_ENGINES_SINCE && mpi.size() > 1;
        let copy = match copy_engines.then(|| split_copy_engines(comm, version)).transpose() {
            Ok(copy) => copy,
            Err(e) => {
                // The other ranks may be waiting inside ncclCommSplit: end the whole job.
                eprintln!("stage3_mpi_cuda ({}): error: {e}", mpi.describe());
                mpi.abort(1);
                return Err(e);
            }
        };
        let events = ctx
            .new_event(None)
            .and_then(|ready| Ok((ready, ctx.new_event(None)?)))
            .map_err(|e| nccl_err("creating CUDA events", e));
        // Every rank holds its communicator now: none may leave alone.
        let (ready, done) = agree(mpi, events)?;
        Ok(Opened {
            comm,
            copy,
            stream,
            ready,
            done,
            ctx,
            device,
        })
    }

    /// The GPU this rank drives (its rank among the ranks on its host).
    pub fn device(&self) -> usize {
        self.device
    }

    /// Where the CUDA backend should take the buffers it shares (`alloc_shared`: the weights'
    /// bf16 copy), when the gathers into them can run on copy engines (see the module
    /// documentation); `None`: plain memory, as any other buffer.
    pub fn peer_memory(&self) -> Option<PeerMemory> {
        #[cfg(feature = "fault-injection")]
        {
            let refuse = std::env::var("GPT2RS_NO_NCCL_MEMORY_RANK")
                .ok()
                .and_then(|r| r.parse::<usize>().ok());
            if refuse == Some(self.rank()) {
                REFUSE_PEER_MEMORY.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        self.copy.map(|_| PeerMemory {
            alloc: alloc_peer,
            free: free_peer,
        })
    }

    /// The communicator for an all-gather over `bytes` bytes at `addr`: the copy-engine one
    /// where they lie in a buffer from `ncclMemAlloc` registered as a window, else `comm`.
    /// Decided at the first gather over that run, a point every rank reaches together: every
    /// rank must hold it in such a buffer (one whose `ncclMemAlloc` failed holds plain memory,
    /// see `alloc_shared`), and then every rank's registration must succeed; otherwise every
    /// rank gathers through `comm`, as without copy engines. (A decision outlives a freed
    /// buffer: either communicator gathers any memory correctly, `copy` through thread blocks
    /// where no window holds it.)
    fn gather_comm(&self, addr: u64, bytes: usize) -> Result<sys::ncclComm_t> {
        let known = self
            .gathers
            .borrow()
            .iter()
            .find(|g| (g.0, g.1) == (addr, bytes))
            .map(|g| g.2);
        let use_copy = match (known, self.copy) {
            (_, None) => false,
            (Some(use_copy), Some(_)) => use_copy,
            (None, Some(copy)) => {
                let all_hold = everywhere(&self.mpi, peer_buffer_index(addr, bytes).is_some())?;
                let registered = all_hold && register_window(copy, addr, bytes).is_ok();
                let use_copy = all_hold && everywhere(&self.mpi, registered)?;
                if registered && !use_copy {
                    deregister_window(addr, bytes);
                }
                use_copy
            }
        };
        if known.is_none() {
            self.gathers.borrow_mut().push((addr, bytes, use_copy));
        }
        Ok(match (use_copy, self.copy) {
            (true, Some(copy)) => copy,
            _ => self.comm,
        })
    }

    /// Waits for what was queued on NCCL's stream (`what` names it in an error).
    fn wait(&self, what: &str) -> Result<()> {
        self.stream.synchronize().map_err(|e| nccl_err(what, e))
    }

    /// The NCCL stream as the raw handle the NCCL calls take.
    fn raw_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as _
    }

    /// Makes the communication stream wait, on the device, for the work queued so far on
    /// `compute` (nothing to do without one: the caller has synchronised).
    fn wait_for(&self, compute: Option<DeviceStream>) -> Result<()> {
        let Some(compute) = compute else {
            return Ok(());
        };
        self._ctx
            .bind_to_thread()
            .map_err(|e| nccl_err("binding the CUDA context", e))?;
        let wait = driver_sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: `compute` is the live stream of the backend on this GPU's primary context
        // (the one `_ctx` retains); both events and our stream live as long as `self`.
        unsafe {
            driver::event::record(self.ready.cu_event(), compute.raw() as driver_sys::CUstream)
                .map_err(|e| nccl_err("recording the compute stream's event", e))?;
            driver::stream::wait_event(self.stream.cu_stream(), self.ready.cu_event(), wait)
                .map_err(|e| nccl_err("ordering the collective after the compute stream", e))
        }
    }

    /// Queues the sum of `n` values at `buf` (f32, or bf16 summed in bf16) on the
    /// communication stream.
    ///
    /// # Safety
    /// As [`Comm::all_reduce_sum`].
    unsafe fn queue_all_reduce(&self, buf: Words, n: usize) -> Result<()> {
        let p = buf.addr() as *mut c_void;
        // SAFETY: `buf` is device memory of at least `n` values on this rank's GPU (the
        // CUDA backend's gradient buffer, or its bf16 copy); in place is allowed by NCCL.
        unsafe {
            nccl::all_reduce(
                p,
                p,
                n,
                nccl_type(buf),
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                self.raw_stream(),
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_err("ncclAllReduce", e))
    }

    /// Queues the reduce-scatter of `parts` of `buf` on the communication stream: one
    /// ncclReduceScatter when the parts are equal, else one ncclReduce per part onto its rank.
    ///
    /// # Safety
    /// As [`Comm::reduce_scatter_sum`].
    unsafe fn queue_reduce_scatter(&self, buf: Words, parts: &[Range<usize>]) -> Result<()> {
        super::check_parts(self, parts)?;
        let comm = self.comm;
        let (base, size) = (buf.addr() as *mut u8, buf.size());
        let (float, sum) = (nccl_type(buf), sys::ncclRedOp_t::ncclSum);
        // SAFETY (both arms): `buf` is device memory covering `parts` on this rank's GPU (the
        // Comm contract); in place is allowed (the own part at its own offset). Offsets in
        // bytes of `size`-byte values.
        match equal_parts(parts) {
            Some(len) => unsafe {
                let own = base.add(parts[self.rank()].start * size) as *mut c_void;
                let run = base.add(parts[0].start * size) as *const c_void;
                nccl::reduce_scatter(run, own, len, float, sum, comm, self.raw_stream())
                    .map(|_| ())
                    .map_err(|e| nccl_err("ncclReduceScatter", e))
            },
            // Uneven parts: one reduce per part onto its rank, started together.
            None => grouped(|| {
                for (root, part) in parts.iter().enumerate().filter(|(_, p)| !p.is_empty()) {
                    unsafe {
                        let p = base.add(part.start * size) as *mut c_void;
                        let stream = self.raw_stream();
                        nccl::reduce(p, p, part.len(), float, sum, root as i32, comm, stream)
                            .map_err(|e| nccl_err("ncclReduce", e))?;
                    }
                }
                Ok(())
            }),
        }
    }

    /// Queues the all-gather of `parts` of `buf` on the communication stream: one
    /// ncclAllGather when the parts are equal, else one ncclBroadcast per part from its rank.
    ///
    /// # Safety
    /// As [`Comm::all_gather`].
    unsafe fn queue_all_gather(&self, buf: Words, parts: &[Range<usize>]) -> Result<()> {
        super::check_gather_parts(self, parts)?;
        let (base, size, words) = (buf.addr() as *mut u8, buf.size(), nccl_type(buf));
        // SAFETY (both arms): as in `reduce_scatter_sum`; offsets in bytes of `size`-byte values.
        match equal_parts(parts) {
            Some(len) => unsafe {
                let own = base.add(parts[self.rank()].start * size) as *const c_void;
                let run = base.add(parts[0].start * size) as *mut c_void;
                let comm = self.gather_comm(run as u64, len * parts.len() * size)?;
                nccl::all_gather(own, run, len, words, comm, self.raw_stream())
                    .map_err(|e| nccl_err("ncclAllGather", e))?;
            },
            None => grouped(|| {
                for (root, part) in parts.iter().enumerate().filter(|(_, p)| !p.is_empty()) {
                    unsafe {
                        let p = base.add(part.start * size) as *mut c_void;
                        nccl::broadcast(p, p, part.len(), words, root as i32, self.comm, self.raw_stream())
                            .map_err(|e| nccl_err("ncclBroadcast", e))?;
                    }
                }
                Ok(())
            })?,
        }
        Ok(())
    }
}

/// NCCL's type of `buf`'s values.
fn nccl_type(buf: Words) -> sys::ncclDataType_t {
    match buf {
        Words::F32(_) => sys::ncclDataType_t::ncclFloat32,
        Words::Bf16(_) => sys::ncclDataType_t::ncclBfloat16,
    }
}

/// The size of every part when all are equal and without gaps, one run from `parts[0].start`
/// (NCCL's native reduce-scatter and all-gather apply), else `None`.
fn equal_parts(parts: &[Range<usize>]) -> Option<usize> {
    let len = parts.first()?.len();
    let run = parts.windows(2).all(|w| w[0].end == w[1].start);
    (run && parts.iter().all(|p| p.len() == len)).then_some(len)
}

/// Runs the NCCL calls `queue` makes as one group (they start together).
fn grouped(queue: impl FnOnce() -> Result<()>) -> Result<()> {
    nccl::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
    let queued = queue();
    let ended = nccl::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
    queued.and(ended.map(|_| ()))
}

impl Comm for NcclComm {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }
    fn size(&self) -> usize {
        self.mpi.size()
    }
    fn orders_on_device(&self) -> bool {
        true
    }
    unsafe fn all_reduce_sum(&self, buf: DevPtr, n: usize) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.queue_all_reduce(Words::F32(buf), n)? };
        self.wait("waiting for the all-reduce")
    }
    unsafe fn start_all_reduce_sum(&self, buf: DevPtr, n: usize, after: Option<DeviceStream>) -> Result<()> {
        self.wait_for(after)?;
        // SAFETY: the caller's contract; the sum is queued after the work that writes `buf`.
        unsafe { self.queue_all_reduce(Words::F32(buf), n) }
    }
    unsafe fn start_all_reduce_max_bits(&self, buf: DevPtr, n: usize, after: Option<DeviceStream>) -> Result<()> {
        self.wait_for(after)?;
        let p = buf.addr() as *mut c_void;
        // SAFETY: the caller's contract (`n` words of device memory on this rank's GPU,
        // written by the work queued on `after` before this call); in place is allowed.
        unsafe {
            nccl::all_reduce(
                p,
                p,
                n,
                sys::ncclDataType_t::ncclInt32,
                sys::ncclRedOp_t::ncclMax,
                self.comm,
                self.raw_stream(),
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_err("ncclAllReduce (max)", e))
    }
    unsafe fn reduce_scatter_sum(&self, buf: DevPtr, parts: &[Range<usize>]) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.queue_reduce_scatter(Words::F32(buf), parts)? };
        self.wait("waiting for the reduce-scatter")
    }
    unsafe fn start_reduce_scatter_sum(
        &self,
        buf: DevPtr,
        parts: &[Range<usize>],
        after: Option<DeviceStream>,
    ) -> Result<()> {
        self.wait_for(after)?;
        // SAFETY: as in `start_all_reduce_sum`.
        unsafe { self.queue_reduce_scatter(Words::F32(buf), parts) }
    }
    unsafe fn start_all_reduce_sum_bf16(&self, buf: DevPtr<bf16>, n: usize, after: Option<DeviceStream>) -> Result<()> {
        self.wait_for(after)?;
        // SAFETY: as in `start_all_reduce_sum`, for bf16 values.
        unsafe { self.queue_all_reduce(Words::Bf16(buf), n) }
    }
    unsafe fn start_reduce_scatter_sum_bf16(
        &self,
        buf: DevPtr<bf16>,
        parts: &[Range<usize>],
        after: Option<DeviceStream>,
    ) -> Result<()> {
        self.wait_for(after)?;
        // SAFETY: as in `start_all_reduce_sum`, for bf16 values.
        unsafe { self.queue_reduce_scatter(Words::Bf16(buf), parts) }
    }
    fn finish_all_reduces(&self, then: Option<DeviceStream>) -> Result<()> {
        let Some(compute) = then else {
            return self.wait("waiting for the gradient sums");
        };
        self._ctx
            .bind_to_thread()
            .map_err(|e| nccl_err("binding the CUDA context", e))?;
        let wait = driver_sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: as in `wait_for`, the other way round.
        unsafe {
            driver::event::record(self.done.cu_event(), self.stream.cu_stream())
                .map_err(|e| nccl_err("recording the sums' event", e))?;
            driver::stream::wait_event(compute.raw() as driver_sys::CUstream, self.done.cu_event(), wait)
                .map_err(|e| nccl_err("ordering the optimiser after the sums", e))
        }
    }
    unsafe fn all_gather(&self, buf: Words, parts: &[Range<usize>]) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.queue_all_gather(buf, parts)? };
        self.wait("waiting for the all-gather")
    }
    unsafe fn start_all_gather(&self, buf: Words, parts: &[Range<usize>], after: Option<DeviceStream>) -> Result<()> {
        self.wait_for(after)?;
        // SAFETY: as in `start_all_reduce_sum`.
        unsafe { self.queue_all_gather(buf, parts) }
    }
    fn gather_means(&self) -> Option<&'static str> {
        let gathers = self.gathers.borrow();
        let copy = gathers.iter().filter(|g| g.2).count();
        match (copy, gathers.len() - copy) {
            (0, 0) => None,
            (_, 0) => Some("copy engines"),
            (0, _) => Some("thread blocks"),
            _ => Some("copy engines and thread blocks"),
        }
    }
    fn all_reduce_sum_host(&self, v: &mut [f32]) -> Result<()> {
        self.mpi.all_reduce_sum_host(v)
    }
    fn broadcast_bytes(&self, data: &mut Vec<u8>) -> Result<()> {
        self.mpi.broadcast_bytes(data)
    }
    fn describe(&self) -> String {
        format!("{}, GPU {}", self.mpi.describe(), self.device)
    }
    fn abort(&self, exit_code: u8) {
        self.mpi.abort(exit_code)
    }
    fn job_abort(&self) -> Option<fn(u8)> {
        self.mpi.job_abort()
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: the communicator was initialised and is destroyed once.
        unsafe {
            if let Some(copy) = self.copy {
                // Windows of buffers still alive go first (see `deregister`).
                for buffer in peer_buffers().iter_mut() {
                    if let Some(window) = buffer.window.take_if(|&mut (comm, _)| comm == copy as usize) {
                        deregister(window);
                    }
                }
                let _ = nccl::comm_destroy(copy);
            }
            let _ = nccl::comm_destroy(self.comm);
        }
    }
}
