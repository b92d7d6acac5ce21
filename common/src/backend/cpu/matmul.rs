//! Matrix products (the `gemm` crate: AVX2/AVX-512 kernels) and the bias gradient.

use super::elementwise::axpy;
use rayon::prelude::*;

/// A row-major matrix operand: its first element and (row stride, column stride).
type Operand = (*const f32, isize, isize);

/// `dst (m,n) = [dst +] lhs (m,k) · rhs (k,n)`; `dst` has row stride `n`.
#[allow(clippy::too_many_arguments)]
fn gemm(dst: &mut [f32], m: usize, n: usize, k: usize, lhs: Operand, rhs: Operand, accumulate: bool, threads: usize) {
    assert!(dst.len() >= m * n, "gemm: destination too small");
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the callers pass operands that cover the strided extents used here (their
    // slices are checked below them), and `dst` is a distinct, exclusively borrowed slice.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.0,
            lhs.2,
            lhs.1,
            rhs.0,
            rhs.2,
            rhs.1,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// out (BT,OC) = inp (BT,C) · wᵀ (C,OC) + bias, with w (OC,C).
pub(super) fn forward(
    out: &mut [f32],
    inp: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    c: usize,
    oc: usize,
    threads: usize,
) {
    let bt = out.len() / oc;
    assert!(inp.len() >= bt * c && w.len() >= oc * c);
    if let Some(bias) = bias {
        out.par_chunks_mut(oc).for_each(|row| row.copy_from_slice(bias));
    }
    let c_ = c as isize;
    // wᵀ[k][j] = w[j][k]: row stride 1, column stride C.
    gemm(
        out,
        bt,
        oc,
        c,
        (inp.as_ptr(), c_, 1),
        (w.as_ptr(), 1, c_),
        bias.is_some(),
        threads,
    );
}

/// The gradients a matmul accumulates into.
pub(super) struct Grads<'a> {
    pub dinp: &'a mut [f32],
    pub dw: &'a mut [f32],
    pub dbias: Option<&'a mut [f32]>,
}

pub(super) fn backward(g: Grads, dout: &[f32], inp: &[f32], w: &[f32], c: usize, oc: usize, threads: usize) {
    let bt = dout.len() / oc;
    assert!(inp.len() >= bt * c && w.len() >= oc * c && g.dinp.len() >= bt * c && g.dw.len() >= oc * c);
    input_grad(g.dinp, dout, w, c, oc, threads);
    weight_grad(g.dw, dout, inp, c, oc, threads);
    if let Some(dbias) = g.dbias {
        bias_backward(dbias, dout, oc);
    }
}

/// dinp (BT,C) += dout (BT,OC) · w (OC,C).
pub(super) fn input_grad(dinp: &mut [f32], dout: &[f32], w: &[f32], c: usize, oc: usize, threads: usize) {
    let bt = dout.len() / oc;
    assert!(w.len() >= oc * c && dinp.len() >= bt * c);
    let (c_, oc_) = (c as isize, oc as isize);
    gemm(
        dinp,
        bt,
        c,
        oc,
        (dout.as_ptr(), oc_, 1),
        (w.as_ptr(), c_, 1),
        true,
        threads,
    );
}

/// dw (OC,C) += doutᵀ (OC,BT) · inp (BT,C).
pub(super) fn weight_grad(dw: &mut [f32], dout: &[f32], inp: &[f32], c: usize, oc: usize, threads: usize) {
    let bt = dout.len() / oc;
    assert!(inp.len() >= bt * c && dw.len() >= oc * c);
    let (c_, oc_) = (c as isize, oc as isize);
    gemm(
        dw,
        oc,
        c,
        bt,
        (dout.as_ptr(), 1, oc_),
        (inp.as_ptr(), c_, 1),
        true,
        threads,
    );
}

/// dbias (OC) += Σ_rows dout (·,OC), 64 columns per task, rows in order.
pub(super) fn bias_backward(dbias: &mut [f32], dout: &[f32], oc: usize) {
    dbias.par_chunks_mut(64).enumerate().for_each(|(j, acc)| {
        for row in dout.chunks_exact(oc) {
            axpy(acc, 1.0, &row[j * 64..][..acc.len()]);
        }
    });
}
