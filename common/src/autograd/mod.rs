//! Reverse-mode autograd over a tape of coarse ops (about ten per transformer block).
//! A [`Graph`] lives for one forward/backward pass: each op runs its forward kernel at
//! once and appends a node; [`Graph::backward`] walks the tape in reverse and calls
//! each op's backward kernel, which accumulates into the inputs' gradients.
//!
//! Memory: activations, saved state and activation gradients come from a [`Pool`], a
//! caching allocator that outlives the graph, so after the first step no op allocates.
//! An activation's gradient goes back to the pool as soon as its producer's backward
//! has consumed it (or passes to an input of an add, whose gradient is the same), and the
//! logits' gradient overwrites the logits when nothing else reads them. Parameters are
//! views into the model's flat parameter buffer, and their gradients are views into the
//! flat gradient buffer, borrowed for the graph's lifetime.
//!
//! Safety: the graph makes the spans the backend's ops take of memory it owns or borrows
//! for its lifetime `'a`: pooled buffers (values, saved state, token ids, gradients), which
//! it never frees, only holds or gives back to the pool it borrows for `'a`, and parameters
//! and their gradients, spans of the model's buffers. The ops check every span's extent
//! against their dimensions and that nothing they write overlaps another operand, so the
//! only `unsafe` left here is where pooled words become spans, and the calls whose contract
//! is about values no shape can check: token and target ids below the rows of their
//! table, a position inside the key/value cache (see [`crate::backend`]'s contract).

mod backward;
mod kv_cache;
mod pool;

pub use kv_cache::KvCache;
pub use pool::Pool;

use crate::backend::{
    bf16, check_range, token_order, Act, ActType, Backend, DevPtr, DeviceBuffer, Fp8, Fp8Out, Fp8Slot, Overwrite, Span,
};
use crate::error::{Error, Result};
use crate::model::Fp8Site;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// A training pass's language-model head whose logits would take more than this many bytes
/// runs over equal row chunks of at most this size ([`Graph::lm_head`]): GPT-2's logits are the
/// largest activation (1.6 GB at B=16, T=1024 in bf16), and only a chunk is needed at once.
/// Each chunk after the first reads and writes the embedding's f32 gradient once more (at GPT-2
/// 124M on an H200 about 0.1 ms, 0.3% of a step), so chunks are large.
pub const LM_HEAD_CHUNK_BYTES: usize = 1 << 30;

/// Handle to a value in a [`Graph`]: an index, cheap to copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor(usize);

/// What a value is, which fixes its element type and its gradient's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A view of the model's weights, in the activation type; its gradient is f32, a view
    /// of the flat gradient buffer.
    Param,
    /// An op's output, in the activation type; so is its pooled gradient.
    Activation,
    /// An f32 result (the mean loss): read, never back-propagated through.
    Scalar,
}

/// What a training pass computes again in backward instead of keeping from the forward pass
/// (`--recompute`): less memory, a little more time; the results are the same, bit for bit,
/// where the kernels that compute them again are the forward's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Recompute {
    /// Keep every activation that backward reads.
    #[default]
    None,
    /// The layernorms' outputs (two of a GPT-2 block's five (B·T, C) activations), from the
    /// kept input and statistics.
    Layernorm,
    /// The layernorms' and the GELUs' outputs (in GPT-2 about a third of the activations).
    All,
}

/// How to compute a value again (`--recompute`): its producer's forward, from inputs that
/// are kept.
#[derive(Clone, Copy, Debug)]
enum Rebuild<'a> {
    Gelu {
        inp: Tensor,
    },
    LayerNorm {
        inp: Tensor,
        w: Tensor,
        b: Tensor,
        mean: Span<'a>,
        rstd: Span<'a>,
    },
}

struct Value<'a> {
    /// The data, rows·cols elements: activations for parameters and activations; for
    /// scalars, f32s (as their 4-byte [`Span::act`] view, read back with [`Span::cast`]).
    /// A recomputed value's data lives in a scratch buffer it shares with others of its size.
    data: Span<'a, Act>,
    /// Set for values the graph does not keep (`--recompute`): how to compute them again.
    rebuild: Option<Rebuild<'a>>,
    /// (rows, cols): every activation here is a matrix, e.g. (B·T, C).
    shape: [usize; 2],
    /// The gradient, rows·cols elements: for parameters f32s (fixed; their 4-byte
    /// [`Span::act`] view), for activations activation-typed and pooled.
    grad: Option<Span<'a, Act>>,
    kind: Kind,
    /// Its memory went back to the pool ([`Graph::release`]): the data must not be read.
    released: bool,
}

/// One recorded op: what its backward needs (inputs, saved state, dimensions).
#[derive(Clone, Copy, Debug)]
enum Op<'a> {
    Encoder {
        tokens: Span<'a, i32>,
        /// Positions sorted by token, for the backward's fixed summation order.
        order: Option<Span<'a, i32>>,
        wte: Tensor,
        wpe: Tensor,
        b: usize,
        t: usize,
    },
    Matmul {
        inp: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
        /// Products in FP8 ([`Graph::matmul_fp8`]): the weight's copies and the scale slots.
        fp8: Option<Fp8Site<'a>>,
    },
    LayerNorm {
        inp: Tensor,
        w: Tensor,
        b: Tensor,
        mean: Span<'a>,
        rstd: Span<'a>,
    },
    Attention {
        qkv: Tensor,
        saved: Span<'a>,
        b: usize,
        t: usize,
        nh: usize,
    },
    Gelu {
        inp: Tensor,
    },
    /// The transformer's MLP, gelu(inp · w_fcᵀ + b_fc) · w_projᵀ + b_proj: one op so that a
    /// backend can fuse GELU into both products. `pre` (the first product) and `act` (its
    /// GELU) are values of the graph but not on the tape; `act` is recomputed under
    /// `--recompute`.
    Mlp {
        inp: Tensor,
        w_fc: Tensor,
        b_fc: Option<Tensor>,
        pre: Tensor,
        act: Tensor,
        w_proj: Tensor,
        b_proj: Option<Tensor>,
        /// Products in FP8 ([`Graph::mlp_fp8`]): the first's site, then the second's.
        fp8: Option<[Fp8Site<'a>; 2]>,
    },
    Relu {
        inp: Tensor,
    },
    Add {
        a: Tensor,
        b: Tensor,
    },
    /// The residual connection and the layernorm after it, one op with two outputs: `sum =
    /// a + b` (the residual stream, a value of the graph but not on the tape) and the node's
    /// output, `layernorm(sum)` (not kept under `--recompute`: computed again from `sum`).
    /// Backward adds the layernorm's input gradient into the sum's and hands that to both
    /// inputs without a separate accumulate ([`Backend::add_layernorm_backward`]).
    AddLayerNorm {
        a: Tensor,
        b: Tensor,
        sum: Tensor,
        w: Tensor,
        bias: Tensor,
        mean: Span<'a>,
        rstd: Span<'a>,
    },
    CrossEntropy {
        logits: Tensor,
        targets: Span<'a, i32>,
        /// (R) per-row losses, which the in-place backward reads.
        losses: Span<'a>,
        v: usize,
        /// The backward seed the forward already applied (`Graph::with_loss_seed`): the
        /// logits hold their gradient from the forward pass on.
        fused: Option<f32>,
    },
    /// The language-model head and its loss in one, over row chunks, in a training forward
    /// pass whose seed is known ([`Graph::lm_head`]): each chunk's logits are computed, turned
    /// into their gradient in place, and multiplied out into `h`'s gradient and `w`'s before
    /// the next chunk takes the same memory. So the (R, Vp) logits never exist whole, and the
    /// backward has nothing left to do but check the seed. `w`'s gradient was WRITTEN by the
    /// first chunk when `fresh` (the step's first pass; see [`Graph::with_fresh_gradients`]),
    /// else added to.
    LmHeadLoss {
        h: Tensor,
        w: Tensor,
        applied: f32,
        fresh: bool,
    },
    /// Not an op: a label the forward pass left on the tape (e.g. "block l starts here").
    /// Reached in reverse, it means every op recorded after it has run its backward.
    Mark {
        label: usize,
    },
}

