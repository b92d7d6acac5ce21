//! Every backward kernel of the CPU backend against central finite differences of its
//! forward kernel, and the whole model's gradient against finite differences of its loss.
//! Reference: L = Σ out ⊙ R for a fixed random R, differentiated numerically with step
//! h = 1e-2 in f32; tolerance |analytic − numeric| ≤ 2e-2·max(|a|,|n|) + 2e-3.

use common::autograd::{Graph, Pool, Recompute};
use common::backend::cpu::{CpuBackend, CpuBuffer};
use common::backend::{token_order, AdamWHyper, Backend, DeviceBuffer, Overwrite, StepState};
use common::model::{ConfigOverrides, Gpt2, ModelConfig};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn randn(n: usize, scale: f32, r: &mut ChaCha8Rng) -> Vec<f32> {
    (0..n)
        .map(|_| ((r.next_u32() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale)
        .collect()
}

fn upload(be: &CpuBackend, data: &[f32]) -> CpuBuffer<f32> {
    let b = be.alloc::<f32>(data.len()).unwrap();
    be.write(&b, 0, data).unwrap();
    b
}

fn read(be: &CpuBackend, b: &CpuBuffer<f32>) -> Vec<f32> {
    let mut v = vec![0.0; b.len()];
    be.read(b, 0, &mut v).unwrap();
    v
}

fn tokens(be: &CpuBackend, ids: &[i32]) -> CpuBuffer<i32> {
    let b = be.alloc::<i32>(ids.len()).unwrap();
    be.write(&b, 0, ids).unwrap();
    b
}

/// Compares `analytic` with central differences of `loss` w.r.t. the values in `x`,
/// at up to 40 coordinates spread over the array.
fn check(name: &str, be: &CpuBackend, x: &CpuBuffer<f32>, analytic: &[f32], mut loss: impl FnMut() -> f64) {
    let h = 1e-2f32;
    let n = x.len();
    let stride = (n / 40).max(1);
    let mut worst = 0.0f32;
    for i in (0..n).step_by(stride) {
        let mut v = read(be, x);
        let orig = v[i];
        v[i] = orig + h;
        be.write(x, 0, &v).unwrap();
        let up = loss();
        v[i] = orig - h;
        be.write(x, 0, &v).unwrap();
        let down = loss();
        v[i] = orig;
        be.write(x, 0, &v).unwrap();
        let numeric = ((up - down) / (2.0 * h as f64)) as f32;
        let a = analytic[i];
        let err = (a - numeric).abs();
        let tol = 2e-2 * a.abs().max(numeric.abs()) + 2e-3;
        assert!(
            err <= tol,
            "{name}[{i}]: analytic {a} vs numeric {numeric} (error {err} > {tol})"
        );
        worst = worst.max(err);
    }
    assert!(
        analytic.iter().any(|&g| g != 0.0),
        "{name}: gradient is identically zero"
    );
    eprintln!(
        "{name}: worst error {worst:.2e} over {} coordinates",
        n.div_ceil(stride)
    );
}

/// Σ out ⊙ r in f64.
fn weighted(be: &CpuBackend, out: &CpuBuffer<f32>, r: &[f32]) -> f64 {
    read(be, out).iter().zip(r).map(|(&a, &b)| a as f64 * b as f64).sum()
}

fn be() -> CpuBackend {
    CpuBackend::new(2).unwrap()
}

#[test]
fn encoder_backward_matches_finite_differences() {
    let be = be();
    let (b, t, c, v) = (2, 5, 8, 11);
    let mut r = rng(1);
    let ids: Vec<i32> = (0..b * t).map(|i| (i * 7 % 4) as i32).collect(); // repeats: tests accumulation
    let (wte, wpe, tok) = (
        upload(&be, &randn(v * c, 1.0, &mut r)),
        upload(&be, &randn(t * c, 1.0, &mut r)),
        tokens(&be, &ids),
    );
    let order = tokens(&be, &token_order(&ids));
    let out = be.alloc::<f32>(b * t * c).unwrap();
    let rw = randn(b * t * c, 1.0, &mut r);
    let (dwte, dwpe) = (be.alloc::<f32>(v * c).unwrap(), be.alloc::<f32>(t * c).unwrap());
    let dout = upload(&be, &rw);
    unsafe {
        be.encoder_backward(
            dwte.span(),
            dwpe.span(),
            dout.span().act(),
            tok.span(),
            order.span(),
            b,
            t,
            c,
        )
    };
    let mut f = || {
        unsafe {
            be.encoder_forward(
                out.span().act(),
                tok.span(),
                None,
                wte.span().act(),
                wpe.span().act(),
                b,
                t,
                c,
            )
        };
        weighted(&be, &out, &rw)
    };
    check("dwte", &be, &wte, &read(&be, &dwte), &mut f);
    check("dwpe", &be, &wpe, &read(&be, &dwpe), &mut f);
}

#[test]
fn matmul_backward_matches_finite_differences() {
    let be = be();
    let (bt, c, oc) = (6, 10, 7);
    let mut r = rng(2);
    let (inp, w, bias) = (
        upload(&be, &randn(bt * c, 1.0, &mut r)),
        upload(&be, &randn(oc * c, 1.0, &mut r)),
        upload(&be, &randn(oc, 1.0, &mut r)),
    );
    let rw = randn(bt * oc, 1.0, &mut r);
    let (dinp, dw, db) = (
        be.alloc::<f32>(bt * c).unwrap(),
        be.alloc::<f32>(oc * c).unwrap(),
        be.alloc::<f32>(oc).unwrap(),
    );
    // Pre-fill gradients to check that backward accumulates instead of overwriting.
    let pre = randn(oc, 1.0, &mut r);
    be.write(&db, 0, &pre).unwrap();
    be.matmul_backward(
        Overwrite::ACCUMULATE,
        dinp.span().act(),
        dw.span(),
        Some(db.span()),
        upload(&be, &rw).span().act(),
        inp.span().act(),
        w.span().act(),
        bt,
        c,
        oc,
    );
    let out = be.alloc::<f32>(bt * oc).unwrap();
    let mut f = || {
        be.matmul_forward(
            out.span().act(),
            inp.span().act(),
            w.span().act(),
            Some(bias.span().act()),
            bt,
            c,
            oc,
        );
        weighted(&be, &out, &rw)
    };
    check("dinp", &be, &inp, &read(&be, &dinp), &mut f);
    check("dw", &be, &w, &read(&be, &dw), &mut f);
    let dbias: Vec<f32> = read(&be, &db).iter().zip(&pre).map(|(a, p)| a - p).collect();
    check("dbias", &be, &bias, &dbias, &mut f);
}

#[test]
fn layernorm_backward_matches_finite_differences() {
    let be = be();
    let (bt, c) = (5, 12);
    let mut r = rng(3);
    let (inp, w, b) = (
        upload(&be, &randn(bt * c, 2.0, &mut r)),
        upload(&be, &randn(c, 1.0, &mut r)),
        upload(&be, &randn(c, 1.0, &mut r)),
    );
    let (out, mean, rstd) = (
        be.alloc::<f32>(bt * c).unwrap(),
        be.alloc::<f32>(bt).unwrap(),
        be.alloc::<f32>(bt).unwrap(),
    );
    let rw = randn(bt * c, 1.0, &mut r);
    be.layernorm_forward(
        out.span().act(),
        mean.span(),
        rstd.span(),
        inp.span().act(),
        w.span().act(),
        b.span().act(),
        bt,
        c,
    );
    let (dinp, dw, db) = (
        be.alloc::<f32>(bt * c).unwrap(),
        be.alloc::<f32>(c).unwrap(),
        be.alloc::<f32>(c).unwrap(),
    );
    be.layernorm_backward(
        dinp.span().act(),
        dw.span(),
        db.span(),
        upload(&be, &rw).span().act(),
        inp.span().act(),
        w.span().act(),
        mean.span(),
        rstd.span(),
        bt,
        c,
    );
    let mut f = || {
        be.layernorm_forward(
            out.span().act(),
            mean.span(),
            rstd.span(),
            inp.span().act(),
            w.span().act(),
            b.span().act(),
            bt,
            c,
        );
        weighted(&be, &out, &rw)
    };
    check("dinp", &be, &inp, &read(&be, &dinp), &mut f);
    check("dw", &be, &w, &read(&be, &dw), &mut f);
    check("db", &be, &b, &read(&be, &db), &mut f);
}

#[test]
fn attention_backward_matches_finite_differences() {
    let be = be();
    let (b, t, c, nh) = (2, 7, 12, 3);
    let mut r = rng(4);
    let qkv = upload(&be, &randn(b * t * 3 * c, 1.0, &mut r));
    let (out, saved) = (
        be.alloc::<f32>(b * t * c).unwrap(),
        be.alloc::<f32>(be.attention_saved_len(b, t, nh)).unwrap(),
    );
    let rw = randn(b * t * c, 1.0, &mut r);
    be.attention_forward(out.span().act(), saved.span(), qkv.span().act(), b, t, c, nh);
    let dqkv = be.alloc::<f32>(b * t * 3 * c).unwrap();
    be.attention_backward(
        false,
        dqkv.span().act(),
        None,
        upload(&be, &rw).span().act(),
        qkv.span().act(),
        out.span().act(),
        saved.span(),
        b,
        t,
        c,
        nh,
    );
    let mut f = || {
        be.attention_forward(out.span().act(), saved.span(), qkv.span().act(), b, t, c, nh);
        weighted(&be, &out, &rw)
    };
    check("dqkv", &be, &qkv, &read(&be, &dqkv), &mut f);
    // The overwriting form ignores what the buffer held (qkv's first gradient).
    let dout = upload(&be, &rw);
    let filled = upload(&be, &randn(b * t * 3 * c, 100.0, &mut r));
    be.attention_forward(out.span().act(), saved.span(), qkv.span().act(), b, t, c, nh);
    be.attention_backward(
        true,
        filled.span().act(),
        None,
        dout.span().act(),
        qkv.span().act(),
        out.span().act(),
        saved.span(),
        b,
        t,
        c,
        nh,
    );
    assert_eq!(read(&be, &filled), read(&be, &dqkv));
}

#[test]
fn attention_is_causal() {
    // Changing a later token's key/value must not change earlier outputs.
    let be = be();
    let (b, t, c, nh) = (1, 6, 8, 2);
    let mut r = rng(5);
    let mut x = randn(b * t * 3 * c, 1.0, &mut r);
    let run = |x: &[f32]| {
        let (out, saved) = (
            be.alloc::<f32>(b * t * c).unwrap(),
            be.alloc::<f32>(be.attention_saved_len(b, t, nh)).unwrap(),
        );
        be.attention_forward(out.span().act(), saved.span(), upload(&be, x).span().act(), b, t, c, nh);
        read(&be, &out)
    };
    let before = run(&x);
    for v in &mut x[(t - 1) * 3 * c..] {
        *v += 1.0;
    }
    let after = run(&x);
    assert_eq!(before[..(t - 1) * c], after[..(t - 1) * c]);
    assert_ne!(before[(t - 1) * c..], after[(t - 1) * c..]);
}

#[test]
fn gelu_backward_matches_finite_differences() {
    let be = be();
    let n = 50;
    let mut r = rng(6);
    let inp = upload(&be, &randn(n, 3.0, &mut r));
    let out = be.alloc::<f32>(n).unwrap();
    let rw = randn(n, 1.0, &mut r);
    let dinp = be.alloc::<f32>(n).unwrap();
    be.gelu_backward(dinp.span().act(), inp.span().act(), upload(&be, &rw).span().act(), n);
    let mut f = || {
        be.gelu_forward(out.span().act(), inp.span().act(), n);
        weighted(&be, &out, &rw)
    };
    check("dgelu", &be, &inp, &read(&be, &dinp), &mut f);
}

#[test]
fn gelu_backward_in_place_is_gelu_backward_into_zeros() {
    let be = be();
    let n = 50_000; // several chunks
    let mut r = rng(16);
    let (x, dy) = (randn(n, 4.0, &mut r), randn(n, 1.0, &mut r));
    let (inp, dout) = (upload(&be, &x), upload(&be, &dy));
    let dinp = be.alloc::<f32>(n).unwrap();
    be.gelu_backward(dinp.span().act(), inp.span().act(), dout.span().act(), n);
    be.gelu_backward_in_place(dout.span().act(), inp.span().act(), n);
    // 0 + g·dy = g·dy exactly (compared as numbers: the sign of a zero may differ).
    assert!(read(&be, &dinp) == read(&be, &dout));
}

#[test]
fn relu_backward_matches_finite_differences() {
    // Inputs kept away from the kink at 0 (|x| >= 0.1, far beyond the difference step).
    let be = be();
    let n = 50;
    let mut r = rng(16);
    let x: Vec<f32> = randn(n, 2.0, &mut r)
        .iter()
        .map(|&v| if v.abs() < 0.1 { v + 0.2f32.copysign(v) } else { v })
        .collect();
    let inp = upload(&be, &x);
    let out = be.alloc::<f32>(n).unwrap();
    let rw = randn(n, 1.0, &mut r);
    let dinp = be.alloc::<f32>(n).unwrap();
    be.relu_backward(dinp.span().act(), inp.span().act(), upload(&be, &rw).span().act(), n);
    let mut f = || {
        be.relu_forward(out.span().act(), inp.span().act(), n);
        weighted(&be, &out, &rw)
    };
    check("drelu", &be, &inp, &read(&be, &dinp), &mut f);
}

#[test]
fn crossentropy_backward_matches_finite_differences() {
    let be = be();
    let (bt, v, vp) = (4, 9, 16);
    let mut r = rng(7);
    let logits = upload(&be, &randn(bt * vp, 2.0, &mut r));
    let tg = tokens(&be, &[0, 3, 8, 3]);
    let losses = be.alloc::<f32>(bt).unwrap();
    let dlogits = be.alloc::<f32>(bt * vp).unwrap();
    let dloss = 0.7;
    unsafe { be.crossentropy_backward(dlogits.span().act(), logits.span().act(), tg.span(), dloss, bt, v, vp) };
    let mut f = || {
        unsafe { be.crossentropy_forward(losses.span(), logits.span().act(), tg.span(), bt, v, vp) };
        read(&be, &losses).iter().map(|&l| l as f64 * dloss as f64).sum()
    };
    let d = read(&be, &dlogits);
    check("dlogits", &be, &logits, &d, &mut f);
    for row in d.chunks(vp) {
        assert!(
            row[v..].iter().all(|&x| x == 0.0),
            "padded vocabulary columns must get no gradient"
        );
    }
}

#[test]
fn in_place_crossentropy_backward_equals_the_accumulating_one_into_zeros() {
    // The in-place version takes the normaliser from the loss: equal up to rounding
    // (|difference| <= 1e-6 of the largest gradient); the padding, garbage before, must be 0.
    let be = be();
    let (bt, v, vp) = (5, 11, 16);
    let mut r = rng(12);
    let x = randn(bt * vp, 3.0, &mut r);
    let (logits, tg) = (upload(&be, &x), tokens(&be, &[0, 10, 4, 4, 7]));
    let (dlogits, losses) = (be.alloc::<f32>(bt * vp).unwrap(), be.alloc::<f32>(bt).unwrap());
    unsafe { be.crossentropy_forward(losses.span(), logits.span().act(), tg.span(), bt, v, vp) };
    unsafe { be.crossentropy_backward(dlogits.span().act(), logits.span().act(), tg.span(), 0.3, bt, v, vp) };
    unsafe { be.crossentropy_backward_in_place(logits.span().act(), losses.span(), tg.span(), 0.3, bt, v, vp) };
    let (want, got) = (read(&be, &dlogits), read(&be, &logits));
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
        assert!((a - b).abs() <= 1e-6 * scale, "[{i}]: {a} vs {b}");
    }
    assert!(got.chunks(vp).all(|row| row[v..].iter().all(|&x| x == 0.0)));
}

#[test]
fn add_is_elementwise_sum() {
    let be = be();
    let mut r = rng(13);
    let (a, b) = (randn(40_000, 1.0, &mut r), randn(40_000, 1.0, &mut r));
    let (da, db, out) = (upload(&be, &a), upload(&be, &b), be.alloc::<f32>(40_000).unwrap());
    be.add(out.span().act(), da.span().act(), db.span().act(), 40_000);
    let got = read(&be, &out);
    assert!(got.iter().zip(a.iter().zip(&b)).all(|(o, (x, y))| *o == x + y));
}

/// What `f` panicked with: it must panic.
fn panic_message(f: impl FnOnce()) -> String {
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("the op must panic");
    match (err.downcast_ref::<String>(), err.downcast_ref::<&str>()) {
        (Some(s), _) => s.clone(),
        (_, Some(s)) => s.to_string(),
        _ => String::new(),
    }
}

#[test]
fn an_op_refuses_a_span_too_short_for_its_dimensions() {
    let be = be();
    let (bt, c, oc) = (3, 4, 5);
    let mut r = rng(24);
    let (inp, w) = (
        upload(&be, &randn(bt * c, 1.0, &mut r)),
        upload(&be, &randn(oc * c, 1.0, &mut r)),
    );
    let out = upload(&be, &[7.0; 3 * 5]);
    let short = out.span().slice(0, bt * oc - 1).act();
    let msg = panic_message(|| be.matmul_forward(short, inp.span().act(), w.span().act(), None, bt, c, oc));
    assert!(msg.contains("matmul_forward") && msg.contains("out holds 14"), "{msg}");
    assert_eq!(read(&be, &out), [7.0; 3 * 5], "nothing was written");
    // An input one element short too; the whole buffers pass.
    let msg = panic_message(|| {
        be.matmul_forward(
            out.span().act(),
            inp.span().act(),
            w.span().slice(1, oc * c - 1).act(),
            None,
            bt,
            c,
            oc,
        )
    });
    assert!(msg.contains("matmul_forward") && msg.contains("w holds 19"), "{msg}");
    be.matmul_forward(out.span().act(), inp.span().act(), w.span().act(), None, bt, c, oc);
    assert!(read(&be, &out).iter().all(|&x| x != 7.0));
}

#[test]
fn an_op_refuses_a_written_operand_overlapping_an_input() {
    let be = be();
    let n = 8;
    let x = randn(2 * n, 1.0, &mut rng(25));
    let buf = upload(&be, &x);
    let s = buf.span();
    // An output that starts one element into its input.
    let msg = panic_message(|| be.gelu_forward(s.slice(1, n).act(), s.slice(0, n).act(), n));
    assert!(msg.contains("gelu_forward") && msg.contains("overlaps"), "{msg}");
    // A product's output (2 values) straddling the start of its weight.
    let inp = upload(&be, &randn(2 * n, 1.0, &mut rng(26)));
    let (out, w) = (s.slice(n - 1, 2).act(), s.slice(n, n).act());
    let msg = panic_message(|| be.matmul_forward(out, inp.span().act(), w, None, 2, n, 1));
    assert!(msg.contains("matmul_forward") && msg.contains("overlaps"), "{msg}");
    assert_eq!(read(&be, &buf), x, "nothing was written");
    // `dst += src` may read dst itself, but not dst shifted.
    let msg = panic_message(|| be.accumulate(s.slice(0, n), s.slice(1, n), n));
    assert!(msg.contains("accumulate") && msg.contains("overlaps"), "{msg}");
    be.accumulate(s.slice(0, n), s.slice(0, n), n);
    let doubled: Vec<f32> = x[..n].iter().map(|v| v + v).collect();
    assert_eq!(read(&be, &buf)[..n], doubled);
}

#[test]
fn adamw_matches_the_reference_formula() {
    let be = be();
    let n = 100;
    let mut r = rng(8);
    let (p0, g, m0, v0) = (
        randn(n, 1.0, &mut r),
        randn(n, 1.0, &mut r),
        randn(n, 0.1, &mut r),
        randn(n, 0.1, &mut r),
    );
    let v0: Vec<f32> = v0.iter().map(|x| x.abs()).collect();
    let (p, gb, m, v) = (upload(&be, &p0), upload(&be, &g), upload(&be, &m0), upload(&be, &v0));
    // Step 2 (t = 3), gradients clipped by 0.5.
    let [lr, bias1, bias2, _] = StepState::schedule(1e-2, 0.9, 0.95, 2);
    let mut state = StepState {
        lr,
        bias1,
        bias2,
        step: 2,
        clip: 0.5,
        apply: 1.0,
        ..Default::default()
    };
    let hp = AdamWHyper {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let update = |state: &StepState| {
        let st = upload(&be, bytemuck::cast_slice(std::slice::from_ref(state)));
        be.adamw(
            p.span(),
            gb.span(),
            m.span(),
            v.span(),
            &[(0..n, true)],
            st.span(),
            hp,
            None,
        );
    };
    update(&state);
    let (pn, mn, vn) = (read(&be, &p), read(&be, &m), read(&be, &v));
    // A step the device decided to skip changes nothing.
    state.apply = 0.0;
    update(&state);
    assert_eq!(
        (read(&be, &p), read(&be, &m), read(&be, &v)),
        (pn.clone(), mn.clone(), vn.clone()),
        "skipped"
    );
    for i in 0..n {
        let gi = g[i] as f64 * 0.5;
        let mi = 0.9 * m0[i] as f64 + 0.1 * gi;
        let vi = 0.95 * v0[i] as f64 + 0.05 * gi * gi;
        let (mh, vh) = (mi / (1.0 - 0.9f64.powi(3)), vi / (1.0 - 0.95f64.powi(3)));
        let pi = p0[i] as f64 - 1e-2 * (mh / (vh.sqrt() + 1e-8) + 0.1 * p0[i] as f64);
        assert!(
            (mn[i] as f64 - mi).abs() < 1e-6 && (vn[i] as f64 - vi).abs() < 1e-6,
            "moment {i}"
        );
        assert!((pn[i] as f64 - pi).abs() < 1e-5, "param {i}: {} vs {pi}", pn[i]);
    }
}

#[test]
fn step_stats_clip_average_decide_and_keep_history() {
    let be = be();
    let g = upload(&be, &[3.0, 4.0]);
    let history = be.alloc::<f32>(2 * 8).unwrap();
    let stats = |loss: f32, max_norm: f32| {
        let state = StepState {
            loss,
            step: 1029,
            ..Default::default()
        };
        let s = upload(&be, bytemuck::cast_slice(std::slice::from_ref(&state)));
        be.sum_squares(s.span(), g.span(), 2);
        be.step_stats(s.span(), history.span(), 8, max_norm, 0.5);
        *bytemuck::from_bytes::<StepState>(bytemuck::cast_slice(&read(&be, &s)))
    };
    let s = stats(6.0, 1.0);
    assert_eq!((s.sumsq, s.norm, s.loss, s.apply), (25.0, 5.0, 3.0, 1.0));
    assert!((s.clip - 0.2).abs() < 1e-6);
    assert_eq!(
        &read(&be, &history)[10..12],
        &[3.0, 5.0],
        "step 1029 in slot 1029 mod 8"
    );
    assert_eq!(stats(6.0, 10.0).clip, 1.0, "no clipping under the ceiling");
    assert_eq!(stats(6.0, 0.0).clip, 1.0, "clipping off");
    assert_eq!(stats(f32::NAN, 1.0).apply, 0.0, "a non-finite loss skips the update");
    assert_eq!(stats(f32::INFINITY, 1.0).apply, 0.0);
}

fn tiny_model(be: &CpuBackend) -> Gpt2<CpuBackend> {
    let ov = ConfigOverrides {
        n_layer: Some(2),
        n_head: Some(2),
        n_embd: Some(8),
        max_seq_len: Some(8),
    };
    let cfg = ModelConfig::from_preset("tiny", 13, ov).unwrap();
    let model = Gpt2::new(be, cfg).unwrap();
    model.init_weights(be, 7).unwrap();
    // Larger weights than GPT-2's init, so every path carries a visible gradient.
    let mut p = vec![0.0; model.num_params()];
    be.read(&model.params, 0, &mut p).unwrap();
    let mut r = rng(9);
    for (x, n) in p.iter_mut().zip(randn(model.num_params(), 0.3, &mut r)) {
        *x += n;
    }
    be.write(&model.params, 0, &p).unwrap();
    model
}

fn model_loss(be: &CpuBackend, model: &Gpt2<CpuBackend>, pool: &mut Pool<CpuBackend>, inp: &[i32], tg: &[i32]) -> f64 {
    let mut g = Graph::new(be, pool, false);
    let fwd = model.forward(&mut g, inp, Some(tg), 2, 5, false).unwrap();
    let mut l = [0.0f32];
    g.read(fwd.loss.unwrap(), &mut l).unwrap();
    l[0] as f64
}

#[test]
fn whole_model_gradient_matches_finite_differences() {
    let be = be();
    let model = tiny_model(&be);
    let mut pool = Pool::default();
    let inp: Vec<i32> = vec![1, 5, 2, 9, 12, 0, 3, 3, 7, 11];
    let tg: Vec<i32> = vec![5, 2, 9, 12, 0, 3, 3, 7, 11, 4];
    {
        let mut g = Graph::new(&be, &mut pool, true);
        let fwd = model.forward(&mut g, &inp, Some(&tg), 2, 5, false).unwrap();
        g.backward(fwd.loss.unwrap(), 1.0).unwrap();
    }
    let mut grads = vec![0.0; model.num_params()];
    be.read(&model.grads, 0, &mut grads).unwrap();
    let cfg = model.config;
    let h = 1e-2f32;
    let mut params = vec![0.0; model.num_params()];
    be.read(&model.params, 0, &mut params).unwrap();
    for e in &model.layout.entries {
        let (name, range) = (&e.name, e.range.clone());
        // Padded vocabulary rows and unused positions have no gradient: skip them.
        let used = match name.as_str() {
            "wte" => range.start..range.start + cfg.vocab_size * cfg.n_embd,
            "wpe" => range.start..range.start + 5 * cfg.n_embd,
            _ => range.clone(),
        };
        for i in used.clone().step_by((used.len() / 6).max(1)) {
            let orig = params[i];
            let mut at = |x: f32| {
                params[i] = x;
                be.write(&model.params, 0, &params).unwrap();
                model_loss(&be, &model, &mut pool, &inp, &tg)
            };
            let numeric = ((at(orig + h) - at(orig - h)) / (2.0 * h as f64)) as f32;
            at(orig);
            let a = grads[i];
            let tol = 3e-2 * a.abs().max(numeric.abs()) + 2e-3;
            assert!(
                (a - numeric).abs() <= tol,
                "{name}[{}]: analytic {a} vs numeric {numeric}",
                i - range.start
            );
        }
    }
}

/// The loss's gradient computed in the forward pass (`Graph::with_loss_seed`, what training
/// does) is the one backward computes: on the CPU the same ops, so bit for bit. A backward
/// seed other than the announced one is an error, not a silently wrong gradient.
#[test]
fn loss_gradient_in_the_forward_pass_equals_the_backward_one() {
    let be = be();
    let model = tiny_model(&be);
    let mut pool = Pool::default();
    let inp: Vec<i32> = vec![1, 5, 2, 9, 12, 0, 3, 3, 7, 11];
    let tg: Vec<i32> = vec![5, 2, 9, 12, 0, 3, 3, 7, 11, 4];
    let mut run = |announce: Option<f32>, seed: f32| {
        be.zero_buffer(&model.grads);
        let mut g = Graph::new(&be, &mut pool, true);
        if let Some(s) = announce {
            g = g.with_loss_seed(s);
        }
        let fwd = model.forward(&mut g, &inp, Some(&tg), 2, 5, false).unwrap();
        let loss = fwd.loss.unwrap();
        let mut l = [0.0f32];
        g.read(loss, &mut l).unwrap();
        let done = g.backward(loss, seed);
        let mut grads = vec![0.0; model.num_params()];
        be.read(&model.grads, 0, &mut grads).unwrap();
        done.map(|_| (l[0], grads))
    };
    assert_eq!(run(None, 0.5).unwrap(), run(Some(0.5), 0.5).unwrap());
    let err = run(Some(0.5), 0.25).unwrap_err().to_string();
    assert!(err.contains("seed"), "{err}");
}

/// The language-model head over row chunks (`Graph::lm_head` in a training pass) gives the
/// loss and gradients of the whole-logits path, as a step of two micro-batches uses it: the
/// first pass writes over stale gradients (`with_fresh_gradients`), the second adds.
#[test]
fn lm_head_in_row_chunks_equals_the_whole_logits() {
    let be = be();
    let model = tiny_model(&be);
    let mut pool = Pool::default();
    let inp: Vec<i32> = vec![1, 5, 2, 9, 12, 0, 3, 3, 7, 11];
    let tg: Vec<i32> = vec![5, 2, 9, 12, 0, 3, 3, 7, 11, 4];
    let mut step = |rows: Option<usize>| {
        be.write(&model.grads, 0, &vec![7.0; model.num_params()]).unwrap(); // stale
        let mut losses = Vec::new();
        for micro in 0..2 {
            let mut g = Graph::new(&be, &mut pool, true)
                .with_loss_seed(0.5)
                .with_fresh_gradients(micro == 0);
            if let Some(r) = rows {
                g = g.with_lm_head_rows(r);
            }
            let fwd = model.forward(&mut g, &inp, Some(&tg), 2, 5, false).unwrap();
            assert_eq!(fwd.logits.is_none(), rows.is_some(), "chunked: no logits kept");
            let loss = fwd.loss.unwrap();
            if micro == 0 {
                g.zero_grads_except_first_products(&model.grads).unwrap();
            }
            let mut l = [0.0f32];
            g.read(loss, &mut l).unwrap();
            g.backward(loss, 0.5).unwrap();
            losses.push(l[0]);
        }
        let mut grads = vec![0.0; model.num_params()];
        be.read(&model.grads, 0, &mut grads).unwrap();
        (losses, grads)
    };
    let (want_loss, want) = step(None);
    for rows in [1, 3, 4, 9] {
        let (loss, got) = step(Some(rows));
        assert_eq!(loss, want_loss, "{rows} rows a chunk: the loss");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{rows} rows a chunk: grad[{i}] {a} vs {b}"
            );
        }
    }
    // A pass that added to the weight's gradient before the step's zeroing is refused.
    let mut g = Graph::new(&be, &mut pool, true)
        .with_loss_seed(0.5)
        .with_lm_head_rows(3);
    model.forward(&mut g, &inp, Some(&tg), 2, 5, false).unwrap();
    let err = g
        .zero_grads_except_first_products(&model.grads)
        .unwrap_err()
        .to_string();
    assert!(err.contains("with_fresh_gradients"), "{err}");
}

