//! Prefix caching (`rust/pool/prefix.rs`, `rust/prefix_cache/`) on one to four layer
//! groups: targeted cases of the contract (a window hit needs only its sinks and window,
//! the hit is the largest valid for every group, chunk boundaries, keys never hit across
//! groups, atomic refusals, blocks registered by `append_tokens`), the model-based
//! property test (`props`, against `model`: every policy, pins, events, block keys,
//! copy-on-write hits, collisions, failures) and, ignored by default, the hit rates on the
//! Mooncake trace (`trace`).


#[path = "prefix_model/model.rs"]
mod model;
#[path = "prefix_model/props.rs"]
mod props;
#[path = "prefix_model/trace.rs"]
mod trace;

use pykvpool::pool::{GroupSpec, BlockPool, StepOutput};
use pykvpool::prefix_cache::CacheConfig;
use pykvpool::{BlockHasher, KvError, SeqId};

const BS: usize = 4;

fn sw(window: usize, sinks: usize) -> GroupSpec {
    GroupSpec::sliding_window(window, sinks).unwrap()
}

fn pool(blocks: usize, groups: Vec<GroupSpec>) -> BlockPool {
    BlockPool::with_options(blocks, BS, groups, Some(CacheConfig::default())).unwrap()
}

fn hashed(hasher: BlockHasher) -> CacheConfig {
    CacheConfig { hasher, ..CacheConfig::default() }
}

fn checked(p: &BlockPool) {
    p.check_invariants().unwrap();
    p.check_cache().unwrap();
}

fn tokens(base: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| base * 1000 + i).collect()
}

/// Admit by tokens; returns the cached tokens.
fn admit(p: &mut BlockPool, seq: u64, t: &[u32]) -> usize {
    let mut out = StepOutput::default();
    let hit = p.add_sequence_tokens(SeqId(seq), t, None, &mut out).unwrap();
    assert_eq!((out.total_tokens, out.slots.len()), (t.len() - hit, p.num_groups() * (t.len() - hit)));
    assert_eq!((p.frontier(SeqId(seq)).unwrap(), p.seq_len(SeqId(seq)).unwrap()), (hit, t.len()));
    checked(p);
    hit
}

fn stored(p: &BlockPool, seq: u64, g: usize) -> Vec<bool> {
    p.table(SeqId(seq), g).unwrap().entries().map(|e| e.is_some()).collect()
}

fn decode(p: &mut BlockPool, seq: u64) {
    let mut out = StepOutput::default();
    p.step_decode(&[SeqId(seq)], &mut out).unwrap();
    checked(p);
}

/// A plain sequence of `blocks` blocks per group: takes free blocks, then evicts.
fn fill(p: &mut BlockPool, seq: u64, tokens: usize) {
    let mut out = StepOutput::default();
    p.add_sequence(SeqId(seq), tokens, &mut out).unwrap();
    checked(p);
}

#[test]
fn window_hit_needs_only_sinks_and_window() {
    // Window of 8 tokens with 4 sinks: a query at 40 needs block 0 and blocks 8, 9.
    let mut p = pool(20, vec![sw(8, 4)]);
    let a = tokens(1, 40);
    assert_eq!(admit(&mut p, 1, &a), 0);
    decode(&mut p, 1); // growth from 40 releases blocks 1..=7: idle, still cached
    assert_eq!(p.cache_stats().unwrap().idle_blocks, 7);
    fill(&mut p, 2, 4 * (20 - 11)); // the 9 free blocks...
    fill(&mut p, 3, 4 * 7); // ...then the 7 idle ones: evicted
    assert_eq!(p.cache_stats().unwrap().evictions, 7);
    p.free(SeqId(2)).unwrap();
    let mut b = a.clone();
    b.extend([7, 7, 7]);
    assert_eq!(p.cached_prefix_len(&b, None).unwrap(), 40, "early blocks evicted, still a hit");
    assert_eq!(admit(&mut p, 4, &b), 40);
    let want: Vec<bool> = (0..11).map(|i| i == 0 || i >= 8).collect();
    assert_eq!(stored(&p, 4, 0), want, "sink block, holes, the window, the computed block");
    let s = p.cache_stats().unwrap();
    assert_eq!((s.queries, s.query_tokens, s.hit_tokens, s.group_hit_blocks.clone()), (2, 83, 40, vec![3]));
    // The held blocks are A's: shared, not copied.
    for i in [0, 8, 9] {
        let blk = p.table(SeqId(4), 0).unwrap().get(i).unwrap();
        assert_eq!(p.table(SeqId(1), 0).unwrap().get(i), Some(blk));
        assert_eq!(p.refcount(blk).unwrap(), 2);
    }
}

