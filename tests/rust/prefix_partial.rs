//! Partly filled keyed blocks (a block-key prompt's last block): a cached block records
//! how many tokens of KV it holds, a full-block lookup is satisfied only by a full block,
//! and no admission, copy-on-write hit, pin or append ever serves more tokens of a cached
//! block than were written into it. `check_invariants` (which checks that no sequence
//! reads past a cached block's fill) runs after every call.

#[path = "support/flat.rs"]
mod flat;
use flat::Flat;
use pykvpool::{BlockId, BlockPool, CacheConfig, SeqId};

const BS: usize = 4;

fn pool(cfg: CacheConfig) -> BlockPool {
    BlockPool::with_prefix_cache(16, BS, cfg).unwrap()
}

fn keyed() -> BlockPool {
    pool(CacheConfig { verify_tokens: false, ..CacheConfig::default() })
}

fn admit_keys(p: &mut BlockPool, seq: u64, keys: &[u128], len: usize) -> usize {
    let mut slots = Vec::new();
    let c = p.add_sequence_block_keys_flat(SeqId(seq), keys, len, &mut slots).unwrap();
    assert_eq!(slots.len(), len - c);
    p.check_invariants().unwrap();
    c
}

fn free(p: &mut BlockPool, seq: u64) {
    p.free(SeqId(seq)).unwrap();
    p.check_invariants().unwrap();
}

fn block(p: &BlockPool, seq: u64, i: usize) -> BlockId {
    p.blocks_of(SeqId(seq)).unwrap()[i]
}

/// The reproducer: 6 tokens of KV written under keys [1, 2] must not serve 8.
#[test]
fn a_partial_block_never_serves_a_full_block_lookup() {
    let mut p = keyed();
    assert_eq!(admit_keys(&mut p, 0, &[1, 2], 6), 0);
    let partial = block(&p, 0, 1);
    assert_eq!(p.prefix_cache().unwrap().filled(partial), Some(2));
    free(&mut p, 0);
    assert_eq!(admit_keys(&mut p, 1, &[1, 2, 3], 12), 4, "only key 1's full block holds KV to reuse");
    assert_ne!(block(&p, 1, 1), partial, "block 1 is computed into a new block");
    let s = p.cache_stats().unwrap();
    assert_eq!((s.hit_blocks, s.collisions), (1, 0), "another fill is another entry: a plain miss");
    // The new full block is cached under key 2 beside the partial block (the fill is part
    // of a block's identity), and so is the rest of its chain.
    let full = block(&p, 1, 1);
    let c = p.prefix_cache().unwrap();
    assert_eq!((c.filled(full), c.filled(partial)), (Some(4), Some(2)));
    assert_eq!(c.block_of(0, 2), Some(full), "a full-block lookup of key 2 finds the full block");
    assert!(c.is_cached(block(&p, 1, 2)));
}

#[test]
fn the_same_partial_prompt_matches_its_partial_block_under_the_last_token_rule() {
    let mut p = keyed();
    admit_keys(&mut p, 0, &[1, 2], 6);
    free(&mut p, 0);
    // Key 2 matches with the same fill; it holds the last prompt token, so it is
    // recomputed: 4 cached tokens, 2 blocks hit.
    assert_eq!(admit_keys(&mut p, 1, &[1, 2], 6), 4);
    free(&mut p, 1);
    // A different fill under the same key is a miss, in either direction.
    assert_eq!(admit_keys(&mut p, 2, &[1, 2], 7), 4);
    let s = p.cache_stats().unwrap();
    assert_eq!((s.hit_blocks, s.collisions), (2 + 1, 0), "another fill is another entry: a miss");
    free(&mut p, 2);
    admit_keys(&mut p, 3, &[5, 6, 7], 12);
    free(&mut p, 3);
    assert_eq!(admit_keys(&mut p, 4, &[5, 6], 6), 4, "a full block does not stand for a partial one");
    assert_eq!(p.cache_stats().unwrap().hit_blocks, 3 + 1);
}

