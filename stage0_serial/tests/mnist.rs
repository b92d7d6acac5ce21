//! `stage0_serial mnist` end to end on made-up idx files (the Debian package is not needed):
//! the MLP learns them and writes its table, a run is reproducible from its seed, both
//! optimisers train, gzipped files read like plain ones, and a missing data set says to run
//! `make run-mnist`. Malformed idx files are in `bad_inputs`.

use common::mnist::synthetic;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_stage0_serial");

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stage0-mnist-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

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
