//! Causal self-attention with two batched GEMMs per direction (llm.c's fp32 CUDA path):
//! permute qkv into q, k, v (B,NH,T,HS), att = softmax(q·kᵀ/√HS) kept in `saved`
//! (B,NH,T,T), y = att·v, unpermute. Intermediates live in the backend's reused scratch.
//! `GPT2_CUDA_ATTENTION=gemm` runs it instead of the flash kernels (`flash.rs`): in f32 only,
//! an fp32 reference for them, and for head sizes past the flash kernels' largest.

use super::blas::Gemm;
use super::{args, blocks, CudaBackend, THREADS};
use crate::backend::{ActType, DevPtr};
use crate::error::{Error, Result};

/// Column-major batched GEMM over the B·NH heads, all operands with stride = one matrix.
#[allow(clippy::too_many_arguments)]
fn heads_gemm(
    trans_a: bool,
    trans_b: bool,
    (m, n, k): (usize, usize, usize),
    (a, lda, stride_a): (DevPtr, usize, usize),
    (b, ldb, stride_b): (DevPtr, usize, usize),
    (c, ldc, stride_c): (DevPtr, usize, usize),
    batch: usize,
) -> Gemm {
    Gemm {
        ab: ActType::F32,
        c_type: ActType::F32,
        trans_a,
        trans_b,
        m,
        n,
        k,
        a,
        lda,
        stride_a,
        b,
        ldb,
        stride_b,
        beta: 0.0,
        c,
        ldc,
        stride_c,
        batch,
    }
}

pub(super) fn head_size(c: usize, nh: usize) -> Result<usize> {
    if nh == 0 || !c.is_multiple_of(nh) {
        return Err(Error::Device(format!(
            "attention: C = {c} is not a multiple of NH = {nh}"
        )));
    }
    Ok(c / nh)
}

impl CudaBackend {
    /// # Safety
    /// `q`, `k`, `v`: B·NH·T·HS each; `qkv`: B·T·3·NH·HS.
    #[allow(clippy::too_many_arguments)]
    unsafe fn permute(&self, q: DevPtr, k: DevPtr, v: DevPtr, qkv: DevPtr, b: usize, t: usize, nh: usize, hs: usize) {
        let grid = blocks(b * t * nh * hs, THREADS);
        self.launch(
            "attention_permute_kernel",
            grid,
            (THREADS as u32, 1, 1),
            args![q, k, v, qkv, b, t, nh, hs],
        );
    }

    /// # Safety
    /// The contract of [`Backend::attention_forward`](crate::backend::Backend::attention_forward).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attention_forward_gemm(
        &self,
        out: DevPtr,
        saved: DevPtr,
        qkv: DevPtr,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) -> Result<()> {
        let hs = head_size(c, nh)?;
        let n = b * t * c;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let q = self.scratch(4 * n)?;
        let (k, v, y) = (q.add(n), q.add(2 * n), q.add(3 * n));
        let (heads, th, tt) = (b * nh, t * hs, t * t);
        let block = (THREADS as u32, 1, 1);

        self.permute(q, k, v, qkv, b, t, nh, hs);
        // pre (T,T) row-major = q · kᵀ, i.e. column-major preᵀ = kᵀ · q, into `saved`.
        self.blas.gemm(&heads_gemm(
            true,
            false,
            (t, t, hs),
            (k, hs, th),
            (q, hs, th),
            (saved, t, tt),
            heads,
        ))?;
        let scale = 1.0 / (hs as f32).sqrt();
        let rows = heads * t;
        let grid = blocks(rows, THREADS / 32);
        self.launch(
            "attention_softmax_forward_kernel",
            grid,
            block,
            args![saved, rows, t, scale],
        );
        // y (T,HS) row-major = att · v, i.e. column-major yᵀ = vᵀ · attᵀ.
        self.blas.gemm(&heads_gemm(
            false,
            false,
            (hs, t, t),
            (v, hs, th),
            (saved, t, tt),
            (y, hs, th),
            heads,
        ))?;
        self.launch(
            "attention_unpermute_kernel",
            blocks(n, THREADS),
            block,
            args![out, y, b, t, nh, hs],
        );
        Ok(())
    }

    /// # Safety
    /// The contract of [`Backend::attention_backward`](crate::backend::Backend::attention_backward).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attention_backward_gemm(
        &self,
        dqkv: DevPtr,
        dout: DevPtr,
        qkv: DevPtr,
        saved: DevPtr,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) -> Result<()> {
        let hs = head_size(c, nh)?;
        let n = b * t * c;
        if n == 0 {
            return Ok(());
        }
        let (heads, th, tt) = (b * nh, t * hs, t * t);
        self.bind()?;
        let q = self.scratch(7 * n + heads * tt)?;
        let (k, v, dq, dk, dv, dy) = (
            q.add(n),
            q.add(2 * n),
            q.add(3 * n),
            q.add(4 * n),
            q.add(5 * n),
            q.add(6 * n),
        );
        let datt = q.add(7 * n);
        let block = (THREADS as u32, 1, 1);

        self.permute(q, k, v, qkv, b, t, nh, hs);
        self.launch(
            "attention_unpermute_backward_kernel",
            blocks(n, THREADS),
            block,
            args![dy, dout, b, t, nh, hs],
        );
        // datt (T,T) = dy · vᵀ; dv (T,HS) = attᵀ · dy.
        self.blas.gemm(&heads_gemm(
            true,
            false,
            (t, t, hs),
            (v, hs, th),
            (dy, hs, th),
            (datt, t, tt),
            heads,
        ))?;
        self.blas.gemm(&heads_gemm(
            false,
            true,
            (hs, t, t),
            (dy, hs, th),
            (saved, t, tt),
            (dv, hs, th),
            heads,
        ))?;
        // Through the softmax (in place, scale folded in): datt -> dpre.
        let scale = 1.0 / (hs as f32).sqrt();
        let rows = heads * t;
        let grid = blocks(rows, THREADS / 32);
        self.launch(
            "attention_softmax_backward_kernel",
            grid,
            block,
            args![datt, saved, rows, t, scale],
        );
        // dq (T,HS) = dpre · k; dk (T,HS) = dpreᵀ · q.
        self.blas.gemm(&heads_gemm(
            false,
            false,
            (hs, t, t),
            (k, hs, th),
            (datt, t, tt),
            (dq, hs, th),
            heads,
        ))?;
        self.blas.gemm(&heads_gemm(
            false,
            true,
            (hs, t, t),
            (q, hs, th),
            (datt, t, tt),
            (dk, hs, th),
            heads,
        ))?;
        let grid = blocks(n, THREADS);
        self.launch(
            "attention_permute_backward_kernel",
            grid,
            block,
            args![dqkv, dq, dk, dv, b, t, nh, hs],
        );
        Ok(())
    }
}