#[test]
fn cpu_results_do_not_depend_on_thread_count() {
    let one = CpuBackend::new(1).unwrap();
    let two = CpuBackend::new(2).unwrap();
    let grads_of = |be: &CpuBackend| {
        let model = tiny_model(be);
        let mut pool = Pool::default();
        let inp: Vec<i32> = (0..10).map(|i| i * 5 % 13).collect();
        let tg: Vec<i32> = (0..10).map(|i| i * 3 % 13).collect();
        let mut g = Graph::new(be, &mut pool, true);
        let fwd = model.forward(&mut g, &inp, Some(&tg), 2, 5, false).unwrap();
        g.backward(fwd.loss.unwrap(), 1.0).unwrap();
        drop(g);
        let mut v = vec![0.0; model.num_params()];
        be.read(&model.grads, 0, &mut v).unwrap();
        v
    };
    let (a, b) = (grads_of(&one), grads_of(&two));
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "1 and 2 threads must agree bit for bit"
    );
}

// ---- the MLP op ---------------------------------------------------------------------

/// How a test graph writes its MLPs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum MlpForm {
    /// `Graph::mlp`.
    Op,
    /// `Graph::mlp` under `--recompute` (the GELU outputs computed again in backward).
    OpRecompute,
    /// `matmul`, `gelu`, `matmul`: the ops `Graph::mlp` replaces.
    Composed,
}

