//! The command line shared by all four stages (clap): `train`, `generate`, `export`,
//! `import`, `tokenize`, `bench`, `report`, `plot` and `mnist`. Each stage binary parses this and runs
//! it on its own backend and comm.

mod checks;

pub use checks::{
    check_env, check_flags, conflict_name, conflict_side, flag_name, refused_as_train_flag, StageFlag, StageKind,
    CONFLICTS, DEFAULT_BATCH, DEFAULT_COMM_TIMEOUT, DEFAULT_GRAD_CLIP, DEFAULT_LR, DEFAULT_MIN_LR_FRAC, DEFAULT_SEED,
    DEFAULT_SEQ_LEN, DEFAULT_VAL_FRACTION, DEFAULT_WARMUP, DEFAULT_WEIGHT_DECAY, MAX_NEW_TOKENS, STAGE_FLAGS,
};

use crate::autograd::Recompute;
use crate::backend::Precision;
use crate::grad_sync::{GradComm, SyncMode};
use crate::mnist::{BenchSettings, OptimizerKind, RunSettings};
use crate::model::{ConfigOverrides, ModelConfig};
use checks::{
    at_least_one, at_least_one_u64, bench_steps, bench_warmup, fraction_f32, kernel_tokens, mass_f32, message_mb,
    non_negative_f32, open_fraction_f32, positive_f32, positive_f64, shard_tokens, thread_count, token_count,
    val_tokens, zero_stage,
};

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// `--precision`: the GPU backend's arithmetic (mapped onto [`Precision`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionFlag {
    /// Strict IEEE fp32 everywhere.
    Fp32,
    /// fp32 storage, TF32 tensor-core matrix products.
    Tf32,
    /// bf16 activations and weight copy, fp32 master weights, moments and accumulation.
    Bf16,
    /// bf16, with the transformer blocks' matrix products in FP8 (E4M3 inputs and weights,
    /// E5M2 gradients, delayed per-tensor scales). Hopper GPUs only.
    Fp8,
}

