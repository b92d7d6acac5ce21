//! The hardware boundary. Everything above this module (tensors, autograd, the model,
//! the optimiser, the training loop) is written once against the [`Backend`] trait; the
//! CPU backend (rayon + `gemm`) and the CUDA backend (cudarc) are its two implementations.
//!
//! Memory model, llm.c style: a backend hands out typed buffers ([`DeviceBuffer`]: an
//! element type and a length) and every op takes [`Span`]s of them plus its dimensions.
//! Activations, their gradients and the weights the forward pass reads have the backend's
//! activation type ([`Span<Act>`], [`ActType`]: f32, or bf16 under [`Precision::Bf16`]);
//! parameter gradients, optimiser state, losses and layer statistics are always f32; token
//! ids are i32. Backward ops always ACCUMULATE (`+=`) into their gradient outputs; callers
//! zero gradients first.
//!
//! # Operands and safety
//!
//! A span is memory that stays alive while the span does ([`span`]). Each op's `# Operands`
//! section gives the elements it reads or writes of each span; the op checks them, and
//! that nothing it writes overlaps another operand, before it runs ([`Operands`], in
//! [`contract`], one function per op that both backends call): a span too short or a
//! written overlap is a panic naming the op, a caller's bug. So most ops are safe. The
//! `unsafe` ones are those whose contract is about values no shape can check: ids that
//! index a table (the embedding, the loss's targets, the MLP's gathered images), a
//! position read on the device, and the raw copies ([`Backend::upload`],
//! [`Backend::download`]) that the bounds-checked [`Backend::write`] and [`Backend::read`]
//! wrap. Nothing else may read or write an op's memory during the call.

pub mod contract;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fused_mlp;
pub mod replay;
pub mod span;

pub use fused_mlp::FusedMlp;
pub use span::{ActElem, Operands, Span};

/// Values one tensor may hold at most (exclusive): the kernels index with 32-bit integers.
pub const MAX_TENSOR_VALUES: usize = 1 << 31;

use crate::error::{Error, Result};
use std::marker::PhantomData;
use std::ops::Range;

/// An element type that backend memory holds: plain bits, no drop.
pub trait Elem: bytemuck::Pod + Send + Sync + 'static {}
impl Elem for f32 {}
impl Elem for i32 {}
impl Elem for bf16 {}
/// Raw bytes: the MLP's images and labels, kept on the device as their idx files hold them.
impl Elem for u8 {}

pub use half::bf16;

/// Marker for "an element of the backend's activation type" ([`Backend::act`]): a
/// `DevPtr<Act>` addresses f32 or bf16 values, which only the backend knows, so it has no
/// [`DevPtr::add`]; [`DevPtr::offset`] takes the type.
pub enum Act {}

/// What activations are stored as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActType {
    F32,
    Bf16,
}

impl ActType {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            ActType::F32 => 4,
            ActType::Bf16 => 2,
        }
    }

    /// 4-byte words that hold `n` elements (pooled memory is counted in words).
    pub fn words(self, n: usize) -> usize {
        (n * self.bytes()).div_ceil(4)
    }
}

/// A backend's queue of device work (a `CUstream` on the GPU), as an opaque handle: what a
/// device communicator orders its collectives against ([`crate::comm::Comm`]'s `start_*`
/// and `finish_all_reduces`), so that no host waits are needed between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceStream(u64);

impl DeviceStream {
    pub const fn from_raw(handle: u64) -> Self {
        DeviceStream(handle)
    }

    pub fn raw(self) -> u64 {
        self.0
    }
}

/// A copy of device buffers made on the device ([`Backend::snapshot`]), which a thread of
/// its own brings into host memory while the backend's work goes on.
pub trait Snapshot: Send {
    /// Bytes of device memory it is kept in (as many again of host memory once read).
    fn bytes(&self) -> u64;
    /// Waits for the copy on the device, brings it into host memory and calls `use_parts`
    /// with the parts, in the order given to [`Backend::snapshot`]: `use_parts`' error, or
    /// how long the copies took.
    fn read(self: Box<Self>, use_parts: &mut dyn FnMut(&[&[f32]]) -> Result<()>) -> Result<SnapshotTimes>;
}

/// How long a [`Snapshot`]'s copies took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SnapshotTimes {
    /// The copy within the device, which the work queued after it waited for.
    pub device_s: f64,
    /// Bringing it into host memory, on the reader's thread (the first time, with making
    /// that memory).
    pub to_host_s: f64,
    /// Whether that host memory is pinned (page-locked: copied into at the bus's speed).
    pub pinned: bool,
}

/// Address of an element of type `T` in a backend's memory (a host address on the CPU, a
/// `CUdeviceptr` on the GPU). Making or moving one is safe; reading or writing through it
/// is what the `unsafe` ops do.
pub struct DevPtr<T = f32> {
    addr: u64,
    elem: PhantomData<fn() -> T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}
impl<T> PartialEq for DevPtr<T> {
    fn eq(&self, other: &Self) -> bool {
        self.addr == other.addr
    }
}
impl<T> Eq for DevPtr<T> {}
impl<T> Default for DevPtr<T> {
    fn default() -> Self {
        DevPtr::from_addr(0)
    }
}
impl<T> std::fmt::Debug for DevPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevPtr({:#x})", self.addr)
    }
}

impl<T> DevPtr<T> {
    pub const fn from_addr(addr: u64) -> Self {
        DevPtr {
            addr,
            elem: PhantomData,
        }
    }

    pub fn addr(self) -> u64 {
        self.addr
    }

    /// The same address, read as another element type.
    pub fn cast<U>(self) -> DevPtr<U> {
        DevPtr::from_addr(self.addr)
    }
}

impl<T: Elem> DevPtr<T> {
    /// The pointer `n` elements further on.
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, n: usize) -> Self {
        DevPtr::from_addr(self.addr + (n * std::mem::size_of::<T>()) as u64)
    }
}

impl DevPtr<Act> {
    /// The pointer `n` activations of type `act` further on.
    pub fn offset(self, n: usize, act: ActType) -> Self {
        DevPtr::from_addr(self.addr + (n * act.bytes()) as u64)
    }
}

/// An owned allocation of `len()` elements of `T`; freed on drop.
pub trait DeviceBuffer<T: Elem> {
    fn ptr(&self) -> DevPtr<T>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The whole buffer, as an op's operand.
    fn span(&self) -> Span<'_, T> {
        Span::of(self)
    }
}

/// The positions of `tokens` sorted by token, stably (equal tokens keep their order): the
/// order in which `encoder_backward` sums each token's gradient rows.
pub fn token_order(tokens: &[i32]) -> Vec<i32> {
    let mut order: Vec<i32> = (0..tokens.len() as i32).collect();
    order.sort_by_key(|&i| tokens[i as usize]);
    order
}

/// `at..at + n` must lie inside a buffer of `len` elements.
pub fn check_range(what: &str, len: usize, at: usize, n: usize) -> Result<()> {
    match at.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(Error::Device(format!(
            "{what}: elements {at}..{} are outside a buffer of {len}",
            at.saturating_add(n)
        ))),
    }
}

/// Rounds the first `n` master weights in `params` into their bf16 `copy` (when there is
/// one: a bf16 backend's forward pass reads it), after they changed other than by an
/// optimiser's update (initialised, loaded, averaged).
pub fn refresh_bf16_copy<B: Backend>(
    be: &B,
    params: &B::Buffer<f32>,
    copy: Option<&B::Buffer<bf16>>,
    n: usize,
) -> Result<()> {
    if let Some(copy) = copy {
        check_range("bf16 copy", copy.len(), 0, n)?;
        check_range("parameters", params.len(), 0, n)?;
        be.round_to_bf16(copy.span(), params.span(), n);
    }
    Ok(())
}

