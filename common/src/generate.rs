//! Text generation from a trained model: greedy, or sampled with temperature, top-k and top-p
//! from a seeded ChaCha stream, so a seed always gives the same text.
//!
//! With the key/value cache (the default) the prompt runs through the model once, then each
//! new token runs as one position against the cached keys and values of every earlier one,
//! and the LM head runs on the last position only. Without it, every token runs the whole
//! sequence again: the reference the cache is tested against (and `train`'s closing sample,
//! whose window slides past the context).

use crate::autograd::{Graph, KvCache, Pool, TokenStage};
use crate::backend::replay::Recorder;
use crate::backend::{Backend, DeviceBuffer};
use crate::error::Result;
use crate::model::Gpt2;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct SampleOptions {
    pub max_new_tokens: usize,
    /// Always take the most likely token.
    pub greedy: bool,
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Then keep only the most likely tokens whose probabilities add up to `top_p` (nucleus
    /// sampling; 1: all).
    pub top_p: f32,
    pub seed: u64,
    /// The ChaCha stream of `seed` to draw from: prompt i of a batch draws from stream i, so
    /// its text does not depend on the prompts before it.
    pub stream: u64,
    /// Most tokens the model sees: the sequence length it was trained on (positions beyond
    /// it were never trained). Capped at the model's maximum.
    pub context: usize,
    /// The token that ends a text (GPT-2's `<|endoftext|>`): generation stops there, and it
    /// is not returned.
    pub end_of_text: Option<u32>,
    /// Keep keys and values of processed positions (see the module's documentation).
    pub kv_cache: bool,
    /// Without the cache: past the context, the model sees the last `context` tokens only,
    /// instead of generation stopping there.
    pub slide: bool,
}

impl Default for SampleOptions {
    fn default() -> Self {
        SampleOptions {
            max_new_tokens: 300,
            greedy: false,
            temperature: 0.8,
            top_k: 40,
            top_p: 1.0,
            seed: 42,
            stream: 0,
            context: usize::MAX,
            end_of_text: None,
            kv_cache: true,
            slide: false,
        }
    }
}

impl SampleOptions {
    /// The context a model of `max_seq_len` positions generates in.
    fn context_of(&self, max_seq_len: usize) -> usize {
        self.context.clamp(1, max_seq_len)
    }

    /// Whether the window slides past the context (only without the cache).
    fn slides(&self) -> bool {
        self.slide && !self.kv_cache
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `max_new_tokens` were generated.
    Length,
    /// The model produced the end-of-text token.
    EndOfText,
    /// The caller's `on_token` asked to stop (a stop string).
    Caller,
    /// Prompt and new tokens fill the context (`limit` tokens) and the window does not slide.
    Context { limit: usize },
}

/// New tokens, why they ended, and where the time went.
#[derive(Clone, Debug)]
pub struct Generated {
    pub tokens: Vec<u32>,
    pub stop: Stop,
    /// The first forward pass (the whole prompt) with its logits read back.
    pub prefill: Duration,
    /// Every later forward pass, with their logits read back (sampling excluded).
    pub decode: Duration,
}

/// Whether a prompt of `tokens` leaves room for a new token in the context `opts` gives a model
/// of `max_seq_len` positions (checked before any output: of every prompt of a batch first).
pub fn check_prompt(tokens: usize, max_seq_len: usize, opts: &SampleOptions) -> Result<()> {
    if tokens == 0 {
        crate::bail_input!("the prompt must hold at least one token");
    }
    let context = opts.context_of(max_seq_len);
    if tokens >= context && !opts.slides() {
        crate::bail_input!(
            "the prompt is {tokens} tokens: no room for a new one in the model's context of {context} tokens"
        );
    }
    Ok(())
}

/// Continues `prompt` (at least one token) and returns the new tokens; `on_token` sees each
/// as it is produced (for streaming output) and may end generation with `Break`.
pub fn generate<B: Backend>(
    model: &Gpt2<B>,
    be: &B,
    pool: &mut Pool<B>,
    prompt: &[u32],
    opts: &SampleOptions,
    mut on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Generated> {
    check_prompt(prompt.len(), model.config.max_seq_len, opts)?;
    let cfg = &model.config;
    let (context, slide) = (opts.context_of(cfg.max_seq_len), opts.slides());
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    rng.set_stream(opts.stream);
    let cache = match opts.kv_cache {
        true => Some(KvCache::new(be, cfg.n_layer, context, cfg.n_embd)?),
        false => None,
    };
    let mut seq: Vec<i32> = prompt.iter().map(|&x| x as i32).collect();
    let mut cached = 0; // positions whose keys and values the cache holds
    let mut logits = vec![0.0f32; cfg.padded_vocab_size];
    let mut replay = match (&cache, be.records() && !graph_off()) {
        (Some(_), true) => Some(DecodeReplay::new(be, cfg.padded_vocab_size)?),
        _ => None,
    };
    let mut done = Generated {
        tokens: Vec::new(),
        stop: Stop::Length,
        prefill: Duration::ZERO,
        decode: Duration::ZERO,
    };
    while done.tokens.len() < opts.max_new_tokens {
        if seq.len() >= context && !slide {
            done.stop = Stop::Context { limit: context };
            break;
        }
        let started = Instant::now();
        if let (Some(replay), Some(cache), 1) = (&mut replay, &cache, seq.len() - cached) {
            // A decode step: one position, recorded once and replayed (see DecodeReplay).
            replay.step(model, be, pool, cache, seq[cached], cached, &mut logits)?;
        } else {
            let mut g = Graph::new(be, pool, false);
            let last = match &cache {
                Some(cache) => model.forward_cached(&mut g, &seq[cached..], cache, cached)?,
                None => {
                    let window = &seq[seq.len().saturating_sub(context)..];
                    model
                        .forward(&mut g, window, None, 1, window.len(), true)?
                        .logits
                        .expect("a pass without targets keeps its logits")
                }
            };
            g.read(last, &mut logits)?;
        }
        cached = seq.len();
        *match done.tokens.is_empty() {
            true => &mut done.prefill,
            false => &mut done.decode,
        } += started.elapsed();
        let next = pick(&logits[..cfg.vocab_size], opts, &mut rng);
        if Some(next) == opts.end_of_text {
            done.stop = Stop::EndOfText;
            break;
        }
        done.tokens.push(next);
        seq.push(next as i32);
        if on_token(next).is_break() {
            done.stop = Stop::Caller;
            break;
        }
    }
    Ok(done)
}

/// `GPT2_CUDA_GRAPH=0`: decode steps run op by op, never recorded (as in training).
fn graph_off() -> bool {
    std::env::var("GPT2_CUDA_GRAPH").is_ok_and(|v| v == "0")
}

/// Decode steps (one new position against the cache) on a backend that records (a GPU): the
/// step's launches are recorded once as a CUDA graph and replayed for every later token, so a
/// token costs one launch instead of one per kernel. What changes from token to token (the
/// token id and its position) is staged at fixed device memory before each replay and read
/// there by the kernels; the last position's logits are copied inside the step into a buffer
/// of their own, read after it. The record-then-replay logic is training's
/// ([`Recorder`]): the first decode step runs op by op (it sizes the buffer pool and the
/// scratch), the second is recorded; memory moved (a scratch grown, the staging buffer
/// elsewhere) records again.
struct DecodeReplay<B: Backend> {
    stage: TokenStage<B>,
    /// The logits of the last decode step (padded vocabulary, activation words).
    logits: B::Buffer<f32>,
    /// Keyed by where the memory is: the scratch's epoch and the staging buffer.
    recorder: Recorder<B, (u64, u64)>,
}

impl<B: Backend> DecodeReplay<B> {
    fn new(be: &B, vocab: usize) -> Result<Self> {
        Ok(DecodeReplay {
            stage: TokenStage::default(),
            logits: be.alloc(be.act().words(vocab))?,
            recorder: Recorder::default(),
        })
    }

    /// Runs `token` at position `pos` and writes its logits into `out`.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        model: &Gpt2<B>,
        be: &B,
        pool: &mut Pool<B>,
        cache: &KvCache<B>,
        token: i32,
        pos: usize,
        out: &mut [f32],
    ) -> Result<()> {
        // In the order the model asks for them: the position, then the token id.
        self.stage.stage(be, vec![vec![pos as i32], vec![token]])?;
        let key = |stage: &TokenStage<B>| (be.memory_epoch(), stage.addr());
        let (stage, logits) = (&self.stage, &self.logits);
        self.recorder.run(be, key(stage), || {
            let mut g = Graph::new(be, pool, false).with_tokens(stage);
            let last = model.forward_cached(&mut g, &[token], cache, pos)?;
            g.copy_act_into(last, logits)?;
            Ok(key(stage))
        })?;
        be.download_act(self.logits.span().words_as(be.act(), out.len()), out)
    }
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
    }
    let maxv = order.iter().map(|&i| logits[i]).fold(f32::NEG_INFINITY, f32::max);
    let weight = |i: usize| (((logits[i] - maxv) / opts.temperature) as f64).exp();
    if opts.top_p < 1.0 {
        // The most likely first (ties by id), up to the first whose running mass reaches top_p.
        order.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let total: f64 = order.iter().map(|&i| weight(i)).sum();
        let mut mass = 0.0;
        let keep = order
            .iter()
            .position(|&i| {
                mass += weight(i);
                mass >= opts.top_p as f64 * total
            })
            .map_or(order.len(), |last| last + 1);
        order.truncate(keep);
    }
    order.sort_unstable(); // a fixed order, so the draw below is reproducible
    let weights: Vec<f64> = order.iter().map(|&i| weight(i)).collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(top_k: usize, top_p: f32) -> SampleOptions {
        SampleOptions {
            temperature: 1.0,
            top_k,
            top_p,
            ..SampleOptions::default()
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_that_reaches_the_mass() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 (logits are their logs).
        let logits: Vec<f32> = [0.5f32, 0.25, 0.125, 0.125].iter().map(|p| p.ln()).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let draws = |p: f32, rng: &mut ChaCha8Rng| -> Vec<u32> {
            (0..2000).map(|_| pick(&logits, &sampled(0, p), rng)).collect()
        };
        assert!(draws(0.5, &mut rng).iter().all(|&t| t == 0));
        let two = draws(0.7, &mut rng);
        assert!(two.iter().all(|&t| t < 2) && two.contains(&1));
        let all = draws(1.0, &mut rng);
        assert!(all.contains(&3) && all.contains(&2));
    }

    #[test]
    fn a_seed_and_stream_give_the_same_draws() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |stream: u64| -> Vec<u32> {
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            rng.set_stream(stream);
            (0..100).map(|_| pick(&logits, &sampled(10, 0.9), &mut rng)).collect()
        };
        assert_eq!(run(0), run(0));
        assert_ne!(run(0), run(1));
    }
}
