//! The `mnist` subcommand: the MLP trained epoch by epoch on any backend and communicator,
//! the same way `train` runs GPT-2. Rank 0 reads the data and every rank receives it; each
//! rank takes its share of every global batch and the gradients are summed over ranks
//! ([`GradSync`]), so every rank applies the same update and stage 1 reproduces stage 0.
//! After each epoch rank 0 evaluates the test set and writes a row of `OUT/loss.tsv`.

use super::data::{self, Dataset, Files, CLASSES};
use super::mlp::Mlp;
use crate::autograd::{Graph, Pool};
use crate::backend::Backend;
use crate::cli::{MnistArgs, OptimizerFlag};
use crate::comm::{check_same_everywhere, Comm};
use crate::error::{Error, Result};
use crate::grad_sync::{GradSync, SyncMode};
use crate::optim::{AdamW, OptimConfig, Optimizer, Sgd, StepStats};
use crate::report::log::{LossLog, Window};
use crate::report::progress;
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
}

impl<'a, B: Backend> MlpTrainer<'a, B> {
    /// An MLP of `widths`, initialised from `seed` (the same on every rank).
    pub fn new(
        be: &'a B,
        comm: &'a dyn Comm,
        widths: &[usize],
        optimizer: OptimizerFlag,
        config: OptimConfig,
        momentum: f32,
        seed: u64,
    ) -> Result<Self> {
        let mlp = Mlp::new(be, widths)?;
        mlp.init_weights(be, seed)?;
        let (n, segments) = (mlp.num_params(), mlp.decay_segments());
        let opt = match optimizer {
            OptimizerFlag::Sgd => Optimizer::Sgd(Sgd::new(be, n, segments, config, momentum)?),
            OptimizerFlag::Adamw => Optimizer::AdamW(AdamW::with_segments(be, n, segments, config)?),
        };
        Ok(MlpTrainer {
            be,
            comm,
            sync: GradSync::whole(SyncMode::Allreduce, n),
            mlp,
            opt,
            pool: Pool::default(),
        })
    }

