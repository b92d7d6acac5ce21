//! Setting a run up before its first step: the same flags and binary on every rank, the
//! model and tokenizer (from the flags, or from the checkpoint when resuming), the corpus (one
//! file read by rank 0 and sent to all, or shards every rank reads its own windows of), the
//! split and the batches, the schedule, and the parameters (initialised, or restored). Every
//! failure stops every rank together.

use super::trainer::{Trainer, TrainerSettings};
use crate::backend::Backend;
use crate::checkpoint::{self, Checkpoint, CheckpointMeta};
use crate::cli::{
    TrainArgs, DEFAULT_BATCH, DEFAULT_GRAD_CLIP, DEFAULT_LR, DEFAULT_MIN_LR_FRAC, DEFAULT_SEED, DEFAULT_SEQ_LEN,
    DEFAULT_VAL_FRACTION, DEFAULT_WARMUP, DEFAULT_WEIGHT_DECAY,
};
use crate::comm::{agree, check_same_everywhere, from_root, Comm};
use crate::data::{
    self, Batch, Batches, DataCursor, DataIdentity, DataOrder, DataPlan, Loader, ShardLoader, ShardSet, TrainSource,
    ValSource,
};
use crate::error::{Error, Result};
use crate::model::{fp8, ModelConfig};
use crate::optim::OptimConfig;
use crate::report::log::LogState;
use crate::tokenizer::{Tokenizer, TokenizerKind};
use std::path::Path;

/// The most steps a run may have (a trillion: far beyond any run, and far from the step
/// counters' limits).
const MAX_STEPS: u64 = 1_000_000_000_000;

/// Everything a run needs once it is set up.
pub struct Run<'a, B: Backend> {
    pub trainer: Trainer<'a, B>,
    /// This rank's batches, prepared ahead on a thread of their own.
    pub loader: Batches,
    /// Validation batches, in pieces of at most the per-rank batch (rank 0 evaluates).
    pub eval_set: Vec<Batch>,
    pub tok: Tokenizer,
    pub config: ModelConfig,
    /// Global batch and sequence length.
    pub batch: usize,
    pub seq_len: usize,
    pub seed: u64,
    pub start_step: u64,
    pub total_steps: u64,
    pub steps_per_epoch: u64,
    pub eval_every: u64,
    /// `--stop-after`: the step count at which to end early (a checkpoint, then exit 0).
    pub stop_after: Option<u64>,
    /// Where the log stood at the checkpoint resumed from (empty for a new run).
    pub log_state: LogState,
    /// The run's settings, saved in checkpoints.
    settings: serde_json::Value,
    /// The corpus, saved in checkpoints.
    corpus: DataIdentity,
}

