//! The MLP's training step whole on the device: what `mnist` runs on one rank with SGD (one
//! GPU, or the CPU).
//!
//! The training set is uploaded once (u8 pixels and labels, as the idx files hold them); each
//! epoch uploads its order of the images (the same shuffle as the host loop's) and its learning
//! rates, and nothing else goes between host and device until the epoch's losses are read at
//! its end. A step is a fixed chain of backend ops on buffers allocated once, so it is recorded
//! once (a CUDA graph, by the [`Recorder`] GPT-2's trainer uses) and replayed, one launch a step:
//!
//! ```text
//! gather_batch                       the batch, from the step counter on the device
//! matmul_relu_forward × hidden, matmul_forward    (cuBLASLt, ReLU in the epilogue)
//! loss_step                          loss, its gradient in place, lr, apply, history, step + 1
//! per layer, last to first:
//!   matmul_backward_relu             the input gradient through the ReLU below (old weights)
//!   linear_sgd                       weight and bias gradients, SGD with momentum applied as
//!                                    they are summed: the update fused into backward
//! ```
//!
//! The update needs no global gradient norm (the MLP does not clip), so there is no optimiser
//! pass after backward and no gradient is stored (except on shapes large enough for cuBLAS,
//! where the product writes the layer's gradient and one kernel applies it). A step whose loss
//! is not finite is skipped on the device (`apply` 0) and reported when the losses are read.
//! On the CPU the same ops compute what the generic autograd step computes, bit for bit
//! (tested): the step differs from it in where it runs, not in what it computes. There it
//! leaves out what the generic step does besides (the first layer's input gradient, the
//! gradient norm, the optimiser's pass, a read of the loss each step), and its ops are issued
//! from one of the backend's worker threads ([`Backend::issue`]), one hand-over a step rather
//! than one an op: about 3.5× the generic step's speed in the same build (784→256→128→10,
//! batch 64, 2 cores: 240 against 850 µs a step).

use super::data::Dataset;
use super::mlp::Mlp;
use crate::backend::replay::Recorder;
use crate::backend::{bf16, check_range, Act, ActType, Backend, DeviceBuffer, FusedMlp, SgdHyper, Span};
use crate::error::{Error, Result};
use crate::optim::{OptimConfig, Sgd, StepMeter, StepStats};
use std::ops::Range;

/// The MLP's step on the device for batches of `rows` images, `steps` of them an epoch.
pub struct FusedStep<B: FusedMlp> {
    bufs: Buffers<B>,
    recorder: Recorder<B, Key>,
    /// Record the step once and replay it (where the backend records); else queue it each time.
    record: bool,
}

/// What a recording depends on: where its memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    memory_epoch: u64,
    /// Parameters, their bf16 copy, velocity, gradients.
    buffers: [u64; 4],
}

struct Buffers<B: FusedMlp> {
    rows: usize,
    steps: usize,
    /// Pixels per image.
    size: usize,
    /// Images in the training set.
    count: usize,
    classes: usize,
    images: B::Buffer<u8>,
    labels: B::Buffer<u8>,
    /// The epoch's order of the images (its first steps·rows).
    order: B::Buffer<i32>,
    /// The epoch's learning rates, one a step.
    schedule: B::Buffer<f32>,
    /// The step's scalars ([`crate::backend::StepState`]: lr, apply, the step counter) and
    /// the epoch's (loss, 0) per step.
    meter: StepMeter<B>,
    /// The batch (rows, size) activations, its labels, the per-row losses.
    x: B::Buffer<f32>,
    targets: B::Buffer<i32>,
    losses: B::Buffer<f32>,
    /// Per layer, its output (rows, outputs): after the ReLU for hidden layers, the logits
    /// (then their gradient) last.
    outs: Vec<B::Buffer<f32>>,
    /// Per hidden layer, its pre-activation (written only where the ReLU is not fused).
    pres: Vec<B::Buffer<f32>>,
    /// Per hidden layer, the gradient at its pre-activation.
    dpres: Vec<B::Buffer<f32>>,
}

/// Activations of `n` elements of the backend's type, in a 4-byte-word buffer.
fn activations<B: Backend>(be: &B, n: usize) -> Result<B::Buffer<f32>> {
    be.alloc(be.act().words(n))
}

/// The activations an [`activations`] buffer holds, as the backend's type.
fn act<'a, B: Backend>(be: &B, buf: &'a B::Buffer<f32>) -> Span<'a, Act> {
    buf.span().words_as_all(be.act())
}

