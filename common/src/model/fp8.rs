//! FP8 training's state (`--precision fp8`): the transformer blocks' four products per block
//! (qkv, the attention's projection, the MLP's two) take their input and weight in E4M3 and
//! their output gradient in E5M2, each tensor with a per-tensor scale from a history of its
//! largest magnitudes (delayed scaling, as Transformer Engine does). The LM head, attention,
//! layernorms and everything else stay bf16, as do the attention's two weight gradients'
//! products; master weights, gradients and AdamW stay fp32.
//!
//! Per product ("site") three scale slots ([`Fp8Slot`]): input, weight, output gradient; and
//! the weight's two FP8 copies, as stored (OC,C) for the forward product and transposed (C,OC)
//! for the input gradient's. A step:
//!
//! 1. forward: each product quantizes its input with the input slot's scale (recording its
//!    amax) and multiplies it with the weight's copy;
//! 2. backward: each product quantizes its output gradient (E5M2) and multiplies it with the
//!    transposed copy into the input gradient; the MLP's two weight gradients are FP8 products
//!    too, of the output gradient's and the input's transposed copies (rows holding the batch's
//!    values), the others bf16's;
//! 3. on several ranks, [`Fp8State::agree`]: each amax the largest over the ranks; then
//!    [`Fp8State::rescale`]: every slot's amax onto its history, a new scale from it;
//! 4. after the update, [`Fp8State::quantize_weights`]: the copies from the new weights.
//!
//! The slots and histories are the training state a checkpoint carries ([`Fp8State::save`]),
//! so a resumed run scales as the uninterrupted one did.

use super::params::Param;
use super::ParamLayout;
use crate::backend::{bf16, Act, ActType, Backend, DeviceBuffer, Fp8, Fp8Slot, Span};
use crate::comm::{device_order, Comm};
use crate::error::{Error, Result};
use std::ops::Range;

/// amax values each slot remembers (torchao's delayed-scaling default).
pub const HISTORY_LEN: usize = 16;

/// A block's products that run in FP8, each named by its weight.
pub const PRODUCTS: [Param; 4] = [Param::QkvW, Param::AttProjW, Param::FcW, Param::FcProjW];

/// A site's slots: the input's, the weight's, the output gradient's.
const SLOTS_PER_SITE: usize = 3;

/// What one FP8 product reads and records: its weight's copies and its three scale slots.
#[derive(Clone, Copy, Debug)]
pub struct Fp8Site<'a> {
    /// The weight (OC,C) in E4M3.
    pub weight: Span<'a, u8>,
    /// Its transpose (C,OC), the same values.
    pub weight_t: Span<'a, u8>,
    /// The slots ([`Fp8Slot`]) of the input, the weight and the output gradient.
    pub input: Span<'a>,
    pub weight_slot: Span<'a>,
    pub grad: Span<'a>,
}

