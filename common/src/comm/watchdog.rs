//! When a rank of a job is stopped from outside, the job must end, and say which rank and
//! where the last good checkpoint is. One implementation for MPI (stage 1) and NCCL
//! (stage 3):
//!
//! - SIGTERM or SIGHUP on any rank (a scheduler's time limit, mpirun passing on a `kill`, a
//!   `kill` of one rank) stops the run as Ctrl-C does: the rank asks to stop (the handler of
//!   [`crate::stop::on_signals`], as in one process), the ranks agree on it after the
//!   current step (the sum at every step's end), rank 0 writes a checkpoint and says in one line how to resume, and every
//!   rank exits 130. Nothing is said at the signal itself, so a signal that reaches every
//!   rank (mpirun passes it on), or comes again while the ranks leave (Hydra's, to the ranks
//!   still running when one has exited 130), is still one line. After the last step it only
//!   cuts rank 0's closing sample short. A rank stuck where the others cannot reach that sum
//!   is ended by `--comm-timeout` (below).
//! - SIGQUIT: the rank prints one line naming itself, the step and the last good checkpoint,
//!   then ends the whole job at once (MPI_Abort), so no rank waits for it in a collective.
//! - A rank killed outright (SIGKILL, the OOM killer) cannot speak. The ranks on its host
//!   hold a process handle of it (pidfd) and wake when it ends; the first to wake prints
//!   one line naming it (rank and PID), the step and the last good checkpoint, and ends the
//!   job a few seconds later unless the launcher has. Hydra's mpirun is quicker: it learns
//!   of the death as the process closes its files and ends the job at once, most often
//!   before a survivor can speak, and names the PID of the first process it reaped: usually
//!   the killed rank, but in a race inside Hydra one of the survivors it ended. Rank 0's
//!   first lines map each PID to its rank ([`Ranks::table`]), and every checkpoint rank 0
//!   writes is announced. (A survivor whose transport aborts on the broken link waits a
//!   few seconds first, so Hydra does not name it instead: `comm/mpi.rs`. Ranks on other
//!   hosts are not watched this way: there the launcher's line, or `--comm-timeout`.) Ranks
//!   leave in order only after all of them stopped watching ([`Watchdog::leaving`], then
//!   [`leave_together`]), so a rank that ends normally is never reported.
//! - A rank that stops making progress (a collective that never completes because another
//!   rank is stopped or hung: `--comm-timeout` seconds without a step) prints one line
//!   naming itself, the step, the ranks on its host that are stopped (SIGSTOP, a debugger),
//!   if any, and the last good checkpoint, then ends the job.

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
    /// A later checkpoint rank 0 is writing, as far as this rank knows (ranks other than 0
    /// learn that a write has finished only at the step after it).
    writing: Option<(String, u64)>,
    /// The run is over (or stopping): no more timeouts.
    disarmed: bool,
    /// The ranks are leaving together: another rank's end is no news.
    leaving: bool,
}

impl Progress {
    /// "the last good checkpoint is ... (step N)", or that there is none.
    fn last_checkpoint(&self) -> String {
        let later = self
            .writing
            .as_ref()
            .filter(|(_, step)| self.checkpoint.as_ref().is_none_or(|(_, done)| step > done));
        let written = match &self.checkpoint {
            Some((path, step)) => format!("{path} (step {step})"),
            None => "none of this run".to_string(),
        };
        match (later, &self.checkpoint) {
            (Some((path, step)), _) => format!(
                "the last good checkpoint is {path} (step {step}) if its write has finished (rank 0 says \
                 so in a line), else {written}"
            ),
            (None, Some(_)) => format!("the last good checkpoint is {written}"),
            (None, None) => "no checkpoint was written in this run".to_string(),
        }
    }
}

/// Says `line` on stderr in one piece and ends the job with `status`.
fn end_job(abort_job: fn(u8), line: String, status: u8) {
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
    abort_job(status);
}