struct Node<'a> {
    op: Op<'a>,
    out: Tensor,
}

pub struct Graph<'a, B: Backend> {
    be: &'a B,
    pool: &'a mut Pool<B>,
    values: Vec<Value<'a>>,
    tape: Vec<Node<'a>>,
    /// Buffers owned for the graph's lifetime (activations, saved state, token ids).
    held: Vec<B::Buffer<f32>>,
    /// Pooled gradient buffers of activations, by value index.
    grads: HashMap<usize, B::Buffer<f32>>,
    record: bool,
    /// `--recompute`: the outputs it names are not kept for backward, but written to a
    /// scratch buffer (one per size, shared) and computed again when backward needs them.
    recompute: Recompute,
    /// The recompute scratch buffers by size in words, with the value each holds now.
    scratch: HashMap<usize, (Span<'a>, Option<Tensor>)>,
    /// FP8 operands' scratch by size in bytes ([`Graph::matmul_fp8`]).
    fp8_scratch: HashMap<usize, Span<'a, u8>>,
    /// Transposed FP8 operands' scratch (the weight gradients' products) by size in bytes and
    /// place (two of one size may be alive at once).
    fp8_scratch_t: HashMap<(usize, usize), Span<'a, u8>>,
    /// Tensors whose op also wrote their FP8 copy for the product that reads them next (in
    /// the scratch of its size, until another operand takes it), its transposed copy where the
    /// op wrote one too (a gradient, for the weight gradient's product), and the slot they were
    /// scaled by ([`Graph::add_layernorm`], [`Graph::attention`], attention's backward).
    fp8_copies: HashMap<usize, Fp8Copies<'a>>,
    /// FP8 products' inputs whose transposed E4M3 copy the forward pass kept for the weight
    /// gradient's product, with the slot it was scaled by ([`Graph::add_layernorm`],
    /// [`Graph::attention`], [`Graph::matmul_fp8`]).
    fp8_kept_t: HashMap<usize, (Span<'a, u8>, DevPtr)>,
    /// A word for an amax that no slot takes (`Graph::fp8_discard`), once asked for.
    fp8_discard: Option<Span<'a>>,
    /// Token ids uploaded before the step, when it is recorded ([`Graph::with_tokens`]).
    staged: Option<&'a TokenStage<B>>,
    /// The backward seed, when known before the forward pass ([`Graph::with_loss_seed`]).
    loss_seed: Option<f32>,
    /// Parameter gradients left unzeroed for their first writer, a product, to WRITE
    /// ([`Graph::zero_grads_except_first_products`]): address -> (the gradient, the product's
    /// place on the tape); each leaves as it is written.
    first_writes: HashMap<u64, (Span<'a>, usize)>,
    /// This pass's gradient writes are the step's first ([`Graph::with_fresh_gradients`]).
    fresh_gradients: bool,
    /// Rows of the language-model head taken at a time in a training pass ([`Graph::lm_head`]);
    /// `None`: the fewest equal chunks of at most [`LM_HEAD_CHUNK_BYTES`] of logits.
    lm_head_rows: Option<usize>,
    /// Products (by output value) whose bias gradient the backward of the one op reading
    /// their output has already summed from that output's gradient as it wrote it (the
    /// `dbias` of [`Backend::add_layernorm_backward`] and
    /// [`Backend::attention_backward`]): their own backward leaves the bias out.
    bias_summed: HashSet<usize>,
}

/// A position in a generated sequence: on the host for checks, in backend memory for the
/// kernels ([`Graph::position`]), where it stays (held by its graph, or staged) for `'a`.
#[derive(Clone, Copy, Debug)]
pub struct Position<'a> {
    pub at: usize,
    dev: Span<'a, i32>,
}

/// Token ids at fixed device memory, for a step recorded once and replayed: before each step
/// the trainer uploads its ids here ([`TokenStage::stage`]), in the order the step's graph asks
/// for them, and a graph given the stage ([`Graph::with_tokens`]) hands out these instead of
/// uploading its own (an upload cannot be part of a recording). Each request is checked
/// against what was staged, so a staging order that no longer matches the model's fails
/// loudly instead of reading the wrong ids.
pub struct TokenStage<B: Backend> {
    buf: Option<B::Buffer<i32>>,
    /// What was uploaded, with its offset in the buffer, in order.
    staged: Vec<(usize, Vec<i32>)>,
    next: Cell<usize>,
}

impl<B: Backend> Default for TokenStage<B> {
    fn default() -> Self {
        TokenStage {
            buf: None,
            staged: Vec::new(),
            next: Cell::new(0),
        }
    }
}

impl<B: Backend> TokenStage<B> {
    /// Uploads `arrays` into one buffer (grown when they do not fit), to be handed out in
    /// this order.
    pub fn stage(&mut self, be: &B, arrays: Vec<Vec<i32>>) -> Result<()> {
        let total: usize = arrays.iter().map(Vec::len).sum();
        if self.buf.as_ref().is_none_or(|buf| buf.len() < total) {
            self.buf = None;
            self.buf = Some(be.alloc(total)?);
        }
        let buf = self.buf.as_ref().expect("allocated above");
        let mut at = 0;
        self.staged.clear();
        for ids in arrays {
            be.write(buf, at, &ids)?;
            let len = ids.len();
            self.staged.push((at, ids));
            at += len;
        }
        self.next.set(0);
        Ok(())
    }

    /// Where the ids live (a recording that read them elsewhere must be made again).
    pub fn addr(&self) -> u64 {
        self.buf.as_ref().map_or(0, |buf| buf.ptr().addr())
    }

    /// The next staged array, which must be `ids`.
    fn take(&self, ids: &[i32]) -> Result<Span<'_, i32>> {
        let i = self.next.get();
        match (self.staged.get(i), &self.buf) {
            (Some((at, staged)), Some(buf)) if staged.as_slice() == ids => {
                self.next.set(i + 1);
                Ok(buf.span().slice(*at, ids.len()))
            }
            _ => Err(Error::Device(format!(
                "the step asked for token ids ({} of them, request {i}) other than those staged for it: \
                 the trainer's staging order does not match the model's",
                ids.len()
            ))),
        }
    }
}

impl<'a, B: Backend> Graph<'a, B> {
    /// `record = false` runs forward only (evaluation, generation): no tape is kept.
    pub fn new(be: &'a B, pool: &'a mut Pool<B>, record: bool) -> Self {
        Graph {
            be,
            pool,
            values: Vec::new(),
            tape: Vec::new(),
            held: Vec::new(),
            grads: HashMap::new(),
            record,
            recompute: Recompute::None,
            scratch: HashMap::new(),
            fp8_scratch: HashMap::new(),
            fp8_scratch_t: HashMap::new(),
            fp8_kept_t: HashMap::new(),
            fp8_discard: None,
            fp8_copies: HashMap::new(),
            staged: None,
            loss_seed: None,
            first_writes: HashMap::new(),
            fresh_gradients: false,
            lm_head_rows: None,
            bias_summed: HashSet::new(),
        }
    }

