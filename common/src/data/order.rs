//! The order in which an epoch visits the windows of a corpus streamed from shards: a keyed
//! permutation of `0..n` computed one index at a time, so it holds no per-window state and
//! takes the same memory for a corpus of any size.
//!
//! The permutation is a balanced Feistel network on `2h` bits (the least with `4^h >= n`),
//! whose round keys come from the seed and the epoch alone; an index whose image falls at or
//! past `n` is permuted again until it lands inside (cycle walking), which keeps the map a
//! bijection of `0..n`. As `4^h < 4n`, an index takes fewer than four walks on average.

/// Feistel rounds: six rounds of a good mixing function make a permutation that no simple
/// pattern of the indices shows through.
const ROUNDS: usize = 6;

/// Spreads consecutive epoch numbers over the seed space (2^64 / golden ratio).
const EPOCH_SEED_MIX: u64 = 0x9E3779B97F4A7C15;

/// The window order of one epoch: `at(i)` is the `i`-th window visited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowOrder {
    n: u64,
    half_bits: u32,
    keys: [u64; ROUNDS],
}

/// SplitMix64's finaliser: a bijection of u64 whose every output bit depends on every input bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

impl WindowOrder {
    /// The order of `n` windows (at least one) in epoch `epoch` of a run seeded with `seed`.
    pub fn new(n: u64, seed: u64, epoch: u64) -> WindowOrder {
        assert!(n > 0, "an order of no windows");
        let mut half_bits = 1;
        while half_bits < 32 && (1u64 << (2 * half_bits)) < n {
            half_bits += 1;
        }
        let mut state = mix(seed ^ mix(epoch.wrapping_mul(EPOCH_SEED_MIX)));
        let keys = std::array::from_fn(|_| {
            state = state.wrapping_add(EPOCH_SEED_MIX);
            mix(state)
        });
        WindowOrder { n, half_bits, keys }
    }

    /// How many windows the order visits.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Always false: an order has at least one window.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The window visited `i`-th, for `i < len()`.
    pub fn at(&self, i: u64) -> u64 {
        assert!(i < self.n, "index {i} outside an order of {}", self.n);
        let mut x = i;
        loop {
            x = self.feistel(x);
            if x < self.n {
                return x;
            }
        }
    }

    /// One pass of the Feistel network over `2 * half_bits` bits.
    fn feistel(&self, x: u64) -> u64 {
        let h = self.half_bits;
        let mask = (1u64 << h) - 1;
        let (mut left, mut right) = (x >> h, x & mask);
        for &key in &self.keys {
            let f = mix(right ^ key) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << h) | right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_is_a_permutation() {
        for n in (1..300).chain([1000, 4096, 4097, 65_537]) {
            let order = WindowOrder::new(n, 7, 3);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let w = order.at(i) as usize;
                assert!(!seen[w], "n {n}: {w} twice");
                seen[w] = true;
            }
        }
    }

    #[test]
    fn the_order_depends_on_seed_and_epoch_only() {
        let n = 1000;
        let list = |seed, epoch| {
            (0..n)
                .map(|i| WindowOrder::new(n, seed, epoch).at(i))
                .collect::<Vec<_>>()
        };
        assert_eq!(list(1, 0), list(1, 0));
        assert_ne!(list(1, 0), list(1, 1));
        assert_ne!(list(1, 0), list(2, 0));
        assert_ne!(list(1, 0), (0..n).collect::<Vec<_>>());
        // Huge corpora: any index maps inside, without per-window memory.
        let big = WindowOrder::new(10_000_000_000, 1, 0);
        assert!((0..1000).all(|i| big.at(i) < 10_000_000_000));
    }
}
