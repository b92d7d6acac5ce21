//! Stage 1 end to end under `mpirun -n 2` (MPICH Hydra): it reproduces stage 0's losses
//! (with and without --overlap), local SGD learns, flags that differ between ranks and a
//! rank that fails end every rank with a message naming it (never a hang), `bench`
//! reports compute and communication time, and `mnist` reproduces stage 0's table. Each job
//! runs under a timeout, one at a time.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_stage1_mpi");

/// Jobs of two busy-polling ranks each: run them one at a time on a small CI machine.
static ONE_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Loss-table entries of stage 0 and stage 1 agree within this (absolute), beyond the
/// table's 4-decimal rounding.
const LOSS_TOL: f32 = 1e-4;
/// Final parameters of stage 0 and stage 1 agree within this (absolute), the attention key
/// biases aside (see `key_bias_mask`): the runs sum the same gradients in another order.
const PARAM_TOL: f32 = 2e-5;

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stage1-mpi-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn corpus(dir: &Path) -> String {
    let text = "ROMEO:\nBut soft, what light through yonder window breaks?\n\nJULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n\n".repeat(40);
    let p = dir.join("corpus.txt");
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn train_args(data: &str, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["train", "--data", data, "--out", out.to_str().unwrap()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let small = "--model tiny --batch 4 --seq-len 16 --sample-len 0 --eval-batches 2 --lr 1e-2 --warmup 5";
    v.extend(small.split(' ').map(str::to_string));
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Gives `flag`, already in `args` (e.g. one of `train_args`' small settings), another value.
fn set_flag(args: &mut [String], flag: &str, value: &str) {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} is not in {args:?}"));
    args[at + 1] = value.to_string();
}

/// Runs `program args` with `env`, killing its whole process group after `limit`.
fn run_limited(program: &str, args: &[String], env: &[(&str, &str)], limit: Duration) -> Outcome {
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program} ({e}): is MPICH installed? (`make deps`)"));
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = pipe(Box::new(child.stdout.take().unwrap()));
    let err = pipe(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            panic!(
                "{program} {} hung: killed after {limit:?}\nstderr: {}",
                args.join(" "),
                err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        took: started.elapsed(),
    }
}

/// `mpirun` with the given MPMD sections (`-n N binary args...`, joined by `:`).
fn mpirun_mpmd(sections: &[Vec<String>], env: &[(&str, &str)], limit: Duration) -> Outcome {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut args = Vec::new();
    for (i, section) in sections.iter().enumerate() {
        if i > 0 {
            args.push(":".to_string());
        }
        args.extend(["-n".to_string(), "1".to_string(), BIN.to_string()]);
        args.extend(section.iter().cloned());
    }
    run_limited("mpirun", &args, env, limit)
}

fn mpirun(np: usize, args: &[String], env: &[(&str, &str)]) -> Outcome {
    mpirun_within(np, args, env, Duration::from_secs(60))
}

/// `mpirun -n np stage1_mpi args`, one job at a time, killed after `limit`.
fn mpirun_within(np: usize, args: &[String], env: &[(&str, &str)], limit: Duration) -> Outcome {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut all = vec!["-n".to_string(), np.to_string(), BIN.to_string()];
    all.extend(args.iter().cloned());
    run_limited("mpirun", &all, env, limit)
}

fn assert_ok(o: &Outcome) {
    assert_eq!(o.code, Some(0), "stdout: {}\nstderr: {}", o.stdout, o.stderr);
}

/// Two loss tables agree row for row within LOSS_TOL; both sides are rounded to 4 decimals,
/// so one unit of the last place is allowed too. `what` names the comparison.
fn assert_tables_close(got: &[[f32; 3]], want: &[[f32; 3]], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= LOSS_TOL + 1e-6, "{what}: {g:?} vs {w:?}");
        }
    }
}

/// Rows of `loss.tsv` as (epoch, train loss, val loss).
fn loss_table(dir: &Path) -> Vec<[f32; 3]> {
    let text = std::fs::read_to_string(dir.join("loss.tsv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<f32> = l.split('\t').map(|x| x.parse().unwrap()).collect();
            [f[0], f[1], f[2]]
        })
        .collect()
}

fn final_params(dir: &Path) -> Vec<f32> {
    common::checkpoint::load(&dir.join("model.ckpt")).unwrap().params
}

/// Marks the attention key biases. Their gradient is zero in exact arithmetic (a constant
/// added to every key's score leaves the softmax unchanged), so what the runs compute is
/// rounding noise, which AdamW's normalised step turns into moves of up to lr each step.
fn key_bias_mask(dir: &Path) -> Vec<bool> {
    let config = common::checkpoint::load_meta(&dir.join("model.ckpt")).unwrap().config;
    let layout = common::model::ParamLayout::new(&config);
    let c = config.n_embd;
    let mut mask = vec![false; layout.total];
    for l in 0..config.n_layer {
        let qkvb = layout.block(l, common::model::Param::QkvB).range.start;
        mask[qkvb + c..qkvb + 2 * c].fill(true);
    }
    mask
}

/// The stage 0 binary, built next to this one by `cargo test --workspace`.
fn stage0_bin() -> PathBuf {
    let p = Path::new(BIN).with_file_name("stage0_serial");
    assert!(
        p.exists(),
        "{} is missing: the equivalence test needs stage 0 built alongside (run `cargo test --workspace`)",
        p.display()
    );
    p
}

#[test]
fn reproduces_stage0_with_and_without_overlap() {
    let d = tmpdir("equiv");
    let data = corpus(&d);
    let steps = ["--steps", "30", "--eval-every", "10"];
    let reference = d.join("stage0");
    let o = run_limited(
        stage0_bin().to_str().unwrap(),
        &train_args(&data, &reference, &[&steps[..], &["--threads", "1"]].concat()),
        &[],
        Duration::from_secs(60),
    );
    assert_ok(&o);
    let (want, want_params) = (loss_table(&reference), final_params(&reference));
    let noise_only = key_bias_mask(&reference);
    assert_eq!(want.len(), 3);
    let mut finals = Vec::new();
    for (name, sync) in [
        ("plain", &[][..]),
        ("overlap", &["--overlap"][..]),
        ("buckets", &["--bucket-mb", "0.3"][..]), // blocks gathered two or more a bucket
    ] {
        let overlap = name;
        let out = d.join(format!("stage1-{name}"));
        let extra = [&steps[..], sync].concat();
        let o = mpirun(2, &train_args(&data, &out, &extra), &[]);
        assert_ok(&o);
        assert_eq!(
            o.stdout.matches("train_loss").count(),
            1,
            "rank 0 alone prints the table: {}",
            o.stdout
        );
        assert_tables_close(
            &loss_table(&out),
            &want,
            &format!("overlap {overlap}: stage 1 vs stage 0"),
        );
        let params = final_params(&out);
        assert_eq!(params.len(), want_params.len());
        assert_eq!(params.len(), noise_only.len());
        let worst = params
            .iter()
            .zip(&want_params)
            .zip(&noise_only)
            .filter(|(_, &skip)| !skip)
            .map(|((a, b), _)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= PARAM_TOL,
            "overlap {overlap}: parameters differ from stage 0 by up to {worst}"
        );
        finals.push(params);
    }
    // Two ranks' sums are a + b however the buckets cut the buffer: the same run, bit for bit.
    assert!(
        finals[1] == finals[0] && finals[2] == finals[0],
        "the buckets changed the sums"
    );
}

