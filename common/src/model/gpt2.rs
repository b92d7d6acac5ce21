//! GPT-2 over any backend: the flat parameter and gradient buffers, GPT-2's
//! initialisation, and the forward pass written as autograd ops. Backward is the tape's.
//! Which tensors exist, their shapes and initialisation come from the parameter table.

use super::fp8::Fp8State;
use super::params::{Init, Param, ParamEntry};
use super::{ModelConfig, ParamLayout};
use crate::autograd::{Graph, KvCache, Tensor};
use crate::backend::{bf16, ActType, Backend};
use crate::error::{Error, Result};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

pub struct Gpt2<B: Backend> {
    pub config: ModelConfig,
    pub layout: ParamLayout,
    /// Every parameter, in one buffer (see [`ParamLayout`]).
    pub params: B::Buffer<f32>,
    /// Gradients, same layout as `params`.
    pub grads: B::Buffer<f32>,
    /// Under a bf16 backend, `params` rounded to bf16: what the forward pass reads. The
    /// optimiser writes it with each update; [`Gpt2::refresh_copy`] after any other change.
    pub params_bf16: Option<B::Buffer<bf16>>,
    /// `--precision fp8`: the blocks' products in FP8, with their weights' FP8 copies and
    /// scales ([`Gpt2::enable_fp8`]); training passes only, evaluation and generation read
    /// the bf16 copy.
    pub fp8: Option<Fp8State<B>>,
}

/// What a forward pass returns.
pub struct Forward {
    /// (B·T, Vp), or (B, Vp) when only the last position was asked for; `None` from a
    /// training pass whose loss took the logits over in chunks ([`Graph::lm_head`]).
    pub logits: Option<Tensor>,
    /// Mean cross-entropy, (1, 1), when targets were given.
    pub loss: Option<Tensor>,
}

impl<B: Backend> Gpt2<B> {
    /// Allocates zeroed parameters and gradients.
    pub fn new(be: &B, config: ModelConfig) -> Result<Self> {
        config.validate()?;
        let layout = ParamLayout::new(&config);
        let params = be.alloc(layout.total)?;
        let grads = be.alloc(layout.total)?;
        let params_bf16 = match be.act() {
            ActType::F32 => None,
            // What ZeRO-1 gathers into: memory other GPUs can map, where the backend has some.
            ActType::Bf16 => Some(be.alloc_shared(layout.total)?),
        };
        Ok(Gpt2 {
            config,
            layout,
            params,
            grads,
            params_bf16,
            fp8: None,
        })
    }

    /// Training passes from now on run the blocks' products in FP8 ([`super::fp8`]), with
    /// fresh scales ([`Gpt2::calibrate_fp8`] once the weights are in). Refused in one line
    /// where the backend or the model's widths cannot.
    pub fn enable_fp8(&mut self, be: &B) -> Result<()> {
        self.fp8 = Some(Fp8State::new(be, &self.layout, self.config.n_layer)?);
        Ok(())
    }

    /// A run's start under FP8: the weights' scales from the weights themselves.
    pub fn calibrate_fp8(&self, be: &B) {
        if let Some(fp8) = &self.fp8 {
            fp8.calibrate(be, &self.params, self.params_bf16.as_ref());
        }
    }

    /// After an update: the FP8 copies of the new weights (when the products run in FP8).
    pub fn quantize_fp8_weights(&self, be: &B) {
        if let Some(fp8) = &self.fp8 {
            fp8.quantize_weights(be, &self.params, self.params_bf16.as_ref());
        }
    }

    /// Every parameter from `host` (the layout's order), and the bf16 copy with them: the one
    /// way parameters come in from outside (a checkpoint, rank 0).
    pub fn set_params(&self, be: &B, host: &[f32]) -> Result<()> {
        be.write(&self.params, 0, host)?;
        self.refresh_copy(be)
    }

    /// Rounds the master weights into the bf16 copy (when there is one): after the
    /// parameters were written other than by the optimiser (initialised, loaded, averaged).
    pub fn refresh_copy(&self, be: &B) -> Result<()> {
        crate::backend::refresh_bf16_copy(be, &self.params, self.params_bf16.as_ref(), self.layout.total)?;
        self.quantize_fp8_weights(be);
        Ok(())
    }

    pub fn num_params(&self) -> usize {
        self.layout.total
    }

