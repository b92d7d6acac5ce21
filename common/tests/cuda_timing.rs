//! Every op at GPT-2 124M training size (B=16, T=1024, fp32 and TF32): checks that each runs
//! and gives finite results at full size (32-bit index limits, launch limits), and prints
//! a timing table with an estimated training step built from the per-op times. No
//! reference here: parity is `cuda_backend.rs`'s job. Needs a CUDA device.
#![cfg(feature = "cuda")]

mod support;

use std::time::Instant;

use common::backend::cuda::{AttentionPath, CudaBackend};
use common::backend::Precision;
use common::backend::{token_order, AdamWHyper, Backend, DeviceBuffer, Overwrite, StepState};

const B: usize = 16;
const T: usize = 1024;
const C: usize = 768;
const NH: usize = 12;
const L: usize = 12;
const V: usize = 50_257;
const VP: usize = 50_304;
const BT: usize = B * T;
const PARAMS: usize = 124_475_904;

fn filled(be: &CudaBackend, n: usize, seed: u32) -> <CudaBackend as Backend>::Buffer<f32> {
    let data: Vec<f32> = (0..n)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
        .collect();
    let buf = be.alloc::<f32>(n).expect("alloc");
    be.write(&buf, 0, &data).expect("upload");
    buf
}

/// Mean milliseconds of `f` over 5 runs after one warm-up.
fn time(be: &CudaBackend, mut f: impl FnMut()) -> f64 {
    f();
    be.synchronize().expect("warm-up");
    let start = Instant::now();
    for _ in 0..5 {
        f();
    }
    be.synchronize().expect("timed runs");
    start.elapsed().as_secs_f64() * 1e3 / 5.0
}

fn assert_finite(be: &CudaBackend, what: &str, buf: &<CudaBackend as Backend>::Buffer<f32>) {
    let mut host = vec![0.0f32; buf.len()];
    be.read(buf, 0, &mut host).expect("download");
    assert!(host.iter().all(|x| x.is_finite()), "{what}: non-finite values");
}

