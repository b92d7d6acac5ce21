//! Each op's operands, checked: one function per [`Backend`](super::Backend) op (and
//! [`FusedMlp`](super::FusedMlp) op) that both backends call first, with the op's own
//! arguments and the backend's activation type. It checks every span against the extent
//! the op's `# Operands` section gives and that nothing the op writes overlaps another
//! operand ([`Operands`]), and hands back the addresses the kernels take. A failed check is
//! a panic naming the op and the operand.

#![allow(clippy::too_many_arguments, clippy::type_complexity)]

use super::{bf16, Act, ActType, DevPtr, Elem, Fp8, Fp8Out, Fp8Slot, Operands, Span, StepState};
use std::ops::Range;

type A = DevPtr<Act>;
type F = DevPtr;
type I = DevPtr<i32>;

fn ops(op: &'static str, act: ActType) -> Operands {
    Operands::new(op, act)
}

/// `nh` heads split the C channels evenly.
fn heads_divide(op: &str, c: usize, nh: usize) {
    assert!(nh > 0 && c.is_multiple_of(nh), "{op}: {nh} heads do not divide C = {c}");
}

/// The V real columns fit in the Vp a row of logits holds.
fn padded_vocab(op: &str, v: usize, vp: usize) {
    assert!(v <= vp, "{op}: V = {v} above the padded Vp = {vp}");
}

pub fn zero<T: Elem>(dst: Span<T>, n: usize) -> DevPtr<T> {
    ops("zero", ActType::F32).write("dst", dst, n)
}

pub fn round_to_bf16(dst: Span<bf16>, src: Span, n: usize) -> (DevPtr<bf16>, F) {
    let mut o = ops("round_to_bf16", ActType::F32);
    (o.write("dst", dst, n), o.read("src", src, n))
}

pub fn widen_bf16(dst: Span, src: Span<bf16>, n: usize) -> (F, DevPtr<bf16>) {
    let mut o = ops("widen_bf16", ActType::F32);
    (o.write("dst", dst, n), o.read("src", src, n))
}

pub fn quantize_fp8(
    act: ActType,
    dst: Span<u8>,
    amax: Span,
    src: Span<Act>,
    scale: Span,
    n: usize,
) -> (DevPtr<u8>, F, A, F) {
    let mut o = ops("quantize_fp8", act);
    let (dst, amax) = (o.write("dst", dst, n), o.write("amax", amax, 1));
    (dst, amax, o.read("src", src, n), o.read("scale", scale, 1))
}

pub fn quantize_fp8_both(
    act: ActType,
    [plain, transposed]: [Span<u8>; 2],
    amax: Span,
    src: Span<Act>,
    scale: Span,
    [rows, cols]: [usize; 2],
) -> ([DevPtr<u8>; 2], F, A, F) {
    let mut o = ops("quantize_fp8_both", act);
    let n = rows * cols;
    let dst = [o.write("plain", plain, n), o.write("transposed", transposed, n)];
    let amax = o.write("amax", amax, 1);
    (dst, amax, o.read("src", src, n), o.read("scale", scale, 1))
}

pub fn quantize_fp8_transposed(
    act: ActType,
    dst: Span<u8>,
    amax: Span,
    src: Span<Act>,
    scale: Span,
    [rows, cols]: [usize; 2],
) -> (DevPtr<u8>, F, A, F) {
    let mut o = ops("quantize_fp8_transposed", act);
    let n = rows * cols;
    let (dst, amax) = (o.write("dst", dst, n), o.write("amax", amax, 1));
    (dst, amax, o.read("src", src, n), o.read("scale", scale, 1))
}

