//! The stage 0 binary end to end: training writes the loss table and a checkpoint, runs
//! are deterministic, resume continues exactly, generation is reproducible, and every
//! kind of bad input gives a one-line error and exit code 2 (never a panic).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::{run, run_ok, send, tmpdir, BIN};

/// A small corpus with Shakespeare's layout, long enough for a few epochs of tiny batches.
fn corpus(dir: &Path) -> PathBuf {
    let text = "ROMEO:\nBut soft, what light through yonder window breaks?\n\nJULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n\n".repeat(40);
    let p = dir.join("corpus.txt");
    std::fs::write(&p, text).unwrap();
    p
}

/// `generate --checkpoint ck` with `flags`, which must succeed: its text.
fn generate_text(ck: &Path, flags: &[&str]) -> String {
    run_ok(&[&["generate", "--checkpoint", ck.to_str().unwrap()], flags].concat())
}

fn train_args<'a>(data: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "train",
        "--data",
        data,
        "--out",
        out,
        "--model",
        "tiny",
        "--batch",
        "4",
        "--seq-len",
        "16",
    ];
    v.extend_from_slice(&["--sample-len", "0", "--threads", "2", "--eval-batches", "2"]);
    v.extend_from_slice(extra);
    v
}

/// `args` with `flag`'s value replaced (or the flag added): command lines are edited by
/// flag name, never by position.
fn with_flag<'a>(mut args: Vec<&'a str>, flag: &'a str, value: &'a str) -> Vec<&'a str> {
    match args.iter().position(|a| *a == flag) {
        Some(at) => args[at + 1] = value,
        None => args.extend([flag, value]),
    }
    args
}

/// Asserts a clean failure: exit code 2, one line on stderr naming `needle`, no panic.
fn assert_bad_input(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit 2, got {:?}; stderr: {err}",
        out.status.code()
    );
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "panic: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one-line error expected: {err}");
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "error should mention '{needle}': {err}"
    );
}

fn loss_table(dir: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(dir.join("loss.tsv"))
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

#[test]
fn train_writes_table_and_checkpoint_and_learns() {
    let d = tmpdir("train");
    let data = corpus(&d);
    let out = d.join("run");
    let o = run(&train_args(
        data.to_str().unwrap(),
        out.to_str().unwrap(),
        &["--steps", "60", "--eval-every", "20"],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = loss_table(&out);
    assert_eq!(
        table[0].join("\t"),
        "epoch\ttrain_loss\tval_loss\tbad_steps\ttokens_per_s\telapsed_s"
    );
    assert_eq!(table.len(), 4, "3 evaluation rows expected: {table:?}");
    let val = |r: usize| table[r][2].parse::<f32>().unwrap();
    assert!(
        val(3) < val(1) && val(3) < 3.0,
        "validation loss should fall below 3 nats: {table:?}"
    );
    assert!(out.join("model.ckpt").exists());
}

/// `loss.tsv` without the two time columns (tokens/s, elapsed), as written.
fn table_without_times(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("loss.tsv")).unwrap();
    text.lines()
        .map(|l| l.split('\t').take(4).collect::<Vec<_>>().join("\t"))
        .collect()
}

fn params_of(dir: &Path) -> Vec<u32> {
    let ck = common::checkpoint::load(&dir.join("model.ckpt")).unwrap();
    ck.params.iter().map(|x| x.to_bits()).collect()
}

/// The schedule past the warmup (5 steps), evaluated every 10 steps.
const SCHEDULE: [&str; 6] = ["--steps", "40", "--warmup", "5", "--eval-every", "10"];

#[test]
fn same_seed_gives_identical_losses_and_stop_after_resumes_as_the_same_run() {
    let d = tmpdir("resume");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    let (a, b) = (d.join("a"), d.join("b"));
    assert!(run(&train_args(data, a.to_str().unwrap(), &SCHEDULE)).status.success());
    // The same run, stopped inside an evaluation window (step 17), then resumed without
    // --steps: the schedule, the window and the clock come from the checkpoint.
    let first = [&SCHEDULE[..], &["--stop-after", "17"]].concat();
    let o = run(&train_args(data, b.to_str().unwrap(), &first));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("stopped after step 17"));
    assert_eq!(
        table_without_times(&b).len(),
        2,
        "rows of steps 10 only, no partial row"
    );
    // Only --resume: the warmup, the evaluation interval and every other setting of the run
    // come from the checkpoint (the defaults would be another run).
    let ckpt = b.join("model.ckpt");
    let resume = ["--resume", ckpt.to_str().unwrap()];
    let o = run(&train_args(data, b.to_str().unwrap(), &resume));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        table_without_times(&a),
        table_without_times(&b),
        "every column but the times, byte for byte"
    );
    assert_eq!(params_of(&a), params_of(&b), "final parameters bit for bit");
    // Elapsed time continued from the checkpoint rather than from 0.
    let elapsed = |dir: &Path| -> Vec<f64> {
        let text = std::fs::read_to_string(dir.join("loss.tsv")).unwrap();
        text.lines()
            .skip(1)
            .map(|l| l.split('\t').nth(5).unwrap().parse().unwrap())
            .collect()
    };
    let e = elapsed(&b);
    assert!(e.windows(2).all(|w| w[1] >= w[0]), "elapsed_s never goes back: {e:?}");
}