/// Dimensions of the MLP test net: B, T, C, hidden H, vocabulary V.
const MLP_NET: (usize, usize, usize, usize, usize) = (2, 3, 8, 12, 7);

/// Shapes of the net's parameters, in buffer order: wte, wpe, the first MLP (C→H→C, with
/// biases), the second (C→H→V, no first bias).
fn mlp_net_shapes() -> Vec<[usize; 2]> {
    let (_, t, c, h, v) = MLP_NET;
    vec![[v, c], [t, c], [h, c], [1, h], [c, h], [1, c], [h, c], [v, h], [1, v]]
}

/// Mean cross-entropy of encoder → mlp → mlp → cross-entropy; with `grads`, also back-
/// propagates into them. Two MLPs, so that under `--recompute` the second's GELU output takes
/// over the scratch and the first's is computed again in backward.
fn mlp_net(be: &CpuBackend, params: &CpuBuffer<f32>, grads: Option<&CpuBuffer<f32>>, form: MlpForm) -> f32 {
    let (b, t, _, _, v) = MLP_NET;
    let ids: Vec<i32> = vec![1, 5, 2, 6, 0, 3];
    let targets: Vec<i32> = vec![5, 2, 6, 0, 3, 4];
    let mut pool = Pool::default();
    let mut g = Graph::new(be, &mut pool, grads.is_some()).with_recompute(if form == MlpForm::OpRecompute {
        Recompute::All
    } else {
        Recompute::None
    });
    let mut at = 0;
    let mut p = Vec::new();
    for shape in mlp_net_shapes() {
        let n = shape[0] * shape[1];
        p.push(g.param(params, None, grads, at..at + n, shape).unwrap());
        at += n;
    }
    let mlp = |g: &mut Graph<'_, CpuBackend>, x, w_fc, b_fc, w_proj, b_proj| match form {
        MlpForm::Op | MlpForm::OpRecompute => g.mlp(x, w_fc, b_fc, w_proj, b_proj).unwrap(),
        MlpForm::Composed => {
            let pre = g.matmul(x, w_fc, b_fc).unwrap();
            let act = g.gelu(pre).unwrap();
            g.matmul(act, w_proj, b_proj).unwrap()
        }
    };
    let x = g.encoder(&ids, None, p[0], p[1], b, t).unwrap();
    let x = mlp(&mut g, x, p[2], Some(p[3]), p[4], Some(p[5]));
    let logits = mlp(&mut g, x, p[6], None, p[7], Some(p[8]));
    let loss = g.cross_entropy(logits, &targets, v).unwrap();
    if grads.is_some() {
        g.backward(loss, 1.0).unwrap();
    }
    let mut l = [0.0f32];
    g.read(loss, &mut l).unwrap();
    l[0]
}

