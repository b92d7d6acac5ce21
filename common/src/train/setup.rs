//! Setting a run up before its first step: the same flags and binary on every rank, the
//! model and tokenizer (from the flags, or from the checkpoint when resuming), the corpus
//! (read by rank 0, sent to all), the split and the loader, the schedule, and the
//! parameters (initialised, or restored). Every failure stops every rank together.

use super::trainer::{Trainer, TrainerSettings};
use crate::backend::Backend;
use crate::checkpoint::{self, CheckpointMeta};
use crate::cli::TrainArgs;
use crate::comm::{agree, check_same_everywhere, from_root, Comm};
use crate::data::{self, Batch, DataCursor, Loader};
use crate::error::{Error, Result};
use crate::model::ModelConfig;
use crate::optim::OptimConfig;
use crate::tokenizer::{Tokenizer, TokenizerKind};
use std::path::Path;

/// Everything a run needs once it is set up.
pub struct Run<'a, B: Backend> {
    pub trainer: Trainer<'a, B>,
    pub loader: Loader,
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
    /// The run's settings, saved in checkpoints.
    settings: serde_json::Value,
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
        let (tok, config) = agree(comm, run_model(args, resumed.as_ref(), world))?;
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

        let steps_per_epoch = loader.steps_per_epoch();
        let total_steps = match (args.steps, args.epochs) {
            (Some(s), _) => s,
            (None, Some(e)) => (e * steps_per_epoch as f64).ceil() as u64,
            (None, None) => 2 * steps_per_epoch,
        };
        if args.eval_batches == 0 || args.sync.sync_every == Some(0) {
            let e = Error::Input("--eval-batches and --sync-every must be at least 1".into());
            return Err(e.on_every_rank());
        }
        if total_steps == 0 {
            let e = Error::Input("nothing to train: --steps / --epochs give 0 steps".into());
            return Err(e.on_every_rank()); // the same flags everywhere: every rank is here
        }
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
        let sync = args.sync.mode();
        let settings = serde_json::json!({
            "batch": b, "seq_len": t, "lr": args.lr, "warmup": args.warmup, "min_lr_frac": args.min_lr_frac,
            "weight_decay": args.weight_decay, "grad_clip": args.grad_clip, "total_steps": total_steps,
            "val_fraction": args.val_fraction, "world": world, "sync_every": args.sync.sync_every,
        });

        let mut trainer = Trainer::new(be, comm, config, TrainerSettings { optim, sync })?;
        let mut start_step = 0;
        match (&args.resume, &resumed) {
            (Some(path), Some(meta)) => {
                let ckpt = agree(comm, comm.is_root().then(|| checkpoint::load(path)).transpose())?;
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
            eval_every: args.eval_every.unwrap_or(steps_per_epoch).max(1),
            settings,
        })
    }

    /// The checkpoint's metadata after `steps_done` steps, the loader where it is now.
    pub fn checkpoint_meta(&self, steps_done: u64) -> CheckpointMeta {
        let cursor = self.loader.cursor();
        CheckpointMeta {
            config: self.config,
            tokenizer: self.tok.kind().name().to_string(),
            step: steps_done,
            data_epoch: cursor.epoch,
            data_step_in_epoch: cursor.step_in_epoch,
            seed: self.seed,
            train: self.settings.clone(),
        }
    }

    /// The run's first line: backend, tokenizer, model and schedule.
    pub fn describe(&self) -> String {
        let (cfg, world) = (&self.config, self.trainer.comm.size());
        format!(
            "{} | {} | {} params | {} layers, {} heads, width {} | batch {}×{} over {world} rank(s) | {} steps/epoch, {} steps",
            self.trainer.be.name(),
            self.tok.kind().name(),
            cfg.num_params(),
            cfg.n_layer,
            cfg.n_head,
            cfg.n_embd,
            self.batch,
            self.seq_len,
            self.steps_per_epoch,
            self.total_steps
        )
    }
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
fn run_model(args: &TrainArgs, resumed: Option<&CheckpointMeta>, world: usize) -> Result<(Tokenizer, ModelConfig)> {
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
    Ok((tok, config))
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