    /// Initialises every tensor by its rule in the parameter table, in buffer order, from
    /// one seeded stream. Filled tensor by tensor so the host never holds a full copy.
    pub fn init_weights(&self, be: &B, seed: u64) -> Result<()> {
        let cfg = &self.config;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let residual_std = 0.02 / ((2 * cfg.n_layer) as f32).sqrt();
        for e in &self.layout.entries {
            let mut host = vec![0.0f32; e.range.len()];
            match e.spec.init {
                Init::Zeros => {}
                Init::Ones => host.fill(1.0),
                Init::Normal => fill_normal(&mut host, 0.02, &mut rng),
                Init::NormalVocabRows => fill_normal(&mut host[..cfg.vocab_size * e.shape[1]], 0.02, &mut rng),
                Init::ResidualNormal => fill_normal(&mut host, residual_std, &mut rng),
            }
            be.write(&self.params, e.range.start, &host)?;
        }
        self.refresh_copy(be)
    }

    /// Builds the forward pass for `inputs` (B·T token ids) on `g`. With `targets`, also
    /// the mean cross-entropy. With `last_only` (forward-only graphs), the LM head runs
    /// on each sequence's last position alone. An id outside the vocabulary is an error.
    pub fn forward<'a>(
        &'a self,
        g: &mut Graph<'a, B>,
        inputs: &[i32],
        targets: Option<&[i32]>,
        b: usize,
        t: usize,
        last_only: bool,
    ) -> Result<Forward> {
        let grads = (targets.is_some() && !last_only).then_some(&self.grads);
        self.build(g, inputs, targets, grads, b, t, last_only, Attend::Full)
    }

    /// A training pass as [`Gpt2::forward`] builds it, whose backward writes the parameter
    /// gradients into `grads` (the layout's size) instead of the model's own buffer: one
    /// micro-batch's gradients apart from the others', as a rank computes its own.
    pub fn forward_into<'a>(
        &'a self,
        g: &mut Graph<'a, B>,
        inputs: &[i32],
        targets: &[i32],
        b: usize,
        t: usize,
        grads: &'a B::Buffer<f32>,
    ) -> Result<Forward> {
        self.build(g, inputs, Some(targets), Some(grads), b, t, false, Attend::Full)
    }

    /// Generation with a key/value cache: runs `inputs` (one sequence) as positions `pos..`
    /// after the `pos` positions `cache` already holds, stores their keys and values, and
    /// returns the logits of the last one, (1, Vp).
    pub fn forward_cached<'a>(
        &'a self,
        g: &mut Graph<'a, B>,
        inputs: &[i32],
        cache: &'a KvCache<B>,
        pos: usize,
    ) -> Result<Tensor> {
        let t = inputs.len();
        if t == 0 || pos + t > cache.rows().min(self.config.max_seq_len) {
            return Err(Error::Input(format!(
                "positions {pos}..{} are outside the model's context of {}",
                pos + t,
                cache.rows().min(self.config.max_seq_len)
            )));
        }
        Ok(self
            .build(g, inputs, None, None, 1, t, true, Attend::Cached { cache, pos })?
            .logits
            .expect("a pass without targets keeps its logits"))
    }

    #[allow(clippy::too_many_arguments)]
    fn build<'a>(
        &'a self,
        g: &mut Graph<'a, B>,
        inputs: &[i32],
        targets: Option<&[i32]>,
        grads: Option<&'a B::Buffer<f32>>,
        b: usize,
        t: usize,
        last_only: bool,
        attend: Attend<'a, B>,
    ) -> Result<Forward> {
        let cfg = &self.config;
        let vocab = cfg.vocab_size;
        let lay = &self.layout;
        let copy = self.params_bf16.as_ref();
        let param = |g: &mut Graph<'a, B>, e: &ParamEntry| g.param(&self.params, copy, grads, e.range.clone(), e.shape);
        let block = |g: &mut Graph<'a, B>, l: usize, p: Param| param(g, lay.block(l, p));
        // Block l's product with weight p (and its bias): in FP8 in a training pass under
        // --precision fp8.
        let fp8 = self.fp8.as_ref().filter(|_| g.records());
        let product = |g: &mut Graph<'a, B>, x: Tensor, l: usize, (p, pb): (Param, Param)| -> Result<Tensor> {
            let (w, bias) = (block(g, l, p)?, block(g, l, pb)?);
            match fp8 {
                Some(fp8) => g.matmul_fp8(x, w, Some(bias), fp8.site(l, p)),
                None => g.matmul(x, w, Some(bias)),
            }
        };
        // Token ids index the real vocabulary only (the padding rows of wte are never used).
        crate::autograd::check_ids("token id", inputs, vocab)?;
        // Generation: where the new positions start, in device memory for the kernels that
        // read it (so one recorded decode step replays at every position).
        let first = match attend {
            Attend::Full => None,
            Attend::Cached { pos, .. } => Some(g.position(pos)?),
        };
        let (wte, wpe) = (param(g, lay.get(Param::Wte))?, param(g, lay.get(Param::Wpe))?);
        // The residual stream, (BT, C).
        let mut x = g.encoder(inputs, first, wte, wpe, b, t)?;
        // In backward, passing mark l means block l's gradients are complete. Block l's first
        // layernorm is fused with the residual add that ends block l - 1, so its mark goes
        // before that op.
        g.mark(0);
        let (w, bias) = (block(g, 0, Param::Ln1W)?, block(g, 0, Param::Ln1B)?);
        let mut h = g.layernorm(x, w, bias)?;
        for l in 0..cfg.n_layer {
            // attention sub-block: x = x + proj(attn(ln1(x))), with ln2(x) in the same op
            let qkv = product(g, h, l, (Param::QkvW, Param::QkvB))?; // (BT, 3C)
            let a = match attend {
                // (BT, C); under FP8 with the projection's FP8 input
                Attend::Full => g.attention(qkv, b, t, cfg.n_head, fp8.map(|f| f.site(l, Param::AttProjW)))?,
                Attend::Cached { cache, .. } => {
                    let first = first.expect("set for cached attention above");
                    g.attention_cached(qkv, cache, l, first, cfg.n_head)?
                }
            };
            let proj = product(g, a, l, (Param::AttProjW, Param::AttProjB))?;
            let (w, bias) = (block(g, l, Param::Ln2W)?, block(g, l, Param::Ln2B)?);
            // Under FP8 the layernorm writes the MLP's FP8 input too.
            (x, h) = g.add_layernorm(x, proj, w, bias, fp8.map(|f| f.site(l, Param::FcW)))?;
            g.release(proj); // summed into x; no backward reads it
                             // MLP sub-block: x = x + fcproj(gelu(fc(ln2(x)))), with the next block's ln1(x)
                             // (or, after the last block, the final layernorm) in the same op
            let (w_fc, b_fc) = (block(g, l, Param::FcW)?, block(g, l, Param::FcB)?);
            let (w_proj, b_proj) = (block(g, l, Param::FcProjW)?, block(g, l, Param::FcProjB)?);
            let proj = match fp8 {
                Some(fp8) => {
                    let sites = [fp8.site(l, Param::FcW), fp8.site(l, Param::FcProjW)];
                    g.mlp_fp8(h, [w_fc, w_proj], [Some(b_fc), Some(b_proj)], sites)?
                }
                None => g.mlp(h, w_fc, Some(b_fc), w_proj, Some(b_proj))?, // through (BT, 4C)
            };
            let (w, bias, next) = if l + 1 < cfg.n_layer {
                g.mark(l + 1);
                let next = fp8.map(|f| f.site(l + 1, Param::QkvW)); // qkv's FP8 input too
                (block(g, l + 1, Param::Ln1W)?, block(g, l + 1, Param::Ln1B)?, next)
            } else {
                (param(g, lay.get(Param::LnfW))?, param(g, lay.get(Param::LnfB))?, None)
            };
            (x, h) = g.add_layernorm(x, proj, w, bias, next)?;
            g.release(proj);
        }
        if last_only {
            // (B, C): the last row of each sequence. With B = 1 a plain view suffices.
            assert_eq!(b, 1, "last_only supports one sequence");
            h = g.rows(h, t - 1, 1);
        }
        let (logits, loss) = g.lm_head(h, wte, targets, vocab)?; // tied LM head: (BT, Vp)
        Ok(Forward { logits, loss })
    }
}

/// What the attention of a forward pass reads: its own B·T positions, or a key/value cache
/// holding the `pos` positions before them (generation, one sequence).
enum Attend<'a, B: Backend> {
    Full,
    Cached { cache: &'a KvCache<B>, pos: usize },
}

/// A uniform sample in [0, 1) (24 random bits).
pub(crate) fn uniform(rng: &mut ChaCha8Rng) -> f32 {
    (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32
}

/// Standard normal samples (Box–Muller) scaled by `std`, in a fixed order.
fn fill_normal(out: &mut [f32], std: f32, rng: &mut ChaCha8Rng) {
    for pair in out.chunks_mut(2) {
        let u1 = uniform(rng).max(f32::MIN_POSITIVE);
        let u2 = uniform(rng);
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let th = 2.0 * std::f32::consts::PI * u2;
        pair[0] = r * th.cos();
        if pair.len() > 1 {
            pair[1] = r * th.sin();
        }
    }
}
