//! The CUDA backend (cudarc): NVRTC-compiled kernels from `kernels/*.cu`, cuBLAS for the
//! matrix products, one stream for all work. `ops.rs` implements [`Backend`] and [`FusedMlp`]
//! (one launcher per op, named and ordered as its CPU twin); this file holds the device, the
//! kernel launcher and the error latch that carries a failed launch to the next `synchronize`.
//!
//! [`Backend`]: crate::backend::Backend
//! [`FusedMlp`]: crate::backend::FusedMlp

mod attention;
mod blas;
mod flash;
mod lt;
mod memory;
mod nvrtc;
mod ops;
mod snapshot;

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result as driver, sys as driver_sys, CudaContext};

use crate::backend::Precision;
use crate::backend::{DevPtr, DeviceBuffer};
use crate::error::{Error, Result};
use blas::Blas;
use lt::LtMatmul;
use memory::{device_err, DeviceMemory};
use nvrtc::Kernels;

pub use memory::{CudaBuffer, PeerMemory};
pub use nvrtc::{
    compile, compile_cached, kernel_cache_dir, kernel_names, kernel_sources, nvrtc_present, nvrtc_version,
};

/// Threads per block of the elementwise and row kernels.
const THREADS: usize = 256;
/// cuBLAS's workspace: NVIDIA recommends 32 MiB on Hopper.
const BLAS_WORKSPACE_BYTES: usize = 32 << 20;
/// Most blocks of the first pass of a grid-wide reduction (their partial sums are kept).
const MAX_REDUCE_BLOCKS: usize = 1024;

pub struct CudaBackend {
    // Field order is drop order: kernels and cuBLAS go before the memory they use.
    kernels: Kernels,
    blas: Blas,
    /// cuBLASLt for matmuls with a bias, the MLP's GELU or its ReLU (fused epilogues); `None`
    /// where libcublasLt is missing (every product then runs in cuBLAS, beside our kernels).
    lt: Option<LtMatmul>,
    #[allow(dead_code, reason = "owned here, used by cuBLAS through its raw pointer")]
    blas_workspace: CudaBuffer,
    /// Zeroed counters (one a column tile) with which the last block of a column reduction
    /// finds that it is last (`bias_backward_vec4_kernel`); each goes back to 0 after use.
    tickets: CudaBuffer<i32>,
    /// (MAX_REDUCE_BLOCKS) partial sums of `sum_squares`.
    reduce_partials: CudaBuffer,
    /// An FP8 product output's scale and amax where cuBLASLt reads and sets them, at words 0
    /// and 4 (16-byte aligned; `fp8_stage_scale_kernel`).
    fp8_staged: CudaBuffer,
    /// Attention's intermediates; grown to the largest call seen, then reused.
    scratch: Mutex<Option<CudaBuffer>>,
    /// Counts the scratch buffer's replacements (`Backend::memory_epoch`).
    scratch_epoch: std::sync::atomic::AtomicU64,
    /// First failure of an op that cannot return one; reported by `synchronize`.
    error: Mutex<Option<String>>,
    memory: Arc<DeviceMemory>,
    /// Checkpoints' copies of the state on the device (`Backend::snapshot`).
    snapshots: snapshot::Snapshots,
    name: String,
    precision: Precision,
    attention: AttentionPath,
    /// The kernels were built for sm_90a (Hopper), so its warpgroup products (wgmma) exist.
    wgmma: bool,
    /// FP8 products and conversions run here (`Backend::fp8`): bf16, cuBLASLt and a GPU of
    /// compute capability 8.9 or newer.
    fp8: bool,
}

/// A training step recorded as a CUDA graph (`Backend::begin_recording`), replayed on the
/// same memory.
pub struct Recording {
    graph: cudarc::driver::CudaGraph,
}

/// How causal attention runs (`GPT2_CUDA_ATTENTION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPath {
    /// Flash kernels: saves (B,NH,T) log-sum-exps. TF32 products on f32 operands
    /// (`kernels/flash_attention.cuh`); on bf16 ones bf16 products (`kernels/flash_bf16.cuh`),
    /// on Hopper at head size 64 its warpgroup products (`kernels/flash_wgmma.cuh`).
    Flash,
    /// Batched cuBLAS GEMMs around a softmax kernel: saves the (B,NH,T,T) probabilities. f32
    /// only; runs head sizes past the flash kernels' largest.
    Gemm,
}

