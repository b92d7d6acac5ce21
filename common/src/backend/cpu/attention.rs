//! Causal multi-head self-attention, one task per (batch, head), saving the softmax
//! probabilities (B,NH,T,T) for the backward pass. Keys and values are transposed to
//! (hs, T) per task so the inner loops run over contiguous positions (they vectorise).

use super::elementwise::{axpy, lane_sum};
use super::fastmath;
use rayon::prelude::*;

#[derive(Clone, Copy)]
pub(super) struct Dims {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub nh: usize,
}

/// Dot product in 8 lanes ([`lane_sum`]): vectorises, and the order is fixed.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let b = &b[..a.len()];
    lane_sum(a.len(), |i| a[i] * b[i])
}

/// The (T, hs) rows given by `row` as an (hs, T) matrix.
fn transpose_head<'a>(t: usize, hs: usize, row: impl Fn(usize) -> &'a [f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; hs * t];
    for tj in 0..t {
        for (d, &x) in row(tj).iter().enumerate() {
            out[d * t + tj] = x;
        }
    }
    out
}

/// Positions computed together by [`coef_rows`]: lanes held in registers across the sum.
const ROW_BLOCK: usize = 32;

/// `out[j] = Σ_d coef[d] · mat[d·stride + j]` for j < `n`, each sum from 0 in order of d (as
/// `axpy` of each row of `mat` into zeros). Blocks of [`ROW_BLOCK`] positions may run past
/// `n` up to `out.len()`: those lanes are written too, with the same sums.
#[inline]
fn coef_rows(out: &mut [f32], n: usize, coef: &[f32], mat: &[f32], stride: usize) {
    let mut j0 = 0;
    while j0 < n {
        if j0 + ROW_BLOCK <= out.len() {
            let mut acc = [0.0f32; ROW_BLOCK];
            for (d, &a) in coef.iter().enumerate() {
                let m = &mat[d * stride + j0..][..ROW_BLOCK];
                for l in 0..ROW_BLOCK {
                    acc[l] += a * m[l];
                }
            }
            out[j0..j0 + ROW_BLOCK].copy_from_slice(&acc);
            j0 += ROW_BLOCK;
        } else {
            for j in j0..n {
                let mut acc = 0.0f32;
                for (d, &a) in coef.iter().enumerate() {
                    acc += a * mat[d * stride + j];
                }
                out[j] = acc;
            }
            return;
        }
    }
}

/// Width of the head dimensions [`weighted_rows`] holds in registers.
const HEAD_BLOCK: usize = 32;

/// `acc[d] += Σ_j w(j) · row(j)[d]` over j in `js`, in that order for every d (as one
/// `axpy` per j).
#[inline]
fn weighted_rows<'a>(
    acc: &mut [f32],
    js: impl Iterator<Item = usize> + Clone,
    w: impl Fn(usize) -> f32,
    row: impl Fn(usize) -> &'a [f32],
) {
    let hs = acc.len();
    let mut d0 = 0;
    while d0 < hs {
        let width = HEAD_BLOCK.min(hs - d0);
        if width == HEAD_BLOCK {
            let mut r = [0.0f32; HEAD_BLOCK];
            r.copy_from_slice(&acc[d0..d0 + HEAD_BLOCK]);
            for j in js.clone() {
                let a = w(j);
                let x = &row(j)[d0..d0 + HEAD_BLOCK];
                for l in 0..HEAD_BLOCK {
                    r[l] += a * x[l];
                }
            }
            acc[d0..d0 + HEAD_BLOCK].copy_from_slice(&r);
        } else {
            let out = &mut acc[d0..];
            for j in js.clone() {
                axpy(out, w(j), &row(j)[d0..]);
            }
        }
        d0 += width;
    }
}

