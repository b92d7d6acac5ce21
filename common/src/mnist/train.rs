//! The `mnist` subcommand: the MLP trained epoch by epoch on any backend and communicator,
//! the same way `train` runs GPT-2. Rank 0 reads the data and every rank receives it; each
//! rank takes its share of every global batch and the gradients are summed over ranks
//! ([`GradSync`]), so every rank applies the same update and stage 1 reproduces stage 0.
//! After each epoch rank 0 evaluates the test set and writes a row of `OUT/loss.tsv`.
//!
//! On one rank with SGD (one GPU, or the CPU), the epoch runs as [`FusedStep`]s instead: the
//! data set on the device, the update inside backward, the losses read once an epoch; on a GPU
//! each step is one replay of a recorded step (`GPT2_MNIST_FUSED=0` turns the fused step off;
//! `GPT2_CUDA_GRAPH=0` queues its ops each time instead of replaying).

use super::checkpoint::{self, Meta, MlpCheckpoint, Settings};
use super::data::{self, Dataset, Files, CLASSES};
use super::fused::FusedStep;
use super::mlp::Mlp;
use super::synthetic;
use super::{OptimizerKind, RunSettings};
use crate::autograd::{Graph, Pool};
use crate::backend::{Backend, FusedMlp};
use crate::comm::{agree, from_root, Comm};
use crate::error::{Error, Result};
use crate::grad_sync::{GradSync, SyncMode};
use crate::optim::{AdamW, OptimConfig, Optimizer, Sgd, StepStats};
use crate::report::log::{set_aside_earlier_run, LogState, LossLog};
use crate::report::progress;
use indicatif::ProgressBar;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Test images per forward pass when evaluating.
const EVAL_ROWS: usize = 1000;

/// One row of the MLP's `loss.tsv`, after an epoch.
#[derive(Clone, Copy, Debug)]
pub struct EpochRow {
    pub epoch: u64,
    pub train_loss: f32,
    pub test_loss: f32,
    /// Fraction of the test images classified right (0 to 1).
    pub test_accuracy: f32,
    pub samples_per_s: f64,
    pub elapsed_s: f64,
}

impl EpochRow {
    pub const HEADER: &'static str = "epoch\ttrain_loss\ttest_loss\ttest_accuracy\tsamples_per_s\telapsed_s";

    fn tsv(&self) -> String {
        format!(
            "{}\t{:.4}\t{:.4}\t{:.4}\t{:.0}\t{:.1}",
            self.epoch, self.train_loss, self.test_loss, self.test_accuracy, self.samples_per_s, self.elapsed_s
        )
    }

    /// The row under the header as the terminal shows it (columns as wide as their names).
    fn display(&self) -> String {
        format!(
            "{:>5}  {:>10.4}  {:>9.4}  {:>13.4}  {:>13.0}  {:>9.1}",
            self.epoch, self.train_loss, self.test_loss, self.test_accuracy, self.samples_per_s, self.elapsed_s
        )
    }
}

/// The MLP, its optimiser and gradient synchronisation on one backend and communicator.
pub struct MlpTrainer<'a, B: Backend> {
    pub be: &'a B,
    pub comm: &'a dyn Comm,
    pub mlp: Mlp<B>,
    pub opt: Optimizer<B>,
    sync: GradSync,
    pool: Pool<B>,
    /// A stop was asked for (Ctrl-C, SIGTERM, SIGHUP) on some rank by the end of the last
    /// step: the same on every rank, which all stop after that step.
    pub stop_asked: bool,
}

impl<'a, B: Backend> MlpTrainer<'a, B> {
    /// An MLP of `widths`, initialised from `seed` (the same on every rank).
    pub fn new(
        be: &'a B,
        comm: &'a dyn Comm,
        widths: &[usize],
        optimizer: OptimizerKind,
        config: OptimConfig,
        momentum: f32,
        seed: u64,
    ) -> Result<Self> {
        let mlp = Mlp::new(be, widths)?;
        mlp.init_weights(be, seed)?;
        let (n, segments) = (mlp.num_params(), mlp.decay_segments());
        let opt = match optimizer {
            OptimizerKind::Sgd => Optimizer::Sgd(Sgd::new(be, n, segments, config, momentum)?),
            OptimizerKind::AdamW => Optimizer::AdamW(AdamW::with_segments(be, n, segments, config)?),
        };
        Ok(MlpTrainer {
            be,
            comm,
            sync: GradSync::whole(SyncMode::Allreduce, n),
            mlp,
            opt,
            pool: Pool::default(),
            stop_asked: false,
        })
    }

