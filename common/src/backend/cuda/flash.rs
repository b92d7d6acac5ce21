//! Launchers of the flash attention kernels (`kernels/flash_attention.cuh`): forward keeps the
//! output and a base-2 log-sum-exp per row, (B,NH,T); backward computes delta = rowsum(dout·out)
//! into scratch, then dK/dV per key tile and dQ per query tile. Kernels exist for head sizes up
//! to 128 (padded to 16/32/64/128); `fp32` uses the 3xTF32 split, `tf32` plain TF32.
//!
//! bf16: `kernels/flash_bf16.cuh`, bf16 tiles and bf16 tensor-core products (mma.sync
//! m16n8k16); on Hopper, for head size 64 with 16-byte-aligned rows, `kernels/flash_wgmma.cuh`
//! instead: the same schedule on warpgroup products (wgmma) that read their right operand, and
//! in the forward q too, from shared memory, and a backward that writes the model's dqkv
//! rather than adding into a zeroed one. `docs/kernels.md` describes both.

use super::memory::device_err;
use super::{args, blocks, Arg, CudaBackend};
use crate::backend::Precision;
use crate::backend::{Act, Backend as _, DevPtr, Span};
use crate::error::{Error, Result};
use cudarc::driver::{result as driver, sys as driver_sys};

const THREADS: u32 = 128;
/// Query (forward, dQ) or key (dK/dV) rows per block.
const ROWS_PER_BLOCK: usize = 64;

/// The kernels for head size `hs`: their name suffix (the padded size, then the TF32 split or
/// `bf16`), how many elements of how many bytes one vector copy moves, and the query rows per
/// block of the forward (the bf16 forward gives each warp two 16-row tiles up to head size 64:
/// `Fwd16` in flash_bf16.cuh).
struct Variant {
    suffix: String,
    vector: (usize, usize),
    forward_rows: usize,
}

/// The largest head size the flash kernels run.
pub(super) const LARGEST_HEAD: usize = 128;

/// `wgmma`: the Hopper kernels may run (an sm_90a build, head size 64, rows 16-byte aligned).
fn variant(hs: usize, precision: Precision, wgmma: bool) -> Result<Variant> {
    let d = match hs {
        1..=16 => 16,
        17..=32 => 32,
        33..=64 => 64,
        65..=LARGEST_HEAD => LARGEST_HEAD,
        _ => {
            // `Backend::attention_refuses` says so before anything runs; this is the backstop.
            return Err(Error::Device(format!(
                "flash attention supports head sizes 1..={LARGEST_HEAD}, not {hs} (set GPT2_CUDA_ATTENTION=gemm)"
            )));
        }
    };
    Ok(match precision {
        Precision::Bf16 if wgmma && hs == 64 => Variant {
            suffix: "d64_wgmma".into(),
            vector: (8, 2),
            forward_rows: ROWS_PER_BLOCK,
        },
        Precision::Bf16 => Variant {
            suffix: format!("d{d}_bf16"),
            vector: (8, 2),
            forward_rows: if d <= 64 { 128 } else { 64 },
        },
        Precision::Tf32 => Variant {
            suffix: format!("d{d}_s1"),
            vector: (4, 4),
            forward_rows: ROWS_PER_BLOCK,
        },
        Precision::Fp32 => Variant {
            suffix: format!("d{d}_s3"),
            vector: (4, 4),
            forward_rows: ROWS_PER_BLOCK,
        },
    })
}

/// 1 when the kernels may copy rows `n` elements of `bytes` at a time: head size (hence every
/// row stride) a multiple of `n` and every matrix aligned to the copy; else 0 (one at a time).
fn vectorizable(hs: usize, ptrs: &[DevPtr<Act>], (n, bytes): (usize, usize)) -> usize {
    let width = (n * bytes) as u64;
    (hs.is_multiple_of(n) && ptrs.iter().all(|p| p.addr().is_multiple_of(width))) as usize
}

/// Loop tiles in flight in the Hopper backward kernels: 2 (double buffering), which is faster
/// than 3 on an H100 (the third stage's shared memory leaves room for fewer blocks a
/// multiprocessor), so only 2 is built.
const PIPE_STAGES: usize = 2;

/// Dynamic shared memory of the Hopper backward kernels with `stages` tiles in flight: the
/// block's own two 64x64 bf16 tiles (k and v, or q and dout), two such tiles a stage (q and
/// dout, or k and v), dK/dV's 64 log-sum-exps and deltas a stage, and 1 KiB to align the tiles
/// to 1024 bytes.
fn pipe_shared_bytes(stages: usize, dkdv: bool) -> u32 {
    let tile = 64 * 64 * 2;
    let per_stage = 2 * tile + if dkdv { 2 * 64 * 4 } else { 0 };
    (2 * tile + stages * per_stage + 1024) as u32
}