impl<'a, B: Backend> Run<'a, B> {
    pub fn prepare(be: &'a B, comm: &'a dyn Comm, args: &TrainArgs) -> Result<Self> {
        let world = comm.size();
        // Before any step that depends on them: the same flags and binary on every rank (the
        // thread count aside: results do not depend on it, and hosts may differ in cores).
        let mut same_everywhere = args.clone();
        same_everywhere.device.threads = None;
        check_same_everywhere(comm, &format!("train {same_everywhere:?}"))?;

        // From the flags, or from the checkpoint when resuming (rank 0 reads it; other hosts
        // need not see the file). Every rank derives the rest on its own, and `agree` makes a
        // failure anywhere stop every rank together.
        let resumed = match &args.resume {
            Some(path) => Some(meta_from_root(comm, path)?),
            None => None,
        };
        // `--init-from`: a new run, with the model and tokenizer of the checkpoint it starts from.
        let init = match &args.init_from {
            Some(path) => Some(meta_from_root(comm, path)?),
            None => None,
        };
        agree(comm, weights_from(args, resumed.as_ref(), init.as_ref()))?;
        let (tok, config, b, t) = agree(
            comm,
            run_model(args, resumed.as_ref().or(init.as_ref()), resumed.as_ref(), world),
        )?;
        // A resumed run keeps its seed: it fixes the data order the cursor points into.
        let seed = agree(comm, run_seed(args, resumed.as_ref()))?;

        // What --data and --val-data name (every rank resolves them; shards must be the same
        // on every rank), and which corpus that is (a resumed run's own, unless asked otherwise).
        let plan = resolve_data(comm, args)?;
        let corpus = corpus_identity(comm, args, resumed.as_ref(), &plan)?;
        let order = match plan.train {
            TrainSource::File(_) => DataOrder::FisherYates,
            TrainSource::Shards(_) => DataOrder::Feistel,
        };
        let split = plan.val == ValSource::Split;
        if let Some(meta) = resumed.as_ref() {
            same_windows(meta, order, split, args.resume_on_new_data).map_err(Error::on_every_rank)?;
        }
        // The held-out fraction fixes the split the checkpoint's data cursor points into.
        let val_fraction = match split {
            true => Some(agree(comm, run_val_fraction(args, resumed.as_ref()))?),
            false => None,
        };
        let (source, val): (Box<dyn data::BatchSource>, Option<Vec<u32>>) = match &plan.train {
            TrainSource::File(path) => {
                // Rank 0 reads and tokenizes the file; every rank gets the tokens.
                let bytes = from_root(comm, || {
                    let tokens = data::load_tokens(path, &tok)?;
                    Ok(bytemuck::cast_slice(&tokens).to_vec())
                })?;
                let tokens: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
                drop(bytes);
                let (train, val) = match val_fraction {
                    Some(fraction) => {
                        let split = agree(comm, data::split(tokens, fraction, t))?;
                        (split.train, Some(split.val))
                    }
                    None => (tokens, None),
                };
                let loader = agree(comm, Loader::new(train, t, b, comm.rank(), world, seed))?;
                (Box::new(loader), val)
            }
            TrainSource::Shards(set) => {
                let vocab = tok.vocab_size();
                let loader = ShardLoader::new(set.clone(), vocab, t, b, comm.rank(), world, seed);
                (Box::new(agree(comm, loader)?), None)
            }
        };
        let mut loader = Batches::new(source, order);
        let eval_set = match val {
            Some(val) => data::eval_batches(&val, t, b, args.eval_batches),
            // Rank 0 evaluates: it alone reads the validation set.
            None => {
                let read = comm
                    .is_root()
                    .then(|| eval_set_of(&plan.val, &tok, t, b, args.eval_batches));
                agree(comm, read.transpose())?.unwrap_or_default()
            }
        };
        let eval_set = eval_pieces(eval_set, t, b / world);

        let steps_per_epoch = loader.steps_per_epoch();
        let total_steps = schedule_length(args, resumed.as_ref(), steps_per_epoch, comm.is_root())?;
        if total_steps == 0 {
            let e = Error::Input("nothing to train: --steps / --epochs give 0 steps".into());
            return Err(e.on_every_rank()); // the same flags everywhere: every rank is here
        }
        if total_steps > MAX_STEPS {
            let e = Error::Input(format!(
                "--steps / --epochs give {total_steps} steps, more than {MAX_STEPS}: ask for fewer"
            ));
            return Err(e.on_every_rank()); // the same flags everywhere: every rank is here
        }
        if let Some(why) = schedule_refuses(args, total_steps) {
            return Err(Error::Input(why).on_every_rank()); // the same flags everywhere
        }
        // The optimiser's settings: the flags, else the resumed run's, else the defaults.
        let setting = Resumed {
            meta: resumed.as_ref(),
            root: comm.is_root(),
        };
        let optim = OptimConfig {
            lr: setting.get("--lr", "lr", args.lr, DEFAULT_LR)?,
            min_lr_frac: setting.get("--min-lr-frac", "min_lr_frac", args.min_lr_frac, DEFAULT_MIN_LR_FRAC)?,
            warmup_steps: setting.get("--warmup", "warmup", args.warmup, DEFAULT_WARMUP)?,
            total_steps,
            weight_decay: setting.get(
                "--weight-decay",
                "weight_decay",
                args.weight_decay,
                DEFAULT_WEIGHT_DECAY,
            )?,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: setting.get("--grad-clip", "grad_clip", args.grad_clip, DEFAULT_GRAD_CLIP)?,
        };
        // A resumed run whose warmup fit its schedule, shortened below it (but not below the
        // checkpoint's step, refused below): the peak is never reached.
        let saved_total = saved_setting::<u64>(resumed.as_ref(), "total_steps")?;
        let warmup = optim.warmup_steps;
        let still_to_run = resumed.as_ref().is_some_and(|m| m.step < total_steps);
        if args.warmup.is_none() && still_to_run && saved_total.is_some_and(|s| warmup <= s) && warmup > total_steps {
            let e = Error::Input(format!(
                "the checkpoint's warmup of {warmup} steps is longer than the run's {total_steps}: the learning \
                 rate would never reach its peak; give --warmup N with N at most {total_steps}"
            ));
            return Err(e.on_every_rank()); // the same checkpoint and flags everywhere
        }
        let eval_every = setting
            .get("--eval-every", "eval_every", args.eval_every, steps_per_epoch)?
            .max(1);
        let sync = args.sync.mode();
        // Micro-batches: the flag, else the checkpoint's, else 1.
        let saved = saved_setting(resumed.as_ref(), "grad_accum")?;
        let micro_batches = args.grad_accum.or(saved).unwrap_or(1);
        if !(b / world).is_multiple_of(micro_batches) {
            let whose = match args.grad_accum {
                None => " (the checkpoint's: give --grad-accum to change it)",
                Some(_) => "",
            };
            let e = Error::Input(format!(
                "--batch {b} over {world} rank(s) gives {} rows each, which --grad-accum {micro_batches}{whose} does not divide",
                b / world
            ));
            return Err(e.on_every_rank()); // the same flags everywhere: every rank is here
        }
        if args.device.fp8() {
            fp8::check_tokens(b / world / micro_batches * t).map_err(|e| e.on_every_rank())?;
        }
        let precision = match args.device.fp8() {
            true => "fp8",
            false => be.precision().name(),
        };
        let settings = serde_json::json!({
            "batch": b, "seq_len": t, "lr": optim.lr, "warmup": optim.warmup_steps, "min_lr_frac": optim.min_lr_frac,
            "weight_decay": optim.weight_decay, "grad_clip": optim.grad_clip, "total_steps": total_steps,
            "val_fraction": val_fraction, "eval_every": eval_every, "world": world,
            "sync_every": args.sync.sync_every, "grad_accum": micro_batches, "precision": precision,
            "zero": args.sync.zero(),
        });
        if let Some(meta) = resumed.as_ref() {
            say_how_local_sgd_resumes(meta, args.sync.sync_every, comm.is_root())?;
        }
        // Master weights and moments are fp32 in every precision, so a checkpoint resumes
        // under any other; say so when it does.
        let saved_precision = saved_setting::<String>(resumed.as_ref(), "precision")?;
        if let Some(saved) = saved_precision.filter(|p| p != precision) {
            if comm.is_root() {
                eprintln!(
                    "note: this checkpoint was trained in {saved} and resumes in {precision} (its weights and \
                     moments are fp32, so nothing is lost; the losses will differ by the precisions' rounding)"
                );
            }
        }

        agree(
            comm,
            check_fits(
                be,
                &config,
                (b / world / micro_batches, t),
                micro_batches,
                args.device.fp8(),
            ),
        )?;
        let mut trainer = Trainer::new(
            be,
            comm,
            config,
            TrainerSettings {
                optim,
                sync,
                micro_batches,
                recompute: args.recompute,
                zero: args.sync.zero(),
                grad_comm: args.sync.grad_comm(),
                fp8: args.device.fp8(),
            },
        )?;
        let (mut start_step, mut log_state) = (0, LogState::default());
        match (&args.resume, &resumed) {
            (Some(path), Some(meta)) => {
                // The whole file, read now, must be the one whose header set the run up.
                let read = comm.is_root().then(|| {
                    checkpoint::load(path).and_then(|c| match c.meta == *meta {
                        true => Ok(c),
                        false => crate::bail_input!("{}: the checkpoint changed while it was read", path.display()),
                    })
                });
                let ckpt = agree(comm, read.transpose())?;
                trainer.restore(ckpt)?;
                let cursor = DataCursor {
                    epoch: meta.data_epoch,
                    step_in_epoch: meta.data_step_in_epoch,
                };
                agree(comm, loader.set_cursor(cursor))?;
                start_step = meta.step;
                log_state = serde_json::from_value(meta.progress.clone()).map_err(|e| {
                    Error::Input(format!("cannot resume: the checkpoint's log state is unreadable ({e})"))
                        .on_every_rank()
                })?;
                // One batch a step: no run of `step` steps reaches a later epoch.
                let impossible = match meta.data_epoch > meta.step {
                    true => Some(format!(
                        "its data cursor is in epoch {} after {} steps",
                        meta.data_epoch, meta.step
                    )),
                    false => log_state.impossible_after(meta.step),
                };
                if let Some(why) = impossible {
                    return Err(Error::Input(format!("cannot resume: {why}")).on_every_rank());
                }
            }
            _ => match &args.init_from {
                // Its weights only: the moments start at zero, as in a new run.
                Some(path) => {
                    let ckpt = agree(comm, comm.is_root().then(|| checkpoint::load(path)).transpose())?;
                    trainer.restore(ckpt.map(|c| Checkpoint {
                        m: vec![0.0; c.params.len()],
                        v: vec![0.0; c.params.len()],
                        ..c
                    }))?
                }
                None => trainer.init_weights(seed)?,
            },
        }
        if start_step >= total_steps {
            let e = Error::Input(format!(
                "checkpoint is at step {start_step}, not before the last step {total_steps}: raise --steps to continue"
            ));
            return Err(e.on_every_rank());
        }
        if let Some(n) = args.stop_after.filter(|&n| n <= start_step) {
            let e = Error::Input(format!(
                "--stop-after {n} is not past the checkpoint's step {start_step}: nothing would run"
            ));
            return Err(e.on_every_rank());
        }
        // The first batch is read now: a window that cannot be read stops every rank before
        // the run writes anything.
        agree(comm, loader.peek())?;
        Ok(Run {
            trainer,
            loader,
            eval_set,
            tok,
            config,
            batch: b,
            seq_len: t,
            seed,
            start_step,
            total_steps,
            steps_per_epoch,
            eval_every,
            stop_after: args.stop_after,
            log_state,
            settings,
            corpus,
        })
    }

