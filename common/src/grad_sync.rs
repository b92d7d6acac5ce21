//! Gradient synchronisation across ranks, on top of [`crate::comm`]: how each rank's
//! gradients (or, for local SGD, parameters) become the same on every rank.
//!
//! - `Allreduce` (the default): backward, then one sum of the whole gradient buffer.
//! - `Overlapped` (`--overlap`, `--bucket-mb`): gradients are summed bucket by bucket as soon
//!   as backward has finished them, while it goes on through the blocks below; a bucket is
//!   one block, or (`--bucket-mb MB`) consecutive blocks gathered, from the last, until they
//!   hold at least MB MiB of fp32 gradients, laid out once from the parameter table. The
//!   embeddings and the final layernorm (finished last) follow. On NCCL the buckets are ordered on the GPU (CUDA
//!   events between the compute stream and NCCL's stream, no host waits); on MPI the host
//!   waits for the backend, then starts a nonblocking sum.
//! - `LocalSgd` (`--sync-every K`): no gradient sums; parameters are averaged every K steps
//!   and after the last.
//!
//! Gradients are averaged by seeding the backward pass with 1/world, so every sum is plain.
//! With gradient accumulation (K micro-batches a step), each micro-batch's backward is seeded
//! with a further 1/K and adds to the same gradients; ranks meet after the last one.
//!
//! `--grad-comm bf16` ([`GradComm`]): each bucket is rounded to bf16 before its sum, summed
//! in bf16 (each addition rounded to bf16; half the bytes on the wire), and widened back into
//! the f32 gradients, where clipping and AdamW read it as ever. Every rank rounds the same
//! sums, so ranks stay equal; on 2 ranks a sum is one rounded addition, whatever the buckets.
//!
//! ZeRO-1 (`--zero 1`, [`Shards`]): the flat buffers are cut once into one contiguous shard
//! per rank; the gradient sums above become reduce-scatters (each rank gets the sum of its
//! own shard, bucket by bucket when overlapped), each rank's optimiser updates its shard
//! ([`crate::optim::AdamW::sharded`]), and the updated shards are all-gathered after the
//! update: under bf16 only the weights' bf16 copy (what forward reads; half the bytes), the
//! f32 weights made whole only when something reads them all (a checkpoint).

use crate::autograd::{Graph, Tensor};
use crate::backend::{bf16, Backend, DeviceBuffer, DeviceStream};
use crate::comm::{device_order, even_parts, parts_within, Comm, Words};
use crate::error::{Error, Result};
use crate::model::{Gpt2, ParamLayout};
use std::ops::Range;
use std::time::Instant;

/// How gradients are synchronised (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    Allreduce,
    /// `bucket`: values a bucket holds at least (0: one bucket per block).
    Overlapped {
        bucket: usize,
    },
    LocalSgd {
        every: u64,
    },
}

/// What the gradient sums carry over the wire (`--grad-comm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GradComm {
    /// f32 values, summed in f32.
    #[default]
    Fp32,
    /// The gradients rounded to bf16 and summed in bf16: half the bytes, about 3 significant
    /// digits per sum; accumulated back into the f32 gradients on each rank.
    Bf16,
}

/// Shard boundaries fall on multiples of this many values (128 bytes), so each shard's
/// kernels start on aligned memory.
const SHARD_ALIGN: usize = 32;

/// Which rank owns which contiguous piece of the flat parameter buffer under ZeRO-1: chosen
/// once from the world size, as even as 32-value alignment allows (equal for GPT-2 124M on 2,
/// 4 or 8 ranks). One rank owns everything when there is no sharding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shards {
    parts: Vec<Range<usize>>,
    rank: usize,
}

impl Shards {
    /// `n` values cut over the ranks of `comm` (`zero`), or all on this rank (not).
    pub fn new(n: usize, comm: &dyn Comm, zero: bool) -> Self {
        if zero && comm.size() > 1 {
            Shards::of(even_parts(n, comm.size(), SHARD_ALIGN), comm.rank())
        } else {
            Shards::of(even_parts(n, 1, 1), 0)
        }
    }

    /// `parts` (every rank's, in rank order) seen from `rank`.
    fn of(parts: Vec<Range<usize>>, rank: usize) -> Self {
        Shards { parts, rank }
    }

