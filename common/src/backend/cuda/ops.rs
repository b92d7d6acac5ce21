//! [`Backend`] and [`FusedMlp`] for [`CudaBackend`]: one launcher per op, named and ordered as
//! its CPU twin. Each op checks its operands ([`contract`]) before it queues anything; ops that
//! return nothing queue their work and latch the first failure for `synchronize`.

use cudarc::driver::{result as driver, sys as driver_sys};

use super::blas::Gemm;
use super::memory::device_err;
use super::Arg;
use super::Recording;
use super::{args, blocks, mlp_tiled, AttentionPath, CudaBackend, CudaBuffer, MAX_REDUCE_BLOCKS, THREADS};
use crate::backend::contract;

/// Rows a block of `quantize_fp8_transposed_kernel` covers (kernels/fp8.cu's FP8_T_ROWS).
const FP8_T_ROWS: usize = 32;
use crate::backend::{
    bf16, gelu_backward_fp8_apart, matmul_fp8_gelu_apart, Act, ActType, AdamWHyper, Backend, DevPtr, DeviceBuffer,
    DeviceStream, Elem, Fp8, Fp8Out, FusedMlp, Overwrite, Precision, SgdHyper, Snapshot, Span,
};
use crate::error::{Error, Result};
use std::ops::Range;

/// Rows (one warp each) per block for the row-wise kernels.
const ROWS_PER_BLOCK: usize = THREADS / 32;
/// Threads of a block of `attention_cached_kernel` (one per query and head): groups of HS
/// threads, one output channel each, share the keys (kernels/kv_cache.cu).
const CACHED_THREADS: u32 = 256;
/// Rows per block of the column reductions (layernorm dw/db, matmul dbias).
const COLUMN_CHUNK_ROWS: usize = 256;

/// Rows per block of the float4 column reductions (fewer, fuller blocks).
const VEC4_CHUNK_ROWS: usize = 512;

/// Positions of `order` a warp of the chunked wte gradient takes (`WTE_CHUNK` in
/// kernels/encoder.cu).
const WTE_CHUNK: usize = 32;

/// Rows a block of the one-pass layernorm backward takes (8 warps, 8 rows each): GPT-2's
/// B·T = 16K rows give 256 blocks, about two a multiprocessor.
const LN_FUSED_ROWS: usize = 64;

/// The one-pass layernorm backward (`layernorm_backward_fused_k{K}_kernel`: dinp and the
/// parameter sums' partials from one read of dout and inp): its K, the float4
/// columns a lane holds (instances for C up to 768, 1024, 1280, 1664), where C and the rows
/// allow 4-element loads; `None` leaves the two-pass kernels.
fn fused_layernorm_width(c: usize, ptrs: &[DevPtr<Act>], act: ActType) -> Option<usize> {
    if !vec4_rows(c, ptrs, act) {
        return None;
    }
    [6, 8, 10, 13].into_iter().find(|&k| c <= 128 * k)
}

/// Shared memory a block may stage an FP8 copy in before storing it transposed
/// (`add_layernorm_forward_quantize_t_kernel`), under the 48 KiB a block has without asking.
const FP8_TILE_BYTES: usize = 40 << 10;

/// Rows of an (bt, c) FP8 copy a block stages at a time: 32, or 16 where 32 rows do not fit
/// FP8_TILE_BYTES, whole blocks of them in bt; `None` where no such rows fit.
fn fp8_tile_rows(bt: usize, c: usize) -> Option<usize> {
    [32, 16]
        .into_iter()
        .find(|&rows| rows * c <= FP8_TILE_BYTES && bt.is_multiple_of(rows))
}

/// A kernel launch's grid and block.
type LaunchShape = ((u32, u32, u32), (u32, u32, u32));

/// Grid and block of a column reduction over an (n, c) matrix: 32 columns × 8 row lanes;
/// blockIdx.y is the chunk of COLUMN_CHUNK_ROWS rows whose partial sums a block writes.
fn column_reduce_launch(n: usize, c: usize) -> LaunchShape {
    let grid = (c.div_ceil(32) as u32, n.div_ceil(COLUMN_CHUNK_ROWS) as u32, 1);
    (grid, (32, 8, 1))
}

/// The float4 column reductions: 128 columns × 8 warps per block, when `c` and every
/// matrix allow loads of 4 elements of `act` at once.
fn vec4_column_reduce(n: usize, c: usize, ptrs: &[DevPtr<Act>], act: ActType) -> Option<LaunchShape> {
    let aligned = vec4_rows(c, ptrs, act);
    let grid = (c.div_ceil(128) as u32, n.div_ceil(VEC4_CHUNK_ROWS) as u32, 1);
    aligned.then_some((grid, (256, 1, 1)))
}

/// Whether rows of `c` activations at these pointers may be read 4 elements at a time.
fn vec4_rows(c: usize, ptrs: &[DevPtr<Act>], act: ActType) -> bool {
    let width = 4 * act.bytes() as u64;
    c.is_multiple_of(4) && ptrs.iter().all(|p| p.addr().is_multiple_of(width))
}

impl CudaBackend {
    /// `outs[j][c] += Σ_k partials[j · chunks + k, c]` over `chunks` rows of per-chunk column sums,
    /// in order: the second, deterministic pass of a column reduction (no atomics), for up to
    /// three reductions (one launch; their partials one after another).
    ///
    /// # Safety
    /// Each of `outs`: `c` values; `partials`: `outs.len() · chunks · c`.
    pub(super) unsafe fn finish_column_sums(&self, outs: &[DevPtr], partials: DevPtr, chunks: usize, c: usize) {
        assert!((1..=3).contains(&outs.len()), "one to three column reductions a launch");
        let grid = (c.div_ceil(32) as u32, outs.len() as u32, 1);
        let out = |j: usize| outs.get(j).copied().unwrap_or_default(); // null: not launched
        self.launch(
            "column_sums_finish_kernel",
            grid,
            (32, 8, 1),
            args![out(0), out(1), out(2), partials, chunks, c],
        );
    }

    /// Queues a cuBLASLt product with a fused epilogue on the bound context (`epilogue`
    /// returns whether an algorithm takes the shape): `true` when the call is done with
    /// (queued, or failed with the failure latched for `synchronize`), `false` when the
    /// caller runs the unfused kernels instead.
    fn fused_epilogue(&self, epilogue: impl FnOnce() -> Result<bool>) -> bool {
        match self.bind().and_then(|()| epilogue()) {
            Ok(taken) => taken,
            Err(e) => {
                self.fail(e);
                true
            }
        }
    }

    /// `layernorm_backward`, and with `copy` the updated dinp also written there (OVERWRITTEN)
    /// by the same kernel: `add_layernorm_backward`'s second input gradient; with `dinp_sums`,
    /// `dinp_sums += Σ_rows dinp` (its new value): `add_layernorm_backward`'s `dbias`.
    ///
    /// # Safety
    /// As `layernorm_backward`; `copy`: BT·C activations, overlapping no other operand;
    /// `dinp_sums`: C f32s.
    #[allow(clippy::too_many_arguments)]
    unsafe fn layernorm_backward_with(
        &self,
        dinp: DevPtr<Act>,
        copy: Option<DevPtr<Act>>,
        dinp_sums: Option<DevPtr>,
        dw: DevPtr,
        db: DevPtr,
        dout: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        mean: DevPtr,
        rstd: DevPtr,
        bt: usize,
        c: usize,
    ) {
        let copy = copy.unwrap_or_default(); // null: no copy
        if let Some(k) = fused_layernorm_width(c, &[dinp, copy, dout, inp, w], self.act()) {
            // One pass: dinp and the blocks' partial parameter sums (and dinp's own), then the
            // sums in order.
            let chunks = bt.div_ceil(LN_FUSED_ROWS);
            let outs: &[DevPtr] = match dinp_sums {
                Some(sums) => &[dw, db, sums],
                None => &[dw, db],
            };
            match self.scratch(outs.len() * chunks * c) {
                Ok(dw_part) => {
                    let (db_part, sums_part) = (dw_part.add(chunks * c), dw_part.add(2 * chunks * c));
                    let (name, sums_part) = match dinp_sums {
                        Some(_) => (format!("layernorm_backward_fused_k{k}_sum_kernel"), sums_part),
                        None => (format!("layernorm_backward_fused_k{k}_kernel"), DevPtr::default()),
                    };
                    self.launch(
                        &name,
                        (chunks as u32, 1, 1),
                        (256, 1, 1),
                        args![
                            dinp,
                            copy,
                            dw_part,
                            db_part,
                            sums_part,
                            dout,
                            inp,
                            w,
                            mean,
                            rstd,
                            bt,
                            c,
                            LN_FUSED_ROWS
                        ],
                    );
                    self.finish_column_sums(outs, dw_part, chunks, c);
                }
                Err(e) => self.fail(e),
            }
        } else {
            let grid = blocks(bt, ROWS_PER_BLOCK);
            let args = args![dinp, copy, dout, inp, w, mean, rstd, bt, c];
            let name = if vec4_rows(c, &[dinp, copy, dout, inp, w], self.act()) {
                "layernorm_backward_dinp_vec4_kernel"
            } else {
                "layernorm_backward_dinp_kernel"
            };
            self.launch(name, grid, (THREADS as u32, 1, 1), args);
            let (name, (grid, block), rows) = match vec4_column_reduce(bt, c, &[dout, inp], self.act()) {
                Some(shape) => ("layernorm_backward_params_vec4_kernel", shape, VEC4_CHUNK_ROWS),
                None => (
                    "layernorm_backward_params_kernel",
                    column_reduce_launch(bt, c),
                    COLUMN_CHUNK_ROWS,
                ),
            };
            let chunks = bt.div_ceil(rows);
            match self.scratch(2 * chunks * c) {
                Ok(dw_part) => {
                    let db_part = dw_part.add(chunks * c);
                    self.launch(
                        name,
                        grid,
                        block,
                        args![dw_part, db_part, dout, inp, mean, rstd, bt, c, rows],
                    );
                    self.finish_column_sums(&[dw, db], dw_part, chunks, c);
                }
                Err(e) => return self.fail(e),
            }
            if let Some(sums) = dinp_sums {
                // A pass of its own over the new dinp, the column sums a product's backward runs.
                self.column_sums(sums, dinp, bt, c);
            }
        }
    }

