//! The `bench` subcommand: times training steps of a model on random tokens and prints
//! a JSON line last (tokens/s, ms/step, memory, GFLOP/s, MFU on GPUs, comm share);
//! `bench --generate` times generation instead (generate.rs), `bench --allreduce` the
//! communicator's sums (allreduce.rs).

mod allreduce;
mod generate;
mod kernels;

pub use allreduce::{allreduce, AllreduceRow};
pub use generate::{generate, GenerateReport};
pub use kernels::{kernels, KernelOpts, KernelRow, GPT2_PRODUCTS};

use crate::backend::Backend;
use crate::backend::Precision;
use crate::cli::BenchArgs;
use crate::comm::{agree, check_same_everywhere, Comm};
use crate::data::Batch;
use crate::error::Result;
use crate::model::ModelConfig;
use crate::optim::OptimConfig;
use crate::report::progress;
use crate::train::{check_fits, validate_shape, Trainer, TrainerSettings};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::time::Instant;

#[derive(Debug, serde::Serialize)]
pub struct BenchReport {
    pub device: String,
    pub model: String,
    pub params: usize,
    pub batch: usize,
    pub seq_len: usize,
    pub ranks: usize,
    pub steps: u64,
    pub tokens_per_s: f64,
    pub ms_per_step: f64,
    /// Of `ms_per_step`: time in gradient communication (0 on one process).
    pub comm_ms_per_step: f64,
    pub compute_ms_per_step: f64,
    /// One step's gradient sums timed alone after the run, as the steps make them (by
    /// bucket, in bf16, as set), the host waiting for them (0 on one process): what a step
    /// would add were none of it hidden behind computing.
    pub sums_alone_ms: f64,
    /// How ZeRO-1's all-gathers ran, where the communicator has more than one way (stage 3:
    /// "copy engines" or "thread blocks"); null elsewhere.
    pub gather: Option<&'static str>,
    pub peak_rss_mb: f64,
    /// Device memory high-water mark (GPU backends; equals RSS on the CPU).
    pub peak_device_mb: f64,
    /// AdamW's moments kept by each rank (1/N of the whole under `--zero 1`), MiB.
    pub optimizer_state_mb: f64,
    pub gflops: f64,
    /// Model FLOPs utilisation against the device's dense peak (GPU only).
    pub mfu: Option<f64>,
    pub final_loss: f32,
}

/// The model to time, once its flags are checked.
fn bench_model(args: &BenchArgs) -> Result<ModelConfig> {
    let config = args.model.config(args.vocab)?;
    validate_shape(&config, args.batch, args.seq_len, 1)?;
    if args.steps == 0 {
        crate::bail_input!("--steps must be at least 1");
    }
    Ok(config)
}

/// Dense peak FLOP/s of the GPU named `device` at `precision`, when known.
pub fn gpu_peak_flops(device: &str, precision: Precision) -> Option<f64> {
    // H100 / H200 SXM datasheet dense figures (the same chip): fp32 67 TF, tf32 495 TF,
    // bf16 989 TF.
    let hopper = device.contains("H100") || device.contains("H200");
    hopper.then_some(match precision {
        Precision::Fp32 => 67e12,
        Precision::Tf32 => 495e12,
        Precision::Bf16 => 989e12,
    })
}

pub fn bench<B: Backend>(be: &B, comm: &dyn Comm, args: &BenchArgs, is_gpu: bool) -> Result<BenchReport> {
    let mut same_everywhere = args.clone();
    same_everywhere.device.threads = None; // may differ per host; timings only
    check_same_everywhere(comm, &format!("bench {same_everywhere:?}"))?;
    let (b, t, world) = (args.batch, args.seq_len, comm.size());
    let config = agree(comm, bench_model(args))?;
    let optim = OptimConfig {
        min_lr_frac: 1.0, // a constant rate
        ..OptimConfig::gpt2(1e-4, 0, args.warmup + args.steps)
    };
    agree(comm, check_fits(be, &config, (b, t), 1, args.device.fp8()))?;
    let sync = args.sync.mode();
    let settings = TrainerSettings {
        optim,
        sync,
        micro_batches: 1,
        recompute: args.recompute,
        zero: args.sync.zero(),
        grad_comm: args.sync.grad_comm(),
        fp8: args.device.fp8(),
    };
    let mut trainer = Trainer::new(be, comm, config, settings)?;
    trainer.init_weights(1)?;
    let mut rng = ChaCha8Rng::seed_from_u64(comm.rank() as u64);
    let mut random_batch = || {
        let ids: Vec<i32> = (0..b * t + 1)
            .map(|_| (rng.next_u32() % args.vocab as u32) as i32)
            .collect();
        Batch {
            inputs: ids[..b * t].to_vec(),
            targets: ids[1..].to_vec(),
        }
    };
    let root = comm.is_root();
    let bar = progress::bar(root, args.warmup + args.steps, 0);
    for step in 0..args.warmup {
        trainer.step(&random_batch(), b, t, step)?;
        bar.inc(1);
    }
    be.synchronize()?;
    be.profile_range(true)?; // the measured steps, for a profiler that waits for them
    let (mut comm_s, mut loss) = (0.0, 0.0);
    let started = Instant::now();
    for step in args.warmup..args.warmup + args.steps {
        let r = trainer.step(&random_batch(), b, t, step)?;
        comm_s += r.comm_s;
        loss = r.finished.last().map_or(loss, |(_, s)| s.loss);
        bar.inc(1);
    }
    be.synchronize()?;
    let secs = started.elapsed().as_secs_f64();
    be.profile_range(false)?;
    loss = trainer.flush()?.last().map_or(loss, |(_, s)| s.loss);
    let sums_alone_s = trainer.time_gradient_sums(5)?;
    bar.finish_and_clear();
    let steps = args.steps as f64;
    let tokens_per_s = (b * t * world) as f64 * steps / secs;
    let flops = config.flops_per_token(t) * tokens_per_s;
    let rss = crate::backend::cpu::peak_rss_bytes() as f64 / (1 << 20) as f64;
    let device = be.name();
    Ok(BenchReport {
        model: args.model.preset.clone().unwrap_or_else(|| "char".into()),
        params: config.num_params(),
        batch: b,
        seq_len: t,
        ranks: world,
        steps: args.steps,
        tokens_per_s,
        ms_per_step: secs * 1e3 / steps,
        comm_ms_per_step: comm_s * 1e3 / steps,
        compute_ms_per_step: (secs - comm_s) * 1e3 / steps,
        sums_alone_ms: sums_alone_s * 1e3,
        gather: comm.gather_means(),
        peak_rss_mb: rss,
        peak_device_mb: be.peak_memory_bytes() as f64 / (1 << 20) as f64,
        optimizer_state_mb: trainer.optimizer_state_bytes() as f64 / (1 << 20) as f64,
        gflops: flops / 1e9,
        mfu: if is_gpu {
            gpu_peak_flops(&device, args.device.precision()).map(|p| flops / world as f64 / p)
        } else {
            None
        },
        final_loss: loss,
        device,
    })
}
