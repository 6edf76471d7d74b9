//! The simulator's device pool: today's [`BlockPool`] (one implicit full-attention group),
//! or a [`HybridPool`] with the model's layer groups (full, sliding window with sinks,
//! chunked) sharing one block space.
//!
//! A plain enum, matched per call: the engine's hot path has no dynamic dispatch, and a
//! run without groups goes through exactly the calls it made before groups existed.
//!
//! The engine mirrors what each group holds with [`held`], pure arithmetic on a
//! sequence's logical length and frontier (the length before its latest growth): a
//! windowed group's released blocks are exactly the blocks the release rule drops for the
//! frontier, a contiguous run after the sink blocks (`hybrid_spec`: "holes == exactly the
//! blocks the rule releases for `frontier`"). `check_invariants` runs compare the mirror
//! with the pool's own statistics.

use crate::error::{KvError, Result};
use crate::hybrid::{GroupSpec, HybridPool, HybridStepOutput};
use crate::pool::block_table::blocks_for;
use crate::pool::{BlockPool, StepOutput};
use crate::prefix_cache::CacheConfig;
use crate::types::SeqId;

/// Logical blocks a group has released (holes) once the latest growth started at
/// `frontier`: the blocks after the sinks that end at or before `first_needed(frontier)`.
#[inline]
pub fn holes(spec: &GroupSpec, bs: usize, frontier: usize) -> usize {
    if !spec.is_windowed() {
        return 0;
    }
    (spec.first_needed(frontier) / bs).saturating_sub(spec.sink_tokens().div_ceil(bs))
}

/// `(blocks, tokens)` a sequence of logical length `len` stores in a group whose latest
/// growth started at `frontier` (`frontier <= len`). Released blocks are always full, so
/// the tokens are `len` minus `bs` per hole. A full group stores `(ceil(len/bs), len)`.
#[inline]
pub fn held(spec: &GroupSpec, bs: usize, len: usize, frontier: usize) -> (usize, usize) {
    let h = holes(spec, bs, frontier);
    (blocks_for(len, bs) - h, len - h * bs)
}

/// Blocks a group holds at most while one sequence grows alone by chunks of at most
/// `chunk` tokens up to `longest` tokens: everything for a full group; for a windowed one
/// the sink blocks, the blocks of the `span - 1` keys before the first query (one more
/// for misalignment) and the chunk's own blocks, capped by the whole sequence.
pub fn peak_alone(spec: &GroupSpec, bs: usize, longest: usize, chunk: usize) -> usize {
    let all = blocks_for(longest, bs);
    let span = match *spec {
        GroupSpec::Full => return all,
        GroupSpec::SlidingWindow { window, .. } => window,
        GroupSpec::Chunked { chunk } => chunk,
    };
    let bound = spec.sink_tokens().div_ceil(bs) + blocks_for(span - 1 + chunk.min(longest), bs) + 1;
    all.min(bound)
}

/// The device pool of a run.
pub enum Device {
    Block(BlockPool, StepOutput),
    Hybrid(HybridPool, HybridStepOutput),
}

impl Device {
    /// A `BlockPool` without `groups`, else a `HybridPool` of them; caching with `cache`.
    pub fn new(num_blocks: usize, bs: usize, cache: Option<CacheConfig>, groups: Option<&[GroupSpec]>) -> Result<Self> {
        Ok(match (groups, cache) {
            (Some(g), Some(c)) => {
                Self::Hybrid(HybridPool::with_prefix_cache(num_blocks, bs, g.to_vec(), c)?, HybridStepOutput::default())
            }
            (Some(g), None) => Self::Hybrid(HybridPool::new(num_blocks, bs, g.to_vec())?, HybridStepOutput::default()),
            (None, Some(c)) => Self::Block(BlockPool::with_prefix_cache(num_blocks, bs, c)?, StepOutput::default()),
            (None, None) => Self::Block(BlockPool::new(num_blocks, bs)?, StepOutput::default()),
        })
    }

    /// The block pool (runs without groups), for what only it supports (prefix caching).
    #[inline]
    pub fn block_pool(&self) -> Option<&BlockPool> {
        match self {
            Self::Block(p, _) => Some(p),
            Self::Hybrid(..) => None,
        }
    }

    /// The pool with layer groups (runs with groups).
    #[inline]
    pub fn hybrid_pool(&self) -> Option<&HybridPool> {
        match self {
            Self::Block(..) => None,
            Self::Hybrid(p, _) => Some(p),
        }
    }

    #[inline]
    pub fn hybrid_pool_mut(&mut self) -> Option<(&mut HybridPool, &mut HybridStepOutput)> {
        match self {
            Self::Block(..) => None,
            Self::Hybrid(p, o) => Some((p, o)),
        }
    }

    #[inline]
    pub fn block_pool_mut(&mut self) -> Option<(&mut BlockPool, &mut StepOutput)> {
        match self {
            Self::Block(p, o) => Some((p, o)),
            Self::Hybrid(..) => None,
        }
    }

    #[inline]
    pub fn num_blocks(&self) -> usize {
        match self {
            Self::Block(p, _) => p.num_blocks(),
            Self::Hybrid(p, _) => p.num_blocks(),
        }
    }

    /// Blocks an allocation can take now (free plus evictable idle cached blocks).
    #[inline]
    pub fn num_free_blocks(&self) -> usize {
        match self {
            Self::Block(p, _) => p.num_free_blocks(),
            Self::Hybrid(p, _) => p.num_free_blocks(),
        }
    }

    /// Blocks held by sequences.
    #[inline]
    pub fn num_used_blocks(&self) -> usize {
        match self {
            Self::Block(p, _) => p.num_used_blocks(),
            Self::Hybrid(p, _) => p.num_used_blocks(),
        }
    }

