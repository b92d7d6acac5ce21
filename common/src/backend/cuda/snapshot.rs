//! Snapshots ([`Backend::snapshot`]): a checkpoint's state copied within the device, on the
//! compute stream after the work queued so far (device memory to device memory: about a
//! millisecond for GPT-2 124M's 1.49 GB), then brought into host memory by the checkpoint
//! writer's thread on a stream of its own, ordered after that copy by an event, while the
//! training steps go on. One store is kept from the first snapshot on (device memory as large
//! as the parts, and pinned host memory made by its first reader) and reused.
//!
//! [`Backend::snapshot`]: crate::backend::Backend::snapshot

use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::{result as driver, sys as driver_sys, CudaContext, CudaEvent, CudaStream, PinnedHostSlice};

use super::memory::{device_err, CudaBuffer, DeviceMemory};
use crate::backend::{DeviceBuffer, Snapshot, SnapshotTimes};
use crate::error::{Error, Result};

/// Device memory that must stay free beside a snapshot's: evaluation and sampling may still
/// need some (sampling comes after the store is released, evaluation may not).
const HEADROOM_BYTES: usize = 1 << 30;

/// The backend's snapshot store, made at the first snapshot.
#[derive(Default)]
pub(super) struct Snapshots {
    slot: Mutex<Slot>,
    /// Host memory made ready before the first snapshot ([`Snapshots::prepare_host`]), which
    /// its store takes.
    prepared: Mutex<Option<HostMemory>>,
}

#[derive(Default)]
enum Slot {
    #[default]
    Unmade,
    /// The device memory for one could not be had (said once): callers read the buffers.
    Refused,
    Kept {
        lens: Vec<usize>,
        store: Arc<Mutex<Store>>,
    },
}

struct Store {
    /// The parts, one after the other.
    device: CudaBuffer<f32>,
    lens: Vec<usize>,
    /// Where the reader copies `device`: made ready before (`Snapshots::prepare_host`), else
    /// by the first reader.
    host: Option<HostMemory>,
    /// The readers' stream.
    stream: Arc<CudaStream>,
    /// Recorded on the compute stream before and after the copy into `device`.
    start: CudaEvent,
    done: CudaEvent,
    /// A copy was queued that no reader has taken yet.
    queued: bool,
}

enum HostMemory {
    /// Page-locked (`cuMemHostAlloc`, not write-combined: the writer reads it): copied into at
    /// the bus's speed.
    Pinned(PinnedHostSlice<f32>),
    /// Where pinned memory could not be had: the driver copies through a staging buffer of its
    /// own.
    Pageable(Vec<f32>),
}

impl HostMemory {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Self {
        // SAFETY: the memory is unset until the copy into it, which writes all of it before
        // it is read.
        match unsafe { ctx.alloc_pinned_with_flags::<f32>(len, 0) } {
            Ok(pinned) => HostMemory::Pinned(pinned),
            Err(_) => HostMemory::Pageable(vec![0.0; len]),
        }
    }

    fn len(&self) -> usize {
        match self {
            HostMemory::Pinned(p) => p.len(),
            HostMemory::Pageable(v) => v.len(),
        }
    }

    fn slice(&mut self) -> Result<&mut [f32]> {
        match self {
            HostMemory::Pinned(p) => p.as_mut_slice().map_err(|e| device_err("pinned host memory", e)),
            HostMemory::Pageable(v) => Ok(v),
        }
    }
}

impl Snapshots {
    /// Makes the host memory for snapshots of `len` f32s now: page-locking takes long (and
    /// holds the driver's locks meanwhile, which would hold up a training thread's launches
    /// if it were made later, beside the steps).
    pub(super) fn prepare_host(&self, memory: &Arc<DeviceMemory>, len: usize) {
        if let Ok(mut prepared) = self.prepared.lock() {
            if prepared.as_ref().is_none_or(|h| h.len() != len) {
                *prepared = Some(HostMemory::new(&memory.ctx, len));
            }
        }
    }

    /// Queues the copy of `parts` into the store on `memory`'s (compute) stream and returns
    /// it for a reader; `None` where the store cannot be had (see [`Slot::Refused`]).
    pub(super) fn take(
        &self,
        memory: &Arc<DeviceMemory>,
        parts: &[&CudaBuffer<f32>],
    ) -> Result<Option<Box<dyn Snapshot>>> {
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        let mut slot = self
            .slot
            .lock()
            .map_err(|_| Error::Device("snapshot store lock poisoned".into()))?;
        let kept = matches!(&*slot, Slot::Kept { lens: kept, .. } if *kept == lens);
        if !kept {
            match &*slot {
                Slot::Refused => return Ok(None),
                // Another shape (not in a training run): its memory goes first.
                Slot::Kept { .. } => *slot = Slot::Unmade,
                Slot::Unmade => {}
            }
            let prepared = self.prepared.lock().ok().and_then(|mut p| p.take());
            match Store::new(memory, &lens, prepared)? {
                Some(store) => {
                    *slot = Slot::Kept {
                        lens: lens.clone(),
                        store: Arc::new(Mutex::new(store)),
                    }
                }
                None => {
                    *slot = Slot::Refused;
                    return Ok(None);
                }
            }
        }
        let Slot::Kept { store, .. } = &*slot else {
            unreachable!("made above")
        };
        let store = Arc::clone(store);
        let mut s = store
            .lock()
            .map_err(|_| Error::Device("snapshot store lock poisoned".into()))?;
        if s.queued {
            // The checkpoint writer waits for its last write before it asks for the next.
            return Err(Error::Device(
                "a snapshot was asked for before the last one was read".into(),
            ));
        }
        let compute = memory.stream.cu_stream();
        memory
            .ctx
            .bind_to_thread()
            .map_err(|e| device_err("binding the CUDA context", e))?;
        // SAFETY: every part is a live buffer of this backend and the store holds their sum;
        // the copies are ordered after the work queued before on the compute stream and before
        // the work queued after, and the store is not reused until its reader has waited for
        // its own copy out of it (`queued`, under the store's lock).
        unsafe {
            driver::event::record(s.start.cu_event(), compute).map_err(|e| device_err("recording an event", e))?;
            let mut at = 0;
            for part in parts {
                let bytes = part.len() * std::mem::size_of::<f32>();
                if bytes > 0 {
                    driver::memcpy_dtod_async(s.device.ptr().add(at).addr(), part.ptr().addr(), bytes, compute)
                        .map_err(|e| device_err("copying the state within the device", e))?;
                }
                at += part.len();
            }
            driver::event::record(s.done.cu_event(), compute).map_err(|e| device_err("recording an event", e))?;
        }
        s.queued = true;
        let bytes = (s.device.len() * std::mem::size_of::<f32>()) as u64;
        drop(s);
        Ok(Some(Box::new(CudaSnapshot { store, bytes })))
    }

