//! The whole GPT-2 on the CUDA backend against the CPU backend (the reference), both in fp32
//! from the same seed: (a) every parameter tensor's gradient at step 0, tolerance 1e-4 in the
//! max-norm relative error max|gpu - cpu| / max|cpu| per tensor; (b) 200 training steps on
//! identical batches through `Trainer`, each step's loss within 1e-3 (absolute) of the CPU's.
//! Needs a CUDA device: run with `--include-ignored` on a GPU machine.
#![cfg(feature = "cuda")]

mod support;

use common::autograd::{Graph, Pool, Recompute};
use common::backend::cpu::CpuBackend;
use common::backend::cuda::CudaBackend;
use common::backend::Precision;
use common::backend::{Backend, DeviceBuffer};
use common::comm::Single;
use common::data::Batch;
use common::grad_sync::SyncMode;
use common::model::{ConfigOverrides, Gpt2, ModelConfig};
use common::optim::OptimConfig;
use common::train::{Trainer, TrainerSettings};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

const GRAD_TOL: f32 = 1e-4;
const LOSS_TOL: f32 = 1e-3;

fn cpu() -> CpuBackend {
    CpuBackend::new(0).expect("CPU backend")
}

fn gpu() -> CudaBackend {
    CudaBackend::new(0, Precision::Fp32).unwrap_or_else(|e| panic!("CUDA backend: {e}"))
}

fn config(preset: &str, ov: ConfigOverrides) -> ModelConfig {
    ModelConfig::from_preset(preset, 256, ov).expect("config")
}

/// Byte-level text with structure to learn: sentences drawn from a short list by a seeded RNG.
fn corpus(len: usize) -> Vec<i32> {
    const LINES: [&str; 6] = [
        "ROMEO: But soft, what light through yonder window breaks?\n",
        "JULIET: O Romeo, Romeo, wherefore art thou Romeo?\n",
        "HAMLET: To be, or not to be, that is the question.\n",
        "MACBETH: Tomorrow, and tomorrow, and tomorrow.\n",
        "LEAR: Nothing will come of nothing. Speak again.\n",
        "PUCK: Lord, what fools these mortals be!\n",
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut out = Vec::with_capacity(len + 64);
    while out.len() < len {
        let line = LINES[(rng.next_u32() % LINES.len() as u32) as usize];
        out.extend(line.bytes().map(|x| x as i32));
    }
    out.truncate(len);
    out
}

/// `n` batches of B windows of T+1 tokens at seeded random offsets.
fn batches(n: usize, b: usize, t: usize) -> Vec<Batch> {
    let text = corpus(20_000);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    (0..n)
        .map(|_| {
            let (mut inputs, mut targets) = (Vec::new(), Vec::new());
            for _ in 0..b {
                let at = (rng.next_u32() as usize) % (text.len() - t - 1);
                inputs.extend_from_slice(&text[at..at + t]);
                targets.extend_from_slice(&text[at + 1..at + t + 1]);
            }
            Batch { inputs, targets }
        })
        .collect()
}

/// Loss and every parameter's gradient after one forward/backward from the seeded init.
fn step0<B: Backend>(be: &B, cfg: ModelConfig, batch: &Batch, b: usize, t: usize) -> (f32, Vec<f32>) {
    step0_with(be, cfg, batch, b, t, Recompute::None)
}

/// `step0`, with the outputs `recompute` names computed again in backward.
fn step0_with<B: Backend>(
    be: &B,
    cfg: ModelConfig,
    batch: &Batch,
    b: usize,
    t: usize,
    recompute: Recompute,
) -> (f32, Vec<f32>) {
    let model = Gpt2::new(be, cfg).expect("model");
    model.init_weights(be, 1337).expect("init");
    let mut pool = Pool::default();
    let mut g = Graph::new(be, &mut pool, true).with_recompute(recompute);
    let fwd = model
        .forward(&mut g, &batch.inputs, Some(&batch.targets), b, t, false)
        .expect("forward");
    let loss = fwd.loss.expect("targets given");
    g.backward(loss, 1.0).expect("backward");
    let mut l = [0.0f32];
    g.read(loss, &mut l).expect("loss");
    drop(g);
    let mut grads = vec![0.0f32; model.num_params()];
    be.read(&model.grads, 0, &mut grads).expect("grads");
    be.synchronize().expect("synchronize");
    (l[0], grads)
}

/// max|got - want| / max|want| (the difference itself when `want` is all zeros; NaN stays NaN).
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let diff = got.iter().zip(want).fold(0.0f32, |m, (g, w)| {
        let d = (g - w).abs();
        if d.is_nan() {
            f32::NAN
        } else {
            m.max(d)
        }
    });
    if scale == 0.0 {
        diff
    } else {
        diff / scale
    }
}