/// Which of a product's gradients its backward WRITES rather than adds to
/// (`Backend::matmul_backward`): those it writes first in a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overwrite {
    /// The input's gradient (the activation-typed dinp).
    pub dinp: bool,
    /// The weight's gradient (the f32 dw).
    pub dw: bool,
}

impl Overwrite {
    /// Both gradients added to (`+=`), the backward of a product on its own.
    pub const ACCUMULATE: Overwrite = Overwrite { dinp: false, dw: false };
}

/// Arithmetic precision of a backend (the CPU backend is always fp32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Strict IEEE fp32 everywhere.
    Fp32,
    /// fp32 storage, TF32 tensor-core matrix products.
    Tf32,
    /// Mixed precision: bf16 activations, activation gradients and weight copy, fp32
    /// accumulation in every product and reduction; fp32 master weights, parameter
    /// gradients and AdamW moments; layernorm statistics, softmax and the loss in fp32.
    Bf16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    /// How activations are stored at this precision.
    pub fn act(self) -> ActType {
        match self {
            Precision::Fp32 | Precision::Tf32 => ActType::F32,
            Precision::Bf16 => ActType::Bf16,
        }
    }
}

/// The two 8-bit float formats of the tensor cores from Ada and Hopper on (OCP's FP8):
/// E4M3 (3 mantissa bits, finite up to 448) for weights and activations, E5M2 (2 bits, up to
/// 57,344) for gradients. Stored as their bits, one `u8` a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8 {
    E4M3,
    E5M2,
}

impl Fp8 {
    /// The largest finite value.
    pub fn max(self) -> f32 {
        match self {
            Fp8::E4M3 => 448.0,
            Fp8::E5M2 => 57_344.0,
        }
    }

    /// `x` in this format, rounded to nearest even and saturated to ±[`Fp8::max`] (NaN stays
    /// NaN): the GPU's conversion (`cvt.rn.satfinite`), bit for bit.
    pub fn encode(self, x: f32) -> u8 {
        match self {
            Fp8::E4M3 => float8::F8E4M3::from_f32(x).to_bits(),
            Fp8::E5M2 => float8::F8E5M2::from_f32(x).to_bits(),
        }
    }

    /// The value `bits` holds (exact in f32).
    pub fn decode(self, bits: u8) -> f32 {
        match self {
            Fp8::E4M3 => float8::F8E4M3::from_bits(bits).to_f32(),
            Fp8::E5M2 => float8::F8E5M2::from_bits(bits).to_f32(),
        }
    }
}

/// One FP8 tensor's scale slot, `Fp8Slot::WORDS` f32 words at a 16-byte aligned address (what
/// cuBLASLt asks of a scale): `[dequant, scale, amax, max]`. `scale` multiplies the values
/// before they are rounded to FP8 ([`Backend::quantize_fp8`]), `dequant` = 1/scale scales the
/// product back ([`Backend::matmul_fp8`]), `amax` collects the largest magnitude the tensor
/// had since the last [`Backend::fp8_rescale`], and `max` is its format's [`Fp8::max`].
pub struct Fp8Slot;

impl Fp8Slot {
    pub const DEQUANT: usize = 0;
    pub const SCALE: usize = 1;
    pub const AMAX: usize = 2;
    pub const MAX: usize = 3;
    /// A slot's words.
    pub const WORDS: usize = 4;

    /// A fresh slot: scale 1, no amax yet.
    pub fn fresh(format: Fp8) -> [f32; 4] {
        [1.0, 1.0, 0.0, format.max()]
    }
}

/// An FP8 copy that an op writes of its output, for an FP8 product to read: `dst` the output's
/// values (as stored) times `scale[0]` in `format`, their largest magnitude recorded in `amax`,
/// as [`Backend::quantize_fp8`] would from the output.
#[derive(Clone, Copy, Debug)]
pub struct Fp8Out<'a> {
    pub dst: Span<'a, u8>,
    pub amax: Span<'a>,
    pub scale: Span<'a>,
    pub format: Fp8,
}

/// [`Backend::matmul_fp8_gelu`] as separate ops: the product into `pre`, GELU into `scratch`,
/// then its quantization into `out` (the default, and a backend's fallback where its fused form
/// cannot run).
#[allow(clippy::too_many_arguments)]
pub fn matmul_fp8_gelu_apart<B: Backend + ?Sized>(
    be: &B,
    pre: Span<Act>,
    scratch: Span<Act>,
    out: Fp8Out,
    x: Span<u8>,
    y: Span<u8>,
    bias: Option<Span<Act>>,
    dequant: [Span; 2],
    shape: [usize; 3],
) {
    let n = shape[0] * shape[1];
    be.matmul_fp8(pre, x, y, bias, dequant, shape, [Fp8::E4M3; 2]);
    be.gelu_forward(scratch, pre, n);
    be.quantize_fp8(out.dst, out.amax, scratch, out.scale, n, out.format);
}

/// [`Backend::gelu_backward_fp8`] as separate ops (the default, and a backend's fallback
/// where its one pass cannot run): d(pre) computed in place in `d`, its copies and bias sums
/// taken from there, then gelu(pre) written over it for the activation's copy.
#[allow(clippy::too_many_arguments)]
pub fn gelu_backward_fp8_apart<B: Backend + ?Sized>(
    be: &B,
    d: Span<Act>,
    inp: Span<Act>,
    [plain, act_t]: [Fp8Out; 2],
    transposed: Span<u8>,
    dbias: Option<Span>,
    [rows, cols]: [usize; 2],
) {
    let n = rows * cols;
    be.gelu_backward_in_place(d, inp, n);
    let q = plain;
    be.quantize_fp8_both([q.dst, transposed], q.amax, d, q.scale, [rows, cols], q.format);
    if let Some(dbias) = dbias {
        be.bias_backward(dbias, d, rows, cols);
    }
    be.gelu_forward(d, inp, n);
    let a = act_t;
    be.quantize_fp8_transposed(a.dst, a.amax, d, a.scale, [rows, cols], a.format);
}

/// Delayed scaling, on one slot ([`Fp8Slot`]) and its amax history (newest first): a finite
/// `amax` is pushed onto the history (the oldest falls off; a non-finite one, from a step the
/// optimiser skips, is not), `amax` is cleared, and where the history's largest value `m` is
/// above 0 the scale becomes the power of two 2^e with e = ⌊log₂(max / m)⌋ (clamped to ±126),
/// so that m · scale lands in [max/2, max] and `dequant` = 2^-e is exact. The GPU's kernel
/// (`fp8_rescale_kernel`) computes the same bits.
pub fn fp8_rescale_slot(slot: &mut [f32], history: &mut [f32]) {
    let amax = slot[Fp8Slot::AMAX];
    if amax.is_finite() && !history.is_empty() {
        history.rotate_right(1);
        history[0] = amax;
    }
    slot[Fp8Slot::AMAX] = 0.0;
    let top = history.iter().fold(0.0f32, |m, &h| m.max(h));
    if top > 0.0 {
        let ratio = slot[Fp8Slot::MAX] / top;
        let e = (((ratio.to_bits() >> 23) & 0xff) as i32 - 127).clamp(-126, 126);
        slot[Fp8Slot::SCALE] = f32::from_bits(((e + 127) as u32) << 23);
        slot[Fp8Slot::DEQUANT] = f32::from_bits(((127 - e) as u32) << 23);
    }
}

