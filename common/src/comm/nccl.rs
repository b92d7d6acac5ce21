//! NCCL communicator for stage 3 (one rank per GPU): gradients are summed on the devices
//! with ncclAllReduce; everything else (start-up broadcasts, small host sums, aborting
//! the job) goes through the MPI communicator that bootstrapped it.

use super::mpi::MpiComm;
use super::{agree, Comm};
use crate::backend::DevPtr;
use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{result as nccl, sys};
use std::sync::Arc;

pub struct NcclComm {
    mpi: MpiComm,
    comm: sys::ncclComm_t,
    /// NCCL's own stream on this rank's GPU. The trainer synchronises the backend before
    /// every sum (the overlapped ones too), and `all_reduce_sum` waits for this stream
    /// before returning, so the two streams never race.
    stream: Arc<CudaStream>,
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
    cudarc::driver::result::init().map_err(|e| nccl_err("CUDA driver initialisation", e))?;
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

impl NcclComm {
    /// Picks GPU `local rank` on this host, makes the NCCL communicator (rank 0 creates the
    /// unique id, MPI broadcasts its 128 bytes) and keeps `mpi` for host-side collectives.
    pub fn init(mpi: MpiComm) -> Result<Self> {
        // Every rank must get this far before any waits in the id broadcast.
        let (ctx, stream, device) = agree(&mpi, open_device(&mpi))?;
        // Rank 0 makes the id; all ranks agree it worked before any waits in the broadcast.
        let id = if mpi.is_root() {
            nccl::get_uniqueid().map(Some)
        } else {
            Ok(None)
        };
        let id = agree(&mpi, id.map_err(|e| nccl_err("ncclGetUniqueId", e)))?;
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
        Ok(NcclComm {
            mpi,
            comm,
            stream,
            _ctx: ctx,
            device,
        })
    }

    /// The GPU this rank drives (its rank among the ranks on its host).
    pub fn device(&self) -> usize {
        self.device
    }
}

impl Comm for NcclComm {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }
    fn size(&self) -> usize {
        self.mpi.size()
    }
    unsafe fn all_reduce_sum(&self, buf: DevPtr, n: usize) -> Result<()> {
        let p = buf.addr() as *mut std::ffi::c_void;
        // SAFETY: `buf` is device memory of at least `n` floats on this rank's GPU (the
        // CUDA backend's gradient buffer); in place is allowed by NCCL.
        unsafe {
            nccl::all_reduce(
                p,
                p,
                n,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                self.stream.cu_stream() as _,
            )
        }
        .map_err(|e| nccl_err("ncclAllReduce", e))?;
        self.stream
            .synchronize()
            .map_err(|e| nccl_err("waiting for the all-reduce", e))
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
            let _ = nccl::comm_destroy(self.comm);
        }
    }
}