impl<'a> Fp8Site<'a> {
    /// A slot's word `at` ([`Fp8Slot::DEQUANT`], ...).
    pub fn word(slot: Span<'a>, at: usize) -> Span<'a> {
        slot.slice(at, 1)
    }

    /// What the forward product is scaled back by: the input's dequant, the weight's.
    pub fn dequant(&self) -> [Span<'a>; 2] {
        [
            Self::word(self.input, Fp8Slot::DEQUANT),
            Self::word(self.weight_slot, Fp8Slot::DEQUANT),
        ]
    }

    /// What the input gradient's product is scaled back by: the gradient's, the weight's.
    pub fn grad_dequant(&self) -> [Span<'a>; 2] {
        [
            Self::word(self.grad, Fp8Slot::DEQUANT),
            Self::word(self.weight_slot, Fp8Slot::DEQUANT),
        ]
    }

    /// What the weight gradient's product is scaled back by: the gradient's, the input's.
    pub fn weight_grad_dequant(&self) -> [Span<'a>; 2] {
        [
            Self::word(self.grad, Fp8Slot::DEQUANT),
            Self::word(self.input, Fp8Slot::DEQUANT),
        ]
    }
}

/// Refused in one line unless a micro-batch's `tokens` are a multiple of 16: the weight
/// gradients' FP8 products run along them (the tensor cores' FP8 rule).
pub fn check_tokens(tokens: usize) -> Result<()> {
    if tokens.is_multiple_of(16) {
        return Ok(());
    }
    Err(Error::Input(format!(
        "--precision fp8: a micro-batch of {tokens} tokens (batch rows per rank and micro-batch times          --seq-len); the FP8 weight gradients need a multiple of 16"
    )))
}

/// One weight that has FP8 copies: where it is among the parameters, where its copies are.
struct Weight {
    params: Range<usize>,
    /// (OC, C).
    shape: [usize; 2],
    /// Its E4M3 copy at `copies[at..at + n]`, the transposed one right after.
    at: usize,
}

pub struct Fp8State<B: Backend> {
    /// Per block, per product of [`PRODUCTS`]: the input's, weight's and gradient's slots.
    slots: B::Buffer<f32>,
    /// Each slot's amax history, newest first.
    history: B::Buffer<f32>,
    copies: B::Buffer<u8>,
    weights: Vec<Weight>,
}

impl<B: Backend> Fp8State<B> {
    /// Fresh slots (scale 1, empty histories) for every block's products. Refused in one line
    /// where the backend has no FP8 or the model's widths are not multiples of 16 (the FP8
    /// products' rule).
    pub fn new(be: &B, layout: &ParamLayout, n_layer: usize) -> Result<Self> {
        if !be.fp8() {
            return Err(Error::Input(format!(
                "--precision fp8 needs FP8 tensor cores (compute capability 8.9 or newer: an H100 or H200); {} has none",
                be.name()
            )));
        }
        let mut weights = Vec::new();
        let mut at = 0;
        for l in 0..n_layer {
            for p in PRODUCTS {
                let e = layout.block(l, p);
                if e.shape.iter().any(|d| !d.is_multiple_of(16)) {
                    let e = Error::Input(format!(
                        "--precision fp8: {} is {:?}, and FP8 products need widths that are multiples of 16",
                        e.name, e.shape
                    ));
                    return Err(e.on_every_rank()); // the same model everywhere
                }
                weights.push(Weight {
                    params: e.range.clone(),
                    shape: e.shape,
                    at,
                });
                at += 2 * e.range.len();
            }
        }
        let sites = weights.len();
        let slots = be.alloc::<f32>(sites * SLOTS_PER_SITE * Fp8Slot::WORDS)?;
        let fresh: Vec<f32> = (0..sites)
            .flat_map(|_| [Fp8::E4M3, Fp8::E4M3, Fp8::E5M2])
            .flat_map(Fp8Slot::fresh)
            .collect();
        be.write(&slots, 0, &fresh)?;
        let history = be.alloc::<f32>(sites * SLOTS_PER_SITE * HISTORY_LEN)?;
        be.zero_buffer(&history);
        let copies = be.alloc::<u8>(at.max(1))?;
        Ok(Fp8State {
            slots,
            history,
            copies,
            weights,
        })
    }

    fn slot_count(&self) -> usize {
        self.weights.len() * SLOTS_PER_SITE
    }

    /// Block `l`'s product with weight `p` (one of [`PRODUCTS`]).
    pub fn site(&self, l: usize, p: Param) -> Fp8Site<'_> {
        let k = PRODUCTS.iter().position(|&q| q == p).expect("an FP8 product's weight");
        self.site_at(l * PRODUCTS.len() + k)
    }

