//! The one-pass decode step: [`BlockPool::step`] when every count is 1 and nothing can
//! be copied on write.
//!
//! The general step plans the whole batch (resolve ids, catch duplicates, count blocks)
//! before it mutates anything, which walks every sequence twice. A pure decode batch on
//! a pool with no shared block and no prefix cache cannot copy on write, and needs a block
//! only for the sequences at a block boundary (about one in `block_size`). This path
//! resolves and applies each entry in the same visit. On an unknown id, a duplicate id or
//! a sequence at the length limit it undoes the entries already applied, last first, which
//! returns their new blocks to the free list in the reverse of the order they were taken.
//! The free list is a stack, so it ends up exactly as before the call (same blocks, same
//! order) and the next allocations hand out the same block ids as if the failed call never
//! happened. If the free list runs dry part-way, it undoes the same way and hands the
//! batch to the general path, which reports the exhaustion (or an earlier-ranked error)
//! with its usual numbers. It is only tried when the free blocks cover twice the expected
//! need (or the whole batch), so a step the pool must refuse rarely pays for a wasted pass.

use crate::error::{KvError, Result};
use crate::invalid;
use crate::pool::{BlockPool, SeqEntry, StepOutput, MAX_SEQ_TOKENS};
use crate::pool::seq_map::SeqMap;
use crate::types::SeqId;

impl BlockPool {
    /// Whether [`Self::decode_one_pass`] is worth trying on a batch of `len` sequences
    /// whose counts are all 1: no block is shared, no prefix cache, and the free blocks
    /// cover the whole batch or twice the blocks a batch with uniformly spread lengths needs.
    #[inline]
    pub(crate) fn one_pass_fits(&self, len: usize) -> bool {
        self.alloc.num_shared() == 0
            && self.cache.is_none()
            && self.alloc.num_free() >= len.min(2 * len.div_ceil(self.block_size))
    }

    /// Append one token to each of `seqs`, resolving and applying in one visit per id.
    /// Only valid when [`Self::one_pass_fits`] holds and every count is 1. An error
    /// leaves the pool as it was; so does `Ok(false)`, returned when the free list ran dry
    /// part-way: the caller then runs the general path (with a fresh batch mark: this one
    /// is spent).
    pub(crate) fn decode_one_pass(
        &mut self,
        map: &mut SeqMap<SeqEntry>,
        seqs: &[SeqId],
        mark: u64,
        out: &mut StepOutput,
    ) -> Result<bool> {
        out.slots.reserve(seqs.len());
        out.seq_lens.reserve(seqs.len());
        let bs = self.block_size;
        for (done, &seq) in seqs.iter().enumerate() {
            let err = match map.slot(&seq).and_then(|s| map.at_mut(s)) {
                None => KvError::UnknownSequence(seq.0),
                Some(e) if e.mark == mark => invalid!("sequence id {} appears twice in one step", seq.0),
                Some(e) if e.table.num_tokens() >= MAX_SEQ_TOKENS => Self::checked_len(e.table.num_tokens(), 1)
                    .err()
                    .unwrap_or_else(|| KvError::Invariant("length limit not enforced".into())),
                Some(e) => {
                    e.mark = mark;
                    let t = &mut e.table;
                    let len = t.num_tokens();
                    let off = self.offset_in_block(len);
                    let b = match t.last() {
                        Some(b) if off != 0 => b,
                        _ => match self.alloc.allocate() {
                            Some(b) => {
                                t.push(b);
                                b
                            }
                            None => {
                                self.undo_decode(map, &seqs[..done]);
                                out.clear();
                                return Ok(false);
                            }
                        },
                    };
                    out.slots.push(b.first_slot(bs) + off as i64);
                    t.set_num_tokens(len + 1);
                    out.seq_lens.push((len + 1) as i32);
                    continue;
                }
            };
            self.undo_decode(map, &seqs[..done]);
            out.clear();
            return Err(err);
        }
        Ok(true)
    }

