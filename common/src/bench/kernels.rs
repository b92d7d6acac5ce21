//! `bench --kernels`: each fused kernel timed alone at the shapes that matter (GPT-2 124M's
//! widths, the sequence lengths, head sizes and vocabularies), one JSON line per
//! row: the op, the shape, milliseconds per call, and the FLOP and the fewest bytes the call
//! must move, from which the reader (`gpu/kernels.sh`, `results/bench-suite.sh`)
//! derives TFLOP/s or GB/s against the device's measured ceilings. Inputs are random (never
//! zeros). Where an unfused form of the same computation exists it is timed beside it (`impl`
//! "ours-unfused").
//!
//! The rows of `kind` "matmul" come first: GPT-2 124M's five matrix products (qkv C→3C,
//! attention projection C→C, fc C→4C, fc projection 4C→C, the tied LM head C→Vp), forward
//! and backward through the Backend methods the model calls, and a large square product on
//! the same backend in the same run (`matmul_peak`): the ceiling each product's rate is set
//! against. Every row runs on [`KernelOpts::tokens`] rows (B·T): 16,384 on a GPU, fewer on
//! the CPU, where the whole bench must stay near a minute on 2 cores (see [`KernelOpts`]).

use crate::backend::{
    gelu_backward_fp8_apart, Act, ActType, AdamWHyper, Backend, DeviceBuffer, Fp8, Fp8Out, Overwrite, Span, StepState,
};
use crate::error::Result;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::cell::RefCell;
use std::time::Instant;

/// What `bench --kernels` times, and at which size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOpts {
    /// Rows (B·T tokens) of every row's activations: the products' M, the layernorm's and
    /// GELU's rows; attention at T = 512, 1024, 2048 (those not above it; else T = tokens)
    /// with B = tokens / T; cross-entropy over tokens / 2 rows.
    pub tokens: usize,
    /// The side of the square product timed as the ceiling (`matmul_peak`).
    pub square: usize,
    /// The matrix-product rows alone (kind "matmul").
    pub matmul_only: bool,
}

impl KernelOpts {
    /// GPT-2 124M's training shape on a GPU (B·T = 16K), the ceiling 8192³.
    pub const GPU_TOKENS: usize = 16_384;
    pub const GPU_SQUARE: usize = 8_192;
    /// On the CPU: 512 tokens keep the whole bench (every row) near a minute on 2 cores, the
    /// five products forward and backward near 10 s; the ceiling 2048³ (17 GFLOP) is large
    /// enough for the `gemm` crate to reach its rate and small enough to time in a second.
    pub const CPU_TOKENS: usize = 512;
    pub const CPU_SQUARE: usize = 2_048;

    /// The defaults of a GPU or CPU backend, `tokens` when given.
    pub fn for_device(gpu: bool, tokens: Option<usize>, matmul_only: bool) -> Self {
        let (t, square) = match gpu {
            true => (Self::GPU_TOKENS, Self::GPU_SQUARE),
            false => (Self::CPU_TOKENS, Self::CPU_SQUARE),
        };
        KernelOpts {
            tokens: tokens.unwrap_or(t),
            square,
            matmul_only,
        }
    }
}

/// GPT-2 124M's matrix products: the forward's and the backward's row names, input width,
/// output width, bias (the LM head is the token embedding, tied, without one; Vp = 50,304).
pub const GPT2_PRODUCTS: [(&str, &str, usize, usize, bool); 5] = [
    ("qkv_fwd", "qkv_bwd", 768, 3 * 768, true),
    ("attproj_fwd", "attproj_bwd", 768, 768, true),
    ("fc_fwd", "fc_bwd", 768, 4 * 768, true),
    ("fcproj_fwd", "fcproj_bwd", 4 * 768, 768, true),
    ("lm_head_fwd", "lm_head_bwd", 768, 50_304, false),
];

/// One timed kernel (or the kernels of one op's forward or backward).
#[derive(Debug, serde::Serialize)]
pub struct KernelRow {
    pub kind: &'static str,
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    pub op: &'static str,
    pub shape: String,
    pub precision: &'static str,
    pub ms: f64,
    /// Floating-point operations of one call (matrix products), when they bound it.
    pub flop: Option<f64>,
    /// The fewest bytes one call must move through device memory (inputs read once, outputs
    /// written once), when they bound it.
    pub bytes: Option<f64>,
}

/// Milliseconds per call of `f`: two warm-up calls (the second timed alone), then five
/// batches of `reps` calls, each batch timed from the host between synchronisations; the
/// median batch. A batch holds fewer calls where `reps` of them would take over 0.2 s (slow
/// calls on the CPU: at least one).
fn time_ms<B: Backend>(be: &B, reps: usize, mut f: impl FnMut()) -> Result<f64> {
    f();
    be.synchronize()?;
    let started = Instant::now();
    f();
    be.synchronize()?;
    let one = started.elapsed().as_secs_f64();
    let reps = reps.min((0.2 / one.max(1e-9)) as usize).max(1);
    let mut batches = Vec::with_capacity(5);
    for _ in 0..5 {
        let started = Instant::now();
        for _ in 0..reps {
            f();
        }
        be.synchronize()?;
        batches.push(started.elapsed().as_secs_f64() * 1e3 / reps as f64);
    }
    batches.sort_by(f64::total_cmp);
    Ok(batches[2])
}