    /// Queues `g` on cuBLAS; a failure is latched for `synchronize`.
    ///
    /// # Safety
    /// `g`'s pointers cover its shapes (the contract of the calling op).
    unsafe fn gemm(&self, g: Gemm) {
        if let Err(e) = self.bind().and_then(|()| self.blas.gemm(&g)) {
            self.fail(e);
        }
    }

    /// `matmul_backward` with dinp's product as `(dinp, beta)` and dw's as `(dw, beta)`: beta 1
    /// accumulates, 0 overwrites; `None` leaves dinp to the caller (the DGELU epilogue computed
    /// it). The bias gradient comes from `column_sums` after cuBLAS's product. (cuBLASLt's
    /// BGRADB epilogue, which sums dout in the weight gradient's product, is slower on an H100:
    /// its algorithms without split-K, which a deterministic sum needs, are slower products.)
    ///
    /// # Safety
    /// As `matmul_backward`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul_backward_with(
        &self,
        dinp: Option<(DevPtr<Act>, f32)>,
        (dw, dw_beta): (DevPtr, f32),
        dbias: Option<DevPtr>,
        dout: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        if let Some((dinp, beta)) = dinp {
            self.input_grad_gemm(dinp, beta, dout, w, bt, c, oc);
        }
        // dw (OC,C) (+)= doutᵀ (OC,BT) · inp (BT,C), into the f32 parameter gradient.
        self.weight_grad_gemm(dw, dw_beta, dout, inp, bt, c, oc);
        if let Some(dbias) = dbias {
            self.column_sums(dbias, dout, bt, oc);
        }
    }

    /// dbias (OC) += Σ_rows dout (BT,OC) in two deterministic passes: per-chunk column sums
    /// into the scratch (float4 loads where the rows allow), then the chunks added in order
    /// (by the last block of each column tile, in the same launch, where it can).
    ///
    /// # Safety
    /// `dbias`: OC f32s; `dout`: BT·OC activations.
    pub(super) unsafe fn column_sums(&self, dbias: DevPtr, dout: DevPtr<Act>, bt: usize, oc: usize) {
        let vec4 = vec4_column_reduce(bt, oc, &[dout], self.act());
        let rows = if vec4.is_some() {
            VEC4_CHUNK_ROWS
        } else {
            COLUMN_CHUNK_ROWS
        };
        let chunks = bt.div_ceil(rows);
        let part = match self.scratch(chunks * oc) {
            Ok(part) => part,
            Err(e) => return self.fail(e),
        };
        match vec4 {
            Some((grid, block)) => self.vec4_column_sums(dbias, part, chunks, grid, oc, |tickets| {
                let args = args![dbias, part, tickets, dout, bt, oc, rows];
                self.launch("bias_backward_vec4_kernel", grid, block, args);
            }),
            None => {
                let (grid, block) = column_reduce_launch(bt, oc);
                self.launch("bias_backward_kernel", grid, block, args![part, dout, bt, oc, rows]);
                self.finish_column_sums(&[dbias], part, chunks, oc);
            }
        }
    }

    /// A float4 column reduction into dbias (OC) whose kernel ends in `column_sums_vec4_end`
    /// (`launch`, given the tickets), over `chunks` chunks of partials at `part`: finished in
    /// the same launch where the column tiles have tickets and dbias takes float4 stores, else
    /// (null tickets) by the finishing kernel after it.
    ///
    /// # Safety
    /// `dbias`: OC f32s; `part`: chunks·OC; `launch` queues a kernel that writes them so.
    unsafe fn vec4_column_sums(
        &self,
        dbias: DevPtr,
        part: DevPtr,
        chunks: usize,
        grid: (u32, u32, u32),
        oc: usize,
        launch: impl FnOnce(DevPtr<i32>),
    ) {
        let one_launch = (grid.0 as usize) <= super::TICKETS && dbias.addr().is_multiple_of(16);
        if one_launch {
            launch(self.tickets.ptr());
        } else {
            launch(DevPtr::default());
            self.finish_column_sums(&[dbias], part, chunks, oc);
        }
    }
}

impl CudaBackend {
    /// `quantize_fp8_transposed_vec_kernel`: `src` (rows, cols) into `dst` transposed and, where
    /// `plain` is not null, as stored there too; 64 x 64 tiles (see [`transposed_in_tiles`]).
    ///
    /// # Safety
    /// Every pointer covers rows·cols elements (amax, scale: one), as the op's contract checks.
    #[allow(clippy::too_many_arguments)]
    unsafe fn quantize_transposed_tiles(
        &self,
        dst: DevPtr<u8>,
        plain: DevPtr<u8>,
        amax: DevPtr,
        src: DevPtr<Act>,
        scale: DevPtr,
        [rows, cols]: [usize; 2],
        e5m2: usize,
    ) {
        let grid = (cols.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1);
        let args = args![dst, plain, amax, src, scale, rows, cols, e5m2];
        unsafe { self.launch("quantize_fp8_transposed_vec_kernel", grid, (32, 8, 1), args) };
    }
}

/// Whether the 64 x 64 kernel takes a (rows, cols) quantization into the transpose: both
/// multiples of 8, `src` 16-byte aligned and every copy 8-byte (every weight of an FP8 model).
fn transposed_in_tiles([rows, cols]: [usize; 2], src: DevPtr<Act>, copies: &[DevPtr<u8>]) -> bool {
    rows.is_multiple_of(8)
        && cols.is_multiple_of(8)
        && src.addr().is_multiple_of(16)
        && copies.iter().all(|c| c.addr().is_multiple_of(8))
}

impl CudaBackend {
    /// `dinp (BT,C) = beta · dinp + dout (BT,OC) · w (OC,C)`: the input-gradient product
    /// (beta 1 accumulates, 0 overwrites).
    ///
    /// # Safety
    /// `dinp`: BT·C, `dout`: BT·OC, `w`: OC·C activations.
    #[allow(clippy::too_many_arguments)]
    unsafe fn input_grad_gemm(
        &self,
        dinp: DevPtr<Act>,
        beta: f32,
        dout: DevPtr<Act>,
        w: DevPtr<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let act = self.act();
        self.gemm(Gemm {
            ab: act,
            c_type: act,
            trans_a: false,
            trans_b: false,
            m: c,
            n: bt,
            k: oc,
            a: w.cast(),
            lda: c,
            stride_a: 0,
            b: dout.cast(),
            ldb: oc,
            stride_b: 0,
            beta,
            c: dinp.cast(),
            ldc: c,
            stride_c: 0,
            batch: 1,
        });
    }