#[test]
fn bf16_sums_are_the_same_however_cut_and_close_to_f32_sums() {
    // --grad-comm bf16 on 2 ranks: each sum is one addition rounded to bf16, so buckets,
    // overlap and ZeRO-1's reduce-scatter leave the run the same bit for bit (ZeRO-1 without
    // clipping, whose norm it sums per shard: see zero1_equals_zero0); the losses stay near
    // the f32 sums' (and differ from them: the bf16 path is taken).
    let d = tmpdir("bf16-sums");
    let data = corpus(&d);
    let steps = ["--steps", "30", "--eval-every", "10"];
    let run = |name: &str, flags: &[&str]| {
        let out = d.join(name);
        let o = mpirun(2, &train_args(&data, &out, &[&steps[..], flags].concat()), &[]);
        assert_ok(&o);
        (loss_table(&out), final_params(&out))
    };
    // One rank has nothing to sum: the flag changes nothing.
    let one_rank = |name: &str, flags: &[&str]| {
        let out = d.join(name);
        assert_ok(&mpirun(1, &train_args(&data, &out, &[&steps[..], flags].concat()), &[]));
        final_params(&out)
    };
    assert!(one_rank("one-rank-bf16", &["--grad-comm", "bf16"]) == one_rank("one-rank", &[]));
    let (f32_losses, f32_params) = run("fp32", &[]);
    let (losses, params) = run("bf16", &["--grad-comm", "bf16"]);
    for (name, flags) in [
        ("bf16-overlap", &["--grad-comm", "bf16", "--overlap"][..]),
        ("bf16-buckets", &["--grad-comm", "bf16", "--bucket-mb", "0.3"]),
    ] {
        let (l, p) = run(name, flags);
        assert_eq!(l, losses, "{name}: the loss table");
        assert!(p == params, "{name}: the final parameters differ from plain bf16 sums'");
    }
    let unclipped = run("bf16-noclip", &["--grad-comm", "bf16", "--grad-clip", "0"]);
    let zero1 = run(
        "bf16-zero1",
        &["--grad-comm", "bf16", "--grad-clip", "0", "--zero", "1"],
    );
    assert!(zero1 == unclipped, "bf16 sums: ZeRO-1 differs from none");
    assert!(params != f32_params, "bf16 sums left every parameter as f32 sums do");
    for (b, f) in losses.iter().zip(&f32_losses) {
        for k in 1..3 {
            assert!(
                (b[k] - f[k]).abs() <= 2e-2,
                "bf16 sums' losses {b:?} against f32 sums' {f:?}"
            );
        }
    }
}

#[test]
fn the_shipped_hostfile_runs_on_this_machine() {
    // `mpirun -n 2 -f hostfile stage1_mpi train ...` as the README and the hostfile say.
    let d = tmpdir("hostfile");
    let data = corpus(&d);
    let hostfile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hostfile");
    let mut args: Vec<String> = ["-n", "2", "-f", hostfile.to_str().unwrap(), BIN]
        .map(String::from)
        .to_vec();
    args.extend(train_args(
        &data,
        &d.join("run"),
        &["--steps", "6", "--eval-every", "6"],
    ));
    let o = {
        let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        run_limited("mpirun", &args, &[], Duration::from_secs(60))
    };
    assert_ok(&o);
    assert_eq!(loss_table(&d.join("run")).len(), 1);
    let summary = std::fs::read_to_string(d.join("run/summary.json")).unwrap();
    assert!(summary.contains("\"ranks\": 2"), "{summary}");
}

#[test]
fn reduce_scatter_and_all_gather_are_exact() {
    // ZeRO-1's collectives on their own (stage1_mpi/src/bin/comm_check.rs): even, uneven and
    // empty parts, blocking and started, on 2 and 3 ranks.
    let check = env!("CARGO_BIN_EXE_comm_check");
    for ranks in ["2", "3"] {
        let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let args: Vec<String> = ["-n", ranks, check].iter().map(|s| s.to_string()).collect();
        let o = run_limited("mpirun", &args, &[], Duration::from_secs(60));
        assert_ok(&o);
        assert_eq!(
            o.stdout.matches("exact").count(),
            ranks.parse::<usize>().unwrap(),
            "{}",
            o.stdout
        );
    }
}

#[test]
fn zero1_equals_zero0() {
    // Two ranks sum each gradient as a + b, which is the same float whichever rank adds, so
    // the reduce-scatter gives each shard the all-reduce's values bit for bit, and AdamW
    // does the same arithmetic per element whoever runs it: without clipping, --zero 1
    // (overlapped or not) is --zero 0 exactly. With clipping the global norm's Σg² is
    // summed per shard (in f64, rounded to f32) and then across ranks, so the clipping factor
    // may differ in its last bit: the losses then agree within LOSS_TOL.
    let d = tmpdir("zero");
    let data = corpus(&d);
    for clip in [&["--grad-clip", "0"][..], &[]] {
        let run = |name: &str, zero: &[&str]| {
            let out = d.join(format!("{name}-clip-{}", clip.is_empty()));
            let extra = [&["--steps", "30", "--eval-every", "10"][..], clip, zero].concat();
            let o = mpirun(2, &train_args(&data, &out, &extra), &[]);
            assert_ok(&o);
            (o, out)
        };
        let (_, whole) = run("zero0", &[]);
        let (o, sharded) = run("zero1", &["--zero", "1"]);
        assert!(o.stdout.contains("(ZeRO-1: 1/2 of"), "the start-up line: {}", o.stdout);
        let (_, overlapped) = run("zero1-overlap", &["--zero", "1", "--overlap"]);
        for out in [&sharded, &overlapped] {
            if clip.is_empty() {
                assert_tables_close(&loss_table(out), &loss_table(&whole), "--zero 1 vs --zero 0");
            } else {
                assert_eq!(
                    table_without_times(out),
                    table_without_times(&whole),
                    "{}",
                    out.display()
                );
                assert_eq!(final_params(out), final_params(&whole), "{}", out.display());
            }
        }
    }
}

#[test]
fn zero1_resumes_exactly_and_on_other_rank_counts() {
    // The checkpoint holds the moments gathered whole, so a --zero 1 run stopped and resumed
    // is the same run bit for bit, and it resumes on 1 rank (and a 1-rank run on 2 under
    // --zero 1) within the ranks' rounding.
    let d = tmpdir("zero-resume");
    let data = corpus(&d);
    let schedule = ["--steps", "40", "--eval-every", "10", "--zero", "1"];
    let straight = d.join("straight");
    assert_ok(&mpirun(2, &train_args(&data, &straight, &schedule), &[]));
    for (first, then) in [(2, 2), (2, 1), (1, 2)] {
        let out = d.join(format!("{first}-then-{then}"));
        let cut = [&schedule[..], &["--stop-after", "17"]].concat();
        assert_ok(&mpirun(first, &train_args(&data, &out, &cut), &[]));
        let ckpt = out.join("model.ckpt");
        let rest = ["--eval-every", "10", "--zero", "1", "--resume", ckpt.to_str().unwrap()];
        assert_ok(&mpirun(then, &train_args(&data, &out, &rest), &[]));
        if first == then {
            assert_eq!(
                table_without_times(&out),
                table_without_times(&straight),
                "stopped and resumed"
            );
            assert_eq!(final_params(&out), final_params(&straight), "stopped and resumed");
        } else {
            let what = format!("{first} then {then} ranks vs 2 ranks straight, --zero 1");
            assert_tables_close(&loss_table(&out), &loss_table(&straight), &what);
        }
    }
}