/// [`Backend::gelu_backward_fp8`](super::Backend::gelu_backward_fp8)'s: `d` and `inp` read
/// (`d` left to the op), the three copies, their amaxes and `dbias` written.
pub fn gelu_backward_fp8(
    act: ActType,
    d: Span<Act>,
    inp: Span<Act>,
    [plain, act_t]: [Fp8Out; 2],
    transposed: Span<u8>,
    dbias: Option<Span>,
    [rows, cols]: [usize; 2],
) -> ([A; 2], [DevPtr<u8>; 3], [F; 4], Option<F>) {
    let mut o = ops("gelu_backward_fp8", act);
    let n = rows * cols;
    let dst = [
        o.write("plain", plain.dst, n),
        o.write("transposed", transposed, n),
        o.write("act_t", act_t.dst, n),
    ];
    let amax = [
        o.write("plain.amax", plain.amax, 1),
        o.write("act_t.amax", act_t.amax, 1),
    ];
    let dbias = o.write_opt("dbias", dbias, cols);
    let scale = [
        o.read("plain.scale", plain.scale, 1),
        o.read("act_t.scale", act_t.scale, 1),
    ];
    let (d, inp) = (o.read("d", d, n), o.read("inp", inp, n));
    ([d, inp], dst, [amax[0], scale[0], amax[1], scale[1]], dbias)
}

pub fn fp8_rescale(slots: Span, history: Span, n: usize, len: usize) -> (F, F) {
    let mut o = ops("fp8_rescale", ActType::F32);
    (
        o.write("slots", slots, n * Fp8Slot::WORDS),
        o.write("history", history, n * len),
    )
}

/// Also the rules of the tensor cores' FP8 products: no E5M2 by E5M2, every dimension a
/// multiple of 16, and each scale at an address that is a multiple of 16 bytes.
pub fn matmul_fp8(
    act: ActType,
    out: Span<Act>,
    x: Span<u8>,
    y: Span<u8>,
    bias: Option<Span<Act>>,
    dequant: [Span; 2],
    shape: [usize; 3],
    formats: [Fp8; 2],
) -> (A, DevPtr<u8>, DevPtr<u8>, Option<A>, [F; 2]) {
    let mut o = ops("matmul_fp8", act);
    let out = o.write("out", out, shape[0] * shape[1]);
    let (x, y, bias, dequant) = fp8_inputs(&mut o, x, y, bias, dequant, shape, formats);
    (out, x, y, bias, dequant)
}

/// [`matmul_fp8`]'s into an f32 weight gradient, `dw` written or added to.
pub fn matmul_fp8_weight_grad(
    dw: Span,
    x: Span<u8>,
    y: Span<u8>,
    dequant: [Span; 2],
    shape: [usize; 3],
    formats: [Fp8; 2],
) -> (F, DevPtr<u8>, DevPtr<u8>, [F; 2]) {
    let mut o = ops("matmul_fp8_weight_grad", ActType::F32);
    let dw = o.write("dw", dw, shape[0] * shape[1]);
    let (x, y, _, dequant) = fp8_inputs(&mut o, x, y, None, dequant, shape, formats);
    (dw, x, y, dequant)
}

/// [`matmul_fp8`]'s with GELU: `pre`, `scratch` and the FP8 copy `out` written, apart.
#[allow(clippy::too_many_arguments)]
pub fn matmul_fp8_gelu(
    act: ActType,
    pre: Span<Act>,
    scratch: Span<Act>,
    out: Fp8Out,
    x: Span<u8>,
    y: Span<u8>,
    bias: Option<Span<Act>>,
    dequant: [Span; 2],
    shape: [usize; 3],
) -> ([A; 2], [DevPtr<u8>; 3], Option<A>, [F; 2], [F; 2]) {
    let mut o = ops("matmul_fp8_gelu", act);
    let n = shape[0] * shape[1];
    let outs = [o.write("pre", pre, n), o.write("scratch", scratch, n)];
    let (dst, amax) = (o.write("out.dst", out.dst, n), o.write("out.amax", out.amax, 1));
    let scale = o.read("out.scale", out.scale, 1);
    let (x, y, bias, dequant) = fp8_inputs(&mut o, x, y, bias, dequant, shape, [Fp8::E4M3; 2]);
    (outs, [dst, x, y], bias, dequant, [scale, amax])
}

