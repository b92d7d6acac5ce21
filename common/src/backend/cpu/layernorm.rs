//! Layer normalisation over rows of width C, and its gradients.

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
            let m = x.iter().sum::<f32>() / c as f32;
            let var = x.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / c as f32;
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
        let (mut dnorm_mean, mut dnorm_norm_mean) = (0.0f32, 0.0f32);
        for i in 0..c {
            let dnorm = w[i] * dy[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * (x[i] - m) * s;
        }
        dnorm_mean /= c as f32;
        dnorm_norm_mean /= c as f32;
        for i in 0..c {
            let norm = (x[i] - m) * s;
            di[i] += (w[i] * dy[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    });
    // Weight and bias gradients: columns are independent; rows summed in order.
    g.dw.par_chunks_mut(64)
        .zip(g.db.par_chunks_mut(64))
        .enumerate()
        .for_each(|(j, (dw, db))| {
            let j0 = j * 64;
            for r in 0..bt {
                let (m, s) = (mean[r], rstd[r]);
                for i in 0..dw.len() {
                    let (x, dy) = (inp[r * c + j0 + i], dout[r * c + j0 + i]);
                    dw[i] += (x - m) * s * dy;
                    db[i] += dy;
                }
            }
        });
}
