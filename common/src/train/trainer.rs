//! [`Trainer`]: the model, its optimiser, the gradient synchronisation plan and the memory
//! pool on one backend and one communicator, with the operations a training run is made
//! of: one step, an evaluation, a sample, saving and restoring. `train` and `bench` both
//! drive it.

use crate::autograd::{check_ids, Graph, Pool, Recompute, TokenStage};
use crate::backend::replay::Recorder;
use crate::backend::{bf16, token_order, Backend, DeviceBuffer};
use crate::checkpoint::{Checkpoint, HostState};
use crate::comm::{broadcast_f32, device_order, Comm, Words};
use crate::data::Batch;
use crate::error::{Error, Result};
use crate::generate::{self, SampleOptions};
use crate::grad_sync::{GradComm, GradSync, Shards, SyncMode};
use crate::model::{fp8, Gpt2, ModelConfig};
use crate::optim::{AdamW, OptimConfig, StepStats, HISTORY};
use crate::tokenizer::Tokenizer;
use std::ops::Range;
use std::time::{Duration, Instant};

/// How a trainer updates and synchronises; the CLI's flags map onto it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainerSettings {
    pub optim: OptimConfig,
    pub sync: SyncMode,
    /// Micro-batches per optimizer step (gradient accumulation); 1: none.
    pub micro_batches: usize,
    /// What backward computes again instead of keeping from the forward pass.
    pub recompute: Recompute,
    /// ZeRO-1: the optimiser's state cut over the ranks (see [`crate::grad_sync::Shards`]).
    pub zero: bool,
    /// What the gradient sums carry.
    pub grad_comm: GradComm,
    /// `--precision fp8`: the blocks' products in FP8 ([`crate::model::fp8`]).
    pub fp8: bool,
}

pub struct Trainer<'a, B: Backend> {
    pub be: &'a B,
    pub comm: &'a dyn Comm,
    pub model: Gpt2<B>,
    pub opt: AdamW<B>,
    sync: GradSync,
    /// The gradients' bf16 copy that their sums carry (`--grad-comm bf16`, several ranks).
    wire: Option<B::Buffer<bf16>>,
    /// Where a micro-batch after the first writes its gradients before they are added to
    /// the others' (`--grad-accum` above 1; see `Trainer::queue_step`).
    apart: Option<B::Buffer<f32>>,
    micro_batches: usize,
    recompute: Recompute,
    pool: Pool<B>,
    /// The step's token ids at fixed device memory, when steps are recorded.
    tokens: TokenStage<B>,
    replay: Replay<B>,
}

/// A step recorded once and replayed (on GPUs: the step as a CUDA graph, NCCL's sums in it), and the
/// steps replayed since their (loss, norm) were last read.
struct Replay<B: Backend> {
    on: bool,
    recorder: Recorder<B, StepShape>,
    /// Replayed steps not read yet, and when the last read was.
    unread: Range<u64>,
    read_at: Instant,
}

/// What a recording depends on: the step's shape and where its memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StepShape {
    b: usize,
    t: usize,
    micro_batches: usize,
    memory_epoch: u64,
    tokens_at: u64,
}

/// One step's report; times in seconds.
#[derive(Clone, Debug, Default)]
pub struct StepReport {
    /// The stats (loss averaged over micro-batches and ranks, gradient norm, learning rate)
    /// of the steps read back during this call: this step when steps run as queued; when
    /// they are replayed, the steps since the last read, now and then (see [`Trainer::flush`]).
    pub finished: Vec<(u64, StepStats)>,
    pub compute_s: f64,
    pub comm_s: f64,
}

/// Replayed steps read back at least this often (a host round trip each time) on one rank;
/// on several, every this many steps.
const READ_EVERY: Duration = Duration::from_secs(1);
const READ_EVERY_STEPS: u64 = 32;