fn mlp_net_params(be: &CpuBackend) -> CpuBuffer<f32> {
    let n = mlp_net_shapes().iter().map(|s| s[0] * s[1]).sum();
    upload(be, &randn(n, 1.0, &mut rng(17)))
}

/// Checks the `analytic` gradient of every tensor of a test net (`shapes`, in buffer order in
/// `params`) against central differences of `loss` at up to 7 coordinates a tensor; the
/// tensors listed in `unread` must have an all-zero gradient, every other a nonzero one.
fn check_net_gradient(
    name: &str,
    be: &CpuBackend,
    params: &CpuBuffer<f32>,
    shapes: &[[usize; 2]],
    analytic: &[f32],
    unread: &[usize],
    mut loss: impl FnMut() -> f64,
) {
    let h = 1e-2f32;
    let mut at = 0;
    for (k, shape) in shapes.iter().enumerate() {
        let n = shape[0] * shape[1];
        let mut worst = 0.0f32;
        for i in (at..at + n).step_by((n / 6).max(1)) {
            let mut v = read(be, params);
            let orig = v[i];
            let mut loss_at = |x: f32| {
                v[i] = x;
                be.write(params, 0, &v).unwrap();
                loss()
            };
            let numeric = ((loss_at(orig + h) - loss_at(orig - h)) / (2.0 * h as f64)) as f32;
            loss_at(orig);
            let a = analytic[i];
            let err = (a - numeric).abs();
            let tol = 2e-2 * a.abs().max(numeric.abs()) + 2e-3;
            assert!(
                err <= tol,
                "{name} tensor {k}[{}]: analytic {a} vs numeric {numeric}",
                i - at
            );
            worst = worst.max(err);
        }
        assert_eq!(
            analytic[at..at + n].iter().all(|&g| g == 0.0),
            unread.contains(&k),
            "{name} tensor {k}: the gradient must be zero exactly where the tensor is unread"
        );
        eprintln!("{name} tensor {k} {shape:?}: worst error {worst:.2e}");
        at += n;
    }
}

