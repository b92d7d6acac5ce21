//! [`Trainer`]: the model, its optimiser, the gradient synchronisation plan and the memory
//! pool on one backend and one communicator, with the operations a training run is made
//! of: one step, an evaluation, a sample, saving and restoring. `train` and `bench` both
//! drive it.

use crate::autograd::{Graph, Pool};
use crate::backend::Backend;
use crate::checkpoint::{self, Checkpoint, CheckpointMeta};
use crate::comm::{broadcast_f32, Comm};
use crate::data::Batch;
use crate::error::Result;
use crate::generate::{self, SampleOptions};
use crate::grad_sync::{GradSync, SyncMode};
use crate::model::{Gpt2, ModelConfig};
use crate::optim::{AdamW, OptimConfig, StepStats};
use crate::tokenizer::Tokenizer;
use std::path::Path;
use std::time::Instant;

/// How a trainer updates and synchronises; the CLI's flags map onto it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainerSettings {
    pub optim: OptimConfig,
    pub sync: SyncMode,
    /// Micro-batches per optimizer step (gradient accumulation); 1: none.
    pub micro_batches: usize,
    /// Compute GELU and layernorm outputs again in backward instead of keeping them.
    pub recompute: bool,
}

pub struct Trainer<'a, B: Backend> {
    pub be: &'a B,
    pub comm: &'a dyn Comm,
    pub model: Gpt2<B>,
    pub opt: AdamW<B>,
    sync: GradSync,
    micro_batches: usize,
    recompute: bool,
    pool: Pool<B>,
}

/// One step's report; times in seconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepReport {
    /// Loss averaged over ranks, gradient norm and learning rate.
    pub stats: StepStats,
    pub compute_s: f64,
    pub comm_s: f64,
}

impl<'a, B: Backend> Trainer<'a, B> {
    pub fn new(be: &'a B, comm: &'a dyn Comm, config: ModelConfig, settings: TrainerSettings) -> Result<Self> {
        let model = Gpt2::new(be, config)?;
        let opt = AdamW::new(be, &model.layout, settings.optim)?;
        let sync = GradSync::new(settings.sync, &model.layout);
        Ok(Trainer {
            be,
            comm,
            model,
            opt,
            sync,
            micro_batches: settings.micro_batches.max(1),
            recompute: settings.recompute,
            pool: Pool::default(),
        })
    }

    /// Rank 0 initialises the parameters and every rank receives them.
    pub fn init_weights(&mut self, seed: u64) -> Result<()> {
        if self.comm.is_root() {
            self.model.init_weights(self.be, seed)?;
        }
        if self.comm.size() > 1 {
            let mut host = self.fetch(&self.model.params)?;
            broadcast_f32(self.comm, &mut host)?;
            self.model.set_params(self.be, &host)?;
        }
        Ok(())
    }

