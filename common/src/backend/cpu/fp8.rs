//! FP8, the reference for the GPU's: quantization, and the product of two FP8 matrices
//! computed in f32 from their exact values.

use super::elementwise::CHUNK;
use super::matmul;
use crate::backend::Fp8;
use rayon::prelude::*;

/// `dst = fp8(src · scale)`, and `amax = max(amax, |src|)` compared as bits (NaN above every
/// number; what the GPU's atomics compare).
pub(super) fn quantize(dst: &mut [u8], amax: &mut f32, src: &[f32], scale: f32, format: Fp8) {
    dst.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(d, s)| {
        for (d, &x) in d.iter_mut().zip(s) {
            *d = format.encode(x * scale);
        }
    });
    let top = src.par_iter().map(|x| x.abs().to_bits()).max().unwrap_or(0);
    *amax = f32::from_bits(amax.to_bits().max(top));
}

/// `dst (cols,rows) = fp8(src (rows,cols)ᵀ · scale)`, and `amax` as [`quantize`]'s.
pub(super) fn quantize_transposed(
    dst: &mut [u8],
    amax: &mut f32,
    src: &[f32],
    scale: f32,
    [rows, cols]: [usize; 2],
    format: Fp8,
) {
    dst.par_chunks_mut(rows).enumerate().for_each(|(j, column)| {
        for (i, d) in column.iter_mut().enumerate() {
            *d = format.encode(src[i * cols + j] * scale);
        }
    });
    let top = src.par_iter().map(|x| x.abs().to_bits()).max().unwrap_or(0);
    *amax = f32::from_bits(amax.to_bits().max(top));
}

/// out (R,S) = (x (R,K) · yᵀ) · dequant[0] · dequant[1] + bias.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    out: &mut [f32],
    x: &[u8],
    y: &[u8],
    bias: Option<&[f32]>,
    dequant: [f32; 2],
    [_, s, k]: [usize; 3],
    [fx, fy]: [Fp8; 2],
    threads: usize,
) {
    let values = |bits: &[u8], format: Fp8| {
        let table: Vec<f32> = (0..=255u8).map(|b| format.decode(b)).collect();
        bits.iter().map(|&b| table[b as usize]).collect::<Vec<f32>>()
    };
    let (x, y) = (values(x, fx), values(y, fy));
    matmul::forward(out, &x, &y, None, k, s, threads);
    let scale = dequant[0] * dequant[1];
    out.par_chunks_mut(s).for_each(|row| {
        for (j, o) in row.iter_mut().enumerate() {
            *o = *o * scale + bias.map_or(0.0, |b| b[j]);
        }
    });
}
