//! Device memory: plain `cuMemAlloc` buffers that free themselves on drop, with the bytes in
//! use and the peak counted here (what `peak_memory_bytes` reports, cuBLAS's workspace and
//! the attention scratch included). Out of memory says how much was asked and how much is free.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{result as driver, sys as driver_sys, CudaContext, CudaStream, DriverError};

use crate::backend::{DevPtr, DeviceBuffer, Elem};
use crate::error::{Error, Result};

/// The context, the one stream, and the byte counters; shared by the backend and its buffers.
pub(super) struct DeviceMemory {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    in_use: AtomicU64,
    peak: AtomicU64,
}

impl DeviceMemory {
    pub(super) fn new(ctx: Arc<CudaContext>, stream: Arc<CudaStream>) -> Self {
        DeviceMemory {
            ctx,
            stream,
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
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
            });
        }
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::Device(format!("cannot allocate {len} elements: size overflows")))?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| device_err("binding the CUDA context", e))?;
        // SAFETY: a plain allocation; the pointer is owned by the returned buffer.
        let ptr = unsafe { driver::malloc_sync(bytes) }.map_err(|e| self.alloc_error(bytes, e))?;
        let buffer = CudaBuffer {
            ptr: DevPtr::from_addr(ptr),
            len,
            memory: Arc::clone(self),
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
        // SAFETY: allocated by `DeviceMemory::alloc`, freed exactly once, no work pending on it.
        let _ = unsafe { driver::free_sync(self.ptr.addr()) };
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