#[test]
fn local_sgd_learns() {
    let d = tmpdir("localsgd");
    let data = corpus(&d);
    let out = d.join("run");
    let o = mpirun(
        2,
        &train_args(
            &data,
            &out,
            &["--steps", "60", "--eval-every", "20", "--sync-every", "4"],
        ),
        &[],
    );
    assert_ok(&o);
    let table = loss_table(&out);
    assert_eq!(table.len(), 3);
    assert!(
        table[2][2] < table[0][2] && table[2][2] < 3.0,
        "validation loss should fall below 3 nats: {table:?}"
    );
}

#[test]
fn flags_that_differ_between_ranks_fail_every_rank() {
    let d = tmpdir("mismatch");
    let data = corpus(&d);
    let out = d.join("run");
    let rank = |seed: &str| train_args(&data, &out, &["--steps", "5", "--seed", seed]);
    let o = mpirun_mpmd(&[rank("1"), rank("1"), rank("2")], &[], Duration::from_secs(30));
    assert_eq!(o.code, Some(2), "stderr: {}", o.stderr);
    // Every rank knows which differ: one line, rank 0's, naming them.
    let lines: Vec<&str> = o.stderr.trim().lines().collect();
    assert_eq!(lines.len(), 1, "one line: {}", o.stderr);
    assert!(
        lines[0].starts_with("stage1_mpi: error: rank(s) 2 of 3 run another binary or other flags than rank 0"),
        "{}",
        lines[0]
    );
}

/// Refused by every rank before anything runs: one line from rank 0, exit 2.
fn refused(extra: &[&str], needle: &str) {
    let d = tmpdir(&format!("refused-{}", needle.replace(['-', ' '], "")));
    let out = d.join("run");
    let o = mpirun(2, &train_args(&corpus(&d), &out, extra), &[]);
    assert_eq!(o.code, Some(2), "stderr: {}", o.stderr);
    assert_eq!(o.stderr.trim().lines().count(), 1, "one line: {}", o.stderr);
    assert!(o.stderr.contains(needle), "{}", o.stderr);
    assert!(!out.exists(), "nothing may run before the flags are checked");
}

#[test]
fn overlap_with_sync_every_is_refused() {
    refused(
        &["--overlap", "--sync-every", "2"],
        "--overlap cannot be used with --sync-every",
    );
}

#[test]
fn zero_with_sync_every_is_refused() {
    refused(
        &["--zero", "1", "--sync-every", "2"],
        "--zero 1 cannot be used with --sync-every",
    );
}

#[test]
fn precision_is_refused_on_the_cpu_ranks() {
    refused(&["--precision", "tf32"], "--precision applies to the GPU stages");
}

#[test]
fn bad_input_fails_every_rank_cleanly() {
    let d = tmpdir("badinput");
    let missing = d.join("missing.txt");
    let o = mpirun(2, &train_args(missing.to_str().unwrap(), &d.join("run"), &[]), &[]);
    assert_eq!(o.code, Some(2), "stderr: {}", o.stderr);
    // Every rank failed alike: rank 0 alone says why, in one line.
    let said: Vec<&str> = o.stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(said.len(), 1, "one line: {}", o.stderr);
    assert!(
        said[0].starts_with("stage1_mpi: error: ") && said[0].contains("missing.txt"),
        "{}",
        said[0]
    );
    // Every rank saw the error: they exit normally, no MPI_Abort.
    assert!(
        !o.stderr.contains("MPI_Abort") && !o.stderr.contains("panicked"),
        "{}",
        o.stderr
    );
}

#[test]
fn a_checkpoint_setting_no_flag_would_take_stops_every_rank_in_one_line() {
    // The settings a resumed run takes from its checkpoint pass the flags' own checks on every
    // rank. `sync_every` is read last, where rank 0 alone used to read it for its notes.
    let d = tmpdir("bad-setting");
    let data = corpus(&d);
    let out = d.join("run");
    assert_ok(&mpirun(2, &train_args(&data, &out, &["--steps", "5"]), &[]));
    let mut ckpt = common::checkpoint::load(&out.join("model.ckpt")).unwrap();
    ckpt.meta.train["sync_every"] = serde_json::json!(0);
    let forged = d.join("forged.ckpt");
    common::checkpoint::save(&forged, &ckpt.meta, &ckpt.params, &ckpt.m, &ckpt.v).unwrap();
    let o = mpirun(
        2,
        &train_args(&data, &d.join("resumed"), &["--resume", forged.to_str().unwrap()]),
        &[],
    );
    assert_eq!(o.code, Some(2), "stderr: {}", o.stderr);
    let said: Vec<&str> = o.stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(said.len(), 1, "one line: {}", o.stderr);
    let want = "stage1_mpi: error: cannot resume: the checkpoint's sync_every 0 is refused: must be at least 1";
    assert_eq!(said[0], want);
}

#[test]
fn resuming_on_ranks_that_do_not_divide_the_batch_names_those_that_do() {
    let d = tmpdir("resume-ranks");
    let data = corpus(&d);
    let out = d.join("run");
    assert_ok(&mpirun(
        2,
        &train_args(&data, &out, &["--steps", "5", "--grad-accum", "2"]),
        &[],
    ));
    let ckpt = out.join("model.ckpt");
    let resume = |np: usize| {
        let o = mpirun(
            np,
            &train_args(&data, &d.join(format!("on{np}")), &["--resume", ckpt.to_str().unwrap()]),
            &[],
        );
        assert_eq!(o.code, Some(2), "stderr: {}", o.stderr);
        let lines: Vec<String> = o.stderr.trim().lines().map(str::to_string).collect();
        assert_eq!(lines.len(), 1, "one line: {}", o.stderr);
        lines[0].clone()
    };
    let want =
        "stage1_mpi: error: the checkpoint's run has --batch 4, which 3 ranks do not divide: resume on 1, 2 or 4 rank(s)";
    assert_eq!(resume(3), want);
    // On 4 ranks, 1 row each: the checkpoint's --grad-accum 2 is named as the checkpoint's.
    assert!(resume(4).contains("--grad-accum 2 (the checkpoint's: give --grad-accum to change it)"));
}

