//! What the command line refuses before anything runs: each numeric flag's range (its value
//! parser), the flags that apply to some stages only, and the pairs that conflict. Each is
//! one line and exit 2 (see `app`).

use clap::parser::ValueSource;

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
        "bucket_mb",
        "the multi-process stages (stage1_mpi, stage3_mpi_cuda)",
        |s| s.distributed,
    ),
    (
        "allreduce",
        "the multi-process stages (stage1_mpi, stage3_mpi_cuda)",
        |s| s.distributed,
    ),
    (
        "sync_every",
        "the multi-process stages (stage1_mpi, stage3_mpi_cuda)",
        |s| s.distributed,
    ),
    ("zero", "the multi-process stages (stage1_mpi, stage3_mpi_cuda)", |s| {
        s.distributed
    }),
    (
        "grad_comm",
        "the multi-process stages (stage1_mpi, stage3_mpi_cuda)",
        |s| s.distributed,
    ),
    (
        "comm_timeout",
        "the multi-process stages (stage1_mpi, stage3_mpi_cuda)",
        |s| s.distributed,
    ),
];

/// Pairs of flags (by clap id) refused together, and why. A side written `id=value` is refused
/// at that (numeric) value only (see [`conflict_side`]).
pub const CONFLICTS: &[(&str, &str, &str)] = &[
    (
        "overlap",
        "sync_every",
        "local SGD sums no gradients during backward, so there is nothing to overlap",
    ),
    (
        "bucket_mb",
        "sync_every",
        "local SGD sums no gradients during backward, so there are no buckets",
    ),
    (
        "grad_comm",
        "sync_every",
        "local SGD sums no gradients: it averages parameters, in f32",
    ),
    // `--zero 0` with `--sync-every` is what local SGD runs anyway.
    (
        "zero=1",
        "sync_every",
        "ZeRO shards the optimiser over ranks that sum gradients every step; local SGD keeps a whole optimiser on each",
    ),
    ("steps", "epochs", "both set the length of the run"),
    (
        "val_fraction",
        "val_data",
        "--val-fraction holds out the tail of a single --data file; --val-data gives the validation set",
    ),
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
    (
        "greedy",
        "top_p",
        "greedy decoding takes the most likely token and never samples",
    ),
    ("prompt", "prompt_file", "both give the prompt"),
    (
        "resume",
        "init_from",
        "--resume continues a run, --init-from starts a new one from its weights",
    ),
    ("dump_logits", "prompt_file", "the logits are dumped for one prompt"),
    (
        "save_init",
        "resume",
        "a resumed run's first weights are the checkpoint's, not an initialisation",
    ),
];

/// A side of [`CONFLICTS`]: its clap id, and the value it is refused at if only one
/// (`zero=1` → `zero`, `1`).
pub fn conflict_side(side: &str) -> (&str, Option<&str>) {
    match side.split_once('=') {
        Some((id, value)) => (id, Some(value)),
        None => (side, None),
    }
}

/// A side of [`CONFLICTS`] as typed: `--sync-every`, `--zero 1`.
pub fn conflict_name(side: &str) -> String {
    match conflict_side(side) {
        (id, Some(value)) => format!("{} {value}", flag_name(id)),
        (id, None) => flag_name(id),
    }
}

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
    let given =
        |id: &str| sub.ids().any(|i| i.as_str() == id) && sub.value_source(id) == Some(ValueSource::CommandLine);
    for &(id, applies_to, applies) in STAGE_FLAGS {
        if given(id) && !applies(stage) {
            return Err(format!(
                "{} applies to {applies_to} only; {stage_name} does not use it",
                flag_name(id)
            ));
        }
    }
    let number = |s: &str| s.trim().parse::<f64>().ok();
    let met = |side: &str| {
        let (id, value) = conflict_side(side);
        // `given` first: asking a subcommand for a flag it lacks panics.
        given(id)
            && value.is_none_or(|v| {
                let mut typed = sub.get_raw(id).into_iter().flatten();
                typed.any(|t| t.to_str().and_then(number) == number(v))
            })
    };
    for &(a, b, why) in CONFLICTS {
        if met(a) && met(b) {
            return Err(format!(
                "{} cannot be used with {}: {why}",
                conflict_name(a),
                conflict_name(b)
            ));
        }
    }
    Ok(())
}

