//! Our parameter table as Hugging Face's `GPT2LMHeadModel` holds it: every tensor's name
//! (`transformer.` + the table's HF name), shape and layout. Three things differ from ours:
//! the `Conv1D` weights (attention and MLP matrices) are stored (in, out), transposed from our
//! (out, in); `wte` has the real vocabulary's rows only (ours is padded to a multiple of 128);
//! vectors are 1-D. `lm_head.weight` is `wte` (tied), so it is not stored.

use crate::model::params::{Param, ParamEntry};
use crate::model::{ModelConfig, ParamLayout};

/// What every HF GPT-2 key starts with in `GPT2LMHeadModel` (the bare `GPT2Model` of
/// OpenAI's original upload has none; import accepts both).
pub const PREFIX: &str = "transformer.";
/// The tied output embedding: stored by some exporters, equal to `wte`.
pub const LM_HEAD: &str = "lm_head.weight";

/// One tensor of ours in HF's form.
pub struct HfTensor<'a> {
    pub entry: &'a ParamEntry,
    /// `transformer.h.3.attn.c_attn.weight`, ...
    pub name: String,
    pub shape: Vec<usize>,
}

impl HfTensor<'_> {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values in HF's layout, from our flat parameter buffer.
    pub fn from_flat(&self, flat: &[f32]) -> Vec<f32> {
        let ours = &flat[self.entry.range.clone()];
        let [rows, cols] = self.entry.shape;
        if is_conv1d(self.entry.spec.param) {
            let mut out = vec![0.0f32; ours.len()];
            for (r, row) in ours.chunks_exact(cols).enumerate() {
                for (c, &x) in row.iter().enumerate() {
                    out[c * rows + r] = x;
                }
            }
            out
        } else {
            ours[..self.len()].to_vec() // wte: the real vocabulary's rows
        }
    }

    /// Writes `values` (HF's layout, `len()` of them) into our flat buffer; padding rows are
    /// left as they are.
    pub fn to_flat(&self, values: &[f32], flat: &mut [f32]) {
        assert_eq!(values.len(), self.len(), "{}: wrong number of values", self.name);
        let ours = &mut flat[self.entry.range.clone()];
        let [rows, cols] = self.entry.shape;
        if is_conv1d(self.entry.spec.param) {
            for (r, row) in ours.chunks_exact_mut(cols).enumerate() {
                for (c, x) in row.iter_mut().enumerate() {
                    *x = values[c * rows + r];
                }
            }
        } else {
            ours[..values.len()].copy_from_slice(values);
        }
    }
}

/// HF's `Conv1D` weights: (in, out) where ours are (out, in).
fn is_conv1d(p: Param) -> bool {
    matches!(p, Param::QkvW | Param::AttProjW | Param::FcW | Param::FcProjW)
}

/// Every tensor of `layout` (built for `cfg`) in HF's form, in our buffer order.
pub fn tensors<'a>(layout: &'a ParamLayout, cfg: &ModelConfig) -> Vec<HfTensor<'a>> {
    layout
        .entries
        .iter()
        .map(|e| {
            let name = match e.block {
                Some(l) => e.spec.hf_name.replace("{}", &l.to_string()),
                None => e.spec.hf_name.to_string(),
            };
            let [rows, cols] = e.shape;
            let shape = match e.spec.param {
                Param::Wte => vec![cfg.vocab_size, cols],
                p if is_conv1d(p) => vec![cols, rows],
                _ if rows == 1 => vec![cols],
                _ => vec![rows, cols],
            };
            HfTensor {
                entry: e,
                name: format!("{PREFIX}{name}"),
                shape,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ConfigOverrides;

    #[test]
    fn names_and_shapes_are_gpt2s() {
        let cfg = ModelConfig::from_preset("gpt2", 50257, ConfigOverrides::default()).unwrap();
        let layout = ParamLayout::new(&cfg);
        let t = tensors(&layout, &cfg);
        let find = |n: &str| {
            t.iter()
                .find(|x| x.name == n)
                .unwrap_or_else(|| panic!("{n}"))
                .shape
                .clone()
        };
        assert_eq!(find("transformer.wte.weight"), [50257, 768]);
        assert_eq!(find("transformer.wpe.weight"), [1024, 768]);
        assert_eq!(find("transformer.h.0.attn.c_attn.weight"), [768, 2304]);
        assert_eq!(find("transformer.h.11.attn.c_attn.bias"), [2304]);
        assert_eq!(find("transformer.h.5.mlp.c_fc.weight"), [768, 3072]);
        assert_eq!(find("transformer.h.5.mlp.c_proj.weight"), [3072, 768]);
        assert_eq!(find("transformer.ln_f.bias"), [768]);
        assert_eq!(t.len(), 4 + 12 * 12);
        // 124,439,808: Hugging Face's parameter count for GPT-2 124M.
        assert_eq!(t.iter().map(HfTensor::len).sum::<usize>(), 124_439_808);
    }

    #[test]
    fn layouts_round_trip() {
        let cfg = ModelConfig::from_preset("tiny", 300, ConfigOverrides::default()).unwrap();
        let layout = ParamLayout::new(&cfg);
        let flat: Vec<f32> = (0..layout.total).map(|i| i as f32).collect();
        let mut back = vec![0.0f32; layout.total];
        for t in tensors(&layout, &cfg) {
            t.to_flat(&t.from_flat(&flat), &mut back);
        }
        let wte = &layout.get(Param::Wte).range;
        let real = wte.start + 300 * cfg.n_embd; // the padding rows are not exported
        assert!(back[real..wte.end].iter().all(|&x| x == 0.0));
        back[real..wte.end].copy_from_slice(&flat[real..wte.end]);
        assert_eq!(back, flat);
        // (out, in) → (in, out): qkvw's row 1, column 0 is HF's row 0, column 1.
        let qkv = tensors(&layout, &cfg)
            .into_iter()
            .find(|t| t.name.ends_with("0.attn.c_attn.weight"))
            .unwrap();
        let hf = qkv.from_flat(&flat);
        assert_eq!(hf[1], flat[qkv.entry.range.start + cfg.n_embd]);
    }
}