/// A new run in an `--out` that holds a stopped run's files moves them to `earlier/` before it
/// writes its table (a checkpoint of one run beside another run's table would be joined by a
/// resume), and the stopped run resumes from there to the uninterrupted run's table.
#[test]
fn a_new_run_moves_an_earlier_run_aside_and_that_run_still_resumes() {
    let d = tmpdir("earlier");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    let (whole, out) = (d.join("whole"), d.join("out"));
    assert!(run(&train_args(data, whole.to_str().unwrap(), &SCHEDULE))
        .status
        .success());
    let stopped = [&SCHEDULE[..], &["--stop-after", "17"]].concat();
    assert!(run(&train_args(data, out.to_str().unwrap(), &stopped)).status.success());
    let (table, ckpt) = (
        table_without_times(&out),
        std::fs::read(out.join("model.ckpt")).unwrap(),
    );
    // Another run (another seed) in the same --out.
    let other = with_flag(train_args(data, out.to_str().unwrap(), &SCHEDULE), "--steps", "5");
    let o = run(&with_flag(other, "--seed", "9"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("held an earlier run's files: moved to"), "{said}");
    let earlier = out.join("earlier");
    assert_eq!(table_without_times(&earlier), table);
    assert_eq!(std::fs::read(earlier.join("model.ckpt")).unwrap(), ckpt);
    assert_ne!(table_without_times(&out), table, "the new run's own table");
    // The earlier run goes on where it stopped, in its new place.
    let earlier_ckpt = earlier.join("model.ckpt");
    let resume = ["--resume", earlier_ckpt.to_str().unwrap()];
    let o = run(&train_args(data, earlier.to_str().unwrap(), &resume));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(table_without_times(&earlier), table_without_times(&whole));
    assert_eq!(params_of(&earlier), params_of(&whole));
}

#[test]
fn recompute_trains_the_same_run_bit_for_bit() {
    // --recompute computes GELU and layernorm outputs (or with `layernorm` the latter alone)
    // again in backward: the same kernels on the same inputs, so the losses and the final
    // parameters must not move by a bit.
    let d = tmpdir("recompute");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    let kept = d.join("kept");
    assert!(run(&train_args(data, kept.to_str().unwrap(), &SCHEDULE))
        .status
        .success());
    for what in [&["--recompute"][..], &["--recompute", "layernorm"]] {
        let again = d.join(what.join("-"));
        let flags = [&SCHEDULE[..], what].concat();
        let o = run(&train_args(data, again.to_str().unwrap(), &flags));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(table_without_times(&kept), table_without_times(&again), "{what:?}");
        assert_eq!(
            params_of(&kept),
            params_of(&again),
            "{what:?}: final parameters bit for bit"
        );
    }
}

#[test]
fn kernel_bench_runs_on_the_cpu_and_gpu_only_flags_are_refused() {
    // The matrix products at 8 tokens (the ceiling, 2048^3, takes most of the time): one JSON
    // line each, the ceiling first.
    let out = run_ok(&[
        "bench",
        "--kernels",
        "--matmul-only",
        "--kernel-tokens",
        "8",
        "--threads",
        "2",
    ]);
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let ops: Vec<&str> = rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops.len(), 11, "{out}");
    assert_eq!(ops[0], "matmul_peak");
    assert!(ops.contains(&"lm_head_bwd") && rows.iter().all(|r| r["kind"] == "matmul"));
    assert_eq!(rows[1]["shape"], "8x768x2304");
    assert_bad_input(
        &run(&["bench", "--matmul-only"]),
        "the following required arguments were not provided: --kernels",
    );
    assert_bad_input(
        &run(&["bench", "--precision", "bf16"]),
        "--precision applies to the GPU stages (stage2_cuda, stage3_mpi_cuda) only",
    );
}

