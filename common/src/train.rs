//! The one training loop for all four stages, generic over the backend (CPU or GPU) and
//! the communicator (one process, MPI, NCCL). Rank 0 alone reads the corpus, logs,
//! evaluates, samples and writes checkpoints; every rank runs the same optimiser step.

use crate::autograd::{Graph, Pool, Tensor};
use crate::backend::{Backend, DevPtr, DeviceBuffer};
use crate::checkpoint::{self, CheckpointMeta};
use crate::cli::{ExecArgs, TrainArgs};
use crate::comm::{agree, broadcast_f32, Comm};
use crate::data::{self, Batch, DataCursor, Loader};
use crate::error::{io_err, Error, Result};
use crate::generate::{self, SampleOptions};
use crate::model::{Gpt2, ModelConfig, ParamLayout};
use crate::optim::{AdamW, OptimConfig, StepStats};
use crate::report::RunSummary;
use crate::tokenizer::{Tokenizer, TokenizerKind};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Model + optimiser + the memory pool, on one backend and one communicator.
pub struct Trainer<'a, B: Backend> {
    pub be: &'a B,
    pub comm: &'a dyn Comm,
    pub model: Gpt2<B>,
    pub opt: AdamW<B>,
    pool: Pool<B>,
    exec: ExecArgs,
}

/// One step's report; times in seconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepReport {
    pub stats: StepStats,
    pub compute_s: f64,
    pub comm_s: f64,
}

impl<'a, B: Backend> Trainer<'a, B> {
    pub fn new(be: &'a B, comm: &'a dyn Comm, config: ModelConfig, optim: OptimConfig, exec: ExecArgs) -> Result<Self> {
        let model = Gpt2::new(be, config)?;
        let opt = AdamW::new(be, &model.layout, optim)?;
        Ok(Trainer {
            be,
            comm,
            model,
            opt,
            pool: Pool::default(),
            exec,
        })
    }

    /// Rank 0 initialises the parameters and every rank receives them.
    pub fn init_weights(&mut self, seed: u64) -> Result<()> {
        if self.comm.is_root() {
            self.model.init_weights(self.be, seed)?;
        }
        self.broadcast_params()
    }

    fn broadcast_params(&mut self) -> Result<()> {
        if self.comm.size() == 1 {
            return Ok(());
        }
        let mut host = vec![0.0f32; self.model.num_params()];
        self.be.download_f32(self.model.params.ptr(), &mut host)?;
        broadcast_f32(self.comm, &mut host)?;
        self.be.upload_f32(self.model.params.ptr(), &host)
    }

    /// forward → zero grads → backward → allreduce → clip + AdamW. `batch` is this
    /// rank's shard; `step` is 0-based. Gradients are averaged over ranks by seeding the
    /// backward pass with 1/world, so the allreduce is a plain sum. With `--overlap` each
    /// block's gradients are sent while backward goes on through the blocks below it.
    pub fn step(&mut self, batch: &Batch, b: usize, t: usize, step: u64) -> Result<StepReport> {
        let (be, comm, world) = (self.be, self.comm, self.comm.size());
        let (params, grads, n) = (self.model.params.ptr(), self.model.grads.ptr(), self.model.num_params());
        let local_sgd = self.exec.sync_every.filter(|&k| k > 0);
        let average_grads = world > 1 && local_sgd.is_none();
        // Local SGD: each rank steps on its own mean gradient, so no 1/world here.
        let seed = if average_grads { 1.0 / world as f32 } else { 1.0 };
        let started = Instant::now();
        let mut comm_s = 0.0;
        be.zero(grads, n);
        let mut g = Graph::new(be, &mut self.pool, true);
        let fwd = self
            .model
            .forward(&mut g, &batch.inputs, Some(&batch.targets), b, t, false)?;
        let loss = fwd.loss.expect("targets given");
        if average_grads && self.exec.overlap {
            backward_overlapped(&mut g, loss, seed, comm, &self.model.layout, grads, &mut comm_s)?;
        } else {
            g.backward(loss, seed)?;
            if average_grads {
                be.synchronize()?;
                timed(&mut comm_s, || comm.all_reduce_sum(grads, n))?;
            }
        }
        let mut stats = self.opt.step(be, params, grads, g.ptr(loss), step)?;
        drop(g);
        if world > 1 {
            if let Some(k) = local_sgd {
                // Local SGD: average the parameters every k steps, and after the last.
                let last = step + 1 == self.opt.config.total_steps;
                if (step + 1).is_multiple_of(k) || last {
                    be.synchronize()?; // the update must be written before the sum reads it
                    timed(&mut comm_s, || comm.all_reduce_sum(params, n))?;
                    be.scale(params, n, 1.0 / world as f32);
                }
            }
            let mut v = [stats.loss];
            timed(&mut comm_s, || comm.all_reduce_sum_host(&mut v))?;
            stats.loss = v[0] / world as f32;
        }
        let total = started.elapsed().as_secs_f64();
        Ok(StepReport {
            stats,
            compute_s: total - comm_s,
            comm_s,
        })
    }