    /// The buffers of the optimiser's state: SGD's velocity, or AdamW's m and v.
    fn state_buffers(&self) -> Vec<&B::Buffer<f32>> {
        match &self.opt {
            Optimizer::Sgd(o) => vec![&o.velocity],
            Optimizer::AdamW(o) => vec![&o.m, &o.v],
        }
    }

    /// The parameters and the optimiser's state (SGD's velocity, or AdamW's m and v), read back.
    pub fn state(&self) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        let n = self.mlp.num_params();
        let read = |b: &B::Buffer<f32>| {
            let mut host = vec![0.0f32; n];
            self.be.read(b, 0, &mut host).map(|()| host)
        };
        let params = read(&self.mlp.params)?;
        let state = self.state_buffers().into_iter().map(read).collect::<Result<_>>()?;
        Ok((params, state))
    }

    /// The parameters (and their bf16 copy) and the optimiser's state from a checkpoint's.
    pub fn restore(&self, params: &[f32], state: &[Vec<f32>]) -> Result<()> {
        let (n, buffers) = (self.mlp.num_params(), self.state_buffers());
        if params.len() != n || state.len() != buffers.len() || state.iter().any(|a| a.len() != n) {
            return Err(Error::Input(format!(
                "cannot resume: the checkpoint's arrays do not fit this MLP of {n} parameters and {} state array(s)",
                buffers.len()
            ))
            .on_every_rank());
        }
        self.mlp.set_params(self.be, params)?;
        for (buffer, host) in buffers.into_iter().zip(state) {
            self.be.write(buffer, 0, host)?;
        }
        Ok(())
    }

    /// One optimiser step (0-based `step`) on this rank's `rows` images: forward, backward,
    /// gradients summed over ranks, the update. The loss is averaged over ranks; a non-finite
    /// one stops the run (every rank sees the same). Notes whether a stop was asked for
    /// ([`MlpTrainer::stop_asked`]).
    pub fn step(&mut self, pixels: &[f32], labels: &[i32], rows: usize, step: u64) -> Result<StepStats> {
        let (be, comm) = (self.be, self.comm);
        self.opt.begin_step(be, step)?;
        be.zero_buffer(&self.mlp.grads);
        {
            let mut g = Graph::new(be, &mut self.pool, true);
            let (_, loss) = self.mlp.forward(&mut g, pixels, rows, Some(labels))?;
            let loss = loss.expect("labels given");
            self.sync
                .backward(&mut g, loss, comm, (&self.mlp.grads, None), (0, 1), None)?;
            let (slot, at) = self.opt.meter().loss_slot();
            g.copy_into(loss, slot, at, false)?;
        }
        let (n, config) = (self.mlp.num_params(), *self.opt.config());
        let meter = self.opt.meter();
        meter.finish_gradients(be, &self.mlp.grads, n, config.grad_clip, 1.0)?;
        let (loss, norm) = meter.read_loss_and_norm(be)?;
        // The loss averaged over ranks, and whether any rank was asked to stop, in one sum.
        let mut v = [loss, crate::stop::asked() as u8 as f32];
        if comm.size() > 1 {
            comm.all_reduce_sum_host(&mut v)?;
            v[0] /= comm.size() as f32;
        }
        let loss = v[0];
        self.stop_asked = v[1] > 0.0;
        let stats = StepStats::of(&config, step, loss, norm);
        if stats.skipped {
            return Err(not_finite(step, &stats));
        }
        let copy = self.mlp.params_bf16.as_ref();
        self.opt.update(be, &self.mlp.params, copy, &self.mlp.grads)?;
        Ok(stats)
    }

    /// (mean cross-entropy, accuracy) over a whole data set, forward only.
    pub fn evaluate(&mut self, set: &Dataset) -> Result<(f32, f32)> {
        let (mut loss_sum, mut right) = (0.0f64, 0usize);
        let (mut pixels, mut labels, mut logits) = (Vec::new(), Vec::new(), Vec::new());
        let all: Vec<usize> = (0..set.len()).collect();
        for rows in all.chunks(EVAL_ROWS) {
            pixels.clear();
            labels.clear();
            set.gather(rows, &mut pixels, &mut labels);
            let mut g = Graph::new(self.be, &mut self.pool, false);
            let (out, loss) = self.mlp.forward(&mut g, &pixels, rows.len(), Some(&labels))?;
            let mut mean = [0.0f32];
            g.read(loss.expect("labels given"), &mut mean)?;
            loss_sum += mean[0] as f64 * rows.len() as f64;
            logits.resize(rows.len() * CLASSES, 0.0);
            g.read(out, &mut logits)?;
            right += logits
                .chunks(CLASSES)
                .zip(&labels)
                .filter(|(row, &label)| argmax(row) == label as usize)
                .count();
        }
        let n = set.len().max(1) as f64;
        Ok(((loss_sum / n) as f32, (right as f64 / n) as f32))
    }

    /// The global 0-based `steps` of the generic step, each on this rank's share of its batch
    /// of `batch` images of `set` (the epoch's order from `seed`), `each` called after every
    /// step. Returns their stats and the seconds spent in steps (the batches' gathering left
    /// out): fewer than `steps` where a stop was asked for (every rank stops after the same
    /// step). `order` is reused between calls.
    pub fn run_generic(
        &mut self,
        set: &Dataset,
        batch: usize,
        steps: Range<u64>,
        seed: u64,
        order: &mut Vec<usize>,
        mut each: impl FnMut(&StepStats),
    ) -> Result<(Vec<(u64, StepStats)>, f64)> {
        let spe = (set.len() / batch) as u64;
        let local = batch / self.comm.size();
        let (mut pixels, mut labels) = (Vec::new(), Vec::new());
        let (mut stats, mut seconds) = (Vec::with_capacity(steps.clone().count()), 0.0);
        for step in steps.clone() {
            let (epoch, s) = (step / spe, (step % spe) as usize);
            if s == 0 || step == steps.start {
                crate::data::epoch_order(order, set.len(), seed, epoch);
            }
            let mine = &order[s * batch + self.comm.rank() * local..][..local];
            pixels.clear();
            labels.clear();
            set.gather(mine, &mut pixels, &mut labels);
            let t0 = Instant::now();
            let st = self.step(&pixels, &labels, local, step)?;
            seconds += t0.elapsed().as_secs_f64();
            each(&st);
            stats.push((step, st));
            if self.stop_asked {
                break;
            }
        }
        Ok((stats, seconds))
    }
}