#[test]
fn an_mnist_sweep_on_ranks_that_do_not_divide_its_batches_says_which_do() {
    let args: Vec<String> = "mnist --synthetic --bench --sweep --steps 2 --warmup 0"
        .split(' ')
        .map(str::to_string)
        .collect();
    let o = mpirun(3, &args, &[]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    let want = "stage1_mpi: error: --sweep's batches [32, 128, 512] do not divide over 3 ranks: run it on 1, 2, 4, 8, 16 or 32";
    assert_eq!(o.stderr.trim(), want);
}

#[test]
fn a_diverged_run_ends_in_one_line_naming_the_checkpoint_on_disk() {
    // lr 1e4: the losses turn non-finite within a few steps. Every rank stops at the same step;
    // rank 0's checkpoint write in progress ends first, and every rank names that one, so the
    // ranks' lines agree and one is printed.
    let d = tmpdir("diverge");
    let data = corpus(&d);
    let out = d.join("run");
    let extra = ["--steps", "60", "--eval-every", "1", "--checkpoint-every", "1"];
    let mut args = train_args(&data, &out, &extra);
    set_flag(&mut args, "--lr", "1e4");
    set_flag(&mut args, "--warmup", "1");
    let o = mpirun(2, &args, &[]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    let lines: Vec<&str> = o.stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "one line: {}", o.stderr);
    assert!(lines[0].contains("in a row"), "{}", lines[0]);
    let ckpt = out.join("model.ckpt");
    if ckpt.exists() {
        let step = common::checkpoint::load_meta(&ckpt).unwrap().step;
        assert!(lines[0].contains(&format!("model.ckpt (step {step})")), "{}", lines[0]);
    }
}

#[test]
fn rank_0_commands_and_the_environment_fail_in_one_line() {
    // Commands rank 0 runs alone share its outcome, and the environment is checked by every
    // rank together: under mpirun, one line (rank 0's) and no abort.
    let d = tmpdir("root-only");
    let data = corpus(&d);
    let missing = d.join("missing.ckpt");
    // A FIFO as the corpus: refused by rank 0 without opening it (which would wait for a writer).
    let fifo = d.join("pipe");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut from_fifo = train_args(fifo.to_str().unwrap(), &d.join("run"), &["--steps", "5"]);
    set_flag(&mut from_fifo, "--batch", "3"); // one row on each of the 3 ranks
    let args = |line: &[&str]| line.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // (arguments, environment, the message's words)
    type Case<'a> = (Vec<String>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (from_fifo, vec![], "named pipe (FIFO), not a corpus file"),
        (
            args(&["generate", "--checkpoint", missing.to_str().unwrap()]),
            vec![],
            "no such checkpoint",
        ),
        (
            args(&["tokenize", "--input", &data, "--output", &data]),
            vec![],
            "is the --input file",
        ),
        (
            args(&["export", "--checkpoint", missing.to_str().unwrap(), "--out", "x"]),
            vec![],
            "no such checkpoint",
        ),
        (
            train_args(&data, &d.join("run"), &["--steps", "2"]),
            vec![("GPT2_CUDA_GRAPH", "2")],
            "GPT2_CUDA_GRAPH=2",
        ),
    ];
    for (line, env, needle) in cases {
        let o = mpirun(3, &line, &env);
        assert_eq!(o.code, Some(2), "{line:?}: {}", o.stderr);
        let lines: Vec<&str> = o.stderr.trim().lines().collect();
        assert_eq!(lines.len(), 1, "{line:?}: one line: {}", o.stderr);
        assert!(
            lines[0].starts_with("stage1_mpi: error: ") && lines[0].contains(needle),
            "{}",
            lines[0]
        );
    }
}

#[test]
fn a_failing_rank_ends_the_job() {
    let d = tmpdir("fail");
    let data = corpus(&d);
    let args = train_args(&data, &d.join("run"), &["--steps", "100000"]);
    for mode in ["exit", "error", "panic"] {
        let env = [
            ("GPT2RS_FAIL_RANK", "1"),
            ("GPT2RS_FAIL_AT_STEP", "3"),
            ("GPT2RS_FAIL_MODE", mode),
        ];
        let o = mpirun(2, &args, &env);
        assert!(o.code.is_some_and(|c| c != 0), "{mode}: exit {:?}", o.code);
        assert!(o.took < Duration::from_secs(30), "{mode}: took {:?}", o.took);
        assert!(
            o.stderr.contains("rank 1 of 2") && o.stderr.contains("on purpose"),
            "{mode}: the message should name rank 1: {}",
            o.stderr
        );
    }
}

#[test]
fn bench_allreduce_reports_bandwidth_by_size() {
    let args: Vec<String> = "bench --allreduce --allreduce-max-mb 1 --steps 2 --warmup 1"
        .split(' ')
        .map(str::to_string)
        .collect();
    let o = mpirun(2, &args, &[]);
    assert_ok(&o);
    let rows: Vec<serde_json::Value> = o
        .stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    // 4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB; rank 0 alone prints.
    let bytes: Vec<u64> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(bytes, [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20], "{}", o.stdout);
    for r in &rows {
        assert_eq!(r["ranks"], 2);
        let (alg, bus) = (r["algbw_gb_s"].as_f64().unwrap(), r["busbw_gb_s"].as_f64().unwrap());
        assert!(
            alg > 0.0 && (bus - alg).abs() < 1e-9 * alg.max(1.0),
            "two ranks: busbw = algbw: {r}"
        );
    }
    // One rank has nothing to sum across: one line, exit 2.
    let o = run_limited(BIN, &args, &[], Duration::from_secs(60));
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("2 or more"), "{}", o.stderr);
}

#[test]
fn bench_reports_compute_and_comm_time() {
    // The sums timed alone as the steps make them: whole, bucket by bucket, in bf16, sharded.
    for flags in ["", "--overlap", "--grad-comm bf16 --zero 1 --overlap --bucket-mb 0.01"] {
        let line = format!("bench --model tiny --vocab 256 --batch 2 --seq-len 16 --steps 3 --warmup 1 {flags}");
        let args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let o = mpirun(2, &args, &[]);
        assert_ok(&o);
        let last = o.stdout.trim().lines().last().unwrap();
        let v: serde_json::Value = serde_json::from_str(last).expect("last line is JSON");
        assert_eq!(v["ranks"], 2, "{last}");
        for key in [
            "compute_ms_per_step",
            "comm_ms_per_step",
            "tokens_per_s",
            "sums_alone_ms",
        ] {
            assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key} missing in {last}");
        }
        // MPI gathers one way: the field says nothing (stage 3's say how NCCL ran them).
        assert!(v["gather"].is_null() && last.contains("\"gather\":null"), "{last}");
        assert_eq!(
            o.stdout.matches("ms/step").count(),
            1,
            "rank 0 alone prints: {}",
            o.stdout
        );
    }
}

#[test]
fn a_crashed_run_resumes_exactly() {
    let d = tmpdir("resume");
    let data = corpus(&d);
    let (straight, crashed) = (d.join("straight"), d.join("crashed"));
    let run = ["--steps", "20", "--eval-every", "10", "--checkpoint-every", "5"];
    assert_ok(&mpirun(2, &train_args(&data, &straight, &run), &[]));
    // Rank 1 dies at step 17. The checkpoint of step 15 was being written in the background
    // and may be lost with the job; the save at 15 waited for step 10's write, so
    // model.ckpt holds step 10 or step 15 (each written whole), and either resumes.
    let crash = [("GPT2RS_FAIL_RANK", "1"), ("GPT2RS_FAIL_AT_STEP", "17")];
    assert_ne!(mpirun(2, &train_args(&data, &crashed, &run), &crash).code, Some(0));
    let ckpt = crashed.join("model.ckpt");
    let resume = [&run[..], &["--resume", ckpt.to_str().unwrap()]].concat();
    assert_ok(&mpirun(2, &train_args(&data, &crashed, &resume), &[]));
    assert_eq!(
        loss_table(&straight),
        loss_table(&crashed),
        "the resumed run must match bit for bit"
    );
    assert_eq!(final_params(&straight), final_params(&crashed));
}

/// `loss.tsv` without the two time columns (tokens/s, elapsed), as written.
fn table_without_times(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("loss.tsv")).unwrap();
    text.lines()
        .map(|l| l.split('\t').take(4).collect::<Vec<_>>().join("\t"))
        .collect()
}

