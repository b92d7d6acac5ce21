//! Token and position embeddings: out = wte[token] + wpe[position], and their gradients.

use super::elementwise::axpy;
use rayon::prelude::*;

/// out (B·T, C) = wte[tokens] + wpe[t].
pub(super) fn forward(out: &mut [f32], tokens: &[i32], wte: &[f32], wpe: &[f32], t: usize, c: usize) {
    out.par_chunks_mut(c).enumerate().for_each(|(bt, row)| {
        let te = &wte[tokens[bt] as usize * c..][..c];
        let pe = &wpe[(bt % t) * c..][..c];
        for ((o, x), y) in row.iter_mut().zip(te).zip(pe) {
            *o = x + y;
        }
    });
}

/// dwte and dwpe += the gradient; `order` is the positions sorted by token (stably).
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    dwte: &mut [f32],
    dwpe: &mut [f32],
    dout: &[f32],
    tokens: &[i32],
    order: &[i32],
    b: usize,
    t: usize,
    c: usize,
) {
    // Positions: each position's row sums over the batch in order.
    dwpe.par_chunks_mut(c).enumerate().for_each(|(ti, row)| {
        for bi in 0..b {
            axpy(row, 1.0, &dout[(bi * t + ti) * c..][..c]);
        }
    });
    // Tokens: rows grouped by token id (`order` is stable, so each group sums in row order);
    // each distinct token's row of dwte goes to one task.
    let groups: Vec<&[i32]> = order
        .chunk_by(|&x, &y| tokens[x as usize] == tokens[y as usize])
        .collect();
    let mut rows: Vec<(&[i32], &mut [f32])> = Vec::with_capacity(groups.len());
    let mut rest = dwte;
    let mut at = 0;
    for group in groups {
        let row = tokens[group[0] as usize] as usize;
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((row - at) * c);
        let (this, tail) = tail.split_at_mut(c);
        rows.push((group, this));
        (rest, at) = (tail, row + 1);
    }
    rows.into_par_iter().for_each(|(group, row)| {
        for &r in group {
            axpy(row, 1.0, &dout[r as usize * c..][..c]);
        }
    });
}
