//! AdamW with decoupled weight decay, global-norm gradient clipping, and the learning
//! rate schedule (linear warmup, then cosine decay to a floor). Runs on the backend, so
//! moments stay where the parameters are and clipping needs no host round trip.

use crate::backend::{bf16, check_range, AdamWStep, Backend, DeviceBuffer};
use crate::error::Result;
use crate::model::ParamLayout;
use std::ops::Range;

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OptimConfig {
    pub lr: f32,
    /// The cosine decays to `lr · min_lr_frac`.
    pub min_lr_frac: f32,
    pub warmup_steps: u64,
    pub total_steps: u64,
    pub weight_decay: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Global gradient-norm ceiling; 0 disables clipping.
    pub grad_clip: f32,
}

impl OptimConfig {
    /// Learning rate for 0-based `step`: linear warmup to `lr`, then cosine to the floor.
    pub fn lr_at(&self, step: u64) -> f32 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f32 / self.warmup_steps as f32;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f32 / span as f32).min(1.0);
        let min_lr = self.lr * self.min_lr_frac;
        min_lr + 0.5 * (1.0 + (std::f32::consts::PI * progress).cos()) * (self.lr - min_lr)
    }
}

/// The optimiser's small device scratch: Σg², then [norm, clip factor, loss], so that
/// one copy brings back what a step reports.
const SCRATCH: usize = 4;
const LOSS_SLOT: usize = 3;

pub struct AdamW<B: Backend> {
    pub config: OptimConfig,
    /// First and second moments, in the parameter layout.
    pub m: B::Buffer<f32>,
    pub v: B::Buffer<f32>,
    scratch: B::Buffer<f32>,
    segments: Vec<(Range<usize>, bool)>,
    /// Parameters in the layout.
    n: usize,
}

/// What one step reports (read back in one small copy).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepStats {
    pub loss: f32,
    pub grad_norm: f32,
    pub lr: f32,
    /// The update was skipped: the loss or the gradient norm was not finite.
    pub skipped: bool,
}

impl<B: Backend> AdamW<B> {
    pub fn new(be: &B, layout: &ParamLayout, config: OptimConfig) -> Result<Self> {
        Ok(AdamW {
            config,
            m: be.alloc(layout.total)?,
            v: be.alloc(layout.total)?,
            scratch: be.alloc(SCRATCH)?,
            segments: layout.decay_segments(),
            n: layout.total,
        })
    }

    /// Where the step's loss goes (a buffer and an offset) for [`AdamW::measure`] to report
    /// it with the gradient norm in one copy.
    pub fn loss_slot(&self) -> (&B::Buffer<f32>, usize) {
        (&self.scratch, LOSS_SLOT)
    }

    /// The global gradient norm, its clipping factor (kept on the device for [`AdamW::step`])
    /// and the loss left in [`AdamW::loss_slot`], read back in the step's one host copy.
    pub fn measure(&mut self, be: &B, grads: &B::Buffer<f32>, step: u64) -> Result<StepStats> {
        check_range("gradients", grads.len(), 0, self.n)?;
        let s = self.scratch.ptr();
        // SAFETY: grads holds the layout's n values (checked above); the scratch SCRATCH.
        unsafe {
            be.zero(s, LOSS_SLOT);
            be.sum_squares(s, grads.ptr(), self.n);
            be.clip_factor(s.add(1), s, self.config.grad_clip);
        }
        let mut host = [0.0f32; 3];
        be.read(&self.scratch, 1, &mut host)?;
        Ok(StepStats {
            loss: host[2],
            grad_norm: host[0],
            lr: self.config.lr_at(step),
            skipped: false,
        })
    }

    /// Applies the update of 0-based `step` with the gradients [`AdamW::measure`] clipped,
    /// writing the updated parameters rounded to bf16 into `copy` too, when given.
    pub fn step(
        &mut self,
        be: &B,
        params: &B::Buffer<f32>,
        copy: Option<&B::Buffer<bf16>>,
        grads: &B::Buffer<f32>,
        step: u64,
    ) -> Result<()> {
        for (what, buf) in [
            ("parameters", params),
            ("gradients", grads),
            ("m", &self.m),
            ("v", &self.v),
        ] {
            check_range(what, buf.len(), 0, self.n)?;
        }
        if let Some(copy) = copy {
            check_range("bf16 parameters", copy.len(), 0, self.n)?;
        }
        // SAFETY: params, grads, m, v and the copy hold the layout's n values (checked
        // above); every segment lies inside 0..n.
        unsafe { self.update(be, params, copy, grads, self.config.lr_at(step), step) };
        Ok(())
    }

    /// AdamW over each decay segment, gradients scaled by the clip factor in the scratch.
    ///
    /// # Safety
    /// `params`, `copy` and `grads` hold the layout's values.
    unsafe fn update(
        &self,
        be: &B,
        params: &B::Buffer<f32>,
        copy: Option<&B::Buffer<bf16>>,
        grads: &B::Buffer<f32>,
        lr: f32,
        step: u64,
    ) {
        let (c, s) = (&self.config, self.scratch.ptr());
        for (range, decay) in &self.segments {
            let hp = AdamWStep {
                lr,
                beta1: c.beta1,
                beta2: c.beta2,
                eps: c.eps,
                weight_decay: if *decay { c.weight_decay } else { 0.0 },
                t: step + 1,
            };
            let (o, len) = (range.start, range.len());
            be.adamw(
                params.ptr().add(o),
                grads.ptr().add(o),
                self.m.ptr().add(o),
                self.v.ptr().add(o),
                len,
                s.add(2),
                hp,
                copy.map(|c| c.ptr().add(o)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> OptimConfig {
        OptimConfig {
            lr: 1.0,
            min_lr_frac: 0.1,
            warmup_steps: 10,
            total_steps: 110,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
        }
    }

    #[test]
    fn warmup_is_linear_then_cosine_decays_to_the_floor() {
        let c = cfg();
        assert!((c.lr_at(0) - 0.1).abs() < 1e-6, "first warmup step");
        assert!((c.lr_at(9) - 1.0).abs() < 1e-6, "warmup reaches the peak");
        assert!((c.lr_at(10) - 1.0).abs() < 1e-6, "cosine starts at the peak");
        assert!(
            (c.lr_at(60) - 0.55).abs() < 1e-5,
            "halfway is the midpoint of peak and floor"
        );
        assert!((c.lr_at(110) - 0.1).abs() < 1e-6, "ends at the floor");
        assert!((c.lr_at(500) - 0.1).abs() < 1e-6, "stays at the floor");
        assert!((11..110).all(|s| c.lr_at(s) <= c.lr_at(s - 1)), "monotone decay");
    }
}