impl From<PrecisionFlag> for Precision {
    fn from(flag: PrecisionFlag) -> Self {
        match flag {
            PrecisionFlag::Fp32 => Precision::Fp32,
            PrecisionFlag::Tf32 => Precision::Tf32,
            PrecisionFlag::Bf16 | PrecisionFlag::Fp8 => Precision::Bf16,
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
    /// Fills in the defaults that depend on the stage (today `--zero`'s); called once the
    /// command line has passed [`check_flags`], so a conflict is judged on what was typed.
    pub fn settle_defaults(&mut self, stage: StageKind) {
        match &mut self.command {
            Command::Train(args) => args.sync.settle_zero(stage),
            Command::Bench(args) => args.sync.settle_zero(stage),
            _ => {}
        }
    }

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
    ///
    /// Ctrl-C, SIGTERM or SIGHUP (to the process, to mpirun, or a scheduler's time limit)
    /// stop the run after the current step: OUT/model.ckpt is saved, and `--resume
    /// OUT/model.ckpt` continues the run as if it had not stopped. SIGQUIT ends a job of
    /// several processes at once, naming the last checkpoint.
    Train(TrainArgs),
    /// Generate text from a checkpoint.
    ///
    /// The text prints as valid UTF-8: newline and tab as they are, other control characters
    /// and invalid bytes escaped (`\x1b`, `\xff`), a backslash doubled (`\\`).
    Generate(GenerateArgs),
    /// Write a checkpoint's model in Hugging Face's format: OUT/model.safetensors,
    /// config.json and the tokenizer files, which `GPT2LMHeadModel.from_pretrained(OUT)` and
    /// `AutoTokenizer.from_pretrained(OUT)` load.
    Export(ExportArgs),
    /// Turn a Hugging Face GPT-2 directory (config.json and model.safetensors) into a
    /// checkpoint, to generate from or to fine-tune with `train --init-from`.
    Import(ImportArgs),
    /// Tokenize a text file into llm.c's .bin format (uint16 tokens), or a corpus of documents
    /// (one a file) into llm.c shards of --shard-tokens, in parallel (--output-dir).
    Tokenize(TokenizeArgs),
    /// Time training steps on random tokens; prints one JSON line last.
    Bench(BenchArgs),
    /// Gather finished runs into OUT/README.md (time and loss tables) and OUT/loss.png.
    Report(ReportArgs),
    /// Draw columns of a tab-separated table as lines into a PNG (the benchmark suite's
    /// plots): one line per --y column and per value of --series.
    Plot(PlotArgs),
    /// Train an MLP classifier on MNIST-style idx files (by default Debian's Fashion-MNIST);
    /// prints and writes OUT/loss.tsv (epoch, losses, test accuracy).
    Mnist(MnistArgs),
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

#[derive(Args, Debug, Clone)]
pub struct PlotArgs {
    /// The table: tab-separated, its first line naming the columns.
    #[arg(long)]
    pub data: PathBuf,
    /// The column along the x axis.
    #[arg(long)]
    pub x: String,
    /// A column to draw against it (repeat for more).
    #[arg(long, required = true)]
    pub y: Vec<String>,
    /// A column whose values each get lines of their own (rows in the table's order).
    #[arg(long)]
    pub series: Option<String>,
    /// The PNG to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Logarithmic x axis.
    #[arg(long)]
    pub log_x: bool,
    /// Logarithmic y axis.
    #[arg(long)]
    pub log_y: bool,
    /// The chart's title.
    #[arg(long)]
    pub title: Option<String>,
}

impl PlotArgs {
    /// The chart these flags ask for.
    pub fn chart(&self) -> crate::report::Chart {
        crate::report::Chart {
            data: self.data.clone(),
            x: self.x.clone(),
            y: self.y.clone(),
            series: self.series.clone(),
            out: self.out.clone(),
            log_x: self.log_x,
            log_y: self.log_y,
            title: self.title.clone(),
        }
    }
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
    /// GPU stages: storage and arithmetic: fp32, tf32 (fp32 storage, TF32 matrix products),
    /// bf16 (mixed precision: bf16 activations, fp32 master weights, gradients and moments)
    /// or fp8 (bf16 with the transformer blocks' products in FP8; Hopper only) [default: bf16].
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionFlag>,
}

impl DeviceArgs {
    /// Worker threads asked for (0: the default).
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or(0)
    }

    pub fn precision(&self) -> Precision {
        self.precision.unwrap_or(PrecisionFlag::Bf16).into()
    }

    /// `--precision fp8`: the blocks' products in FP8 on the bf16 backend.
    pub fn fp8(&self) -> bool {
        self.precision == Some(PrecisionFlag::Fp8)
    }

    /// The precision's name, as runs record it.
    pub fn precision_name(&self) -> &'static str {
        match self.fp8() {
            true => "fp8",
            false => self.precision().name(),
        }
    }
}

/// How ranks synchronise (multi-process stages only, see [`STAGE_FLAGS`]).
#[derive(Args, Debug, Clone, Default)]
pub struct SyncArgs {
    /// Multi-process stages: sum each block's gradients while the backward pass goes on
    /// through the blocks below it.
    #[arg(long)]
    pub overlap: bool,
    /// Multi-process stages: --overlap with buckets of consecutive blocks, gathered from the
    /// last block down until each holds at least MB MiB of fp32 gradients (implies --overlap)
    /// [default: one bucket per block].
    #[arg(long, value_name = "MB", value_parser = positive_f32)]
    pub bucket_mb: Option<f32>,
    /// Multi-process stages: local SGD, average parameters every K steps instead of
    /// gradients every step.
    #[arg(long, value_name = "K", value_parser = at_least_one_u64)]
    pub sync_every: Option<u64>,
    /// Multi-process stages: ZeRO stage. 1: AdamW's moments cut over the ranks (gradients
    /// reduce-scattered, each rank updates its 1/N of the weights, which are then
    /// all-gathered): faster on GPUs, with less memory; 0: every rank keeps all, faster over
    /// MPI on CPUs [default: 1 on stage3_mpi_cuda, 0 there with --sync-every; 0 on stage1_mpi].
    #[arg(long, value_name = "STAGE", value_parser = zero_stage)]
    pub zero: Option<u8>,
    /// Multi-process stages: what the gradient sums carry: fp32, or bf16 (the gradients
    /// rounded to bf16 and summed in bf16: half the bytes on the wire; back into f32
    /// gradients on each rank) [default: fp32].
    #[arg(long, value_enum, value_name = "TYPE")]
    pub grad_comm: Option<GradComm>,
}

impl SyncArgs {
    /// ZeRO-1 asked for (after [`Cli::settle_defaults`], the stage's default where not).
    pub fn zero(&self) -> bool {
        self.zero == Some(1)
    }