impl<B: FusedMlp> FusedStep<B> {
    /// Uploads `train` and allocates every buffer a step of `mlp` uses, for batches of
    /// `rows` images and epochs of `steps` steps. `record`: record the step once and replay it
    /// (on a backend that records).
    pub fn new(be: &B, mlp: &Mlp<B>, train: &Dataset, rows: usize, steps: usize, record: bool) -> Result<Self> {
        let (size, count) = (train.images.size(), train.len());
        let classes = *mlp.widths.last().expect("an MLP has an output width");
        if rows == 0 || steps == 0 || rows * steps > count || mlp.widths[0] != size {
            return Err(Error::Input(format!(
                "the fused step needs 1 ≤ batch × steps ≤ {count} images of {} pixels (batch {rows}, {steps} steps, images of {size})",
                mlp.widths[0]
            )));
        }
        // Checked here: the gather reads `size` pixels at each index below `count`, and the
        // loss the logit at each label.
        if train.images.pixels.len() != count * size {
            return Err(Error::Input(format!(
                "the fused step needs {count} images of {size} pixels, not {} pixels",
                train.images.pixels.len()
            )));
        }
        if let Some(&label) = train.labels.iter().find(|&&l| l as usize >= classes) {
            return Err(Error::Input(format!(
                "label {label} is outside the MLP's {classes} classes"
            )));
        }
        let images = be.alloc(train.images.pixels.len())?;
        be.write(&images, 0, &train.images.pixels)?;
        let labels = be.alloc(count)?;
        be.write(&labels, 0, &train.labels)?;
        let hidden = &mlp.layers[..mlp.layers.len() - 1];
        let bufs = Buffers {
            rows,
            steps,
            size,
            count,
            classes,
            images,
            labels,
            order: be.alloc(rows * steps)?,
            schedule: be.alloc(steps)?,
            meter: StepMeter::with_history(be, steps)?,
            x: activations(be, rows * size)?,
            targets: be.alloc(rows)?,
            losses: be.alloc(rows)?,
            outs: mlp
                .layers
                .iter()
                .map(|l| activations(be, rows * l.outputs))
                .collect::<Result<_>>()?,
            pres: hidden
                .iter()
                .map(|l| activations(be, rows * l.outputs))
                .collect::<Result<_>>()?,
            dpres: hidden
                .iter()
                .map(|l| activations(be, rows * l.outputs))
                .collect::<Result<_>>()?,
        };
        Ok(FusedStep {
            bufs,
            recorder: Recorder::default(),
            record: record && be.records(),
        })
    }

    /// Steps an epoch.
    pub fn steps(&self) -> usize {
        self.bufs.steps
    }

    /// Whether steps are replayed from a recording now.
    pub fn replaying(&self) -> bool {
        self.recorder.recorded()
    }

    /// Before an epoch's steps: its order of the training images (the first steps·rows are
    /// used), the learning rate of each of its steps, and the global 0-based step it starts
    /// at. Uploads only: nothing waits.
    pub fn begin_epoch(&mut self, be: &B, order: &[usize], lrs: &[f32], first_step: u64) -> Result<()> {
        let b = &self.bufs;
        let n = b.rows * b.steps;
        if order.len() < n || lrs.len() != b.steps {
            return Err(Error::Device(format!(
                "an epoch needs {n} images and {} learning rates, not {} and {}",
                b.steps,
                order.len(),
                lrs.len()
            )));
        }
        // Checked here: the gather kernel reads images at these indices.
        let ids = order[..n]
            .iter()
            .map(|&i| match i < b.count {
                true => Ok(i as i32),
                false => Err(Error::Device(format!(
                    "image {i} is outside the {} of the set",
                    b.count
                ))),
            })
            .collect::<Result<Vec<i32>>>()?;
        be.write(&b.order, 0, &ids)?;
        be.write(&b.schedule, 0, lrs)?;
        // The step counter the device advances (lr and beta corrections unused here).
        b.meter.begin_step(be, lrs[0], None, first_step)
    }

    /// Sets the device's step counter to the global 0-based `step` (a run that starts
    /// mid-epoch, after [`FusedStep::begin_epoch`] named the epoch's first step).
    pub fn set_step(&mut self, be: &B, step: u64) -> Result<()> {
        self.bufs.meter.begin_step(be, 0.0, None, step)
    }

