//! The MLP workload's step on the device: the CPU's [`FusedMlp`] impl, and the numerics only
//! it uses (the batch cut from the data set, the ReLU's gradient mask applied in place). Its
//! ops check their spans ([`contract`]) before any address becomes a slice, as the
//! [`Backend`](crate::backend::Backend) ops in `mod.rs` do.

use super::{elementwise, loss, matmul, optim, read_state, state_mut, view, view_mut, CpuBackend};
use crate::backend::{bf16, contract, Act, Backend, FusedMlp, SgdHyper, Span};
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

impl FusedMlp for CpuBackend {
    unsafe fn gather_batch(
        &self,
        out: Span<Act>,
        targets: Span<i32>,
        images: Span<u8>,
        labels: Span<u8>,
        order: Span<i32>,
        state: Span,
        rows: usize,
        size: usize,
        steps: usize,
    ) {
        let (images_len, labels_len) = (images.len(), labels.len());
        let (out, targets, images, labels, order, state) = contract::gather_batch(
            self.act(),
            out,
            targets,
            images,
            labels,
            order,
            state,
            rows,
            size,
            steps,
        );
        // SAFETY: the contract checked every extent and overlap; the data set is viewed whole,
        // so an image index past it is an index out of bounds.
        unsafe {
            let s = read_state(state).step as usize % steps;
            let order = &view(order, steps * rows)[s * rows..(s + 1) * rows];
            let (images, labels) = (view(images, images_len), view(labels, labels_len));
            let (out, targets) = (view_mut(out, rows * size), view_mut(targets, rows));
            self.run(|| gather(out, targets, images, labels, order, size));
        }
    }

    unsafe fn loss_step(
        &self,
        logits: Span<Act>,
        losses: Span,
        targets: Span<i32>,
        state: Span,
        schedule: Span,
        history: Span,
        history_len: usize,
        rows: usize,
        v: usize,
        steps: usize,
        dloss: f32,
    ) {
        let (logits, losses, targets, state, schedule, history) = contract::loss_step(
            self.act(),
            logits,
            losses,
            targets,
            state,
            schedule,
            history,
            history_len,
            rows,
            v,
            steps,
        );
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            let (logits, losses, targets) = (view_mut(logits, rows * v), view_mut(losses, rows), view(targets, rows));
            // The generic step's ops in its order: crossentropy_forward, mean, the copy into
            // the state (0 + mean), step_stats (· 1.0), crossentropy_backward_in_place.
            self.run(|| loss::forward(losses, logits, targets, v, v));
            let loss = 0.0 + optim::mean(losses) * 1.0;
            self.run(|| loss::backward_in_place(logits, losses, targets, dloss, v, v));
            let s = state_mut(state);
            let at = s.step as usize;
            s.sumsq = 0.0;
            s.norm = 0.0;
            s.clip = 1.0;
            s.loss = loss;
            s.apply = loss.is_finite() as u8 as f32;
            s.lr = view(schedule, steps)[at % steps];
            let slot = 2 * (at % history_len);
            view_mut(history, 2 * history_len)[slot..slot + 2].copy_from_slice(&[loss, 0.0]);
            s.step = s.step.wrapping_add(1);
        }
    }

    fn matmul_backward_relu(
        &self,
        dinp: Span<Act>,
        dout: Span<Act>,
        w: Span<Act>,
        act: Span<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let (dinp, dout, w, act) = contract::matmul_backward_relu(self.act(), dinp, dout, w, act, bt, c, oc);
        // SAFETY: the contract checked every extent and that `dinp` overlaps no input.
        let (d, act) = unsafe { (view_mut(dinp, bt * c), view(act, bt * c)) };
        // SAFETY: as above.
        let (dout, w) = unsafe { (view(dout, bt * oc), view(w, oc * c)) };
        self.run(|| {
            elementwise::zero(&mut *d);
            matmul::input_grad(d, dout, w, c, oc, self.threads);
            relu_mask(d, act);
        });
    }

    fn linear_sgd(
        &self,
        params: Span,
        velocity: Span,
        grads: Span,
        copy: Option<Span<bf16>>,
        dout: Span<Act>,
        inp: Span<Act>,
        state: Span,
        hp: SgdHyper,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let (params, velocity, grads, copy, dout, inp, state) =
            contract::linear_sgd(self.act(), params, velocity, grads, copy, dout, inp, state, bt, c, oc);
        let n = oc * c;
        // SAFETY: the contract checked that params, velocity, grads and copy hold OC·C + OC
        // elements each, dout and inp their extents, and that no written one overlaps another.
        unsafe {
            // The gradients as the generic step computes them (into zeros), then its two updates.
            {
                let g = view_mut(grads, n + oc);
                let (dw, db) = g.split_at_mut(n);
                let (dout, inp) = (view(dout, bt * oc), view(inp, bt * c));
                self.run(|| {
                    elementwise::zero(&mut *dw);
                    elementwise::zero(&mut *db);
                    matmul::weight_grad(dw, dout, inp, c, oc, self.threads);
                    matmul::bias_backward(db, dout, oc);
                });
            }
            self.sgd_at(params, grads, velocity, n, state, hp, copy);
            let bias = SgdHyper {
                weight_decay: 0.0,
                ..hp
            };
            self.sgd_at(
                params.add(n),
                grads.add(n),
                velocity.add(n),
                oc,
                state,
                bias,
                copy.map(|p| p.add(n)),
            );
        }
    }
}
