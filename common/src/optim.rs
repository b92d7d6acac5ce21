//! AdamW with decoupled weight decay, SGD with momentum (the MLP workload's default),
//! global-norm gradient clipping, and the learning rate schedule (linear warmup, then cosine
//! decay to a floor). Runs on the backend, so moments stay where the parameters are and
//! clipping needs no host round trip.

use crate::backend::{bf16, check_range, AdamWStep, Backend, DevPtr, DeviceBuffer, SgdStep};
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

/// What every optimiser measures before its update: the global gradient norm, the factor
/// that clips it (kept on the device for the update) and the step's loss, in one scratch
/// buffer read back in one copy.
struct Meter<B: Backend> {
    scratch: B::Buffer<f32>,
}

impl<B: Backend> Meter<B> {
    fn new(be: &B) -> Result<Self> {
        Ok(Meter {
            scratch: be.alloc(SCRATCH)?,
        })
    }

    fn loss_slot(&self) -> (&B::Buffer<f32>, usize) {
        (&self.scratch, LOSS_SLOT)
    }

    /// The clip factor [`Meter::measure`] left on the device: the updates scale by it.
    fn clip_factor(&self) -> DevPtr {
        self.scratch.ptr().add(2)
    }

    /// The stats of 0-based `step` over the first `n` gradients, clipping them as `config`
    /// says (the factor stays on the device).
    fn measure(&self, be: &B, grads: &B::Buffer<f32>, n: usize, config: &OptimConfig, step: u64) -> Result<StepStats> {
        check_range("gradients", grads.len(), 0, n)?;
        let s = self.scratch.ptr();
        // SAFETY: grads holds n values (checked above); the scratch SCRATCH.
        unsafe {
            be.zero(s, LOSS_SLOT);
            be.sum_squares(s, grads.ptr(), n);
            be.clip_factor(s.add(1), s, config.grad_clip);
        }
        let mut host = [0.0f32; 3];
        be.read(&self.scratch, 1, &mut host)?;
        Ok(StepStats {
            loss: host[2],
            grad_norm: host[0],
            lr: config.lr_at(step),
            skipped: false,
        })
    }
}

/// Checks that `params`, `grads`, the state buffers and the bf16 copy hold `n` values.
fn check_buffers<B: Backend>(
    n: usize,
    params: &B::Buffer<f32>,
    grads: &B::Buffer<f32>,
    state: &[&B::Buffer<f32>],
    copy: Option<&B::Buffer<bf16>>,
) -> Result<()> {
    for (what, buf) in [("parameters", params), ("gradients", grads)].into_iter().chain(state.iter().map(|b| ("optimiser state", *b))) {
        check_range(what, buf.len(), 0, n)?;
    }
    if let Some(copy) = copy {
        check_range("bf16 parameters", copy.len(), 0, n)?;
    }
    Ok(())
}

pub struct AdamW<B: Backend> {
    pub config: OptimConfig,
    /// First and second moments, in the parameter layout.
    pub m: B::Buffer<f32>,
    pub v: B::Buffer<f32>,
    meter: Meter<B>,
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
        Self::with_segments(be, layout.total, layout.decay_segments(), config)
    }

    /// For `n` parameters whose weight decay applies to the `segments` flagged true.
    pub fn with_segments(be: &B, n: usize, segments: Vec<(Range<usize>, bool)>, config: OptimConfig) -> Result<Self> {
        Ok(AdamW {
            config,
            m: be.alloc(n)?,
            v: be.alloc(n)?,
            meter: Meter::new(be)?,
            segments,
            n,
        })
    }

    /// Where the step's loss goes (a buffer and an offset) for [`AdamW::measure`] to report
    /// it with the gradient norm in one copy.
    pub fn loss_slot(&self) -> (&B::Buffer<f32>, usize) {
        self.meter.loss_slot()
    }

    /// The global gradient norm, its clipping factor (kept on the device for [`AdamW::step`])
    /// and the loss left in [`AdamW::loss_slot`], read back in the step's one host copy.
    pub fn measure(&mut self, be: &B, grads: &B::Buffer<f32>, step: u64) -> Result<StepStats> {
        self.meter.measure(be, grads, self.n, &self.config, step)
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
        check_buffers::<B>(self.n, params, grads, &[&self.m, &self.v], copy)?;
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
        let (c, clip) = (&self.config, self.meter.clip_factor());
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
                clip,
                hp,
                copy.map(|c| c.ptr().add(o)),
            );
        }
    }
}

