//! What the GPU test files share.

use std::sync::{Mutex, MutexGuard};

static GPU: Mutex<()> = Mutex::new(());

/// Held for the whole of a GPU test, so that the GPU tests of one process take turns whatever
/// `--test-threads` says. Every backend of a process shares the device's primary CUDA context,
/// and a test that synchronises it (opening a backend does: cudarc synchronises the context as
/// it makes the first stream of a context handle) while another test's stream is being captured
/// into a CUDA graph fails, and invalidates that capture (cuda_mlp with 8 test threads failed
/// now and then that way). A training process queues all its device
/// work and records its graphs on one thread. A test that failed leaves the lock poisoned; the
/// next takes it all the same.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
