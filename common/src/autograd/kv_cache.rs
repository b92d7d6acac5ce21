//! The keys and values of every position a generation has processed, per transformer block,
//! so that each new token runs the model on one position instead of the whole prefix.

use crate::backend::{Backend, DeviceBuffer, Span};
use crate::error::Result;

/// Per block, a key and a value matrix of (rows, width) activations, filled from row 0 as
/// positions are processed ([`crate::autograd::Graph::attention_cached`]).
pub struct KvCache<B: Backend> {
    layers: Vec<[B::Buffer<f32>; 2]>,
    rows: usize,
    width: usize,
}

impl<B: Backend> KvCache<B> {
    /// Room for `rows` positions of `width` channels in each of `layers` blocks.
    pub fn new(be: &B, layers: usize, rows: usize, width: usize) -> Result<Self> {
        let words = be.act().words(rows * width);
        let layers = (0..layers)
            .map(|_| Ok([be.alloc(words)?, be.alloc(words)?]))
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, rows, width })
    }

    /// Positions it holds room for.
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Block `layer`'s key and value matrices, each the 4-byte words that hold `rows · width`
    /// activations.
    pub(super) fn spans(&self, layer: usize) -> (Span<'_>, Span<'_>) {
        let [k, v] = &self.layers[layer];
        (k.span(), v.span())
    }
}