    #[inline]
    pub fn contains(&self, seq: SeqId) -> bool {
        match self {
            Self::Block(p, _) => p.contains(seq),
            Self::Hybrid(p, _) => p.contains(seq),
        }
    }

    /// Logical length of `seq`, tokens.
    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        match self {
            Self::Block(p, _) => p.seq_len(seq),
            Self::Hybrid(p, _) => p.seq_len(seq),
        }
    }

    /// Blocks growing `seq` by `n` tokens allocates (new blocks and copies, every group),
    /// before a windowed group's releases.
    #[inline]
    pub fn blocks_needed(&self, seq: SeqId, n: usize) -> Result<usize> {
        match self {
            Self::Block(p, _) => p.blocks_needed(seq, n),
            Self::Hybrid(p, _) => p.blocks_needed(seq, n),
        }
    }

    /// Add `seq` holding `len` tokens (slots discarded).
    pub fn add_sequence(&mut self, seq: SeqId, len: usize) -> Result<()> {
        match self {
            Self::Block(p, o) => {
                let r = p.add_sequence(seq, len, &mut o.slots);
                o.slots.clear();
                r
            }
            Self::Hybrid(p, o) => p.add_sequence(seq, len, o),
        }
    }

    /// Add `seq` holding `len` tokens whose latest growth started at `frontier`: what the
    /// release rule keeps in every group ([`HybridPool::add_sequence_at`]; a `BlockPool`
    /// keeps everything). Fresh blocks: a swap moving a sequence between pools.
    pub fn add_sequence_at(&mut self, seq: SeqId, len: usize, frontier: usize) -> Result<()> {
        match self {
            Self::Block(p, o) => {
                let r = p.add_sequence(seq, len, &mut o.slots);
                o.slots.clear();
                r
            }
            Self::Hybrid(p, _) => p.add_sequence_at(seq, len, frontier),
        }
    }

    /// Grow every `seqs[i]` by `counts[i]` tokens in one atomic step.
    pub fn step(&mut self, seqs: &[SeqId], counts: &[usize]) -> Result<()> {
        match self {
            Self::Block(p, o) => p.step(seqs, counts, o),
            Self::Hybrid(p, o) => p.step(seqs, counts, o),
        }
    }

    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        match self {
            Self::Block(p, _) => p.free(seq),
            Self::Hybrid(p, _) => p.free(seq),
        }
    }

    /// A hybrid pool agrees with the engine's mirror: every running `(request, frontier)`,
    /// and without prefix caching the blocks per group and the stored tokens (nothing more
    /// to compare for a `BlockPool` or with caching, whose sharing the engine does not
    /// mirror: there it counts each holder's blocks).
    pub fn check_mirror(&self, running: impl Iterator<Item = (usize, u32)>, group_blocks: &[usize], tokens: u64) -> Result<()> {
        let Self::Hybrid(p, _) = self else { return Ok(()) };
        for (i, f) in running {
            let got = p.frontier(SeqId(i as u64))?;
            if got != f as usize {
                return Err(KvError::Invariant(format!("request {i}: pool frontier {got}, engine {f}")));
            }
        }
        if p.prefix_cache().is_some() {
            return Ok(());
        }
        let st = p.stats();
        let stored: u64 = st.group_stored_tokens.iter().sum();
        if st.group_blocks != group_blocks || stored != tokens || p.num_used_blocks() != group_blocks.iter().sum::<usize>() {
            return Err(KvError::Invariant(format!(
                "pool holds {:?} blocks per group and {stored} tokens, engine {group_blocks:?} and {tokens}",
                st.group_blocks
            )));
        }
        Ok(())
    }

    pub fn check_invariants(&self) -> Result<()> {
        match self {
            Self::Block(p, _) => p.check_invariants(),
            Self::Hybrid(p, _) => p.check_invariants(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `held` against the release rule applied block by block.
    #[test]
    fn held_counts_what_the_release_rule_keeps() {
        let specs = [
            GroupSpec::Full,
            GroupSpec::sliding_window(1, 0).unwrap(),
            GroupSpec::sliding_window(7, 0).unwrap(),
            GroupSpec::sliding_window(8, 3).unwrap(),
            GroupSpec::chunked(6).unwrap(),
        ];
        for s in specs {
            for bs in [1usize, 2, 4] {
                for len in 0..40usize {
                    for f in 0..=len {
                        let kept: Vec<usize> = (0..len.div_ceil(bs)).filter(|&i| !s.releasable(i, bs, f)).collect();
                        let tokens: usize = kept.iter().map(|&i| ((i + 1) * bs).min(len) - i * bs).sum();
                        assert_eq!(held(&s, bs, len, f), (kept.len(), tokens), "{s} bs {bs} len {len} frontier {f}");
                    }
                }
            }
        }
    }

    /// The peak bound is never below the blocks held during any growth of a lone sequence.
    #[test]
    fn peak_alone_bounds_every_growth() {
        let specs = [GroupSpec::Full, GroupSpec::sliding_window(5, 0).unwrap(), GroupSpec::sliding_window(8, 3).unwrap(), GroupSpec::chunked(6).unwrap()];
        for s in specs {
            for bs in [1usize, 2, 4] {
                for chunk in 1..10usize {
                    let longest = 45;
                    let (mut len, mut peak) = (0usize, 0usize);
                    while len < longest {
                        let n = chunk.min(longest - len);
                        // During the growth: the blocks kept for frontier `len`, plus the new ones.
                        peak = peak.max(held(&s, bs, len + n, len).0);
                        len += n;
                    }
                    assert!(peak <= peak_alone(&s, bs, longest, chunk), "{s} bs {bs} chunk {chunk}");
                }
            }
        }
    }
}
