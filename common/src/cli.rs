//! The command line shared by all four stages (clap): `train`, `generate`, `tokenize`,
//! `bench`. Each stage binary parses this and runs it on its own backend and comm.

use crate::backend::Precision;
use crate::grad_sync::SyncMode;
use crate::model::{ConfigOverrides, ModelConfig};

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// `--precision`: the GPU backend's arithmetic (mapped onto [`Precision`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionFlag {
    /// Strict IEEE fp32 everywhere.
    Fp32,
    /// fp32 storage, TF32 tensor-core matrix products.
    Tf32,
}

impl From<PrecisionFlag> for Precision {
    fn from(flag: PrecisionFlag) -> Self {
        match flag {
            PrecisionFlag::Fp32 => Precision::Fp32,
            PrecisionFlag::Tf32 => Precision::Tf32,
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Train, sample and benchmark GPT-2 (one model, four execution stages).",
    long_about = "Train, sample and benchmark GPT-2.\n\n\
        The four binaries share this command line and differ only in how they execute:\n  \
        stage0_serial    CPU, one process (the reference)\n  \
        stage1_mpi       CPU data parallelism over MPI: mpirun -n 2 ./stage1_mpi train ...\n  \
        stage2_cuda      one GPU\n  \
        stage3_mpi_cuda  one rank per GPU: mpirun -n 8 -f hostfile ./stage3_mpi_cuda train ...\n\n\
        Quick start: stage0_serial train --data data/tinyshakespeare.txt --out runs/char"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a model; writes OUT/loss.tsv, OUT/model.ckpt and prints the loss table.
    Train(TrainArgs),
    /// Generate text from a checkpoint.
    ///
    /// The text prints as valid UTF-8: newline and tab as they are, other control characters
    /// and invalid bytes escaped (`\x1b`, `\xff`), a backslash doubled (`\\`).
    Generate(GenerateArgs),
    /// Tokenize a text file into llm.c's .bin format (uint16 tokens).
    Tokenize(TokenizeArgs),
    /// Time training steps on random tokens; prints one JSON line last.
    Bench(BenchArgs),
    /// Gather finished runs into OUT/README.md (time and loss tables) and OUT/loss.png.
    Report(ReportArgs),
}

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A finished run: LABEL=DIR (DIR holds loss.tsv and summary.json). Repeat per stage;
    /// the first is the baseline.
    #[arg(long = "run", value_name = "LABEL=DIR", required = true)]
    pub runs: Vec<String>,
    /// Where README.md and loss.png go.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// Model shape: a preset with optional overrides.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model preset: tiny (tests), char (CPU default), gpt2 (124M), gpt2-medium, gpt2-large.
    /// [default: char; when resuming, the checkpoint's]
    #[arg(long = "model")]
    pub preset: Option<String>,
    /// Override the number of transformer blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Override the number of attention heads (must divide --width).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Override the embedding width.
    #[arg(long)]
    pub width: Option<usize>,
    /// Override the longest sequence the position embedding covers.
    #[arg(long)]
    pub max_seq_len: Option<usize>,
}

impl ModelArgs {
    pub fn config(&self, vocab_size: usize) -> crate::Result<ModelConfig> {
        let ov = ConfigOverrides {
            n_layer: self.layers,
            n_head: self.heads,
            n_embd: self.width,
            max_seq_len: self.max_seq_len,
        };
        ModelConfig::from_preset(self.preset.as_deref().unwrap_or("char"), vocab_size, ov)
    }

    /// Was any model flag given explicitly?
    pub fn given(&self) -> bool {
        self.preset.is_some()
            || self.layers.is_some()
            || self.heads.is_some()
            || self.width.is_some()
            || self.max_seq_len.is_some()
    }
}

/// The device a stage computes on. Each flag applies to some stages only (see
/// [`STAGE_FLAGS`]); given to another, it is refused.
#[derive(Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// CPU stages: worker threads per process [default: the host's cores / its ranks].
    #[arg(long)]
    pub threads: Option<usize>,
    /// GPU stages: arithmetic of the matrix products [default: tf32].
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionFlag>,
}

impl DeviceArgs {
    /// Worker threads asked for (0: the default).
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or(0)
    }

    pub fn precision(&self) -> Precision {
        self.precision.unwrap_or(PrecisionFlag::Tf32).into()
    }
}

/// How ranks synchronise (multi-process stages only, see [`STAGE_FLAGS`]).
#[derive(Args, Debug, Clone, Default)]
pub struct SyncArgs {
    /// Multi-process stages: sum each block's gradients while the backward pass goes on
    /// through the blocks below it.
    #[arg(long)]
    pub overlap: bool,
    /// Multi-process stages: local SGD, average parameters every K steps instead of
    /// gradients every step.
    #[arg(long, value_name = "K")]
    pub sync_every: Option<u64>,
}

impl SyncArgs {
    /// How gradients are synchronised across ranks.
    pub fn mode(&self) -> SyncMode {
        match (self.sync_every, self.overlap) {
            (Some(every), _) => SyncMode::LocalSgd { every },
            (None, true) => SyncMode::Overlapped,
            (None, false) => SyncMode::Allreduce,
        }
    }
}

/// Where a stage runs, which decides the execution flags that apply to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageKind {
    pub gpu: bool,
    /// Several processes (MPI ranks).
    pub distributed: bool,
}

