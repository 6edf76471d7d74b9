//! Prefix caching through the pool's public API: hits, the last-token rule, copy-on-write
//! hits, eviction order per policy, pins and expiry, forced collisions, block-key replay,
//! atomic failures. `check_invariants` runs after every mutation.

#[path = "support/flat.rs"]
mod flat;
use flat::Flat;
use pykvpool::prefix_cache::block_hash::BlockHasher;
use pykvpool::{BlockId, BlockPool, CacheConfig, CacheEventKind, EvictionPolicy, KvError, SeqId};

fn pool(blocks: usize, bs: usize, cfg: CacheConfig) -> BlockPool {
    BlockPool::with_prefix_cache(blocks, bs, cfg).unwrap()
}

fn admit(p: &mut BlockPool, seq: u64, tokens: &[u32]) -> usize {
    let mut slots = Vec::new();
    let c = p.add_sequence_tokens_flat(SeqId(seq), tokens, None, &mut slots).unwrap();
    assert_eq!(slots.len(), tokens.len() - c, "slots are given for the tokens to compute");
    p.check_invariants().unwrap();
    c
}

fn free(p: &mut BlockPool, seq: u64) {
    p.free(SeqId(seq)).unwrap();
    p.check_invariants().unwrap();
}

fn range(a: u32, b: u32) -> Vec<u32> {
    (a..b).collect()
}

#[test]
fn second_admission_reuses_full_blocks_and_leaves_one_token() {
    let mut p = pool(16, 4, CacheConfig::default());
    let prompt = range(0, 10);
    assert_eq!(admit(&mut p, 1, &prompt), 0);
    let t1 = p.blocks_of(SeqId(1)).unwrap();
    // Shared while both live: refcount 2 on the two full blocks.
    assert_eq!(admit(&mut p, 2, &prompt), 8);
    assert_eq!(&p.blocks_of(SeqId(2)).unwrap()[..2], &t1[..2]);
    assert_eq!(p.refcount(t1[0]).unwrap(), 2);
    free(&mut p, 1);
    free(&mut p, 2);
    // Idle cached blocks stay reusable and count as free.
    assert_eq!(p.num_free_blocks(), 16);
    let s = p.cache_stats().unwrap();
    assert_eq!((s.idle_blocks, s.evictable_blocks, s.cached_blocks), (2, 2, 2));
    // Exactly two full blocks cached: a prompt of 8 must recompute its last block.
    assert_eq!(admit(&mut p, 3, &range(0, 8)), 4);
    assert_eq!(admit(&mut p, 4, &range(0, 9)), 8);
    let s = p.cache_stats().unwrap();
    assert_eq!(s.queries, 4);
    assert_eq!(s.hit_blocks, 2 + 2 + 2);
    assert_eq!(s.hit_tokens, 8 + 4 + 8);
    assert_eq!(s.query_tokens, 10 + 10 + 8 + 9);
}

#[test]
fn cow_partial_hit_copies_the_last_block() {
    let cfg = CacheConfig { cow_partial_hit: true, ..CacheConfig::default() };
    let mut p = pool(8, 4, cfg);
    admit(&mut p, 1, &range(0, 8));
    let src = p.blocks_of(SeqId(1)).unwrap()[1];
    free(&mut p, 1);
    let (mut slots, mut cow) = (Vec::new(), Vec::new());
    let c = p.add_sequence_tokens_cow_flat(SeqId(2), &range(0, 8), None, &mut slots, &mut cow).unwrap();
    p.check_invariants().unwrap();
    assert_eq!(c, 7);
    let dst = p.blocks_of(SeqId(2)).unwrap()[1];
    assert_eq!(cow, vec![(src, dst)]);
    assert_ne!(src, dst);
    assert_eq!(slots, vec![dst.first_slot(4) + 3], "only the final token is computed");
    // The source stays cached and idle, and serves the next admission the same way (the
    // pool's config decides, for every admission by token ids).
    assert!(p.prefix_cache().unwrap().is_cached(src));
    assert_eq!(admit(&mut p, 3, &range(0, 8)), 7);
    assert_eq!(p.cache_stats().unwrap().cow_hits, 2);
}