/// Hyper-parameters of AdamW that stay fixed over a run (decoupled weight decay, as in
/// Loshchilov & Hutter); what changes per step is in [`StepState`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWHyper {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

/// The optimiser's per-step scalars, kept where the parameters are (`#[repr(C)]` f32 words:
/// `StepState` in kernels/adamw.cu has the same layout). The host writes the step's schedule
/// (`lr`, the bias corrections, `step`) before the step; the device finishes the rest
/// ([`Backend::step_stats`]), and [`Backend::adamw`] reads it: a step needs no host round trip,
/// so it can be recorded once and replayed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StepState {
    /// Σg² over the gradients (summed into by [`Backend::sum_squares`]).
    pub sumsq: f32,
    /// √sumsq.
    pub norm: f32,
    /// The factor that clips the norm to `max_norm` (1 when under it).
    pub clip: f32,
    /// The loss: the micro-batches' sum, then (by `step_stats`) their mean.
    pub loss: f32,
    pub lr: f32,
    /// 1 - beta1^t and 1 - beta2^t for the 1-based step t.
    pub bias1: f32,
    pub bias2: f32,
    /// The 0-based step (its slot in the history).
    pub step: u32,
    /// 1: apply the update; 0: skip it (a non-finite loss or norm).
    pub apply: f32,
}

impl StepState {
    /// Words of f32 it takes.
    pub const WORDS: usize = std::mem::size_of::<StepState>() / 4;
    /// Word offsets of the fields the host (or a sum over ranks) reads or writes.
    pub const SUMSQ: usize = 0;
    pub const NORM: usize = 1;
    pub const LOSS: usize = 3;
    pub const SCHEDULE: usize = 4;
    pub const APPLY: usize = 8;

    /// The words `lr, bias1, bias2, step` the host writes at [`StepState::SCHEDULE`] before
    /// 0-based step `step`: bias corrections in f64 (1 - beta^t loses digits in f32 for small t).
    pub fn schedule(lr: f32, beta1: f32, beta2: f32, step: u64) -> [f32; 4] {
        let t = (step + 1).min(i32::MAX as u64) as i32;
        let bias = |beta: f32| (1.0 - (beta as f64).powi(t)) as f32;
        [lr, bias(beta1), bias(beta2), f32::from_bits(step as u32)]
    }
}

/// Hyper-parameters of SGD with momentum that stay fixed over a run (PyTorch's form, no
/// dampening); the learning rate is the step's, in [`StepState`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdHyper {
    pub momentum: f32,
    /// L2 penalty added to the gradient (coupled, as PyTorch's SGD has it).
    pub weight_decay: f32,
}

/// Dimensions shared by most ops: `bt` rows (batch × time) of width `c`.
/// Naming follows llm.c: B batch, T time, C channels, OC output channels, NH heads,
/// V vocabulary, Vp padded vocabulary. `DevPtr<Act>` operands hold [`Backend::act`]
/// elements; plain `DevPtr` operands hold f32.
pub trait Backend {
    type Buffer<T: Elem>: DeviceBuffer<T>;

    /// Short human name, e.g. "cpu (2 threads)" or "NVIDIA H100 80GB HBM3".
    fn name(&self) -> String;

    /// The element type of activations, their gradients and the weights the forward pass
    /// reads (f32 unless the backend computes in bf16).
    fn act(&self) -> ActType {
        self.precision().act()
    }

    /// What the backend computes in (the CPU: fp32).
    fn precision(&self) -> Precision {
        Precision::Fp32
    }

    // ---- memory: the safe, bounds-checked entry points --------------------------------
    /// A zero-filled buffer of `n` elements.
    fn alloc<T: Elem>(&self, n: usize) -> Result<Self::Buffer<T>>;

    /// As [`Backend::alloc`], in memory the other GPUs of this host can map where the backend
    /// was given a way to allocate it (stage 3: the weights' bf16 copy, which ZeRO-1 gathers
    /// into, so NCCL fills it with copy engines rather than thread blocks).
    fn alloc_shared<T: Elem>(&self, n: usize) -> Result<Self::Buffer<T>> {
        self.alloc(n)
    }

    /// Copies `src` into `dst[at..at + src.len()]`.
    fn write<T: Elem>(&self, dst: &Self::Buffer<T>, at: usize, src: &[T]) -> Result<()> {
        check_range("write", dst.len(), at, src.len())?;
        // SAFETY: the range was checked against the live buffer `dst`.
        unsafe { self.upload(dst.ptr().add(at), src) }
    }

    /// Copies `src[at..at + dst.len()]` into `dst`.
    fn read<T: Elem>(&self, src: &Self::Buffer<T>, at: usize, dst: &mut [T]) -> Result<()> {
        check_range("read", src.len(), at, dst.len())?;
        // SAFETY: the range was checked against the live buffer `src`.
        unsafe { self.download(src.ptr().add(at), dst) }
    }

    /// Sets every element of `buf` to 0.
    fn zero_buffer<T: Elem>(&self, buf: &Self::Buffer<T>) {
        self.zero(buf.span(), buf.len())
    }

    /// Wait until all queued work is done (a no-op on the CPU).
    fn synchronize(&self) -> Result<()>;
    /// Starts (`true`) or stops the range of work a profiler that waits for one records (CUDA:
    /// cuProfilerStart/Stop, for `ncu --profile-from-start off`); `bench` marks its measured
    /// steps with it. A no-op elsewhere.
    fn profile_range(&self, _on: bool) -> Result<()> {
        Ok(())
    }
    /// The stream all this backend's work is queued on, for a device communicator to order
    /// collectives against; `None` where work runs as it is queued (the CPU).
    fn device_stream(&self) -> Option<DeviceStream> {
        None
    }
    /// Calls `ops(self, plan)` from where this backend's ops are cheapest to issue: by default
    /// right here. The CPU backend calls it on one of its worker threads, so that each op's
    /// parallel loops start there instead of being handed to the workers and waited for, op
    /// by op (a short chain of small ops, such as the MLP's step, otherwise spends more time
    /// waking threads than computing). `plan` holds what the ops need as plain data (addresses
    /// and sizes, no buffers), which is why it may cross threads.
    /// # Safety
    /// What `ops` requires of `plan`.
    unsafe fn issue<P: Sync>(&self, plan: &P, ops: unsafe fn(&Self, &P) -> Result<()>) -> Result<()> {
        ops(self, plan)
    }

    // ---- snapshots: device memory brought to the host while work goes on --------------
    /// Queues, after the work queued so far, a copy of `parts` (whole buffers, one after the
    /// other) into device memory of the backend's own, and returns it for another thread to
    /// bring into host memory ([`Snapshot::read`]) while work goes on: a checkpoint's state,
    /// for which training then waits only as long as a copy within the device takes. That
    /// memory is made at the first call (device memory as large as the parts, then as much
    /// host memory at the first read) and kept for the next, which must come after the last
    /// one was read; [`Backend::release_snapshots`] frees it. `None` where the backend has no
    /// such copy (the CPU: its memory is the host's) or cannot have the memory for one:
    /// callers then read the buffers themselves.
    fn snapshot(&self, parts: &[&Self::Buffer<f32>]) -> Result<Option<Box<dyn Snapshot>>> {
        let _ = parts;
        Ok(None)
    }
    /// Whether this backend takes snapshots ([`Backend::snapshot`]; it may still be refused
    /// the memory for one).
    fn takes_snapshots(&self) -> bool {
        false
    }
    /// Makes ready the host memory that snapshots of buffers of `lens` elements will be read
    /// into, where the backend needs memory of its own for that (the GPU: pinned memory, which
    /// takes a while to make and is best made before the work starts). Where it cannot be
    /// had, the first read makes memory of its own.
    fn prepare_snapshots(&self, lens: &[usize]) {
        let _ = lens;
    }
    /// Frees what [`Backend::snapshot`] keeps, once the last snapshot has been read.
    fn release_snapshots(&self) {}

