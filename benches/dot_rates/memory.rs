//! Tiles read from memory for `dot_rates --stream` ([`super::stream`]): where each K, V
//! tile pair lies in the streamed buffer ([`Layout`]), which pair a tile reads next (runs
//! claimed from a shared counter) and the software prefetches of pairs further on
//! ([`Ahead`]), in a burst at each tile's start or spread over its loops' steps.

use std::arch::x86_64::*;
use std::cell::Cell;

/// Tile pairs per claim (1 MiB of 8-bit pairs): one atomic add per 256 tiles.
pub const RUN: usize = 256;

/// Where the pairs lie: as the cache lays out a layer, blocks of `heads` K tiles then
/// their `heads` V tiles; pair `p` is head `p % heads` of the block in slot
/// `order[p / heads]` (the block table: slots in order, or scattered).
#[derive(Clone, Copy)]
pub struct Layout {
    pub heads: usize,
    pub order: &'static [u32],
}

/// A software prefetch: the first `lines` lines of the K tile and of the V tile of the
/// pair `dist` pairs on, with hint `hint` (0: T0, 1: T1, 2: T2, 3: NTA), at each tile's
/// start or, `spread`, over its loops' steps.
#[derive(Clone, Copy, Debug)]
pub struct Ahead {
    pub hint: u8,
    pub dist: usize,
    pub lines: usize,
    pub spread: bool,
}

/// One spread prefetch: the lines `at .. end` of a tile, `per` lines a step.
struct Pump {
    at: Cell<*const i8>,
    end: *const i8,
    per: usize,
    hint: u8,
}

#[inline(always)]
fn prefetch(hint: u8, a: *const i8) {
    // SAFETY: prefetches never fault (and `a` lies inside the buffer anyway).
    unsafe {
        match hint {
            0 => _mm_prefetch::<_MM_HINT_T0>(a),
            1 => _mm_prefetch::<_MM_HINT_T1>(a),
            2 => _mm_prefetch::<_MM_HINT_T2>(a),
            _ => _mm_prefetch::<_MM_HINT_NTA>(a),
        }
    }
}

/// The K, V tile pairs of one buffer in [`Layout`], taken in order from the run
/// `next()` names (run `r` is pairs `r * RUN ..` modulo the pairs): threads that claim
/// runs from one counter read the buffer in turn, so no pair is read twice before the
/// whole buffer has been.
pub struct Stream {
    buf: &'static [u8],
    layout: Layout,
    /// Bytes of one K (or V) tile, the tile pairs in `buf` and the current one.
    tile: usize,
    pairs: usize,
    at: usize,
    /// The next run is claimed when `at` reaches `end`.
    end: usize,
    next: fn() -> usize,
    ahead: &'static [Ahead],
    pumps: Vec<Pump>,
    /// Pump calls in this tile and in the last one (how far to spread the next).
    steps: Cell<usize>,
    last_steps: usize,
}

impl Stream {
    /// Tiles of `tile` bytes; not yet on a pair ([`Self::advance`] first).
    pub fn new(buf: &'static [u8], layout: Layout, tile: usize, next: fn() -> usize, ahead: &'static [Ahead]) -> Self {
        let pairs = layout.order.len() * layout.heads;
        assert!(layout.order.iter().all(|&b| (b as usize + 1) * 2 * layout.heads * tile <= buf.len()));
        assert!(pairs >= RUN && (buf.as_ptr() as usize).is_multiple_of(64), "the stream holds {pairs} tile pairs");
        Stream { buf, layout, tile, pairs, at: 0, end: 0, next, ahead, pumps: Vec::new(), steps: Cell::new(0), last_steps: 32 }
    }

    /// Byte offsets of pair `p`'s K and V tiles.
    fn tiles(&self, p: usize) -> (usize, usize) {
        let (h, n) = (p % self.layout.heads, self.layout.heads);
        let block = self.layout.order[p / n % self.layout.order.len()] as usize * 2 * n * self.tile;
        (block + h * self.tile, block + (n + h) * self.tile)
    }

    /// The current pair's K and V tiles.
    pub fn kv(&self) -> [*const u8; 2] {
        let (k, v) = self.tiles(self.at);
        [k, v].map(|o| self.buf[o..][..self.tile].as_ptr())
    }

    /// The K and the V tile of the pair `dist` on: the first `lines` lines of each.
    fn lines_ahead(&self, dist: usize, lines: usize) -> [(*const i8, *const i8); 2] {
        let (k, v) = self.tiles((self.at + dist) % self.pairs);
        let n = 64 * lines.min(self.tile / 64);
        [k, v].map(|o| (self.buf[o..].as_ptr().cast(), self.buf[o + n..].as_ptr().cast()))
    }

    /// Moves to the next pair: issues the bursts and sets up the spread prefetches.
    pub fn advance(&mut self) {
        self.at += 1;
        if self.at >= self.end {
            self.at = (self.next)() % (self.pairs / RUN) * RUN;
            self.end = self.at + RUN;
        }
        self.last_steps = if self.steps.get() > 0 { self.steps.get() } else { self.last_steps.max(1) };
        self.steps.set(0);
        self.pumps.clear();
        let ahead: &'static [Ahead] = self.ahead;
        for a in ahead {
            for (mut at, end) in self.lines_ahead(a.dist, a.lines) {
                if a.spread {
                    let lines = (end as usize - at as usize) / 64;
                    let per = lines.div_ceil(self.last_steps).max(1);
                    self.pumps.push(Pump { at: Cell::new(at), end, per, hint: a.hint });
                } else {
                    while at < end {
                        prefetch(a.hint, at);
                        at = at.wrapping_add(64);
                    }
                }
            }
        }
    }

    /// One step of a loop over the tile: the spread prefetches' next lines.
    #[inline(always)]
    pub fn pump(&self) {
        self.steps.set(self.steps.get() + 1);
        for p in &self.pumps {
            let mut at = p.at.get();
            for _ in 0..p.per {
                if at < p.end {
                    prefetch(p.hint, at);
                    at = at.wrapping_add(64);
                }
            }
            p.at.set(at);
        }
    }
}
