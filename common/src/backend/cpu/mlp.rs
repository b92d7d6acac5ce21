//! The MLP workload's step on the device (`Backend::gather_batch`, `matmul_backward_relu`): the
//! batch cut from the data set, and the ReLU's gradient mask applied in place.

use rayon::prelude::*;

/// Row r of `out` (rows, size) = image `order[r]` of `images` scaled to [0, 1], `targets[r]`
/// its label.
pub(super) fn gather(out: &mut [f32], targets: &mut [i32], images: &[u8], labels: &[u8], order: &[i32], size: usize) {
    out.par_chunks_mut(size)
        .zip(targets.par_iter_mut())
        .zip(order)
        .for_each(|((row, t), &i)| {
            let i = i as usize;
            for (x, &p) in row.iter_mut().zip(&images[i * size..(i + 1) * size]) {
                *x = p as f32 / 255.0;
            }
            *t = labels[i] as i32;
        });
}

/// `d = [act > 0] · d`, as `relu_backward` adds it into a zeroed gradient (`0 + d`).
pub(super) fn relu_mask(d: &mut [f32], act: &[f32]) {
    d.par_iter_mut().zip(act).for_each(|(d, &a)| {
        *d = if a > 0.0 { 0.0 + *d } else { 0.0 };
    });
}