    /// `--zero` not given: 1 on the GPU stage whose ranks sum gradients every step (faster
    /// there, with less memory: results/scaling.md), 0 under local SGD (whole optimisers)
    /// and on the CPU stage (MPI's reduce-scatter and all-gather take longer than its
    /// allreduce: results/bench/zero-cpu.md).
    fn settle_zero(&mut self, stage: StageKind) {
        let sums_every_step = self.sync_every.is_none();
        self.zero
            .get_or_insert((stage.gpu && stage.distributed && sums_every_step) as u8);
    }

    /// What the gradient sums carry.
    pub fn grad_comm(&self) -> GradComm {
        self.grad_comm.unwrap_or_default()
    }

    /// How gradients are synchronised across ranks.
    pub fn mode(&self) -> SyncMode {
        match (self.sync_every, self.overlap || self.bucket_mb.is_some()) {
            (Some(every), _) => SyncMode::LocalSgd { every },
            (None, true) => SyncMode::Overlapped {
                bucket: self
                    .bucket_mb
                    .map_or(0, |mb| (mb as f64 * (1 << 20) as f64 / 4.0).ceil() as usize),
            },
            (None, false) => SyncMode::Allreduce,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// Training corpus: a UTF-8 text file or a .bin of tokens (see `tokenize`), its tail held
    /// out for validation; or llm.c .bin shards, streamed: a directory (its *_val_* shards
    /// validate), a quoted pattern ('shards/*_train_*.bin') or several paths, sorted by name.
    #[arg(long, num_args = 1.., required = true, value_name = "FILE|DIR|GLOB")]
    pub data: Vec<PathBuf>,
    /// Validation set: a text or .bin file, a quoted pattern of .bin shards, or a directory's
    /// *_val_* shards [default: the tail of a single --data file (--val-fraction), or the
    /// *_val_* shards of a --data directory].
    #[arg(long, value_name = "FILE|GLOB")]
    pub val_data: Option<PathBuf>,
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
    /// Peak learning rate [default: 3e-3; when resuming, the checkpoint's].
    #[arg(long, value_parser = positive_f32)]
    pub lr: Option<f32>,
    /// Linear warmup steps [default: 50; when resuming, the checkpoint's].
    #[arg(long)]
    pub warmup: Option<u64>,
    /// The cosine schedule ends at lr × this, 0 to 1 [default: 0.1; when resuming, the
    /// checkpoint's].
    #[arg(long, value_parser = fraction_f32)]
    pub min_lr_frac: Option<f32>,
    /// AdamW decoupled weight decay, matrices and embeddings only [default: 0.1; when
    /// resuming, the checkpoint's].
    #[arg(long, value_parser = non_negative_f32)]
    pub weight_decay: Option<f32>,
    /// Clip the global gradient norm to this, 0: off [default: 1.0; when resuming, the
    /// checkpoint's].
    #[arg(long, value_parser = non_negative_f32)]
    pub grad_clip: Option<f32>,
    /// Seed for initialisation and data order [default: 1337; when resuming, the checkpoint's].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Evaluate and write a loss.tsv row every N steps [default: once per epoch; when
    /// resuming, the checkpoint's].
    #[arg(long, value_parser = at_least_one_u64)]
    pub eval_every: Option<u64>,
    /// Validation batches per evaluation (at most).
    #[arg(long, default_value_t = 20, value_parser = at_least_one)]
    pub eval_batches: usize,
    /// Fraction of the corpus held out for validation, taken from the end; above 0, below 1
    /// [default: 0.1; when resuming, the checkpoint's].
    #[arg(long, value_parser = open_fraction_f32)]
    pub val_fraction: Option<f32>,
    /// Save OUT/model.ckpt every N steps as well as at the end (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Continue the run saved in this checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// With --resume: go on with a corpus other than the one the checkpoint's run trained on
    /// (the checkpoint records its name, size and first and last MiB; another corpus is
    /// refused without this flag).
    #[arg(long, requires = "resume")]
    pub resume_on_new_data: bool,
    /// Start a new run from this checkpoint's weights (fine-tuning): its model and tokenizer,
    /// with a fresh optimizer, data order, schedule and log (unlike --resume, which continues
    /// the same run). From `train` or `import`.
    #[arg(long, value_name = "CHECKPOINT")]
    pub init_from: Option<PathBuf>,
    /// End the run after this many steps (counted from the start of the run, like --steps),
    /// with a checkpoint, without changing the schedule; --resume continues it.
    #[arg(long, value_name = "N", value_parser = at_least_one_u64)]
    pub stop_after: Option<u64>,
    /// Stop after this many consecutive steps with a non-finite loss or gradient norm (each
    /// is skipped: the model is left as it was).
    #[arg(long, default_value_t = 3, value_name = "N", value_parser = at_least_one_u64)]
    pub max_bad_steps: u64,
    /// Micro-batches per optimizer step (gradient accumulation): each rank's share of
    /// --batch is cut into K pieces whose gradients add up before the ranks meet, so one
    /// GPU can reproduce a multi-GPU global batch [default: 1; when resuming, the
    /// checkpoint's].
    #[arg(long, value_name = "K", value_parser = at_least_one)]
    pub grad_accum: Option<usize>,
    /// Compute these outputs again in the backward pass instead of keeping them from the
    /// forward pass: `layernorm` (two of a block's five (B·T, C) activations), `all` (and the
    /// GELUs': about a third of the activations; `--recompute` alone), or `none`. Less memory,
    /// a little slower; the results are the same, bit for bit.
    #[arg(long, value_enum, value_name = "WHAT", num_args = 0..=1, default_value = "none",
          default_missing_value = "all")]
    pub recompute: Recompute,
    /// Multi-process stages: end the job when a rank makes no progress for this many seconds
    /// (another rank stopped or hung in a collective); keep it above the time of an
    /// evaluation or a checkpoint write [default: 300].
    #[arg(long, value_name = "SECONDS", value_parser = at_least_one_u64)]
    pub comm_timeout: Option<u64>,
    /// Length of the sample printed after training (0: none; at most 1,000,000).
    #[arg(long, default_value_t = 400, value_parser = token_count)]
    pub sample_len: usize,
    /// Write every step's batch to FILE, in the order trained on (raw little-endian int32: per
    /// step the inputs, B×T, then the targets), and at the end FILE.json: the shape, the
    /// optimiser's settings and every step's loss, learning rate and gradient norm. For
    /// training another implementation on the same data (gpu/py/pytorch_train_compare.py).
    /// One process only.
    #[arg(long, value_name = "FILE")]
    pub dump_batches: Option<PathBuf>,
    /// Also save the weights before the first step as OUT/init.ckpt (a checkpoint at step 0,
    /// which `export` turns into Hugging Face's format and `--resume` restarts from).
    #[arg(long)]
    pub save_init: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub sync: SyncArgs,
}

/// `mnist --optimizer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OptimizerFlag {
    /// SGD with momentum (--momentum).
    Sgd,
    /// AdamW (betas 0.9, 0.999).
    Adamw,
}