    /// Whether the buffers are cut over several ranks.
    pub fn sharded(&self) -> bool {
        self.parts.len() > 1
    }

    /// This rank's shard.
    pub fn own(&self) -> Range<usize> {
        self.parts[self.rank].clone()
    }

    /// Every rank's shard, in rank order.
    pub fn parts(&self) -> &[Range<usize>] {
        &self.parts
    }
}

/// The synchronisation plan of one model: its mode and its gradient buckets.
pub struct GradSync {
    mode: SyncMode,
    /// ZeRO-1's shards (one, the whole buffer, without).
    shards: Shards,
    /// The buckets summed during backward when overlapped (consecutive blocks, contiguous
    /// in the flat buffer), and for each block the bucket its completion closes, if any.
    buckets: Vec<Range<usize>>,
    closes: Vec<Option<usize>>,
    /// What lies outside the blocks, finished only at the end of backward.
    outside: Vec<Range<usize>>,
    total: usize,
    /// What the sums carry.
    wire: GradComm,
}

impl GradSync {
    pub fn new(mode: SyncMode, layout: &ParamLayout, shards: Shards) -> Self {
        assert!(
            !(shards.sharded() && matches!(mode, SyncMode::LocalSgd { .. })),
            "local SGD keeps every rank's optimiser whole (the command line refuses --zero with --sync-every)"
        );
        let bucket = match mode {
            SyncMode::Overlapped { bucket } => bucket,
            _ => 0,
        };
        let (buckets, closes) = buckets_of(&layout.blocks, bucket);
        GradSync {
            mode,
            shards,
            buckets,
            closes,
            outside: layout.outside_blocks(),
            total: layout.total,
            wire: GradComm::Fp32,
        }
    }

    /// The sums carry `wire` values; `Bf16` needs [`GradSync::backward`]'s bf16 buffer.
    pub fn with_wire(mut self, wire: GradComm) -> Self {
        self.wire = wire;
        self
    }

    /// The buckets, in the order backward finishes them (the last block's first).
    pub fn buckets(&self) -> &[Range<usize>] {
        &self.buckets
    }

    /// For a model of `total` parameters in one bucket (no blocks: `Overlapped` sums it
    /// after backward, as `Allreduce` does). Local SGD's averaging takes a GPT-2 model, so
    /// only the gradient modes are for such models.
    pub fn whole(mode: SyncMode, total: usize) -> Self {
        assert!(
            !matches!(mode, SyncMode::LocalSgd { .. }),
            "local SGD averages a GPT-2 model's parameters"
        );
        GradSync {
            mode,
            shards: Shards::of(even_parts(total, 1, 1), 0),
            buckets: Vec::new(),
            closes: Vec::new(),
            outside: std::iter::once(0..total).collect(),
            total,
            wire: GradComm::Fp32,
        }
    }

    /// ZeRO-1's shards (the whole buffer on one rank without).
    pub fn shards(&self) -> &Shards {
        &self.shards
    }

    /// d(loss) to seed backward with: 1/(world · micro-batches) when gradients are averaged
    /// over ranks (local SGD steps each rank on its own mean gradient: 1/micro-batches).
    pub fn loss_scale(&self, world: usize, micro_batches: usize) -> f32 {
        let ranks = match self.mode {
            SyncMode::LocalSgd { .. } => 1,
            SyncMode::Allreduce | SyncMode::Overlapped { .. } => world,
        };
        1.0 / (ranks * micro_batches) as f32
    }