fn gradients_match(name: &str, cfg: ModelConfig, b: usize, t: usize) {
    gradients_match_on(name, &gpu(), cfg, b, t);
}

/// Asserts that two `step0` results are the same run: loss and every gradient the same bits.
fn assert_same_step0(what: &str, (a_loss, a): &(f32, Vec<f32>), (b_loss, b): &(f32, Vec<f32>)) {
    let same = |x: f32, y: f32| x.to_bits() == y.to_bits();
    let differ = a.iter().zip(b).filter(|&(&x, &y)| !same(x, y)).count();
    eprintln!(
        "SAME {what}: loss {a_loss} vs {b_loss}, {differ} of {} gradients differ",
        a.len()
    );
    assert!(same(*a_loss, *b_loss), "{what}: loss");
    assert_eq!(differ, 0, "{what}: gradients differ");
}

#[test]
#[ignore = "needs a CUDA device"]
fn recompute_is_bit_for_bit_with_the_fused_residual() {
    let _gpu = support::one_at_a_time();
    // Under --recompute each fused op's layernorm output is computed again by layernorm_forward
    // from the kept sum; the fused kernel shares that kernel's row code, so the run is the same
    // bit for bit: in every precision for the layernorms alone, and with GELU in fp32 and
    // tf32, where GELU runs in our kernel (bf16's GELU epilogue is recomputed by our kernel,
    // the same only to rounding).
    let cfg = config("char", ConfigOverrides::default());
    let (b, t) = (4, 64);
    let batch = &batches(1, b, t)[0];
    for precision in [Precision::Fp32, Precision::Tf32, Precision::Bf16] {
        let be = CudaBackend::new(0, precision).expect("cuda");
        let kept = step0_with(&be, cfg, batch, b, t, Recompute::None);
        let what = match precision {
            Precision::Bf16 => Recompute::Layernorm,
            _ => Recompute::All,
        };
        let again = step0_with(&be, cfg, batch, b, t, what);
        assert_same_step0(&format!("--recompute {what:?}, {precision:?}"), &kept, &again);
    }
}

fn gradients_match_on(name: &str, gpu: &CudaBackend, cfg: ModelConfig, b: usize, t: usize) {
    let batch = &batches(1, b, t)[0];
    let (cpu_loss, cpu_grads) = step0(&cpu(), cfg, batch, b, t);
    let (gpu_loss, gpu_grads) = step0(gpu, cfg, batch, b, t);
    let model_layout = common::model::ParamLayout::new(&cfg);
    let mut bad = Vec::new();
    let loss_err = (gpu_loss - cpu_loss).abs() / cpu_loss.abs();
    eprintln!("PARITY model {name:<14} loss       cpu={cpu_loss:.6} gpu={gpu_loss:.6} rel_err={loss_err:.2e}");
    if loss_err.is_nan() || loss_err > GRAD_TOL {
        bad.push(format!("loss: {loss_err:.3e}"));
    }
    let mut worst = 0.0f32;
    for e in &model_layout.entries {
        let (tensor, range) = (&e.name, e.range.clone());
        let err = rel_err(&gpu_grads[range.clone()], &cpu_grads[range]);
        worst = if err.is_nan() { err } else { worst.max(err) };
        if err.is_nan() || err > GRAD_TOL {
            bad.push(format!("{tensor}: {err:.3e}"));
        }
    }
    eprintln!(
        "PARITY model {name:<14} grads      worst tensor rel_err={worst:.2e} over {} tensors, tol={GRAD_TOL:.0e}",
        model_layout.entries.len()
    );
    assert!(bad.is_empty(), "{name}: {}", bad.join(", "));
}

#[test]
#[ignore = "needs a CUDA device"]
fn whole_model_gradients_match_cpu_at_step0() {
    let _gpu = support::one_at_a_time();
    // Head sizes 16 (tiny, odd T), 32 (char) and 64 (GPT-2's), vocabulary 256.
    gradients_match("tiny", config("tiny", ConfigOverrides::default()), 3, 37);
    gradients_match("char", config("char", ConfigOverrides::default()), 4, 64);
    let hs64 = ConfigOverrides {
        n_layer: Some(2),
        n_head: Some(4),
        n_embd: Some(256),
        max_seq_len: Some(128),
    };
    gradients_match("hs64", config("char", hs64), 2, 128);
}