/// Why `train` would refuse `value` for its flag `id` (a clap id), as if typed: the flag's own
/// value check, for the settings a resumed checkpoint brings in place of flags. `None` where
/// it is accepted or `train` has no such flag.
pub fn refused_as_train_flag(id: &str, value: &str) -> Option<String> {
    let cli = super::Cli::grammar();
    let long = cli
        .find_subcommand("train")?
        .get_arguments()
        .find(|a| a.get_id() == id)?
        .get_long()?;
    let line = [
        "stage",
        "train",
        "--data",
        "d",
        "--out",
        "o",
        &format!("--{long}={value}"),
    ];
    let err = cli.try_get_matches_from(line).err()?;
    // A value check's own reason where it gave one, else clap's first line.
    Some(match std::error::Error::source(&err) {
        Some(why) => why.to_string(),
        None => err.render().to_string().lines().next().unwrap_or("refused").to_string(),
    })
}

// ---- value checks: every numeric flag is checked as it is parsed ------------------------
// (clap prints the message after "invalid value 'X' for '--flag'"; see `app` for the one line)

fn number<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    let s = s.trim();
    // Where a whole number is wanted, a number of another kind is told what is wrong with it.
    s.parse().map_err(|_| match s.parse::<f64>() {
        Ok(x) if x.is_nan() => "not a number".to_string(),
        Ok(x) if x < 0.0 => "must not be negative".to_string(),
        Ok(x) if x.is_finite() && x.fract() != 0.0 => "must be a whole number".to_string(),
        Ok(_) => "is too large".to_string(),
        Err(_) => "not a number".to_string(),
    })
}

