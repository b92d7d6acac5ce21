//! GPT-2 model configuration: presets, overrides and the checks that reject impossible
//! dimensions with a clear message.

use crate::error::Result;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Real vocabulary size (256 for bytes, 50257 for GPT-2 BPE).
    pub vocab_size: usize,
    /// Vocabulary rounded up to a multiple of 128; the extra rows of `wte` are never
    /// targets, which keeps matmul shapes friendly.
    pub padded_vocab_size: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    /// Longest sequence the position embedding covers.
    pub max_seq_len: usize,
}

/// Named presets. `tiny` is for tests; `char` is the CPU-sized default for the bundled corpus.
pub const PRESETS: &[(&str, usize, usize, usize, usize)] = &[
    // name, layers, heads, width, max_seq_len
    ("tiny", 2, 2, 32, 64),
    ("char", 4, 4, 128, 256),
    ("gpt2", 12, 12, 768, 1024),
    ("gpt2-medium", 24, 16, 1024, 1024),
    ("gpt2-large", 36, 20, 1280, 1024),
];

/// Flag overrides applied on top of a preset (all optional).
#[derive(Clone, Copy, Debug, Default)]
pub struct ConfigOverrides {
    pub n_layer: Option<usize>,
    pub n_head: Option<usize>,
    pub n_embd: Option<usize>,
    pub max_seq_len: Option<usize>,
}

pub fn round_up(x: usize, multiple: usize) -> usize {
    x.div_ceil(multiple) * multiple
}

impl ModelConfig {
    pub fn from_preset(name: &str, vocab_size: usize, ov: ConfigOverrides) -> Result<Self> {
        let Some(&(_, l, h, c, t)) = PRESETS.iter().find(|p| p.0 == name) else {
            let names: Vec<_> = PRESETS.iter().map(|p| p.0).collect();
            crate::bail_input!("unknown model preset '{name}' (choose one of: {})", names.join(", "));
        };
        if vocab_size == 0 || vocab_size > 1 << 24 {
            crate::bail_input!("vocabulary size {vocab_size} must be between 1 and 2^24");
        }
        let cfg = ModelConfig {
            vocab_size,
            padded_vocab_size: round_up(vocab_size, 128),
            n_layer: ov.n_layer.unwrap_or(l),
            n_head: ov.n_head.unwrap_or(h),
            n_embd: ov.n_embd.unwrap_or(c),
            max_seq_len: ov.max_seq_len.unwrap_or(t),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Every field with its name, for messages that compare configs.
    pub fn fields(&self) -> [(&'static str, usize); 6] {
        // Destructured so that a new field cannot be forgotten here.
        let ModelConfig {
            vocab_size,
            padded_vocab_size,
            n_layer,
            n_head,
            n_embd,
            max_seq_len,
        } = *self;
        [
            ("vocab_size", vocab_size),
            ("padded_vocab_size", padded_vocab_size),
            ("n_layer", n_layer),
            ("n_head", n_head),
            ("n_embd", n_embd),
            ("max_seq_len", max_seq_len),
        ]
    }

    pub fn validate(&self) -> Result<()> {
        let [(_, vocab_size), (_, padded_vocab_size), (_, n_layer), (_, n_head), (_, n_embd), (_, max_seq_len)] =
            self.fields();
        if vocab_size == 0 || n_layer == 0 || n_head == 0 || n_embd == 0 || max_seq_len == 0 {
            crate::bail_input!("model dimensions must be positive (layers {n_layer}, heads {n_head}, width {n_embd}, max seq-len {max_seq_len}, vocab {vocab_size})");
        }
        // Every tensor must fit the kernels' 32-bit indices (and the memory of a real machine).
        let too_big = |x: Option<usize>| x.is_none_or(|w| w >= crate::backend::MAX_TENSOR_VALUES);
        if n_layer > 4096
            || too_big(padded_vocab_size.checked_mul(n_embd))
            || too_big(max_seq_len.checked_mul(n_embd))
            || too_big(n_embd.checked_mul(n_embd).and_then(|x| x.checked_mul(4)))
        {
            crate::bail_input!("model too large (layers {n_layer}, width {n_embd}, max seq-len {max_seq_len}, vocab {vocab_size}): each weight matrix must hold under 2^31 values and layers be at most 4096");
        }
        if n_embd % n_head != 0 {
            crate::bail_input!("--heads {n_head} does not divide --width {n_embd}");
        }
        if padded_vocab_size < vocab_size || padded_vocab_size % 128 != 0 {
            crate::bail_input!(
                "padded vocabulary {padded_vocab_size} must be a multiple of 128 and at least {vocab_size}"
            );
        }
        Ok(())
    }

    /// Number of parameters (padded vocabulary rows included).
    pub fn num_params(&self) -> usize {
        super::ParamLayout::new(self).total
    }

    /// A lower bound on what training at (b, t) holds, in values: (the largest single
    /// activation, all activations kept for backward), `attention_saved` being what the
    /// backend keeps per attention call. Per token and block, at least 18·C values are kept
    /// (layernorms, qkv, attention output, projections, the MLP's 4C twice, residuals).
    pub fn activation_values(&self, b: usize, t: usize, attention_saved: usize) -> (u128, u128) {
        let (bt, c, vp) = (
            b as u128 * t as u128,
            self.n_embd as u128,
            self.padded_vocab_size as u128,
        );
        let logits = bt * vp;
        let per_block = bt * 18 * c + attention_saved as u128;
        let largest = logits.max(bt * 4 * c).max(attention_saved as u128);
        (largest, self.n_layer as u128 * per_block + bt * 2 * c + logits)
    }

    /// Training FLOPs per token at sequence length `t`: llm.c's 6N + 6·L·C·T
    /// (N counts every parameter, padding included, as llm.c does).
    pub fn flops_per_token(&self, t: usize) -> f64 {
        let n = self.num_params() as f64;
        6.0 * n + 6.0 * (self.n_layer * self.n_embd * t) as f64
    }
}
