//! The CUDA backend (cudarc): NVRTC-compiled kernels from `kernels/*.cu`, cuBLAS for the
//! matrix products, one stream for all work. `ops.rs` implements [`Backend`] (one launcher
//! per op, named and ordered as its CPU twin); this file holds the device, the kernel
//! launcher and the error latch that carries a failed launch to the next `synchronize`.
//!
//! [`Backend`]: crate::backend::Backend

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

pub use flash::HopperBackward;
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
    /// cuBLASLt for matmuls with a bias, the MLP's GELU or the bias gradient (fused
    /// epilogues); `None` when off (GPT2_CUDA_BIAS_EPILOGUE=0) or missing.
    lt: Option<LtMatmul>,
    #[allow(dead_code, reason = "owned here, used by cuBLAS through its raw pointer")]
    blas_workspace: CudaBuffer,
    /// Zeroed counters (one a column tile) with which the last block of a column reduction
    /// finds that it is last (`bias_backward_vec4_kernel`); each goes back to 0 after use.
    tickets: CudaBuffer<i32>,
    /// (MAX_REDUCE_BLOCKS) partial sums of `sum_squares`.
    reduce_partials: CudaBuffer,
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
    /// Which flash backward runs where the Hopper kernels do (`GPT2_CUDA_ATTN_BWD`).
    hopper_backward: HopperBackward,
    gelu: GeluPath,
    bias_grad: BiasGradPath,
    residual: ResidualPath,
    /// The training loss's forward and in-place backward in one kernel (`GPT2_CUDA_LOSS`,
    /// `fused` by default, or `unfused`: the two kernels).
    fused_loss: bool,
    /// The layernorm backward in one pass where a `layernorm_backward_fused_k*` instance takes
    /// the width (`GPT2_CUDA_LN_BWD`, `fused` by default, or `unfused`: the dinp kernel, then
    /// the parameter kernel reading dout and the input again).
    one_pass_layernorm: bool,
    /// A product's bias gradient, where the add-layernorm backward writes its output gradient
    /// (`Backend::add_layernorm_backward`'s `dbias`), summed in the one-pass layernorm kernel
    /// from the values it stores (`GPT2_CUDA_LN_BIAS`, `fused` by default, or `unfused`: the
    /// column-sum kernels reading that gradient back, as the product's backward ran them).
    layernorm_bias_sums: bool,
    /// The qkv product's bias gradient, where the attention backward writes qkv's gradient
    /// (`Backend::attention_backward`'s `dbias`), summed by the Hopper kernels from
    /// the tiles they store (`GPT2_CUDA_ATTN_BIAS`, `fused` by default, or `unfused`: the
    /// column-sum kernels reading that gradient back).
    attention_bias_sums: bool,
    /// The MLP's first product's bias gradient, the column sums of the hidden layer's
    /// gradient, in the epilogue of the product that writes that gradient (cuBLASLt's
    /// DGELU_BGRAD, where the GELU epilogues run; `GPT2_CUDA_DGELU_BIAS=fused`), or by the
    /// column-sum kernels reading that gradient back (`unfused`, the default: on an H100 in
    /// bf16 the epilogue's kernel cost 2.6 ms a step more than the sums it saves, NOTES 34).
    dgelu_bias_sums: bool,
    /// The token embedding's gradient in chunks of 32 positions, then the chunks in order,
    /// where C allows (`GPT2_CUDA_WTE_BWD`, `fused` by default, or `unfused`: one thread sums a
    /// token's whole run of rows, a serial chain as long as text's commonest token's count).
    chunked_wte: bool,
    /// A product's first input gradient written by the product (beta = 0), not zeroed and
    /// then added to (`GPT2_CUDA_DGRAD`, `fused` by default, or `unfused`).
    overwrite_dgrad: bool,
    /// The MLP's ReLU in its products' epilogues (cuBLASLt's RELU_BIAS; `GPT2_CUDA_RELU`).
    relu_epilogue: bool,
    mlp_tiles: MlpTiles,
}