/// Device buffers of random values for one shape, freed together. Each is handed out as a
/// span that borrows the arena, which keeps the buffer until it is dropped.
struct Arena<'a, B: Backend> {
    be: &'a B,
    rng: RefCell<ChaCha8Rng>,
    held: RefCell<Vec<B::Buffer<f32>>>,
    held_ids: RefCell<Vec<B::Buffer<i32>>>,
    held_bytes: RefCell<Vec<B::Buffer<u8>>>,
}

impl<'a, B: Backend> Arena<'a, B> {
    fn new(be: &'a B) -> Self {
        Arena {
            be,
            rng: RefCell::new(ChaCha8Rng::seed_from_u64(1)),
            held: RefCell::new(Vec::new()),
            held_ids: RefCell::new(Vec::new()),
            held_bytes: RefCell::new(Vec::new()),
        }
    }

    fn random(&self, n: usize, scale: f32) -> Vec<f32> {
        let rng = &mut *self.rng.borrow_mut();
        (0..n)
            .map(|_| scale * ((rng.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0))
            .collect()
    }

    /// `n` activations, random in [-scale, scale).
    fn act(&self, n: usize, scale: f32) -> Result<Span<'_, Act>> {
        let act = self.be.act();
        let buf = self.be.alloc::<f32>(act.words(n).max(1))?;
        // SAFETY: the buffer's words hold at least `n` activations; the arena keeps the
        // buffer (its memory stays put when the buffer moves) until it is dropped, which the
        // span's borrow of the arena defers.
        let span = unsafe { Span::from_raw_act(buf.ptr().cast(), n, act) };
        self.be.upload_act(span, &self.random(n, scale))?;
        self.held.borrow_mut().push(buf);
        Ok(span)
    }

    /// `n` f32 values, random in [-scale, scale), or all equal to `fill`.
    fn f32s(&self, n: usize, scale: f32, fill: Option<f32>) -> Result<Span<'_>> {
        let buf = self.be.alloc::<f32>(n.max(1))?;
        let host = match fill {
            Some(x) => vec![x; n],
            None => self.random(n, scale),
        };
        self.be.write(&buf, 0, &host)?;
        // SAFETY: as in `act`.
        let span = unsafe { Span::from_raw(buf.ptr(), n) };
        self.held.borrow_mut().push(buf);
        Ok(span)
    }

    /// `n` ids below `below`.
    fn ids(&self, n: usize, below: usize) -> Result<Span<'_, i32>> {
        let buf = self.be.alloc::<i32>(n.max(1))?;
        let host: Vec<i32> = {
            let rng = &mut *self.rng.borrow_mut();
            (0..n).map(|_| (rng.next_u32() as usize % below) as i32).collect()
        };
        self.be.write(&buf, 0, &host)?;
        // SAFETY: as in `act`.
        let span = unsafe { Span::from_raw(buf.ptr(), n) };
        self.held_ids.borrow_mut().push(buf);
        Ok(span)
    }

    /// `n` FP8 values of `format`: random activations in [-1, 1) quantized with scale 1.
    fn fp8(&self, n: usize, format: Fp8) -> Result<Span<'_, u8>> {
        let (src, scale, amax) = (
            self.act(n, 1.0)?,
            self.f32s(1, 0.0, Some(1.0))?,
            self.f32s(1, 0.0, Some(0.0))?,
        );
        let buf = self.be.alloc::<u8>(n.max(1))?;
        // SAFETY: as in `act`.
        let span = unsafe { Span::from_raw(buf.ptr(), n) };
        self.be.quantize_fp8(span, amax, src, scale, n, format);
        self.held_bytes.borrow_mut().push(buf);
        Ok(span)
    }

    /// Where an op writes `n` FP8 values of `format`: `n` bytes (as `fp8` makes them), scale 1,
    /// amax 0.
    fn fp8_out(&self, n: usize, format: Fp8) -> Result<Fp8Out<'_>> {
        Ok(Fp8Out {
            dst: self.fp8(n, format)?,
            amax: self.f32s(1, 0.0, Some(0.0))?,
            scale: self.f32s(1, 0.0, Some(1.0))?,
            format,
        })
    }
}

