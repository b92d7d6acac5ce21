//! FP8 training (`--precision fp8`) on the CPU backend, the reference of the GPU's: delayed
//! scaling's step, the transposed quantization, and whole runs of the tiny model: they learn
//! as fp32 does, repeat bit for bit, and resume exactly with the scales the checkpoint carries;
//! on two ranks (threads) the scales agree, and the run is one rank's two micro-batches.

use common::autograd::Recompute;
use common::backend::cpu::CpuBackend;
use common::backend::{fp8_rescale_slot, Backend, DeviceBuffer, Fp8, Fp8Slot};
use common::backend::{DevPtr, DeviceStream};
use common::checkpoint::{Checkpoint, CheckpointMeta};
use common::comm::{Comm, Single, Words};
use common::data::Batch;
use common::error::Result;
use common::grad_sync::SyncMode;
use common::model::{ConfigOverrides, ModelConfig};
use common::optim::OptimConfig;
use common::train::{Trainer, TrainerSettings};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::ops::Range;
use std::sync::{Arc, Barrier, Mutex};

#[test]
fn rescaling_pushes_the_amax_and_takes_a_power_of_two_below_the_headroom() {
    let mut slot = Fp8Slot::fresh(Fp8::E4M3);
    let mut history = [0.0f32; 4];
    // No amax yet: the scale stays 1.
    fp8_rescale_slot(&mut slot, &mut history);
    assert_eq!(slot, [1.0, 1.0, 0.0, 448.0]);
    // amax 3: 448 / 3 = 149.3, so 2^7 = 128 (3 · 128 = 384 ≤ 448), dequant 2^-7 exactly.
    slot[Fp8Slot::AMAX] = 3.0;
    fp8_rescale_slot(&mut slot, &mut history);
    assert_eq!(slot, [1.0 / 128.0, 128.0, 0.0, 448.0]);
    assert_eq!(history, [3.0, 0.0, 0.0, 0.0]);
    // A smaller amax later: the history's largest (3) still rules.
    slot[Fp8Slot::AMAX] = 0.5;
    fp8_rescale_slot(&mut slot, &mut history);
    assert_eq!((slot[Fp8Slot::SCALE], history), (128.0, [0.5, 3.0, 0.0, 0.0]));
    // A non-finite amax (a skipped step) is not pushed.
    slot[Fp8Slot::AMAX] = f32::NAN;
    fp8_rescale_slot(&mut slot, &mut history);
    assert_eq!((slot[Fp8Slot::AMAX], history), (0.0, [0.5, 3.0, 0.0, 0.0]));
    // Once 3 falls off the end, 0.5 rules: 448 / 0.5 = 896, so 2^9 = 512.
    for _ in 0..3 {
        slot[Fp8Slot::AMAX] = 0.25;
        fp8_rescale_slot(&mut slot, &mut history);
    }
    assert_eq!(history, [0.25, 0.25, 0.25, 0.5]);
    assert_eq!(slot[Fp8Slot::SCALE], 512.0);
    // A tiny amax: the scale stops at 2^126, not infinity.
    slot[Fp8Slot::AMAX] = 1e-38;
    let mut one = [0.0f32];
    fp8_rescale_slot(&mut slot, &mut one);
    assert_eq!(slot[Fp8Slot::SCALE], 2f32.powi(126));
    // E5M2: 57344 / 1e-3 = 5.7e7, so 2^25.
    let mut slot = Fp8Slot::fresh(Fp8::E5M2);
    slot[Fp8Slot::AMAX] = 1e-3;
    fp8_rescale_slot(&mut slot, &mut [0.0; 2]);
    assert_eq!(slot[Fp8Slot::SCALE], 2f32.powi(25));
}