/// The trainer of these tests: AdamW at lr 1e-3 after `warmup` steps of `total` (cosine to a
/// tenth), clipping at 1, `micro_batches` a step, one rank.
fn settings(warmup: u64, total: u64, micro_batches: usize) -> TrainerSettings {
    TrainerSettings {
        optim: OptimConfig::gpt2(1e-3, warmup, total),
        sync: SyncMode::Allreduce,
        micro_batches,
        recompute: Recompute::None,
        zero: false,
        grad_comm: Default::default(),
        fp8: false,
    }
}

fn train_losses<B: Backend>(be: &B, cfg: ModelConfig, batches: &[Batch], b: usize, t: usize) -> Vec<f32> {
    let settings = settings(20, batches.len() as u64, 1);
    let mut trainer = Trainer::new(be, &Single, cfg, settings).expect("trainer");
    trainer.init_weights(1337).expect("init");
    losses(&mut trainer, batches, b, t)
}

/// Every step's loss, as the steps' reports and a last flush bring them back.
fn losses<B: Backend>(trainer: &mut Trainer<'_, B>, batches: &[Batch], b: usize, t: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for (step, batch) in batches.iter().enumerate() {
        let report = trainer.step(batch, b, t, step as u64).expect("step");
        out.extend(report.finished.iter().map(|(_, s)| s.loss));
    }
    out.extend(trainer.flush().expect("flush").iter().map(|(_, s)| s.loss));
    assert_eq!(out.len(), batches.len(), "one loss per step");
    out
}

/// Losses and final parameters of `steps` steps of the char model on the GPU, the steps
/// replayed from a CUDA graph or run as queued.
fn replay_run(precision: Precision, replay: bool, micro_batches: usize) -> (Vec<f32>, Vec<f32>, bool) {
    let be = CudaBackend::new(0, precision).expect("cuda");
    char_run(&be, replay, settings(4, 12, micro_batches))
}

/// 12 steps of the char model (B=8, T=64) on `be` under `settings`: the losses, the final
/// parameters, and whether the steps were replayed.
fn char_run<B: Backend>(be: &B, replay: bool, settings: TrainerSettings) -> (Vec<f32>, Vec<f32>, bool) {
    let (b, t) = (8, 64);
    let data = batches(12, b, t);
    let cfg = config("char", ConfigOverrides::default());
    let mut trainer = Trainer::new(be, &Single, cfg, settings).expect("trainer");
    if !replay {
        trainer = trainer.run_as_queued();
    }
    trainer.init_weights(1337).expect("init");
    let losses = losses(&mut trainer, &data, b, t);
    let mut params = vec![0.0f32; trainer.model.num_params()];
    be.read(&trainer.model.params, 0, &mut params).expect("read");
    (losses, params, trainer.replaying())
}

/// The gradients a trainer leaves after one step on `batch` (b rows) in `micro` micro-batches,
/// from the seeded initial weights.
fn step_gradients<B: Backend>(be: &B, batch: &Batch, b: usize, t: usize, micro: usize) -> Vec<f32> {
    let settings = settings(1, 1, micro);
    let cfg = config("char", ConfigOverrides::default());
    let mut trainer = Trainer::new(be, &Single, cfg, settings).expect("trainer");
    trainer.init_weights(1337).expect("init");
    trainer.step(batch, b, t, 0).expect("step");
    trainer.flush().expect("flush");
    let mut grads = vec![0.0f32; trainer.model.num_params()];
    be.read(&trainer.model.grads, 0, &mut grads).expect("read");
    grads
}