    /// `dw (OC,C) = beta · dw + doutᵀ (OC,BT) · inp (BT,C)` in f32: the weight-gradient
    /// product (beta 1 accumulates, 0 overwrites).
    ///
    /// # Safety
    /// `dw`: OC·C f32s; `dout`: BT·OC, `inp`: BT·C activations.
    #[allow(clippy::too_many_arguments)]
    unsafe fn weight_grad_gemm(
        &self,
        dw: DevPtr,
        beta: f32,
        dout: DevPtr<Act>,
        inp: DevPtr<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        self.gemm(Gemm {
            ab: self.act(),
            c_type: ActType::F32,
            trans_a: false,
            trans_b: true,
            m: c,
            n: oc,
            k: bt,
            a: inp.cast(),
            lda: c,
            stride_a: 0,
            b: dout.cast(),
            ldb: oc,
            stride_b: 0,
            beta,
            c: dw,
            ldc: c,
            stride_c: 0,
            batch: 1,
        });
    }
}

/// The grid of `kernels/mlp.cu`'s tiled products over an (m, n) output: 32 × 32 tiles.
fn mlp_tile_grid(m: usize, n: usize) -> LaunchShape {
    ((n.div_ceil(32) as u32, m.div_ceil(32) as u32, 1), (16, 16, 1))
}

/// Most weight-decay segments one AdamW launch takes (`DecaySegments` in adamw.cu).
const DECAY_SEGMENTS: usize = 256;

/// `DecaySegments` (adamw.cu) for `segments`, offsets from `start`: the count, each segment's
/// end, then one bit per segment for whether it decays (u32 words, as the struct lays them out).
fn decay_table(segments: &[(Range<usize>, bool)], start: usize) -> Arg {
    let mut words = vec![0u32; 1 + DECAY_SEGMENTS + DECAY_SEGMENTS / 32];
    words[0] = segments.len() as u32;
    for (k, (range, decay)) in segments.iter().enumerate() {
        words[1 + k] = (range.end - start) as u32;
        words[1 + DECAY_SEGMENTS + k / 32] |= (*decay as u32) << (k % 32);
    }
    Arg::Bytes(bytemuck::cast_slice(&words).to_vec())
}

impl Backend for CudaBackend {
    type Buffer<T: Elem> = CudaBuffer<T>;

    fn name(&self) -> String {
        self.name.clone()
    }

    // ---- memory ---------------------------------------------------------------------

    fn alloc<T: Elem>(&self, n: usize) -> Result<CudaBuffer<T>> {
        self.memory.alloc(n)
    }

    fn alloc_shared<T: Elem>(&self, n: usize) -> Result<CudaBuffer<T>> {
        self.memory.alloc_shared(n)
    }

    unsafe fn upload<T: Elem>(&self, dst: DevPtr<T>, src: &[T]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // The pageable source is staged before the call returns, so `src` may go right after.
        driver::memcpy_htod_async(dst.addr(), src, self.stream()).map_err(|e| device_err("host-to-device copy", e))
    }

    unsafe fn download<T: Elem>(&self, src: DevPtr<T>, dst: &mut [T]) -> Result<()> {
        self.take_error()?;
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // The stream is synchronised before `dst` is read.
        driver::memcpy_dtoh_async(dst, src.addr(), self.stream()).map_err(|e| device_err("device-to-host copy", e))?;
        self.synchronize()
    }

