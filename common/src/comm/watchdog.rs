//! When a rank of a job is stopped from outside, the job must end, and say which rank and
//! where the last good checkpoint is. One implementation for MPI (stage 1) and NCCL
//! (stage 3):
//!
//! - A rank stopped by a signal it can catch (SIGTERM, SIGHUP, SIGQUIT: a scheduler, a
//!   user's `kill`) prints one line naming itself, the step and the last good checkpoint,
//!   then ends the whole job (MPI_Abort), so no rank waits for it in a collective.
//! - A rank killed outright (SIGKILL, the OOM killer) cannot speak: the launcher ends the
//!   job and names a process by PID and host (the first it saw fail: the killed rank, or
//!   a survivor that failed first on the broken link, whose transport then names the dead
//!   PID). Rank 0's first lines map each PID to its rank ([`pid_table`]), and every
//!   checkpoint rank 0 writes is announced, so the output says which rank died and where to
//!   resume from.
//! - A rank that stops making progress (a collective that never completes because another
//!   rank is stopped or hung: `--comm-timeout` seconds without a step) prints one line
//!   naming itself, the step and the last good checkpoint, then ends the job.

use super::Comm;
use crate::error::{Error, Result};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the watchdog knows of the run.
struct Progress {
    step: u64,
    /// When the run last made progress (a step began, a checkpoint was written).
    last: Instant,
    /// The last checkpoint written: its path and step.
    checkpoint: Option<(String, u64)>,
    /// The run is over (or stopping): no more timeouts.
    disarmed: bool,
}

impl Progress {
    /// "the last good checkpoint is ... (step N)", or that there is none.
    fn last_checkpoint(&self) -> String {
        match &self.checkpoint {
            Some((path, step)) => format!("the last good checkpoint is {path} (step {step})"),
            None => "no checkpoint was written in this run".to_string(),
        }
    }
}

/// Says `line` on stderr in one piece and ends the job with `status`.
fn end_job(abort_job: fn(u8), line: String, status: u8) {
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
    abort_job(status);
}

/// Listens for termination signals on a thread of its own; see the module documentation.
pub struct Watchdog {
    progress: Arc<Mutex<Progress>>,
}

/// Exit status of a job ended by signal `sig` (the shell's convention).
fn status_for(sig: i32) -> u8 {
    (128 + sig).clamp(0, 255) as u8
}

impl Watchdog {
    /// Starts watching, where there is a job to end (`None` for one process: there a
    /// signal's default action ends the run, and nobody waits for it). With `timeout`, a
    /// rank that makes no progress for that long ends the job.
    pub fn start(comm: &dyn Comm, timeout: Option<Duration>) -> Result<Option<Self>> {
        let Some(abort_job) = comm.job_abort() else {
            return Ok(None);
        };
        use signal_hook::consts::{SIGHUP, SIGQUIT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP, SIGQUIT])
            .map_err(|e| Error::Device(format!("cannot watch for termination signals: {e}")))?;
        let progress = Arc::new(Mutex::new(Progress {
            step: 0,
            last: Instant::now(),
            checkpoint: None,
            disarmed: false,
        }));
        let (seen, who) = (Arc::clone(&progress), comm.describe());
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    let p = seen.lock().unwrap_or_else(|e| e.into_inner());
                    let name = signal_hook::low_level::signal_name(sig).unwrap_or("a signal");
                    let line = format!(
                        "{who}: stopped by {name} at step {}; ending the job: {}",
                        p.step,
                        p.last_checkpoint()
                    );
                    end_job(abort_job, line, status_for(sig));
                }
            })
            .map_err(|e| Error::Device(format!("cannot start the watchdog thread: {e}")))?;
        if let Some(timeout) = timeout {
            let (seen, who) = (Arc::clone(&progress), comm.describe());
            std::thread::Builder::new()
                .name("comm-timeout".into())
                .spawn(move || loop {
                    std::thread::sleep(Duration::from_millis(200).min(timeout));
                    let p = seen.lock().unwrap_or_else(|e| e.into_inner());
                    if p.disarmed {
                        return;
                    }
                    if p.last.elapsed() >= timeout {
                        let line = format!(
                            "{who}: no progress for {} s at step {} (--comm-timeout): another rank is stopped or hung; ending the job: {}",
                            timeout.as_secs(),
                            p.step,
                            p.last_checkpoint()
                        );
                        end_job(abort_job, line, 1);
                    }
                })
                .map_err(|e| Error::Device(format!("cannot start the timeout thread: {e}")))?;
        }
        Ok(Some(Watchdog { progress }))
    }

    /// The run is over, or stopping on its own: no more timeouts (signals still end the job).
    pub fn disarm(&self) {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).disarmed = true;
    }

    /// The run is at (0-based) `step`.
    pub fn at_step(&self, step: u64) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        (p.step, p.last) = (step, Instant::now());
    }

    /// A checkpoint of `step` steps was written (by rank 0) to `path`.
    pub fn saved(&self, path: &Path, step: u64) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        (p.checkpoint, p.last) = (Some((path.display().to_string(), step)), Instant::now());
    }
}

/// Rank 0's line mapping each rank to its process id ("ranks: 0 = PID 4107, 1 = PID
/// 4108"), so the PID a launcher names when a process is killed reads as a rank. Every rank
/// takes part; `None` for one process.
pub fn pid_table(comm: &dyn Comm) -> Result<Option<String>> {
    if comm.size() == 1 {
        return Ok(None);
    }
    // Two exact 16-bit halves per rank (an f32 holds integers below 2^24 exactly).
    let pid = std::process::id();
    let mut halves = vec![0.0f32; 2 * comm.size()];
    halves[2 * comm.rank()] = (pid >> 16) as f32;
    halves[2 * comm.rank() + 1] = (pid & 0xffff) as f32;
    comm.all_reduce_sum_host(&mut halves)?;
    let pids = halves.chunks(2).map(|h| ((h[0] as u32) << 16) | h[1] as u32);
    let list: Vec<String> = pids.enumerate().map(|(r, p)| format!("{r} = PID {p}")).collect();
    Ok(Some(format!("ranks: {}", list.join(", "))))
}
