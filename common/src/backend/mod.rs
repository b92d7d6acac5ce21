//! The hardware boundary. Everything above this module (tensors, autograd, the model,
//! the optimiser, the training loop) is written once against the [`Backend`] trait; the
//! CPU backend (rayon + `gemm`) and the CUDA backend (cudarc) are its two implementations.
//!
//! Memory model, llm.c style: a backend hands out typed buffers ([`DeviceBuffer`]: an
//! element type and a length) and every op takes raw [`DevPtr`]s plus its dimensions.
//! Activations are f32; token ids are i32. Backward ops always ACCUMULATE (`+=`) into
//! their gradient outputs; callers zero gradients first.
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

use crate::error::{Error, Result};
use std::marker::PhantomData;

/// An element type that backend memory holds: plain bits, no drop.
pub trait Elem: bytemuck::Pod + Send + Sync + 'static {}
impl Elem for f32 {}
impl Elem for i32 {}

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

    /// The pointer `n` elements further on.
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, n: usize) -> Self {
        DevPtr::from_addr(self.addr + (n * std::mem::size_of::<T>()) as u64)
    }

    /// The same address, read as another element type.
    pub fn cast<U>(self) -> DevPtr<U> {
        DevPtr::from_addr(self.addr)
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

/// Arithmetic precision of a backend's matrix products (the CPU backend is always fp32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Strict IEEE fp32 everywhere.
    Fp32,
    /// fp32 storage, TF32 tensor-core matrix products.
    Tf32,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
        }
    }
}

/// Hyper-parameters of one AdamW update (decoupled weight decay, as in Loshchilov & Hutter).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1-based step number, for bias correction.
    pub t: u64,
}

/// Dimensions shared by most ops: `bt` rows (batch × time) of width `c`.
/// Naming follows llm.c: B batch, T time, C channels, OC output channels, NH heads,
/// V vocabulary, Vp padded vocabulary.
pub trait Backend {
    type Buffer<T: Elem>: DeviceBuffer<T>;

    /// Short human name, e.g. "cpu (2 threads)" or "NVIDIA H100 80GB HBM3".
    fn name(&self) -> String;

    // ---- memory: the safe, bounds-checked entry points --------------------------------
    /// A zero-filled buffer of `n` elements.
    fn alloc<T: Elem>(&self, n: usize) -> Result<Self::Buffer<T>>;

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
    fn zero_buffer(&self, buf: &Self::Buffer<f32>) {
        // SAFETY: the whole of a live buffer.
        unsafe { self.zero(buf.ptr(), buf.len()) }
    }

    /// Wait until all queued work is done (a no-op on the CPU).
    fn synchronize(&self) -> Result<()>;
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
    /// # Safety
    /// `dst`: `n` elements.
    unsafe fn zero(&self, dst: DevPtr, n: usize);
    /// `dst += src`, elementwise over `n` values.
    /// # Safety
    /// `dst`, `src`: `n` elements each; they may be the same pointer.
    unsafe fn accumulate(&self, dst: DevPtr, src: DevPtr, n: usize);
    /// `out = a + b`, elementwise over `n` values, in one pass.
    /// # Safety
    /// `out`, `a`, `b`: `n` elements each; `out` distinct from both.
    unsafe fn add(&self, out: DevPtr, a: DevPtr, b: DevPtr, n: usize);
    /// `dst *= s`, elementwise over `n` values.
    /// # Safety
    /// `dst`: `n` elements.
    unsafe fn scale(&self, dst: DevPtr, n: usize, s: f32);