impl<B: FusedMlp> MlpTrainer<'_, B> {
    /// As [`MlpTrainer::run_generic`] with `fused` (made for this set and batch; one rank,
    /// SGD): each epoch's order and learning rates are uploaded at its first step, the steps
    /// are queued (replayed) without waiting, and their stats are read at each epoch's end and
    /// at the end of `steps`, or after the step where a stop was asked for (one rank: no other
    /// to agree with). The seconds are the wall time, reads included.
    pub fn run_fused(
        &mut self,
        fused: &mut FusedStep<B>,
        set: &Dataset,
        steps: Range<u64>,
        seed: u64,
        order: &mut Vec<usize>,
        mut each: impl FnMut(),
    ) -> Result<(Vec<(u64, StepStats)>, f64)> {
        let Optimizer::Sgd(sgd) = &self.opt else {
            return Err(Error::Device("the fused MLP step runs SGD only".into()));
        };
        let (be, config, spe) = (self.be, sgd.config, fused.steps() as u64);
        let started = Instant::now();
        let (mut stats, mut unread) = (Vec::with_capacity(steps.clone().count()), steps.start);
        for step in steps.clone() {
            let epoch = step / spe;
            if step % spe == 0 || step == steps.start {
                crate::data::epoch_order(order, set.len(), seed, epoch);
                let first = epoch * spe;
                let lrs: Vec<f32> = (first..first + spe).map(|s| config.lr_at(s)).collect();
                // A range may start mid-epoch (a bench's timed steps after its warm-up): the
                // upload names the epoch's first step, then the counter is set to this one.
                fused.begin_epoch(be, order, &lrs, first)?;
                if step != first {
                    fused.set_step(be, step)?;
                }
            }
            fused.step(be, &self.mlp, sgd)?;
            each();
            self.stop_asked = crate::stop::asked();
            if (step + 1) % spe == 0 || step + 1 == steps.end || self.stop_asked {
                let read = fused.read(be, &config, unread..step + 1)?;
                if let Some((s, st)) = read.iter().find(|(_, st)| st.skipped) {
                    return Err(not_finite(*s, st));
                }
                stats.extend(read);
                unread = step + 1;
            }
            if self.stop_asked {
                break;
            }
        }
        Ok((stats, started.elapsed().as_secs_f64()))
    }
}

