//! CUDA backend against the CPU backend (the reference), op by op, forward and backward,
//! on random inputs with odd shapes (T not a multiple of 32, C = 48, padded vocabularies).
//! Gradient outputs start from random values, so the tests also check that backward ops
//! ACCUMULATE. Error measure, unless a test says otherwise: the max-norm relative error
//! max|gpu - cpu| / max|cpu| of each output; fp32 tolerance 1e-4.
//!
//! bf16: the inputs are rounded to bf16 first, so the CPU (f32) and the GPU (bf16 storage,
//! f32 arithmetic) compute on the same values, and each output must satisfy
//! |gpu - cpu| ≤ k·2⁻⁸·√K·max|cpu|, K the output's reduction length and k a constant stated
//! per kernel beside its test (`bf16_tol`).
//! Needs a CUDA device: run with `--include-ignored` on a GPU machine.
#![cfg(feature = "cuda")]

mod support;

use common::backend::cpu::CpuBackend;
use common::backend::cuda::{AttentionPath, CudaBackend};
use common::backend::Precision;
use common::backend::{
    bf16, gelu_backward_fp8_apart, token_order, Act, AdamWHyper, Backend, DeviceBuffer, Fp8, Fp8Out, Fp8Slot,
    Overwrite, SgdHyper, Span, StepState,
};

const FP32_TOL: f32 = 1e-4;

fn cpu() -> CpuBackend {
    CpuBackend::new(2).expect("CPU backend")
}

fn gpu(precision: Precision) -> CudaBackend {
    CudaBackend::new(0, precision).unwrap_or_else(|e| panic!("CUDA backend: {e}"))
}

/// Deterministic values uniform in [-scale, scale) (xorshift64*; no dependency).
fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let bits = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 random bits
            scale * (2.0 * bits as f32 / (1u64 << 24) as f32 - 1.0)
        })
        .collect()
}

/// What the inputs of a case are: any f32, or values a bf16 holds exactly.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Inputs {
    F32,
    Bf16,
}

/// `random`, rounded to bf16 when the case is for bf16.
fn rnd(q: Inputs, n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let v = random(n, seed, scale);
    match q {
        Inputs::F32 => v,
        Inputs::Bf16 => v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
    }
}

/// The bf16 bound for an output summed over K terms: k·2⁻⁸·√K, relative to max|cpu|.
fn bf16_tol(k: f32, reduction: usize) -> f32 {
    k * (2.0f32).powi(-8) * (reduction as f32).sqrt()
}

/// The inputs a precision's tests draw: bf16-exact values under bf16, any f32 otherwise.
fn inputs_for(precision: Precision) -> Inputs {
    if precision == Precision::Bf16 {
        Inputs::Bf16
    } else {
        Inputs::F32
    }
}

/// Activations (the backend's type) from f32 values, in a buffer of 4-byte words.
fn upload_act<B: Backend>(be: &B, data: &[f32]) -> B::Buffer<f32> {
    let buf = alloc_act(be, data.len());
    be.upload_act(act(be, &buf), data).expect("upload");
    buf
}

fn alloc_act<B: Backend>(be: &B, n: usize) -> B::Buffer<f32> {
    be.alloc::<f32>(be.act().words(n).max(1)).expect("alloc")
}

fn download_act<B: Backend>(be: &B, buf: &B::Buffer<f32>, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    assert!(be.act().words(n) <= buf.len());
    be.download_act(act(be, buf), &mut out).expect("download");
    be.synchronize().expect("synchronize");
    out
}

/// A buffer of 4-byte words as the backend's activations (two bf16 to a word).
fn act<'a, B: Backend>(be: &B, buf: &'a B::Buffer<f32>) -> Span<'a, Act> {
    buf.span().words_as_all(be.act())
}

fn random_ids(n: usize, seed: u64, below: usize) -> Vec<i32> {
    random(n, seed, 1.0)
        .iter()
        .map(|x| (((x + 1.0) * 0.5 * below as f32) as usize).min(below - 1) as i32)
        .collect()
}

fn upload<B: Backend>(be: &B, data: &[f32]) -> B::Buffer<f32> {
    let buf = be.alloc::<f32>(data.len()).expect("alloc");
    be.write(&buf, 0, data).expect("upload");
    buf
}

fn upload_ids<B: Backend>(be: &B, data: &[i32]) -> B::Buffer<i32> {
    let buf = be.alloc(data.len()).expect("alloc");
    be.write(&buf, 0, data).expect("upload");
    buf
}

fn download<B: Backend>(be: &B, buf: &B::Buffer<f32>) -> Vec<f32> {
    let mut out = vec![0.0; buf.len()];
    be.read(buf, 0, &mut out).expect("download");
    be.synchronize().expect("synchronize");
    out
}

/// max|got - want| / max|want| (0 when both are all zeros).
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let diff = got.iter().zip(want).fold(0.0f32, |m, (g, w)| {
        if (g - w).is_nan() {
            f32::NAN
        } else {
            m.max((g - w).abs())
        }
    });
    if scale == 0.0 {
        diff
    } else {
        diff / scale
    }
}

/// Compares named outputs; prints each error (a table line for the run's log), fails over `tol`.
fn check(test: &str, names: &[&str], gpu: &[Vec<f32>], cpu: &[Vec<f32>], tol: f32) {
    let mut bad = Vec::new();
    for ((name, g), c) in names.iter().zip(gpu).zip(cpu) {
        let err = rel_err(g, c);
        eprintln!(
            "PARITY {test:<28} {name:<10} n={:<8} rel_err={err:.2e} tol={tol:.0e}",
            c.len()
        );
        if err.is_nan() || err > tol {
            bad.push(format!("{name}: {err:.3e} > {tol:.0e}"));
        }
    }
    assert!(bad.is_empty(), "{test}: {}", bad.join(", "));
}

// ---- FP8 ----------------------------------------------------------------------------

/// `values` quantized by `be` with `scale` into `format`: the bits, and the amax.
fn quantized<B: Backend>(be: &B, values: &[f32], scale: f32, format: Fp8) -> (B::Buffer<u8>, Vec<u8>, f32) {
    let n = values.len();
    let (src, s, amax) = (upload_act(be, values), upload(be, &[scale]), upload(be, &[0.0]));
    let dst = be.alloc::<u8>(n).expect("alloc");
    be.quantize_fp8(dst.span(), amax.span(), act(be, &src), s.span(), n, format);
    let mut bits = vec![0u8; n];
    be.read(&dst, 0, &mut bits).expect("read");
    let top = download(be, &amax)[0];
    (dst, bits, top)
}

/// An FP8 product on `be`: x (R,K) and y (S,K) quantized there from bf16-exact values, then
/// out = x·yᵀ·dequant (+ bias). The quantized bits (as floats), both amaxes and the output.
fn fp8_case<B: Backend>(be: &B, [r, s, k]: [usize; 3], formats: [Fp8; 2], with_bias: bool) -> Vec<Vec<f32>> {
    let (x, xbits, xmax) = quantized(be, &rnd(Inputs::Bf16, r * k, 31, 600.0), 0.5, formats[0]);
    let (y, ybits, ymax) = quantized(be, &rnd(Inputs::Bf16, s * k, 32, 3.0), 16.0, formats[1]);
    let bias = upload_act(be, &rnd(Inputs::Bf16, s, 33, 1.0));
    let (dx, dy, out) = (upload(be, &[2.0]), upload(be, &[0.0625]), alloc_act(be, r * s));
    let bias_arg = with_bias.then(|| act(be, &bias));
    be.matmul_fp8(
        act(be, &out),
        x.span(),
        y.span(),
        bias_arg,
        [dx.span(), dy.span()],
        [r, s, k],
        formats,
    );
    let floats = |b: &[u8]| b.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    vec![
        floats(&xbits),
        floats(&ybits),
        vec![xmax, ymax],
        download_act(be, &out, r * s),
    ]
}

/// `matmul_fp8_weight_grad` on `be`: dw (R,S) (+)= x (R,K) · yᵀ · dequant in f32, x E5M2 (an
/// output gradient's transposed copy) and y E4M3 (an input's), quantized there from bf16-exact
/// values, dw starting from values of its own.
fn fp8_weight_grad_case<B: Backend>(be: &B, [r, s, k]: [usize; 3], overwrite: bool) -> Vec<f32> {
    let (x, _, _) = quantized(be, &rnd(Inputs::Bf16, r * k, 35, 1e-3), 65536.0, Fp8::E5M2);
    let (y, _, _) = quantized(be, &rnd(Inputs::Bf16, s * k, 36, 2.0), 64.0, Fp8::E4M3);
    let (dx, dy) = (upload(be, &[1.0 / 65536.0]), upload(be, &[1.0 / 64.0]));
    let dw = upload(be, &rnd(Inputs::F32, r * s, 37, 0.1));
    let formats = [Fp8::E5M2, Fp8::E4M3];
    be.matmul_fp8_weight_grad(
        overwrite,
        dw.span(),
        x.span(),
        y.span(),
        [dx.span(), dy.span()],
        [r, s, k],
        formats,
    );
    download(be, &dw)
}