impl AttentionPath {
    /// From the environment variable `GPT2_CUDA_ATTENTION` (`flash`, the default, or `gemm`).
    fn from_env() -> Result<Self> {
        match std::env::var("GPT2_CUDA_ATTENTION").as_deref() {
            Err(_) | Ok("") | Ok("flash") => Ok(AttentionPath::Flash),
            Ok("gemm") => Ok(AttentionPath::Gemm),
            Ok(other) => Err(Error::Input(format!(
                "GPT2_CUDA_ATTENTION={other}: expected `flash` or `gemm`"
            ))),
        }
    }
}

/// Whether a product of the MLP workload's fused step (`matmul_backward_relu`, `linear_sgd`)
/// of (m, n, k) runs in the tiled kernels of `kernels/mlp.cu`, with its epilogue (the ReLU
/// mask, the SGD update) fused: where the product is small (at most 2^24 multiply-adds) or
/// its reduction short (k ≤ 64: a weight gradient at a small batch). Elsewhere cuBLAS is
/// faster, followed by a kernel for the epilogue.
fn mlp_tiled(m: usize, n: usize, k: usize) -> bool {
    k <= 64 || m.saturating_mul(n).saturating_mul(k) <= 1 << 24
}

impl CudaBackend {
    /// Has [`Backend::alloc_shared`](crate::backend::Backend::alloc_shared) take its buffers
    /// from `peer` (before the model is made; the first call only counts).
    pub fn share_memory_with(&self, peer: PeerMemory) {
        self.memory.share_with(peer);
    }

