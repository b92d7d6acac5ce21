//! AdamW with decoupled weight decay, global-norm gradient clipping, and the learning
//! rate schedule (linear warmup, then cosine decay to a floor). Runs on the backend, so
//! moments stay where the parameters are, and clipping, the skip of a non-finite step and the
//! step's (loss, norm) need no host round trip: the host reads them when it likes.
//!
//! Under ZeRO-1 (`--zero 1`) each rank's AdamW owns one contiguous shard of the flat
//! parameter buffer ([`AdamW::sharded`]): it keeps the moments of that shard only, updates
//! those parameters only (weight decay still per parameter, the decay segments cut to the
//! shard), and sums its shard's Σg² with the other ranks' before the global norm.

use crate::backend::{bf16, check_range, AdamWHyper, Backend, DeviceBuffer, SgdHyper, Span, StepState};
use crate::comm::{device_order, Comm};
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
    /// GPT-2's AdamW at peak rate `lr`: betas 0.9 and 0.95, eps 1e-8, weight decay 0.1, the
    /// gradient norm clipped at 1, `warmup_steps` of linear warmup, then a cosine to a tenth of
    /// `lr` at `total_steps` (the train command's defaults but for the rate and the schedule).
    pub fn gpt2(lr: f32, warmup_steps: u64, total_steps: u64) -> Self {
        OptimConfig {
            lr,
            min_lr_frac: 0.1,
            warmup_steps,
            total_steps,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
        }
    }

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
/// ([`StepMeter::read_history`]): a step recorded and replayed writes them there, and the host
/// reads them at log points.
pub const HISTORY: usize = 1024;

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

/// What every optimiser measures around its update, on the device: the step's scalars
/// ([`StepState`]: the schedule the host writes, the norm, clipping factor, mean loss and the
/// decision to apply that the device works out) and a history of (loss, norm) per step.
pub struct StepMeter<B: Backend> {
    state: B::Buffer<f32>,
    /// (loss, norm) of step s at 2·(s mod history_len).
    history: B::Buffer<f32>,
    history_len: usize,
}

impl<B: Backend> StepMeter<B> {
    pub fn new(be: &B) -> Result<Self> {
        Self::with_history(be, HISTORY)
    }

    /// A meter keeping the (loss, norm) of the last `len` steps (at least 1).
    pub fn with_history(be: &B, len: usize) -> Result<Self> {
        let len = len.max(1);
        Ok(StepMeter {
            state: be.alloc(StepState::WORDS)?,
            history: be.alloc(2 * len)?,
            history_len: len,
        })
    }

    /// Steps whose (loss, norm) the history keeps.
    pub fn history_len(&self) -> usize {
        self.history_len
    }