    /// Undo one-token appends to `applied` (distinct, live ids), last first, so that the
    /// blocks they took return to the free-list stack in reverse order of allocation.
    fn undo_decode(&mut self, map: &mut SeqMap<SeqEntry>, applied: &[SeqId]) {
        for seq in applied.iter().rev() {
            let Some(e) = map.get_mut(seq) else { continue };
            let t = &mut e.table;
            let len = t.num_tokens() - 1;
            if self.offset_in_block(len) == 0 {
                // The token opened a block: it was allocated (refcount 1) by this step.
                let mut taken = None;
                t.truncate_blocks(t.blocks().len() - 1, |b| taken = Some(b));
                if let Some(b) = taken {
                    self.alloc.release(b);
                }
            }
            t.set_num_tokens(len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::BlockId;

    const BS: usize = 16;

    /// Tables `(id, blocks, tokens)`, refcounts, statistics, next blocks allocated.
    type State = (Vec<(u64, Vec<BlockId>, usize)>, Vec<u32>, crate::pool::PoolStats, Vec<BlockId>);

    /// Everything observable, plus the block ids the next allocations return: the free
    /// list read from the top of the stack (the pool allocates by popping it).
    fn state(pool: &BlockPool) -> State {
        let mut tables: Vec<_> =
            pool.seqs.iter().map(|(s, e)| (s.0, e.table.blocks().to_vec(), e.table.num_tokens())).collect();
        tables.sort_unstable();
        let next = pool.alloc.free_list().iter().rev().copied().collect();
        (tables, pool.alloc.refcounts().to_vec(), pool.stats(), next)
    }

    /// 300 sequences; 1 in 4 sits at a block boundary, so a decode step allocates ~75 blocks.
    fn pool_with_batch() -> (BlockPool, Vec<SeqId>) {
        let mut pool = BlockPool::new(4096, BS).unwrap();
        let mut slots = Vec::new();
        let ids: Vec<SeqId> = (0..300u64).map(|i| SeqId(i * 7 + 3)).collect();
        for (i, &s) in ids.iter().enumerate() {
            let len = if i % 4 == 0 { 32 } else { 20 + i % 11 };
            pool.add_sequence(s, len, &mut slots).unwrap();
        }
        // Free a few scattered sequences so the free list is not a plain countdown.
        for &s in &ids[..40] {
            if s.0 % 3 == 0 {
                pool.free(s).unwrap();
            }
        }
        let live: Vec<SeqId> = ids.into_iter().filter(|s| pool.contains(*s)).collect();
        (pool, live)
    }

    fn failing_step(make_bad: impl Fn(&[SeqId]) -> Vec<SeqId>, want: fn(&KvError) -> bool) {
        let (mut pool, live) = pool_with_batch();
        // The failing entry comes after a sequence that opens a block, at the batch's end.
        let boundary = live.iter().rposition(|s| pool.seq_len(*s).unwrap() % BS == 0).unwrap();
        let mut batch = live[..=boundary].to_vec();
        batch.extend(make_bad(&batch));
        let counts = vec![1; batch.len()];
        assert!(pool.one_pass_fits(counts.len()));
        let before = state(&pool);
        let mut out = StepOutput::default();
        let err = pool.step(&batch, &counts, &mut out).unwrap_err();
        assert!(want(&err), "{err:?}");
        assert!(out.slots.is_empty() && out.seq_lens.is_empty() && out.cow.is_empty());
        assert_eq!(state(&pool), before);
        pool.check_invariants().unwrap();
        // The same batch without the bad id then succeeds as if nothing had happened.
        let good = &batch[..=boundary];
        let mut fresh = pool.clone();
        let mut out2 = StepOutput::default();
        fresh.step(good, &vec![1; good.len()], &mut out2).unwrap();
        let (mut reference, _) = pool_with_batch();
        let mut out3 = StepOutput::default();
        reference.step(good, &vec![1; good.len()], &mut out3).unwrap();
        assert_eq!(out2.slots, out3.slots);
        assert_eq!(state(&fresh), state(&reference));
    }

    #[test]
    fn unknown_id_at_the_end_rolls_back_everything() {
        failing_step(|_| vec![SeqId(1_000_000)], |e| matches!(e, KvError::UnknownSequence(1_000_000)));
    }

    #[test]
    fn duplicate_id_at_the_end_rolls_back_everything() {
        // The duplicate is the boundary sequence itself: its block was just taken.
        failing_step(|b| vec![*b.last().unwrap()], |e| matches!(e, KvError::InvalidArgument(_)));
    }

    #[test]
    fn unknown_id_first_changes_nothing() {
        let (mut pool, live) = pool_with_batch();
        let mut batch = vec![SeqId(5)];
        batch.extend(&live);
        let before = state(&pool);
        let mut out = StepOutput::default();
        assert!(matches!(pool.step(&batch, &vec![1; batch.len()], &mut out), Err(KvError::UnknownSequence(5))));
        assert_eq!(state(&pool), before);
    }

    #[test]
    fn one_pass_matches_the_two_pass_path() {
        // Same batches on two pools; on one, a fork of a sequence outside the batch (freed
        // after the step) shares a block and forces the general path, which must agree.
        let (mut a, live) = pool_with_batch();
        let (mut b, _) = pool_with_batch();
        let outside = SeqId(u64::MAX - 2);
        let mut slots = Vec::new();
        a.add_sequence(outside, BS, &mut slots).unwrap();
        b.add_sequence(outside, BS, &mut slots).unwrap();
        let counts = vec![1; live.len()];
        let (mut oa, mut ob) = (StepOutput::default(), StepOutput::default());
        for round in 0..40 {
            assert!(a.one_pass_fits(counts.len()));
            a.step(&live, &counts, &mut oa).unwrap();
            b.fork(outside, SeqId(u64::MAX - 1)).unwrap();
            assert!(!b.one_pass_fits(counts.len()));
            b.step(&live, &counts, &mut ob).unwrap();
            b.free(SeqId(u64::MAX - 1)).unwrap();
            assert_eq!((&oa.slots, &oa.seq_lens), (&ob.slots, &ob.seq_lens), "round {round}");
            assert!(ob.cow.is_empty() && oa.cow.is_empty());
            assert_eq!(state(&a), state(&b));
        }
        a.check_invariants().unwrap();
    }

    #[test]
    fn running_dry_part_way_falls_back_to_the_general_path() {
        // 100 sequences at a block boundary, 20 free blocks: tried (20 >= 2 * ceil(100/16)),
        // runs dry at the 21st, undoes 20 allocations and lets the general path report.
        let mut pool = BlockPool::new(120, BS).unwrap();
        let mut slots = Vec::new();
        let ids: Vec<SeqId> = (0..100u64).map(SeqId).collect();
        pool.add_sequence(SeqId(500), 3 * BS, &mut slots).unwrap();
        for &s in &ids {
            pool.add_sequence(s, BS, &mut slots).unwrap();
        }
        pool.add_sequence(SeqId(501), 17 * BS, &mut slots).unwrap();
        // Free list not in id order: 3 blocks freed first, then 17 on top.
        pool.free(SeqId(500)).unwrap();
        pool.free(SeqId(501)).unwrap();
        let counts = vec![1; ids.len()];
        assert!(pool.one_pass_fits(counts.len()));
        let before = state(&pool);
        let mut out = StepOutput::default();
        let r = pool.step(&ids, &counts, &mut out);
        assert!(matches!(r, Err(KvError::PoolExhausted { requested: 100, free: 20 })), "{r:?}");
        assert_eq!(state(&pool), before);
        // An unknown id after the point where it ran dry outranks exhaustion, as in the
        // general path; so does a duplicate of an entry the failed attempt had marked.
        let mut bad = ids.clone();
        bad.push(SeqId(9_999));
        assert!(matches!(pool.step(&bad, &vec![1; bad.len()], &mut out), Err(KvError::UnknownSequence(9_999))));
        let mut dup = ids.clone();
        dup.push(SeqId(3));
        assert!(matches!(pool.step(&dup, &vec![1; dup.len()], &mut out), Err(KvError::InvalidArgument(_))));
        assert_eq!(state(&pool), before);
        // With enough free, the same kind of batch goes through in one pass.
        for &s in &ids[..80] {
            pool.free(s).unwrap();
        }
        assert!(pool.one_pass_fits(20));
        pool.step(&ids[80..], &counts[80..], &mut out).unwrap();
        assert_eq!(out.seq_lens, vec![BS as i32 + 1; 20]);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn step_decode_is_step_with_ones() {
        let (a0, live) = pool_with_batch();
        let mut cases: Vec<Vec<SeqId>> = vec![live.clone(), live[..5].to_vec(), Vec::new()];
        cases.push([&live[..50], &[SeqId(1_000_000)][..]].concat());
        cases.push([&live[..50], &[live[7]][..]].concat());
        for batch in cases {
            let (mut a, mut b) = (a0.clone(), a0.clone());
            let (mut oa, mut ob) = (StepOutput::default(), StepOutput::default());
            let ra = a.step(&batch, &vec![1; batch.len()], &mut oa);
            let rb = b.step_decode(&batch, &mut ob);
            assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
            assert_eq!((oa.slots, oa.seq_lens), (ob.slots, ob.seq_lens));
            assert_eq!(state(&a), state(&b));
        }
        // Exhaustion, through the general path, from a shorter call after a longer one
        // (the ones buffer is longer than the batch).
        let mut pool = BlockPool::new(3, BS).unwrap();
        let mut slots = Vec::new();
        for s in 0..3u64 {
            pool.add_sequence(SeqId(s), BS, &mut slots).unwrap();
        }
        let mut out = StepOutput::default();
        assert!(pool.step_decode(&[SeqId(0), SeqId(1), SeqId(2), SeqId(9)], &mut out).is_err());
        let r = pool.step_decode(&[SeqId(0), SeqId(1)], &mut out);
        assert!(matches!(r, Err(KvError::PoolExhausted { requested: 2, free: 0 })), "{r:?}");
    }

    #[test]
    fn falls_back_when_free_blocks_could_run_out() {
        // Exactly as many free blocks as sequences minus one: the general path must run
        // and report exhaustion (or succeed) with its usual atomicity.
        let mut pool = BlockPool::new(4, BS).unwrap();
        let mut slots = Vec::new();
        for s in 0..3u64 {
            pool.add_sequence(SeqId(s), BS, &mut slots).unwrap();
        }
        let ids = [SeqId(0), SeqId(1), SeqId(2)];
        assert!(!pool.one_pass_fits(3));
        let before = state(&pool);
        let mut out = StepOutput::default();
        assert!(matches!(pool.step(&ids, &[1, 1, 1], &mut out), Err(KvError::PoolExhausted { requested: 3, free: 1 })));
        assert_eq!(state(&pool), before);
    }
}
