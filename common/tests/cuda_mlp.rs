//! The MLP's fused step on the GPU (`mnist/fused.rs`: the data set on the device, one CUDA graph
//! replay a step, SGD inside backward) against the generic step (autograd, then the SGD pass) on
//! the GPU and against the CPU, over three epochs of 784→128→128→128→10 at batch 32 on made-up
//! MNIST-shaped data; replayed against queued (bit for bit); bf16 against its generic step.
//! Every comparison prints one `MLP-PARITY` line (the largest differences) for the device log.
//! Needs a CUDA device: run with `--include-ignored` on a GPU machine.
#![cfg(feature = "cuda")]

mod support;

use common::backend::cpu::CpuBackend;
use common::backend::cuda::CudaBackend;
use common::backend::{Backend, DeviceBuffer, FusedMlp, Precision};
use common::comm::Single;
use common::mnist::data::Dataset;
use common::mnist::fused::FusedStep;
use common::mnist::synthetic;
use common::mnist::train::{mnist_config, MlpTrainer};
use common::mnist::OptimizerKind;
use common::optim::Optimizer;

const WIDTHS: [usize; 5] = [784, 128, 128, 128, 10];
const BATCH: usize = 32;
const EPOCHS: u64 = 3;
const SEED: u64 = 1337;

fn gpu(precision: Precision) -> CudaBackend {
    CudaBackend::new(0, precision).unwrap_or_else(|e| panic!("CUDA backend: {e}"))
}

/// 1,024 made-up images of 28 × 28: 32 steps an epoch at batch 32.
fn set() -> Dataset {
    synthetic::dataset(1024, 28, 5)
}

/// What a run leaves: every step's loss, the final parameters and momentum.
struct Run {
    losses: Vec<f32>,
    params: Vec<f32>,
    velocity: Vec<f32>,
}

fn read<B: Backend>(be: &B, buf: &B::Buffer<f32>) -> Vec<f32> {
    let mut host = vec![0.0; buf.len()];
    be.read(buf, 0, &mut host).unwrap();
    host
}

/// `EPOCHS` epochs of SGD from the seeded initialisation: the fused step (`record`: replayed)
/// or the generic one.
fn run<B: FusedMlp>(be: &B, set: &Dataset, fused: Option<bool>) -> Run {
    let steps = (set.len() / BATCH) as u64;
    let config = mnist_config(0.05, EPOCHS * steps, 0.0);
    let mut t = MlpTrainer::new(be, &Single, &WIDTHS, OptimizerKind::Sgd, config, 0.9, SEED).unwrap();
    let mut order = Vec::new();
    let all = 0..EPOCHS * steps;
    let (stats, _) = match fused {
        Some(record) => {
            let mut f = FusedStep::new(be, &t.mlp, set, BATCH, steps as usize, record).unwrap();
            let out = t.run_fused(&mut f, set, all, SEED, &mut order, || ()).unwrap();
            assert_eq!(f.replaying(), record && be.records(), "replayed as asked");
            out
        }
        None => t.run_generic(set, BATCH, all, SEED, &mut order, |_| ()).unwrap(),
    };
    let Optimizer::Sgd(sgd) = &t.opt else { unreachable!() };
    Run {
        losses: stats.iter().map(|(_, s)| s.loss).collect(),
        params: read(be, &t.mlp.params),
        velocity: read(be, &sgd.velocity),
    }
}

/// (largest loss difference, largest parameter difference over the largest parameter).
fn compare(what: &str, a: &Run, b: &Run) -> (f32, f32) {
    assert_eq!(a.losses.len(), b.losses.len());
    let loss = a
        .losses
        .iter()
        .zip(&b.losses)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    let scale = b.params.iter().map(|x| x.abs()).fold(0.0, f32::max);
    let param = a
        .params
        .iter()
        .zip(&b.params)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale;
    println!(
        "MLP-PARITY {what}: {} steps, max |loss diff| {loss:.3e}, max |param diff| / max |param| {param:.3e}, final losses {:.5} / {:.5}",
        a.losses.len(),
        a.losses.last().unwrap(),
        b.losses.last().unwrap()
    );
    (loss, param)
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_fused_step_matches_the_generic_step_on_the_gpu() {
    let _gpu = support::one_at_a_time();
    let set = set();
    let generic = run(&gpu(Precision::Fp32), &set, None);
    assert!(generic.losses.last() < generic.losses.first(), "the generic run learns");
    let fused = run(&gpu(Precision::Fp32), &set, Some(true));
    let what = "fp32 fused vs generic on the GPU";
    let (loss, param) = compare(what, &fused, &generic);
    assert!(loss < 1e-4 && param < 1e-4, "{what}: {loss:e} {param:e}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_fused_step_on_the_gpu_matches_the_cpu() {
    let _gpu = support::one_at_a_time();
    let set = set();
    let cpu = run(&CpuBackend::new(0).unwrap(), &set, None);
    let fused = run(&gpu(Precision::Fp32), &set, Some(true));
    let (loss, param) = compare("fp32 fused on the GPU vs generic on the CPU", &fused, &cpu);
    assert!(loss < 1e-3 && param < 1e-3, "{loss:e} {param:e}");
}

/// The recording replays exactly what the queued ops compute (the step counter, the epoch's
/// order and schedule all read on the device).
#[test]
#[ignore = "needs a CUDA device"]
fn a_replayed_step_computes_what_the_queued_step_computes_bit_for_bit() {
    let _gpu = support::one_at_a_time();
    let set = set();
    let be = gpu(Precision::Fp32);
    let (replayed, queued) = (run(&be, &set, Some(true)), run(&be, &set, Some(false)));
    compare("fp32 fused replayed vs queued", &replayed, &queued);
    assert_eq!(replayed.losses, queued.losses);
    assert_eq!(replayed.params, queued.params);
    assert_eq!(replayed.velocity, queued.velocity);
    let again = run(&be, &set, Some(true));
    assert_eq!(again.params, replayed.params, "the same run twice: the same weights");
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_fused_step_tracks_its_generic_step() {
    let _gpu = support::one_at_a_time();
    let set = set();
    let be = gpu(Precision::Bf16);
    let (fused, generic) = (run(&be, &set, Some(true)), run(&be, &set, None));
    // Both round activations and their gradients to bf16, at other points of other sums.
    let (loss, _) = compare("bf16 fused vs generic on the GPU", &fused, &generic);
    assert!(loss < 0.05, "{loss:e}");
}