    /// The history: (loss, norm) of step s at 2·(s mod [`StepMeter::history_len`]).
    pub fn history(&self) -> Span<'_> {
        self.history.span()
    }

    /// Where the step's loss goes (a buffer and an offset): each micro-batch adds its own.
    pub fn loss_slot(&self) -> (&B::Buffer<f32>, usize) {
        (&self.state, StepState::LOSS)
    }

    /// The [`StepState`] the updates read.
    pub fn state(&self) -> Span<'_> {
        self.state.span()
    }

    /// Writes 0-based `step`'s learning rate, bias corrections (for AdamW's `betas`; 1 for
    /// an optimiser without) and number to the device, before the step's work is queued or
    /// replayed.
    pub fn begin_step(&self, be: &B, lr: f32, betas: Option<(f32, f32)>, step: u64) -> Result<()> {
        let mut schedule = StepState::schedule(lr, betas.map_or(0.0, |b| b.0), betas.map_or(0.0, |b| b.1), step);
        if betas.is_none() {
            (schedule[1], schedule[2]) = (1.0, 1.0);
        }
        be.write(&self.state, StepState::SCHEDULE, &schedule)
    }

    /// Queues what follows the gradients (the first `n` of `grads`): Σg², the norm, its
    /// clipping factor for `grad_clip`, the loss (summed over micro-batches) times
    /// `loss_scale`, whether to apply the update, and (loss, norm) into the history. Nothing
    /// is read back.
    pub fn finish_gradients(
        &self,
        be: &B,
        grads: &B::Buffer<f32>,
        n: usize,
        grad_clip: f32,
        loss_scale: f32,
    ) -> Result<()> {
        self.finish_shard_gradients(be, grads, 0..n, None, grad_clip, loss_scale)
    }

    /// [`StepMeter::finish_gradients`] from the gradients in `shard` of `grads`, with Σg²
    /// summed over the ranks of `across` (each holding its own shard) before the norm: on the
    /// device where the communicator orders its work there (NCCL), else after the host waits
    /// for the backend (MPI).
    pub fn finish_shard_gradients(
        &self,
        be: &B,
        grads: &B::Buffer<f32>,
        shard: Range<usize>,
        across: Option<&dyn Comm>,
        grad_clip: f32,
        loss_scale: f32,
    ) -> Result<()> {
        check_range("gradients", grads.len(), shard.start, shard.len())?;
        let s = self.state.span();
        be.zero(s, 1); // sumsq
        be.sum_squares(s, grads.span().slice(shard.start, shard.len()), shard.len());
        if let Some(comm) = across {
            self.sum_across(be, comm, StepState::SUMSQ)?;
        }
        be.step_stats(s, self.history.span(), self.history_len, grad_clip, loss_scale);
        Ok(())
    }

    /// Sums the state's word `at` over the ranks of `comm`: ordered on the device where the
    /// communicator can (no host wait), else after the host waits for the backend.
    fn sum_across(&self, be: &B, comm: &dyn Comm, at: usize) -> Result<()> {
        let word = self.state.ptr().add(at);
        match device_order(be, comm) {
            // SAFETY: the state holds its words; nothing else touches the word meanwhile
            // (what reads it is queued on `after` after the sum).
            after @ Some(_) => unsafe {
                comm.start_all_reduce_sum(word, 1, after)?;
                comm.finish_all_reduces(after)
            },
            None => {
                be.synchronize()?;
                // SAFETY: as above, and the backend's writes are done.
                unsafe { comm.all_reduce_sum(word, 1) }
            }
        }
    }

    /// Sums the step's loss (each rank's micro-batches' sum so far) over the ranks of `comm`
    /// where it lies (on the device, without a host round trip, where the communicator can),
    /// before [`StepMeter::finish_gradients`] averages it (its `loss_scale` then takes the
    /// 1/ranks): every rank gets the same loss, and so decides alike whether to apply the
    /// update.
    pub fn sum_loss_across(&self, be: &B, comm: &dyn Comm) -> Result<()> {
        self.sum_across(be, comm, StepState::LOSS)
    }

    /// This step's (loss, norm), read back now (a host round trip).
    pub fn read_loss_and_norm(&self, be: &B) -> Result<(f32, f32)> {
        let mut host = [0.0f32; StepState::WORDS];
        be.read(&self.state, 0, &mut host)?;
        Ok((host[StepState::LOSS], host[StepState::NORM]))
    }

    /// The stats of the 0-based `steps` (at most [`StepMeter::history_len`] of the latest),
    /// from the history.
    pub fn read_history(&self, be: &B, config: &OptimConfig, steps: Range<u64>) -> Result<Vec<(u64, StepStats)>> {
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        let len = self.history_len;
        assert!(steps.end - steps.start <= len as u64, "history holds {len} steps");
        let mut host = vec![0.0f32; 2 * len];
        be.read(&self.history, 0, &mut host)?;
        Ok(steps
            .map(|s| {
                let at = 2 * (s as u32 as usize % len);
                (s, StepStats::of(config, s, host[at], host[at + 1]))
            })
            .collect())
    }
}

/// Checks that `params`, `grads` and the bf16 copy hold `n` values, and the optimiser's
/// buffers `state_n`.
fn check_buffers<B: Backend>(
    (n, state_n): (usize, usize),
    params: &B::Buffer<f32>,
    grads: &B::Buffer<f32>,
    state: &[&B::Buffer<f32>],
    copy: Option<&B::Buffer<bf16>>,
) -> Result<()> {
    for (what, buf) in [("parameters", params), ("gradients", grads)] {
        check_range(what, buf.len(), 0, n)?;
    }
    for buf in state {
        check_range("optimiser state", buf.len(), 0, state_n)?;
    }
    if let Some(copy) = copy {
        check_range("bf16 parameters", copy.len(), 0, n)?;
    }
    Ok(())
}

pub struct AdamW<B: Backend> {
    pub config: OptimConfig,
    /// First and second moments of the shard's parameters, in the parameter layout.
    pub m: B::Buffer<f32>,
    pub v: B::Buffer<f32>,
    pub meter: StepMeter<B>,
    /// The decay segments cut to the shard, offsets from its start.
    segments: Vec<(Range<usize>, bool)>,
    /// Parameters in the layout.
    n: usize,
    /// The parameters this optimiser updates: all of them, or this rank's ZeRO-1 shard.
    shard: Range<usize>,
    /// Whether the parameters are cut over the ranks (ZeRO-1): the gradient norm's Σg² is then
    /// summed over them. Known alike on every rank, whatever its own shard holds (with few
    /// parameters one rank may own all of them).
    across_ranks: bool,
}

impl<B: Backend> AdamW<B> {
    pub fn new(be: &B, layout: &ParamLayout, config: OptimConfig) -> Result<Self> {
        Self::with_segments(be, layout.total, layout.decay_segments(), config)
    }