    /// Frees the store (its reader, if any, is done: the checkpoint writer waited for it).
    pub(super) fn release(&self) {
        if let Ok(mut slot) = self.slot.lock() {
            if matches!(&*slot, Slot::Kept { .. }) {
                *slot = Slot::Unmade;
            }
        }
        if let Ok(mut prepared) = self.prepared.lock() {
            *prepared = None;
        }
    }
}

impl Store {
    /// Device memory for `lens` f32s, its stream and events; `None` (said once) where the
    /// device has not that much free beside [`HEADROOM_BYTES`].
    fn new(memory: &Arc<DeviceMemory>, lens: &[usize], host: Option<HostMemory>) -> Result<Option<Store>> {
        let total: usize = lens.iter().sum();
        let bytes = total * std::mem::size_of::<f32>();
        memory
            .ctx
            .bind_to_thread()
            .map_err(|e| device_err("binding the CUDA context", e))?;
        let (free, _) = driver::mem_get_info().map_err(|e| device_err("reading the free GPU memory", e))?;
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        let refuse = |why: String| {
            eprintln!(
                "note: checkpoints copy the state to host memory while training waits: {why} \
                 (a copy on the GPU, written in the background, needs {:.2} GiB)",
                gib(bytes)
            );
            Ok(None)
        };
        if free < bytes + HEADROOM_BYTES {
            return refuse(format!("only {:.2} GiB of GPU memory is free", gib(free)));
        }
        let device = match memory.alloc::<f32>(total) {
            Ok(d) => d,
            Err(e) => return refuse(e.to_string()),
        };
        let stream = memory
            .ctx
            .new_stream()
            .map_err(|e| device_err("creating the checkpoint copy's stream", e))?;
        let timed = Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = || {
            memory
                .ctx
                .new_event(timed)
                .map_err(|e| device_err("creating a CUDA event", e))
        };
        Ok(Some(Store {
            device,
            lens: lens.to_vec(),
            host: host.filter(|h| h.len() == total),
            stream,
            start: event()?,
            done: event()?,
            queued: false,
        }))
    }
}

/// One snapshot queued, for its reader.
struct CudaSnapshot {
    store: Arc<Mutex<Store>>,
    bytes: u64,
}

impl Snapshot for CudaSnapshot {
    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn read(self: Box<Self>, use_parts: &mut dyn FnMut(&[&[f32]]) -> Result<()>) -> Result<SnapshotTimes> {
        let mut guard = self
            .store
            .lock()
            .map_err(|_| Error::Device("snapshot store lock poisoned".into()))?;
        let Store {
            device,
            lens,
            host,
            stream,
            start,
            done,
            queued,
        } = &mut *guard;
        if !*queued {
            return Err(Error::Device("a snapshot was read twice".into()));
        }
        let started = Instant::now();
        stream
            .wait(done)
            .map_err(|e| device_err("ordering the checkpoint copy after the state's", e))?;
        let host = host.get_or_insert_with(|| HostMemory::new(stream.context(), device.len()));
        let pinned = matches!(host, HostMemory::Pinned(_));
        let all = host.slice()?;
        // SAFETY: `all` holds `device.len()` f32s; the stream waits for the copy into `device`
        // (the event) and is synchronised before `all` is read.
        unsafe { driver::memcpy_dtoh_async(all, device.ptr().addr(), stream.cu_stream()) }
            .map_err(|e| device_err("copying the checkpoint to host memory", e))?;
        stream
            .synchronize()
            .map_err(|e| device_err("copying the checkpoint to host memory", e))?;
        *queued = false;
        let to_host_s = started.elapsed().as_secs_f64();
        let device_ms = start
            .elapsed_ms(done)
            .map_err(|e| device_err("timing the copy within the device", e))?;
        let mut parts = Vec::with_capacity(lens.len());
        let mut rest: &[f32] = all;
        for &len in lens.iter() {
            let (part, after) = rest.split_at(len);
            parts.push(part);
            rest = after;
        }
        use_parts(&parts)?;
        Ok(SnapshotTimes {
            device_s: device_ms as f64 / 1e3,
            to_host_s,
            pinned,
        })
    }
}

impl Drop for CudaSnapshot {
    /// A snapshot dropped unread (its write never started) leaves the store free.
    fn drop(&mut self) {
        if let Ok(mut s) = self.store.lock() {
            s.queued = false;
        }
    }
}
