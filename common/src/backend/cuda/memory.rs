//! Device memory: plain `cuMemAlloc` buffers that free themselves on drop, with the bytes in
//! use and the peak counted here (what `peak_memory_bytes` reports, cuBLAS's workspace and
//! the attention scratch included). Out of memory says how much was asked and how much is free.
//! Where a [`PeerMemory`] is given (stage 3), [`DeviceMemory::alloc_shared`] takes its buffers
//! from it instead: memory the other GPUs of the host can map.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result as driver, sys as driver_sys, CudaContext, CudaStream, DriverError};

use crate::backend::{DevPtr, DeviceBuffer, Elem};
use crate::error::{Error, Result};

/// The context, the one stream, and the byte counters; shared by the backend and its buffers.
pub(super) struct DeviceMemory {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    in_use: AtomicU64,
    peak: AtomicU64,
    /// Where `alloc_shared` takes its memory from; unset: as `alloc`.
    peer: OnceLock<PeerMemory>,
}

/// A way to allocate device memory that the other GPUs of this host can map into their
/// collectives (stage 3: NCCL's `ncclMemAlloc`). ZeRO-1 gathers into such a buffer, which NCCL
/// then fills with copy engines instead of thread blocks on the multiprocessors.
#[derive(Clone, Copy, Debug)]
pub struct PeerMemory {
    /// `bytes` bytes on the current context's GPU: their address, or why not.
    pub alloc: fn(bytes: usize) -> std::result::Result<u64, String>,
    /// Frees what `alloc` returned.
    pub free: fn(addr: u64),
}

impl DeviceMemory {
    pub(super) fn new(ctx: Arc<CudaContext>, stream: Arc<CudaStream>) -> Self {
        DeviceMemory {
            ctx,
            stream,
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            peer: OnceLock::new(),
        }
    }

    /// Has `alloc_shared` take its memory from `peer` (the first call only counts).
    pub(super) fn share_with(&self, peer: PeerMemory) {
        let _ = self.peer.set(peer);
    }

    /// As `alloc`, in memory from the [`PeerMemory`] given (`share_with`), where one was and
    /// it can give this much; else plain memory (the collectives on it then use thread blocks).
    pub(super) fn alloc_shared<T: Elem>(self: &Arc<Self>, len: usize) -> Result<CudaBuffer<T>> {
        match self.peer.get() {
            Some(&peer) if len > 0 => self.alloc_from(len, Some(peer)).or_else(|_| self.alloc(len)),
            _ => self.alloc(len),
        }
    }

    pub(super) fn peak_bytes(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// `len` zero-filled elements (the zeroing is queued on the stream).
    pub(super) fn alloc<T: Elem>(self: &Arc<Self>, len: usize) -> Result<CudaBuffer<T>> {
        if len == 0 {
            return Ok(CudaBuffer {
                ptr: DevPtr::from_addr(0),
                len,
                memory: Arc::clone(self),
                peer: None,
            });
        }
        self.alloc_from(len, None)
    }

    /// `len` (> 0) zero-filled elements from `peer`, or plain `cuMemAlloc` memory.
    fn alloc_from<T: Elem>(self: &Arc<Self>, len: usize, peer: Option<PeerMemory>) -> Result<CudaBuffer<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::Device(format!("cannot allocate {len} elements: size overflows")))?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| device_err("binding the CUDA context", e))?;
        let ptr = match peer {
            // SAFETY: a plain allocation; the pointer is owned by the returned buffer.
            None => unsafe { driver::malloc_sync(bytes) }.map_err(|e| self.alloc_error(bytes, e))?,
            Some(peer) => (peer.alloc)(bytes).map_err(|e| {
                Error::Device(format!(
                    "GPU allocation of {bytes} bytes other GPUs can map failed: {e}"
                ))
            })?,
        };
        let buffer = CudaBuffer {
            ptr: DevPtr::from_addr(ptr),
            len,
            memory: Arc::clone(self),
            peer,
        };
        let now = self.in_use.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.peak.fetch_max(now, Ordering::Relaxed);
        if alloc_log() {
            eprintln!("GPT2_CUDA_ALLOC_LOG alloc {bytes} in_use {now}");
        }
        // SAFETY: `ptr` holds `bytes` bytes; the memset is ordered before any later work on the stream.
        unsafe { driver::memset_d8_async(ptr, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| device_err("zero-filling a new buffer", e))?;
        Ok(buffer)
    }

    fn alloc_error(&self, bytes: usize, e: DriverError) -> Error {
        let (free, total) = driver::mem_get_info().unwrap_or((0, 0));
        let what = if e.0 == driver_sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            "out of GPU memory"
        } else {
            "GPU allocation failed"
        };
        Error::Device(format!(
            "{what}: asked for {bytes} bytes ({:.2} GiB), {free} bytes ({:.2} GiB) free of {:.2} GiB \
             ({:.2} GiB held by this process's backend): {e}",
            gib(bytes as u64),
            gib(free as u64),
            gib(total as u64),
            gib(self.in_use.load(Ordering::Relaxed)),
        ))
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

pub(super) fn device_err(what: &str, e: DriverError) -> Error {
    Error::Device(format!("{what}: {e}"))
}

/// An owned device allocation of `len()` elements of `T`, freed on drop.
pub struct CudaBuffer<T = f32> {
    ptr: DevPtr<T>,
    len: usize,
    memory: Arc<DeviceMemory>,
    /// Where the memory came from, when not from `cuMemAlloc` (it goes back there).
    peer: Option<PeerMemory>,
}

impl<T: Elem> DeviceBuffer<T> for CudaBuffer<T> {
    fn ptr(&self) -> DevPtr<T> {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl<T> Drop for CudaBuffer<T> {
    fn drop(&mut self) {
        if self.ptr.addr() == 0 {
            return;
        }
        let memory = &self.memory;
        // Queued kernels may still use the buffer: let them finish before it goes back.
        let _ = memory.ctx.bind_to_thread();
        let _ = memory.stream.synchronize();
        match self.peer {
            Some(peer) => (peer.free)(self.ptr.addr()),
            // SAFETY: allocated by `DeviceMemory::alloc`, freed exactly once, no work pending on it.
            None => {
                let _ = unsafe { driver::free_sync(self.ptr.addr()) };
            }
        }
        let bytes = (self.len * std::mem::size_of::<T>()) as u64;
        let before = memory.in_use.fetch_sub(bytes, Ordering::Relaxed);
        if alloc_log() {
            eprintln!("GPT2_CUDA_ALLOC_LOG free {bytes} in_use {}", before - bytes);
        }
    }
}

/// `GPT2_CUDA_ALLOC_LOG=1`: every device allocation and free on stderr with the bytes in use
/// after it (a diagnostic: where the peak comes from).
fn alloc_log() -> bool {
    static LOG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOG.get_or_init(|| std::env::var("GPT2_CUDA_ALLOC_LOG").is_ok_and(|v| v == "1"))
}