#[test]
fn a_run_stopped_by_stop_after_or_ctrl_c_resumes_as_the_same_run() {
    let d = tmpdir("stopped");
    let data = corpus(&d);
    // Past the warmup (5 steps); evaluated every 10 steps.
    let schedule = ["--steps", "40", "--eval-every", "10"];
    let straight = d.join("straight");
    assert_ok(&mpirun(2, &train_args(&data, &straight, &schedule), &[]));
    let resume = |out: &Path| {
        let ckpt = out.join("model.ckpt");
        let rest = ["--eval-every", "10", "--resume", ckpt.to_str().unwrap()];
        assert_ok(&mpirun(2, &train_args(&data, out, &rest), &[]));
        assert_eq!(
            table_without_times(&straight),
            table_without_times(out),
            "{}",
            out.display()
        );
        assert_eq!(final_params(&straight), final_params(out), "{}", out.display());
    };
    // --stop-after, inside an evaluation window.
    let stopped = d.join("stop-after");
    let first = [&schedule[..], &["--stop-after", "17"]].concat();
    assert_ok(&mpirun(2, &train_args(&data, &stopped, &first), &[]));
    resume(&stopped);
    // Ctrl-C: SIGINT to mpirun, which passes it to both ranks; they stop at the same step.
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let long = ["--steps", "2000", "--eval-every", "100"];
    let interrupted = d.join("ctrl-c");
    let mut args = vec!["-n".to_string(), "2".to_string(), BIN.to_string()];
    args.extend(train_args(&data, &interrupted, &long));
    let child = Command::new("mpirun")
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // (Hydra's own exit status after forwarding SIGINT is 0: the ranks' lines tell.)
    assert!(
        err.contains("interrupted: stopped after step") && err.contains("--resume"),
        "the run must have been interrupted before its end: {err}"
    );
    drop(_one);
    let straight_long = d.join("straight-long");
    assert_ok(&mpirun(2, &train_args(&data, &straight_long, &long), &[]));
    let ckpt = interrupted.join("model.ckpt");
    let rest = ["--eval-every", "100", "--resume", ckpt.to_str().unwrap()];
    assert_ok(&mpirun(2, &train_args(&data, &interrupted, &rest), &[]));
    assert_eq!(table_without_times(&straight_long), table_without_times(&interrupted));
    assert_eq!(final_params(&straight_long), final_params(&interrupted));
}

type LineReceiver = std::sync::mpsc::Receiver<String>;

/// Starts a long run under `mpirun -n 2` with a checkpoint every 10 steps; returns the job,
/// the lines it printed, and rank 1's PID, once rank 0 has printed its PID table and
/// announced a checkpoint.
fn long_run_with_checkpoints(
    out: &Path,
    data: &str,
    extra: &[&str],
) -> (std::process::Child, LineReceiver, Vec<String>, u32) {
    long_run_started_by(&[], out, data, extra)
}

/// [`long_run_with_checkpoints`], each rank started by the command `starter` (which runs
/// the binary it is given, with its arguments).
fn long_run_started_by(
    starter: &[&str],
    out: &Path,
    data: &str,
    extra: &[&str],
) -> (std::process::Child, LineReceiver, Vec<String>, u32) {
    let mut args = vec!["-n".to_string(), "2".to_string()];
    args.extend(starter.iter().map(|s| s.to_string()));
    args.push(BIN.to_string());
    let long = ["--steps", "100000", "--checkpoint-every", "10", "--eval-every", "1000"];
    args.extend(train_args(data, out, &[&long[..], extra].concat()));
    let mut child = Command::new("mpirun")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            let _ = tx.send(line);
        }
    });
    // Start-up and ten steps take a few seconds; the bound is generous (it costs nothing when
    // the run is quick) because this test failed once on a machine loaded by other builds.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut pid1, mut seen) = (None, Vec::new());
    while pid1.is_none() || !seen.iter().any(|l: &String| l.starts_with("checkpoint: step")) {
        assert!(
            Instant::now() < deadline,
            "no PID table or checkpoint within 90 s: {seen:?}"
        );
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            if let Some(table) = line.strip_prefix("ranks: ") {
                let entry = table
                    .split(", ")
                    .find(|e| e.starts_with("1 = PID "))
                    .expect("rank 1 listed");
                pid1 = entry.trim_start_matches("1 = PID ").parse().ok();
            }
            seen.push(line);
        }
    }
    (child, rx, seen, pid1.unwrap())
}

/// Sends signal `sig` ("KILL", "TERM", ...) to process `pid`.
fn send(sig: &str, pid: u32) {
    let sent = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
    assert!(sent.unwrap().success(), "kill -{sig} {pid}");
}

/// The first line of `err` that contains `what` (the test fails without one).
fn line_with<'a>(err: &'a str, what: &str) -> &'a str {
    err.lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line with {what:?}: {err}"))
}

/// The N of "`words`N;" in `line`, if it says so (a stop line's step).
fn step_after(line: &str, words: &str) -> Option<u64> {
    line.split(words).nth(1)?.split(';').next()?.parse().ok()
}

/// OUT/mlp.ckpt of an `mnist` run in `dir`, read and checked.
fn mlp_checkpoint(dir: &Path) -> common::mnist::checkpoint::MlpCheckpoint {
    let path = dir.join("mlp.ckpt");
    common::mnist::checkpoint::parse(&std::fs::read(&path).unwrap(), &path).unwrap()
}

/// Waits for the job (at most 60 s) and returns its exit code, stderr and the time it took
/// after the kill.
fn ends_within_a_minute(mut child: std::process::Child) -> (Option<i32>, String, Duration) {
    let killed_at = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "the job did not end within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    (status.code(), err, killed_at.elapsed())
}

#[test]
fn a_rank_stopped_by_sigquit_names_itself_and_the_last_checkpoint() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmpdir("sigquit");
    let out = d.join("run");
    let (child, _, _, pid1) = long_run_with_checkpoints(&out, &corpus(&d), &[]);
    send("QUIT", pid1);
    let (code, err, took) = ends_within_a_minute(child);
    assert_ne!(code, Some(0), "{err}");
    let line = line_with(&err, "stopped by SIGQUIT");
    assert!(line.contains("rank 1 of 2"), "{line}");
    assert!(
        line.contains("last good checkpoint is") && line.contains("model.ckpt (step"),
        "{line}"
    );
    eprintln!("job ended {took:?} after the SIGQUIT: {line}");
    common::checkpoint::load(&out.join("model.ckpt")).expect("the named checkpoint loads");
}

/// SIGTERM, to one rank (`kill` of its PID) or to mpirun (a scheduler's time limit; mpirun
/// passes it to every rank), stops the job as Ctrl-C does: every rank after the same step,
/// with a checkpoint of that step, in one line, and the run resumes from it.
#[test]
fn sigterm_to_one_rank_or_to_mpirun_stops_the_job_after_a_step_with_a_checkpoint() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmpdir("sigterm");
    let data = corpus(&d);
    for to_mpirun in [false, true] {
        let out = d.join(if to_mpirun { "mpirun" } else { "rank1" });
        let (child, _, seen, pid1) = long_run_with_checkpoints(&out, &data, &[]);
        let pid = if to_mpirun { child.id() } else { pid1 };
        send("TERM", pid);
        let (code, err, took) = ends_within_a_minute(child);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line (to mpirun: {to_mpirun}): {err}");
        let line = lines[0];
        let step = step_after(line, "interrupted: stopped after step ")
            .unwrap_or_else(|| panic!("not a stop after a step (to mpirun: {to_mpirun}): {line}"));
        assert!(line.contains("--resume"), "{line}");
        // The ranks exit 130, as after Ctrl-C; mpirun's own status after passing a signal on
        // is Hydra's (130 here, 0 on the GPU hosts), so it is not asserted.
        let ckpt = common::checkpoint::load(&out.join("model.ckpt")).expect("the checkpoint loads");
        assert_eq!(ckpt.meta.step, step, "the checkpoint is of the step the line names");
        assert!(step >= 10, "stopped after the first checkpoint (step 10): {seen:?}");
        eprintln!("job stopped {took:?} after the SIGTERM (to mpirun: {to_mpirun}; exit {code:?}): {line}");
    }
    drop(_one);
    // The run resumes from the checkpoint the stop wrote (as after Ctrl-C, whose resumed run
    // equals an uninterrupted one: a_run_stopped_by_stop_after_or_ctrl_c_resumes_as_the_same_run).
    let out = d.join("mpirun");
    let ckpt = out.join("model.ckpt");
    let step = common::checkpoint::load(&ckpt).unwrap().meta.step;
    let more = (step + 3).to_string();
    let rest = ["--stop-after", &more, "--resume", ckpt.to_str().unwrap()];
    assert_ok(&mpirun(2, &train_args(&data, &out, &rest), &[]));
    assert_eq!(common::checkpoint::load(&ckpt).unwrap().meta.step, step + 3);
}