    /// The checkpoint's metadata after `steps_done` steps, the loader where it is now and
    /// the log as `log` says.
    pub fn checkpoint_meta(&self, steps_done: u64, log: &LogState) -> Result<CheckpointMeta> {
        let cursor = self.loader.cursor();
        Ok(CheckpointMeta {
            config: self.config,
            tokenizer: self.tok.kind().name().to_string(),
            step: steps_done,
            data_epoch: cursor.epoch,
            data_step_in_epoch: cursor.step_in_epoch,
            data_order: Some(self.loader.order().name().to_string()),
            seed: self.seed,
            train: self.settings.clone(),
            progress: serde_json::to_value(log).expect("plain data serialises"),
            data: Some(self.corpus.clone()),
            fp8: self.trainer.fp8_state()?,
        })
    }

    /// The run's first line: backend, tokenizer, model, schedule and the optimiser state each
    /// rank keeps.
    pub fn describe(&self) -> String {
        let (cfg, world) = (&self.config, self.trainer.comm.size());
        let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
        let state = self.trainer.optimizer_state_bytes();
        let whole = 2 * cfg.num_params() * std::mem::size_of::<f32>();
        let zero = if state < whole {
            format!(" (ZeRO-1: 1/{world} of {:.1} MiB)", mib(whole))
        } else {
            String::new()
        };
        format!(
            "{} | {} | {} params | {} layers, {} heads, width {} | batch {}×{} over {world} rank(s) | {} steps/epoch, {} steps | AdamW state {:.1} MiB per rank{zero}",
            self.trainer.be.name(),
            self.tok.kind().name(),
            cfg.num_params(),
            cfg.n_layer,
            cfg.n_head,
            cfg.n_embd,
            self.batch,
            self.seq_len,
            self.steps_per_epoch,
            self.total_steps,
            mib(state),
        )
    }
}