/// The quantization is the CPU's bit for bit (the hardware's conversion is the encoding
/// `Fp8::encode` implements), amax included; the product's f32 sums differ from the CPU's only
/// in order, so the output is the CPU's within its bf16 rounding (the MLP's first product's
/// apart: see its GELU case).
#[test]
#[ignore = "needs a CUDA device"]
fn fp8_matches_cpu() {
    let _gpu = support::one_at_a_time();
    let be = gpu(Precision::Bf16);
    if !be.fp8() {
        eprintln!(
            "SKIPPED: {} has no FP8 products (compute capability 8.9 or newer)",
            be.name()
        );
        return;
    }
    use Fp8::{E4M3, E5M2};
    for (shape, formats, bias) in [
        ([64, 128, 256], [E4M3, E4M3], true),
        ([256, 2304, 768], [E4M3, E4M3], true),
        ([48, 32, 16], [E5M2, E4M3], false),
        ([128, 768, 3072], [E5M2, E4M3], false),
        ([32, 64, 48], [E4M3, E5M2], true),
    ] {
        let want = fp8_case(&cpu(), shape, formats, bias);
        let got = fp8_case(&be, shape, formats, bias);
        let what = format!("fp8 {shape:?} {formats:?} bias={bias}");
        for (i, name) in ["x bits", "y bits", "amax"].iter().enumerate() {
            assert_eq!(got[i], want[i], "{what}: {name}");
        }
        check(&what, &["out"], &got[3..], &want[3..], 2f32.powi(-8));
    }
    // The weight gradient's product into f32, written and added to, at a batch's K: the CPU's
    // sums, in another order and with the FP8 tensor cores' partial sums (fewer bits than f32
    // between their promotions into f32).
    for (shape, overwrite) in [
        ([768, 3072, 4096], true),
        ([256, 768, 1024], false),
        ([48, 32, 64], false),
    ] {
        let what = format!("fp8 weight gradient {shape:?} overwrite={overwrite}");
        let (want, got) = (
            fp8_weight_grad_case(&cpu(), shape, overwrite),
            fp8_weight_grad_case(&be, shape, overwrite),
        );
        check(&what, &["dw"], &[got], &[want], 2f32.powi(-10));
    }
    // A length the vector path does not take (not a multiple of 8).
    let odd = rnd(Inputs::Bf16, 1001, 34, 100.0);
    for format in [E4M3, E5M2] {
        let (_, got, gmax) = quantized(&be, &odd, 4.0, format);
        let (_, want, wmax) = quantized(&cpu(), &odd, 4.0, format);
        assert_eq!((got, gmax), (want, wmax), "{format:?}: 1001 values");
    }
    // Into the transpose (a weight's copy for the input gradient): whole and partial tiles of
    // the 64 x 64 kernel, and a shape it does not take (not multiples of 8).
    for [rows, cols] in [[768, 2304], [200, 40], [36, 20]] {
        let values = rnd(Inputs::Bf16, rows * cols, 35, 0.3);
        for format in [E4M3, E5M2] {
            let got = quantized_transposed(&be, &values, [rows, cols], 256.0, format);
            let want = quantized_transposed(&cpu(), &values, [rows, cols], 256.0, format);
            assert_eq!(got, want, "{format:?}: transposed {rows}x{cols}");
            // Both copies at once (a weight's): the plain one and the transpose, one amax.
            let both = quantized_both(&be, &values, [rows, cols], 256.0, format);
            assert!(both == quantized_both(&cpu(), &values, [rows, cols], 256.0, format));
            assert!(both.1 == want.0 && both.2 == want.1, "{format:?}: both {rows}x{cols}");
        }
    }
    // Through GELU and gelu' (the epilogues of cuBLASLt on the GPU, the separate ops on the
    // CPU). gelu(pre) exists only as its E4M3 copy, which the GPU takes of the product in f32
    // and the CPU of pre rounded: a value may round to the neighbouring E4M3 step (2^-3 of
    // the largest at most). At 2^12 most values saturate: still no NaN, the format's largest.
    for (shape, out_scale) in [
        ([256, 3072, 768], 16.0),
        ([128, 768, 3072], 16.0),
        ([128, 768, 3072], 4096.0),
    ] {
        let (want, got) = (
            fp8_gelu_case(&cpu(), shape, out_scale),
            fp8_gelu_case(&be, shape, out_scale),
        );
        let what = format!("fp8 gelu {shape:?} at {out_scale}");
        // pre in bf16, its partial sums added in the tensor cores' precision (FAST_ACCUM: 0.3%
        // to 0.4% of the largest value apart on an H200); d(pre) in E5M2 (two bits of
        // mantissa: a bf16 step between the two backends may move a value across a rounding
        // boundary) and the rest in E4M3.
        check(&what, &["pre"], &got[..1], &want[..1], 2f32.powi(-7));
        check(&what, &["dpre (E5M2)"], &got[1..2], &want[1..2], 2f32.powi(-2));
        let names = ["act (E4M3)", "out (E4M3)", "its amax"];
        check(&what, &names, &got[2..], &want[2..], 2f32.powi(-3));
        let top = got[3].iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(top <= 448.0 / out_scale, "{what}: {top} above the format's largest");
        if out_scale > 1000.0 {
            assert_eq!(top, 448.0 / out_scale, "{what}: saturated to the format's largest");
        }
    }
    // FP8's gelu' in one pass, with the bias gradient and without: the separate ops' bits, on
    // the GPU. The bias sums at a whole and a cut last chunk, into a gradient that takes float4
    // stores (finished in the same launch) and one that does not (a second pass), and at a
    // shape the one pass does not take.
    for (shape, bias) in [
        ([128, 3072], None),
        ([128, 3072], Some(0)),
        ([544, 768], Some(0)),
        ([544, 768], Some(1)),
        ([40, 24], Some(0)),
    ] {
        let fused = gelu_fp8_case(&be, shape, bias, true);
        assert!(
            fused == gelu_fp8_case(&be, shape, bias, false),
            "gelu_backward_fp8 {shape:?}, bias at {bias:?}"
        );
    }
    // Attention's backward with dqkv's E5M2 copies (the qkv product's output gradient, as
    // stored and transposed): the two ops' bits, on the GPU, with the bias sums and without, at
    // shapes whose last tile is whole and cut, and at a length the fused copies do not take (T
    // not a multiple of 16).
    for (b, t, c, nh) in [(2, 256, 768, 12), (1, 208, 128, 2), (1, 200, 128, 2)] {
        for with_bias in [true, false] {
            let fused = attention_quantize_case(&be, [b, t, c, nh], with_bias, true);
            let apart = attention_quantize_case(&be, [b, t, c, nh], with_bias, false);
            assert!(
                fused == apart,
                "attention_backward_quantize B={b} T={t} C={c} bias {with_bias}"
            );
        }
    }
    // Attention's forward with out's E4M3 copies (the projection's input, as stored and
    // transposed): the two ops' bits, on the GPU, at shapes whose last tile is whole and cut,
    // and at a length the fused copies do not take (T not a multiple of 16).
    for shape in [[2, 256, 768, 12], [1, 208, 128, 2], [1, 200, 128, 2]] {
        let fused = attention_forward_quantize_case(&be, shape, true);
        assert!(
            fused == attention_forward_quantize_case(&be, shape, false),
            "attention_forward_quantize {shape:?}"
        );
    }
    // The layernorm that writes the next product's FP8 input, and with it that input
    // transposed: the separate ops' bits, on the GPU (shapes of whole 32-row blocks take the
    // transposed copy in the same pass, and of 16-row ones where 32 rows do not fit the shared
    // memory (C 1600); others not).
    for shape in [[256, 768], [64, 1280], [48, 1600], [40, 20], [24, 18]] {
        for transposed in [false, true] {
            let fused = add_layernorm_quantize_case(&be, shape, transposed, true);
            assert!(
                fused == add_layernorm_quantize_case(&be, shape, transposed, false),
                "add_layernorm_forward_quantize {shape:?}, transposed {transposed}"
            );
        }
    }
    // The weight half of a product's backward: matmul_backward's dw and dbias, bit for bit.
    for overwrite in [false, true] {
        let (whole, half) = weight_backward_case(&be, [256, 128, 384], overwrite);
        assert!(whole == half, "matmul_weight_backward, overwrite {overwrite}");
    }
    // Delayed scaling's step: the CPU's bits.
    let (slots, history) = rescale_case(&be);
    assert_eq!((slots, history), rescale_case(&cpu()), "fp8_rescale");
}

/// `matmul_fp8_gelu` (pre, and gelu(pre)'s E4M3 copy at `out_scale`), then an FP8 product into
/// d(act) and `gelu_backward_fp8` from that pre, on `be`, the operands quantized there from
/// bf16-exact values: pre, d(pre) (its E5M2 copy's values), the rebuilt act (its transposed
/// E4M3 copy's values), the forward copy's values (each scaled back) and its amax.
fn fp8_gelu_case<B: Backend>(be: &B, [r, s, k]: [usize; 3], out_scale: f32) -> Vec<Vec<f32>> {
    let (x, _, _) = quantized(be, &rnd(Inputs::Bf16, r * k, 51, 2.0), 64.0, Fp8::E4M3);
    let (y, _, _) = quantized(be, &rnd(Inputs::Bf16, s * k, 52, 0.05), 2048.0, Fp8::E4M3);
    let (g, _, _) = quantized(be, &rnd(Inputs::Bf16, r * k, 53, 1e-3), 65536.0, Fp8::E5M2);
    let (yt, _, _) = quantized(be, &rnd(Inputs::Bf16, s * k, 54, 0.05), 2048.0, Fp8::E4M3);
    let bias = upload_act(be, &rnd(Inputs::Bf16, s, 55, 0.5));
    let scales = [
        upload(be, &[1.0 / 64.0]),
        upload(be, &[1.0 / 2048.0]),
        upload(be, &[1.0 / 65536.0]),
    ];
    let (pre, scratch, dpre) = (alloc_act(be, r * s), alloc_act(be, r * s), alloc_act(be, r * s));
    // The output's slot words as a graph has them: the scale one word past an aligned address.
    let slot = upload(be, &[1.0 / out_scale, out_scale, 0.0, 448.0]);
    let out_q = be.alloc::<u8>(r * s).expect("alloc");
    let out = Fp8Out {
        dst: out_q.span(),
        amax: slot.span().slice(2, 1),
        scale: slot.span().slice(1, 1),
        format: Fp8::E4M3,
    };
    let dq = [scales[0].span(), scales[1].span()];
    be.matmul_fp8_gelu(
        act(be, &pre),
        act(be, &scratch),
        out,
        x.span(),
        y.span(),
        Some(act(be, &bias)),
        dq,
        [r, s, k],
    );
    // d(act) = g · ytᵀ into dpre's buffer, then gelu' into d(pre)'s E5M2 copies and gelu(pre)'s
    // transposed E4M3 one.
    let dq = [scales[2].span(), scales[1].span()];
    be.matmul_fp8(
        act(be, &dpre),
        g.span(),
        yt.span(),
        None,
        dq,
        [r, s, k],
        [Fp8::E5M2, Fp8::E4M3],
    );
    let outs = GeluFp8Outputs::new(be, r * s, [4096.0, 16.0]);
    be.gelu_backward_fp8(
        act(be, &dpre),
        act(be, &pre),
        outs.copies(),
        outs.qt.span(),
        None,
        [r, s],
    );
    let [q, qt, at] = outs.bytes(be);
    // The transposed copy holds the stored one's bytes.
    let transposed = (0..r * s).all(|i| qt[(i % s) * r + i / s] == q[i]);
    assert!(
        transposed,
        "gelu_backward_fp8 {:?}: the transposed E5M2 copy",
        [r, s, k]
    );
    let dpre_values = q.iter().map(|&b| Fp8::E5M2.decode(b) / 4096.0).collect();
    let act_values = (0..r * s)
        .map(|i| Fp8::E4M3.decode(at[(i % s) * r + i / s]) / 16.0)
        .collect();
    let mut out_bits = vec![0u8; r * s];
    be.read(&out_q, 0, &mut out_bits).expect("read");
    let out_values = out_bits.iter().map(|&b| Fp8::E4M3.decode(b) / out_scale).collect();
    vec![
        download_act(be, &pre, r * s),
        dpre_values,
        act_values,
        out_values,
        vec![download(be, &slot)[2]],
    ]
}

/// `gelu_backward_fp8` on `be` (`fused`), or its separate ops there, over R×C values, with the
/// bias gradient (added to ones, at that offset into its buffer) or without: the three FP8
/// copies' bits, the two amaxes', the bias gradient's.
fn gelu_fp8_case<B: Backend>(be: &B, [r, c]: [usize; 2], bias: Option<usize>, fused: bool) -> Vec<Vec<u32>> {
    let n = r * c;
    let (d, pre) = (
        upload_act(be, &rnd(Inputs::Bf16, n, 71, 1e-2)),
        upload_act(be, &rnd(Inputs::Bf16, n, 72, 3.0)),
    );
    let outs = GeluFp8Outputs::new(be, n, [8192.0, 64.0]);
    let (copies, qt) = (outs.copies(), outs.qt.span());
    let at_ = bias.unwrap_or(0);
    let sums = upload(be, &vec![1.0; at_ + c]);
    let dbias = bias.map(|at| sums.span().slice(at, c));
    let (d, pre_) = (act(be, &d), act(be, &pre));
    if fused {
        be.gelu_backward_fp8(d, pre_, copies, qt, dbias, [r, c]);
    } else {
        gelu_backward_fp8_apart(be, d, pre_, copies, qt, dbias, [r, c]);
    }
    let mut got: Vec<Vec<u32>> = (outs.bytes(be).into_iter())
        .map(|b| b.into_iter().map(u32::from).collect())
        .collect();
    got.push(download(be, &outs.words).iter().map(|x| x.to_bits()).collect());
    got.push(download(be, &sums).iter().map(|x| x.to_bits()).collect());
    got
}

/// `gelu_backward_fp8`'s outputs for n values on one backend: d(pre)'s E5M2 copy (`q`) and its
/// transposed one (`qt`), gelu(pre)'s transposed E4M3 copy (`at`), and `words`: d(pre)'s scale
/// and amax, then act's.
struct GeluFp8Outputs<B: Backend> {
    q: B::Buffer<u8>,
    qt: B::Buffer<u8>,
    at: B::Buffer<u8>,
    words: B::Buffer<f32>,
}

impl<B: Backend> GeluFp8Outputs<B> {
    fn new(be: &B, n: usize, [dpre_scale, act_scale]: [f32; 2]) -> Self {
        let alloc = || be.alloc::<u8>(n).expect("alloc");
        let words = upload(be, &[dpre_scale, 0.0, act_scale, 0.0]);
        GeluFp8Outputs {
            q: alloc(),
            qt: alloc(),
            at: alloc(),
            words,
        }
    }

    /// The two copies' `Fp8Out`s, as the op takes them.
    fn copies(&self) -> [Fp8Out<'_>; 2] {
        let words = self.words.span();
        [(self.q.span(), 0, Fp8::E5M2), (self.at.span(), 2, Fp8::E4M3)].map(|(dst, at, format)| Fp8Out {
            dst,
            amax: words.slice(at + 1, 1),
            scale: words.slice(at, 1),
            format,
        })
    }

    /// The three copies' bytes: q, qt, at.
    fn bytes(&self, be: &B) -> [Vec<u8>; 3] {
        [&self.q, &self.qt, &self.at].map(|buf| {
            let mut v = vec![0u8; buf.len()];
            be.read(buf, 0, &mut v).expect("read");
            v
        })
    }
}