#[derive(Args, Debug, Clone)]
pub struct MnistArgs {
    /// Training images, an idx file (gzipped or not) [default: Debian's dataset-fashion-mnist,
    /// which `make run-mnist` installs]. The four files go together.
    #[arg(long, requires_all = ["train_labels", "test_images", "test_labels"])]
    pub train_images: Option<PathBuf>,
    /// Training labels, an idx file (gzipped or not).
    #[arg(long, requires_all = ["train_images", "test_images", "test_labels"])]
    pub train_labels: Option<PathBuf>,
    /// Test images, an idx file (gzipped or not).
    #[arg(long, requires_all = ["train_images", "train_labels", "test_labels"])]
    pub test_images: Option<PathBuf>,
    /// Test labels, an idx file (gzipped or not).
    #[arg(long, requires_all = ["train_images", "train_labels", "test_images"])]
    pub test_labels: Option<PathBuf>,
    /// Output directory for loss.tsv and the checkpoint mlp.ckpt (created if missing).
    #[arg(long, default_value = "runs/mnist")]
    pub out: PathBuf,
    /// Continue the run saved in this checkpoint (an OUT/mlp.ckpt), given the flags it was
    /// started with: it ends with the table and weights of the run never stopped. Ctrl-C,
    /// SIGTERM and SIGHUP stop a run after its current step with such a checkpoint; one is
    /// also written at the end, and after an epoch once 30 s have passed since the last.
    #[arg(long, value_name = "CHECKPOINT", conflicts_with_all = ["bench", "trace"])]
    pub resume: Option<PathBuf>,
    /// End the run after this many steps (counted from its start), with a checkpoint, without
    /// changing the schedule; --resume continues it.
    #[arg(long, value_name = "N", value_parser = at_least_one_u64, conflicts_with = "bench")]
    pub stop_after: Option<u64>,
    /// Widths of the hidden layers, comma-separated (the input width comes from the images,
    /// the output is the 10 classes).
    #[arg(long, value_delimiter = ',', default_value = "256,128", value_parser = at_least_one)]
    pub hidden: Vec<usize>,
    /// Passes over the training images.
    #[arg(long, default_value_t = 20, value_parser = at_least_one_u64)]
    pub epochs: u64,
    /// Global batch size, in images, split over ranks.
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    pub batch: usize,
    /// The optimiser.
    #[arg(long, value_enum, default_value_t = OptimizerFlag::Sgd)]
    pub optimizer: OptimizerFlag,
    /// Peak learning rate; it decays along a cosine to 0 over the run [default: 0.05 with
    /// sgd, 1e-3 with adamw].
    #[arg(long, value_parser = positive_f32)]
    pub lr: Option<f32>,
    /// SGD's momentum, 0 to 1 (--optimizer sgd only) [default: 0.9].
    #[arg(long, value_parser = fraction_f32)]
    pub momentum: Option<f32>,
    /// Weight decay of the weight matrices (not the biases): L2 with sgd, decoupled with adamw.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative_f32)]
    pub weight_decay: f32,
    /// Seed for initialisation and data order.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Made-up images of MNIST's form instead of files: 60,000 training and 10,000 test images
    /// of 28 × 28 pixels (each class lights its own band of rows and columns over noise), the
    /// same every run. For speed figures where the real files are not at hand.
    #[arg(long, conflicts_with_all = ["train_images", "train_labels", "test_images", "test_labels"])]
    pub synthetic: bool,
    /// Also write into OUT/trace/ what another framework needs to repeat the run step for step:
    /// the initial parameters (init.f32, the flat layout, little-endian), every step's images
    /// (order.i32), every step's learning rate and loss (steps.tsv), the settings
    /// (settings.json), and with --synthetic the training set (idx files). A run stopped
    /// early leaves the trace of its whole epochs; a trace cannot be continued (--resume).
    #[arg(long, conflicts_with = "bench")]
    pub trace: bool,
    /// Time training steps instead of training: --warmup steps, then --steps timed ones, on
    /// the training images (made up unless the four files are given); one JSON line, no test
    /// set, no loss.tsv. On one rank with SGD the fused step (the update inside backward; on
    /// one GPU: data on the GPU, one CUDA graph replay a step), else the generic one.
    #[arg(long)]
    pub bench: bool,
    /// With --bench: the sweep, batch 32, 128 and 512 × three hidden layers of 64, 256 or 1024,
    /// one JSON line each (--batch and --hidden are not used).
    #[arg(long, requires = "bench")]
    pub sweep: bool,
    /// With --bench: timed steps, at most 1,000,000 [default: 5000].
    #[arg(long, requires = "bench", value_parser = bench_steps)]
    pub steps: Option<u64>,
    /// With --bench: untimed steps first, at most 1,000,000 [default: 200].
    #[arg(long, requires = "bench", value_parser = bench_warmup)]
    pub warmup: Option<u64>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

impl MnistArgs {
    /// `--lr`, or the optimiser's default.
    pub fn lr(&self) -> f32 {
        self.lr.unwrap_or(match self.optimizer {
            OptimizerFlag::Sgd => 0.05,
            OptimizerFlag::Adamw => 1e-3,
        })
    }