/// Steps in the run: `--steps`, or `--epochs` worth, or the resumed checkpoint's schedule,
/// or two epochs. A resumed run that is given another length says so in one line.
fn schedule_length(
    args: &TrainArgs,
    resumed: Option<&CheckpointMeta>,
    steps_per_epoch: u64,
    root: bool,
) -> Result<u64> {
    let saved = saved_setting(resumed, "total_steps")?;
    let total = match (args.steps, args.epochs, saved) {
        (Some(s), _, _) => s,
        // Saturates far beyond any run; refused below (MAX_STEPS).
        (None, Some(e), _) => (e * steps_per_epoch as f64).ceil() as u64,
        (None, None, Some(s)) => s,
        (None, None, None) => 2 * steps_per_epoch,
    };
    if let Some(old) = saved.filter(|&old| old != total) {
        if root {
            crate::say!(
                "note: the schedule changes from {old} to {total} steps (the learning rate follows the new length)"
            );
        }
    }
    Ok(total)
}

/// Why flags that shape the schedule do nothing in a run of `total_steps` steps, if they do:
/// a `--warmup` longer than the run (the learning rate would never reach `--lr`), a
/// `--stop-after` at or past its last step (the run ends there anyway).
fn schedule_refuses(args: &TrainArgs, total_steps: u64) -> Option<String> {
    if let Some(w) = args.warmup.filter(|&w| w > total_steps) {
        return Some(format!(
            "--warmup {w} is longer than the run's {total_steps} steps: the learning rate would never reach --lr; \
             give at most {total_steps}"
        ));
    }
    let n = args.stop_after.filter(|&n| n >= total_steps)?;
    Some(format!(
        "--stop-after {n} is not before the run's last step {total_steps}: the run ends there anyway; leave it out"
    ))
}