/// A step whose loss (or gradient norm) is not finite stops the run: the same error on every
/// rank (they all see the same averaged loss).
fn not_finite(step: u64, stats: &StepStats) -> Error {
    let msg = format!(
        "step {}: the loss ({}) or gradient norm ({}) is not finite: lower --lr",
        step + 1,
        stats.loss,
        stats.grad_norm
    );
    Error::Training(msg).on_every_rank()
}

/// Whether `mnist` runs [`FusedStep`]s: one rank and SGD (on any backend: on the CPU it
/// computes the generic step's values bit for bit, faster), unless `GPT2_MNIST_FUSED=0`.
pub fn fused_path(comm: &dyn Comm, optimizer: OptimizerKind) -> bool {
    let off = std::env::var("GPT2_MNIST_FUSED").is_ok_and(|v| v == "0");
    comm.size() == 1 && optimizer == OptimizerKind::Sgd && !off
}

/// Whether the fused step is recorded once and replayed (`GPT2_CUDA_GRAPH=0`: queued each
/// time, as GPT-2's trainer takes it).
pub fn replay_on() -> bool {
    !std::env::var("GPT2_CUDA_GRAPH").is_ok_and(|v| v == "0")
}

/// Seeds of `--synthetic`'s training and test sets (fixed: the same data whatever `--seed`).
const SYNTHETIC_SEEDS: (u64, u64) = (0x5eed_7a1d, 0x5eed_7e57);

/// The training and test sets: `--synthetic`'s made-up ones (60,000 and 10,000 images of
/// 28 × 28, made by every rank alike), or the files' (read by rank 0, sent to all).
pub fn load_sets(comm: &dyn Comm, run: &RunSettings) -> Result<(Dataset, Dataset)> {
    if run.synthetic {
        return Ok(synthetic_sets());
    }
    data::load(comm, &Files::new(run.files.as_ref()))
}

/// `--synthetic`'s training and test sets.
pub fn synthetic_sets() -> (Dataset, Dataset) {
    (
        synthetic::dataset(60_000, 28, SYNTHETIC_SEEDS.0),
        synthetic::dataset(10_000, 28, SYNTHETIC_SEEDS.1),
    )
}

/// The index of the largest value (the first of equals).
fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold(0, |best, (i, &x)| if x > row[best] { i } else { best })
}