    /// Opens GPU `device`, compiles the kernels for its architecture and sets up cuBLAS.
    pub fn new(device: usize, precision: Precision) -> Result<Self> {
        check_libraries()?;
        driver::init().map_err(|e| device_err("CUDA driver initialisation failed (is a GPU visible?)", e))?;
        let count = driver::device::get_count().map_err(|e| device_err("counting CUDA devices", e))?;
        if device >= count.max(0) as usize {
            return Err(Error::Device(format!(
                "no CUDA device {device}: {count} GPU(s) visible (CUDA_VISIBLE_DEVICES may hide them)"
            )));
        }
        let ctx = CudaContext::new(device).map_err(|e| device_err("creating the CUDA context", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| device_err("reading the compute capability", e))?;
        if major < 8 {
            // The flash attention kernels use Ampere's cp.async and TF32 mma instructions.
            return Err(Error::Device(format!(
                "GPU {device} is sm_{major}{minor}: these kernels need compute capability 8.0 or newer (Ampere, Hopper)"
            )));
        }
        // Hopper (9.0) builds for sm_90a: its architecture-specific instructions (wgmma), which
        // the bf16 flash kernels for head size 64 use (`kernels/flash_wgmma.cuh`).
        let arch = match (major, minor) {
            (9, 0) => "sm_90a".to_string(),
            _ => format!("sm_{major}{minor}"),
        };
        let stream = ctx.new_stream().map_err(|e| device_err("creating a CUDA stream", e))?;
        let gpu = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let memory = Arc::new(DeviceMemory::new(ctx, stream));

        let attention = AttentionPath::from_env()?;
        if attention == AttentionPath::Gemm && precision == Precision::Bf16 {
            return Err(Error::Input(
                "GPT2_CUDA_ATTENTION=gemm runs in f32 only: use --precision fp32 or tf32 with it".into(),
            ));
        }
        let kernels = Kernels::load(&arch, precision.act())?;
        flash::allow_shared_memory(&kernels)?;
        let blas_workspace = memory.alloc(BLAS_WORKSPACE_BYTES / 4)?;
        let tickets = memory.alloc(TICKETS)?;
        let blas = Blas::new(
            memory.stream.cu_stream(),
            precision,
            blas_workspace.ptr(),
            BLAS_WORKSPACE_BYTES,
        )?;
        let lt = LtMatmul::new(precision, blas_workspace.ptr(), BLAS_WORKSPACE_BYTES)?;
        let reduce_partials = memory.alloc(MAX_REDUCE_BLOCKS)?;
        let fp8_staged = memory.alloc(8)?;
        let fp8 = (major, minor) >= (8, 9) && precision == Precision::Bf16 && lt.is_some();
        Ok(CudaBackend {
            kernels,
            blas,
            lt,
            blas_workspace,
            tickets,
            reduce_partials,
            fp8_staged,
            scratch: Mutex::new(None),
            scratch_epoch: Default::default(),
            error: Mutex::new(None),
            memory,
            snapshots: Default::default(),
            name: format!("{gpu} ({arch}, {})", precision.name()),
            precision,
            attention,
            wgmma: arch == "sm_90a",
            fp8,
        })
    }

    /// The same backend with attention on `path` (tests compare the two; the GEMM path
    /// is f32 only, so a bf16 backend stays on flash).
    pub fn with_attention(mut self, path: AttentionPath) -> Self {
        if self.precision != Precision::Bf16 || path != AttentionPath::Gemm {
            self.attention = path;
        }
        self
    }

    pub fn attention_path(&self) -> AttentionPath {
        self.attention
    }

    /// The cuBLASLt epilogue plans made so far (`Bias`, `ReluBias`, `GeluAux { bias }`,
    /// `DGelu`), each with its (m, n, k) and whether cuBLASLt had an algorithm for it (where
    /// it had none, or the operands did not fit, the product ran unfused): what tests and
    /// benchmarks check the fused path by.
    pub fn epilogue_plans(&self) -> Vec<(String, [usize; 3], bool)> {
        self.lt.as_ref().map(|lt| lt.plans()).unwrap_or_default()
    }

    /// cuBLASLt, where the MLP's GELU goes into its products' epilogues: in bf16. In fp32 and
    /// tf32 cuBLASLt's f32 GELU epilogue kernels are slower than its plain products plus our
    /// GELU kernels, so those run the products, then the kernels.
    fn gelu_epilogues(&self) -> Option<&LtMatmul> {
        self.lt.as_ref().filter(|_| self.precision == Precision::Bf16)
    }

    fn stream(&self) -> driver_sys::CUstream {
        self.memory.stream.cu_stream()
    }

    /// Remembers the first failure; `synchronize` reports it.
    fn fail(&self, err: Error) {
        if let Ok(mut slot) = self.error.lock() {
            slot.get_or_insert_with(|| err.to_string());
        }
    }

    fn take_error(&self) -> Result<()> {
        match self.error.lock().ok().and_then(|mut slot| slot.take()) {
            Some(msg) => Err(Error::Device(msg)),
            None => Ok(()),
        }
    }

    fn bind(&self) -> Result<()> {
        self.memory
            .ctx
            .bind_to_thread()
            .map_err(|e| device_err("binding the CUDA context", e))
    }

    /// Queues elementwise kernel `name` over `n` items, one thread each.
    ///
    /// # Safety
    /// As [`CudaBackend::launch`].
    unsafe fn launch_1d(&self, name: &str, n: usize, args: &[Arg]) {
        self.launch(name, blocks(n, THREADS), (THREADS as u32, 1, 1), args);
    }

    /// Queues an FP8 quantizing kernel over `n` values: eight a thread a step of a grid-stride
    /// loop, over at most MAX_REDUCE_BLOCKS blocks of THREADS (one amax atomic a block).
    ///
    /// # Safety
    /// As [`CudaBackend::launch`].
    unsafe fn launch_quantize(&self, name: &str, n: usize, args: &[Arg]) {
        let grid = (n.div_ceil(8).div_ceil(THREADS).clamp(1, MAX_REDUCE_BLOCKS) as u32, 1, 1);
        self.launch(name, grid, (THREADS as u32, 1, 1), args);
    }

    /// Queues kernel `name` on the stream; a failure is latched for `synchronize`.
    /// Integer arguments must fit an `int`.
    ///
    /// # Safety
    /// The arguments match the kernel's signature, and every pointer covers what the
    /// kernel reads and writes at this grid (the Backend contract of the calling op).
    unsafe fn launch(&self, name: &str, grid: (u32, u32, u32), block: (u32, u32, u32), args: &[Arg]) {
        if let Err(e) = self.try_launch(name, grid, block, args) {
            self.fail(e);
        }
    }

    unsafe fn try_launch(&self, name: &str, grid: (u32, u32, u32), block: (u32, u32, u32), args: &[Arg]) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.try_launch_shared(name, grid, block, 0, args) }
    }

    /// [`CudaBackend::try_launch`] with `shared` bytes of dynamic shared memory (above 48 KiB
    /// only what the kernel was allowed when it was loaded: `flash::allow_shared_memory`).
    unsafe fn try_launch_shared(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        args: &[Arg],
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(()); // nothing to do
        }
        let function = self
            .kernels
            .get(name)
            .ok_or_else(|| Error::Device(format!("kernel {name} is not in the registry")))?;
        // Every argument sits in 8 bytes; a kernel reads 4 of them for int/float (little-endian).
        // Structs passed by value point at their own bytes.
        let mut storage = Vec::with_capacity(args.len());
        for arg in args {
            storage.push(match arg {
                Arg::Ptr(addr) => *addr,
                Arg::Int(x) => i32::try_from(*x)
                    .map_err(|_| Error::Device(format!("{name}: size {x} does not fit a 32-bit int")))?
                    as u32 as u64,
                Arg::F32(x) => x.to_bits() as u64,
                Arg::Bytes(_) => 0,
            });
        }
        let mut params: Vec<*mut c_void> = storage
            .iter_mut()
            .zip(args)
            .map(|(v, arg)| match arg {
                Arg::Bytes(bytes) => bytes.as_ptr() as *mut c_void,
                _ => v as *mut u64 as *mut c_void,
            })
            .collect();
        self.bind()?;
        // SAFETY: argument count and types follow the kernel's signature (kept in step with
        // the .cu files by the backend tests); cuLaunchKernel copies the values before returning.
        unsafe { driver::launch_kernel(function, grid, block, shared, self.stream(), &mut params) }
            .map_err(|e| device_err(&format!("launching {name}"), e))
    }

    /// A device scratch area of at least `words` f32s, valid until the next call.
    fn scratch(&self, words: usize) -> Result<DevPtr> {
        let mut slot = self
            .scratch
            .lock()
            .map_err(|_| Error::Device("scratch lock poisoned".into()))?;
        if slot.as_ref().is_none_or(|buf| buf.len() < words) {
            *slot = None; // free the old one first (its drop waits for the stream)
            self.scratch_epoch.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *slot = Some(self.memory.alloc(words)?);
        }
        Ok(slot.as_ref().map(|buf| buf.ptr()).unwrap_or_default())
    }
}

