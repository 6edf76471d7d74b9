//! The simulator's device pool: a [`BlockPool`] with one full-attention group, or with
//! the model's layer groups (full, sliding window with sinks, chunked) sharing one block
//! space.
//!
//! The engine mirrors what each group holds with [`held`], pure arithmetic on a
//! sequence's logical length and frontier (the length before its latest growth): a
//! windowed group's released blocks are exactly the blocks the release rule drops for the
//! frontier, a contiguous run after the sink blocks (`hybrid_spec`: "holes == exactly the
//! blocks the rule releases for `frontier`"). `check_invariants` runs compare the mirror
//! with the pool's own statistics.

use crate::error::{KvError, Result};
use crate::pool::sizes::blocks_for;
use crate::pool::{BlockPool, GroupSpec, StepOutput};
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

/// The device pool of a run (one full-attention group unless the model has layer
/// groups) and the output buffer its calls reuse. Reads go to the pool (`Deref`).
pub struct Device {
    pool: BlockPool,
    out: StepOutput,
    /// Built with the model's layer groups (the engine mirrors what each group holds).
    grouped: bool,
}

impl std::ops::Deref for Device {
    type Target = BlockPool;

    #[inline]
    fn deref(&self) -> &BlockPool {
        &self.pool
    }
}

impl Device {
    /// A pool of `groups` (None: one full-attention group); caching with `cache`.
    pub fn new(num_blocks: usize, bs: usize, cache: Option<CacheConfig>, groups: Option<&[GroupSpec]>) -> Result<Self> {
        let specs = groups.map_or_else(|| vec![GroupSpec::Full], <[GroupSpec]>::to_vec);
        let pool = BlockPool::with_options(num_blocks, bs, specs, cache)?;
        Ok(Self { pool, out: StepOutput::default(), grouped: groups.is_some() })
    }

    /// The pool and the reusable output buffer, for calls that change the pool.
    #[inline]
    pub fn pool_mut(&mut self) -> (&mut BlockPool, &mut StepOutput) {
        (&mut self.pool, &mut self.out)
    }

    /// Add `seq` holding `len` tokens (slots discarded).
    pub fn add_sequence(&mut self, seq: SeqId, len: usize) -> Result<()> {
        self.pool.add_sequence(seq, len, &mut self.out)
    }

    /// Add `seq` holding `len` tokens whose latest growth started at `frontier`: what the
    /// release rule keeps in every group ([`BlockPool::add_sequence_at`]). Fresh blocks: a
    /// swap moving a sequence between pools.
    pub fn add_sequence_at(&mut self, seq: SeqId, len: usize, frontier: usize) -> Result<()> {
        self.pool.add_sequence_at(seq, len, frontier)
    }

    /// Grow every `seqs[i]` by `counts[i]` tokens in one atomic step.
    pub fn step(&mut self, seqs: &[SeqId], counts: &[usize]) -> Result<()> {
        self.pool.step(seqs, counts, &mut self.out)
    }

    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        self.pool.free(seq)
    }

    /// A pool with layer groups agrees with the engine's mirror: every running `(request,
    /// frontier)`, and without prefix caching the blocks per group and the stored tokens
    /// (nothing more to compare without groups or with caching, whose sharing the engine
    /// does not mirror: there it counts each holder's blocks).
    pub fn check_mirror(&self, running: impl Iterator<Item = (usize, u32)>, group_blocks: &[usize], tokens: u64) -> Result<()> {
        if !self.grouped {
            return Ok(());
        }
        let p = &self.pool;
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
        if st.group_blocks != group_blocks || st.stored_tokens != tokens || p.num_used_blocks() != group_blocks.iter().sum::<usize>() {
            return Err(KvError::Invariant(format!(
                "pool holds {:?} blocks per group and {} tokens, engine {group_blocks:?} and {tokens}",
                st.group_blocks, st.stored_tokens
            )));
        }
        Ok(())
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
