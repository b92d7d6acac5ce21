//! CPU backend: rayon for parallel loops and the `gemm` crate (AVX2/AVX-512 kernels) for
//! matrix products. Every reduction runs in a fixed order that does not depend on the
//! thread count (work is split by output element or by fixed-size blocks, never by
//! thread), so a run is bit-for-bit reproducible and stage 1's ranks can match stage 0.
//!
//! This file holds the buffers and the [`Backend`] impl. Each op first hands its spans to
//! its [`contract`] function, which checks every extent and that nothing the op writes
//! overlaps another operand; only the addresses it returns become slices, of exactly the
//! extents it checked. The numerics live in one file per op family and work on plain
//! slices: `elementwise`, `encoder`, `matmul`, `layernorm`, `attention`, `loss`, `optim`,
//! `mlp` (the MLP's step on the device, with the [`FusedMlp`](super::FusedMlp) impl).

// Index loops read like the formulas in these numeric kernels.
#![allow(clippy::needless_range_loop)]

mod attention;
mod elementwise;
mod encoder;
mod fastmath;
mod fp8;
mod layernorm;
mod loss;
mod matmul;
mod mlp;
mod optim;
mod subnormals;

use super::{
    bf16, contract, Act, AdamWHyper, Backend, DevPtr, DeviceBuffer, Elem, Fp8, Fp8Slot, Overwrite, SgdHyper, Span,
    StepState,
};
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
        // Every worker flushes subnormal floats to zero (see `subnormals`): they would run
        // in microcode on many x86-64 cores. So does this thread, for anything run outside the pool.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .start_handler(|_| subnormals::flush_subnormals())
            .build()
            .map_err(|e| Error::Device(format!("cannot start {threads} CPU threads: {e}")))?;
        subnormals::flush_subnormals();
        Ok(CpuBackend { pool, threads })
    }

    /// Whether every worker thread flushes subnormal floats to zero, each checked by
    /// arithmetic (a product below f32's smallest normal comes out 0), not by its flags alone.
    #[cfg(test)]
    pub(crate) fn flushes_subnormals(&self) -> bool {
        let flushed = || {
            let tiny = std::hint::black_box(1e-30f32) * std::hint::black_box(1e-10f32);
            subnormals::flushing_subnormals() && tiny == 0.0
        };
        self.pool.broadcast(|_| flushed()).into_iter().all(|f| f)
    }

    /// Runs `f` on this backend's thread pool.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

// ---- raw memory views --------------------------------------------------------------
// Every op's spans have been through its `contract::` function before these are called:
// each address holds the elements the op uses, and nothing the op writes overlaps another
// operand, so a view of that extent is a slice no other slice of the call aliases. Where a
// table's rows are picked by values (token ids, image indices), the view is the whole span
// and indexing it is bounds-checked. Only the raw copies (`upload`, `download`) take
// addresses whose extent their caller promises.

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

/// # Safety
/// `p` holds `n` live elements that nothing writes while the slice is used.
unsafe fn view<'a, P: HostPtr>(p: P, n: usize) -> &'a [P::Elem] {
    std::slice::from_raw_parts(p.addr() as *const P::Elem, n)
}
/// # Safety
/// `p` holds `n` live elements that nothing else reads or writes while the slice is used.
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

/// The [`StepState`] at `p`, read.
///
/// # Safety
/// `p` holds [`StepState::WORDS`] words that nothing writes while it is read.
unsafe fn read_state(p: DevPtr) -> StepState {
    *bytemuck::from_bytes(bytemuck::cast_slice(view(p, StepState::WORDS)))
}

impl CpuBackend {
    /// `dst += src` over `n` values (`src` may be `dst`: then `dst *= 2`).
    ///
    /// # Safety
    /// As `view_mut(dst, n)` and `view(src, n)`, except that they may be the same pointer.
    unsafe fn accumulate_at(&self, dst: DevPtr, src: DevPtr, n: usize) {
        if dst == src {
            return self.run(|| elementwise::scale(view_mut(dst, n), 2.0));
        }
        self.run(|| elementwise::accumulate(view_mut(dst, n), view(src, n)));
    }

