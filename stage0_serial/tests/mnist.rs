//! `stage0_serial mnist` end to end on made-up idx files (the Debian package is not needed):
//! the MLP learns them and writes its table, a run is reproducible from its seed, both
//! optimisers train, gzipped files read like plain ones, and a missing data set says to run
//! `make run-mnist`. Malformed idx files are in `bad_inputs`.

mod support;

use common::mnist::synthetic;
use std::path::Path;
use std::process::{Command, Output};
use support::{send, stopped_after_step, tmpdir, BIN};

/// A training set of 600 and a test set of 200 images of 12 × 12 pixels, in `dir`, with
/// the file flags that name them (`ext`: "idx" or "gz").
fn data(dir: &Path, ext: &str) -> Vec<String> {
    let mut flags = Vec::new();
    for (set, count, seed) in [("train", 600, 1), ("test", 200, 2)] {
        let (images, labels) = (
            dir.join(format!("{set}-images.{ext}")),
            dir.join(format!("{set}-labels.{ext}")),
        );
        synthetic::write_idx(&synthetic::dataset(count, 12, seed), &images, &labels).unwrap();
        flags.extend([format!("--{set}-images"), images.display().to_string()]);
        flags.extend([format!("--{set}-labels"), labels.display().to_string()]);
    }
    flags
}

fn mnist(files: &[String], out: &Path, extra: &[&str]) -> Output {
    let small = ["--hidden", "32,16", "--batch", "20", "--epochs", "4", "--threads", "2"];
    Command::new(BIN)
        .arg("mnist")
        .args(files)
        .arg("--out")
        .arg(out)
        .args(small)
        .args(extra)
        .output()
        .unwrap()
}

/// Rows of `loss.tsv` without the header, the timing columns dropped.
fn table(out: &Path) -> Vec<Vec<f32>> {
    let text = std::fs::read_to_string(out.join("loss.tsv")).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("epoch\ttrain_loss\ttest_loss\ttest_accuracy\tsamples_per_s\telapsed_s")
    );
    lines
        .map(|l| l.split('\t').take(4).map(|x| x.parse().unwrap()).collect())
        .collect()
}

fn assert_ok(o: &Output) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn the_mlp_learns_and_a_seed_fixes_the_run() {
    let d = tmpdir("learns");
    let files = data(&d, "idx");
    let o = mnist(&files, &d.join("a"), &[]);
    assert_ok(&o);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("MLP 144→32→16→10") && stdout.contains("test accuracy"),
        "{stdout}"
    );
    let t = table(&d.join("a"));
    assert_eq!(t.len(), 4, "one row per epoch: {t:?}");
    assert!(
        t[3][1] < t[0][1] && t[3][3] > 0.9,
        "the test loss falls and accuracy passes 90%: {t:?}"
    );
    // The same seed gives the same table; gzipped files read the same.
    let gz = data(&d, "gz");
    assert_ok(&mnist(&gz, &d.join("b"), &[]));
    assert_eq!(table(&d.join("b")), t);
    assert_ok(&mnist(&files, &d.join("c"), &["--seed", "7"]));
    assert_ne!(table(&d.join("c")), t);
    // SGD on one rank runs the fused step; the generic one (GPT2_MNIST_FUSED=0) writes the
    // same table, with a 1-thread backend too.
    assert!(stdout.contains("fused step"), "{stdout}");
    let generic = Command::new(BIN)
        .arg("mnist")
        .args(&files)
        .arg("--out")
        .arg(d.join("d"))
        .args(["--hidden", "32,16", "--batch", "20", "--epochs", "4", "--threads", "1"])
        .env("GPT2_MNIST_FUSED", "0")
        .output()
        .unwrap();
    assert_ok(&generic);
    assert!(!String::from_utf8_lossy(&generic.stdout).contains("fused step"));
    assert_eq!(table(&d.join("d")), t);
}

#[test]
fn adamw_trains_too_and_refuses_a_momentum() {
    let d = tmpdir("adamw");
    let files = data(&d, "idx");
    let o = mnist(
        &files,
        &d.join("a"),
        &["--optimizer", "adamw", "--lr", "3e-3", "--weight-decay", "0.01"],
    );
    assert_ok(&o);
    let t = table(&d.join("a"));
    assert!(t[3][3] > 0.9, "{t:?}");
    let o = mnist(&files, &d.join("b"), &["--optimizer", "adamw", "--momentum", "0.5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--momentum applies to --optimizer sgd"));
}