/// What the corpus is (rank 0 reads it; every rank gets it). Resuming, a corpus other than the
/// one the checkpoint records is refused unless `--resume-on-new-data` asks for it (then said in
/// one line); a checkpoint that records none (older, or imported) takes any.
fn corpus_identity(
    comm: &dyn Comm,
    args: &TrainArgs,
    resumed: Option<&CheckpointMeta>,
    plan: &DataPlan,
) -> Result<DataIdentity> {
    let json = from_root(comm, || {
        let data = match &plan.train {
            TrainSource::File(path) => DataIdentity::of(path)?,
            TrainSource::Shards(set) => DataIdentity::of_shards(&set.paths())?,
        };
        if let Some(saved) = resumed.and_then(|m| m.data.as_ref()).filter(|s| !s.same_data(&data)) {
            if !args.resume_on_new_data {
                crate::bail_input!(
                    "cannot resume: the checkpoint's run trained on {saved}, not on {data}: give its corpus, or add \
                     --resume-on-new-data to go on with this one"
                );
            }
            crate::say!(
                "note: going on with {} where the checkpoint's run trained on {} (--resume-on-new-data)",
                data.name,
                saved.name
            );
        }
        Ok(serde_json::to_vec(&data).expect("plain data serialises"))
    })?;
    serde_json::from_slice(&json).map_err(|e| Error::Device(format!("the corpus's identity from rank 0: {e}")))
}

/// The data `--data` and `--val-data` name. A single file without `--val-data` is rank 0's to
/// read (other hosts need not see it); shards are resolved, and their headers read, on every
/// rank, and a rank that sees other training shards than rank 0 stops the job in one line.
fn resolve_data(comm: &dyn Comm, args: &TrainArgs) -> Result<DataPlan> {
    let plan = agree(comm, data::resolve(&args.data, args.val_data.as_deref()))?;
    if let (Some(fraction), TrainSource::Shards(_)) = (args.val_fraction, &plan.train) {
        let e = Error::Input(format!(
            "--val-fraction {fraction} holds out the tail of a single --data file; shards take their validation set \
             from --val-data or a directory's *_val_* shards"
        ));
        return Err(e.on_every_rank()); // the same flags everywhere
    }
    if let TrainSource::Shards(set) = &plan.train {
        same_shards_everywhere(comm, set)?;
    }
    Ok(plan)
}

/// Stops every rank, in one line, where a rank sees other training shards (names or sizes)
/// than rank 0: rank 0's list goes to every rank, and each says where its own first differs.
fn same_shards_everywhere(comm: &dyn Comm, set: &ShardSet) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let list = |s: &ShardSet| s.shards.iter().map(|x| (x.path.clone(), x.bytes())).collect::<Vec<_>>();
    let mine = list(set);
    let json = from_root(comm, || Ok(serde_json::to_vec(&mine).expect("plain data serialises")))?;
    let root: Vec<(std::path::PathBuf, u64)> =
        serde_json::from_slice(&json).map_err(|e| Error::Device(format!("the shard list from rank 0: {e}")))?;
    // Per rank: 0 where it sees rank 0's list, else 1 + the index of its first difference.
    let mut differ = vec![0.0f32; comm.size()];
    if mine != root {
        let first = mine.iter().zip(&root).take_while(|(a, b)| a == b).count();
        differ[comm.rank()] = (first + 1) as f32;
    }
    comm.all_reduce_sum_host(&mut differ)?;
    let Some((rank, &code)) = differ.iter().enumerate().find(|(_, &c)| c > 0.0) else {
        return Ok(());
    };
    let first = code as usize - 1;
    let what = match root.get(first) {
        Some((path, bytes)) => format!(
            "does not see rank 0's shard {} ({bytes} bytes) as rank 0 does (missing, another size, or other shards before it)",
            path.display()
        ),
        None => format!("sees more shards than rank 0's {}", root.len()),
    };
    let e = Error::Input(format!(
        "rank {rank} of {} {what}: every host must see the same --data shards, on a shared file system or as identical copies",
        comm.size()
    ));
    Err(e.on_every_rank())
}