    fn zero<T: Elem>(&self, dst: Span<T>, n: usize) {
        let dst = contract::zero(dst, n);
        let bytes = n * std::mem::size_of::<T>();
        if bytes == 0 {
            return;
        }
        let queued = self.bind().and_then(|()| {
            // The widest memset the size and the address allow.
            let (addr, stream) = (dst.addr(), self.stream());
            // SAFETY: the contract checked that `dst` holds `n` elements.
            let done = unsafe {
                if bytes.is_multiple_of(4) && addr.is_multiple_of(4) {
                    driver_sys::cuMemsetD32Async(addr, 0, bytes / 4, stream)
                } else if bytes.is_multiple_of(2) && addr.is_multiple_of(2) {
                    driver_sys::cuMemsetD16Async(addr, 0, bytes / 2, stream)
                } else {
                    driver_sys::cuMemsetD8Async(addr, 0, bytes, stream)
                }
            };
            done.result().map_err(|e| device_err("zeroing device memory", e))
        });
        if let Err(e) = queued {
            self.fail(e);
        }
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn round_to_bf16(&self, dst: Span<bf16>, src: Span, n: usize) {
        let (dst, src) = contract::round_to_bf16(dst, src, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.launch_1d("round_to_bf16_kernel", n, args![dst, src, n]) };
    }

    fn widen_bf16(&self, dst: Span, src: Span<bf16>, n: usize) {
        let (dst, src) = contract::widen_bf16(dst, src, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.launch_1d("widen_bf16_kernel", n, args![dst, src, n]) };
    }

    fn fp8(&self) -> bool {
        self.fp8
    }

    fn quantize_fp8(&self, dst: Span<u8>, amax: Span, src: Span<Act>, scale: Span, n: usize, format: Fp8) {
        assert!(self.fp8, "quantize_fp8: {} has no FP8 (Backend::fp8)", self.name);
        let (dst, amax, src, scale) = contract::quantize_fp8(self.act(), dst, amax, src, scale, n);
        // A 16-byte load of bf16 and an 8-byte store a step where aligned.
        let vec = src.addr() % 16 == 0 && dst.addr() % 8 == 0 && n.is_multiple_of(8);
        let e5m2 = (format == Fp8::E5M2) as usize;
        let args = args![dst, amax, src, scale, n, e5m2, vec as usize];
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.launch_quantize("quantize_fp8_kernel", n, args) };
    }

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
        assert!(self.fp8, "matmul_fp8_gelu: {} has no FP8 (Backend::fp8)", self.name);
        let ([pre_, _], [dst, x_, y_], bias_, dq, [scale, amax]) =
            contract::matmul_fp8_gelu(self.act(), pre, scratch, out, x, y, bias, dequant, shape);
        let lt = self.lt.as_ref().expect("an FP8 backend has cuBLASLt");
        // The epilogue's scale and amax at aligned words: the slot's scale staged there first,
        // the amax raised into the slot's after.
        let staged = self.fp8_staged.ptr();
        let staged_amax = staged.add(4);
        // SAFETY: one thread; `staged` holds 8 words, `scale` one (the contract).
        unsafe { self.launch("fp8_stage_scale_kernel", (1, 1, 1), (1, 1, 1), args![staged, scale]) };
        // SAFETY: the contract checked every extent and overlap.
        let fused = self.fused_epilogue(|| unsafe {
            lt.matmul_fp8_gelu(
                self.stream(),
                pre_,
                dst,
                [staged, staged_amax],
                x_,
                y_,
                bias_,
                dq,
                shape,
            )
        });
        if fused {
            // SAFETY: one thread; `amax` one word (the contract), `staged` 8.
            unsafe { self.launch("fp8_fold_amax_kernel", (1, 1, 1), (1, 1, 1), args![amax, staged]) };
            return;
        } // else the epilogue cannot run here: the product, GELU, the quantization
        matmul_fp8_gelu_apart(self, pre, scratch, out, x, y, bias, dequant, shape);
    }

    fn quantize_fp8_transposed(
        &self,
        dst: Span<u8>,
        amax: Span,
        src: Span<Act>,
        scale: Span,
        shape: [usize; 2],
        format: Fp8,
    ) {
        assert!(
            self.fp8,
            "quantize_fp8_transposed: {} has no FP8 (Backend::fp8)",
            self.name
        );
        let (dst, amax, src, scale) = contract::quantize_fp8_transposed(self.act(), dst, amax, src, scale, shape);
        let [rows, cols] = shape;
        let e5m2 = (format == Fp8::E5M2) as usize;
        // SAFETY (both arms): the contract checked every extent and overlap.
        if transposed_in_tiles(shape, src, &[dst]) {
            let plain = DevPtr::<u8>::default(); // none
            unsafe { self.quantize_transposed_tiles(dst, plain, amax, src, scale, shape, e5m2) };
        } else {
            // 32 columns by FP8_T_ROWS rows through a 32 x 32 tile, a value at a time.
            let grid = (cols.div_ceil(32) as u32, rows.div_ceil(FP8_T_ROWS) as u32, 1);
            let args = args![dst, amax, src, scale, rows, cols, e5m2];
            unsafe { self.launch("quantize_fp8_transposed_kernel", grid, (32, 8, 1), args) };
        }
    }

    fn quantize_fp8_both(
        &self,
        copies: [Span<u8>; 2],
        amax: Span,
        src: Span<Act>,
        scale: Span,
        shape: [usize; 2],
        format: Fp8,
    ) {
        assert!(self.fp8, "quantize_fp8_both: {} has no FP8 (Backend::fp8)", self.name);
        let ([plain, dst], amax_, src_, scale_) =
            contract::quantize_fp8_both(self.act(), copies, amax, src, scale, shape);
        if !transposed_in_tiles(shape, src_, &[plain, dst]) {
            let [plain, transposed] = copies;
            self.quantize_fp8(plain, amax, src, scale, shape[0] * shape[1], format);
            return self.quantize_fp8_transposed(transposed, amax, src, scale, shape, format);
        }
        let e5m2 = (format == Fp8::E5M2) as usize;
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.quantize_transposed_tiles(dst, plain, amax_, src_, scale_, shape, e5m2) };
    }

    fn fp8_rescale(&self, slots: Span, history: Span, n: usize, len: usize) {
        let (slots, history) = contract::fp8_rescale(slots, history, n, len);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.launch_1d("fp8_rescale_kernel", n, args![slots, history, n, len]) };
    }

    fn matmul_fp8(
        &self,
        out: Span<Act>,
        x: Span<u8>,
        y: Span<u8>,
        bias: Option<Span<Act>>,
        dequant: [Span; 2],
        shape: [usize; 3],
        formats: [Fp8; 2],
    ) {
        assert!(self.fp8, "matmul_fp8: {} has no FP8 (Backend::fp8)", self.name);
        let (out, x, y, bias, dequant) = contract::matmul_fp8(self.act(), out, x, y, bias, dequant, shape, formats);
        let lt = self.lt.as_ref().expect("an FP8 backend has cuBLASLt");
        // SAFETY: the contract checked every extent and that `out` overlaps no input.
        let queued = self
            .bind()
            .and_then(|()| unsafe { lt.matmul_fp8(self.stream(), out, x, y, bias, dequant, shape, formats) });
        match queued {
            Ok(true) => {}
            Ok(false) => self.fail(Error::Device(format!(
                "cuBLASLt has no FP8 algorithm for {shape:?} ({formats:?}, bias {})",
                bias.is_some()
            ))),
            Err(e) => self.fail(e),
        }
    }

    fn matmul_fp8_weight_grad(
        &self,
        overwrite: bool,
        dw: Span,
        x: Span<u8>,
        y: Span<u8>,
        dequant: [Span; 2],
        shape: [usize; 3],
        formats: [Fp8; 2],
    ) {
        assert!(
            self.fp8,
            "matmul_fp8_weight_grad: {} has no FP8 (Backend::fp8)",
            self.name
        );
        let (dw, x, y, dequant) = contract::matmul_fp8_weight_grad(dw, x, y, dequant, shape, formats);
        let lt = self.lt.as_ref().expect("an FP8 backend has cuBLASLt");
        // SAFETY: the contract checked every extent and that `dw` overlaps no input.
        let queued = self
            .bind()
            .and_then(|()| unsafe { lt.matmul_fp8_f32(self.stream(), dw, !overwrite, x, y, dequant, shape, formats) });
        match queued {
            Ok(true) => {}
            Ok(false) => self.fail(Error::Device(format!(
                "cuBLASLt has no FP8 weight-gradient algorithm for {shape:?} ({formats:?})"
            ))),
            Err(e) => self.fail(e),
        }
    }

    fn accumulate(&self, dst: Span, src: Span, n: usize) {
        let (dst, src) = contract::accumulate(dst, src, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.launch_1d("accumulate_kernel", n, args![dst, src, n]) };
    }

    fn accumulate_act(&self, dst: Span<Act>, src: Span<Act>, n: usize) {
        let (dst, src) = contract::accumulate_act(self.act(), dst, src, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            if vec4_rows(n, &[dst, src], self.act()) {
                self.launch_1d("accumulate_act_vec4_kernel", n / 4, args![dst, src, n / 4]);
            } else {
                self.launch_1d("accumulate_act_kernel", n, args![dst, src, n]);
            }
        }
    }

    fn add(&self, out: Span<Act>, a: Span<Act>, b: Span<Act>, n: usize) {
        let (out, a, b) = contract::add(self.act(), out, a, b, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            if vec4_rows(n, &[out, a, b], self.act()) {
                self.launch_1d("add_vec4_kernel", n / 4, args![out, a, b, n / 4]);
            } else {
                self.launch_1d("add_kernel", n, args![out, a, b, n]);
            }
        }
    }

    fn scale(&self, dst: Span, n: usize, s: f32) {
        let dst = contract::scale(dst, n);
        // SAFETY: the contract checked that `dst` holds `n` elements.
        unsafe { self.launch_1d("scale_kernel", n, args![dst, n, s]) };
    }

    fn profile_range(&self, on: bool) -> Result<()> {
        self.bind()?;
        // SAFETY: this backend's context is current on this thread (bound above).
        let r = unsafe {
            match on {
                true => driver_sys::cuProfilerStart(),
                false => driver_sys::cuProfilerStop(),
            }
        };
        r.result().map_err(|e| device_err("marking the profiled range", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        let synced = self
            .memory
            .stream
            .synchronize()
            .map_err(|e| device_err("CUDA stream failed", e));
        self.take_error()?;
        synced
    }

    fn device_stream(&self) -> Option<DeviceStream> {
        Some(DeviceStream::from_raw(self.stream() as u64))
    }

    fn snapshot(&self, parts: &[&CudaBuffer<f32>]) -> Result<Option<Box<dyn Snapshot>>> {
        self.take_error()?;
        self.snapshots.take(&self.memory, parts)
    }

    fn takes_snapshots(&self) -> bool {
        true
    }

    fn prepare_snapshots(&self, lens: &[usize]) {
        self.snapshots.prepare_host(&self.memory, lens.iter().sum());
    }

    fn release_snapshots(&self) {
        self.snapshots.release();
    }

    type Recording = Recording;

    fn records(&self) -> bool {
        true
    }

    fn begin_recording(&self) -> Result<()> {
        self.take_error()?;
        self.bind()?;
        // Thread-local mode: an allocation, a free or a synchronisation by this thread while
        // recording fails instead of being silently left out of the graph. (Global mode would
        // also fail other threads' calls meanwhile: GPU tests running side by side did.)
        self.memory
            .stream
            .begin_capture(driver_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| device_err("starting to record a CUDA graph", e))
    }

    fn end_recording(&self) -> Result<Recording> {
        self.bind()?;
        let graph = self.memory.stream.end_capture(driver_sys::CUgraphInstantiate_flags(0));
        // A launch that failed while recording left its error in the latch: that one first.
        self.take_error()?;
        match graph {
            Ok(Some(graph)) => Ok(Recording { graph }),
            Ok(None) => Err(Error::Device("recording a CUDA graph: nothing was queued".into())),
            Err(e) => Err(device_err("recording the step as a CUDA graph", e)),
        }
    }

    fn replay(&self, recording: &Recording) -> Result<()> {
        self.bind()?;
        recording
            .graph
            .launch()
            .map_err(|e| device_err("replaying the step's CUDA graph", e))
    }

    fn memory_epoch(&self) -> u64 {
        self.scratch_epoch.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn peak_memory_bytes(&self) -> u64 {
        self.memory.peak_bytes()
    }

    fn memory_capacity_bytes(&self) -> Option<u64> {
        self.bind().ok()?;
        driver::mem_get_info().ok().map(|(_free, total)| total as u64)
    }

    // ---- layers ---------------------------------------------------------------------

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
    ) {
        let (out, tokens, first_position, wte, wpe) =
            contract::encoder_forward(self.act(), out, tokens, first_position, wte, wpe, b, t, c);
        // A null pointer: positions from 0.
        let first = first_position.unwrap_or_default();
        self.launch_1d(
            "encoder_forward_kernel",
            b * t * c,
            args![out, tokens, first, wte, wpe, b, t, c],
        );
    }

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
    ) {
        let (dwte, dwpe, dout, tokens, order) =
            contract::encoder_backward(self.act(), dwte, dwpe, dout, tokens, order, b, t, c);
        let bt = b * t;
        // In chunks (no serial chain as long as a token's run) where rows of C allow 8-element
        // loads; otherwise one thread a (run, column).
        let chunked = c.is_multiple_of(8)
            && dout.addr().is_multiple_of(8 * self.act().bytes() as u64)
            && dwte.addr().is_multiple_of(32);
        let chunks = bt.div_ceil(WTE_CHUNK);
        match chunked.then(|| self.scratch(2 * chunks * c)) {
            Some(Ok(partials)) => {
                let tiles = c.div_ceil(256) as u32;
                self.launch(
                    "encoder_backward_wte_chunks_kernel",
                    (chunks.div_ceil(8) as u32, tiles, 1),
                    (256, 1, 1),
                    args![dwte, partials, dout, tokens, order, bt, c],
                );
                self.launch(
                    "encoder_backward_wte_runs_kernel",
                    (chunks as u32, tiles, 1),
                    (256, 1, 1),
                    args![dwte, partials, tokens, order, bt, c],
                );
            }
            Some(Err(e)) => return self.fail(e),
            None => self.launch_1d(
                "encoder_backward_wte_kernel",
                bt * c,
                args![dwte, dout, tokens, order, b, t, c],
            ),
        }
        self.launch_1d("encoder_backward_wpe_kernel", t * c, args![dwpe, dout, b, t, c]);
    }

    fn matmul_forward(
        &self,
        out: Span<Act>,
        inp: Span<Act>,
        w: Span<Act>,
        bias: Option<Span<Act>>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let (out, inp, w, bias) = contract::matmul_forward(self.act(), out, inp, w, bias, bt, c, oc);
        // SAFETY: the contract checked every extent and that `out` overlaps no input.
        unsafe {
            if let (Some(lt), Some(bias)) = (&self.lt, bias) {
                if self.fused_epilogue(|| lt.matmul_bias(self.stream(), false, out, inp, w, bias, bt, c, oc)) {
                    return;
                } // else no fused algorithm for this shape: GEMM, then the bias kernel
            }
            // Row-major out (BT,OC) = inp (BT,C) · wᵀ is column-major outᵀ (OC,BT) = wᵀ · inpᵀ.
            let act = self.act();
            let (out, inp, w) = (out.cast(), inp.cast(), w.cast());
            self.gemm(Gemm {
                ab: act,
                c_type: act,
                trans_a: true,
                trans_b: false,
                m: oc,
                n: bt,
                k: c,
                a: w,
                lda: c,
                stride_a: 0,
                b: inp,
                ldb: c,
                stride_b: 0,
                beta: 0.0,
                c: out,
                ldc: oc,
                stride_c: 0,
                batch: 1,
            });
            if let Some(bias) = bias {
                self.launch_1d("add_bias_kernel", bt * oc, args![out, bias, bt, oc]);
            }
        }
    }

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
    ) {
        let (dinp, dw, dbias, dout, inp, w) =
            contract::matmul_backward(self.act(), dinp, dw, dbias, dout, inp, w, bt, c, oc);
        // An overwritten gradient is the product's with beta 0, neither zeroed nor read.
        let beta = if overwrite.dinp { 0.0 } else { 1.0 };
        let dw_beta = if overwrite.dw { 0.0 } else { 1.0 };
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.matmul_backward_with(Some((dinp, beta)), (dw, dw_beta), dbias, dout, inp, w, bt, c, oc) };
    }

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
    ) {
        let (dw, dbias, dout, inp) = contract::matmul_weight_backward(self.act(), dw, dbias, dout, inp, bt, c, oc);
        let dw_beta = if overwrite_dw { 0.0 } else { 1.0 };
        // SAFETY: the contract checked every extent and overlap; without dinp, `w` is not read.
        unsafe { self.matmul_backward_with(None, (dw, dw_beta), dbias, dout, inp, DevPtr::default(), bt, c, oc) };
    }

    fn bias_backward(&self, dbias: Span, dout: Span<Act>, bt: usize, oc: usize) {
        let (dbias, dout) = contract::bias_backward(self.act(), dbias, dout, bt, oc);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.column_sums(dbias, dout, bt, oc) };
    }

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
        let spans = (pre, out, inp, w, bias);
        let (pre, out, inp, w, bias) =
            contract::matmul_act_forward("matmul_gelu_forward", self.act(), pre, out, inp, w, bias, bt, c, oc);
        if let Some(lt) = self.gelu_epilogues() {
            // SAFETY: the contract checked every extent and overlap.
            if self.fused_epilogue(|| unsafe { lt.matmul_gelu(self.stream(), pre, out, inp, w, bias, bt, c, oc) }) {
                return;
            } // else the epilogue cannot run here: the product, then the GELU kernel
        }
        let (pre, out, inp, w, bias) = spans;
        self.matmul_forward(pre, inp, w, bias, bt, c, oc);
        self.gelu_forward(out, pre, bt * oc);
    }

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
        let (dpre_span, pre_span) = (dpre, pre);
        let (dpre, dpre_bias, dw, dbias, dout, act, pre, w) =
            contract::matmul_backward_dgelu(self.act(), dpre, dpre_bias, dw, dbias, dout, act, pre, w, bt, c, oc);
        let dw = (dw, if overwrite_dw { 0.0 } else { 1.0 });
        // SAFETY: the contract checked every extent and that `dpre` overlaps no other operand.
        unsafe {
            // dpre = gelu'(pre) ⊙ (dout · w) in the product's epilogue where it runs, else the
            // product, then gelu' in place; dpre's column sums by the column-sum kernels after.
            // (cuBLASLt's DGELU_BGRAD epilogue, which would sum them in the product, costs more on
            // an H100 in bf16 than the column sums it saves.)
            let fused = self.gelu_epilogues().is_some_and(|lt| {
                self.fused_epilogue(|| lt.matmul_dgelu(self.stream(), dpre, dout, w, pre, bt, c, oc))
            });
            if fused {
                self.matmul_backward_with(None, dw, dbias, dout, act, w, bt, c, oc);
            } else {
                // dpre = dout · w (beta = 0 overwrites), then dpre = gelu'(pre) ⊙ dpre.
                self.matmul_backward_with(Some((dpre, 0.0)), dw, dbias, dout, act, w, bt, c, oc);
                self.gelu_backward_in_place(dpre_span, pre_span, bt * c);
            }
            if let Some(dpre_bias) = dpre_bias {
                self.column_sums(dpre_bias, dpre, bt, c);
            }
        }
    }

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
    ) {
        let (out, mean, rstd, inp, w, b) = contract::layernorm_forward(self.act(), out, mean, rstd, inp, w, b, bt, c);
        let grid = blocks(bt, ROWS_PER_BLOCK);
        let name = if vec4_rows(c, &[out, inp, w, b], self.act()) {
            "layernorm_forward_vec4_kernel"
        } else {
            "layernorm_forward_kernel"
        };
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            self.launch(
                name,
                grid,
                (THREADS as u32, 1, 1),
                args![out, mean, rstd, inp, w, b, bt, c],
            )
        };
    }

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
    ) {
        let (dinp, dw, db, dout, inp, w, mean, rstd) =
            contract::layernorm_backward(self.act(), dinp, dw, db, dout, inp, w, mean, rstd, bt, c);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.layernorm_backward_with(dinp, None, None, dw, db, dout, inp, w, mean, rstd, bt, c) };
    }

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
        let spans = (sum, out, mean, rstd, a, b, w, bias);
        let (sum, out, mean, rstd, a, b, w, bias) =
            contract::add_layernorm_forward(self.act(), sum, out, mean, rstd, a, b, w, bias, bt, c);
        // One kernel where the rows allow 4-element accesses; otherwise the two ops.
        if vec4_rows(c, &[sum, out, a, b, w, bias], self.act()) {
            let grid = blocks(bt, ROWS_PER_BLOCK);
            let args = args![sum, out, mean, rstd, a, b, w, bias, bt, c];
            // SAFETY: the contract checked every extent and overlap.
            unsafe { self.launch("add_layernorm_forward_vec4_kernel", grid, (THREADS as u32, 1, 1), args) };
        } else {
            let (sum, out, mean, rstd, a, b, w, bias) = spans;
            self.add(sum, a, b, bt * c);
            self.layernorm_forward(out, mean, rstd, sum, w, bias, bt, c);
        }
    }

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
        let q = quantized;
        let (sum_, out_, mean_, rstd_, a_, b_, w_, bias_) =
            contract::add_layernorm_forward(self.act(), sum, out, mean, rstd, a, b, w, bias, bt, c);
        // One kernel where add_layernorm_forward's is one and the copy takes 4-byte stores; the
        // transposed copy in it too where the rows come in whole staged tiles (`fp8_tile_rows`)
        // and it takes 16-byte stores.
        let one = vec4_rows(c, &[sum_, out_, a_, b_, w_, bias_], self.act()) && q.dst.ptr().addr().is_multiple_of(4);
        let with_t = transposed
            .zip(fp8_tile_rows(bt, c))
            .filter(|(t, _)| t.ptr().addr().is_multiple_of(16));
        if !(one && self.act() == ActType::Bf16) || transposed.is_some() != with_t.is_some() {
            self.add_layernorm_forward(sum, out, mean, rstd, a, b, w, bias, bt, c);
            self.quantize_fp8(q.dst, q.amax, out, q.scale, bt * c, q.format);
            if let Some(t) = transposed {
                self.quantize_fp8_transposed(t, q.amax, out, q.scale, [bt, c], q.format);
            }
            return;
        }
        assert!(
            self.fp8,
            "add_layernorm_forward_quantize: {} has no FP8 (Backend::fp8)",
            self.name
        );
        let (dst, amax, _, scale) = contract::quantize_fp8(self.act(), q.dst, q.amax, out, q.scale, bt * c);
        let e5m2 = (q.format == Fp8::E5M2) as usize;
        let block = (THREADS as u32, 1, 1);
        // SAFETY: the contracts checked every extent and overlap.
        unsafe {
            match with_t {
                None => {
                    let args = args![sum_, out_, mean_, rstd_, a_, b_, w_, bias_, dst, amax, scale, bt, c, e5m2];
                    let grid = blocks(bt, ROWS_PER_BLOCK);
                    self.launch("add_layernorm_forward_quantize_kernel", grid, block, args)
                }
                Some((t, rows)) => {
                    let (dst_t, ..) = contract::quantize_fp8_transposed(self.act(), t, q.amax, out, q.scale, [bt, c]);
                    let args =
                        args![sum_, out_, mean_, rstd_, a_, b_, w_, bias_, dst, dst_t, amax, scale, bt, c, e5m2, rows];
                    let (name, grid) = ("add_layernorm_forward_quantize_t_kernel", blocks(bt, rows));
                    if let Err(e) = self.try_launch_shared(name, grid, block, (rows * c) as u32, args) {
                        self.fail(e);
                    }
                }
            }
        };
    }

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
        let (dsum, copy, dbias, dw, db, dout, sum, w, mean, rstd) =
            contract::add_layernorm_backward(self.act(), dsum, copy, dbias, dw, db, dout, sum, w, mean, rstd, bt, c);
        // The dinp kernel writes the copy beside dsum (no zero fill, no accumulate) and, in
        // one pass, sums dbias's columns from the same registers.
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.layernorm_backward_with(dsum, copy, dbias, dw, db, dout, sum, w, mean, rstd, bt, c) };
    }

    fn attention_refuses(&self, head_size: usize) -> Option<String> {
        let flash = !matches!(self.attention, AttentionPath::Gemm);
        (flash && !(1..=super::flash::LARGEST_HEAD).contains(&head_size)).then(|| {
            format!(
                "flash attention runs head sizes up to {} (--width / --heads), not {head_size}: GPT2_CUDA_ATTENTION=gemm with --precision fp32 or tf32 runs larger heads",
                super::flash::LARGEST_HEAD
            )
        })
    }

    fn attention_saved_len(&self, b: usize, t: usize, nh: usize) -> usize {
        match self.attention {
            // log-sum-exp per row
            AttentionPath::Flash => b.saturating_mul(nh).saturating_mul(t),
            AttentionPath::Gemm => b.saturating_mul(nh).saturating_mul(t).saturating_mul(t), // the probabilities
        }
    }

    fn attention_forward(&self, out: Span<Act>, saved: Span, qkv: Span<Act>, b: usize, t: usize, c: usize, nh: usize) {
        let saved_len = self.attention_saved_len(b, t, nh);
        let (out, saved, qkv) = contract::attention_forward(self.act(), out, saved, saved_len, qkv, b, t, c, nh);
        // The GEMM path is f32 only (a bf16 backend is never on it: see `CudaBackend::new`).
        // SAFETY: the contract checked every extent and overlap.
        let queued = unsafe {
            match self.attention {
                AttentionPath::Flash => self
                    .attention_forward_flash(out, saved, qkv, b, t, c, nh, None)
                    .map(|_| ()),
                AttentionPath::Gemm => self.attention_forward_gemm(out.cast(), saved, qkv.cast(), b, t, c, nh),
            }
        };
        if let Err(e) = queued {
            self.fail(e);
        }
    }

    fn attention_forward_quantize(
        &self,
        out: Span<Act>,
        saved: Span,
        qkv: Span<Act>,
        [b, t, c, nh]: [usize; 4],
        quantized: Fp8Out,
        transposed: Span<u8>,
    ) {
        let q = quantized;
        let shape = [b * t, c];
        let ([dst, dst_t], amax, _, scale) =
            contract::quantize_fp8_both(self.act(), [q.dst, transposed], q.amax, out, q.scale, shape);
        let saved_len = self.attention_saved_len(b, t, nh);
        let (out_, saved_, qkv_) = contract::attention_forward(self.act(), out, saved, saved_len, qkv, b, t, c, nh);
        // The Hopper kernel writes the E4M3 copies as it stores out (the same bits as quantizing
        // it after); elsewhere the two ops.
        let copy = (self.attention == AttentionPath::Flash && q.format == Fp8::E4M3).then_some(super::flash::Fp8Copy {
            dst,
            dst_t,
            amax,
            scale,
        });
        // SAFETY: the contracts checked every extent and overlap.
        let written = match copy {
            Some(copy) => unsafe { self.attention_forward_flash(out_, saved_, qkv_, b, t, c, nh, Some(copy)) },
            None => {
                self.attention_forward(out, saved, qkv, b, t, c, nh);
                Ok(false)
            }
        };
        match written {
            Ok(true) => {}
            Ok(false) => self.quantize_fp8_both([q.dst, transposed], q.amax, out, q.scale, shape, q.format),
            Err(e) => self.fail(e),
        }
    }

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
    ) {
        let dqkv_span = dqkv;
        let saved_len = self.attention_saved_len(b, t, nh);
        let (dqkv, dbias, dout, qkv, out, saved) =
            contract::attention_backward(self.act(), dqkv, dbias, dout, qkv, out, saved, saved_len, b, t, c, nh);
        // SAFETY: the contract checked every extent and overlap.
        let queued = unsafe {
            match self.attention {
                AttentionPath::Flash => self
                    .attention_backward_flash(dqkv, dout, qkv, out, saved, b, t, c, nh, overwrite, dbias, None)
                    .map(|_| ()),
                AttentionPath::Gemm => {
                    // Accumulates only: a written gradient is zeroed first, its bias summed after.
                    if overwrite {
                        self.zero_act(dqkv_span, b * t * 3 * c);
                    }
                    let queued = self.attention_backward_gemm(dqkv.cast(), dout.cast(), qkv.cast(), saved, b, t, c, nh);
                    if let Some(dbias) = dbias {
                        self.column_sums(dbias, dqkv, b * t, 3 * c);
                    }
                    queued
                }
            }
        };
        if let Err(e) = queued {
            self.fail(e);
        }
    }

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
        let q = quantized;
        let shape = [b * t, 3 * c];
        let ([dst, dst_t], amax, _, scale) =
            contract::quantize_fp8_both(self.act(), [q.dst, transposed], q.amax, dqkv, q.scale, shape);
        let saved_len = self.attention_saved_len(b, t, nh);
        let (dqkv_, dbias_, dout_, qkv_, out_, saved_) =
            contract::attention_backward(self.act(), dqkv, dbias, dout, qkv, out, saved, saved_len, b, t, c, nh);
        // The Hopper kernels write the E5M2 copies as they store dqkv (the same bits as quantizing
        // it after; the plain one in 8-byte stores, the transposed one in 16-byte runs, so T a
        // multiple of 16); elsewhere the two ops.
        let fits = self.attention == AttentionPath::Flash
            && q.format == Fp8::E5M2
            && t.is_multiple_of(16)
            && q.dst.ptr().addr().is_multiple_of(8)
            && transposed.ptr().addr().is_multiple_of(16);
        let copy = fits.then_some(super::flash::Fp8Copy {
            dst,
            dst_t,
            amax,
            scale,
        });
        // SAFETY: the contracts checked every extent and overlap.
        let written = unsafe {
            match copy {
                Some(copy) => self.attention_backward_flash(
                    dqkv_,
                    dout_,
                    qkv_,
                    out_,
                    saved_,
                    b,
                    t,
                    c,
                    nh,
                    true,
                    dbias_,
                    Some(copy),
                ),
                None => {
                    self.attention_backward(true, dqkv, dbias, dout, qkv, out, saved, b, t, c, nh);
                    Ok(false)
                }
            }
        };
        match written {
            Ok(true) => {}
            Ok(false) => self.quantize_fp8_both([q.dst, transposed], q.amax, dqkv, q.scale, shape, q.format),
            Err(e) => self.fail(e),
        }
    }

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
    ) {
        let (out, k_cache, v_cache, qkv, pos) =
            contract::attention_cached_forward(self.act(), out, k_cache, v_cache, rows, qkv, pos, t, c, nh);
        let queued = (|| -> Result<()> {
            super::attention::head_size(c, nh)?;
            if t == 0 {
                return Ok(());
            }
            self.bind()?;
            // The scores of every (query, head) pair over the cache rows, in the reused scratch,
            // sized by the cache (not by `pos`, which lives on the device) so a recorded step
            // finds it at every position.
            let scores = self.scratch(t * nh * rows)?;
            self.launch_1d("kv_cache_write_kernel", t * c, args![k_cache, v_cache, qkv, pos, t, c]);
            self.launch(
                "attention_cached_kernel",
                (t as u32, nh as u32, 1),
                (CACHED_THREADS, 1, 1),
                args![out, scores, k_cache, v_cache, qkv, pos, rows, t, c, nh],
            );
            Ok(())
        })();
        if let Err(e) = queued {
            self.fail(e);
        }
    }

    fn relu_forward(&self, out: Span<Act>, inp: Span<Act>, n: usize) {
        let (out, inp) = contract::unary("relu_forward", self.act(), out, inp, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.launch_1d("relu_forward_kernel", n, args![out, inp, n]) };
    }

    fn relu_backward(&self, dinp: Span<Act>, inp: Span<Act>, dout: Span<Act>, n: usize) {
        let (dinp, inp, dout) = contract::unary_backward("relu_backward", self.act(), dinp, inp, dout, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.launch_1d("relu_backward_kernel", n, args![dinp, inp, dout, n]) };
    }

    fn gelu_forward(&self, out: Span<Act>, inp: Span<Act>, n: usize) {
        let (out, inp) = contract::unary("gelu_forward", self.act(), out, inp, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            if vec4_rows(n, &[out, inp], self.act()) {
                self.launch_1d("gelu_forward_vec4_kernel", n / 4, args![out, inp, n / 4]);
            } else {
                self.launch_1d("gelu_forward_kernel", n, args![out, inp, n]);
            }
        }
    }

    fn gelu_backward(&self, dinp: Span<Act>, inp: Span<Act>, dout: Span<Act>, n: usize) {
        let (dinp, inp, dout) = contract::unary_backward("gelu_backward", self.act(), dinp, inp, dout, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            if vec4_rows(n, &[dinp, inp, dout], self.act()) {
                self.launch_1d("gelu_backward_vec4_kernel", n / 4, args![dinp, inp, dout, n / 4]);
            } else {
                self.launch_1d("gelu_backward_kernel", n, args![dinp, inp, dout, n]);
            }
        }
    }

    fn gelu_backward_in_place(&self, d: Span<Act>, inp: Span<Act>, n: usize) {
        let (d, inp) = contract::gelu_backward_in_place(self.act(), d, inp, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            if vec4_rows(n, &[d, inp], self.act()) {
                self.launch_1d("gelu_backward_in_place_vec4_kernel", n / 4, args![d, inp, n / 4]);
            } else {
                self.launch_1d("gelu_backward_in_place_kernel", n, args![d, inp, n]);
            }
        }
    }

    fn gelu_backward_fp8(
        &self,
        d: Span<Act>,
        inp: Span<Act>,
        copies: [Fp8Out; 2],
        transposed: Span<u8>,
        dbias: Option<Span>,
        [rows, cols]: [usize; 2],
    ) {
        let [q, a] = copies;
        // One pass where its tiles line up (every FP8 model's hidden layer at a batch of whole
        // 32-row groups), else the separate kernels.
        let fits = rows.is_multiple_of(32)
            && cols.is_multiple_of(4)
            && [d, inp].iter().all(|x| x.ptr().addr().is_multiple_of(8))
            && q.dst.ptr().addr().is_multiple_of(4)
            && [transposed, a.dst].iter().all(|x| x.ptr().addr().is_multiple_of(16));
        if !(fits && self.act() == ActType::Bf16) {
            return gelu_backward_fp8_apart(self, d, inp, copies, transposed, dbias, [rows, cols]);
        }
        assert!(self.fp8, "gelu_backward_fp8: {} has no FP8 (Backend::fp8)", self.name);
        let ([d_, inp_], [dst, dst_t, act_t], [amax, scale, act_amax, act_scale], dbias_) =
            contract::gelu_backward_fp8(self.act(), d, inp, copies, transposed, dbias, [rows, cols]);
        let e5m2 = (q.format == Fp8::E5M2) as usize;
        let act_e5m2 = (a.format == Fp8::E5M2) as usize;
        let (grid, block) = vec4_column_reduce(rows, cols, &[d_, inp_], self.act()).expect("aligned above");
        let chunks = grid.1 as usize;
        let rows_per_block = VEC4_CHUNK_ROWS;
        let launch = |dbias: DevPtr, part: DevPtr, tickets: DevPtr<i32>| {
            let args = args![
                d_,
                inp_,
                dst,
                dst_t,
                amax,
                scale,
                e5m2,
                act_t,
                act_amax,
                act_scale,
                act_e5m2,
                dbias,
                part,
                tickets,
                rows,
                cols,
                rows_per_block
            ];
            // SAFETY: the contract checked every extent and overlap; the partials (when the
            // bias sums run) cover the chunks' column sums.
            unsafe { self.launch("gelu_backward_fp8_kernel", grid, block, args) };
        };
        let Some(dbias) = dbias_ else {
            return launch(DevPtr::default(), DevPtr::default(), DevPtr::default());
        };
        let part = match self.scratch(chunks * cols) {
            Ok(part) => part,
            Err(e) => return self.fail(e),
        };
        // SAFETY: as above.
        unsafe { self.vec4_column_sums(dbias, part, chunks, grid, cols, |tickets| launch(dbias, part, tickets)) }
    }

    unsafe fn crossentropy_forward(
        &self,
        losses: Span,
        logits: Span<Act>,
        targets: Span<i32>,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let (losses, logits, targets) = contract::crossentropy_forward(self.act(), losses, logits, targets, bt, v, vp);
        let vec = vec4_rows(vp, &[logits], self.act()) as usize;
        let args = args![losses, logits, targets, bt, v, vp, vec];
        self.launch("crossentropy_forward_kernel", (bt as u32, 1, 1), (512, 1, 1), args);
    }

    unsafe fn crossentropy_backward(
        &self,
        dlogits: Span<Act>,
        logits: Span<Act>,
        targets: Span<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let (dlogits, logits, targets) =
            contract::crossentropy_backward(self.act(), dlogits, logits, targets, bt, v, vp);
        let args = args![dlogits, logits, targets, dloss, bt, v, vp];
        self.launch("crossentropy_backward_kernel", (bt as u32, 1, 1), (512, 1, 1), args);
    }

    unsafe fn crossentropy_backward_in_place(
        &self,
        logits: Span<Act>,
        losses: Span,
        targets: Span<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let (logits, losses, targets) = contract::crossentropy_in_place(
            "crossentropy_backward_in_place",
            self.act(),
            logits,
            losses,
            targets,
            bt,
            v,
            vp,
        );
        // 4-element accesses when every row starts aligned to 4 elements.
        let width = 4 * self.act().bytes() as u64;
        let vec = (vp.is_multiple_of(4) && logits.addr().is_multiple_of(width)) as usize;
        let args = args![logits, losses, targets, dloss, bt, v, vp, vec];
        self.launch(
            "crossentropy_backward_in_place_kernel",
            (bt as u32, 1, 1),
            (512, 1, 1),
            args,
        );
    }

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
        let (logits, losses, targets) =
            contract::crossentropy_in_place("crossentropy_fused", self.act(), logits, losses, targets, bt, v, vp);
        // 8-element (16-byte for bf16) accesses when every row starts aligned to 8 elements.
        let width = 8 * self.act().bytes() as u64;
        let vec = (vp.is_multiple_of(8) && logits.addr().is_multiple_of(width)) as usize;
        let args = args![losses, logits, targets, dloss, bt, v, vp, vec];
        self.launch("crossentropy_fused_kernel", (bt as u32, 1, 1), (1024, 1, 1), args);
    }

    // ---- reductions and the optimiser ---------------------------------------------

    fn mean(&self, out: Span, inp: Span, n: usize) {
        let (out, inp) = contract::mean(out, inp, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.launch("mean_kernel", (1, 1, 1), (1024, 1, 1), args![out, inp, n]) };
    }

    fn sum_squares(&self, out: Span, inp: Span, n: usize) {
        let (out, inp) = contract::sum_squares(out, inp, n);
        if n == 0 {
            return;
        }
        // Two fixed passes (block partials, then one block) rather than atomics: deterministic.
        let parts = n.div_ceil(THREADS).min(MAX_REDUCE_BLOCKS);
        let partials = self.reduce_partials.ptr();
        // SAFETY: the contract checked every extent and overlap; `partials` holds
        // MAX_REDUCE_BLOCKS values.
        unsafe {
            self.launch(
                "sum_squares_partial_kernel",
                (parts as u32, 1, 1),
                (THREADS as u32, 1, 1),
                args![partials, inp, n],
            );
            self.launch(
                "sum_squares_finish_kernel",
                (1, 1, 1),
                (1024, 1, 1),
                args![out, partials, parts],
            );
        }
    }

    fn step_stats(&self, state: Span, history: Span, history_len: usize, max_norm: f32, loss_scale: f32) {
        let (state, history) = contract::step_stats(state, history, history_len);
        let args = args![state, history, history_len, max_norm, loss_scale];
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.launch("step_stats_kernel", (1, 1, 1), (32, 1, 1), args) };
    }

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
    ) {
        let (params, grads, m, v, state, copy) = contract::adamw(params, grads, m, v, segments, state, copy);
        // One launch over the whole buffer, the segments passed by value (a layout with more
        // than DECAY_SEGMENTS of them goes in pieces of that many).
        for piece in segments.chunks(DECAY_SEGMENTS) {
            let (start, end) = (piece[0].0.start, piece[piece.len() - 1].0.end);
            let copy = copy.map(|c| c.add(start)).unwrap_or_default();
            let (params, grads, m, v) = (params.add(start), grads.add(start), m.add(start), v.add(start));
            // Four values a thread, in 16-byte accesses where every buffer is aligned to them.
            let vec =
                [params, grads, m, v].iter().all(|p| p.addr().is_multiple_of(16)) && copy.addr().is_multiple_of(8);
            let args = args![
                params,
                grads,
                m,
                v,
                end - start,
                state,
                hp.beta1,
                hp.beta2,
                hp.eps,
                hp.weight_decay,
                copy,
                vec as usize,
                decay_table(piece, start)
            ];
            // SAFETY: the contract checked every extent (the segments' whole) and overlap.
            unsafe { self.launch_1d("adamw_kernel", (end - start).div_ceil(4), args) };
        }
    }

    fn sgd(
        &self,
        params: Span,
        grads: Span,
        velocity: Span,
        n: usize,
        state: Span,
        hp: SgdHyper,
        copy: Option<Span<bf16>>,
    ) {
        let (params, grads, velocity, state, copy) = contract::sgd(params, grads, velocity, n, state, copy);
        let args = args![
            params,
            grads,
            velocity,
            n,
            state,
            hp.momentum,
            hp.weight_decay,
            copy.unwrap_or_default()
        ];
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.launch_1d("sgd_kernel", n, args) };
    }
}

