//! Layer normalisation over rows of width C, and its gradients.

use super::elementwise::lane_sum;
use rayon::prelude::*;

/// Each row's mean and 1/std, saved by the forward pass for the backward.
pub(super) struct Stats<'a> {
    pub mean: &'a mut [f32],
    pub rstd: &'a mut [f32],
}

/// out = (inp - mean) · rstd · w + b per row of width C = `w.len()`.
pub(super) fn forward(out: &mut [f32], stats: Stats, inp: &[f32], w: &[f32], b: &[f32]) {
    let c = w.len();
    out.par_chunks_mut(c)
        .zip(inp.par_chunks(c))
        .zip(stats.mean.par_iter_mut().zip(stats.rstd.par_iter_mut()))
        .for_each(|((o, x), (mu, rs))| {
            let m = lane_sum(c, |i| x[i]) / c as f32;
            let var = lane_sum(c, |i| (x[i] - m) * (x[i] - m)) / c as f32;
            let s = 1.0 / (var + 1e-5).sqrt();
            for i in 0..c {
                o[i] = (x[i] - m) * s * w[i] + b[i];
            }
            (*mu, *rs) = (m, s);
        });
}

/// The gradients a layernorm accumulates into.
pub(super) struct Grads<'a> {
    pub dinp: &'a mut [f32],
    pub dw: &'a mut [f32],
    pub db: &'a mut [f32],
}

pub(super) fn backward(g: Grads, dout: &[f32], inp: &[f32], w: &[f32], mean: &[f32], rstd: &[f32]) {
    let (c, bt) = (w.len(), mean.len());
    // Input gradient: rows are independent.
    g.dinp.par_chunks_mut(c).enumerate().for_each(|(r, di)| {
        let (x, dy) = (&inp[r * c..][..c], &dout[r * c..][..c]);
        let (m, s) = (mean[r], rstd[r]);
        let dnorm_mean = lane_sum(c, |i| w[i] * dy[i]) / c as f32;
        let dnorm_norm_mean = lane_sum(c, |i| w[i] * dy[i] * (x[i] - m) * s) / c as f32;
        for i in 0..c {
            let norm = (x[i] - m) * s;
            di[i] += (w[i] * dy[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    });
    // Weight and bias gradients: columns are independent; rows summed in order, onto what the
    // gradients held, in registers for a block of COLUMNS.
    g.dw.par_chunks_mut(COLUMNS)
        .zip(g.db.par_chunks_mut(COLUMNS))
        .enumerate()
        .for_each(|(j, (dw, db))| {
            let j0 = j * COLUMNS;
            let n = dw.len();
            let (mut aw, mut ab) = ([0.0f32; COLUMNS], [0.0f32; COLUMNS]);
            aw[..n].copy_from_slice(dw);
            ab[..n].copy_from_slice(db);
            for r in 0..bt {
                let (m, s) = (mean[r], rstd[r]);
                let (x, dy) = (&inp[r * c + j0..][..n], &dout[r * c + j0..][..n]);
                for i in 0..n {
                    aw[i] += (x[i] - m) * s * dy[i];
                    ab[i] += dy[i];
                }
            }
            dw.copy_from_slice(&aw[..n]);
            db.copy_from_slice(&ab[..n]);
        });
}

/// Columns of the weight and bias gradients one task sums.
const COLUMNS: usize = 64;