/// How causal attention runs. Both are kept so that they can be compared.
/// A training step recorded as a CUDA graph (`Backend::begin_recording`), replayed on the
/// same memory.
pub struct Recording {
    graph: cudarc::driver::CudaGraph,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPath {
    /// Flash kernels: saves (B,NH,T) log-sum-exps. TF32 products on f32 operands
    /// (`kernels/flash_attention.cuh`), bf16 products on bf16 ones (`kernels/flash_bf16.cuh`).
    Flash,
    /// Under bf16, the mma.sync kernels everywhere, where `Flash` takes Hopper's
    /// warpgroup-product kernels (`kernels/flash_wgmma.cuh`) at head size 64, for comparison.
    FlashMma,
    /// Under bf16, the TF32 flash kernels on bf16 operands (the first bf16 version), kept
    /// for comparison; the same as `Flash` in fp32 and tf32.
    FlashTf32,
    /// Batched cuBLAS GEMMs around a softmax kernel: saves the (B,NH,T,T) probabilities.
    Gemm,
}

impl AttentionPath {
    /// From the environment variable `GPT2_CUDA_ATTENTION` (`flash`, the default,
    /// `flash-mma`, `flash-tf32` or `gemm`).
    fn from_env() -> Result<Self> {
        match std::env::var("GPT2_CUDA_ATTENTION").as_deref() {
            Err(_) | Ok("") | Ok("flash") => Ok(AttentionPath::Flash),
            Ok("flash-mma") => Ok(AttentionPath::FlashMma),
            Ok("flash-tf32") => Ok(AttentionPath::FlashTf32),
            Ok("gemm") => Ok(AttentionPath::Gemm),
            Ok(other) => Err(Error::Input(format!(
                "GPT2_CUDA_ATTENTION={other}: expected `flash`, `flash-mma`, `flash-tf32` or `gemm`"
            ))),
        }
    }
}

/// How the MLP's GELU runs. Both are kept so that they can be compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GeluPath {
    /// In the epilogues of the MLP's products (cuBLASLt): the first product writes the
    /// pre-activation and its GELU, the backward product into the hidden layer applies gelu'.
    /// Where an epilogue cannot run (no cuBLASLt, alignment, no algorithm), as `Unfused`.
    Fused,
    /// The GELU kernels beside the products: forward `gelu_forward`, backward the product
    /// then `gelu_backward_in_place`.
    Unfused,
}

impl GeluPath {
    /// From the environment variable `GPT2_CUDA_GELU` (`fused` or `unfused`); unset, fused in
    /// bf16 and unfused in fp32 and tf32. Measured on an H100 (27d03bb, GPT-2 124M B=16
    /// T=1024): bf16 39.8 -> 38.8 ms a step fused, but tf32 83.1 -> 86.4 ms: cuBLASLt's f32
    /// GELU epilogue kernels are slower than its plain products plus our GELU kernels.
    fn from_env(precision: Precision) -> Result<Self> {
        let fused = match std::env::var("GPT2_CUDA_GELU").as_deref() {
            Err(_) | Ok("") => precision == Precision::Bf16,
            _ => fused_from_env("GPT2_CUDA_GELU")?,
        };
        Ok(if fused { GeluPath::Fused } else { GeluPath::Unfused })
    }
}

/// How the residual add and the layernorm after it run (`Backend::add_layernorm_forward` and
/// `_backward`). Both are kept so that they can be compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResidualPath {
    /// One kernel writes the sum and its layernorm (where rows allow 4-element accesses, else
    /// as `Unfused`); in backward the layernorm's dinp kernel also writes the add's second
    /// input gradient.
    Fused,
    /// `add` then `layernorm_forward`; in backward `layernorm_backward`, then a zero fill and
    /// `accumulate_act` for the second input (the kernels of the separate ops).
    Unfused,
}

impl ResidualPath {
    /// From the environment variable `GPT2_CUDA_RESIDUAL` (`fused`, the default, or `unfused`).
    fn from_env() -> Result<Self> {
        Ok(if fused_from_env("GPT2_CUDA_RESIDUAL")? {
            ResidualPath::Fused
        } else {
            ResidualPath::Unfused
        })
    }
}

/// An ablation switch: environment variable `var` is `fused` (true; also when unset or empty)
/// or `unfused` (false).
fn fused_from_env(var: &str) -> Result<bool> {
    switch_from_env(var, true)
}

/// An ablation switch: environment variable `var` is `fused` (true) or `unfused` (false);
/// `default` when unset or empty.
fn switch_from_env(var: &str, default: bool) -> Result<bool> {
    match std::env::var(var).as_deref() {
        Err(_) | Ok("") => Ok(default),
        Ok("fused") => Ok(true),
        Ok("unfused") => Ok(false),
        Ok(other) => Err(Error::Input(format!("{var}={other}: expected `fused` or `unfused`"))),
    }
}