#[test]
fn the_transposed_quantization_is_the_quantization_transposed() {
    let be = CpuBackend::new(1).unwrap();
    let (rows, cols) = (48, 80);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let src: Vec<f32> = (0..rows * cols)
        .map(|_| (rng.next_u32() as f32 / u32::MAX as f32 - 0.5) * 40.0)
        .collect();
    let host = |n: usize| be.alloc::<f32>(n).unwrap();
    let (x, scale) = (host(rows * cols), host(1));
    be.write(&x, 0, &src).unwrap();
    be.write(&scale, 0, &[4.0]).unwrap();
    let (plain, transposed) = (
        be.alloc::<u8>(rows * cols).unwrap(),
        be.alloc::<u8>(rows * cols).unwrap(),
    );
    let (amax_plain, amax_t) = (host(1), host(1));
    for format in [Fp8::E4M3, Fp8::E5M2] {
        be.zero_buffer(&amax_plain);
        be.zero_buffer(&amax_t);
        let src_act = x.span().act();
        be.quantize_fp8(
            plain.span(),
            amax_plain.span(),
            src_act,
            scale.span(),
            rows * cols,
            format,
        );
        be.quantize_fp8_transposed(
            transposed.span(),
            amax_t.span(),
            src_act,
            scale.span(),
            [rows, cols],
            format,
        );
        let (mut p, mut t) = (vec![0u8; rows * cols], vec![0u8; rows * cols]);
        be.read(&plain, 0, &mut p).unwrap();
        be.read(&transposed, 0, &mut t).unwrap();
        for i in 0..rows {
            for j in 0..cols {
                assert_eq!(t[j * rows + i], p[i * cols + j], "{format:?} ({i}, {j})");
            }
        }
        let (mut a, mut b) = ([0.0f32], [0.0f32]);
        be.read(&amax_plain, 0, &mut a).unwrap();
        be.read(&amax_t, 0, &mut b).unwrap();
        assert_eq!(a[0].to_bits(), b[0].to_bits());
        assert!(a[0] > 19.0 && a[0] <= 20.0, "amax {}", a[0]);
    }
}

const B: usize = 4;
const T: usize = 32;

fn tiny() -> ModelConfig {
    ModelConfig::from_preset("tiny", 256, ConfigOverrides::default()).unwrap()
}

fn settings(fp8: bool, total: u64) -> TrainerSettings {
    TrainerSettings {
        optim: OptimConfig::gpt2(3e-3, 2, total),
        sync: SyncMode::Allreduce,
        micro_batches: 1,
        recompute: Recompute::None,
        zero: false,
        grad_comm: Default::default(),
        fp8,
    }
}

/// Byte-level batches of a repeated sentence with some noise: something to learn fast.
fn batches(n: usize) -> Vec<Batch> {
    let text = b"the cat sat on the mat and the dog lay by the door. ";
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    (0..n)
        .map(|_| {
            let start = rng.next_u32() as usize % text.len();
            let ids: Vec<i32> = (0..B * T + 1)
                .map(|k| match rng.next_u32() % 11 {
                    0 => b"aeiou"[rng.next_u32() as usize % 5] as i32, // noise
                    _ => text[(start + k) % text.len()] as i32,
                })
                .collect();
            Batch {
                inputs: ids[..B * T].to_vec(),
                targets: ids[1..].to_vec(),
            }
        })
        .collect()
}

fn run<'a>(trainer: &mut Trainer<'a, CpuBackend>, data: &[Batch], first: u64) -> Vec<f32> {
    let mut losses = Vec::new();
    for (i, batch) in data.iter().enumerate() {
        let report = trainer.step(batch, B, T, first + i as u64).unwrap();
        losses.extend(report.finished.iter().map(|(_, s)| s.loss));
    }
    losses
}

fn params(be: &CpuBackend, trainer: &Trainer<'_, CpuBackend>) -> Vec<f32> {
    let mut p = vec![0.0; trainer.model.num_params()];
    be.read(&trainer.model.params, 0, &mut p).unwrap();
    p
}

