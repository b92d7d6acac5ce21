//! CPU backend: rayon for parallel loops and the `gemm` crate (AVX2/AVX-512 kernels) for
//! matrix products. Every reduction runs in a fixed order that does not depend on the
//! thread count (work is split by output element or by fixed-size blocks, never by
//! thread), so a run is bit-for-bit reproducible and stage 1's ranks can match stage 0.

// Index loops read like the formulas in these numeric kernels.
#![allow(clippy::needless_range_loop)]

use super::{fastmath, AdamWStep, Backend, DevPtr, DeviceBuffer};
use crate::error::{Error, Result};
use rayon::prelude::*;

/// Host memory standing in for device memory. Kept as `Vec<f32>`; its address is the
/// [`DevPtr`] the ops receive.
pub struct CpuBuffer(Vec<f32>);

impl DeviceBuffer for CpuBuffer {
    fn ptr(&self) -> DevPtr {
        DevPtr(self.0.as_ptr() as u64)
    }
    fn len(&self) -> usize {
        self.0.len()
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

    fn par(&self) -> gemm::Parallelism {
        if self.threads > 1 {
            gemm::Parallelism::Rayon(self.threads)
        } else {
            gemm::Parallelism::None
        }
    }

    /// `dst (m,n) = [dst +] lhs (m,k) · rhs (k,n)`, all given by (row stride, col stride).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        dst: (DevPtr, isize, isize),
        lhs: (DevPtr, isize, isize),
        rhs: (DevPtr, isize, isize),
        accumulate: bool,
    ) {
        // SAFETY: the callers pass pointers to live buffers of at least the strided
        // extents used here, and `dst` never overlaps `lhs` or `rhs`.
        self.pool.install(|| unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.0 .0 as *mut f32,
                dst.2,
                dst.1,
                accumulate,
                lhs.0 .0 as *const f32,
                lhs.2,
                lhs.1,
                rhs.0 .0 as *const f32,
                rhs.2,
                rhs.1,
                1.0,
                1.0,
                false,
                false,
                false,
                self.par(),
            )
        });
    }
}

// ---- raw memory views --------------------------------------------------------------
// The autograd layer guarantees that an op's outputs never alias its inputs, and that
// every pointer covers the extent the op reads or writes. These turn pointers into slices
// under that contract.

fn view<'a>(p: DevPtr, n: usize) -> &'a [f32] {
    unsafe { std::slice::from_raw_parts(p.0 as *const f32, n) }
}
#[allow(clippy::mut_from_ref)]
fn view_mut<'a>(p: DevPtr, n: usize) -> &'a mut [f32] {
    unsafe { std::slice::from_raw_parts_mut(p.0 as *mut f32, n) }
}
fn view_i32<'a>(p: DevPtr, n: usize) -> &'a [i32] {
    unsafe { std::slice::from_raw_parts(p.0 as *const i32, n) }
}

/// Elementwise work is split in chunks this long (a constant, so results never depend
/// on the thread count).
const CHUNK: usize = 1 << 14;

