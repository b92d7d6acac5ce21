//! Reverse mode: the tape walked backwards, each op's backward kernel accumulating into its
//! inputs' gradients, activation gradients recycled as soon as they are consumed.

use super::{fp8_out_at, Graph, Kind, Node, Op, Tensor};
use crate::backend::{Act, Backend, DeviceBuffer, Fp8, Fp8Out, Overwrite, Span};
use crate::error::{Error, Result};
use crate::model::Fp8Site;
use std::collections::HashSet;
use std::ops::Range;

impl<'a, B: Backend> Graph<'a, B> {
    // ---- backward -------------------------------------------------------------------

    /// Gradient slot of activation `x` (activation-typed), allocated (zeroed) from the pool
    /// on first use.
    fn act_grad(&mut self, x: Tensor) -> Result<Span<'a, Act>> {
        assert_eq!(
            self.values[x.0].kind,
            Kind::Activation,
            "an op's input is an activation"
        );
        if let Some(g) = self.values[x.0].grad {
            return Ok(g);
        }
        let g = self.act_grad_overwritten(x)?;
        self.be.zero_act(g, self.numel(x));
        Ok(g)
    }

    /// A gradient slot for activation `x`, which has none yet, that the caller's op will
    /// OVERWRITE: a pooled buffer, not zeroed.
    pub(super) fn act_grad_overwritten(&mut self, x: Tensor) -> Result<Span<'a, Act>> {
        assert!(
            self.values[x.0].kind == Kind::Activation && self.values[x.0].grad.is_none(),
            "an overwritten gradient is an activation's first"
        );
        let n = self.numel(x);
        let words = self.grad_buffer(x, self.act().words(n))?;
        let g = self.as_act(words, n);
        self.values[x.0].grad = Some(g);
        Ok(g)
    }

    /// `x`'s gradient slot and whether it is its first: then a pooled buffer, not zeroed, that
    /// the caller's op OVERWRITES (`act_grad_overwritten`); else the slot it adds to.
    fn act_grad_or_first(&mut self, x: Tensor) -> Result<(Span<'a, Act>, bool)> {
        if self.values[x.0].grad.is_none() {
            Ok((self.act_grad_overwritten(x)?, true))
        } else {
            Ok((self.act_grad(x)?, false))
        }
    }

    /// Gradient slot of parameter `x` (f32): its view of the gradient buffer, or a zeroed
    /// pooled buffer when the graph was given none. The caller's op adds to it; a slot left
    /// for a product to write (`zero_grads_except_first_products`) that no product wrote is
    /// zeroed first.
    fn param_grad(&mut self, x: Tensor) -> Result<Span<'a>> {
        let (g, first) = self.param_grad_or_first(x)?;
        if first {
            self.be.zero(g, self.numel(x));
        }
        Ok(g)
    }

    /// `x`'s gradient slot and whether the caller's product WRITES it (its first write of the
    /// step, left unzeroed by `zero_grads_except_first_products`); else the slot it adds to.
    fn param_grad_or_first(&mut self, x: Tensor) -> Result<(Span<'a>, bool)> {
        assert_eq!(self.values[x.0].kind, Kind::Param, "an op's weight is a parameter");
        let g = match self.values[x.0].grad {
            Some(g) => g.cast(),
            None => {
                let g = self.grad_buffer(x, self.numel(x))?;
                self.be.zero(g, g.len());
                self.values[x.0].grad = Some(g.act());
                g
            }
        };
        Ok((g, self.first_writes.remove(&g.ptr().addr()).is_some()))
    }

    /// Where `node`'s backward will write the whole gradient of its input `x` (no gradient yet,
    /// no other reader), and `x` is a product's output with a bias: that bias's gradient slot,
    /// for `node`'s backward to add the column sums of `x`'s gradient into as it writes it
    /// (a product's bias gradient is those sums); the product's backward then leaves its bias
    /// out (`output_bias_grad`). Else `None`.
    fn take_output_bias(&mut self, tape: &[Node], node: &Node, x: Tensor) -> Result<Option<Span<'a>>> {
        if self.is_param(x) || self.values[x.0].grad.is_some() || read_by_others(tape, x, node) {
            return Ok(None);
        }
        let Some(bias) = tape.iter().find(|n| n.out == x).and_then(|n| output_bias(&n.op)) else {
            return Ok(None);
        };
        self.bias_summed.insert(x.0);
        self.param_grad(bias).map(Some)
    }

    /// The gradient slot of `bias`, the bias of the product whose output is `out`, for that
    /// product's backward to add to; `None` without a bias, or when the op reading `out` has
    /// summed it already (`take_output_bias`).
    fn output_bias_grad(&mut self, out: Tensor, bias: Option<Tensor>) -> Result<Option<Span<'a>>> {
        if self.bias_summed.remove(&out.0) {
            return Ok(None);
        }
        bias.map(|b| self.param_grad(b)).transpose()
    }

    /// For a step's first backward pass, in place of zeroing the whole flat gradient buffer
    /// `grads`: each parameter whose first gradient write (in backward's order) is a product's
    /// weight gradient (`Op::Matmul`, `Op::Mlp`: in GPT-2 every matrix, the tied wte by the
    /// LM head) is left for that product to WRITE, and only the rest of the buffer is zeroed
    /// (GPT-2: wpe, each block's vectors, the last layernorm's: 14 ranges). Saves the products
    /// reading the matrices' gradients back and most of the zeroing. Call between the forward
    /// pass and backward. Parameters whose views overlap without being equal are all zeroed.
    pub fn zero_grads_except_first_products(&mut self, grads: &B::Buffer<f32>) -> Result<()> {
        if (self.tape.iter()).any(|n| matches!(n.op, Op::LmHeadLoss { fresh: false, .. })) {
            return Err(Error::Device(
                "the language-model head added to its weight's gradient in the forward pass, which \
                 zeroing now would lose: give the step's first pass with_fresh_gradients(true)"
                    .into(),
            ));
        }
        self.first_writes.clear();
        let (base, len) = (grads.ptr().addr(), grads.len());
        // Every parameter's gradient range in the buffer (element offsets), by address.
        let range = |g: &Self, x: Tensor| -> Option<Range<usize>> {
            let addr = g.values[x.0].grad?.ptr().addr();
            let start = (addr.checked_sub(base)? / 4) as usize;
            (addr % 4 == base % 4 && start + g.numel(x) <= len).then(|| start..start + g.numel(x))
        };
        let mut seen = HashSet::new();
        for (at, node) in self.tape.iter().enumerate().rev() {
            for (x, product) in param_writes(&node.op) {
                if let (Some(r), Some(g)) = (range(self, x), self.values[x.0].grad) {
                    if seen.insert(r.start) && product {
                        self.first_writes.insert(base + 4 * r.start as u64, (g.cast(), at));
                    }
                }
            }
        }
        // Left out: a range that overlaps another parameter's without being the same.
        let mut all: Vec<Range<usize>> = (0..self.values.len())
            .filter(|&i| self.values[i].kind == Kind::Param)
            .filter_map(|i| range(self, Tensor(i)))
            .collect();
        all.sort_by_key(|r| (r.start, r.end));
        all.dedup();
        for pair in all.windows(2) {
            if pair[1].start < pair[0].end {
                for r in pair {
                    self.first_writes.remove(&(base + 4 * r.start as u64));
                }
            }
        }
        let mut skip: Vec<Range<usize>> = (self.first_writes.iter())
            .map(|(&addr, &(g, _))| {
                let start = ((addr - base) / 4) as usize;
                start..start + g.len()
            })
            .collect();
        skip.sort_by_key(|r| r.start);
        let mut at = 0;
        for r in skip.iter().chain(std::iter::once(&(len..len))) {
            if r.start > at {
                self.be.zero(grads.span().slice(at, r.start - at), r.start - at);
            }
            at = at.max(r.end);
        }
        Ok(())
    }

    fn numel(&self, x: Tensor) -> usize {
        let [r, c] = self.values[x.0].shape;
        r * c
    }

    /// A pooled buffer of `words` for `x`'s gradient, not zeroed, kept until its producer's
    /// backward has consumed it.
    fn grad_buffer(&mut self, x: Tensor, words: usize) -> Result<Span<'a>> {
        let (buf, span) = self.take_pooled(words)?;
        self.grads.insert(x.0, buf);
        Ok(span)
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
        self.values[heir.0].grad = self.values[out.0].grad.take();
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
        self.bias_summed.clear();
        for (at, node) in tape.iter().enumerate().rev() {
            if let Op::Mark { label } = node.op {
                // What `on_mark` hands over (a bucket summed on another stream) must be whole:
                // a gradient below this mark left for a product that never ran is zeroed now.
                self.zero_unwritten(|by| by > at);
                on_mark(label)?;
                continue;
            }
            let dout = if node.out == loss {
                None
            } else {
                match self.values[node.out.0].grad {
                    Some(g) => Some(g),
                    // The residual stream's gradient alone (its layernorm output unused).
                    None if matches!(node.op, Op::AddLayerNorm { sum, .. } if self.values[sum.0].grad.is_some()) => {
                        None
                    }
                    None => continue, // nothing downstream depends on this value
                }
            };
            self.backward_op(&tape, node, dout, seed)?;
            // The producer has consumed its output's gradient: recycle it.
            self.release_grad(node.out);
        }
        self.tape = tape;
        self.zero_unwritten(|_| true);
        Ok(())
    }

    /// Zeroes the gradients left for a product that never ran (nothing downstream needed its
    /// op), as if the buffer had been zeroed: those whose product's place on the tape
    /// satisfies `passed` (backward has gone by it).
    fn zero_unwritten(&mut self, passed: impl Fn(usize) -> bool) {
        let unwritten: Vec<u64> = (self.first_writes.iter())
            .filter(|(_, &(_, by))| passed(by))
            .map(|(&addr, _)| addr)
            .collect();
        for addr in unwritten {
            let (g, _) = self.first_writes.remove(&addr).expect("listed above");
            self.be.zero(g, g.len());
        }
    }

    /// Runs `node`'s backward with its output's gradient `out_grad` (none for the loss, and
    /// for an [`Op::AddLayerNorm`] whose layernorm output has none).
    fn backward_op(
        &mut self,
        tape: &[Node<'a>],
        node: &Node<'a>,
        out_grad: Option<Span<'a, Act>>,
        seed: f32,
    ) -> Result<()> {
        let be = self.be;
        let [r, c] = self.shape(node.out);
        let dout = || out_grad.expect("backward: the op's output has a gradient");
        match node.op {
            Op::Encoder {
                tokens,
                order,
                wte,
                wpe,
                b,
                t,
            } => {
                let (dwte, dwpe) = (self.param_grad(wte)?, self.param_grad(wpe)?);
                let order = order.expect("a recording graph uploads the order");
                // SAFETY: every token is a row of wte (checked by the forward pass), and
                // `order` is `token_order` of them.
                unsafe { be.encoder_backward(dwte, dwpe, dout(), tokens, order, b, t, c) };
            }
            Op::Matmul { inp, w, bias, fp8 } => {
                let [_, ic] = self.shape(inp);
                let ((dinp, dinp_first), (dw, dw_first)) = (self.act_grad_or_first(inp)?, self.param_grad_or_first(w)?);
                let dbias = self.output_bias_grad(node.out, bias)?;
                // A first gradient (in GPT-2 the input's only one; the weight's in a step's first
                // backward) is written by the product, not zeroed and added to.
                let overwrite = Overwrite {
                    dinp: dinp_first,
                    dw: dw_first,
                };
                match fp8 {
                    None => {
                        let x = self.data(inp);
                        be.matmul_backward(overwrite, dinp, dw, dbias, dout(), x, self.span(w), r, ic, c);
                    }
                    Some(site) => {
                        // Both gradients' products in FP8: the output gradient as stored for the
                        // input's, both operands transposed for the weight's.
                        let [dq, dq_t] = self.quantize_grad_both(site, node.out, dout(), [r, c])?;
                        self.input_grad_fp8(site, dinp, dinp_first, dq, [r, ic, c])?;
                        let x_t = self.quantize_input_transposed(site, inp, [r, ic])?;
                        let dequant = site.weight_grad_dequant();
                        be.matmul_fp8_weight_grad(dw_first, dw, dq_t, x_t, dequant, [c, ic, r], GRAD_FORMATS);
                        if let Some(dbias) = dbias {
                            be.bias_backward(dbias, dout(), r, c);
                        }
                    }
                }
            }
            Op::LayerNorm { inp, w, b, mean, rstd } => {
                let (dinp, dw, db) = (self.act_grad(inp)?, self.param_grad(w)?, self.param_grad(b)?);
                let x = self.data(inp);
                be.layernorm_backward(dinp, dw, db, dout(), x, self.span(w), mean, rstd, r, c);
            }
            Op::Attention { qkv, saved, b, t, nh } => {
                let x = self.data(qkv);
                // qkv's first gradient (in GPT-2 its only one): written, not zeroed and added to,
                // and with it the qkv product's bias gradient (its column sums).
                let dbias = self.take_output_bias(tape, node, qkv)?;
                let (dqkv, first) = self.act_grad_or_first(qkv)?;
                let out = self.span(node.out);
                // Under FP8, the qkv product's E5M2 output gradient with it, as stored and
                // transposed, for that product's two gradients.
                match fp8_site(tape, qkv).filter(|_| first) {
                    Some(site) => {
                        let (q, q_t) = (self.grad_fp8_out(site, r * 3 * c)?, self.fp8_scratch_t(r * 3 * c, 0)?);
                        be.attention_backward_quantize(dqkv, dbias, dout(), x, out, saved, b, t, c, nh, q, q_t);
                        self.fp8_copies.insert(qkv.0, (q.dst, Some(q_t), site.grad.ptr()));
                    }
                    None => be.attention_backward(first, dqkv, dbias, dout(), x, out, saved, b, t, c, nh),
                }
            }
            Op::Gelu { inp } => {
                let dinp = self.act_grad(inp)?;
                let x = self.data(inp);
                be.gelu_backward(dinp, x, dout(), r * c);
            }
            Op::Mlp {
                inp,
                w_fc,
                b_fc,
                pre,
                act,
                w_proj,
                b_proj,
                fp8,
            } => {
                let ([_, ic], [_, h]) = (self.shape(inp), self.shape(pre));
                if let Some([fc, proj]) = fp8 {
                    return self.mlp_backward_fp8(node, dout(), [inp, pre], [w_fc, w_proj], [b_fc, b_proj], [fc, proj]);
                }
                // The second product back to the hidden layer, through GELU, into pre's
                // gradient, which lives for this op only: d(pre) = gelu'(pre) ⊙ (dout · w_proj).
                let ((dw, dw_first), dbias) = (
                    self.param_grad_or_first(w_proj)?,
                    self.output_bias_grad(node.out, b_proj)?,
                );
                // The first product's bias gradient is d(pre)'s column sums, summed there too.
                let dpre = self.act_grad_overwritten(pre)?;
                let dpre_bias = b_fc.map(|b| self.param_grad(b)).transpose()?;
                let a = self.data(act);
                let (p, w) = (self.span(pre), self.span(w_proj));
                be.matmul_backward_dgelu(dpre, dpre_bias, dw, dw_first, dbias, dout(), a, p, w, r, h, c);
                // The first product, its bias done.
                let ((dinp, dinp_first), (dw, dw_first)) =
                    (self.act_grad_or_first(inp)?, self.param_grad_or_first(w_fc)?);
                let x = self.data(inp);
                let overwrite = Overwrite {
                    dinp: dinp_first,
                    dw: dw_first,
                };
                be.matmul_backward(overwrite, dinp, dw, None, dpre, x, self.span(w_fc), r, ic, h);
                self.release_grad(pre);
            }
            Op::Relu { inp } => {
                let dinp = self.act_grad(inp)?;
                let x = self.data(inp);
                be.relu_backward(dinp, x, dout(), r * c);
            }
            Op::Add { a, b } => {
                // Both inputs get dout; one may simply take over its buffer.
                let heir = if a != b { self.hand_down(node.out, [b, a]) } else { None };
                for x in [a, b] {
                    if Some(x) != heir {
                        let dx = self.act_grad(x)?;
                        be.accumulate_act(dx, dout(), r * c);
                    }
                }
            }
            Op::AddLayerNorm {
                a,
                b,
                sum,
                w,
                bias,
                mean,
                rstd,
            } => self.add_layernorm_backward((tape, node), [a, b], sum, [w, bias], [mean, rstd], out_grad, r, c)?,
            Op::CrossEntropy {
                logits,
                targets,
                losses,
                v,
                fused,
            } => {
                let [rows, vp] = self.shape(logits);
                let dloss = seed / rows as f32;
                if let Some(applied) = fused {
                    // The forward pass already wrote the gradient over the logits.
                    if applied != dloss || self.values[logits.0].grad.is_some() || read_by_others(tape, logits, node) {
                        return Err(Error::Device(format!(
                            "the loss computed its gradient in the forward pass for seed {} but backward \
                             got {seed}, or another op read the logits it overwrote",
                            applied * rows as f32
                        )));
                    }
                    self.values[logits.0].grad = Some(self.span(logits));
                } else if self.values[logits.0].grad.is_none()
                    && !self.is_param(logits)
                    && !read_by_others(tape, logits, node)
                {
                    // Nothing else reads the logits: their gradient overwrites them (llm.c's
                    // trick), which saves a (R, Vp) buffer, its zeroing and a read.
                    let x = self.span(logits);
                    // SAFETY: every target is below v (checked by the forward pass).
                    unsafe { be.crossentropy_backward_in_place(x, losses, targets, dloss, rows, v, vp) };
                    self.values[logits.0].grad = Some(x);
                } else {
                    let dlogits = self.act_grad(logits)?;
                    let x = self.data(logits);
                    // SAFETY: every target is below v (checked by the forward pass).
                    unsafe { be.crossentropy_backward(dlogits, x, targets, dloss, rows, v, vp) };
                }
            }
            Op::LmHeadLoss { h, w, applied, .. } => {
                let rows = self.shape(h)[0];
                let dloss = seed / rows as f32;
                if applied != dloss {
                    return Err(Error::Device(format!(
                        "the language-model head computed its gradients in the forward pass for seed {} \
                         but backward got {seed}",
                        applied * rows as f32
                    )));
                }
                // The forward pass wrote both gradients; w's slot, when left for this op's
                // first write, is used up here (nothing to zero).
                self.param_grad_or_first(w)?;
            }
            Op::Mark { .. } => unreachable!("marks are handled by backward_with"),
        }
        Ok(())
    }

    /// Backward of [`Op::AddLayerNorm`], `sum = a + b` and the node's output `layernorm(sum)`
    /// with gradient `dout` (none when only the sum has one). The sum's gradient (zeroed first
    /// if nothing downstream gave it one) takes the layernorm's input gradient in place and is
    /// then each input's: one input takes over its buffer, as an add's does (`b` first, as
    /// `Op::Add`), and the other, when it has no gradient yet, has it written by the same
    /// backend call (`copy`) instead of zeroed and accumulated. Inputs that already have a
    /// gradient accumulate.
    #[allow(clippy::too_many_arguments)]
    fn add_layernorm_backward(
        &mut self,
        (tape, node): (&[Node], &Node),
        [a, b]: [Tensor; 2],
        sum: Tensor,
        [w, bias]: [Tensor; 2],
        [mean, rstd]: [Span<'a>; 2],
        dout: Option<Span<'a, Act>>,
        r: usize,
        c: usize,
    ) -> Result<()> {
        let (be, n) = (self.be, r * c);
        // An input that is a product's output read by nothing else has the sum's whole gradient
        // as its own: its bias gradient is summed here, in the same pass (GPT-2: the attention
        // and MLP projections' biases).
        let mut dbias = None;
        if a != b && dout.is_some() {
            dbias = self.take_output_bias(tape, node, a)?;
            if dbias.is_none() {
                dbias = self.take_output_bias(tape, node, b)?;
            }
        }
        let dsum = self.act_grad(sum)?;
        let heir = if a != b { self.hand_down(sum, [b, a]) } else { None };
        let other = heir.map(|h| if h == b { a } else { b });
        let copy = match other {
            Some(x) if !self.is_param(x) && self.values[x.0].grad.is_none() => Some(self.act_grad_overwritten(x)?),
            _ => None,
        };
        if let Some(dout) = dout {
            let (dw, db) = (self.param_grad(w)?, self.param_grad(bias)?);
            let s = self.data(sum);
            be.add_layernorm_backward(dsum, copy, dbias, dw, db, dout, s, self.span(w), mean, rstd, r, c);
        } else if let Some(copy) = copy {
            be.zero_act(copy, n);
            be.accumulate_act(copy, dsum, n);
        }
        for x in [a, b] {
            if Some(x) != heir && (copy.is_none() || Some(x) != other) {
                let dx = self.act_grad(x)?;
                be.accumulate_act(dx, dsum, n);
            }
        }
        if heir.is_none() {
            // No input took the sum's gradient over: it was read for the last time above.
            self.release_grad(sum);
        }
        Ok(())
    }
}

impl<'a, B: Backend> Graph<'a, B> {
    /// An FP8 product's input gradient, `dinp (R,C) (+)= dout (R,OC) · w`, from the output
    /// gradient in E5M2 (`dq`, at the site's gradient scale) times the weight's transposed
    /// E4M3 copy. Written where `first`, else computed apart and added.
    fn input_grad_fp8(
        &mut self,
        site: Fp8Site<'a>,
        dinp: Span<'a, Act>,
        first: bool,
        dq: Span<'a, u8>,
        [r, c, oc]: [usize; 3],
    ) -> Result<()> {
        let be = self.be;
        let (dequant, formats) = (site.grad_dequant(), GRAD_FORMATS);
        if first {
            be.matmul_fp8(dinp, dq, site.weight_t, None, dequant, [r, c, oc], formats);
        } else {
            let words = self.alloc_words(self.act().words(r * c))?;
            let apart = self.as_act(words, r * c);
            be.matmul_fp8(apart, dq, site.weight_t, None, dequant, [r, c, oc], formats);
            be.accumulate_act(dinp, apart, r * c);
        }
        Ok(())
    }

    /// Where an FP8 product's output gradient (n values) goes in E5M2, at its site's scale,
    /// its amax recorded: the scratch of its size.
    fn grad_fp8_out(&mut self, site: Fp8Site<'a>, n: usize) -> Result<Fp8Out<'a>> {
        self.fp8_out(site.grad, Fp8::E5M2, n)
    }

    /// [`Op::Mlp`]'s backward with every product in FP8, the weight gradients too (from
    /// transposed copies: rows holding the batch's values, the layout FP8 products read):
    /// dout in E5M2 as stored and transposed; d(act) = dout · w_proj from the weight's transposed
    /// copy; gelu' into d(pre), kept only as its E5M2 copies, with act = gelu(pre) rebuilt as
    /// its transposed E4M3 copy and the first product's bias gradient summed in the same pass
    /// ([`Backend::gelu_backward_fp8`]); then the second weight's gradient doutᵀ · act, the
    /// first's d(pre)ᵀ · x (x's transposed copy at its forward scale), and the input's.
    #[allow(clippy::too_many_arguments)]
    fn mlp_backward_fp8(
        &mut self,
        node: &Node<'a>,
        dout: Span<'a, Act>,
        [inp, pre]: [Tensor; 2],
        [w_fc, w_proj]: [Tensor; 2],
        [b_fc, b_proj]: [Option<Tensor>; 2],
        [fc, proj]: [Fp8Site<'a>; 2],
    ) -> Result<()> {
        let be = self.be;
        let ([r, c], [_, ic], [_, h]) = (self.shape(node.out), self.shape(inp), self.shape(pre));
        let [dq, dq_t] = self.quantize_grad_both(proj, node.out, dout, [r, c])?;
        let dact = self.act_grad_overwritten(pre)?; // d(act), in pre's gradient buffer
        be.matmul_fp8(
            dact,
            dq,
            proj.weight_t,
            None,
            proj.grad_dequant(),
            [r, h, c],
            GRAD_FORMATS,
        );
        let dpre_q = self.grad_fp8_out(fc, r * h)?;
        let (dpre_t, act_t) = (self.fp8_scratch_t(r * h, 0)?, self.fp8_scratch_t(r * h, 1)?);
        // At the second product's input scale; its amax (of gelu(pre) from the rounded pre, not
        // the forward's product) is not recorded.
        let act_q = Fp8Out {
            amax: self.fp8_discard()?,
            ..fp8_out_at(act_t, proj.input, Fp8::E4M3)
        };
        let dpre_bias = b_fc.map(|b| self.param_grad(b)).transpose()?;
        let p = self.span(pre);
        be.gelu_backward_fp8(dact, p, [dpre_q, act_q], dpre_t, dpre_bias, [r, h]);
        let (dw, dw_first) = self.param_grad_or_first(w_proj)?;
        let dequant = proj.weight_grad_dequant();
        be.matmul_fp8_weight_grad(dw_first, dw, dq_t, act_t, dequant, [c, h, r], GRAD_FORMATS);
        if let Some(dbias) = self.output_bias_grad(node.out, b_proj)? {
            be.bias_backward(dbias, dout, r, c);
        }
        let x_t = self.quantize_input_transposed(fc, inp, [r, ic])?;
        let (dw, dw_first) = self.param_grad_or_first(w_fc)?;
        let dequant = fc.weight_grad_dequant();
        be.matmul_fp8_weight_grad(dw_first, dw, dpre_t, x_t, dequant, [h, ic, r], GRAD_FORMATS);
        let (dinp, dinp_first) = self.act_grad_or_first(inp)?;
        self.input_grad_fp8(fc, dinp, dinp_first, dpre_q.dst, [r, ic, h])?;
        self.release_grad(pre);
        Ok(())
    }

    /// An FP8 product's output gradient `dout` (R,C) in E5M2 at its site's scale, the
    /// product's output being `out`: as stored, for the input gradient's product (the copy the
    /// op reading `out` wrote with it, [`Graph::take_fp8_copy`]), and transposed (C,R),
    /// for the weight gradient's; the amax recorded (again, where the copy was made before: the
    /// same values).
    fn quantize_grad_both(
        &mut self,
        site: Fp8Site<'a>,
        out: Tensor,
        dout: Span<'a, Act>,
        [r, c]: [usize; 2],
    ) -> Result<[Span<'a, u8>; 2]> {
        let t = self.fp8_scratch_t(r * c, 0)?;
        match self.take_fp8_copy(site, out) {
            Some((copy, Some(copy_t))) => return Ok([copy, copy_t]),
            Some((copy, None)) => {
                let q = self.grad_fp8_out_at(site, t);
                self.be
                    .quantize_fp8_transposed(t, q.amax, dout, q.scale, [r, c], q.format);
                return Ok([copy, t]);
            }
            None => {}
        }
        let q = self.grad_fp8_out(site, r * c)?;
        self.be
            .quantize_fp8_both([q.dst, t], q.amax, dout, q.scale, [r, c], q.format);
        Ok([q.dst, t])
    }

    /// An FP8 product's input `x` (R,C) transposed (C,R) in E4M3 at the scale its forward
    /// product took, for the weight gradient's product: the copy the forward pass kept
    /// ([`Graph::add_layernorm`], [`Graph::attention`], [`Graph::matmul_fp8`]), else quantized
    /// now (its amax recorded again: the same values).
    fn quantize_input_transposed(&mut self, site: Fp8Site<'a>, x: Tensor, [r, c]: [usize; 2]) -> Result<Span<'a, u8>> {
        match self.fp8_kept_t.get(&x.0) {
            Some(&(kept, slot)) if slot == site.input.ptr() => return Ok(kept),
            _ => {}
        }
        // Place 1: beside the output gradient's transposed copy, which may have its size.
        let q = fp8_out_at(self.fp8_scratch_t(r * c, 1)?, site.input, Fp8::E4M3);
        let (t, data) = (q.dst, self.data(x));
        self.be
            .quantize_fp8_transposed(t, q.amax, data, q.scale, [r, c], q.format);
        Ok(t)
    }

    /// The E5M2 copy of the product's output gradient, and its transposed one if written, that
    /// the op reading its output `out` wrote at the site's scale (attention's backward), if
    /// there is one.
    fn take_fp8_copy(&mut self, site: Fp8Site<'a>, out: Tensor) -> Option<(Span<'a, u8>, Option<Span<'a, u8>>)> {
        match self.fp8_copies.remove(&out.0) {
            Some((copy, copy_t, slot)) if slot == site.grad.ptr() => Some((copy, copy_t)),
            _ => None,
        }
    }

    /// `x`'s gradient buffer, if it has one, back to the pool: its last reader has run.
    fn release_grad(&mut self, x: Tensor) {
        if let Some(buf) = self.grads.remove(&x.0) {
            self.pool.give(buf);
            self.values[x.0].grad = None;
        }
    }

    /// `dst` in E5M2 at the site's gradient scale, its amax recorded there.
    fn grad_fp8_out_at(&self, site: Fp8Site<'a>, dst: Span<'a, u8>) -> Fp8Out<'a> {
        fp8_out_at(dst, site.grad, Fp8::E5M2)
    }
}

/// The input gradient's FP8 product: the E5M2 output gradient by the E4M3 transposed weight.
const GRAD_FORMATS: [Fp8; 2] = [Fp8::E5M2, Fp8::E4M3];

/// The bias added to `op`'s output, where it is a product's (`Op::Matmul`, `Op::Mlp`'s second):
/// its gradient is the column sums of the output's gradient.
fn output_bias(op: &Op) -> Option<Tensor> {
    match *op {
        Op::Matmul { bias, .. } => bias,
        Op::Mlp { b_proj, .. } => b_proj,
        _ => None,
    }
}

/// The parameters whose gradients `op`'s backward writes, in the order it writes them, each
/// with whether a product writes it (its weight gradient: one that can overwrite).
fn param_writes(op: &Op) -> Vec<(Tensor, bool)> {
    let vector = |b: Option<Tensor>| b.map(|b| (b, false));
    match *op {
        Op::Encoder { wte, wpe, .. } => vec![(wte, false), (wpe, false)],
        Op::Matmul { w, bias, .. } => [Some((w, true)), vector(bias)].into_iter().flatten().collect(),
        Op::LayerNorm { w, b, .. } | Op::AddLayerNorm { w, bias: b, .. } => vec![(w, false), (b, false)],
        Op::Mlp {
            w_fc,
            b_fc,
            w_proj,
            b_proj,
            ..
        } => [Some((w_proj, true)), vector(b_proj), vector(b_fc), Some((w_fc, true))]
            .into_iter()
            .flatten()
            .collect(),
        // Written in the forward pass: its first chunk writes w's gradient when `fresh`.
        Op::LmHeadLoss { w, fresh, .. } => vec![(w, fresh)],
        Op::Attention { .. }
        | Op::Gelu { .. }
        | Op::Relu { .. }
        | Op::Add { .. }
        | Op::CrossEntropy { .. }
        | Op::Mark { .. } => Vec::new(),
    }
}

/// The FP8 site of the product whose output is `x` (`Op::Matmul` under `--precision fp8`).
fn fp8_site<'a>(tape: &[Node<'a>], x: Tensor) -> Option<Fp8Site<'a>> {
    match tape.iter().find(|n| n.out == x)?.op {
        Op::Matmul { fp8, .. } => fp8,
        _ => None,
    }
}

/// Does any op on `tape` other than `node` take `x` as an input?
fn read_by_others(tape: &[Node], x: Tensor, node: &Node) -> bool {
    tape.iter().any(|other| {
        !std::ptr::eq(other, node)
            && match other.op {
                Op::Encoder { wte, wpe, .. } => x == wte || x == wpe,
                Op::Matmul { inp, w, bias, .. } => x == inp || x == w || bias == Some(x),
                Op::LayerNorm { inp, w, b, .. } => x == inp || x == w || x == b,
                Op::Attention { qkv, .. } => x == qkv,
                Op::Gelu { inp } | Op::Relu { inp } => x == inp,
                Op::Mlp {
                    inp,
                    w_fc,
                    b_fc,
                    w_proj,
                    b_proj,
                    ..
                } => x == inp || x == w_fc || x == w_proj || b_fc == Some(x) || b_proj == Some(x),
                Op::Add { a, b } => x == a || x == b,
                Op::AddLayerNorm { a, b, w, bias, .. } => x == a || x == b || x == w || x == bias,
                Op::CrossEntropy { logits, .. } => x == logits,
                Op::LmHeadLoss { h, w, .. } => x == h || x == w,
                Op::Mark { .. } => false,
            }
    })
}
