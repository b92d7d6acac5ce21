//! What every stage binary runs after picking its backend and communicator: dispatch the
//! subcommand, and turn any error into one line on stderr and an exit code (2 for bad
//! input), never a panic.

use crate::backend::{Backend, FusedMlp};
use crate::checkpoint;
use crate::cli::{check_flags, Cli, Command, DeviceArgs, GenerateArgs, StageKind, TokenizeArgs};
use crate::comm::{agree, check_same_everywhere, leave_together, on_root, Comm};
use crate::error::{Error, Result};
use crate::generate::{self, SampleOptions, Stop};
use crate::model::Gpt2;
use crate::text::{self, StopText, TextStream};
use crate::tokenizer::Tokenizer;
use crate::{autograd::Pool, data};
use clap::FromArgMatches;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// How a stage executes: its name, where it runs, how to make its backend.
pub struct Stage<'a, B> {
    pub name: &'a str,
    pub kind: StageKind,
    pub backend: &'a dyn Fn(&DeviceArgs, &dyn Comm) -> Result<B>,
}

pub fn main<B: FusedMlp>(stage: Stage<B>, comm: &dyn Comm, cli: Cli) -> ExitCode {
    match run(&stage, comm, cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(stage.name, comm, e),
    }
}

/// Ends this rank on `e`, stage `name`'s way: an error every rank met is said once, by rank
/// 0, where every rank met it alike; an error on this rank alone ends the whole job.
pub fn fail(name: &str, comm: &dyn Comm, e: Error) -> ExitCode {
    let who = if comm.size() > 1 {
        format!(" ({})", comm.describe())
    } else {
        String::new()
    };
    if e.is_on_every_rank() {
        // Every rank leaves: together, so none is taken for one that died, learning
        // whether all failed alike. Then rank 0 alone says why, in one line (as for a
        // refused command line); otherwise each rank says its own.
        match leave_together(comm, &e.to_string()) {
            Ok(true) if !comm.is_root() => {}
            Ok(true) => say(&format!("{name}: error: {e}")),
            _ => say(&format!("{name}{who}: error: {e}")),
        }
    } else {
        say(&format!("{name}{who}: error: {e}"));
        // The other ranks did not see this error: end the whole job, or they would
        // wait forever in their next collective.
        comm.abort(e.exit_code());
    }
    ExitCode::from(e.exit_code())
}