#[test]
fn mlp_op_gradient_matches_finite_differences() {
    let be = be();
    let params = mlp_net_params(&be);
    let grads = be.alloc::<f32>(params.len()).unwrap();
    mlp_net(&be, &params, Some(&grads), MlpForm::Op);
    let analytic = read(&be, &grads);
    check_net_gradient("mlp", &be, &params, &mlp_net_shapes(), &analytic, &[], || {
        mlp_net(&be, &params, None, MlpForm::Op) as f64
    });
}

#[test]
fn mlp_op_equals_the_composed_ops_and_recomputes_exactly_on_the_cpu() {
    // The CPU backend's fused methods are the trait's defaults (the ops composed), so the
    // op, the op under --recompute and matmul → gelu → matmul give the same numbers (compared
    // as numbers: 0 + g·dy and g·dy may differ in the sign of a zero).
    let be = be();
    let params = mlp_net_params(&be);
    let run = |form| {
        let grads = be.alloc::<f32>(params.len()).unwrap();
        let loss = mlp_net(&be, &params, Some(&grads), form);
        (loss, read(&be, &grads))
    };
    let want = run(MlpForm::Composed);
    for form in [MlpForm::Op, MlpForm::OpRecompute] {
        let got = run(form);
        assert_eq!(got.0.to_bits(), want.0.to_bits(), "{form:?}: loss");
        assert!(got.1 == want.1, "{form:?}: gradients differ");
    }
}