#[test]
fn hybrid_hit_is_the_largest_valid_for_every_group() {
    let groups = vec![GroupSpec::Full, sw(8, 0)];
    // Full blocks evicted while the window ones stay: the full group's run bounds the hit.
    let mut p = pool(30, groups.clone());
    let a = tokens(2, 40);
    admit(&mut p, 1, &a);
    p.free(SeqId(1)).unwrap(); // tail first, block by block: 9 (full), 9 (window), 8, 8, ...
    fill(&mut p, 2, 4 * 7); // 2 x 7 blocks: 10 free + 4 evicted: blocks 9 and 8 of both groups
    assert_eq!(p.cache_stats().unwrap().evictions, 4);
    p.free(SeqId(2)).unwrap();
    let mut b = a.clone();
    b.push(1);
    assert_eq!(admit(&mut p, 3, &b), 32, "the full group keeps blocks 0..8; the window needs 6, 7");
    assert_eq!(stored(&p, 3, 1), (0..11).map(|i| i >= 6).collect::<Vec<_>>());
    assert_eq!(p.cache_stats().unwrap().group_hit_blocks, [8, 2]);
    // Window blocks missing while the full group holds the whole prefix: the hit drops to
    // the largest point both can serve, here none.
    let mut p = pool(30, groups);
    admit(&mut p, 1, &a);
    decode(&mut p, 1); // the window group releases blocks 0..=7
    fill(&mut p, 2, 4 * 8); // 2 x 8 blocks: 8 free + the 8 idle ones evicted
    assert_eq!(p.cache_stats().unwrap().evictions, 8);
    let c = [&a[..24], &[5, 5, 5, 5, 5]].concat(); // shares 6 blocks
    assert_eq!(p.cached_prefix_len(&c, None).unwrap(), 0, "blocks 4, 5 of the window group are gone");
    let d = [&a[..32], &[5]].concat(); // shares 8 blocks: window blocks 6, 7 gone too
    assert_eq!(p.cached_prefix_len(&d, None).unwrap(), 0);
    assert_eq!(p.cached_prefix_len(&b, None).unwrap(), 40, "the window before 40 is held by sequence 1");
}

#[test]
fn chunked_hits_need_only_their_chunk() {
    let mut p = pool(40, vec![GroupSpec::Full, GroupSpec::chunked(8).unwrap()]);
    let a = tokens(3, 40);
    admit(&mut p, 1, &a);
    p.free(SeqId(1)).unwrap();
    // 37 tokens: hit of 36, the chunked group needs only block 8 (positions 32..36).
    assert_eq!(admit(&mut p, 2, &a[..37]), 36);
    assert_eq!(stored(&p, 2, 1), (0..10).map(|i| i >= 8).collect::<Vec<_>>());
    assert_eq!(stored(&p, 2, 0), vec![true; 10]);
    // 41 tokens: hit of 40, a chunk boundary: the chunked group holds nothing before it.
    let mut b = a.clone();
    b.push(9);
    assert_eq!(admit(&mut p, 3, &b), 40);
    assert_eq!(stored(&p, 3, 1), (0..11).map(|i| i == 10).collect::<Vec<_>>());
}

#[test]
fn a_key_cached_in_one_group_never_hits_another() {
    // Every block of every prompt gets the same key: within a group that is the hasher's
    // business (a collision), across groups the index keeps them apart.
    fn same(_: &[u8]) -> u128 {
        42
    }
    let mut p = BlockPool::with_options(7, BS, vec![GroupSpec::Full, GroupSpec::Full], Some(hashed(BlockHasher::Custom(same)))).unwrap();
    let a = tokens(4, 9);
    admit(&mut p, 1, &a);
    assert_eq!(p.cache_stats().unwrap().stored_blocks, 2, "one key per group: block 0 of each");
    p.free(SeqId(1)).unwrap();
    fill(&mut p, 2, 4 * 3); // 5 free, then group 0's idle block (released first) goes
    assert_eq!(p.cache_stats().unwrap().evictions, 1);
    p.free(SeqId(2)).unwrap();
    let c = p.prefix_cache().unwrap();
    assert!(c.block_of(0, 42).is_none() && c.block_of(1, 42).is_some());
    assert_eq!(p.cached_prefix_len(&a, None).unwrap(), 0, "group 1's block never serves group 0");
    assert_eq!(admit(&mut p, 3, &a), 0);
    let g1 = p.prefix_cache().unwrap().block_of(1, 42).unwrap();
    assert!(p.table(SeqId(3), 1).unwrap().entries().all(|b| b != Some(g1)), "a miss takes fresh blocks");
    assert!(p.prefix_cache().unwrap().block_of(0, 42).is_some(), "group 0 registers its own");
}