fn fp8_inputs(
    o: &mut Operands,
    x: Span<u8>,
    y: Span<u8>,
    bias: Option<Span<Act>>,
    dequant: [Span; 2],
    [r, s, k]: [usize; 3],
    formats: [Fp8; 2],
) -> (DevPtr<u8>, DevPtr<u8>, Option<A>, [F; 2]) {
    let op = o.name();
    assert!(
        formats != [Fp8::E5M2; 2],
        "{op}: E5M2 by E5M2 has no tensor-core product"
    );
    assert!(
        [r, s, k].iter().all(|d| d.is_multiple_of(16)),
        "{op}: R, S, K = {r}, {s}, {k}: each must be a multiple of 16"
    );
    let (x, y) = (o.read("x", x, r * k), o.read("y", y, s * k));
    let bias = o.read_opt("bias", bias, s);
    let dequant = [o.read("dequant[0]", dequant[0], 1), o.read("dequant[1]", dequant[1], 1)];
    for (i, p) in dequant.iter().enumerate() {
        assert!(p.addr().is_multiple_of(16), "{op}: dequant[{i}] is not 16-byte aligned");
    }
    (x, y, bias, dequant)
}

/// `dst += src`; `src` may be `dst` itself.
pub fn accumulate(dst: Span, src: Span, n: usize) -> (F, F) {
    let mut o = ops("accumulate", ActType::F32);
    (o.write("dst", dst, n), o.read_or_same("src", src, n))
}

pub fn accumulate_act(act: ActType, dst: Span<Act>, src: Span<Act>, n: usize) -> (A, A) {
    let mut o = ops("accumulate_act", act);
    (o.write("dst", dst, n), o.read_or_same("src", src, n))
}

pub fn add(act: ActType, out: Span<Act>, a: Span<Act>, b: Span<Act>, n: usize) -> (A, A, A) {
    let mut o = ops("add", act);
    (o.write("out", out, n), o.read("a", a, n), o.read("b", b, n))
}

pub fn scale(dst: Span, n: usize) -> F {
    ops("scale", ActType::F32).write("dst", dst, n)
}

/// Shapes only: that every id indexes `wte` is the caller's promise.
pub fn encoder_forward(
    act: ActType,
    out: Span<Act>,
    tokens: Span<i32>,
    first_position: Option<Span<i32>>,
    wte: Span<Act>,
    wpe: Span<Act>,
    b: usize,
    t: usize,
    c: usize,
) -> (A, I, Option<I>, A, A) {
    let mut o = ops("encoder_forward", act);
    let out = o.write("out", out, b * t * c);
    let tokens = o.read("tokens", tokens, b * t);
    let first = o.read_opt("first_position", first_position, 1);
    // That wte has a row for every id, and wpe rows for positions p..p + T, is the
    // caller's promise; wpe holds at least the T from 0.
    let wte = o.read("wte", wte, wte.len());
    let wpe = o.read("wpe", wpe, t * c);
    (out, tokens, first, wte, wpe)
}

pub fn encoder_backward(
    act: ActType,
    dwte: Span,
    dwpe: Span,
    dout: Span<Act>,
    tokens: Span<i32>,
    order: Span<i32>,
    b: usize,
    t: usize,
    c: usize,
) -> (F, F, A, I, I) {
    let mut o = ops("encoder_backward", act);
    let dwte = o.write("dwte", dwte, dwte.len());
    let dwpe = o.write("dwpe", dwpe, t * c);
    let dout = o.read("dout", dout, b * t * c);
    let tokens = o.read("tokens", tokens, b * t);
    let order = o.read("order", order, b * t);
    (dwte, dwpe, dout, tokens, order)
}

pub fn matmul_forward(
    act: ActType,
    out: Span<Act>,
    inp: Span<Act>,
    w: Span<Act>,
    bias: Option<Span<Act>>,
    bt: usize,
    c: usize,
    oc: usize,
) -> (A, A, A, Option<A>) {
    let mut o = ops("matmul_forward", act);
    let out = o.write("out", out, bt * oc);
    (
        out,
        o.read("inp", inp, bt * c),
        o.read("w", w, oc * c),
        o.read_opt("bias", bias, oc),
    )
}