/// Watches for SIGQUIT, for a rank on this host that ends without a word, and (with a
/// timeout) for a lack of progress, on threads of its own; see the module documentation.
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
    /// rank that makes no progress for that long ends the job. `ranks` (every rank's PID and
    /// host) names the ranks on this host to watch for an end without a word.
    pub fn start(comm: &dyn Comm, timeout: Option<Duration>, ranks: Option<&Ranks>) -> Result<Option<Self>> {
        let Some(abort_job) = comm.job_abort() else {
            return Ok(None);
        };
        use signal_hook::consts::SIGQUIT;
        crate::stop::take_back_termination_signals();
        // SIGTERM and SIGHUP ask for a stop (`stop::on_signals`); SIGQUIT ends the job here.
        let mut signals = signal_hook::iterator::Signals::new([SIGQUIT])
            .map_err(|e| Error::Device(format!("cannot watch for SIGQUIT: {e}")))?;
        let progress = Arc::new(Mutex::new(Progress {
            step: 0,
            last: Instant::now(),
            checkpoint: None,
            writing: None,
            disarmed: false,
            leaving: false,
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
            let peers = ranks.map(|r| r.here(comm.rank())).unwrap_or_default();
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
                            "{who}: no progress for {} s at step {} (--comm-timeout): {}; ending the job: {}",
                            timeout.as_secs(),
                            p.step,
                            why_no_progress(&peers),
                            p.last_checkpoint()
                        );
                        end_job(abort_job, line, 1);
                    }
                })
                .map_err(|e| Error::Device(format!("cannot start the timeout thread: {e}")))?;
        }
        if let Some(ranks) = ranks {
            watch_peers(
                ranks.here(comm.rank()),
                Arc::clone(&progress),
                comm.describe(),
                abort_job,
            )?;
        }
        Ok(Some(Watchdog { progress }))
    }

    /// The run is over, or stopping on its own: no more timeouts, and the other ranks may
    /// leave.
    pub fn disarm(&self) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        (p.disarmed, p.leaving) = (true, true);
    }

    /// The ranks are about to leave together ([`leave_together`]): another rank's end is no
    /// longer reported; the timeout still watches the barrier.
    pub fn leaving(&self) {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).leaving = true;
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

    /// Rank 0 has begun writing the checkpoint of `step` steps at `path` (named, if this rank
    /// ends before it learns that the write finished, as the one that may be good).
    pub fn writing(&self, path: &Path, step: u64) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        p.writing = Some((path.display().to_string(), step));
    }
}

impl Drop for Watchdog {
    /// A run that ends with an error every rank saw leaves too ([`leave_together`], still
    /// under the timeout).
    fn drop(&mut self) {
        self.leaving();
    }
}

/// Every rank's process id and host, the same on every rank.
pub struct Ranks {
    pids: Vec<u32>,
    /// A hash of each rank's host name, boot and PID namespace: ranks with equal values see
    /// the same processes under the same PIDs.
    hosts: Vec<u64>,
}

impl Ranks {
    /// Every rank takes part; `None` for one process.
    pub fn exchange(comm: &dyn Comm) -> Result<Option<Ranks>> {
        if comm.size() == 1 {
            return Ok(None);
        }
        // Six exact 16-bit words per rank: the PID's two, the host's four (an f32 holds
        // integers below 2^24 exactly).
        let (pid, host) = (std::process::id() as u64, host_id());
        let mine = [
            pid >> 16,
            pid & 0xffff,
            host >> 48,
            (host >> 32) & 0xffff,
            (host >> 16) & 0xffff,
            host & 0xffff,
        ];
        let mut words = vec![0.0f32; 6 * comm.size()];
        words[6 * comm.rank()..][..6].copy_from_slice(&mine.map(|w| w as f32));
        comm.all_reduce_sum_host(&mut words)?;
        let joined = |w: &[f32]| w.iter().fold(0u64, |acc, &x| (acc << 16) | x as u64);
        Ok(Some(Ranks {
            pids: words.chunks(6).map(|w| joined(&w[..2]) as u32).collect(),
            hosts: words.chunks(6).map(|w| joined(&w[2..])).collect(),
        }))
    }

    /// Rank 0's line mapping each rank to its process id ("ranks: 0 = PID 4107, 1 = PID
    /// 4108"), so the PID a launcher names when a process is killed reads as a rank.
    pub fn table(&self) -> String {
        let list: Vec<String> = self
            .pids
            .iter()
            .enumerate()
            .map(|(r, p)| format!("{r} = PID {p}"))
            .collect();
        format!("ranks: {}", list.join(", "))
    }

    /// The other ranks on `me`'s host, with their PIDs.
    fn here(&self, me: usize) -> Vec<(usize, u32)> {
        (0..self.pids.len())
            .filter(|&r| r != me && self.hosts[r] == self.hosts[me])
            .map(|r| (r, self.pids[r]))
            .collect()
    }
}