/// SGD with momentum (PyTorch's form: v = μ·v + g, p -= lr·v), with the same schedule,
/// clipping and reporting as [`AdamW`]; `config.weight_decay` is an L2 term on the segments
/// flagged true.
pub struct Sgd<B: Backend> {
    pub config: OptimConfig,
    pub momentum: f32,
    /// The momentum buffer, in the parameter layout.
    pub velocity: B::Buffer<f32>,
    meter: Meter<B>,
    segments: Vec<(Range<usize>, bool)>,
    n: usize,
}

impl<B: Backend> Sgd<B> {
    pub fn new(
        be: &B,
        n: usize,
        segments: Vec<(Range<usize>, bool)>,
        config: OptimConfig,
        momentum: f32,
    ) -> Result<Self> {
        Ok(Sgd {
            config,
            momentum,
            velocity: be.alloc(n)?,
            meter: Meter::new(be)?,
            segments,
            n,
        })
    }

    pub fn step(
        &mut self,
        be: &B,
        params: &B::Buffer<f32>,
        copy: Option<&B::Buffer<bf16>>,
        grads: &B::Buffer<f32>,
        step: u64,
    ) -> Result<()> {
        check_buffers::<B>(self.n, params, grads, &[&self.velocity], copy)?;
        let lr = self.config.lr_at(step);
        for (range, decay) in &self.segments {
            let hp = SgdStep {
                lr,
                momentum: self.momentum,
                weight_decay: if *decay { self.config.weight_decay } else { 0.0 },
            };
            let (o, len) = (range.start, range.len());
            // SAFETY: every buffer holds the n values (checked above); each segment lies
            // inside 0..n.
            unsafe {
                be.sgd(
                    params.ptr().add(o),
                    grads.ptr().add(o),
                    self.velocity.ptr().add(o),
                    len,
                    self.meter.clip_factor(),
                    hp,
                    copy.map(|c| c.ptr().add(o)),
                );
            }
        }
        Ok(())
    }
}

/// Either optimiser, behind one face (the MLP workload lets the command line choose).
pub enum Optimizer<B: Backend> {
    AdamW(AdamW<B>),
    Sgd(Sgd<B>),
}

impl<B: Backend> Optimizer<B> {
    pub fn config(&self) -> &OptimConfig {
        match self {
            Optimizer::AdamW(o) => &o.config,
            Optimizer::Sgd(o) => &o.config,
        }
    }

    fn meter(&self) -> &Meter<B> {
        match self {
            Optimizer::AdamW(o) => &o.meter,
            Optimizer::Sgd(o) => &o.meter,
        }
    }

    /// See [`AdamW::loss_slot`].
    pub fn loss_slot(&self) -> (&B::Buffer<f32>, usize) {
        self.meter().loss_slot()
    }

    /// See [`AdamW::measure`]: the norm over the first `n` gradients.
    pub fn measure(&self, be: &B, grads: &B::Buffer<f32>, n: usize, step: u64) -> Result<StepStats> {
        self.meter().measure(be, grads, n, self.config(), step)
    }

    pub fn step(
        &mut self,
        be: &B,
        params: &B::Buffer<f32>,
        copy: Option<&B::Buffer<bf16>>,
        grads: &B::Buffer<f32>,
        step: u64,
    ) -> Result<()> {
        match self {
            Optimizer::AdamW(o) => o.step(be, params, copy, grads, step),
            Optimizer::Sgd(o) => o.step(be, params, copy, grads, step),
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