#[test]
fn a_partial_block_extended_by_append_is_copied_and_keeps_its_fill() {
    let mut p = keyed();
    admit_keys(&mut p, 0, &[1, 2], 6);
    let partial = block(&p, 0, 1);
    let (mut slots, mut cow) = (Vec::new(), Vec::new());
    p.append_flat(SeqId(0), 2, &mut slots, &mut cow).unwrap();
    p.check_invariants().unwrap();
    let copy = block(&p, 0, 1);
    assert_eq!(cow, vec![(partial, copy)], "cached blocks are immutable: the append writes a copy");
    assert_eq!(p.prefix_cache().unwrap().filled(partial), Some(2));
    assert!(!p.prefix_cache().unwrap().is_cached(copy));
    free(&mut p, 0);
    assert_eq!(admit_keys(&mut p, 1, &[1, 2, 3], 12), 4);
}

#[test]
fn forks_of_a_partial_block_copy_it_and_never_publish_more_tokens() {
    let mut p = keyed();
    admit_keys(&mut p, 0, &[1, 2], 6);
    let partial = block(&p, 0, 1);
    p.fork(SeqId(0), SeqId(1)).unwrap();
    let mut out = pykvpool::pool::StepOutput::default();
    p.step(&[SeqId(0), SeqId(1)], &[2, 2], &mut out).unwrap();
    p.check_invariants().unwrap();
    assert_eq!(out.cow.len(), 2, "both holders copy the cached partial block");
    assert!(out.cow.iter().all(|&(src, _)| src == partial));
    free(&mut p, 0);
    free(&mut p, 1);
    assert_eq!(p.prefix_cache().unwrap().filled(partial), Some(2));
    assert_eq!(admit_keys(&mut p, 2, &[1, 2, 3], 12), 4);
}

/// Token-id lookups ask for full blocks: a keyed partial block filed under a full
/// block's key (verification off, so only the fill tells them apart) is never reused,
/// by a plain hit, a copy-on-write hit, `cached_prefix_len` or a pin.
#[test]
fn token_admissions_never_take_a_partial_block() {
    for cow_partial_hit in [false, true] {
        let mut p = pool(CacheConfig { verify_tokens: false, cow_partial_hit, ..CacheConfig::default() });
        let tokens: Vec<u32> = (100..112).collect();
        let keys = p.block_keys(&tokens, None).unwrap();
        admit_keys(&mut p, 0, &keys[..2], 6);
        free(&mut p, 0);
        assert_eq!(p.cached_prefix_len(&tokens, None).unwrap(), 4);
        assert!(p.pin_prefix_tokens(&tokens[..8], None, None, None).is_err());
        p.check_invariants().unwrap();
        let (mut slots, mut cow) = (Vec::new(), Vec::new());
        let c = p.add_sequence_tokens_cow_flat(SeqId(1), &tokens[..8], None, &mut slots, &mut cow).unwrap();
        p.check_invariants().unwrap();
        assert_eq!((c, cow.len()), (4, 0), "no copy of a 2-token block as a 7-token hit");
        // Sequence 1's full block 1 is cached beside the partial one and serves the next.
        let full = p.blocks_of(SeqId(1)).unwrap()[1];
        free(&mut p, 1);
        let c = p.add_sequence_tokens_flat(SeqId(2), &tokens, None, &mut slots).unwrap();
        assert_eq!((c, p.blocks_of(SeqId(2)).unwrap()[1]), (8, full));
        p.check_invariants().unwrap();
    }
}

#[test]
fn pins_by_key_cover_full_blocks_only() {
    let mut p = keyed();
    admit_keys(&mut p, 0, &[1, 2], 6);
    free(&mut p, 0);
    assert!(p.pin_prefix_keys(&[1, 2], None, None).is_err(), "key 2 names a partly filled block");
    let id = p.pin_prefix_keys(&[1], None, None).unwrap();
    p.check_invariants().unwrap();
    p.unpin(id).unwrap();
    p.check_invariants().unwrap();
}