/// `attention_backward_quantize` on `be` (`fused`), or its two ops there: dqkv's bits, the bias
/// gradient's, the E5M2 copies' (as stored and transposed), the amax's.
fn attention_quantize_case<B: Backend>(
    be: &B,
    [b, t, c, nh]: [usize; 4],
    with_bias: bool,
    fused: bool,
) -> Vec<Vec<u32>> {
    let n = b * t * 3 * c;
    let qkv = upload_act(be, &rnd(Inputs::Bf16, n, 81, 1.0));
    let out = alloc_act(be, b * t * c);
    let saved = be.alloc::<f32>(be.attention_saved_len(b, t, nh)).unwrap();
    let dout = upload_act(be, &rnd(Inputs::Bf16, b * t * c, 82, 1.0));
    let dqkv = upload_act(be, &rnd(Inputs::Bf16, n, 83, 100.0));
    let dbias = upload(be, &rnd(Inputs::Bf16, 3 * c, 84, 1.0));
    let copies = CopyBuffers::new(be, n, 4096.0, Fp8::E5M2);
    be.attention_forward(act(be, &out), saved.span(), act(be, &qkv), b, t, c, nh);
    let bias = with_bias.then(|| dbias.span());
    let (dq, o, s) = (act(be, &dqkv), act(be, &out), saved.span());
    if fused {
        let (dout, qkv) = (act(be, &dout), act(be, &qkv));
        be.attention_backward_quantize(
            dq,
            bias,
            dout,
            qkv,
            o,
            s,
            b,
            t,
            c,
            nh,
            copies.out(),
            copies.dst_t.span(),
        );
    } else {
        be.attention_backward(true, dq, bias, act(be, &dout), act(be, &qkv), o, s, b, t, c, nh);
        copies.quantize_apart(be, dq, [b * t, 3 * c]);
    }
    let mut got = vec![
        download_act(be, &dqkv, n).iter().map(|x| x.to_bits()).collect(),
        download(be, &dbias).iter().map(|x| x.to_bits()).collect(),
    ];
    got.extend(copies.bits(be));
    got
}

/// An FP8 op's two copies under test, as stored and transposed, with their scale and amax.
struct CopyBuffers<B: Backend> {
    dst: B::Buffer<u8>,
    dst_t: B::Buffer<u8>,
    scale: B::Buffer<f32>,
    amax: B::Buffer<f32>,
    format: Fp8,
}

impl<B: Backend> CopyBuffers<B> {
    /// `n` bytes each, at `scale`, the amax at 0.
    fn new(be: &B, n: usize, scale: f32, format: Fp8) -> Self {
        Self {
            dst: be.alloc::<u8>(n).expect("alloc"),
            dst_t: be.alloc::<u8>(n).expect("alloc"),
            scale: upload(be, &[scale]),
            amax: upload(be, &[0.0]),
            format,
        }
    }

    /// The copy as stored, as the fused ops take it.
    fn out(&self) -> Fp8Out<'_> {
        Fp8Out {
            dst: self.dst.span(),
            amax: self.amax.span(),
            scale: self.scale.span(),
            format: self.format,
        }
    }

    /// Both copies of `src` (`shape`) by `quantize_fp8_both`: what a fused op replaces.
    fn quantize_apart(&self, be: &B, src: Span<Act>, shape: [usize; 2]) {
        let both = [self.dst.span(), self.dst_t.span()];
        be.quantize_fp8_both(both, self.amax.span(), src, self.scale.span(), shape, self.format);
    }

    /// The two copies' bytes and the amax's bits.
    fn bits(&self, be: &B) -> [Vec<u32>; 3] {
        let bytes = |buf: &B::Buffer<u8>| {
            let mut v = vec![0u8; buf.len()];
            be.read(buf, 0, &mut v).expect("read");
            v.into_iter().map(u32::from).collect()
        };
        [
            bytes(&self.dst),
            bytes(&self.dst_t),
            vec![download(be, &self.amax)[0].to_bits()],
        ]
    }
}

/// `attention_forward_quantize` on `be` (`fused`), or its two ops there: out's bits, the
/// saved state's, the E4M3 copies' (as stored and transposed), the amax's.
fn attention_forward_quantize_case<B: Backend>(be: &B, [b, t, c, nh]: [usize; 4], fused: bool) -> Vec<Vec<u32>> {
    let n = b * t * c;
    let qkv = upload_act(be, &rnd(Inputs::Bf16, 3 * n, 85, 1.0));
    let out = alloc_act(be, n);
    let saved_len = be.attention_saved_len(b, t, nh);
    let saved = be.alloc::<f32>(saved_len).unwrap();
    let copies = CopyBuffers::new(be, n, 64.0, Fp8::E4M3);
    let (o, s, x) = (act(be, &out), saved.span(), act(be, &qkv));
    if fused {
        be.attention_forward_quantize(o, s, x, [b, t, c, nh], copies.out(), copies.dst_t.span());
    } else {
        be.attention_forward(o, s, x, b, t, c, nh);
        copies.quantize_apart(be, o, [b * t, c]);
    }
    let mut got = vec![
        download_act(be, &out, n).iter().map(|x| x.to_bits()).collect(),
        download(be, &saved).iter().map(|x| x.to_bits()).collect(),
    ];
    got.extend(copies.bits(be));
    got
}

/// `add_layernorm_forward_quantize` on `be` (`fused`), or its separate ops there, with the
/// transposed copy or without: every output's bits (sum, out, mean, rstd, the FP8 copies, the
/// amax).
fn add_layernorm_quantize_case<B: Backend>(be: &B, [r, c]: [usize; 2], transposed: bool, fused: bool) -> Vec<Vec<u32>> {
    let q = Inputs::Bf16;
    let (a, b) = (
        upload_act(be, &rnd(q, r * c, 61, 2.0)),
        upload_act(be, &rnd(q, r * c, 62, 2.0)),
    );
    let (w, bias) = (upload_act(be, &rnd(q, c, 63, 1.0)), upload_act(be, &rnd(q, c, 64, 0.5)));
    let (sum, out) = (alloc_act(be, r * c), alloc_act(be, r * c));
    let (mean, rstd) = (upload(be, &vec![0.0; r]), upload(be, &vec![0.0; r]));
    let (dst, dst_t, scale, amax) = (
        be.alloc::<u8>(r * c).expect("alloc"),
        be.alloc::<u8>(r * c).expect("alloc"),
        upload(be, &[32.0]),
        upload(be, &[0.0]),
    );
    let copy = Fp8Out {
        dst: dst.span(),
        amax: amax.span(),
        scale: scale.span(),
        format: Fp8::E4M3,
    };
    let t = transposed.then(|| dst_t.span());
    let (s, o, x, y) = (act(be, &sum), act(be, &out), act(be, &a), act(be, &b));
    let (w, bias) = (act(be, &w), act(be, &bias));
    if fused {
        be.add_layernorm_forward_quantize([s, o], mean.span(), rstd.span(), [x, y], w, bias, [r, c], copy, t);
    } else {
        be.add_layernorm_forward(s, o, mean.span(), rstd.span(), x, y, w, bias, r, c);
        be.quantize_fp8(dst.span(), amax.span(), o, scale.span(), r * c, Fp8::E4M3);
        if let Some(t) = t {
            be.quantize_fp8_transposed(t, amax.span(), o, scale.span(), [r, c], Fp8::E4M3);
        }
    }
    let bytes = |buf: &B::Buffer<u8>| {
        let mut v = vec![0u8; r * c];
        be.read(buf, 0, &mut v).expect("read");
        v.into_iter().map(u32::from).collect::<Vec<u32>>()
    };
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let mut got = vec![
        bits(download_act(be, &sum, r * c)),
        bits(download_act(be, &out, r * c)),
        bits(download(be, &mean)),
        bits(download(be, &rstd)),
        bytes(&dst),
        bits(download(be, &amax)),
    ];
    if transposed {
        got.push(bytes(&dst_t));
    }
    got
}

/// dw and dbias from `matmul_backward`, then from `matmul_weight_backward`, on the same
/// operands and starting values.
fn weight_backward_case<B: Backend>(be: &B, [bt, c, oc]: [usize; 3], overwrite: bool) -> (Vec<f32>, Vec<f32>) {
    let q = Inputs::Bf16;
    let (inp, w, dout) = (
        upload_act(be, &rnd(q, bt * c, 41, 1.0)),
        upload_act(be, &rnd(q, oc * c, 42, 1.0)),
        upload_act(be, &rnd(q, bt * oc, 43, 1.0)),
    );
    let start = (rnd(q, oc * c, 44, 1.0), rnd(q, oc, 45, 1.0));
    let run = |weight_only: bool| {
        let (dw, dbias, dinp) = (upload(be, &start.0), upload(be, &start.1), alloc_act(be, bt * c));
        if weight_only {
            be.matmul_weight_backward(
                overwrite,
                dw.span(),
                Some(dbias.span()),
                act(be, &dout),
                act(be, &inp),
                bt,
                c,
                oc,
            );
        } else {
            let how = Overwrite {
                dinp: true,
                dw: overwrite,
            };
            let (dinp, dout, inp, w) = (act(be, &dinp), act(be, &dout), act(be, &inp), act(be, &w));
            be.matmul_backward(how, dinp, dw.span(), Some(dbias.span()), dout, inp, w, bt, c, oc);
        }
        [download(be, &dw), download(be, &dbias)].concat()
    };
    (run(false), run(true))
}

/// `values` (rows,cols) quantized into the transpose at `scale`: the bits and the amax.
fn quantized_transposed<B: Backend>(
    be: &B,
    values: &[f32],
    shape: [usize; 2],
    scale: f32,
    format: Fp8,
) -> (Vec<u8>, f32) {
    let n = values.len();
    let (src, s, amax) = (upload_act(be, values), upload(be, &[scale]), upload(be, &[0.0]));
    let dst = be.alloc::<u8>(n).expect("alloc");
    be.quantize_fp8_transposed(dst.span(), amax.span(), act(be, &src), s.span(), shape, format);
    let mut bits = vec![0u8; n];
    be.read(&dst, 0, &mut bits).expect("read");
    (bits, download(be, &amax)[0])
}

/// `values` (rows,cols) quantized into both copies at `scale`: the plain bits, the transposed
/// bits and the amax.
fn quantized_both<B: Backend>(
    be: &B,
    values: &[f32],
    shape: [usize; 2],
    scale: f32,
    format: Fp8,
) -> (Vec<u8>, Vec<u8>, f32) {
    let n = values.len();
    let (src, s, amax) = (upload_act(be, values), upload(be, &[scale]), upload(be, &[0.0]));
    let (plain, t) = (be.alloc::<u8>(n).expect("alloc"), be.alloc::<u8>(n).expect("alloc"));
    be.quantize_fp8_both(
        [plain.span(), t.span()],
        amax.span(),
        act(be, &src),
        s.span(),
        shape,
        format,
    );
    let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
    be.read(&plain, 0, &mut a).expect("read");
    be.read(&t, 0, &mut b).expect("read");
    (a, b, download(be, &amax)[0])
}

/// Three rounds of `fp8_rescale` over slots with amax values of every kind (none, tiny, huge,
/// NaN, a power of two exactly at the format's headroom): the slots and histories after.
fn rescale_case<B: Backend>(be: &B) -> (Vec<u32>, Vec<u32>) {
    let amaxes = [0.0, 3.0, 1e-38, 3e38, f32::NAN, 448.0, 0.5, 1e-3, f32::INFINITY];
    let (n, len) = (amaxes.len(), 4);
    let mut fresh: Vec<f32> = (0..n)
        .flat_map(|i| Fp8Slot::fresh(if i % 2 == 0 { Fp8::E4M3 } else { Fp8::E5M2 }))
        .collect();
    let (slots, history) = (upload(be, &fresh), upload(be, &vec![0.0; n * len]));
    for round in 0..3 {
        let mut host = download(be, &slots);
        for (i, a) in amaxes.iter().enumerate() {
            host[i * Fp8Slot::WORDS + Fp8Slot::AMAX] = a * (round + 1) as f32;
        }
        be.write(&slots, 0, &host).expect("write");
        be.fp8_rescale(slots.span(), history.span(), n, len);
    }
    fresh = download(be, &slots);
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect();
    (bits(fresh), bits(download(be, &history)))
}

// ---- encoder ------------------------------------------------------------------------