/// 64-bit FNV-1a of the host name, the kernel's boot id and this process's PID namespace
/// (containers on one kernel see other processes under other PIDs).
fn host_id() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let namespace = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let text = read("/proc/sys/kernel/hostname") + &read("/proc/sys/kernel/random/boot_id") + &namespace;
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Why a rank has waited past `--comm-timeout`, as far as it can see: the ranks among `peers`
/// (rank, PID: those on this host) that are stopped (SIGSTOP, a debugger), else the causes it
/// cannot tell apart.
fn why_no_progress(peers: &[(usize, u32)]) -> String {
    let stopped: Vec<String> = (peers.iter())
        .filter(|&&(_, pid)| is_stopped(pid))
        .map(|(rank, pid)| format!("rank {rank} (PID {pid})"))
        .collect();
    match stopped.len() {
        0 => "another rank is stopped or hung (or a step, evaluation or checkpoint takes longer: raise --comm-timeout)"
            .to_string(),
        1 => format!("{} is stopped (SIGSTOP or a debugger)", stopped[0]),
        _ => format!("{} are stopped (SIGSTOP or a debugger)", stopped.join(", ")),
    }
}

/// Whether process `pid` is stopped: its state in /proc/PID/stat (after the command's closing
/// parenthesis) is T (stopped by a signal) or t (by a tracer).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
        })
        .unwrap_or(false)
}

/// How long a rank that saw another die waits for the launcher to end the job.
const GRACE_AFTER_A_DEATH: Duration = Duration::from_secs(5);

/// Watches `peers` (rank, PID) on a thread of its own: the first to end while the run is
/// armed ends the job with a line naming it. Peers whose handle cannot be had (a kernel
/// before 5.3, a PID already gone) are left to the launcher and `--comm-timeout`.
fn watch_peers(peers: Vec<(usize, u32)>, progress: Arc<Mutex<Progress>>, who: String, abort_job: fn(u8)) -> Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let handles: Vec<(usize, u32, OwnedFd)> = peers
        .into_iter()
        .filter_map(|(rank, pid)| {
            // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
            // SAFETY: a non-negative result is a descriptor this process now owns.
            (fd >= 0).then(|| (rank, pid, unsafe { OwnedFd::from_raw_fd(fd as i32) }))
        })
        .collect();
    if handles.is_empty() {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("peer-watch".into())
        .spawn(move || {
            let mut fds: Vec<libc::pollfd> = handles
                .iter()
                .map(|(_, _, fd)| libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            loop {
                // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries.
                let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
                if ready < 0 {
                    if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return; // cannot watch: the launcher and the timeout remain
                }
                let Some(i) = fds.iter().position(|f| f.revents != 0) else {
                    continue;
                };
                let p = progress.lock().unwrap_or_else(|e| e.into_inner());
                if p.leaving {
                    return; // the ranks are leaving in order
                }
                let (rank, pid, _) = &handles[i];
                let line = format!(
                    "{who}: rank {rank} (PID {pid}) ended before the run did (killed, crashed or aborted) at step {}; ending the job: {}",
                    p.step,
                    p.last_checkpoint()
                );
                drop(p);
                // Said at once; the job is ended a little later, so that the launcher
                // (which ends the job when a process dies) names the dead rank first.
                let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
                std::thread::sleep(GRACE_AFTER_A_DEATH);
                abort_job(1);
                return;
            }
        })
        .map_err(|e| Error::Device(format!("cannot start the thread watching the other ranks: {e}")))?;
    Ok(())
}

/// Where ranks end a run together (its end, or an error every rank saw): each has stopped
/// watching the others ([`Watchdog::leaving`]) before this barrier, so none that leaves
/// after it is taken for a rank killed outright. Returns whether every rank leaves with the
/// same `text` (the error it will print; "" at a normal end), learnt in the barrier's one
/// all-reduce: each rank puts a 64-bit hash of it, in four 16-bit pieces (exact in f32), at
/// its own place in a vector that the sum fills in.
pub fn leave_together(comm: &dyn Comm, text: &str) -> Result<bool> {
    let n = comm.size();
    if n == 1 {
        return Ok(true);
    }
    let hash = xxhash_rust::xxh64::xxh64(text.as_bytes(), 0);
    let mut all = vec![0.0f32; 4 * n];
    for (i, piece) in all[4 * comm.rank()..][..4].iter_mut().enumerate() {
        *piece = ((hash >> (16 * i)) & 0xffff) as f32;
    }
    comm.all_reduce_sum_host(&mut all)?;
    Ok(all.chunks(4).all(|h| h == &all[..4]))
}
