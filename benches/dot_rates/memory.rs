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
/// pair `dist` pairs on, with hint `hint` (0: T0, 1: T1, 2: T2, 3: NTA), issued as
/// `when` says.
#[derive(Clone, Copy, Debug)]
pub struct Ahead {
    pub hint: u8,
    pub dist: usize,
    pub lines: usize,
    pub when: When,
}

/// When an [`Ahead`]'s lines go out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum When {
    /// All at the tile's start.
    Burst,
    /// Spread over the steps of both loops (K and V lines at once from the first).
    Spread,
    /// The K lines over the K loop's steps, the V lines over the V loop's (the kernel's
    /// spread: its score loop prefetches K tiles, its `P V` loop V tiles).
    PerLoop,
}

/// One spread prefetch: the lines `at .. end` of a tile, `per` lines a step of the
/// loops in `loops` (bit 0: the K loop, bit 1: the V loop).
struct Pump {
    at: Cell<*const i8>,
    end: *const i8,
    per: usize,
    hint: u8,
    loops: u8,
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
    /// Steps of the K and the V loop in this tile and in the last one (how far to
    /// spread the next).
    steps: [Cell<usize>; 2],
    last_steps: [usize; 2],
}

impl Stream {
    /// Tiles of `tile` bytes; not yet on a pair ([`Self::advance`] first).
    pub fn new(buf: &'static [u8], layout: Layout, tile: usize, next: fn() -> usize, ahead: &'static [Ahead]) -> Self {
        let pairs = layout.order.len() * layout.heads;
        assert!(layout.order.iter().all(|&b| (b as usize + 1) * 2 * layout.heads * tile <= buf.len()));
        assert!(pairs >= RUN && (buf.as_ptr() as usize).is_multiple_of(64), "the stream holds {pairs} tile pairs");
        let steps = [Cell::new(0), Cell::new(0)];
        Stream { buf, layout, tile, pairs, at: 0, end: 0, next, ahead, pumps: Vec::new(), steps, last_steps: [16, 16] }
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
        for (last, now) in self.last_steps.iter_mut().zip(&self.steps) {
            if now.get() > 0 {
                *last = now.replace(0);
            }
        }
        self.pumps.clear();
        let ahead: &'static [Ahead] = self.ahead;
        for a in ahead {
            for (part, (mut at, end)) in self.lines_ahead(a.dist, a.lines).into_iter().enumerate() {
                let (loops, steps) = match a.when {
                    When::Spread => (3, self.last_steps[0] + self.last_steps[1]),
                    When::PerLoop => (1 << part, self.last_steps[part]),
                    When::Burst => (0, 0),
                };
                if steps > 0 {
                    let per = ((end as usize - at as usize) / 64).div_ceil(steps).max(1);
                    self.pumps.push(Pump { at: Cell::new(at), end, per, hint: a.hint, loops });
                } else {
                    while at < end {
                        prefetch(a.hint, at);
                        at = at.wrapping_add(64);
                    }
                }
            }
        }
    }

    /// One step of the tile's K loop (`l` 0) or V loop (1): the next lines of the spread
    /// prefetches that run over it.
    #[inline(always)]
    pub fn pump(&self, l: usize) {
        self.steps[l].set(self.steps[l].get() + 1);
        for p in self.pumps.iter().filter(|p| p.loops & (1 << l) != 0) {
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
