//! `bench --generate`: times text generation with the key/value cache on a model with random
//! weights, in its three parts: start-up (the backend, with its kernels, and the model made
//! ready), the prompt (prefill: `--seq-len` tokens in one forward pass) and decoding
//! (`--new-tokens`, one position each), each run reading its logits back as generation does.

use crate::autograd::Pool;
use crate::backend::Backend;
use crate::cli::BenchArgs;
use crate::error::Result;
use crate::generate::{self, SampleOptions};
use crate::model::Gpt2;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

#[derive(Debug, serde::Serialize)]
pub struct GenerateReport {
    pub device: String,
    pub model: String,
    pub params: usize,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    /// Timed generations (after `--warmup` untimed ones); the figures are their medians.
    pub runs: u64,
    /// From before the backend was made until the model was ready (kernels compiled or loaded
    /// from the cache, weights allocated and initialised).
    pub startup_s: f64,
    pub prefill_ms: f64,
    pub prefill_tokens_per_s: f64,
    /// Per new token after the first (the first comes from the prefill).
    pub decode_ms_per_token: f64,
    pub decode_tokens_per_s: f64,
    pub peak_device_mb: f64,
}

/// `started` is when the backend began to be made.
pub fn generate<B: Backend>(be: &B, args: &BenchArgs, started: Instant) -> Result<GenerateReport> {
    let config = args.model.config(args.vocab)?;
    let (prompt_len, new_tokens) = (args.seq_len, args.new_tokens);
    if prompt_len
        .checked_add(new_tokens)
        .is_none_or(|n| n > config.max_seq_len)
    {
        crate::bail_input!(
            "--seq-len {prompt_len} (the prompt) + --new-tokens {new_tokens} must fit the model's {} positions",
            config.max_seq_len
        );
    }
    let model = Gpt2::new(be, config)?;
    model.init_weights(be, 1337)?;
    be.synchronize()?;
    let startup_s = started.elapsed().as_secs_f64();

    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|_| rng.next_u32() % config.vocab_size as u32)
        .collect();
    let opts = SampleOptions {
        max_new_tokens: new_tokens,
        greedy: true,
        context: config.max_seq_len,
        ..SampleOptions::default()
    };
    let mut pool = Pool::default();
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for run in 0..args.warmup + args.steps {
        let done = generate::generate(&model, be, &mut pool, &prompt, &opts, |_| ControlFlow::Continue(()))?;
        if run >= args.warmup {
            prefill.push(done.prefill);
            decode.push(done.decode);
        }
    }
    let (prefill, decode) = (median(prefill).as_secs_f64(), median(decode).as_secs_f64());
    let decoded = new_tokens.saturating_sub(1).max(1) as f64;
    Ok(GenerateReport {
        device: be.name(),
        model: args.model.preset.clone().unwrap_or_else(|| "char".into()),
        params: config.num_params(),
        prompt_tokens: prompt_len,
        new_tokens,
        runs: args.steps,
        startup_s,
        prefill_ms: prefill * 1e3,
        prefill_tokens_per_s: prompt_len as f64 / prefill,
        decode_ms_per_token: decode * 1e3 / decoded,
        decode_tokens_per_s: decoded / decode,
        peak_device_mb: be.peak_memory_bytes() as f64 / (1 << 20) as f64,
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}