#[test]
fn allocation_takes_free_blocks_before_evicting_then_lru_tail_first() {
    let mut p = pool(6, 4, CacheConfig { record_events: true, ..CacheConfig::default() });
    admit(&mut p, 1, &range(0, 8)); // A: 2 blocks
    admit(&mut p, 2, &range(100, 108)); // B: 2 blocks
    let a = p.blocks_of(SeqId(1)).unwrap();
    free(&mut p, 1);
    free(&mut p, 2);
    // Touch A again so that B is least recently used.
    assert_eq!(p.cached_prefix_len(&range(0, 8), None).unwrap(), 8);
    assert_eq!(admit(&mut p, 3, &range(0, 9)), 8);
    free(&mut p, 3);
    // 2 free (never cached) + 4 idle: a 3-block prompt takes the free ones first...
    let s = p.cache_stats().unwrap();
    assert_eq!(s.idle_blocks, 4);
    admit(&mut p, 4, &range(200, 212));
    assert_eq!(p.cache_stats().unwrap().evictions, 1);
    // ...and the one eviction took B's tail (LRU leaf), keeping B's head.
    assert_eq!(p.cached_prefix_len(&range(100, 108), None).unwrap(), 4);
    assert_eq!(p.cached_prefix_len(&range(0, 8), None).unwrap(), 8);
    let mut ev = Vec::new();
    p.drain_events(&mut ev).unwrap();
    assert_eq!(ev.iter().filter(|e| e.kind == CacheEventKind::Removed).count(), 1);
    assert!(ev.iter().filter(|e| e.kind == CacheEventKind::Stored).count() >= 5);
    assert!(ev.iter().all(|e| e.block.is_some()));
    assert!(a.iter().all(|&b| p.prefix_cache().unwrap().is_cached(b)));
    p.drain_events(&mut ev).unwrap();
}

#[test]
fn fifo_and_lfu_orders() {
    for (policy, survivor) in [(EvictionPolicy::Fifo, 1u32), (EvictionPolicy::Lfu, 0)] {
        let mut p = pool(3, 4, CacheConfig { policy, ..CacheConfig::default() });
        // Two one-block prompts (plus one token): block X stored first, Y second.
        admit(&mut p, 1, &[0, 1, 2, 3]);
        free(&mut p, 1);
        admit(&mut p, 2, &[9, 9, 9, 9]);
        free(&mut p, 2);
        // Hit X twice (LFU count 2), so X is older but more frequent.
        for s in 3..5 {
            assert_eq!(admit(&mut p, s, &[0, 1, 2, 3, 7]), 4);
            free(&mut p, s);
        }
        // Y touched last (most recent) for LRU; FIFO evicts X (stored first); LFU evicts Y.
        admit(&mut p, 9, &[9, 9, 9, 9, 5]);
        free(&mut p, 9);
        admit(&mut p, 10, &range(50, 58));
        let x = p.cached_prefix_len(&[0, 1, 2, 3], None).unwrap() / 4;
        let y = p.cached_prefix_len(&[9, 9, 9, 9], None).unwrap() / 4;
        assert_eq!((x, y), if survivor == 0 { (1, 0) } else { (0, 1) }, "{policy}");
        p.check_invariants().unwrap();
    }
}

#[test]
fn hard_pins_survive_pressure_until_unpinned_or_expired() {
    let mut p = pool(3, 4, CacheConfig::default());
    let sys = range(0, 8);
    admit(&mut p, 1, &sys);
    free(&mut p, 1);
    let pin = p.pin_prefix_tokens(&sys, None, None, None).unwrap();
    assert_eq!(p.num_free_blocks(), 1);
    let err = p.add_sequence_tokens_flat(SeqId(2), &range(50, 58), None, &mut Vec::new()).unwrap_err();
    assert_eq!(err, KvError::PoolExhausted { requested: 2, free: 1 });
    p.unpin(pin).unwrap();
    assert!(p.unpin(pin).is_err());
    assert_eq!(p.num_free_blocks(), 3);
    // Expiry in logical time: the pin lapses when the clock reaches it.
    let now = p.cache_stats().unwrap().clock;
    p.pin_prefix_tokens(&sys, None, None, Some(now + 2)).unwrap();
    assert_eq!(p.num_free_blocks(), 1);
    admit(&mut p, 3, &[7]);
    assert_eq!(p.num_free_blocks(), 0);
    free(&mut p, 3); // second operation: clock reaches now + 2
    assert_eq!(p.cache_stats().unwrap().num_pins, 0);
    assert_eq!(p.num_free_blocks(), 3);
    // Manual clock.
    p.set_clock(100).unwrap();
    assert!(p.set_clock(99).is_err());
    assert!(p.pin_prefix_tokens(&sys, None, None, Some(100)).is_err(), "expiry must be in the future");
    assert!(p.pin_prefix_tokens(&range(40, 48), None, None, None).is_err(), "unknown prefix");
    assert!(p.pin_prefix_tokens(&[0, 1], None, None, None).is_err(), "no full block");
    p.check_invariants().unwrap();
}