/// The `mnist` subcommand without `--bench`: trains, tests after each epoch, prints the table,
/// and keeps `OUT/mlp.ckpt` (at a stop, at the end, and after an epoch once 30 s have passed
/// since the last) for `--resume`.
pub fn train<B: FusedMlp>(be: &B, comm: &dyn Comm, asked: &RunSettings) -> Result<()> {
    crate::stop::on_signals();
    let (train, test) = load_sets(comm, asked)?;
    let (world, b) = (comm.size(), asked.batch);
    check_batch(&train, b, world)?;
    let steps_per_epoch = (train.len() / b) as u64;
    let Some(total_steps) = asked.epochs.checked_mul(steps_per_epoch) else {
        let e = Error::Input(format!(
            "--epochs {} of {steps_per_epoch} steps each is too many steps",
            asked.epochs
        ));
        return Err(e.on_every_rank()); // the same flags everywhere: every rank is here
    };
    if let Some(n) = asked.stop_after.filter(|&n| n >= total_steps) {
        let e = Error::Input(format!(
            "--stop-after {n} is not before the run's last step {total_steps}: the run ends there anyway; leave it out"
        ));
        return Err(e.on_every_rank()); // the same flags everywhere: every rank is here
    }
    let config = mnist_config(asked.lr, total_steps, asked.weight_decay);
    let widths = widths(&train, &asked.hidden)?;
    let settings = Settings::of(asked, &widths, &train, &test);
    let resumed = match &asked.resume {
        Some(path) => Some(resume_from(comm, path, &settings, total_steps, asked.stop_after)?),
        None => None,
    };
    let trainer = MlpTrainer::new(be, comm, &widths, asked.optimizer, config, asked.momentum, asked.seed)?;
    let (start, log_state) = match &resumed {
        Some(ck) => {
            trainer.restore(&ck.params, &ck.state)?;
            (ck.meta.step, ck.meta.log)
        }
        None => (0, LogState::default()),
    };
    let fused = match fused_path(comm, asked.optimizer) {
        true => Some(FusedStep::new(
            be,
            &trainer.mlp,
            &train,
            b,
            steps_per_epoch as usize,
            replay_on(),
        )?),
        false => None,
    };

    let root = comm.is_root();
    let open_log = || {
        if asked.resume.is_none() {
            set_aside_earlier_run(&asked.out, &RUN_FILES)?;
        }
        LossLog::open_table(
            &asked.out,
            EpochRow::HEADER,
            asked.resume.is_some().then_some(log_state.rows),
        )
    };
    let log = agree(comm, root.then(open_log).transpose())?;
    let trace = match root && asked.trace {
        true => Some(Trace::open(be, asked, &trainer, &train, b, steps_per_epoch)?),
        false => None,
    };
    if root {
        let shape: Vec<String> = widths.iter().map(|w| w.to_string()).collect();
        let how = match (&fused, be.records()) {
            (Some(_), true) => " | fused step (data on the device, one graph replay a step, SGD inside backward)",
            (Some(_), false) => " | fused step (SGD inside backward)",
            (None, _) => "",
        };
        crate::say!(
            "{} | MLP {} ({} params) | {} lr {} | batch {b} over {world} rank(s) | {} training, {} test images | {steps_per_epoch} steps/epoch, {total_steps} steps{how}",
            be.name(),
            shape.join("→"),
            trainer.mlp.num_params(),
            asked.optimizer.shown(),
            config.lr,
            train.len(),
            test.len(),
        );
        if let Some(path) = &asked.resume {
            crate::say!("resuming {} at step {start} of {total_steps}", path.display());
        }
        crate::say!("{}", EpochRow::HEADER.replace('\t', "  "));
    }
    let mut run = MlpRun {
        trainer,
        fused,
        log,
        trace,
        train: &train,
        test: &test,
        seed: asked.seed,
        steps_per_epoch,
        ckpt: asked.out.join(checkpoint::FILE),
        meta: Meta {
            settings,
            step: start,
            log: log_state,
        },
        bar: progress::bar(root, total_steps, start),
        started: Instant::now(),
        saved: Instant::now(),
        order: Vec::new(),
        last: None,
    };
    let end = asked.stop_after.map_or(total_steps, |s| s.min(total_steps));
    while run.meta.step < end {
        // A failed write from here on (a full disk) is the run's failure, not bad input.
        if run.epoch(end).map_err(Error::during_run)? == Ended::Stopped {
            let how = run.saved_how();
            run.bar.abandon();
            let msg = format!("stopped after step {}; {how}", run.meta.step);
            return Err(Error::Interrupted(msg).on_every_rank());
        }
    }
    run.bar.finish_and_clear();
    if let Some(row) = run.last.filter(|_| end == total_steps) {
        crate::say!(
            "test accuracy {:.2}% after {} epochs ({:.1} s); table in {}",
            100.0 * row.test_accuracy,
            row.epoch,
            row.elapsed_s,
            asked.out.join("loss.tsv").display()
        );
    }
    if root && end < total_steps {
        crate::say!("stopped after step {end} as --stop-after asked; {}", run.saved_how());
    } else if root {
        crate::say!("saved {}", run.ckpt.display());
    }
    Ok(())
}

/// The files of a run in its `--out` that a new run there writes anew (the checkpoint last).
const RUN_FILES: [&str; 2] = ["loss.tsv", checkpoint::FILE];