/// Whether a step can be recorded once and replayed: on a backend that records (the GPU),
/// with one rank, or with ranks whose communicator orders its collectives on the device
/// (NCCL) and the same work every step (not local SGD, which averages every K steps).
fn replayable<B: Backend>(be: &B, comm: &dyn Comm, sync: SyncMode) -> bool {
    be.records()
        && (comm.size() == 1 || (device_order(be, comm).is_some() && !matches!(sync, SyncMode::LocalSgd { .. })))
}

impl<'a, B: Backend> Trainer<'a, B> {
    pub fn new(be: &'a B, comm: &'a dyn Comm, config: ModelConfig, settings: TrainerSettings) -> Result<Self> {
        let mut model = Gpt2::new(be, config)?;
        if settings.fp8 {
            model.enable_fp8(be)?;
        }
        let shards = Shards::new(model.layout.total, comm, settings.zero);
        let (n, segments) = (model.layout.total, model.layout.decay_segments());
        let opt = AdamW::sharded(be, n, segments, settings.optim, shards.own(), shards.sharded())?;
        let sync = GradSync::new(settings.sync, &model.layout, shards).with_wire(settings.grad_comm);
        // The bf16 copy the sums carry under --grad-comm bf16.
        let wire = match settings.grad_comm {
            GradComm::Bf16 if comm.size() > 1 => Some(be.alloc::<bf16>(n)?),
            _ => None,
        };
        let apart = match settings.micro_batches > 1 {
            true => Some(be.alloc::<f32>(n)?),
            false => None,
        };
        let replay_off = std::env::var("GPT2_CUDA_GRAPH").is_ok_and(|v| v == "0");
        Ok(Trainer {
            be,
            comm,
            model,
            opt,
            sync,
            wire,
            apart,
            micro_batches: settings.micro_batches.max(1),
            recompute: settings.recompute,
            pool: Pool::default(),
            tokens: TokenStage::default(),
            replay: Replay {
                on: !replay_off && replayable(be, comm, settings.sync),
                recorder: Recorder::default(),
                unread: 0..0,
                read_at: Instant::now(),
            },
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
        self.model.calibrate_fp8(self.be);
        Ok(())
    }

    /// Steps run as queued, op by op, never recorded (what `GPT2_CUDA_GRAPH=0` asks for).
    pub fn run_as_queued(mut self) -> Self {
        self.replay.on = false;
        self
    }

    /// Micro-batches per step (gradient accumulation; 1: none).
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Whether steps are being replayed from a recording (a CUDA graph) now.
    pub fn replaying(&self) -> bool {
        self.replay.recorder.recorded()
    }

    /// One optimizer step on this rank's (b, t) shard `batch`, cut into `micro_batches`
    /// pieces of b / micro_batches rows; `step` is 0-based. What it computes is
    /// `Trainer::queue_step`; a step whose loss (averaged over micro-batches and ranks) or
    /// gradient norm is not finite leaves the model as it was (`skipped`).
    ///
    /// How it runs: as queued, op by op, with the step's (loss, norm) read back after it; or,
    /// on the GPU (one rank, or ranks over NCCL), recorded once and replayed from then on
    /// (`Trainer::step_replayed`), with nothing read back until [`Trainer::flush`] (or a
    /// read now and then).
    pub fn step(&mut self, batch: &Batch, b: usize, t: usize, step: u64) -> Result<StepReport> {
        if self.model.fp8.is_some() {
            fp8::check_tokens(b / self.micro_batches * t)?; // before anything is queued
        }
        let started = Instant::now();
        self.opt.begin_step(self.be, step)?; // the step's learning rate and bias corrections
        if self.replay.on {
            let finished = self.step_replayed(batch, b, t, step)?;
            return Ok(StepReport {
                finished,
                compute_s: started.elapsed().as_secs_f64(),
                comm_s: 0.0,
            });
        }
        let comm_s = self.queue_step(batch, b, t, step, false)?;
        let (loss, norm) = self.opt.meter.read_loss_and_norm(self.be)?;
        Ok(StepReport {
            finished: vec![(step, StepStats::of(&self.opt.config, step, loss, norm))],
            compute_s: started.elapsed().as_secs_f64() - comm_s,
            comm_s,
        })
    }

    /// The training step, queued on the backend:
    ///
    /// 1. per micro-batch: forward (the loss), zero the gradients (all but those the first
    ///    products write), then backward: the first micro-batch's gradients into the model's
    ///    buffer, each later one's apart and then added to them, so that each micro-batch's
    ///    gradients are computed as a rank computes its own and K micro-batches on one rank
    ///    sum as K ranks do (for K = 2 bit for bit);
    /// 2. reduce: the gradients summed over the ranks (under `--overlap`, bucket by bucket
    ///    during backward), the loss averaged over micro-batches and ranks;
    /// 3. clip: the gradient norm and the factor that clips it to `grad_clip`;
    /// 4. AdamW on the parameters (the device skips it when the loss or the norm is not
    ///    finite), then under ZeRO-1 the updated shards gathered on every rank.
    ///
    /// `staged`: the token ids come from `self.tokens` (a recorded step). Returns the
    /// seconds spent communicating.
    fn queue_step(&mut self, batch: &Batch, b: usize, t: usize, step: u64, staged: bool) -> Result<f64> {
        let (be, comm) = (self.be, self.comm);
        let k = self.micro_batches;
        let n = (b / k) * t; // tokens of a micro-batch
        let mut comm_s = 0.0;
        for micro in 0..k {
            let (inputs, targets) = (&batch.inputs[micro * n..][..n], &batch.targets[micro * n..][..n]);
            let seed = self.sync.loss_scale(comm.size(), k);
            let mut g = Graph::new(be, &mut self.pool, true)
                .with_recompute(self.recompute)
                .with_loss_seed(seed)
                .with_fresh_gradients(true);
            if staged {
                g = g.with_tokens(&self.tokens);
            }
            let apart = if micro == 0 { None } else { self.apart.as_ref() };
            let into = apart.unwrap_or(&self.model.grads);
            let fwd = self.model.forward_into(&mut g, inputs, targets, b / k, t, into)?;
            let loss = fwd.loss.expect("targets given");
            g.zero_grads_except_first_products(into)?;
            let bufs = (&self.model.grads, self.wire.as_ref());
            comm_s += self.sync.backward(&mut g, loss, comm, bufs, (micro, k), apart)?;
            let (slot, at) = self.opt.meter.loss_slot();
            g.copy_into(loss, slot, at, micro > 0)?; // the micro-batches' losses, summed
        }
        self.opt.finish_gradients(be, &self.model.grads, 1.0 / k as f32, comm)?;
        if let Some(fp8) = &self.model.fp8 {
            fp8.agree(be, comm)?; // each amax the largest over the ranks
            fp8.rescale(be); // the step's amax values into the FP8 scales
        }
        comm_s += self.update(step)?;
        self.model.quantize_fp8_weights(be);
        Ok(comm_s)
    }

    /// `Trainer::queue_step` recorded once and replayed: the token ids staged at fixed
    /// memory, then the step replayed when a recording of its shape exists (else queued, and
    /// recorded the second time). NCCL's sums (and ZeRO-1's gather) are in the recording, and
    /// the steps' (loss, norm) wait on the device until they are read, by count or by time.
    fn step_replayed(&mut self, batch: &Batch, b: usize, t: usize, step: u64) -> Result<Vec<(u64, StepStats)>> {
        let be = self.be;
        // The ids the step's graph will ask for, in its order: per micro-batch the inputs,
        // their order for the embedding's backward, the targets (checked when handed out).
        let (k, n) = (self.micro_batches, (b / self.micro_batches) * t);
        let mut arrays = Vec::with_capacity(3 * k);
        for micro in 0..k {
            let inputs = &batch.inputs[micro * n..][..n];
            // Checked here: a replayed step runs none of the graph's own checks.
            check_ids("token id", inputs, self.model.config.padded_vocab_size)?;
            check_ids(
                "target id",
                &batch.targets[micro * n..][..n],
                self.model.config.vocab_size,
            )?;
            arrays.extend([
                inputs.to_vec(),
                token_order(inputs),
                batch.targets[micro * n..][..n].to_vec(),
            ]);
        }
        self.tokens.stage(be, arrays)?;
        let shape = |be: &B, tokens: &TokenStage<B>| StepShape {
            b,
            t,
            micro_batches: k,
            memory_epoch: be.memory_epoch(),
            tokens_at: tokens.addr(),
        };
        let now = shape(be, &self.tokens);
        let mut recorder = std::mem::take(&mut self.replay.recorder);
        let ran = recorder.run(be, now, || {
            self.queue_step(batch, b, t, step, true)?;
            Ok(shape(be, &self.tokens))
        });
        self.replay.recorder = recorder;
        ran?;
        if self.replay.unread.is_empty() {
            self.replay.unread = step..step;
        }
        self.replay.unread.end = step + 1;
        let unread = self.replay.unread.end - self.replay.unread.start;
        // Several ranks read at the same steps (what they read can end the run: every rank
        // must see it at the same step), so by count; one rank also by the clock.
        let due = match self.comm.size() {
            1 => unread >= (HISTORY / 2) as u64 || self.replay.read_at.elapsed() >= READ_EVERY,
            _ => unread >= READ_EVERY_STEPS,
        };
        if due {
            return self.flush();
        }
        Ok(Vec::new())
    }

    /// The update of 0-based `step` and what follows it across ranks (ZeRO-1's gather of
    /// the updated shards; local SGD's averaging). Returns the seconds spent communicating.
    fn update(&self, step: u64) -> Result<f64> {
        let (be, opt, model) = (self.be, &self.opt, &self.model);
        let copy = model.params_bf16.as_ref();
        let schedule = (step, opt.config.total_steps);
        self.sync
            .update_then_sync(be, self.comm, model, schedule, &mut |range| {
                opt.update_range(be, &model.params, copy, &model.grads, range)
            })
    }

    /// The stats of the replayed steps not read yet (waits for them); none when steps run as
    /// queued (each step's come with it).
    pub fn flush(&mut self) -> Result<Vec<(u64, StepStats)>> {
        let unread = std::mem::replace(&mut self.replay.unread, 0..0);
        self.replay.read_at = Instant::now();
        self.opt.read_history(self.be, unread)
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

    /// Seconds one step's gradient sums take alone, the mean of `reps` (see
    /// [`GradSync::time_sums`]); 0 on one rank. Between steps only: it leaves the gradient
    /// buffer unspecified (the next step zeroes it first).
    pub fn time_gradient_sums(&self, reps: usize) -> Result<f64> {
        self.sync
            .time_sums(self.be, self.comm, &self.model, self.wire.as_ref(), reps)
    }

    /// Each tensor's gradient norm after the last step (its name and √Σg², in buffer order),
    /// for finding which tensor a run's gradient spike comes from (`GPT2_GRAD_NORMS`). Reads
    /// the whole gradient buffer back; under ZeRO-1 only this rank's shard is summed.
    pub fn gradient_norms(&self) -> Result<Vec<(String, f32)>> {
        let grads = self.fetch(&self.model.grads)?;
        Ok(self
            .model
            .layout
            .entries
            .iter()
            .map(|e| {
                let sumsq: f64 = grads[e.range.clone()].iter().map(|&g| g as f64 * g as f64).sum();
                (e.name.clone(), sumsq.sqrt() as f32)
            })
            .collect())
    }

    /// Bytes of optimiser state (AdamW's moments) this rank keeps: a 1/N share under ZeRO-1.
    pub fn optimizer_state_bytes(&self) -> usize {
        self.opt.state_bytes()
    }

    /// The whole training state in host memory, on rank 0 (`None` elsewhere): parameters
    /// (made whole first where the steps gather only their bf16 copy: ZeRO-1 under bf16)
    /// and both moments, each rank's shard of the moments gathered under ZeRO-1, copied into
    /// `reuse` (arrays of an earlier copy, to spare fresh memory). Every rank calls it (a
    /// collective then).
    pub fn state_on_root(&self, reuse: [Vec<f32>; 3]) -> Result<Option<[Vec<f32>; 3]>> {
        let root = self.comm.is_root();
        let [mut p, mut m, mut v] = reuse;
        self.sync.gather_params(self.be, self.comm, &self.model)?;
        if root {
            self.fetch_into(&self.model.params, &mut p)?;
        }
        self.gather_moment(&self.opt.m, &mut m)?;
        self.gather_moment(&self.opt.v, &mut v)?;
        Ok(root.then_some([p, m, v]))
    }

    /// The training state for a checkpoint, on rank 0 (`None` elsewhere). Where the backend
    /// has [snapshots](Backend::snapshot) (the GPU) and the moments are whole on rank 0 (not
    /// cut by ZeRO-1), a copy within the device, queued after the steps so far, which the
    /// checkpoint's writer brings to host memory while training goes on; else the state in
    /// host memory now, as [`Trainer::state_on_root`] copies it into `arrays()` (a collective
    /// under ZeRO-1, which every rank calls). Either holds the same values.
    pub fn checkpoint_state(&self, arrays: impl FnOnce() -> [Vec<f32>; 3]) -> Result<Option<HostState>> {
        let n = self.model.num_params();
        let parts = [&self.model.params, &self.opt.m, &self.opt.v];
        // The same decision on every rank.
        if self.snapshots_checkpoints() && parts.iter().all(|p| p.len() == n) {
            if !self.comm.is_root() {
                return Ok(None); // nothing to gather: rank 0 holds the whole state
            }
            if let Some(snapshot) = self.be.snapshot(&parts)? {
                return Ok(Some(HostState::Snapshot(snapshot)));
            }
        }
        Ok(self.state_on_root(arrays())?.map(HostState::Arrays))
    }

    /// Makes ready what checkpoints' snapshots will need in host memory (rank 0), before the
    /// steps start.
    pub fn prepare_checkpoints(&self) {
        if self.comm.is_root() && self.snapshots_checkpoints() {
            let n = self.model.num_params();
            self.be.prepare_snapshots(&[n, n, n]);
        }
    }

    /// Frees the memory that checkpoints' snapshots keep (after the last checkpoint's write:
    /// sampling may want it).
    pub fn release_checkpoint_memory(&self) {
        self.be.release_snapshots();
    }

    /// Whether checkpoints will go through a snapshot on the device where they can (and so
    /// need no host arrays made ready for them).
    pub fn snapshots_checkpoints(&self) -> bool {
        self.be.takes_snapshots() && !self.sync.shards().sharded()
    }

    /// One moment whole into `host` on rank 0 (left alone elsewhere). Sharded, each rank's
    /// shard meets the others' in the gradient buffer, free between steps (the next step
    /// zeroes it first).
    fn gather_moment(&self, moment: &B::Buffer<f32>, host: &mut Vec<f32>) -> Result<()> {
        if !self.sync.shards().sharded() {
            return match self.comm.is_root() {
                true => self.fetch_into(moment, host),
                false => Ok(()),
            };
        }
        let own = self.sync.shards().own();
        let mut shard = vec![0.0f32; own.len()];
        self.be.read(moment, 0, &mut shard)?;
        let grads = &self.model.grads;
        self.be.write(grads, own.start, &shard)?;
        self.be.synchronize()?;
        // SAFETY: the shards cover the layout, which `grads` holds; nothing else uses the
        // gradients between steps.
        unsafe {
            self.comm
                .all_gather(Words::F32(grads.ptr()), self.sync.shards().parts())?
        };
        if self.comm.is_root() {
            self.fetch_into(grads, host)?;
        }
        Ok(())
    }

    /// Loads parameters and moments from rank 0's checkpoint (`None` elsewhere) into every
    /// rank; under ZeRO-1 each rank keeps its shard of the moments, whatever the world size
    /// that wrote the checkpoint.
    pub fn restore(&mut self, ckpt: Option<Checkpoint>) -> Result<()> {
        let n = self.model.num_params();
        let (mut p, mut m, mut v, fp8) = match ckpt {
            Some(c) => (c.params, c.m, c.v, c.meta.fp8),
            None => (vec![0.0; n], vec![0.0; n], vec![0.0; n], None),
        };
        let own = self.opt.shard();
        for (host, dst, part) in [
            (&mut p, &self.model.params, 0..n),
            (&mut m, &self.opt.m, own.clone()),
            (&mut v, &self.opt.v, own),
        ] {
            broadcast_f32(self.comm, host)?;
            if host.len() != n {
                // Every rank has rank 0's arrays now, so every rank stops here together.
                let e = Error::Input(format!(
                    "the checkpoint holds {} values per array but this model has {n}",
                    host.len()
                ));
                return Err(e.on_every_rank());
            }
            self.be.write(dst, 0, &host[part])?;
        }
        self.model.refresh_copy(self.be)?;
        // FP8 scales: rank 0's checkpoint's on every rank (empty: it has none) or, from a
        // checkpoint without them (another precision's, imported weights), calibrated afresh.
        let mut fp8 = fp8.unwrap_or_default();
        broadcast_f32(self.comm, &mut fp8)?;
        match (&self.model.fp8, (!fp8.is_empty()).then_some(fp8)) {
            (Some(state), Some(saved)) => {
                let params = (&self.model.params, self.model.params_bf16.as_ref());
                match state.restore(self.be, &saved, params.0, params.1) {
                    // Every rank holds rank 0's values: a count that does not fit fails on all.
                    Err(e @ Error::Input(_)) => Err(e.on_every_rank()),
                    done => done,
                }
            }
            (Some(_), None) => {
                self.model.calibrate_fp8(self.be);
                Ok(())
            }
            (None, _) => Ok(()),
        }
    }

    /// The FP8 scales and their histories, for a checkpoint (`None` unless `--precision fp8`).
    pub fn fp8_state(&self) -> Result<Option<Vec<f32>>> {
        self.model.fp8.as_ref().map(|f| f.save(self.be)).transpose()
    }

    /// Text continuing `prompt`, in printable form ([`crate::text::printable`]: control bytes
    /// and invalid UTF-8 escaped). That form is both what `train` prints and what
    /// `summary.json` keeps, so the report's README never holds raw control bytes and no
    /// byte the model wrote is lost to U+FFFD. With the number of tokens: fewer than asked
    /// where the run is asked to stop meanwhile (Ctrl-C, SIGTERM: [`crate::stop::asked`]).
    pub fn sample(&mut self, tok: &Tokenizer, prompt: &str, opts: &SampleOptions) -> Result<(String, usize)> {
        let ids = tok.encode(prompt)?;
        let out = generate::generate(&self.model, self.be, &mut self.pool, &ids, opts, |_| {
            match crate::stop::asked() {
                true => std::ops::ControlFlow::Break(()), // Ctrl-C, SIGTERM: cut it short
                false => std::ops::ControlFlow::Continue(()),
            }
        })?;
        Ok((crate::text::printable(&tok.bytes(&out.tokens)), out.tokens.len()))
    }

    fn fetch(&self, buf: &B::Buffer<f32>) -> Result<Vec<f32>> {
        let mut host = Vec::new();
        self.fetch_into(buf, &mut host)?;
        Ok(host)
    }

    /// The model's worth of `buf` into `host` (its memory reused when large enough).
    fn fetch_into(&self, buf: &B::Buffer<f32>, host: &mut Vec<f32>) -> Result<()> {
        host.resize(self.model.num_params(), 0.0);
        self.be.read(buf, 0, host)
    }
}
