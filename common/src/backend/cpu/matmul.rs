//! Matrix products (the `gemm` crate: AVX2/AVX-512 kernels) and the bias gradient.

use super::elementwise::axpy;
use rayon::prelude::*;

/// A row-major matrix operand: its first element and (row stride, column stride).
type Operand = (*const f32, isize, isize);

/// gemm blocks the inner dimension (k) one way for products of at most this many rows and
/// columns and another way for larger ones: column blocks wider than this sum like the whole.
const GEMM_SMALL: usize = 64;

/// How the threads share a product.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Split {
    /// gemm's own split, but products of 2 to [`GEMM_SMALL`] rows by columns (see `gemm`).
    FewRows,
    /// By columns wherever that keeps the values: the forward products, whose weights are
    /// read transposed (gemm's own split of those measured up to 1.5× slower on 2 cores,
    /// GPT-2's included; its split of the backward products is as fast as columns).
    Columns,
}

/// `dst (m,n) = [dst +] lhs (m,k) · rhs (k,n)`; `dst` has row stride `n`.
///
/// Threads split the product by output blocks only, never along k, so every element is the
/// same sum whatever the thread count. gemm's own split of a product of few rows (a batch of
/// 64 images times the MLP's first layer: 106 against 62 µs on 2 cores) keeps a thread
/// waiting, and so does its split of the forward products (`Split::Columns`): those are cut
/// here into one block of columns per thread, each a one-thread product. gemm sums such a
/// block over k in the blocks it uses for the whole product (for up to [`GEMM_SMALL`] rows,
/// each block is wider than that), so the values are the whole product's, bit for bit
/// (tested). One row (a token's product), one column and k ≤ 2 are never cut: gemm computes
/// those by other routines, whose sums depend on the width.
#[allow(clippy::too_many_arguments)]
fn gemm(
    dst: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    lhs: Operand,
    rhs: Operand,
    accumulate: bool,
    threads: usize,
    split: Split,
) {
    assert!(dst.len() >= m * n, "gemm: destination too small");
    let min_width = match (m, k) {
        (0..=1, _) | (_, 0..=2) => None,
        (2..=GEMM_SMALL, _) => Some(GEMM_SMALL + 1),
        _ if split == Split::Columns => Some(2),
        _ => None,
    };
    let blocks = min_width.map_or(1, |w| threads.min(n / w));
    if blocks > 1 {
        // Addresses, to cross threads: block b's columns are b·n/blocks.. (b+1)·n/blocks, at
        // least min_width of them; the blocks write disjoint columns of `dst`.
        let (d, l, r) = (dst.as_mut_ptr() as usize, lhs.0 as usize, rhs.0 as usize);
        (0..blocks).into_par_iter().for_each(|b| {
            let (j0, j1) = (b * n / blocks, (b + 1) * n / blocks);
            let dst = d as *mut f32;
            let first = (r as *const f32).wrapping_offset(j0 as isize * rhs.2);
            // SAFETY: as below, for the columns j0..j1 of `dst` and `rhs`, which lie inside the
            // whole product's extents; no other block writes them.
            unsafe {
                product(
                    (dst.add(j0), n),
                    m,
                    j1 - j0,
                    k,
                    (l as *const f32, lhs.1, lhs.2),
                    (first, rhs.1, rhs.2),
                    accumulate,
                    gemm::Parallelism::None,
                )
            }
        });
        return;
    }
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the callers pass operands that cover the strided extents used here (their
    // slices are checked below them), and `dst` is a distinct, exclusively borrowed slice.
    unsafe { product((dst.as_mut_ptr(), n), m, n, k, lhs, rhs, accumulate, par) }
}

/// `dst (m,n) = [dst +] lhs (m,k) · rhs (k,n)`, `dst` given as its first element and row
/// stride.
///
/// # Safety
/// The operands cover the strided extents of m × k, k × n and m × n elements; `dst` is not
/// read or written by anything else meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    dst: (*mut f32, usize),
    m: usize,
    n: usize,
    k: usize,
    lhs: Operand,
    rhs: Operand,
    accumulate: bool,
    par: gemm::Parallelism,
) {
    gemm::gemm(
        m,
        n,
        k,
        dst.0,
        1,
        dst.1 as isize,
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
        Split::Columns,
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
        Split::FewRows,
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
        Split::FewRows,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A product cut into column blocks over threads equals gemm's whole product bit for bit
    /// (the MLP's shapes, a token's, GPT-2's, one or two columns), and so the same at any
    /// thread count, under either split.
    #[test]
    fn column_blocks_sum_like_the_whole_product() {
        let pool = |t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap();
        let value = |i: usize, salt: usize| ((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0;
        for (m, n, k) in [
            (64, 256, 784),
            (32, 256, 784),
            (64, 784, 256),
            (64, 130, 300),
            (17, 200, 513),
            (1, 768, 768),
            (2, 2304, 768),
            (40, 300, 2),
            (64, 3072, 768),
            (256, 256, 784),
            (256, 10, 128),
            (65, 3, 70),
            (300, 1, 50),
            (256, 768, 3072),
            (512, 2304, 768),
        ] {
            let lhs: Vec<f32> = (0..m * k).map(|i| value(i, 1)).collect();
            let rhs: Vec<f32> = (0..k * n).map(|i| value(i, 2)).collect();
            let start: Vec<f32> = (0..m * n).map(|i| value(i, 3)).collect();
            // rhs read transposed (stored n × k), as the forward pass reads weights.
            let run = |threads: usize, accumulate: bool, split: Split| {
                let mut dst = start.clone();
                pool(threads).install(|| {
                    gemm(
                        &mut dst,
                        m,
                        n,
                        k,
                        (lhs.as_ptr(), k as isize, 1),
                        (rhs.as_ptr(), 1, k as isize),
                        accumulate,
                        threads,
                        split,
                    )
                });
                dst
            };
            for accumulate in [false, true] {
                let whole = run(1, accumulate, Split::FewRows);
                for (threads, split) in [2, 3, 4]
                    .into_iter()
                    .flat_map(|t| [(t, Split::FewRows), (t, Split::Columns)])
                {
                    let got = run(threads, accumulate, split);
                    let same = whole.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{m}x{n}x{k} on {threads} threads, {split:?} (accumulate {accumulate})"
                    );
                }
            }
        }
    }
}