#[test]
fn fp8_training_learns_as_fp32_does_and_repeats() {
    let be = CpuBackend::new(2).unwrap();
    let data = batches(30);
    let train = |fp8: bool| {
        let mut trainer = Trainer::new(&be, &Single, tiny(), settings(fp8, 30)).unwrap();
        trainer.init_weights(7).unwrap();
        let losses = run(&mut trainer, &data, 0);
        (losses, params(&be, &trainer))
    };
    let (fp32, _) = train(false);
    let (fp8, weights) = train(true);
    assert_ne!(fp8, fp32, "the FP8 run must round somewhere");
    let (first, last) = (fp8[0], fp8[29]);
    assert!(last < 0.6 * first, "FP8 learns: {first} -> {last}");
    let gap = (fp8[29] - fp32[29]).abs() / fp32[29];
    assert!(gap < 0.03, "FP8 ends within 3% of fp32: {} vs {}", fp8[29], fp32[29]);
    let (again, weights_again) = train(true);
    assert_eq!(again, fp8, "an FP8 run repeats bit for bit");
    assert!(weights == weights_again);
}

fn meta(trainer: &Trainer<'_, CpuBackend>, step: u64) -> CheckpointMeta {
    CheckpointMeta {
        config: tiny(),
        tokenizer: "byte".into(),
        step,
        data_epoch: 0,
        data_step_in_epoch: step,
        data_order: None,
        seed: 7,
        train: serde_json::json!({}),
        progress: serde_json::json!({}),
        data: None,
        fp8: trainer.fp8_state().unwrap(),
    }
}

#[test]
fn an_fp8_run_resumes_exactly_with_the_checkpoints_scales() {
    let be = CpuBackend::new(2).unwrap();
    let data = batches(8);
    let fresh = || Trainer::new(&be, &Single, tiny(), settings(true, 8)).unwrap();
    let mut whole = fresh();
    whole.init_weights(7).unwrap();
    let losses = run(&mut whole, &data, 0);

    let mut first = fresh();
    first.init_weights(7).unwrap();
    let mut resumed_losses = run(&mut first, &data[..4], 0);
    let [p, m, v] = first
        .state_on_root([Vec::new(), Vec::new(), Vec::new()])
        .unwrap()
        .unwrap();
    let ckpt = Checkpoint {
        meta: meta(&first, 4),
        params: p,
        m,
        v,
    };
    // Through the file's JSON, as a checkpoint carries them.
    let json = serde_json::to_string(&ckpt.meta).unwrap();
    let meta_back: CheckpointMeta = serde_json::from_str(&json).unwrap();
    assert_eq!(meta_back, ckpt.meta);
    let resume = |fp8: Option<Vec<f32>>| {
        let mut second = fresh();
        let mut meta = meta_back.clone();
        meta.fp8 = fp8;
        second
            .restore(Some(Checkpoint {
                meta,
                params: ckpt.params.clone(),
                m: ckpt.m.clone(),
                v: ckpt.v.clone(),
            }))
            .unwrap();
        let later = run(&mut second, &data[4..], 4);
        (later, params(&be, &second))
    };
    let (later, weights) = resume(meta_back.fp8.clone());
    resumed_losses.extend(later);
    assert_eq!(resumed_losses, losses, "resumed with its scales: the same losses");
    assert!(weights == params(&be, &whole), "and the same weights");
    // Without them (scales calibrated afresh), the run goes elsewhere: the scales matter.
    let (_, elsewhere) = resume(None);
    assert!(elsewhere != weights, "fresh scales give other weights");
}

#[test]
fn fp8_refuses_widths_its_products_cannot_take() {
    let be = CpuBackend::new(1).unwrap();
    let odd = ModelConfig::from_preset(
        "tiny",
        256,
        ConfigOverrides {
            n_embd: Some(24),
            ..Default::default()
        },
    )
    .unwrap();
    let e = Trainer::new(&be, &Single, odd, settings(true, 1))
        .err()
        .expect("refused");
    let text = e.to_string();
    assert!(
        text.contains("--precision fp8") && text.contains("multiples of 16"),
        "{text}"
    );
    assert!(!text.contains('\n'), "one line: {text}");
}

/// Ranks as threads of this process: each collective posts every rank's bytes on a shared
/// board, and each rank reduces them in rank order (on two ranks a sum is one addition, as
/// MPI's and NCCL's are). What a CPU backend's `DevPtr` addresses is host memory.
struct ThreadRank {
    rank: usize,
    size: usize,
    board: Arc<(Barrier, Mutex<Vec<Vec<u8>>>)>,
}