    // ---- layers: forward and backward ---------------------------------------------
    /// `out (B,T,C) = wte[tokens] + wpe[t]`; `tokens` is (B,T).
    /// # Safety
    /// `out`: B·T·C; `tokens`: B·T ids, each a row of `wte`; `wte`: (its rows)·C; `wpe`: T·C.
    #[allow(clippy::too_many_arguments)]
    unsafe fn encoder_forward(
        &self,
        out: DevPtr,
        tokens: DevPtr<i32>,
        wte: DevPtr,
        wpe: DevPtr,
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
        dout: DevPtr,
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
        out: DevPtr,
        inp: DevPtr,
        w: DevPtr,
        bias: Option<DevPtr>,
        bt: usize,
        c: usize,
        oc: usize,
    );
    /// # Safety
    /// As `matmul_forward`; `dinp`, `dw`, `dbias`, `dout` have the shapes of `inp`, `w`,
    /// `bias`, `out`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul_backward(
        &self,
        dinp: DevPtr,
        dw: DevPtr,
        dbias: Option<DevPtr>,
        dout: DevPtr,
        inp: DevPtr,
        w: DevPtr,
        bt: usize,
        c: usize,
        oc: usize,
    );

    /// out = (inp - mean) · rstd · w + b per row; saves mean (BT) and rstd (BT).
    /// # Safety
    /// `out`, `inp`: BT·C; `mean`, `rstd`: BT; `w`, `b`: C.
    #[allow(clippy::too_many_arguments)]
    unsafe fn layernorm_forward(
        &self,
        out: DevPtr,
        mean: DevPtr,
        rstd: DevPtr,
        inp: DevPtr,
        w: DevPtr,
        b: DevPtr,
        bt: usize,
        c: usize,
    );
    /// # Safety
    /// As `layernorm_forward`; `dinp`, `dout`: BT·C; `dw`, `db`: C.
    #[allow(clippy::too_many_arguments)]
    unsafe fn layernorm_backward(
        &self,
        dinp: DevPtr,
        dw: DevPtr,
        db: DevPtr,
        dout: DevPtr,
        inp: DevPtr,
        w: DevPtr,
        mean: DevPtr,
        rstd: DevPtr,
        bt: usize,
        c: usize,
    );

    /// Elements of saved state `attention_forward` needs for its backward (the backend
    /// chooses: full probabilities on the CPU, log-sum-exp rows in a flash kernel).
    fn attention_saved_len(&self, b: usize, t: usize, nh: usize) -> usize;
    /// Causal multi-head self-attention: qkv (B,T,3C) → out (B,T,C).
    /// # Safety
    /// `out`: B·T·C; `saved`: `attention_saved_len(b, t, nh)`; `qkv`: B·T·3C; `nh` divides C.
    #[allow(clippy::too_many_arguments)]
    unsafe fn attention_forward(
        &self,
        out: DevPtr,
        saved: DevPtr,
        qkv: DevPtr,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    );
    /// # Safety
    /// As `attention_forward`; `dqkv`: B·T·3C; `dout`: B·T·C.
    #[allow(clippy::too_many_arguments)]
    unsafe fn attention_backward(
        &self,
        dqkv: DevPtr,
        dout: DevPtr,
        qkv: DevPtr,
        out: DevPtr,
        saved: DevPtr,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    );

    /// GELU, tanh approximation (GPT-2's).
    /// # Safety
    /// `out`, `inp`: `n` elements each.
    unsafe fn gelu_forward(&self, out: DevPtr, inp: DevPtr, n: usize);
    /// # Safety
    /// `dinp`, `inp`, `dout`: `n` elements each.
    unsafe fn gelu_backward(&self, dinp: DevPtr, inp: DevPtr, dout: DevPtr, n: usize);

    /// `losses (BT) = -log softmax(logits[:, :V])[target]`, logits (BT,Vp), targets (BT).
    /// # Safety
    /// `losses`: BT; `logits`: BT·Vp; `targets`: BT ids, each below V; V ≤ Vp.
    #[allow(clippy::too_many_arguments)]
    unsafe fn crossentropy_forward(
        &self,
        losses: DevPtr,
        logits: DevPtr,
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
        dlogits: DevPtr,
        logits: DevPtr,
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
        logits: DevPtr,
        losses: DevPtr,
        targets: DevPtr<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
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
    /// Reads Σg² from `sumsq[0]`; writes the global norm to `out[0]` and the factor that
    /// clips it to `max_norm` (1 when already under, or when `max_norm` ≤ 0) to `out[1]`.
    /// # Safety
    /// `out`: 2; `sumsq`: 1.
    unsafe fn clip_factor(&self, out: DevPtr, sumsq: DevPtr, max_norm: f32);
    /// One AdamW update of `n` parameters; gradients are first multiplied by
    /// `grad_scale[0]` (the clipping factor, kept on the device).
    /// # Safety
    /// `params`, `grads`, `m`, `v`: `n` elements each; `grad_scale`: 1.
    #[allow(clippy::too_many_arguments)]
    unsafe fn adamw(
        &self,
        params: DevPtr,
        grads: DevPtr,
        m: DevPtr,
        v: DevPtr,
        n: usize,
        grad_scale: DevPtr,
        hp: AdamWStep,
    );
}
