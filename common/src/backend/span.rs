//! Typed, shape-checked operands: what the ops take instead of raw addresses.
//!
//! A [`Span`] is `len` elements of backend memory that stays alive while the span does: made
//! safely from a buffer ([`DeviceBuffer::span`], then [`Span::slice`]), or by a layer that
//! owns its memory some other way ([`Span::from_raw`], `unsafe`: the autograd graph, whose
//! pooled values it tracks itself). An op checks every span against the extent its dimensions
//! give, and that none it writes overlaps another operand ([`Operands`]), before it touches
//! memory: a wrong dimension is a panic naming the op and the operand, never a write out of
//! bounds. That is what lets most ops be safe functions; those whose contract is about
//! values (token ids that index a table, a position read on the device) stay `unsafe`.

use super::{Act, ActType, DevPtr, DeviceBuffer, Elem};
use half::bf16;
use std::marker::PhantomData;

/// `len` elements of type `T` (or, for `T = Act`, of the backend's activation type) of memory
/// that lives at least as long as `'a`.
pub struct Span<'a, T = f32> {
    ptr: DevPtr<T>,
    len: usize,
    /// Bytes per element (an activation's is only known at run time).
    width: usize,
    memory: PhantomData<&'a ()>,
}

impl<T> Clone for Span<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Span<'_, T> {}
impl<T> std::fmt::Debug for Span<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Span({:#x}, {} × {} B)", self.ptr.addr(), self.len, self.width)
    }
}

impl<'a, T: Elem> Span<'a, T> {
    /// The whole of a live buffer.
    pub fn of<Buf: DeviceBuffer<T> + ?Sized>(buf: &'a Buf) -> Self {
        // SAFETY: the buffer holds `len()` elements and outlives 'a.
        unsafe { Span::from_raw(buf.ptr(), buf.len()) }
    }

    /// `len` elements at `ptr`.
    ///
    /// # Safety
    /// They are live memory of the backend the span is given to, and stay so for `'a`.
    pub unsafe fn from_raw(ptr: DevPtr<T>, len: usize) -> Self {
        Span {
            ptr,
            len,
            width: std::mem::size_of::<T>(),
            memory: PhantomData,
        }
    }
}

impl<'a> Span<'a, Act> {
    /// `len` activations of type `act` at `ptr`.
    ///
    /// # Safety
    /// As [`Span::from_raw`].
    pub unsafe fn from_raw_act(ptr: DevPtr<Act>, len: usize, act: ActType) -> Self {
        Span {
            ptr,
            len,
            width: act.bytes(),
            memory: PhantomData,
        }
    }
}

impl<'a> Span<'a, f32> {
    /// The first `n` activations of type `act` that these 4-byte words hold (pooled memory
    /// and buffers of [`ActType::words`]: two bf16 to a word).
    ///
    /// # Panics
    /// When the words do not hold `n` activations.
    pub fn words_as(self, act: ActType, n: usize) -> Span<'a, Act> {
        assert!(
            act.words(n) <= self.len,
            "span: {n} activations do not fit in {} words",
            self.len
        );
        // SAFETY: the n activations lie inside this span's live memory.
        unsafe { Span::from_raw_act(self.ptr.cast(), n, act) }
    }

    /// The bytes these words hold, as `u8` values (FP8 data in pooled memory).
    pub fn words_as_bytes(self) -> Span<'a, u8> {
        // SAFETY: 4·len bytes lie inside this span's live memory.
        unsafe { Span::from_raw(self.ptr.cast(), 4 * self.len) }
    }

    /// All the activations of type `act` that these words hold.
    pub fn words_as_all(self, act: ActType) -> Span<'a, Act> {
        self.words_as(act, self.len * 4 / act.bytes())
    }
}

/// The element types activations may be stored as: their spans can be read as [`Act`].
pub trait ActElem: Elem {
    const ACT: ActType;
}
impl ActElem for f32 {
    const ACT: ActType = ActType::F32;
}
impl ActElem for bf16 {
    const ACT: ActType = ActType::Bf16;
}