    /// Queues one step (replays it, once recorded) of `mlp` with `sgd`'s momentum, velocity
    /// and weight decay, and the learning rate of the epoch's schedule. Nothing is read back.
    pub fn step(&mut self, be: &B, mlp: &Mlp<B>, sgd: &Sgd<B>) -> Result<()> {
        self.bufs.check(be, mlp, sgd)?;
        let key = |be: &B| Key {
            memory_epoch: be.memory_epoch(),
            buffers: [
                mlp.params.ptr().addr(),
                mlp.params_bf16.as_ref().map_or(0, |c| c.ptr().addr()),
                sgd.velocity.ptr().addr(),
                mlp.grads.ptr().addr(),
            ],
        };
        let bufs = &self.bufs;
        if !self.record {
            return bufs.queue(be, mlp, sgd);
        }
        self.recorder.run(be, key(be), || {
            bufs.queue(be, mlp, sgd)?;
            Ok(key(be))
        })
    }

    /// The stats of the global 0-based `steps` of this epoch (waits for them): loss, no
    /// gradient norm (0), the schedule's learning rate, skipped when the loss was not finite.
    pub fn read(&self, be: &B, config: &OptimConfig, steps: Range<u64>) -> Result<Vec<(u64, StepStats)>> {
        self.bufs.meter.read_history(be, config, steps)
    }
}

impl<B: FusedMlp> Buffers<B> {
    /// The model's and the optimiser's buffers hold the layout, each layer's biases right after
    /// its weights (the fused ops rely on both).
    fn check(&self, be: &B, mlp: &Mlp<B>, sgd: &Sgd<B>) -> Result<()> {
        let n = mlp.num_params();
        check_range("parameters", mlp.params.len(), 0, n)?;
        check_range("gradients", mlp.grads.len(), 0, n)?;
        check_range("velocity", sgd.velocity.len(), 0, n)?;
        match (&mlp.params_bf16, be.act()) {
            (Some(copy), ActType::Bf16) => check_range("bf16 parameters", copy.len(), 0, n)?,
            (None, ActType::F32) => {}
            _ => {
                return Err(Error::Device(
                    "the bf16 copy of the parameters does not fit the backend".into(),
                ))
            }
        }
        let fits = mlp.layers.len() == self.outs.len()
            && mlp.widths[0] == self.size
            && mlp.layers.iter().all(|l| l.bias.start == l.weight.end);
        if !fits {
            return Err(Error::Device("the fused step was made for another MLP".into()));
        }
        Ok(())
    }

    /// Queues the step (see the module documentation): its plan, issued where the backend
    /// issues ops best ([`Backend::issue`]: on the CPU, from one of its worker threads).
    fn queue(&self, be: &B, mlp: &Mlp<B>, sgd: &Sgd<B>) -> Result<()> {
        let plan = self.plan(be, mlp, sgd);
        // SAFETY: the plan of this step's buffers (see `issue_step`).
        unsafe { be.issue(&plan, issue_step::<B>) }
    }

    /// The step's operands and sizes (the caller has checked the buffers: `check`).
    fn plan<'a>(&'a self, be: &B, mlp: &'a Mlp<B>, sgd: &'a Sgd<B>) -> Plan<'a> {
        // Under bf16 (checked: the copy exists then, and only then) the forward pass and the
        // input gradients read the weights' bf16 copy, and the updates refresh it.
        let copy = mlp.params_bf16.as_ref().map(|c| c.span());
        let weights = |r: &Range<usize>| -> Span<'a, Act> {
            match copy {
                Some(c) => c.slice(r.start, r.len()).act(),
                None => mlp.params.span().slice(r.start, r.len()).act(),
            }
        };
        let last = mlp.layers.len() - 1;
        Plan {
            rows: self.rows,
            size: self.size,
            steps: self.steps,
            classes: self.classes,
            x: act(be, &self.x),
            targets: self.targets.span(),
            losses: self.losses.span(),
            images: self.images.span(),
            labels: self.labels.span(),
            order: self.order.span(),
            schedule: self.schedule.span(),
            state: self.meter.state(),
            history: (self.meter.history(), self.meter.history_len()),
            hp: SgdHyper {
                momentum: sgd.momentum,
                weight_decay: sgd.config.weight_decay,
            },
            layers: mlp
                .layers
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    // The weights, then the biases right after them (checked).
                    let (at, n) = (l.weight.start, l.bias.end - l.weight.start);
                    LayerPlan {
                        inputs: l.inputs,
                        outputs: l.outputs,
                        w: weights(&l.weight),
                        b: weights(&l.bias),
                        out: act(be, &self.outs[i]),
                        pre: (i < last).then(|| act(be, &self.pres[i])),
                        dpre: (i < last).then(|| act(be, &self.dpres[i])),
                        params: mlp.params.span().slice(at, n),
                        velocity: sgd.velocity.span().slice(at, n),
                        grads: mlp.grads.span().slice(at, n),
                        copy: copy.map(|c| c.slice(at, n)),
                    }
                })
                .collect(),
        }
    }
}