/// out (B,T,C) and the probabilities att (B,NH,T,T) from qkv (B,T,3C).
pub(super) fn forward(out: &mut [f32], att: &mut [f32], qkv: &[f32], d: Dims) {
    let Dims { b, t, c, nh } = d;
    let hs = c / nh;
    let scale = 1.0 / (hs as f32).sqrt();
    assert!(out.len() >= b * t * c && att.len() >= b * nh * t * t && qkv.len() >= b * t * 3 * c);
    let (out, att) = (SyncPtr(out.as_mut_ptr()), SyncPtr(att.as_mut_ptr()));
    (0..b * nh).into_par_iter().for_each(|i| {
        let (bi, h) = (i / nh, i % nh);
        let row = |tj: usize, part: usize| &qkv[(bi * t + tj) * 3 * c + part * c + h * hs..][..hs];
        let kt = transpose_head(t, hs, |tj| row(tj, 1));
        let mut coef = vec![0.0f32; hs];
        for ti in 0..t {
            // SAFETY: task (b,h) alone writes att rows (b,h,·) and out[b,·,h*hs..][..hs],
            // all inside the slices checked above.
            let att = unsafe { att.slice((i * t + ti) * t, t) };
            let out = unsafe { out.slice((bi * t + ti) * c + h * hs, hs) };
            for (c, &qd) in coef.iter_mut().zip(row(ti, 0)) {
                *c = qd * scale;
            }
            coef_rows(att, ti + 1, &coef, &kt, t);
            let (scores, rest) = att.split_at_mut(ti + 1);
            softmax_weighted_sum(scores, out, |tj| row(tj, 2));
            rest.fill(0.0);
        }
    });
}

/// `scores` (one query's scaled dot products) become their softmax, in place, and `out` =
/// Σ_j scores[j] · value(j): the arithmetic, in its order, of every attention row.
fn softmax_weighted_sum<'a>(scores: &mut [f32], out: &mut [f32], value: impl Fn(usize) -> &'a [f32]) {
    let maxv = scores.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    for a in scores.iter_mut() {
        *a = fastmath::exp(*a - maxv);
    }
    let inv = 1.0 / scores.iter().sum::<f32>();
    for a in scores.iter_mut() {
        *a *= inv;
    }
    out.fill(0.0);
    let scores = &*scores;
    weighted_rows(out, 0..scores.len(), |tj| scores[tj], value);
}