#[test]
fn a_rank_killed_outright_is_named_by_its_pid_and_the_checkpoints_are_announced() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmpdir("sigkill");
    let out = d.join("run");
    let (child, rx, printed, pid1) = long_run_with_checkpoints(&out, &corpus(&d), &[]);
    send("KILL", pid1);
    let (code, err, _) = ends_within_a_minute(child);
    assert_ne!(code, Some(0), "{err}");
    // Hydra ends the job within milliseconds of a death (before a survivor can speak, most
    // often) and names the PID of the first process it reaped: usually the killed rank's,
    // but in a race inside Hydra one of the survivors it ended (1 run in 12 on a loaded
    // 2-core machine). Rank 0's table maps that PID to its rank; a survivor that got to
    // speak named rank 1 (the test above gives it the time); rank 0 announced its checkpoint.
    let after: Vec<String> = rx.iter().collect(); // to the end of its output
    let table = printed.iter().find(|l| l.starts_with("ranks: ")).unwrap();
    let named: String = after
        .iter()
        .find_map(|l| l.trim_start_matches('=').trim().strip_prefix("PID "))
        .unwrap_or_else(|| panic!("no PID from the launcher: {after:?} {err}"))
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    assert!(
        table.contains(&format!("= PID {named}")),
        "PID {named} is not in {table}"
    );
    for line in err.lines().filter(|l| l.contains("ended before the run did")) {
        assert!(
            line.starts_with("rank 0 of 2") && line.contains(&format!("rank 1 (PID {pid1})")),
            "{line}"
        );
    }
    eprintln!("the launcher named PID {named}; {table}");
    let announced = printed.iter().find(|l| l.starts_with("checkpoint: step")).unwrap();
    assert!(
        announced.ends_with(&out.join("model.ckpt").display().to_string()),
        "{announced}"
    );
    common::checkpoint::load(&out.join("model.ckpt")).expect("the last checkpoint loads");
}

#[test]
fn a_rank_killed_outright_is_named_by_a_survivor_when_the_launcher_leaves_time() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmpdir("sigkill-slow-launcher");
    let out = d.join("run");
    // Each rank runs under a shell that outlives it by 10 s, holding its link to mpirun:
    // the launcher does not see the death (as some launchers do not end a job when a
    // process dies), so the survivor's watch on the dead rank is what ends the job (in
    // about 5 s) and names it.
    let shell = ["sh", "-c", "\"$0\" \"$@\"; s=$?; sleep 10; exit $s"];
    let (child, _, _, pid1) = long_run_started_by(&shell, &out, &corpus(&d), &[]);
    send("KILL", pid1);
    let (code, err, took) = ends_within_a_minute(child);
    assert_ne!(code, Some(0), "{err}");
    let line = line_with(&err, &format!("rank 1 (PID {pid1}) ended before the run did"));
    assert!(line.starts_with("rank 0 of 2"), "{line}");
    assert!(
        line.contains("the last good checkpoint is") && line.contains("model.ckpt (step"),
        "{line}"
    );
    eprintln!("job ended {took:?} after the SIGKILL: {line}");
}

#[test]
fn a_stopped_rank_is_caught_by_the_comm_timeout() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmpdir("sigstop");
    let out = d.join("run");
    let (child, _, _, pid1) = long_run_with_checkpoints(&out, &corpus(&d), &["--comm-timeout", "3"]);
    // Rank 1 stops (SIGSTOP): rank 0 waits in its next collective until the timeout.
    send("STOP", pid1);
    let (code, err, took) = ends_within_a_minute(child);
    assert_ne!(code, Some(0), "{err}");
    let line = line_with(&err, "no progress for 3 s");
    assert!(
        line.contains("rank 0 of 2") && line.contains("last good checkpoint is"),
        "{line}"
    );
    // Rank 0 sees rank 1 stopped on their host and names it.
    let named = format!("rank 1 (PID {pid1}) is stopped (SIGSTOP or a debugger)");
    assert!(line.contains(&named), "{line}");
    eprintln!("job ended {took:?} after the SIGSTOP: {line}");
}

#[test]
fn grad_accum_on_one_rank_is_two_ranks_bit_for_bit() {
    // Two ranks take the two halves of each global batch of 4 and sum their gradients as
    // a + b; one rank with --grad-accum 2 takes the same halves one after the other, computes
    // the second half's gradients apart from the first's and adds them: the same run, bit
    // for bit, overlapped or not, and under ZeRO-1 without clipping. With clipping ZeRO-1
    // sums the norm per shard, so there the losses agree within the ranks' rounding.
    let d = tmpdir("accum");
    let data = corpus(&d);
    for clip in [&[][..], &["--grad-clip", "0"]] {
        let steps = [&["--steps", "30", "--eval-every", "10"][..], clip].concat();
        let accum = d.join(format!("stage0-accum-clip-{}", clip.is_empty()));
        let args = train_args(
            &data,
            &accum,
            &[&steps[..], &["--threads", "1", "--grad-accum", "2"]].concat(),
        );
        assert_ok(&run_limited(
            stage0_bin().to_str().unwrap(),
            &args,
            &[],
            Duration::from_secs(60),
        ));
        for sync in [&[][..], &["--overlap"], &["--zero", "1", "--overlap"]] {
            let ranks = d.join(format!("stage1-{}-clip-{}", sync.join(""), clip.is_empty()));
            assert_ok(&mpirun(
                2,
                &train_args(&data, &ranks, &[&steps[..], sync].concat()),
                &[],
            ));
            let what = format!("--grad-accum 2 vs 2 ranks {sync:?} {clip:?}");
            if sync.contains(&"--zero") && clip.is_empty() {
                assert_tables_close(&loss_table(&accum), &loss_table(&ranks), &what);
            } else {
                assert_eq!(table_without_times(&accum), table_without_times(&ranks), "{what}");
                assert!(
                    final_params(&accum) == final_params(&ranks),
                    "{what}: parameters differ"
                );
            }
        }
    }
}