    // ---- recording: a step captured once and replayed (CUDA graphs) --------------------
    /// Queued work recorded by [`Backend::begin_recording`]; `()` where there is none.
    type Recording;
    /// Whether this backend records work ([`Backend::begin_recording`]); the CPU does not: its
    /// work runs as it is queued.
    fn records(&self) -> bool {
        false
    }
    /// From now until [`Backend::end_recording`], queued work is recorded instead of run; no
    /// memory may be allocated or freed, and nothing read back, in between.
    fn begin_recording(&self) -> Result<()> {
        Err(Error::Device(format!("{} does not record work", self.name())))
    }
    /// The work queued since [`Backend::begin_recording`], to be replayed by [`Backend::replay`].
    fn end_recording(&self) -> Result<Self::Recording>;
    /// Queues the recorded work again, on the same memory.
    fn replay(&self, recording: &Self::Recording) -> Result<()>;
    /// Changes whenever the backend frees memory of its own that a recording may use (its
    /// scratch grew): a recording made in another epoch must be made again.
    fn memory_epoch(&self) -> u64 {
        0
    }
    /// Highest memory in use so far, in bytes (device memory on a GPU, RSS on the CPU).
    fn peak_memory_bytes(&self) -> u64;
    /// All the memory this backend computes in, in bytes (the GPU's, or the host's RAM),
    /// when known: sizes above it are refused before anything is allocated.
    fn memory_capacity_bytes(&self) -> Option<u64>;

