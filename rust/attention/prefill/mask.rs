//! Attention masks on logical positions, and the keys one query sees.
//!
//! Key `j` of a sequence has logical position `j` (its index in the sequence's block
//! table); a query has the position the caller gives (`q_positions`) or, by default, the
//! position of one of the sequence's last `n_q` keys. Every mask below is a rule on the
//! pair (query position `p`, key position `k`); they combine by intersection, and the
//! keys a query sees always form at most two intervals ([`Span`]), which is what lets
//! the kernel classify a whole tile of keys at once.

/// Which keys each query sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mask {
    /// `k <= p` (ignored when `chunk_size` is set).
    pub causal: bool,
    /// Block-causal: `k / c <= p / c` (bidirectional inside a chunk of `c` positions,
    /// causal across chunks). Needs `causal`.
    pub chunk_size: Option<usize>,
    /// Only `p - k <= w` (keys more than `w` positions behind the query are hidden).
    pub window_left: Option<usize>,
    /// Keys `k < s` are visible whatever the window (still subject to the causal or
    /// block-causal rule).
    pub sink_tokens: usize,
}

/// The keys `0..len` one query sees: `0..sink_end` and `lo..hi`, with
/// `sink_end <= lo <= hi <= len` (either piece may be empty).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub sink_end: usize,
    pub lo: usize,
    pub hi: usize,
}

/// How a tile of keys relates to a set of queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cover {
    /// No query sees any key of the tile: skipped.
    Empty,
    /// Every query sees every key: no mask work.
    Full,
    /// Mixed: masked key by key.
    Partial,
}

impl Mask {
    /// The rule itself, for one (query, key) pair of positions; the reference for tests.
    pub fn visible(&self, p: u64, k: u64) -> bool {
        let ordered = match self.chunk_size {
            Some(c) => k / c as u64 <= p / c as u64,
            None => !self.causal || k <= p,
        };
        let near = self.window_left.is_none_or(|w| p.saturating_sub(k) <= w as u64);
        ordered && (near || k < self.sink_tokens as u64)
    }

    /// The keys of a sequence of `len` keys that a query at position `p` sees.
    pub fn span(&self, p: u64, len: usize) -> Span {
        let len64 = len as u64;
        let end = match self.chunk_size {
            Some(c) => (p / c as u64).saturating_add(1).saturating_mul(c as u64),
            None if self.causal => p.saturating_add(1),
            None => u64::MAX,
        };
        let hi = end.min(len64);
        let lo = self.window_left.map_or(0, |w| p.saturating_sub(w as u64)).min(hi);
        let sinks = self.sink_tokens as u64;
        // Both values are at most len, which fits usize.
        if sinks >= lo {
            Span { sink_end: 0, lo: 0, hi: hi as usize }
        } else {
            Span { sink_end: sinks as usize, lo: lo as usize, hi: hi as usize }
        }
    }
}

impl Span {
    #[inline]
    pub fn contains(&self, k: usize) -> bool {
        k < self.sink_end || (self.lo <= k && k < self.hi)
    }

    /// Visible keys in `t0..t1`.
    #[inline]
    pub fn count(&self, t0: usize, t1: usize) -> usize {
        let overlap = |a: usize, b: usize| b.min(t1).saturating_sub(a.max(t0));
        overlap(0, self.sink_end) + overlap(self.lo, self.hi)
    }

    /// The smallest key range holding every visible key (empty: `0..0`).
    pub fn hull(&self) -> (usize, usize) {
        match (self.sink_end > 0, self.lo < self.hi) {
            (true, true) => (0, self.hi),
            (true, false) => (0, self.sink_end),
            (false, true) => (self.lo, self.hi),
            (false, false) => (0, 0),
        }
    }
}

/// How the keys `t0..t1` relate to the queries of `spans`.
pub(crate) fn cover(spans: &[Span], t0: usize, t1: usize) -> Cover {
    let (mut any, mut all) = (false, true);
    for s in spans {
        let c = s.count(t0, t1);
        any |= c > 0;
        all &= c == t1 - t0;
    }
    match (any, all) {
        (false, _) => Cover::Empty,
        (true, true) => Cover::Full,
        _ => Cover::Partial,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_agrees_with_the_rule_everywhere() {
        let masks = [
            Mask { causal: false, ..Mask::default() },
            Mask { causal: true, ..Mask::default() },
            Mask { causal: true, chunk_size: Some(3), ..Mask::default() },
            Mask { causal: true, window_left: Some(4), sink_tokens: 2, ..Mask::default() },
            Mask { causal: true, chunk_size: Some(5), window_left: Some(3), sink_tokens: 1 },
            Mask { causal: false, window_left: Some(2), sink_tokens: 6, ..Mask::default() },
            Mask { causal: true, window_left: Some(0), sink_tokens: 0, ..Mask::default() },
        ];
        for m in masks {
            for len in [0usize, 1, 7, 20] {
                for p in 0..25u64 {
                    let s = m.span(p, len);
                    assert!(s.sink_end <= s.lo && s.lo <= s.hi && s.hi <= len, "{m:?} {p} {s:?}");
                    for k in 0..len {
                        assert_eq!(s.contains(k), m.visible(p, k as u64), "{m:?} p={p} k={k} len={len}");
                    }
                    let (a, b) = (3.min(len), 11.min(len));
                    assert_eq!(s.count(a, b), (a..b).filter(|&k| s.contains(k)).count());
                    let (h0, h1) = s.hull();
                    assert!((0..len).all(|k| !s.contains(k) || (h0..h1).contains(&k)));
                }
            }
        }
    }

    #[test]
    fn huge_positions_saturate() {
        let m = Mask { causal: true, chunk_size: Some(7), window_left: Some(usize::MAX), sink_tokens: 0 };
        assert_eq!(m.span(u64::MAX, 10), Span { sink_end: 0, lo: 0, hi: 10 });
    }

    #[test]
    fn cover_classifies_tiles() {
        let m = Mask { causal: true, ..Mask::default() };
        let spans: Vec<Span> = (8..12).map(|p| m.span(p, 12)).collect();
        assert_eq!(cover(&spans, 0, 8), Cover::Full);
        assert_eq!(cover(&spans, 8, 12), Cover::Partial);
        let late: Vec<Span> = (0..2).map(|p| m.span(p, 12)).collect();
        assert_eq!(cover(&late, 4, 8), Cover::Empty);
    }
}