    /// For `n` parameters whose weight decay applies to the `segments` flagged true.
    pub fn with_segments(be: &B, n: usize, segments: Vec<(Range<usize>, bool)>, config: OptimConfig) -> Result<Self> {
        Self::sharded(be, n, segments, config, 0..n, false)
    }

    /// The optimiser of `shard` of `n` parameters (ZeRO-1: this rank's share, `across_ranks`
    /// true when the parameters are cut over several ranks): moments for the shard only,
    /// updates of the shard only.
    pub fn sharded(
        be: &B,
        n: usize,
        segments: Vec<(Range<usize>, bool)>,
        config: OptimConfig,
        shard: Range<usize>,
        across_ranks: bool,
    ) -> Result<Self> {
        assert!(shard.end <= n, "shard {shard:?} outside the {n} parameters");
        let within = |i: usize| i.clamp(shard.start, shard.end) - shard.start;
        let segments = segments
            .into_iter()
            .map(|(r, decay)| (within(r.start)..within(r.end), decay))
            .filter(|(r, _)| !r.is_empty())
            .collect();
        Ok(AdamW {
            config,
            m: be.alloc(shard.len())?,
            v: be.alloc(shard.len())?,
            meter: StepMeter::new(be)?,
            segments,
            n,
            shard,
            across_ranks,
        })
    }

    /// The parameters this optimiser updates (and whose moments it keeps).
    pub fn shard(&self) -> Range<usize> {
        self.shard.clone()
    }

    /// Bytes of optimiser state (the two moments) this rank keeps.
    pub fn state_bytes(&self) -> usize {
        2 * self.shard.len() * std::mem::size_of::<f32>()
    }

    /// See [`StepMeter::begin_step`]: the schedule of 0-based `step`.
    pub fn begin_step(&self, be: &B, step: u64) -> Result<()> {
        let c = &self.config;
        self.meter.begin_step(be, c.lr_at(step), Some((c.beta1, c.beta2)), step)
    }

    /// See [`StepMeter::finish_gradients`], over every parameter's gradient: a shard's Σg²
    /// is summed over the ranks of `comm` (each holds its shard's summed gradients).
    /// With several ranks the loss is averaged over them too ([`StepMeter::sum_loss_across`]).
    pub fn finish_gradients(&self, be: &B, grads: &B::Buffer<f32>, loss_scale: f32, comm: &dyn Comm) -> Result<()> {
        let across = self.across_ranks.then_some(comm);
        let clip = self.config.grad_clip;
        check_range("gradients", grads.len(), 0, self.n)?;
        let mut loss_scale = loss_scale;
        if comm.size() > 1 {
            self.meter.sum_loss_across(be, comm)?;
            loss_scale /= comm.size() as f32;
        }
        self.meter
            .finish_shard_gradients(be, grads, self.shard(), across, clip, loss_scale)
    }

    /// See [`StepMeter::read_history`].
    pub fn read_history(&self, be: &B, steps: Range<u64>) -> Result<Vec<(u64, StepStats)>> {
        self.meter.read_history(be, &self.config, steps)
    }

    /// Queues the update of the shard's parameters (one pass; weight decay on the decay
    /// segments), with the gradients clipped by the factor [`StepMeter::finish_gradients`]
    /// left on the device, writing the updated parameters rounded to bf16 into `copy` too,
    /// when given. The device skips it when the step's loss or norm was not finite.
    pub fn update(
        &self,
        be: &B,
        params: &B::Buffer<f32>,
        copy: Option<&B::Buffer<bf16>>,
        grads: &B::Buffer<f32>,
    ) -> Result<()> {
        self.update_range(be, params, copy, grads, self.shard())
    }

