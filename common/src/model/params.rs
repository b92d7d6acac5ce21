//! THE parameter table: every GPT-2 tensor is declared once, in [`PARAMS`], with its shape,
//! initialisation, weight decay and Hugging Face name. Everything else derives from it: the
//! flat layout below (one buffer for parameters, and the same offsets in the gradient and
//! AdamW-moment buffers), the views the forward pass takes, initialisation, the optimiser's
//! decay segments, gradient buckets and the tensor list a checkpoint carries.
//!
//! ```text
//! wte (Vp,C) | wpe (maxT,C) | block 0 | block 1 | ... | lnfw (C) | lnfb (C)
//! block l = qkvw (3C,C) attprojw (C,C) fcw (4C,C) fcprojw (C,4C)     <- weight-decayed
//!           ln1w ln1b (C) qkvb (3C) attprojb (C) ln2w ln2b (C) fcb (4C) fcprojb (C)
//! ```

use super::ModelConfig;
use std::ops::Range;

/// A GPT-2 parameter tensor; per-block ones exist once in every transformer block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    Wte,
    Wpe,
    QkvW,
    AttProjW,
    FcW,
    FcProjW,
    Ln1W,
    Ln1B,
    QkvB,
    AttProjB,
    Ln2W,
    Ln2B,
    FcB,
    FcProjB,
    LnfW,
    LnfB,
}

/// Where a tensor lives: once in the model, or once in every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Model,
    Block,
}

/// GPT-2's initialisation rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    Zeros,
    Ones,
    /// N(0, 0.02).
    Normal,
    /// N(0, 0.02) on the real vocabulary's rows; the padding rows stay 0.
    NormalVocabRows,
    /// N(0, 0.02/√(2·layers)): the projections that write into the residual stream.
    ResidualNormal,
}

/// One row of the parameter table.
#[derive(Debug)]
pub struct ParamSpec {
    pub param: Param,
    /// Our name; per-block tensors are `h{l}.{name}` in messages and checkpoints.
    pub name: &'static str,
    pub scope: Scope,
    /// (rows, cols); weights are (out, in) as in PyTorch's `Linear`, vectors (1, n).
    pub shape: fn(&ModelConfig) -> [usize; 2],
    pub init: Init,
    /// Decoupled weight decay applies (matrices and embeddings, as GPT-2 and llm.c do).
    pub decay: bool,
    /// Name in Hugging Face's `GPT2Model` (`{}` is the block index). Its `Conv1D` weights
    /// are stored transposed, (in, out).
    pub hf_name: &'static str,
}

const fn spec(
    param: Param,
    name: &'static str,
    scope: Scope,
    shape: fn(&ModelConfig) -> [usize; 2],
    init: Init,
    decay: bool,
    hf_name: &'static str,
) -> ParamSpec {
    ParamSpec {
        param,
        name,
        scope,
        shape,
        init,
        decay,
        hf_name,
    }
}

use Init::*;
use Param::*;
use Scope::{Block, Model};