#[test]
fn eight_ranks_match_one_rank_accumulating_and_reshard_on_resume() {
    // The used-by line's world size on the CPU: 8 ranks, one sequence each of a global batch
    // of 8, with and without ZeRO-1 (8 shards), against stage 0 taking each batch in 8
    // micro-batches, within the ranks' rounding (a sum of 8 in another order); a --zero 1 run
    // stopped on 8 ranks resumes on 2 (the optimiser's shards cut again), within the same bound.
    let d = tmpdir("eight");
    let data = corpus(&d);
    // A global batch of 8, evaluated every 10 steps; 30 steps unless resumed.
    let args = |out: &Path, extra: &[&str]| {
        let steps: &[&str] = if extra.contains(&"--resume") {
            &[]
        } else {
            &["--steps", "30"]
        };
        let mut args = train_args(&data, out, &[steps, &["--eval-every", "10"], extra].concat());
        set_flag(&mut args, "--batch", "8");
        args
    };
    let on_8_ranks = |out: &Path, extra: &[&str]| {
        let o = mpirun_within(8, &args(out, extra), &[], Duration::from_secs(180));
        assert_ok(&o);
        assert!(o.stdout.contains("over 8 rank(s)"), "{}", o.stdout);
    };
    let accum = d.join("stage0-accum");
    let stage0 = stage0_bin();
    let o = run_limited(
        stage0.to_str().unwrap(),
        &args(&accum, &["--threads", "1", "--grad-accum", "8"]),
        &[],
        Duration::from_secs(120),
    );
    assert_ok(&o);
    let want = loss_table(&accum);
    for zero in ["0", "1"] {
        let out = d.join(format!("zero{zero}"));
        on_8_ranks(&out, &["--zero", zero]);
        let what = format!("8 ranks --zero {zero} vs stage 0 --grad-accum 8");
        assert_tables_close(&loss_table(&out), &want, &what);
    }
    let out = d.join("8-then-2");
    on_8_ranks(&out, &["--zero", "1", "--stop-after", "17"]);
    let ckpt = out.join("model.ckpt");
    assert_ok(&mpirun(
        2,
        &args(&out, &["--zero", "1", "--resume", ckpt.to_str().unwrap()]),
        &[],
    ));
    assert_tables_close(&loss_table(&out), &want, "8 then 2 ranks, --zero 1, vs stage 0");
}

#[test]
fn a_checkpoint_resumes_on_another_number_of_ranks() {
    // Checkpoints hold the whole state (rank 0 writes it) and a global data cursor, so a run
    // stopped on 2 ranks continues on 1 and back, within the ranks' rounding of stage 0.
    let d = tmpdir("reshard");
    let data = corpus(&d);
    let schedule = ["--steps", "40", "--eval-every", "10"];
    let straight = d.join("straight");
    assert_ok(&mpirun(2, &train_args(&data, &straight, &schedule), &[]));
    for (first, then) in [(2, 1), (1, 2)] {
        let out = d.join(format!("{first}-then-{then}"));
        let cut = [&schedule[..], &["--stop-after", "17"]].concat();
        assert_ok(&mpirun(first, &train_args(&data, &out, &cut), &[]));
        let ckpt = out.join("model.ckpt");
        let rest = ["--eval-every", "10", "--resume", ckpt.to_str().unwrap()];
        assert_ok(&mpirun(then, &train_args(&data, &out, &rest), &[]));
        let what = format!("{first} then {then} ranks vs 2 ranks straight");
        assert_tables_close(&loss_table(&out), &loss_table(&straight), &what);
    }
}

#[test]
fn validation_covers_the_same_windows_at_any_rank_count() {
    // 15 validation windows: per-rank-sized batches would cover 12, global ones 8; rank 0
    // must evaluate exactly stage 0's windows.
    let d = tmpdir("eval");
    let text = "ROMEO:\nBut soft, what light through yonder window breaks?\n\nJULIET:\nO Romeo, Romeo!\n\n".repeat(60);
    let data = d.join("corpus.txt");
    std::fs::write(&data, text).unwrap();
    let data = data.to_str().unwrap();
    let flags = ["--steps", "20", "--eval-every", "10"];
    let sized = |out: &Path| {
        let mut args = train_args(data, out, &flags);
        set_flag(&mut args, "--batch", "8");
        set_flag(&mut args, "--seq-len", "32");
        args
    };
    let reference = d.join("stage0");
    let o = run_limited(
        stage0_bin().to_str().unwrap(),
        &sized(&reference),
        &[],
        Duration::from_secs(60),
    );
    assert_ok(&o);
    let out = d.join("stage1");
    assert_ok(&mpirun(2, &sized(&out), &[]));
    let (got, want) = (loss_table(&out), loss_table(&reference));
    assert_eq!(got.len(), want.len(), "stage 1 {got:?} vs stage 0 {want:?}");
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g[2] - w[2]).abs() <= LOSS_TOL + 1e-6,
            "val loss: stage 1 {g:?} vs stage 0 {w:?}"
        );
    }
}

/// `mnist` rows as (train loss, test loss, test accuracy), the epoch and timings dropped.
fn mnist_table(dir: &Path) -> Vec<[f32; 3]> {
    let text = std::fs::read_to_string(dir.join("loss.tsv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<f32> = l.split('\t').map(|x| x.parse().unwrap()).collect();
            [f[1], f[2], f[3]]
        })
        .collect()
}

#[test]
fn mnist_reproduces_stage0() {
    use common::mnist::synthetic;
    let d = tmpdir("mnist");
    let mut files = Vec::new();
    for (set, count, seed) in [("train", 1000, 1), ("test", 300, 2)] {
        let (images, labels) = (d.join(format!("{set}-images.idx")), d.join(format!("{set}-labels.idx")));
        synthetic::write_idx(&synthetic::dataset(count, 12, seed), &images, &labels).unwrap();
        files.extend([format!("--{set}-images"), images.display().to_string()]);
        files.extend([format!("--{set}-labels"), labels.display().to_string()]);
    }
    // 1000 images in global batches of 50: 20 steps an epoch, 100 steps in all.
    let args = |out: &Path| {
        let mut v = vec!["mnist".to_string(), "--out".to_string(), out.display().to_string()];
        v.extend(files.iter().cloned());
        v.extend("--hidden 32,16 --batch 50 --epochs 5".split(' ').map(str::to_string));
        v
    };
    for (optimizer, lr) in [("sgd", "0.05"), ("adamw", "3e-3")] {
        let (reference, out) = (
            d.join(format!("stage0-{optimizer}")),
            d.join(format!("stage1-{optimizer}")),
        );
        let flag = ["--optimizer", optimizer, "--lr", lr].map(str::to_string);
        let o = run_limited(
            stage0_bin().to_str().unwrap(),
            &[args(&reference), flag.to_vec(), vec!["--threads".into(), "1".into()]].concat(),
            &[],
            Duration::from_secs(60),
        );
        assert_ok(&o);
        let o = mpirun(2, &[args(&out), flag.to_vec()].concat(), &[]);
        assert_ok(&o);
        assert_eq!(
            o.stdout.matches("train_loss").count(),
            1,
            "rank 0 alone prints: {}",
            o.stdout
        );
        let (got, want) = (mnist_table(&out), mnist_table(&reference));
        assert_eq!(want.len(), 5);
        // Losses within LOSS_TOL; accuracy within 0.2 points (the bound after training).
        for (g, w) in got.iter().zip(&want) {
            let close = (g[0] - w[0]).abs() <= LOSS_TOL + 1e-6
                && (g[1] - w[1]).abs() <= LOSS_TOL + 1e-6
                && (g[2] - w[2]).abs() <= 0.002;
            assert!(close, "{optimizer}: stage 1 {got:?} vs stage 0 {want:?}");
        }
        assert!(want[4][2] > 0.9, "{optimizer}: it learns: {want:?}");
        // Stopped mid-epoch (20 steps an epoch) and resumed on the ranks: the same table.
        let stopped = d.join(format!("stage1-{optimizer}-stopped"));
        let stop = ["--stop-after", "30"].map(str::to_string);
        assert_ok(&mpirun(
            2,
            &[args(&stopped), flag.to_vec(), stop.to_vec()].concat(),
            &[],
        ));
        assert_eq!(mnist_table(&stopped).len(), 1);
        let ckpt = stopped.join("mlp.ckpt").display().to_string();
        let resume = ["--resume".to_string(), ckpt];
        assert_ok(&mpirun(
            2,
            &[args(&stopped), flag.to_vec(), resume.to_vec()].concat(),
            &[],
        ));
        assert_eq!(mnist_table(&stopped), got, "{optimizer}: resumed on 2 ranks");
        let arrays = |dir: &Path| {
            let ck = mlp_checkpoint(dir);
            (ck.meta.step, ck.params, ck.state)
        };
        assert_eq!(
            arrays(&stopped),
            arrays(&out),
            "{optimizer}: the same weights and state"
        );
    }
}