/// Every operand and size a step's ops use, as plain data (spans, no buffers), so that the
/// backend may issue them from a thread of its own.
struct Plan<'a> {
    rows: usize,
    size: usize,
    steps: usize,
    classes: usize,
    x: Span<'a, Act>,
    targets: Span<'a, i32>,
    losses: Span<'a>,
    images: Span<'a, u8>,
    labels: Span<'a, u8>,
    order: Span<'a, i32>,
    schedule: Span<'a>,
    state: Span<'a>,
    /// The loss history and its length.
    history: (Span<'a>, usize),
    hp: SgdHyper,
    layers: Vec<LayerPlan<'a>>,
}

/// One layer of a [`Plan`].
struct LayerPlan<'a> {
    inputs: usize,
    outputs: usize,
    /// The weights and biases the forward pass and the input gradient read (the bf16 copy's
    /// under bf16).
    w: Span<'a, Act>,
    b: Span<'a, Act>,
    /// Its output (rows, outputs): after the ReLU for hidden layers; the logits last.
    out: Span<'a, Act>,
    /// Hidden layers: the pre-activation and the gradient at it (rows, outputs).
    pre: Option<Span<'a, Act>>,
    dpre: Option<Span<'a, Act>>,
    /// The layer's weights then biases in the parameters, their velocity, their gradients and
    /// the bf16 copy.
    params: Span<'a>,
    velocity: Span<'a>,
    grads: Span<'a>,
    copy: Option<Span<'a, bf16>>,
}

