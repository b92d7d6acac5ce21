//! The multilayer perceptron: `input → [Linear → ReLU] per hidden layer → Linear → logits`,
//! trained with softmax cross-entropy. Its forward pass is written as autograd ops on any
//! backend (the tape does backward), like GPT-2's.
//!
//! Parameters live in one flat buffer, layer by layer, and gradients in another of the same
//! layout (so one all-reduce sums them all):
//!
//! ```text
//! w0 (h0, in) | b0 (h0) | w1 (h1, h0) | b1 (h1) | ... | wL (classes, hL) | bL (classes)
//! ```
//!
//! Weights are (out, in) as in PyTorch's `Linear`, and initialised as its default does:
//! weights and biases uniform in ±1/√in, drawn from one stream seeded by `--seed`.

use crate::autograd::{Graph, Tensor};
use crate::backend::{bf16, refresh_bf16_copy, ActType, Backend};
use crate::error::Result;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use std::ops::Range;

/// One `Linear` layer's place in the flat buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    pub inputs: usize,
    pub outputs: usize,
    /// (outputs, inputs).
    pub weight: Range<usize>,
    /// (1, outputs).
    pub bias: Range<usize>,
}

/// The layers of an MLP of these widths (input, hidden..., classes), in buffer order.
pub fn layers(widths: &[usize]) -> Vec<Layer> {
    let mut at = 0;
    widths
        .windows(2)
        .map(|w| {
            let (inputs, outputs) = (w[0], w[1]);
            let weight = at..at + outputs * inputs;
            let bias = weight.end..weight.end + outputs;
            at = bias.end;
            Layer {
                inputs,
                outputs,
                weight,
                bias,
            }
        })
        .collect()
}

pub struct Mlp<B: Backend> {
    /// Input width, hidden widths, classes.
    pub widths: Vec<usize>,
    pub layers: Vec<Layer>,
    /// Every parameter, in one buffer (see the module documentation).
    pub params: B::Buffer<f32>,
    /// Gradients, same layout as `params`.
    pub grads: B::Buffer<f32>,
    /// Under a bf16 backend, `params` rounded to bf16: what the forward pass reads.
    pub params_bf16: Option<B::Buffer<bf16>>,
}

impl<B: Backend> Mlp<B> {
    /// Allocates zeroed parameters and gradients for `widths` (input, hidden..., classes).
    pub fn new(be: &B, widths: &[usize]) -> Result<Self> {
        assert!(
            widths.len() >= 2 && widths.iter().all(|&w| w > 0),
            "an MLP needs an input and an output width"
        );
        let layers = layers(widths);
        let total = layers.last().map_or(0, |l| l.bias.end);
        Ok(Mlp {
            widths: widths.to_vec(),
            layers,
            params: be.alloc(total)?,
            grads: be.alloc(total)?,
            params_bf16: match be.act() {
                ActType::F32 => None,
                ActType::Bf16 => Some(be.alloc(total)?),
            },
        })
    }

    pub fn num_params(&self) -> usize {
        self.layers.last().map_or(0, |l| l.bias.end)
    }

    /// Contiguous ranges with their weight-decay flag: the weights decay, the biases not.
    pub fn decay_segments(&self) -> Vec<(Range<usize>, bool)> {
        self.layers
            .iter()
            .flat_map(|l| [(l.weight.clone(), true), (l.bias.clone(), false)])
            .collect()
    }