    /// Mean loss over evaluation batches (forward only).
    pub fn evaluate(&mut self, batches: &[Batch], t: usize) -> Result<f32> {
        // Mean over all rows: batches may differ in size (see `eval_pieces`).
        let (mut sum, mut rows) = (0.0f64, 0usize);
        for batch in batches {
            let b = batch.inputs.len() / t;
            let mut g = Graph::new(self.be, &mut self.pool, false);
            let fwd = self
                .model
                .forward(&mut g, &batch.inputs, Some(&batch.targets), b, t, false)?;
            let mut loss = [0.0f32];
            self.be
                .download_f32(g.ptr(fwd.loss.expect("targets given")), &mut loss)?;
            sum += loss[0] as f64 * b as f64;
            rows += b;
        }
        Ok((sum / rows.max(1) as f64) as f32)
    }

    /// Writes parameters, moments and progress atomically (rank 0 only).
    pub fn save(&self, path: &Path, meta: &CheckpointMeta) -> Result<()> {
        let n = self.model.num_params();
        let fetch = |buf: &B::Buffer| -> Result<Vec<f32>> {
            let mut host = vec![0.0f32; n];
            self.be.download_f32(buf.ptr(), &mut host)?;
            Ok(host)
        };
        let (p, m, v) = (fetch(&self.model.params)?, fetch(&self.opt.m)?, fetch(&self.opt.v)?);
        checkpoint::save(path, meta, &p, &m, &v)
    }

    /// Loads parameters and moments (from rank 0's copy) into every rank.
    fn restore(&mut self, ckpt: Option<checkpoint::Checkpoint>) -> Result<()> {
        let n = self.model.num_params();
        let (mut p, mut m, mut v) = match ckpt {
            Some(c) => (c.params, c.m, c.v),
            None => (vec![0.0; n], vec![0.0; n], vec![0.0; n]),
        };
        for (host, dst) in [
            (&mut p, self.model.params.ptr()),
            (&mut m, self.opt.m.ptr()),
            (&mut v, self.opt.v.ptr()),
        ] {
            broadcast_f32(self.comm, host)?;
            self.be.upload_f32(dst, host)?;
        }
        Ok(())
    }

    pub fn sample(&mut self, tok: &Tokenizer, prompt: &str, opts: &SampleOptions) -> Result<String> {
        let ids = tok.encode(prompt);
        let out = generate::generate(&self.model, self.be, &mut self.pool, &ids, opts, |_| {})?;
        Ok(tok.decode(&out))
    }
}

/// Backward with the gradient allreduce overlapped: the model leaves `g.mark(i)` where
/// block i starts, so once backward passes it block i's gradients are final and their sum
/// can start. The embeddings (wte is also the LM head) and the final layernorm are final
/// only at the end. `comm_s` gets the time spent inside communication calls, waiting
/// included: the part of communication that computing did not hide.
fn backward_overlapped<B: Backend>(
    g: &mut Graph<B>,
    loss: Tensor,
    seed: f32,
    comm: &dyn Comm,
    layout: &ParamLayout,
    grads: DevPtr,
    comm_s: &mut f64,
) -> Result<()> {
    let be = g.backend();
    g.backward_with(loss, seed, |block| {
        // The kernels that wrote this block's gradients may still be queued (GPU), and
        // NCCL reads on its own stream: wait for them first (a no-op on the CPU).
        be.synchronize()?;
        let range = &layout.layers[block].range;
        timed(comm_s, || {
            comm.start_all_reduce_sum(grads.add(range.start), range.len())
        })
    })?;
    let blocks_start = layout.layers.first().map_or(layout.lnfw, |l| l.range.start);
    be.synchronize()?;
    timed(comm_s, || {
        comm.start_all_reduce_sum(grads, blocks_start)?;
        comm.start_all_reduce_sum(grads.add(layout.lnfw), layout.total - layout.lnfw)?;
        comm.finish_all_reduces()
    })
}