#[allow(clippy::too_many_arguments)]
pub fn matmul_weight_backward(
    act: ActType,
    dw: Span,
    dbias: Option<Span>,
    dout: Span<Act>,
    inp: Span<Act>,
    bt: usize,
    c: usize,
    oc: usize,
) -> (F, Option<F>, A, A) {
    let mut o = ops("matmul_weight_backward", act);
    let (dw, dbias) = (o.write("dw", dw, oc * c), o.write_opt("dbias", dbias, oc));
    (dw, dbias, o.read("dout", dout, bt * oc), o.read("inp", inp, bt * c))
}

pub fn matmul_backward(
    act: ActType,
    dinp: Span<Act>,
    dw: Span,
    dbias: Option<Span>,
    dout: Span<Act>,
    inp: Span<Act>,
    w: Span<Act>,
    bt: usize,
    c: usize,
    oc: usize,
) -> (A, F, Option<F>, A, A, A) {
    let mut o = ops("matmul_backward", act);
    let (dinp, dw, dbias) = (
        o.write("dinp", dinp, bt * c),
        o.write("dw", dw, oc * c),
        o.write_opt("dbias", dbias, oc),
    );
    let (dout, inp, w) = (
        o.read("dout", dout, bt * oc),
        o.read("inp", inp, bt * c),
        o.read("w", w, oc * c),
    );
    (dinp, dw, dbias, dout, inp, w)
}

pub fn bias_backward(act: ActType, dbias: Span, dout: Span<Act>, bt: usize, oc: usize) -> (F, A) {
    let mut o = ops("bias_backward", act);
    (o.write("dbias", dbias, oc), o.read("dout", dout, bt * oc))
}

pub fn layernorm_forward(
    act: ActType,
    out: Span<Act>,
    mean: Span,
    rstd: Span,
    inp: Span<Act>,
    w: Span<Act>,
    b: Span<Act>,
    bt: usize,
    c: usize,
) -> (A, F, F, A, A, A) {
    let mut o = ops("layernorm_forward", act);
    let (out, mean, rstd) = (
        o.write("out", out, bt * c),
        o.write("mean", mean, bt),
        o.write("rstd", rstd, bt),
    );
    (
        out,
        mean,
        rstd,
        o.read("inp", inp, bt * c),
        o.read("w", w, c),
        o.read("b", b, c),
    )
}

pub fn layernorm_backward(
    act: ActType,
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
) -> (A, F, F, A, A, A, F, F) {
    let mut o = ops("layernorm_backward", act);
    let (dinp, dw, db) = (
        o.write("dinp", dinp, bt * c),
        o.write("dw", dw, c),
        o.write("db", db, c),
    );
    let (dout, inp, w) = (
        o.read("dout", dout, bt * c),
        o.read("inp", inp, bt * c),
        o.read("w", w, c),
    );
    (
        dinp,
        dw,
        db,
        dout,
        inp,
        w,
        o.read("mean", mean, bt),
        o.read("rstd", rstd, bt),
    )
}

pub fn add_layernorm_forward(
    act: ActType,
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
) -> (A, A, F, F, A, A, A, A) {
    let mut o = ops("add_layernorm_forward", act);
    let (sum, out) = (o.write("sum", sum, bt * c), o.write("out", out, bt * c));
    let (mean, rstd) = (o.write("mean", mean, bt), o.write("rstd", rstd, bt));
    let (a, b) = (o.read("a", a, bt * c), o.read("b", b, bt * c));
    (sum, out, mean, rstd, a, b, o.read("w", w, c), o.read("bias", bias, c))
}

pub fn add_layernorm_backward(
    act: ActType,
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
) -> (A, Option<A>, Option<F>, F, F, A, A, A, F, F) {
    let mut o = ops("add_layernorm_backward", act);
    let (dsum, copy) = (o.write("dsum", dsum, bt * c), o.write_opt("copy", copy, bt * c));
    let (dbias, dw, db) = (
        o.write_opt("dbias", dbias, c),
        o.write("dw", dw, c),
        o.write("db", db, c),
    );
    let (dout, sum, w) = (
        o.read("dout", dout, bt * c),
        o.read("sum", sum, bt * c),
        o.read("w", w, c),
    );
    (
        dsum,
        copy,
        dbias,
        dw,
        db,
        dout,
        sum,
        w,
        o.read("mean", mean, bt),
        o.read("rstd", rstd, bt),
    )
}

