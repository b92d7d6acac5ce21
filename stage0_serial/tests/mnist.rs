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