impl<'a, T: ActElem> Span<'a, T> {
    /// The same memory as activations (of type `T`).
    pub fn act(self) -> Span<'a, Act> {
        Span {
            ptr: self.ptr.cast(),
            len: self.len,
            width: self.width,
            memory: PhantomData,
        }
    }
}

impl<'a, T> Span<'a, T> {
    pub fn len(self) -> usize {
        self.len
    }

    pub fn is_empty(self) -> bool {
        self.len == 0
    }

    /// The address of the first element (reading through it is what the ops do).
    pub fn ptr(self) -> DevPtr<T> {
        self.ptr
    }

    /// Elements `at..at + n`.
    ///
    /// # Panics
    /// When they are not all inside the span.
    pub fn slice(self, at: usize, n: usize) -> Self {
        assert!(
            at.checked_add(n).is_some_and(|end| end <= self.len),
            "span: elements {at}..{} are outside a span of {}",
            at.saturating_add(n),
            self.len
        );
        Span {
            ptr: DevPtr::from_addr(self.ptr.addr() + (at * self.width) as u64),
            len: n,
            width: self.width,
            memory: PhantomData,
        }
    }

    /// The same memory read as another element type of the same width (an f32 activation
    /// span as plain f32, say).
    ///
    /// # Panics
    /// When the widths differ.
    pub fn cast<U: Elem>(self) -> Span<'a, U> {
        assert_eq!(self.width, std::mem::size_of::<U>(), "span: cast to another width");
        Span {
            ptr: self.ptr.cast(),
            len: self.len,
            width: self.width,
            memory: PhantomData,
        }
    }

    /// Byte range of the first `n` elements.
    fn bytes(self, n: usize) -> (u64, u64) {
        let start = self.ptr.addr();
        (start, start + (n * self.width) as u64)
    }
}

/// Most operands one op has (the largest, `linear_sgd`, has 7).
const MAX_OPERANDS: usize = 12;

/// One op's operands being checked: each span holds at least the elements the op uses
/// (and, for activations, has the backend's activation type), and no operand the op writes
/// overlaps another. Hands back each span's address once checked.
///
/// # Panics
/// On the first operand that fails, naming the op and the operand: a caller's bug, as an
/// index out of bounds is.
pub struct Operands {
    op: &'static str,
    act: ActType,
    /// Byte ranges checked so far, and whether the op writes each.
    seen: [(u64, u64, bool); MAX_OPERANDS],
    count: usize,
}

impl Operands {
    /// The op's name, for its messages.
    pub fn name(&self) -> &'static str {
        self.op
    }

    pub fn new(op: &'static str, act: ActType) -> Self {
        Operands {
            op,
            act,
            seen: [(0, 0, false); MAX_OPERANDS],
            count: 0,
        }
    }

    /// An operand the op only reads: `n` elements.
    pub fn read<T: Operand>(&mut self, name: &str, span: Span<T>, n: usize) -> DevPtr<T> {
        self.check(name, span, n, false, false)
    }

    /// An operand the op writes (or reads and writes): `n` elements, overlapping no other.
    pub fn write<T: Operand>(&mut self, name: &str, span: Span<T>, n: usize) -> DevPtr<T> {
        self.check(name, span, n, true, false)
    }

    /// An operand the op reads that may be exactly the written one before it (`dst += src`
    /// with `src` = `dst`), but may not overlap it otherwise.
    pub fn read_or_same<T: Operand>(&mut self, name: &str, span: Span<T>, n: usize) -> DevPtr<T> {
        self.check(name, span, n, false, true)
    }

    pub fn read_opt<T: Operand>(&mut self, name: &str, span: Option<Span<T>>, n: usize) -> Option<DevPtr<T>> {
        span.map(|s| self.read(name, s, n))
    }

    pub fn write_opt<T: Operand>(&mut self, name: &str, span: Option<Span<T>>, n: usize) -> Option<DevPtr<T>> {
        span.map(|s| self.write(name, s, n))
    }

    fn check<T: Operand>(&mut self, name: &str, span: Span<T>, n: usize, writes: bool, same_ok: bool) -> DevPtr<T> {
        let op = self.op;
        if let Some(act) = T::ACT_CHECK.then_some(self.act) {
            assert_eq!(
                span.width,
                act.bytes(),
                "{op}: {name} holds {}-byte values, the backend's activations are {}",
                span.width,
                act.bytes()
            );
        }
        assert!(
            span.len >= n,
            "{op}: {name} holds {} elements, the op needs {n}",
            span.len
        );
        let (start, end) = span.bytes(n);
        if start < end {
            for &(s, e, w) in &self.seen[..self.count] {
                let overlaps = start < e && s < end;
                let allowed = same_ok && w && (s, e) == (start, end);
                assert!(
                    !overlaps || !(writes || w) || allowed,
                    "{op}: {name} overlaps an operand the op {}",
                    if writes { "uses" } else { "writes" }
                );
            }
        }
        assert!(self.count < MAX_OPERANDS, "{op}: more than {MAX_OPERANDS} operands");
        self.seen[self.count] = (start, end, writes);
        self.count += 1;
        span.ptr
    }
}