/// Rank 0 reads the checkpoint to resume and every rank receives it, checked against this
/// run's settings (the same everywhere), its schedule and `--stop-after`.
fn resume_from(
    comm: &dyn Comm,
    path: &Path,
    settings: &Settings,
    total_steps: u64,
    stop_after: Option<u64>,
) -> Result<MlpCheckpoint> {
    let check = |ck: &MlpCheckpoint| {
        checkpoint::check_same_run(&ck.meta.settings, settings)?;
        let (shown, s) = (path.display(), ck.meta.step);
        if s > total_steps {
            crate::bail_input!("{shown}: cannot resume: the checkpoint counts {s} steps, its run has {total_steps}");
        }
        if s == total_steps {
            crate::bail_input!("{shown}: cannot resume: the checkpoint's run is finished (all {total_steps} steps)");
        }
        match stop_after {
            Some(n) if n <= s => crate::bail_input!(
                "--stop-after {n}: the checkpoint's run has done {s} steps already (--stop-after counts from the run's start)"
            ),
            _ => Ok(()),
        }
    };
    let bytes = from_root(comm, || {
        let bytes = checkpoint::read(path)?;
        check(&checkpoint::parse(&bytes, path)?)?;
        Ok(bytes)
    })?;
    // Rank 0's bytes, checked there: every rank makes the same checkpoint of them.
    checkpoint::parse(&bytes, path).map_err(Error::on_every_rank)
}

/// The longest a run goes without a checkpoint: one is written at the end of the first epoch
/// to end this long after the last (a stop and the run's end always write one). Not every
/// epoch: on one GPU an epoch of the default MLP takes about 60 ms, of the order of a file's
/// write and sync.
const SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// How an [`MlpRun::epoch`] ended.
#[derive(PartialEq)]
enum Ended {
    /// At the epoch's end or the run's (`--stop-after`).
    Ran,
    /// A stop was asked for: a checkpoint of the steps done is written.
    Stopped,
}

/// A training run under way: the trainer, the table and the checkpoint it keeps, where it
/// stands ([`Meta`]: the steps done, the open epoch's losses, the time so far).
struct MlpRun<'a, 'b, B: FusedMlp> {
    trainer: MlpTrainer<'a, B>,
    fused: Option<FusedStep<B>>,
    /// Rank 0's table, trace and checkpoint.
    log: Option<LossLog>,
    trace: Option<Trace>,
    train: &'b Dataset,
    test: &'b Dataset,
    seed: u64,
    steps_per_epoch: u64,
    ckpt: PathBuf,
    meta: Meta,
    bar: ProgressBar,
    started: Instant,
    /// When the last checkpoint was written (the run's start before the first).
    saved: Instant,
    /// The epoch's order of the training images (kept from one epoch to the next).
    order: Vec<usize>,
    /// The last row written.
    last: Option<EpochRow>,
}

impl<B: FusedMlp> MlpRun<'_, '_, B> {
    /// Training time, the resumed run's before this process included.
    fn elapsed(&self) -> f64 {
        self.meta.log.elapsed_s + self.started.elapsed().as_secs_f64()
    }

    /// Runs the steps from where the run stands to the end of their epoch (or to `end`):
    /// a row of the table at the epoch's end, a checkpoint at `end`, at a stop, and at an
    /// epoch's end once [`SAVE_EVERY`] has passed since the last.
    fn epoch(&mut self, end: u64) -> Result<Ended> {
        let (spe, b) = (self.steps_per_epoch, self.meta.settings.batch);
        let epoch = self.meta.step / spe;
        let steps = self.meta.step..((epoch + 1) * spe).min(end);
        let (bar, order) = (&self.bar, &mut self.order);
        let (stats, seconds) = match self.fused.as_mut() {
            Some(f) => self
                .trainer
                .run_fused(f, self.train, steps.clone(), self.seed, order, || bar.inc(1))?,
            None => self
                .trainer
                .run_generic(self.train, b, steps.clone(), self.seed, order, |st| {
                    bar.set_message(format!("epoch {} loss {:.4} lr {:.2e}", epoch + 1, st.loss, st.lr));
                    bar.inc(1);
                })?,
        };
        let window = &mut self.meta.log.window;
        for (_, st) in &stats {
            window.add(st.loss, false);
        }
        window.add_time(seconds);
        self.meta.step += stats.len() as u64;
        if self.meta.step == (epoch + 1) * spe {
            // Rank 0 alone writes them; every rank learns how that went (a full disk stops all).
            let written = self.close_epoch(epoch + 1, &stats);
            agree(self.trainer.comm, written)?;
        }
        // A stop asked for at an epoch's last step ends the run there too (not one step on).
        let stopped = self.trainer.stop_asked && self.meta.step < end;
        if stopped || self.meta.step == end || self.save_due()? {
            self.save()?;
        }
        Ok(if stopped { Ended::Stopped } else { Ended::Ran })
    }

