//! AdamW with decoupled weight decay, global-norm gradient clipping, and the learning
//! rate schedule (linear warmup, then cosine decay to a floor). Runs on the backend, so
//! moments stay where the parameters are, and clipping, the skip of a non-finite step and the
//! step's (loss, norm) need no host round trip: the host reads them when it likes.

use crate::backend::{bf16, check_range, AdamWHyper, Backend, DeviceBuffer, StepState};
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

/// Steps whose (loss, norm) the device keeps until the host reads them
/// ([`AdamW::read_history`]): a step recorded and replayed writes them there, and the host
/// reads them at log points.
pub const HISTORY: usize = 1024;

pub struct AdamW<B: Backend> {
    pub config: OptimConfig,
    /// First and second moments, in the parameter layout.
    pub m: B::Buffer<f32>,
    pub v: B::Buffer<f32>,
    /// The step's scalars ([`StepState`]).
    state: B::Buffer<f32>,
    /// (loss, norm) of step s at 2·(s mod HISTORY).
    history: B::Buffer<f32>,
    segments: Vec<(Range<usize>, bool)>,
    /// Parameters in the layout.
    n: usize,
}

/// What one step reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepStats {
    pub loss: f32,
    pub grad_norm: f32,
    pub lr: f32,
    /// The update was skipped: the loss or the gradient norm was not finite.
    pub skipped: bool,
}

impl StepStats {
    /// The stats of 0-based `step` from its (loss, norm), by the rule the device applies.
    pub fn of(config: &OptimConfig, step: u64, loss: f32, grad_norm: f32) -> Self {
        StepStats {
            loss,
            grad_norm,
            lr: config.lr_at(step),
            skipped: !(loss.is_finite() && grad_norm.is_finite()),
        }
    }
}

impl<B: Backend> AdamW<B> {
    pub fn new(be: &B, layout: &ParamLayout, config: OptimConfig) -> Result<Self> {
        Ok(AdamW {
            config,
            m: be.alloc(layout.total)?,
            v: be.alloc(layout.total)?,
            state: be.alloc(StepState::WORDS)?,
            history: be.alloc(2 * HISTORY)?,
            segments: layout.decay_segments(),
            n: layout.total,
        })
    }

    /// Where the step's loss goes (a buffer and an offset): each micro-batch adds its own.
    pub fn loss_slot(&self) -> (&B::Buffer<f32>, usize) {
        (&self.state, StepState::LOSS)
    }

    /// Writes 0-based `step`'s learning rate, bias corrections and number to the device (before
    /// the step's work is queued or replayed).
    pub fn begin_step(&self, be: &B, step: u64) -> Result<()> {
        let c = &self.config;
        let schedule = StepState::schedule(c.lr_at(step), c.beta1, c.beta2, step);
        be.write(&self.state, StepState::SCHEDULE, &schedule)
    }

    /// Queues what follows the gradients: Σg², the norm, its clipping factor, the loss (summed
    /// over micro-batches) times `loss_scale`, whether to apply the update, and (loss, norm)
    /// into the history. Nothing is read back.
    pub fn finish_gradients(&self, be: &B, grads: &B::Buffer<f32>, loss_scale: f32) -> Result<()> {
        check_range("gradients", grads.len(), 0, self.n)?;
        let s = self.state.ptr();
        // SAFETY: grads holds the layout's n values (checked above); the state its words, the
        // history 2·HISTORY.
        unsafe {
            be.zero(s, 1); // sumsq
            be.sum_squares(s, grads.ptr(), self.n);
            be.step_stats(s, self.history.ptr(), HISTORY, self.config.grad_clip, loss_scale);
        }
        Ok(())
    }

    /// This step's (loss, norm), read back now (a host round trip).
    pub fn read_loss_and_norm(&self, be: &B) -> Result<(f32, f32)> {
        let mut host = [0.0f32; StepState::WORDS];
        be.read(&self.state, 0, &mut host)?;
        Ok((host[StepState::LOSS], host[StepState::NORM]))
    }

    /// Overrides the device's decision to apply the update (ranks agree on it from the loss
    /// averaged over ranks).
    pub fn set_apply(&self, be: &B, apply: bool) -> Result<()> {
        be.write(&self.state, StepState::APPLY, &[apply as u8 as f32])
    }

    /// The stats of the 0-based `steps` (at most [`HISTORY`] of the latest), from the history.
    pub fn read_history(&self, be: &B, steps: Range<u64>) -> Result<Vec<(u64, StepStats)>> {
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        assert!(steps.end - steps.start <= HISTORY as u64, "history holds {HISTORY} steps");
        let mut host = vec![0.0f32; 2 * HISTORY];
        be.read(&self.history, 0, &mut host)?;
        Ok(steps
            .map(|s| {
                let at = 2 * (s as u32 as usize % HISTORY);
                (s, StepStats::of(&self.config, s, host[at], host[at + 1]))
            })
            .collect())
    }

    /// Queues the update (each decay segment with its weight decay), with the gradients
    /// clipped by the factor [`AdamW::finish_gradients`] left on the device, writing the
    /// updated parameters rounded to bf16 into `copy` too, when given. The device skips it
    /// when the step's loss or norm was not finite.
    pub fn update(
        &self,
        be: &B,
        params: &B::Buffer<f32>,
        copy: Option<&B::Buffer<bf16>>,
        grads: &B::Buffer<f32>,
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
        let c = &self.config;
        for (range, decay) in &self.segments {
            let hp = AdamWHyper {
                beta1: c.beta1,
                beta2: c.beta2,
                eps: c.eps,
                weight_decay: if *decay { c.weight_decay } else { 0.0 },
            };
            let (o, len) = (range.start, range.len());
            // SAFETY: params, grads, m, v and the copy hold the layout's n values (checked
            // above); every segment lies inside 0..n; the state holds its words.
            unsafe {
                be.adamw(
                    params.ptr().add(o),
                    grads.ptr().add(o),
                    self.m.ptr().add(o),
                    self.v.ptr().add(o),
                    len,
                    self.state.ptr(),
                    hp,
                    copy.map(|c| c.ptr().add(o)),
                );
            }
        }
        Ok(())
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