/// Refuses to resume where the flags' data would be cut into other windows, or visited in
/// another order, than the checkpoint's data cursor counts in (unless `--resume-on-new-data`
/// asks to go on with other data): shards streamed where the run held one file in memory or
/// the other way round, or a held-out tail where the run had `--val-data`, or the other way.
fn same_windows(meta: &CheckpointMeta, order: DataOrder, split: bool, new_data: bool) -> Result<()> {
    let saved = DataOrder::from_checkpoint(meta.data_order.as_deref())?;
    let saved_split = saved_setting::<f32>(Some(meta), "val_fraction")?.is_some();
    if new_data {
        return Ok(());
    }
    let held_out = |split: bool| match split {
        true => "the tail of its --data held out (--val-fraction)",
        false => "a validation set of its own (--val-data, or a directory's *_val_* shards)",
    };
    if saved != order {
        crate::bail_input!(
            "cannot resume: the checkpoint's data cursor counts windows of {}, but these flags give {}: give the run's \
             --data and --val-data, or add --resume-on-new-data",
            saved.describe(),
            order.describe()
        );
    }
    if saved_split != split {
        crate::bail_input!(
            "cannot resume: the checkpoint's run trained with {}, these flags with {}: give the run's --data and \
             --val-data, or add --resume-on-new-data",
            held_out(saved_split),
            held_out(split)
        );
    }
    Ok(())
}

/// Evaluation batches from a validation set of its own (not the held-out tail): a text file
/// read whole, or the first windows of shards read one after another. A set shorter than one
/// window is refused.
fn eval_set_of(
    val: &ValSource,
    tok: &crate::tokenizer::Tokenizer,
    t: usize,
    b: usize,
    max: usize,
) -> Result<Vec<Batch>> {
    let (tokens, name) = match val {
        ValSource::Split => return Ok(Vec::new()),
        ValSource::Text(path) => (data::load_tokens(path, tok)?, path.display().to_string()),
        ValSource::Shards(set) => {
            // The most eval_batches takes: `max` batches of `b` windows of `t`, and one more token.
            let need = (max as u64)
                .saturating_mul(b as u64)
                .saturating_mul(t as u64)
                .saturating_add(1);
            let name = match set.shards.len() {
                1 => set.shards[0].path.display().to_string(),
                n => format!("{n} validation shards"),
            };
            (set.read_prefix(need, tok.vocab_size())?, name)
        }
    };
    let batches = data::eval_batches(&tokens, t, b, max);
    if batches.is_empty() {
        crate::bail_input!(
            "--val-data {name}: {} tokens, fewer than one window of seq-len + 1 = {}",
            tokens.len(),
            t + 1
        );
    }
    Ok(batches)
}

/// Rank 0's checkpoint metadata, on every rank.
fn meta_from_root(comm: &dyn Comm, path: &Path) -> Result<CheckpointMeta> {
    let json = from_root(comm, || {
        let meta = checkpoint::load_meta(path)?;
        Ok(serde_json::to_vec(&meta).expect("plain data serialises"))
    })?;
    serde_json::from_slice(&json).map_err(|e| Error::Device(format!("checkpoint metadata from rank 0: {e}")))
}

/// A setting the checkpoint fixes: when resuming, the checkpoint's value (a flag that asks
/// for another is refused, saying `why` it is fixed); otherwise the flag or its default.
fn fixed_by_checkpoint<T: PartialEq + std::fmt::Display + Copy>(
    flag: &str,
    given: Option<T>,
    saved: Option<T>,
    default: T,
    why: &str,
) -> Result<T> {
    match (saved, given) {
        (Some(s), Some(g)) if s != g => {
            crate::bail_input!(
                "cannot resume: the checkpoint was trained with {flag} {s} ({why}) but the flags ask for {g}"
            )
        }
        (Some(s), _) => Ok(s),
        (None, g) => Ok(g.unwrap_or(default)),
    }
}

/// Resuming: local SGD (`--sync-every K`) keeps each rank's moments, and its parameters
/// between averages, apart, while a checkpoint holds rank 0's: when the checkpoint's run had
/// several ranks, every rank resumes from rank 0's state, which is not where the run stood.
/// Rank 0 (`root`) says so, and says when the flags change how gradients are synchronised;
/// every rank reads the settings, so a bad one stops them all.
fn say_how_local_sgd_resumes(meta: &CheckpointMeta, sync_every: Option<u64>, root: bool) -> Result<()> {
    let saved = saved_setting::<u64>(Some(meta), "sync_every")?;
    let world = saved_setting::<u64>(Some(meta), "world")?.unwrap_or(1);
    if !root {
        return Ok(());
    }
    if let (Some(k), true) = (saved, world > 1) {
        crate::say!(
            "note: the checkpoint's run used local SGD (--sync-every {k}) over {world} ranks, whose moments (and \
             parameters between averages) differ from rank to rank; the checkpoint holds rank 0's, and every rank \
             resumes from them, so the run does not continue bit for bit"
        );
    }
    let show = |k: Option<u64>| {
        k.map_or("gradients summed every step".to_string(), |k| {
            format!("--sync-every {k}")
        })
    };
    if saved != sync_every {
        crate::say!(
            "note: {} from here on (the checkpoint's run had {})",
            show(sync_every),
            show(saved)
        );
    }
    Ok(())
}