impl FusedMlp for CudaBackend {
    fn matmul_relu_forward(
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
        let spans = (pre, out, inp, w, bias);
        let (_, out, inp, w, bias) =
            contract::matmul_act_forward("matmul_relu_forward", self.act(), pre, out, inp, w, bias, bt, c, oc);
        if let (Some(lt), Some(bias)) = (&self.lt, bias) {
            // SAFETY: the contract checked every extent and overlap.
            if self.fused_epilogue(|| unsafe { lt.matmul_bias(self.stream(), true, out, inp, w, bias, bt, c, oc) }) {
                return;
            } // else no fused algorithm for this shape: the product, then ReLU
        }
        let (pre, out, inp, w, bias) = spans;
        self.matmul_forward(pre, inp, w, bias, bt, c, oc);
        self.relu_forward(out, pre, bt * oc);
    }

    // ---- the MLP workload's step on the device ------------------------------------------

    unsafe fn gather_batch(
        &self,
        out: Span<Act>,
        targets: Span<i32>,
        images: Span<u8>,
        labels: Span<u8>,
        order: Span<i32>,
        state: Span,
        rows: usize,
        size: usize,
        steps: usize,
    ) {
        let (out, targets, images, labels, order, state) = contract::gather_batch(
            self.act(),
            out,
            targets,
            images,
            labels,
            order,
            state,
            rows,
            size,
            steps,
        );
        let args = args![out, targets, images, labels, order, state, rows, size, steps];
        self.launch_1d("gather_batch_kernel", rows * size, args);
    }

