//! The classifier's loss: softmax cross-entropy over the first V of Vp logit columns, its
//! gradient, and llm.c's in-place variant that overwrites the logits with it.

use super::fastmath;
use rayon::prelude::*;

/// Σ e^(x − shift), with 8 independent accumulators (vectorises; fixed order).
#[inline]
fn sum_exp(xs: &[f32], shift: f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let body = xs.len() / 8 * 8;
    for x in xs[..body].chunks_exact(8) {
        for i in 0..8 {
            acc[i] += fastmath::exp(x[i] - shift);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &x in &xs[body..] {
        s += fastmath::exp(x - shift);
    }
    s
}

/// losses[r] = log-sum-exp(logits[r, :V]) − logits[r, target].
pub(super) fn forward(losses: &mut [f32], logits: &[f32], targets: &[i32], v: usize, vp: usize) {
    losses.par_iter_mut().enumerate().for_each(|(r, loss)| {
        let row = &logits[r * vp..][..v];
        let maxv = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let sum = sum_exp(row, maxv);
        *loss = maxv + sum.ln() - row[targets[r] as usize];
    });
}

pub(super) fn backward(dlogits: &mut [f32], logits: &[f32], targets: &[i32], dloss: f32, v: usize, vp: usize) {
    dlogits.par_chunks_mut(vp).enumerate().for_each(|(r, d)| {
        let row = &logits[r * vp..][..v];
        let maxv = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let sum = sum_exp(row, maxv);
        let inv = 1.0 / sum;
        for i in 0..v {
            d[i] += (fastmath::exp(row[i] - maxv) * inv - (i == targets[r] as usize) as u8 as f32) * dloss;
        }
    });
}

pub(super) fn backward_in_place(logits: &mut [f32], losses: &[f32], targets: &[i32], dloss: f32, v: usize, vp: usize) {
    logits.par_chunks_mut(vp).enumerate().for_each(|(r, row)| {
        let target = targets[r] as usize;
        let lse = losses[r] + row[target]; // loss = log-sum-exp - logit[target]
        for (i, x) in row[..v].iter_mut().enumerate() {
            *x = (fastmath::exp(*x - lse) - (i == target) as u8 as f32) * dloss;
        }
        row[v..].fill(0.0);
    });
}
