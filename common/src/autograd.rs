//! Reverse-mode autograd over a tape of coarse ops (about ten per transformer block).
//! A [`Graph`] lives for one forward/backward pass: each op runs its forward kernel at
//! once and appends a [`Node`]; [`Graph::backward`] walks the tape in reverse and calls
//! each op's backward kernel, which accumulates into the inputs' gradients.
//!
//! Memory: activations, saved state and activation gradients come from a [`Pool`], a
//! caching allocator that outlives the graph, so after the first step no op allocates.
//! An activation's gradient goes back to the pool as soon as its producer's backward
//! has consumed it (or passes to an input of an add, whose gradient is the same), and the
//! logits' gradient overwrites the logits when nothing else reads them. Parameters are
//! views into the model's flat parameter buffer, and their gradients are views into the
//! flat gradient buffer.

use crate::backend::{Backend, DevPtr, DeviceBuffer};
use crate::error::Result;
use std::collections::HashMap;

/// Handle to a value in a [`Graph`]: an index, cheap to copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor(usize);

struct Value {
    ptr: DevPtr,
    /// (rows, cols): every activation here is a matrix, e.g. (B·T, C).
    shape: [usize; 2],
    /// Gradient location: fixed for parameters, pooled for activations.
    grad: Option<DevPtr>,
    is_param: bool,
}

/// One recorded op: what its backward needs (inputs, saved state, dimensions).
#[derive(Clone, Copy, Debug)]
enum Op {
    Encoder {
        tokens: DevPtr,
        wte: Tensor,
        wpe: Tensor,
        b: usize,
        t: usize,
    },
    Matmul {
        inp: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
    },
    LayerNorm {
        inp: Tensor,
        w: Tensor,
        b: Tensor,
        mean: DevPtr,
        rstd: DevPtr,
    },
    Attention {
        qkv: Tensor,
        saved: DevPtr,
        b: usize,
        t: usize,
        nh: usize,
    },
    Gelu {
        inp: Tensor,
    },
    Add {
        a: Tensor,
        b: Tensor,
    },
    CrossEntropy {
        logits: Tensor,
        targets: DevPtr,
        /// (R) per-row losses, which the in-place backward reads.
        losses: DevPtr,
        v: usize,
    },
    /// Not an op: a label the forward pass left on the tape (e.g. "block l starts here").
    /// Reached in reverse, it means every op recorded after it has run its backward.
    Mark {
        label: usize,
    },
}

struct Node {
    op: Op,
    out: Tensor,
}

/// Size classes for pooled buffers: exact below 4096 words, else rounded up to the next
/// eighth of a power of two (at most 12.5% waste), so varying sizes (generation grows T
/// by one each token) still reuse buffers.
fn size_class(n: usize) -> usize {
    if n <= 4096 {
        return n.max(1);
    }
    let step = 1usize << (usize::BITS - n.leading_zeros() - 4);
    n.div_ceil(step) * step
}

/// Caching allocator: buffers handed back are kept by size class and reused.
pub struct Pool<B: Backend> {
    free: HashMap<usize, Vec<B::Buffer>>,
}

impl<B: Backend> Default for Pool<B> {
    fn default() -> Self {
        Pool { free: HashMap::new() }
    }
}

impl<B: Backend> Pool<B> {
    fn take(&mut self, be: &B, n: usize) -> Result<B::Buffer> {
        let class = size_class(n);
        match self.free.get_mut(&class).and_then(|v| v.pop()) {
            Some(buf) => Ok(buf),
            None => be.alloc(class),
        }
    }

    fn give(&mut self, buf: B::Buffer) {
        self.free.entry(buf.len()).or_default().push(buf);
    }
}