/// SIGTERM to mpirun (a scheduler's time limit) stops `mnist` as it stops `train`: every rank
/// after the same step (the ranks agree in the loss's sum), a checkpoint of that step, one line.
#[test]
fn sigterm_to_mpirun_stops_mnist_after_a_step_with_a_checkpoint() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmpdir("mnist-sigterm");
    let out = d.join("run");
    let args = "mnist --synthetic --hidden 32 --batch 64 --epochs 1000".split(' ');
    let mut child = Command::new("mpirun")
        .args(["-n", "2", BIN])
        .args(args)
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    // The first epoch's row shows the job under way.
    let deadline = Instant::now() + Duration::from_secs(90);
    while std::fs::read_to_string(out.join("loss.tsv")).map_or(0, |t| t.lines().count()) < 2 {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no epoch within 90 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    send("TERM", child.id());
    let (_, err, took) = ends_within_a_minute(child);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    let step = step_after(lines[0], "stopped after step ").unwrap_or_else(|| panic!("not a stop after a step: {err}"));
    assert_eq!(
        mlp_checkpoint(&out).meta.step,
        step,
        "the checkpoint is of the step the line names"
    );
    eprintln!("mnist job stopped {took:?} after the SIGTERM: {}", lines[0]);
}

/// hwloc (which MPICH asks for the topology at MPI_Init) does not probe OpenCL unless the user
/// names the components. What shows the probe: the OpenCL loader, pointed by OCL_ICD_VENDORS
/// at a folder naming a made-up driver, looks that library up, which `LD_DEBUG=libs` prints.
#[test]
fn mpi_init_keeps_hwloc_off_opencl_unless_the_user_names_its_components() {
    let d = tmpdir("hwloc");
    let driver = "libgpt2rs_made_up_opencl_driver.so";
    std::fs::write(d.join("made-up.icd"), format!("{driver}\n")).unwrap();
    let vendors = d.to_str().unwrap();
    let bench: Vec<String> = "bench --model tiny --batch 2 --seq-len 16 --steps 1 --warmup 0"
        .split(' ')
        .map(str::to_string)
        .collect();
    let probes = |extra: &[(&str, &str)]| {
        let mut env = vec![("OCL_ICD_VENDORS", vendors), ("LD_DEBUG", "libs")];
        env.extend_from_slice(extra);
        let o = mpirun(2, &bench, &env);
        assert_ok(&o);
        o.stderr.contains(&format!("find library={driver}"))
    };
    assert!(
        probes(&[("HWLOC_COMPONENTS", "-gl")]),
        "with HWLOC_COMPONENTS=-gl set by the user, hwloc's OpenCL plugin should probe the made-up \
         driver; is libhwloc-plugins installed (`make deps`)?"
    );
    assert!(!probes(&[]), "by default MPI_Init should not let hwloc probe OpenCL");
}

/// The test corpus as byte tokens in `.bin` shards: `train` training shards and one
/// validation shard (`c_val_000.bin`) in `dir`, the corpus cut into `train + 1` pieces.
fn shards(dir: &Path, train: usize) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let text = std::fs::read(corpus(dir)).unwrap();
    std::fs::remove_file(dir.join("corpus.txt")).unwrap();
    let piece = text.len() / (train + 1);
    for k in 0..=train {
        let name = match k < train {
            true => format!("c_train_{k:03}.bin"),
            false => "c_val_000.bin".to_string(),
        };
        let tokens: Vec<u32> = text[k * piece..(k + 1) * piece].iter().map(|&b| b as u32).collect();
        common::data::write_bin(&dir.join(name), &tokens).unwrap();
    }
    dir.to_str().unwrap().to_string()
}

#[test]
fn a_sharded_corpus_matches_stage0_and_resumes_on_another_rank_count() {
    let d = tmpdir("shards");
    let data = shards(&d.join("shards"), 3);
    let steps = ["--steps", "30", "--eval-every", "10"];
    let reference = d.join("stage0");
    let args = train_args(&data, &reference, &[&steps[..], &["--threads", "1"]].concat());
    assert_ok(&run_limited(
        stage0_bin().to_str().unwrap(),
        &args,
        &[],
        Duration::from_secs(60),
    ));
    let straight = d.join("straight");
    assert_ok(&mpirun(2, &train_args(&data, &straight, &steps), &[]));
    assert_tables_close(
        &loss_table(&straight),
        &loss_table(&reference),
        "2 ranks vs stage 0, shards",
    );
    // Stopped on 2 ranks at step 13, resumed on 1: the batches the straight run saw.
    let out = d.join("2-then-1");
    let cut = [&steps[..], &["--stop-after", "13"]].concat();
    assert_ok(&mpirun(2, &train_args(&data, &out, &cut), &[]));
    let ckpt = out.join("model.ckpt");
    let rest = ["--eval-every", "10", "--resume", ckpt.to_str().unwrap()];
    assert_ok(&mpirun(1, &train_args(&data, &out, &rest), &[]));
    assert_tables_close(
        &loss_table(&out),
        &loss_table(&straight),
        "2 then 1 ranks vs 2 ranks, shards",
    );
}

#[test]
fn a_rank_that_sees_other_shards_stops_the_job_in_one_line() {
    // The same relative --data from two working directories: rank 1's has a shard more.
    let d = tmpdir("other-shards");
    let (a, b) = (d.join("a"), d.join("b"));
    shards(&a.join("shards"), 2);
    shards(&b.join("shards"), 3);
    let out = d.join("run");
    let line = train_args("shards", &out, &["--steps", "3"]);
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut args = Vec::new();
    for (i, dir) in [&a, &b].iter().enumerate() {
        if i > 0 {
            args.push(":".to_string());
        }
        let wdir = dir.to_str().unwrap().to_string();
        args.extend(["-n".into(), "1".into(), "-wdir".into(), wdir, BIN.to_string()]);
        args.extend(line.iter().cloned());
    }
    let o = run_limited("mpirun", &args, &[], Duration::from_secs(30));
    assert_eq!(o.code, Some(2), "stderr: {}", o.stderr);
    let lines: Vec<&str> = o.stderr.trim().lines().collect();
    assert_eq!(lines.len(), 1, "one line: {}", o.stderr);
    assert!(
        lines[0].starts_with("stage1_mpi: error: rank 1 of 2 does not see rank 0's shard shards/c_train_000.bin"),
        "{}",
        lines[0]
    );
}
