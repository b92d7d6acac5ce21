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

impl Cli {
    /// The command line's grammar, with negative numbers read as values (so `--lr -1` is
    /// refused for its value, naming --lr, rather than as an unknown flag `-1`).
    pub fn grammar() -> clap::Command {
        <Cli as clap::CommandFactory>::command().mut_subcommands(|sub| {
            sub.mut_args(|arg| {
                let takes_value = arg.get_action().takes_values();
                arg.allow_negative_numbers(takes_value)
            })
        })
    }
}

#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant, reason = "parsed once per process")]
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
    #[arg(long, value_parser = at_least_one)]
    pub layers: Option<usize>,
    /// Override the number of attention heads (must divide --width).
    #[arg(long, value_parser = at_least_one)]
    pub heads: Option<usize>,
    /// Override the embedding width.
    #[arg(long, value_parser = at_least_one)]
    pub width: Option<usize>,
    /// Override the longest sequence the position embedding covers.
    #[arg(long, value_parser = at_least_one)]
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
    /// CPU stages: worker threads per process, at most 4 per core [default: the host's
    /// cores / its ranks].
    #[arg(long, value_parser = thread_count)]
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
    #[arg(long, value_name = "K", value_parser = at_least_one_u64)]
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
    /// Tokenizer for text input: byte (256 symbols) or gpt2 (BPE, 50257) [default: byte;
    /// when resuming, the checkpoint's].
    #[arg(long, value_enum)]
    pub tokenizer: Option<crate::tokenizer::TokenizerKind>,
    /// Optimizer steps to run [default: 2 epochs' worth; when resuming, the checkpoint's].
    #[arg(long, value_parser = at_least_one_u64)]
    pub steps: Option<u64>,
    /// Passes over the training windows (an epoch visits each window once).
    #[arg(long, value_parser = positive_f64)]
    pub epochs: Option<f64>,
    /// Global batch size, in sequences, split over ranks [default: 32; when resuming, the
    /// checkpoint's].
    #[arg(long, value_parser = at_least_one)]
    pub batch: Option<usize>,
    /// Sequence length T, at most the model's max sequence length [default: 128; when
    /// resuming, the checkpoint's].
    #[arg(long, value_parser = at_least_one)]
    pub seq_len: Option<usize>,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-3, value_parser = positive_f32)]
    pub lr: f32,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 50)]
    pub warmup: u64,
    /// The cosine schedule ends at lr × this (0 to 1).
    #[arg(long, default_value_t = 0.1, value_parser = fraction_f32)]
    pub min_lr_frac: f32,
    /// AdamW decoupled weight decay (matrices and embeddings only).
    #[arg(long, default_value_t = 0.1, value_parser = non_negative_f32)]
    pub weight_decay: f32,
    /// Clip the global gradient norm to this (0: off).
    #[arg(long, default_value_t = 1.0, value_parser = non_negative_f32)]
    pub grad_clip: f32,
    /// Seed for initialisation and data order [default: 1337; when resuming, the checkpoint's].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Evaluate and write a loss.tsv row every N steps (default: once per epoch).
    #[arg(long, value_parser = at_least_one_u64)]
    pub eval_every: Option<u64>,
    /// Validation batches per evaluation (at most).
    #[arg(long, default_value_t = 20, value_parser = at_least_one)]
    pub eval_batches: usize,
    /// Fraction of the corpus held out for validation (taken from the end; above 0, below 1).
    #[arg(long, default_value_t = 0.1, value_parser = open_fraction_f32)]
    pub val_fraction: f32,
    /// Save OUT/model.ckpt every N steps as well as at the end (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Continue the run saved in this checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// End the run after this many steps (counted from the start of the run, like --steps),
    /// with a checkpoint, without changing the schedule; --resume continues it.
    #[arg(long, value_name = "N", value_parser = at_least_one_u64)]
    pub stop_after: Option<u64>,
    /// Stop after this many consecutive steps with a non-finite loss or gradient norm (each
    /// is skipped: the model is left as it was).
    #[arg(long, default_value_t = 3, value_name = "N", value_parser = at_least_one_u64)]
    pub max_bad_steps: u64,
    /// Length of the sample printed after training (0: none; at most 1,000,000).
    #[arg(long, default_value_t = 400, value_parser = token_count)]
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
    /// Tokens to generate (at most 1,000,000).
    #[arg(long, default_value_t = 300, value_parser = token_count)]
    pub max_new_tokens: usize,
    /// Pick the most likely token each time (deterministic).
    #[arg(long)]
    pub greedy: bool,
    /// Softmax temperature for sampling (above 0).
    #[arg(long, default_value_t = 0.8, value_parser = positive_f32)]
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
    #[arg(long, default_value_t = 50257, value_parser = at_least_one)]
    pub vocab: usize,
    /// Batch size per process.
    #[arg(long, default_value_t = 4, value_parser = at_least_one)]
    pub batch: usize,
    /// Sequence length.
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    pub seq_len: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 10, value_parser = at_least_one_u64)]
    pub steps: u64,
    /// Untimed steps first.
    #[arg(long, default_value_t = 2)]
    pub warmup: u64,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub sync: SyncArgs,
}

