//! CPU backend: rayon for parallel loops and the `gemm` crate (AVX2/AVX-512 kernels) for
//! matrix products. Every reduction runs in a fixed order that does not depend on the
//! thread count (work is split by output element or by fixed-size blocks, never by
//! thread), so a run is bit-for-bit reproducible and stage 1's ranks can match stage 0.
//!
//! This file holds the buffers and the [`Backend`] impl, which is the one place where raw
//! pointers become slices (under the trait's safety contract); the numerics live in one
//! file per op family and work on plain slices: `elementwise`, `encoder`, `matmul`,
//! `layernorm`, `attention`, `loss`, `optim`, `mlp` (the MLP's step on the device).

// Index loops read like the formulas in these numeric kernels.
#![allow(clippy::needless_range_loop)]

mod attention;
mod elementwise;
mod encoder;
mod fastmath;
mod layernorm;
mod loss;
mod matmul;
mod mlp;
mod optim;

use super::{bf16, Act, AdamWHyper, Backend, DevPtr, DeviceBuffer, Elem, Overwrite, SgdHyper, StepState};
use crate::error::{Error, Result};
use std::ops::Range;
use std::ptr::NonNull;

/// Host memory standing in for device memory: an owned allocation reached only through
/// raw pointers (so ops may write it while the buffer is shared, as device memory is).
pub struct CpuBuffer<T> {
    ptr: NonNull<T>,
    len: usize,
}

impl<T: Elem> DeviceBuffer<T> for CpuBuffer<T> {
    fn ptr(&self) -> DevPtr<T> {
        DevPtr::from_addr(self.ptr.as_ptr() as u64)
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl<T> Drop for CpuBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: made by `Box::into_raw` of a boxed slice of `len` elements in `alloc`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)) });
    }
}

pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
}

impl CpuBackend {
    /// A backend with its own pool of `threads` workers (0: one per core).
    pub fn new(threads: usize) -> Result<Self> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| Error::Device(format!("cannot start {threads} CPU threads: {e}")))?;
        Ok(CpuBackend { pool, threads })
    }

    /// Runs `f` on this backend's thread pool.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

// ---- raw memory views --------------------------------------------------------------
// Under the Backend trait's contract every pointer covers the extent the op uses and an
// op's outputs never alias its inputs; these turn such pointers into slices.

// The CPU computes in f32 only, so its activations (`DevPtr<Act>`) are f32.

trait HostPtr: Copy {
    type Elem;
    fn addr(self) -> u64;
}
impl<T: Elem> HostPtr for DevPtr<T> {
    type Elem = T;
    fn addr(self) -> u64 {
        DevPtr::addr(self)
    }
}
impl HostPtr for DevPtr<Act> {
    type Elem = f32;
    fn addr(self) -> u64 {
        DevPtr::addr(self)
    }
}

unsafe fn view<'a, P: HostPtr>(p: P, n: usize) -> &'a [P::Elem] {
    std::slice::from_raw_parts(p.addr() as *const P::Elem, n)
}
#[allow(clippy::mut_from_ref)]
unsafe fn view_mut<'a, P: HostPtr>(p: P, n: usize) -> &'a mut [P::Elem] {
    std::slice::from_raw_parts_mut(p.addr() as *mut P::Elem, n)
}

/// The [`StepState`] at `p` (f32 words).
///
/// # Safety
/// `p` holds [`StepState::WORDS`] words, not otherwise borrowed.
unsafe fn state_mut<'a>(p: DevPtr) -> &'a mut StepState {
    bytemuck::from_bytes_mut(bytemuck::cast_slice_mut(view_mut(p, StepState::WORDS)))
}

