//! The hardware boundary. Everything above this module (tensors, autograd, the model,
//! the optimiser, the training loop) is written once against the [`Backend`] trait; the
//! CPU backend (rayon + `gemm`) and the CUDA backend (cudarc) are its two implementations.
//!
//! Memory model, llm.c style: a backend hands out typed buffers ([`DeviceBuffer`]: an
//! element type and a length) and every op takes raw [`DevPtr`]s plus its dimensions.
//! Activations, their gradients and the weights the forward pass reads have the backend's
//! activation type ([`DevPtr<Act>`], [`ActType`]: f32, or bf16 under [`Precision::Bf16`]);
//! parameter gradients, optimiser state, losses and layer statistics are always f32; token
//! ids are i32. Backward ops always ACCUMULATE (`+=`) into their gradient outputs; callers
//! zero gradients first.
//!
//! # Safety
//!
//! An op that takes a [`DevPtr`] cannot check it, so it is an `unsafe fn`. Its caller
//! promises, for every pointer: it addresses live memory of this backend holding at least
//! the extent the op's documentation gives (counted in elements), outputs overlap no input
//! unless the op says so, and nothing else reads or writes that memory during the call.
//! The safe layers above hold that promise: [`Backend::write`] and [`Backend::read`] check
//! bounds against a buffer, the autograd graph checks every shape against the buffers it
//! owns or borrows, and the optimiser checks its buffers against the parameter layout.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod replay;

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
        // SAFETY: both buffers hold n values (checked above).
        unsafe { be.round_to_bf16(copy.ptr(), params.ptr(), n) };
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
        // SAFETY: the whole of a live buffer.
        unsafe { self.zero(buf.ptr(), buf.len()) }
    }

    /// Wait until all queued work is done (a no-op on the CPU).
    fn synchronize(&self) -> Result<()>;
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
    /// `dst`: `src.len()` elements (see [the contract](self#safety)).
    unsafe fn upload<T: Elem>(&self, dst: DevPtr<T>, src: &[T]) -> Result<()>;
    /// # Safety
    /// `src`: `dst.len()` elements.
    unsafe fn download<T: Elem>(&self, src: DevPtr<T>, dst: &mut [T]) -> Result<()>;
    /// Activations from f32 values, rounded to nearest-even when the type is bf16.
    /// # Safety
    /// `dst`: `src.len()` activations.
    unsafe fn upload_act(&self, dst: DevPtr<Act>, src: &[f32]) -> Result<()> {
        match self.act() {
            ActType::F32 => self.upload(dst.cast::<f32>(), src),
            ActType::Bf16 => {
                let host: Vec<bf16> = src.iter().map(|&x| bf16::from_f32(x)).collect();
                self.upload(dst.cast::<bf16>(), &host)
            }
        }
    }
    /// Activations as f32 values (exactly: every bf16 is an f32).
    /// # Safety
    /// `src`: `dst.len()` activations.
    unsafe fn download_act(&self, src: DevPtr<Act>, dst: &mut [f32]) -> Result<()> {
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
    /// # Safety
    /// `dst`: `n` elements.
    unsafe fn zero<T: Elem>(&self, dst: DevPtr<T>, n: usize);
    /// # Safety
    /// `dst`: `n` activations.
    unsafe fn zero_act(&self, dst: DevPtr<Act>, n: usize) {
        match self.act() {
            ActType::F32 => self.zero(dst.cast::<f32>(), n),
            ActType::Bf16 => self.zero(dst.cast::<bf16>(), n),
        }
    }
    /// `dst = bf16(src)`, rounded to nearest-even, over `n` values: the weight copy the
    /// forward pass reads under bf16, refreshed after the master weights change.
    /// # Safety
    /// `dst`, `src`: `n` elements each.
    unsafe fn round_to_bf16(&self, dst: DevPtr<bf16>, src: DevPtr, n: usize);
    /// `dst += src`, elementwise over `n` f32 values.
    /// # Safety
    /// `dst`, `src`: `n` elements each; they may be the same pointer.
    unsafe fn accumulate(&self, dst: DevPtr, src: DevPtr, n: usize);
    /// `dst += src`, elementwise over `n` activations (a gradient reaching a value twice).
    /// # Safety
    /// `dst`, `src`: `n` activations each; they may be the same pointer.
    unsafe fn accumulate_act(&self, dst: DevPtr<Act>, src: DevPtr<Act>, n: usize);
    /// `out = a + b`, elementwise over `n` activations, in one pass.
    /// # Safety
    /// `out`, `a`, `b`: `n` activations each; `out` distinct from both.
    unsafe fn add(&self, out: DevPtr<Act>, a: DevPtr<Act>, b: DevPtr<Act>, n: usize);
    /// `dst *= s`, elementwise over `n` f32 values.
    /// # Safety
    /// `dst`: `n` elements.
    unsafe fn scale(&self, dst: DevPtr, n: usize, s: f32);

    // ---- layers: forward and backward ---------------------------------------------
    /// `out (B,T,C) = wte[tokens] + wpe[p + t]`; `tokens` is (B,T), and `p` is 0, or with
    /// `first_position` the position it holds (generation: read on the device, so that a
    /// recorded decode step replays at every position).
    /// # Safety
    /// `out`: B·T·C; `tokens`: B·T ids, each a row of `wte`; `wte`: (its rows)·C; `wpe`:
    /// (p + T)·C; `first_position`: one value.
    #[allow(clippy::too_many_arguments)]
    unsafe fn encoder_forward(
        &self,
        out: DevPtr<Act>,
        tokens: DevPtr<i32>,
        first_position: Option<DevPtr<i32>>,
        wte: DevPtr<Act>,
        wpe: DevPtr<Act>,
        b: usize,
        t: usize,
        c: usize,
    );
    /// `order` is the positions 0..B·T sorted by their token (stably, see [`token_order`]):
    /// each token's rows of `dout` are summed in that fixed order, with no atomics.
    /// # Safety
    /// As `encoder_forward`, with `dwte`, `dwpe` and `dout` in place of `wte`, `wpe`, `out`;
    /// `order`: B·T positions, a permutation of 0..B·T.
    #[allow(clippy::too_many_arguments)]
    unsafe fn encoder_backward(
        &self,
        dwte: DevPtr,
        dwpe: DevPtr,
        dout: DevPtr<Act>,
        tokens: DevPtr<i32>,
        order: DevPtr<i32>,
        b: usize,
        t: usize,
        c: usize,
    );

    /// out (BT,OC) = inp (BT,C) · wᵀ + bias, with w (OC,C) as in PyTorch's Linear.
    /// # Safety
    /// `out`: BT·OC; `inp`: BT·C; `w`: OC·C; `bias`: OC.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul_forward(
        &self,
        out: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        bias: Option<DevPtr<Act>>,
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
    /// # Safety
    /// As `matmul_forward`; `dinp`, `dw`, `dbias`, `dout` have the shapes of `inp`, `w`,
    /// `bias`, `out`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul_backward(
        &self,
        overwrite: Overwrite,
        dinp: DevPtr<Act>,
        dw: DevPtr,
        dbias: Option<DevPtr>,
        dout: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    );
    /// dbias (OC) += Σ_rows dout (BT,OC): the bias gradient alone, as a pass of its own
    /// (`matmul_backward` computes it too, the CUDA backend inside the weight gradient's
    /// product; this is the unfused form that benchmarks set beside it).
    /// # Safety
    /// `dbias`: OC; `dout`: BT·OC.
    unsafe fn bias_backward(&self, dbias: DevPtr, dout: DevPtr<Act>, bt: usize, oc: usize);

    /// out = (inp - mean) · rstd · w + b per row; saves mean (BT) and rstd (BT).
    /// # Safety
    /// `out`, `inp`: BT·C; `mean`, `rstd`: BT; `w`, `b`: C.
    #[allow(clippy::too_many_arguments)]
    unsafe fn layernorm_forward(
        &self,
        out: DevPtr<Act>,
        mean: DevPtr,
        rstd: DevPtr,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        b: DevPtr<Act>,
        bt: usize,
        c: usize,
    );
    /// # Safety
    /// As `layernorm_forward`; `dinp`, `dout`: BT·C; `dw`, `db`: C.
    #[allow(clippy::too_many_arguments)]
    unsafe fn layernorm_backward(
        &self,
        dinp: DevPtr<Act>,
        dw: DevPtr,
        db: DevPtr,
        dout: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        mean: DevPtr,
        rstd: DevPtr,
        bt: usize,
        c: usize,
    );

    /// The residual connection and the layernorm after it: `sum = a + b` (rounded to the
    /// activation type) and `out = layernorm(sum)` with its mean and rstd, as `add` then
    /// `layernorm_forward` compute them. By default those two ops; a backend may do both in
    /// one pass that reads `a` and `b` once (CUDA: `add_layernorm_forward_vec4_kernel`).
    /// # Safety
    /// As `add` over BT·C activations and `layernorm_forward` with `sum` for `inp`; `sum` and
    /// `out` distinct from each other and from every input.
    #[allow(clippy::too_many_arguments)]
    unsafe fn add_layernorm_forward(
        &self,
        sum: DevPtr<Act>,
        out: DevPtr<Act>,
        mean: DevPtr,
        rstd: DevPtr,
        a: DevPtr<Act>,
        b: DevPtr<Act>,
        w: DevPtr<Act>,
        bias: DevPtr<Act>,
        bt: usize,
        c: usize,
    ) {
        self.add(sum, a, b, bt * c);
        self.layernorm_forward(out, mean, rstd, sum, w, bias, bt, c);
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
    /// # Safety
    /// As `layernorm_backward` with `dsum` for `dinp` and `sum` for `inp`; `copy`: BT·C
    /// activations, overlapping no other operand; `dbias`: C f32s.
    #[allow(clippy::too_many_arguments)]
    unsafe fn add_layernorm_backward(
        &self,
        dsum: DevPtr<Act>,
        copy: Option<DevPtr<Act>>,
        dbias: Option<DevPtr>,
        dw: DevPtr,
        db: DevPtr,
        dout: DevPtr<Act>,
        sum: DevPtr<Act>,
        w: DevPtr<Act>,
        mean: DevPtr,
        rstd: DevPtr,
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
    /// # Safety
    /// `out`: B·T·C; `saved`: `attention_saved_len(b, t, nh)`; `qkv`: B·T·3C; `nh` divides C.
    #[allow(clippy::too_many_arguments)]
    unsafe fn attention_forward(
        &self,
        out: DevPtr<Act>,
        saved: DevPtr,
        qkv: DevPtr<Act>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    );
    /// The backward of `attention_forward`: `dqkv += ∂loss/∂qkv` from `dout`. With
    /// `overwrite`, dqkv's contents are ignored and OVERWRITTEN (qkv's first and only
    /// gradient): no zero fill first, and a backend may skip reading it (the Hopper kernels
    /// do). With `dbias` (only with `overwrite`), also `dbias += Σ_rows dqkv`, the gradient
    /// written: the bias gradient of the product whose output is qkv, which its backward then
    /// leaves out. A backend without overwriting kernels zeroes dqkv, accumulates into it and
    /// runs `bias_backward` after (the CPU); CUDA's Hopper kernels sum the bias from the tiles
    /// they store.
    /// # Safety
    /// As `attention_forward`; `dqkv`: B·T·3C; `dout`: B·T·C; `dbias`: 3C f32s.
    #[allow(clippy::too_many_arguments)]
    unsafe fn attention_backward(
        &self,
        overwrite: bool,
        dqkv: DevPtr<Act>,
        dbias: Option<DevPtr>,
        dout: DevPtr<Act>,
        qkv: DevPtr<Act>,
        out: DevPtr<Act>,
        saved: DevPtr,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    );

    /// Causal attention of `t` new positions of one sequence against a key/value cache (text
    /// generation): writes the new keys and values of qkv (T,3C) into rows `pos..pos + T` of
    /// `k_cache` and `v_cache` (each (rows, C)), then out (T,C) = attention of new query i
    /// (position `pos + i`) over cache rows `0..=pos + i`. `pos` is read where it lives (on
    /// the device for a GPU), so a recorded decode step replays at every position. Forward
    /// only. On the CPU each row is computed as `attention_forward` computes it, in the same
    /// order.
    /// # Safety
    /// `out`: T·C; `qkv`: T·3C; `k_cache`, `v_cache`: rows·C activations, distinct from the
    /// others; `pos`: one value, pos + T ≤ rows; `nh` divides C.
    #[allow(clippy::too_many_arguments)]
    unsafe fn attention_cached_forward(
        &self,
        out: DevPtr<Act>,
        k_cache: DevPtr<Act>,
        v_cache: DevPtr<Act>,
        rows: usize,
        qkv: DevPtr<Act>,
        pos: DevPtr<i32>,
        t: usize,
        c: usize,
        nh: usize,
    );

    /// ReLU, max(x, 0) (the MLP workload's); backward passes the gradient where x > 0.
    /// # Safety
    /// `out`, `inp`: `n` elements each.
    unsafe fn relu_forward(&self, out: DevPtr<Act>, inp: DevPtr<Act>, n: usize);
    /// # Safety
    /// `dinp`, `inp`, `dout`: `n` elements each.
    unsafe fn relu_backward(&self, dinp: DevPtr<Act>, inp: DevPtr<Act>, dout: DevPtr<Act>, n: usize);

    /// GELU, tanh approximation (GPT-2's).
    /// # Safety
    /// `out`, `inp`: `n` elements each.
    unsafe fn gelu_forward(&self, out: DevPtr<Act>, inp: DevPtr<Act>, n: usize);
    /// # Safety
    /// `dinp`, `inp`, `dout`: `n` elements each.
    unsafe fn gelu_backward(&self, dinp: DevPtr<Act>, inp: DevPtr<Act>, dout: DevPtr<Act>, n: usize);
    /// `d = gelu'(inp) ⊙ d`, in place: the gradient with respect to the output becomes the one
    /// with respect to the input (OVERWRITES, unlike the other backward ops).
    /// # Safety
    /// `d`, `inp`: `n` elements each.
    unsafe fn gelu_backward_in_place(&self, d: DevPtr<Act>, inp: DevPtr<Act>, n: usize);

    /// The MLP's first product through GELU: `pre (BT,OC) = inp (BT,C) · wᵀ + bias` and
    /// `out = gelu(pre)`, both written. By default the two ops; a backend may fuse GELU into
    /// the product's epilogue (CUDA: cuBLASLt's GELU_AUX_BIAS).
    /// # Safety
    /// As `matmul_forward`; `pre`, `out`: BT·OC each, distinct.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul_gelu_forward(
        &self,
        pre: DevPtr<Act>,
        out: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        bias: Option<DevPtr<Act>>,
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
    /// # Safety
    /// As `matmul_backward` with `dpre` for `dinp` and `act` for `inp`; `pre`: BT·C; `dpre`
    /// overlaps nothing else; `dpre_bias`: C f32s.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul_backward_dgelu(
        &self,
        dpre: DevPtr<Act>,
        dpre_bias: Option<DevPtr>,
        dw: DevPtr,
        overwrite_dw: bool,
        dbias: Option<DevPtr>,
        dout: DevPtr<Act>,
        act: DevPtr<Act>,
        pre: DevPtr<Act>,
        w: DevPtr<Act>,
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
    /// # Safety
    /// `losses`: BT; `logits`: BT·Vp; `targets`: BT ids, each below V; V ≤ Vp.
    #[allow(clippy::too_many_arguments)]
    unsafe fn crossentropy_forward(
        &self,
        losses: DevPtr,
        logits: DevPtr<Act>,
        targets: DevPtr<i32>,
        bt: usize,
        v: usize,
        vp: usize,
    );
    /// dlogits += (softmax(logits) - onehot(target)) · dloss, with dloss a scalar per row.
    /// # Safety
    /// As `crossentropy_forward`; `dlogits`: BT·Vp.
    #[allow(clippy::too_many_arguments)]
    unsafe fn crossentropy_backward(
        &self,
        dlogits: DevPtr<Act>,
        logits: DevPtr<Act>,
        targets: DevPtr<i32>,
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
        logits: DevPtr<Act>,
        losses: DevPtr,
        targets: DevPtr<i32>,
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
        losses: DevPtr,
        logits: DevPtr<Act>,
        targets: DevPtr<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        self.crossentropy_forward(losses, logits, targets, bt, v, vp);
        self.crossentropy_backward_in_place(logits, losses, targets, dloss, bt, v, vp);
    }

    /// A hidden layer's product through ReLU: `pre (BT,OC) = inp (BT,C) · wᵀ + bias` and
    /// `out = relu(pre)` (the MLP workload's). By default the two ops, both written; a backend
    /// may fuse ReLU into the product's epilogue (CUDA: cuBLASLt's RELU_BIAS) and then leave
    /// `pre` unwritten: callers read `out` only.
    /// # Safety
    /// As `matmul_forward`; `pre`, `out`: BT·OC each, distinct.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul_relu_forward(
        &self,
        pre: DevPtr<Act>,
        out: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        bias: Option<DevPtr<Act>>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        self.matmul_forward(pre, inp, w, bias, bt, c, oc);
        self.relu_forward(out, pre, bt * oc);
    }

    // ---- the MLP workload's step, whole on the device (mnist/fused.rs) ----------------
    /// The step's batch, cut on the device from a data set kept there: row r of `out` (rows,
    /// size) is image `order[s·rows + r]` of `images` (`size` u8 pixels each) scaled to [0, 1]
    /// (`p / 255` in f32, as the host's gather computes it, then stored as an activation), and
    /// `targets[r]` is its label in `labels`, where s is the step within the epoch: the
    /// [`StepState`] step at `state` mod `steps`. Nothing is read back.
    /// # Safety
    /// `out`: rows·size activations; `targets`: rows; `order`: steps·rows image indices, each
    /// below the images in `images` (size each) and `labels`; `state`: [`StepState::WORDS`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn gather_batch(
        &self,
        out: DevPtr<Act>,
        targets: DevPtr<i32>,
        images: DevPtr<u8>,
        labels: DevPtr<u8>,
        order: DevPtr<i32>,
        state: DevPtr,
        rows: usize,
        size: usize,
        steps: usize,
    );
    /// The classifier's loss and the step's scalars, for a step whose update runs inside its
    /// backward pass (so with no gradient norm before it): `losses (rows) =
    /// crossentropy_forward(logits (rows, V), targets)`, their `mean` into the [`StepState`]'s
    /// `loss`, then the logits overwritten by their gradient as `crossentropy_backward_in_place`
    /// with `dloss` writes it. In the state: `norm` and `sumsq` 0, `clip` 1, `apply` 1 when the
    /// loss is finite (else 0), `lr = schedule[s]`, (loss, 0) into `history[2·(step mod
    /// history_len)..]`, then `step` + 1; s is the step within the epoch (step mod `steps`).
    /// The same values as those ops compute, bit for bit.
    /// # Safety
    /// `logits`: rows·V activations; `losses`, `targets`: rows (ids below V); `state`:
    /// [`StepState::WORDS`]; `schedule`: `steps`; `history`: 2·`history_len`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn loss_step(
        &self,
        logits: DevPtr<Act>,
        losses: DevPtr,
        targets: DevPtr<i32>,
        state: DevPtr,
        schedule: DevPtr,
        history: DevPtr,
        history_len: usize,
        rows: usize,
        v: usize,
        steps: usize,
        dloss: f32,
    );
    /// A Linear layer's input gradient through the ReLU before it: `dinp (BT,C) = (dout (BT,OC)
    /// · w (OC,C)) ⊙ [act > 0]`, OVERWRITTEN, where `act` (BT,C) is the ReLU's output (> 0
    /// exactly where its input is): what `matmul_backward`'s dinp and then `relu_backward`
    /// compute into zeroed buffers.
    /// # Safety
    /// `dinp`, `act`: BT·C; `dout`: BT·OC; `w`: OC·C activations; `dinp` overlaps nothing else.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul_backward_relu(
        &self,
        dinp: DevPtr<Act>,
        dout: DevPtr<Act>,
        w: DevPtr<Act>,
        act: DevPtr<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    );
    /// SGD fused into the backward pass: a Linear layer's gradients `dw (OC,C) = doutᵀ · inp`
    /// and `db (OC) = Σ_rows dout`, applied at once as [`Backend::sgd`] applies gradients (the
    /// [`StepState`]'s lr and clipping factor, nothing when its `apply` is 0), `hp.weight_decay`
    /// on the weights and none on the biases, to `params`: w (OC,C) then b (OC), the MLP's
    /// layout, with their momentum `velocity` (the same layout), and with `copy` the updated
    /// values rounded to bf16 there too. `grads` is the layer's slice of the gradient buffer
    /// (OC·C + OC f32s), which the op may use as scratch: unspecified afterwards.
    /// # Safety
    /// `params`, `velocity`, `grads`, `copy`: OC·C + OC elements; `dout`: BT·OC; `inp`: BT·C
    /// activations; `state`: [`StepState::WORDS`]; the parameters (and their copy) are not
    /// read by `dout` or `inp`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn linear_sgd(
        &self,
        params: DevPtr,
        velocity: DevPtr,
        grads: DevPtr,
        copy: Option<DevPtr<bf16>>,
        dout: DevPtr<Act>,
        inp: DevPtr<Act>,
        state: DevPtr,
        hp: SgdHyper,
        bt: usize,
        c: usize,
        oc: usize,
    );

    // ---- reductions and the optimiser ---------------------------------------------
    /// `out[0]` = mean of `inp[0..n]` (a fixed reduction order on the CPU).
    /// # Safety
    /// `out`: 1; `inp`: `n`.
    unsafe fn mean(&self, out: DevPtr, inp: DevPtr, n: usize);
    /// `out[0] += Σ inp[i]²` over `n` values.
    /// # Safety
    /// `out`: 1; `inp`: `n`.
    unsafe fn sum_squares(&self, out: DevPtr, inp: DevPtr, n: usize);
    /// Finishes a step's [`StepState`] at `state` from its `sumsq` and summed `loss`: the
    /// norm, the factor that clips it to `max_norm` (1 when already under, or when `max_norm`
    /// ≤ 0: PyTorch's clip_grad_norm_), the loss times `loss_scale` (the mean over
    /// micro-batches), `apply` (1 when loss and norm are finite), and (loss, norm) into
    /// `history[2·(step mod history_len)..]`, where the host reads them when it likes.
    /// # Safety
    /// `state`: [`StepState::WORDS`]; `history`: 2·`history_len`.
    unsafe fn step_stats(&self, state: DevPtr, history: DevPtr, history_len: usize, max_norm: f32, loss_scale: f32);
    /// One AdamW update of the parameters the `segments` cover (in order, from 0), with
    /// `hp.weight_decay` on the segments flagged true and none on the others, in one pass over
    /// the buffers, with the learning rate, bias corrections and clipping factor of the
    /// [`StepState`] at `state`; nothing at all when its `apply` is 0. With `copy`, the updated
    /// parameters are also written there rounded to bf16, in the same pass.
    /// # Safety
    /// `params`, `grads`, `m`, `v`, `copy`: as many elements as the segments cover; `state`:
    /// [`StepState::WORDS`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn adamw(
        &self,
        params: DevPtr,
        grads: DevPtr,
        m: DevPtr,
        v: DevPtr,
        segments: &[(Range<usize>, bool)],
        state: DevPtr,
        hp: AdamWHyper,
        copy: Option<DevPtr<bf16>>,
    );
    /// One SGD update with momentum of `n` parameters (the MLP workload's optimiser), with
    /// the learning rate and clipping factor of the [`StepState`] at `state` (nothing at all
    /// when its `apply` is 0): `g = grads · clip + weight_decay · p`, `velocity = momentum ·
    /// velocity + g`, `p -= lr · velocity`. With `copy`, the updated parameters are also
    /// written there rounded to bf16, in the same pass.
    /// # Safety
    /// `params`, `grads`, `velocity`: `n` elements each; `state`: [`StepState::WORDS`]; `copy`: `n`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn sgd(
        &self,
        params: DevPtr,
        grads: DevPtr,
        velocity: DevPtr,
        n: usize,
        state: DevPtr,
        hp: SgdHyper,
        copy: Option<DevPtr<bf16>>,
    );
}
