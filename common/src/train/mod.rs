//! THE training loop, shared by all four stages, generic over the backend (CPU or GPU) and
//! the communicator (one process, MPI, NCCL). Rank 0 alone logs, evaluates, samples and
//! writes checkpoints; every rank runs the same optimiser step. `setup` prepares a run,
//! `trainer` holds the model and the step.

mod setup;
mod trainer;

pub use setup::{validate_shape, Run};
pub use trainer::{StepReport, Trainer, TrainerSettings};

use crate::backend::Backend;
use crate::cli::TrainArgs;
use crate::comm::{agree, Comm};
use crate::error::{io_err, Error, Result};
use crate::generate::SampleOptions;
use crate::report::log::{LossLog, LossRow, Window};
use crate::report::{progress, RunSummary};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// The `train` subcommand.
pub fn train<B: Backend>(be: &B, comm: &dyn Comm, args: &TrainArgs) -> Result<()> {
    install_interrupt_handler();
    let mut run = Run::prepare(be, comm, args)?;
    let root = comm.is_root();
    let mut log = agree(
        comm,
        root.then(|| LossLog::open(&args.out, args.resume.is_some()))
            .transpose(),
    )?;
    if root {
        println!("{}\n{}", run.describe(), LossLog::header());
    }
    let ckpt_path = args.out.join("model.ckpt");
    let (b, t, world) = (run.batch, run.seq_len, comm.size());
    let bar = progress::bar(root, run.total_steps, run.start_step);
    let (started, mut window, mut step_time, mut last_val) = (Instant::now(), Window::default(), 0.0, f32::NAN);

    for step in run.start_step..run.total_steps {
        fail_if_asked(comm, step)?;
        let batch = run.loader.next_batch();
        let t0 = Instant::now();
        let report = run.trainer.step(&batch, b / world, t, step)?;
        let (loss, dt) = (report.stats.loss, t0.elapsed().as_secs_f64());
        window.add(loss, dt);
        step_time += dt;
        let s = report.stats;
        bar.set_message(format!("loss {loss:.4} lr {:.2e} norm {:.2}", s.lr, s.grad_norm));
        bar.inc(1);
        if !loss.is_finite() {
            // The loss is averaged over ranks: every rank stops here together.
            let e = Error::Device(format!("loss became {loss} at step {step}: lower --lr"));
            return Err(e.on_every_rank());
        }

        let done = step + 1;
        let stop = interrupted(comm)?;
        if done % run.eval_every == 0 || done == run.total_steps || stop {
            let (train_loss, tokens_per_s) = window.take(b * t);
            if let Some(log) = log.as_mut() {
                last_val = run.trainer.evaluate(&run.eval_set, t)?;
                let (epoch, elapsed_s) = (run.loader.epochs_done(), started.elapsed().as_secs_f64());
                let row = LossRow {
                    epoch,
                    train_loss,
                    val_loss: last_val,
                    tokens_per_s,
                    elapsed_s,
                };
                bar.suspend(|| println!("{}", row.display()));
                log.append(&row)?;
            }
        }
        let periodic = args.checkpoint_every > 0 && done % args.checkpoint_every == 0;
        if root && (periodic || done == run.total_steps || stop) {
            run.trainer.save(&ckpt_path, &run.checkpoint_meta(done))?;
        }
        if stop {
            bar.abandon();
            let shown = ckpt_path.display();
            let e = Error::Interrupted(format!(
                "stopped after step {done}; saved {shown} (continue with --resume {shown})"
            ));
            return Err(e.on_every_rank());
        }
    }
    bar.finish_and_clear();
    if root {
        println!("saved {}", ckpt_path.display());
        let tokens = ((run.total_steps - run.start_step) * (b * t) as u64) as f64;
        finish(
            &mut run,
            args,
            started.elapsed().as_secs_f64(),
            tokens / step_time,
            last_val,
        )?;
    }
    Ok(())
}

/// Rank 0, after the last step: the sample, and `OUT/summary.json` for `report`.
fn finish<B: Backend>(
    run: &mut Run<B>,
    args: &TrainArgs,
    train_time_s: f64,
    tokens_per_s: f64,
    val: f32,
) -> Result<()> {
    let mut summary = RunSummary {
        device: run.trainer.be.name(),
        ranks: run.trainer.comm.size(),
        params: run.config.num_params(),
        batch: run.batch,
        seq_len: run.seq_len,
        steps: run.total_steps,
        train_time_s,
        train_tokens_per_s: tokens_per_s,
        final_val_loss: val,
        ..Default::default()
    };
    if args.sample_len > 0 {
        let opts = SampleOptions {
            max_new_tokens: args.sample_len,
            greedy: false,
            temperature: 0.8,
            top_k: 40,
            seed: run.seed,
            context: run.seq_len,
        };
        let started = Instant::now();
        summary.sample = run.trainer.sample(&run.tok, "\n", &opts)?;
        (summary.sample_tokens, summary.sample_time_s) = (args.sample_len, started.elapsed().as_secs_f64());
        println!("---- sample ----\n{}\n----------------", summary.sample);
    }
    let path = args.out.join("summary.json");
    let json = serde_json::to_string_pretty(&summary).expect("plain data serialises");
    std::fs::write(&path, json).map_err(io_err(&path))
}

/// Set by Ctrl-C; the loop saves a checkpoint and stops at the end of the current step.
static STOP: AtomicBool = AtomicBool::new(false);

fn install_interrupt_handler() {
    // A second handler is refused; one is enough (tests train several times in a process).
    let _ = ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst));
}

/// Has any rank been interrupted? (Agreed over all ranks so they stop at the same step.)
fn interrupted(comm: &dyn Comm) -> Result<bool> {
    let mut v = [STOP.load(Ordering::SeqCst) as u8 as f32];
    comm.all_reduce_sum_host(&mut v)?;
    Ok(v[0] > 0.0)
}

/// Test hook for failure handling: `GPT2RS_FAIL_RANK=r GPT2RS_FAIL_AT_STEP=s` makes rank
/// r exit(1) at once when it reaches step s, without telling the other ranks, as a crashed
/// process would; with `GPT2RS_FAIL_MODE=error` it returns an error instead (an error on
/// one rank alone), with `panic` it panics (a bug). The stage 1 tests check that the job
/// then ends, and never hangs.
fn fail_if_asked(comm: &dyn Comm, step: u64) -> Result<()> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if var("GPT2RS_FAIL_RANK") != Some(comm.rank() as u64) || var("GPT2RS_FAIL_AT_STEP") != Some(step) {
        return Ok(());
    }
    let why = format!("failing on purpose at step {step} (GPT2RS_FAIL_RANK test hook)");
    match std::env::var("GPT2RS_FAIL_MODE").as_deref() {
        Ok("error") => return Err(Error::Device(why)),
        Ok("panic") => panic!("{}: {why}", comm.describe()),
        _ => {}
    }
    eprintln!("{}: {why}", comm.describe());
    std::process::exit(1);
}
