//! The attention kind of a layer group and what a query at a logical position needs.
//!
//! A query at position `p` sees keys `k <= p` that its kind keeps visible:
//!
//! - [`GroupSpec::Full`]: every key;
//! - [`GroupSpec::SlidingWindow`]: the `window` most recent positions, the query's own
//!   included (`p - k < window`, i.e. a kernel's `window_left = window - 1`, Hugging Face's
//!   `sliding_window`), plus the first `sink_tokens` positions (attention sinks,
//!   StreamingLLM; LongLive's sink frames);
//! - [`GroupSpec::Chunked`]: the keys of the query's own chunk (`k / chunk == p / chunk`,
//!   Llama 4's `attention_chunk_size`).
//!
//! Everything here is arithmetic on logical positions: nothing is inferred from how many
//! tokens a sequence still stores.

use crate::error::Result;
use crate::invalid;

/// Longest window or chunk accepted, in tokens (positions are exported as int32).
pub const MAX_SPAN: usize = i32::MAX as usize;

/// The attention kind of one layer group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupSpec {
    /// Global attention: a query needs every earlier key.
    Full,
    /// `window` most recent positions (the query's own included) plus `sink_tokens` sinks.
    SlidingWindow { window: usize, sink_tokens: usize },
    /// Block-local attention over aligned chunks of `chunk` positions.
    Chunked { chunk: usize },
}

impl GroupSpec {
    /// A sliding window, checked: `window` in `1..=MAX_SPAN`, `sink_tokens <= MAX_SPAN`.
    pub fn sliding_window(window: usize, sink_tokens: usize) -> Result<Self> {
        if window == 0 || window > MAX_SPAN {
            return Err(invalid!("window must be in 1..={MAX_SPAN} tokens, got {window}"));
        }
        if sink_tokens > MAX_SPAN {
            return Err(invalid!("sink_tokens must be at most {MAX_SPAN} tokens, got {sink_tokens}"));
        }
        Ok(Self::SlidingWindow { window, sink_tokens })
    }

    /// Chunked attention, checked: `chunk` in `1..=MAX_SPAN`.
    pub fn chunked(chunk: usize) -> Result<Self> {
        if chunk == 0 || chunk > MAX_SPAN {
            return Err(invalid!("chunk_size must be in 1..={MAX_SPAN} tokens, got {chunk}"));
        }
        Ok(Self::Chunked { chunk })
    }

    /// Whether a query ever stops needing an earlier key (so blocks can be released).
    #[inline]
    pub fn is_windowed(&self) -> bool {
        !matches!(self, Self::Full)
    }

    /// The sink positions `0..sink_tokens`, visible to every query.
    #[inline]
    pub fn sink_tokens(&self) -> usize {
        match *self {
            Self::SlidingWindow { sink_tokens, .. } => sink_tokens,
            _ => 0,
        }
    }

    /// The first non-sink key position a query at `p` needs.
    #[inline]
    pub fn first_needed(&self, p: usize) -> usize {
        match *self {
            Self::Full => 0,
            Self::SlidingWindow { window, .. } => (p + 1).saturating_sub(window),
            Self::Chunked { chunk } => p - p % chunk,
        }
    }

    /// Whether a query at `p` sees the key at `k` (`k <= p` assumed by the caller).
    #[inline]
    pub fn sees(&self, p: usize, k: usize) -> bool {
        k < self.sink_tokens() || k >= self.first_needed(p)
    }

    /// `window_left` as the kernels take it: keys `p - k <= window_left` are visible
    /// (None for full attention; chunked attention is not a window).
    pub fn window_left(&self) -> Option<usize> {
        match *self {
            Self::SlidingWindow { window, .. } => Some(window - 1),
            _ => None,
        }
    }

    /// Whether logical block `i` (positions `i*bs .. (i+1)*bs`) may be released once the
    /// first query still to come is at `p`: no position in it is a sink or at or after
    /// `first_needed(p)`.
    #[inline]
    pub fn releasable(&self, i: usize, bs: usize, p: usize) -> bool {
        self.is_windowed() && i * bs >= self.sink_tokens() && (i + 1) * bs <= self.first_needed(p)
    }

    /// Logical blocks a query at `p` needs strictly before `p` (what a prefix-cache hit of
    /// `p` tokens must provide), as up to two ranges: the sink blocks and the window.
    pub fn needed_before(&self, p: usize, bs: usize) -> [std::ops::Range<usize>; 2] {
        let end = p.div_ceil(bs);
        let sinks = self.sink_tokens().min(p).div_ceil(bs);
        let f = self.first_needed(p);
        let first = if f >= p { end } else { f / bs };
        if sinks >= first {
            [0..end, end..end]
        } else {
            [0..sinks, first..end]
        }
    }
}

impl std::fmt::Display for GroupSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Full => write!(f, "FullAttention()"),
            Self::SlidingWindow { window, sink_tokens: 0 } => write!(f, "SlidingWindow({window})"),
            Self::SlidingWindow { window, sink_tokens } => write!(f, "SlidingWindow({window}, sink_tokens={sink_tokens})"),
            Self::Chunked { chunk } => write!(f, "ChunkedAttention({chunk})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rule against the visibility predicate written out by position.
    #[test]
    fn release_and_needed_blocks_follow_visibility() {
        let specs = [
            GroupSpec::Full,
            GroupSpec::sliding_window(1, 0).unwrap(),
            GroupSpec::sliding_window(5, 0).unwrap(),
            GroupSpec::sliding_window(8, 3).unwrap(),
            GroupSpec::sliding_window(4, 9).unwrap(),
            GroupSpec::chunked(6).unwrap(),
        ];
        for s in specs {
            for bs in [1usize, 2, 4, 5] {
                for p in 0..40usize {
                    let visible = |k: usize| k <= p && (k < s.sink_tokens() || k >= s.first_needed(p));
                    assert_eq!((0..=p).filter(|&k| s.sees(p, k)).count(), (0..=p).filter(|&k| visible(k)).count());
                    for i in 0..p.div_ceil(bs) + 1 {
                        let any = (i * bs..(i + 1) * bs).any(|k| k < s.sink_tokens() || (k >= s.first_needed(p)));
                        assert_eq!(s.releasable(i, bs, p), s.is_windowed() && !any, "{s} bs {bs} p {p} block {i}");
                    }
                    let [a, b] = s.needed_before(p, bs);
                    let want: Vec<usize> = (0..p.div_ceil(bs)).filter(|&i| (i * bs..((i + 1) * bs).min(p)).any(&visible)).collect();
                    let got: Vec<usize> = a.chain(b).collect();
                    assert_eq!(got, want, "{s} bs {bs} p {p}");
                }
            }
        }
    }

    #[test]
    fn bad_spans_are_refused() {
        assert!(GroupSpec::sliding_window(0, 0).is_err());
        assert!(GroupSpec::sliding_window(MAX_SPAN + 1, 0).is_err());
        assert!(GroupSpec::sliding_window(4, MAX_SPAN + 1).is_err());
        assert!(GroupSpec::chunked(0).is_err());
        assert_eq!(GroupSpec::sliding_window(4096, 0).unwrap().window_left(), Some(4095));
        assert_eq!(GroupSpec::Full.to_string(), "FullAttention()");
    }
}