/// What a span may hold as an operand: plain elements, or activations (whose width is
/// checked against the backend's).
pub trait Operand {
    const ACT_CHECK: bool;
}
impl<T: Elem> Operand for T {
    const ACT_CHECK: bool = false;
}
impl Operand for Act {
    const ACT_CHECK: bool = true;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::Backend;

    #[test]
    fn slices_stay_inside() {
        let be = CpuBackend::new(1).unwrap();
        let buf = be.alloc::<f32>(10).unwrap();
        let s = Span::of(&buf);
        assert_eq!(s.slice(4, 6).len(), 6);
        assert_eq!(s.slice(4, 6).ptr(), buf.ptr().add(4));
        assert!(std::panic::catch_unwind(|| s.slice(5, 6)).is_err());
        assert!(std::panic::catch_unwind(|| s.slice(usize::MAX, 2)).is_err());
    }

    #[test]
    fn operands_refuse_short_spans_and_overlapping_writes() {
        let be = CpuBackend::new(1).unwrap();
        let buf = be.alloc::<f32>(10).unwrap();
        let s = Span::of(&buf);
        let check = |f: &dyn Fn(&mut Operands)| {
            let mut o = Operands::new("op", ActType::F32);
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut o))).is_ok()
        };
        // Long enough, disjoint: fine; reads may overlap reads.
        assert!(check(&|o| {
            o.write("out", s.slice(0, 5), 5);
            o.read("a", s.slice(5, 5), 5);
            o.read("b", s.slice(5, 5), 5);
        }));
        // Too short.
        assert!(!check(&|o| {
            o.read("a", s.slice(0, 4), 5);
        }));
        // A write over a read, a read over a write, a write over a write.
        assert!(!check(&|o| {
            o.read("a", s.slice(0, 5), 5);
            o.write("out", s.slice(4, 5), 5);
        }));
        assert!(!check(&|o| {
            o.write("out", s.slice(0, 5), 5);
            o.read("a", s.slice(4, 5), 5);
        }));
        // The same span read back where the op allows it, but not shifted.
        assert!(check(&|o| {
            o.write("dst", s.slice(0, 5), 5);
            o.read_or_same("src", s.slice(0, 5), 5);
        }));
        assert!(!check(&|o| {
            o.write("dst", s.slice(0, 5), 5);
            o.read_or_same("src", s.slice(1, 5), 5);
        }));
        // Only the extent the op uses counts.
        assert!(check(&|o| {
            o.write("out", s.slice(0, 6), 5);
            o.read("a", s.slice(5, 5), 5);
        }));
    }

    #[test]
    fn activation_spans_must_have_the_backends_type() {
        let be = CpuBackend::new(1).unwrap();
        let buf = be.alloc::<bf16>(4).unwrap();
        let s = Span::of(&buf).act();
        let mut o = Operands::new("op", ActType::Bf16);
        o.read("a", s, 4);
        let wrong = std::panic::catch_unwind(|| Operands::new("op", ActType::F32).read("a", s, 4));
        assert!(wrong.is_err());
    }
}
