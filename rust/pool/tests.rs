//! Unit tests that need the pool's internals: a failed one-pass decode leaves the
//! allocator's free-list stack exactly as it was (same blocks, same order), so the next
//! allocations hand out the same ids as if the call never happened.

use super::{GroupSpec, BlockPool, StepOutput};
use crate::error::KvError;
use crate::types::{BlockId, SeqId};

const BS: usize = 4;

type State = (Vec<(u64, usize, usize, Vec<Vec<Option<BlockId>>>)>, Vec<u32>, Vec<BlockId>);

fn state(pool: &BlockPool) -> State {
    let mut seqs: Vec<_> = pool
        .seqs
        .iter()
        .map(|(s, e)| (s.0, e.len, e.frontier, e.tables.iter().map(|t| t.entries().collect()).collect()))
        .collect();
    seqs.sort();
    (seqs, pool.alloc.refcounts().to_vec(), pool.alloc.free_list().to_vec())
}

/// 40 sequences over a full and a windowed group, lengths spread so that a decode step
/// both releases window blocks and opens new blocks; a few freed to scatter the free list.
fn pool_with_batch() -> (BlockPool, Vec<SeqId>) {
    let groups = vec![GroupSpec::Full, GroupSpec::sliding_window(6, 1).unwrap()];
    let mut pool = BlockPool::with_groups(1024, BS, groups).unwrap();
    let mut out = StepOutput::default();
    let ids: Vec<SeqId> = (0..40u64).map(|i| SeqId(i * 3 + 1)).collect();
    for (i, &s) in ids.iter().enumerate() {
        pool.add_sequence(s, 9 + i % 13, &mut out).unwrap();
    }
    for _ in 0..3 {
        pool.step_decode(&ids, &mut out).unwrap();
    }
    for &s in ids.iter().filter(|s| s.0 % 5 == 0) {
        pool.free(s).unwrap();
    }
    let live: Vec<SeqId> = ids.into_iter().filter(|s| pool.contains(*s)).collect();
    (pool, live)
}

#[test]
fn a_failed_one_pass_decode_restores_the_free_list_order() {
    for bad in [SeqId(999), SeqId(0)] {
        let (mut pool, live) = pool_with_batch();
        let mut batch = live.clone();
        // An unknown id, or a duplicate of the first entry, at the end of the batch.
        batch.push(if bad.0 == 999 { bad } else { live[0] });
        assert!(pool.one_pass_fits(batch.len()));
        let before = state(&pool);
        let mut out = StepOutput::default();
        let err = pool.step_decode(&batch, &mut out).unwrap_err();
        assert!(matches!(err, KvError::UnknownSequence(999) | KvError::InvalidArgument(_)), "{err:?}");
        assert_eq!(state(&pool), before);
        assert!(out.slots.is_empty() && out.seq_lens.is_empty());
        // The good batch then gives what a pool that never saw the failure gives.
        let (mut reference, _) = pool_with_batch();
        let mut out2 = StepOutput::default();
        pool.step_decode(&live, &mut out).unwrap();
        reference.step_decode(&live, &mut out2).unwrap();
        assert_eq!(out.slots, out2.slots);
        assert_eq!(state(&pool), state(&reference));
        pool.check_invariants().unwrap();
    }
}

#[test]
fn running_dry_part_way_falls_back_to_the_general_path() {
    // Every sequence at a block boundary in four groups, the window group releasing one
    // block each: the one pass is tried (16 free >= 2 x 4 x ceil(6 / 4)), runs dry at the
    // sixth sequence after releases and allocations, undoes them all, and the general path
    // reports 24 needed against 16 free + 6 released.
    let w = GroupSpec::sliding_window(5, 0).unwrap();
    let mut pool = BlockPool::with_groups(100, BS, vec![GroupSpec::Full, GroupSpec::Full, GroupSpec::Full, w]).unwrap();
    let mut out = StepOutput::default();
    let ids: Vec<SeqId> = (0..6u64).map(SeqId).collect();
    for &s in &ids {
        pool.add_sequence(s, 2 * BS, &mut out).unwrap();
    }
    pool.add_sequence(SeqId(100), 5 * BS, &mut out).unwrap();
    pool.add_sequence(SeqId(101), 4 * BS, &mut out).unwrap();
    pool.free(SeqId(100)).unwrap();
    pool.add_sequence(SeqId(102), 5 * BS, &mut out).unwrap();
    assert_eq!(pool.num_free_blocks(), 16);
    assert!(pool.one_pass_fits(ids.len()));
    let before = state(&pool);
    let r = pool.step_decode(&ids, &mut out);
    assert_eq!(r, Err(KvError::PoolExhausted { requested: 24, free: 22 }));
    assert_eq!(state(&pool), before);
    pool.free(SeqId(102)).unwrap();
    pool.step_decode(&ids, &mut out).unwrap();
    assert_eq!(out.seq_lens, vec![2 * BS as i32 + 1; 6]);
    assert_eq!(pool.table(SeqId(0), 3).unwrap().entries().next(), Some(None), "window block 0 released");
    pool.check_invariants().unwrap();
}