    /// The bf16 buffer the sums carry: `Some` under `--grad-comm bf16` on several ranks (and
    /// then it must cover the layout), else `None`.
    fn wire_buffer<'w, B: Backend>(
        &self,
        wire: Option<&'w B::Buffer<bf16>>,
        world: usize,
    ) -> Result<Option<&'w B::Buffer<bf16>>> {
        match (self.wire, wire) {
            (GradComm::Fp32, _) => Ok(None),
            (GradComm::Bf16, _) if world == 1 => Ok(None), // no sums
            (GradComm::Bf16, Some(w)) if w.len() >= self.total => Ok(Some(w)),
            (GradComm::Bf16, _) => Err(Error::Device(
                "bf16 gradient sums need a bf16 buffer of the layout's size".into(),
            )),
        }
    }

    /// Starts the sum of `range` of the gradients over the ranks: an all-reduce, or under
    /// ZeRO-1 a reduce-scatter onto the shards' parts of it; with `wire`, of the range rounded
    /// to bf16 there. Ordered after the backend's queued work on the device (`after`), or the
    /// host waits for the backend first. Adds the seconds spent in the communicator's call
    /// to `comm_s`.
    ///
    /// # Safety
    /// `range` lies in the layout, inside `grads` and `wire`, which stay alive and untouched
    /// until [`Comm::finish_all_reduces`].
    unsafe fn start_sum<B: Backend>(
        &self,
        be: &B,
        comm: &dyn Comm,
        range: &Range<usize>,
        (grads, wire): (&B::Buffer<f32>, Option<&B::Buffer<bf16>>),
        after: Option<DeviceStream>,
        comm_s: &mut f64,
    ) -> Result<()> {
        if after.is_none() {
            be.synchronize()?;
        }
        let parts = || parts_within(self.shards.parts(), range);
        let Some(wire) = wire else {
            let at = grads.ptr().add(range.start);
            // SAFETY: the caller's contract.
            return timed(comm_s, || unsafe {
                match self.shards.sharded() {
                    true => comm.start_reduce_scatter_sum(at, &parts(), after),
                    false => comm.start_all_reduce_sum(at, range.len(), after),
                }
            });
        };
        let (start, n) = (range.start, range.len());
        be.round_to_bf16(wire.span().slice(start, n), grads.span().slice(start, n), n);
        if after.is_none() {
            be.synchronize()?;
        }
        let at = wire.ptr().add(start);
        // SAFETY: the caller's contract, for the range's bf16 copy in `wire`, written (host
        // wait) or queued on `after` before the sum.
        timed(comm_s, || unsafe {
            match self.shards.sharded() {
                true => comm.start_reduce_scatter_sum_bf16(at, &parts(), after),
                false => comm.start_all_reduce_sum_bf16(at, n, after),
            }
        })
    }

    /// The bf16 sums in `wire` back into the f32 gradients (this rank's shard under ZeRO-1).
    fn widen<B: Backend>(&self, be: &B, grads: &B::Buffer<f32>, wire: Option<&B::Buffer<bf16>>) {
        if let Some(wire) = wire {
            let r = if self.shards.sharded() {
                self.shards.own()
            } else {
                0..self.total
            };
            be.widen_bf16(
                grads.span().slice(r.start, r.len()),
                wire.span().slice(r.start, r.len()),
                r.len(),
            );
        }
    }

    /// Back-propagates micro-batch `micro` (of `micro.1`) from `loss` into `grads`; after
    /// the last one, leaves the summed gradients in `grads` on every rank (under ZeRO-1,
    /// the sum of its own shard only: the rest is left unspecified). Under `--grad-comm
    /// bf16`, `wire` (the layout's size in bf16) carries the sums. Returns the
    /// seconds spent inside communication calls (waiting included: the part of
    /// communication that computing did not hide). Overlapped on NCCL, the host does not
    /// wait: this is the time spent queueing the collectives, and the GPU's wait for
    /// them shows in the step's compute time.
    ///
    /// `apart`: the graph writes this micro-batch's gradients there (a buffer of the layout's
    /// size), and they are added into `grads` range by range, each range before its sum
    /// starts. A micro-batch after the first computes its gradients from zero this way, as a
    /// rank computes its own, so that adding them is one rounding, as the ranks' sum is: K
    /// micro-batches on one rank then give what K ranks of one give, bit for bit for K = 2.
    pub fn backward<B: Backend>(
        &self,
        g: &mut Graph<'_, B>,
        loss: Tensor,
        comm: &dyn Comm,
        (grads, wire): (&B::Buffer<f32>, Option<&B::Buffer<bf16>>),
        (micro, micro_batches): (usize, usize),
        apart: Option<&B::Buffer<f32>>,
    ) -> Result<f64> {
        let (be, world) = (g.backend(), comm.size());
        let wire = self.wire_buffer::<B>(wire, world)?;
        let seed = self.loss_scale(world, micro_batches);
        assert!(grads.len() >= self.total, "gradient buffer smaller than the layout");
        assert!(
            apart.is_none_or(|a| a.len() >= self.total),
            "the micro-batch's gradient buffer is smaller than the layout"
        );
        let add = |range: &Range<usize>| {
            if let Some(apart) = apart {
                let (at, n) = (range.start, range.len());
                be.accumulate(grads.span().slice(at, n), apart.span().slice(at, n), n);
            }
        };
        if micro + 1 < micro_batches {
            g.backward(loss, seed)?; // ranks meet after the last micro-batch
            add(&(0..self.total));
            return Ok(0.0);
        }
        // Overlapped on a device communicator (NCCL): each bucket's sum is ordered after the
        // kernels queued so far on the backend's stream, on the device, with no host wait.
        // Elsewhere the host waits for the backend before each bucket (a no-op on the CPU).
        let after = device_order(be, comm);
        let sum = |range: &Range<usize>, comm_s: &mut f64| {
            add(range);
            // SAFETY: every range lies in the layout, inside `grads` (checked above) and
            // `wire` (checked by `wire_buffer`), which the caller keeps alive and leaves alone
            // until the sums are finished; the bucket's writes are done or ordered before it.
            unsafe { self.start_sum(be, comm, range, (grads, wire), after, comm_s) }
        };
        let widen = || self.widen(be, grads, wire);
        let mut comm_s = 0.0;
        match self.mode {
            SyncMode::Overlapped { .. } if world > 1 => {
                // The kernels that wrote a block's gradients may still be queued (GPU) when
                // backward hands it over, and NCCL reads on its own stream: `sum` orders the
                // bucket after them. A bucket goes once its lowest block is done.
                g.backward_with(loss, seed, |block| match self.closes[block] {
                    Some(b) => sum(&self.buckets[b], &mut comm_s),
                    None => Ok(()),
                })?;
                for range in &self.outside {
                    sum(range, &mut comm_s)?;
                }
                // What reads the sums (the norm, the optimiser) is queued on the backend's
                // stream after this, which waits for them on the device (or the host waits).
                timed(&mut comm_s, || comm.finish_all_reduces(after))?;
                widen();
            }
            SyncMode::Allreduce if world > 1 && (after.is_some() || wire.is_some()) => {
                // One bucket after backward, ordered on the device (no host wait), or in bf16.
                g.backward(loss, seed)?;
                sum(&(0..self.total), &mut comm_s)?;
                timed(&mut comm_s, || comm.finish_all_reduces(after))?;
                widen();
            }
            SyncMode::Allreduce if world > 1 => {
                g.backward(loss, seed)?;
                add(&(0..self.total));
                be.synchronize()?;
                // SAFETY: the whole layout, inside `grads` (checked above).
                timed(&mut comm_s, || unsafe { self.sum_whole(comm, grads.ptr()) })?;
            }
            _ => {
                g.backward(loss, seed)?;
                add(&(0..self.total));
            }
        }
        Ok(comm_s)
    }

    /// The optimiser's update of 0-based `step` (`update`, of this rank's shard: the whole
    /// buffer without ZeRO-1), then what follows it across ranks:
    /// ZeRO-1 gathers every rank's updated shard; local SGD averages the parameters every K
    /// steps and after the last. Returns the seconds spent communicating.
    pub fn update_then_sync<B: Backend>(
        &self,
        be: &B,
        comm: &dyn Comm,
        model: &Gpt2<B>,
        (step, total_steps): (u64, u64),
        update: &mut dyn FnMut(Range<usize>) -> Result<()>,
    ) -> Result<f64> {
        if self.shards.sharded() {
            return self.update_and_gather(be, comm, model, update);
        }
        update(self.shards.own())?;
        let world = comm.size();
        let SyncMode::LocalSgd { every } = self.mode else {
            return Ok(0.0);
        };
        let done = step + 1;
        if world == 1 || !(done.is_multiple_of(every) || done == total_steps) {
            return Ok(0.0);
        }
        let params = &model.params;
        assert!(params.len() >= self.total, "parameter buffer smaller than the layout");
        let mut comm_s = 0.0;
        // The update must be written before the sum reads it.
        be.synchronize()?;
        // SAFETY: the whole layout, inside `params` (checked above).
        timed(&mut comm_s, || unsafe { comm.all_reduce_sum(params.ptr(), self.total) })?;
        be.scale(params.span(), self.total, 1.0 / world as f32);
        model.refresh_copy(be)?;
        Ok(comm_s)
    }
}

