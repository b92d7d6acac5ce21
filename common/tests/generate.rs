//! Generation with the key/value cache against generation without it (every token runs the
//! whole sequence again): the same greedy tokens, on the CPU in fp32 and (GPU test) for 64
//! tokens on the GPU in fp32; and where generation stops at the model's context.

#[cfg(feature = "cuda")]
mod support;

use common::autograd::Pool;
use common::backend::cpu::CpuBackend;
use common::backend::Backend;
use common::generate::{generate, Generated, SampleOptions, Stop};
use common::model::{ConfigOverrides, Gpt2, ModelConfig};
use std::ops::ControlFlow;

/// A tiny byte model (2 blocks, width 32) of `positions` positions with GPT-2's
/// initialisation scaled up 6 times, so that its next-token distributions are peaked like a
/// trained model's and greedy choices are not near-ties that rounding could flip; with its
/// parameters, to load elsewhere.
fn model<B: Backend>(be: &B, positions: usize) -> (Gpt2<B>, Vec<f32>) {
    let ov = ConfigOverrides {
        max_seq_len: Some(positions),
        ..ConfigOverrides::default()
    };
    let cfg = ModelConfig::from_preset("tiny", 256, ov).unwrap();
    let model = Gpt2::new(be, cfg).unwrap();
    model.init_weights(be, 7).unwrap();
    let mut host = vec![0.0f32; model.num_params()];
    be.read(&model.params, 0, &mut host).unwrap();
    host.iter_mut().for_each(|x| *x *= 6.0);
    model.set_params(be, &host).unwrap();
    (model, host)
}

fn greedy<B: Backend>(model: &Gpt2<B>, be: &B, prompt: &[u32], n: usize, kv_cache: bool) -> Generated {
    let opts = SampleOptions {
        max_new_tokens: n,
        greedy: true,
        kv_cache,
        ..SampleOptions::default()
    };
    generate(model, be, &mut Pool::default(), prompt, &opts, |_| {
        ControlFlow::Continue(())
    })
    .unwrap()
}

const PROMPT: &[u32] = &[82, 79, 77, 69, 79, 58, 10]; // "ROMEO:\n"

#[test]
fn greedy_with_the_cache_equals_greedy_without_it_on_the_cpu() {
    let be = CpuBackend::new(2).unwrap();
    let (model, _) = model(&be, 64);
    let n = 64 - PROMPT.len(); // up to the context
    let (cached, full) = (
        greedy(&model, &be, PROMPT, n, true),
        greedy(&model, &be, PROMPT, n, false),
    );
    assert_eq!(cached.tokens.len(), n);
    assert_eq!(cached.tokens, full.tokens);
    // Not one token more than the context holds, with or without the cache.
    for kv_cache in [true, false] {
        let over = greedy(&model, &be, PROMPT, n + 5, kv_cache);
        assert_eq!(over.stop, Stop::Context { limit: 64 });
        assert_eq!(over.tokens, cached.tokens);
    }
    // Distinct tokens: the model does not just repeat one.
    let mut distinct = cached.tokens.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 3, "{:?}", cached.tokens);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn greedy_with_the_cache_equals_greedy_without_it_on_the_gpu_fp32() {
    let _gpu = support::one_at_a_time();
    use common::backend::cuda::CudaBackend;
    use common::backend::Precision;
    let gpu = CudaBackend::new(0, Precision::Fp32).unwrap_or_else(|e| panic!("CUDA backend: {e}"));
    // 64 new tokens after the prompt: a model of 128 positions.
    let (long, host) = model(&gpu, 128);
    let (cached, full) = (
        greedy(&long, &gpu, PROMPT, 64, true),
        greedy(&long, &gpu, PROMPT, 64, false),
    );
    assert_eq!(cached.tokens.len(), 64);
    assert_eq!(cached.tokens, full.tokens);
    // And the CPU's tokens, from the same weights.
    let cpu = CpuBackend::new(0).unwrap();
    let on_cpu = Gpt2::new(&cpu, long.config).unwrap();
    on_cpu.set_params(&cpu, &host).unwrap();
    assert_eq!(greedy(&on_cpu, &cpu, PROMPT, 64, true).tokens, cached.tokens);
}
