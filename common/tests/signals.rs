//! The termination signals are ours: a handler a library installed before ours (LLVM's, which
//! MPI's start-up loads on the GPU hosts, ends the process on SIGTERM) is not called after
//! ours. Its own process: the signal sets the process-wide stop flag.

use std::sync::atomic::{AtomicBool, Ordering};

static FOREIGN: AtomicBool = AtomicBool::new(false);

extern "C" fn foreign_handler(_: libc::c_int) {
    FOREIGN.store(true, Ordering::SeqCst);
}

#[test]
fn a_handler_installed_before_ours_is_not_called_after_ours() {
    // SAFETY: installs a handler that stores to an atomic (async-signal-safe).
    unsafe { libc::signal(libc::SIGTERM, foreign_handler as *const () as libc::sighandler_t) };
    common::stop::take_back_termination_signals();
    // SAFETY: the action stores to an atomic.
    unsafe { signal_hook::low_level::register(libc::SIGTERM, common::stop::ask) }.unwrap();
    assert!(!common::stop::asked());
    // SAFETY: raises a signal whose handler is ours (above).
    unsafe { libc::raise(libc::SIGTERM) };
    assert!(common::stop::asked(), "our handler ran");
    assert!(
        !FOREIGN.load(Ordering::SeqCst),
        "the library's handler was not called after ours"
    );
}
