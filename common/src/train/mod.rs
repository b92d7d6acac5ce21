//! THE training loop, shared by all four stages, generic over the backend (CPU or GPU) and
//! the communicator (one process, MPI, NCCL). Rank 0 alone logs, evaluates, samples and
//! writes checkpoints; every rank runs the same optimiser step. `setup` prepares a run,
//! `trainer` holds the model and the step.

mod setup;
mod trainer;

pub use setup::{check_fits, validate_shape, Run};
pub use trainer::{StepReport, Trainer, TrainerSettings};

use crate::backend::Backend;
use crate::cli::TrainArgs;
use crate::comm::{agree, Comm};
use crate::error::{io_err, Error, Result};
use crate::generate::SampleOptions;
use crate::report::log::{LogState, LossLog, LossRow};
use crate::report::{progress, RunSummary};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// The `train` subcommand.
pub fn train<B: Backend>(be: &B, comm: &dyn Comm, args: &TrainArgs) -> Result<()> {
    install_interrupt_handler();
    let mut run = Run::prepare(be, comm, args)?;
    let root = comm.is_root();
    let keep_rows = args.resume.is_some().then_some(run.log_state.rows);
    let mut log = agree(comm, root.then(|| LossLog::open(&args.out, keep_rows)).transpose())?;
    if root {
        println!("{}\n{}", run.describe(), LossLog::header());
    }
    let ckpt = args.out.join("model.ckpt");
    let (b, t, world) = (run.batch, run.seq_len, comm.size());
    let bar = progress::bar(root, run.total_steps, run.start_step);
    // Time and the open window continue from the checkpoint when resuming.
    let (started, earlier_s, mut window) = (Instant::now(), run.log_state.elapsed_s, run.log_state.window);
    let elapsed = || earlier_s + started.elapsed().as_secs_f64();
    let (mut step_time, mut last_val, mut bad_in_a_row, mut saved_at) = (0.0, f32::NAN, 0, None);

    for step in run.start_step..run.total_steps {
        fail_if_asked(comm, step)?;
        let batch = run.loader.next_batch();
        let t0 = Instant::now();
        let s = run.trainer.step(&batch, b / world, t, step)?.stats;
        let dt = t0.elapsed().as_secs_f64();
        window.add(s.loss, s.skipped, dt);
        step_time += dt;
        bar.set_message(format!("loss {:.4} lr {:.2e} norm {:.2}", s.loss, s.lr, s.grad_norm));
        bar.inc(1);
        bad_in_a_row = if s.skipped { bad_in_a_row + 1 } else { 0 };
        if bad_in_a_row >= args.max_bad_steps {
            bar.abandon();
            return Err(diverged(bad_in_a_row, step, saved_at, &ckpt)); // every rank sees the same stats
        }

        let done = step + 1;
        let interrupted = interrupted(comm)?;
        let stop_early = interrupted || run.stop_after == Some(done);
        if done % run.eval_every == 0 || done == run.total_steps {
            let (train_loss, bad_steps, tokens_per_s) = window.take(b * t);
            if let Some(log) = log.as_mut() {
                last_val = run.trainer.evaluate(&run.eval_set, t)?;
                let (epoch, elapsed_s) = (run.loader.epochs_done(), elapsed());
                let row = LossRow {
                    epoch,
                    train_loss,
                    val_loss: last_val,
                    bad_steps,
                    tokens_per_s,
                    elapsed_s,
                };
                bar.suspend(|| println!("{}", row.display()));
                log.append(&row)?;
            }
        }
        let periodic = args.checkpoint_every > 0 && done % args.checkpoint_every == 0;
        if root && (periodic || done == run.total_steps || stop_early) {
            let state = LogState {
                rows: log.as_ref().map_or(0, LossLog::rows),
                elapsed_s: elapsed(),
                window,
            };
            run.trainer.save(&ckpt, &run.checkpoint_meta(done, &state))?;
            saved_at = Some(done);
        }
        if stop_early {
            bar.abandon();
            let how = format!("saved {0} (continue with --resume {0})", ckpt.display());
            if interrupted {
                return Err(Error::Interrupted(format!("stopped after step {done}; {how}")).on_every_rank());
            }
            if root {
                println!("stopped after step {done} as --stop-after asked; {how}");
            }
            return Ok(());
        }
    }
    bar.finish_and_clear();
    if root {
        println!("saved {}", ckpt.display());
        let tokens = ((run.total_steps - run.start_step) * (b * t) as u64) as f64;
        finish(&mut run, args, elapsed(), tokens / step_time, last_val)?;
    }
    Ok(())
}

/// The error that ends a run after `n` skipped steps in a row, naming the last checkpoint.
fn diverged(n: u64, step: u64, saved_at: Option<u64>, ckpt: &std::path::Path) -> Error {
    let last = match saved_at {
        Some(s) => format!("the last good checkpoint is {} (step {s})", ckpt.display()),
        None => "no checkpoint was written in this run".to_string(),
    };
    let msg = format!(
        "{n} steps in a row (to step {step}) had a non-finite loss or gradient norm and were skipped; \
         stopping: {last}. Lower --lr, or raise --max-bad-steps"
    );
    Error::Training(msg).on_every_rank()
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