/// `saved`: the length the backend asks for ([`Backend::attention_saved_len`](super::Backend::attention_saved_len)).
pub fn attention_forward(
    act: ActType,
    out: Span<Act>,
    saved: Span,
    saved_len: usize,
    qkv: Span<Act>,
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
) -> (A, F, A) {
    heads_divide("attention_forward", c, nh);
    let mut o = ops("attention_forward", act);
    let (out, saved) = (o.write("out", out, b * t * c), o.write("saved", saved, saved_len));
    (out, saved, o.read("qkv", qkv, b * t * 3 * c))
}

pub fn attention_backward(
    act: ActType,
    dqkv: Span<Act>,
    dbias: Option<Span>,
    dout: Span<Act>,
    qkv: Span<Act>,
    out: Span<Act>,
    saved: Span,
    saved_len: usize,
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
) -> (A, Option<F>, A, A, A, F) {
    heads_divide("attention_backward", c, nh);
    let mut o = ops("attention_backward", act);
    let (dqkv, dbias) = (o.write("dqkv", dqkv, b * t * 3 * c), o.write_opt("dbias", dbias, 3 * c));
    let (dout, qkv, out) = (
        o.read("dout", dout, b * t * c),
        o.read("qkv", qkv, b * t * 3 * c),
        o.read("out", out, b * t * c),
    );
    (dqkv, dbias, dout, qkv, out, o.read("saved", saved, saved_len))
}

/// Shapes only: that `pos + t ≤ rows` for the position on the device is the caller's promise.
pub fn attention_cached_forward(
    act: ActType,
    out: Span<Act>,
    k_cache: Span<Act>,
    v_cache: Span<Act>,
    rows: usize,
    qkv: Span<Act>,
    pos: Span<i32>,
    t: usize,
    c: usize,
    nh: usize,
) -> (A, A, A, A, I) {
    heads_divide("attention_cached_forward", c, nh);
    assert!(
        t <= rows,
        "attention_cached_forward: {t} positions in a cache of {rows}"
    );
    let mut o = ops("attention_cached_forward", act);
    let out = o.write("out", out, t * c);
    let (k, v) = (
        o.write("k_cache", k_cache, rows * c),
        o.write("v_cache", v_cache, rows * c),
    );
    (out, k, v, o.read("qkv", qkv, t * 3 * c), o.read("pos", pos, 1))
}

/// `out = f(inp)` over `n` activations (ReLU, GELU).
pub fn unary(op: &'static str, act: ActType, out: Span<Act>, inp: Span<Act>, n: usize) -> (A, A) {
    let mut o = ops(op, act);
    (o.write("out", out, n), o.read("inp", inp, n))
}

/// `dinp += f'(inp) · dout` over `n` activations.
pub fn unary_backward(
    op: &'static str,
    act: ActType,
    dinp: Span<Act>,
    inp: Span<Act>,
    dout: Span<Act>,
    n: usize,
) -> (A, A, A) {
    let mut o = ops(op, act);
    (o.write("dinp", dinp, n), o.read("inp", inp, n), o.read("dout", dout, n))
}

pub fn gelu_backward_in_place(act: ActType, d: Span<Act>, inp: Span<Act>, n: usize) -> (A, A) {
    let mut o = ops("gelu_backward_in_place", act);
    (o.write("d", d, n), o.read("inp", inp, n))
}

/// The MLP's first product through an activation (GELU, ReLU): `pre` and `out` both written.
pub fn matmul_act_forward(
    op: &'static str,
    act: ActType,
    pre: Span<Act>,
    out: Span<Act>,
    inp: Span<Act>,
    w: Span<Act>,
    bias: Option<Span<Act>>,
    bt: usize,
    c: usize,
    oc: usize,
) -> (A, A, A, A, Option<A>) {
    let mut o = ops(op, act);
    let (pre, out) = (o.write("pre", pre, bt * oc), o.write("out", out, bt * oc));
    (
        pre,
        out,
        o.read("inp", inp, bt * c),
        o.read("w", w, oc * c),
        o.read_opt("bias", bias, oc),
    )
}