// ---- value checks: every numeric flag is checked as it is parsed ------------------------
// (clap prints the message after "invalid value 'X' for '--flag'"; see `app` for the one line)

fn number<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| "not a number".to_string())
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match number::<usize>(s)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

fn at_least_one_u64(s: &str) -> Result<u64, String> {
    match number::<u64>(s)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// `train --seed`, `--batch` and `--seq-len` when none is given (and not resuming).
pub const DEFAULT_SEED: u64 = 1337;
pub const DEFAULT_BATCH: usize = 32;
pub const DEFAULT_SEQ_LEN: usize = 128;

/// The most tokens `generate` and the training sample produce.
pub const MAX_NEW_TOKENS: usize = 1_000_000;

fn token_count(s: &str) -> Result<usize, String> {
    match number::<usize>(s)? {
        n if n > MAX_NEW_TOKENS => Err(format!("must be at most {MAX_NEW_TOKENS}")),
        n => Ok(n),
    }
}

/// Threads per process: at least 1, at most 4 per core of this host.
fn thread_count(s: &str) -> Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match number::<usize>(s)? {
        0 => Err("must be at least 1 (leave --threads out for the default)".into()),
        n if n > 4 * cores => Err(format!(
            "must be at most {} (4 per core; this host has {cores})",
            4 * cores
        )),
        n => Ok(n),
    }
}

fn finite_f32(s: &str) -> Result<f32, String> {
    match number::<f32>(s)? {
        x if x.is_finite() => Ok(x),
        _ => Err("must be a finite number".into()),
    }
}

fn positive_f32(s: &str) -> Result<f32, String> {
    finite_f32(s).and_then(|x| if x > 0.0 { Ok(x) } else { Err("must be above 0".into()) })
}

fn non_negative_f32(s: &str) -> Result<f32, String> {
    finite_f32(s).and_then(|x| {
        if x >= 0.0 {
            Ok(x)
        } else {
            Err("must be 0 or more".into())
        }
    })
}

fn fraction_f32(s: &str) -> Result<f32, String> {
    finite_f32(s).and_then(|x| {
        if (0.0..=1.0).contains(&x) {
            Ok(x)
        } else {
            Err("must be between 0 and 1".into())
        }
    })
}