/// Two micro-batches' gradients come out as two ranks' summed do: each half's gradients
/// computed alone, then added once. A half run alone is seeded with 1 rather than the
/// micro-batch's 1/2, which doubles its gradients exactly (a power of two), so the sum to
/// expect is 0.5·g0 + 0.5·g1, rounded once.
fn micro_batches_sum_as_ranks_do<B: Backend>(be: &B, what: &str) {
    let (b, t) = (8, 64);
    let batch = &batches(1, b, t)[0];
    let n = (b / 2) * t;
    let half = |i: usize| Batch {
        inputs: batch.inputs[i * n..][..n].to_vec(),
        targets: batch.targets[i * n..][..n].to_vec(),
    };
    let whole = step_gradients(be, batch, b, t, 2);
    let (g0, g1) = (
        step_gradients(be, &half(0), b / 2, t, 1),
        step_gradients(be, &half(1), b / 2, t, 1),
    );
    let differ = (whole.iter().zip(g0.iter().zip(&g1)))
        .filter(|(w, (x, y))| w.to_bits() != (0.5 * *x + 0.5 * *y).to_bits())
        .count();
    assert_eq!(
        differ,
        0,
        "{what}: {differ} of {} gradients are not the halves' sum",
        whole.len()
    );
    eprintln!(
        "MICRO {what}: {} gradients, each the halves' sum bit for bit",
        whole.len()
    );
}

#[test]
fn micro_batches_sum_as_ranks_do_on_the_cpu() {
    micro_batches_sum_as_ranks_do(&cpu(), "cpu");
}