/// Dot product with 8 independent accumulators: vectorises, and the order is fixed.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, ra) = a.split_at(a.len() / 8 * 8);
    let (cb, rb) = b.split_at(ca.len());
    for (x, y) in ca.chunks_exact(8).zip(cb.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Σ e^(x − shift), with 8 independent accumulators (vectorises; fixed order).
#[inline]
fn sum_exp(xs: &[f32], shift: f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let body = xs.len() / 8 * 8;
    for x in xs[..body].chunks_exact(8) {
        for i in 0..8 {
            acc[i] += fastmath::exp(x[i] - shift);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &x in &xs[body..] {
        s += fastmath::exp(x - shift);
    }
    s
}

/// The (T, hs) rows given by `row` as an (hs, T) matrix.
fn transpose_head<'a>(t: usize, hs: usize, row: impl Fn(usize) -> &'a [f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; hs * t];
    for tj in 0..t {
        for (d, &x) in row(tj).iter().enumerate() {
            out[d * t + tj] = x;
        }
    }
    out
}

/// y += a · x
#[inline]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

const GELU_SCALE: f32 = 0.797_884_6; // sqrt(2/pi)

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.threads)
    }

    fn alloc(&self, words: usize) -> Result<CpuBuffer> {
        let mut v = Vec::new();
        v.try_reserve_exact(words)
            .map_err(|_| Error::Device(format!("out of host memory allocating {} MiB", (words * 4) >> 20)))?;
        v.resize(words, 0.0);
        Ok(CpuBuffer(v))
    }

    fn upload_f32(&self, dst: DevPtr, src: &[f32]) -> Result<()> {
        view_mut(dst, src.len()).copy_from_slice(src);
        Ok(())
    }

    fn upload_i32(&self, dst: DevPtr, src: &[i32]) -> Result<()> {
        view_mut(dst, src.len()).copy_from_slice(bytemuck::cast_slice(src));
        Ok(())
    }

    fn download_f32(&self, src: DevPtr, dst: &mut [f32]) -> Result<()> {
        dst.copy_from_slice(view(src, dst.len()));
        Ok(())
    }

    fn zero(&self, dst: DevPtr, n: usize) {
        self.pool
            .install(|| view_mut(dst, n).par_chunks_mut(CHUNK).for_each(|c| c.fill(0.0)));
    }

    fn accumulate(&self, dst: DevPtr, src: DevPtr, n: usize) {
        let (d, s) = (view_mut(dst, n), view(src, n));
        self.pool.install(|| {
            d.par_chunks_mut(CHUNK)
                .zip(s.par_chunks(CHUNK))
                .for_each(|(d, s)| axpy(d, 1.0, s))
        });
    }

    fn add(&self, out: DevPtr, a: DevPtr, b: DevPtr, n: usize) {
        let (a, b) = (view(a, n), view(b, n));
        self.pool.install(|| {
            view_mut(out, n)
                .par_chunks_mut(CHUNK)
                .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
                .for_each(|(o, (a, b))| {
                    for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
                        *o = a + b;
                    }
                })
        });
    }

    fn scale(&self, dst: DevPtr, n: usize, s: f32) {
        self.pool.install(|| {
            view_mut(dst, n)
                .par_chunks_mut(CHUNK)
                .for_each(|c| c.iter_mut().for_each(|x| *x *= s))
        });
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn peak_memory_bytes(&self) -> u64 {
        peak_rss_bytes()
    }

    fn encoder_forward(&self, out: DevPtr, tokens: DevPtr, wte: DevPtr, wpe: DevPtr, b: usize, t: usize, c: usize) {
        let (out, tokens) = (view_mut(out, b * t * c), view_i32(tokens, b * t));
        self.pool.install(|| {
            out.par_chunks_mut(c).enumerate().for_each(|(bt, row)| {
                let te = view(wte.add(tokens[bt] as usize * c), c);
                let pe = view(wpe.add((bt % t) * c), c);
                for ((o, x), y) in row.iter_mut().zip(te).zip(pe) {
                    *o = x + y;
                }
            })
        });
    }

    fn encoder_backward(&self, dwte: DevPtr, dwpe: DevPtr, dout: DevPtr, tokens: DevPtr, b: usize, t: usize, c: usize) {
        let (dout, tokens) = (view(dout, b * t * c), view_i32(tokens, b * t));
        // Positions: each position's row sums over the batch in order.
        self.pool.install(|| {
            view_mut(dwpe, t * c)
                .par_chunks_mut(c)
                .enumerate()
                .for_each(|(ti, row)| {
                    for bi in 0..b {
                        axpy(row, 1.0, &dout[(bi * t + ti) * c..][..c]);
                    }
                })
        });
        // Tokens: group rows by token id (stable, so each group sums in row order) and
        // give each distinct token to one task.
        let mut order: Vec<u32> = (0..(b * t) as u32).collect();
        order.sort_by_key(|&i| tokens[i as usize]);
        let groups: Vec<&[u32]> = order
            .chunk_by(|&x, &y| tokens[x as usize] == tokens[y as usize])
            .collect();
        self.pool.install(|| {
            groups.par_iter().for_each(|rows| {
                let row = view_mut(dwte.add(tokens[rows[0] as usize] as usize * c), c);
                for &r in rows.iter() {
                    axpy(row, 1.0, &dout[r as usize * c..][..c]);
                }
            })
        });
    }

    fn matmul_forward(
        &self,
        out: DevPtr,
        inp: DevPtr,
        w: DevPtr,
        bias: Option<DevPtr>,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        if let Some(bias) = bias {
            let bias = view(bias, oc);
            self.pool.install(|| {
                view_mut(out, bt * oc)
                    .par_chunks_mut(oc)
                    .for_each(|row| row.copy_from_slice(bias))
            });
        }
        let (c_, oc_) = (c as isize, oc as isize);
        // out (BT,OC) = inp (BT,C) · wᵀ (C,OC); wᵀ[k][j] = w[j][k].
        self.gemm(bt, oc, c, (out, oc_, 1), (inp, c_, 1), (w, 1, c_), bias.is_some());
    }

    fn matmul_backward(
        &self,
        dinp: DevPtr,
        dw: DevPtr,
        dbias: Option<DevPtr>,
        dout: DevPtr,
        inp: DevPtr,
        w: DevPtr,
        bt: usize,
        c: usize,
        oc: usize,
    ) {
        let (c_, oc_) = (c as isize, oc as isize);
        // dinp (BT,C) += dout (BT,OC) · w (OC,C)
        self.gemm(bt, c, oc, (dinp, c_, 1), (dout, oc_, 1), (w, c_, 1), true);
        // dw (OC,C) += doutᵀ (OC,BT) · inp (BT,C)
        self.gemm(oc, c, bt, (dw, c_, 1), (dout, 1, oc_), (inp, c_, 1), true);
        if let Some(dbias) = dbias {
            let dout = view(dout, bt * oc);
            self.pool.install(|| {
                view_mut(dbias, oc).par_chunks_mut(64).enumerate().for_each(|(j, acc)| {
                    for row in dout.chunks_exact(oc) {
                        axpy(acc, 1.0, &row[j * 64..][..acc.len()]);
                    }
                })
            });
        }
    }

    fn layernorm_forward(
        &self,
        out: DevPtr,
        mean: DevPtr,
        rstd: DevPtr,
        inp: DevPtr,
        w: DevPtr,
        b: DevPtr,
        bt: usize,
        c: usize,
    ) {
        let (inp, w, b) = (view(inp, bt * c), view(w, c), view(b, c));
        let (mean, rstd) = (view_mut(mean, bt), view_mut(rstd, bt));
        self.pool.install(|| {
            view_mut(out, bt * c)
                .par_chunks_mut(c)
                .zip(inp.par_chunks(c))
                .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
                .for_each(|((o, x), (mu, rs))| {
                    let m = x.iter().sum::<f32>() / c as f32;
                    let var = x.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / c as f32;
                    let s = 1.0 / (var + 1e-5).sqrt();
                    for i in 0..c {
                        o[i] = (x[i] - m) * s * w[i] + b[i];
                    }
                    (*mu, *rs) = (m, s);
                })
        });
    }

    fn layernorm_backward(
        &self,
        dinp: DevPtr,
        dw: DevPtr,
        db: DevPtr,
        dout: DevPtr,
        inp: DevPtr,
        w: DevPtr,
        mean: DevPtr,
        rstd: DevPtr,
        bt: usize,
        c: usize,
    ) {
        let (dout, inp, w) = (view(dout, bt * c), view(inp, bt * c), view(w, c));
        let (mean, rstd) = (view(mean, bt), view(rstd, bt));
        self.pool.install(|| {
            // Input gradient: rows are independent.
            view_mut(dinp, bt * c)
                .par_chunks_mut(c)
                .enumerate()
                .for_each(|(r, di)| {
                    let (x, dy) = (&inp[r * c..][..c], &dout[r * c..][..c]);
                    let (m, s) = (mean[r], rstd[r]);
                    let (mut dnorm_mean, mut dnorm_norm_mean) = (0.0f32, 0.0f32);
                    for i in 0..c {
                        let dnorm = w[i] * dy[i];
                        dnorm_mean += dnorm;
                        dnorm_norm_mean += dnorm * (x[i] - m) * s;
                    }
                    dnorm_mean /= c as f32;
                    dnorm_norm_mean /= c as f32;
                    for i in 0..c {
                        let norm = (x[i] - m) * s;
                        di[i] += (w[i] * dy[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
                    }
                });
            // Weight and bias gradients: columns are independent; rows summed in order.
            let (dw, db) = (view_mut(dw, c), view_mut(db, c));
            dw.par_chunks_mut(64)
                .zip(db.par_chunks_mut(64))
                .enumerate()
                .for_each(|(j, (dw, db))| {
                    let j0 = j * 64;
                    for r in 0..bt {
                        let (m, s) = (mean[r], rstd[r]);
                        for i in 0..dw.len() {
                            let (x, dy) = (inp[r * c + j0 + i], dout[r * c + j0 + i]);
                            dw[i] += (x - m) * s * dy;
                            db[i] += dy;
                        }
                    }
                });
        });
    }

    fn attention_saved_len(&self, b: usize, t: usize, nh: usize) -> usize {
        b * nh * t * t // softmax probabilities, (B,NH,T,T)
    }

    fn attention_forward(&self, out: DevPtr, saved: DevPtr, qkv: DevPtr, b: usize, t: usize, c: usize, nh: usize) {
        let hs = c / nh;
        let scale = 1.0 / (hs as f32).sqrt();
        let qkv = view(qkv, b * t * 3 * c);
        let (out, att) = (SyncPtr(out.0 as *mut f32), SyncPtr(saved.0 as *mut f32));
        self.pool.install(|| {
            // One task per (batch, head). Keys are transposed to (hs, T) so each query's
            // scores are built by axpy over contiguous key positions (vectorises).
            (0..b * nh).into_par_iter().for_each(|i| {
                let (bi, h) = (i / nh, i % nh);
                let row = |tj: usize, part: usize| &qkv[(bi * t + tj) * 3 * c + part * c + h * hs..][..hs];
                let kt = transpose_head(t, hs, |tj| row(tj, 1));
                for ti in 0..t {
                    // SAFETY: task (b,h) alone writes att rows (b,h,·) and out[b,·,h*hs..][..hs].
                    let att = unsafe { att.slice((i * t + ti) * t, t) };
                    let out = unsafe { out.slice((bi * t + ti) * c + h * hs, hs) };
                    let (scores, rest) = att.split_at_mut(ti + 1);
                    scores.fill(0.0);
                    for (d, &qd) in row(ti, 0).iter().enumerate() {
                        axpy(scores, qd * scale, &kt[d * t..][..=ti]);
                    }
                    let maxv = scores.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
                    for a in scores.iter_mut() {
                        *a = fastmath::exp(*a - maxv);
                    }
                    let inv = 1.0 / scores.iter().sum::<f32>();
                    out.fill(0.0);
                    for (tj, a) in scores.iter_mut().enumerate() {
                        *a *= inv;
                        axpy(out, *a, row(tj, 2));
                    }
                    rest.fill(0.0);
                }
            })
        });
    }

    fn attention_backward(
        &self,
        dqkv: DevPtr,
        dout: DevPtr,
        qkv: DevPtr,
        _out: DevPtr,
        saved: DevPtr,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        let hs = c / nh;
        let scale = 1.0 / (hs as f32).sqrt();
        let (qkv, dout, att) = (
            view(qkv, b * t * 3 * c),
            view(dout, b * t * c),
            view(saved, b * nh * t * t),
        );
        let dqkv = SyncPtr(dqkv.0 as *mut f32);
        self.pool.install(|| {
            // One task per (batch, head): dk and dv rows collect from every later query,
            // so time runs sequentially inside the task. Values are transposed to (hs, T)
            // and key gradients gathered transposed, so inner loops run over positions.
            (0..b * nh).into_par_iter().for_each(|i| {
                let (bi, h) = (i / nh, i % nh);
                let row = |tj: usize, part: usize| &qkv[(bi * t + tj) * 3 * c + part * c + h * hs..][..hs];
                // SAFETY: task (b,h) alone touches the head-h columns of batch b's rows.
                let drow =
                    |tj: usize, part: usize| unsafe { dqkv.slice((bi * t + tj) * 3 * c + part * c + h * hs, hs) };
                let vt = transpose_head(t, hs, |tj| row(tj, 2));
                let mut dkt = vec![0.0f32; hs * t];
                let mut dpre = vec![0.0f32; t];
                for ti in 0..t {
                    let a = &att[(i * t + ti) * t..][..=ti];
                    let dy = &dout[(bi * t + ti) * c + h * hs..][..hs];
                    // through out = att · v: datt = dy · vᵀ, dv += att ⊗ dy
                    let datt = &mut dpre[..=ti];
                    datt.fill(0.0);
                    for (d, &g) in dy.iter().enumerate() {
                        axpy(datt, g, &vt[d * t..][..=ti]);
                    }
                    for (tj, &aj) in a.iter().enumerate() {
                        axpy(drow(tj, 2), aj, dy);
                    }
                    // through the softmax: dpre = a ⊙ (datt − Σ a·datt), then the scale
                    let s = dot(a, datt);
                    for (dp, &aj) in datt.iter_mut().zip(a) {
                        *dp = aj * (*dp - s) * scale;
                    }
                    // through scores = q · kᵀ
                    let dq = drow(ti, 0);
                    for (tj, &dp) in datt.iter().enumerate() {
                        axpy(dq, dp, row(tj, 1));
                    }
                    for (d, &qd) in row(ti, 0).iter().enumerate() {
                        axpy(&mut dkt[d * t..][..=ti], qd, datt);
                    }
                }
                for tj in 0..t {
                    let dk = drow(tj, 1);
                    for d in 0..hs {
                        dk[d] += dkt[d * t + tj];
                    }
                }
            })
        });
    }

    fn gelu_forward(&self, out: DevPtr, inp: DevPtr, n: usize) {
        let inp = view(inp, n);
        self.pool.install(|| {
            view_mut(out, n)
                .par_chunks_mut(CHUNK)
                .zip(inp.par_chunks(CHUNK))
                .for_each(|(o, x)| {
                    for (o, &x) in o.iter_mut().zip(x) {
                        *o = 0.5 * x * (1.0 + fastmath::tanh(GELU_SCALE * (x + 0.044715 * x * x * x)));
                    }
                })
        });
    }

    fn gelu_backward(&self, dinp: DevPtr, inp: DevPtr, dout: DevPtr, n: usize) {
        let (inp, dout) = (view(inp, n), view(dout, n));
        self.pool.install(|| {
            view_mut(dinp, n)
                .par_chunks_mut(CHUNK)
                .zip(inp.par_chunks(CHUNK).zip(dout.par_chunks(CHUNK)))
                .for_each(|(d, (x, dy))| {
                    for ((d, &x), &dy) in d.iter_mut().zip(x).zip(dy) {
                        let u = GELU_SCALE * (x + 0.044715 * x * x * x);
                        let th = fastmath::tanh(u);
                        let sech2 = 1.0 - th * th;
                        let grad = 0.5 * (1.0 + th) + 0.5 * x * sech2 * GELU_SCALE * (1.0 + 3.0 * 0.044715 * x * x);
                        *d += grad * dy;
                    }
                })
        });
    }

    fn crossentropy_forward(&self, losses: DevPtr, logits: DevPtr, targets: DevPtr, bt: usize, v: usize, vp: usize) {
        let (logits, targets) = (view(logits, bt * vp), view_i32(targets, bt));
        self.pool.install(|| {
            view_mut(losses, bt).par_iter_mut().enumerate().for_each(|(r, loss)| {
                let row = &logits[r * vp..][..v];
                let maxv = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let sum = sum_exp(row, maxv);
                *loss = maxv + sum.ln() - row[targets[r] as usize];
            })
        });
    }

    fn crossentropy_backward(
        &self,
        dlogits: DevPtr,
        logits: DevPtr,
        targets: DevPtr,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let (logits, targets) = (view(logits, bt * vp), view_i32(targets, bt));
        self.pool.install(|| {
            view_mut(dlogits, bt * vp)
                .par_chunks_mut(vp)
                .enumerate()
                .for_each(|(r, d)| {
                    let row = &logits[r * vp..][..v];
                    let maxv = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    let sum = sum_exp(row, maxv);
                    let inv = 1.0 / sum;
                    for i in 0..v {
                        d[i] += (fastmath::exp(row[i] - maxv) * inv - (i == targets[r] as usize) as u8 as f32) * dloss;
                    }
                })
        });
    }

    fn crossentropy_backward_in_place(
        &self,
        logits: DevPtr,
        losses: DevPtr,
        targets: DevPtr,
        dloss: f32,
        bt: usize,
        v: usize,
        vp: usize,
    ) {
        let (losses, targets) = (view(losses, bt), view_i32(targets, bt));
        self.pool.install(|| {
            view_mut(logits, bt * vp)
                .par_chunks_mut(vp)
                .enumerate()
                .for_each(|(r, row)| {
                    let target = targets[r] as usize;
                    let lse = losses[r] + row[target]; // loss = log-sum-exp - logit[target]
                    for (i, x) in row[..v].iter_mut().enumerate() {
                        *x = (fastmath::exp(*x - lse) - (i == target) as u8 as f32) * dloss;
                    }
                    row[v..].fill(0.0);
                })
        });
    }

    fn mean(&self, out: DevPtr, inp: DevPtr, n: usize) {
        let s: f64 = view(inp, n).iter().map(|&x| x as f64).sum();
        view_mut(out, 1)[0] = (s / n as f64) as f32;
    }

    fn sum_squares(&self, out: DevPtr, inp: DevPtr, n: usize) {
        let inp = view(inp, n);
        let partials: Vec<f64> = self.pool.install(|| {
            inp.par_chunks(CHUNK)
                .map(|c| c.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>())
                .collect()
        });
        view_mut(out, 1)[0] += partials.iter().sum::<f64>() as f32;
    }

    fn clip_factor(&self, out: DevPtr, sumsq: DevPtr, max_norm: f32) {
        let norm = view(sumsq, 1)[0].sqrt();
        let out = view_mut(out, 2);
        out[0] = norm;
        out[1] = if max_norm > 0.0 && norm > max_norm {
            max_norm / (norm + 1e-6)
        } else {
            1.0
        };
    }

    fn adamw(&self, params: DevPtr, grads: DevPtr, m: DevPtr, v: DevPtr, n: usize, grad_scale: DevPtr, hp: AdamWStep) {
        let scale = view(grad_scale, 1)[0];
        let (grads, ms, vs) = (view(grads, n), view_mut(m, n), view_mut(v, n));
        let bc1 = 1.0 - hp.beta1.powi(hp.t as i32);
        let bc2 = 1.0 - hp.beta2.powi(hp.t as i32);
        self.pool.install(|| {
            view_mut(params, n)
                .par_chunks_mut(CHUNK)
                .zip(grads.par_chunks(CHUNK))
                .zip(ms.par_chunks_mut(CHUNK).zip(vs.par_chunks_mut(CHUNK)))
                .for_each(|((p, g), (m, v))| {
                    for i in 0..p.len() {
                        let g = g[i] * scale;
                        m[i] = hp.beta1 * m[i] + (1.0 - hp.beta1) * g;
                        v[i] = hp.beta2 * v[i] + (1.0 - hp.beta2) * g * g;
                        let (mhat, vhat) = (m[i] / bc1, v[i] / bc2);
                        p[i] -= hp.lr * (mhat / (vhat.sqrt() + hp.eps) + hp.weight_decay * p[i]);
                    }
                })
        });
    }
}

/// A raw pointer that parallel tasks may share when each writes a disjoint region.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}
impl SyncPtr {
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice<'a>(&self, offset: usize, n: usize) -> &'a mut [f32] {
        std::slice::from_raw_parts_mut(self.0.add(offset), n)
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