    /// One optimiser step (0-based `step`) on this rank's `rows` images: forward, backward,
    /// gradients summed over ranks, the update. The loss is averaged over ranks; a non-finite
    /// one stops the run (every rank sees the same).
    pub fn step(&mut self, pixels: &[f32], labels: &[i32], rows: usize, step: u64) -> Result<StepStats> {
        let (be, comm) = (self.be, self.comm);
        self.opt.begin_step(be, step)?;
        be.zero_buffer(&self.mlp.grads);
        {
            let mut g = Graph::new(be, &mut self.pool, true);
            let (_, loss) = self.mlp.forward(&mut g, pixels, rows, Some(labels))?;
            let loss = loss.expect("labels given");
            self.sync.backward(&mut g, loss, comm, &self.mlp.grads, (0, 1))?;
            let (slot, at) = self.opt.meter().loss_slot();
            g.copy_into(loss, slot, at, false)?;
        }
        let (n, config) = (self.mlp.num_params(), *self.opt.config());
        let meter = self.opt.meter();
        meter.finish_gradients(be, &self.mlp.grads, n, config.grad_clip, 1.0)?;
        let (mut loss, norm) = meter.read_loss_and_norm(be)?;
        if comm.size() > 1 {
            let mut v = [loss];
            comm.all_reduce_sum_host(&mut v)?;
            loss = v[0] / comm.size() as f32;
        }
        let stats = StepStats::of(&config, step, loss, norm);
        if stats.skipped {
            let msg = format!(
                "step {}: the loss ({}) or gradient norm ({}) is not finite: lower --lr",
                step + 1,
                stats.loss,
                stats.grad_norm
            );
            return Err(Error::Training(msg).on_every_rank());
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
}

/// The index of the largest value (the first of equals).
fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold(0, |best, (i, &x)| if x > row[best] { i } else { best })
}

/// The `mnist` subcommand.
pub fn train<B: Backend>(be: &B, comm: &dyn Comm, args: &MnistArgs) -> Result<()> {
    // The same flags and binary on every rank (the thread count aside).
    let mut same_everywhere = args.clone();
    same_everywhere.device.threads = None;
    check_same_everywhere(comm, &format!("mnist {same_everywhere:?}"))?;
    // The same flags everywhere: every rank refuses them together.
    let momentum = args.momentum().map_err(Error::on_every_rank)?;
    let (train, test) = data::load(comm, &Files::from_args(args))?;
    let (world, b) = (comm.size(), args.batch);
    if !b.is_multiple_of(world) || b > train.len() {
        let e = Error::Input(format!(
            "--batch {b} must divide over the {world} rank(s) and be at most the {} training images",
            train.len()
        ));
        return Err(e.on_every_rank());
    }
    let steps_per_epoch = (train.len() / b) as u64;
    let total_steps = args.epochs * steps_per_epoch;
    let config = OptimConfig {
        lr: args.lr(),
        min_lr_frac: 0.0,
        warmup_steps: 0,
        total_steps,
        weight_decay: args.weight_decay,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        grad_clip: 0.0,
    };
    let widths: Vec<usize> = std::iter::once(train.images.size())
        .chain(args.hidden.iter().copied())
        .chain([CLASSES])
        .collect();
    let mut trainer = MlpTrainer::new(be, comm, &widths, args.optimizer, config, momentum, args.seed)?;

    let root = comm.is_root();
    let mut log = match root {
        true => Some(LossLog::open_table(&args.out, EpochRow::HEADER, None)?),
        false => None,
    };
    if root {
        let shape: Vec<String> = widths.iter().map(|w| w.to_string()).collect();
        println!(
            "{} | MLP {} ({} params) | {:?} lr {} | batch {b} over {world} rank(s) | {} training, {} test images | {steps_per_epoch} steps/epoch, {total_steps} steps",
            be.name(),
            shape.join("→"),
            trainer.mlp.num_params(),
            args.optimizer,
            config.lr,
            train.len(),
            test.len(),
        );
        println!("{}", EpochRow::HEADER.replace('\t', "  "));
    }
    let bar = progress::bar(root, total_steps, 0);
    let (started, local) = (Instant::now(), b / world);
    let (mut order, mut pixels, mut labels) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    for epoch in 0..args.epochs {
        crate::data::epoch_order(&mut order, train.len(), args.seed, epoch);
        let mut window = Window::default();
        for s in 0..steps_per_epoch as usize {
            let step = epoch * steps_per_epoch + s as u64;
            let mine = &order[s * b + comm.rank() * local..][..local];
            pixels.clear();
            labels.clear();
            train.gather(mine, &mut pixels, &mut labels);
            let t0 = Instant::now();
            let stats = trainer.step(&pixels, &labels, local, step)?;
            window.add(stats.loss, false);
            window.add_time(t0.elapsed().as_secs_f64());
            bar.set_message(format!(
                "epoch {} loss {:.4} lr {:.2e}",
                epoch + 1,
                stats.loss,
                stats.lr
            ));
            bar.inc(1);
        }
        let (train_loss, _, samples_per_s) = window.take(b);
        if let Some(log) = log.as_mut() {
            let (test_loss, test_accuracy) = trainer.evaluate(&test)?;
            let row = EpochRow {
                epoch: epoch + 1,
                train_loss,
                test_loss,
                test_accuracy,
                samples_per_s,
                elapsed_s: started.elapsed().as_secs_f64(),
            };
            bar.suspend(|| println!("{}", row.display()));
            log.append_line(&row.tsv())?;
            last = Some(row);
        }
    }
    bar.finish_and_clear();
    if let Some(row) = last {
        println!(
            "test accuracy {:.2}% after {} epochs ({:.1} s); table in {}",
            100.0 * row.test_accuracy,
            row.epoch,
            row.elapsed_s,
            args.out.join("loss.tsv").display()
        );
    }
    Ok(())
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
