//! The hardware boundary. Everything above this module (tensors, autograd, the model,
//! the optimiser, the training loop) is written once against the [`Backend`] trait; the
//! CPU backend (rayon + `gemm`) and the CUDA backend (cudarc) are its two implementations.
//!
//! Memory model, llm.c style: a backend hands out buffers of 4-byte words and every op
//! takes raw [`DevPtr`]s plus its dimensions. Activations are f32; token ids are stored
//! as i32 in the same kind of buffer. Backward ops always ACCUMULATE (`+=`) into their
//! gradient outputs; callers zero gradients first.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_disabled.rs"]
pub mod cuda;
mod fastmath;

use crate::error::Result;

/// Address of a 4-byte word in a backend's memory (a host address on the CPU, a
/// `CUdeviceptr` on the GPU). Offsets are counted in words, never in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DevPtr(pub u64);

impl DevPtr {
    /// The pointer `words` 4-byte words further on.
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, words: usize) -> DevPtr {
        DevPtr(self.0 + 4 * words as u64)
    }
}

/// An owned allocation; freed on drop.
pub trait DeviceBuffer {
    fn ptr(&self) -> DevPtr;
    /// Length in 4-byte words.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
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
    type Buffer: DeviceBuffer;

    /// Short human name, e.g. "cpu (2 threads)" or "NVIDIA H100 80GB HBM3".
    fn name(&self) -> String;

    // ---- memory ---------------------------------------------------------------------
    /// A zero-filled buffer of `words` 4-byte words.
    fn alloc(&self, words: usize) -> Result<Self::Buffer>;
    fn upload_f32(&self, dst: DevPtr, src: &[f32]) -> Result<()>;
    fn upload_i32(&self, dst: DevPtr, src: &[i32]) -> Result<()>;
    fn download_f32(&self, src: DevPtr, dst: &mut [f32]) -> Result<()>;
    fn zero(&self, dst: DevPtr, n: usize);
    /// `dst += src`, elementwise over `n` values.
    fn accumulate(&self, dst: DevPtr, src: DevPtr, n: usize);
    /// `out = a + b`, elementwise over `n` values, in one pass (`out` distinct from both).
    fn add(&self, out: DevPtr, a: DevPtr, b: DevPtr, n: usize);
    /// `dst *= s`, elementwise over `n` values.
    fn scale(&self, dst: DevPtr, n: usize, s: f32);
    /// Wait until all queued work is done (a no-op on the CPU).
    fn synchronize(&self) -> Result<()>;
    /// Highest memory in use so far, in bytes (device memory on a GPU, RSS on the CPU).
    fn peak_memory_bytes(&self) -> u64;

    // ---- layers: forward and backward ---------------------------------------------
    /// out (B,T,C) = wte[tokens] + wpe[t]; `tokens` is (B,T) i32.
    #[allow(clippy::too_many_arguments)]
    fn encoder_forward(&self, out: DevPtr, tokens: DevPtr, wte: DevPtr, wpe: DevPtr, b: usize, t: usize, c: usize);
    #[allow(clippy::too_many_arguments)]
    fn encoder_backward(&self, dwte: DevPtr, dwpe: DevPtr, dout: DevPtr, tokens: DevPtr, b: usize, t: usize, c: usize);

    /// out (BT,OC) = inp (BT,C) · wᵀ + bias, with w (OC,C) as in PyTorch's Linear.
    #[allow(clippy::too_many_arguments)]
    fn matmul_forward(&self, out: DevPtr, inp: DevPtr, w: DevPtr, bias: Option<DevPtr>, bt: usize, c: usize, oc: usize);
    #[allow(clippy::too_many_arguments)]
    fn matmul_backward(
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
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
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
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
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

    /// Words of saved state `attention_forward` needs for its backward (the backend
    /// chooses: full probabilities on the CPU, log-sum-exp rows in a flash kernel).
    fn attention_saved_len(&self, b: usize, t: usize, nh: usize) -> usize;
    /// Causal multi-head self-attention: qkv (B,T,3C) → out (B,T,C).
    #[allow(clippy::too_many_arguments)]
    fn attention_forward(&self, out: DevPtr, saved: DevPtr, qkv: DevPtr, b: usize, t: usize, c: usize, nh: usize);
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
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
    fn gelu_forward(&self, out: DevPtr, inp: DevPtr, n: usize);
    fn gelu_backward(&self, dinp: DevPtr, inp: DevPtr, dout: DevPtr, n: usize);

    /// losses (BT) = -log softmax(logits[:, :V])[target], logits (BT,Vp), targets (BT) i32.
    fn crossentropy_forward(&self, losses: DevPtr, logits: DevPtr, targets: DevPtr, bt: usize, v: usize, vp: usize);
    /// dlogits += (softmax(logits) - onehot(target)) · dloss, with dloss a scalar per row.
    #[allow(clippy::too_many_arguments)]
    fn crossentropy_backward(
        &self,
        dlogits: DevPtr,
        logits: DevPtr,
        targets: DevPtr,
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
    #[allow(clippy::too_many_arguments)]
    fn crossentropy_backward_in_place(
        &self,
        logits: DevPtr,
        losses: DevPtr,
        targets: DevPtr,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    );

    // ---- reductions and the optimiser ---------------------------------------------
    /// out[0] = mean of `inp[0..n]` (a fixed reduction order on the CPU).
    fn mean(&self, out: DevPtr, inp: DevPtr, n: usize);
    /// out[0] += Σ inp[i]² over `n` values.
    fn sum_squares(&self, out: DevPtr, inp: DevPtr, n: usize);
    /// Reads Σg² from `sumsq[0]`; writes the global norm to `out[0]` and the factor that
    /// clips it to `max_norm` (1 when already under, or when `max_norm` ≤ 0) to `out[1]`.
    fn clip_factor(&self, out: DevPtr, sumsq: DevPtr, max_norm: f32);
    /// One AdamW update of `n` parameters; gradients are first multiplied by
    /// `grad_scale[0]` (the clipping factor, kept on the device).
    #[allow(clippy::too_many_arguments)]
    fn adamw(&self, params: DevPtr, grads: DevPtr, m: DevPtr, v: DevPtr, n: usize, grad_scale: DevPtr, hp: AdamWStep);
}