/// Rank 0 evaluates the same windows at every world size (the global batches), cut into
/// pieces of at most the per-rank batch so that its memory stays at the training level.
fn eval_pieces(batches: Vec<Batch>, t: usize, rows: usize) -> Vec<Batch> {
    let n = rows.max(1) * t;
    let piece = |v: &[i32]| v.chunks(n).map(<[i32]>::to_vec).collect::<Vec<_>>();
    batches
        .iter()
        .flat_map(|b| piece(&b.inputs).into_iter().zip(piece(&b.targets)))
        .map(|(inputs, targets)| Batch { inputs, targets })
        .collect()
}

/// Runs `f`, adding its duration to `seconds`.
fn timed<T>(seconds: &mut f64, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    let out = f();
    *seconds += started.elapsed().as_secs_f64();
    out
}

/// Set by Ctrl-C; the loop saves a checkpoint and stops at the end of the current step.
static STOP: AtomicBool = AtomicBool::new(false);

fn install_interrupt_handler() {
    // A second handler is refused; one is enough (tests train several times in a process).
    let _ = ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst));
}

/// Rank 0 runs `f`; its result (bytes or an error message) reaches every rank, so a bad
/// input on rank 0 fails all ranks instead of leaving them waiting.
fn from_root(comm: &dyn Comm, f: impl FnOnce() -> Result<Vec<u8>>) -> Result<Vec<u8>> {
    let mut msg = if comm.is_root() {
        match f() {
            Ok(mut bytes) => {
                bytes.push(0);
                bytes
            }
            Err(e) => {
                let mut m = e.to_string().into_bytes();
                m.push(1);
                m
            }
        }
    } else {
        Vec::new()
    };
    comm.broadcast_bytes(&mut msg)?;
    match msg.pop() {
        Some(0) => Ok(msg),
        _ if comm.is_root() => Err(Error::Input(String::from_utf8_lossy(&msg).into_owned()).on_every_rank()),
        _ => Err(Error::Input(format!("rank 0 failed: {}", String::from_utf8_lossy(&msg))).on_every_rank()),
    }
}

/// Every rank must run the same configuration and binary: compare a hash of both. Every
/// rank learns the outcome, so a mismatch fails them all together.
pub(crate) fn check_same_everywhere(comm: &dyn Comm, fingerprint: &str) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let version = env!("CARGO_PKG_VERSION");
    let mine = (fnv1a(format!("{version} {fingerprint}").as_bytes()) ^ binary_hash())
        .to_le_bytes()
        .to_vec();
    let mut root = mine.clone();
    comm.broadcast_bytes(&mut root)?;
    let differ_here = root != mine;
    let mut differ = [differ_here as u8 as f32];
    comm.all_reduce_sum_host(&mut differ)?;
    let help = "start the same executable with the same flags on every rank";
    if differ_here {
        return Err(Error::Input(format!(
            "this rank's binary or configuration differs from rank 0's: {help}"
        ))
        .on_every_rank());
    }
    if differ[0] > 0.0 {
        return Err(Error::Input(format!(
            "{} rank(s) run a different binary or configuration than rank 0: {help}",
            differ[0] as usize
        ))
        .on_every_rank());
    }
    Ok(())
}

/// Rank 0's checkpoint metadata, on every rank.
fn meta_from_root(comm: &dyn Comm, path: &Path) -> Result<CheckpointMeta> {
    let json = from_root(comm, || {
        let meta = checkpoint::load_meta(path)?;
        Ok(serde_json::to_vec(&meta).expect("plain data serialises"))
    })?;
    serde_json::from_slice(&json).map_err(|e| Error::Device(format!("checkpoint metadata from rank 0: {e}")))
}

