//! `mnist --bench`: training steps of the MLP timed on MNIST-shaped images (made up unless the
//! four files are given), through the same step runners as `mnist` (the fused step on one rank
//! with SGD, GPU or CPU, else the generic one). One JSON line per shape on stdout (`--sweep`: batch 32, 128,
//! 512 × three hidden layers of 64, 256, 1024); a readable line per shape on stderr.

use super::data::Dataset;
use super::fused::FusedStep;
use super::train::{check_batch, fused_path, load_sets, mnist_config, replay_on, widths, MlpTrainer};
use super::{BenchSettings, RunSettings};
use crate::backend::FusedMlp;
use crate::comm::Comm;
use crate::error::{Error, Result};
use std::time::Instant;

/// Batches and hidden widths of `--sweep` (three hidden layers of each width).
pub const SWEEP_BATCHES: [usize; 3] = [32, 128, 512];
pub const SWEEP_WIDTHS: [usize; 3] = [64, 256, 1024];
/// Hidden layers of each sweep shape.
const SWEEP_LAYERS: usize = 3;

/// One timed shape.
#[derive(Debug, serde::Serialize)]
pub struct MlpBenchRow {
    pub device: String,
    pub precision: String,
    /// `fused` (one replay of the recorded step a step), `fused-queued` (the fused step's ops
    /// queued each step: the CPU, which records nothing, or `GPT2_CUDA_GRAPH=0`) or `generic`
    /// (autograd, then the SGD pass: several ranks, AdamW, or `GPT2_MNIST_FUSED=0`).
    pub path: String,
    /// Input, hidden layers, classes.
    pub widths: Vec<usize>,
    pub params: usize,
    /// Global batch, in images.
    pub batch: usize,
    pub ranks: usize,
    pub warmup: u64,
    pub steps: u64,
    pub seconds: f64,
    pub steps_per_s: f64,
    pub samples_per_s: f64,
    pub us_per_step: f64,
    /// The last timed step's loss.
    pub final_loss: f32,
}

/// `mnist --bench` (and `--sweep`): `timed`'s steps of `asked`'s MLP.
pub fn bench<B: FusedMlp>(be: &B, comm: &dyn Comm, asked: &RunSettings, timed: &BenchSettings) -> Result<()> {
    let train = match asked.files.is_some() || asked.synthetic {
        true => load_sets(comm, asked)?.0,
        false => super::train::synthetic_sets().0,
    };
    let world = comm.size();
    if timed.sweep && SWEEP_BATCHES.iter().any(|b| !b.is_multiple_of(world)) {
        // The sweep's batches are fixed: only the rank count can change.
        let fit = crate::comm::ranks_dividing(&SWEEP_BATCHES);
        return Err(Error::Input(format!(
            "--sweep's batches {SWEEP_BATCHES:?} do not divide over {world} ranks: run it on {fit}"
        ))
        .on_every_rank());
    }
    let shapes: Vec<(usize, Vec<usize>)> = match timed.sweep {
        true => SWEEP_BATCHES
            .iter()
            .flat_map(|&b| SWEEP_WIDTHS.iter().map(move |&w| (b, vec![w; SWEEP_LAYERS])))
            .collect(),
        false => vec![(asked.batch, asked.hidden.clone())],
    };
    for (batch, hidden) in shapes {
        let row = time_shape(be, comm, (asked, timed), &train, batch, &hidden)?;
        if comm.is_root() {
            eprintln!(
                "{} | {} | MLP {:?} batch {} | {:.1} us/step, {:.0} steps/s, {:.0} samples/s | loss {:.4}",
                row.device,
                row.path,
                row.widths,
                row.batch,
                row.us_per_step,
                row.steps_per_s,
                row.samples_per_s,
                row.final_loss
            );
            crate::say!("{}", serde_json::to_string(&row).expect("plain data serialises"));
        }
    }
    Ok(())
}

/// `timed.warmup` untimed steps, then `timed.steps` timed ones of one shape, from a fresh model.
fn time_shape<B: FusedMlp>(
    be: &B,
    comm: &dyn Comm,
    (asked, timed): (&RunSettings, &BenchSettings),
    train: &Dataset,
    batch: usize,
    hidden: &[usize],
) -> Result<MlpBenchRow> {
    check_batch(train, batch, comm.size())?;
    let (warmup, steps) = (timed.warmup, timed.steps);
    let config = mnist_config(asked.lr, warmup + steps, asked.weight_decay);
    let widths = widths(train, hidden)?;
    let mut trainer = MlpTrainer::new(be, comm, &widths, asked.optimizer, config, asked.momentum, asked.seed)?;
    let steps_per_epoch = train.len() / batch;
    let replay = replay_on();
    let mut fused = match fused_path(comm, asked.optimizer) {
        true => Some(FusedStep::new(be, &trainer.mlp, train, batch, steps_per_epoch, replay)?),
        false => None,
    };
    let mut order = Vec::new();
    let mut run = |range: std::ops::Range<u64>| match fused.as_mut() {
        Some(f) => trainer.run_fused(f, train, range, asked.seed, &mut order, || ()),
        None => trainer.run_generic(train, batch, range, asked.seed, &mut order, |_| ()),
    };
    run(0..warmup)?;
    be.synchronize()?;
    let started = Instant::now();
    let (stats, _) = run(warmup..warmup + steps)?;
    be.synchronize()?;
    let seconds = started.elapsed().as_secs_f64();
    let path = match (&fused, replay && be.records()) {
        (Some(_), true) => "fused",
        (Some(_), false) => "fused-queued",
        (None, _) => "generic",
    };
    Ok(MlpBenchRow {
        device: be.name(),
        precision: be.precision().name().into(),
        path: path.into(),
        params: trainer.mlp.num_params(),
        widths,
        batch,
        ranks: comm.size(),
        warmup,
        steps,
        seconds,
        steps_per_s: steps as f64 / seconds,
        samples_per_s: (steps as usize * batch) as f64 / seconds,
        us_per_step: seconds * 1e6 / steps as f64,
        final_loss: stats.last().map_or(f32::NAN, |(_, s)| s.loss),
    })
}