    /// The `i`th site, in `weights`' order (block by block, [`PRODUCTS`] in each).
    fn site_at(&self, i: usize) -> Fp8Site<'_> {
        let w = &self.weights[i];
        let n = w.params.len();
        let slot = |j: usize| {
            let at = (i * SLOTS_PER_SITE + j) * Fp8Slot::WORDS;
            self.slots.span().slice(at, Fp8Slot::WORDS)
        };
        Fp8Site {
            weight: self.copies.span().slice(w.at, n),
            weight_t: self.copies.span().slice(w.at + n, n),
            input: slot(0),
            weight_slot: slot(1),
            grad: slot(2),
        }
    }

    /// Every weight's two FP8 copies from `weights` (what the forward pass reads: the bf16
    /// copy, or the f32 parameters on an f32 backend), scaled by its slot, whose amax they
    /// record.
    pub fn quantize_weights(&self, be: &B, params: &B::Buffer<f32>, copy: Option<&B::Buffer<bf16>>) {
        for (i, w) in self.weights.iter().enumerate() {
            let site = self.site_at(i);
            let src = weight_values(be, params, copy, w.params.clone());
            let (amax, scale) = (
                Fp8Site::word(site.weight_slot, Fp8Slot::AMAX),
                Fp8Site::word(site.weight_slot, Fp8Slot::SCALE),
            );
            be.quantize_fp8_both([site.weight, site.weight_t], amax, src, scale, w.shape, Fp8::E4M3);
        }
    }

    /// Delayed scaling's step ([`crate::backend::fp8_rescale_slot`] on every slot): after a
    /// step's backward, before the update.
    pub fn rescale(&self, be: &B) {
        be.fp8_rescale(self.slots.span(), self.history.span(), self.slot_count(), HISTORY_LEN);
    }

    /// Several ranks, before [`Fp8State::rescale`]: each slot's amax becomes the largest over
    /// the ranks (the amax of the whole step's batch), so that every rank derives the same
    /// scales and rank 0's, which a checkpoint keeps, are every rank's. A slot's other words
    /// are the same on every rank already and stay so (the largest of equal bits).
    pub fn agree(&self, be: &B, comm: &dyn Comm) -> Result<()> {
        if comm.size() == 1 {
            return Ok(());
        }
        let (slots, n) = (self.slots.ptr(), self.slots.len());
        let after = device_order(be, comm);
        if after.is_none() {
            be.synchronize()?; // the host reduces what the backend wrote
        }
        // SAFETY: the slots hold `n` words, written only by the work queued so far; what
        // reads them next (the rescale) is queued after the collective is waited for.
        unsafe { comm.start_all_reduce_max_bits(slots, n, after)? };
        comm.finish_all_reduces(after)
    }

    /// A fresh run's start: the weights' scales from their own amax (the inputs' and
    /// gradients' come from the first step), then the copies at those scales.
    pub fn calibrate(&self, be: &B, params: &B::Buffer<f32>, copy: Option<&B::Buffer<bf16>>) {
        self.quantize_weights(be, params, copy);
        self.rescale(be);
        self.quantize_weights(be, params, copy);
    }

    /// The slots, then the histories: what a checkpoint keeps.
    pub fn save(&self, be: &B) -> Result<Vec<f32>> {
        let mut host = vec![0.0f32; self.slots.len() + self.history.len()];
        let (slots, history) = host.split_at_mut(self.slots.len());
        be.read(&self.slots, 0, slots)?;
        be.read(&self.history, 0, history)?;
        Ok(host)
    }

    /// Slots and histories from [`Fp8State::save`]'s values, then the weights' copies at
    /// their scales (which record the amax the slots already hold: no change).
    pub fn restore(
        &self,
        be: &B,
        saved: &[f32],
        params: &B::Buffer<f32>,
        copy: Option<&B::Buffer<bf16>>,
    ) -> Result<()> {
        let n = self.slots.len();
        if saved.len() != n + self.history.len() {
            return Err(Error::Input(format!(
                "the checkpoint's FP8 scales hold {} values, this model's {}",
                saved.len(),
                n + self.history.len()
            )));
        }
        be.write(&self.slots, 0, &saved[..n])?;
        be.write(&self.history, 0, &saved[n..])?;
        self.quantize_weights(be, params, copy);
        Ok(())
    }

    /// Device bytes this state takes (the copies, the slots, the histories).
    pub fn bytes(&self) -> usize {
        self.copies.len() + 4 * (self.slots.len() + self.history.len())
    }
}

/// A weight's values as the forward pass reads them ([`crate::autograd::Graph::param`]).
fn weight_values<'a, B: Backend>(
    be: &B,
    params: &'a B::Buffer<f32>,
    copy: Option<&'a B::Buffer<bf16>>,
    range: Range<usize>,
) -> Span<'a, Act> {
    match (be.act(), copy) {
        (ActType::Bf16, Some(copy)) => copy.span().slice(range.start, range.len()).act(),
        _ => params.span().slice(range.start, range.len()).act(),
    }
}