/// Adds a product's row of `precision` (kind "matmul", ours): (op, shape, ms, FLOP).
fn product_row<'r>(
    rows: &'r mut Vec<KernelRow>,
    precision: &'static str,
) -> impl FnMut(&'static str, String, f64, f64) + 'r {
    move |op, shape, ms, flop| {
        rows.push(KernelRow {
            kind: "matmul",
            implementation: "ours",
            op,
            shape,
            precision,
            ms,
            flop: Some(flop),
            bytes: None,
        })
    }
}

/// GPT-2 124M's products at `tokens` rows and the square ceiling, `kind` "matmul". Forward:
/// `matmul_forward` with the bias, as the model calls each (the fc product goes through
/// `matmul_gelu_forward` in the model, timed below as `matmul_gelu_fwd`); backward:
/// `matmul_backward`, the input gradient, the weight gradient and the bias gradient (fcproj's
/// goes through `matmul_backward_dgelu` in the model, `matmul_dgelu_bwd` below). FLOP: the
/// products' (2·M·K·N forward, twice that backward; the bias's M·N adds are not counted).
fn matmul_rows<B: Backend>(be: &B, opts: &KernelOpts, rows: &mut Vec<KernelRow>) -> Result<()> {
    let mut row = product_row(rows, be.precision().name());
    {
        let n = opts.square;
        let m = Arena::new(be);
        let (x, w, out) = (m.act(n * n, 1.0)?, m.act(n * n, 0.1)?, m.act(n * n, 1.0)?);
        let ms = time_ms(be, 5, || be.matmul_forward(out, x, w, None, n, n, n))?;
        row("matmul_peak", format!("{n}x{n}x{n}"), ms, 2.0 * (n as f64).powi(3));
    }
    let r = opts.tokens;
    for (fwd, bwd, c_in, oc, has_bias) in GPT2_PRODUCTS {
        let m = Arena::new(be);
        let (inp, w, out, dout, dinp) = (
            m.act(r * c_in, 1.0)?,
            m.act(oc * c_in, 0.1)?,
            m.act(r * oc, 1.0)?,
            m.act(r * oc, 1.0)?,
            m.act(r * c_in, 1.0)?,
        );
        let bias = if has_bias { Some(m.act(oc, 0.1)?) } else { None };
        let (dw, db) = (m.f32s(oc * c_in, 1.0, None)?, m.f32s(oc, 1.0, None)?);
        let dbias = has_bias.then_some(db);
        let shape = format!("{r}x{c_in}x{oc}");
        let flop = 2.0 * (r * c_in * oc) as f64;
        let ms = time_ms(be, 10, || be.matmul_forward(out, inp, w, bias, r, c_in, oc))?;
        row(fwd, shape.clone(), ms, flop);
        // dinp, dw and dbias accumulate over the calls, which changes their values, not the
        // work.
        let ms = time_ms(be, 10, || {
            be.matmul_backward(Overwrite::ACCUMULATE, dinp, dw, dbias, dout, inp, w, r, c_in, oc)
        })?;
        row(bwd, shape, ms, 2.0 * flop);
    }
    drop(row); // its borrow of `rows`
    if be.fp8() && be.act() == ActType::Bf16 {
        fp8_rows(be, opts, rows)?;
    }
    Ok(())
}

/// The same products in FP8 (`matmul_fp8`, precision "fp8"), on a GPU that has them: the
/// square ceiling and the forward products in E4M3 (bias in the epilogue, bf16 out), and the
/// backward's two products of each (the input gradient, K = OC, bf16 out, and the weight
/// gradient, K = B·T, written in f32 as training's are) with E5M2 gradients by E4M3 operands,
/// each operand laid out K-major as FP8 needs; the quantizations not included.
fn fp8_rows<B: Backend>(be: &B, opts: &KernelOpts, rows: &mut Vec<KernelRow>) -> Result<()> {
    let mut row = product_row(rows, "fp8");
    let (e4, e5) = (Fp8::E4M3, Fp8::E5M2);
    {
        let n = opts.square;
        let m = Arena::new(be);
        let (x, y, out) = (m.fp8(n * n, e4)?, m.fp8(n * n, e4)?, m.act(n * n, 1.0)?);
        let dequant = [m.f32s(1, 0.0, Some(1.0))?, m.f32s(1, 0.0, Some(1.0))?];
        let ms = time_ms(be, 5, || be.matmul_fp8(out, x, y, None, dequant, [n, n, n], [e4, e4]))?;
        row("matmul_peak", format!("{n}x{n}x{n}"), ms, 2.0 * (n as f64).powi(3));
    }
    let r = opts.tokens;
    for (fwd, bwd, c_in, oc, has_bias) in GPT2_PRODUCTS {
        let m = Arena::new(be);
        let (inp, w, out) = (m.fp8(r * c_in, e4)?, m.fp8(oc * c_in, e4)?, m.act(r * oc, 1.0)?);
        // Each scale in a buffer of its own: cuBLASLt takes them at 16-byte aligned addresses.
        let dequant = [m.f32s(1, 0.0, Some(1.0))?, m.f32s(1, 0.0, Some(1.0))?];
        let bias = if has_bias { Some(m.act(oc, 0.1)?) } else { None };
        let shape = format!("{r}x{c_in}x{oc}");
        let flop = 2.0 * (r * c_in * oc) as f64;
        let ms = time_ms(be, 10, || {
            be.matmul_fp8(out, inp, w, bias, dequant, [r, oc, c_in], [e4, e4])
        })?;
        row(fwd, shape.clone(), ms, flop);
        // Backward: dinp (R,C) = dout (R,OC) · (wᵀ (C,OC))ᵀ, and dw (OC,C) = doutᵀ (OC,R) · (inpᵀ (C,R))ᵀ.
        let (dout, wt, dout_t, inp_t) = (
            m.fp8(r * oc, e5)?,
            m.fp8(c_in * oc, e4)?,
            m.fp8(oc * r, e5)?,
            m.fp8(c_in * r, e4)?,
        );
        let (dinp, dw) = (m.act(r * c_in, 1.0)?, m.f32s(oc * c_in, 0.0, Some(0.0))?);
        let ms = time_ms(be, 10, || {
            be.matmul_fp8(dinp, dout, wt, None, dequant, [r, c_in, oc], [e5, e4]);
            be.matmul_fp8_weight_grad(true, dw, dout_t, inp_t, dequant, [oc, c_in, r], [e5, e4]);
        })?;
        row(bwd, shape, ms, 2.0 * flop);
    }
    {
        // The MLP's first product through GELU in its epilogue (pre written, gelu(pre) as its
        // E4M3 copy).
        let (c_in, oc) = (768, 4 * 768);
        let m = Arena::new(be);
        let (inp, w, bias) = (m.fp8(r * c_in, e4)?, m.fp8(oc * c_in, e4)?, Some(m.act(oc, 0.1)?));
        let (pre, scratch, out) = (m.act(r * oc, 1.0)?, m.act(r * oc, 1.0)?, m.fp8_out(r * oc, e4)?);
        let dequant = [m.f32s(1, 0.0, Some(1.0))?, m.f32s(1, 0.0, Some(1.0))?];
        let ms = time_ms(be, 10, || {
            be.matmul_fp8_gelu(pre, scratch, out, inp, w, bias, dequant, [r, oc, c_in])
        })?;
        row(
            "fc_gelu_fwd",
            format!("{r}x{c_in}x{oc}"),
            ms,
            2.0 * (r * c_in * oc) as f64,
        );
    }
    Ok(())
}

/// Every row of the kernel benchmark, in the backend's precision: the matrix products first
/// (`matmul_rows`), then the fused kernels (unless `opts.matmul_only`).
pub fn kernels<B: Backend>(be: &B, opts: &KernelOpts) -> Result<Vec<KernelRow>> {
    if opts.tokens == 0 || opts.square == 0 {
        crate::bail_input!("bench --kernels needs at least 1 token and a square of at least 1");
    }
    let mut rows = Vec::new();
    matmul_rows(be, opts, &mut rows)?;
    if opts.matmul_only {
        return Ok(rows);
    }
    let precision = be.precision().name();
    let a = be.act().bytes() as f64;
    let mut row = |implementation, op, shape: String, ms, flop: Option<f64>, bytes: Option<f64>| {
        rows.push(KernelRow {
            kind: "kernel",
            implementation,
            op,
            shape,
            precision,
            ms,
            flop,
            bytes,
        })
    };

    // Attention: the tokens (16K on a GPU) at width 768, causal; FLOP as FlashAttention counts
    // them (the causal half of 2 products forward, 5 backward). Sequence lengths above the
    // token count are left out (the CPU's fewer tokens: T = the tokens if none is left).
    let tokens = opts.tokens;
    let mut lengths: Vec<usize> = [512usize, 1024, 2048].into_iter().filter(|&t| t <= tokens).collect();
    if lengths.is_empty() {
        lengths.push(tokens);
    }
    for t in lengths {
        for hs in [64usize, 128] {
            let (b, c) = (tokens / t, 768);
            let nh = c / hs;
            let m = Arena::new(be);
            let (qkv, out, dout, dqkv) = (
                m.act(b * t * 3 * c, 1.0)?,
                m.act(b * t * c, 1.0)?,
                m.act(b * t * c, 1.0)?,
                m.act(b * t * 3 * c, 1.0)?,
            );
            let lse = m.f32s(be.attention_saved_len(b, t, nh), 1.0, Some(0.0))?;
            let shape = format!("B={b} T={t} NH={nh} HS={hs}");
            let causal = (b * nh * t * t * hs) as f64; // one T×T×HS product, halved, times 2
            let fwd = time_ms(be, 10, || be.attention_forward(out, lse, qkv, b, t, c, nh))?;
            row("ours", "attention_fwd", shape.clone(), fwd, Some(2.0 * causal), None);
            // `lse` and `out` were written by the forward. The model's call: dqkv is qkv's
            // first gradient, overwritten.
            let bwd = time_ms(be, 10, || {
                be.attention_backward(true, dqkv, None, dout, qkv, out, lse, b, t, c, nh)
            })?;
            row("ours", "attention_bwd", shape, bwd, Some(5.0 * causal), None);
        }
    }

    // Layernorm and GELU at GPT-2 124M's training shape (B·T = 16K rows on a GPU).
    let (r, c) = (tokens, 768usize);
    {
        let m = Arena::new(be);
        let (inp, out, dout, dinp) = (
            m.act(r * c, 2.0)?,
            m.act(r * c, 1.0)?,
            m.act(r * c, 1.0)?,
            m.act(r * c, 1.0)?,
        );
        let (w, b) = (m.act(c, 1.0)?, m.act(c, 1.0)?);
        let (mean, rstd, dw, db) = (
            m.f32s(r, 1.0, None)?,
            m.f32s(r, 1.0, None)?,
            m.f32s(c, 1.0, None)?,
            m.f32s(c, 1.0, None)?,
        );
        let n = (r * c) as f64;
        let shape = format!("{r}x{c}");
        let fwd = time_ms(be, 20, || be.layernorm_forward(out, mean, rstd, inp, w, b, r, c))?;
        row(
            "ours",
            "layernorm_fwd",
            shape.clone(),
            fwd,
            None,
            Some(2.0 * n * a + 8.0 * r as f64),
        );
        // mean and rstd were written by the forward.
        let bwd = time_ms(be, 20, || {
            be.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, r, c)
        })?;
        row(
            "ours",
            "layernorm_bwd",
            shape.clone(),
            bwd,
            None,
            Some(4.0 * n * a + 8.0 * r as f64),
        );

        // The residual add and the layernorm after it (every layernorm of the model but the
        // first), `inp` the residual stream, `y` the branch: fused, one pass that writes the
        // sum and its layernorm, and in backward the dinp kernel writing the add's second
        // input gradient (`copy`) too; unfused, `add` then `layernorm_forward`, and
        // `layernorm_backward` then a zero fill and `accumulate_act` (the separate ops).
        // Floors: forward reads inp and y and writes the sum and the output; backward reads
        // the sum's gradient, dout and the sum and writes the sum's gradient and the copy.
        let (y, sum, copy) = (m.act(r * c, 1.0)?, m.act(r * c, 1.0)?, m.act(r * c, 1.0)?);
        let (fwd_floor, bwd_floor) = (Some(4.0 * n * a + 8.0 * r as f64), Some(5.0 * n * a + 8.0 * r as f64));
        let fused = time_ms(be, 20, || {
            be.add_layernorm_forward(sum, out, mean, rstd, inp, y, w, b, r, c)
        })?;
        row("ours", "add_layernorm_fwd", shape.clone(), fused, None, fwd_floor);
        let apart = time_ms(be, 20, || {
            be.add(sum, inp, y, r * c);
            be.layernorm_forward(out, mean, rstd, sum, w, b, r, c);
        })?;
        row(
            "ours-unfused",
            "add_layernorm_fwd",
            shape.clone(),
            apart,
            None,
            fwd_floor,
        );
        // sum, mean and rstd were written by the forward. dinp (the sum's gradient)
        // accumulates over the calls, which changes its values, not the work.
        let fused = time_ms(be, 20, || {
            be.add_layernorm_backward(dinp, Some(copy), None, dw, db, dout, sum, w, mean, rstd, r, c)
        })?;
        row("ours", "add_layernorm_bwd", shape.clone(), fused, None, bwd_floor);
        let apart = time_ms(be, 20, || {
            be.layernorm_backward(dinp, dw, db, dout, sum, w, mean, rstd, r, c);
            be.zero_act(copy, r * c);
            be.accumulate_act(copy, dinp, r * c);
        })?;
        row("ours-unfused", "add_layernorm_bwd", shape, apart, None, bwd_floor);
    }
    {
        let n = r * 4 * c;
        let m = Arena::new(be);
        let (inp, out, dout, dinp) = (m.act(n, 4.0)?, m.act(n, 1.0)?, m.act(n, 1.0)?, m.act(n, 1.0)?);
        let shape = format!("{r}x{}", 4 * c);
        let fwd = time_ms(be, 20, || be.gelu_forward(out, inp, n))?;
        row("ours", "gelu_fwd", shape.clone(), fwd, None, Some(2.0 * n as f64 * a));
        let bwd = time_ms(be, 20, || be.gelu_backward(dinp, inp, dout, n))?;
        row("ours", "gelu_bwd", shape, bwd, None, Some(4.0 * n as f64 * a));
    }
    {
        // The MLP's products through GELU (fc forward, fcproj's backward into the hidden layer):
        // GELU in the GEMM's epilogue where the backend fuses it, against the product and the
        // GELU kernel apart (backward: d(act) stored, then gelu_backward into d(pre)).
        let h = 4 * c;
        let m = Arena::new(be);
        let (inp, w_fc, b_fc) = (m.act(r * c, 1.0)?, m.act(h * c, 0.1)?, m.act(h, 0.1)?);
        let (pre, out, dpre, dact) = (
            m.act(r * h, 1.0)?,
            m.act(r * h, 1.0)?,
            m.act(r * h, 1.0)?,
            m.act(r * h, 1.0)?,
        );
        let (w_proj, dout) = (m.act(c * h, 0.05)?, m.act(r * c, 1.0)?);
        let (dw, db) = (m.f32s(c * h, 1.0, None)?, m.f32s(c, 1.0, None)?);
        let shape = format!("{r}x{c}x{h}");
        let flop = 2.0 * (r * c * h) as f64;
        let fused = time_ms(be, 10, || {
            be.matmul_gelu_forward(pre, out, inp, w_fc, Some(b_fc), r, c, h)
        })?;
        row("ours", "matmul_gelu_fwd", shape.clone(), fused, Some(flop), None);
        let apart = time_ms(be, 10, || {
            be.matmul_forward(pre, inp, w_fc, Some(b_fc), r, c, h);
            be.gelu_forward(out, pre, r * h);
        })?;
        row(
            "ours-unfused",
            "matmul_gelu_fwd",
            shape.clone(),
            apart,
            Some(flop),
            None,
        );
        // `out` stands for the GELU output the product read.
        let fused = time_ms(be, 10, || {
            be.matmul_backward_dgelu(dpre, None, dw, false, Some(db), dout, out, pre, w_proj, r, h, c)
        })?;
        row("ours", "matmul_dgelu_bwd", shape.clone(), fused, Some(2.0 * flop), None);
        let apart = time_ms(be, 10, || {
            be.matmul_backward(Overwrite::ACCUMULATE, dact, dw, Some(db), dout, out, w_proj, r, h, c);
            be.gelu_backward(dpre, pre, dact, r * h);
        })?;
        row("ours-unfused", "matmul_dgelu_bwd", shape, apart, Some(2.0 * flop), None);
    }

    // The backward of GPT-2's four products with a bias (qkv, attention projection, fc,
    // fcproj) at B·T = 16K (on a GPU): "ours", `matmul_backward` with the bias gradient, as the
    // model calls it; unfused, the same products without it, then `bias_backward`. Both
    // backends sum the bias gradient in a pass of its own over dout after the products, so the
    // two rows time the same work through one call or two. FLOP: both products (dinp and dW);
    // bytes: not the bound (the products are).
    for (c_in, oc) in [(c, 3 * c), (c, c), (c, 4 * c), (4 * c, c)] {
        let m = Arena::new(be);
        let (inp, w, dout, dinp) = (
            m.act(r * c_in, 1.0)?,
            m.act(oc * c_in, 0.1)?,
            m.act(r * oc, 1.0)?,
            m.act(r * c_in, 1.0)?,
        );
        let (dw, db) = (m.f32s(oc * c_in, 1.0, None)?, m.f32s(oc, 1.0, None)?);
        let shape = format!("{r}x{c_in}x{oc}");
        let flop = 4.0 * (r * c_in * oc) as f64;
        let fused = time_ms(be, 10, || {
            be.matmul_backward(Overwrite::ACCUMULATE, dinp, dw, Some(db), dout, inp, w, r, c_in, oc)
        })?;
        row("ours", "matmul_bwd_bias", shape.clone(), fused, Some(flop), None);
        let apart = time_ms(be, 10, || {
            be.matmul_backward(Overwrite::ACCUMULATE, dinp, dw, None, dout, inp, w, r, c_in, oc);
            be.bias_backward(db, dout, r, oc);
        })?;
        row("ours-unfused", "matmul_bwd_bias", shape, apart, Some(flop), None);
    }

    // Cross-entropy forward + backward over vocabularies 32K to 128K (half the tokens: 8K
    // rows on a GPU): "ours", one
    // kernel (training's, `crossentropy_fused`: the row read twice, the second time from L2,
    // written once); "ours-two-kernels", the forward then the gradient written over the logits;
    // unfused, into a second buffer zeroed first.
    for v in [32_768usize, 50_304, 131_072] {
        let bt = (tokens / 2).max(1);
        let m = Arena::new(be);
        let (logits, dlogits) = (m.act(bt * v, 4.0)?, m.act(bt * v, 1.0)?);
        let (targets, losses) = (m.ids(bt, v)?, m.f32s(bt, 1.0, None)?);
        let shape = format!("BT={bt} V={v}");
        let dloss = 1.0 / bt as f32;
        // SAFETY: the targets are ids below V. The in-place backward turns the logits into
        // gradients: later calls read those, which costs the same (the values only steer
        // `expf`).
        let fused = time_ms(be, 5, || unsafe {
            be.crossentropy_fused(losses, logits, targets, dloss, bt, v, v);
        })?;
        let floor = 2.0 * (bt * v) as f64 * a; // read once, written once
        row("ours", "crossentropy_fwd_bwd", shape.clone(), fused, None, Some(floor));
        // SAFETY: as above.
        let two = time_ms(be, 5, || unsafe {
            be.crossentropy_forward(losses, logits, targets, bt, v, v);
            be.crossentropy_backward_in_place(logits, losses, targets, dloss, bt, v, v);
        })?;
        let floor = 3.0 * (bt * v) as f64 * a; // read for the loss, read and written for the gradient
        row(
            "ours-two-kernels",
            "crossentropy_fwd_bwd",
            shape.clone(),
            two,
            None,
            Some(floor),
        );
        // SAFETY: as above.
        let unfused = time_ms(be, 5, || unsafe {
            be.crossentropy_forward(losses, logits, targets, bt, v, v);
            be.zero_act(dlogits, bt * v);
            be.crossentropy_backward(dlogits, logits, targets, dloss, bt, v, v);
        })?;
        row(
            "ours-unfused",
            "crossentropy_fwd_bwd",
            shape,
            unfused,
            None,
            Some(floor),
        );
    }

    // AdamW over GPT-2 124M's parameters: f32 weights, gradients and moments, and under bf16
    // the weight copy written in the same pass.
    {
        let n = 124_475_904usize;
        let m = Arena::new(be);
        let (p, g, mm, vv) = (
            m.f32s(n, 0.1, None)?,
            m.f32s(n, 0.01, None)?,
            m.f32s(n, 0.001, None)?,
            m.f32s(n, 0.0, Some(1e-6))?,
        );
        // Step 10, unclipped, applied.
        let [lr, bias1, bias2, _] = StepState::schedule(1e-4, 0.9, 0.95, 9);
        let step = StepState {
            lr,
            bias1,
            bias2,
            step: 9,
            clip: 1.0,
            apply: 1.0,
            ..Default::default()
        };
        let state = be.alloc::<f32>(StepState::WORDS)?;
        be.write(&state, 0, bytemuck::cast_slice(std::slice::from_ref(&step)))?;
        let copy = match be.act() {
            crate::backend::ActType::Bf16 => Some(be.alloc::<crate::backend::bf16>(n)?),
            crate::backend::ActType::F32 => None,
        };
        let hp = AdamWHyper {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let bytes = n as f64 * (4.0 * 7.0 + if copy.is_some() { 2.0 } else { 0.0 });
        let copy = copy.as_ref().map(|c| c.span());
        let ms = time_ms(be, 5, || {
            be.adamw(p, g, mm, vv, &[(0..n, true)], state.span(), hp, copy)
        })?;
        row("ours", "adamw", format!("{n} params"), ms, None, Some(bytes));
    }
    // FP8 quantization (where the backend has FP8, in bf16): the widths GPT-2's products read.
    if be.fp8() && be.act() == ActType::Bf16 {
        for c in [768usize, 3072] {
            let n = tokens * c;
            let m = Arena::new(be);
            let (src, dst) = (m.act(n, 4.0)?, m.fp8(n, Fp8::E4M3)?);
            let (scale, amax) = (m.f32s(1, 0.0, Some(1.0))?, m.f32s(1, 0.0, Some(0.0))?);
            let ms = time_ms(be, 20, || be.quantize_fp8(dst, amax, src, scale, n, Fp8::E4M3))?;
            row(
                "ours",
                "quantize_fp8",
                format!("{tokens}x{c}"),
                ms,
                None,
                Some((a + 1.0) * n as f64),
            );
        }
        // The residual add and layernorm that also write the next product's E4M3 input, as
        // stored and transposed, against the three kernels. Floor: add_layernorm_fwd's and the
        // copies' two bytes.
        {
            let (r, c) = (tokens, 768usize);
            let n = r * c;
            let m = Arena::new(be);
            let (x, y, sum, out) = (m.act(n, 1.0)?, m.act(n, 1.0)?, m.act(n, 1.0)?, m.act(n, 1.0)?);
            let (w, b) = (m.act(c, 1.0)?, m.act(c, 1.0)?);
            let (copy, dst_t) = (m.fp8_out(n, Fp8::E4M3)?, m.fp8(n, Fp8::E4M3)?);
            let Fp8Out { dst, amax, scale, .. } = copy;
            let (mean, rstd) = (m.f32s(r, 1.0, None)?, m.f32s(r, 1.0, None)?);
            let (shape, bytes) = (format!("{r}x{c}"), Some((4.0 * a + 2.0) * n as f64 + 8.0 * r as f64));
            let fused = time_ms(be, 20, || {
                be.add_layernorm_forward_quantize([sum, out], mean, rstd, [x, y], w, b, [r, c], copy, Some(dst_t))
            })?;
            row("ours", "add_layernorm_fwd_quantize", shape.clone(), fused, None, bytes);
            let apart = time_ms(be, 20, || {
                be.add_layernorm_forward(sum, out, mean, rstd, x, y, w, b, r, c);
                be.quantize_fp8(dst, amax, out, scale, n, Fp8::E4M3);
                be.quantize_fp8_transposed(dst_t, amax, out, scale, [r, c], Fp8::E4M3);
            })?;
            row("ours-unfused", "add_layernorm_fwd_quantize", shape, apart, None, bytes);
        }
        // Attention that also writes its output as the projection's E4M3 input, as stored and
        // transposed, against attention then quantize_fp8_both (T = 1024, or the tokens).
        {
            let (c, nh) = (768usize, 12usize);
            let t = tokens.min(1024);
            let b = tokens / t;
            let n = b * t * c;
            let m = Arena::new(be);
            let (qkv, out) = (m.act(3 * n, 1.0)?, m.act(n, 1.0)?);
            let lse = m.f32s(be.attention_saved_len(b, t, nh), 1.0, Some(0.0))?;
            let (copy, dst_t) = (m.fp8_out(n, Fp8::E4M3)?, m.fp8(n, Fp8::E4M3)?);
            let Fp8Out { dst, amax, scale, .. } = copy;
            let (hs, flop) = (c / nh, Some(2.0 * (b * nh * t * t * (c / nh)) as f64)); // as attention_fwd's
            let shape = format!("B={b} T={t} NH={nh} HS={hs}");
            let fused = time_ms(be, 10, || {
                be.attention_forward_quantize(out, lse, qkv, [b, t, c, nh], copy, dst_t)
            })?;
            row("ours", "attention_fwd_quantize", shape.clone(), fused, flop, None);
            let apart = time_ms(be, 10, || {
                be.attention_forward(out, lse, qkv, b, t, c, nh);
                be.quantize_fp8_both([dst, dst_t], amax, out, scale, [b * t, c], Fp8::E4M3);
            })?;
            row("ours-unfused", "attention_fwd_quantize", shape, apart, flop, None);
        }
        // FP8's gelu' (the MLP's d(pre) as its E5M2 copies, as stored and transposed; gelu(pre)
        // rebuilt as its transposed E4M3 copy; the bias gradient summed), against its five
        // kernels. The separate kernels change d over the calls (in place), not the work.
        {
            let n = tokens * 3072;
            let m = Arena::new(be);
            let (d, pre) = (m.act(n, 1.0)?, m.act(n, 2.0)?);
            let (q, dst_t, at) = (m.fp8_out(n, Fp8::E5M2)?, m.fp8(n, Fp8::E5M2)?, m.fp8_out(n, Fp8::E4M3)?);
            let dbias = m.f32s(3072, 0.0, Some(0.0))?;
            let (shape, bytes) = (format!("{tokens}x3072"), Some((2.0 * a + 3.0) * n as f64));
            let fused = time_ms(be, 20, || {
                be.gelu_backward_fp8(d, pre, [q, at], dst_t, Some(dbias), [tokens, 3072])
            })?;
            row("ours", "gelu_backward_fp8", shape.clone(), fused, None, bytes);
            let apart = time_ms(be, 20, || {
                gelu_backward_fp8_apart(be, d, pre, [q, at], dst_t, Some(dbias), [tokens, 3072])
            })?;
            row("ours-unfused", "gelu_backward_fp8", shape, apart, None, bytes);
        }
        // Into the transpose: a weight's copy for the input gradient's product.
        for [rows_, cols] in [[2304usize, 768], [3072, 768], [768, 3072]] {
            let n = rows_ * cols;
            let m = Arena::new(be);
            let (src, dst) = (m.act(n, 0.1)?, m.fp8(n, Fp8::E4M3)?);
            let (scale, amax) = (m.f32s(1, 0.0, Some(1.0))?, m.f32s(1, 0.0, Some(0.0))?);
            let ms = time_ms(be, 20, || {
                be.quantize_fp8_transposed(dst, amax, src, scale, [rows_, cols], Fp8::E4M3)
            })?;
            row(
                "ours",
                "quantize_fp8_transposed",
                format!("{rows_}x{cols}"),
                ms,
                None,
                Some((a + 1.0) * n as f64),
            );
            // Both of a weight's copies from one read, against the two kernels.
            let plain = m.fp8(n, Fp8::E4M3)?;
            let (shape, bytes) = ([rows_, cols], Some((a + 2.0) * n as f64));
            let both = time_ms(be, 20, || {
                be.quantize_fp8_both([plain, dst], amax, src, scale, shape, Fp8::E4M3)
            })?;
            row(
                "ours",
                "quantize_fp8_both",
                format!("{rows_}x{cols}"),
                both,
                None,
                bytes,
            );
            let apart = time_ms(be, 20, || {
                be.quantize_fp8(plain, amax, src, scale, n, Fp8::E4M3);
                be.quantize_fp8_transposed(dst, amax, src, scale, shape, Fp8::E4M3);
            })?;
            row(
                "ours-unfused",
                "quantize_fp8_both",
                format!("{rows_}x{cols}"),
                apart,
                None,
                bytes,
            );
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    #[test]
    fn cpu_matmul_rows_cover_gpt2s_products_with_their_flop() {
        let be = CpuBackend::new(1).unwrap();
        let opts = KernelOpts {
            tokens: 4,
            square: 32,
            matmul_only: true,
        };
        let rows = kernels(&be, &opts).unwrap();
        let ops: Vec<&str> = rows.iter().map(|r| r.op).collect();
        let mut want = vec!["matmul_peak"];
        for (fwd, bwd, ..) in GPT2_PRODUCTS {
            want.extend([fwd, bwd]);
        }
        assert_eq!(ops, want);
        assert!(rows
            .iter()
            .all(|r| r.kind == "matmul" && r.ms > 0.0 && r.ms.is_finite()));
        assert_eq!(rows[0].flop, Some(2.0 * 32f64.powi(3)));
        let lm_bwd = rows.last().unwrap();
        assert_eq!(lm_bwd.shape, "4x768x50304");
        assert_eq!(lm_bwd.flop, Some(4.0 * 4.0 * 768.0 * 50_304.0));
    }
}
