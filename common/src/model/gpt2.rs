//! GPT-2 over any backend: the flat parameter and gradient buffers, GPT-2's
//! initialisation, and the forward pass written as autograd ops. Backward is the tape's.

use super::{ModelConfig, ParamLayout};
use crate::autograd::{Graph, Tensor};
use crate::backend::{Backend, DevPtr, DeviceBuffer};
use crate::error::Result;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

pub struct Gpt2<B: Backend> {
    pub config: ModelConfig,
    pub layout: ParamLayout,
    /// Every parameter, in one buffer (see [`ParamLayout`]).
    pub params: B::Buffer,
    /// Gradients, same layout as `params`.
    pub grads: B::Buffer,
}

/// What a forward pass returns.
pub struct Forward {
    /// (B·T, Vp), or (B, Vp) when only the last position was asked for.
    pub logits: Tensor,
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
        Ok(Gpt2 {
            config,
            layout,
            params,
            grads,
        })
    }

    pub fn num_params(&self) -> usize {
        self.layout.total
    }

    /// GPT-2's initialisation: weights N(0, 0.02), the two residual projections of each
    /// block N(0, 0.02/√(2·layers)), biases 0, layernorm gains 1. Padded vocabulary rows
    /// stay 0. Filled tensor by tensor so the host never holds a full copy.
    pub fn init_weights(&self, be: &B, seed: u64) -> Result<()> {
        let cfg = &self.config;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let residual_std = 0.02 / ((2 * cfg.n_layer) as f32).sqrt();
        for (name, range) in self.layout.named(cfg) {
            let kind = name.rsplit('.').next().unwrap_or(&name);
            let mut host = vec![0.0f32; range.len()];
            match kind {
                "ln1w" | "ln2w" | "lnfw" => host.fill(1.0),
                "wte" => fill_normal(&mut host[..cfg.vocab_size * cfg.n_embd], 0.02, &mut rng),
                "wpe" | "qkvw" | "fcw" => fill_normal(&mut host, 0.02, &mut rng),
                "attprojw" | "fcprojw" => fill_normal(&mut host, residual_std, &mut rng),
                _ => {} // biases
            }
            be.upload_f32(self.params.ptr().add(range.start), &host)?;
        }
        Ok(())
    }

    /// Builds the forward pass for `inputs` (B·T token ids) on `g`. With `targets`, also
    /// the mean cross-entropy. With `last_only` (forward-only graphs), the LM head runs
    /// on each sequence's last position alone.
    pub fn forward(
        &self,
        g: &mut Graph<B>,
        inputs: &[i32],
        targets: Option<&[i32]>,
        b: usize,
        t: usize,
        last_only: bool,
    ) -> Result<Forward> {
        let cfg = &self.config;
        let (c, nh) = (cfg.n_embd, cfg.n_head);
        let (pp, gp) = (self.params.ptr(), self.grads.ptr());
        let training = targets.is_some() && !last_only;
        let p = |g: &mut Graph<B>, off: usize, shape: [usize; 2]| {
            let grad = training.then(|| gp.add(off));
            g.param(pp.add(off), grad, shape)
        };
        let lay = &self.layout;
        let wte = p(g, lay.wte, [cfg.padded_vocab_size, c]);
        let wpe = p(g, lay.wpe, [cfg.max_seq_len, c]);
        let tokens = g.tokens(inputs)?;
        let mut x = g.encoder(tokens, wte, wpe, b, t)?; // (BT, C)
        for (i, l) in lay.layers.iter().enumerate() {
            // In backward, passing this mark means block i's gradients are complete.
            g.mark(i);
            // attention sub-block: x = x + proj(attn(ln1(x)))
            let (w, bias) = (p(g, l.ln1w, [1, c]), p(g, l.ln1b, [1, c]));
            let h = g.layernorm(x, w, bias)?;
            let (w, bias) = (p(g, l.qkvw, [3 * c, c]), p(g, l.qkvb, [1, 3 * c]));
            let qkv = g.matmul(h, w, Some(bias))?; // (BT, 3C)
            let a = g.attention(qkv, b, t, nh)?; // (BT, C)
            let (w, bias) = (p(g, l.attprojw, [c, c]), p(g, l.attprojb, [1, c]));
            let proj = g.matmul(a, w, Some(bias))?;
            x = g.add(x, proj)?;
            // MLP sub-block: x = x + fcproj(gelu(fc(ln2(x))))
            let (w, bias) = (p(g, l.ln2w, [1, c]), p(g, l.ln2b, [1, c]));
            let h = g.layernorm(x, w, bias)?;
            let (w, bias) = (p(g, l.fcw, [4 * c, c]), p(g, l.fcb, [1, 4 * c]));
            let fc = g.matmul(h, w, Some(bias))?; // (BT, 4C)
            let act = g.gelu(fc)?;
            let (w, bias) = (p(g, l.fcprojw, [c, 4 * c]), p(g, l.fcprojb, [1, c]));
            let proj = g.matmul(act, w, Some(bias))?;
            x = g.add(x, proj)?;
        }
        let (w, bias) = (p(g, lay.lnfw, [1, c]), p(g, lay.lnfb, [1, c]));
        let mut h = g.layernorm(x, w, bias)?;
        if last_only {
            // (B, C): the last row of each sequence. With B = 1 a plain view suffices.
            assert_eq!(b, 1, "last_only supports one sequence");
            h = g.rows(h, t - 1, 1);
        }
        let logits = g.matmul(h, wte, None)?; // tied LM head: (BT, Vp)
        let loss = match targets {
            Some(tg) => {
                let tp: DevPtr = g.tokens(tg)?;
                Some(g.cross_entropy(logits, tp, cfg.vocab_size)?)
            }
            None => None,
        };
        Ok(Forward { logits, loss })
    }
}

/// Standard normal samples (Box–Muller) scaled by `std`, in a fixed order.
fn fill_normal(out: &mut [f32], std: f32, rng: &mut ChaCha8Rng) {
    let uniform = |rng: &mut ChaCha8Rng| (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32;
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
