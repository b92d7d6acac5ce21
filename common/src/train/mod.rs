//! THE training loop, shared by all four stages, generic over the backend (CPU or GPU) and
//! the communicator (one process, MPI, NCCL). Rank 0 alone logs, evaluates, samples and
//! writes checkpoints; every rank runs the same optimiser step. `setup` prepares a run,
//! `trainer` holds the model and the step (recorded once and replayed:
//! [`crate::backend::replay`]).

pub mod dump;
#[cfg(feature = "fault-injection")]
mod fault;
mod session;
mod setup;
mod trainer;

pub use dump::{BatchDump, DumpMeta};
pub use setup::{check_fits, check_heads, validate_shape, Run};
pub use trainer::{StepReport, Trainer, TrainerSettings};

use crate::backend::Backend;
use crate::cli::TrainArgs;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::generate::SampleOptions;
use crate::report::RunSummary;
use session::Session;
use std::time::Instant;

/// The `train` subcommand.
pub fn train<B: Backend>(be: &B, comm: &dyn Comm, args: &TrainArgs) -> Result<()> {
    crate::stop::on_signals();
    if args.dump_batches.is_some() && comm.size() > 1 {
        let e = Error::Input("--dump-batches writes one process's batches: run it on one rank".into());
        return Err(e.on_every_rank()); // the same flags everywhere: every rank is here
    }
    if let Some(dump) = &args.dump_batches {
        // The dump replaces its file: never one of the run's inputs.
        let plan = crate::data::resolve(&args.data, args.val_data.as_deref())?;
        let checkpoints = [args.resume.as_ref(), args.init_from.as_ref()];
        let inputs = plan
            .files()
            .into_iter()
            .chain(checkpoints.into_iter().flatten().map(|p| p.as_path()));
        crate::input::refuse_overwriting("--dump-batches", dump, inputs)?;
    }
    let mut run = Run::prepare(be, comm, args)?;
    // Before anything is written to OUT: a path that cannot be written is one line.
    let dump = match &args.dump_batches {
        Some(path) => Some(BatchDump::create(path, dump::meta_of(&run))?),
        None => None,
    };
    let session = Session::open(&run, comm, args)?;
    if args.save_init {
        session.save_init(&run)?;
    }
    // From here on a failed write (a full disk) is the run's failure, not bad input.
    run_steps(&mut run, session, dump, comm, args).map_err(Error::during_run)
}

/// The steps of a run set up, and its end: the last checkpoint, the dump, the summary.
fn run_steps<B: Backend>(
    run: &mut Run<B>,
    mut session: Session<'_>,
    mut dump: Option<BatchDump>,
    comm: &dyn Comm,
    args: &TrainArgs,
) -> Result<()> {
    let local_batch = run.batch / comm.size();
    let grad_norm_steps = grad_norm_steps();
    let mut loader_wait_s = 0.0;
    for step in run.start_step..run.total_steps {
        #[cfg(feature = "fault-injection")]
        fault::fail_if_asked(comm, step)?;
        session.starting(step)?;
        let waiting = Instant::now();
        let batch = run.loader.next_batch()?;
        loader_wait_s += waiting.elapsed().as_secs_f64();
        if let Some(d) = dump.as_mut() {
            d.add_batch(&batch)?;
        }
        let started = Instant::now();
        let report = run.trainer.step(&batch, local_batch, run.seq_len, step)?;
        session.add_time(started.elapsed().as_secs_f64(), 1);
        print_grad_norms_if_asked(run, comm, step, &grad_norm_steps)?;
        session.record_all(&report.finished)?;
        if let Some(d) = dump.as_mut() {
            d.add_stats(&report.finished);
        }

        let done = step + 1;
        let last = done == run.total_steps;
        // A stop asked for at the last step changes nothing: the run ends as a finished one
        // (its summary and sample written), not as one to resume. Every rank knows `last`.
        let stop = match last {
            true => None,
            false => session.stop_requested(run, done)?,
        };
        let log_point = done % run.eval_every == 0 || last;
        let periodic = args.checkpoint_every > 0 && done % args.checkpoint_every == 0;
        if log_point || periodic || last || stop.is_some() {
            // Replayed steps' stats wait on the device until now: the window and the
            // --max-bad-steps check need them before a row or a checkpoint.
            let started = Instant::now();
            let finished = run.trainer.flush()?;
            session.add_time(started.elapsed().as_secs_f64(), 0);
            session.record_all(&finished)?;
            if let Some(d) = dump.as_mut() {
                d.add_stats(&finished);
            }
        }
        if log_point {
            session.log_row(run)?;
        }
        if periodic || last || stop.is_some() {
            session.checkpoint(run, done)?;
        }
        if let Some(why) = stop {
            finish_dump(dump)?;
            return session.stop(why, done);
        }
    }
    session.finish()?;
    finish_dump(dump)?;
    if comm.is_root() {
        let tokens = ((run.total_steps - run.start_step) * (run.batch * run.seq_len) as u64) as f64;
        let (elapsed, tokens_per_s) = (session.elapsed(), tokens / session.step_time);
        // The last checkpoint is written: the memory its copy kept goes (sampling may want it).
        run.trainer.release_checkpoint_memory();
        finish(run, args, (elapsed, loader_wait_s), tokens_per_s, session.last_val)?;
    }
    Ok(())
}

/// Writes the dump's description (its batches are in the file already) and says so.
fn finish_dump(dump: Option<BatchDump>) -> Result<()> {
    if let Some(d) = dump {
        let (path, steps) = d.finish()?;
        crate::say!("wrote {} ({steps} steps)", path.display());
    }
    Ok(())
}

/// Rank 0, after the last step: the sample, and `OUT/summary.json` for `report`.
fn finish<B: Backend>(
    run: &mut Run<B>,
    args: &TrainArgs,
    (train_time_s, loader_wait_s): (f64, f64),
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
        loader_wait_s,
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
            // As it always was: the whole window recomputed per token, sliding past seq-len.
            kv_cache: false,
            slide: true,
            ..SampleOptions::default()
        };
        let started = Instant::now();
        let (sample, tokens) = run.trainer.sample(&run.tok, "\n", &opts)?;
        (summary.sample, summary.sample_tokens) = (sample, tokens);
        summary.sample_time_s = started.elapsed().as_secs_f64();
        crate::say!("---- sample ----\n{}\n----------------", summary.sample);
    }
    let path = args.out.join("summary.json");
    let json = serde_json::to_string_pretty(&summary).expect("plain data serialises");
    crate::atomic_file::write(&path, |f| std::io::Write::write_all(f, json.as_bytes()))
}

/// A debugging aid: the 0-based steps of `GPT2_GRAD_NORMS=36,37,38`, after which rank 0
/// prints every tensor's gradient norm ([`print_grad_norms_if_asked`]).
fn grad_norm_steps() -> Vec<u64> {
    std::env::var("GPT2_GRAD_NORMS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// After `step`, if it is one of `steps`: rank 0 prints "grad-norms step N: name=norm ...".
fn print_grad_norms_if_asked<B: Backend>(run: &Run<B>, comm: &dyn Comm, step: u64, steps: &[u64]) -> Result<()> {
    if steps.contains(&step) && comm.is_root() {
        let norms = run.trainer.gradient_norms()?;
        let line: Vec<String> = norms.iter().map(|(name, n)| format!("{name}={n:.6e}")).collect();
        crate::say!("grad-norms step {step}: {}", line.join(" "));
    }
    Ok(())
}