    /// [`Backend::sgd`]'s update on addresses.
    ///
    /// # Safety
    /// `params`, `velocity` (and `copy`): `n` elements each to write, `grads`: `n` to read,
    /// `state`: [`StepState::WORDS`], none overlapping a written one.
    #[allow(clippy::too_many_arguments)]
    unsafe fn sgd_at(
        &self,
        params: DevPtr,
        grads: DevPtr,
        velocity: DevPtr,
        n: usize,
        state: DevPtr,
        hp: SgdHyper,
        copy: Option<DevPtr<bf16>>,
    ) {
        let step = read_state(state);
        if step.apply == 0.0 {
            return;
        }
        let (p, v) = (view_mut(params, n), view_mut(velocity, n));
        let grads = view(grads, n);
        self.run(|| optim::sgd(p, v, grads, &step, hp));
        if let Some(copy) = copy {
            elementwise::round_to_bf16(view_mut(copy, n), view(params, n));
        }
    }
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
        // SAFETY: `dst` holds src.len() elements (the caller's contract).
        unsafe { view_mut(dst, src.len()) }.copy_from_slice(src);
        Ok(())
    }

    unsafe fn download<T: Elem>(&self, src: DevPtr<T>, dst: &mut [T]) -> Result<()> {
        // SAFETY: `src` holds dst.len() elements (the caller's contract).
        dst.copy_from_slice(unsafe { view(src, dst.len()) });
        Ok(())
    }

    fn zero<T: Elem>(&self, dst: Span<T>, n: usize) {
        let dst = contract::zero(dst, n);
        // SAFETY: the contract checked the extent.
        self.run(|| elementwise::zero(unsafe { view_mut(dst, n) }));
    }

    fn round_to_bf16(&self, dst: Span<bf16>, src: Span, n: usize) {
        let (dst, src) = contract::round_to_bf16(dst, src, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { elementwise::round_to_bf16(view_mut(dst, n), view(src, n)) };
    }

    fn widen_bf16(&self, dst: Span, src: Span<bf16>, n: usize) {
        let (dst, src) = contract::widen_bf16(dst, src, n);
        // SAFETY: the contract checked every extent and overlap.
        let (dst, src) = unsafe { (view_mut(dst, n), view(src, n)) };
        dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
    }

    fn fp8(&self) -> bool {
        true
    }

    fn quantize_fp8(&self, dst: Span<u8>, amax: Span, src: Span<Act>, scale: Span, n: usize, format: Fp8) {
        let (dst, amax, src, scale) = contract::quantize_fp8(self.act(), dst, amax, src, scale, n);
        // SAFETY: the contract checked every extent and overlap.
        let (dst, amax, src, scale) = unsafe { (view_mut(dst, n), view_mut(amax, 1), view(src, n), view(scale, 1)) };
        self.run(|| fp8::quantize(dst, &mut amax[0], src, scale[0], format));
    }

    fn matmul_fp8(
        &self,
        out: Span<Act>,
        x: Span<u8>,
        y: Span<u8>,
        bias: Option<Span<Act>>,
        dequant: [Span; 2],
        shape: [usize; 3],
        formats: [Fp8; 2],
    ) {
        let (out, x, y, bias, dequant) = contract::matmul_fp8(self.act(), out, x, y, bias, dequant, shape, formats);
        let [r, s, k] = shape;
        // SAFETY: the contract checked every extent and that `out` overlaps no input.
        unsafe {
            let (out, x, y) = (view_mut(out, r * s), view(x, r * k), view(y, s * k));
            let bias = bias.map(|b| view(b, s));
            let dequant = [view(dequant[0], 1)[0], view(dequant[1], 1)[0]];
            self.run(|| fp8::matmul(out, x, y, bias, dequant, shape, formats, self.threads));
        }
    }

    fn matmul_fp8_weight_grad(
        &self,
        overwrite: bool,
        dw: Span,
        x: Span<u8>,
        y: Span<u8>,
        dequant: [Span; 2],
        shape: [usize; 3],
        formats: [Fp8; 2],
    ) {
        let (dw, x, y, dequant) = contract::matmul_fp8_weight_grad(dw, x, y, dequant, shape, formats);
        let [r, s, k] = shape;
        // SAFETY: the contract checked every extent and that `dw` overlaps no input.
        unsafe {
            let (dw, x, y) = (view_mut(dw, r * s), view(x, r * k), view(y, s * k));
            let dequant = [view(dequant[0], 1)[0], view(dequant[1], 1)[0]];
            self.run(|| {
                if overwrite {
                    fp8::matmul(dw, x, y, None, dequant, shape, formats, self.threads);
                } else {
                    let mut sum = vec![0.0f32; r * s];
                    fp8::matmul(&mut sum, x, y, None, dequant, shape, formats, self.threads);
                    dw.iter_mut().zip(&sum).for_each(|(d, s)| *d += s);
                }
            });
        }
    }

    fn quantize_fp8_transposed(
        &self,
        dst: Span<u8>,
        amax: Span,
        src: Span<Act>,
        scale: Span,
        shape: [usize; 2],
        format: Fp8,
    ) {
        let (dst, amax, src, scale) = contract::quantize_fp8_transposed(self.act(), dst, amax, src, scale, shape);
        let n = shape[0] * shape[1];
        // SAFETY: the contract checked every extent and overlap.
        let (dst, amax, src, scale) = unsafe { (view_mut(dst, n), view_mut(amax, 1), view(src, n), view(scale, 1)) };
        self.run(|| fp8::quantize_transposed(dst, &mut amax[0], src, scale[0], shape, format));
    }

    fn fp8_rescale(&self, slots: Span, history: Span, n: usize, len: usize) {
        let (slots, history) = contract::fp8_rescale(slots, history, n, len);
        // SAFETY: the contract checked every extent and overlap.
        let (slots, history) = unsafe { (view_mut(slots, n * Fp8Slot::WORDS), view_mut(history, n * len)) };
        for (i, slot) in slots.chunks_mut(Fp8Slot::WORDS).enumerate() {
            crate::backend::fp8_rescale_slot(slot, &mut history[i * len..][..len]);
        }
    }

    fn accumulate(&self, dst: Span, src: Span, n: usize) {
        let (dst, src) = contract::accumulate(dst, src, n);
        // SAFETY: the contract checked every extent, and that `src` is `dst` or apart from it.
        unsafe { self.accumulate_at(dst, src, n) };
    }

    fn accumulate_act(&self, dst: Span<Act>, src: Span<Act>, n: usize) {
        let (dst, src) = contract::accumulate_act(self.act(), dst, src, n);
        // SAFETY: the contract checked every extent, and that `src` is `dst` or apart from it.
        unsafe { self.accumulate_at(dst.cast(), src.cast(), n) };
    }

    fn add(&self, out: Span<Act>, a: Span<Act>, b: Span<Act>, n: usize) {
        let (out, a, b) = contract::add(self.act(), out, a, b, n);
        // SAFETY: the contract checked every extent and overlap.
        let (out, a, b) = unsafe { (view_mut(out, n), view(a, n), view(b, n)) };
        self.run(|| elementwise::add(out, a, b));
    }

    fn scale(&self, dst: Span, n: usize, s: f32) {
        let dst = contract::scale(dst, n);
        // SAFETY: the contract checked the extent.
        let dst = unsafe { view_mut(dst, n) };
        self.run(|| elementwise::scale(dst, s));
    }

    unsafe fn encoder_forward(
        &self,
        out: Span<Act>,
        tokens: Span<i32>,
        first_position: Option<Span<i32>>,
        wte: Span<Act>,
        wpe: Span<Act>,
        b: usize,
        t: usize,
        c: usize,
    ) {
        let (wte_len, wpe_len) = (wte.len(), wpe.len());
        let (out, tokens, first_position, wte, wpe) =
            contract::encoder_forward(self.act(), out, tokens, first_position, wte, wpe, b, t, c);
        // SAFETY: the contract checked every extent and overlap; the tables are viewed whole,
        // so a token id or position past them is an index out of bounds.
        unsafe {
            let tokens = view(tokens, b * t);
            let p = first_position.map_or(0, |p| view(p, 1)[0] as usize);
            let wpe = &view(wpe, wpe_len)[p * c..(p + t) * c];
            let (out, wte) = (view_mut(out, b * t * c), view(wte, wte_len));
            self.run(|| encoder::forward(out, tokens, wte, wpe, t, c));
        }
    }

    unsafe fn encoder_backward(
        &self,
        dwte: Span,
        dwpe: Span,
        dout: Span<Act>,
        tokens: Span<i32>,
        order: Span<i32>,
        b: usize,
        t: usize,
        c: usize,
    ) {
        let dwte_len = dwte.len();
        let (dwte, dwpe, dout, tokens, order) =
            contract::encoder_backward(self.act(), dwte, dwpe, dout, tokens, order, b, t, c);
        // SAFETY: the contract checked every extent and overlap; `dwte` is viewed whole, so a
        // token id past it is an index out of bounds.
        unsafe {
            let (tokens, order) = (view(tokens, b * t), view(order, b * t));
            let (dwte, dwpe, dout) = (view_mut(dwte, dwte_len), view_mut(dwpe, t * c), view(dout, b * t * c));
            self.run(|| encoder::backward(dwte, dwpe, dout, tokens, order, b, t, c));
        }
    }

    fn matmul_forward(
        &self,
        out: Span<Act>,
        inp: Span<Act>,
        w: Span<Act>,
        bias: Option<Span<Act>>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let (out, inp, w, bias) = contract::matmul_forward(self.act(), out, inp, w, bias, bt, c, oc);
        // SAFETY: the contract checked every extent and that `out` overlaps no input.
        unsafe {
            let out = view_mut(out, bt * oc);
            let (inp, w, bias) = (view(inp, bt * c), view(w, oc * c), bias.map(|p| view(p, oc)));
            self.run(|| matmul::forward(out, inp, w, bias, c, oc, self.threads));
        }
    }

    fn matmul_backward(
        &self,
        overwrite: Overwrite,
        dinp: Span<Act>,
        dw: Span,
        dbias: Option<Span>,
        dout: Span<Act>,
        inp: Span<Act>,
        w: Span<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let (dinp, dw, dbias, dout, inp, w) =
            contract::matmul_backward(self.act(), dinp, dw, dbias, dout, inp, w, bt, c, oc);
        // SAFETY: the contract checked every extent and that no gradient overlaps another operand.
        unsafe {
            let grads = matmul::Grads {
                dinp: view_mut(dinp, bt * c),
                dw: view_mut(dw, oc * c),
                dbias: dbias.map(|p| view_mut(p, oc)),
            };
            let (dout, inp, w) = (view(dout, bt * oc), view(inp, bt * c), view(w, oc * c));
            self.run(|| {
                // A written gradient is zeroed and then added to: the same bits as into zeros.
                if overwrite.dinp {
                    elementwise::zero(&mut *grads.dinp);
                }
                if overwrite.dw {
                    elementwise::zero(&mut *grads.dw);
                }
                matmul::backward(grads, dout, inp, w, c, oc, self.threads)
            });
        }
    }

    fn matmul_weight_backward(
        &self,
        overwrite_dw: bool,
        dw: Span,
        dbias: Option<Span>,
        dout: Span<Act>,
        inp: Span<Act>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let (dw, dbias, dout, inp) = contract::matmul_weight_backward(self.act(), dw, dbias, dout, inp, bt, c, oc);
        // SAFETY: the contract checked every extent and that no gradient overlaps another operand.
        unsafe {
            let (dw, dbias) = (view_mut(dw, oc * c), dbias.map(|p| view_mut(p, oc)));
            let (dout, inp) = (view(dout, bt * oc), view(inp, bt * c));
            self.run(|| {
                // As matmul_backward: a written gradient is zeroed and then added to.
                if overwrite_dw {
                    elementwise::zero(&mut *dw);
                }
                matmul::weight_grad(dw, dout, inp, c, oc, self.threads);
                if let Some(dbias) = dbias {
                    matmul::bias_backward(dbias, dout, oc);
                }
            });
        }
    }

    fn bias_backward(&self, dbias: Span, dout: Span<Act>, bt: usize, oc: usize) {
        let (dbias, dout) = contract::bias_backward(self.act(), dbias, dout, bt, oc);
        // SAFETY: the contract checked every extent and overlap.
        let (dbias, dout) = unsafe { (view_mut(dbias, oc), view(dout, bt * oc)) };
        self.run(|| matmul::bias_backward(dbias, dout, oc));
    }

    fn layernorm_forward(
        &self,
        out: Span<Act>,
        mean: Span,
        rstd: Span,
        inp: Span<Act>,
        w: Span<Act>,
        b: Span<Act>,
        bt: usize,
        c: usize,
    ) {
        let (out, mean, rstd, inp, w, b) = contract::layernorm_forward(self.act(), out, mean, rstd, inp, w, b, bt, c);
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            let stats = layernorm::Stats {
                mean: view_mut(mean, bt),
                rstd: view_mut(rstd, bt),
            };
            let (out, inp, w, b) = (view_mut(out, bt * c), view(inp, bt * c), view(w, c), view(b, c));
            self.run(|| layernorm::forward(out, stats, inp, w, b));
        }
    }

    fn layernorm_backward(
        &self,
        dinp: Span<Act>,
        dw: Span,
        db: Span,
        dout: Span<Act>,
        inp: Span<Act>,
        w: Span<Act>,
        mean: Span,
        rstd: Span,
        bt: usize,
        c: usize,
    ) {
        let (dinp, dw, db, dout, inp, w, mean, rstd) =
            contract::layernorm_backward(self.act(), dinp, dw, db, dout, inp, w, mean, rstd, bt, c);
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            let grads = layernorm::Grads {
                dinp: view_mut(dinp, bt * c),
                dw: view_mut(dw, c),
                db: view_mut(db, c),
            };
            let (dout, inp, w) = (view(dout, bt * c), view(inp, bt * c), view(w, c));
            let (mean, rstd) = (view(mean, bt), view(rstd, bt));
            self.run(|| layernorm::backward(grads, dout, inp, w, mean, rstd));
        }
    }

    fn attention_saved_len(&self, b: usize, t: usize, nh: usize) -> usize {
        // softmax probabilities, (B,NH,T,T); saturated, so a size past usize is refused
        // (`train::check_fits`) rather than wrapped
        b.saturating_mul(nh).saturating_mul(t).saturating_mul(t)
    }

    fn attention_forward(&self, out: Span<Act>, saved: Span, qkv: Span<Act>, b: usize, t: usize, c: usize, nh: usize) {
        let saved_len = self.attention_saved_len(b, t, nh);
        let (out, saved, qkv) = contract::attention_forward(self.act(), out, saved, saved_len, qkv, b, t, c, nh);
        let dims = attention::Dims { b, t, c, nh };
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            let (out, att, qkv) = (
                view_mut(out, b * t * c),
                view_mut(saved, saved_len),
                view(qkv, b * t * 3 * c),
            );
            self.run(|| attention::forward(out, att, qkv, dims));
        }
    }

    unsafe fn attention_cached_forward(
        &self,
        out: Span<Act>,
        k_cache: Span<Act>,
        v_cache: Span<Act>,
        rows: usize,
        qkv: Span<Act>,
        pos: Span<i32>,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        let (out, k_cache, v_cache, qkv, pos) =
            contract::attention_cached_forward(self.act(), out, k_cache, v_cache, rows, qkv, pos, t, c, nh);
        // SAFETY: the contract checked every extent and overlap; the kernel checks the caches
        // hold rows up to pos + T.
        unsafe {
            let pos = view(pos, 1)[0] as usize;
            let (out, k_cache, v_cache, qkv) = (
                view_mut(out, t * c),
                view_mut(k_cache, rows * c),
                view_mut(v_cache, rows * c),
                view(qkv, t * 3 * c),
            );
            self.run(|| attention::cached_forward(out, k_cache, v_cache, qkv, pos, t, c, nh));
        }
    }

    fn attention_backward(
        &self,
        overwrite: bool,
        dqkv: Span<Act>,
        dbias: Option<Span>,
        dout: Span<Act>,
        qkv: Span<Act>,
        out: Span<Act>,
        saved: Span,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        let saved_len = self.attention_saved_len(b, t, nh);
        let (dqkv, dbias, dout, qkv, _out, saved) =
            contract::attention_backward(self.act(), dqkv, dbias, dout, qkv, out, saved, saved_len, b, t, c, nh);
        let dims = attention::Dims { b, t, c, nh };
        // SAFETY: the contract checked every extent and that no gradient overlaps another operand.
        unsafe {
            let dqkv = view_mut(dqkv, b * t * 3 * c);
            let (dout, qkv, att) = (view(dout, b * t * c), view(qkv, b * t * 3 * c), view(saved, saved_len));
            let dbias = dbias.map(|p| view_mut(p, 3 * c));
            self.run(|| {
                // A written gradient is zeroed and then added to: the same bits as into zeros.
                if overwrite {
                    elementwise::zero(&mut *dqkv);
                }
                attention::backward(&mut *dqkv, dout, qkv, att, dims);
                if let Some(dbias) = dbias {
                    matmul::bias_backward(dbias, dqkv, 3 * c);
                }
            });
        }
    }

    fn relu_forward(&self, out: Span<Act>, inp: Span<Act>, n: usize) {
        let (out, inp) = contract::unary("relu_forward", self.act(), out, inp, n);
        // SAFETY: the contract checked every extent and overlap.
        let (out, inp) = unsafe { (view_mut(out, n), view(inp, n)) };
        self.run(|| elementwise::relu_forward(out, inp));
    }

    fn relu_backward(&self, dinp: Span<Act>, inp: Span<Act>, dout: Span<Act>, n: usize) {
        let (dinp, inp, dout) = contract::unary_backward("relu_backward", self.act(), dinp, inp, dout, n);
        // SAFETY: the contract checked every extent and overlap.
        let (dinp, inp, dout) = unsafe { (view_mut(dinp, n), view(inp, n), view(dout, n)) };
        self.run(|| elementwise::relu_backward(dinp, inp, dout));
    }

    fn gelu_forward(&self, out: Span<Act>, inp: Span<Act>, n: usize) {
        let (out, inp) = contract::unary("gelu_forward", self.act(), out, inp, n);
        // SAFETY: the contract checked every extent and overlap.
        let (out, inp) = unsafe { (view_mut(out, n), view(inp, n)) };
        self.run(|| elementwise::gelu_forward(out, inp));
    }

    fn gelu_backward(&self, dinp: Span<Act>, inp: Span<Act>, dout: Span<Act>, n: usize) {
        let (dinp, inp, dout) = contract::unary_backward("gelu_backward", self.act(), dinp, inp, dout, n);
        // SAFETY: the contract checked every extent and overlap.
        let (dinp, inp, dout) = unsafe { (view_mut(dinp, n), view(inp, n), view(dout, n)) };
        self.run(|| elementwise::gelu_backward(dinp, inp, dout));
    }

    fn gelu_backward_in_place(&self, d: Span<Act>, inp: Span<Act>, n: usize) {
        let (d, inp) = contract::gelu_backward_in_place(self.act(), d, inp, n);
        // SAFETY: the contract checked every extent and overlap.
        let (d, inp) = unsafe { (view_mut(d, n), view(inp, n)) };
        self.run(|| elementwise::gelu_backward_in_place(d, inp));
    }

    unsafe fn crossentropy_forward(
        &self,
        losses: Span,
        logits: Span<Act>,
        targets: Span<i32>,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let (losses, logits, targets) = contract::crossentropy_forward(self.act(), losses, logits, targets, bt, v, vp);
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            let (losses, logits, targets) = (view_mut(losses, bt), view(logits, bt * vp), view(targets, bt));
            self.run(|| loss::forward(losses, logits, targets, v, vp));
        }
    }

    unsafe fn crossentropy_backward(
        &self,
        dlogits: Span<Act>,
        logits: Span<Act>,
        targets: Span<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let (dlogits, logits, targets) =
            contract::crossentropy_backward(self.act(), dlogits, logits, targets, bt, v, vp);
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            let dlogits = view_mut(dlogits, bt * vp);
            let (logits, targets) = (view(logits, bt * vp), view(targets, bt));
            self.run(|| loss::backward(dlogits, logits, targets, dloss, v, vp));
        }
    }

    unsafe fn crossentropy_backward_in_place(
        &self,
        logits: Span<Act>,
        losses: Span,
        targets: Span<i32>,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let (logits, losses, targets) = contract::crossentropy_in_place(
            "crossentropy_backward_in_place",
            self.act(),
            logits,
            losses,
            targets,
            bt,
            v,
            vp,
        );
        // SAFETY: the contract checked every extent and overlap.
        unsafe {
            let logits = view_mut(logits, bt * vp);
            let (losses, targets) = (view(losses, bt), view(targets, bt));
            self.run(|| loss::backward_in_place(logits, losses, targets, dloss, v, vp));
        }
    }

    fn mean(&self, out: Span, inp: Span, n: usize) {
        let (out, inp) = contract::mean(out, inp, n);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { view_mut(out, 1)[0] = optim::mean(view(inp, n)) };
    }

    fn sum_squares(&self, out: Span, inp: Span, n: usize) {
        let (out, inp) = contract::sum_squares(out, inp, n);
        // SAFETY: the contract checked every extent and overlap.
        let (out, inp) = unsafe { (view_mut(out, 1), view(inp, n)) };
        out[0] += self.run(|| optim::sum_squares(inp));
    }

    fn step_stats(&self, state: Span, history: Span, history_len: usize, max_norm: f32, loss_scale: f32) {
        let (state, history) = contract::step_stats(state, history, history_len);
        // SAFETY: the contract checked every extent and overlap.
        let (s, history) = unsafe { (state_mut(state), view_mut(history, 2 * history_len)) };
        optim::step_stats(s, max_norm, loss_scale);
        let at = 2 * (s.step as usize % history_len);
        history[at..at + 2].copy_from_slice(&[s.loss, s.norm]);
    }

    fn adamw(
        &self,
        params: Span,
        grads: Span,
        m: Span,
        v: Span,
        segments: &[(Range<usize>, bool)],
        state: Span,
        hp: AdamWHyper,
        copy: Option<Span<bf16>>,
    ) {
        let (params, grads, m, v, state, copy) = contract::adamw(params, grads, m, v, segments, state, copy);
        // SAFETY: the contract checked that every operand holds the elements the segments
        // cover (each view lies inside them) and that no written one overlaps another.
        unsafe {
            let step = read_state(state);
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
                elementwise::round_to_bf16(view_mut(copy, last.end), view(params, last.end));
            }
        }
    }

    fn sgd(
        &self,
        params: Span,
        grads: Span,
        velocity: Span,
        n: usize,
        state: Span,
        hp: SgdHyper,
        copy: Option<Span<bf16>>,
    ) {
        let (params, grads, velocity, state, copy) = contract::sgd(params, grads, velocity, n, state, copy);
        // SAFETY: the contract checked every extent and overlap.
        unsafe { self.sgd_at(params, grads, velocity, n, state, hp, copy) };
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