    /// This pass is the step's first (its first micro-batch): a gradient that the forward pass
    /// itself computes ([`Graph::lm_head`]) is written over the parameter's slot rather than
    /// added to it, as the products of backward write theirs after
    /// [`Graph::zero_grads_except_first_products`].
    pub fn with_fresh_gradients(mut self, fresh: bool) -> Self {
        self.fresh_gradients = fresh;
        self
    }

    /// The language-model head of a training pass takes `rows` rows at a time (tests; by
    /// default the fewest equal chunks of at most [`LM_HEAD_CHUNK_BYTES`] of logits).
    pub fn with_lm_head_rows(mut self, rows: usize) -> Self {
        self.lm_head_rows = Some(rows.max(1));
        self
    }

    /// The seed the training step will pass to [`Graph::backward`], known before the forward
    /// pass: the loss then computes its logits' gradient in the same pass
    /// ([`Backend::crossentropy_fused`]), overwriting the logits, which nothing else may read.
    pub fn with_loss_seed(mut self, seed: f32) -> Self {
        self.loss_seed = self.record.then_some(seed);
        self
    }

    /// Token ids come from `stage` (uploaded before the step) instead of being uploaded here.
    pub fn with_tokens(mut self, stage: &'a TokenStage<B>) -> Self {
        self.staged = Some(stage);
        self
    }

    /// Trades speed for memory: the outputs `what` names are computed again in backward
    /// instead of kept (training graphs only). The results are the same, bit for bit, when
    /// the kernels that compute them again are the forward's: not when the backend fused
    /// GELU into the MLP's first product (its epilogue may round GELU otherwise than
    /// `gelu_forward`, which computes it again), where they agree to that rounding.
    pub fn with_recompute(mut self, what: Recompute) -> Self {
        self.recompute = if self.record { what } else { Recompute::None };
        self
    }