/// The tokenizer and model of a run: from the flags, or from the checkpoint when resuming.
fn run_model(
    args: &TrainArgs,
    resumed: Option<&CheckpointMeta>,
    world: usize,
) -> Result<(Tokenizer, TokenizerKind, ModelConfig)> {
    let tok_kind = resumed.map_or(Ok(args.tokenizer), |m| TokenizerKind::from_checkpoint(&m.tokenizer))?;
    let tok = Tokenizer::new(tok_kind)?;
    let vocab = tok.vocab_size();
    let config = match resumed {
        Some(meta) => {
            if args.model.given() {
                checkpoint::check_compatible(meta, &args.model.config(vocab)?, tok_kind.name())?;
            }
            // The data cursor counts windows of this batch and length.
            for (key, flag, value) in [("batch", "--batch", args.batch), ("seq_len", "--seq-len", args.seq_len)] {
                let saved = meta.train.get(key).and_then(|v| v.as_u64());
                if saved.is_some_and(|s| s != value as u64) {
                    crate::bail_input!(
                        "cannot resume: the checkpoint was trained with {flag} {} but the flags ask for {value}",
                        saved.unwrap_or_default()
                    );
                }
            }
            meta.config
        }
        None => args.model.config(vocab)?,
    };
    validate_shape(&config, args.batch, args.seq_len, world)?;
    Ok((tok, tok_kind, config))
}

/// Hash of this process's executable file (0 if it cannot be read), so ranks started from
/// different builds are caught even when their version numbers agree.
fn binary_hash() -> u64 {
    let Ok(bytes) = std::env::current_exe().and_then(std::fs::read) else {
        return 0;
    };
    // FNV-1a over 8-byte words: debug binaries run to 100 MB, and this is not adversarial.
    bytes.chunks(8).fold(0xcbf29ce484222325u64, |h, word| {
        let mut w = [0u8; 8];
        w[..word.len()].copy_from_slice(word);
        (h ^ u64::from_le_bytes(w)).wrapping_mul(0x100000001b3)
    })
}

pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// The `train` subcommand.
pub fn train<B: Backend>(be: &B, comm: &dyn Comm, args: &TrainArgs) -> Result<()> {
    install_interrupt_handler();
    let root = comm.is_root();
    let world = comm.size();

    // Before any step that depends on them: the same flags and binary on every rank (the
    // thread count aside: results do not depend on it, and hosts may differ in cores).
    let mut same_everywhere = args.clone();
    same_everywhere.exec.threads = 0;
    check_same_everywhere(comm, &format!("train {same_everywhere:?}"))?;

    // Run settings: from the flags, or from the checkpoint when resuming (rank 0 reads it,
    // other hosts need not see the file). Every rank derives the rest on its own, and
    // `agree` makes a failure anywhere stop every rank together.
    let resumed = match &args.resume {
        Some(path) => Some(meta_from_root(comm, path)?),
        None => None,
    };
    let (tok, tok_kind, config) = agree(comm, run_model(args, resumed.as_ref(), world))?;
    let (b, t) = (args.batch, args.seq_len);
    // A resumed run keeps its seed: it fixes the data order the cursor points into.
    let seed = resumed.as_ref().map_or(args.seed, |m| m.seed);

    // Rank 0 reads and tokenizes the corpus; every rank gets the tokens.
    let bytes = from_root(comm, || {
        let tokens = data::load_tokens(&args.data, &tok)?;
        Ok(bytemuck::cast_slice(&tokens).to_vec())
    })?;
    let tokens: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
    drop(bytes);
    let split = agree(comm, data::split(tokens, args.val_fraction, t))?;
    let mut loader = agree(comm, Loader::new(split.train, t, b, comm.rank(), world, seed))?;
    let eval_set = eval_pieces(data::eval_batches(&split.val, t, b, args.eval_batches), t, b / world);
    let spe = loader.steps_per_epoch();
    let total_steps = match (args.steps, args.epochs) {
        (Some(s), _) => s,
        (None, Some(e)) => (e * spe as f64).ceil() as u64,
        (None, None) => 2 * spe,
    };
    if args.eval_batches == 0 || args.exec.sync_every == Some(0) {
        let e = Error::Input("--eval-batches and --sync-every must be at least 1".into());
        return Err(e.on_every_rank());
    }
    if total_steps == 0 {
        let e = Error::Input("nothing to train: --steps / --epochs give 0 steps".into());
        return Err(e.on_every_rank()); // the same flags everywhere: every rank is here
    }
    let eval_every = args.eval_every.unwrap_or(spe).max(1);
    let optim = OptimConfig {
        lr: args.lr,
        min_lr_frac: args.min_lr_frac,
        warmup_steps: args.warmup,
        total_steps,
        weight_decay: args.weight_decay,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        grad_clip: args.grad_clip,
    };
    let settings = serde_json::json!({
        "batch": b, "seq_len": t, "lr": args.lr, "warmup": args.warmup, "min_lr_frac": args.min_lr_frac,
        "weight_decay": args.weight_decay, "grad_clip": args.grad_clip, "total_steps": total_steps,
        "val_fraction": args.val_fraction, "world": world, "sync_every": args.exec.sync_every,
    });

    let mut trainer = Trainer::new(be, comm, config, optim, args.exec.clone())?;
    let mut start_step = 0;
    match (&args.resume, &resumed) {
        (Some(path), Some(meta)) => {
            let ckpt = agree(
                comm,
                if root {
                    checkpoint::load(path).map(Some)
                } else {
                    Ok(None)
                },
            )?;
            trainer.restore(ckpt)?;
            let cursor = DataCursor {
                epoch: meta.data_epoch,
                step_in_epoch: meta.data_step_in_epoch,
            };
            agree(comm, loader.set_cursor(cursor))?;
            start_step = meta.step;
        }
        _ => trainer.init_weights(seed)?,
    }
    if start_step >= total_steps {
        let e = Error::Input(format!(
            "checkpoint is at step {start_step}, not before the last step {total_steps}: raise --steps to continue"
        ));
        return Err(e.on_every_rank());
    }

    let out = &args.out;
    let ckpt_path = out.join("model.ckpt");
    let mut log = agree(
        comm,
        root.then(|| LossLog::open(out, args.resume.is_some())).transpose(),
    )?;
    if root {
        println!(
            "{} | {} | {} params | {} layers, {} heads, width {} | batch {b}×{t} over {world} rank(s) | {spe} steps/epoch, {total_steps} steps",
            be.name(),
            tok_kind.name(),
            config.num_params(),
            config.n_layer,
            config.n_head,
            config.n_embd
        );
        println!("{}", LossLog::HEADER.replace('\t', "  "));
    }
    let bar = progress_bar(root, total_steps, start_step);

    let run_start = Instant::now();
    let mut window = Window::default();
    let (mut step_time, mut last_val) = (0.0f64, f32::NAN);
    let meta_at = |step: u64, cursor: DataCursor| CheckpointMeta {
        config,
        tokenizer: tok_kind.name().to_string(),
        step,
        data_epoch: cursor.epoch,
        data_step_in_epoch: cursor.step_in_epoch,
        seed,
        train: settings.clone(),
    };
    for step in start_step..total_steps {
        fail_if_asked(comm, step)?;
        let batch = loader.next_batch();
        let t0 = Instant::now();
        let report = trainer.step(&batch, b / world, t, step)?;
        let dt = t0.elapsed().as_secs_f64();
        window.add(report.stats.loss, dt);
        step_time += dt;
        bar.set_message(format!(
            "loss {:.4} lr {:.2e} norm {:.2}",
            report.stats.loss, report.stats.lr, report.stats.grad_norm
        ));
        bar.inc(1);
        if !report.stats.loss.is_finite() {
            // The loss is averaged over ranks: every rank stops here together.
            return Err(
                Error::Device(format!("loss became {} at step {step}: lower --lr", report.stats.loss)).on_every_rank(),
            );
        }

        let done = step + 1;
        let stop = interrupted(comm)?;
        if done % eval_every == 0 || done == total_steps || stop {
            let (train_loss, tokens_per_s) = window.take(b * t);
            if let Some(log) = log.as_mut() {
                last_val = trainer.evaluate(&eval_set, t)?;
                let row = LossRow {
                    epoch: loader.epochs_done(),
                    train_loss,
                    val_loss: last_val,
                    tokens_per_s,
                    elapsed_s: run_start.elapsed().as_secs_f64(),
                };
                bar.suspend(|| println!("{}", row.display()));
                log.append(&row)?;
            }
        }
        let periodic = args.checkpoint_every > 0 && done % args.checkpoint_every == 0;
        if root && (periodic || done == total_steps || stop) {
            trainer.save(&ckpt_path, &meta_at(done, loader.cursor()))?;
        }
        if stop {
            bar.abandon();
            return Err(Error::Interrupted(format!(
                "stopped after step {done}; saved {} (continue with --resume {0})",
                ckpt_path.display()
            ))
            .on_every_rank());
        }
    }
    bar.finish_and_clear();
    let train_time_s = run_start.elapsed().as_secs_f64();
    if root {
        println!("saved {}", ckpt_path.display());
        let mut summary = RunSummary {
            device: be.name(),
            ranks: world,
            params: config.num_params(),
            batch: b,
            seq_len: t,
            steps: total_steps,
            train_time_s,
            train_tokens_per_s: ((total_steps - start_step) * (b * t) as u64) as f64 / step_time,
            final_val_loss: last_val,
            ..Default::default()
        };
        if args.sample_len > 0 {
            let opts = SampleOptions {
                max_new_tokens: args.sample_len,
                greedy: false,
                temperature: 0.8,
                top_k: 40,
                seed,
                context: t,
            };
            let started = Instant::now();
            summary.sample = trainer.sample(&tok, "\n", &opts)?;
            (summary.sample_tokens, summary.sample_time_s) = (args.sample_len, started.elapsed().as_secs_f64());
            println!("---- sample ----{}\n----------------", summary.sample);
        }
        let path = out.join("summary.json");
        let json = serde_json::to_string_pretty(&summary).expect("plain data serialises");
        std::fs::write(&path, json).map_err(io_err(&path))?;
    }
    Ok(())
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

/// Has any rank been interrupted? (Agreed over all ranks so they stop at the same step.)
fn interrupted(comm: &dyn Comm) -> Result<bool> {
    let mut v = [STOP.load(Ordering::SeqCst) as u8 as f32];
    comm.all_reduce_sum_host(&mut v)?;
    Ok(v[0] > 0.0)
}

pub fn validate_shape(config: &ModelConfig, b: usize, t: usize, world: usize) -> Result<()> {
    if b == 0 || t == 0 {
        crate::bail_input!("--batch and --seq-len must be positive (got batch {b}, seq-len {t})");
    }
    if t > config.max_seq_len {
        crate::bail_input!(
            "--seq-len {t} is above the model's maximum sequence length {}",
            config.max_seq_len
        );
    }
    if !b.is_multiple_of(world) {
        crate::bail_input!("--batch {b} must be divisible by the number of ranks {world}");
    }
    Ok(())
}

pub fn progress_bar(visible: bool, total: u64, at: u64) -> indicatif::ProgressBar {
    if !visible {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {elapsed_precise} < {eta_precise}  {msg}")
            .expect("static template"),
    );
    bar.set_position(at);
    bar
}

/// Training losses and step time since the last `loss.tsv` row.
#[derive(Default)]
struct Window {
    loss: f64,
    steps: u64,
    seconds: f64,
}

impl Window {
    fn add(&mut self, loss: f32, seconds: f64) {
        self.loss += loss as f64;
        self.steps += 1;
        self.seconds += seconds;
    }

    /// Mean training loss and tokens/s over the window; the next window starts empty.
    fn take(&mut self, tokens_per_step: usize) -> (f32, f64) {
        let w = std::mem::take(self);
        (
            (w.loss / w.steps as f64) as f32,
            (w.steps * tokens_per_step as u64) as f64 / w.seconds,
        )
    }
}

/// One row of `loss.tsv`.
#[derive(Clone, Copy, Debug)]
pub struct LossRow {
    pub epoch: f64,
    pub train_loss: f32,
    pub val_loss: f32,
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
}

impl LossRow {
    fn tsv(&self) -> String {
        format!(
            "{:.3}\t{:.4}\t{:.4}\t{:.0}\t{:.1}",
            self.epoch, self.train_loss, self.val_loss, self.tokens_per_s, self.elapsed_s
        )
    }
    fn display(&self) -> String {
        format!(
            "{:>5.3}  {:>10.4}  {:>8.4}  {:>12.0}  {:>9.1}",
            self.epoch, self.train_loss, self.val_loss, self.tokens_per_s, self.elapsed_s
        )
    }
}

/// `OUT/loss.tsv`, flushed after every row so an interrupted run keeps its table.
struct LossLog {
    file: std::fs::File,
    path: PathBuf,
}

impl LossLog {
    const HEADER: &'static str = "epoch\ttrain_loss\tval_loss\ttokens_per_s\telapsed_s";

    fn open(dir: &Path, append: bool) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let path = dir.join("loss.tsv");
        let keep = append && path.exists();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(keep)
            .write(true)
            .truncate(!keep)
            .open(&path)
            .map_err(io_err(&path))?;
        if !keep {
            writeln!(file, "{}", Self::HEADER).map_err(io_err(&path))?;
        }
        Ok(LossLog { file, path })
    }

    fn append(&mut self, row: &LossRow) -> Result<()> {
        writeln!(self.file, "{}", row.tsv())
            .and_then(|_| self.file.flush())
            .map_err(io_err(&self.path))
    }
}
