//! CUDA backend against the CPU backend (the reference), op by op, forward and backward,
//! on random inputs with odd shapes (T not a multiple of 32, C = 48, padded vocabularies).
//! Gradient outputs start from random values, so the tests also check that backward ops
//! ACCUMULATE. Error measure, unless a test says otherwise: the max-norm relative error
//! max|gpu - cpu| / max|cpu| of each output; fp32 tolerance 1e-4.
//! Needs a CUDA device: run with `--include-ignored` on a GPU machine.
#![cfg(feature = "cuda")]

use common::backend::cpu::CpuBackend;
use common::backend::cuda::{AttentionPath, CudaBackend};
use common::backend::Precision;
use common::backend::{token_order, AdamWStep, Backend, DevPtr, DeviceBuffer};

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

fn random_ids(n: usize, seed: u64, below: usize) -> Vec<i32> {
    random(n, seed, 1.0)
        .iter()
        .map(|x| (((x + 1.0) * 0.5 * below as f32) as usize).min(below - 1) as i32)
        .collect()
}

fn upload<B: Backend>(be: &B, data: &[f32]) -> B::Buffer<f32> {
    let buf = be.alloc(data.len()).expect("alloc");
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

// ---- encoder ------------------------------------------------------------------------

fn encoder_case<B: Backend>(be: &B, b: usize, t: usize, c: usize, v: usize) -> Vec<Vec<f32>> {
    let ids = random_ids(b * t, 1, v);
    let (tokens, order) = (upload_ids(be, &ids), upload_ids(be, &token_order(&ids)));
    let wte = upload(be, &random(v * c, 2, 1.0));
    let wpe = upload(be, &random(t * c, 3, 1.0));
    let out = be.alloc(b * t * c).unwrap();
    unsafe { be.encoder_forward(out.ptr(), tokens.ptr(), wte.ptr(), wpe.ptr(), b, t, c) };
    let dout = upload(be, &random(b * t * c, 4, 1.0));
    let dwte = upload(be, &random(v * c, 5, 1.0));
    let dwpe = upload(be, &random(t * c, 6, 1.0));
    unsafe { be.encoder_backward(dwte.ptr(), dwpe.ptr(), dout.ptr(), tokens.ptr(), order.ptr(), b, t, c) };
    vec![download(be, &out), download(be, &dwte), download(be, &dwpe)]
}

#[test]
#[ignore = "needs a CUDA device"]
fn encoder_matches_cpu() {
    // Few tokens (v = 11) so that many positions share one row of dwte.
    for (b, t, c, v) in [(3, 37, 48, 11), (2, 64, 768, 50)] {
        let want = encoder_case(&cpu(), b, t, c, v);
        let got = encoder_case(&gpu(Precision::Fp32), b, t, c, v);
        check(
            &format!("encoder b{b} t{t} c{c}"),
            &["out", "dwte", "dwpe"],
            &got,
            &want,
            FP32_TOL,
        );
    }
}

// ---- matmul -------------------------------------------------------------------------

fn matmul_case<B: Backend>(be: &B, bt: usize, c: usize, oc: usize, with_bias: bool) -> Vec<Vec<f32>> {
    let inp = upload(be, &random(bt * c, 11, 1.0));
    let w = upload(be, &random(oc * c, 12, 0.5));
    let bias = upload(be, &random(oc, 13, 1.0));
    let out = be.alloc(bt * oc).unwrap();
    let bias_ptr = with_bias.then(|| bias.ptr());
    unsafe { be.matmul_forward(out.ptr(), inp.ptr(), w.ptr(), bias_ptr, bt, c, oc) };
    let dout = upload(be, &random(bt * oc, 14, 1.0));
    let dinp = upload(be, &random(bt * c, 15, 1.0));
    let dw = upload(be, &random(oc * c, 16, 1.0));
    let dbias = upload(be, &random(oc, 17, 1.0));
    let dbias_ptr = with_bias.then(|| dbias.ptr());
    unsafe {
        be.matmul_backward(
            dinp.ptr(),
            dw.ptr(),
            dbias_ptr,
            dout.ptr(),
            inp.ptr(),
            w.ptr(),
            bt,
            c,
            oc,
        )
    };
    vec![
        download(be, &out),
        download(be, &dinp),
        download(be, &dw),
        download(be, &dbias),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn matmul_matches_cpu() {
    let names = ["out", "dinp", "dw", "dbias"];
    for (bt, c, oc, bias) in [
        (74, 48, 144, true),
        (37, 48, 192, false),
        (333, 768, 2304, true),
        (5, 7, 3, true),
    ] {
        let want = matmul_case(&cpu(), bt, c, oc, bias);
        let got = matmul_case(&gpu(Precision::Fp32), bt, c, oc, bias);
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
    // TF32 keeps 10 mantissa bits: tolerance 1e-2 of the output's scale (reference: CPU fp32).
    let (bt, c, oc) = (256, 768, 768);
    let want = matmul_case(&cpu(), bt, c, oc, true);
    let got = matmul_case(&gpu(Precision::Tf32), bt, c, oc, true);
    check("matmul tf32", &["out", "dinp", "dw", "dbias"], &got, &want, 1e-2);
}

// ---- layernorm ----------------------------------------------------------------------

fn layernorm_case<B: Backend>(be: &B, bt: usize, c: usize) -> Vec<Vec<f32>> {
    // An offset and a spread per row, as activations have.
    let x: Vec<f32> = random(bt * c, 21, 2.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v + (i / c) as f32 * 0.1)
        .collect();
    let inp = upload(be, &x);
    let w = upload(be, &random(c, 22, 1.0));
    let b = upload(be, &random(c, 23, 1.0));
    let (out, mean, rstd) = (be.alloc(bt * c).unwrap(), be.alloc(bt).unwrap(), be.alloc(bt).unwrap());
    unsafe { be.layernorm_forward(out.ptr(), mean.ptr(), rstd.ptr(), inp.ptr(), w.ptr(), b.ptr(), bt, c) };
    let dout = upload(be, &random(bt * c, 24, 1.0));
    let dinp = upload(be, &random(bt * c, 25, 1.0));
    let dw = upload(be, &random(c, 26, 1.0));
    let db = upload(be, &random(c, 27, 1.0));
    unsafe {
        be.layernorm_backward(
            dinp.ptr(),
            dw.ptr(),
            db.ptr(),
            dout.ptr(),
            inp.ptr(),
            w.ptr(),
            mean.ptr(),
            rstd.ptr(),
            bt,
            c,
        )
    };
    vec![
        download(be, &out),
        download(be, &mean),
        download(be, &rstd),
        download(be, &dinp),
        download(be, &dw),
        download(be, &db),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn layernorm_matches_cpu() {
    let names = ["out", "mean", "rstd", "dinp", "dw", "db"];
    for (bt, c) in [(74, 48), (1, 5), (300, 768), (600, 33)] {
        let want = layernorm_case(&cpu(), bt, c);
        let got = layernorm_case(&gpu(Precision::Fp32), bt, c);
        check(&format!("layernorm {bt}x{c}"), &names, &got, &want, FP32_TOL);
    }
}

// ---- attention ----------------------------------------------------------------------

fn attention_case<B: Backend>(be: &B, b: usize, t: usize, c: usize, nh: usize) -> Vec<Vec<f32>> {
    let qkv = upload(be, &random(b * t * 3 * c, 31, 1.0));
    let out = be.alloc(b * t * c).unwrap();
    let saved = be.alloc(be.attention_saved_len(b, t, nh)).unwrap();
    unsafe { be.attention_forward(out.ptr(), saved.ptr(), qkv.ptr(), b, t, c, nh) };
    let dout = upload(be, &random(b * t * c, 32, 1.0));
    let dqkv = upload(be, &random(b * t * 3 * c, 33, 1.0));
    unsafe { be.attention_backward(dqkv.ptr(), dout.ptr(), qkv.ptr(), out.ptr(), saved.ptr(), b, t, c, nh) };
    vec![download(be, &out), download(be, &dqkv)]
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_matches_cpu() {
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
            let want = attention_case(&cpu(), b, t, c, nh);
            let got = attention_case(&gpu(Precision::Fp32).with_attention(path), b, t, c, nh);
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
fn attention_flash_tf32_is_close_to_cpu() {
    // TF32 operands (10 mantissa bits): tolerance 1e-2 of each output's scale, as for matmul.
    for (b, t, c, nh) in [(2, 70, 96, 3), (1, 129, 768, 12)] {
        let want = attention_case(&cpu(), b, t, c, nh);
        let got = attention_case(&gpu(Precision::Tf32), b, t, c, nh);
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
    // A big call then a small one (scratch kept), then the first again: results must agree
    // bit for bit (the flash backward has no atomics, so it is deterministic too).
    for path in [AttentionPath::Flash, AttentionPath::Gemm] {
        let gpu = gpu(Precision::Fp32).with_attention(path);
        let first = attention_case(&gpu, 2, 70, 96, 3);
        let _ = attention_case(&gpu, 1, 5, 48, 4);
        let again = attention_case(&gpu, 2, 70, 96, 3);
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
    let gpu = gpu(Precision::Fp32);
    assert_eq!(gpu.attention_path(), AttentionPath::Flash, "flash is the default");
    assert_eq!(gpu.attention_saved_len(16, 1024, 12), 16 * 12 * 1024);
}

// ---- gelu, cross-entropy ------------------------------------------------------------

fn gelu_case<B: Backend>(be: &B, n: usize) -> Vec<Vec<f32>> {
    let inp = upload(be, &random(n, 41, 4.0));
    let out = be.alloc(n).unwrap();
    unsafe { be.gelu_forward(out.ptr(), inp.ptr(), n) };
    let dout = upload(be, &random(n, 42, 1.0));
    let dinp = upload(be, &random(n, 43, 1.0));
    unsafe { be.gelu_backward(dinp.ptr(), inp.ptr(), dout.ptr(), n) };
    vec![download(be, &out), download(be, &dinp)]
}

#[test]
#[ignore = "needs a CUDA device"]
fn gelu_matches_cpu() {
    for n in [1, 1000, 12_345] {
        let want = gelu_case(&cpu(), n);
        let got = gelu_case(&gpu(Precision::Fp32), n);
        check(&format!("gelu n{n}"), &["out", "dinp"], &got, &want, FP32_TOL);
    }
}

fn crossentropy_case<B: Backend>(be: &B, bt: usize, v: usize, vp: usize) -> Vec<Vec<f32>> {
    let logits = upload(be, &random(bt * vp, 51, 4.0));
    let targets = upload_ids(be, &random_ids(bt, 52, v));
    let losses = be.alloc(bt).unwrap();
    unsafe { be.crossentropy_forward(losses.ptr(), logits.ptr(), targets.ptr(), bt, v, vp) };
    // Padding columns of dlogits must come back untouched, so they start random too.
    let dlogits = upload(be, &random(bt * vp, 53, 1.0));
    unsafe { be.crossentropy_backward(dlogits.ptr(), logits.ptr(), targets.ptr(), 1.0 / bt as f32, bt, v, vp) };
    // In place: the logits become their gradient (padding 0).
    unsafe { be.crossentropy_backward_in_place(logits.ptr(), losses.ptr(), targets.ptr(), 1.0 / bt as f32, bt, v, vp) };
    vec![download(be, &losses), download(be, &dlogits), download(be, &logits)]
}

#[test]
#[ignore = "needs a CUDA device"]
fn crossentropy_matches_cpu() {
    for (bt, v, vp) in [(37, 101, 128), (5, 50_257, 50_304), (64, 7, 7)] {
        let want = crossentropy_case(&cpu(), bt, v, vp);
        let got = crossentropy_case(&gpu(Precision::Fp32), bt, v, vp);
        check(
            &format!("crossentropy {bt}x{v}/{vp}"),
            &["losses", "dlogits", "in_place"],
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
    unsafe { be.mean(mean.ptr(), inp.ptr(), n) };
    let sumsq = upload(be, &[0.25]); // accumulated into
    unsafe { be.sum_squares(sumsq.ptr(), inp.ptr(), n) };
    unsafe { be.sum_squares(sumsq.ptr(), inp.ptr(), n / 2) };
    let clip = be.alloc(2).unwrap();
    unsafe { be.clip_factor(clip.ptr(), sumsq.ptr(), max_norm) };
    vec![download(be, &mean), download(be, &sumsq), download(be, &clip)]
}

#[test]
#[ignore = "needs a CUDA device"]
fn reductions_and_clip_match_cpu() {
    // max_norm below the norm (clips), above it (factor 1), and 0 (clipping off).
    for (n, max_norm) in [(100_003, 1.0), (1_000, 100.0), (3, 0.0), (3_000_001, 5.0)] {
        let want = reductions_case(&cpu(), n, max_norm);
        let got = reductions_case(&gpu(Precision::Fp32), n, max_norm);
        check(
            &format!("reduce n{n} max_norm{max_norm}"),
            &["mean", "sumsq", "clip"],
            &got,
            &want,
            FP32_TOL,
        );
    }
}

fn adamw_case<B: Backend>(be: &B, n: usize, t: u64) -> Vec<Vec<f32>> {
    let params = upload(be, &random(n, 71, 1.0));
    let grads = upload(be, &random(n, 72, 1.0));
    let m = upload(be, &random(n, 73, 0.1));
    let v: Vec<f32> = random(n, 74, 0.01).iter().map(|x| x.abs()).collect();
    let v = upload(be, &v);
    let scale = upload(be, &[0.5]);
    let hp = AdamWStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        t,
    };
    unsafe { be.adamw(params.ptr(), grads.ptr(), m.ptr(), v.ptr(), n, scale.ptr(), hp) };
    unsafe {
        be.adamw(
            params.ptr(),
            grads.ptr(),
            m.ptr(),
            v.ptr(),
            n,
            scale.ptr(),
            AdamWStep { t: t + 1, ..hp },
        )
    };
    vec![download(be, &params), download(be, &m), download(be, &v)]
}

#[test]
#[ignore = "needs a CUDA device"]
fn adamw_matches_cpu() {
    for (n, t) in [(1_001, 1), (50_000, 1_000)] {
        let want = adamw_case(&cpu(), n, t);
        let got = adamw_case(&gpu(Precision::Fp32), n, t);
        check(
            &format!("adamw n{n} t{t}"),
            &["params", "m", "v"],
            &got,
            &want,
            FP32_TOL,
        );
    }
}

// ---- memory -------------------------------------------------------------------------

fn memory_case<B: Backend>(be: &B, n: usize) -> Vec<Vec<f32>> {
    let fresh = be.alloc(n).unwrap(); // must be zero-filled
    let a = upload(be, &random(n, 81, 1.0));
    let b = upload(be, &random(n, 82, 1.0));
    unsafe { be.accumulate(a.ptr(), b.ptr(), n) };
    let z = upload(be, &random(n, 83, 1.0));
    unsafe { be.zero(z.ptr().add(1), n - 2) }; // first and last word survive
    let scaled = upload(be, &random(n, 84, 1.0));
    unsafe { be.scale(scaled.ptr(), n, -0.3) };
    let sum = upload(be, &random(n, 85, 1.0)); // overwritten
    unsafe { be.add(sum.ptr(), b.ptr(), scaled.ptr(), n) };
    vec![
        download(be, &fresh),
        download(be, &a),
        download(be, &z),
        download(be, &scaled),
        download(be, &sum),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn memory_ops_match_cpu() {
    let want = memory_case(&cpu(), 10_007);
    let got = memory_case(&gpu(Precision::Fp32), 10_007);
    check(
        "memory ops",
        &["alloc", "accumulate", "zero", "scale", "add"],
        &got,
        &want,
        0.0,
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn peak_memory_counts_allocations() {
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
    // C not divisible by NH cannot be run: the error waits for synchronize, then clears.
    let gpu = gpu(Precision::Fp32);
    unsafe { gpu.attention_forward(DevPtr::default(), DevPtr::default(), DevPtr::default(), 1, 4, 10, 3) };
    let err = gpu.synchronize().expect_err("must report");
    assert!(err.to_string().contains("multiple of NH"), "{err}");
    gpu.synchronize().expect("error is reported once");
}