#[test]
fn soft_priority_orders_eviction_under_priority_policy() {
    let mut p = pool(4, 4, CacheConfig { policy: EvictionPolicy::Priority, ..CacheConfig::default() });
    admit(&mut p, 1, &range(0, 5));
    free(&mut p, 1);
    admit(&mut p, 2, &range(10, 15));
    free(&mut p, 2);
    // The older prefix gets a higher retention priority: the newer one is evicted.
    p.pin_prefix_tokens(&range(0, 4), None, Some(5), None).unwrap();
    admit(&mut p, 3, &range(20, 32));
    assert_eq!(p.cached_prefix_len(&range(0, 4), None).unwrap(), 4);
    assert_eq!(p.cached_prefix_len(&range(10, 14), None).unwrap(), 0);
    p.check_invariants().unwrap();
}

fn parentless(bytes: &[u8]) -> u128 {
    // Ignores the parent key (bytes 0..16): equal blocks collide whatever precedes them.
    xxhash_rust::xxh3::xxh3_128(&bytes[16..])
}

#[test]
fn collisions_are_misses_never_wrong_kv() {
    // Every key collides on 1 bit: verification turns each into a miss.
    let cfg = CacheConfig { hasher: BlockHasher::Truncated { bits: 1 }, ..CacheConfig::default() };
    let mut p = pool(32, 4, cfg);
    admit(&mut p, 1, &range(0, 9));
    let mut hits = 0;
    for (s, start) in (2..10).zip([100u32, 200, 300, 400, 500, 600, 700, 800]) {
        hits += admit(&mut p, s, &range(start, start + 9));
    }
    assert_eq!(hits, 0);
    assert!(p.cache_stats().unwrap().collisions > 0);
    // Chain collision: blocks equal, prefixes different. [A, C] then [B, C]: C's key is
    // shared, but its cached parent is A's block, so [B, C] never reuses it.
    let mut p = pool(32, 4, CacheConfig { hasher: BlockHasher::Custom(parentless), ..CacheConfig::default() });
    let (a, b, c) = ([1u32; 4], [2u32; 4], [3u32; 4]);
    let ac: Vec<u32> = a.iter().chain(&c).chain(&[0]).copied().collect();
    let bc: Vec<u32> = b.iter().chain(&c).chain(&[0]).copied().collect();
    admit(&mut p, 1, &ac);
    assert_eq!(admit(&mut p, 2, &bc), 0);
    free(&mut p, 2);
    assert_eq!(admit(&mut p, 3, &bc), 4, "B is cached now, C only under A");
    assert_eq!(admit(&mut p, 4, &ac), 8);
}

#[test]
fn append_tokens_registers_blocks_that_fill() {
    let mut p = pool(16, 4, CacheConfig::default());
    admit(&mut p, 1, &range(0, 3));
    let (mut slots, mut cow) = (Vec::new(), Vec::new());
    p.append_tokens_flat(SeqId(1), &range(3, 9), &mut slots, &mut cow).unwrap();
    p.check_invariants().unwrap();
    assert_eq!(p.cache_stats().unwrap().cached_blocks, 2);
    free(&mut p, 1);
    assert_eq!(admit(&mut p, 2, &range(0, 12)), 8);
    // A sequence grown by a plain append stops caching from there on.
    p.append_flat(SeqId(2), 4, &mut Vec::new(), &mut Vec::new()).unwrap();
    p.append_tokens_flat(SeqId(2), &range(0, 8), &mut slots, &mut cow).unwrap();
    assert_eq!(p.cache_stats().unwrap().cached_blocks, 3);
    p.check_invariants().unwrap();
}