#[test]
fn without_files_or_the_package_it_says_to_run_make_run_mnist() {
    let d = tmpdir("no-package");
    let o = Command::new(BIN)
        .args(["mnist", "--out"])
        .arg(d.join("o"))
        .env("GPT2RS_FASHION_MNIST_DIR", &d)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("make run-mnist"), "{err}");
}

/// `--trace` writes what another framework needs to repeat the run: the initial parameters,
/// every step's images and its learning rate and loss, the settings.
#[test]
fn trace_writes_the_initial_weights_and_every_step() {
    let d = tmpdir("trace");
    let files = data(&d, "idx");
    assert_ok(&mnist(&files, &d.join("a"), &["--trace"]));
    let trace = d.join("a").join("trace");
    let params = (144 * 32 + 32) + (32 * 16 + 16) + (16 * 10 + 10);
    assert_eq!(std::fs::read(trace.join("init.f32")).unwrap().len(), 4 * params);
    // 600 images in batches of 20: 30 steps an epoch, 4 epochs, every image once an epoch.
    let order = std::fs::read(trace.join("order.i32")).unwrap();
    let ids: Vec<i32> = order
        .chunks(4)
        .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(ids.len(), 4 * 600);
    let mut first: Vec<i32> = ids[..600].to_vec();
    first.sort();
    assert_eq!(first, (0..600).collect::<Vec<_>>());
    let steps = std::fs::read_to_string(trace.join("steps.tsv")).unwrap();
    let rows: Vec<Vec<f64>> = steps
        .lines()
        .skip(1)
        .map(|l| l.split('\t').map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 120);
    assert!(rows
        .iter()
        .enumerate()
        .all(|(i, r)| r[0] == i as f64 && r[2].is_finite()));
    assert!(
        (rows[0][1] - 0.05).abs() < 1e-9,
        "the first step's lr is --lr: {:?}",
        rows[0]
    );
    let settings = std::fs::read_to_string(trace.join("settings.json")).unwrap();
    assert!(
        settings.contains("\"widths\"") && settings.contains("\"momentum\""),
        "{settings}"
    );
    // The epoch's mean of the traced losses is the table's training loss.
    let mean: f64 = rows[..30].iter().map(|r| r[2]).sum::<f64>() / 30.0;
    assert!((mean - table(&d.join("a"))[0][1] as f64).abs() < 1e-4);
}