    /// `--momentum` (0.9 when not given); refused with AdamW, which has none.
    pub fn momentum(&self) -> crate::Result<f32> {
        match (self.optimizer, self.momentum) {
            (OptimizerFlag::Adamw, Some(_)) => {
                crate::bail_input!("--momentum applies to --optimizer sgd only (AdamW's betas are fixed)")
            }
            (_, m) => Ok(m.unwrap_or(0.9)),
        }
    }

    /// The run these flags ask for, defaults filled in; `--momentum` with AdamW is refused
    /// (on every rank: the flags are the same everywhere).
    pub fn settings(&self) -> crate::Result<RunSettings> {
        let momentum = self.momentum().map_err(crate::Error::on_every_rank)?;
        // clap makes sure all four files or none are given.
        let files = match (
            &self.train_images,
            &self.train_labels,
            &self.test_images,
            &self.test_labels,
        ) {
            (Some(a), Some(b), Some(c), Some(d)) => Some([a.clone(), b.clone(), c.clone(), d.clone()]),
            _ => None,
        };
        let bench = self.bench.then(|| BenchSettings {
            sweep: self.sweep,
            warmup: self.warmup.unwrap_or(200),
            steps: self.steps.unwrap_or(5000),
        });
        Ok(RunSettings {
            files,
            synthetic: self.synthetic,
            out: self.out.clone(),
            resume: self.resume.clone(),
            stop_after: self.stop_after,
            hidden: self.hidden.clone(),
            epochs: self.epochs,
            batch: self.batch,
            optimizer: self.optimizer.into(),
            lr: self.lr(),
            momentum,
            weight_decay: self.weight_decay,
            seed: self.seed,
            trace: self.trace,
            bench,
        })
    }
}

impl From<OptimizerFlag> for OptimizerKind {
    fn from(flag: OptimizerFlag) -> Self {
        match flag {
            OptimizerFlag::Sgd => OptimizerKind::Sgd,
            OptimizerFlag::Adamw => OptimizerKind::AdamW,
        }
    }
}

/// The small trained model that ships with the project (Tiny Shakespeare, the char preset, in
/// Hugging Face's format; `data/make-char-model.sh` made it): `generate`'s default.
pub const SHIPPED_MODEL: &str = "data/shakespeare-char";

#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// Checkpoint written by `train` or `import`, or a Hugging Face GPT-2 directory (what
    /// `export` writes) [default: the small Shakespeare model that ships in
    /// data/shakespeare-char, found from the working directory or else in this build's source
    /// tree].
    #[arg(long, value_name = "CHECKPOINT|DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Text to continue.
    #[arg(long, default_value = "\n")]
    pub prompt: String,
    /// A batch of prompts, one a line (empty lines skipped): each completion is printed after
    /// a line `--- prompt N ---`, in the file's order. Prompt N samples from its own stream of
    /// --seed, so its text does not depend on the other lines.
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// Tokens to generate (at most 1,000,000). Generation also stops at end-of-text (GPT-2
    /// BPE models), at --stop, and where the prompt and new tokens fill the model's context
    /// (its training sequence length; the window does not slide), which it says in one line.
    #[arg(long, default_value_t = 300, value_parser = token_count)]
    pub max_new_tokens: usize,
    /// Stop when the text generated contains STRING (not printed), as shown (escapes included).
    #[arg(long, value_name = "STRING")]
    pub stop: Option<String>,
    /// Pick the most likely token each time (deterministic).
    #[arg(long)]
    pub greedy: bool,
    /// Softmax temperature for sampling (above 0).
    #[arg(long, default_value_t = 0.8, value_parser = positive_f32)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Then among the most likely tokens whose probabilities add up to P only (nucleus
    /// sampling; above 0, at most 1; 1: all).
    #[arg(long, default_value_t = 1.0, value_parser = mass_f32)]
    pub top_p: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Run the whole sequence through the model for every new token instead of keeping
    /// each position's keys and values (slower; the reference the cache is tested against).
    #[arg(long)]
    pub no_kv_cache: bool,
    /// Write the logits of every position of the prompt (one forward pass over it, the real
    /// vocabulary's columns) to FILE as JSON, {"prompt": TEXT, "tokens": [...], "logits": [[...], ...]}, and
    /// generate nothing: for comparing with another implementation (gpu/py/hf_check.py).
    #[arg(long, value_name = "FILE")]
    pub dump_logits: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

impl GenerateArgs {
    /// `--checkpoint`, or the shipped model: `data/shakespeare-char` under the working
    /// directory, else under the source tree this binary was built from.
    pub fn checkpoint_or_shipped(&self) -> PathBuf {
        if let Some(path) = &self.checkpoint {
            return path.clone();
        }
        let here = PathBuf::from(SHIPPED_MODEL);
        let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(SHIPPED_MODEL);
        match !here.is_dir() && built.is_dir() {
            true => built,
            false => here,
        }
    }
}

/// `export --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// Hugging Face's GPT-2: model.safetensors (f32), config.json, vocab.json, merges.txt.
    Safetensors,
}

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// Checkpoint written by `train` or `import`.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The directory to write (created if missing; files of the same names are replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// What to write.
    #[arg(long, value_enum, default_value_t = ExportFormat::Safetensors)]
    pub format: ExportFormat,
}