    unsafe fn loss_step(
        &self,
        logits: Span<Act>,
        losses: Span,
        targets: Span<i32>,
        state: Span,
        schedule: Span,
        history: Span,
        history_len: usize,
        rows: usize,
        v: usize,
        steps: usize,
        dloss: f32,
    ) {
        let (logits, losses, targets, state, schedule, history) = contract::loss_step(
            self.act(),
            logits,
            losses,
            targets,
            state,
            schedule,
            history,
            history_len,
            rows,
            v,
            steps,
        );
        // The forward kernel's 4-element reads where it takes them (crossentropy_forward).
        let vec = vec4_rows(v, &[logits], self.act()) as usize;
        let args = args![
            logits,
            losses,
            targets,
            state,
            schedule,
            history,
            history_len,
            rows,
            v,
            steps,
            dloss,
            vec
        ];
        self.launch("loss_step_kernel", (1, 1, 1), (1024, 1, 1), args);
    }

    fn matmul_backward_relu(
        &self,
        dinp: Span<Act>,
        dout: Span<Act>,
        w: Span<Act>,
        act: Span<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let (dinp, dout, w, act) = contract::matmul_backward_relu(self.act(), dinp, dout, w, act, bt, c, oc);
        // SAFETY: the contract checked every extent and that `dinp` overlaps no other operand.
        unsafe {
            if mlp_tiled(bt, c, oc) {
                let (grid, block) = mlp_tile_grid(bt, c);
                self.launch(
                    "mlp_dinp_relu_kernel",
                    grid,
                    block,
                    args![dinp, dout, w, act, bt, c, oc],
                );
            } else {
                self.input_grad_gemm(dinp, 0.0, dout, w, bt, c, oc);
                self.launch_1d("mlp_relu_mask_kernel", bt * c, args![dinp, act, bt * c]);
            }
        }
    }