/// Allows the Hopper backward kernels, where they were built, the dynamic shared memory
/// they take past the default 48 KiB: once, when the kernels are loaded (not between launches,
/// which a CUDA graph being recorded would refuse).
pub(super) fn allow_shared_memory(kernels: &super::nvrtc::Kernels) -> Result<()> {
    for suffix in ["wgmma", "wgmma_store", "wgmma_store_bias", "wgmma_store_fp8"] {
        for (kernel, dkdv) in [("dkdv", true), ("dq", false)] {
            let name = format!("flash_backward_{kernel}_d64_{suffix}");
            let Some(function) = kernels.get(&name) else { continue };
            let bytes = pipe_shared_bytes(PIPE_STAGES, dkdv);
            // SAFETY: a function of the current context's loaded module; an attribute, not a launch.
            unsafe {
                driver::function::set_function_attribute(
                    function,
                    driver_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
            }
            .map_err(|e| device_err(&format!("allowing {name} {bytes} bytes of shared memory"), e))?;
        }
    }
    Ok(())
}

/// The FP8 copies that the Hopper kernels write of a matrix as they store its tiles: dqkv's
/// E5M2 ones in backward (the qkv product's output gradient; `Fp8Copy` in flash_wgmma.cuh),
/// out's E4M3 ones in forward (the attention projection's input): where they go (laid out as
/// the matrix, and transposed), their amax word, their scale word.
#[derive(Clone, Copy, Default)]
pub(super) struct Fp8Copy {
    pub dst: DevPtr<u8>,
    pub dst_t: DevPtr<u8>,
    pub amax: DevPtr,
    pub scale: DevPtr,
}

impl CudaBackend {
    /// Whether the Hopper kernels (`flash_wgmma.cuh`) can take head size `hs` over `ptrs`.
    fn wgmma_fits(&self, hs: usize, ptrs: &[DevPtr<Act>]) -> bool {
        self.wgmma && hs == 64 && vectorizable(hs, ptrs, (8, 2)) == 1
    }

    /// (B·NH, tiles of `rows`): the tiles go in y, so they must fit its 65535 limit.
    fn flash_grid(&self, b: usize, t: usize, nh: usize, rows: usize) -> Result<(u32, u32, u32)> {
        let tiles = t.div_ceil(rows);
        let heads = b * nh;
        if tiles > 65_535 || heads > u32::MAX as usize {
            return Err(Error::Device(format!(
                "flash attention: T = {t} or B·NH = {heads} is past the grid limits"
            )));
        }
        Ok((heads as u32, tiles as u32, 1))
    }

    /// With `fp8`, out's E4M3 copies too where the Hopper kernel runs (T a multiple of 16, the
    /// copies aligned: 8 bytes, 16 transposed): returns whether it wrote them.
    ///
    /// # Safety
    /// The contract of [`Backend::attention_forward`](crate::backend::Backend::attention_forward);
    /// with `fp8`, that of `quantize_fp8_both` over out, (B·T, C).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attention_forward_flash(
        &self,
        out: DevPtr<Act>,
        lse: DevPtr,
        qkv: DevPtr<Act>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
        fp8: Option<Fp8Copy>,
    ) -> Result<bool> {
        let hs = super::attention::head_size(c, nh)?;
        if b * t == 0 {
            return Ok(fp8.is_some());
        }
        let v = variant(hs, self.precision, self.wgmma_fits(hs, &[qkv, out]))?;
        let scale_log2 = std::f32::consts::LOG2_E / (hs as f32).sqrt();
        let vec = vectorizable(hs, &[qkv], v.vector);
        let grid = self.flash_grid(b, t, nh, v.forward_rows)?;
        let fused = fp8.filter(|copy| {
            v.suffix == "d64_wgmma"
                && t.is_multiple_of(16)
                && copy.dst.addr().is_multiple_of(8)
                && copy.dst_t.addr().is_multiple_of(16)
        });
        match fused {
            Some(q) => self.try_launch(
                "flash_forward_d64_wgmma_fp8",
                grid,
                (THREADS, 1, 1),
                args![out, lse, qkv, t, nh, hs, scale_log2, vec, q.dst, q.dst_t, q.amax, q.scale],
            )?,
            None => self.try_launch(
                &format!("flash_forward_{}", v.suffix),
                grid,
                (THREADS, 1, 1),
                args![out, lse, qkv, t, nh, hs, scale_log2, vec],
            )?,
        }
        Ok(fused.is_some())
    }

    /// delta = rowsum(dout·out), then dK/dV per key tile and dQ per query tile, added into
    /// dqkv, or with `overwrite` in place of what it held: written over it by the Hopper
    /// kernels where they take the shape, otherwise zero-filled first and added into. With
    /// `dbias` (only with `overwrite`), `dbias += Σ_rows dqkv`: from the Hopper kernels' tiles
    /// as they store them (partial sums a tile of 64 positions, then those in order), or where
    /// they do not run, by the column sums reading dqkv back.
    ///
    /// # Safety
    /// The contract of [`Backend::attention_backward`](crate::backend::Backend::attention_backward);
    /// `dbias`: 3C f32s.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attention_backward_flash(
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
        overwrite: bool,
        dbias: Option<DevPtr>,
        fp8: Option<Fp8Copy>,
    ) -> Result<bool> {
        assert!(
            overwrite || (dbias.is_none() && fp8.is_none()),
            "a bias gradient or an FP8 copy from an overwritten dqkv only"
        );
        let hs = super::attention::head_size(c, nh)?;
        if b * t == 0 {
            return Ok(fp8.is_some());
        }
        let v = variant(hs, self.precision, self.wgmma_fits(hs, &[qkv, dout, dqkv]))?;
        let hopper = v.suffix == "d64_wgmma";
        let store = overwrite && hopper;
        if overwrite && !store {
            let n = b * t * 3 * c;
            // SAFETY: the caller's contract: dqkv is n live activations.
            self.zero_act(Span::from_raw_act(dqkv, n, self.act()), n);
        }
        // The Hopper kernels' bias partials, a row of 3C a tile of 64 positions, after delta.
        let tiles = b * t.div_ceil(ROWS_PER_BLOCK);
        let fused_bias = dbias.filter(|_| store);
        let part_words = if fused_bias.is_some() { tiles * 3 * c } else { 0 };
        let delta_words = (b * nh * t).next_multiple_of(4);
        let delta = self.scratch(delta_words + part_words)?;
        let part = delta.add(delta_words);
        // 8 values a thread and HS / 8 threads a head's row where HS and the rows allow, else
        // a warp a position; 256 threads a block.
        let rows_of_8 = (8 * self.act().bytes()) as u64;
        let vec8 = hs.is_multiple_of(8) && (hs / 8).is_power_of_two() && hs / 8 <= 32;
        let (kernel, grid) = if vec8 && [dout, out].iter().all(|p| p.addr().is_multiple_of(rows_of_8)) {
            ("flash_backward_delta_vec8_kernel", blocks(b * t * c / 8, 256))
        } else {
            ("flash_backward_delta_kernel", blocks(b * t, 8))
        };
        self.try_launch(kernel, grid, (256, 1, 1), args![delta, dout, out, b, t, nh, hs])?;
        let scale = 1.0 / (hs as f32).sqrt();
        let scale_log2 = std::f32::consts::LOG2_E * scale;
        let grid = self.flash_grid(b, t, nh, ROWS_PER_BLOCK)?;
        let vec = vectorizable(hs, &[qkv, dout], v.vector);
        let bwd_args = args![dqkv, dout, qkv, lse, delta, t, nh, hs, scale, scale_log2, vec];
        let fused_fp8 = fp8.filter(|_| store);
        if hopper {
            let suffix = match (store, fused_bias, fused_fp8) {
                (true, _, Some(_)) => "d64_wgmma_store_fp8",
                (true, Some(_), None) => "d64_wgmma_store_bias",
                (true, None, None) => "d64_wgmma_store",
                (false, _, _) => "d64_wgmma",
            };
            let bias_args = args![dqkv, dout, qkv, lse, delta, t, nh, hs, scale, scale_log2, vec, part];
            let bias_part = if fused_bias.is_some() { part } else { DevPtr::default() }; // none
            let copy = fused_fp8.unwrap_or_default();
            let fp8_args = args![
                dqkv, dout, qkv, lse, delta, t, nh, hs, scale, scale_log2, vec, bias_part, copy.dst, copy.dst_t,
                copy.amax, copy.scale
            ];
            for (kernel, dkdv) in [("dkdv", true), ("dq", false)] {
                let args: &[Arg] = match (fused_fp8, fused_bias) {
                    (Some(_), _) => fp8_args,
                    (None, Some(_)) => bias_args,
                    (None, None) => bwd_args,
                };
                self.try_launch_shared(
                    &format!("flash_backward_{kernel}_{suffix}"),
                    grid,
                    (THREADS, 1, 1),
                    pipe_shared_bytes(PIPE_STAGES, dkdv),
                    args,
                )?;
            }
        } else {
            for kernel in ["dkdv", "dq"] {
                self.try_launch(
                    &format!("flash_backward_{kernel}_{}", v.suffix),
                    grid,
                    (THREADS, 1, 1),
                    bwd_args,
                )?;
            }
        }
        match (fused_bias, dbias) {
            (Some(dbias), _) => self.finish_column_sums(&[dbias], part, tiles, 3 * c),
            (None, Some(dbias)) => self.column_sums(dbias, dqkv, b * t, 3 * c),
            (None, None) => {}
        }
        Ok(fused_fp8.is_some())
    }
}
