//! The AVX-512 paths' prefetcher: the lines of the tiles a loop reads next, spread over
//! its steps, the next tile into L1 (T0) and a farther one into L2 (T1)
//! ([`super::work::Ahead`]). A burst of L2 lines at a tile's start stalled on the core's
//! miss buffers (3.7-4.7% of a profile's samples on `prefetcht1`); spread, bf16 decode
//! gained 20% (GQA) and 42% (MHA) on one core (`benches/RESULTS.md`, issue 15 wave 4).

use std::arch::x86_64::*;

/// The K or the V tiles a loop prefetches: the next one into L1, a farther one into L2
/// ([`super::work::Ahead`]).
pub(crate) struct Stream<'a, E> {
    pub l1: Option<&'a [E]>,
    pub l2: Option<&'a [E]>,
}

// By hand: a derive would ask `E: Copy`, and these are only slices.
impl<E> Clone for Stream<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for Stream<'_, E> {}

impl<E> Stream<'_, E> {
    /// Nothing to prefetch.
    pub(crate) const NONE: Self = Stream { l1: None, l2: None };
}

/// Prefetches the tiles of a [`Stream`], `per` lines of each per `step`, so the misses
/// are spread over a loop instead of arriving in one burst (a burst of L2 prefetches at
/// a tile's start stalled on the core's miss buffers).
pub(crate) struct Prefetcher {
    near: Lines,
    far: Lines,
}

/// The lines of one tile left to prefetch.
struct Lines {
    p: *const i8,
    /// Bytes left to prefetch, and bytes per step.
    left: usize,
    per: usize,
}

impl Lines {
    fn new<E>(tile: Option<&[E]>, iters: usize) -> Self {
        match tile {
            Some(t) => {
                let len = std::mem::size_of_val(t);
                let lines = len.div_ceil(64);
                Self { p: t.as_ptr().cast(), left: len, per: 64 * lines.div_ceil(iters.max(1)) }
            }
            None => Self { p: std::ptr::null(), left: 0, per: 0 },
        }
    }

    /// Prefetch the next `per` bytes with hint `HINT`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    fn step<const HINT: i32>(&mut self) {
        if self.left == 0 {
            return;
        }
        let mut off = 0;
        while off < self.per && off < self.left {
            // Prefetches never fault; the address stays inside the tile.
            _mm_prefetch::<HINT>(self.p.wrapping_add(off));
            off += 64;
        }
        self.p = self.p.wrapping_add(off);
        self.left -= off.min(self.left);
    }
}

impl Prefetcher {
    /// Spread `s`'s tiles' lines over `iters` steps.
    #[inline]
    pub(crate) fn new<E>(s: Stream<E>, iters: usize) -> Self {
        Self { near: Lines::new(s.l1, iters), far: Lines::new(s.l2, iters) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(crate) fn step(&mut self) {
        self.near.step::<_MM_HINT_T0>();
        self.far.step::<_MM_HINT_T1>();
    }
}