impl GradSync {
    /// ZeRO-1: `update` of this rank's shard, then the gather of every rank's updated shard
    /// to every rank. With a bf16 copy of the weights (what a bf16
    /// forward pass reads), only the copy travels: each shard of it is its owner's rounding
    /// of its updated weights, the bits every rank would round from the gathered f32 values,
    /// in half the bytes. The f32 weights outside this rank's shard then lag until
    /// [`GradSync::gather_params`] brings them (the update reads only the own shard).
    fn update_and_gather<B: Backend>(
        &self,
        be: &B,
        comm: &dyn Comm,
        model: &Gpt2<B>,
        update: &mut dyn FnMut(Range<usize>) -> Result<()>,
    ) -> Result<f64> {
        let words = self.gathered(model);
        let mut comm_s = 0.0;
        let after = device_order(be, comm);
        update(self.shards.own())?;
        if after.is_none() {
            be.synchronize()?; // the update must be written before the gather reads it
        }
        // SAFETY: the shards cover the layout, inside the gathered buffer (checked by
        // `gathered`); the update that writes them is done (host wait) or queued on `after`
        // before it.
        timed(&mut comm_s, || unsafe {
            comm.start_all_gather(words, self.shards.parts(), after)
        })?;
        timed(&mut comm_s, || comm.finish_all_reduces(after))?;
        Ok(comm_s)
    }