/// Every tensor in flat-buffer order: the model's leading tensors, then one block's
/// (repeated per block), then the model's trailing tensors. `PARAMS[p as usize].param == p`.
pub const PARAMS: [ParamSpec; 16] = [
    spec(
        Wte,
        "wte",
        Model,
        |c| [c.padded_vocab_size, c.n_embd],
        NormalVocabRows,
        true,
        "wte.weight",
    ),
    spec(
        Wpe,
        "wpe",
        Model,
        |c| [c.max_seq_len, c.n_embd],
        Normal,
        true,
        "wpe.weight",
    ),
    spec(
        QkvW,
        "qkvw",
        Block,
        |c| [3 * c.n_embd, c.n_embd],
        Normal,
        true,
        "h.{}.attn.c_attn.weight",
    ),
    spec(
        AttProjW,
        "attprojw",
        Block,
        |c| [c.n_embd, c.n_embd],
        ResidualNormal,
        true,
        "h.{}.attn.c_proj.weight",
    ),
    spec(
        FcW,
        "fcw",
        Block,
        |c| [4 * c.n_embd, c.n_embd],
        Normal,
        true,
        "h.{}.mlp.c_fc.weight",
    ),
    spec(
        FcProjW,
        "fcprojw",
        Block,
        |c| [c.n_embd, 4 * c.n_embd],
        ResidualNormal,
        true,
        "h.{}.mlp.c_proj.weight",
    ),
    spec(Ln1W, "ln1w", Block, |c| [1, c.n_embd], Ones, false, "h.{}.ln_1.weight"),
    spec(Ln1B, "ln1b", Block, |c| [1, c.n_embd], Zeros, false, "h.{}.ln_1.bias"),
    spec(
        QkvB,
        "qkvb",
        Block,
        |c| [1, 3 * c.n_embd],
        Zeros,
        false,
        "h.{}.attn.c_attn.bias",
    ),
    spec(
        AttProjB,
        "attprojb",
        Block,
        |c| [1, c.n_embd],
        Zeros,
        false,
        "h.{}.attn.c_proj.bias",
    ),
    spec(Ln2W, "ln2w", Block, |c| [1, c.n_embd], Ones, false, "h.{}.ln_2.weight"),
    spec(Ln2B, "ln2b", Block, |c| [1, c.n_embd], Zeros, false, "h.{}.ln_2.bias"),
    spec(
        FcB,
        "fcb",
        Block,
        |c| [1, 4 * c.n_embd],
        Zeros,
        false,
        "h.{}.mlp.c_fc.bias",
    ),
    spec(
        FcProjB,
        "fcprojb",
        Block,
        |c| [1, c.n_embd],
        Zeros,
        false,
        "h.{}.mlp.c_proj.bias",
    ),
    spec(LnfW, "lnfw", Model, |c| [1, c.n_embd], Ones, false, "ln_f.weight"),
    spec(LnfB, "lnfb", Model, |c| [1, c.n_embd], Zeros, false, "ln_f.bias"),
];

impl Param {
    pub fn spec(self) -> &'static ParamSpec {
        &PARAMS[self as usize]
    }
}

/// One tensor placed in the flat buffer.
#[derive(Clone, Debug)]
pub struct ParamEntry {
    pub spec: &'static ParamSpec,
    /// The block, for per-block tensors.
    pub block: Option<usize>,
    /// `wte`, `h3.qkvw`, ...
    pub name: String,
    /// Offset range in the flat buffers, in elements.
    pub range: Range<usize>,
    pub shape: [usize; 2],
}

/// Where each tensor lives in the ONE flat parameter buffer (and, at the same offsets, in
/// the gradient and AdamW-moment buffers).
#[derive(Clone, Debug)]
pub struct ParamLayout {
    /// Every tensor, in buffer order.
    pub entries: Vec<ParamEntry>,
    /// Each block's whole range, for per-block gradient buckets.
    pub blocks: Vec<Range<usize>>,
    /// Entry index by `[param][block]` (model tensors at block 0).
    index: Vec<Vec<usize>>,
    pub total: usize,
}

impl ParamLayout {
    pub fn new(cfg: &ModelConfig) -> Self {
        let first_block = PARAMS.iter().position(|s| s.scope == Block).unwrap_or(PARAMS.len());
        let block_len = PARAMS[first_block..].iter().take_while(|s| s.scope == Block).count();
        let (head, rest) = PARAMS.split_at(first_block);
        let (block, tail) = rest.split_at(block_len);
        let mut layout = ParamLayout {
            entries: Vec::with_capacity(head.len() + cfg.n_layer * block.len() + tail.len()),
            blocks: Vec::with_capacity(cfg.n_layer),
            index: vec![Vec::new(); PARAMS.len()],
            total: 0,
        };
        for s in head {
            layout.place(cfg, s, None);
        }
        for l in 0..cfg.n_layer {
            let start = layout.total;
            for s in block {
                layout.place(cfg, s, Some(l));
            }
            layout.blocks.push(start..layout.total);
        }
        for s in tail {
            layout.place(cfg, s, None);
        }
        layout
    }