/// This process's rank and the job's size where a launcher started it as one of several
/// (MPICH's Hydra sets `PMI_RANK`/`PMI_SIZE`, Open MPI `OMPI_COMM_WORLD_*`).
fn launched_as_several() -> Option<(usize, usize)> {
    let var = |name: &str| std::env::var(name).ok()?.trim().parse::<usize>().ok();
    [
        ("PMI_RANK", "PMI_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ]
    .iter()
    .find_map(|(rank, size)| Some((var(rank).unwrap_or(0), var(size)?)))
    .filter(|&(_, size)| size > 1)
}

/// Writes one line to stderr in one piece, so lines of ranks failing at once (all sent to
/// the terminal by mpirun) do not interleave. Control characters in it (a newline in a flag's
/// value or a file name that the message quotes) are escaped, so it stays one line.
fn say(line: &str) {
    let line: String = line
        .chars()
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect();
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Why a command line was refused.
enum Refused {
    /// clap's own error, or help / version (which exit 0).
    Clap(clap::Error),
    /// A flag given to a stage it does not apply to, or a conflicting pair.
    Flags(String),
}

/// Parses and checks the command line (see [`check_flags`]).
fn parse(name: &str, kind: StageKind) -> std::result::Result<Cli, Refused> {
    let matches = Cli::grammar().try_get_matches().map_err(Refused::Clap)?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(Refused::Clap)?;
    check_flags(&matches, kind, name).map_err(Refused::Flags)?;
    cli.settle_defaults(kind);
    Ok(cli)
}

impl Refused {
    /// 0 for help and version, 2 for an error.
    fn exit_code(&self) -> ExitCode {
        match self {
            Refused::Clap(e) if e.exit_code() == 0 => ExitCode::SUCCESS,
            _ => ExitCode::from(2),
        }
    }

    /// Help and version in full; an error as one line.
    fn print(&self, name: &str) -> ExitCode {
        match self {
            Refused::Clap(e) if e.exit_code() == 0 => {
                let _ = e.print();
            }
            Refused::Clap(e) => say(&format!("{name}: {} (see {name} --help)", first_line(e))),
            Refused::Flags(msg) => say(&format!("{name}: error: {msg}")),
        }
        self.exit_code()
    }
}

/// clap's message as one line: its first, and where that ends in a colon (the missing
/// flags, say), the indented lines that list what it announces.
fn first_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut lines = text.lines();
    let mut first = lines.next().unwrap_or("error: bad command line").to_string();
    if first.ends_with(':') {
        let listed: Vec<&str> = lines.take_while(|l| l.starts_with("  ")).map(str::trim).collect();
        first = format!("{first} {}", listed.join(", "));
    }
    first
}

/// Parses the command line on every rank of a job and agrees on the outcome, so flags
/// that fail on some ranks only (different flags per rank) stop every rank instead of
/// leaving the others waiting. Help, or an error every rank shares, is printed by rank 0.
pub fn parse_cli(name: &str, kind: StageKind, comm: &dyn Comm) -> std::result::Result<Cli, ExitCode> {
    if let (false, Some((rank, size))) = (kind.distributed, launched_as_several()) {
        // `mpirun -n 8 stage0_serial`: 8 copies of one run writing one --out.
        if rank == 0 {
            say(&format!(
                "{name}: error: started as {size} processes (mpirun -n {size}?), but this stage runs in one: \
                 for several use stage1_mpi (CPUs) or stage3_mpi_cuda (GPUs)"
            ));
        }
        return Err(ExitCode::from(2));
    }
    let parsed = parse(name, kind);
    let mut failed = vec![0.0f32; comm.size()];
    failed[comm.rank()] = parsed.is_err() as u8 as f32;
    if let Err(e) = comm.all_reduce_sum_host(&mut failed) {
        say(&format!("{name} ({}): error: {e}", comm.describe()));
        return Err(ExitCode::FAILURE);
    }
    let failed: Vec<String> = (0..failed.len())
        .filter(|&r| failed[r] > 0.0)
        .map(|r| r.to_string())
        .collect();
    match parsed {
        Ok(cli) if failed.is_empty() => Ok(cli),
        Ok(_) => {
            let (who, ranks) = (comm.describe(), failed.join(", "));
            say(&format!(
                "{name} ({who}): error: the flags of rank {ranks} do not parse (its message says why)"
            ));
            Err(ExitCode::from(2))
        }
        // Every rank refused the same line: rank 0 alone says why.
        Err(refused) if comm.is_root() || failed.len() < comm.size() => Err(refused.print(name)),
        Err(refused) => Err(refused.exit_code()),
    }
}

fn run<B: FusedMlp>(stage: &Stage<B>, comm: &dyn Comm, cli: Cli) -> Result<()> {
    // One environment for every rank, as mpirun passes it on: refused by all together.
    agree(comm, crate::cli::check_env().map_err(Error::Input))?;
    match cli.command {
        Command::Train(args) => {
            let be = (stage.backend)(&args.device, comm)?;
            crate::train::train(&be, comm, &args)
        }
        Command::Bench(args) if args.generate => on_root(comm, || {
            let started = std::time::Instant::now();
            let be = (stage.backend)(&args.device, comm)?;
            let r = crate::bench::generate(&be, &args, started)?;
            crate::say!(
                "{}: {} | {} params | start-up {:.2} s | prompt {} tokens: {:.1} ms, {:.0} tokens/s | decode {} tokens: {:.2} ms/token, {:.1} tokens/s",
                stage.name, r.device, r.params, r.startup_s, r.prompt_tokens, r.prefill_ms,
                r.prefill_tokens_per_s, r.new_tokens, r.decode_ms_per_token, r.decode_tokens_per_s
            );
            crate::say!("{}", serde_json::to_string(&r).expect("plain data serialises"));
            Ok(())
        }),
        Command::Bench(args) if args.allreduce => {
            let be = (stage.backend)(&args.device, comm)?;
            let max = args.allreduce_max_mb << 20;
            for row in crate::bench::allreduce(&be, comm, max, args.steps as usize, args.warmup as usize)? {
                if comm.is_root() {
                    crate::say!("{}", serde_json::to_string(&row).expect("plain data serialises"));
                }
            }
            Ok(())
        }
        Command::Bench(args) if args.kernels => {
            let be = (stage.backend)(&args.device, comm)?;
            let opts = crate::bench::KernelOpts::for_device(stage.kind.gpu, args.kernel_tokens, args.matmul_only);
            if comm.is_root() {
                eprintln!(
                    "{}: bench --kernels on {}: {} tokens a row (--kernel-tokens), ceiling {}^3{}",
                    stage.name,
                    be.name(),
                    opts.tokens,
                    opts.square,
                    if opts.matmul_only { ", matrix products only" } else { "" }
                );
            }
            for row in crate::bench::kernels(&be, &opts)? {
                if comm.is_root() {
                    crate::say!("{}", serde_json::to_string(&row).expect("plain data serialises"));
                }
            }
            Ok(())
        }
        Command::Bench(args) => {
            let be = (stage.backend)(&args.device, comm)?;
            let report = crate::bench::bench(&be, comm, &args, stage.kind.gpu)?;
            if comm.is_root() {
                crate::say!(
                    "{}: {} | {} params | batch {}x{} x {} rank(s) | {:.1} ms/step ({:.1} compute, {:.1} comm) | {:.0} tokens/s | {:.1} GFLOP/s",
                    stage.name, report.device, report.params, report.batch, report.seq_len, report.ranks,
                    report.ms_per_step, report.compute_ms_per_step, report.comm_ms_per_step, report.tokens_per_s, report.gflops
                );
                crate::say!("{}", serde_json::to_string(&report).expect("plain data serialises"));
            }
            Ok(())
        }
        Command::Generate(args) => on_root(comm, || {
            if let Some(out) = &args.dump_logits {
                let inputs = weight_files(&args.checkpoint_or_shipped());
                crate::input::refuse_overwriting("--dump-logits", out, inputs.iter().map(PathBuf::as_path))?;
            }
            // The inputs first: a bad checkpoint or prompt is the same error on any machine.
            let ckpt = generate_weights(&args)?;
            if args.temperature.is_nan() || (args.temperature <= 0.0 && !args.greedy) {
                crate::bail_input!("--temperature must be positive (or use --greedy)");
            }
            let be = (stage.backend)(&args.device, comm)?;
            generate_cmd(&be, ckpt, &args, stage.name)
        }),
        Command::Mnist(args) => {
            let be = (stage.backend)(&args.device, comm)?;
            // The same flags and binary on every rank (the thread count aside).
            let mut same_everywhere = args.clone();
            same_everywhere.device.threads = None;
            check_same_everywhere(comm, &format!("mnist {same_everywhere:?}"))?;
            crate::mnist::run(&be, comm, &args.settings()?)
        }
        Command::Report(args) => on_root(comm, || {
            let path = crate::report::report(&args.runs, &args.out)?;
            crate::say!("wrote {}", path.display());
            Ok(())
        }),
        Command::Plot(args) => on_root(comm, || {
            crate::input::refuse_overwriting("--out", &args.out, [args.data.as_path()])?;
            crate::report::plot_table(&args.chart())?;
            crate::say!("wrote {}", args.out.display());
            Ok(())
        }),
        Command::Tokenize(args) => on_root(comm, || tokenize_cmd(&args)),
        Command::Export(args) => on_root(comm, || {
            let written = crate::interop::EXPORTED.map(|f| args.out.join(f));
            if let Some(over) = written.iter().find(|f| crate::input::same_file(f, &args.checkpoint)) {
                crate::bail_input!(
                    "--out {}: the export would write {} over the --checkpoint {}: give another directory",
                    args.out.display(),
                    over.display(),
                    args.checkpoint.display()
                );
            }
            let ckpt = checkpoint::load(&args.checkpoint)?;
            let kind = crate::tokenizer::TokenizerKind::from_checkpoint(&ckpt.meta.tokenizer)?;
            crate::interop::export(&args.out, &ckpt.meta.config, kind, &ckpt.params)?;
            crate::say!("{}: written from {}", args.out.display(), args.checkpoint.display());
            Ok(())
        }),
        Command::Import(args) => on_root(comm, || {
            let read = crate::interop::IMPORTED.map(|f| args.from.join(f));
            crate::input::refuse_overwriting("--out", &args.out, read.iter().map(PathBuf::as_path))?;
            let ckpt = crate::interop::import_checkpoint(&args.from)?;
            let n = ckpt.params.len();
            let zeros = vec![0.0f32; n];
            checkpoint::save(&args.out, &ckpt.meta, &ckpt.params, &zeros, &zeros)?;
            crate::say!(
                "{}: {n} parameters ({} tokenizer) from {}",
                args.out.display(),
                ckpt.meta.tokenizer,
                args.from.display()
            );
            Ok(())
        }),
    }
}

/// The files `generate` reads its weights from: the checkpoint, or a Hugging Face directory's.
fn weight_files(path: &Path) -> Vec<PathBuf> {
    match path.is_dir() {
        true => crate::interop::IMPORTED.iter().map(|f| path.join(f)).collect(),
        false => vec![path.to_path_buf()],
    }
}

/// `generate --checkpoint`: a checkpoint file, or a Hugging Face directory; by default the
/// model that ships in data/ (see [`GenerateArgs::checkpoint_or_shipped`]).
fn generate_weights(args: &GenerateArgs) -> Result<checkpoint::Checkpoint> {
    let path = args.checkpoint_or_shipped();
    if args.checkpoint.is_none() && !path.is_dir() {
        crate::bail_input!(
            "no --checkpoint given, and the model that ships in {} is not there: run from the project root, or give --checkpoint",
            crate::cli::SHIPPED_MODEL
        );
    }
    match path.is_dir() {
        true => crate::interop::import_checkpoint(&path),
        false => checkpoint::load(&path),
    }
}

fn generate_cmd<B: Backend>(be: &B, ckpt: checkpoint::Checkpoint, args: &GenerateArgs, name: &str) -> Result<()> {
    let kind = crate::tokenizer::TokenizerKind::from_checkpoint(&ckpt.meta.tokenizer)?;
    let tok = Tokenizer::new(kind)?;
    crate::train::check_heads(be, &ckpt.meta.config)?;
    let model = Gpt2::new(be, ckpt.meta.config)?;
    model.set_params(be, &ckpt.params)?;
    let trained_seq_len = ckpt
        .meta
        .train
        .get("seq_len")
        .and_then(|v| v.as_u64())
        .map(|t| t as usize);
    drop(ckpt);
    if let Some(path) = &args.dump_logits {
        return dump_logits(be, &model, &args.prompt, &tok.encode(&args.prompt)?, path);
    }
    let prompts = prompts(args)?;
    if args.stop.as_deref() == Some("") {
        crate::bail_input!("--stop is empty: give the text to stop at");
    }
    let base = SampleOptions {
        max_new_tokens: args.max_new_tokens,
        greedy: args.greedy,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        stream: 0,
        context: trained_seq_len.unwrap_or(model.config.max_seq_len),
        end_of_text: tok.end_of_text(),
        kv_cache: !args.no_kv_cache,
        slide: false,
    };
    // Every prompt is encoded and checked before any text goes out (a batch does not stop
    // halfway).
    let mut encoded = Vec::with_capacity(prompts.len());
    for prompt in &prompts {
        let ids = tok.encode(prompt)?;
        if ids.is_empty() {
            crate::bail_input!("--prompt is empty: give at least one character");
        }
        generate::check_prompt(ids.len(), model.config.max_seq_len, &base)?;
        encoded.push(ids);
    }
    let mut pool = Pool::default();
    let mut out = std::io::stdout().lock();
    for (i, (prompt, ids)) in prompts.iter().zip(encoded).enumerate() {
        if crate::stop::stdout_gone() {
            break; // the reader has gone: nothing more to generate for
        }
        if prompts.len() > 1 {
            let _ = writeln!(out, "--- prompt {} ---", i + 1);
        }
        // Everything on stdout follows one convention (see `text`): the prompt too, so a
        // backslash or control character in it reads the same as one the model wrote.
        let _ = write!(out, "{}", text::printable(prompt.as_bytes()));
        // Stream text as it comes; bytes of a multi-byte character are held until complete,
        // and an end that may begin the stop string until it is known not to.
        let mut stream = TextStream::new(&tok);
        let mut stop = args.stop.as_deref().map(StopText::new);
        let mut show = |piece: String, out: &mut std::io::StdoutLock| {
            let (piece, stopped) = match &mut stop {
                Some(stop) => stop.push(&piece),
                None => (piece, false),
            };
            if write!(out, "{piece}").and_then(|()| out.flush()).is_err() {
                crate::stop::lost_stdout(); // a closed pipe: stop generating
                return true;
            }
            stopped
        };
        let opts = SampleOptions {
            stream: i as u64,
            ..base
        };
        let done = generate::generate(&model, be, &mut pool, &ids, &opts, |id| {
            match show(stream.push(id), &mut out) {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        })?;
        if done.stop != Stop::Caller && !show(stream.finish(), &mut out) {
            let rest = stop.as_mut().map(StopText::finish).unwrap_or_default();
            let _ = write!(out, "{rest}");
        }
        let _ = writeln!(out);
        if let Stop::Context { limit } = done.stop {
            let _ = out.flush();
            say(&format!(
                "{name}: stopped at the model's context of {limit} tokens (prompt {} + {} new); the window does not slide",
                ids.len(),
                done.tokens.len()
            ));
        }
    }
    Ok(())
}

/// `generate --dump-logits`: the logits of every position of `prompt`, as JSON.
fn dump_logits<B: Backend>(be: &B, model: &Gpt2<B>, text: &str, prompt: &[u32], path: &Path) -> Result<()> {
    let cfg = &model.config;
    if prompt.is_empty() || prompt.len() > cfg.max_seq_len {
        crate::bail_input!(
            "--dump-logits: the prompt is {} tokens; it must be 1 to the model's {} positions",
            prompt.len(),
            cfg.max_seq_len
        );
    }
    let ids: Vec<i32> = prompt.iter().map(|&x| x as i32).collect();
    let mut logits = vec![0.0f32; ids.len() * cfg.padded_vocab_size];
    {
        let mut pool = Pool::default();
        let mut g = crate::autograd::Graph::new(be, &mut pool, false);
        let fwd = model.forward(&mut g, &ids, None, 1, ids.len(), false)?;
        g.read(
            fwd.logits.expect("a pass without targets keeps its logits"),
            &mut logits,
        )?;
    }
    let rows: Vec<&[f32]> = logits
        .chunks_exact(cfg.padded_vocab_size)
        .map(|row| &row[..cfg.vocab_size])
        .collect();
    let json = serde_json::json!({ "prompt": text, "tokens": prompt, "logits": rows });
    let bytes = serde_json::to_vec(&json).expect("plain data serialises");
    crate::atomic_file::write(path, |f| f.write_all(&bytes))?;
    crate::say!("{}: logits of {} positions", path.display(), prompt.len());
    Ok(())
}

/// `--prompt`, or the lines of `--prompt-file` (empty ones skipped): a regular file, or
/// standard input (`-`, `/dev/stdin`), of at most [`crate::input::MAX_PROMPT_FILE`] bytes.
fn prompts(args: &GenerateArgs) -> Result<Vec<String>> {
    let Some(path) = &args.prompt_file else {
        return Ok(vec![args.prompt.clone()]);
    };
    let text = crate::input::read_text(path, "a prompt file", crate::input::MAX_PROMPT_FILE, true)?;
    let lines: Vec<String> = text.lines().filter(|l| !l.is_empty()).map(str::to_string).collect();
    if lines.is_empty() {
        crate::bail_input!("{}: no prompt in the file (one a line)", path.display());
    }
    Ok(lines)
}

fn tokenize_cmd(args: &TokenizeArgs) -> Result<()> {
    match (&args.output, &args.output_dir) {
        (Some(output), _) => tokenize_file(args, output),
        (None, Some(dir)) => tokenize_shards(args, dir),
        (None, None) => crate::bail_input!("tokenize: give --output FILE or --output-dir DIR"),
    }
}

/// `tokenize --output FILE`: one text file's tokens as they are.
fn tokenize_file(args: &TokenizeArgs, output: &Path) -> Result<()> {
    let input = match args.input.as_slice() {
        [one] if !data::shards::is_pattern(one) && !one.is_dir() => one,
        _ => crate::bail_input!(
            "--output writes one text file's tokens: for a directory, a pattern or several files give --output-dir DIR"
        ),
    };
    if crate::input::same_file(input, output) {
        crate::bail_input!(
            "--output {} is the --input file: the tokens would replace the text; give another path",
            output.display()
        );
    }
    let tok = Tokenizer::new(args.tokenizer)?;
    let tokens = data::load_tokens(input, &tok)?;
    data::write_bin(output, &tokens)?;
    crate::say!(
        "{}: {} tokens ({}) written to {}",
        input.display(),
        tokens.len(),
        args.tokenizer.name(),
        output.display()
    );
    Ok(())
}

/// `tokenize --output-dir DIR`: documents into llm.c shards (see [`data::sharding`]).
fn tokenize_shards(args: &TokenizeArgs, dir: &Path) -> Result<()> {
    use data::sharding;
    const LLMC_SHARD_TOKENS: u64 = 100_000_000;
    let tok = Tokenizer::new(args.tokenizer)?;
    if tok.end_of_text().is_none() {
        crate::bail_input!(
            "--tokenizer {} has no <|endoftext|> to put before each document: use --tokenizer gpt2 with --output-dir",
            args.tokenizer.name()
        );
    }
    let shard_tokens = args.shard_tokens.unwrap_or(LLMC_SHARD_TOKENS);
    let spec = sharding::ShardSpec {
        dir: dir.to_path_buf(),
        prefix: match &args.prefix {
            Some(p) => p.clone(),
            None => dir
                .file_name()
                .map_or_else(|| "shard".to_string(), |n| n.to_string_lossy().into_owned()),
        },
        shard_tokens,
        val_tokens: args.val_tokens.unwrap_or(shard_tokens),
    };
    let documents = sharding::documents(&args.input)?;
    sharding::check_destination(&spec, &documents)?;
    let threads = match args.threads {
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::Device(format!("cannot start {threads} threads: {e}")))?;
    let started = std::time::Instant::now();
    let bar = crate::report::progress::bytes_bar(documents.iter().map(|d| d.bytes).sum());
    let written = sharding::write_shards(&documents, &tok, &spec, &pool, &bar);
    bar.finish_and_clear();
    let written = written?;
    let seconds = started.elapsed().as_secs_f64();
    crate::say!(
        "{} documents, {} tokens ({}; {} validation), {} shards in {}, {:.1} s, {:.0} tokens/s",
        written.documents,
        written.tokens,
        args.tokenizer.name(),
        written.val_tokens,
        written.shards.len(),
        dir.display(),
        seconds,
        written.tokens as f64 / seconds.max(1e-9)
    );
    Ok(())
}