/// `--bench` times steps and prints one JSON line per shape: the fused step on the CPU (its
/// ops issued each step: `fused-queued`), the generic one under `GPT2_MNIST_FUSED=0`, with the
/// same last loss (the fused step computes the generic one's values bit for bit).
#[test]
fn bench_prints_one_json_line_per_shape() {
    let d = tmpdir("bench");
    let files = data(&d, "idx");
    let bench = |fused: &str| {
        let o = Command::new(BIN)
            .arg("mnist")
            .args(&files)
            .args([
                "--bench", "--steps", "12", "--warmup", "3", "--hidden", "16", "--batch", "20",
            ])
            .args(["--threads", "2"])
            .env("GPT2_MNIST_FUSED", fused)
            .output()
            .unwrap();
        assert_ok(&o);
        let stdout = String::from_utf8_lossy(&o.stdout);
        let rows: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(rows.len(), 1, "{stdout}");
        rows[0].clone()
    };
    let (r, generic) = (bench("1"), bench("0"));
    assert_eq!(
        (&r["path"], &generic["path"]),
        (&"fused-queued".into(), &"generic".into())
    );
    assert_eq!(r["final_loss"], generic["final_loss"]);
    assert_eq!(r["steps"], 12);
    assert_eq!(r["widths"], serde_json::json!([144, 16, 10]));
    assert!(r["samples_per_s"].as_f64().unwrap() > 0.0 && r["final_loss"].as_f64().unwrap().is_finite());
    let o = Command::new(BIN).args(["mnist", "--steps", "5"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "--steps without --bench is refused");
}

/// A run's checkpoint (OUT/mlp.ckpt), read and checked.
fn checkpoint(out: &Path) -> common::mnist::checkpoint::MlpCheckpoint {
    let path = out.join("mlp.ckpt");
    common::mnist::checkpoint::parse(&std::fs::read(&path).unwrap(), &path).expect("the checkpoint reads")
}

/// Its parameters and the optimiser's state, the values that the run goes on from.
fn arrays(out: &Path) -> (Vec<f32>, Vec<Vec<f32>>) {
    let ck = checkpoint(out);
    (ck.params, ck.state)
}

/// A run stopped mid-epoch by --stop-after, resumed, ends with the table and the weights of
/// the run never stopped: SGD on the fused step, AdamW on the generic one.
#[test]
fn a_stopped_run_resumes_to_the_uninterrupted_table_and_weights() {
    let d = tmpdir("resume");
    let files = data(&d, "idx");
    for optimizer in ["sgd", "adamw"] {
        let flags = [
            "--optimizer",
            optimizer,
            "--lr",
            if optimizer == "sgd" { "0.05" } else { "3e-3" },
        ];
        let (straight, stopped) = (
            d.join(format!("{optimizer}-straight")),
            d.join(format!("{optimizer}-stopped")),
        );
        assert_ok(&mnist(&files, &straight, &flags));
        let ck = checkpoint(&straight);
        assert_eq!((ck.meta.step, ck.meta.log.rows), (120, 4), "the end's checkpoint");
        // 30 steps an epoch: step 45 is mid-way through the second, step 60 its end. The
        // second stop is of the resumed run, which the third run continues.
        let resume = stopped.join("mlp.ckpt");
        let resume = ["--resume", resume.to_str().unwrap()];
        let o = mnist(&files, &stopped, &[&flags[..], &["--stop-after", "45"]].concat());
        assert_ok(&o);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            stdout.contains("stopped after step 45 as --stop-after asked"),
            "{stdout}"
        );
        assert_eq!(table(&stopped).len(), 1, "one whole epoch");
        assert_eq!(checkpoint(&stopped).meta.step, 45);
        let o = mnist(
            &files,
            &stopped,
            &[&flags[..], &resume, &["--stop-after", "60"]].concat(),
        );
        assert_ok(&o);
        assert!(String::from_utf8_lossy(&o.stdout).contains("at step 45 of 120"));
        assert_eq!((table(&stopped).len(), checkpoint(&stopped).meta.step), (2, 60));
        // --stop-after counts from the run's start: a step already done is refused.
        let o = mnist(
            &files,
            &stopped,
            &[&flags[..], &resume, &["--stop-after", "60"]].concat(),
        );
        assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stderr).contains("done 60 steps already"));
        assert_ok(&mnist(&files, &stopped, &[&flags[..], &resume].concat()));
        assert_eq!(table(&stopped), table(&straight), "{optimizer}");
        assert_eq!(arrays(&stopped), arrays(&straight), "{optimizer}");
    }
}