pub fn matmul_backward_dgelu(
    act: ActType,
    dpre: Span<Act>,
    dpre_bias: Option<Span>,
    dw: Span,
    dbias: Option<Span>,
    dout: Span<Act>,
    act_in: Span<Act>,
    pre: Span<Act>,
    w: Span<Act>,
    bt: usize,
    c: usize,
    oc: usize,
) -> (A, Option<F>, F, Option<F>, A, A, A, A) {
    let mut o = ops("matmul_backward_dgelu", act);
    let (dpre, dpre_bias) = (o.write("dpre", dpre, bt * c), o.write_opt("dpre_bias", dpre_bias, c));
    let (dw, dbias) = (o.write("dw", dw, oc * c), o.write_opt("dbias", dbias, oc));
    let (dout, act_in) = (o.read("dout", dout, bt * oc), o.read("act", act_in, bt * c));
    (
        dpre,
        dpre_bias,
        dw,
        dbias,
        dout,
        act_in,
        o.read("pre", pre, bt * c),
        o.read("w", w, oc * c),
    )
}

/// Shapes only: that every target is below `v` is the caller's promise.
pub fn crossentropy_forward(
    act: ActType,
    losses: Span,
    logits: Span<Act>,
    targets: Span<i32>,
    bt: usize,
    v: usize,
    vp: usize,
) -> (F, A, I) {
    padded_vocab("crossentropy_forward", v, vp);
    let mut o = ops("crossentropy_forward", act);
    let losses = o.write("losses", losses, bt);
    (
        losses,
        o.read("logits", logits, bt * vp),
        o.read("targets", targets, bt),
    )
}

pub fn crossentropy_backward(
    act: ActType,
    dlogits: Span<Act>,
    logits: Span<Act>,
    targets: Span<i32>,
    bt: usize,
    v: usize,
    vp: usize,
) -> (A, A, I) {
    padded_vocab("crossentropy_backward", v, vp);
    let mut o = ops("crossentropy_backward", act);
    let dlogits = o.write("dlogits", dlogits, bt * vp);
    (
        dlogits,
        o.read("logits", logits, bt * vp),
        o.read("targets", targets, bt),
    )
}

/// The in-place classifier backward and the fused loss: `logits` overwritten, `losses`
/// read (in place) or written (fused).
pub fn crossentropy_in_place(
    op: &'static str,
    act: ActType,
    logits: Span<Act>,
    losses: Span,
    targets: Span<i32>,
    bt: usize,
    v: usize,
    vp: usize,
) -> (A, F, I) {
    padded_vocab(op, v, vp);
    let mut o = ops(op, act);
    let (logits, losses) = (o.write("logits", logits, bt * vp), o.write("losses", losses, bt));
    (logits, losses, o.read("targets", targets, bt))
}

pub fn mean(out: Span, inp: Span, n: usize) -> (F, F) {
    let mut o = ops("mean", ActType::F32);
    (o.write("out", out, 1), o.read("inp", inp, n))
}

pub fn sum_squares(out: Span, inp: Span, n: usize) -> (F, F) {
    let mut o = ops("sum_squares", ActType::F32);
    (o.write("out", out, 1), o.read("inp", inp, n))
}

pub fn step_stats(state: Span, history: Span, history_len: usize) -> (F, F) {
    let mut o = ops("step_stats", ActType::F32);
    (
        o.write("state", state, StepState::WORDS),
        o.write("history", history, 2 * history_len),
    )
}

/// The elements the segments cover (they must follow each other from 0).
fn segments_len(op: &str, segments: &[(Range<usize>, bool)]) -> usize {
    let mut end = 0;
    for (range, _) in segments {
        assert_eq!(range.start, end, "{op}: segments must follow each other from 0");
        assert!(range.end >= range.start, "{op}: a segment ends before it starts");
        end = range.end;
    }
    end
}