#[derive(Args, Debug, Clone)]
pub struct ImportArgs {
    /// A Hugging Face GPT-2 directory: config.json and model.safetensors (f32, f16 or bf16;
    /// `export` writes one). Its vocabulary must be GPT-2's 50257 tokens or 256 bytes.
    #[arg(long = "from", value_name = "DIR")]
    pub from: PathBuf,
    /// The checkpoint to write (its AdamW moments are zero and its step 0).
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("destination").required(true).args(["output", "output_dir"])))]
pub struct TokenizeArgs {
    /// With --output: one UTF-8 text file. With --output-dir: the documents, one a file:
    /// text files, directories (every file under them) and quoted patterns
    /// ('docs/**/*.txt'), taken in the sorted order of their paths.
    #[arg(long, value_name = "PATH", required = true, num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// Output .bin (llm.c layout: 256 int32 header, then uint16 tokens) holding the file's
    /// tokens as they are.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["output_dir", "shard_tokens", "val_tokens", "prefix", "threads"])]
    pub output: Option<PathBuf>,
    /// Write llm.c shards here (created if missing; refused where it holds .bin files):
    /// PREFIX_val_000000.bin, then PREFIX_train_000001.bin, ...; <|endoftext|> before each
    /// document. `train --data DIR` reads them.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// With --output-dir: tokens per training shard; the last holds the rest
    /// [default: 100000000, llm.c's].
    #[arg(long, value_name = "N", value_parser = shard_tokens)]
    pub shard_tokens: Option<u64>,
    /// With --output-dir: the validation shard takes whole documents from the first until
    /// it holds at least N tokens; 0: no validation shard [default: --shard-tokens].
    #[arg(long, value_name = "N", value_parser = val_tokens)]
    pub val_tokens: Option<u64>,
    /// With --output-dir: the shards' names begin with this [default: the directory's name].
    #[arg(long)]
    pub prefix: Option<String>,
    /// With --output-dir: documents tokenized at once, at most 4 per core [default: the
    /// host's cores]. The shards do not depend on it.
    #[arg(long, value_parser = thread_count)]
    pub threads: Option<usize>,
    #[arg(long, value_enum, default_value_t = crate::tokenizer::TokenizerKind::Gpt2)]
    pub tokenizer: crate::tokenizer::TokenizerKind,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Vocabulary size of the random tokens (50257 = GPT-2's).
    #[arg(long, default_value_t = crate::tokenizer::GPT2_VOCAB, value_parser = at_least_one)]
    pub vocab: usize,
    /// Batch size per process.
    #[arg(long, default_value_t = 4, value_parser = at_least_one)]
    pub batch: usize,
    /// Sequence length.
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    pub seq_len: usize,
    /// Timed steps (at most 1,000,000).
    #[arg(long, default_value_t = 10, value_parser = bench_steps)]
    pub steps: u64,
    /// Untimed steps first (at most 1,000,000).
    #[arg(long, default_value_t = 2, value_parser = bench_warmup)]
    pub warmup: u64,
    /// As `train --recompute`: `layernorm`, `all` (`--recompute` alone) or `none`.
    #[arg(long, value_enum, value_name = "WHAT", num_args = 0..=1, default_value = "none",
          default_missing_value = "all")]
    pub recompute: Recompute,
    /// Time generation with the key/value cache instead: start-up, the prompt (prefill, --seq-len
    /// random tokens) and decoding (--new-tokens), each in tokens/s, medians of --steps runs
    /// after --warmup; one JSON line. Batch 1, random weights, rank 0 alone.
    #[arg(long, conflicts_with = "kernels")]
    pub generate: bool,
    /// With --generate: tokens to generate after the prompt.
    #[arg(long, default_value_t = 128, value_parser = at_least_one)]
    pub new_tokens: usize,
    /// Time each kernel alone instead, one JSON line per row: GPT-2 124M's matrix products
    /// forward and backward with a large square product as the ceiling (kind "matmul"), then
    /// attention, layernorm, GELU, cross-entropy and AdamW (kind "kernel"), at
    /// --kernel-tokens rows; the model flags are not used. One process.
    #[arg(long)]
    pub kernels: bool,
    /// With --kernels: the rows (B·T tokens) of every timed op [default: 16384 on a GPU, 512
    /// on the CPU, where every row then takes about a minute on 2 cores; at most 1,048,576].
    #[arg(long, requires = "kernels", value_parser = kernel_tokens)]
    pub kernel_tokens: Option<usize>,
    /// With --kernels: the matrix products and their ceiling only (kind "matmul").
    #[arg(long, requires = "kernels")]
    pub matmul_only: bool,
    /// Multi-process stages: time the communicator's all-reduce instead, 4 KiB to
    /// --allreduce-max-mb MiB (each ×4), one JSON line per size: time, algorithm and bus
    /// bandwidth (nccl-tests' conventions), --steps timed after --warmup; the model flags are
    /// not used.
    #[arg(long, conflicts_with_all = ["kernels", "generate"])]
    pub allreduce: bool,
    /// With --allreduce: the largest message, MiB (1 to 65536).
    #[arg(long, default_value_t = 512, value_parser = message_mb)]
    pub allreduce_max_mb: usize,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub sync: SyncArgs,
}

#[cfg(test)]
mod tests;