fn open_fraction_f32(s: &str) -> Result<f32, String> {
    finite_f32(s).and_then(|x| {
        if x > 0.0 && x < 1.0 {
            Ok(x)
        } else {
            Err("must be above 0 and below 1".into())
        }
    })
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match number::<f64>(s)? {
        x if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err("must be a finite number above 0".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values each flag must refuse (both `--flag value` and `--flag=value`), by subcommand
    /// and flag; an empty list marks a flag with nothing numeric to check (paths, names,
    /// switches). Every flag of every subcommand must be listed: see the test below.
    const BAD_VALUES: &[(&str, &str, &[&str])] = &[
        ("train", "data", &[]),
        ("train", "out", &[]),
        ("train", "preset", &[]),
        ("train", "layers", &["0", "-1", "x"]),
        ("train", "heads", &["0", "1.5"]),
        ("train", "width", &["0"]),
        ("train", "max_seq_len", &["0"]),
        ("train", "tokenizer", &["bpe"]),
        ("train", "steps", &["0", "-3"]),
        ("train", "epochs", &["0", "-1", "nan", "inf"]),
        ("train", "batch", &["0", "4000000000000000000000"]),
        ("train", "seq_len", &["0"]),
        ("train", "lr", &["0", "-1", "nan", "inf", "1e99"]),
        ("train", "warmup", &["-1", "nan"]),
        ("train", "min_lr_frac", &["-0.1", "1.5", "nan"]),
        ("train", "weight_decay", &["-1", "nan"]),
        ("train", "grad_clip", &["-1", "nan", "inf"]),
        ("train", "seed", &["-1", "x"]),
        ("train", "eval_every", &["0"]),
        ("train", "eval_batches", &["0"]),
        ("train", "val_fraction", &["0", "1", "nan", "-0.5"]),
        ("train", "checkpoint_every", &["-1"]),
        ("train", "resume", &[]),
        ("train", "stop_after", &["0"]),
        ("train", "max_bad_steps", &["0"]),
        ("train", "sample_len", &["1000001", "18446744073709551615"]),
        ("train", "threads", &["0", "100000"]),
        ("train", "precision", &["fp16"]),
        ("train", "overlap", &[]),
        ("train", "sync_every", &["0"]),
        ("generate", "checkpoint", &[]),
        ("generate", "prompt", &[]),
        ("generate", "max_new_tokens", &["1000001", "18446744073709551615"]),
        ("generate", "greedy", &[]),
        ("generate", "temperature", &["0", "-1", "nan"]),
        ("generate", "top_k", &["-1"]),
        ("generate", "seed", &["-1"]),
        ("generate", "threads", &["0", "100000"]),
        ("generate", "precision", &["bf8"]),
        ("tokenize", "input", &[]),
        ("tokenize", "output", &[]),
        ("tokenize", "tokenizer", &["words"]),
        ("bench", "preset", &[]),
        ("bench", "layers", &["0"]),
        ("bench", "heads", &["0"]),
        ("bench", "width", &["0"]),
        ("bench", "max_seq_len", &["0"]),
        ("bench", "vocab", &["0"]),
        ("bench", "batch", &["0"]),
        ("bench", "seq_len", &["0"]),
        ("bench", "steps", &["0"]),
        ("bench", "warmup", &["-1"]),
        ("bench", "threads", &["0", "100000"]),
        ("bench", "precision", &["fp64"]),
        ("bench", "overlap", &[]),
        ("bench", "sync_every", &["0"]),
        ("report", "runs", &[]),
        ("report", "out", &[]),
    ];

    /// Arguments that make each subcommand parse, before the flag under test.
    fn base(sub: &'static str) -> Vec<&'static str> {
        match sub {
            "train" => vec!["train", "--data", "d", "--out", "o"],
            "generate" => vec!["generate", "--checkpoint", "c"],
            "tokenize" => vec!["tokenize", "--input", "i", "--output", "o"],
            "report" => vec!["report", "--run", "a=b"],
            _ => vec![sub],
        }
    }

    #[test]
    fn every_flag_of_every_subcommand_is_in_the_table() {
        let cli = Cli::grammar();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments().filter(|a| a.get_long().is_some()) {
                let (s, id) = (sub.get_name(), arg.get_id().as_str());
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(
                    BAD_VALUES.iter().any(|&(ts, tid, _)| ts == s && tid == id),
                    "{s} --{}: add it to BAD_VALUES",
                    arg.get_long().unwrap()
                );
            }
        }
    }

    #[test]
    fn every_bad_value_is_refused_in_both_forms() {
        let cli = Cli::grammar();
        for &(sub, id, values) in BAD_VALUES {
            let arg = cli
                .find_subcommand(sub)
                .and_then(|s| s.get_arguments().find(|a| a.get_id() == id))
                .unwrap_or_else(|| panic!("{sub} has no flag {id}"));
            let long = format!("--{}", arg.get_long().unwrap());
            for value in values {
                for form in [vec![long.clone(), value.to_string()], vec![format!("{long}={value}")]] {
                    let mut line = vec!["stage".to_string()];
                    line.extend(base(sub).iter().map(|s| s.to_string()));
                    line.extend(form.iter().cloned());
                    let err = Cli::grammar().try_get_matches_from(&line).err();
                    let err = err.unwrap_or_else(|| panic!("accepted: {line:?}"));
                    let first = err.render().to_string();
                    let first = first.lines().next().unwrap_or("");
                    assert!(first.contains(&long), "{line:?}: the message must name {long}: {first}");
                }
            }
        }
    }
}
