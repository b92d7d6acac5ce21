//! Launchers of the flash attention kernels (`kernels/flash_attention.cuh`): forward keeps the
//! output and a base-2 log-sum-exp per row, (B,NH,T); backward computes delta = rowsum(dout·out)
//! into scratch, then dK/dV per key tile and dQ per query tile. Kernels exist for head sizes up
//! to 128 (padded to 16/32/64/128); `fp32` uses the 3xTF32 split, `tf32` plain TF32.
//!
//! bf16 (first version): the operands are widened to f32 in scratch, the TF32 kernels run
//! (exact on bf16 inputs, whose 8 mantissa bits fit TF32's 10), and the results are rounded
//! back. Correct, but it moves the operands three more times and runs at TF32's rate: a
//! native bf16 kernel (m16n8k16) is the next step.

use super::{args, blocks, CudaBackend};
use crate::backend::{Act, DevPtr};
use crate::backend::Precision;
use crate::error::{Error, Result};

const THREADS: u32 = 128;
/// Query (forward, dQ) or key (dK/dV) rows per block.
const ROWS_PER_BLOCK: usize = 64;

/// Kernel name suffix for head size `hs`: the padded size and the TF32 split.
fn variant(hs: usize, precision: Precision) -> Result<String> {
    let d = match hs {
        1..=16 => 16,
        17..=32 => 32,
        33..=64 => 64,
        65..=128 => 128,
        _ => {
            return Err(Error::Device(format!(
                "flash attention supports head sizes 1..=128, not {hs} (set GPT2_CUDA_ATTENTION=gemm)"
            )))
        }
    };
    let split = match precision {
        Precision::Fp32 => 3,
        Precision::Tf32 | Precision::Bf16 => 1,
    };
    Ok(format!("d{d}_s{split}"))
}

/// 1 when the kernels may copy rows in 16-byte pieces: head size (hence every row stride) a
/// multiple of 4 floats and every matrix 16-byte aligned; else 0 (4-byte loads).
fn vectorizable(hs: usize, ptrs: &[DevPtr]) -> usize {
    (hs.is_multiple_of(4) && ptrs.iter().all(|p| p.addr().is_multiple_of(16))) as usize
}

impl CudaBackend {
    /// Attention forward on bf16 operands through the f32 kernels (see the module's note).
    ///
    /// # Safety
    /// The contract of [`Backend::attention_forward`](crate::backend::Backend::attention_forward).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attention_forward_bf16(
        &self,
        out: DevPtr<Act>,
        lse: DevPtr,
        qkv: DevPtr<Act>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) -> Result<()> {
        let n = b * t * c;
        let qkv32 = self.scratch_in(&self.convert_scratch, 4 * n)?;
        let out32 = qkv32.add(3 * n);
        self.try_launch_1d("act_to_f32_kernel", 3 * n, args![qkv32, qkv, 3 * n])?;
        self.attention_forward_flash(out32, lse, qkv32, b, t, c, nh)?;
        self.try_launch_1d("f32_to_act_kernel", n, args![out, out32, n])
    }

    /// Attention backward on bf16 operands through the f32 kernels; `dqkv` accumulates.
    ///
    /// # Safety
    /// The contract of [`Backend::attention_backward`](crate::backend::Backend::attention_backward).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attention_backward_bf16(
        &self,
        dqkv: DevPtr<Act>,
        dout: DevPtr<Act>,
        qkv: DevPtr<Act>,
        out: DevPtr<Act>,
        lse: DevPtr,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) -> Result<()> {
        let n = b * t * c;
        let qkv32 = self.scratch_in(&self.convert_scratch, 8 * n)?;
        let (out32, dout32, dqkv32) = (qkv32.add(3 * n), qkv32.add(4 * n), qkv32.add(5 * n));
        self.try_launch_1d("act_to_f32_kernel", 3 * n, args![qkv32, qkv, 3 * n])?;
        self.try_launch_1d("act_to_f32_kernel", n, args![out32, out, n])?;
        self.try_launch_1d("act_to_f32_kernel", n, args![dout32, dout, n])?;
        crate::backend::Backend::zero(self, dqkv32, 3 * n);
        self.attention_backward_flash(dqkv32, dout32, qkv32, out32, lse, b, t, c, nh)?;
        self.try_launch_1d("accumulate_f32_into_act_kernel", 3 * n, args![dqkv, dqkv32, 3 * n])
    }

    /// (B·NH, row tiles): the tiles go in y, so they must fit its 65535 limit.
    fn flash_grid(&self, b: usize, t: usize, nh: usize) -> Result<(u32, u32, u32)> {
        let tiles = t.div_ceil(ROWS_PER_BLOCK);
        let heads = b * nh;
        if tiles > 65_535 || heads > u32::MAX as usize {
            return Err(Error::Device(format!(
                "flash attention: T = {t} or B·NH = {heads} is past the grid limits"
            )));
        }
        Ok((heads as u32, tiles as u32, 1))
    }

    /// # Safety
    /// The contract of [`Backend::attention_forward`](crate::backend::Backend::attention_forward).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attention_forward_flash(
        &self,
        out: DevPtr,
        lse: DevPtr,
        qkv: DevPtr,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) -> Result<()> {
        let hs = super::attention::head_size(c, nh)?;
        if b * t == 0 {
            return Ok(());
        }
        let name = format!("flash_forward_{}", variant(hs, self.precision)?);
        let scale_log2 = std::f32::consts::LOG2_E / (hs as f32).sqrt();
        let vec = vectorizable(hs, &[qkv]);
        self.try_launch(
            &name,
            self.flash_grid(b, t, nh)?,
            (THREADS, 1, 1),
            args![out, lse, qkv, t, nh, hs, scale_log2, vec],
        )
    }

    /// # Safety
    /// The contract of [`Backend::attention_backward`](crate::backend::Backend::attention_backward).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attention_backward_flash(
        &self,
        dqkv: DevPtr,
        dout: DevPtr,
        qkv: DevPtr,
        out: DevPtr,
        lse: DevPtr,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) -> Result<()> {
        let hs = super::attention::head_size(c, nh)?;
        if b * t == 0 {
            return Ok(());
        }
        let suffix = variant(hs, self.precision)?;
        let rows = b * nh * t;
        let delta = self.scratch(rows)?;
        self.try_launch(
            "flash_backward_delta_kernel",
            blocks(rows, 256),
            (256, 1, 1),
            args![delta, dout, out, b, t, nh, hs],
        )?;
        let scale = 1.0 / (hs as f32).sqrt();
        let scale_log2 = std::f32::consts::LOG2_E * scale;
        let grid = self.flash_grid(b, t, nh)?;
        let vec = vectorizable(hs, &[qkv, dout]);
        let bwd_args = args![dqkv, dout, qkv, lse, delta, t, nh, hs, scale, scale_log2, vec];
        self.try_launch(
            &format!("flash_backward_dkdv_{suffix}"),
            grid,
            (THREADS, 1, 1),
            bwd_args,
        )?;
        self.try_launch(&format!("flash_backward_dq_{suffix}"), grid, (THREADS, 1, 1), bwd_args)
    }
}