#[test]
fn resuming_with_another_length_says_so() {
    let d = tmpdir("relength");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    let out = d.join("run");
    let first = [&SCHEDULE[..], &["--stop-after", "12"]].concat();
    assert!(run(&train_args(data, out.to_str().unwrap(), &first)).status.success());
    let ckpt = out.join("model.ckpt");
    let o = run(&train_args(
        data,
        out.to_str().unwrap(),
        &["--resume", ckpt.to_str().unwrap(), "--steps", "30"],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("schedule changes from 40 to 30 steps"), "{stdout}");
}

#[test]
fn resuming_with_other_settings_says_so_or_refuses() {
    let d = tmpdir("resettings");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    let out = d.join("run");
    let first = [&SCHEDULE[..], &["--stop-after", "12", "--lr", "2e-3"]].concat();
    assert!(run(&train_args(data, out.to_str().unwrap(), &first)).status.success());
    let ckpt = out.join("model.ckpt");
    let resume = |stop: &str, extra: &[&str]| {
        let flags = [&["--resume", ckpt.to_str().unwrap(), "--stop-after", stop][..], extra].concat();
        run(&train_args(data, out.to_str().unwrap(), &flags))
    };
    // Another held-out fraction would move the split the data cursor points into: refused.
    assert_bad_input(&resume("14", &["--val-fraction", "0.2"]), "--val-fraction 0.1");
    // Another learning rate is the user's to choose: taken, and said.
    let o = resume("14", &["--lr", "1e-3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("note: --lr 0.001 from here on (the checkpoint's run had 0.002)"),
        "{stdout}"
    );
    // The same value as the checkpoint's says nothing.
    let o = resume("16", &["--lr", "1e-3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("note: --lr"));
}

#[test]
fn a_stop_at_the_last_step_is_refused_and_a_finished_run_sweeps_torn_files() {
    // --stop-after at the last step would change nothing (the run ends as a finished one
    // there, as after Ctrl-C at that step): refused in one line, before anything is written.
    let d = tmpdir("stoplast");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    let out = d.join("run");
    // A temporary file an interrupted checkpoint write left (no process has this PID).
    std::fs::create_dir_all(&out).unwrap();
    let stale = out.join(".model.ckpt.999999999.tmp");
    std::fs::write(&stale, b"torn").unwrap();
    let args = train_args(data, out.to_str().unwrap(), &["--steps", "6"]);
    assert_bad_input(&run(&with_flag(args.clone(), "--stop-after", "6")), "--stop-after 6");
    assert!(stale.exists() && !out.join("loss.tsv").exists(), "nothing written");
    let stdout = run_ok(&args);
    assert!(out.join("summary.json").exists() && out.join("model.ckpt").exists());
    assert!(!stale.exists(), "the leftover temporary file is removed");
    assert!(stdout.contains("removed 1 temporary file(s)"), "{stdout}");
}

/// A checkpoint records its corpus: resuming on another is refused, unless
/// --resume-on-new-data asks for it, and then the new checkpoint records the new corpus. The
/// same corpus under another name resumes without a word.
#[test]
fn resume_refuses_another_corpus_unless_asked() {
    let d = tmpdir("newdata");
    let data = corpus(&d);
    let other = d.join("other.txt");
    let text = std::fs::read_to_string(&data).unwrap().replace("ROMEO", "TYBALT");
    std::fs::write(&other, text).unwrap();
    let renamed = d.join("renamed.txt");
    std::fs::copy(&data, &renamed).unwrap();
    let out = d.join("run");
    let (data_s, out_s) = (data.to_str().unwrap(), out.to_str().unwrap());
    run_ok(&train_args(data_s, out_s, &["--steps", "6", "--stop-after", "3"]));
    let ck = out.join("model.ckpt");
    let recorded = common::checkpoint::load_meta(&ck)
        .unwrap()
        .data
        .expect("the corpus is recorded");
    assert_eq!(recorded, common::data::DataIdentity::of(&data).unwrap());
    let resume = |data: &Path, extra: &[&str]| {
        let args = train_args(data.to_str().unwrap(), out_s, &["--resume", ck.to_str().unwrap()]);
        run(&[&args[..], extra].concat())
    };
    let o = resume(&renamed, &["--stop-after", "4"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("going on with"));
    assert_bad_input(&resume(&other, &[]), "--resume-on-new-data");
    let o = resume(&other, &["--resume-on-new-data"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("note: going on with other.txt"), "{stdout}");
    let now = common::checkpoint::load_meta(&ck).unwrap().data.unwrap();
    assert_eq!(now, common::data::DataIdentity::of(&other).unwrap());
    // The flag without --resume is refused by the command line.
    assert_bad_input(&run(&train_args(data_s, out_s, &["--resume-on-new-data"])), "--resume");
}

/// Prompt files and tables to plot may come from a pipe as standard input (`-`,
/// `/dev/stdin`), read no further than their limit.
#[test]
fn text_from_standard_input_is_read_within_its_limit() {
    use std::process::Stdio;
    let with_stdin = |args: &[&str], stdin: Stdio| Command::new(BIN).args(args).stdin(stdin).output().unwrap();
    let zeros = || Stdio::from(std::fs::File::open("/dev/zero").unwrap());
    // The shipped model (no --checkpoint), prompts from a pipe.
    let mut child = Command::new(BIN)
        .args(["generate", "--prompt-file", "-", "--max-new-tokens", "4", "--greedy"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"ROMEO:\nJULIET:\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("--- prompt 2 ---"));
    let o = with_stdin(&["generate", "--prompt-file", "-"], zeros());
    assert_bad_input(&o, "-: longer than 16 MiB, the most a prompt file may hold");
    let plot = ["plot", "--data", "/dev/stdin", "--x", "a", "--y", "b", "--out", "p.png"];
    assert_bad_input(&with_stdin(&plot, zeros()), "longer than 64 MiB");
}

#[test]
fn generate_is_reproducible_and_greedy_is_deterministic() {
    let d = tmpdir("gen");
    let data = corpus(&d);
    let out = d.join("run");
    assert!(run(&train_args(
        data.to_str().unwrap(),
        out.to_str().unwrap(),
        &["--steps", "30"]
    ))
    .status
    .success());
    let ck = out.join("model.ckpt");
    let gen = |extra: &[&str]| {
        generate_text(
            &ck,
            &[&["--prompt", "ROMEO:", "--max-new-tokens", "40"], extra].concat(),
        )
    };
    let s1 = gen(&["--seed", "5"]);
    assert!(s1.starts_with("ROMEO:") && s1.len() > "ROMEO:".len());
    assert_eq!(s1, gen(&["--seed", "5"]), "same seed, same text");
    assert_eq!(
        gen(&["--greedy"]),
        gen(&["--greedy", "--seed", "9"]),
        "greedy ignores the seed"
    );
}

/// Printable: valid UTF-8, and no control byte other than newline and tab.
fn assert_printable(what: &str, bytes: &[u8]) {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|e| panic!("{what} is not UTF-8 ({e}): {bytes:?}"));
    let bad: Vec<char> = text
        .chars()
        .filter(|&c| c.is_control() && c != '\n' && c != '\t')
        .collect();
    assert!(bad.is_empty(), "{what} holds raw control characters {bad:?}: {text:?}");
}

#[test]
fn untrained_byte_model_output_is_printable() {
    // One step leaves the model near uniform over all 256 bytes: it emits NUL, ESC, DEL,
    // C1 bytes and broken UTF-8, which must reach the terminal escaped.
    let d = tmpdir("printable");
    let data = corpus(&d);
    let out = d.join("run");
    let args = train_args(data.to_str().unwrap(), out.to_str().unwrap(), &["--steps", "1"]);
    let o = run(&with_flag(args, "--sample-len", "200"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_printable("train's sample", &o.stdout);
    assert!(String::from_utf8_lossy(&o.stdout).contains("---- sample ----"));
    let ck = out.join("model.ckpt");
    for seed in ["1", "2"] {
        let o = run(&[
            "generate",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "200",
            "--seed",
            seed,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_printable("generate's output", &o.stdout);
        // Trained at --seq-len 16: the prompt's 6 bytes and 10 new ones fill the context.
        assert!(o.stdout.starts_with(b"ROMEO:") && o.stdout.len() > 16);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            err.trim(),
            "stage0_serial: stopped at the model's context of 16 tokens (prompt 6 + 10 new); the window does not slide"
        );
    }
}

#[test]
fn tokenize_then_train_on_bin() {
    let d = tmpdir("bin");
    let data = corpus(&d);
    let bin = d.join("corpus.bin");
    let o = run(&[
        "tokenize",
        "--input",
        data.to_str().unwrap(),
        "--output",
        bin.to_str().unwrap(),
        "--tokenizer",
        "byte",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&train_args(
        bin.to_str().unwrap(),
        d.join("r").to_str().unwrap(),
        &["--steps", "5"],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn bench_prints_json_last() {
    let o = run(&[
        "bench",
        "--model",
        "tiny",
        "--vocab",
        "256",
        "--batch",
        "2",
        "--seq-len",
        "16",
        "--steps",
        "2",
        "--warmup",
        "1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let last = stdout.trim().lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).expect("last line is JSON");
    for key in ["tokens_per_s", "ms_per_step", "peak_rss_mb"] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key} missing in {last}");
    }
}

#[test]
fn bad_corpus_inputs_fail_cleanly() {
    let d = tmpdir("badcorpus");
    let out = d.join("o");
    let out = out.to_str().unwrap();
    assert_bad_input(
        &run(&train_args(d.join("missing.txt").to_str().unwrap(), out, &[])),
        "missing.txt",
    );
    let empty = d.join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    assert_bad_input(&run(&train_args(empty.to_str().unwrap(), out, &[])), "empty");
    let short = d.join("short.txt");
    std::fs::write(&short, "too short").unwrap();
    assert_bad_input(&run(&train_args(short.to_str().unwrap(), out, &[])), "short");
}

fn bin_file(d: &Path, name: &str, magic: i32, count: i32, tokens: &[u16]) -> PathBuf {
    let mut bytes = Vec::new();
    let mut header = [0i32; 256];
    header[0] = magic;
    header[1] = 1;
    header[2] = count;
    for h in header {
        bytes.extend_from_slice(&h.to_le_bytes());
    }
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    let p = d.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn bad_bin_files_fail_cleanly() {
    let d = tmpdir("badbin");
    let out = d.join("o");
    let out = out.to_str().unwrap();
    let tokens: Vec<u16> = (0..2000).map(|i| (i % 200) as u16).collect();
    let magic = bin_file(&d, "magic.bin", 12345, 2000, &tokens);
    assert_bad_input(&run(&train_args(magic.to_str().unwrap(), out, &[])), "magic");
    let size = bin_file(&d, "size.bin", 20240520, 3000, &tokens);
    assert_bad_input(&run(&train_args(size.to_str().unwrap(), out, &[])), "size");
    let mut big = tokens.clone();
    big[77] = 300; // ≥ 256, the byte vocabulary
    let vocab = bin_file(&d, "vocab.bin", 20240520, 2000, &big);
    assert_bad_input(&run(&train_args(vocab.to_str().unwrap(), out, &[])), "300");
}

#[test]
fn bad_checkpoints_fail_cleanly() {
    let d = tmpdir("badckpt");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    let run_dir = d.join("run");
    assert!(run(&train_args(data, run_dir.to_str().unwrap(), &["--steps", "5"]))
        .status
        .success());
    let good = std::fs::read(run_dir.join("model.ckpt")).unwrap();
    let truncated = d.join("truncated.ckpt");
    std::fs::write(&truncated, &good[..good.len() / 2]).unwrap();
    let mut flipped = good.clone();
    let mid = flipped.len() - 100;
    flipped[mid] ^= 0x40;
    let corrupt = d.join("corrupt.ckpt");
    std::fs::write(&corrupt, &flipped).unwrap();
    let out = d.join("o");
    let out = out.to_str().unwrap();
    for (path, needle) in [(&truncated, "truncated"), (&corrupt, "corrupt")] {
        let p = path.to_str().unwrap();
        assert_bad_input(&run(&train_args(data, out, &["--steps", "10", "--resume", p])), needle);
        assert_bad_input(&run(&["generate", "--checkpoint", p]), needle);
    }
    // A checkpoint trained with another batch size (the data cursor would mean other windows).
    let ok = run_dir.join("model.ckpt");
    let other_batch = train_args(data, out, &["--steps", "10", "--resume", ok.to_str().unwrap()]);
    assert_bad_input(&run(&with_flag(other_batch, "--batch", "2")), "--batch");
    // A checkpoint whose config conflicts with the flags.
    let ok = run_dir.join("model.ckpt");
    let o = run(&train_args(
        data,
        out,
        &["--steps", "10", "--layers", "3", "--resume", ok.to_str().unwrap()],
    ));
    assert_bad_input(&o, "n_layer");
}

#[test]
fn impossible_dimensions_fail_cleanly() {
    let d = tmpdir("dims");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    let out = d.join("o");
    let out = out.to_str().unwrap();
    assert_bad_input(&run(&train_args(data, out, &["--heads", "3"])), "divide");
    assert_bad_input(&run(&with_flag(train_args(data, out, &[]), "--batch", "0")), "batch");
    // tiny's max sequence length is 64
    assert_bad_input(
        &run(&with_flag(train_args(data, out, &[]), "--seq-len", "65")),
        "seq-len",
    );
    assert_bad_input(&run(&train_args(data, out, &["--layers", "100000000000"])), "too large");
    assert_bad_input(
        &run(&train_args(data, out, &["--width", "4000000000", "--heads", "1"])),
        "too large",
    );
    let no_eval = with_flag(train_args(data, out, &[]), "--eval-batches", "0");
    assert_bad_input(&run(&no_eval), "eval-batches");
    let bench = ["bench", "--model", "tiny", "--vocab", "0", "--steps", "1"];
    assert_bad_input(&run(&bench), "--vocab");
    assert_bad_input(&run(&with_flag(train_args(data, out, &[]), "--model", "gpt5")), "gpt5");
}

#[test]
fn ctrl_c_saves_a_checkpoint_and_the_resumed_run_is_the_same_run() {
    let d = tmpdir("sigint");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    let schedule = ["--steps", "1500", "--warmup", "5", "--eval-every", "100"];
    let (straight, out) = (d.join("straight"), d.join("run"));
    assert!(run(&train_args(data, straight.to_str().unwrap(), &schedule))
        .status
        .success());
    let child = Command::new(BIN)
        .args(train_args(data, out.to_str().unwrap(), &schedule))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    send("INT", child.id());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(130),
        "interrupted runs exit 130 (did the run end first?): {err}"
    );
    assert!(err.contains("--resume"), "the message says how to continue: {err}");
    let ckpt = out.join("model.ckpt");
    let (out_s, ck) = (out.to_str().unwrap(), ckpt.to_str().unwrap());
    // Asking for fewer steps than were done names the checkpoint's step...
    let o = run(&train_args(data, out_s, &["--steps", "1", "--resume", ck]));
    assert_bad_input(&o, "--steps");
    // ...and without --steps the run continues its own schedule, as if never stopped.
    let o = run(&train_args(data, out_s, &["--resume", ck]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(table_without_times(&straight), table_without_times(&out));
    assert_eq!(params_of(&straight), params_of(&out));
}

#[test]
fn sigterm_and_sighup_stop_a_run_with_a_checkpoint_as_ctrl_c_does() {
    // `kill`, `timeout` or a closed terminal must not lose the run either.
    let d = tmpdir("sigterm");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    for sig in ["TERM", "HUP"] {
        let out = d.join(sig);
        let child = Command::new(BIN)
            .args(train_args(data, out.to_str().unwrap(), &["--steps", "100000"]))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        send(sig, child.id());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(130), "SIG{sig}: {err}");
        assert!(err.contains("--resume"), "SIG{sig}: {err}");
        common::checkpoint::load(&out.join("model.ckpt")).expect("the checkpoint loads");
    }
}

#[test]
fn ctrl_c_during_the_closing_sample_cuts_it_short() {
    // After the last step the run samples; Ctrl-C there ends the sample, not the finished
    // run: it exits 0 with its summary, which counts the tokens sampled.
    use std::io::{BufRead, BufReader};
    let d = tmpdir("sample-int");
    let data = corpus(&d);
    let out = d.join("run");
    let (data, out_s) = (data.to_str().unwrap(), out.to_str().unwrap());
    let args = with_flag(train_args(data, out_s, &["--steps", "4"]), "--sample-len", "1000000");
    let mut child = Command::new(BIN)
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // "saved OUT/model.ckpt" is the run's last line before the sample.
    while !lines
        .next()
        .expect("a line before the sample")
        .unwrap()
        .starts_with("saved ")
    {}
    std::thread::sleep(std::time::Duration::from_millis(200));
    send("INT", child.id());
    std::thread::spawn(move || lines.for_each(drop)); // the sample's lines, read as they come
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the sample went on for 30 s after Ctrl-C");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "a finished run: {err}");
    let summary = std::fs::read_to_string(out.join("summary.json")).expect("the summary is written");
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    let tokens = summary["sample_tokens"].as_u64().expect("sample_tokens");
    assert!(
        (1..1_000_000).contains(&tokens),
        "the sample was cut short: {tokens} tokens"
    );
}

#[test]
fn a_closed_stdout_stops_the_run_with_a_checkpoint_not_a_panic() {
    // `train ... | head -3`: once the reader has gone, the run stops as Ctrl-C stops it.
    use std::io::{BufRead, BufReader};
    let d = tmpdir("pipe");
    let data = corpus(&d);
    let out = d.join("run");
    let flags = ["--steps", "100000", "--eval-every", "1"];
    let mut child = Command::new(BIN)
        .args(train_args(data.to_str().unwrap(), out.to_str().unwrap(), &flags))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        lines.next().expect("a line").expect("UTF-8");
    }
    drop(lines); // the reader goes
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(130), "{err}");
    common::checkpoint::load(&out.join("model.ckpt")).expect("the checkpoint loads");
}

#[test]
fn non_finite_steps_are_skipped_counted_and_stop_the_run() {
    let d = tmpdir("diverge");
    let data = corpus(&d);
    let out = d.join("run");
    // lr 1e4: the first steps blow the parameters up, the losses turn NaN.
    let extra = [
        "--steps",
        "60",
        "--warmup",
        "1",
        "--lr",
        "1e4",
        "--eval-every",
        "1",
        "--checkpoint-every",
        "1",
    ];
    let o = run(&train_args(data.to_str().unwrap(), out.to_str().unwrap(), &extra));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("3 steps in a row") && err.contains("non-finite"), "{err}");
    let table = loss_table(&out);
    // Rows are written after each step's check: the third skip in a row ends the run first.
    let bad: u64 = table[1..].iter().map(|r| r[3].parse::<u64>().unwrap()).sum();
    assert!(bad >= 2, "skipped steps are counted in bad_steps: {table:?}");
    assert!(
        table[1..].iter().all(|r| r[2] != "NaN"),
        "the skipped updates left the model finite: {table:?}"
    );
    // Whatever checkpoint was written holds finite values only, and generation takes it; the
    // line names the one on disk (a write in progress when the run stopped ends first).
    let ckpt = out.join("model.ckpt");
    if ckpt.exists() {
        let step = common::checkpoint::load_meta(&ckpt).unwrap().step;
        assert!(err.contains(&format!("model.ckpt (step {step})")), "{err}");
        let o = run(&[
            "generate",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--max-new-tokens",
            "5",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// A write that fails once the run has started (a file size limit here, which fails a write as
/// a full disk does) ends the run as a failed one: exit 1, one line naming the file.
#[test]
fn a_write_failing_during_the_run_exits_1() {
    let d = tmpdir("full");
    let data = corpus(&d);
    let out = d.join("run");
    let args = train_args(data.to_str().unwrap(), out.to_str().unwrap(), &["--steps", "2"]);
    // SIGXFSZ ignored (which exec keeps), a write past 32 KiB fails with EFBIG: the table's
    // rows fit, the checkpoint does not.
    let o = Command::new("sh")
        .args(["-c", "trap '' XFSZ; ulimit -f 64; exec \"$0\" \"$@\""])
        .arg(BIN)
        .args(&args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("model.ckpt") && err.contains("File too large"), "{err}");
}

#[test]
fn generate_samples_top_p_stops_at_a_string_and_keeps_a_batch_in_order() {
    let d = tmpdir("gen-batch");
    let data = corpus(&d);
    let out = d.join("run");
    let args = train_args(data.to_str().unwrap(), out.to_str().unwrap(), &["--steps", "30"]);
    assert!(run(&with_flag(args, "--seq-len", "48")).status.success());
    let ck = out.join("model.ckpt");
    let gen = |extra: &[&str]| generate_text(&ck, &[&["--max-new-tokens", "30"], extra].concat());
    // top-p: reproducible from the seed; a tiny mass leaves the most likely token alone.
    let nucleus = gen(&["--prompt", "JULIET:", "--top-p", "0.9", "--seed", "3"]);
    assert_eq!(nucleus, gen(&["--prompt", "JULIET:", "--top-p", "0.9", "--seed", "3"]));
    let greedy = gen(&["--prompt", "JULIET:", "--greedy"]);
    assert_eq!(gen(&["--prompt", "JULIET:", "--top-p", "1e-6", "--seed", "4"]), greedy);
    // With the cache or without, the same text.
    assert_eq!(gen(&["--prompt", "JULIET:", "--greedy", "--no-kv-cache"]), greedy);
    // --stop: the text up to the string, which is not printed.
    let continuation = &greedy["JULIET:".len()..];
    let stop: String = continuation.chars().skip(3).take(2).collect();
    let at = continuation.find(&stop).unwrap();
    let stopped = gen(&["--prompt", "JULIET:", "--greedy", "--stop", &stop]);
    assert_eq!(stopped, format!("JULIET:{}\n", &continuation[..at]));
    // A batch: each prompt's completion after its header, in the file's order (greedy: the
    // same as one run per prompt).
    let prompts = ["ROMEO:", "JULIET:", "O Ro"];
    let file = d.join("prompts.txt");
    std::fs::write(&file, format!("{}\n\n{}\n{}\n", prompts[0], prompts[1], prompts[2])).unwrap();
    let batch = gen(&["--prompt-file", file.to_str().unwrap(), "--greedy"]);
    let expected: String = (0..3)
        .map(|i| {
            format!(
                "--- prompt {} ---\n{}",
                i + 1,
                gen(&["--prompt", prompts[i], "--greedy"])
            )
        })
        .collect();
    assert_eq!(batch, expected);
    // Sampled, the batch is reproducible too, and prompt 1 draws from the seed's first stream.
    let sampled = gen(&["--prompt-file", file.to_str().unwrap(), "--seed", "8"]);
    assert_eq!(sampled, gen(&["--prompt-file", file.to_str().unwrap(), "--seed", "8"]));
    let first = gen(&["--prompt", prompts[0], "--seed", "8"]);
    assert!(sampled.starts_with(&format!("--- prompt 1 ---\n{first}")));
}

#[test]
fn export_import_round_trips_and_init_from_starts_a_new_run() {
    let d = tmpdir("interop");
    let data = corpus(&d);
    let out = d.join("run");
    let args = train_args(data.to_str().unwrap(), out.to_str().unwrap(), &["--steps", "20"]);
    assert!(run(&args).status.success());
    let (ck, hf, imported) = (out.join("model.ckpt"), d.join("hf"), d.join("imported.ckpt"));
    let ok = run_ok;
    ok(&[
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--format",
        "safetensors",
        "--out",
        hf.to_str().unwrap(),
    ]);
    for f in [
        "model.safetensors",
        "config.json",
        "vocab.json",
        "merges.txt",
        "tokenizer_config.json",
    ] {
        assert!(hf.join(f).exists(), "{f} missing");
    }
    ok(&[
        "import",
        "--from",
        hf.to_str().unwrap(),
        "--out",
        imported.to_str().unwrap(),
    ]);
    // The same model: the same logits, bit for bit, and the same greedy text.
    let logits = |ckpt: &Path, file: &str| {
        let path = d.join(file);
        ok(&[
            "generate",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--prompt",
            "ROMEO:",
            "--dump-logits",
            path.to_str().unwrap(),
        ]);
        std::fs::read(path).unwrap()
    };
    assert_eq!(logits(&ck, "a.json"), logits(&imported, "b.json"));
    let greedy = |ckpt: &Path| {
        ok(&[
            "generate",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--greedy",
            "--max-new-tokens",
            "8",
        ])
    };
    assert_eq!(greedy(&ck), greedy(&imported));
    // Fine-tuning from it: a new run at step 0 with its own schedule; --resume is refused.
    let ft = d.join("ft");
    let args = train_args(data.to_str().unwrap(), ft.to_str().unwrap(), &["--steps", "3"]);
    let mut init = args.clone();
    init.retain(|a| *a != "--model" && *a != "tiny");
    init.extend(["--init-from", imported.to_str().unwrap()]);
    ok(&init);
    assert_eq!(loss_table(&ft).len(), 2, "a header and the one row of 3 steps");
    let mut resume = args.clone();
    resume.extend(["--resume", imported.to_str().unwrap()]);
    assert_bad_input(&run(&resume), "--init-from");
    // An export cut short leaves no config.json (it is removed first and written last), not the
    // earlier export's beside new files: here vocab.json cannot be replaced (a directory holds
    // its place), and import then says so in one line.
    std::fs::remove_file(hf.join("vocab.json")).unwrap();
    std::fs::create_dir_all(hf.join("vocab.json").join("in-the-way")).unwrap();
    let cut = run(&[
        "export",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--out",
        hf.to_str().unwrap(),
    ]);
    assert!(!cut.status.success());
    assert!(
        !hf.join("config.json").exists(),
        "config.json stayed beside a cut-short export"
    );
    assert_bad_input(
        &run(&[
            "import",
            "--from",
            hf.to_str().unwrap(),
            "--out",
            imported.to_str().unwrap(),
        ]),
        "export cut short",
    );
}

#[test]
fn bench_generate_reports_start_up_prefill_and_decode() {
    let o = run(&[
        "bench",
        "--generate",
        "--model",
        "tiny",
        "--vocab",
        "256",
        "--seq-len",
        "8",
        "--new-tokens",
        "8",
        "--steps",
        "2",
        "--warmup",
        "1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for key in ["startup_s", "prefill_tokens_per_s", "decode_tokens_per_s"] {
        assert!(json[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {json}");
    }
    assert_eq!(
        (json["prompt_tokens"].as_u64(), json["new_tokens"].as_u64()),
        (Some(8), Some(8))
    );
    // A prompt and new tokens past the model's positions are refused.
    assert_bad_input(
        &run(&[
            "bench",
            "--generate",
            "--model",
            "tiny",
            "--seq-len",
            "60",
            "--new-tokens",
            "8",
        ]),
        "--new-tokens",
    );
}

#[test]
fn dump_batches_writes_what_was_trained_on() {
    // --dump-batches and --save-init: the batches in order with every step's loss, and the
    // weights before the first step, from which the same run trains the same again.
    let d = tmpdir("dump");
    let data = corpus(&d);
    let (out, dump) = (d.join("run"), d.join("batches.bin"));
    let steps = 6;
    let flags = [
        "--steps",
        "6",
        "--tokenizer",
        "gpt2",
        "--eval-every",
        "1",
        "--warmup",
        "2",
        "--dump-batches",
        dump.to_str().unwrap(),
    ];
    let mut args = train_args(data.to_str().unwrap(), out.to_str().unwrap(), &flags);
    args.push("--save-init");
    let stdout = run_ok(&args);
    assert!(stdout.contains("batches.bin.json (6 steps)"), "{stdout}");

    let (meta, batches) = common::train::dump::read(&dump).unwrap();
    assert_eq!(
        (meta.batch, meta.seq_len, meta.steps, meta.first_step),
        (4, 16, steps, 0)
    );
    assert_eq!((meta.vocab_size, meta.padded_vocab_size), (50257, 50304));
    assert_eq!(batches.len(), steps as usize);
    for b in &batches {
        // Each row's targets are its inputs one token on.
        for (i, t) in b.inputs.chunks(16).zip(b.targets.chunks(16)) {
            assert_eq!(i[1..], t[..15]);
        }
    }
    assert_ne!(batches[0], batches[1], "a new batch each step");
    // Every step's loss, as loss.tsv shows it (a row per step here), and the schedule's rate.
    let table = loss_table(&out);
    for (s, loss) in meta.loss.iter().enumerate() {
        assert_eq!(format!("{loss:.4}"), table[s + 1][1], "step {s}");
        assert_eq!(meta.lr[s], meta.optimizer.lr_at(s as u64));
        assert!(meta.grad_norm[s] > 0.0 && !meta.skipped[s]);
    }

    // The vocabulary's padding rows of wte are still 0 after training: no gradient, so AdamW
    // (and its weight decay) leaves them alone; the unpadded export loses nothing.
    let ck = common::checkpoint::load(&out.join("model.ckpt")).unwrap();
    let (v, vp, c) = (50257, 50304, ck.meta.config.n_embd);
    assert!(ck.params[..v * c].iter().any(|&x| x != 0.0));
    assert!(ck.params[v * c..vp * c].iter().all(|&x| x == 0.0), "padding rows moved");

    // init.ckpt is the state before step 0: resumed from it, the run trains the same batches to
    // the same losses, bit for bit.
    let init = out.join("init.ckpt");
    assert_eq!(common::checkpoint::load(&init).unwrap().meta.step, 0);
    let (again, dump2) = (d.join("again"), d.join("again.bin"));
    let mut resumed = with_flag(args.clone(), "--out", again.to_str().unwrap());
    resumed = with_flag(resumed, "--dump-batches", dump2.to_str().unwrap());
    resumed.retain(|a| !["--save-init", "--model", "tiny", "--tokenizer", "gpt2"].contains(a));
    resumed.extend(["--resume", init.to_str().unwrap()]);
    run_ok(&resumed);
    let (meta2, batches2) = common::train::dump::read(&dump2).unwrap();
    assert_eq!(batches2, batches);
    assert_eq!(meta2.loss, meta.loss);

    // A run that dies at step 3 (as a crashed process: exit at once) while dumping over that
    // dump leaves it and its description as they were; its temporary file goes at the next write.
    let crashed = with_flag(resumed.clone(), "--dump-batches", dump.to_str().unwrap());
    let o = Command::new(BIN)
        .args(&crashed)
        .env("GPT2RS_FAIL_RANK", "0")
        .env("GPT2RS_FAIL_AT_STEP", "3")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let (meta3, batches3) = common::train::dump::read(&dump).unwrap();
    assert_eq!((meta3.steps, &batches3, &meta3.loss), (steps, &batches, &meta.loss));
    let temps = || {
        std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".batches.bin."))
            .count()
    };
    assert_eq!(temps(), 1, "the crashed writer's temporary file");
    run_ok(&crashed);
    assert_eq!(temps(), 0, "swept by the next write");
    assert_eq!(common::train::dump::read(&dump).unwrap().1, batches);

    // A path that cannot be written is one line and exit 2, before anything is written.
    let bad = d.join("no-such-dir").join("b.bin");
    let fresh = d.join("fresh");
    let mut args = with_flag(args.clone(), "--dump-batches", bad.to_str().unwrap());
    args = with_flag(args, "--out", fresh.to_str().unwrap());
    assert_bad_input(&run(&args), "no-such-dir");
    assert!(!fresh.exists(), "nothing written to OUT");
}

#[test]
fn generate_works_straight_after_the_build_with_the_shipped_model() {
    // No --checkpoint: the model in data/shakespeare-char (found through the source tree, as
    // the tests run elsewhere), the same as naming its directory.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/shakespeare-char");
    let flags = ["--prompt", "ROMEO:", "--max-new-tokens", "120", "--seed", "3"];
    let text = run_ok(&[&["generate"], &flags[..]].concat());
    assert_eq!(text, generate_text(&shipped, &flags));
    assert!(text.starts_with("ROMEO:"), "{text}");
    // Shakespeare-like: letters, spaces, newlines and punctuation, nothing escaped.
    let plain = text
        .chars()
        .filter(|c| c.is_ascii_alphabetic() || " \n,.;:!?'-".contains(*c));
    assert!(plain.count() >= text.chars().count() * 95 / 100, "{text}");
    assert!(!text.contains("\\x"), "{text}");
    // Greedy from the shipped model is reproducible, and in English words.
    let greedy = generate_text(&shipped, &["--prompt", "KING", "--greedy", "--max-new-tokens", "60"]);
    assert!(
        greedy.contains(" the ") || greedy.contains(" and ") || greedy.contains(" my "),
        "{greedy}"
    );
}

#[test]
fn report_keeps_a_diverged_runs_rows_and_plots_its_finite_losses() {
    // A run whose losses went non-finite (NaN, inf: what a diverged run writes) beside a
    // good one: the tables keep every row, the plot draws the finite points.
    let d = tmpdir("report-diverged");
    let header = "epoch\ttrain_loss\tval_loss\tbad_steps\ttokens_per_s\telapsed_s\n";
    let runs = [
        (
            "good",
            "1.000\t2.5000\t2.4000\t0\t100\t1.0\n2.000\t2.2000\t2.3000\t0\t100\t2.0\n",
        ),
        (
            "diverged",
            "1.000\t2.6000\tinf\t0\t100\t1.0\n2.000\tNaN\tNaN\t3\t100\t2.0\n",
        ),
    ];
    for (name, rows) in runs {
        std::fs::create_dir_all(d.join(name)).unwrap();
        std::fs::write(d.join(name).join("loss.tsv"), format!("{header}{rows}")).unwrap();
    }
    // The good run finished (a summary); the diverged one wrote none.
    let summary = common::report::RunSummary {
        params: 1234,
        ..Default::default()
    };
    std::fs::write(d.join("good/summary.json"), serde_json::to_string(&summary).unwrap()).unwrap();
    let out = d.join("report");
    let arg = |name: &str| format!("{name}={}", d.join(name).display());
    let o = run(&[
        "report",
        "--run",
        &arg("good"),
        "--run",
        &arg("diverged"),
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let md = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(md.contains("NaN") && md.contains("inf"), "{md}");
    // A run without summary.json is marked, not read as zeros.
    assert!(md.contains("Model: 1234 parameters"), "{md}");
    assert!(md.contains("| diverged | not finished (no summary.json) |"), "{md}");
    assert!(err.contains("note: ") && err.contains("no summary.json"), "{err}");
    let font = Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists();
    if font {
        assert!(!err.contains("no plot"), "{err}");
        assert!(out.join("loss.png").exists());
    }
}

#[test]
fn started_as_several_processes_it_refuses_in_one_line() {
    // `mpirun -n 3 stage0_serial ...` (the launcher's variables, as MPICH and Open MPI set
    // them): one line from the first process, the others silent, exit 2 for all.
    let d = tmpdir("several");
    let data = corpus(&d);
    let out = d.join("run");
    let line = [
        "train",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--model",
        "tiny",
    ];
    for (rank, size) in [
        ("PMI_RANK", "PMI_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ] {
        for r in ["0", "2"] {
            let o = Command::new(BIN)
                .args(line)
                .env(rank, r)
                .env(size, "3")
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{err}");
            match r {
                "0" => assert!(
                    err.trim().lines().count() == 1
                        && err.contains("started as 3 processes")
                        && err.contains("stage1_mpi"),
                    "{err}"
                ),
                _ => assert!(err.is_empty(), "{err}"),
            }
        }
    }
    assert!(!out.exists(), "nothing written");
    // One process of one is a plain run.
    let o = Command::new(BIN)
        .args(["bench", "--model", "tiny", "--steps", "1"])
        .env("PMI_SIZE", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `n` shards of the corpus's text as byte tokens, `{prefix}_{k:03}.bin` in `dir`: the
/// corpus cut into `n` pieces.
fn text_shards(dir: &Path, prefix: &str, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let text = std::fs::read(corpus(dir)).unwrap();
    std::fs::remove_file(dir.join("corpus.txt")).unwrap();
    let piece = text.len() / n;
    for k in 0..n {
        let tokens: Vec<u32> = text[k * piece..(k + 1) * piece].iter().map(|&b| b as u32).collect();
        common::data::write_bin(&dir.join(format!("{prefix}_{k:03}.bin")), &tokens).unwrap();
    }
}

#[test]
fn a_sharded_corpus_trains_and_resumes_across_shards_and_epochs() {
    let d = tmpdir("shards");
    // Three training shards (a third of the corpus each) and one validation shard.
    let shards = d.join("shards");
    text_shards(&shards, "c_train", 3);
    text_shards(&d.join("val"), "c_val", 4);
    std::fs::rename(d.join("val/c_val_000.bin"), shards.join("c_val_000.bin")).unwrap();
    let data = shards.to_str().unwrap();
    // 68 steps an epoch (272 windows of 16 + 1, batch 4): 80 steps cross into the second.
    let schedule = ["--steps", "80", "--warmup", "5", "--eval-every", "20"];
    let straight = d.join("straight");
    run_ok(&train_args(data, straight.to_str().unwrap(), &schedule));
    let table = table_without_times(&straight);
    assert_eq!(table.len(), 5, "{table:?}");
    assert!(table[4].starts_with("1.176\t"), "80 of 68 steps an epoch: {table:?}");

    // Stopped at step 30, then resumed: the same table and weights.
    let stopped = d.join("stopped");
    let first = [&schedule[..], &["--stop-after", "30"]].concat();
    run_ok(&train_args(data, stopped.to_str().unwrap(), &first));
    let ck = stopped.join("model.ckpt");
    let meta = common::checkpoint::load_meta(&ck).unwrap();
    assert_eq!(meta.data_order.as_deref(), Some("feistel-v1"));
    assert_eq!((meta.data_epoch, meta.data_step_in_epoch), (0, 30));
    run_ok(&train_args(
        data,
        stopped.to_str().unwrap(),
        &["--resume", ck.to_str().unwrap()],
    ));
    assert_eq!(table_without_times(&stopped), table);
    assert_eq!(params_of(&stopped), params_of(&straight));

    // The same shards named by a pattern and --val-data are the same run.
    let pattern = shards.join("c_train_*.bin");
    let val = shards.join("c_val_000.bin");
    let by_pattern = d.join("pattern");
    let extra = [&schedule[..], &["--val-data", val.to_str().unwrap()]].concat();
    run_ok(&train_args(
        pattern.to_str().unwrap(),
        by_pattern.to_str().unwrap(),
        &extra,
    ));
    assert_eq!(table_without_times(&by_pattern), table);
}