fn encoder_case<B: Backend>(be: &B, q: Inputs, ids: &[i32], t: usize, c: usize, v: usize) -> Vec<Vec<f32>> {
    let b = ids.len() / t;
    let (tokens, order) = (upload_ids(be, ids), upload_ids(be, &token_order(ids)));
    let wte = upload_act(be, &rnd(q, v * c, 2, 1.0));
    let wpe = upload_act(be, &rnd(q, t * c, 3, 1.0));
    let out = alloc_act(be, b * t * c);
    unsafe {
        be.encoder_forward(
            act(be, &out),
            tokens.span(),
            None,
            act(be, &wte),
            act(be, &wpe),
            b,
            t,
            c,
        )
    };
    let dout = upload_act(be, &rnd(q, b * t * c, 4, 1.0));
    let dwte = upload(be, &rnd(q, v * c, 5, 1.0));
    let dwpe = upload(be, &rnd(q, t * c, 6, 1.0));
    unsafe {
        be.encoder_backward(
            dwte.span(),
            dwpe.span(),
            act(be, &dout),
            tokens.span(),
            order.span(),
            b,
            t,
            c,
        )
    };
    vec![
        download_act(be, &out, b * t * c),
        download(be, &dwte),
        download(be, &dwpe),
    ]
}

/// Ids of text's shape: about `share` of the positions hold token 0 (as " " and "\n" fill
/// a batch of real text), the rest spread over `below` tokens.
fn skewed_ids(n: usize, seed: u64, below: usize, share: f32) -> Vec<i32> {
    let pick = random(n, seed + 1, 1.0);
    random_ids(n, seed, below)
        .into_iter()
        .zip(pick)
        .map(|(id, x)| if (x + 1.0) * 0.5 < share { 0 } else { id })
        .collect()
}

/// The wte gradient sums each token's rows in a fixed order, in chunks of 32 positions where
/// C is a multiple of 8 (runs within a chunk, runs across many chunks, runs that start or end
/// at a chunk's edge), one thread a run otherwise (C = 36).
const ENCODER_CASES: [(usize, usize, usize, usize, f32); 6] = [
    // (b, t, c, vocabulary, share of token 0)
    (3, 37, 48, 11, 0.0),
    (2, 64, 768, 50, 0.0),
    (4, 256, 768, 3, 0.0),   // three runs of ~340 positions: ~11 chunks each
    (8, 128, 64, 1000, 0.6), // one run of ~600, the rest short
    (2, 32, 40, 2, 0.0),     // 64 positions: two chunks, one or two runs
    (2, 100, 36, 7, 0.3),    // C not a multiple of 8: one thread a run
];

#[test]
#[ignore = "needs a CUDA device"]
fn encoder_matches_cpu() {
    let _gpu = support::one_at_a_time();
    for (b, t, c, v, share) in ENCODER_CASES {
        let ids = skewed_ids(b * t, 1, v, share);
        let want = encoder_case(&cpu(), Inputs::F32, &ids, t, c, v);
        let got = encoder_case(&gpu(Precision::Fp32), Inputs::F32, &ids, t, c, v);
        check(
            &format!("encoder b{b} t{t} c{c} v{v} share{share}"),
            &["out", "dwte", "dwpe"],
            &got,
            &want,
            FP32_TOL,
        );
    }
}

