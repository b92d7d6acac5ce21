//! Failure injection for the tests of failure handling, compiled only with the `common` crate's
//! `fault-injection` feature (the stages' tests turn it on; release builds do not have it).

use crate::comm::Comm;
use crate::error::{Error, Result};

/// Test hook for failure handling: `GPT2RS_FAIL_RANK=r GPT2RS_FAIL_AT_STEP=s` makes rank
/// r exit(1) at once when it reaches step s, without telling the other ranks, as a crashed
/// process would; with `GPT2RS_FAIL_MODE=error` it returns an error instead (an error on
/// one rank alone), with `panic` it panics (a bug). The stage 1 tests check that the job
/// then ends, and never hangs.
pub(super) fn fail_if_asked(comm: &dyn Comm, step: u64) -> Result<()> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if var("GPT2RS_FAIL_RANK") != Some(comm.rank() as u64) || var("GPT2RS_FAIL_AT_STEP") != Some(step) {
        return Ok(());
    }
    let why = format!("failing on purpose at step {step} (GPT2RS_FAIL_RANK test hook)");
    match std::env::var("GPT2RS_FAIL_MODE").as_deref() {
        Ok("error") => return Err(Error::Device(why)),
        Ok("panic") => panic!("{}: {why}", comm.describe()),
        _ => {}
    }
    eprintln!("{}: {why}", comm.describe());
    std::process::exit(1);
}