    // ---- memory: raw -------------------------------------------------------------------
    /// # Safety
    /// `dst` addresses `src.len()` elements of live memory of this backend.
    unsafe fn upload<T: Elem>(&self, dst: DevPtr<T>, src: &[T]) -> Result<()>;
    /// # Safety
    /// `src` addresses `dst.len()` elements of live memory of this backend.
    unsafe fn download<T: Elem>(&self, src: DevPtr<T>, dst: &mut [T]) -> Result<()>;
    /// Activations from f32 values, rounded to nearest-even when the type is bf16.
    /// # Operands
    /// `dst`: `src.len()` activations.
    fn upload_act(&self, dst: Span<Act>, src: &[f32]) -> Result<()> {
        let dst = Operands::new("upload_act", self.act()).write("dst", dst, src.len());
        // SAFETY: `dst` holds src.len() activations (checked).
        unsafe {
            match self.act() {
                ActType::F32 => self.upload(dst.cast::<f32>(), src),
                ActType::Bf16 => {
                    let host: Vec<bf16> = src.iter().map(|&x| bf16::from_f32(x)).collect();
                    self.upload(dst.cast::<bf16>(), &host)
                }
            }
        }
    }
    /// Activations as f32 values (exactly: every bf16 is an f32).
    /// # Operands
    /// `src`: `dst.len()` activations.
    fn download_act(&self, src: Span<Act>, dst: &mut [f32]) -> Result<()> {
        let src = Operands::new("download_act", self.act()).read("src", src, dst.len());
        // SAFETY: `src` holds dst.len() activations (checked).
        unsafe {
            match self.act() {
                ActType::F32 => self.download(src.cast::<f32>(), dst),
                ActType::Bf16 => {
                    let mut host = vec![bf16::ZERO; dst.len()];
                    self.download(src.cast::<bf16>(), &mut host)?;
                    for (d, h) in dst.iter_mut().zip(host) {
                        *d = h.to_f32();
                    }
                    Ok(())
                }
            }
        }
    }
    /// # Operands
    /// `dst`: `n` elements.
    fn zero<T: Elem>(&self, dst: Span<T>, n: usize);
    /// # Operands
    /// `dst`: `n` activations.
    fn zero_act(&self, dst: Span<Act>, n: usize) {
        match self.act() {
            ActType::F32 => self.zero(dst.cast::<f32>(), n),
            ActType::Bf16 => self.zero(dst.cast::<bf16>(), n),
        }
    }
    /// `dst = bf16(src)`, rounded to nearest-even, over `n` values: the weight copy the
    /// forward pass reads under bf16, refreshed after the master weights change.
    /// # Operands
    /// `dst`, `src`: `n` elements each.
    fn round_to_bf16(&self, dst: Span<bf16>, src: Span, n: usize);
    /// `dst = f32(src)` over `n` values (exact): gradients summed in bf16 back into f32.
    /// # Operands
    /// `dst`, `src`: `n` elements each.
    fn widen_bf16(&self, dst: Span, src: Span<bf16>, n: usize);
    /// Whether this backend runs the FP8 ops ([`Backend::quantize_fp8`],
    /// [`Backend::matmul_fp8`]): the CPU in f32 (their reference), a GPU with FP8 tensor cores
    /// (compute capability 8.9 or newer) in bf16 with cuBLASLt.
    fn fp8(&self) -> bool;
    /// `dst = fp8(src · scale[0])` in `format` ([`Fp8::encode`]: rounded to nearest even,
    /// saturated to the format's largest finite value), and `amax[0] = max(amax[0], |src|)`
    /// over the `n` values, by their bits (NaN above every number), which is the same
    /// whatever the order of the comparisons. Needs [`Backend::fp8`].
    /// # Operands
    /// `dst`, `src`: `n` elements; `amax`, `scale`: 1.
    #[allow(clippy::too_many_arguments)]
    fn quantize_fp8(&self, dst: Span<u8>, amax: Span, src: Span<Act>, scale: Span, n: usize, format: Fp8);
    /// out (R,S) = (x (R,K) · yᵀ) · dequant\[0\] · dequant\[1\] + bias, row-major, where x and
    /// y are FP8 matrices of `formats` (not both E5M2) whose rows hold their K values, and the
    /// products are summed in f32: GPT-2's forward product with x the input and y the weight
    /// (OC,C) (`matmul_forward`'s shape), each scaled back by its quantization's reciprocal.
    /// Needs [`Backend::fp8`]; R, S and K multiples of 16.
    /// # Operands
    /// `out`: R·S; `x`: R·K; `y`: S·K; `bias`: S; each `dequant`: 1, at an address that is
    /// a multiple of 16 bytes (cuBLASLt refuses others).
    #[allow(clippy::too_many_arguments)]
    fn matmul_fp8(
        &self,
        out: Span<Act>,
        x: Span<u8>,
        y: Span<u8>,
        bias: Option<Span<Act>>,
        dequant: [Span; 2],
        shape: [usize; 3],
        formats: [Fp8; 2],
    );
    /// A weight gradient in FP8: dw (R,S) = (x (R,K) · yᵀ) · dequant\[0\] · dequant\[1\],
    /// summed and written in f32 (where `overwrite`, else added to dw), with x the output
    /// gradient's transposed copy (OC, BT) and y the input's (C, BT): rows holding a batch's K =
    /// BT values, the layout the FP8 products read, so that dw is the weight's (OC, C).
    /// Formats and rules as [`Backend::matmul_fp8`]'s. Needs [`Backend::fp8`].
    /// # Operands
    /// `dw`: R·S; `x`: R·K; `y`: S·K; each `dequant`: 1, 16-byte aligned.
    #[allow(clippy::too_many_arguments)]
    fn matmul_fp8_weight_grad(
        &self,
        overwrite: bool,
        dw: Span,
        x: Span<u8>,
        y: Span<u8>,
        dequant: [Span; 2],
        shape: [usize; 3],
        formats: [Fp8; 2],
    );
    /// [`Backend::matmul_fp8`] through GELU, the MLP's first product in FP8: `pre = x · yᵀ ·
    /// dequant + bias` written, and `gelu(pre)` only as its FP8 copy `out` (E4M3, the second
    /// product's input; the bf16 activation is not kept: the backward rebuilds it, see
    /// [`Backend::gelu_backward_fp8`]). By default the product, then GELU into `scratch`
    /// and its quantization; the CUDA backend fuses GELU and the quantization into the product's
    /// epilogue where cuBLASLt has one (GELU then taken of the product in f32, before `pre` is
    /// rounded), leaving `scratch` alone.
    /// # Operands
    /// As `matmul_fp8` (E4M3 both), with `pre`, `scratch`: R·S each, distinct; `out` as in
    /// `quantize_fp8` (R·S values).
    #[allow(clippy::too_many_arguments)]
    fn matmul_fp8_gelu(
        &self,
        pre: Span<Act>,
        scratch: Span<Act>,
        out: Fp8Out,
        x: Span<u8>,
        y: Span<u8>,
        bias: Option<Span<Act>>,
        dequant: [Span; 2],
        shape: [usize; 3],
    ) {
        matmul_fp8_gelu_apart(self, pre, scratch, out, x, y, bias, dequant, shape);
    }
    /// FP8's gelu', for the MLP whose weight gradients are FP8 products: from the output
    /// gradient d(act) in `d` and `inp` = pre, d(pre) = gelu'(pre) ⊙ d(act) (rounded to the
    /// activation type, as [`Backend::gelu_backward_in_place`] writes it) kept only as FP8: as
    /// stored in `plain` ([`Backend::quantize_fp8`], its amax recorded) and transposed (C,R) in
    /// `transposed` at the same scale, for the first product's input and weight gradients; act
    /// = gelu(pre) (rounded, as [`Backend::gelu_forward`] writes it) transposed in `act_t`
    /// ([`Backend::quantize_fp8_transposed`]), for the second's weight gradient; with `dbias`,
    /// d(pre)'s column sums added there ([`Backend::bias_backward`]: the first product's bias
    /// gradient). `d` is left unspecified. By default the separate ops
    /// ([`gelu_backward_fp8_apart`]); the CUDA backend runs them as one pass (the same bits).
    /// Needs [`Backend::fp8`].
    /// # Operands
    /// `d`, `inp`: R·C (`shape` = [R, C]); each copy R·C, apart; `dbias`: C; amaxes, scales: 1.
    #[allow(clippy::too_many_arguments)]
    fn gelu_backward_fp8(
        &self,
        d: Span<Act>,
        inp: Span<Act>,
        copies: [Fp8Out; 2],
        transposed: Span<u8>,
        dbias: Option<Span>,
        shape: [usize; 2],
    ) {
        gelu_backward_fp8_apart(self, d, inp, copies, transposed, dbias, shape);
    }
    /// [`Backend::quantize_fp8`] into the transpose: `dst (cols,rows) = fp8(src (rows,cols)ᵀ ·
    /// scale[0])`, with `amax` as there. A weight's FP8 copy for the input gradient's product
    /// (FP8 products read both operands with their K values contiguous). Needs [`Backend::fp8`].
    /// # Operands
    /// `dst`, `src`: rows·cols elements; `amax`, `scale`: 1.
    #[allow(clippy::too_many_arguments)]
    fn quantize_fp8_transposed(
        &self,
        dst: Span<u8>,
        amax: Span,
        src: Span<Act>,
        scale: Span,
        shape: [usize; 2],
        format: Fp8,
    );
    /// A weight's two FP8 copies at once: `plain` as [`Backend::quantize_fp8`] writes it and
    /// `transposed` as [`Backend::quantize_fp8_transposed`] does, the amax recorded once (the
    /// same values). By default the two ops; the CUDA backend reads the weight once for both.
    /// # Operands
    /// `plain`, `transposed`, `src`: rows·cols elements, distinct; `amax`, `scale`: 1.
    #[allow(clippy::too_many_arguments)]
    fn quantize_fp8_both(
        &self,
        [plain, transposed]: [Span<u8>; 2],
        amax: Span,
        src: Span<Act>,
        scale: Span,
        shape: [usize; 2],
        format: Fp8,
    ) {
        self.quantize_fp8(plain, amax, src, scale, shape[0] * shape[1], format);
        self.quantize_fp8_transposed(transposed, amax, src, scale, shape, format);
    }
    /// Delayed scaling's step over `n` FP8 scale slots ([`Fp8Slot`]: `Fp8Slot::WORDS` f32s each),
    /// each with a history of `len` amax values: [`fp8_rescale_slot`] on every slot.
    /// # Operands
    /// `slots`: n·Fp8Slot::WORDS; `history`: n·len.
    fn fp8_rescale(&self, slots: Span, history: Span, n: usize, len: usize);
    /// `dst += src`, elementwise over `n` f32 values.
    /// # Operands
    /// `dst`, `src`: `n` elements each; they may be the same pointer.
    fn accumulate(&self, dst: Span, src: Span, n: usize);
    /// `dst += src`, elementwise over `n` activations (a gradient reaching a value twice).
    /// # Operands
    /// `dst`, `src`: `n` activations each; they may be the same pointer.
    fn accumulate_act(&self, dst: Span<Act>, src: Span<Act>, n: usize);
    /// `out = a + b`, elementwise over `n` activations, in one pass.
    /// # Operands
    /// `out`, `a`, `b`: `n` activations each; `out` distinct from both.
    fn add(&self, out: Span<Act>, a: Span<Act>, b: Span<Act>, n: usize);
    /// `dst *= s`, elementwise over `n` f32 values.
    /// # Operands
    /// `dst`: `n` elements.
    fn scale(&self, dst: Span, n: usize, s: f32);

    // ---- layers: forward and backward ---------------------------------------------
    /// `out (B,T,C) = wte[tokens] + wpe[p + t]`; `tokens` is (B,T), and `p` is 0, or with
    /// `first_position` the position it holds (generation: read on the device, so that a
    /// recorded decode step replays at every position).
    /// # Operands
    /// `out`: B·T·C; `tokens`: B·T; `wte`: its rows·C; `wpe`: at least T·C;
    /// `first_position`: one value.
    /// # Safety
    /// Every id in `tokens` is a row of `wte`, and `wpe` holds (p + T)·C values for the
    /// position p that `first_position` holds.
    #[allow(clippy::too_many_arguments)]
    unsafe fn encoder_forward(
        &self,
        out: Span<Act>,
        tokens: Span<i32>,
        first_position: Option<Span<i32>>,
        wte: Span<Act>,
        wpe: Span<Act>,
        b: usize,
        t: usize,
        c: usize,
    );
    /// `order` is the positions 0..B·T sorted by their token (stably, see [`token_order`]):
    /// each token's rows of `dout` are summed in that fixed order, with no atomics.
    /// # Operands
    /// As `encoder_forward`, with `dwte`, `dwpe` and `dout` in place of `wte`, `wpe`, `out`;
    /// `order`: B·T.
    /// # Safety
    /// Every id in `tokens` is a row of `dwte`; `order` is a permutation of 0..B·T.
    #[allow(clippy::too_many_arguments)]
    unsafe fn encoder_backward(
        &self,
        dwte: Span,
        dwpe: Span,
        dout: Span<Act>,
        tokens: Span<i32>,
        order: Span<i32>,
        b: usize,
        t: usize,
        c: usize,
    );