/// (clap id, the stages it applies to in words, the same as a test).
pub type StageFlag = (&'static str, &'static str, fn(StageKind) -> bool);

/// Flags (by clap id) that apply to some stages only: given to another stage, each is
/// refused with one line instead of being ignored.
pub const STAGE_FLAGS: &[StageFlag] = &[
    ("threads", "the CPU stages (stage0_serial, stage1_mpi)", |s| !s.gpu),
    ("precision", "the GPU stages (stage2_cuda, stage3_mpi_cuda)", |s| s.gpu),
    (
        "overlap",
        "the multi-process stages (stage1_mpi, stage3_mpi_cuda)",
        |s| s.distributed,
    ),
    (
        "sync_every",
        "the multi-process stages (stage1_mpi, stage3_mpi_cuda)",
        |s| s.distributed,
    ),
];

/// Pairs of flags (by clap id) refused together, and why.
pub const CONFLICTS: &[(&str, &str, &str)] = &[
    (
        "overlap",
        "sync_every",
        "local SGD sums no gradients during backward, so there is nothing to overlap",
    ),
    ("steps", "epochs", "both set the length of the run"),
    (
        "greedy",
        "temperature",
        "greedy decoding takes the most likely token and never samples",
    ),
    (
        "greedy",
        "top_k",
        "greedy decoding takes the most likely token and never samples",
    ),
];

/// `sync_every` → `--sync-every`.
pub fn flag_name(id: &str) -> String {
    format!("--{}", id.replace('_', "-"))
}

/// Refuses a flag given to a stage it does not apply to, and a pair of conflicting flags,
/// with one line each. `matches` is the whole command line's.
pub fn check_flags(matches: &clap::ArgMatches, stage: StageKind, stage_name: &str) -> Result<(), String> {
    let Some((_, sub)) = matches.subcommand() else {
        return Ok(());
    };
    let given = |id: &str| {
        sub.ids().any(|i| i.as_str() == id) && sub.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
    };
    for &(id, applies_to, applies) in STAGE_FLAGS {
        if given(id) && !applies(stage) {
            return Err(format!(
                "{} applies to {applies_to} only; {stage_name} does not use it",
                flag_name(id)
            ));
        }
    }
    for &(a, b, why) in CONFLICTS {
        if given(a) && given(b) {
            return Err(format!("{} cannot be used with {}: {why}", flag_name(a), flag_name(b)));
        }
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// Training corpus: a UTF-8 text file, or a .bin of tokens (see `tokenize`).
    #[arg(long)]
    pub data: PathBuf,
    /// Output directory for loss.tsv and checkpoints (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tokenizer for text input: byte (256 symbols) or gpt2 (BPE, 50257).
    #[arg(long, value_enum, default_value_t = crate::tokenizer::TokenizerKind::Byte)]
    pub tokenizer: crate::tokenizer::TokenizerKind,
    /// Optimizer steps to run (default: 2 epochs' worth).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Passes over the training windows (an epoch visits each window once).
    #[arg(long)]
    pub epochs: Option<f64>,
    /// Global batch size, in sequences (split over ranks).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Sequence length T (at most the model's max sequence length).
    #[arg(long, default_value_t = 128)]
    pub seq_len: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f32,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 50)]
    pub warmup: u64,
    /// The cosine schedule ends at lr × this.
    #[arg(long, default_value_t = 0.1)]
    pub min_lr_frac: f32,
    /// AdamW decoupled weight decay (matrices and embeddings only).
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f32,
    /// Clip the global gradient norm to this (0: off).
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f32,
    /// Seed for initialisation and data order.
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// Evaluate and write a loss.tsv row every N steps (default: once per epoch).
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Validation batches per evaluation (at most).
    #[arg(long, default_value_t = 20)]
    pub eval_batches: usize,
    /// Fraction of the corpus held out for validation (taken from the end).
    #[arg(long, default_value_t = 0.1)]
    pub val_fraction: f32,
    /// Save OUT/model.ckpt every N steps as well as at the end (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Continue the run saved in this checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Length of the sample printed after training (0: none).
    #[arg(long, default_value_t = 400)]
    pub sample_len: usize,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub sync: SyncArgs,
}

#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// Checkpoint written by `train`.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Text to continue.
    #[arg(long, default_value = "\n")]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 300)]
    pub max_new_tokens: usize,
    /// Pick the most likely token each time (deterministic).
    #[arg(long)]
    pub greedy: bool,
    /// Softmax temperature for sampling.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Sampling seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    #[command(flatten)]
    pub device: DeviceArgs,
}

#[derive(Args, Debug, Clone)]
pub struct TokenizeArgs {
    /// UTF-8 text file.
    #[arg(long)]
    pub input: PathBuf,
    /// Output .bin (llm.c layout: 256 int32 header, then uint16 tokens).
    #[arg(long)]
    pub output: PathBuf,
    #[arg(long, value_enum, default_value_t = crate::tokenizer::TokenizerKind::Gpt2)]
    pub tokenizer: crate::tokenizer::TokenizerKind,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Vocabulary size of the random tokens (50257 = GPT-2's).
    #[arg(long, default_value_t = 50257)]
    pub vocab: usize,
    /// Batch size per process.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    #[arg(long, default_value_t = 64)]
    pub seq_len: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Untimed steps first.
    #[arg(long, default_value_t = 2)]
    pub warmup: u64,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub sync: SyncArgs,
}