    /// What ZeRO-1's steps gather after the update: the weights' bf16 copy where the forward
    /// pass reads one (see `update_and_gather`), else the f32 weights. Checks that the buffer
    /// covers the layout.
    fn gathered<B: Backend>(&self, model: &Gpt2<B>) -> Words {
        match &model.params_bf16 {
            Some(copy) => {
                assert!(copy.len() >= self.total, "bf16 copy smaller than the layout");
                Words::Bf16(copy.ptr())
            }
            None => {
                assert!(
                    model.params.len() >= self.total,
                    "parameter buffer smaller than the layout"
                );
                Words::F32(model.params.ptr())
            }
        }
    }

    /// Makes the f32 weights whole on every rank where the steps gather only their bf16 copy
    /// (ZeRO-1 under bf16: see `update_and_gather`), before something reads them all (a
    /// checkpoint, the final state). Between steps; a collective every rank calls.
    pub fn gather_params<B: Backend>(&self, be: &B, comm: &dyn Comm, model: &Gpt2<B>) -> Result<()> {
        if !self.shards.sharded() || matches!(self.gathered(model), Words::F32(_)) {
            return Ok(()); // whole already: gathered (ZeRO-1 in f32) or never cut
        }
        assert!(
            model.params.len() >= self.total,
            "parameter buffer smaller than the layout"
        );
        be.synchronize()?;
        // SAFETY: the shards cover the layout, inside `params` (checked above), whose own
        // shard holds the last update (written: the host waited); nothing else uses them
        // between steps.
        unsafe { comm.all_gather(Words::F32(model.params.ptr()), self.shards.parts()) }
    }
}

impl GradSync {
    /// Seconds one step's gradient sums take on their own, the host waiting for them (the
    /// mean of `reps`): the sums as the step makes them (bucket by bucket under
    /// `--overlap`, in bf16 under `--grad-comm bf16`, its rounding and widening included),
    /// on the gradients, then under ZeRO-1 the all-gather of the steps
    /// (`GradSync::gathered`) into the same buffer, so by the same means (copy engines where
    /// the steps use them). Between steps every rank holds the same gathered words, so
    /// gathering them again changes nothing. 0 with one rank or under local SGD. For the
    /// benchmark: what a step would add if computing hid none of it.
    pub fn time_sums<B: Backend>(
        &self,
        be: &B,
        comm: &dyn Comm,
        model: &Gpt2<B>,
        wire: Option<&B::Buffer<bf16>>,
        reps: usize,
    ) -> Result<f64> {
        if comm.size() == 1 || matches!(self.mode, SyncMode::LocalSgd { .. }) || reps == 0 {
            return Ok(0.0);
        }
        let grads = &model.grads;
        assert!(grads.len() >= self.total, "gradient buffer smaller than the layout");
        let wire = self.wire_buffer::<B>(wire, comm.size())?;
        let words = self.gathered(model);
        let whole = 0..self.total;
        let ranges: Vec<&Range<usize>> = match self.mode {
            SyncMode::Overlapped { .. } => self.buckets.iter().chain(&self.outside).collect(),
            _ => vec![&whole],
        };
        be.synchronize()?;
        let started = Instant::now();
        let mut calls = 0.0;
        for _ in 0..reps {
            for range in &ranges {
                // SAFETY: every range lies in the layout, inside `grads` and `wire` (checked
                // above and by `wire_buffer`), which nothing else uses between steps; the host
                // waits for the sums below before the next round.
                unsafe { self.start_sum(be, comm, range, (grads, wire), None, &mut calls)? };
            }
            comm.finish_all_reduces(None)?;
            self.widen(be, grads, wire);
            if self.shards.sharded() {
                // SAFETY: the gathered buffer covers every rank's shard (`gathered`), which
                // the gather writes with the values it holds already.
                unsafe { comm.all_gather(words, self.shards.parts())? };
            }
            be.synchronize()?;
        }
        Ok(started.elapsed().as_secs_f64() / reps as f64)
    }