    /// out (BT,OC) = inp (BT,C) · wᵀ + bias, with w (OC,C) as in PyTorch's Linear.
    /// # Operands
    /// `out`: BT·OC; `inp`: BT·C; `w`: OC·C; `bias`: OC.
    #[allow(clippy::too_many_arguments)]
    fn matmul_forward(
        &self,
        out: Span<Act>,
        inp: Span<Act>,
        w: Span<Act>,
        bias: Option<Span<Act>>,
        bt: usize,
        c: usize,
        oc: usize,
    );
    /// Backward of `matmul_forward`: `dinp (BT,C) += dout · w`, `dw (OC,C) += doutᵀ · inp`,
    /// `dbias (OC) += Σ_rows dout`. Each of dinp and dw that `overwrite` names is WRITTEN
    /// instead (`=`, not `+=`): a gradient's first write in a step (in GPT-2 every product's
    /// input has only one gradient, and every weight matrix's first comes from a product),
    /// which saves zeroing it and the product reading it back. dbias always accumulates.
    /// [`Overwrite::ACCUMULATE`] adds to both.
    /// # Operands
    /// As `matmul_forward`; `dinp`, `dw`, `dbias`, `dout` have the shapes of `inp`, `w`,
    /// `bias`, `out`.
    #[allow(clippy::too_many_arguments)]
    fn matmul_backward(
        &self,
        overwrite: Overwrite,
        dinp: Span<Act>,
        dw: Span,
        dbias: Option<Span>,
        dout: Span<Act>,
        inp: Span<Act>,
        w: Span<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    );
    /// `matmul_backward` without the input gradient: `dw (OC,C) += doutᵀ · inp` (WRITTEN with
    /// `overwrite_dw`) and `dbias (OC) += Σ_rows dout`. The FP8 products compute the input
    /// gradient themselves.
    /// # Operands
    /// As `matmul_backward`, without `dinp` and `w`.
    #[allow(clippy::too_many_arguments)]
    fn matmul_weight_backward(
        &self,
        overwrite_dw: bool,
        dw: Span,
        dbias: Option<Span>,
        dout: Span<Act>,
        inp: Span<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    );
    /// dbias (OC) += Σ_rows dout (BT,OC): the bias gradient alone, as a pass of its own
    /// (`matmul_backward` computes it too, the CUDA backend inside the weight gradient's
    /// product; this is the unfused form that benchmarks set beside it).
    /// # Operands
    /// `dbias`: OC; `dout`: BT·OC.
    fn bias_backward(&self, dbias: Span, dout: Span<Act>, bt: usize, oc: usize);