// ---- the residual add fused into layernorm ------------------------------------------

/// How a test graph writes its residual connections.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ResidualForm {
    /// `Graph::add_layernorm`.
    Op,
    /// `Graph::add_layernorm` under `--recompute` (the layernorm outputs computed again).
    OpRecompute,
    /// `add` then `layernorm`: the ops `Graph::add_layernorm` replaces.
    Composed,
    /// `Graph::add_layernorm`, then the product's output released (`Graph::release`, as the
    /// model does): the next product's output takes its memory.
    OpReleased,
}

/// Dimensions of the residual test net: B, T, C, vocabulary V.
const RESIDUAL_NET: (usize, usize, usize, usize) = (2, 3, 8, 7);

/// Shapes of the net's parameters, in buffer order: wte, wpe, a layernorm's (w, b), then three
/// times a product (w, bias) and the fused op's layernorm (w, b), then the head.
fn residual_net_shapes() -> Vec<[usize; 2]> {
    let (_, t, c, v) = RESIDUAL_NET;
    let mut shapes = vec![[v, c], [t, c], [1, c], [1, c]];
    for _ in 0..3 {
        shapes.extend([[c, c], [1, c], [1, c], [1, c]]);
    }
    shapes.push([v, c]);
    shapes
}

/// Mean cross-entropy of a net that reaches each path of the fused op's backward; with
/// `grads`, also back-propagates into them:
///
/// ```text
/// x0 = encoder; h0 = ln(x0); (x1, h1) = F(x0, mm(h0))   x0 has no gradient yet: written
/// (x2, h2) = F(x1, mm(h1))                               x1 has one (from the add below)
/// (x3, _) = F(x2, mm(h2))                                only the sum has a gradient
/// logits = mm(x3 + x1)
/// ```
fn residual_net(be: &CpuBackend, params: &CpuBuffer<f32>, grads: Option<&CpuBuffer<f32>>, form: ResidualForm) -> f32 {
    let (b, t, _, v) = RESIDUAL_NET;
    let ids: Vec<i32> = vec![1, 5, 2, 6, 0, 3];
    let targets: Vec<i32> = vec![5, 2, 6, 0, 3, 4];
    let mut pool = Pool::default();
    let mut g = Graph::new(be, &mut pool, grads.is_some()).with_recompute(if form == ResidualForm::OpRecompute {
        Recompute::All
    } else {
        Recompute::None
    });
    let mut at = 0;
    let mut p = Vec::new();
    for shape in residual_net_shapes() {
        let n = shape[0] * shape[1];
        p.push(g.param(params, None, grads, at..at + n, shape).unwrap());
        at += n;
    }
    let fused = |g: &mut Graph<'_, CpuBackend>, x, y, w, bias| match form {
        ResidualForm::Op | ResidualForm::OpRecompute | ResidualForm::OpReleased => {
            g.add_layernorm(x, y, w, bias, None).unwrap()
        }
        ResidualForm::Composed => {
            let sum = g.add(x, y).unwrap();
            (sum, g.layernorm(sum, w, bias).unwrap())
        }
    };
    let x0 = g.encoder(&ids, None, p[0], p[1], b, t).unwrap();
    let mut h = g.layernorm(x0, p[2], p[3]).unwrap();
    let mut xs = vec![x0];
    let mut released = None;
    for k in 0..3 {
        let q = &p[4 + 4 * k..8 + 4 * k];
        let y = g.matmul(h, q[0], Some(q[1])).unwrap();
        if let Some(addr) = released {
            assert_eq!(g.ptr(y).addr(), addr, "the released output's memory was not reused");
        }
        let (x, normed) = fused(&mut g, *xs.last().unwrap(), y, q[2], q[3]);
        if form == ResidualForm::OpReleased {
            released = Some(g.ptr(y).addr());
            g.release(y);
        }
        xs.push(x);
        h = normed;
    }
    let z = g.add(xs[3], xs[1]).unwrap();
    let logits = g.matmul(z, p[16], None).unwrap();
    let loss = g.cross_entropy(logits, &targets, v).unwrap();
    if grads.is_some() {
        g.backward(loss, 1.0).unwrap();
    }
    let mut l = [0.0f32];
    g.read(loss, &mut l).unwrap();
    l[0]
}