    /// The whole buffer's gradient sum at `grads`, the host waiting for it: the all-reduce,
    /// or under ZeRO-1 the reduce-scatter (each rank the sum of its own shard).
    ///
    /// # Safety
    /// `grads` holds the layout's values, which nothing else touches during the call and
    /// whose writes are done.
    unsafe fn sum_whole(&self, comm: &dyn Comm, grads: crate::backend::DevPtr) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match self.shards.sharded() {
                true => comm.reduce_scatter_sum(grads, self.shards.parts()),
                false => comm.all_reduce_sum(grads, self.total),
            }
        }
    }
}

/// Buckets of consecutive `blocks` (contiguous ranges, in order), gathered from the last
/// block down until each holds at least `min_values` (the lowest may hold fewer), in the
/// order backward finishes them; and for each block the bucket its completion closes (the
/// bucket's lowest block), if any. `min_values` 0: one bucket per block.
fn buckets_of(blocks: &[Range<usize>], min_values: usize) -> (Vec<Range<usize>>, Vec<Option<usize>>) {
    let (mut buckets, mut closes) = (Vec::new(), vec![None; blocks.len()]);
    let mut end = None;
    for (i, block) in blocks.iter().enumerate().rev() {
        let top = *end.get_or_insert(block.end);
        if top - block.start >= min_values || i == 0 {
            closes[i] = Some(buckets.len());
            buckets.push(block.start..top);
            end = None;
        }
    }
    (buckets, closes)
}

/// Runs `f`, adding its duration to `seconds`.
fn timed<T>(seconds: &mut f64, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    let out = f();
    *seconds += started.elapsed().as_secs_f64();
    out
}

#[cfg(test)]
mod tests {
    use super::buckets_of;

    #[test]
    fn buckets_gather_blocks_from_the_last_down() {
        let blocks = [0..10, 10..20, 20..30, 30..40, 40..50];
        // One bucket a block, the last block's first.
        let (b, c) = buckets_of(&blocks, 0);
        assert_eq!(b, vec![40..50, 30..40, 20..30, 10..20, 0..10]);
        assert_eq!(c, vec![Some(4), Some(3), Some(2), Some(1), Some(0)]);
        // At least 20 values: two blocks a bucket, the lowest alone.
        let (b, c) = buckets_of(&blocks, 20);
        assert_eq!(b, vec![30..50, 10..30, 0..10]);
        assert_eq!(c, vec![Some(2), Some(1), None, Some(0), None]);
        // Larger than everything: one bucket, closed by the first block.
        let (b, c) = buckets_of(&blocks, 1000);
        assert_eq!(b, vec![0..50]);
        assert_eq!(c, vec![Some(0), None, None, None, None]);
        // The buckets cover the blocks exactly.
        for min in [0, 5, 11, 25, 49, 50, 51] {
            let (b, _) = buckets_of(&blocks, min);
            let mut covered: Vec<_> = b.iter().flat_map(|r| r.clone()).collect();
            covered.sort_unstable();
            assert_eq!(covered, (0..50).collect::<Vec<_>>(), "min {min}");
        }
    }
}