impl ThreadRank {
    fn world(size: usize) -> Vec<ThreadRank> {
        let board = Arc::new((Barrier::new(size), Mutex::new(vec![Vec::new(); size])));
        (0..size)
            .map(|rank| ThreadRank {
                rank,
                size,
                board: board.clone(),
            })
            .collect()
    }

    /// Every rank's `mine`, in rank order.
    fn exchange(&self, mine: &[u8]) -> Vec<Vec<u8>> {
        let (barrier, posted) = &*self.board;
        posted.lock().unwrap()[self.rank] = mine.to_vec();
        barrier.wait();
        let all = posted.lock().unwrap().clone();
        barrier.wait(); // nobody posts again before everyone has read
        all
    }

    /// The `n` 32-bit words at `buf` replaced by `fold` over the ranks' words, in rank order.
    unsafe fn reduce(&self, buf: DevPtr, n: usize, fold: impl Fn(u32, u32) -> u32) {
        let words = unsafe { std::slice::from_raw_parts_mut(buf.addr() as *mut u32, n) };
        let all = self.exchange(bytemuck::cast_slice(words));
        for (i, w) in words.iter_mut().enumerate() {
            let word = |r: usize| u32::from_le_bytes(all[r][4 * i..4 * i + 4].try_into().unwrap());
            *w = (1..self.size).fold(word(0), |acc, r| fold(acc, word(r)));
        }
    }
}

impl Comm for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    unsafe fn all_reduce_sum(&self, buf: DevPtr, n: usize) -> Result<()> {
        let add = |a: u32, b: u32| (f32::from_bits(a) + f32::from_bits(b)).to_bits();
        unsafe { self.reduce(buf, n, add) };
        Ok(())
    }
    unsafe fn start_all_reduce_max_bits(&self, buf: DevPtr, n: usize, _: Option<DeviceStream>) -> Result<()> {
        unsafe { self.reduce(buf, n, u32::max) };
        Ok(())
    }
    unsafe fn reduce_scatter_sum(&self, _: DevPtr, _: &[Range<usize>]) -> Result<()> {
        unreachable!("no ZeRO-1 here")
    }
    unsafe fn all_gather(&self, _: Words, _: &[Range<usize>]) -> Result<()> {
        unreachable!("no ZeRO-1 here")
    }
    fn all_reduce_sum_host(&self, v: &mut [f32]) -> Result<()> {
        unsafe { self.all_reduce_sum(DevPtr::from_addr(v.as_mut_ptr() as u64), v.len()) }
    }
    fn broadcast_bytes(&self, data: &mut Vec<u8>) -> Result<()> {
        *data = self.exchange(data).swap_remove(0);
        Ok(())
    }
}

/// Rank `rank`'s rows of each batch, of `ranks` equal shares.
fn shard(data: &[Batch], rank: usize, ranks: usize) -> Vec<Batch> {
    let n = B / ranks * T;
    let rows = |v: &[i32]| v[rank * n..][..n].to_vec();
    data.iter()
        .map(|b| Batch {
            inputs: rows(&b.inputs),
            targets: rows(&b.targets),
        })
        .collect()
}

/// Two ranks' run of `data` from step `first` (resumed from `ckpt` on rank 0 when given):
/// per rank its losses, final weights and FP8 state.
type RankRun = (Vec<f32>, Vec<f32>, Vec<f32>);