/// Which products of the MLP's fused step (`matmul_backward_relu`, `linear_sgd`) run in the
/// tiled kernels of `kernels/mlp.cu`, with their epilogue (the ReLU mask, the SGD update) fused,
/// and which in cuBLAS followed by a kernel for the epilogue. Both are kept so that they can be
/// compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpTiles {
    /// The tiled kernels where the product is small (at most 2^24 multiply-adds) or its
    /// reduction short (k ≤ 64: a weight gradient at a small batch); cuBLAS elsewhere.
    Auto,
    /// The tiled kernels at every shape.
    Always,
    /// cuBLAS at every shape.
    Never,
}

impl MlpTiles {
    /// From the environment variable `GPT2_CUDA_MLP_TILES` (`auto`, the default, `always` or
    /// `never`).
    fn from_env() -> Result<Self> {
        match std::env::var("GPT2_CUDA_MLP_TILES").as_deref() {
            Err(_) | Ok("") | Ok("auto") => Ok(MlpTiles::Auto),
            Ok("always") => Ok(MlpTiles::Always),
            Ok("never") => Ok(MlpTiles::Never),
            Ok(other) => Err(Error::Input(format!(
                "GPT2_CUDA_MLP_TILES={other}: expected `auto`, `always` or `never`"
            ))),
        }
    }

    /// Whether a product of (m, n, k) runs tiled.
    fn tiled(self, m: usize, n: usize, k: usize) -> bool {
        match self {
            MlpTiles::Always => true,
            MlpTiles::Never => false,
            MlpTiles::Auto => k <= 64 || m.saturating_mul(n).saturating_mul(k) <= 1 << 24,
        }
    }
}

/// How `matmul_backward` computes the bias gradient. Both are kept so that they can be compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BiasGradPath {
    /// In the weight gradient's product (cuBLASLt's BGRADB epilogue, reading dout once; opt-in
    /// with `GPT2_CUDA_BGRAD=fused`: on an H100 in bf16 it measured 0.14 ms a step slower than
    /// `Unfused`, the algorithms without split-K being slower products, and some shapes have
    /// none; see NOTES.md 14): the
    /// epilogue overwrites a small f32 scratch vector, which `accumulate_kernel` adds into
    /// dbias (gradients accumulate over micro-batches). Where the epilogue cannot run (no
    /// cuBLASLt, alignment, no algorithm without split-K), as `Unfused`.
    Fused,
    /// cuBLAS's product, then the two-pass column sums of dout (`bias_backward_vec4_kernel`,
    /// `column_sums_finish_kernel`): the default.
    Unfused,
}