pub(super) fn at_least_one(s: &str) -> Result<usize, String> {
    match number::<usize>(s)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// `bench --allreduce-max-mb`: 1 MiB to 64 GiB (more than any device holds; the byte count
/// stays far from overflowing).
pub(super) fn message_mb(s: &str) -> Result<usize, String> {
    match number::<usize>(s)? {
        n @ 1..=65536 => Ok(n),
        _ => Err("must be 1 to 65536 (MiB)".into()),
    }
}

pub(super) fn zero_stage(s: &str) -> Result<u8, String> {
    match number::<u8>(s) {
        Ok(stage @ (0 | 1)) => Ok(stage),
        _ => Err("must be 0 or 1 (ZeRO stages 2 and 3 are not implemented)".into()),
    }
}

pub(super) fn at_least_one_u64(s: &str) -> Result<u64, String> {
    match number::<u64>(s)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// `tokenize --shard-tokens`: at least 1, at most the .bin header's i32 count.
pub(super) fn shard_tokens(s: &str) -> Result<u64, String> {
    match number::<u64>(s)? {
        0 => Err("must be at least 1".into()),
        n if n > i32::MAX as u64 => Err(format!("must be at most {} (the .bin header's count)", i32::MAX)),
        n => Ok(n),
    }
}

/// `tokenize --val-tokens`: 0 (no validation shard) up to the .bin header's i32 count.
pub(super) fn val_tokens(s: &str) -> Result<u64, String> {
    match number::<u64>(s)? {
        n if n > i32::MAX as u64 => Err(format!("must be at most {} (the .bin header's count)", i32::MAX)),
        n => Ok(n),
    }
}

/// The most steps `bench` and `mnist --bench` time, and the most they run first untimed.
pub const MAX_BENCH_STEPS: u64 = 1_000_000;

/// A whole number from `range`, else why not ("must be 1 to 1000000").
fn whole_in<T>(s: &str, range: std::ops::RangeInclusive<T>) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    let n = number::<T>(s)?;
    match range.contains(&n) {
        true => Ok(n),
        false => Err(format!("must be {} to {}", range.start(), range.end())),
    }
}

/// `bench --steps`, `mnist --steps`: timed steps, 1 to [`MAX_BENCH_STEPS`].
pub(super) fn bench_steps(s: &str) -> Result<u64, String> {
    whole_in(s, 1..=MAX_BENCH_STEPS)
}

/// `bench --warmup`, `mnist --warmup`: untimed steps, 0 to [`MAX_BENCH_STEPS`].
pub(super) fn bench_warmup(s: &str) -> Result<u64, String> {
    whole_in(s, 0..=MAX_BENCH_STEPS)
}

/// `bench --kernel-tokens`: the rows of every timed op, at most 2^20 (GPT-2's logits alone are
/// then 200 GB; every size stays far from overflowing).
pub const MAX_KERNEL_TOKENS: usize = 1 << 20;

pub(super) fn kernel_tokens(s: &str) -> Result<usize, String> {
    whole_in(s, 1..=MAX_KERNEL_TOKENS)
}

/// `train --seed`, `--batch` and `--seq-len` when none is given (and not resuming).
pub const DEFAULT_SEED: u64 = 1337;
pub const DEFAULT_BATCH: usize = 32;
pub const DEFAULT_SEQ_LEN: usize = 128;
/// `train`'s optimiser and split when neither a flag nor a resumed checkpoint gives them.
pub const DEFAULT_LR: f32 = 3e-3;
pub const DEFAULT_WARMUP: u64 = 50;
pub const DEFAULT_MIN_LR_FRAC: f32 = 0.1;
pub const DEFAULT_WEIGHT_DECAY: f32 = 0.1;
pub const DEFAULT_GRAD_CLIP: f32 = 1.0;
pub const DEFAULT_VAL_FRACTION: f32 = 0.1;
/// `train --comm-timeout` when none is given (multi-process stages), in seconds.
pub const DEFAULT_COMM_TIMEOUT: u64 = 300;

/// The most tokens `generate` and the training sample produce.
pub const MAX_NEW_TOKENS: usize = 1_000_000;

pub(super) fn token_count(s: &str) -> Result<usize, String> {
    match number::<usize>(s)? {
        n if n > MAX_NEW_TOKENS => Err(format!("must be at most {MAX_NEW_TOKENS}")),
        n => Ok(n),
    }
}

/// Threads per process: at least 1, at most 4 per core of this host.
pub(super) fn thread_count(s: &str) -> Result<usize, String> {
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

pub(super) fn finite_f32(s: &str) -> Result<f32, String> {
    match number::<f32>(s)? {
        x if x.is_finite() => Ok(x),
        _ => Err("must be a finite number".into()),
    }
}

pub(super) fn positive_f32(s: &str) -> Result<f32, String> {
    finite_f32(s).and_then(|x| if x > 0.0 { Ok(x) } else { Err("must be above 0".into()) })
}

pub(super) fn non_negative_f32(s: &str) -> Result<f32, String> {
    finite_f32(s).and_then(|x| {
        if x >= 0.0 {
            Ok(x)
        } else {
            Err("must be 0 or more".into())
        }
    })
}

pub(super) fn fraction_f32(s: &str) -> Result<f32, String> {
    finite_f32(s).and_then(|x| {
        if (0.0..=1.0).contains(&x) {
            Ok(x)
        } else {
            Err("must be between 0 and 1".into())
        }
    })
}

/// `--top-p`: a probability mass, above 0 and at most 1.
pub(super) fn mass_f32(s: &str) -> Result<f32, String> {
    finite_f32(s).and_then(|x| {
        if x > 0.0 && x <= 1.0 {
            Ok(x)
        } else {
            Err("must be above 0 and at most 1".into())
        }
    })
}

pub(super) fn open_fraction_f32(s: &str) -> Result<f32, String> {
    finite_f32(s).and_then(|x| {
        if x > 0.0 && x < 1.0 {
            Ok(x)
        } else {
            Err("must be above 0 and below 1".into())
        }
    })
}

pub(super) fn positive_f64(s: &str) -> Result<f64, String> {
    match number::<f64>(s)? {
        x if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err("must be a finite number above 0".into()),
    }
}

/// The environment's on/off switches (debugging and tuning aids the README names where it
/// uses them): `0` or `1` when set. A value the code would not read as either (`false`, `off`)
/// is refused rather than ignored.
const ENV_SWITCHES: &[&str] = &["GPT2_CUDA_ALLOC_LOG", "GPT2_CUDA_GRAPH", "GPT2_MNIST_FUSED"];

/// Checks the environment settings that are read where a wrong value could not be said in a
/// line (the switches, and `GPT2_GRAD_NORMS`' step list), before any command runs.
pub fn check_env() -> Result<(), String> {
    not_text_settings(std::env::vars_os())?;
    check_env_with(|name| std::env::var(name).ok())
}

/// Refuses a setting of this program (`GPT2_*`, `GPT2RS_*`) whose value is not UTF-8 text:
/// the code reads such a value as unset, so it would otherwise be ignored without a word.
pub(super) fn not_text_settings(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<(), String> {
    for (name, value) in vars {
        let name = name.to_string_lossy();
        if (name.starts_with("GPT2_") || name.starts_with("GPT2RS_")) && value.to_str().is_none() {
            return Err(format!(
                "{name}={}: the value is not UTF-8 text",
                value.to_string_lossy().escape_debug()
            ));
        }
    }
    Ok(())
}

/// [`check_env`] over the settings `get` gives.
pub(super) fn check_env_with(get: impl Fn(&str) -> Option<String>) -> Result<(), String> {
    for name in ENV_SWITCHES {
        if let Some(v) = get(name).filter(|v| !matches!(v.as_str(), "" | "0" | "1")) {
            return Err(format!("{name}={v}: give 0 (off) or 1 (on)"));
        }
    }
    let steps = get("GPT2_GRAD_NORMS").unwrap_or_default();
    if steps
        .split(',')
        .any(|s| !s.trim().is_empty() && s.trim().parse::<u64>().is_err())
    {
        return Err(format!(
            "GPT2_GRAD_NORMS={steps}: give 0-based step numbers separated by commas, e.g. 36,37"
        ));
    }
    Ok(())
}