pub fn adamw(
    params: Span,
    grads: Span,
    m: Span,
    v: Span,
    segments: &[(Range<usize>, bool)],
    state: Span,
    copy: Option<Span<bf16>>,
) -> (F, F, F, F, F, Option<DevPtr<bf16>>) {
    let n = segments_len("adamw", segments);
    let mut o = ops("adamw", ActType::F32);
    let (params, m, v) = (o.write("params", params, n), o.write("m", m, n), o.write("v", v, n));
    let copy = o.write_opt("copy", copy, n);
    (
        params,
        o.read("grads", grads, n),
        m,
        v,
        o.read("state", state, StepState::WORDS),
        copy,
    )
}

pub fn sgd(
    params: Span,
    grads: Span,
    velocity: Span,
    n: usize,
    state: Span,
    copy: Option<Span<bf16>>,
) -> (F, F, F, F, Option<DevPtr<bf16>>) {
    let mut o = ops("sgd", ActType::F32);
    let (params, velocity) = (o.write("params", params, n), o.write("velocity", velocity, n));
    let copy = o.write_opt("copy", copy, n);
    (
        params,
        o.read("grads", grads, n),
        velocity,
        o.read("state", state, StepState::WORDS),
        copy,
    )
}

// ---- the MLP's fused step ----------------------------------------------------------

/// Shapes only: that every index of `order` is an image of `images` and `labels` is the
/// caller's promise.
pub fn gather_batch(
    act: ActType,
    out: Span<Act>,
    targets: Span<i32>,
    images: Span<u8>,
    labels: Span<u8>,
    order: Span<i32>,
    state: Span,
    rows: usize,
    size: usize,
    steps: usize,
) -> (A, I, DevPtr<u8>, DevPtr<u8>, I, F) {
    let mut o = ops("gather_batch", act);
    let (out, targets) = (o.write("out", out, rows * size), o.write("targets", targets, rows));
    let (images, labels) = (
        o.read("images", images, images.len()),
        o.read("labels", labels, labels.len()),
    );
    let order = o.read("order", order, steps * rows);
    (
        out,
        targets,
        images,
        labels,
        order,
        o.read("state", state, StepState::WORDS),
    )
}

/// Shapes only: that every target is below `v` is the caller's promise.
pub fn loss_step(
    act: ActType,
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
) -> (A, F, I, F, F, F) {
    let mut o = ops("loss_step", act);
    let (logits, losses) = (o.write("logits", logits, rows * v), o.write("losses", losses, rows));
    let state = o.write("state", state, StepState::WORDS);
    let history = o.write("history", history, 2 * history_len);
    let targets = o.read("targets", targets, rows);
    (
        logits,
        losses,
        targets,
        state,
        o.read("schedule", schedule, steps),
        history,
    )
}

pub fn matmul_backward_relu(
    act: ActType,
    dinp: Span<Act>,
    dout: Span<Act>,
    w: Span<Act>,
    act_in: Span<Act>,
    bt: usize,
    c: usize,
    oc: usize,
) -> (A, A, A, A) {
    let mut o = ops("matmul_backward_relu", act);
    let dinp = o.write("dinp", dinp, bt * c);
    let (dout, w) = (o.read("dout", dout, bt * oc), o.read("w", w, oc * c));
    (dinp, dout, w, o.read("act", act_in, bt * c))
}

pub fn linear_sgd(
    act: ActType,
    params: Span,
    velocity: Span,
    grads: Span,
    copy: Option<Span<bf16>>,
    dout: Span<Act>,
    inp: Span<Act>,
    state: Span,
    bt: usize,
    c: usize,
    oc: usize,
) -> (F, F, F, Option<DevPtr<bf16>>, A, A, F) {
    let n = oc * c + oc;
    let mut o = ops("linear_sgd", act);
    let (params, velocity) = (o.write("params", params, n), o.write("velocity", velocity, n));
    let (grads, copy) = (o.write("grads", grads, n), o.write_opt("copy", copy, n));
    let (dout, inp) = (o.read("dout", dout, bt * oc), o.read("inp", inp, bt * c));
    (
        params,
        velocity,
        grads,
        copy,
        dout,
        inp,
        o.read("state", state, StepState::WORDS),
    )
}
