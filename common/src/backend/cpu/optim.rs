//! Reductions (mean, sum of squares, the clipping factor) and the AdamW and SGD updates.

use super::elementwise::CHUNK;
use crate::backend::{AdamWHyper, SgdHyper, StepState};
use rayon::prelude::*;

/// Mean in f64, in order.
pub(super) fn mean(inp: &[f32]) -> f32 {
    let s: f64 = inp.iter().map(|&x| x as f64).sum();
    (s / inp.len() as f64) as f32
}

/// Σx², in f64 partial sums over fixed chunks added in order.
pub(super) fn sum_squares(inp: &[f32]) -> f32 {
    let partials: Vec<f64> = inp
        .par_chunks(CHUNK)
        .map(|c| c.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>())
        .collect();
    partials.iter().sum::<f64>() as f32
}

/// [global norm, factor that clips it to `max_norm`] from Σg².
pub(super) fn clip_factor(sumsq: f32, max_norm: f32) -> [f32; 2] {
    let norm = sumsq.sqrt();
    let factor = if max_norm > 0.0 && norm > max_norm {
        max_norm / (norm + 1e-6)
    } else {
        1.0
    };
    [norm, factor]
}

/// Finishes `s` from its Σg² and summed loss: norm, clipping factor, mean loss, apply.
pub(super) fn step_stats(s: &mut StepState, max_norm: f32, loss_scale: f32) {
    [s.norm, s.clip] = clip_factor(s.sumsq, max_norm);
    s.loss *= loss_scale;
    s.apply = (s.loss.is_finite() && s.norm.is_finite()) as u8 as f32;
}

/// What AdamW updates in place.
pub(super) struct AdamWState<'a> {
    pub params: &'a mut [f32],
    pub m: &'a mut [f32],
    pub v: &'a mut [f32],
}

/// One update with the step's learning rate, bias corrections and clipping factor.
pub(super) fn adamw(s: AdamWState, grads: &[f32], step: &StepState, hp: AdamWHyper) {
    let (bc1, bc2, scale, lr) = (step.bias1, step.bias2, step.clip, step.lr);
    s.params
        .par_chunks_mut(CHUNK)
        .zip(grads.par_chunks(CHUNK))
        .zip(s.m.par_chunks_mut(CHUNK).zip(s.v.par_chunks_mut(CHUNK)))
        .for_each(|((p, g), (m, v))| {
            for i in 0..p.len() {
                let g = g[i] * scale;
                m[i] = hp.beta1 * m[i] + (1.0 - hp.beta1) * g;
                v[i] = hp.beta2 * v[i] + (1.0 - hp.beta2) * g * g;
                let (mhat, vhat) = (m[i] / bc1, v[i] / bc2);
                p[i] -= lr * (mhat / (vhat.sqrt() + hp.eps) + hp.weight_decay * p[i]);
            }
        });
}

/// SGD with momentum, in place: `velocity` is the momentum buffer.
/// One SGD update with the step's learning rate and clipping factor.
pub(super) fn sgd(params: &mut [f32], velocity: &mut [f32], grads: &[f32], step: &StepState, hp: SgdHyper) {
    let (scale, lr) = (step.clip, step.lr);
    params
        .par_chunks_mut(CHUNK)
        .zip(velocity.par_chunks_mut(CHUNK))
        .zip(grads.par_chunks(CHUNK))
        .for_each(|((p, v), g)| {
            for i in 0..p.len() {
                let g = g[i] * scale + hp.weight_decay * p[i];
                v[i] = hp.momentum * v[i] + g;
                p[i] -= lr * v[i];
            }
        });
}