fn two_ranks(data: &[Batch], first: u64, total: u64, ckpt: Option<&Checkpoint>) -> Vec<RankRun> {
    std::thread::scope(|s| {
        let ranks: Vec<_> = ThreadRank::world(2)
            .into_iter()
            .map(|comm| {
                let mine = shard(data, comm.rank, 2);
                s.spawn(move || {
                    let be = CpuBackend::new(1).unwrap();
                    let mut trainer = Trainer::new(&be, &comm, tiny(), settings(true, total)).unwrap();
                    match ckpt {
                        Some(c) if first > 0 => {
                            let on_root = (comm.rank == 0).then(|| Checkpoint {
                                meta: c.meta.clone(),
                                params: c.params.clone(),
                                m: c.m.clone(),
                                v: c.v.clone(),
                            });
                            trainer.restore(on_root).unwrap()
                        }
                        _ => trainer.init_weights(7).unwrap(),
                    }
                    let mut losses = Vec::new();
                    for (i, batch) in mine.iter().enumerate() {
                        let report = trainer.step(batch, B / 2, T, first + i as u64).unwrap();
                        losses.extend(report.finished.iter().map(|(_, st)| st.loss));
                    }
                    (losses, params(&be, &trainer), trainer.fp8_state().unwrap().unwrap())
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn fp8_on_two_ranks_agrees_equals_two_micro_batches_and_resumes_exactly() {
    let data = batches(6);
    let runs = two_ranks(&data, 0, 6, None);
    assert!(runs[0] == runs[1], "both ranks: the same losses, weights and scales");
    // Each amax the largest over the ranks is the amax of the whole batch, so two ranks are
    // one rank's two micro-batches, bit for bit.
    let be = CpuBackend::new(1).unwrap();
    let two_micro_batches = || {
        let settings = TrainerSettings {
            micro_batches: 2,
            ..settings(true, 6)
        };
        let mut trainer = Trainer::new(&be, &Single, tiny(), settings).unwrap();
        trainer.init_weights(7).unwrap();
        trainer
    };
    let mut one = two_micro_batches();
    let losses = run(&mut one, &data, 0);
    assert_eq!(runs[0].0, losses, "two ranks = two micro-batches");
    assert!(runs[0].1 == params(&be, &one), "and the same weights");
    assert!(runs[0].2 == one.fp8_state().unwrap().unwrap(), "and the same scales");

    // Cut after 3 steps: rank 0's checkpoint (its scales are every rank's) resumes both.
    let mut first = two_micro_batches();
    run(&mut first, &data[..3], 0);
    let [p, m, v] = first
        .state_on_root([Vec::new(), Vec::new(), Vec::new()])
        .unwrap()
        .unwrap();
    let ckpt = Checkpoint {
        meta: meta(&first, 3),
        params: p,
        m,
        v,
    };
    let resumed = two_ranks(&data[3..], 3, 6, Some(&ckpt));
    assert_eq!(resumed[0].0, runs[0].0[3..], "resumed on two ranks: the same losses");
    assert!(resumed[0].1 == runs[0].1 && resumed[1].1 == runs[1].1, "and weights");
    assert!(resumed[1].2 == runs[1].2, "and scales, on rank 1 too");
}

#[test]
fn a_micro_batch_off_sixteen_tokens_is_refused_in_one_line() {
    let be = CpuBackend::new(2).unwrap();
    let mut trainer = Trainer::new(&be, &Single, tiny(), settings(true, 1)).unwrap();
    trainer.init_weights(7).unwrap();
    // 3 rows of 5 tokens: 15, where the FP8 weight gradients' products need a multiple of 16.
    let ids: Vec<i32> = (0..16).map(|k| b"the cat sat on t"[k] as i32).collect();
    let batch = Batch {
        inputs: ids[..15].to_vec(),
        targets: ids[1..].to_vec(),
    };
    let e = trainer.step(&batch, 3, 5, 0).expect_err("refused");
    let line = e.to_string();
    assert!(line.contains("15 tokens") && !line.contains('\n'), "{line}");
    assert!(matches!(e, common::error::Error::Input(_)), "{e:?}");
}

#[test]
fn fp8_training_under_recompute_is_the_same_run() {
    let be = CpuBackend::new(2).unwrap();
    let data = batches(4);
    let train = |recompute: Recompute| {
        let settings = TrainerSettings {
            recompute,
            ..settings(true, 4)
        };
        let mut trainer = Trainer::new(&be, &Single, tiny(), settings).unwrap();
        trainer.init_weights(7).unwrap();
        let losses = run(&mut trainer, &data, 0);
        (losses, params(&be, &trainer))
    };
    let kept = train(Recompute::None);
    for recompute in [Recompute::Layernorm, Recompute::All] {
        assert!(train(recompute) == kept, "{recompute:?}: the run differs");
    }
}
