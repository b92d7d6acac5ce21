//! Asking a run to stop at the end of its current step, with a checkpoint: Ctrl-C, SIGTERM
//! and SIGHUP, in one process or in each rank of a job (there the ranks agree on the stop at
//! the step's end, and the watchdog of `comm/watchdog.rs` takes SIGQUIT); stdout gone (a
//! closed pipe, a full disk: see [`say`]).
//! `train`'s steps and its closing sample read [`asked`] (the `generate` command ends on
//! Ctrl-C as any program does).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
/// stdout has failed once: later lines are dropped.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// Whether the run has been asked to stop.
pub fn asked() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Asks the run to stop (async-signal-safe: a store to an atomic).
pub fn ask() {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the handlers of Ctrl-C, SIGTERM and SIGHUP, each of which asks for a stop. Once
/// per process, however many runs it makes (tests make several).
pub fn on_signals() {
    // A second Ctrl-C handler is refused; one is enough.
    let _ = ctrlc::set_handler(ask);
    static TERMINATION: std::sync::Once = std::sync::Once::new();
    TERMINATION.call_once(|| {
        take_back_termination_signals();
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
            // SAFETY: the action stores to an atomic, which is async-signal-safe.
            let _ = unsafe { signal_hook::low_level::register(sig, ask) };
        }
    });
}

/// Takes SIGTERM, SIGHUP and SIGQUIT back from handlers that libraries installed: their
/// default action again, once per process, before the first handler of ours (signal-hook,
/// which ours go through, calls a handler it finds after its own). On the GPU hosts, MPI's
/// start-up (hwloc's OpenCL plugin) loads LLVM, whose handlers end the process at once on
/// these signals: a rank then died at a SIGTERM instead of stopping after its step.
pub fn take_back_termination_signals() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            // SAFETY: sets a signal's action to the default; none of ours is installed yet
            // (the callers run this first), so no handler of ours is dropped.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    });
}

/// One line on stdout, as `println!` writes it, but never a panic: when stdout fails (the
/// reader of a pipe has gone, the disk is full) the run is asked to stop, as by Ctrl-C (`train`
/// saves a checkpoint and ends), and the lines after it are dropped. [`crate::say!`] formats
/// its arguments into it.
pub fn say(line: std::fmt::Arguments) {
    if !stdout_gone() && writeln!(std::io::stdout().lock(), "{line}").is_err() {
        lost_stdout();
    }
}

/// Whether stdout has failed (see [`say`]).
pub fn stdout_gone() -> bool {
    STDOUT_GONE.load(Ordering::SeqCst)
}

/// A write to stdout failed: nothing more goes there, and the run is asked to stop.
pub fn lost_stdout() {
    STDOUT_GONE.store(true, Ordering::SeqCst);
    ask();
}

/// `println!` that never panics: see [`stop::say`](say).
#[macro_export]
macro_rules! say {
    () => { $crate::stop::say(format_args!("")) };
    ($($arg:tt)*) => { $crate::stop::say(format_args!($($arg)*)) };
}
