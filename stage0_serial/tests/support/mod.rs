//! What several of stage 0's test files need: a fresh folder, running the binary, signalling
//! a run, and reading the step its stop line names.

// Each test file is its own crate, and not every one uses every helper.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The stage 0 binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_stage0_serial");

/// A new, empty folder for test `name` of this test file, under the system's temp folder.
pub fn tmpdir(name: &str) -> PathBuf {
    let file = env!("CARGO_CRATE_NAME");
    let d = std::env::temp_dir().join(format!("stage0-{file}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the binary with `args`.
pub fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("binary runs")
}

/// Runs the binary, which must succeed; its stdout.
pub fn run_ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).expect("stdout is UTF-8")
}

/// Sends signal `sig` ("INT", "TERM", ...) to process `pid`; the test fails if `kill` does.
pub fn send(sig: &str, pid: u32) {
    let sent = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
    assert!(sent.is_ok_and(|s| s.success()), "kill -{sig} {pid}");
}

/// The N of "stopped after step N;" in `text`, if it says so.
pub fn stopped_after_step(text: &str) -> Option<u64> {
    text.split("stopped after step ")
        .nth(1)?
        .split(';')
        .next()?
        .parse()
        .ok()
}