    /// out = (inp - mean) · rstd · w + b per row; saves mean (BT) and rstd (BT).
    /// # Operands
    /// `out`, `inp`: BT·C; `mean`, `rstd`: BT; `w`, `b`: C.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
        &self,
        out: Span<Act>,
        mean: Span,
        rstd: Span,
        inp: Span<Act>,
        w: Span<Act>,
        b: Span<Act>,
        bt: usize,
        c: usize,
    );
    /// # Operands
    /// As `layernorm_forward`; `dinp`, `dout`: BT·C; `dw`, `db`: C.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
        &self,
        dinp: Span<Act>,
        dw: Span,
        db: Span,
        dout: Span<Act>,
        inp: Span<Act>,
        w: Span<Act>,
        mean: Span,
        rstd: Span,
        bt: usize,
        c: usize,
    );

    /// The residual connection and the layernorm after it: `sum = a + b` (rounded to the
    /// activation type) and `out = layernorm(sum)` with its mean and rstd, as `add` then
    /// `layernorm_forward` compute them. By default those two ops; a backend may do both in
    /// one pass that reads `a` and `b` once (CUDA: `add_layernorm_forward_vec4_kernel`).
    /// # Operands
    /// As `add` over BT·C activations and `layernorm_forward` with `sum` for `inp`; `sum` and
    /// `out` distinct from each other and from every input.
    #[allow(clippy::too_many_arguments)]
    fn add_layernorm_forward(
        &self,
        sum: Span<Act>,
        out: Span<Act>,
        mean: Span,
        rstd: Span,
        a: Span<Act>,
        b: Span<Act>,
        w: Span<Act>,
        bias: Span<Act>,
        bt: usize,
        c: usize,
    ) {
        self.add(sum, a, b, bt * c);
        self.layernorm_forward(out, mean, rstd, sum, w, bias, bt, c);
    }
    /// [`Backend::add_layernorm_forward`], and `out`'s FP8 copy `quantized` (the next FP8
    /// product's input) as [`Backend::quantize_fp8`] makes it, and with `transposed` the copy
    /// transposed (C, BT) too, as [`Backend::quantize_fp8_transposed`] makes it (that product's
    /// weight gradient's operand): by default the separate ops; the CUDA backend writes the
    /// copies in the same pass (the same bits). Needs [`Backend::fp8`].
    /// # Operands
    /// As `add_layernorm_forward`; `quantized.dst`, `transposed`: BT·C, `.amax`, `.scale`: 1.
    #[allow(clippy::too_many_arguments)]
    fn add_layernorm_forward_quantize(
        &self,
        [sum, out]: [Span<Act>; 2],
        mean: Span,
        rstd: Span,
        [a, b]: [Span<Act>; 2],
        w: Span<Act>,
        bias: Span<Act>,
        [bt, c]: [usize; 2],
        quantized: Fp8Out,
        transposed: Option<Span<u8>>,
    ) {
        self.add_layernorm_forward(sum, out, mean, rstd, a, b, w, bias, bt, c);
        let q = quantized;
        self.quantize_fp8(q.dst, q.amax, out, q.scale, bt * c, q.format);
        if let Some(t) = transposed {
            self.quantize_fp8_transposed(t, q.amax, out, q.scale, [bt, c], q.format);
        }
    }
    /// Backward of `add_layernorm_forward` down to the residual stream: `dsum +=
    /// layernorm_backward(dout)` in place, after which `dsum` holds the whole gradient of the
    /// sum, which is the gradient of `a` and of `b` alike; with `copy`, that gradient is also
    /// written there (OVERWRITTEN, not accumulated), so that the second input gets its gradient
    /// in the same pass instead of a zero fill and an accumulate; with `dbias`, `dbias += Σ_rows
    /// dsum` (its new value): the bias gradient of the product whose output is `a` or `b`
    /// (`bias_backward` of that gradient), which the product's backward then leaves out. `dw`,
    /// `db` accumulate. By default `layernorm_backward`, then `copy` zeroed and
    /// `accumulate_act` into it (the ops an `add` and a `layernorm` ran), then `bias_backward`;
    /// a backend may write `copy` and sum `dbias` in the layernorm backward's own pass (CUDA:
    /// the one-pass kernel's extra outputs).
    /// # Operands
    /// As `layernorm_backward` with `dsum` for `dinp` and `sum` for `inp`; `copy`: BT·C
    /// activations, overlapping no other operand; `dbias`: C f32s.
    #[allow(clippy::too_many_arguments)]
    fn add_layernorm_backward(
        &self,
        dsum: Span<Act>,
        copy: Option<Span<Act>>,
        dbias: Option<Span>,
        dw: Span,
        db: Span,
        dout: Span<Act>,
        sum: Span<Act>,
        w: Span<Act>,
        mean: Span,
        rstd: Span,
        bt: usize,
        c: usize,
    ) {
        self.layernorm_backward(dsum, dw, db, dout, sum, w, mean, rstd, bt, c);
        if let Some(copy) = copy {
            self.zero_act(copy, bt * c);
            self.accumulate_act(copy, dsum, bt * c);
        }
        if let Some(dbias) = dbias {
            self.bias_backward(dbias, dsum, bt, c);
        }
    }

    /// Why this backend's attention cannot run heads of `head_size` values, if it cannot (a
    /// flash kernel's bound), so that the size is refused before anything is allocated.
    fn attention_refuses(&self, head_size: usize) -> Option<String> {
        let _ = head_size;
        None
    }
    /// f32 elements of saved state `attention_forward` needs for its backward (the backend
    /// chooses: full probabilities on the CPU, log-sum-exp rows in a flash kernel). Saturates
    /// at `usize::MAX` where the size does not fit, so that size checks refuse it.
    fn attention_saved_len(&self, b: usize, t: usize, nh: usize) -> usize;
    /// Causal multi-head self-attention: qkv (B,T,3C) → out (B,T,C).
    /// # Operands
    /// `out`: B·T·C; `saved`: `attention_saved_len(b, t, nh)`; `qkv`: B·T·3C; `nh` divides C.
    #[allow(clippy::too_many_arguments)]
    fn attention_forward(&self, out: Span<Act>, saved: Span, qkv: Span<Act>, b: usize, t: usize, c: usize, nh: usize);
    /// [`Backend::attention_forward`], then out quantized into `quantized` and, transposed
    /// (C, B·T), into `transposed`, as [`Backend::quantize_fp8_both`] does: under FP8 the
    /// attention projection's input, for its product and its weight gradient's. By default
    /// the two ops; CUDA's Hopper kernel writes both copies as it stores out's tiles (the same
    /// bits).
    /// # Operands
    /// As `attention_forward`; `quantized.dst`, `transposed`: B·T·C bytes, `.amax`, `.scale`: 1.
    #[allow(clippy::too_many_arguments)]
    fn attention_forward_quantize(
        &self,
        out: Span<Act>,
        saved: Span,
        qkv: Span<Act>,
        [b, t, c, nh]: [usize; 4],
        quantized: Fp8Out,
        transposed: Span<u8>,
    ) {
        self.attention_forward(out, saved, qkv, b, t, c, nh);
        let q = quantized;
        self.quantize_fp8_both([q.dst, transposed], q.amax, out, q.scale, [b * t, c], q.format);
    }
    /// The backward of `attention_forward`: `dqkv += ∂loss/∂qkv` from `dout`. With
    /// `overwrite`, dqkv's contents are ignored and OVERWRITTEN (qkv's first and only
    /// gradient): no zero fill first, and a backend may skip reading it (the Hopper kernels
    /// do). With `dbias` (only with `overwrite`), also `dbias += Σ_rows dqkv`, the gradient
    /// written: the bias gradient of the product whose output is qkv, which its backward then
    /// leaves out. A backend without overwriting kernels zeroes dqkv, accumulates into it and
    /// runs `bias_backward` after (the CPU); CUDA's Hopper kernels sum the bias from the tiles
    /// they store.
    /// # Operands
    /// As `attention_forward`; `dqkv`: B·T·3C; `dout`: B·T·C; `dbias`: 3C f32s.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        overwrite: bool,
        dqkv: Span<Act>,
        dbias: Option<Span>,
        dout: Span<Act>,
        qkv: Span<Act>,
        out: Span<Act>,
        saved: Span,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    );
    /// [`Backend::attention_backward`] overwriting dqkv (qkv's first and only gradient), then
    /// dqkv quantized into `quantized` and, transposed (3C, B·T), into `transposed`, as
    /// [`Backend::quantize_fp8_both`] does: under FP8 the qkv product's output gradient, for its
    /// input and weight gradients. By default the two ops; CUDA's Hopper kernels write both
    /// copies as they store dqkv's tiles (the same bits).
    /// # Operands
    /// As `attention_backward`; `quantized.dst`, `transposed`: B·T·3C bytes, `.amax`, `.scale`:
    /// 1.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward_quantize(
        &self,
        dqkv: Span<Act>,
        dbias: Option<Span>,
        dout: Span<Act>,
        qkv: Span<Act>,
        out: Span<Act>,
        saved: Span,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
        quantized: Fp8Out,
        transposed: Span<u8>,
    ) {
        self.attention_backward(true, dqkv, dbias, dout, qkv, out, saved, b, t, c, nh);
        let q = quantized;
        self.quantize_fp8_both([q.dst, transposed], q.amax, dqkv, q.scale, [b * t, 3 * c], q.format);
    }

    /// Causal attention of `t` new positions of one sequence against a key/value cache (text
    /// generation): writes the new keys and values of qkv (T,3C) into rows `pos..pos + T` of
    /// `k_cache` and `v_cache` (each (rows, C)), then out (T,C) = attention of new query i
    /// (position `pos + i`) over cache rows `0..=pos + i`. `pos` is read where it lives (on
    /// the device for a GPU), so a recorded decode step replays at every position. Forward
    /// only. On the CPU each row is computed as `attention_forward` computes it, in the same
    /// order.
    /// # Operands
    /// `out`: T·C; `qkv`: T·3C; `k_cache`, `v_cache`: rows·C activations, distinct from the
    /// others; `pos`: one value; `nh` divides C.
    /// # Safety
    /// The position `pos` holds leaves room for the new rows: pos + T ≤ rows.
    #[allow(clippy::too_many_arguments)]
    unsafe fn attention_cached_forward(
        &self,
        out: Span<Act>,
        k_cache: Span<Act>,
        v_cache: Span<Act>,
        rows: usize,
        qkv: Span<Act>,
        pos: Span<i32>,
        t: usize,
        c: usize,
        nh: usize,
    );

    /// ReLU, max(x, 0) (the MLP workload's); backward passes the gradient where x > 0.
    /// # Operands
    /// `out`, `inp`: `n` elements each.
    fn relu_forward(&self, out: Span<Act>, inp: Span<Act>, n: usize);
    /// # Operands
    /// `dinp`, `inp`, `dout`: `n` elements each.
    fn relu_backward(&self, dinp: Span<Act>, inp: Span<Act>, dout: Span<Act>, n: usize);

    /// GELU, tanh approximation (GPT-2's).
    /// # Operands
    /// `out`, `inp`: `n` elements each.
    fn gelu_forward(&self, out: Span<Act>, inp: Span<Act>, n: usize);
    /// # Operands
    /// `dinp`, `inp`, `dout`: `n` elements each.
    fn gelu_backward(&self, dinp: Span<Act>, inp: Span<Act>, dout: Span<Act>, n: usize);
    /// `d = gelu'(inp) ⊙ d`, in place: the gradient with respect to the output becomes the one
    /// with respect to the input (OVERWRITES, unlike the other backward ops).
    /// # Operands
    /// `d`, `inp`: `n` elements each.
    fn gelu_backward_in_place(&self, d: Span<Act>, inp: Span<Act>, n: usize);

    /// The MLP's first product through GELU: `pre (BT,OC) = inp (BT,C) · wᵀ + bias` and
    /// `out = gelu(pre)`, both written. By default the two ops; a backend may fuse GELU into
    /// the product's epilogue (CUDA: cuBLASLt's GELU_AUX_BIAS).
    /// # Operands
    /// As `matmul_forward`; `pre`, `out`: BT·OC each, distinct.
    #[allow(clippy::too_many_arguments)]
    fn matmul_gelu_forward(
        &self,
        pre: Span<Act>,
        out: Span<Act>,
        inp: Span<Act>,
        w: Span<Act>,
        bias: Option<Span<Act>>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        self.matmul_forward(pre, inp, w, bias, bt, c, oc);
        self.gelu_forward(out, pre, bt * oc);
    }
    /// Backward of `matmul_forward(out, gelu(pre), w, bias, …)` down to `pre`, the MLP's second
    /// product: `dpre (BT,C) = gelu'(pre) ⊙ (dout (BT,OC) · w (OC,C))`, OVERWRITTEN (the
    /// gradient of `gelu(pre)` is never stored); `dw += doutᵀ · act` and `dbias += Σ dout`
    /// accumulate as in `matmul_backward` (dw is WRITTEN with `overwrite_dw`). `act` is
    /// `gelu(pre)` as the forward product read it. With `dpre_bias`, also `dpre_bias +=
    /// Σ_rows dpre`: the bias gradient of the product whose output is pre (the MLP's first),
    /// which its backward then leaves out. By default the two ops, then `bias_backward`; a
    /// backend may fuse gelu' into the product's epilogue (CUDA: cuBLASLt's DGELU), and the
    /// bias sums too (DGELU_BGRAD, opt-in: slower on an H100).
    /// # Operands
    /// As `matmul_backward` with `dpre` for `dinp` and `act` for `inp`; `pre`: BT·C; `dpre`
    /// overlaps nothing else; `dpre_bias`: C f32s.
    #[allow(clippy::too_many_arguments)]
    fn matmul_backward_dgelu(
        &self,
        dpre: Span<Act>,
        dpre_bias: Option<Span>,
        dw: Span,
        overwrite_dw: bool,
        dbias: Option<Span>,
        dout: Span<Act>,
        act: Span<Act>,
        pre: Span<Act>,
        w: Span<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let overwrite = Overwrite {
            dinp: true,
            dw: overwrite_dw,
        };
        self.matmul_backward(overwrite, dpre, dw, dbias, dout, act, w, bt, c, oc);
        self.gelu_backward_in_place(dpre, pre, bt * c);
        if let Some(dpre_bias) = dpre_bias {
            self.bias_backward(dpre_bias, dpre, bt, c);
        }
    }

    /// `losses (BT) = -log softmax(logits[:, :V])[target]`, logits (BT,Vp), targets (BT).
    /// # Operands
    /// `losses`: BT; `logits`: BT·Vp; `targets`: BT; V ≤ Vp.
    /// # Safety
    /// Every id in `targets` is below V.
    #[allow(clippy::too_many_arguments)]
    unsafe fn crossentropy_forward(
        &self,
        losses: Span,
        logits: Span<Act>,
        targets: Span<i32>,
        bt: usize,
        v: usize,
        vp: usize,
    );
    /// dlogits += (softmax(logits) - onehot(target)) · dloss, with dloss a scalar per row.
    /// # Operands
    /// As `crossentropy_forward`; `dlogits`: BT·Vp.
    /// # Safety
    /// As `crossentropy_forward`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn crossentropy_backward(
        &self,
        dlogits: Span<Act>,
        logits: Span<Act>,
        targets: Span<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    );
    /// llm.c's in-place classifier backward, for logits nothing else reads: overwrites
    /// `logits` with their gradient, (softmax(logits) - onehot(target)) · dloss over the
    /// first V columns and 0 in the padding. `losses` are what `crossentropy_forward` wrote
    /// for these logits: with the target's logit they give each row's log-sum-exp, so a row
    /// is read once and written once. Saves a (BT,Vp) buffer, its zeroing and two reads.
    /// # Safety
    /// As `crossentropy_forward`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn crossentropy_backward_in_place(
        &self,
        logits: Span<Act>,
        losses: Span,
        targets: Span<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    );
    /// `crossentropy_forward` and then `crossentropy_backward_in_place`, for a training step
    /// that will back-propagate `dloss` into logits nothing else reads: the losses are
    /// written and the logits overwritten by their gradient already in the forward pass. A
    /// backend may do both in one pass over the logits (the GPU: read once from memory
    /// instead of twice); this default runs the two ops.
    /// # Safety
    /// As `crossentropy_forward`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn crossentropy_fused(
        &self,
        losses: Span,
        logits: Span<Act>,
        targets: Span<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        self.crossentropy_forward(losses, logits, targets, bt, v, vp);
        self.crossentropy_backward_in_place(logits, losses, targets, dloss, bt, v, vp);
    }

    // ---- reductions and the optimiser ---------------------------------------------
    /// `out[0]` = mean of `inp[0..n]` (a fixed reduction order on the CPU).
    /// # Operands
    /// `out`: 1; `inp`: `n`.
    fn mean(&self, out: Span, inp: Span, n: usize);
    /// `out[0] += Σ inp[i]²` over `n` values.
    /// # Operands
    /// `out`: 1; `inp`: `n`.
    fn sum_squares(&self, out: Span, inp: Span, n: usize);
    /// Finishes a step's [`StepState`] at `state` from its `sumsq` and summed `loss`: the
    /// norm, the factor that clips it to `max_norm` (1 when already under, or when `max_norm`
    /// ≤ 0: PyTorch's clip_grad_norm_), the loss times `loss_scale` (the mean over
    /// micro-batches), `apply` (1 when loss and norm are finite), and (loss, norm) into
    /// `history[2·(step mod history_len)..]`, where the host reads them when it likes.
    /// # Operands
    /// `state`: [`StepState::WORDS`]; `history`: 2·`history_len`.
    fn step_stats(&self, state: Span, history: Span, history_len: usize, max_norm: f32, loss_scale: f32);
    /// One AdamW update of the parameters the `segments` cover (in order, from 0), with
    /// `hp.weight_decay` on the segments flagged true and none on the others, in one pass over
    /// the buffers, with the learning rate, bias corrections and clipping factor of the
    /// [`StepState`] at `state`; nothing at all when its `apply` is 0. With `copy`, the updated
    /// parameters are also written there rounded to bf16, in the same pass.
    /// # Operands
    /// `params`, `grads`, `m`, `v`, `copy`: as many elements as the segments cover; `state`:
    /// [`StepState::WORDS`].
    #[allow(clippy::too_many_arguments)]
    fn adamw(
        &self,
        params: Span,
        grads: Span,
        m: Span,
        v: Span,
        segments: &[(Range<usize>, bool)],
        state: Span,
        hp: AdamWHyper,
        copy: Option<Span<bf16>>,
    );
    /// One SGD update with momentum of `n` parameters (the MLP workload's optimiser), with
    /// the learning rate and clipping factor of the [`StepState`] at `state` (nothing at all
    /// when its `apply` is 0): `g = grads · clip + weight_decay · p`, `velocity = momentum ·
    /// velocity + g`, `p -= lr · velocity`. With `copy`, the updated parameters are also
    /// written there rounded to bf16, in the same pass.
    /// # Operands
    /// `params`, `grads`, `velocity`: `n` elements each; `state`: [`StepState::WORDS`]; `copy`: `n`.
    #[allow(clippy::too_many_arguments)]
    fn sgd(
        &self,
        params: Span,
        grads: Span,
        velocity: Span,
        n: usize,
        state: Span,
        hp: SgdHyper,
        copy: Option<Span<bf16>>,
    );
}