/// The held-out fraction: `--val-fraction`, or the checkpoint's when resuming (another is
/// refused: the split is where the checkpoint's data cursor points).
fn run_val_fraction(args: &TrainArgs, resumed: Option<&CheckpointMeta>) -> Result<f32> {
    let saved = saved_setting(resumed, "val_fraction")?;
    let why = "it fixes the split the data cursor points into";
    fixed_by_checkpoint("--val-fraction", args.val_fraction, saved, DEFAULT_VAL_FRACTION, why)
}

/// A setting of the run's that its checkpoint holds under `key` (older checkpoints may
/// lack some).
fn saved_setting<T: serde::de::DeserializeOwned>(meta: Option<&CheckpointMeta>, key: &str) -> Result<Option<T>> {
    let value = match meta.and_then(|m| m.train.get(key)) {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(v) => v,
    };
    // The checksum covers what was written, not whether it makes sense: a value the flag of
    // the same name would refuse is refused here too (every rank holds the same header).
    let refuse =
        |why: String| Error::Input(format!("cannot resume: the checkpoint's {key} {value} {why}")).on_every_rank();
    let text = value.as_str().map_or_else(|| value.to_string(), str::to_string);
    if let Some(why) = crate::cli::refused_as_train_flag(key, &text) {
        return Err(refuse(format!("is refused: {why}")));
    }
    serde_json::from_value(value.clone())
        .map(Some)
        .map_err(|e| refuse(format!("is unreadable ({e})")))
}

/// The settings a resumed run takes from its checkpoint unless a flag gives another.
struct Resumed<'m> {
    meta: Option<&'m CheckpointMeta>,
    root: bool,
}

impl Resumed<'_> {
    /// `given` (the flag `flag`), else the checkpoint's `key` when resuming, else `default`.
    /// A flag that changes a resumed run's value is taken and said in one line (rank 0).
    fn get<T>(&self, flag: &str, key: &str, given: Option<T>, default: T) -> Result<T>
    where
        T: Copy + PartialEq + std::fmt::Display + serde::de::DeserializeOwned,
    {
        let saved = saved_setting::<T>(self.meta, key)?;
        Ok(match (given, saved) {
            (Some(g), Some(s)) if g != s => {
                if self.root {
                    crate::say!("note: {flag} {g} from here on (the checkpoint's run had {s})");
                }
                g
            }
            (Some(g), _) => g,
            (None, Some(s)) => s,
            (None, None) => default,
        })
    }
}

/// The run's seed: `--seed`, or the checkpoint's when resuming.
fn run_seed(args: &TrainArgs, resumed: Option<&CheckpointMeta>) -> Result<u64> {
    let why = "it fixes the data order";
    fixed_by_checkpoint("--seed", args.seed, resumed.map(|m| m.seed), DEFAULT_SEED, why)
}

/// `--resume` takes a training run's checkpoint, not an imported one; `--init-from` fixes the
/// model, so model flags are refused with it.
fn weights_from(args: &TrainArgs, resumed: Option<&CheckpointMeta>, init: Option<&CheckpointMeta>) -> Result<()> {
    if resumed.is_some_and(crate::interop::is_imported) {
        crate::bail_input!(
            "cannot resume: this checkpoint was made by `import`, not by a run: start from it with --init-from"
        );
    }
    if init.is_some() && args.model.given() {
        crate::bail_input!("--init-from takes the model from the checkpoint: leave out --model, --layers, --heads, --width and --max-seq-len");
    }
    Ok(())
}