/// Issues the ops of one step (see the module documentation).
///
/// # Safety
/// `p` comes from [`Buffers::plan`]: its order holds steps × rows indices below the images
/// (zeros as allocated, then what `begin_epoch` checked), its labels are below the classes
/// (checked in `new`).
unsafe fn issue_step<B: FusedMlp>(be: &B, p: &Plan<'_>) -> Result<()> {
    let (rows, last) = (p.rows, p.layers.len() - 1);
    // SAFETY: the order's indices are below the images (the caller's contract).
    unsafe {
        be.gather_batch(
            p.x, p.targets, p.images, p.labels, p.order, p.state, rows, p.size, p.steps,
        );
    }
    let mut inp = p.x;
    for l in &p.layers {
        match l.pre {
            Some(pre) => be.matmul_relu_forward(pre, l.out, inp, l.w, Some(l.b), rows, l.inputs, l.outputs),
            None => be.matmul_forward(l.out, inp, l.w, Some(l.b), rows, l.inputs, l.outputs),
        }
        inp = l.out;
    }
    let logits = p.layers[last].out;
    // SAFETY: the targets are labels of the set, below the classes (the caller's contract).
    unsafe {
        be.loss_step(
            logits,
            p.losses,
            p.targets,
            p.state,
            p.schedule,
            p.history.0,
            p.history.1,
            rows,
            p.classes,
            p.steps,
            1.0 / rows as f32,
        );
    }
    let mut dout = logits; // now the logits' gradient
    for (i, l) in p.layers.iter().enumerate().rev() {
        let inp = if i == 0 { p.x } else { p.layers[i - 1].out };
        if i > 0 {
            // Before this layer's update: it reads the weights the forward pass read.
            let below = &p.layers[i - 1];
            let dpre = below.dpre.expect("a hidden layer");
            be.matmul_backward_relu(dpre, dout, l.w, below.out, rows, l.inputs, l.outputs);
        }
        be.linear_sgd(
            l.params, l.velocity, l.grads, l.copy, dout, inp, p.state, p.hp, rows, l.inputs, l.outputs,
        );
        if i > 0 {
            dout = p.layers[i - 1].dpre.expect("a hidden layer");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::comm::Single;
    use crate::mnist::synthetic;
    use crate::mnist::train::MlpTrainer;
    use crate::mnist::OptimizerKind;
    use crate::optim::Optimizer;

    fn sgd<'t, B: Backend>(t: &'t MlpTrainer<'_, B>) -> &'t Sgd<B> {
        match &t.opt {
            Optimizer::Sgd(s) => s,
            Optimizer::AdamW(_) => unreachable!("made with SGD"),
        }
    }

    fn read(be: &CpuBackend, buf: &<CpuBackend as Backend>::Buffer<f32>) -> Vec<f32> {
        let mut host = vec![0.0; buf.len()];
        be.read(buf, 0, &mut host).unwrap();
        host
    }

    /// Three epochs of a small MLP, the fused step against the generic one (autograd, then the
    /// SGD pass), on the CPU: every loss, parameter and momentum the same, bit for bit.
    #[test]
    fn the_fused_step_computes_what_the_generic_step_computes_bit_for_bit() {
        let be = CpuBackend::new(2).unwrap();
        let set = synthetic::dataset(200, 12, 3);
        let widths = [144, 32, 16, 10];
        let (rows, epochs) = (16, 3u64);
        let steps = set.len() / rows;
        for weight_decay in [0.0, 0.01] {
            let config = OptimConfig {
                lr: 0.05,
                min_lr_frac: 0.0,
                warmup_steps: 0,
                total_steps: epochs * steps as u64,
                weight_decay,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                grad_clip: 0.0,
            };
            let make = || MlpTrainer::new(&be, &Single, &widths, OptimizerKind::Sgd, config, 0.9, 7).unwrap();
            let (mut generic, fast) = (make(), make());
            let mut fused = FusedStep::new(&be, &fast.mlp, &set, rows, steps, true).unwrap();
            let (mut order, mut pixels, mut labels) = (Vec::new(), Vec::new(), Vec::new());
            for epoch in 0..epochs {
                crate::data::epoch_order(&mut order, set.len(), 7, epoch);
                let first = epoch * steps as u64;
                let mut want = Vec::new();
                for s in 0..steps {
                    pixels.clear();
                    labels.clear();
                    set.gather(&order[s * rows..(s + 1) * rows], &mut pixels, &mut labels);
                    want.push(generic.step(&pixels, &labels, rows, first + s as u64).unwrap().loss);
                }
                let lrs: Vec<f32> = (0..steps).map(|s| config.lr_at(first + s as u64)).collect();
                fused.begin_epoch(&be, &order, &lrs, first).unwrap();
                for _ in 0..steps {
                    fused.step(&be, &fast.mlp, sgd(&fast)).unwrap();
                }
                let got = fused.read(&be, &config, first..first + steps as u64).unwrap();
                let got: Vec<f32> = got.iter().map(|(_, s)| s.loss).collect();
                assert_eq!(
                    got, want,
                    "epoch {epoch}: the losses differ (weight decay {weight_decay})"
                );
            }
            assert_eq!(read(&be, &fast.mlp.params), read(&be, &generic.mlp.params));
            assert_eq!(read(&be, &sgd(&fast).velocity), read(&be, &sgd(&generic).velocity));
        }
    }

    /// A non-finite loss skips that step's update on the device and shows when read.
    #[test]
    fn a_step_with_a_non_finite_loss_is_skipped_and_reported() {
        let be = CpuBackend::new(1).unwrap();
        let set = synthetic::dataset(64, 6, 1);
        let config = OptimConfig {
            lr: 0.1,
            min_lr_frac: 0.0,
            warmup_steps: 0,
            total_steps: 4,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            grad_clip: 0.0,
        };
        let t = MlpTrainer::new(&be, &Single, &[36, 8, 10], OptimizerKind::Sgd, config, 0.9, 1).unwrap();
        let n = t.mlp.num_params();
        let mut params = read(&be, &t.mlp.params);
        params[n - 1] = f32::INFINITY; // a bias of the logits
        t.mlp.set_params(&be, &params).unwrap();
        let mut fused = FusedStep::new(&be, &t.mlp, &set, 16, 4, false).unwrap();
        let order: Vec<usize> = (0..64).collect();
        fused.begin_epoch(&be, &order, &[0.1; 4], 0).unwrap();
        fused.step(&be, &t.mlp, sgd(&t)).unwrap();
        let stats = fused.read(&be, &config, 0..1).unwrap();
        assert!(stats[0].1.skipped && !stats[0].1.loss.is_finite());
        assert_eq!(
            read(&be, &t.mlp.params)[..n - 1],
            params[..n - 1],
            "nothing was updated"
        );
    }
}