/// Ctrl-C, SIGTERM and SIGHUP stop a run after its current step with a checkpoint of that
/// step, in one line, exit 130; and a new run in the same --out moves that run aside.
#[test]
fn a_signal_stops_the_run_with_a_checkpoint_and_a_new_run_moves_it_aside() {
    let d = tmpdir("signal");
    let files = data(&d, "idx");
    for sig in ["INT", "TERM", "HUP"] {
        let out = d.join(sig);
        let child = Command::new(BIN)
            .arg("mnist")
            .args(&files)
            .arg("--out")
            .arg(&out)
            .args([
                "--hidden",
                "32,16",
                "--batch",
                "20",
                "--epochs",
                "1000000",
                "--threads",
                "2",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The first epoch's row shows the run under way.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::fs::read_to_string(out.join("loss.tsv")).map_or(0, |t| t.lines().count()) < 2 {
            assert!(std::time::Instant::now() < deadline, "no epoch within 60 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        send(sig, child.id());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(130), "SIG{sig}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "SIG{sig}: {err}");
        let step = stopped_after_step(&err).unwrap_or_else(|| panic!("SIG{sig}: {err}"));
        assert!(err.contains("--resume"), "SIG{sig}: {err}");
        assert_eq!(
            checkpoint(&out).meta.step,
            step,
            "SIG{sig}: the checkpoint of the step named"
        );
    }
    // A new run there moves the stopped one's table and checkpoint to OUT/earlier/.
    let out = d.join("TERM");
    let (before_table, before) = (std::fs::read(out.join("loss.tsv")).unwrap(), checkpoint(&out).meta);
    let o = mnist(&files, &out, &[]);
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("held an earlier run's files"));
    let earlier = out.join("earlier");
    assert_eq!(std::fs::read(earlier.join("loss.tsv")).unwrap(), before_table);
    assert_eq!(checkpoint(&earlier).meta, before);
    assert_eq!(checkpoint(&out).meta.step, 120);
}

/// A checkpoint that cannot continue this run is refused in one line, exit 2.
#[test]
fn resume_refuses_another_runs_or_a_broken_checkpoint() {
    let d = tmpdir("resume-bad");
    let files = data(&d, "idx");
    let run = d.join("run");
    assert_ok(&mnist(&files, &run, &["--stop-after", "40"]));
    let ck = run.join("mlp.ckpt");
    let ck_s = ck.to_str().unwrap();
    let refused = |extra: &[&str], needle: &str| {
        // The run's flags (as `mnist` gives them), --batch from `extra` where it has one.
        let batch = if extra.contains(&"--batch") {
            &[][..]
        } else {
            &["--batch", "20"][..]
        };
        let o = Command::new(BIN)
            .arg("mnist")
            .args(&files)
            .arg("--out")
            .arg(d.join("other"))
            .args(["--hidden", "32,16", "--epochs", "4", "--threads", "2"])
            .args(batch)
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.contains(needle), "{extra:?}: expected {needle:?} in {err}");
    };
    refused(&["--resume", ck_s, "--batch", "30"], "--batch 20 (this run: 30)");
    refused(
        &["--resume", ck_s, "--seed", "9", "--lr", "0.1"],
        "--lr 0.05 (this run: 0.1)",
    );
    refused(&["--resume", ck_s, "--trace"], "--trace");
    refused(
        &["--resume", d.join("none.ckpt").to_str().unwrap()],
        "no such checkpoint file",
    );
    let fifo = d.join("pipe");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // No wait for a writer.
    refused(
        &["--resume", fifo.to_str().unwrap()],
        "named pipe (FIFO), not an MLP checkpoint file",
    );
    // Other data: the test set's 200 images made with another seed.
    let other = d.join("other-data");
    std::fs::create_dir_all(&other).unwrap();
    let mut changed = files.clone();
    let (images, labels) = (other.join("test-images.idx"), other.join("test-labels.idx"));
    synthetic::write_idx(&synthetic::dataset(200, 12, 5), &images, &labels).unwrap();
    let at = changed.iter().position(|f| f == "--test-images").unwrap();
    changed[at + 1] = images.display().to_string();
    changed[at + 3] = labels.display().to_string();
    let o = mnist(&changed, &d.join("other"), &["--resume", ck_s]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("test set 200 images"));
    // A flipped byte, a cut file, a GPT-2 checkpoint, a finished run.
    let bytes = std::fs::read(&ck).unwrap();
    let bad = d.join("bad.ckpt");
    let bad_s = bad.to_str().unwrap();
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 1;
    std::fs::write(&bad, &flipped).unwrap();
    refused(&["--resume", bad_s], "corrupt");
    std::fs::write(&bad, &bytes[..bytes.len() - 100]).unwrap();
    refused(&["--resume", bad_s], "corrupt");
    std::fs::write(&bad, &bytes[..10]).unwrap();
    refused(&["--resume", bad_s], "truncated");
    let mut gpt2 = b"GPT2RSCK".to_vec();
    gpt2.extend_from_slice(&bytes[8..]);
    std::fs::write(&bad, &gpt2).unwrap();
    refused(&["--resume", bad_s], "a GPT-2 checkpoint");
    assert_ok(&mnist(&files, &d.join("done"), &[]));
    let done = d.join("done").join("mlp.ckpt");
    refused(&["--resume", done.to_str().unwrap()], "is finished");
}