fn residual_net_params(be: &CpuBackend) -> CpuBuffer<f32> {
    let n = residual_net_shapes().iter().map(|s| s[0] * s[1]).sum();
    upload(be, &randn(n, 1.0, &mut rng(23)))
}

#[test]
fn add_layernorm_op_gradient_matches_finite_differences() {
    let be = be();
    let params = residual_net_params(&be);
    let grads = be.alloc::<f32>(params.len()).unwrap();
    residual_net(&be, &params, Some(&grads), ResidualForm::Op);
    let analytic = read(&be, &grads);
    // The last layernorm's output is never read: its (w, b), tensors 14 and 15, get nothing.
    let shapes = residual_net_shapes();
    check_net_gradient("residual", &be, &params, &shapes, &analytic, &[14, 15], || {
        residual_net(&be, &params, None, ResidualForm::Op) as f64
    });
}

#[test]
fn add_layernorm_op_equals_add_then_layernorm_bit_for_bit_on_the_cpu() {
    // The CPU backend's add_layernorm methods are the trait's defaults (add, layernorm_forward;
    // layernorm_backward, then zero + accumulate for the copy), and the graph hands the
    // gradients out as Op::Add did: the op, the op under --recompute, the op with the product's
    // output released and add → layernorm give the same bits, which keeps stage 0's runs what
    // they were.
    let be = be();
    let params = residual_net_params(&be);
    let run = |form| {
        let grads = be.alloc::<f32>(params.len()).unwrap();
        let loss = residual_net(&be, &params, Some(&grads), form);
        (loss, read(&be, &grads))
    };
    let want = run(ResidualForm::Composed);
    for form in [ResidualForm::Op, ResidualForm::OpRecompute, ResidualForm::OpReleased] {
        let got = run(form);
        assert_eq!(got.0.to_bits(), want.0.to_bits(), "{form:?}: loss");
        let same = got.1.iter().zip(&want.1).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{form:?}: gradients differ");
    }
}