    pub fn backend(&self) -> &'a B {
        self.be
    }

    /// The address of a parameter's or an activation's data.
    pub fn ptr(&self, x: Tensor) -> DevPtr<Act> {
        self.span(x).ptr()
    }

    /// The data of a parameter or an activation: rows·cols activations.
    fn span(&self, x: Tensor) -> Span<'a, Act> {
        assert_ne!(
            self.values[x.0].kind,
            Kind::Scalar,
            "span: an f32 scalar has no activation data"
        );
        assert!(!self.values[x.0].released, "span: the value's memory was released");
        self.values[x.0].data
    }

    /// The data of an f32 scalar value.
    fn scalar_span(&self, x: Tensor) -> Span<'a> {
        assert_eq!(self.values[x.0].kind, Kind::Scalar, "not an f32 scalar");
        self.values[x.0].data.cast()
    }

    fn act(&self) -> ActType {
        self.be.act()
    }

    pub fn shape(&self, x: Tensor) -> [usize; 2] {
        self.values[x.0].shape
    }

    /// A parameter of `shape` at `range` of the model's flat buffers, borrowed for the
    /// graph's lifetime: the forward pass reads `params` (f32), or under a bf16 backend their
    /// bf16 `copy`; the gradient accumulates at the same range of `grads` (when given).
    pub fn param(
        &mut self,
        params: &'a B::Buffer<f32>,
        copy: Option<&'a B::Buffer<bf16>>,
        grads: Option<&'a B::Buffer<f32>>,
        range: Range<usize>,
        shape: [usize; 2],
    ) -> Result<Tensor> {
        assert_eq!(range.len(), shape[0] * shape[1], "param: range and shape differ");
        let data = match (self.act(), copy) {
            (ActType::F32, _) => {
                check_range("parameter", params.len(), range.start, range.len())?;
                params.span().slice(range.start, range.len()).act()
            }
            (ActType::Bf16, Some(copy)) => {
                check_range("parameter (bf16 copy)", copy.len(), range.start, range.len())?;
                copy.span().slice(range.start, range.len()).act()
            }
            (ActType::Bf16, None) => {
                return Err(Error::Device(
                    "a bf16 backend reads the parameters' bf16 copy, and none was given".into(),
                ))
            }
        };
        if let Some(g) = grads {
            check_range("parameter gradient", g.len(), range.start, range.len())?;
        }
        let grad = grads.map(|g| g.span().slice(range.start, range.len()).act());
        Ok(self.push(data, shape, grad, Kind::Param))
    }

    /// Copies token ids to backend memory for the graph's lifetime.
    fn tokens(&mut self, ids: &[i32]) -> Result<Span<'a, i32>> {
        if let Some(stage) = self.staged {
            return stage.take(ids);
        }
        let (buf, words) = self.take_pooled(ids.len())?;
        self.held.push(buf);
        let buf = self.held.last().expect("pushed above");
        // The ids' bits, as the 4-byte words the pool holds.
        self.be.write(buf, 0, bytemuck::cast_slice(ids))?;
        Ok(words.cast())
    }

    /// Copies the first `dst.len()` values of `x` into `dst` (as f32, whatever `x` holds).
    pub fn read(&self, x: Tensor, dst: &mut [f32]) -> Result<()> {
        let [r, c] = self.shape(x);
        check_range("read", r * c, 0, dst.len())?;
        match self.values[x.0].kind {
            Kind::Scalar => {
                let src = self.scalar_span(x);
                // SAFETY: `src` holds r·c f32s, live for 'a (checked above against `dst`).
                unsafe { self.be.download(src.ptr(), dst) }
            }
            Kind::Param | Kind::Activation => self.be.download_act(self.span(x), dst),
        }
    }

    /// Copies activation `x` into the start of `dst` (activation words), on the device: for a
    /// value wanted after the graph is gone (a recorded step's output).
    pub fn copy_act_into(&self, x: Tensor, dst: &B::Buffer<f32>) -> Result<()> {
        let [r, c] = self.shape(x);
        check_range("copy", dst.len(), 0, self.act().words(r * c))?;
        let (to, from) = (self.as_act(dst.span(), r * c), self.span(x));
        self.be.zero_act(to, r * c);
        self.be.accumulate_act(to, from, r * c);
        Ok(())
    }

    /// Writes the f32 scalar `x` over `dst[at..at + len(x)]`, or adds it there when `add`
    /// (the loss, into the optimiser's stats).
    pub fn copy_into(&self, x: Tensor, dst: &B::Buffer<f32>, at: usize, add: bool) -> Result<()> {
        let [r, c] = self.shape(x);
        check_range("copy", dst.len(), at, r * c)?;
        let (to, src) = (dst.span().slice(at, r * c), self.scalar_span(x));
        if !add {
            self.be.zero(to, r * c);
        }
        self.be.accumulate(to, src, r * c);
        Ok(())
    }

    fn push(&mut self, data: Span<'a, Act>, shape: [usize; 2], grad: Option<Span<'a, Act>>, kind: Kind) -> Tensor {
        self.values.push(Value {
            data,
            rebuild: None,
            shape,
            grad,
            kind,
            released: false,
        });
        Tensor(self.values.len() - 1)
    }

    /// Gives activation `x`'s memory back to the pool now, for the next value of its size:
    /// the caller promises that nothing reads x's data again, neither a later op nor any
    /// backward. True of a matrix product's or the MLP's output once [`Graph::add_layernorm`]
    /// has summed it into the residual stream: their backwards read their inputs, not their
    /// outputs, and add_layernorm's reads its sum (a transformer block's two projections: 2 of
    /// its 17 (B·T, C)-sized activations, 6% of GPT-2 124M's peak in bf16 at B=16, T=1024).
    /// Its gradient is unaffected. A value in a `--recompute` scratch stays where it is.
    pub fn release(&mut self, x: Tensor) {
        let v = &self.values[x.0];
        if v.kind != Kind::Activation || v.rebuild.is_some() || v.released {
            return;
        }
        if let Some(i) = self.held.iter().position(|buf| buf.ptr().addr() == v.data.ptr().addr()) {
            let buf = self.held.swap_remove(i);
            self.pool.give(buf);
            self.values[x.0].released = true;
        }
    }

    /// A buffer of at least `words` 4-byte words from the pool, and a span of its first
    /// `words`, which stays valid for `'a` wherever the buffer goes from here: the one place
    /// where the graph's memory becomes spans.
    fn take_pooled(&mut self, words: usize) -> Result<(B::Buffer<f32>, Span<'a>)> {
        let buf = self.pool.take(self.be, words)?;
        // SAFETY: the buffer holds `buf.len()` words of the backend's memory, and the graph
        // never frees a pooled buffer: it holds it (`held`, `grads`) or gives it back to the
        // pool, which it borrows exclusively for 'a. So the memory lives for 'a.
        let span = unsafe { Span::from_raw(buf.ptr(), buf.len()) };
        Ok((buf, span.slice(0, words)))
    }

    /// The first `n` activations of the backend's type in `words`.
    fn as_act<'s>(&self, words: Span<'s>, n: usize) -> Span<'s, Act> {
        words.words_as(self.act(), n)
    }

    /// A pooled buffer of `words` 4-byte words, held for the graph's lifetime.
    fn alloc_words(&mut self, words: usize) -> Result<Span<'a>> {
        let (buf, span) = self.take_pooled(words)?;
        self.held.push(buf);
        Ok(span)
    }

    /// `n` bytes (FP8 copies), pooled in whole words, held for the graph's lifetime.
    fn alloc_bytes(&mut self, n: usize) -> Result<Span<'a, u8>> {
        Ok(self.alloc_words(n.div_ceil(4))?.words_as_bytes().slice(0, n))
    }

    /// `n` f32 values (saved statistics, losses) for the graph's lifetime.
    fn alloc_f32(&mut self, n: usize) -> Result<Span<'a>> {
        self.alloc_words(n)
    }

    /// A new activation of `shape`, held for the graph's lifetime.
    fn activation(&mut self, shape: [usize; 2]) -> Result<Tensor> {
        let n = shape[0] * shape[1];
        let words = self.alloc_words(self.act().words(n))?;
        Ok(self.push(self.as_act(words, n), shape, None, Kind::Activation))
    }

    /// As [`Graph::activation`] for a value that `--recompute` does not keep: its data goes
    /// to the shared scratch of its size (taken over from whichever value held it).
    fn activation_recomputed(&mut self, shape: [usize; 2], rebuild: Rebuild<'a>) -> Result<Tensor> {
        let wanted = match rebuild {
            Rebuild::LayerNorm { .. } => self.recompute != Recompute::None,
            Rebuild::Gelu { .. } => self.recompute == Recompute::All,
        };
        if !wanted {
            return self.activation(shape);
        }
        self.activation_unkept_written(shape, rebuild)
    }

    /// [`Graph::activation_unkept`] whose producer writes it into the scratch next.
    fn activation_unkept_written(&mut self, shape: [usize; 2], rebuild: Rebuild<'a>) -> Result<Tensor> {
        let out = self.activation_unkept(shape, rebuild)?;
        self.scratch_written(out);
        Ok(out)
    }

    /// A value the graph does not keep, whatever `--recompute` says: its data is the shared
    /// scratch of its size, which it does not hold yet (the scratch keeps its holder until
    /// something writes the value there: [`Graph::scratch_written`], or [`Graph::data`]).
    fn activation_unkept(&mut self, shape: [usize; 2], rebuild: Rebuild<'a>) -> Result<Tensor> {
        let n = shape[0] * shape[1];
        let words = self.act().words(n);
        let scratch = match self.scratch.get(&words) {
            Some(&(scratch, _)) => scratch,
            None => {
                let scratch = self.alloc_words(words)?;
                self.scratch.insert(words, (scratch, None));
                scratch
            }
        };
        let out = self.push(self.as_act(scratch, n), shape, None, Kind::Activation);
        self.values[out.0].rebuild = Some(rebuild);
        Ok(out)
    }

    /// Recomputed value `x` is being written into its scratch (which then holds it): its data.
    fn scratch_written(&mut self, x: Tensor) -> Span<'a, Act> {
        self.scratch_holder(x, Some(x));
        self.span(x)
    }

    /// Recomputed value `x`'s scratch has been written with what may be no value's data: it
    /// holds none now (the next read of a value there computes it again).
    fn scratch_clobbered(&mut self, x: Tensor) {
        self.scratch_holder(x, None);
    }

    fn scratch_holder(&mut self, x: Tensor, holder: Option<Tensor>) {
        let [r, c] = self.shape(x);
        let words = self.act().words(r * c);
        let (scratch, _) = self.scratch[&words];
        self.scratch.insert(words, (scratch, holder));
    }

    /// `op`'s output: a new activation, recorded on the tape.
    fn output(&mut self, shape: [usize; 2], op: Op<'a>) -> Result<Tensor> {
        let out = self.activation(shape)?;
        self.record_op(op, out);
        Ok(out)
    }

    /// As [`Graph::output`] for a value that `--recompute` does not keep.
    fn output_recomputed(&mut self, shape: [usize; 2], op: Op<'a>, rebuild: Rebuild<'a>) -> Result<Tensor> {
        let out = self.activation_recomputed(shape, rebuild)?;
        self.record_op(op, out);
        Ok(out)
    }

    fn record_op(&mut self, op: Op<'a>, out: Tensor) {
        if self.record {
            self.tape.push(Node { op, out });
        }
    }

    /// The data of `x`, computed again first when it is a recomputed value whose scratch now
    /// holds another one (backward reads inputs through this).
    fn data(&mut self, x: Tensor) -> Span<'a, Act> {
        let out = self.span(x);
        let Some(rebuild) = self.values[x.0].rebuild else {
            return out;
        };
        let [r, c] = self.shape(x);
        let words = self.act().words(r * c);
        let (scratch, holder) = self.scratch[&words];
        if holder != Some(x) {
            // The forward call that made `x` again: it writes the same values.
            match rebuild {
                Rebuild::Gelu { inp } => self.be.gelu_forward(out, self.span(inp), r * c),
                Rebuild::LayerNorm { inp, w, b, mean, rstd } => {
                    let (inp, w, b) = (self.span(inp), self.span(w), self.span(b));
                    self.be.layernorm_forward(out, mean, rstd, inp, w, b, r, c)
                }
            }
            self.scratch.insert(words, (scratch, Some(x)));
        }
        out
    }

    // ---- ops ------------------------------------------------------------------------

    /// `rows` × `cols` values from the host (inputs that are not token ids: the MLP's
    /// pixels), as an activation that no op produced: backward ends there.
    pub fn input(&mut self, data: &[f32], rows: usize, cols: usize) -> Result<Tensor> {
        assert_eq!(data.len(), rows * cols, "input: {rows} × {cols} values expected");
        let words = self.alloc_words(self.act().words(data.len()))?;
        let x = self.as_act(words, data.len());
        self.be.upload_act(x, data)?;
        Ok(self.push(x, [rows, cols], None, Kind::Activation))
    }

    /// The position a generation step starts at, uploaded (or staged) once for the ops that
    /// read it on the device ([`Graph::encoder`], [`Graph::attention_cached`]).
    pub fn position(&mut self, at: usize) -> Result<Position<'a>> {
        let id = i32::try_from(at).map_err(|_| Error::Input(format!("position {at} is out of range")))?;
        Ok(Position {
            at,
            dev: self.tokens(&[id])?,
        })
    }

    /// `(B·T, C) = wte[ids] + wpe[p..p + T]`, for `ids` (B·T) rows of `wte`; `p` is 0, or
    /// `first`'s position (generation: read on the device).
    pub fn encoder(
        &mut self,
        ids: &[i32],
        first: Option<Position<'a>>,
        wte: Tensor,
        wpe: Tensor,
        b: usize,
        t: usize,
    ) -> Result<Tensor> {
        let ([rows, c], [positions, pc]) = (self.shape(wte), self.shape(wpe));
        let p = first.map_or(0, |f| f.at);
        assert!(pc == c && p + t <= positions, "encoder: position table too small");
        assert!(
            first.is_none() || !self.record,
            "encoder: a first position is for forward-only graphs"
        );
        assert_eq!(ids.len(), b * t, "encoder: ids must be B·T");
        check_ids("token id", ids, rows)?;
        let tokens = self.tokens(ids)?;
        // The summation order of the backward (none without one).
        let order = self.record.then(|| self.tokens(&token_order(ids))).transpose()?;
        let out = self.output(
            [b * t, c],
            Op::Encoder {
                tokens,
                order,
                wte,
                wpe,
                b,
                t,
            },
        )?;
        let (x, wte, wpe) = (self.span(out), self.span(wte), self.span(wpe));
        // SAFETY: every id is a row of wte, and wpe has rows for positions p..p + T (both
        // checked above); `first.dev` holds p.
        unsafe {
            self.be
                .encoder_forward(x, tokens, first.map(|f| f.dev), wte, wpe, b, t, c)
        };
        Ok(out)
    }

    /// Whether this graph records a tape for backward (a training pass).
    pub fn records(&self) -> bool {
        self.record
    }

    /// inp (R, C) · wᵀ (C, OC) + bias → (R, OC).
    pub fn matmul(&mut self, inp: Tensor, w: Tensor, bias: Option<Tensor>) -> Result<Tensor> {
        self.product(inp, w, bias, None)
    }

    /// [`Graph::matmul`] with the product in FP8 (`--precision fp8`): the input quantized to
    /// E4M3 at its slot's scale (recording its amax), times the weight's E4M3 copy, both
    /// scaled back in the product. Backward: the output gradient in E5M2 times the weight's
    /// transposed copy gives the input gradient; the output gradient's and the input's
    /// transposed copies give the weight gradient. Training graphs only (R a multiple of 16).
    pub fn matmul_fp8(&mut self, inp: Tensor, w: Tensor, bias: Option<Tensor>, site: Fp8Site<'a>) -> Result<Tensor> {
        assert!(self.record, "matmul_fp8 is for training graphs");
        self.product(inp, w, bias, Some(site))
    }

    fn product(&mut self, inp: Tensor, w: Tensor, bias: Option<Tensor>, fp8: Option<Fp8Site<'a>>) -> Result<Tensor> {
        let ([r, c], [oc, wc]) = (self.shape(inp), self.shape(w));
        assert_eq!(c, wc, "matmul: inner dimensions differ");
        if let Some(b) = bias {
            assert_eq!(self.shape(b), [1, oc], "matmul: bias must be (1, OC)");
        }
        let out = self.output([r, oc], Op::Matmul { inp, w, bias, fp8 })?;
        let bias = bias.map(|b| self.span(b));
        let x = self.data(inp);
        match fp8 {
            None => self.be.matmul_forward(self.span(out), x, self.span(w), bias, r, c, oc),
            Some(site) => {
                let xq = self.quantize_input(site, inp, [r, c])?;
                let (dequant, formats) = (site.dequant(), [Fp8::E4M3; 2]);
                self.be
                    .matmul_fp8(self.span(out), xq, site.weight, bias, dequant, [r, oc, c], formats);
            }
        }
        Ok(out)
    }

    /// `n` bytes of FP8 scratch, shared by every FP8 operand of that size: each is read by the
    /// one product right after its quantization, in stream order.
    fn fp8_scratch(&mut self, n: usize) -> Result<Span<'a, u8>> {
        self.fp8_copies.retain(|_, (copy, _, _)| copy.len() != n); // overwritten from now on
        if let Some(&scratch) = self.fp8_scratch.get(&n) {
            return Ok(scratch);
        }
        let scratch = self.alloc_bytes(n)?;
        self.fp8_scratch.insert(n, scratch);
        Ok(scratch)
    }

    /// A word that an FP8 copy's amax may go to where no slot should take it: a copy of values
    /// that its slot has already seen in another rounding (the hidden activation rebuilt from
    /// the rounded pre-activation).
    pub(super) fn fp8_discard(&mut self) -> Result<Span<'a>> {
        if let Some(word) = self.fp8_discard {
            return Ok(word);
        }
        let word = self.alloc_f32(1)?;
        self.fp8_discard = Some(word);
        Ok(word)
    }

    /// `n` bytes of scratch for a transposed FP8 operand at `place` (0 or 1: two of a size may
    /// be alive at once), each read by the one weight-gradient product after it.
    pub(super) fn fp8_scratch_t(&mut self, n: usize, place: usize) -> Result<Span<'a, u8>> {
        if let Some(&scratch) = self.fp8_scratch_t.get(&(n, place)) {
            return Ok(scratch);
        }
        let scratch = self.alloc_bytes(n)?;
        self.fp8_scratch_t.insert((n, place), scratch);
        Ok(scratch)
    }

    pub fn layernorm(&mut self, inp: Tensor, w: Tensor, b: Tensor) -> Result<Tensor> {
        let [r, c] = self.shape(inp);
        assert!(
            self.shape(w) == [1, c] && self.shape(b) == [1, c],
            "layernorm: w and b must be (1, C)"
        );
        let (mean, rstd) = (self.alloc_f32(r)?, self.alloc_f32(r)?);
        let rebuild = Rebuild::LayerNorm { inp, w, b, mean, rstd };
        let out = self.output_recomputed([r, c], Op::LayerNorm { inp, w, b, mean, rstd }, rebuild)?;
        let x = self.data(inp);
        self.be
            .layernorm_forward(self.span(out), mean, rstd, x, self.span(w), self.span(b), r, c);
        Ok(out)
    }

    /// Causal self-attention over qkv (B·T, 3C) with `nh` heads → (B·T, C). With `fp8` (the
    /// site of the FP8 product that reads the output next, in a training graph), the op also
    /// writes the output's E4M3 copy at that site's input scale
    /// ([`Backend::attention_forward_quantize`]), which that product reads instead of
    /// quantizing, and its transposed copy, kept for that product's weight gradient.
    pub fn attention(
        &mut self,
        qkv: Tensor,
        b: usize,
        t: usize,
        nh: usize,
        fp8: Option<Fp8Site<'a>>,
    ) -> Result<Tensor> {
        let [r, c3] = self.shape(qkv);
        assert!(r == b * t && c3 % 3 == 0, "attention: qkv must be (B·T, 3C)");
        let c = c3 / 3;
        assert!(nh > 0 && c % nh == 0, "attention: {nh} heads do not divide C = {c}");
        let saved = self.alloc_f32(self.be.attention_saved_len(b, t, nh))?;
        let out = self.output([r, c], Op::Attention { qkv, saved, b, t, nh })?;
        let x = self.data(qkv);
        match fp8 {
            None => self.be.attention_forward(self.span(out), saved, x, b, t, c, nh),
            Some(site) => {
                let (q, kept_t) = self.written_input_fp8(out, site, r * c)?;
                let be = self.be;
                be.attention_forward_quantize(self.span(out), saved, x, [b, t, c, nh], q, kept_t);
            }
        }
        Ok(out)
    }

    /// Causal self-attention of `T` new positions of one sequence, qkv (T, 3C), against block
    /// `layer`'s rows of `cache`, which already hold positions `0..pos`: the new keys and
    /// values are stored at `pos..pos + T`, and each new query attends over every position up
    /// to its own → (T, C). Forward-only graphs (generation).
    pub fn attention_cached(
        &mut self,
        qkv: Tensor,
        cache: &'a KvCache<B>,
        layer: usize,
        pos: Position<'a>,
        nh: usize,
    ) -> Result<Tensor> {
        assert!(!self.record, "attention_cached is for forward-only graphs");
        let [t, c3] = self.shape(qkv);
        assert!(c3 % 3 == 0, "attention_cached: qkv must be (T, 3C)");
        let c = c3 / 3;
        assert!(
            nh > 0 && c % nh == 0,
            "attention_cached: {nh} heads do not divide C = {c}"
        );
        assert!(
            cache.width() == c && layer < cache.layers(),
            "attention_cached: the cache does not fit the model"
        );
        check_range("key/value cache", cache.rows(), pos.at, t)?;
        let rows = cache.rows();
        let (k, v) = cache.spans(layer);
        let (k, v) = (self.as_act(k, rows * c), self.as_act(v, rows * c));
        let out = self.activation([t, c])?;
        let x = self.data(qkv);
        // SAFETY: `pos.dev` holds `pos.at`, and pos + T ≤ rows (checked above).
        unsafe {
            self.be
                .attention_cached_forward(self.span(out), k, v, rows, x, pos.dev, t, c, nh)
        };
        Ok(out)
    }

    pub fn gelu(&mut self, inp: Tensor) -> Result<Tensor> {
        let shape = self.shape(inp);
        let out = self.output_recomputed(shape, Op::Gelu { inp }, Rebuild::Gelu { inp })?;
        let x = self.data(inp);
        self.be.gelu_forward(self.span(out), x, shape[0] * shape[1]);
        Ok(out)
    }

    /// The transformer's MLP sub-block as one op: `gelu(inp · w_fcᵀ + b_fc) · w_projᵀ + b_proj`,
    /// (R, C) → (R, OC), with w_fc (H, C) and w_proj (OC, H). The same values as
    /// `matmul`, `gelu`, `matmul`, but the backend may fuse GELU into the first product's
    /// epilogue and gelu' into the backward product that reaches the hidden layer
    /// ([`Backend::matmul_gelu_forward`], [`Backend::matmul_backward_dgelu`]), and the
    /// gradient of the GELU output is never stored. Under `--recompute` the GELU output is
    /// not kept: backward computes it again from the pre-activation with `gelu_forward`.
    pub fn mlp(
        &mut self,
        inp: Tensor,
        w_fc: Tensor,
        b_fc: Option<Tensor>,
        w_proj: Tensor,
        b_proj: Option<Tensor>,
    ) -> Result<Tensor> {
        self.mlp_op(inp, [w_fc, w_proj], [b_fc, b_proj], None)
    }

    /// [`Graph::mlp`] with both products in FP8 (as [`Graph::matmul_fp8`]'s, `sites` the
    /// first's and the second's), GELU in the first's epilogue where the backend fuses it
    /// ([`Backend::matmul_fp8_gelu`]). Training graphs only.
    pub fn mlp_fp8(
        &mut self,
        inp: Tensor,
        [w_fc, w_proj]: [Tensor; 2],
        [b_fc, b_proj]: [Option<Tensor>; 2],
        sites: [Fp8Site<'a>; 2],
    ) -> Result<Tensor> {
        assert!(self.record, "mlp_fp8 is for training graphs");
        self.mlp_op(inp, [w_fc, w_proj], [b_fc, b_proj], Some(sites))
    }

    fn mlp_op(
        &mut self,
        inp: Tensor,
        [w_fc, w_proj]: [Tensor; 2],
        [b_fc, b_proj]: [Option<Tensor>; 2],
        fp8: Option<[Fp8Site<'a>; 2]>,
    ) -> Result<Tensor> {
        let ([r, c], [h, fc_c], [oc, proj_h]) = (self.shape(inp), self.shape(w_fc), self.shape(w_proj));
        assert_eq!(c, fc_c, "mlp: the first product's inner dimensions differ");
        assert_eq!(h, proj_h, "mlp: the second product's inner dimensions differ");
        if let Some(b) = b_fc {
            assert_eq!(self.shape(b), [1, h], "mlp: b_fc must be (1, H)");
        }
        if let Some(b) = b_proj {
            assert_eq!(self.shape(b), [1, oc], "mlp: b_proj must be (1, OC)");
        }
        let pre = self.activation([r, h])?;
        // A recomputed input of the hidden layer's size would share act's scratch: keep act then.
        // FP8 keeps act only as the second product's E4M3 input: backward rebuilds its
        // transposed E4M3 copy from pre for the weight gradient's product.
        let words = |n: usize| self.act().words(n);
        let act = if fp8.is_some() {
            assert_ne!(
                h, c,
                "mlp_fp8: the FP8 copies of the input and the hidden layer share scratch by size"
            );
            self.activation_unkept([r, h], Rebuild::Gelu { inp: pre })?
        } else if self.values[inp.0].rebuild.is_some() && words(r * c) == words(r * h) {
            self.activation([r, h])?
        } else {
            self.activation_recomputed([r, h], Rebuild::Gelu { inp: pre })?
        };
        let op = Op::Mlp {
            inp,
            w_fc,
            b_fc,
            pre,
            act,
            w_proj,
            b_proj,
            fp8,
        };
        let out = self.output([r, oc], op)?;
        let (b_fc, b_proj) = (b_fc.map(|b| self.span(b)), b_proj.map(|b| self.span(b)));
        let x = self.data(inp);
        let hidden = act; // the tensor, whose FP8 copy the second product reads
        let (pre, act) = (self.span(pre), self.span(act));
        let Some([fc, proj]) = fp8 else {
            self.be.matmul_gelu_forward(pre, act, x, self.span(w_fc), b_fc, r, c, h);
            self.be
                .matmul_forward(self.span(out), act, self.span(w_proj), b_proj, r, h, oc);
            return Ok(out);
        };
        let xq = self.quantize_input(fc, inp, [r, c])?;
        let aq = self.input_fp8_out(proj, r * h)?;
        self.be
            .matmul_fp8_gelu(pre, act, aq, xq, fc.weight, b_fc, fc.dequant(), [r, h, c]);
        self.scratch_clobbered(hidden); // act's scratch, which the backend may have used
        let formats = [Fp8::E4M3; 2];
        self.be.matmul_fp8(
            self.span(out),
            aq.dst,
            proj.weight,
            b_proj,
            proj.dequant(),
            [r, oc, h],
            formats,
        );
        Ok(out)
    }

    /// An FP8 product's input `inp` (R,C) in E4M3 at its site's scale, its amax recorded: the
    /// copy its op wrote ([`Graph::add_layernorm`], [`Graph::attention`]), else quantized now
    /// into the scratch of its size, with its transposed copy kept for the weight gradient's
    /// product in the same pass.
    fn quantize_input(&mut self, site: Fp8Site<'a>, inp: Tensor, [r, c]: [usize; 2]) -> Result<Span<'a, u8>> {
        match self.fp8_copies.remove(&inp.0) {
            Some((copy, _, slot)) if slot == site.input.ptr() => return Ok(copy),
            _ => {}
        }
        let q = self.input_fp8_out(site, r * c)?;
        let t = self.fp8_kept_t_buffer(inp, site, r * c)?;
        let x = self.data(inp);
        self.be
            .quantize_fp8_both([q.dst, t], q.amax, x, q.scale, [r, c], q.format);
        Ok(q.dst)
    }

    /// Where the op that makes `x` (n values) writes its E4M3 copies for `site`'s product: the
    /// copy as stored (the scratch of its size, which that product reads instead of quantizing)
    /// and transposed (kept for the weight gradient's product), both recorded for them.
    fn written_input_fp8(&mut self, x: Tensor, site: Fp8Site<'a>, n: usize) -> Result<(Fp8Out<'a>, Span<'a, u8>)> {
        let q = self.input_fp8_out(site, n)?;
        let t = self.fp8_kept_t_buffer(x, site, n)?;
        self.fp8_copies.insert(x.0, (q.dst, None, site.input.ptr()));
        Ok((q, t))
    }

    /// A buffer, held for the graph's lifetime, for the transposed E4M3 copy (n bytes) of FP8
    /// product input `x`, which that product's weight gradient reads in backward
    /// (`Graph::quantize_input_transposed`).
    fn fp8_kept_t_buffer(&mut self, x: Tensor, site: Fp8Site<'a>, n: usize) -> Result<Span<'a, u8>> {
        let t = self.alloc_bytes(n)?;
        self.fp8_kept_t.insert(x.0, (t, site.input.ptr()));
        Ok(t)
    }

    /// Where an FP8 product's input (n values) goes in E4M3, at its site's scale, its amax
    /// recorded: the scratch of its size.
    fn input_fp8_out(&mut self, site: Fp8Site<'a>, n: usize) -> Result<Fp8Out<'a>> {
        self.fp8_out(site.input, Fp8::E4M3, n)
    }

    /// `n` values in `format` at `slot`'s scale, their amax recorded there: the scratch of
    /// that size.
    pub(super) fn fp8_out(&mut self, slot: Span<'a>, format: Fp8, n: usize) -> Result<Fp8Out<'a>> {
        Ok(fp8_out_at(self.fp8_scratch(n)?, slot, format))
    }

    /// max(x, 0), elementwise (the MLP workload's activation).
    pub fn relu(&mut self, inp: Tensor) -> Result<Tensor> {
        let shape = self.shape(inp);
        let out = self.output(shape, Op::Relu { inp })?;
        let x = self.data(inp);
        self.be.relu_forward(self.span(out), x, shape[0] * shape[1]);
        Ok(out)
    }

    pub fn add(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        let shape = self.shape(a);
        assert_eq!(shape, self.shape(b), "add: shapes differ");
        let n = shape[0] * shape[1];
        let recomputed = |x: Tensor| self.values[x.0].rebuild.is_some();
        assert!(
            !(recomputed(a) && recomputed(b)),
            "add: two recomputed inputs of one size would share a scratch buffer"
        );
        let out = self.output(shape, Op::Add { a, b })?;
        let (a, b) = (self.data(a), self.data(b));
        self.be.add(self.span(out), a, b, n);
        Ok(out)
    }

    /// The residual connection and the layernorm that reads it, as one op: returns `(sum,
    /// normed)` with `sum = a + b` and `normed = layernorm(sum; w, bias)`, the values of `add`
    /// then `layernorm` (the CPU computes them with exactly those ops). A backend may compute
    /// both in one pass over `a` and `b` ([`Backend::add_layernorm_forward`]), and in backward
    /// the layernorm's input gradient goes into the residual stream's in the pass that
    /// computes it. Under `--recompute`, `normed` is not kept: backward computes it again from
    /// `sum` with `layernorm_forward`. With `fp8` (the site of the FP8 product that reads
    /// `normed` next, in a training graph), the op also writes `normed`'s E4M3 copy at that
    /// site's input scale ([`Backend::add_layernorm_forward_quantize`]), which that product
    /// reads instead of quantizing, and its transposed copy, kept for that product's weight
    /// gradient; `normed` itself is then not kept (as under `--recompute`), since nothing in
    /// backward reads it.
    pub fn add_layernorm(
        &mut self,
        a: Tensor,
        b: Tensor,
        w: Tensor,
        bias: Tensor,
        fp8: Option<Fp8Site<'a>>,
    ) -> Result<(Tensor, Tensor)> {
        let shape @ [r, c] = self.shape(a);
        assert_eq!(shape, self.shape(b), "add_layernorm: shapes differ");
        assert!(
            self.shape(w) == [1, c] && self.shape(bias) == [1, c],
            "add_layernorm: w and bias must be (1, C)"
        );
        let (a_recomputed, b_recomputed) = (self.values[a.0].rebuild.is_some(), self.values[b.0].rebuild.is_some());
        assert!(
            !(a_recomputed && b_recomputed),
            "add_layernorm: two recomputed inputs of one size would share a scratch buffer"
        );
        let sum = self.activation(shape)?;
        let (mean, rstd) = (self.alloc_f32(r)?, self.alloc_f32(r)?);
        let op = Op::AddLayerNorm {
            a,
            b,
            sum,
            w,
            bias,
            mean,
            rstd,
        };
        // A recomputed input sits in the scratch of this size, which `normed` would take over.
        let rebuild = Rebuild::LayerNorm {
            inp: sum,
            w,
            b: bias,
            mean,
            rstd,
        };
        let normed = if a_recomputed || b_recomputed {
            self.output(shape, op)?
        } else if fp8.is_some() {
            let out = self.activation_unkept_written(shape, rebuild)?;
            self.record_op(op, out);
            out
        } else {
            self.output_recomputed(shape, op, rebuild)?
        };
        let (x, y) = (self.data(a), self.data(b));
        let (s, n, w, bias) = (self.span(sum), self.span(normed), self.span(w), self.span(bias));
        match fp8 {
            None => self.be.add_layernorm_forward(s, n, mean, rstd, x, y, w, bias, r, c),
            Some(site) => {
                let (q, t) = self.written_input_fp8(normed, site, r * c)?;
                let be = self.be;
                be.add_layernorm_forward_quantize([s, n], mean, rstd, [x, y], w, bias, [r, c], q, Some(t));
            }
        }
        Ok((sum, normed))
    }

    /// The tied language-model head `h (R, C) · wᵀ (C, Vp)` and, with `targets`, the mean
    /// cross-entropy over the first `v` columns: (the logits, the loss). In a training pass
    /// whose seed is known ([`Graph::with_loss_seed`]) and whose logits would be large, the
    /// two run together over row chunks (`Op::LmHeadLoss`) and no logits are returned;
    /// otherwise as [`Graph::matmul`] then [`Graph::cross_entropy`].
    pub fn lm_head(
        &mut self,
        h: Tensor,
        w: Tensor,
        targets: Option<&[i32]>,
        v: usize,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let ([r, _], [vp, _]) = (self.shape(h), self.shape(w));
        let bytes = self.act().words(vp) * 4;
        // As few chunks as keep each within LM_HEAD_CHUNK_BYTES, of equal rows.
        let chunks = (r * bytes).div_ceil(LM_HEAD_CHUNK_BYTES).max(1);
        let rows = self.lm_head_rows.unwrap_or(r.div_ceil(chunks));
        let chunked = self.loss_seed.is_some()
            && rows < r
            && self.values[w.0].grad.is_some()
            && self.values[h.0].grad.is_none()
            && !self.is_param(h);
        match targets {
            Some(targets) if chunked => Ok((None, Some(self.lm_head_loss(h, w, targets, v, rows)?))),
            _ => {
                let logits = self.matmul(h, w, None)?;
                let loss = targets.map(|tg| self.cross_entropy(logits, tg, v)).transpose()?;
                Ok((Some(logits), loss))
            }
        }
    }

    /// [`Op::LmHeadLoss`]: the head, the loss and both gradients, `rows` rows at a time.
    fn lm_head_loss(&mut self, h: Tensor, w: Tensor, targets: &[i32], v: usize, rows: usize) -> Result<Tensor> {
        let ([r, c], [vp, wc]) = (self.shape(h), self.shape(w));
        assert_eq!(c, wc, "lm_head: inner dimensions differ");
        assert!(
            v <= vp && targets.len() == r,
            "lm_head: {r} targets below {v} ≤ Vp = {vp} expected"
        );
        check_ids("target id", targets, v)?;
        let targets = self.tokens(targets)?;
        let (losses, mean) = (self.alloc_f32(r)?, self.alloc_f32(1)?);
        let out = self.push(mean.act(), [1, 1], None, Kind::Scalar);
        let applied = self.loss_seed.expect("lm_head chunks only with a known seed") / r as f32;
        let fresh = self.fresh_gradients;
        self.record_op(Op::LmHeadLoss { h, w, applied, fresh }, out);
        // One chunk's logits, then their gradient: the pool has the memory back at the end.
        let (scratch_buf, words) = self.take_pooled(self.act().words(rows * vp))?;
        let scratch = self.as_act(words, rows * vp);
        let dh = self.act_grad_overwritten(h)?;
        let dw = self.values[w.0].grad.expect("checked by lm_head").cast::<f32>();
        let (x, wd) = (self.data(h), self.span(w));
        for start in (0..r).step_by(rows) {
            let n = rows.min(r - start);
            let (logits, xs) = (scratch.slice(0, n * vp), x.slice(start * c, n * c));
            self.be.matmul_forward(logits, xs, wd, None, n, c, vp);
            // SAFETY: every target is below v (checked above).
            unsafe {
                self.be.crossentropy_fused(
                    losses.slice(start, n),
                    logits,
                    targets.slice(start, n),
                    applied,
                    n,
                    v,
                    vp,
                )
            };
            let overwrite = Overwrite {
                dinp: true,
                dw: fresh && start == 0,
            };
            let dxs = dh.slice(start * c, n * c);
            self.be
                .matmul_backward(overwrite, dxs, dw, None, logits, xs, wd, n, c, vp);
        }
        self.pool.give(scratch_buf);
        self.be.mean(mean, losses, r);
        Ok(out)
    }

    /// Mean cross-entropy of logits (R, Vp) against `targets` (R ids below `v` ≤ Vp) → (1, 1).
    pub fn cross_entropy(&mut self, logits: Tensor, targets: &[i32], v: usize) -> Result<Tensor> {
        let [r, vp] = self.shape(logits);
        assert!(
            v <= vp && targets.len() == r,
            "cross_entropy: {r} targets below {v} ≤ Vp = {vp} expected"
        );
        check_ids("target id", targets, v)?;
        let targets = self.tokens(targets)?;
        let losses = self.alloc_f32(r)?;
        let mean = self.alloc_f32(1)?;
        let out = self.push(mean.act(), [1, 1], None, Kind::Scalar);
        // The gradient in the same pass when the seed is known and the logits are an
        // activation of this graph (its backward checks that nothing else read them).
        let fused = self
            .loss_seed
            .filter(|_| !self.is_param(logits))
            .map(|seed| seed / r as f32);
        if self.record {
            let op = Op::CrossEntropy {
                logits,
                targets,
                losses,
                v,
                fused,
            };
            self.tape.push(Node { op, out });
        }
        let x = self.data(logits);
        // SAFETY: every target is below v (checked above).
        unsafe {
            match fused {
                Some(dloss) => self.be.crossentropy_fused(losses, x, targets, dloss, r, v, vp),
                None => self.be.crossentropy_forward(losses, x, targets, r, v, vp),
            }
        }
        self.be.mean(mean, losses, r);
        Ok(out)
    }

    /// Rows `start..start+n` of `x` as a new value sharing its memory. Forward only
    /// (used to run the LM head on the last position when generating).
    pub fn rows(&mut self, x: Tensor, start: usize, n: usize) -> Tensor {
        assert!(!self.record, "rows() views are for forward-only graphs");
        let [r, c] = self.shape(x);
        assert!(start + n <= r);
        let kind = self.values[x.0].kind;
        let data = match kind {
            Kind::Scalar => self.scalar_span(x).slice(start * c, n * c).act(),
            Kind::Param | Kind::Activation => self.span(x).slice(start * c, n * c),
        };
        self.push(data, [n, c], None, kind)
    }

    /// Leaves `label` on the tape; `backward_with` reports it once everything recorded
    /// after it has back-propagated (so gradients used only after it are final).
    pub fn mark(&mut self, label: usize) {
        if self.record {
            let out = Tensor(usize::MAX);
            self.tape.push(Node {
                op: Op::Mark { label },
                out,
            });
        }
    }

    /// Is `x` a parameter (memory owned outside the graph)?
    pub fn is_param(&self, x: Tensor) -> bool {
        self.values[x.0].kind == Kind::Param
    }
}

/// Every id must index one of `n` rows: an Input error names the first that does not.
pub(crate) fn check_ids(what: &str, ids: &[i32], n: usize) -> Result<()> {
    match ids.iter().position(|&id| id < 0 || id as usize >= n) {
        Some(i) => Err(Error::Input(format!(
            "{what} {} at position {i} is outside the vocabulary of {n}",
            ids[i]
        ))),
        None => Ok(()),
    }
}
impl<B: Backend> Drop for Graph<'_, B> {
    fn drop(&mut self) {
        for buf in self.held.drain(..).chain(self.grads.drain().map(|(_, b)| b)) {
            self.pool.give(buf);
        }
    }
}

/// A tensor's FP8 copy, its transposed one where written, and the scale slot of both.
type Fp8Copies<'a> = (Span<'a, u8>, Option<Span<'a, u8>>, DevPtr);

/// `dst` in `format` at `slot`'s scale, its amax recorded there.
pub(super) fn fp8_out_at<'a>(dst: Span<'a, u8>, slot: Span<'a>, format: Fp8) -> Fp8Out<'a> {
    let word = Fp8Site::word;
    Fp8Out {
        dst,
        amax: word(slot, Fp8Slot::AMAX),
        scale: word(slot, Fp8Slot::SCALE),
        format,
    }
}