#[test]
fn refused_admissions_change_nothing() {
    let mut p = pool(14, vec![GroupSpec::Full, sw(4, 0)]);
    let a = tokens(5, 16);
    admit(&mut p, 1, &a);
    p.free(SeqId(1)).unwrap(); // 8 idle blocks, 6 free
    fill(&mut p, 3, 4); // 4 free + 8 idle = 12 available
    let snap = |p: &BlockPool| (p.stats(), p.cache_stats(), p.prefix_cache().unwrap().eviction_candidates(), p.seq_ids());
    let before = snap(&p);
    let mut out = StepOutput::default();
    // A hit of 16 tokens revives 4 + 1 idle blocks; 32 tokens need 2 x 4 new ones.
    let b = [&a[..], &tokens(6, 16)].concat();
    assert_eq!(p.cached_prefix_len(&b, None).unwrap(), 16);
    let err = p.add_sequence_tokens(SeqId(2), &b, None, &mut out).unwrap_err();
    assert_eq!(err, KvError::PoolExhausted { requested: 8, free: 7 }, "12 available minus 5 revived");
    assert!(out.slots.is_empty() && out.seq_lens.is_empty() && out.total_tokens == 0);
    assert!(matches!(p.add_sequence_tokens(SeqId(3), &a, None, &mut out), Err(KvError::DuplicateSequence(3))));
    let e = p.add_sequence_block_keys(SeqId(4), &[1, 2], 9, &mut out).unwrap_err();
    assert!(e.to_string().contains("keys: 2 block keys for a prompt of 9 tokens"), "{e}");
    assert_eq!(snap(&p), before);
    checked(&p);
    // One block fewer fits exactly.
    assert_eq!(admit(&mut p, 2, &b[..28]), 16);
    assert_eq!(p.num_free_blocks(), 1);
    let mut plain = BlockPool::with_groups(4, BS, vec![GroupSpec::Full]).unwrap();
    assert!(plain.add_sequence_tokens(SeqId(0), &a, None, &mut out).is_err());
    assert!(plain.cache_stats().is_err());
    assert!(BlockPool::with_options(4, BS, vec![GroupSpec::Full], Some(hashed(BlockHasher::Truncated { bits: 0 }))).is_err());
}

#[test]
fn appended_blocks_are_registered_and_hit() {
    let mut p = pool(30, vec![GroupSpec::Full, sw(6, 0)]);
    let a = tokens(7, 6);
    admit(&mut p, 1, &a);
    let mut out = StepOutput::default();
    let more = tokens(8, 7);
    p.append_tokens(SeqId(1), &more, &mut out).unwrap();
    checked(&p);
    assert_eq!(out.seq_lens, [13]);
    let all = [&a[..], &more[..]].concat();
    assert_eq!(p.cache_stats().unwrap().stored_blocks, 2 * 3, "blocks 0, 1, 2 in both groups");
    assert_eq!(p.cached_prefix_len(&all, None).unwrap(), 12);
    // A plain step drops the token record: later blocks are not registered.
    p.step(&[SeqId(1)], &[3], &mut out).unwrap();
    p.append_tokens(SeqId(1), &[1, 2], &mut out).unwrap();
    assert_eq!(p.cache_stats().unwrap().stored_blocks, 6);
    // Keyed admission: the partial last key is cached with its fill in every group.
    p.add_sequence_block_keys(SeqId(2), &[11, 12, 13], 10, &mut out).unwrap();
    assert_eq!(p.cache_stats().unwrap().stored_blocks, 6 + 2 * 3);
    assert_eq!(p.add_sequence_block_keys(SeqId(3), &[11, 12, 13], 10, &mut out).unwrap(), 8);
    assert_eq!(p.add_sequence_block_keys(SeqId(4), &[11, 12], 8, &mut out).unwrap(), 4, "one token computed");
    checked(&p);
}