    fn place(&mut self, cfg: &ModelConfig, spec: &'static ParamSpec, block: Option<usize>) {
        let shape = (spec.shape)(cfg);
        let start = self.total;
        self.total += shape[0] * shape[1];
        let name = match block {
            Some(l) => format!("h{l}.{}", spec.name),
            None => spec.name.to_string(),
        };
        self.index[spec.param as usize].push(self.entries.len());
        self.entries.push(ParamEntry {
            spec,
            block,
            name,
            range: start..self.total,
            shape,
        });
    }

    /// A model-wide tensor (`wte`, `wpe`, `lnfw`, `lnfb`).
    pub fn get(&self, p: Param) -> &ParamEntry {
        assert_eq!(p.spec().scope, Model, "{p:?} is a per-block tensor: use block()");
        &self.entries[self.index[p as usize][0]]
    }

    /// Block `l`'s tensor `p`.
    pub fn block(&self, l: usize, p: Param) -> &ParamEntry {
        assert_eq!(p.spec().scope, Block, "{p:?} is a model-wide tensor: use get()");
        &self.entries[self.index[p as usize][l]]
    }

    /// The parameters outside every block (embeddings and the final layernorm), which the
    /// backward pass finishes last.
    pub fn outside_blocks(&self) -> Vec<Range<usize>> {
        let first = self.blocks.first().map_or(self.total, |b| b.start);
        let last = self.blocks.last().map_or(self.total, |b| b.end);
        [0..first, last..self.total]
            .into_iter()
            .filter(|r| !r.is_empty())
            .collect()
    }

    /// Contiguous ranges with their weight-decay flag (neighbouring tensors merged).
    pub fn decay_segments(&self) -> Vec<(Range<usize>, bool)> {
        let mut segs: Vec<(Range<usize>, bool)> = Vec::new();
        for e in &self.entries {
            match segs.last_mut() {
                Some((r, decay)) if *decay == e.spec.decay && r.end == e.range.start => r.end = e.range.end,
                _ => segs.push((e.range.clone(), e.spec.decay)),
            }
        }
        segs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ConfigOverrides;

    #[test]
    fn the_table_is_indexed_by_param_and_blocks_are_contiguous() {
        for (i, s) in PARAMS.iter().enumerate() {
            assert_eq!(s.param as usize, i, "{} is out of place", s.name);
        }
        let scopes: Vec<Scope> = PARAMS.iter().map(|s| s.scope).collect();
        let blocks = scopes.iter().position(|&s| s == Block).unwrap();
        let after = blocks + scopes[blocks..].iter().take_while(|&&s| s == Block).count();
        assert!(
            scopes[after..].iter().all(|&s| s == Model),
            "block tensors must be contiguous"
        );
    }

    #[test]
    fn layout_is_gpt2s_flat_order() {
        let cfg = ModelConfig::from_preset("gpt2", 50257, ConfigOverrides::default()).unwrap();
        let lay = ParamLayout::new(&cfg);
        assert_eq!(lay.total, 124_475_904); // llm.c's count for the padded GPT-2 124M
        let c = 768;
        assert_eq!(lay.get(Param::Wpe).range.start, 50304 * c);
        assert_eq!(lay.block(0, Param::QkvW).range.start, (50304 + 1024) * c);
        assert_eq!(
            lay.block(11, Param::FcProjB).range.end,
            lay.get(Param::LnfW).range.start
        );
        assert_eq!(lay.entries.len(), 4 + 12 * 12);
        assert_eq!(lay.block(3, Param::Ln2W).name, "h3.ln2w");
        // Segments alternate: embeddings+matrices decay, vectors do not.
        let segs = lay.decay_segments();
        assert_eq!(segs.len(), 2 * 12);
        assert!(segs[0].1 && !segs[1].1 && !segs.last().unwrap().1);
        assert_eq!(segs.last().unwrap().0.end, lay.total);
        assert_eq!(
            lay.outside_blocks(),
            vec![0..lay.blocks[0].start, lay.blocks[11].end..lay.total]
        );
    }
}