    /// PyTorch's `Linear` initialisation from `seed`: every weight and bias of a layer with
    /// `in` inputs uniform in [-1/√in, 1/√in), in buffer order. The same on every rank.
    pub fn init_weights(&self, be: &B, seed: u64) -> Result<()> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut host = vec![0.0f32; self.num_params()];
        for l in &self.layers {
            let bound = 1.0 / (l.inputs as f32).sqrt();
            for x in &mut host[l.weight.start..l.bias.end] {
                *x = (2.0 * crate::model::uniform(&mut rng) - 1.0) * bound;
            }
        }
        self.set_params(be, &host)
    }

    /// Every parameter from `host` (the layout's order), and the bf16 copy with them.
    pub fn set_params(&self, be: &B, host: &[f32]) -> Result<()> {
        be.write(&self.params, 0, host)?;
        refresh_bf16_copy(be, &self.params, self.params_bf16.as_ref(), self.num_params())
    }

    /// The forward pass of `rows` inputs of `widths[0]` values each (`pixels`, row-major):
    /// the logits (rows, classes), and with `labels` their mean cross-entropy (1, 1).
    pub fn forward<'a>(
        &'a self,
        g: &mut Graph<'a, B>,
        pixels: &[f32],
        rows: usize,
        labels: Option<&[i32]>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let copy = self.params_bf16.as_ref();
        let mut x = g.input(pixels, rows, self.widths[0])?;
        for (i, l) in self.layers.iter().enumerate() {
            let w = g.param(
                &self.params,
                copy,
                Some(&self.grads),
                l.weight.clone(),
                [l.outputs, l.inputs],
            )?;
            let b = g.param(&self.params, copy, Some(&self.grads), l.bias.clone(), [1, l.outputs])?;
            x = g.matmul(x, w, Some(b))?;
            if i + 1 < self.layers.len() {
                x = g.relu(x)?;
            }
        }
        let classes = *self.widths.last().expect("at least two widths");
        let loss = labels.map(|y| g.cross_entropy(x, y, classes)).transpose()?;
        Ok((x, loss))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autograd::Pool;
    use crate::backend::cpu::CpuBackend;

    #[test]
    fn the_layout_is_layer_by_layer() {
        let ls = layers(&[784, 256, 128, 10]);
        assert_eq!(ls.len(), 3);
        assert_eq!(
            (ls[0].weight.clone(), ls[0].bias.clone()),
            (0..784 * 256, 784 * 256..784 * 256 + 256)
        );
        assert_eq!(ls[1].weight.start, ls[0].bias.end);
        assert_eq!(ls[2].bias.end, 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
    }

    /// The autograd gradient of a small MLP against central differences of its loss.
    #[test]
    fn gradients_match_finite_differences() {
        let be = CpuBackend::new(1).unwrap();
        let mlp = Mlp::new(&be, &[5, 4, 3, 3]).unwrap();
        mlp.init_weights(&be, 7).unwrap();
        let pixels: Vec<f32> = (0..4 * 5).map(|i| ((i * 37 % 11) as f32) / 11.0).collect();
        let labels = [0, 2, 1, 2];
        let loss_of = |mlp: &Mlp<CpuBackend>, pool: &mut Pool<CpuBackend>, backward: bool| {
            be.zero_buffer(&mlp.grads);
            let mut g = Graph::new(&be, pool, backward);
            let (_, loss) = mlp.forward(&mut g, &pixels, 4, Some(&labels)).unwrap();
            let loss = loss.unwrap();
            if backward {
                g.backward(loss, 1.0).unwrap();
            }
            let mut v = [0.0f32];
            g.read(loss, &mut v).unwrap();
            v[0] as f64
        };
        let mut pool = Pool::default();
        loss_of(&mlp, &mut pool, true);
        let n = mlp.num_params();
        let (mut params, mut grads) = (vec![0.0f32; n], vec![0.0f32; n]);
        be.read(&mlp.params, 0, &mut params).unwrap();
        be.read(&mlp.grads, 0, &mut grads).unwrap();
        let h = 1e-2f32;
        for i in (0..n).step_by(3) {
            let mut p = params.clone();
            p[i] += h;
            mlp.set_params(&be, &p).unwrap();
            let up = loss_of(&mlp, &mut pool, false);
            p[i] -= 2.0 * h;
            mlp.set_params(&be, &p).unwrap();
            let down = loss_of(&mlp, &mut pool, false);
            let numeric = (up - down) / (2.0 * h as f64);
            assert!(
                (numeric - grads[i] as f64).abs() < 2e-3,
                "parameter {i}: {numeric} vs {}",
                grads[i]
            );
        }
    }

    #[test]
    fn initialisation_is_seeded_and_bounded() {
        let be = CpuBackend::new(1).unwrap();
        let read = |seed| {
            let mlp = Mlp::new(&be, &[16, 8, 10]).unwrap();
            mlp.init_weights(&be, seed).unwrap();
            let mut p = vec![0.0f32; mlp.num_params()];
            be.read(&mlp.params, 0, &mut p).unwrap();
            p
        };
        let (a, b, c) = (read(1), read(1), read(2));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a[..16 * 8 + 8].iter().all(|x| x.abs() <= 0.25) && a.iter().any(|x| x.abs() > 0.2));
        assert!(a[16 * 8 + 8..].iter().all(|x| x.abs() <= 1.0 / 8f32.sqrt()));
    }
}
