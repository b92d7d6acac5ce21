//! Where each parameter lives in the ONE flat parameter buffer (and, at the same offsets,
//! in the gradient and AdamW-moment buffers). Tensors are grouped so that optimiser,
//! allreduce and checkpoint code can each treat the model as a few flat ranges:
//!
//! ```text
//! wte (Vp,C) | wpe (maxT,C) | layer 0 | layer 1 | ... | lnfw (C) | lnfb (C)
//! layer l = qkvw (3C,C) attprojw (C,C) fcw (4C,C) fcprojw (C,4C)     <- weight-decayed
//!           ln1w ln1b (C) qkvb (3C) attprojb (C) ln2w ln2b (C) fcb (4C) fcprojb (C)
//! ```

use super::ModelConfig;
use std::ops::Range;

/// Offsets (in f32 words) of one transformer block's tensors.
#[derive(Clone, Debug)]
pub struct LayerParams {
    pub qkvw: usize,     // (3C, C)
    pub attprojw: usize, // (C, C)
    pub fcw: usize,      // (4C, C)
    pub fcprojw: usize,  // (C, 4C)
    pub ln1w: usize,     // (C)
    pub ln1b: usize,     // (C)
    pub qkvb: usize,     // (3C)
    pub attprojb: usize, // (C)
    pub ln2w: usize,     // (C)
    pub ln2b: usize,     // (C)
    pub fcb: usize,      // (4C)
    pub fcprojb: usize,  // (C)
    /// The whole block, for per-layer gradient buckets.
    pub range: Range<usize>,
    /// The block's weight matrices (decayed); the rest of `range` is vectors.
    pub matrices: Range<usize>,
}

#[derive(Clone, Debug)]
pub struct ParamLayout {
    pub wte: usize, // (Vp, C), tied with the LM head
    pub wpe: usize, // (maxT, C)
    pub layers: Vec<LayerParams>,
    pub lnfw: usize, // (C)
    pub lnfb: usize, // (C)
    pub total: usize,
}

impl ParamLayout {
    pub fn new(cfg: &ModelConfig) -> Self {
        let c = cfg.n_embd;
        let mut at = 0;
        let mut take = |n: usize| {
            let o = at;
            at += n;
            o
        };
        let wte = take(cfg.padded_vocab_size * c);
        let wpe = take(cfg.max_seq_len * c);
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for _ in 0..cfg.n_layer {
            let qkvw = take(3 * c * c);
            let attprojw = take(c * c);
            let fcw = take(4 * c * c);
            let fcprojw = take(4 * c * c);
            let vectors_start = fcprojw + 4 * c * c;
            let l = LayerParams {
                qkvw,
                attprojw,
                fcw,
                fcprojw,
                ln1w: take(c),
                ln1b: take(c),
                qkvb: take(3 * c),
                attprojb: take(c),
                ln2w: take(c),
                ln2b: take(c),
                fcb: take(4 * c),
                fcprojb: take(c),
                range: qkvw..0,
                matrices: qkvw..vectors_start,
            };
            layers.push(l);
        }
        let lnfw = take(c);
        let lnfb = take(c);
        let total = at;
        // Each block's range ends where the next begins.
        let starts: Vec<usize> = layers.iter().map(|l| l.qkvw).chain([lnfw]).collect();
        for (l, w) in layers.iter_mut().zip(starts.windows(2)) {
            l.range = w[0]..w[1];
        }
        ParamLayout {
            wte,
            wpe,
            layers,
            lnfw,
            lnfb,
            total,
        }
    }

    /// Contiguous ranges with their weight-decay flag: matrices and embeddings decay,
    /// biases and layernorm gains do not (GPT-2 / llm.c practice).
    pub fn decay_segments(&self) -> Vec<(Range<usize>, bool)> {
        let mut segs = vec![(self.wte..self.layers.first().map_or(self.lnfw, |l| l.qkvw), true)];
        for l in &self.layers {
            segs.push((l.matrices.clone(), true));
            segs.push((l.matrices.end..l.range.end, false));
        }
        segs.push((self.lnfw..self.total, false));
        segs
    }

    /// Named (offset, len, fan-in-style kind) list, used by init and by tests.
    pub fn named(&self, cfg: &ModelConfig) -> Vec<(String, Range<usize>)> {
        let c = cfg.n_embd;
        let mut v = vec![
            ("wte".to_string(), self.wte..self.wte + cfg.padded_vocab_size * c),
            ("wpe".to_string(), self.wpe..self.wpe + cfg.max_seq_len * c),
        ];
        for (i, l) in self.layers.iter().enumerate() {
            for (name, off, len) in [
                ("qkvw", l.qkvw, 3 * c * c),
                ("attprojw", l.attprojw, c * c),
                ("fcw", l.fcw, 4 * c * c),
                ("fcprojw", l.fcprojw, 4 * c * c),
                ("ln1w", l.ln1w, c),
                ("ln1b", l.ln1b, c),
                ("qkvb", l.qkvb, 3 * c),
                ("attprojb", l.attprojb, c),
                ("ln2w", l.ln2w, c),
                ("ln2b", l.ln2b, c),
                ("fcb", l.fcb, 4 * c),
                ("fcprojb", l.fcprojb, c),
            ] {
                v.push((format!("h{i}.{name}"), off..off + len));
            }
        }
        v.push(("lnfw".to_string(), self.lnfw..self.lnfw + c));
        v.push(("lnfb".to_string(), self.lnfb..self.lnfb + c));
        v
    }
}
