//! A step recorded once and replayed: on a backend that records its work (the GPU: a CUDA
//! graph), a step whose work and memory are the same every time is queued as it is the first
//! time (which sizes the memory a recording will use: pools, scratch, plans), recorded the
//! second time, and replayed from then on, one launch a step. GPT-2's [`Trainer`] and the MLP's
//! fused step ([`crate::mnist::fused`]) both drive one.
//!
//! [`Trainer`]: crate::train::Trainer

use crate::backend::Backend;
use crate::error::Result;

/// The recording of a step, for the key that says what it depends on (shapes, where its
/// memory is): a step of another key runs as queued first, then is recorded again.
pub struct Recorder<B: Backend, K> {
    /// The key of the last step run as queued, which sized the memory a recording uses.
    warm: Option<K>,
    recording: Option<(K, B::Recording)>,
}

impl<B: Backend, K> Default for Recorder<B, K> {
    fn default() -> Self {
        Recorder {
            warm: None,
            recording: None,
        }
    }
}

impl<B: Backend, K: PartialEq> Recorder<B, K> {
    /// Whether a recording exists (steps are being replayed).
    pub fn recorded(&self) -> bool {
        self.recording.is_some()
    }

    /// Runs one step of key `now`, whose work `queue` queues: the recording of `now` is
    /// replayed when there is one; otherwise the first step of a key runs as queued (and
    /// `queue` returns the key as it stands after, for memory may have moved while it ran),
    /// and the second is recorded, then replayed. Nothing is read back.
    pub fn run(&mut self, be: &B, now: K, queue: impl FnOnce() -> Result<K>) -> Result<()> {
        match &self.recording {
            Some((recorded, rec)) if *recorded == now => be.replay(rec),
            _ if self.warm.as_ref() != Some(&now) => {
                // The first step of a key runs as queued: it sizes the pool and the scratch.
                self.recording = None;
                self.warm = Some(queue()?);
                Ok(())
            }
            _ => {
                self.recording = None;
                be.begin_recording()?;
                let queued = queue();
                let recorded = be.end_recording();
                queued?;
                let rec = recorded?;
                be.replay(&rec)?;
                self.recording = Some((now, rec));
                Ok(())
            }
        }
    }
}