    fn linear_sgd(
        &self,
        params: Span,
        velocity: Span,
        grads: Span,
        copy: Option<Span<bf16>>,
        dout: Span<Act>,
        inp: Span<Act>,
        state: Span,
        hp: SgdHyper,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let (params, velocity, grads, copy, dout, inp, state) =
            contract::linear_sgd(self.act(), params, velocity, grads, copy, dout, inp, state, bt, c, oc);
        let copy = copy.unwrap_or_default(); // null: no copy
        let (momentum, decay) = (hp.momentum, hp.weight_decay);
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            if mlp_tiled(oc, c + 1, bt) {
                let (grid, block) = mlp_tile_grid(oc, c + 1);
                let args = args![params, velocity, copy, dout, inp, state, momentum, decay, bt, c, oc];
                self.launch("mlp_linear_sgd_kernel", grid, block, args);
            } else {
                self.weight_grad_gemm(grads, 0.0, dout, inp, bt, c, oc);
                let wblocks = (oc * c).div_ceil(THREADS);
                let grid = ((wblocks + oc.div_ceil(32)) as u32, 1, 1);
                let args = args![params, velocity, grads, copy, dout, state, momentum, decay, bt, c, oc, wblocks];
                self.launch("mlp_sgd_apply_kernel", grid, (THREADS as u32, 1, 1), args);
            }
        }
    }
}