impl BiasGradPath {
    /// From the environment variable `GPT2_CUDA_BGRAD` (`unfused`, the default, or `fused`).
    fn from_env() -> Result<Self> {
        match std::env::var("GPT2_CUDA_BGRAD").as_deref() {
            Ok("fused") => Ok(BiasGradPath::Fused),
            Err(_) | Ok("") | Ok("unfused") => Ok(BiasGradPath::Unfused),
            Ok(other) => Err(Error::Input(format!(
                "GPT2_CUDA_BGRAD={other}: expected `fused` or `unfused`"
            ))),
        }
    }
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
        let gelu = GeluPath::from_env(precision)?;
        let bias_grad = BiasGradPath::from_env()?;
        let residual = ResidualPath::from_env()?;
        let relu_epilogue = fused_from_env("GPT2_CUDA_RELU")?;
        let mlp_tiles = MlpTiles::from_env()?;
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
        let lt = match std::env::var("GPT2_CUDA_BIAS_EPILOGUE").as_deref() {
            Ok("0") => None,
            _ => LtMatmul::new(precision, blas_workspace.ptr(), BLAS_WORKSPACE_BYTES)?,
        };
        let reduce_partials = memory.alloc(MAX_REDUCE_BLOCKS)?;
        Ok(CudaBackend {
            kernels,
            blas,
            lt,
            blas_workspace,
            tickets,
            reduce_partials,
            scratch: Mutex::new(None),
            scratch_epoch: Default::default(),
            error: Mutex::new(None),
            memory,
            snapshots: Default::default(),
            name: format!("{gpu} ({arch}, {})", precision.name()),
            precision,
            attention,
            wgmma: arch == "sm_90a",
            hopper_backward: HopperBackward::from_env()?,
            gelu,
            bias_grad,
            residual,
            fused_loss: fused_from_env("GPT2_CUDA_LOSS")?,
            one_pass_layernorm: fused_from_env("GPT2_CUDA_LN_BWD")?,
            layernorm_bias_sums: fused_from_env("GPT2_CUDA_LN_BIAS")?,
            attention_bias_sums: fused_from_env("GPT2_CUDA_ATTN_BIAS")?,
            dgelu_bias_sums: switch_from_env("GPT2_CUDA_DGELU_BIAS", false)?,
            chunked_wte: fused_from_env("GPT2_CUDA_WTE_BWD")?,
            overwrite_dgrad: fused_from_env("GPT2_CUDA_DGRAD")?,
            relu_epilogue,
            mlp_tiles,
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

    /// The same backend with the matmul bias as a separate pass (for timing comparisons);
    /// without cuBLASLt the GELU and bias-gradient epilogues go too.
    pub fn without_bias_epilogue(mut self) -> Self {
        self.lt = None;
        self
    }

    /// The same backend with the MLP's GELU on `path` (tests compare the two).
    pub fn with_gelu(mut self, path: GeluPath) -> Self {
        self.gelu = path;
        self
    }

    /// The same backend with the bias gradient on `path` (tests compare the two).
    pub fn with_bias_grad(mut self, path: BiasGradPath) -> Self {
        self.bias_grad = path;
        self
    }

    pub fn bias_grad_path(&self) -> BiasGradPath {
        self.bias_grad
    }

    /// The same backend with the residual add and layernorm on `path` (tests compare the two).
    pub fn with_residual(mut self, path: ResidualPath) -> Self {
        self.residual = path;
        self
    }

    pub fn residual_path(&self) -> ResidualPath {
        self.residual
    }

    /// The same backend with bias gradients summed in the layernorm backward's pass (`true`)
    /// or by the column-sum kernels after it (tests compare the two).
    pub fn with_layernorm_bias_sums(mut self, fused: bool) -> Self {
        self.layernorm_bias_sums = fused;
        self
    }

    /// The same backend with the qkv bias gradient summed in the attention backward's kernels
    /// (`true`) or by the column-sum kernels after them (tests compare the two).
    pub fn with_attention_bias_sums(mut self, fused: bool) -> Self {
        self.attention_bias_sums = fused;
        self
    }

    /// The same backend with the MLP's hidden bias gradient summed in the DGELU product's
    /// epilogue (`true`) or by the column-sum kernels after it (tests compare the two).
    pub fn with_dgelu_bias_sums(mut self, fused: bool) -> Self {
        self.dgelu_bias_sums = fused;
        self
    }

    /// The same backend with the MLP's ReLU in its products' epilogues (`true`) or in its own
    /// kernel (tests compare the two).
    pub fn with_relu_epilogue(mut self, fused: bool) -> Self {
        self.relu_epilogue = fused;
        self
    }

    /// The same backend with the MLP's fused step products on `tiles` (tests compare them).
    pub fn with_mlp_tiles(mut self, tiles: MlpTiles) -> Self {
        self.mlp_tiles = tiles;
        self
    }

    /// The same backend with another Hopper flash backward (tests compare them).
    pub fn with_hopper_backward(mut self, backward: HopperBackward) -> Self {
        self.hopper_backward = backward;
        self
    }

    /// Whether the kernels were built for sm_90a, where the experimental warpgroup-product flash
    /// kernels exist.
    pub fn has_wgmma(&self) -> bool {
        self.wgmma
    }

    pub fn attention_path(&self) -> AttentionPath {
        self.attention
    }

    pub fn gelu_path(&self) -> GeluPath {
        self.gelu
    }

    /// The cuBLASLt epilogue plans made so far (`Bias`, `GeluAux { bias }`, `DGelu`,
    /// `BGradB`), each with its (m, n, k) and whether cuBLASLt had an algorithm for it (where
    /// it had none, or the operands did not fit, the product ran unfused): what tests and
    /// benchmarks check the fused path by.
    pub fn epilogue_plans(&self) -> Vec<(String, [usize; 3], bool)> {
        self.lt.as_ref().map(|lt| lt.plans()).unwrap_or_default()
    }

    /// One line per epilogue plan with an algorithm: the algorithm's id, tile, split-K and
    /// reduction scheme (and, for the bias gradient, the heuristic's first pick where it was
    /// passed over for splitting k), for test logs and the notes.
    pub fn epilogue_algorithms(&self) -> Vec<String> {
        self.lt.as_ref().map(|lt| lt.algorithms()).unwrap_or_default()
    }

    /// cuBLASLt, when the MLP's GELU goes into its epilogues.
    fn gelu_epilogues(&self) -> Option<&LtMatmul> {
        self.lt.as_ref().filter(|_| self.gelu == GeluPath::Fused)
    }

    /// cuBLASLt, when the bias gradient goes into the weight gradient's epilogue.
    fn bias_grad_epilogue(&self) -> Option<&LtMatmul> {
        self.lt.as_ref().filter(|_| self.bias_grad == BiasGradPath::Fused)
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