#[test]
fn copy_gain_counts_the_cached_partial_blocks_a_growth_leaves_idle() {
    // A keyed 10-token prompt over blocks of 4: its partial last block (2 tokens) is
    // cached in both groups; the first growth copies it away in each.
    let mut p = pool(40, vec![GroupSpec::Full, sw(6, 0)]);
    let mut out = StepOutput::default();
    p.add_sequence_block_keys(SeqId(1), &[11, 12, 13], 10, &mut out).unwrap();
    assert_eq!((p.copy_gain(SeqId(1), 0).unwrap(), p.copy_gain(SeqId(1), 1).unwrap()), (0, 2));
    // Shared, the copied blocks stay held by the other sequence.
    p.fork(SeqId(1), SeqId(2)).unwrap();
    assert_eq!(p.copy_gain(SeqId(1), 1).unwrap(), 0);
    p.free(SeqId(2)).unwrap();
    let (free, need) = (p.num_free_blocks(), p.blocks_needed(SeqId(1), 1).unwrap());
    // The window (6 tokens) also releases block 0 for a query at 10: the exact plan is
    // new blocks - window releases - copies left idle.
    let released = p.release_gain(SeqId(1)).unwrap();
    assert_eq!((need, released), (2, 1));
    p.step(&[SeqId(1)], &[1], &mut out).unwrap();
    assert_eq!(out.cow.len(), 2);
    assert_eq!(p.num_free_blocks() + need, free + released + 2, "the gain is what the copies leave idle");
    assert_eq!(p.copy_gain(SeqId(1), 1).unwrap(), 0, "the copies are not cached");
    assert!(p.copy_gain(SeqId(9), 1).is_err());
    checked(&p);
}

#[test]
fn stored_twins_are_adopted_in_full_groups_only() {
    // Two sequences join at no hit and compute the same 12-token prefix in one pass.
    let mut p = pool(60, vec![GroupSpec::Full, sw(6, 0)]);
    let shared = tokens(3, 12);
    let (a, b) = ([&shared[..], &[1, 2][..]].concat(), [&shared[..], &[7, 8, 9][..]].concat());
    assert_eq!(p.add_sequence_hit(SeqId(1), &a, None).unwrap(), 0);
    assert_eq!(p.add_sequence_hit(SeqId(2), &b, None).unwrap(), 0);
    let mut out = StepOutput::default();
    p.step(&[SeqId(1), SeqId(2)], &[a.len(), b.len()], &mut out).unwrap();
    p.store_tokens(SeqId(1), &a).unwrap();
    let free = p.num_free_blocks();
    p.store_tokens(SeqId(2), &b).unwrap();
    checked(&p);
    // The full group's 3 shared blocks are sequence 1's now; the window group keeps its own.
    let first3 = |s: u64| (0..3).map(|i| p.table(SeqId(s), 0).unwrap().get(i)).collect::<Vec<_>>();
    assert_eq!(first3(1), first3(2));
    let window = |s: u64| p.table(SeqId(s), 1).unwrap().get(2);
    assert_ne!(window(1), window(2));
    assert_eq!(p.num_free_blocks(), free + 3);
    assert_eq!(p.cached_prefix_len(&b, None).unwrap(), 12);
    assert!(p.store_tokens(SeqId(2), &[1]).is_err(), "no more stored tokens than ids");
}

#[test]
fn release_gain_counts_only_the_blocks_a_release_frees() {
    // A 4-token window over blocks of 4: a next query at 16 needs positions 13..16, so
    // blocks 0..3 (ending at 4, 8, 12) are released.
    let mut p = pool(40, vec![sw(4, 0)]);
    let a = tokens(9, 16);
    admit(&mut p, 1, &a);
    assert_eq!(p.release_gain(SeqId(1)).unwrap(), 3);
    // Shared blocks stay held by the other sequence.
    p.fork(SeqId(1), SeqId(2)).unwrap();
    assert_eq!(p.release_gain(SeqId(1)).unwrap(), 0);
    p.free(SeqId(2)).unwrap();
    assert_eq!(p.release_gain(SeqId(1)).unwrap(), 3);
    // A hard pin keeps its block: what a hit of 12 tokens needs is block 2 alone.
    p.pin_prefix_tokens(&a[..12], None, None, None).unwrap();
    assert_eq!(p.release_gain(SeqId(1)).unwrap(), 2);
    let free = p.num_free_blocks();
    p.mark_computed(&[SeqId(1)]).unwrap();
    assert_eq!(p.num_free_blocks(), free + 2, "the gain is what the release frees");
    assert_eq!(p.release_gain(SeqId(1)).unwrap(), 0);
    assert!(p.release_gain(SeqId(9)).is_err());
    checked(&p);
}