    /// [`AdamW::update`] of the parameters in `range` only (inside the shard, offsets in the
    /// whole buffer): the same values as the whole shard's update gives them, element by
    /// element, so a shard updated in pieces ends bit for bit as one updated at once.
    pub fn update_range(
        &self,
        be: &B,
        params: &B::Buffer<f32>,
        copy: Option<&B::Buffer<bf16>>,
        grads: &B::Buffer<f32>,
        range: Range<usize>,
    ) -> Result<()> {
        check_buffers::<B>((self.n, self.shard.len()), params, grads, &[&self.m, &self.v], copy)?;
        assert!(
            self.shard.start <= range.start && range.start <= range.end && range.end <= self.shard.end,
            "update of {range:?} outside the shard {:?}",
            self.shard
        );
        // The decay segments cut to the range, offsets from its start.
        let (from, to) = (range.start - self.shard.start, range.end - self.shard.start);
        let segments: Vec<(Range<usize>, bool)> = self
            .segments
            .iter()
            .map(|(r, decay)| (r.start.clamp(from, to) - from..r.end.clamp(from, to) - from, *decay))
            .filter(|(r, _)| !r.is_empty())
            .collect();
        if segments.is_empty() {
            return Ok(()); // an empty shard (more ranks than aligned pieces), or range
        }
        let c = &self.config;
        let hp = AdamWHyper {
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            weight_decay: c.weight_decay,
        };
        let n = range.len();
        be.adamw(
            params.span().slice(range.start, n),
            grads.span().slice(range.start, n),
            self.m.span().slice(from, n),
            self.v.span().slice(from, n),
            &segments,
            self.meter.state(),
            hp,
            copy.map(|c| c.span().slice(range.start, n)),
        );
        Ok(())
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
    pub meter: StepMeter<B>,
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
            meter: StepMeter::new(be)?,
            segments,
            n,
        })
    }

    /// Queues the update with the learning rate and clipping factor of the meter's state
    /// (skipped by the device when the step was not finite).
    pub fn update(
        &self,
        be: &B,
        params: &B::Buffer<f32>,
        copy: Option<&B::Buffer<bf16>>,
        grads: &B::Buffer<f32>,
    ) -> Result<()> {
        check_buffers::<B>((self.n, self.n), params, grads, &[&self.velocity], copy)?;
        for (range, decay) in &self.segments {
            let hp = SgdHyper {
                momentum: self.momentum,
                weight_decay: if *decay { self.config.weight_decay } else { 0.0 },
            };
            let (o, len) = (range.start, range.len());
            be.sgd(
                params.span().slice(o, len),
                grads.span().slice(o, len),
                self.velocity.span().slice(o, len),
                len,
                self.meter.state(),
                hp,
                copy.map(|c| c.span().slice(o, len)),
            );
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

    pub fn meter(&self) -> &StepMeter<B> {
        match self {
            Optimizer::AdamW(o) => &o.meter,
            Optimizer::Sgd(o) => &o.meter,
        }
    }

    /// See [`StepMeter::begin_step`].
    pub fn begin_step(&self, be: &B, step: u64) -> Result<()> {
        match self {
            Optimizer::AdamW(o) => o.begin_step(be, step),
            Optimizer::Sgd(o) => o.meter.begin_step(be, o.config.lr_at(step), None, step),
        }
    }

    pub fn update(
        &self,
        be: &B,
        params: &B::Buffer<f32>,
        copy: Option<&B::Buffer<bf16>>,
        grads: &B::Buffer<f32>,
    ) -> Result<()> {
        match self {
            Optimizer::AdamW(o) => o.update(be, params, copy, grads),
            Optimizer::Sgd(o) => o.update(be, params, copy, grads),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    #[test]
    fn shards_and_pieces_of_an_update_make_the_whole_update() {
        // Two halves updated by two sharded optimisers (the same gradients, the same state)
        // equal one optimiser over the whole, bit for bit, decay segments crossing the cut.
        let be = CpuBackend::new(1).unwrap();
        let n = 100;
        let segments = vec![(0..30, true), (30..45, false), (45..100, true)];
        let config = OptimConfig {
            weight_decay: 0.1,
            ..cfg()
        };
        let host: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let grads_host: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        // Each shard updated at once, or in the pieces `cut` makes of it (update_range).
        let run = |shards: &[Range<usize>], cut: &dyn Fn(&Range<usize>) -> Vec<Range<usize>>| {
            let (params, grads) = (be.alloc::<f32>(n).unwrap(), be.alloc::<f32>(n).unwrap());
            be.write(&params, 0, &host).unwrap();
            be.write(&grads, 0, &grads_host).unwrap();
            for shard in shards {
                let opt = AdamW::sharded(&be, n, segments.clone(), config, shard.clone(), shards.len() > 1).unwrap();
                opt.begin_step(&be, 3).unwrap();
                opt.meter.finish_gradients(&be, &grads, n, 0.0, 1.0).unwrap();
                for piece in cut(shard) {
                    opt.update_range(&be, &params, None, &grads, piece).unwrap();
                }
                assert_eq!(opt.state_bytes(), 8 * shard.len());
            }
            let mut out = vec![0.0; n];
            be.read(&params, 0, &mut out).unwrap();
            out
        };
        let at_once = |shard: &Range<usize>| vec![shard.clone()];
        let whole = run(std::slice::from_ref(&(0..n)), &at_once);
        assert_eq!(run(&[0..40, 40..100], &at_once), whole);
        // Pieces that cut the decay segments (at 30 and 45) and one that is empty.
        let pieces = |shard: &Range<usize>| {
            let (a, b) = (shard.start, shard.end);
            vec![a..a + 7, a + 7..a + 7, a + 7..(a + 33).min(b), (a + 33).min(b)..b]
        };
        assert_eq!(run(&[0..40, 40..100], &pieces), whole);
        assert_eq!(run(std::slice::from_ref(&(0..n)), &pieces), whole);
        assert_ne!(whole, host, "the update moved the parameters");
    }

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