fn gpt2_step_table(precision: Precision) {
    let be = CudaBackend::new(0, precision).expect("CUDA backend");
    // The GEMM attention path, timed beside the flash kernels (rows in parentheses, not in
    // the step's estimate).
    let gemm = CudaBackend::new(0, precision)
        .expect("CUDA backend")
        .with_attention(AttentionPath::Gemm);
    let mut rows: Vec<(String, f64, usize)> = Vec::new(); // (op, ms, times per step)
    let mut row = |name: &str, ms: f64, per_step: usize| rows.push((name.to_string(), ms, per_step));

    let ids: Vec<i32> = (0..BT).map(|i| (i * 7919 % V) as i32).collect();
    let (tokens, order) = (be.alloc::<i32>(BT).unwrap(), be.alloc::<i32>(BT).unwrap());
    be.write(&tokens, 0, &ids).unwrap();
    be.write(&order, 0, &token_order(&ids)).unwrap();
    let (wte, wpe) = (filled(&be, VP * C, 1), filled(&be, T * C, 2));
    let (x, dx) = (filled(&be, BT * C, 3), filled(&be, BT * C, 4));
    let (dwte, dwpe) = (be.alloc::<f32>(VP * C).unwrap(), be.alloc::<f32>(T * C).unwrap());
    row(
        "encoder fwd",
        time(&be, || unsafe {
            be.encoder_forward(
                x.span().act(),
                tokens.span(),
                None,
                wte.span().act(),
                wpe.span().act(),
                B,
                T,
                C,
            )
        }),
        1,
    );
    row(
        "encoder bwd",
        time(&be, || unsafe {
            be.encoder_backward(
                dwte.span(),
                dwpe.span(),
                dx.span().act(),
                tokens.span(),
                order.span(),
                B,
                T,
                C,
            )
        }),
        1,
    );
    assert_finite(&be, "encoder", &x);

    let (w, bias) = (filled(&be, C, 5), filled(&be, C, 6));
    let (ln, mean, rstd) = (
        be.alloc::<f32>(BT * C).unwrap(),
        be.alloc::<f32>(BT).unwrap(),
        be.alloc::<f32>(BT).unwrap(),
    );
    let (dw, db) = (be.alloc::<f32>(C).unwrap(), be.alloc::<f32>(C).unwrap());
    let ln_f = || {
        be.layernorm_forward(
            ln.span().act(),
            mean.span(),
            rstd.span(),
            x.span().act(),
            w.span().act(),
            bias.span().act(),
            BT,
            C,
        )
    };
    row("layernorm fwd", time(&be, ln_f), 2 * L + 1);
    let ln_b = || {
        be.layernorm_backward(
            dx.span().act(),
            dw.span(),
            db.span(),
            ln.span().act(),
            x.span().act(),
            w.span().act(),
            mean.span(),
            rstd.span(),
            BT,
            C,
        )
    };
    row("layernorm bwd", time(&be, ln_b), 2 * L + 1);
    assert_finite(&be, "layernorm", &dx);

    // The four matmuls of a block and the LM head: (name, C in, C out, bias, per step).
    for (name, c, oc, has_bias, per_step) in [
        ("qkv", C, 3 * C, true, L),
        ("attproj", C, C, true, L),
        ("fc", C, 4 * C, true, L),
        ("fcproj", 4 * C, C, true, L),
        ("lm head", C, VP, false, 1),
    ] {
        let (inp, wt, bs) = (filled(&be, BT * c, 7), filled(&be, oc * c, 8), filled(&be, oc, 9));
        let (out, dinp, dwt, dbs) = (
            be.alloc::<f32>(BT * oc).unwrap(),
            be.alloc::<f32>(BT * c).unwrap(),
            be.alloc::<f32>(oc * c).unwrap(),
            be.alloc::<f32>(oc).unwrap(),
        );
        let bias_arg = has_bias.then(|| bs.span().act());
        let dbias_arg = has_bias.then(|| dbs.span());
        let fwd = time(&be, || {
            be.matmul_forward(out.span().act(), inp.span().act(), wt.span().act(), bias_arg, BT, c, oc)
        });
        let bwd = time(&be, || {
            be.matmul_backward(
                Overwrite::ACCUMULATE,
                dinp.span().act(),
                dwt.span(),
                dbias_arg,
                out.span().act(),
                inp.span().act(),
                wt.span().act(),
                BT,
                c,
                oc,
            )
        });
        let tflops = |ms: f64, gemms: f64| gemms * 2.0 * (BT * c * oc) as f64 / (ms * 1e-3) / 1e12;
        eprintln!(
            "TIMING matmul {name:<8} fwd {:6.1} TFLOP/s  bwd {:6.1} TFLOP/s",
            tflops(fwd, 1.0),
            tflops(bwd, 2.0)
        );
        row(&format!("matmul {name} fwd"), fwd, per_step);
        row(&format!("matmul {name} bwd"), bwd, per_step);
        assert_finite(&be, name, &dinp);
    }

    let qkv = filled(&be, BT * 3 * C, 10);
    let (att_out, dqkv) = (be.alloc::<f32>(BT * C).unwrap(), be.alloc::<f32>(BT * 3 * C).unwrap());
    let saved = be.alloc::<f32>(be.attention_saved_len(B, T, NH)).unwrap();
    row(
        "attention fwd",
        time(&be, || {
            be.attention_forward(att_out.span().act(), saved.span(), qkv.span().act(), B, T, C, NH)
        }),
        L,
    );
    let att_b = || {
        be.attention_backward(
            false,
            dqkv.span().act(),
            None,
            x.span().act(),
            qkv.span().act(),
            att_out.span().act(),
            saved.span(),
            B,
            T,
            C,
            NH,
        )
    };
    row("attention bwd", time(&be, att_b), L);
    assert_finite(&be, "attention out", &att_out);
    assert_finite(&be, "attention dqkv", &dqkv);
    drop(saved);
    be.synchronize().unwrap();
    {
        let saved = gemm.alloc::<f32>(gemm.attention_saved_len(B, T, NH)).unwrap();
        let fwd = || gemm.attention_forward(att_out.span().act(), saved.span(), qkv.span().act(), B, T, C, NH);
        row("(attention fwd, gemm)", time(&gemm, fwd), 0);
        let bwd = || {
            gemm.attention_backward(
                false,
                dqkv.span().act(),
                None,
                x.span().act(),
                qkv.span().act(),
                att_out.span().act(),
                saved.span(),
                B,
                T,
                C,
                NH,
            )
        };
        row("(attention bwd, gemm)", time(&gemm, bwd), 0);
    }

    let (h, gh, dh) = (
        filled(&be, BT * 4 * C, 11),
        be.alloc::<f32>(BT * 4 * C).unwrap(),
        be.alloc::<f32>(BT * 4 * C).unwrap(),
    );
    row(
        "gelu fwd",
        time(&be, || be.gelu_forward(gh.span().act(), h.span().act(), BT * 4 * C)),
        L,
    );
    row(
        "gelu bwd",
        time(&be, || {
            be.gelu_backward(dh.span().act(), h.span().act(), gh.span().act(), BT * 4 * C)
        }),
        L,
    );
    let sum = be.alloc::<f32>(BT * C).unwrap();
    row(
        "residual add",
        time(&be, || {
            be.add(sum.span().act(), x.span().act(), dx.span().act(), BT * C)
        }),
        2 * L,
    );
    row(
        "residual accumulate",
        time(&be, || be.accumulate(dx.span(), x.span(), BT * C)),
        4 * L,
    );
    let add_ms = time(&be, || {
        be.add(
            h.span().act(),
            h.span().slice(BT * 2 * C, BT * 2 * C).act(),
            gh.span().act(),
            BT * 2 * C,
        )
    });
    eprintln!(
        "TIMING ceiling: add kernel over {} M floats moves {:.0} GB/s (bytes read + written)",
        BT * 2 * C / 1_000_000,
        3.0 * 4.0 * (BT * 2 * C) as f64 / (add_ms * 1e-3) / 1e9
    );

    let logits = filled(&be, BT * VP, 12);
    let (losses, dlogits, loss) = (
        be.alloc::<f32>(BT).unwrap(),
        be.alloc::<f32>(BT * VP).unwrap(),
        be.alloc::<f32>(1).unwrap(),
    );
    row(
        "crossentropy fwd",
        time(&be, || unsafe {
            be.crossentropy_forward(losses.span(), logits.span().act(), tokens.span(), BT, V, VP)
        }),
        1,
    );
    let ce_b = || unsafe {
        be.crossentropy_backward(
            dlogits.span().act(),
            logits.span().act(),
            tokens.span(),
            1.0 / BT as f32,
            BT,
            V,
            VP,
        )
    };
    row("(crossentropy bwd, accumulate)", time(&be, ce_b), 0);
    let ce_in_place = || unsafe {
        be.crossentropy_backward_in_place(
            dlogits.span().act(),
            losses.span(),
            tokens.span(),
            1.0 / BT as f32,
            BT,
            V,
            VP,
        )
    };
    row("crossentropy bwd in place", time(&be, ce_in_place), 1);
    row("mean (loss)", time(&be, || be.mean(loss.span(), losses.span(), BT)), 1);
    assert_finite(&be, "losses", &losses);
    drop((logits, dlogits));

    let (params, grads, m, v) = (
        filled(&be, PARAMS, 13),
        filled(&be, PARAMS, 14),
        be.alloc::<f32>(PARAMS).unwrap(),
        be.alloc::<f32>(PARAMS).unwrap(),
    );
    let step = StepState {
        lr: 6e-4,
        bias1: 0.1,
        bias2: 0.05,
        clip: 1.0,
        apply: 1.0,
        ..Default::default()
    };
    let state = be.alloc::<f32>(StepState::WORDS).unwrap();
    be.write(&state, 0, bytemuck::cast_slice(std::slice::from_ref(&step)))
        .unwrap();
    let (sumsq, history) = (be.alloc::<f32>(1).unwrap(), be.alloc::<f32>(8).unwrap());
    row("zero grads", time(&be, || be.zero(grads.span(), PARAMS)), 1);
    row(
        "sum_squares",
        time(&be, || be.sum_squares(sumsq.span(), params.span(), PARAMS)),
        1,
    );
    row(
        "step_stats",
        time(&be, || be.step_stats(state.span(), history.span(), 4, 1.0, 1.0)),
        1,
    );
    let hp = AdamWHyper {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    row(
        "adamw",
        time(&be, || {
            be.adamw(
                params.span(),
                grads.span(),
                m.span(),
                v.span(),
                &[(0..PARAMS, true)],
                state.span(),
                hp,
                None,
            )
        }),
        1,
    );
    assert_finite(&be, "params", &params);

    eprintln!(
        "TIMING {} B={B} T={T}: op, ms per call, calls per step, ms per step",
        be.name()
    );
    let mut total = 0.0;
    for (name, ms, n) in &rows {
        total += ms * *n as f64;
        eprintln!("TIMING   {name:<22} {ms:8.3} ms x{n:<3} = {:8.2} ms", ms * *n as f64);
    }
    eprintln!(
        "TIMING   estimated step {total:.1} ms = {:.0} tokens/s; peak backend memory here {:.2} GiB",
        BT as f64 / (total * 1e-3),
        be.peak_memory_bytes() as f64 / (1u64 << 30) as f64
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpt2_124m_ops_at_full_size_fp32() {
    let _gpu = support::one_at_a_time();
    gpt2_step_table(Precision::Fp32);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpt2_124m_ops_at_full_size_tf32() {
    let _gpu = support::one_at_a_time();
    gpt2_step_table(Precision::Tf32);
}