/// Column tiles a one-launch column reduction can count (`CudaBackend::tickets`): 128
/// columns each, so up to 524,288 columns.
const TICKETS: usize = 4096;

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.bind();
        let _ = self.memory.stream.synchronize();
    }
}

/// cudarc panics when a library it loads lazily is missing; check each one first.
fn check_libraries() -> Result<()> {
    // SAFETY: each only tries to dlopen the library's candidate names.
    let (driver_ok, blas_ok) = unsafe { (driver_sys::is_culib_present(), cudarc::cublas::sys::is_culib_present()) };
    if !driver_ok {
        return Err(Error::Device(
            "libcuda.so (the NVIDIA driver) not found: no NVIDIA GPU driver on this machine".into(),
        ));
    }
    if !blas_ok {
        return Err(Error::Device(
            "libcublas.so not found: install CUDA's cuBLAS (e.g. `pip install nvidia-cublas`) and put its \
             lib folder on LD_LIBRARY_PATH"
                .into(),
        ));
    }
    if !nvrtc_present() {
        return Err(nvrtc::missing_nvrtc());
    }
    Ok(())
}

/// One kernel argument.
#[derive(Clone)]
enum Arg {
    /// A device address.
    Ptr(u64),
    Int(usize),
    F32(f32),
    /// A struct passed by value, as its bytes.
    Bytes(Vec<u8>),
}

impl<T> From<DevPtr<T>> for Arg {
    fn from(p: DevPtr<T>) -> Self {
        Arg::Ptr(p.addr())
    }
}
impl From<usize> for Arg {
    fn from(x: usize) -> Self {
        Arg::Int(x)
    }
}
impl From<f32> for Arg {
    fn from(x: f32) -> Self {
        Arg::F32(x)
    }
}

/// `args![out, inp, n]`: a kernel's argument list.
macro_rules! args {
    ($($a:expr),* $(,)?) => { &[$(crate::backend::cuda::Arg::from($a)),*] };
}
use args;

/// Blocks of `threads` covering `n` items, as a 1-D grid.
fn blocks(n: usize, threads: usize) -> (u32, u32, u32) {
    (n.div_ceil(threads).min(u32::MAX as usize) as u32, 1, 1)
}