    /// At the end of `epoch` (1-based), whose last `stats` these are: rank 0 traces the epoch,
    /// tests the model and writes its row from the epoch's window.
    fn close_epoch(&mut self, epoch: u64, stats: &[(u64, StepStats)]) -> Result<()> {
        if let Some(trace) = self.trace.as_mut() {
            let images = self.steps_per_epoch as usize * self.meta.settings.batch;
            trace.epoch(&self.order[..images], stats)?;
        }
        let (train_loss, _, samples_per_s) = self.meta.log.window.take(self.meta.settings.batch);
        let elapsed_s = self.elapsed();
        let Some(log) = self.log.as_mut() else {
            return Ok(());
        };
        let (test_loss, test_accuracy) = self.trainer.evaluate(self.test)?;
        let row = EpochRow {
            epoch,
            train_loss,
            test_loss,
            test_accuracy,
            samples_per_s,
            elapsed_s,
        };
        self.bar.suspend(|| crate::say!("{}", row.display()));
        log.append_line(&row.tsv())?;
        self.last = Some(row);
        Ok(())
    }

    /// Whether a checkpoint is due at this epoch's end: [`SAVE_EVERY`] has passed since the
    /// last one (or the start) by rank 0's clock, which every rank learns.
    fn save_due(&self) -> Result<bool> {
        let comm = self.trainer.comm;
        let mut due = [(comm.is_root() && self.saved.elapsed() >= SAVE_EVERY) as u8 as f32];
        if comm.size() > 1 {
            comm.all_reduce_sum_host(&mut due)?;
        }
        Ok(due[0] > 0.0)
    }

    /// Rank 0 writes the checkpoint of the steps done (every rank learns how the write went).
    fn save(&mut self) -> Result<()> {
        self.saved = Instant::now();
        let mut meta = self.meta.clone();
        meta.log.elapsed_s = self.elapsed();
        let written = match &self.log {
            Some(log) => {
                meta.log.rows = log.rows();
                self.trainer.state().and_then(|(params, state)| {
                    let state: Vec<&[f32]> = state.iter().map(Vec::as_slice).collect();
                    checkpoint::save(&self.ckpt, &meta, &params, &state)
                })
            }
            None => Ok(()),
        };
        agree(self.trainer.comm, written)
    }

    /// "saved OUT/mlp.ckpt (continue with ...)".
    fn saved_how(&self) -> String {
        format!(
            "saved {0} (continue with the same flags and --resume {0})",
            self.ckpt.display()
        )
    }
}

/// A global batch of `b` images must split evenly over the ranks and fit the training set
/// (the same on every rank: every rank refuses it together).
pub fn check_batch(train: &Dataset, b: usize, world: usize) -> Result<()> {
    if !b.is_multiple_of(world) || b > train.len() {
        let e = Error::Input(format!(
            "--batch {b} must divide over the {world} rank(s) and be at most the {} training images",
            train.len()
        ));
        return Err(e.on_every_rank());
    }
    Ok(())
}

/// The MLP's optimiser settings: `lr` decaying along a cosine to 0 over `total_steps`, no
/// warmup, no clipping; AdamW's betas 0.9, 0.999.
pub fn mnist_config(lr: f32, total_steps: u64, weight_decay: f32) -> OptimConfig {
    OptimConfig {
        lr,
        min_lr_frac: 0.0,
        warmup_steps: 0,
        total_steps,
        weight_decay,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        grad_clip: 0.0,
    }
}