/// Attention of `t` new positions against a key/value cache (see
/// `Backend::attention_cached_forward`): the new keys and values go into cache rows
/// `pos..pos + t`, then query i attends over rows `0..=pos + i`. Each score is accumulated
/// over the head's dimensions in `forward`'s order, so a row equals `forward`'s bit for bit.
#[allow(clippy::too_many_arguments)]
pub(super) fn cached_forward(
    out: &mut [f32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    qkv: &[f32],
    pos: usize,
    t: usize,
    c: usize,
    nh: usize,
) {
    let hs = c / nh;
    let scale = 1.0 / (hs as f32).sqrt();
    let rows = pos + t;
    assert!(out.len() >= t * c && qkv.len() >= t * 3 * c && k_cache.len() >= rows * c && v_cache.len() >= rows * c);
    for i in 0..t {
        let new = &qkv[i * 3 * c..][..3 * c];
        k_cache[(pos + i) * c..][..c].copy_from_slice(&new[c..2 * c]);
        v_cache[(pos + i) * c..][..c].copy_from_slice(&new[2 * c..]);
    }
    let (k_cache, v_cache) = (&*k_cache, &*v_cache);
    let out = SyncPtr(out.as_mut_ptr());
    (0..t * nh).into_par_iter().for_each(|task| {
        let (i, h) = (task / nh, task % nh);
        let q = &qkv[i * 3 * c + h * hs..][..hs];
        let mut scores: Vec<f32> = (0..=pos + i)
            .map(|j| {
                let k = &k_cache[j * c + h * hs..][..hs];
                q.iter().zip(k).fold(0.0f32, |s, (&qd, &kd)| s + qd * scale * kd)
            })
            .collect();
        // SAFETY: task (i, h) alone writes out[i, h*hs..][..hs], inside the slice checked above.
        let out = unsafe { out.slice(i * c + h * hs, hs) };
        softmax_weighted_sum(&mut scores, out, |j| &v_cache[j * c + h * hs..][..hs]);
    });
}

/// dqkv (B,T,3C) += the gradient through attention, from dout (B,T,C).
pub(super) fn backward(dqkv: &mut [f32], dout: &[f32], qkv: &[f32], att: &[f32], d: Dims) {
    let Dims { b, t, c, nh } = d;
    let hs = c / nh;
    let scale = 1.0 / (hs as f32).sqrt();
    assert!(dqkv.len() >= b * t * 3 * c && dout.len() >= b * t * c && att.len() >= b * nh * t * t);
    let dqkv = SyncPtr(dqkv.as_mut_ptr());
    // One task per (batch, head). Every gradient element is summed in the order of the
    // plain loop over queries ti: dq row ti over keys tj ≤ ti, dk and dv row tj over
    // queries ti ≥ tj. The score gradients of all queries are kept (T,T) so the key and
    // value gradients can each run as one pass per row.
    (0..b * nh).into_par_iter().for_each(|i| {
        let (bi, h) = (i / nh, i % nh);
        let row = |tj: usize, part: usize| &qkv[(bi * t + tj) * 3 * c + part * c + h * hs..][..hs];
        // SAFETY: task (b,h) alone touches the head-h columns of batch b's rows, inside
        // the slice checked above.
        let drow = |tj: usize, part: usize| unsafe { dqkv.slice((bi * t + tj) * 3 * c + part * c + h * hs, hs) };
        let dy = |ti: usize| &dout[(bi * t + ti) * c + h * hs..][..hs];
        let a = |ti: usize| &att[(i * t + ti) * t..][..t];
        let vt = transpose_head(t, hs, |tj| row(tj, 2));
        let mut dpre = vec![0.0f32; t * t];
        for ti in 0..t {
            let a = &a(ti)[..=ti];
            // through out = att · v: datt = dy · vᵀ
            let datt = &mut dpre[ti * t..][..t];
            coef_rows(datt, ti + 1, dy(ti), &vt, t);
            let datt = &mut datt[..=ti];
            // through the softmax: dpre = a ⊙ (datt − Σ a·datt), then the scale
            let s = dot(a, datt);
            for (dp, &aj) in datt.iter_mut().zip(a) {
                *dp = aj * (*dp - s) * scale;
            }
            // through scores = q · kᵀ: dq = dpre · k
            let datt = &*datt;
            weighted_rows(drow(ti, 0), 0..=ti, |tj| datt[tj], |tj| row(tj, 1));
        }
        let dpre = &dpre;
        for tj in 0..t {
            // dv += attᵀ · dy
            weighted_rows(drow(tj, 2), tj..t, |ti| a(ti)[tj], dy);
            // dk += dpreᵀ · q, summed apart and then added
            let mut dk = [0.0f32; HEAD_BLOCK];
            if hs <= HEAD_BLOCK {
                let dk = &mut dk[..hs];
                weighted_rows(dk, tj..t, |ti| dpre[ti * t + tj], |ti| row(ti, 0));
                axpy(drow(tj, 1), 1.0, dk);
            } else {
                let mut dk = vec![0.0f32; hs];
                weighted_rows(&mut dk, tj..t, |ti| dpre[ti * t + tj], |ti| row(ti, 0));
                axpy(drow(tj, 1), 1.0, &dk);
            }
        }
    });
}

/// A raw pointer that parallel tasks may share when each writes a disjoint region.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}
impl SyncPtr {
    /// # Safety
    /// `offset..offset + n` lies inside the slice this pointer came from, and no other
    /// task touches it meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice<'a>(&self, offset: usize, n: usize) -> &'a mut [f32] {
        std::slice::from_raw_parts_mut(self.0.add(offset), n)
    }
}
