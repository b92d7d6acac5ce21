//! The caching allocator the graphs draw activations, saved state and activation
//! gradients from: buffers handed back are kept by size class and reused, so after the
//! first step no op allocates.

use crate::backend::{Backend, DeviceBuffer};
use crate::error::Result;
use std::collections::HashMap;

/// Size classes for pooled buffers: exact below 4096 words, else rounded up to the next
/// eighth of a power of two (at most 12.5% waste), so varying sizes (generation grows T
/// by one each token) still reuse buffers.
fn size_class(n: usize) -> usize {
    if n <= 4096 {
        return n.max(1);
    }
    let step = 1usize << (usize::BITS - n.leading_zeros() - 4);
    n.div_ceil(step) * step
}

/// Caching allocator: buffers handed back are kept by size class and reused.
pub struct Pool<B: Backend> {
    free: HashMap<usize, Vec<B::Buffer<f32>>>,
}

impl<B: Backend> Default for Pool<B> {
    fn default() -> Self {
        Pool { free: HashMap::new() }
    }
}

impl<B: Backend> Pool<B> {
    pub(super) fn take(&mut self, be: &B, n: usize) -> Result<B::Buffer<f32>> {
        let class = size_class(n);
        match self.free.get_mut(&class).and_then(|v| v.pop()) {
            Some(buf) => Ok(buf),
            None => be.alloc(class),
        }
    }

    pub(super) fn give(&mut self, buf: B::Buffer<f32>) {
        self.free.entry(buf.len()).or_default().push(buf);
    }
}