#[test]
fn writing_into_a_truncated_cached_block_copies_it() {
    let mut p = pool(16, 4, CacheConfig::default());
    admit(&mut p, 1, &range(0, 9));
    let b1 = p.blocks_of(SeqId(1)).unwrap()[1];
    p.truncate(SeqId(1), 3).unwrap(); // 6 tokens: block 1 (cached) now partly valid
    let (mut slots, mut cow) = (Vec::new(), Vec::new());
    p.append_tokens_flat(SeqId(1), &[42, 43], &mut slots, &mut cow).unwrap();
    p.check_invariants().unwrap();
    let new = p.blocks_of(SeqId(1)).unwrap()[1];
    assert_eq!(cow, vec![(b1, new)]);
    assert_eq!(p.cached_prefix_len(&range(0, 8), None).unwrap(), 8, "cached content untouched");
    free(&mut p, 1);
    let mut probe: Vec<u32> = range(0, 6);
    probe.extend([42, 43, 0]);
    assert_eq!(admit(&mut p, 2, &probe), 8, "the rewritten block was registered too");
}

#[test]
fn failures_change_nothing() {
    let mut p = pool(4, 4, CacheConfig { record_events: true, ..CacheConfig::default() });
    admit(&mut p, 1, &range(0, 9));
    let before = (p.stats(), p.cache_stats().unwrap(), p.blocks_of(SeqId(1)).unwrap());
    let mut slots = vec![-7];
    assert!(matches!(
        p.add_sequence_tokens_flat(SeqId(2), &range(0, 30), None, &mut slots),
        Err(KvError::PoolExhausted { .. })
    ));
    assert!(matches!(p.add_sequence_tokens_flat(SeqId(1), &range(0, 3), None, &mut slots), Err(KvError::DuplicateSequence(1))));
    assert!(p.add_sequence_block_keys_flat(SeqId(2), &[1, 2], 9, &mut slots).is_err(), "3 keys needed");
    assert!(p.append_tokens_flat(SeqId(9), &[1], &mut slots, &mut Vec::new()).is_err());
    assert_eq!(slots, vec![-7]);
    assert_eq!(before, (p.stats(), p.cache_stats().unwrap(), p.blocks_of(SeqId(1)).unwrap()));
    p.check_invariants().unwrap();
    // A pool without caching refuses cache calls.
    let mut plain = BlockPool::new(4, 4).unwrap();
    assert!(plain.add_sequence_tokens_flat(SeqId(1), &[1], None, &mut slots).is_err());
    assert!(plain.cache_stats().is_err());
}

#[test]
fn block_key_replay_counts_every_block() {
    let mut p = pool(64, 512, CacheConfig { verify_tokens: false, ..CacheConfig::default() });
    let mut slots = Vec::new();
    assert_eq!(p.add_sequence_block_keys_flat(SeqId(1), &[0, 1, 2], 1100, &mut slots).unwrap(), 0);
    p.free(SeqId(1)).unwrap();
    // Shares the first two blocks; the third key is new.
    assert_eq!(p.add_sequence_block_keys_flat(SeqId(2), &[0, 1, 3], 1300, &mut slots).unwrap(), 1024);
    p.free(SeqId(2)).unwrap();
    // All three keys cached: the last-token rule gives back the last block.
    assert_eq!(p.add_sequence_block_keys_flat(SeqId(3), &[0, 1, 2], 1100, &mut slots).unwrap(), 1024);
    let s = p.cache_stats().unwrap();
    assert_eq!((s.query_blocks, s.hit_blocks), (9, 5));
    p.check_invariants().unwrap();
    assert_eq!(p.reset_prefix_cache().unwrap(), 4);
    p.check_invariants().unwrap();
}

#[test]
fn plain_operations_work_with_the_cache_on() {
    let mut p = pool(8, 4, CacheConfig::default());
    let mut slots = Vec::new();
    p.add_sequence_flat(SeqId(1), 9, &mut slots).unwrap();
    p.fork(SeqId(1), SeqId(2)).unwrap();
    let mut out = pykvpool::pool::StepOutput::default();
    p.step(&[SeqId(1), SeqId(2)], &[1, 1], &mut out).unwrap();
    assert_eq!(out.cow.len(), 1);
    p.check_invariants().unwrap();
    assert_eq!(p.cache_stats().unwrap().cached_blocks, 0);
    p.free(SeqId(1)).unwrap();
    p.free(SeqId(2)).unwrap();
    assert_eq!(p.num_free_blocks(), 8);
    assert_eq!(p.refcount(BlockId(0)).unwrap(), 0);
    p.check_invariants().unwrap();
}