impl Backend for CpuBackend {
    type Buffer<T: Elem> = CpuBuffer<T>;
    /// Nothing to record: work runs as it is queued.
    type Recording = ();

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.threads)
    }

    fn alloc<T: Elem>(&self, n: usize) -> Result<CpuBuffer<T>> {
        let mut v: Vec<T> = Vec::new();
        v.try_reserve_exact(n).map_err(|_| {
            let mib = (n as u128 * std::mem::size_of::<T>() as u128) >> 20;
            Error::Device(format!("out of host memory allocating {mib} MiB"))
        })?;
        v.resize(n, T::zeroed());
        let len = v.len();
        let raw = Box::into_raw(v.into_boxed_slice()) as *mut T;
        let ptr = NonNull::new(raw).expect("Box pointers are never null");
        Ok(CpuBuffer { ptr, len })
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// On a worker of the pool: each op's `run` then starts its parallel loops right there
    /// (rayon's `install` from inside its own pool calls in place) instead of handing them to
    /// the pool and sleeping until they are done, a wake-up each way per op.
    unsafe fn issue<P: Sync>(&self, plan: &P, ops: unsafe fn(&Self, &P) -> Result<()>) -> Result<()> {
        // SAFETY: the caller's, for `ops` on `plan`; the calling thread waits for the call.
        self.run(|| unsafe { ops(self, plan) })
    }

    fn end_recording(&self) -> Result<()> {
        Err(Error::Device("the CPU backend does not record work".into()))
    }

    fn replay(&self, _recording: &()) -> Result<()> {
        Ok(())
    }

    fn peak_memory_bytes(&self) -> u64 {
        peak_rss_bytes()
    }

    fn memory_capacity_bytes(&self) -> Option<u64> {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kb = info
            .lines()
            .find(|l| l.starts_with("MemTotal:"))?
            .split_whitespace()
            .nth(1)?;
        kb.parse::<u64>().ok().map(|kb| kb * 1024)
    }

    unsafe fn upload<T: Elem>(&self, dst: DevPtr<T>, src: &[T]) -> Result<()> {
        view_mut(dst, src.len()).copy_from_slice(src);
        Ok(())
    }

    unsafe fn download<T: Elem>(&self, src: DevPtr<T>, dst: &mut [T]) -> Result<()> {
        dst.copy_from_slice(view(src, dst.len()));
        Ok(())
    }

    unsafe fn zero<T: Elem>(&self, dst: DevPtr<T>, n: usize) {
        self.run(|| elementwise::zero(view_mut(dst, n)));
    }

    unsafe fn round_to_bf16(&self, dst: DevPtr<bf16>, src: DevPtr, n: usize) {
        for (d, &s) in view_mut(dst, n).iter_mut().zip(view(src, n)) {
            *d = bf16::from_f32(s);
        }
    }

    unsafe fn accumulate(&self, dst: DevPtr, src: DevPtr, n: usize) {
        if dst == src {
            return self.scale(dst, n, 2.0);
        }
        self.run(|| elementwise::accumulate(view_mut(dst, n), view(src, n)));
    }

    unsafe fn accumulate_act(&self, dst: DevPtr<Act>, src: DevPtr<Act>, n: usize) {
        self.accumulate(dst.cast(), src.cast(), n);
    }

    unsafe fn add(&self, out: DevPtr<Act>, a: DevPtr<Act>, b: DevPtr<Act>, n: usize) {
        self.run(|| elementwise::add(view_mut(out, n), view(a, n), view(b, n)));
    }

    unsafe fn scale(&self, dst: DevPtr, n: usize, s: f32) {
        self.run(|| elementwise::scale(view_mut(dst, n), s));
    }

    unsafe fn encoder_forward(
        &self,
        out: DevPtr<Act>,
        tokens: DevPtr<i32>,
        first_position: Option<DevPtr<i32>>,
        wte: DevPtr<Act>,
        wpe: DevPtr<Act>,
        b: usize,
        t: usize,
        c: usize,
    ) {
        let tokens = view(tokens, b * t);
        let vocab = tokens.iter().map(|&id| id as usize + 1).max().unwrap_or(0);
        let p = first_position.map_or(0, |p| view(p, 1)[0] as usize);
        let wpe = &view(wpe, (p + t) * c)[p * c..];
        let (out, wte) = (view_mut(out, b * t * c), view(wte, vocab * c));
        self.run(|| encoder::forward(out, tokens, wte, wpe, t, c));
    }

    unsafe fn encoder_backward(
        &self,
        dwte: DevPtr,
        dwpe: DevPtr,
        dout: DevPtr<Act>,
        tokens: DevPtr<i32>,
        order: DevPtr<i32>,
        b: usize,
        t: usize,
        c: usize,
    ) {
        let (tokens, order) = (view(tokens, b * t), view(order, b * t));
        let vocab = tokens.iter().map(|&id| id as usize + 1).max().unwrap_or(0);
        let (dwte, dwpe, dout) = (view_mut(dwte, vocab * c), view_mut(dwpe, t * c), view(dout, b * t * c));
        self.run(|| encoder::backward(dwte, dwpe, dout, tokens, order, b, t, c));
    }

    unsafe fn matmul_forward(
        &self,
        out: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        bias: Option<DevPtr<Act>>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let out = view_mut(out, bt * oc);
        let (inp, w, bias) = (view(inp, bt * c), view(w, oc * c), bias.map(|p| view(p, oc)));
        self.run(|| matmul::forward(out, inp, w, bias, c, oc, self.threads));
    }

    unsafe fn matmul_backward(
        &self,
        overwrite: Overwrite,
        dinp: DevPtr<Act>,
        dw: DevPtr,
        dbias: Option<DevPtr>,
        dout: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        // A written gradient is zeroed and then added to: the same bits as into zeros.
        // SAFETY: dinp holds BT·C activations and dw OC·C f32s (the caller's contract).
        unsafe {
            if overwrite.dinp {
                self.zero_act(dinp, bt * c);
            }
            if overwrite.dw {
                self.zero(dw, oc * c);
            }
        }
        let grads = matmul::Grads {
            dinp: view_mut(dinp, bt * c),
            dw: view_mut(dw, oc * c),
            dbias: dbias.map(|p| view_mut(p, oc)),
        };
        let (dout, inp, w) = (view(dout, bt * oc), view(inp, bt * c), view(w, oc * c));
        self.run(|| matmul::backward(grads, dout, inp, w, c, oc, self.threads));
    }

    unsafe fn bias_backward(&self, dbias: DevPtr, dout: DevPtr<Act>, bt: usize, oc: usize) {
        let (dbias, dout) = (view_mut(dbias, oc), view(dout, bt * oc));
        self.run(|| matmul::bias_backward(dbias, dout, oc));
    }

    unsafe fn layernorm_forward(
        &self,
        out: DevPtr<Act>,
        mean: DevPtr,
        rstd: DevPtr,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        b: DevPtr<Act>,
        bt: usize,
        c: usize,
    ) {
        let stats = layernorm::Stats {
            mean: view_mut(mean, bt),
            rstd: view_mut(rstd, bt),
        };
        let (out, inp, w, b) = (view_mut(out, bt * c), view(inp, bt * c), view(w, c), view(b, c));
        self.run(|| layernorm::forward(out, stats, inp, w, b));
    }

    unsafe fn layernorm_backward(
        &self,
        dinp: DevPtr<Act>,
        dw: DevPtr,
        db: DevPtr,
        dout: DevPtr<Act>,
        inp: DevPtr<Act>,
        w: DevPtr<Act>,
        mean: DevPtr,
        rstd: DevPtr,
        bt: usize,
        c: usize,
    ) {
        let grads = layernorm::Grads {
            dinp: view_mut(dinp, bt * c),
            dw: view_mut(dw, c),
            db: view_mut(db, c),
        };
        let (dout, inp, w) = (view(dout, bt * c), view(inp, bt * c), view(w, c));
        let (mean, rstd) = (view(mean, bt), view(rstd, bt));
        self.run(|| layernorm::backward(grads, dout, inp, w, mean, rstd));
    }

    fn attention_saved_len(&self, b: usize, t: usize, nh: usize) -> usize {
        // softmax probabilities, (B,NH,T,T); saturated, so a size past usize is refused
        // (`train::check_fits`) rather than wrapped
        b.saturating_mul(nh).saturating_mul(t).saturating_mul(t)
    }

    unsafe fn attention_forward(
        &self,
        out: DevPtr<Act>,
        saved: DevPtr,
        qkv: DevPtr<Act>,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        let dims = attention::Dims { b, t, c, nh };
        let (out, att, qkv) = (
            view_mut(out, b * t * c),
            view_mut(saved, b * nh * t * t),
            view(qkv, b * t * 3 * c),
        );
        self.run(|| attention::forward(out, att, qkv, dims));
    }

    unsafe fn attention_cached_forward(
        &self,
        out: DevPtr<Act>,
        k_cache: DevPtr<Act>,
        v_cache: DevPtr<Act>,
        rows: usize,
        qkv: DevPtr<Act>,
        pos: DevPtr<i32>,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        let pos = view(pos, 1)[0] as usize;
        let (out, k_cache, v_cache, qkv) = (
            view_mut(out, t * c),
            view_mut(k_cache, rows * c),
            view_mut(v_cache, rows * c),
            view(qkv, t * 3 * c),
        );
        self.run(|| attention::cached_forward(out, k_cache, v_cache, qkv, pos, t, c, nh));
    }

    unsafe fn attention_backward(
        &self,
        overwrite: bool,
        dqkv: DevPtr<Act>,
        dbias: Option<DevPtr>,
        dout: DevPtr<Act>,
        qkv: DevPtr<Act>,
        _out: DevPtr<Act>,
        saved: DevPtr,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        // A written gradient is zeroed and then added to: the same bits as into zeros.
        if overwrite {
            // SAFETY: dqkv holds B·T·3C activations (the caller's contract).
            unsafe { self.zero_act(dqkv, b * t * 3 * c) };
        }
        let dims = attention::Dims { b, t, c, nh };
        let (dout, qkv, att) = (
            view(dout, b * t * c),
            view(qkv, b * t * 3 * c),
            view(saved, b * nh * t * t),
        );
        self.run(|| attention::backward(view_mut(dqkv, b * t * 3 * c), dout, qkv, att, dims));
        if let Some(dbias) = dbias {
            // SAFETY: dbias holds 3C f32s (the caller's contract).
            unsafe { self.bias_backward(dbias, dqkv, b * t, 3 * c) };
        }
    }

    unsafe fn relu_forward(&self, out: DevPtr<Act>, inp: DevPtr<Act>, n: usize) {
        self.run(|| elementwise::relu_forward(view_mut(out, n), view(inp, n)));
    }

    unsafe fn relu_backward(&self, dinp: DevPtr<Act>, inp: DevPtr<Act>, dout: DevPtr<Act>, n: usize) {
        self.run(|| elementwise::relu_backward(view_mut(dinp, n), view(inp, n), view(dout, n)));
    }

    unsafe fn gelu_forward(&self, out: DevPtr<Act>, inp: DevPtr<Act>, n: usize) {
        self.run(|| elementwise::gelu_forward(view_mut(out, n), view(inp, n)));
    }

    unsafe fn gelu_backward(&self, dinp: DevPtr<Act>, inp: DevPtr<Act>, dout: DevPtr<Act>, n: usize) {
        self.run(|| elementwise::gelu_backward(view_mut(dinp, n), view(inp, n), view(dout, n)));
    }

    unsafe fn gelu_backward_in_place(&self, d: DevPtr<Act>, inp: DevPtr<Act>, n: usize) {
        self.run(|| elementwise::gelu_backward_in_place(view_mut(d, n), view(inp, n)));
    }

    unsafe fn crossentropy_forward(
        &self,
        losses: DevPtr,
        logits: DevPtr<Act>,
        targets: DevPtr<i32>,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let (losses, logits, targets) = (view_mut(losses, bt), view(logits, bt * vp), view(targets, bt));
        self.run(|| loss::forward(losses, logits, targets, v, vp));
    }

    unsafe fn crossentropy_backward(
        &self,
        dlogits: DevPtr<Act>,
        logits: DevPtr<Act>,
        targets: DevPtr<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let dlogits = view_mut(dlogits, bt * vp);
        let (logits, targets) = (view(logits, bt * vp), view(targets, bt));
        self.run(|| loss::backward(dlogits, logits, targets, dloss, v, vp));
    }

    unsafe fn crossentropy_backward_in_place(
        &self,
        logits: DevPtr<Act>,
        losses: DevPtr,
        targets: DevPtr<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let logits = view_mut(logits, bt * vp);
        let (losses, targets) = (view(losses, bt), view(targets, bt));
        self.run(|| loss::backward_in_place(logits, losses, targets, dloss, v, vp));
    }

    unsafe fn mean(&self, out: DevPtr, inp: DevPtr, n: usize) {
        view_mut(out, 1)[0] = optim::mean(view(inp, n));
    }

    unsafe fn sum_squares(&self, out: DevPtr, inp: DevPtr, n: usize) {
        let inp = view(inp, n);
        view_mut(out, 1)[0] += self.run(|| optim::sum_squares(inp));
    }

    unsafe fn step_stats(&self, state: DevPtr, history: DevPtr, history_len: usize, max_norm: f32, loss_scale: f32) {
        let s = state_mut(state);
        optim::step_stats(s, max_norm, loss_scale);
        let at = 2 * (s.step as usize % history_len);
        view_mut(history, 2 * history_len)[at..at + 2].copy_from_slice(&[s.loss, s.norm]);
    }

    unsafe fn adamw(
        &self,
        params: DevPtr,
        grads: DevPtr,
        m: DevPtr,
        v: DevPtr,
        segments: &[(Range<usize>, bool)],
        state: DevPtr,
        hp: AdamWHyper,
        copy: Option<DevPtr<bf16>>,
    ) {
        let step = *state_mut(state);
        if step.apply == 0.0 {
            return;
        }
        for (range, decay) in segments {
            let (o, n) = (range.start, range.len());
            let moments = optim::AdamWState {
                params: view_mut(params.add(o), n),
                m: view_mut(m.add(o), n),
                v: view_mut(v.add(o), n),
            };
            let grads = view(grads.add(o), n);
            let hp = AdamWHyper {
                weight_decay: if *decay { hp.weight_decay } else { 0.0 },
                ..hp
            };
            self.run(|| optim::adamw(moments, grads, &step, hp));
        }
        if let (Some(copy), Some((last, _))) = (copy, segments.last()) {
            self.round_to_bf16(copy, params, last.end);
        }
    }

    unsafe fn sgd(
        &self,
        params: DevPtr,
        grads: DevPtr,
        velocity: DevPtr,
        n: usize,
        state: DevPtr,
        hp: SgdHyper,
        copy: Option<DevPtr<bf16>>,
    ) {
        let step = *state_mut(state);
        if step.apply == 0.0 {
            return;
        }
        let (p, v) = (view_mut(params, n), view_mut(velocity, n));
        let grads = view(grads, n);
        self.run(|| optim::sgd(p, v, grads, &step, hp));
        if let Some(copy) = copy {
            self.round_to_bf16(copy, params, n);
        }
    }

    unsafe fn gather_batch(
        &self,
        out: DevPtr<Act>,
        targets: DevPtr<i32>,
        images: DevPtr<u8>,
        labels: DevPtr<u8>,
        order: DevPtr<i32>,
        state: DevPtr,
        rows: usize,
        size: usize,
        steps: usize,
    ) {
        let s = state_mut(state).step as usize % steps;
        let order = &view(order, steps * rows)[s * rows..(s + 1) * rows];
        let count = order.iter().map(|&i| i as usize + 1).max().unwrap_or(0);
        let (images, labels) = (view(images, count * size), view(labels, count));
        let (out, targets) = (view_mut(out, rows * size), view_mut(targets, rows));
        self.run(|| mlp::gather(out, targets, images, labels, order, size));
    }

    unsafe fn loss_step(
        &self,
        logits: DevPtr<Act>,
        losses: DevPtr,
        targets: DevPtr<i32>,
        state: DevPtr,
        schedule: DevPtr,
        history: DevPtr,
        history_len: usize,
        rows: usize,
        v: usize,
        steps: usize,
        dloss: f32,
    ) {
        // The generic step's ops in its order: crossentropy_forward, mean, the copy into the
        // state (0 + mean), step_stats (· 1.0), crossentropy_backward_in_place.
        self.crossentropy_forward(losses, logits, targets, rows, v, v);
        let loss = 0.0 + optim::mean(view(losses, rows)) * 1.0;
        self.crossentropy_backward_in_place(logits, losses, targets, dloss, rows, v, v);
        let s = state_mut(state);
        let at = s.step as usize;
        s.sumsq = 0.0;
        s.norm = 0.0;
        s.clip = 1.0;
        s.loss = loss;
        s.apply = loss.is_finite() as u8 as f32;
        s.lr = view(schedule, steps)[at % steps];
        let slot = 2 * (at % history_len);
        view_mut(history, 2 * history_len)[slot..slot + 2].copy_from_slice(&[loss, 0.0]);
        s.step = s.step.wrapping_add(1);
    }

    unsafe fn matmul_backward_relu(
        &self,
        dinp: DevPtr<Act>,
        dout: DevPtr<Act>,
        w: DevPtr<Act>,
        act: DevPtr<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let d = view_mut(dinp, bt * c);
        let (dout, w, act) = (view(dout, bt * oc), view(w, oc * c), view(act, bt * c));
        self.run(|| {
            elementwise::zero(d);
            matmul::input_grad(d, dout, w, c, oc, self.threads);
            mlp::relu_mask(d, act);
        });
    }

    unsafe fn linear_sgd(
        &self,
        params: DevPtr,
        velocity: DevPtr,
        grads: DevPtr,
        copy: Option<DevPtr<bf16>>,
        dout: DevPtr<Act>,
        inp: DevPtr<Act>,
        state: DevPtr,
        hp: SgdHyper,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        // The gradients as the generic step computes them (into zeros), then its two updates.
        {
            let g = view_mut(grads, oc * c + oc);
            let (dw, db) = g.split_at_mut(oc * c);
            let (dout, inp) = (view(dout, bt * oc), view(inp, bt * c));
            self.run(|| {
                elementwise::zero(dw);
                elementwise::zero(db);
                matmul::weight_grad(dw, dout, inp, c, oc, self.threads);
                matmul::bias_backward(db, dout, oc);
            });
        }
        let n = oc * c;
        self.sgd(params, grads, velocity, n, state, hp, copy);
        let bias = SgdHyper {
            weight_decay: 0.0,
            ..hp
        };
        self.sgd(
            params.add(n),
            grads.add(n),
            velocity.add(n),
            oc,
            state,
            bias,
            copy.map(|p| p.add(n)),
        );
    }
}

/// Peak resident set size of this process (Linux `VmHWM`), in bytes; 0 if unknown.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