#[test]
#[should_panic(expected = "released")]
fn a_released_value_cannot_be_read() {
    let be = be();
    let mut pool = Pool::default();
    let mut g = Graph::new(&be, &mut pool, false);
    let x = g.input(&[1.0, 2.0, 3.0, 4.0], 2, 2).unwrap();
    g.release(x);
    let _ = g.ptr(x);
}

/// The whole model's gradients after one backward pass into a gradient buffer full of NaN,
/// where only what `zero_grads_except_first_products` leaves to a product's first write is
/// not zeroed (`first_writes`), or after zeroing all of it.
fn model_gradients(be: &CpuBackend, first_writes: bool) -> Vec<f32> {
    // T = 12 of a 32-position model: wpe's rows past T get no gradient and must be zero.
    let ov = ConfigOverrides {
        n_layer: Some(2),
        n_head: Some(2),
        n_embd: Some(16),
        max_seq_len: Some(32),
    };
    let cfg = ModelConfig::from_preset("char", 40, ov).unwrap();
    let (b, t) = (2, 12);
    let model = Gpt2::new(be, cfg).unwrap();
    model.init_weights(be, 7).unwrap();
    be.write(&model.grads, 0, &vec![f32::NAN; model.grads.len()]).unwrap();
    let mut r = rng(3);
    let ids: Vec<i32> = (0..b * t + 1).map(|_| (r.next_u32() % 40) as i32).collect();
    let mut pool = Pool::default();
    let mut g = Graph::new(be, &mut pool, true);
    let fwd = model
        .forward(&mut g, &ids[..b * t], Some(&ids[1..]), b, t, false)
        .unwrap();
    if first_writes {
        g.zero_grads_except_first_products(&model.grads).unwrap();
    } else {
        be.zero_buffer(&model.grads);
    }
    g.backward(fwd.loss.unwrap(), 1.0).unwrap();
    drop(g);
    read(be, &model.grads)
}

/// A gradient left for a product that never ran (its output unused) is zero by the time
/// backward hands over the mark below that product: what `on_mark` passes on (a bucket summed
/// on another stream while backward goes on) must be whole, not wait for the end of backward.
#[test]
fn a_mark_hands_over_zeros_for_a_product_that_never_ran() {
    let be = be();
    let params = be.alloc::<f32>(32).unwrap();
    let grads = be.alloc::<f32>(32).unwrap();
    let values: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin()).collect();
    be.write(&params, 0, &values).unwrap();
    be.write(&grads, 0, &[f32::NAN; 32]).unwrap();
    let mut pool = Pool::default();
    let mut g = Graph::new(&be, &mut pool, true);
    let x = g.input(&[0.5, -1.0, 2.0, 0.25, 1.5, 0.0, -0.5, 1.0], 2, 4).unwrap();
    g.mark(0);
    let unused = g.param(&params, None, Some(&grads), 0..16, [4, 4]).unwrap();
    let used = g.param(&params, None, Some(&grads), 16..32, [4, 4]).unwrap();
    let _never_read = g.matmul(x, unused, None).unwrap();
    let logits = g.matmul(x, used, None).unwrap();
    let loss = g.cross_entropy(logits, &[1, 3], 4).unwrap();
    g.zero_grads_except_first_products(&grads).unwrap();
    let mut at_mark = Vec::new();
    g.backward_with(loss, 1.0, |_| {
        at_mark = read(&be, &grads);
        Ok(())
    })
    .unwrap();
    drop(g);
    assert_eq!(at_mark[..16], [0.0; 16], "the unused product's gradient at the mark");
    assert!(at_mark[16..].iter().all(|v| v.is_finite() && *v != 0.0), "{at_mark:?}");
    assert_eq!(read(&be, &grads), at_mark, "nothing changes after the mark");
}

#[test]
fn first_product_writes_equal_gradients_added_to_zeros() {
    // The matrices' gradients written by their products (wte's by the LM head, before the
    // encoder adds to it), the rest zeroed first: the same numbers as the whole buffer zeroed
    // and every gradient added (equal as numbers: 0 + g and g differ only in a zero's sign),
    // and no NaN left of what the buffer held.
    let be = be();
    let (want, got) = (model_gradients(&be, false), model_gradients(&be, true));
    assert!(want.iter().all(|x| x.is_finite()), "the zeroed run is finite");
    let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "{differ} of {} gradients differ", want.len());
}