#[test]
#[ignore = "needs a CUDA device"]
fn micro_batches_sum_as_ranks_do_on_the_gpu() {
    let _gpu = support::one_at_a_time();
    for precision in [Precision::Fp32, Precision::Bf16] {
        let be = CudaBackend::new(0, precision).expect("cuda");
        micro_batches_sum_as_ranks_do(&be, &format!("{precision:?}"));
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn replayed_steps_equal_steps_run_as_queued() {
    let _gpu = support::one_at_a_time();
    // The step recorded once as a CUDA graph and replayed runs the same kernels on the same
    // memory as the step queued op by op: the same run, bit for bit, in every precision and
    // with gradient accumulation.
    for (precision, micro) in [(Precision::Fp32, 1), (Precision::Tf32, 2), (Precision::Bf16, 1)] {
        let (want_loss, want_params, queued_replays) = replay_run(precision, false, micro);
        let (loss, params, replayed) = replay_run(precision, true, micro);
        assert!(
            !queued_replays && replayed,
            "{precision:?}: the replayed run must replay"
        );
        assert_eq!(loss, want_loss, "{precision:?} micro {micro}: losses");
        let same = params.iter().zip(&want_params).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{precision:?} micro {micro}: final parameters differ");
        eprintln!(
            "REPLAY {precision:?} micro {micro}: 12 steps equal, last loss {:.4}",
            loss[11]
        );
    }
}

/// `--precision fp8` on the GPU: the CPU's FP8 run (its reference, in f32) and the GPU's bf16
/// run within 2% a step; replayed as queued bit for bit, and again the same.
#[test]
#[ignore = "needs a CUDA device"]
fn fp8_training_follows_bf16_and_repeats() {
    let _gpu = support::one_at_a_time();
    let be = CudaBackend::new(0, Precision::Bf16).expect("cuda");
    if !be.fp8() {
        eprintln!("SKIPPED: {} has no FP8 products", be.name());
        return;
    }
    let fp8 = TrainerSettings {
        fp8: true,
        ..settings(4, 12, 1)
    };
    let (loss, params, replayed) = char_run(&be, true, fp8);
    let (queued, queued_params, _) = char_run(&be, false, fp8);
    let (again, again_params, _) = char_run(&be, true, fp8);
    assert!(replayed, "the FP8 run replays");
    assert_eq!(loss, queued, "FP8: replayed and queued losses");
    assert!(params == queued_params, "FP8: replayed and queued parameters");
    assert_eq!(loss, again, "FP8: a second run's losses");
    assert!(params == again_params, "FP8: a second run's parameters");
    let (bf16, _, _) = char_run(&be, true, settings(4, 12, 1));
    let (cpu_fp8, _, _) = char_run(&cpu(), false, fp8);
    assert_ne!(loss, bf16, "the FP8 run must differ from bf16 somewhere");
    for (step, ((f, b), c)) in loss.iter().zip(&bf16).zip(&cpu_fp8).enumerate() {
        assert!((f - b).abs() <= 0.02 * b, "step {step}: fp8 {f} vs bf16 {b}");
        assert!((f - c).abs() <= 0.02 * c, "step {step}: gpu fp8 {f} vs cpu fp8 {c}");
    }
    eprintln!(
        "FP8 12 steps: last loss {:.4} (bf16 {:.4}, cpu fp8 {:.4})",
        loss[11], bf16[11], cpu_fp8[11]
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn training_200_steps_tracks_cpu_losses() {
    let _gpu = support::one_at_a_time();
    let (b, t) = (8, 64);
    let cfg = config("char", ConfigOverrides::default());
    let data = batches(200, b, t);
    let want = train_losses(&cpu(), cfg, &data, b, t);
    let got = train_losses(&gpu(), cfg, &data, b, t);
    let mut worst = (0.0f32, 0);
    for (step, (g, c)) in got.iter().zip(&want).enumerate() {
        let diff = (g - c).abs();
        assert!(
            diff <= LOSS_TOL,
            "step {step}: gpu loss {g} vs cpu {c} (|diff| {diff:.3e} > {LOSS_TOL:.0e})"
        );
        if diff > worst.0 {
            worst = (diff, step);
        }
    }
    eprintln!(
        "PARITY train char 200 steps: loss {:.4} -> {:.4} (cpu {:.4} -> {:.4}), worst |diff| {:.2e} at step {}, tol {LOSS_TOL:.0e}",
        got[0], got[199], want[0], want[199], worst.0, worst.1
    );
    assert!(
        got[199] < got[0] - 1.0,
        "the loss must fall: {} -> {}",
        got[0],
        got[199]
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_training_200_steps_stays_within_2_percent_of_cpu() {
    let _gpu = support::one_at_a_time();
    // Mixed precision changes the rounding of every activation, so the losses are compared
    // relatively (2%, as the 500-step GPT-2 run), not to fp32 rounding.
    let (b, t) = (8, 64);
    let cfg = config("char", ConfigOverrides::default());
    let data = batches(200, b, t);
    let want = train_losses(&cpu(), cfg, &data, b, t);
    let bf16 = CudaBackend::new(0, Precision::Bf16).unwrap_or_else(|e| panic!("CUDA backend: {e}"));
    let got = train_losses(&bf16, cfg, &data, b, t);
    let mut worst = (0.0f32, 0);
    for (step, (g, c)) in got.iter().zip(&want).enumerate() {
        let rel = (g - c).abs() / c.abs();
        assert!(
            rel <= 0.02,
            "step {step}: bf16 loss {g} vs cpu {c} ({:.2}% apart)",
            100.0 * rel
        );
        if rel > worst.0 {
            worst = (rel, step);
        }
    }
    eprintln!(
        "PARITY train char 200 steps bf16: loss {:.4} -> {:.4} (cpu {:.4} -> {:.4}), worst {:.3}% at step {}",
        got[0],
        got[199],
        want[0],
        want[199],
        100.0 * worst.0,
        worst.1
    );
}

/// The logits of `model` for `batch` (forward only).
fn logits<B: Backend>(be: &B, model: &Gpt2<B>, batch: &Batch, b: usize, t: usize) -> Vec<f32> {
    let mut pool = Pool::default();
    let mut g = Graph::new(be, &mut pool, false);
    let fwd = model
        .forward(&mut g, &batch.inputs, None, b, t, false)
        .expect("forward");
    let mut out = vec![0.0f32; b * t * model.config.padded_vocab_size];
    g.read(fwd.logits.expect("logits kept"), &mut out).expect("logits");
    out
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_forward_reads_the_parameters_it_was_given() {
    let _gpu = support::one_at_a_time();
    // Parameters set from the host (as `generate` and a resumed run load them) must reach the
    // bf16 copy the forward pass reads: the logits agree with fp32 to bf16 rounding, where a
    // stale copy gives other logits altogether.
    let (b, t) = (2, 64);
    let cfg = config("char", ConfigOverrides::default());
    let batch = &batches(1, b, t)[0];
    let fp32 = gpu();
    let reference = Gpt2::new(&fp32, cfg).expect("model");
    reference.init_weights(&fp32, 7).expect("init");
    let mut host = vec![0.0f32; reference.num_params()];
    fp32.read(&reference.params, 0, &mut host).expect("params");
    let bf16 = CudaBackend::new(0, Precision::Bf16).unwrap_or_else(|e| panic!("CUDA backend: {e}"));
    let model = Gpt2::new(&bf16, cfg).expect("model");
    model.set_params(&bf16, &host).expect("set params");
    let (want, got) = (
        logits(&fp32, &reference, batch, b, t),
        logits(&bf16, &model, batch, b, t),
    );
    let err = rel_err(&got, &want);
    eprintln!("PARITY model char bf16 logits from set_params rel_err={err:.2e} (bound 5e-2)");
    assert!(err < 5e-2, "bf16 logits off by {err:.3e}");
}

/// Every gradient after one backward pass from the seeded init into a gradient buffer full of
/// NaN: the whole buffer zeroed first, or (`first_writes`) only what the products' first
/// writes leave (`Graph::zero_grads_except_first_products`).
fn grads_after_backward<B: Backend>(be: &B, first_writes: bool) -> Vec<f32> {
    grads_and_loss(be, first_writes, None).0
}

/// [`grads_after_backward`] with the step's seed announced (the loss's gradient in the
/// forward pass, as training runs it), and the language-model head over chunks of `lm_rows`
/// rows when given; also the loss.
fn grads_and_loss<B: Backend>(be: &B, first_writes: bool, lm_rows: Option<usize>) -> (Vec<f32>, f32) {
    // T = 64 of the char model's 256 positions: wpe's later rows must come out zero.
    let cfg = config("char", ConfigOverrides::default());
    let (b, t) = (4, 64);
    let batch = &batches(1, b, t)[0];
    let model = Gpt2::new(be, cfg).expect("model");
    model.init_weights(be, 1337).expect("init");
    be.write(&model.grads, 0, &vec![f32::NAN; model.grads.len()])
        .expect("write");
    let mut pool = Pool::default();
    let mut g = Graph::new(be, &mut pool, true);
    if let Some(rows) = lm_rows {
        g = g
            .with_loss_seed(1.0)
            .with_fresh_gradients(first_writes)
            .with_lm_head_rows(rows);
    }
    let fwd = model
        .forward(&mut g, &batch.inputs, Some(&batch.targets), b, t, false)
        .expect("forward");
    let loss = fwd.loss.expect("targets given");
    let mut l = [0.0f32];
    g.read(loss, &mut l).expect("loss");
    if first_writes {
        g.zero_grads_except_first_products(&model.grads).expect("zero");
    } else {
        be.zero_buffer(&model.grads);
    }
    g.backward(loss, 1.0).expect("backward");
    drop(g);
    let mut grads = vec![0.0f32; model.grads.len()];
    be.read(&model.grads, 0, &mut grads).expect("grads");
    be.synchronize().expect("synchronize");
    (grads, l[0])
}

#[test]
#[ignore = "needs a CUDA device"]
fn lm_head_in_row_chunks_equals_the_whole_logits() {
    let _gpu = support::one_at_a_time();
    // 256 rows in chunks of 96 (the last 64): the loss and every gradient as with the whole
    // (256, Vp) logits, the weight's gradient written over NaN by the first chunk.
    for precision in [Precision::Fp32, Precision::Bf16] {
        let be = CudaBackend::new(0, precision).expect("cuda");
        let (want, want_loss) = grads_and_loss(&be, true, None);
        let (got, loss) = grads_and_loss(&be, true, Some(96));
        let err = rel_err(&got, &want);
        eprintln!("LM_HEAD_CHUNKS {precision:?}: loss {loss} vs {want_loss}, gradients rel_err {err:.2e}");
        assert!(got.iter().all(|x| x.is_finite()), "{precision:?}: NaN left");
        // Products of another row count may round otherwise: bf16 outputs by their last bit.
        let bound = if precision == Precision::Bf16 { 1e-2 } else { 1e-4 };
        assert!(
            (loss - want_loss).abs() <= 1e-6 * want_loss.abs(),
            "{precision:?}: loss {loss} vs {want_loss}"
        );
        assert!(
            err < bound,
            "{precision:?}: gradients off by {err:.2e} (bound {bound:.0e})"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn first_product_writes_equal_gradients_added_to_zeros() {
    let _gpu = support::one_at_a_time();
    // The weight-gradient products with beta 0 into NaN against beta 1 into zeros: the same
    // numbers in every precision (a zero's sign aside), nothing left of the NaN.
    for precision in [Precision::Fp32, Precision::Tf32, Precision::Bf16] {
        let be = CudaBackend::new(0, precision).expect("cuda");
        let (want, got) = (grads_after_backward(&be, false), grads_after_backward(&be, true));
        assert!(
            want.iter().all(|x| x.is_finite()),
            "{precision:?}: the zeroed run is finite"
        );
        let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        eprintln!(
            "FIRST_WRITES {precision:?}: {differ} of {} gradients differ",
            want.len()
        );
        assert_eq!(differ, 0, "{precision:?}: gradients differ");
    }
}