    /// zero grads → (forward → backward) per micro-batch → gradients summed over ranks →
    /// clip + AdamW. A step whose loss (averaged over micro-batches and ranks) or gradient
    /// norm is not finite leaves the model as it was (`stats.skipped`). `batch` is this
    /// rank's (b, t) shard, cut into `micro_batches` pieces of b / micro_batches rows; `step`
    /// is 0-based.
    pub fn step(&mut self, batch: &Batch, b: usize, t: usize, step: u64) -> Result<StepReport> {
        let (be, comm) = (self.be, self.comm);
        let started = Instant::now();
        be.zero_buffer(&self.model.grads);
        let (k, mut comm_s) = (self.micro_batches, 0.0);
        let n = (b / k) * t; // tokens of a micro-batch
        for micro in 0..k {
            let (inputs, targets) = (&batch.inputs[micro * n..][..n], &batch.targets[micro * n..][..n]);
            let mut g = Graph::new(be, &mut self.pool, true).with_recompute(self.recompute);
            let fwd = self.model.forward(&mut g, inputs, Some(targets), b / k, t, false)?;
            let loss = fwd.loss.expect("targets given");
            comm_s += self.sync.backward(&mut g, loss, comm, &self.model.grads, (micro, k))?;
            let (slot, at) = self.opt.loss_slot();
            g.copy_into(loss, slot, at, micro > 0)?; // the micro-batches' losses, summed
        }
        let mut stats = self.opt.measure(be, &self.model.grads, step)?;
        stats.loss /= k as f32;
        if comm.size() > 1 {
            let t0 = Instant::now();
            let mut v = [stats.loss];
            comm.all_reduce_sum_host(&mut v)?;
            stats.loss = v[0] / comm.size() as f32;
            comm_s += t0.elapsed().as_secs_f64();
        }
        // Every rank sees the same averaged loss and (gradients summed) the same norm.
        stats.skipped = !(stats.loss.is_finite() && stats.grad_norm.is_finite());
        if !stats.skipped {
            let copy = self.model.params_bf16.as_ref();
            self.opt.step(be, &self.model.params, copy, &self.model.grads, step)?;
        }
        let total_steps = self.opt.config.total_steps;
        comm_s += self.sync.after_update(be, comm, &self.model, step, total_steps)?;
        let total = started.elapsed().as_secs_f64();
        Ok(StepReport {
            stats,
            compute_s: total - comm_s,
            comm_s,
        })
    }

    /// Mean loss over evaluation batches (forward only), weighted by rows.
    pub fn evaluate(&mut self, batches: &[Batch], t: usize) -> Result<f32> {
        let (mut sum, mut rows) = (0.0f64, 0usize);
        for batch in batches {
            let b = batch.inputs.len() / t;
            let mut g = Graph::new(self.be, &mut self.pool, false);
            let fwd = self
                .model
                .forward(&mut g, &batch.inputs, Some(&batch.targets), b, t, false)?;
            let mut loss = [0.0f32];
            g.read(fwd.loss.expect("targets given"), &mut loss)?;
            sum += loss[0] as f64 * b as f64;
            rows += b;
        }
        Ok((sum / rows.max(1) as f64) as f32)
    }

    /// Writes parameters, moments and progress atomically (rank 0 only).
    pub fn save(&self, path: &Path, meta: &CheckpointMeta) -> Result<()> {
        let p = self.fetch(&self.model.params)?;
        let m = self.fetch(&self.opt.m)?;
        let v = self.fetch(&self.opt.v)?;
        checkpoint::save(path, meta, &p, &m, &v)
    }

    /// Loads parameters and moments from rank 0's checkpoint (`None` elsewhere) into every rank.
    pub fn restore(&mut self, ckpt: Option<Checkpoint>) -> Result<()> {
        let n = self.model.num_params();
        let (mut p, mut m, mut v) = match ckpt {
            Some(c) => (c.params, c.m, c.v),
            None => (vec![0.0; n], vec![0.0; n], vec![0.0; n]),
        };
        for (host, dst) in [
            (&mut p, &self.model.params),
            (&mut m, &self.opt.m),
            (&mut v, &self.opt.v),
        ] {
            broadcast_f32(self.comm, host)?;
            self.be.write(dst, 0, host)?;
        }
        self.model.refresh_copy(self.be)
    }

    /// Text continuing `prompt`, in printable form ([`crate::text::printable`]: control bytes
    /// and invalid UTF-8 escaped). That form is both what `train` prints and what
    /// `summary.json` keeps, so the report's README never holds raw control bytes and no
    /// byte the model wrote is lost to U+FFFD.
    pub fn sample(&mut self, tok: &Tokenizer, prompt: &str, opts: &SampleOptions) -> Result<String> {
        let ids = tok.encode(prompt);
        let out = generate::generate(&self.model, self.be, &mut self.pool, &ids, opts, |_| {})?;
        Ok(crate::text::printable(&tok.bytes(&out)))
    }

    fn fetch(&self, buf: &B::Buffer<f32>) -> Result<Vec<f32>> {
        let mut host = vec![0.0f32; self.model.num_params()];
        self.be.read(buf, 0, &mut host)?;
        Ok(host)
    }
}