/// The tokenizer, model, batch and sequence length of a run: from the flags, or from the
/// checkpoint when resuming (its model and tokenizer also with --init-from).
fn run_model(
    args: &TrainArgs,
    model_from: Option<&CheckpointMeta>,
    resumed: Option<&CheckpointMeta>,
    world: usize,
) -> Result<(Tokenizer, ModelConfig, usize, usize)> {
    let tok_kind = match model_from {
        Some(m) => {
            let saved = TokenizerKind::from_checkpoint(&m.tokenizer)?;
            if let Some(given) = args.tokenizer.filter(|&k| k != saved) {
                let cannot = if resumed.is_some() {
                    "cannot resume"
                } else {
                    "cannot start from it"
                };
                crate::bail_input!(
                    "{cannot}: the checkpoint was trained with --tokenizer {} but the flags ask for {}",
                    saved.name(),
                    given.name()
                );
            }
            saved
        }
        None => args.tokenizer.unwrap_or(TokenizerKind::Byte),
    };
    let tok = Tokenizer::new(tok_kind)?;
    let vocab = tok.vocab_size();
    let config = match model_from {
        Some(meta) => {
            if args.model.given() {
                checkpoint::check_compatible(meta, &args.model.config(vocab)?, tok_kind.name())?;
            }
            meta.config
        }
        None => args.model.config(vocab)?,
    };
    // The data cursor counts windows of this batch and length.
    let why = "the data cursor counts windows of it";
    let b = fixed_by_checkpoint(
        "--batch",
        args.batch,
        saved_setting(resumed, "batch")?,
        DEFAULT_BATCH,
        why,
    )?;
    let t = fixed_by_checkpoint(
        "--seq-len",
        args.seq_len,
        saved_setting(resumed, "seq_len")?,
        DEFAULT_SEQ_LEN,
        why,
    )?;
    if resumed.is_some() && !b.is_multiple_of(world) {
        // The batch is the checkpoint's and cannot change: the rank count can.
        crate::bail_input!(
            "the checkpoint's run has --batch {b}, which {world} ranks do not divide: resume on {} rank(s)",
            crate::comm::ranks_dividing(&[b])
        );
    }
    validate_shape(&config, b, t, world)?;
    Ok((tok, config, b, t))
}

/// Batch and sequence length must fit the model and split evenly over the ranks.
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

/// Refuses a model whose heads the backend's attention cannot run (see
/// [`Backend::attention_refuses`]), in one line before anything is allocated.
pub fn check_heads<B: Backend>(be: &B, config: &ModelConfig) -> Result<()> {
    match be.attention_refuses(config.n_embd / config.n_head) {
        Some(why) => crate::bail_input!("{why}"),
        None => Ok(()),
    }
}

/// Refuses a model and batch that cannot fit before anything is allocated: a head size the
/// backend's attention cannot run, a tensor beyond the kernels' 32-bit indices, or (a lower
/// bound of) parameters, gradients, AdamW moments, activations and, under `fp8`, the block
/// weights' FP8 copies beyond the backend's memory. `b` is a micro-batch's rows on one
/// process, of `micro_batches` a step (above 1: the gradient buffer a later micro-batch
/// writes apart).
pub fn check_fits<B: Backend>(
    be: &B,
    config: &ModelConfig,
    (b, t): (usize, usize),
    micro_batches: usize,
    fp8: bool,
) -> Result<()> {
    check_heads(be, config)?;
    let saved = be.attention_saved_len(b, t, config.n_head);
    let (largest, activations) = config.activation_values(b, t, saved);
    if largest >= crate::backend::MAX_TENSOR_VALUES as u128 {
        crate::bail_input!(
            "a batch of {b}×{t} is too large for this model: one activation would hold {largest} values (at most 2^31)"
        );
    }
    // f32 parameters, gradients and moments (+ the bf16 copy, + a micro-batch's gradients),
    // activations in their type.
    let act = be.act().bytes() as u128;
    let copy = if act < 4 { act } else { 0 };
    let apart = if micro_batches > 1 { 4 } else { 0 };
    // --precision fp8: two FP8 copies of each block weight (the products' 12·C² a block).
    let fp8_copies = if fp8 {
        2 * 12 * (config.n_layer * config.n_embd * config.n_embd) as u128
    } else {
        0
    };
    let bytes = (16 + copy + apart) * config.num_params() as u128 + act * activations + fp8_copies;
    if let Some(capacity) = be.memory_capacity_bytes().filter(|&c| bytes > c as u128) {
        let gib = |x: u128| x as f64 / (1u64 << 30) as f64;
        crate::bail_input!(
            "a batch of {b}×{t} needs at least {:.1} GiB (parameters, gradients, AdamW moments, activations) but {} has {:.1} GiB",
            gib(bytes),
            be.name(),
            gib(capacity as u128)
        );
    }
    Ok(())
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