// ---- matmul -------------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn matmul_case<B: Backend>(be: &B, q: Inputs, bt: usize, c: usize, oc: usize, with_bias: bool) -> Vec<Vec<f32>> {
    let inp = upload_act(be, &rnd(q, bt * c, 11, 1.0));
    let w = upload_act(be, &rnd(q, oc * c, 12, 0.5));
    let bias = upload_act(be, &rnd(q, oc, 13, 1.0));
    let out = alloc_act(be, bt * oc);
    let bias_arg = with_bias.then(|| act(be, &bias));
    be.matmul_forward(act(be, &out), act(be, &inp), act(be, &w), bias_arg, bt, c, oc);
    let dout = upload_act(be, &rnd(q, bt * oc, 14, 1.0));
    let dinp = upload_act(be, &rnd(q, bt * c, 15, 1.0));
    let dw = upload(be, &rnd(q, oc * c, 16, 1.0));
    let dbias = upload(be, &rnd(q, oc, 17, 1.0));
    let dbias_arg = with_bias.then(|| dbias.span());
    be.matmul_backward(
        Overwrite::ACCUMULATE,
        act(be, &dinp),
        dw.span(),
        dbias_arg,
        act(be, &dout),
        act(be, &inp),
        act(be, &w),
        bt,
        c,
        oc,
    );
    vec![
        download_act(be, &out, bt * oc),
        download_act(be, &dinp, bt * c),
        download(be, &dw),
        download(be, &dbias),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn matmul_matches_cpu() {
    let _gpu = support::one_at_a_time();
    let names = ["out", "dinp", "dw", "dbias"];
    for (bt, c, oc, bias) in [
        (74, 48, 144, true),
        (37, 48, 192, false),
        (333, 768, 2304, true),
        (5, 7, 3, true),
    ] {
        let want = matmul_case(&cpu(), Inputs::F32, bt, c, oc, bias);
        let got = matmul_case(&gpu(Precision::Fp32), Inputs::F32, bt, c, oc, bias);
        check(
            &format!("matmul {bt}x{c}x{oc} bias={bias}"),
            &names,
            &got,
            &want,
            FP32_TOL,
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn matmul_tf32_is_close_to_cpu() {
    let _gpu = support::one_at_a_time();
    // TF32 keeps 10 mantissa bits: tolerance 1e-2 of the output's scale (reference: CPU fp32).
    let (bt, c, oc) = (256, 768, 768);
    let want = matmul_case(&cpu(), Inputs::F32, bt, c, oc, true);
    let got = matmul_case(&gpu(Precision::Tf32), Inputs::F32, bt, c, oc, true);
    check("matmul tf32", &["out", "dinp", "dw", "dbias"], &got, &want, 1e-2);
}

// ---- the MLP's products through GELU (cuBLASLt epilogues) ---------------------------

/// `matmul_gelu_forward` (pre, act) and `matmul_backward_dgelu` (dpre, dw, dbias, and with
/// a bias the first product's, dpre_bias). The backward reads its own random pre and act
/// (bf16-exact under bf16), so that its error does not include the forward's; dpre starts
/// random (it is overwritten), dw and the bias gradients too (they accumulate).
#[allow(clippy::too_many_arguments)]
fn mlp_case<B: Backend>(be: &B, q: Inputs, bt: usize, c: usize, h: usize, oc: usize, with_bias: bool) -> Vec<Vec<f32>> {
    // Weights scaled by 3/√C: pre spreads over GELU's curved part (|x| up to ~4).
    let inp = upload_act(be, &rnd(q, bt * c, 91, 1.0));
    let w_fc = upload_act(be, &rnd(q, h * c, 92, 3.0 / (c as f32).sqrt()));
    let b_fc = upload_act(be, &rnd(q, h, 93, 1.0));
    let (pre, out) = (alloc_act(be, bt * h), alloc_act(be, bt * h));
    let bias = with_bias.then(|| act(be, &b_fc));
    be.matmul_gelu_forward(
        act(be, &pre),
        act(be, &out),
        act(be, &inp),
        act(be, &w_fc),
        bias,
        bt,
        c,
        h,
    );
    let pre_b = upload_act(be, &rnd(q, bt * h, 94, 4.0));
    let act_b = upload_act(be, &rnd(q, bt * h, 95, 2.0));
    let w_proj = upload_act(be, &rnd(q, oc * h, 96, 0.5));
    let dout = upload_act(be, &rnd(q, bt * oc, 97, 1.0));
    let dpre = upload_act(be, &rnd(q, bt * h, 98, 1.0));
    let dw = upload(be, &rnd(q, oc * h, 99, 1.0));
    let dbias = upload(be, &rnd(q, oc, 100, 1.0));
    let dbias_arg = with_bias.then(|| dbias.span());
    let dpre_bias = upload(be, &rnd(q, h, 101, 1.0));
    be.matmul_backward_dgelu(
        act(be, &dpre),
        with_bias.then(|| dpre_bias.span()),
        dw.span(),
        false,
        dbias_arg,
        act(be, &dout),
        act(be, &act_b),
        act(be, &pre_b),
        act(be, &w_proj),
        bt,
        h,
        oc,
    );
    vec![
        download_act(be, &pre, bt * h),
        download_act(be, &out, bt * h),
        download_act(be, &dpre, bt * h),
        download(be, &dw),
        download(be, &dbias),
        download(be, &dpre_bias),
    ]
}

const MLP_NAMES: [&str; 6] = ["pre", "act", "dpre", "dw", "dbias", "dpre_bias"];

/// (BT, C, H, OC, bias): in bf16, H a multiple of 8 runs the epilogues (the auxiliary
/// matrix's leading dimension is H) and H = 36 falls back to the GELU kernels; GPT-2's MLP at
/// BT = 333; a tiny odd one.
const MLP_SHAPES: [(usize, usize, usize, usize, bool); 5] = [
    (74, 48, 192, 48, true),
    (64, 32, 128, 40, false),
    (37, 48, 36, 20, true),
    (333, 768, 3072, 768, true),
    (5, 7, 8, 3, true),
];

#[test]
#[ignore = "needs a CUDA device"]
fn mlp_gelu_matches_cpu() {
    let _gpu = support::one_at_a_time();
    // fp32 at the file's tolerance, tf32 at 1e-2 as the matmul: the products, then the GELU
    // kernels (the epilogues run in bf16 only).
    for (precision, tol) in [(Precision::Fp32, FP32_TOL), (Precision::Tf32, 1e-2)] {
        let gpu = gpu(precision);
        for (bt, c, h, oc, bias) in MLP_SHAPES {
            let want = mlp_case(&cpu(), Inputs::F32, bt, c, h, oc, bias);
            let got = mlp_case(&gpu, Inputs::F32, bt, c, h, oc, bias);
            let test = format!("mlp {precision:?} {bt}x{c}x{h}x{oc} bias={bias}");
            check(&test, &MLP_NAMES, &got, &want, tol);
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gelu_epilogues_run_at_gpt2_shapes_in_bf16_only() {
    let _gpu = support::one_at_a_time();
    // GPT-2 124M's MLP (C = 768, H = 3072): in bf16 cuBLASLt must have an algorithm for both
    // GELU epilogues, or the step silently runs the GELU kernels; fp32 and tf32 make no GELU
    // plan (they run the kernels).
    let gelu_plans = |gpu: &CudaBackend| -> Vec<(String, [usize; 3], bool)> {
        let plans = gpu.epilogue_plans();
        plans.into_iter().filter(|(e, _, _)| e.contains("Gelu")).collect()
    };
    for precision in [Precision::Fp32, Precision::Tf32, Precision::Bf16] {
        let gpu = gpu(precision);
        let q = inputs_for(precision);
        let _ = mlp_case(&gpu, q, 1024, 768, 3072, 768, true);
        let _ = mlp_case(&gpu, q, 1024, 768, 3072, 768, false);
        let plans = gelu_plans(&gpu);
        eprintln!("EPILOGUES {precision:?}: {plans:?}");
        if precision != Precision::Bf16 {
            assert!(plans.is_empty(), "{precision:?}: GELU plans were made: {plans:?}");
            continue;
        }
        for epilogue in ["GeluAux { bias: true }", "DGelu"] {
            let found = plans.iter().any(|(e, _, found)| e == epilogue && *found);
            assert!(
                found,
                "{precision:?}: no cuBLASLt algorithm ran the {epilogue} epilogue, it ran unfused: {plans:?}"
            );
        }
    }
}

// ---- the bias gradient of a product ------------------------------------------------------

/// `matmul_backward` on buffers [dinp, dw, dbias, dout, inp, w] at (BT, C, OC).
fn backward_with_bias<B: Backend>(be: &B, bufs: [&B::Buffer<f32>; 6], (bt, c, oc): (usize, usize, usize)) {
    let [dinp, dw, dbias, dout, inp, w] = bufs;
    be.matmul_backward(
        Overwrite::ACCUMULATE,
        act(be, dinp),
        dw.span(),
        Some(dbias.span()),
        act(be, dout),
        act(be, inp),
        act(be, w),
        bt,
        c,
        oc,
    );
}

/// `matmul_backward` twice, as two micro-batches (each its own inp and dout, the same w),
/// into dinp, dw and dbias that start random: the second call checks that the bias gradient
/// accumulates (grad-accum).
fn bias_grad_case<B: Backend>(be: &B, q: Inputs, bt: usize, c: usize, oc: usize) -> Vec<Vec<f32>> {
    let w = upload_act(be, &rnd(q, oc * c, 121, 0.5));
    let dinp = upload_act(be, &rnd(q, bt * c, 122, 1.0));
    let dw = upload(be, &rnd(q, oc * c, 123, 1.0));
    let dbias = upload(be, &rnd(q, oc, 124, 1.0));
    let mut inputs = Vec::new(); // kept until the queued work has run
    for micro in 0..2 {
        let inp = upload_act(be, &rnd(q, bt * c, 125 + 2 * micro, 1.0));
        let dout = upload_act(be, &rnd(q, bt * oc, 126 + 2 * micro, 1.0));
        backward_with_bias(be, [&dinp, &dw, &dbias, &dout, &inp, &w], (bt, c, oc));
        inputs.push((inp, dout));
    }
    let out = vec![download_act(be, &dinp, bt * c), download(be, &dw), download(be, &dbias)];
    drop(inputs);
    out
}

const BIAS_GRAD_NAMES: [&str; 3] = ["dinp", "dw", "dbias"];

/// (BT, C, OC): GPT-2's qkv and projection at odd BT, a small one; OC = 13 leaves dout's rows
/// unaligned (26 or 52 bytes), so the column sums take their scalar kernels there.
const BIAS_GRAD_SHAPES: [(usize, usize, usize); 4] = [(333, 768, 2304), (256, 768, 768), (74, 48, 144), (37, 48, 13)];

#[test]
#[ignore = "needs a CUDA device"]
fn matmul_bias_grad_matches_cpu() {
    let _gpu = support::one_at_a_time();
    // fp32 at the file's tolerance, tf32 at 1e-2 as the matmul; two accumulating calls each.
    for (precision, tol) in [(Precision::Fp32, FP32_TOL), (Precision::Tf32, 1e-2)] {
        let gpu = gpu(precision);
        for (bt, c, oc) in BIAS_GRAD_SHAPES {
            let want = bias_grad_case(&cpu(), Inputs::F32, bt, c, oc);
            let got = bias_grad_case(&gpu, Inputs::F32, bt, c, oc);
            check(
                &format!("bgrad {precision:?} {bt}x{c}x{oc}"),
                &BIAS_GRAD_NAMES,
                &got,
                &want,
                tol,
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_matmul_bias_grad_is_within_bound() {
    let _gpu = support::one_at_a_time();
    // dinp: two cuBLAS products each rounded into the bf16 buffer (k = 3, one more rounding
    // than the matmul's single update); dw: f32, two products of K = BT (k = 2 as the
    // matmul's); dbias: f32 sums of bf16-exact values over 2·BT rows (k = 1).
    let gpu = gpu(Precision::Bf16);
    for (bt, c, oc) in BIAS_GRAD_SHAPES {
        let want = bias_grad_case(&cpu(), Inputs::Bf16, bt, c, oc);
        let got = bias_grad_case(&gpu, Inputs::Bf16, bt, c, oc);
        check_bf16(
            &format!("bgrad {bt}x{c}x{oc}"),
            &BIAS_GRAD_NAMES,
            &got,
            &want,
            &[(3.0, oc), (2.0, 2 * bt), (1.0, 2 * bt)],
        );
    }
}

// ---- layernorm ----------------------------------------------------------------------

fn layernorm_case<B: Backend>(be: &B, q: Inputs, bt: usize, c: usize) -> Vec<Vec<f32>> {
    // An offset and a spread per row, as activations have.
    let x: Vec<f32> = random(bt * c, 21, 2.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v + (i / c) as f32 * 0.1)
        .map(|v| {
            if q == Inputs::Bf16 {
                bf16::from_f32(v).to_f32()
            } else {
                v
            }
        })
        .collect();
    let inp = upload_act(be, &x);
    let w = upload_act(be, &rnd(q, c, 22, 1.0));
    let b = upload_act(be, &rnd(q, c, 23, 1.0));
    let (out, mean, rstd) = (
        alloc_act(be, bt * c),
        be.alloc::<f32>(bt).unwrap(),
        be.alloc::<f32>(bt).unwrap(),
    );
    be.layernorm_forward(
        act(be, &out),
        mean.span(),
        rstd.span(),
        act(be, &inp),
        act(be, &w),
        act(be, &b),
        bt,
        c,
    );
    let dout = upload_act(be, &rnd(q, bt * c, 24, 1.0));
    let dinp = upload_act(be, &rnd(q, bt * c, 25, 1.0));
    let dw = upload(be, &rnd(q, c, 26, 1.0));
    let db = upload(be, &rnd(q, c, 27, 1.0));
    be.layernorm_backward(
        act(be, &dinp),
        dw.span(),
        db.span(),
        act(be, &dout),
        act(be, &inp),
        act(be, &w),
        mean.span(),
        rstd.span(),
        bt,
        c,
    );
    vec![
        download_act(be, &out, bt * c),
        download(be, &mean),
        download(be, &rstd),
        download_act(be, &dinp, bt * c),
        download(be, &dw),
        download(be, &db),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn layernorm_matches_cpu() {
    let _gpu = support::one_at_a_time();
    let names = ["out", "mean", "rstd", "dinp", "dw", "db"];
    // C a multiple of 4 up to 1664 takes the one-pass backward (each of its widths: 768, 1024,
    // 1280, 1664; rows past a block of 64 and a partial last block); 33 and 5 the two-pass one.
    for (bt, c) in [
        (74, 48),
        (1, 5),
        (300, 768),
        (600, 33),
        (130, 1024),
        (65, 1280),
        (70, 1600),
    ] {
        let want = layernorm_case(&cpu(), Inputs::F32, bt, c);
        let got = layernorm_case(&gpu(Precision::Fp32), Inputs::F32, bt, c);
        check(&format!("layernorm {bt}x{c}"), &names, &got, &want, FP32_TOL);
    }
}

// ---- the residual add fused into layernorm --------------------------------------------

/// `add_layernorm_forward` (sum, out, mean, rstd), then `add_layernorm_backward` with a copy
/// (dsum, copy, dw, db, and dbias: a product's bias gradient from dsum). The backward reads its own sum (bf16-exact under bf16) and that sum's
/// statistics from `layernorm_forward`, so that its error does not include the forward's
/// rounding of the sum; dsum, dw, db and dbias start random (they accumulate), the copy too
/// (it is overwritten).
fn add_layernorm_case<B: Backend>(be: &B, q: Inputs, bt: usize, c: usize) -> Vec<Vec<f32>> {
    // The residual stream with a small offset per row, and a branch output to add to it.
    let offset = |i: usize| ((i / c) % 10) as f32 * 0.1;
    let x: Vec<f32> = rnd(q, bt * c, 31, 2.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v + offset(i))
        .collect();
    let x = rnd_to(q, x);
    let a = upload_act(be, &x);
    let b = upload_act(be, &rnd(q, bt * c, 32, 1.0));
    let w = upload_act(be, &rnd(q, c, 33, 1.0));
    let bias = upload_act(be, &rnd(q, c, 34, 1.0));
    let (sum, out) = (alloc_act(be, bt * c), alloc_act(be, bt * c));
    let (mean, rstd) = (be.alloc::<f32>(bt).unwrap(), be.alloc::<f32>(bt).unwrap());
    let (w_p, bias_p) = (act(be, &w), act(be, &bias));
    be.add_layernorm_forward(
        act(be, &sum),
        act(be, &out),
        mean.span(),
        rstd.span(),
        act(be, &a),
        act(be, &b),
        w_p,
        bias_p,
        bt,
        c,
    );
    let sum_b: Vec<f32> = rnd(q, bt * c, 35, 2.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v + offset(i))
        .collect();
    let sum_b = upload_act(be, &rnd_to(q, sum_b));
    let (mean_b, rstd_b, scratch) = (
        be.alloc::<f32>(bt).unwrap(),
        be.alloc::<f32>(bt).unwrap(),
        alloc_act(be, bt * c),
    );
    be.layernorm_forward(
        act(be, &scratch),
        mean_b.span(),
        rstd_b.span(),
        act(be, &sum_b),
        w_p,
        bias_p,
        bt,
        c,
    );
    let dout = upload_act(be, &rnd(q, bt * c, 36, 1.0));
    let dsum = upload_act(be, &rnd(q, bt * c, 37, 1.0));
    let copy = upload_act(be, &rnd(q, bt * c, 38, 1.0));
    let dw = upload(be, &rnd(q, c, 39, 1.0));
    let db = upload(be, &rnd(q, c, 40, 1.0));
    let dbias = upload(be, &rnd(q, c, 41, 1.0));
    be.add_layernorm_backward(
        act(be, &dsum),
        Some(act(be, &copy)),
        Some(dbias.span()),
        dw.span(),
        db.span(),
        act(be, &dout),
        act(be, &sum_b),
        w_p,
        mean_b.span(),
        rstd_b.span(),
        bt,
        c,
    );
    vec![
        download_act(be, &sum, bt * c),
        download_act(be, &out, bt * c),
        download(be, &mean),
        download(be, &rstd),
        download_act(be, &dsum, bt * c),
        download_act(be, &copy, bt * c),
        download(be, &dw),
        download(be, &db),
        download(be, &dbias),
    ]
}

/// Values rounded to bf16 when the case is for bf16.
fn rnd_to(q: Inputs, v: Vec<f32>) -> Vec<f32> {
    match q {
        Inputs::F32 => v,
        Inputs::Bf16 => v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
    }
}

const ADD_LN_NAMES: [&str; 9] = ["sum", "out", "mean", "rstd", "dsum", "copy", "dw", "db", "dbias"];

/// (BT, C): C = 48 and 768 run the fused forward kernel; C = 33 (not a multiple of 4) falls
/// back to the two ops forward and the scalar dinp kernel (which writes the copy too).
const ADD_LN_SHAPES: [(usize, usize); 4] = [(74, 48), (1, 8), (300, 768), (600, 33)];

#[test]
#[ignore = "needs a CUDA device"]
fn add_layernorm_matches_cpu() {
    let _gpu = support::one_at_a_time();
    // fp32 and tf32 (no product here: the same kernels) at the file's tolerance.
    for precision in [Precision::Fp32, Precision::Tf32] {
        let gpu = gpu(precision);
        for (bt, c) in ADD_LN_SHAPES {
            let want = add_layernorm_case(&cpu(), Inputs::F32, bt, c);
            let got = add_layernorm_case(&gpu, Inputs::F32, bt, c);
            let test = format!("add_layernorm {precision:?} {bt}x{c}");
            check(&test, &ADD_LN_NAMES, &got, &want, FP32_TOL);
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_add_layernorm_is_within_bound() {
    let _gpu = support::one_at_a_time();
    // sum: one rounding of a two-term sum (k = 1, K = 2, as `add`); out: the sum's rounding
    // (relative 2⁻⁹ of |x| ≤ 3, against a row spread of about 1) through the normalisation,
    // then its own rounding (k = 2); mean, rstd: f32 statistics of the rounded sum (k = 2);
    // backward as `layernorm_backward` (dsum read back and updated, k = 2; the copy is the
    // same values; dw and db f32 sums over rows, k = 1; dbias f32 sums of the rounded dsum,
    // whose error relative to its largest value is dsum's, as dsum's bound).
    let gpu = gpu(Precision::Bf16);
    for (bt, c) in [(300, 768), (74, 48), (600, 33)] {
        let want = add_layernorm_case(&cpu(), Inputs::Bf16, bt, c);
        let got = add_layernorm_case(&gpu, Inputs::Bf16, bt, c);
        check_bf16(
            &format!("add_layernorm {bt}x{c}"),
            &ADD_LN_NAMES,
            &got,
            &want,
            &[
                (1.0, 2),
                (2.0, c),
                (2.0, c),
                (2.0, c),
                (2.0, c),
                (2.0, c),
                (1.0, bt),
                (1.0, bt),
                (2.0, c),
            ],
        );
    }
}

// ---- attention ----------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn attention_case<B: Backend>(be: &B, q: Inputs, b: usize, t: usize, c: usize, nh: usize) -> Vec<Vec<f32>> {
    attention_case_scaled(be, q, b, t, c, nh, 1.0)
}

/// [`attention_case`] with q, k and v uniform in [-scale, scale): at scale 1 the scores are
/// small and the softmax nearly flat; at 4 (scores of ±20 and more) it is peaked, as a
/// trained model's attention is.
#[allow(clippy::too_many_arguments)]
fn attention_case_scaled<B: Backend>(
    be: &B,
    q: Inputs,
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
    scale: f32,
) -> Vec<Vec<f32>> {
    let qkv = upload_act(be, &rnd(q, b * t * 3 * c, 31, scale));
    let out = alloc_act(be, b * t * c);
    let saved = be.alloc::<f32>(be.attention_saved_len(b, t, nh)).unwrap();
    be.attention_forward(act(be, &out), saved.span(), act(be, &qkv), b, t, c, nh);
    let dout = upload_act(be, &rnd(q, b * t * c, 32, 1.0));
    let dqkv = upload_act(be, &rnd(q, b * t * 3 * c, 33, 1.0));
    be.attention_backward(
        false,
        act(be, &dqkv),
        None,
        act(be, &dout),
        act(be, &qkv),
        act(be, &out),
        saved.span(),
        b,
        t,
        c,
        nh,
    );
    vec![
        download_act(be, &out, b * t * c),
        download_act(be, &dqkv, b * t * 3 * c),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_matches_cpu() {
    let _gpu = support::one_at_a_time();
    // Head sizes 12, 32, 64 and 128 (flash pads them to 16/32/64/128); T = 1, odd T, T past
    // one tile (64 rows) and not a multiple of it. fp32 flash is the 3xTF32 split.
    let cases = [
        (2, 37, 48, 4),
        (1, 1, 48, 4),
        (2, 70, 96, 3),
        (1, 129, 768, 12),
        (2, 200, 128, 2),
        (1, 150, 256, 2),
    ];
    for path in [AttentionPath::Flash, AttentionPath::Gemm] {
        for (b, t, c, nh) in cases {
            let want = attention_case(&cpu(), Inputs::F32, b, t, c, nh);
            let got = attention_case(&gpu(Precision::Fp32).with_attention(path), Inputs::F32, b, t, c, nh);
            check(
                &format!("attention {path:?} b{b} t{t} c{c} nh{nh}"),
                &["out", "dqkv"],
                &got,
                &want,
                FP32_TOL,
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_matches_cpu_when_peaked() {
    let _gpu = support::one_at_a_time();
    // Peaked softmaxes (inputs at scale 4: scores far apart, rows' maxima moving between key
    // tiles), GPT-2's head size 64 and T past several tiles: the fp32 paths still to 1e-4.
    for path in [AttentionPath::Flash, AttentionPath::Gemm] {
        for (b, t, c, nh) in [(1, 256, 768, 12), (2, 130, 128, 2)] {
            let want = attention_case_scaled(&cpu(), Inputs::F32, b, t, c, nh, 4.0);
            let gpu = gpu(Precision::Fp32).with_attention(path);
            let got = attention_case_scaled(&gpu, Inputs::F32, b, t, c, nh, 4.0);
            check(
                &format!("peaked attention {path:?} b{b} t{t} c{c} nh{nh}"),
                &["out", "dqkv"],
                &got,
                &want,
                FP32_TOL,
            );
        }
    }
}

/// The mean of (got - want) / want over `want`'s entries: a rounding bias, where random
/// rounding errors average out.
fn mean_relative_error(got: &[f32], want: &[f64]) -> f64 {
    let sum: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w) / w).sum();
    sum / want.len() as f64
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_fp32_sums_over_long_rows_are_unbiased() {
    let _gpu = support::one_at_a_time();
    // Near-uniform attention over T = 1024 keys (small scores) on values and output gradients
    // near 1 (a large part shared by all): each output is a running sum over up to 1024 keys,
    // each dv one over up to 1024 queries. Against an f64 reference, the mean relative error of
    // those sums is their rounding bias (random rounding averages out over 131K values). On an
    // H200: cuBLAS (the gemm path) 1e-9; the flash kernels -2.4e-7 (out) and -3.8e-7 (dv), from
    // the TF32 units cutting the split's low parts. Running sums kept in the tensor core's
    // accumulator instead, which cuts their low bits, come to -1.1e-5 and -1.3e-5: a bias that
    // sends fp32 training away from PyTorch's (docs/gpu.md).
    let (t, c, nh) = (1024, 128, 2);
    let hs = c / nh;
    let mut qkv = random(t * 3 * c, 41, 0.1);
    let near_one = |x: f32| 1.0 + 0.01 * x;
    for row in qkv.chunks_mut(3 * c) {
        row[2 * c..].iter_mut().for_each(|v| *v = near_one(*v / 0.1));
    }
    let dout: Vec<f32> = random(t * c, 42, 1.0).into_iter().map(near_one).collect();
    // The f64 reference: out = softmax(q·kᵀ/√hs, causal)·v and dv = Pᵀ·dout, head by head.
    let (mut out, mut dv) = (vec![0.0f64; t * c], vec![0.0f64; t * c]);
    for h in 0..nh {
        let at = |i: usize, part: usize, d: usize| qkv[i * 3 * c + part * c + h * hs + d] as f64;
        for i in 0..t {
            let s: Vec<f64> = (0..=i)
                .map(|j| (0..hs).map(|d| at(i, 0, d) * at(j, 1, d)).sum::<f64>() / (hs as f64).sqrt())
                .collect();
            let max = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let l: f64 = e.iter().sum();
            for (j, ej) in e.iter().enumerate() {
                let p = ej / l;
                for d in 0..hs {
                    out[i * c + h * hs + d] += p * at(j, 2, d);
                    dv[j * c + h * hs + d] += p * dout[i * c + h * hs + d] as f64;
                }
            }
        }
    }
    let mut line = String::new();
    for path in [AttentionPath::Gemm, AttentionPath::Flash] {
        let be = gpu(Precision::Fp32).with_attention(path);
        let x = upload_act(&be, &qkv);
        let y = alloc_act(&be, t * c);
        let saved = be.alloc::<f32>(be.attention_saved_len(1, t, nh)).unwrap();
        be.attention_forward(act(&be, &y), saved.span(), act(&be, &x), 1, t, c, nh);
        let dy = upload_act(&be, &dout);
        let dx = alloc_act(&be, t * 3 * c);
        let (dxs, dys, xs, ys) = (act(&be, &dx), act(&be, &dy), act(&be, &x), act(&be, &y));
        be.attention_backward(true, dxs, None, dys, xs, ys, saved.span(), 1, t, c, nh);
        let got_out = download_act(&be, &y, t * c);
        let got_dv: Vec<f32> = download_act(&be, &dx, t * 3 * c)
            .chunks(3 * c)
            .flat_map(|row| row[2 * c..].to_vec())
            .collect();
        let bias = [mean_relative_error(&got_out, &out), mean_relative_error(&got_dv, &dv)];
        line += &format!(" {path:?}: out {:.1e}, dv {:.1e};", bias[0], bias[1]);
        for (name, b) in ["out", "dv"].iter().zip(bias) {
            assert!(
                b.abs() <= 2e-6,
                "{path:?} {name}: mean relative error {b:.2e} (a rounding bias);{line}"
            );
        }
    }
    println!("mean relative errors against f64:{line}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_flash_tf32_is_close_to_cpu() {
    let _gpu = support::one_at_a_time();
    // TF32 operands (10 mantissa bits): tolerance 1e-2 of each output's scale, as for matmul.
    for (b, t, c, nh) in [(2, 70, 96, 3), (1, 129, 768, 12)] {
        let want = attention_case(&cpu(), Inputs::F32, b, t, c, nh);
        let got = attention_case(&gpu(Precision::Tf32), Inputs::F32, b, t, c, nh);
        check(
            &format!("attention tf32 b{b} t{t} c{c}"),
            &["out", "dqkv"],
            &got,
            &want,
            1e-2,
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_scratch_is_reused_across_shapes() {
    let _gpu = support::one_at_a_time();
    // A big call then a small one (scratch kept), then the first again: results must agree
    // bit for bit (the flash backward has no atomics, so it is deterministic too).
    for path in [AttentionPath::Flash, AttentionPath::Gemm] {
        let gpu = gpu(Precision::Fp32).with_attention(path);
        let first = attention_case(&gpu, Inputs::F32, 2, 70, 96, 3);
        let _ = attention_case(&gpu, Inputs::F32, 1, 5, 48, 4);
        let again = attention_case(&gpu, Inputs::F32, 2, 70, 96, 3);
        check(
            &format!("attention rerun {path:?}"),
            &["out", "dqkv"],
            &again,
            &first,
            0.0,
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn flash_attention_saves_one_value_per_row() {
    let _gpu = support::one_at_a_time();
    let gpu = gpu(Precision::Fp32);
    assert_eq!(gpu.attention_path(), AttentionPath::Flash, "flash is the default");
    assert_eq!(gpu.attention_saved_len(16, 1024, 12), 16 * 12 * 1024);
}

// ---- gelu, cross-entropy ------------------------------------------------------------

fn gelu_case<B: Backend>(be: &B, q: Inputs, n: usize) -> Vec<Vec<f32>> {
    let inp = upload_act(be, &rnd(q, n, 41, 4.0));
    let out = alloc_act(be, n);
    be.gelu_forward(act(be, &out), act(be, &inp), n);
    let dout = upload_act(be, &rnd(q, n, 42, 1.0));
    let dinp = upload_act(be, &rnd(q, n, 43, 1.0));
    be.gelu_backward(act(be, &dinp), act(be, &inp), act(be, &dout), n);
    vec![download_act(be, &out, n), download_act(be, &dinp, n)]
}

#[test]
#[ignore = "needs a CUDA device"]
fn gelu_matches_cpu() {
    let _gpu = support::one_at_a_time();
    for n in [1, 1000, 12_345] {
        let want = gelu_case(&cpu(), Inputs::F32, n);
        let got = gelu_case(&gpu(Precision::Fp32), Inputs::F32, n);
        check(&format!("gelu n{n}"), &["out", "dinp"], &got, &want, FP32_TOL);
    }
}

fn relu_case<B: Backend>(be: &B, q: Inputs, n: usize) -> Vec<Vec<f32>> {
    let inp = upload_act(be, &rnd(q, n, 44, 4.0));
    let out = alloc_act(be, n);
    be.relu_forward(act(be, &out), act(be, &inp), n);
    let dout = upload_act(be, &rnd(q, n, 45, 1.0));
    let dinp = upload_act(be, &rnd(q, n, 46, 1.0));
    be.relu_backward(act(be, &dinp), act(be, &inp), act(be, &dout), n);
    vec![download_act(be, &out, n), download_act(be, &dinp, n)]
}

#[test]
#[ignore = "needs a CUDA device"]
fn relu_matches_cpu() {
    let _gpu = support::one_at_a_time();
    // fp32 exactly (a comparison and an add); bf16: the accumulated gradient rounds once (k = 1).
    let n = 12_345;
    let want = relu_case(&cpu(), Inputs::F32, n);
    let got = relu_case(&gpu(Precision::Fp32), Inputs::F32, n);
    check("relu", &["out", "dinp"], &got, &want, 0.0);
    let want = relu_case(&cpu(), Inputs::Bf16, n);
    let got = relu_case(&gpu(Precision::Bf16), Inputs::Bf16, n);
    check_bf16("relu", &["out", "dinp"], &got, &want, &[(0.0, 1), (1.0, 2)]);
}

fn crossentropy_case<B: Backend>(be: &B, q: Inputs, bt: usize, v: usize, vp: usize) -> Vec<Vec<f32>> {
    let logits = upload_act(be, &rnd(q, bt * vp, 51, 4.0));
    let targets = upload_ids(be, &random_ids(bt, 52, v));
    let losses = be.alloc::<f32>(bt).unwrap();
    unsafe { be.crossentropy_forward(losses.span(), act(be, &logits), targets.span(), bt, v, vp) };
    // Padding columns of dlogits must come back untouched, so they start random too.
    let dlogits = upload_act(be, &rnd(q, bt * vp, 53, 1.0));
    let dloss = 1.0 / bt as f32;
    unsafe { be.crossentropy_backward(act(be, &dlogits), act(be, &logits), targets.span(), dloss, bt, v, vp) };
    // In place: the logits become their gradient (padding 0).
    unsafe { be.crossentropy_backward_in_place(act(be, &logits), losses.span(), targets.span(), dloss, bt, v, vp) };
    // Both in one call (training's loss), on the same logits again.
    let fused_logits = upload_act(be, &rnd(q, bt * vp, 51, 4.0));
    let fused_losses = be.alloc::<f32>(bt).unwrap();
    unsafe {
        be.crossentropy_fused(
            fused_losses.span(),
            act(be, &fused_logits),
            targets.span(),
            dloss,
            bt,
            v,
            vp,
        )
    };
    vec![
        download(be, &losses),
        download_act(be, &dlogits, bt * vp),
        download_act(be, &logits, bt * vp),
        download(be, &fused_losses),
        download_act(be, &fused_logits, bt * vp),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn crossentropy_matches_cpu() {
    let _gpu = support::one_at_a_time();
    for (bt, v, vp) in [(37, 101, 128), (5, 50_257, 50_304), (64, 7, 7)] {
        let want = crossentropy_case(&cpu(), Inputs::F32, bt, v, vp);
        let got = crossentropy_case(&gpu(Precision::Fp32), Inputs::F32, bt, v, vp);
        check(
            &format!("crossentropy {bt}x{v}/{vp}"),
            &["losses", "dlogits", "in_place", "fused_losses", "fused"],
            &got,
            &want,
            FP32_TOL,
        );
    }
}

// ---- reductions, clipping, AdamW ----------------------------------------------------

fn reductions_case<B: Backend>(be: &B, n: usize, max_norm: f32) -> Vec<Vec<f32>> {
    let inp = upload(be, &random(n, 61, 1.0));
    let mean = upload(be, &[7.0]); // overwritten
    be.mean(mean.span(), inp.span(), n);
    let state = StepState {
        sumsq: 0.25, // accumulated into
        loss: 3.0,
        step: 5,
        ..Default::default()
    };
    let state = upload(be, bytemuck::cast_slice(std::slice::from_ref(&state)));
    be.sum_squares(state.span(), inp.span(), n);
    be.sum_squares(state.span(), inp.span(), n / 2);
    let history = be.alloc::<f32>(2 * 4).unwrap();
    be.step_stats(state.span(), history.span(), 4, max_norm, 0.5);
    vec![download(be, &mean), download(be, &state), download(be, &history)]
}

#[test]
#[ignore = "needs a CUDA device"]
fn reductions_and_clip_match_cpu() {
    let _gpu = support::one_at_a_time();
    // max_norm below the norm (clips), above it (factor 1), and 0 (clipping off).
    for (n, max_norm) in [(100_003, 1.0), (1_000, 100.0), (3, 0.0), (3_000_001, 5.0)] {
        let want = reductions_case(&cpu(), n, max_norm);
        let got = reductions_case(&gpu(Precision::Fp32), n, max_norm);
        check(
            &format!("reduce n{n} max_norm{max_norm}"),
            &["mean", "step state", "history"],
            &got,
            &want,
            FP32_TOL,
        );
    }
}

fn adamw_case<B: Backend>(be: &B, n: usize, t: u64) -> Vec<Vec<f32>> {
    let copy = be.alloc::<bf16>(n).unwrap();
    let params = upload(be, &random(n, 71, 1.0));
    let grads = upload(be, &random(n, 72, 1.0));
    let m = upload(be, &random(n, 73, 0.1));
    let v: Vec<f32> = random(n, 74, 0.01).iter().map(|x| x.abs()).collect();
    let v = upload(be, &v);
    // 1-based step t, then t + 1; gradients clipped by 0.5.
    let state = |t: u64| {
        let [lr, bias1, bias2, _] = StepState::schedule(1e-3, 0.9, 0.95, t - 1);
        let s = StepState {
            lr,
            bias1,
            bias2,
            step: (t - 1) as u32,
            clip: 0.5,
            apply: 1.0,
            ..Default::default()
        };
        upload(be, bytemuck::cast_slice(std::slice::from_ref(&s)))
    };
    let hp = AdamWHyper {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let (s1, s2) = (state(t), state(t + 1));
    // Weight decay on the first and last thirds only: the kernel finds each parameter's segment.
    let (a, b) = (n / 3, 2 * n / 3);
    let segments = [(0..a, true), (a..b, false), (b..n, true)];
    be.adamw(
        params.span(),
        grads.span(),
        m.span(),
        v.span(),
        &segments,
        s1.span(),
        hp,
        None,
    );
    let copy_arg = Some(copy.span());
    be.adamw(
        params.span(),
        grads.span(),
        m.span(),
        v.span(),
        &segments,
        s2.span(),
        hp,
        copy_arg,
    );
    let mut copied = vec![bf16::ZERO; n];
    be.read(&copy, 0, &mut copied).unwrap();
    let copied = copied.iter().map(|x| x.to_f32()).collect();
    vec![download(be, &params), download(be, &m), download(be, &v), copied]
}

#[test]
#[ignore = "needs a CUDA device"]
fn adamw_matches_cpu() {
    let _gpu = support::one_at_a_time();
    for (n, t) in [(1_001, 1), (50_000, 1_000)] {
        let want = adamw_case(&cpu(), n, t);
        let got = adamw_case(&gpu(Precision::Fp32), n, t);
        check(
            &format!("adamw n{n} t{t}"),
            &["params", "m", "v", "bf16 copy"],
            &got,
            &want,
            FP32_TOL,
        );
    }
}

fn sgd_case<B: Backend>(be: &B, n: usize) -> Vec<Vec<f32>> {
    let copy = be.alloc::<bf16>(n).unwrap();
    let params = upload(be, &random(n, 75, 1.0));
    let grads = upload(be, &random(n, 76, 1.0));
    let velocity = upload(be, &random(n, 77, 0.1));
    // Learning rate 0.05, gradients clipped by 0.5.
    let step = StepState {
        lr: 0.05,
        clip: 0.5,
        apply: 1.0,
        ..Default::default()
    };
    let state = upload(be, bytemuck::cast_slice(std::slice::from_ref(&step)));
    let hp = SgdHyper {
        momentum: 0.9,
        weight_decay: 0.01,
    };
    be.sgd(params.span(), grads.span(), velocity.span(), n, state.span(), hp, None);
    let hp = SgdHyper {
        weight_decay: 0.0,
        ..hp
    };
    be.sgd(
        params.span(),
        grads.span(),
        velocity.span(),
        n,
        state.span(),
        hp,
        Some(copy.span()),
    );
    let mut copied = vec![bf16::ZERO; n];
    be.read(&copy, 0, &mut copied).unwrap();
    let copied = copied.iter().map(|x| x.to_f32()).collect();
    vec![download(be, &params), download(be, &velocity), copied]
}

#[test]
#[ignore = "needs a CUDA device"]
fn sgd_matches_cpu() {
    let _gpu = support::one_at_a_time();
    for n in [1_001, 50_000] {
        let (want, got) = (sgd_case(&cpu(), n), sgd_case(&gpu(Precision::Fp32), n));
        check(
            &format!("sgd n{n}"),
            &["params", "velocity", "bf16 copy"],
            &got,
            &want,
            FP32_TOL,
        );
    }
}

// ---- memory -------------------------------------------------------------------------

fn memory_case<B: Backend>(be: &B, q: Inputs, n: usize) -> Vec<Vec<f32>> {
    let fresh = be.alloc::<f32>(n).unwrap(); // must be zero-filled
    let a = upload(be, &random(n, 81, 1.0));
    let b = upload(be, &random(n, 82, 1.0));
    be.accumulate(a.span(), b.span(), n);
    let z = upload(be, &random(n, 83, 1.0));
    be.zero(z.span().slice(1, n - 2), n - 2); // first and last word survive
    let scaled = upload(be, &random(n, 84, 1.0));
    be.scale(scaled.span(), n, -0.3);
    // Activations: a sum and an accumulation.
    let (xa, xb) = (upload_act(be, &rnd(q, n, 85, 1.0)), upload_act(be, &rnd(q, n, 86, 1.0)));
    let sum = upload_act(be, &rnd(q, n, 87, 1.0)); // overwritten
    be.add(act(be, &sum), act(be, &xa), act(be, &xb), n);
    be.accumulate_act(act(be, &xa), act(be, &xb), n);
    let rounded = be.alloc::<bf16>(n).unwrap();
    be.round_to_bf16(rounded.span(), scaled.span(), n);
    let mut r = vec![bf16::ZERO; n];
    be.read(&rounded, 0, &mut r).unwrap();
    vec![
        download(be, &fresh),
        download(be, &a),
        download(be, &z),
        download(be, &scaled),
        download_act(be, &sum, n),
        download_act(be, &xa, n),
        r.iter().map(|x| x.to_f32()).collect(),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn memory_ops_match_cpu() {
    let _gpu = support::one_at_a_time();
    let want = memory_case(&cpu(), Inputs::F32, 10_007);
    let got = memory_case(&gpu(Precision::Fp32), Inputs::F32, 10_007);
    let names = ["alloc", "accumulate", "zero", "scale", "add", "acc_act", "to_bf16"];
    check("memory ops", &names, &got, &want, 0.0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn peak_memory_counts_allocations() {
    let _gpu = support::one_at_a_time();
    let gpu = gpu(Precision::Fp32);
    let before = gpu.peak_memory_bytes();
    let big = gpu.alloc::<f32>(1 << 24).unwrap();
    assert!(
        gpu.peak_memory_bytes() >= before + (4 << 24),
        "peak {} after 64 MiB",
        gpu.peak_memory_bytes()
    );
    drop(big);
    let _small = gpu.alloc::<f32>(16).unwrap();
    assert!(
        gpu.peak_memory_bytes() >= before + (4 << 24),
        "peak must not drop after a free"
    );
    eprintln!("{}: peak {} bytes", gpu.name(), gpu.peak_memory_bytes());
}

#[test]
#[ignore = "needs a CUDA device"]
fn out_of_memory_is_a_device_error() {
    let _gpu = support::one_at_a_time();
    let gpu = gpu(Precision::Fp32);
    let err = gpu.alloc::<f32>(1 << 40).err().expect("4 TiB must not fit"); // 4 TiB
    let msg = err.to_string();
    assert!(matches!(err, common::Error::Device(_)), "{msg}");
    assert!(
        msg.contains("asked for 4398046511104 bytes") && msg.contains("free"),
        "{msg}"
    );
    // The backend stays usable.
    let buf = upload(&gpu, &[1.0, 2.0]);
    assert_eq!(download(&gpu, &buf), vec![1.0, 2.0]);
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_bad_launch_surfaces_at_synchronize() {
    let _gpu = support::one_at_a_time();
    // A head size the flash kernels cannot run (129) passes the op's shape checks but cannot
    // be launched: the error waits for synchronize, then clears.
    let gpu = gpu(Precision::Fp32).with_attention(AttentionPath::Flash);
    let (b, t, c, nh) = (1, 4, 129, 1);
    let (out, qkv) = (
        alloc_act(&gpu, b * t * c),
        upload_act(&gpu, &random(b * t * 3 * c, 7, 1.0)),
    );
    let saved = gpu.alloc::<f32>(gpu.attention_saved_len(b, t, nh)).unwrap();
    gpu.attention_forward(act(&gpu, &out), saved.span(), act(&gpu, &qkv), b, t, c, nh);
    let err = gpu.synchronize().expect_err("must report");
    assert!(err.to_string().contains("head sizes"), "{err}");
    gpu.synchronize().expect("error is reported once");
    // C not divisible by NH is refused before anything is queued.
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gpu.attention_forward(act(&gpu, &out), saved.span(), act(&gpu, &qkv), 1, 4, 10, 3)
    }));
    let msg = refused.expect_err("must panic");
    let msg = msg.downcast_ref::<String>().map(String::as_str).unwrap_or_default();
    assert!(
        msg.contains("attention_forward") && msg.contains("do not divide"),
        "{msg}"
    );
    gpu.synchronize().expect("nothing was queued");
}

// ---- bf16: every kernel against the CPU on bf16-exact inputs -------------------------
// k per kernel (see the module's note): 1 where the only bf16 step is rounding the output
// (or nothing: f32 outputs), 2 where a bf16 value is read back and updated (accumulating
// gradients, cuBLAS's beta = 1), 4 for attention (its output is rounded before backward
// reads it again for the softmax gradient).

fn check_bf16(test: &str, names: &[&str], got: &[Vec<f32>], want: &[Vec<f32>], bounds: &[(f32, usize)]) {
    for (i, name) in names.iter().enumerate() {
        let (k, reduction) = bounds[i];
        let tol = bf16_tol(k, reduction);
        check(&format!("{test} bf16"), &[name], &got[i..=i], &want[i..=i], tol);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_encoder_is_within_bound() {
    let _gpu = support::one_at_a_time();
    for (b, t, c, v, share) in ENCODER_CASES {
        let ids = skewed_ids(b * t, 1, v, share);
        let want = encoder_case(&cpu(), Inputs::Bf16, &ids, t, c, v);
        let got = encoder_case(&gpu(Precision::Bf16), Inputs::Bf16, &ids, t, c, v);
        check_bf16(
            &format!("encoder b{b} t{t} c{c} v{v} share{share}"),
            &["out", "dwte", "dwpe"],
            &got,
            &want,
            &[(1.0, 2), (1.0, b * t), (1.0, b)],
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_matmul_is_within_bound() {
    let _gpu = support::one_at_a_time();
    for (bt, c, oc, bias) in [(333, 768, 2304, true), (256, 768, 768, false), (74, 48, 144, true)] {
        let want = matmul_case(&cpu(), Inputs::Bf16, bt, c, oc, bias);
        let got = matmul_case(&gpu(Precision::Bf16), Inputs::Bf16, bt, c, oc, bias);
        check_bf16(
            &format!("matmul {bt}x{c}x{oc}"),
            &["out", "dinp", "dw", "dbias"],
            &got,
            &want,
            &[(2.0, c), (2.0, oc), (2.0, bt), (1.0, bt)],
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_mlp_gelu_epilogues_are_within_bound() {
    let _gpu = support::one_at_a_time();
    // pre: a product with a bias, rounded once (k = 2, as the matmul's out); act: GELU (slope
    // at most 1.13) of pre's error, then its own rounding (k = 3); dpre: where the epilogue
    // cannot run (H = 36), d(act) is rounded and then dpre (k = 2), in the epilogue only dpre;
    // dw and dbias as the matmul's; dpre_bias sums BT values of dpre's error (k = 4: twice
    // dpre's bound, for the largest values' errors against the sums' typical size).
    let gpu = gpu(Precision::Bf16);
    for (bt, c, h, oc, bias) in MLP_SHAPES {
        let want = mlp_case(&cpu(), Inputs::Bf16, bt, c, h, oc, bias);
        let got = mlp_case(&gpu, Inputs::Bf16, bt, c, h, oc, bias);
        check_bf16(
            &format!("mlp {bt}x{c}x{h}x{oc}"),
            &MLP_NAMES,
            &got,
            &want,
            &[(2.0, c), (3.0, c), (2.0, oc), (2.0, bt), (1.0, bt), (4.0, oc)],
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_layernorm_is_within_bound() {
    let _gpu = support::one_at_a_time();
    for (bt, c) in [(300, 768), (74, 48)] {
        let want = layernorm_case(&cpu(), Inputs::Bf16, bt, c);
        let got = layernorm_case(&gpu(Precision::Bf16), Inputs::Bf16, bt, c);
        check_bf16(
            &format!("layernorm {bt}x{c}"),
            &["out", "mean", "rstd", "dinp", "dw", "db"],
            &got,
            &want,
            &[(1.0, c), (1.0, c), (1.0, c), (2.0, c), (1.0, bt), (1.0, bt)],
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_attention_is_within_bound() {
    let _gpu = support::one_at_a_time();
    // The default kernels (on Hopper at head size 64 the backward is the warpgroup-product one):
    // T = 64 one tile, 129 a partial one, 1024 the benchmark's.
    let cases = [
        (2, 70, 96, 3),
        (1, 129, 768, 12),
        (1, 150, 256, 2),
        (1, 64, 128, 2),
        (2, 1024, 768, 12),
    ];
    let gpu = gpu(Precision::Bf16);
    for (b, t, c, nh) in cases {
        let want = attention_case(&cpu(), Inputs::Bf16, b, t, c, nh);
        let got = attention_case(&gpu, Inputs::Bf16, b, t, c, nh);
        check_bf16(
            &format!("attention b{b} t{t} c{c} nh{nh}"),
            &["out", "dqkv"],
            &got,
            &want,
            &[(4.0, t), (4.0, t)],
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_gelu_crossentropy_and_elementwise_are_within_bound() {
    let _gpu = support::one_at_a_time();
    let n = 12_345;
    let want = gelu_case(&cpu(), Inputs::Bf16, n);
    let got = gelu_case(&gpu(Precision::Bf16), Inputs::Bf16, n);
    check_bf16("gelu", &["out", "dinp"], &got, &want, &[(1.0, 1), (2.0, 1)]);
    // Row lengths: a few vectors a thread up to GPT-2's vocabulary, padded and not.
    for (bt, v, vp) in [
        (37, 101, 128),
        (4, 9_001, 9_008),
        (2, 30_000, 30_000),
        (5, 50_257, 50_304),
    ] {
        let want = crossentropy_case(&cpu(), Inputs::Bf16, bt, v, vp);
        let got = crossentropy_case(&gpu(Precision::Bf16), Inputs::Bf16, bt, v, vp);
        check_bf16(
            &format!("crossentropy {bt}x{v}"),
            &["losses", "dlogits", "in_place", "fused_losses", "fused"],
            &got,
            &want,
            &[(1.0, v), (2.0, v), (1.0, v), (1.0, v), (1.0, v)],
        );
    }
    let want = memory_case(&cpu(), Inputs::Bf16, 10_007);
    let got = memory_case(&gpu(Precision::Bf16), Inputs::Bf16, 10_007);
    // f32 ops exact; the activation sum and accumulation round once each.
    let names = ["alloc", "accumulate", "zero", "scale", "add", "acc_act", "to_bf16"];
    let bounds = [(0.0, 1), (0.0, 1), (0.0, 1), (0.0, 1), (1.0, 2), (1.0, 2), (0.0, 1)];
    check_bf16("memory ops", &names, &got, &want, &bounds);
}

/// The bf16 attention kernels against the CPU per 64-row block of queries (out, dq) and keys
/// (dk, dv), the gradient buffer starting at zero so that every figure is the kernel's own
/// (`attention_case` adds into a random buffer, which hides gradient errors; the overwriting
/// calls start from random values, which they must ignore). The kernels (on Hopper at head
/// size 64 the warpgroup-product ones, their backward adding into dqkv or writing it, the same
/// bits; the mma.sync ones at head size 128) must stay within 1e-2 in every tile (a warpgroup
/// forward miscompiled by CUDA 13.0's ptxas was wrong past the first tile, which a
/// whole-tensor bound missed).
#[test]
#[ignore = "needs a CUDA device"]
fn bf16_attention_errors_by_tile() {
    let _gpu = support::one_at_a_time();
    let gpu = gpu(Precision::Bf16);
    for (b, t, c, nh) in [(1, 200, 64, 1), (2, 256, 128, 2), (1, 1024, 128, 2), (1, 200, 256, 2)] {
        let want = cpu().run(b, t, c, nh, false);
        // Through attention_backward adding into dqkv, then writing it (`overwrite`).
        let mut accumulated = None;
        for overwrite in [false, true] {
            let got = gpu.run(b, t, c, nh, overwrite);
            // The overwriting backward does the accumulating one's arithmetic in its order.
            match &accumulated {
                None => accumulated = Some(got.clone()),
                Some(first) => assert!(
                    first == &got,
                    "the overwriting backward differs from the accumulating one (b{b} t{t} c{c})"
                ),
            }
            let hs = c / nh;
            let mut line = format!("TILES overwrite {overwrite} b{b} t{t} c{c}:");
            let mut worst = 0.0f64;
            for (name, which, part) in [("out", 0, 0), ("dq", 1, 0), ("dk", 1, 1), ("dv", 1, 2)] {
                let width = if which == 0 { c } else { 3 * c };
                line += &format!(" {name} [");
                for tile in 0..t.div_ceil(64) {
                    let (mut num, mut den) = (0.0f64, 0.0f64);
                    for bi in 0..b {
                        for r in tile * 64..((tile + 1) * 64).min(t) {
                            for h in 0..nh {
                                for d in 0..hs {
                                    let i = (bi * t + r) * width + part * c + h * hs + d;
                                    num += ((got[which][i] - want[which][i]) as f64).powi(2);
                                    den += (want[which][i] as f64).powi(2);
                                }
                            }
                        }
                    }
                    let err = (num / den.max(1e-30)).sqrt();
                    worst = worst.max(if err.is_nan() { f64::INFINITY } else { err });
                    line += &format!(" {err:.1e}");
                }
                line += " ]";
            }
            eprintln!("{line}");
            assert!(worst <= 1e-2, "{line}");
        }
    }
}

/// The model's attention backward with the qkv product's bias gradient: forward, then
/// `attention_backward` with `overwrite` into a random dqkv with `dbias` (random: it accumulates).
/// Returns [dqkv, dbias].
fn attention_bias_case<B: Backend>(be: &B, q: Inputs, b: usize, t: usize, c: usize, nh: usize) -> Vec<Vec<f32>> {
    let qkv = upload_act(be, &rnd(q, b * t * 3 * c, 51, 1.0));
    let out = alloc_act(be, b * t * c);
    let saved = be.alloc::<f32>(be.attention_saved_len(b, t, nh)).unwrap();
    let dout = upload_act(be, &rnd(q, b * t * c, 52, 1.0));
    let dqkv = upload_act(be, &rnd(q, b * t * 3 * c, 53, 100.0));
    let dbias = upload(be, &rnd(q, 3 * c, 54, 1.0));
    be.attention_forward(act(be, &out), saved.span(), act(be, &qkv), b, t, c, nh);
    be.attention_backward(
        true,
        act(be, &dqkv),
        Some(dbias.span()),
        act(be, &dout),
        act(be, &qkv),
        act(be, &out),
        saved.span(),
        b,
        t,
        c,
        nh,
    );
    vec![download_act(be, &dqkv, b * t * 3 * c), download(be, &dbias)]
}

const ATTENTION_BIAS_SHAPES: [(usize, usize, usize, usize); 4] =
    [(1, 200, 64, 1), (2, 256, 128, 2), (1, 129, 768, 12), (2, 1024, 768, 12)];

#[test]
#[ignore = "needs a CUDA device"]
fn attention_bias_sums_match_cpu() {
    let _gpu = support::one_at_a_time();
    // The qkv bias gradient from the attention backward (on Hopper at head size 64 the
    // warpgroup kernels' tile sums, elsewhere the column sums reading dqkv back) against the
    // CPU: fp32 at the file's tolerance; bf16 as dqkv's own bound (a sum of dqkv's values, its
    // error relative to the largest that of dqkv).
    for (b, t, c, nh) in ATTENTION_BIAS_SHAPES {
        let want = attention_bias_case(&cpu(), Inputs::F32, b, t, c, nh);
        let got = attention_bias_case(&gpu(Precision::Fp32), Inputs::F32, b, t, c, nh);
        check(
            &format!("attention bias fp32 b{b} t{t} c{c}"),
            &["dqkv", "dbias"],
            &got,
            &want,
            FP32_TOL,
        );
    }
    let gpu = gpu(Precision::Bf16);
    for (b, t, c, nh) in ATTENTION_BIAS_SHAPES {
        let want = attention_bias_case(&cpu(), Inputs::Bf16, b, t, c, nh);
        let got = attention_bias_case(&gpu, Inputs::Bf16, b, t, c, nh);
        let test = format!("attention bias b{b} t{t} c{c}");
        check_bf16(&test, &["dqkv", "dbias"], &got, &want, &[(4.0, t), (4.0, t)]);
    }
}

/// attention_case with a zeroed gradient buffer, over any backend.
/// `overwrite`: written by `attention_backward` over a gradient buffer of random values.
trait ErasedAttention {
    fn run(&self, b: usize, t: usize, c: usize, nh: usize, overwrite: bool) -> Vec<Vec<f32>>;
}
impl<B: Backend> ErasedAttention for B {
    fn run(&self, b: usize, t: usize, c: usize, nh: usize, overwrite: bool) -> Vec<Vec<f32>> {
        let be = self;
        let qkv = upload_act(be, &rnd(Inputs::Bf16, b * t * 3 * c, 31, 1.0));
        let out = alloc_act(be, b * t * c);
        let saved = be.alloc::<f32>(be.attention_saved_len(b, t, nh)).unwrap();
        be.attention_forward(act(be, &out), saved.span(), act(be, &qkv), b, t, c, nh);
        let dout = upload_act(be, &rnd(Inputs::Bf16, b * t * c, 32, 1.0));
        // Written over random values, or added to zeros.
        let start = if overwrite {
            rnd(Inputs::Bf16, b * t * 3 * c, 33, 100.0)
        } else {
            vec![0.0; b * t * 3 * c]
        };
        let dqkv = upload_act(be, &start);
        be.attention_backward(
            overwrite,
            act(be, &dqkv),
            None,
            act(be, &dout),
            act(be, &qkv),
            act(be, &out),
            saved.span(),
            b,
            t,
            c,
            nh,
        );
        vec![
            download_act(be, &out, b * t * c),
            download_act(be, &dqkv, b * t * 3 * c),
        ]
    }
}
