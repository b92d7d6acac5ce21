//! Text generation from a trained model: greedy, or sampled with temperature and top-k
//! from a seeded ChaCha stream, so a seed always gives the same text.

use crate::autograd::{Graph, Pool};
use crate::backend::Backend;
use crate::error::Result;
use crate::model::Gpt2;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

#[derive(Clone, Copy, Debug)]
pub struct SampleOptions {
    pub max_new_tokens: usize,
    /// Always take the most likely token.
    pub greedy: bool,
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    pub seed: u64,
    /// Most recent tokens the model sees: the sequence length it was trained on (positions
    /// beyond it were never trained). Capped at the model's maximum.
    pub context: usize,
}

/// Continues `prompt` (at least one token) and returns the new tokens; `on_token` sees
/// each as it is produced (for streaming output).
pub fn generate<B: Backend>(
    model: &Gpt2<B>,
    be: &B,
    pool: &mut Pool<B>,
    prompt: &[u32],
    opts: &SampleOptions,
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        crate::bail_input!("the prompt must hold at least one token");
    }
    let cfg = &model.config;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut context: Vec<i32> = prompt.iter().map(|&x| x as i32).collect();
    let mut logits = vec![0.0f32; cfg.padded_vocab_size];
    let mut out = Vec::new();
    for _ in 0..opts.max_new_tokens {
        let window = &context[context.len().saturating_sub(opts.context.clamp(1, cfg.max_seq_len))..];
        {
            let mut g = Graph::new(be, pool, false);
            let fwd = model.forward(&mut g, window, None, 1, window.len(), true)?;
            g.read(fwd.logits, &mut logits)?;
        }
        let next = pick(&logits[..cfg.vocab_size], opts, &mut rng);
        on_token(next);
        out.push(next);
        context.push(next as i32);
    }
    Ok(out)
}

/// Chooses the next token from one row of logits.
pub fn pick(logits: &[f32], opts: &SampleOptions, rng: &mut ChaCha8Rng) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold(0, |best, (i, &x)| if x > logits[best] { i } else { best })
    };
    if opts.greedy || opts.temperature <= 0.0 {
        return argmax() as u32;
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    if opts.top_k > 0 && opts.top_k < logits.len() {
        order.select_nth_unstable_by(opts.top_k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        order.truncate(opts.top_k);
        order.sort_unstable(); // a fixed order, so the draw below is reproducible
    }
    let maxv = order.iter().map(|&i| logits[i]).fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| (((logits[i] - maxv) / opts.temperature) as f64).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut r = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
    for (&i, w) in order.iter().zip(&weights) {
        if r < *w {
            return i as u32;
        }
        r -= w;
    }
    *order.last().expect("non-empty vocabulary") as u32
}