/// Input width (the images'), `hidden`, the classes.
/// Refused when a layer's weight matrix would hold 2^31 values or more (as GPT-2's are: the
/// kernels index with 32-bit integers), before anything is allocated.
pub fn widths(train: &Dataset, hidden: &[usize]) -> Result<Vec<usize>> {
    let widths: Vec<usize> = std::iter::once(train.images.size())
        .chain(hidden.iter().copied())
        .chain([CLASSES])
        .collect();
    for pair in widths.windows(2) {
        if pair[0]
            .checked_mul(pair[1])
            .is_none_or(|n| n >= crate::backend::MAX_TENSOR_VALUES)
        {
            return Err(Error::Input(format!(
                "--hidden: a layer of {} by {} holds 2^31 weights or more (each must hold fewer)",
                pair[0], pair[1]
            ))
            .on_every_rank()); // the same flags everywhere: every rank is here
        }
    }
    Ok(widths)
}

/// `--trace`: what another framework needs to repeat the run step for step (rank 0 writes it).
struct Trace {
    dir: std::path::PathBuf,
    order: std::fs::File,
    steps: std::fs::File,
}

impl Trace {
    /// Writes the settings, the initial parameters and, for made-up data, the training set.
    fn open<B: Backend>(
        be: &B,
        asked: &RunSettings,
        trainer: &MlpTrainer<'_, B>,
        train: &Dataset,
        batch: usize,
        steps_per_epoch: u64,
    ) -> Result<Self> {
        use crate::error::io_err;
        use std::io::Write;
        let dir = asked.out.join("trace");
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let mut params = vec![0.0f32; trainer.mlp.num_params()];
        be.read(&trainer.mlp.params, 0, &mut params)?;
        // The settings and the initial parameters are replaced whole (a kill leaves the
        // earlier files or these); order.i32 and steps.tsv grow by whole epochs.
        let replace = |name: &str, bytes: &[u8]| crate::atomic_file::write(&dir.join(name), |f| f.write_all(bytes));
        replace("init.f32", bytemuck::cast_slice::<f32, u8>(&params))?;
        let settings = serde_json::json!({
            "widths": trainer.mlp.widths,
            "batch": batch,
            "steps_per_epoch": steps_per_epoch,
            "epochs": asked.epochs,
            "optimizer": asked.optimizer.name(),
            "lr": asked.lr,
            "momentum": asked.momentum,
            "weight_decay": asked.weight_decay,
            "seed": asked.seed,
            "synthetic": asked.synthetic,
            "device": be.name(),
            "layout": "per layer: weight (out, in) row-major, then bias (out); f32 little-endian",
        });
        replace("settings.json", format!("{settings:#}\n").as_bytes())?;
        if asked.synthetic {
            synthetic::write_idx(train, &dir.join("train-images.idx"), &dir.join("train-labels.idx"))?;
        }
        let create = |name: &str| {
            let path = dir.join(name);
            std::fs::File::create(&path).map_err(io_err(&path))
        };
        let (order, mut steps) = (create("order.i32")?, create("steps.tsv")?);
        writeln!(steps, "step\tlr\tloss").map_err(io_err(&dir.join("steps.tsv")))?;
        Ok(Trace { dir, order, steps })
    }

    /// An epoch's images (in step order) and its steps' learning rates and losses.
    fn epoch(&mut self, order: &[usize], stats: &[(u64, StepStats)]) -> Result<()> {
        use crate::error::io_err;
        use std::io::Write;
        let ids: Vec<i32> = order.iter().map(|&i| i as i32).collect();
        let path = |name: &str| self.dir.join(name);
        self.order
            .write_all(bytemuck::cast_slice(&ids))
            .map_err(io_err(path("order.i32")))?;
        let mut text = String::new();
        for (step, st) in stats {
            text += &format!("{step}\t{:e}\t{:e}\n", st.lr, st.loss);
        }
        let (steps, at) = (&mut self.steps, path("steps.tsv"));
        steps.write_all(text.as_bytes()).map_err(io_err(&at))?;
        steps.flush().map_err(io_err(at))
    }
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn argmax_takes_the_first_of_equals() {
        assert_eq!(argmax(&[0.0, 2.0, 2.0, -1.0]), 1);
        assert_eq!(argmax(&[5.0]), 0);
    }
}
