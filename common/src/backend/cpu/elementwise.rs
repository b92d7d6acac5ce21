//! Elementwise ops (zero, add, scale, GELU) over fixed-size chunks, so results never depend
//! on the thread count; rounding to bf16; and the small vector helpers the other op
//! families share.

use super::fastmath;
use crate::backend::bf16;
use rayon::prelude::*;

/// Elementwise work is split in chunks this long (a constant, so results never depend
/// on the thread count).
pub(super) const CHUNK: usize = 1 << 14;

const GELU_SCALE: f32 = 0.797_884_6; // sqrt(2/pi)

/// y += a · x
#[inline]
pub(super) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// Σ f(i) for i < n in 8 lanes (lane i mod 8, each in order), the lanes then added pairwise:
/// vectorises, and the order is fixed.
#[inline(always)]
pub(super) fn lane_sum(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let full = n / 8 * 8;
    for i0 in (0..full).step_by(8) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a += f(i0 + l);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in full..n {
        s += f(i);
    }
    s
}

pub(super) fn zero<T: bytemuck::Pod + Send>(dst: &mut [T]) {
    dst.par_chunks_mut(CHUNK).for_each(|c| c.fill(T::zeroed()));
}

pub(super) fn accumulate(dst: &mut [f32], src: &[f32]) {
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| axpy(d, 1.0, s));
}

pub(super) fn add(out: &mut [f32], a: &[f32], b: &[f32]) {
    out.par_chunks_mut(CHUNK)
        .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
        .for_each(|(o, (a, b))| {
            for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
                *o = a + b;
            }
        });
}

/// `dst = bf16(src)`, rounded to nearest-even.
pub(super) fn round_to_bf16(dst: &mut [bf16], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16::from_f32(s);
    }
}

pub(super) fn scale(dst: &mut [f32], s: f32) {
    dst.par_chunks_mut(CHUNK)
        .for_each(|c| c.iter_mut().for_each(|x| *x *= s));
}

/// max(x, 0).
pub(super) fn relu_forward(out: &mut [f32], inp: &[f32]) {
    out.par_chunks_mut(CHUNK).zip(inp.par_chunks(CHUNK)).for_each(|(o, x)| {
        for (o, &x) in o.iter_mut().zip(x) {
            *o = x.max(0.0);
        }
    });
}

/// dinp += dout where x > 0 (the gradient at 0 taken as 0, as PyTorch does).
pub(super) fn relu_backward(dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
    dinp.par_chunks_mut(CHUNK)
        .zip(inp.par_chunks(CHUNK).zip(dout.par_chunks(CHUNK)))
        .for_each(|(d, (x, dy))| {
            for ((d, &x), &dy) in d.iter_mut().zip(x).zip(dy) {
                if x > 0.0 {
                    *d += dy;
                }
            }
        });
}

/// GELU, tanh approximation.
pub(super) fn gelu_forward(out: &mut [f32], inp: &[f32]) {
    out.par_chunks_mut(CHUNK).zip(inp.par_chunks(CHUNK)).for_each(|(o, x)| {
        for (o, &x) in o.iter_mut().zip(x) {
            *o = 0.5 * x * (1.0 + fastmath::tanh(GELU_SCALE * (x + 0.044715 * x * x * x)));
        }
    });
}

/// d gelu(x) / dx.
#[inline]
fn gelu_grad(x: f32) -> f32 {
    let u = GELU_SCALE * (x + 0.044715 * x * x * x);
    let th = fastmath::tanh(u);
    let sech2 = 1.0 - th * th;
    0.5 * (1.0 + th) + 0.5 * x * sech2 * GELU_SCALE * (1.0 + 3.0 * 0.044715 * x * x)
}

pub(super) fn gelu_backward(dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
    dinp.par_chunks_mut(CHUNK)
        .zip(inp.par_chunks(CHUNK).zip(dout.par_chunks(CHUNK)))
        .for_each(|(d, (x, dy))| {
            for ((d, &x), &dy) in d.iter_mut().zip(x).zip(dy) {
                *d += gelu_grad(x) * dy;
            }
        });
}

/// d = gelu'(x) · d, overwriting: `gelu_backward` into zeros, without a second buffer.
pub(super) fn gelu_backward_in_place(d: &mut [f32], inp: &[f32]) {
    d.par_chunks_mut(CHUNK).zip(inp.par_chunks(CHUNK)).for_each(|(d, x)| {
        for (d, &x) in d.iter_mut().zip(x) {
            *d *= gelu_grad(x);
        }
    });
}