pub struct Graph<'a, B: Backend> {
    be: &'a B,
    pool: &'a mut Pool<B>,
    values: Vec<Value>,
    tape: Vec<Node>,
    /// Buffers owned for the graph's lifetime (activations, saved state, token ids).
    held: Vec<B::Buffer>,
    /// Pooled gradient buffers of activations, by value index.
    grads: HashMap<usize, B::Buffer>,
    record: bool,
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
        }
    }

    pub fn backend(&self) -> &'a B {
        self.be
    }

    pub fn ptr(&self, x: Tensor) -> DevPtr {
        self.values[x.0].ptr
    }

    pub fn shape(&self, x: Tensor) -> [usize; 2] {
        self.values[x.0].shape
    }

    /// A parameter: memory owned by the caller, gradient accumulated at `grad` (if any).
    pub fn param(&mut self, ptr: DevPtr, grad: Option<DevPtr>, shape: [usize; 2]) -> Tensor {
        self.push(ptr, shape, grad, true)
    }

    /// Copies token ids to backend memory for the graph's lifetime.
    pub fn tokens(&mut self, ids: &[i32]) -> Result<DevPtr> {
        let p = self.alloc(ids.len())?;
        self.be.upload_i32(p, ids)?;
        Ok(p)
    }

    fn push(&mut self, ptr: DevPtr, shape: [usize; 2], grad: Option<DevPtr>, is_param: bool) -> Tensor {
        self.values.push(Value {
            ptr,
            shape,
            grad,
            is_param,
        });
        Tensor(self.values.len() - 1)
    }

    fn alloc(&mut self, n: usize) -> Result<DevPtr> {
        let buf = self.pool.take(self.be, n)?;
        let p = buf.ptr();
        self.held.push(buf);
        Ok(p)
    }

    fn output(&mut self, shape: [usize; 2], op: Op) -> Result<Tensor> {
        let p = self.alloc(shape[0] * shape[1])?;
        let out = self.push(p, shape, None, false);
        if self.record {
            self.tape.push(Node { op, out });
        }
        Ok(out)
    }

    // ---- ops ------------------------------------------------------------------------

    /// (B·T, C) = wte[tokens] + wpe[0..T].
    pub fn encoder(&mut self, tokens: DevPtr, wte: Tensor, wpe: Tensor, b: usize, t: usize) -> Result<Tensor> {
        let c = self.shape(wte)[1];
        assert!(
            self.shape(wpe)[1] == c && t <= self.shape(wpe)[0],
            "encoder: position table too small"
        );
        let out = self.output([b * t, c], Op::Encoder { tokens, wte, wpe, b, t })?;
        self.be
            .encoder_forward(self.ptr(out), tokens, self.ptr(wte), self.ptr(wpe), b, t, c);
        Ok(out)
    }

    /// inp (R, C) · wᵀ (C, OC) + bias → (R, OC).
    pub fn matmul(&mut self, inp: Tensor, w: Tensor, bias: Option<Tensor>) -> Result<Tensor> {
        let ([r, c], [oc, wc]) = (self.shape(inp), self.shape(w));
        assert_eq!(c, wc, "matmul: inner dimensions differ");
        let out = self.output([r, oc], Op::Matmul { inp, w, bias })?;
        let bias_ptr = bias.map(|b| self.ptr(b));
        self.be
            .matmul_forward(self.ptr(out), self.ptr(inp), self.ptr(w), bias_ptr, r, c, oc);
        Ok(out)
    }

    pub fn layernorm(&mut self, inp: Tensor, w: Tensor, b: Tensor) -> Result<Tensor> {
        let [r, c] = self.shape(inp);
        let (mean, rstd) = (self.alloc(r)?, self.alloc(r)?);
        let out = self.output([r, c], Op::LayerNorm { inp, w, b, mean, rstd })?;
        self.be
            .layernorm_forward(self.ptr(out), mean, rstd, self.ptr(inp), self.ptr(w), self.ptr(b), r, c);
        Ok(out)
    }

    /// Causal self-attention over qkv (B·T, 3C) with `nh` heads → (B·T, C).
    pub fn attention(&mut self, qkv: Tensor, b: usize, t: usize, nh: usize) -> Result<Tensor> {
        let [r, c3] = self.shape(qkv);
        assert!(r == b * t && c3 % 3 == 0, "attention: qkv must be (B·T, 3C)");
        let c = c3 / 3;
        let saved = self.alloc(self.be.attention_saved_len(b, t, nh))?;
        let out = self.output([r, c], Op::Attention { qkv, saved, b, t, nh })?;
        self.be
            .attention_forward(self.ptr(out), saved, self.ptr(qkv), b, t, c, nh);
        Ok(out)
    }

    pub fn gelu(&mut self, inp: Tensor) -> Result<Tensor> {
        let shape = self.shape(inp);
        let out = self.output(shape, Op::Gelu { inp })?;
        self.be.gelu_forward(self.ptr(out), self.ptr(inp), shape[0] * shape[1]);
        Ok(out)
    }

    pub fn add(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        let shape = self.shape(a);
        assert_eq!(shape, self.shape(b), "add: shapes differ");
        let n = shape[0] * shape[1];
        let out = self.output(shape, Op::Add { a, b })?;
        self.be.add(self.ptr(out), self.ptr(a), self.ptr(b), n);
        Ok(out)
    }

    /// Mean cross-entropy of logits (R, Vp) against `targets` (R i32 ids < `v`) → (1, 1).
    pub fn cross_entropy(&mut self, logits: Tensor, targets: DevPtr, v: usize) -> Result<Tensor> {
        let [r, vp] = self.shape(logits);
        let losses = self.alloc(r)?;
        let out = self.output(
            [1, 1],
            Op::CrossEntropy {
                logits,
                targets,
                losses,
                v,
            },
        )?;
        self.be
            .crossentropy_forward(losses, self.ptr(logits), targets, r, v, vp);
        self.be.mean(self.ptr(out), losses, r);
        Ok(out)
    }

    /// Rows `start..start+n` of `x` as a new value sharing its memory. Forward only
    /// (used to run the LM head on the last position when generating).
    pub fn rows(&mut self, x: Tensor, start: usize, n: usize) -> Tensor {
        assert!(!self.record, "rows() views are for forward-only graphs");
        let [r, c] = self.shape(x);
        assert!(start + n <= r);
        let p = self.ptr(x).add(start * c);
        self.push(p, [n, c], None, false)
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

    // ---- backward -------------------------------------------------------------------

    /// Gradient slot of `x`, allocated (zeroed) from the pool on first use.
    fn grad_slot(&mut self, x: Tensor) -> Result<DevPtr> {
        if let Some(g) = self.values[x.0].grad {
            return Ok(g);
        }
        let [r, c] = self.values[x.0].shape;
        let buf = self.pool.take(self.be, r * c)?;
        self.be.zero(buf.ptr(), r * c);
        let g = buf.ptr();
        self.grads.insert(x.0, buf);
        self.values[x.0].grad = Some(g);
        Ok(g)
    }

    /// Gives `out`'s pooled gradient buffer to the first of `heirs` that is an activation with
    /// no gradient yet, when that gradient equals `out`'s (an add's inputs): no zero fill and
    /// no copy. `out`'s producer is running its backward, the buffer's last reader. Returns
    /// the heir.
    fn hand_down(&mut self, out: Tensor, heirs: [Tensor; 2]) -> Option<Tensor> {
        let heir = heirs
            .into_iter()
            .find(|&x| !self.is_param(x) && self.values[x.0].grad.is_none())?;
        let buf = self.grads.remove(&out.0)?;
        self.values[out.0].grad = None;
        self.values[heir.0].grad = Some(buf.ptr());
        self.grads.insert(heir.0, buf);
        Some(heir)
    }

    /// Back-propagates from `loss` (the last op, a cross-entropy) with d(loss) = `seed`,
    /// accumulating into every parameter's gradient.
    pub fn backward(&mut self, loss: Tensor, seed: f32) -> Result<()> {
        self.backward_with(loss, seed, |_| Ok(()))
    }

    /// [`Graph::backward`], calling `on_mark(label)` as each [`Graph::mark`] is passed.
    pub fn backward_with(
        &mut self,
        loss: Tensor,
        seed: f32,
        mut on_mark: impl FnMut(usize) -> Result<()>,
    ) -> Result<()> {
        let last = self
            .tape
            .last()
            .expect("backward: empty tape (graph built without recording?)");
        assert_eq!(last.out, loss, "backward: the loss must be the last op");
        let tape = std::mem::take(&mut self.tape);
        for node in tape.iter().rev() {
            if let Op::Mark { label } = node.op {
                on_mark(label)?;
                continue;
            }
            let dout = if node.out == loss {
                DevPtr::default()
            } else {
                match self.values[node.out.0].grad {
                    Some(g) => g,
                    None => continue, // nothing downstream depends on this value
                }
            };
            self.backward_op(&tape, node, dout, seed)?;
            // The producer has consumed its output's gradient: recycle it.
            if let Some(buf) = self.grads.remove(&node.out.0) {
                self.pool.give(buf);
                self.values[node.out.0].grad = None;
            }
        }
        self.tape = tape;
        Ok(())
    }

    fn backward_op(&mut self, tape: &[Node], node: &Node, dout: DevPtr, seed: f32) -> Result<()> {
        let be = self.be;
        let [r, c] = self.shape(node.out);
        match node.op {
            Op::Encoder { tokens, wte, wpe, b, t } => {
                let (dwte, dwpe) = (self.grad_slot(wte)?, self.grad_slot(wpe)?);
                be.encoder_backward(dwte, dwpe, dout, tokens, b, t, c);
            }
            Op::Matmul { inp, w, bias } => {
                let [_, ic] = self.shape(inp);
                let (dinp, dw) = (self.grad_slot(inp)?, self.grad_slot(w)?);
                let dbias = bias.map(|b| self.grad_slot(b)).transpose()?;
                be.matmul_backward(dinp, dw, dbias, dout, self.ptr(inp), self.ptr(w), r, ic, c);
            }
            Op::LayerNorm { inp, w, b, mean, rstd } => {
                let (dinp, dw, db) = (self.grad_slot(inp)?, self.grad_slot(w)?, self.grad_slot(b)?);
                be.layernorm_backward(dinp, dw, db, dout, self.ptr(inp), self.ptr(w), mean, rstd, r, c);
            }
            Op::Attention { qkv, saved, b, t, nh } => {
                let dqkv = self.grad_slot(qkv)?;
                be.attention_backward(dqkv, dout, self.ptr(qkv), self.ptr(node.out), saved, b, t, c, nh);
            }
            Op::Gelu { inp } => {
                let dinp = self.grad_slot(inp)?;
                be.gelu_backward(dinp, self.ptr(inp), dout, r * c);
            }
            Op::Add { a, b } => {
                // Both inputs get dout; one may simply take over its buffer.
                let heir = if a != b { self.hand_down(node.out, [b, a]) } else { None };
                for x in [a, b] {
                    if Some(x) != heir {
                        let dx = self.grad_slot(x)?;
                        be.accumulate(dx, dout, r * c);
                    }
                }
            }
            Op::CrossEntropy {
                logits,
                targets,
                losses,
                v,
            } => {
                let [rows, vp] = self.shape(logits);
                let dloss = seed / rows as f32;
                if self.values[logits.0].grad.is_none() && !self.is_param(logits) && !read_by_others(tape, logits, node)
                {
                    // Nothing else reads the logits: their gradient overwrites them (llm.c's
                    // trick), which saves a (R, Vp) buffer, its zeroing and a read.
                    let p = self.ptr(logits);
                    be.crossentropy_backward_in_place(p, losses, targets, dloss, rows, v, vp);
                    self.values[logits.0].grad = Some(p);
                } else {
                    let dlogits = self.grad_slot(logits)?;
                    be.crossentropy_backward(dlogits, self.ptr(logits), targets, dloss, rows, v, vp);
                }
            }
            Op::Mark { .. } => unreachable!("marks are handled by backward_with"),
        }
        Ok(())
    }

    /// Is `x` a parameter (memory owned outside the graph)?
    pub fn is_param(&self, x: Tensor) -> bool {
        self.values[x.0].is_param
    }
}

/// Does any op on `tape` other than `node` take `x` as an input?
fn read_by_others(tape: &[Node], x: Tensor, node: &Node) -> bool {
    tape.iter().any(|other| {
        !std::ptr::eq(other, node)
            && match other.op {
                Op::Encoder { wte, wpe, .. } => x == wte || x == wpe,
                Op::Matmul { inp, w, bias } => x == inp || x == w || bias == Some(x),
                Op::LayerNorm { inp, w, b, .. } => x == inp || x == w || x == b,
                Op::Attention { qkv, .. } => x == qkv,
                Op::Gelu { inp } => x == inp,
                Op::Add { a, b } => x == a || x == b,
                Op::CrossEntropy { logits, .. } => x == logits,
                Op::Mark { .. } => false,
            }
    })
}

impl<B: Backend> Drop for Graph<'_, B> {
    fn drop(&mut self) {
        for buf in self.held.drain(..).chain(self.grads.drain().map(|(_, b)| b)) {
            self.pool.give(buf);
        }
    }
}
