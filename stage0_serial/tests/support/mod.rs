//! What several of stage 0's test files need: signalling a run, and reading the step its stop
//! line names.

/// Sends signal `sig` ("INT", "TERM", ...) to process `pid`; the test fails if `kill` does.
pub fn send(sig: &str, pid: u32) {
    let sent = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
    assert!(sent.is_ok_and(|s| s.success()), "kill -{sig} {pid}");
}

/// The N of "stopped after step N;" in `text`, if it says so.
#[allow(dead_code)] // each test file is its own crate, and not every one reads a stop line
pub fn stopped_after_step(text: &str) -> Option<u64> {
    text.split("stopped after step ")
        .nth(1)?
        .split(';')
        .next()?
        .parse()
        .ok()
}
