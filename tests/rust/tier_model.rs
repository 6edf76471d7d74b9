//! The tier directory (`prefix_cache::tiers`) against a model written from its module's
//! specification: random programs of offers, copies-through (write-through), hits (some
//! with wrong verification data) and sightings over one or two tiers of every policy,
//! with and without the reuse gate.
//!
//! The model keeps each tier as a plain list and finds a victim by sorting on the policy's
//! documented order; the gate as exact counts halved on the same schedule (the sketch may
//! only overcount, so the model admits a subset of what the directory admits). The moves a
//! call returns are applied to a shadow of the tiers' slots, which must hold what the model
//! holds after every call: the byte layer that follows the moves stores what the decisions
//! say.

use std::collections::{HashMap, VecDeque};

use proptest::prelude::*;

use pykvpool::prefix_cache::eviction::EvictionPolicy;
use pykvpool::prefix_cache::tiers::{GateConfig, Move, TierConfig, TierEntry, TierKey, TierMeta, TierPolicy, TierRules, Tiers};
use pykvpool::BlockId;

#[derive(Clone, Debug)]
enum Op {
    Offer { k: u8, hits: u32 },
    Through { k: u8, hits: u32 },
    Take { k: u8, tamper: bool },
    Seen { k: u8 },
    EndCall,
}

fn key(k: u8) -> TierKey {
    // Two groups and two fills share key values: all four are distinct blocks.
    ((k % 2), (k as u128 / 4) * 0x1_0000_0000_0000_0001, 16 - (k as u16 / 2 % 2))
}

fn tokens(k: u8) -> Box<[u32]> {
    vec![k as u32; 4].into_boxed_slice()
}

/// A held block: its key id, its hits in the device, the tick it entered its tier at and
/// whether the device holds it too (copied through).
type Held = (u8, u32, u64, bool);

/// S3-FIFO as its specification says (`prefix_cache::tier_order`): two FIFOs of (key,
/// frequency) and the keys of the last `cap` blocks evicted from the small one.
#[derive(Clone, Debug, Default)]
struct S3Model {
    cap: usize,
    small: Vec<(u8, u32)>,
    main: Vec<(u8, u32)>,
    ghost: VecDeque<u8>,
}

impl S3Model {
    fn insert(&mut self, k: u8, hits: u32) {
        let f = hits.min(3);
        if self.ghost.contains(&k) { self.main.push((k, f)) } else { self.small.push((k, f)) }
    }

    fn remove(&mut self, k: u8) {
        self.small.retain(|e| e.0 != k);
        self.main.retain(|e| e.0 != k);
    }

    fn pop(&mut self) -> Option<u8> {
        loop {
            if self.small.len() >= (self.cap / 10).max(1) || self.main.is_empty() {
                if self.small.is_empty() {
                    return None;
                }
                let (k, f) = self.small.remove(0);
                if f > 0 {
                    self.main.push((k, 0));
                    continue;
                }
                self.ghost.push_back(k);
                if self.ghost.len() > self.cap {
                    self.ghost.pop_front();
                }
                return Some(k);
            }
            let (k, f) = self.main.remove(0);
            if f > 0 {
                self.main.push((k, f - 1));
                continue;
            }
            return Some(k);
        }
    }
}

struct Model {
    cfgs: Vec<TierConfig>,
    tiers: Vec<Vec<Held>>,
    /// Per tier, its S3-FIFO state when that is its policy.
    s3: Vec<Option<S3Model>>,
    /// Slots emptied by hits since the last end of call, per tier.
    taken: Vec<usize>,
    tick: u64,
    gate: Option<(GateConfig, HashMap<u8, u32>, u64)>,
}

impl Model {
    /// Entry order, or hits then entry order for `lfu`.
    fn order_key(p: TierPolicy, &(_, hits, tick, _): &Held) -> (u64, u64) {
        match p {
            TierPolicy::Ranked(EvictionPolicy::Lru | EvictionPolicy::Fifo) => (tick, 0),
            TierPolicy::Ranked(EvictionPolicy::Lfu) => (hits as u64, tick),
            _ => unreachable!("refused, or not ranked"),
        }
    }

    /// The victims in order, if nothing entered meanwhile.
    fn order(&self, t: usize) -> Vec<u8> {
        if let Some(s3) = &self.s3[t] {
            let mut s = s3.clone();
            return std::iter::from_fn(|| s.pop()).collect();
        }
        let mut v = self.tiers[t].clone();
        v.sort_by_key(|h| Self::order_key(self.cfgs[t].policy, h));
        v.into_iter().map(|(k, _, _, _)| k).collect()
    }

    /// Take the next victim of tier `t` out of its order.
    fn pop(&mut self, t: usize) -> u8 {
        match &mut self.s3[t] {
            Some(s) => s.pop().expect("a full tier has a victim"),
            None => self.order(t)[0],
        }
    }

    fn see(&mut self, k: u8) {
        if let Some((cfg, counts, seen)) = &mut self.gate {
            *counts.entry(k).or_default() += 1;
            *seen += 1;
            if seen.is_multiple_of(cfg.half_life) {
                counts.values_mut().for_each(|c| *c /= 2);
            }
        }
    }

    fn must_admit(&self, k: u8) -> bool {
        self.gate.as_ref().is_none_or(|(cfg, counts, _)| counts.get(&k).copied().unwrap_or(0).min(255) >= cfg.min_seen)
    }

    fn remove(&mut self, k: u8) {
        self.tiers.iter_mut().for_each(|t| t.retain(|(x, _, _, _)| *x != k));
        self.s3.iter_mut().flatten().for_each(|s| s.remove(k));
    }

    /// Whether `k` was stored in tier `t` (cascading a victim down, unless the device
    /// holds it: a resident victim is dropped).
    fn insert(&mut self, t: usize, k: u8, hits: u32, resident: bool) -> bool {
        if t == self.tiers.len() {
            return false;
        }
        if self.tiers[t].len() + self.taken[t] == self.cfgs[t].capacity_blocks {
            if self.tiers[t].is_empty() {
                return false;
            }
            let victim = self.pop(t);
            let i = self.tiers[t].iter().position(|h| h.0 == victim).unwrap();
            let (vk, vhits, _, vres) = self.tiers[t].remove(i);
            if !vres {
                self.insert(t + 1, vk, vhits, false);
            }
        }
        self.tick += 1;
        self.tiers[t].push((k, hits, self.tick, resident));
        if let Some(s) = &mut self.s3[t] {
            s.insert(k, hits);
        }
        true
    }

    /// The tier and index holding `k`, if any.
    fn held(&self, k: u8) -> Option<(usize, usize)> {
        self.tiers.iter().enumerate().find_map(|(t, v)| v.iter().position(|h| h.0 == k).map(|i| (t, i)))
    }
}

/// Apply `moves` to the shadow slots (`slot -> key` per tier); `block` is the offered key.
fn apply(shadow: &mut [HashMap<u32, u8>], moves: &[Move], block: Option<u8>) {
    for m in moves {
        match *m {
            Move::Store { key: k, block: b, tier, slot } => {
                assert_eq!(k, key(b.0 as u8), "a store names its block's key");
                assert_eq!(Some(b.0 as u8), block, "stores the offered block");
                assert!(shadow[tier].insert(slot, b.0 as u8).is_none(), "store into a used slot");
            }
            Move::Demote { key: named, tier, slot, to_slot, .. } => {
                let k = shadow[tier].remove(&slot).expect("demote from an empty slot");
                assert_eq!(named, key(k), "a demotion names the key it moves");
                assert!(shadow[tier + 1].insert(to_slot, k).is_none(), "demote into a used slot");
            }
            Move::Drop { key: named, tier, slot } => {
                let k = shadow[tier].remove(&slot).expect("drop of an empty slot");
                assert_eq!(named, key(k), "a drop names the key it forgets");
            }
        }
    }
}

fn policy() -> impl Strategy<Value = TierPolicy> {
    prop_oneof![
        Just(TierPolicy::Ranked(EvictionPolicy::Lru)),
        Just(TierPolicy::Ranked(EvictionPolicy::Fifo)),
        Just(TierPolicy::Ranked(EvictionPolicy::Lfu)),
        Just(TierPolicy::S3Fifo),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24, 0u32..3).prop_map(|(k, hits)| Op::Offer { k, hits }),
        2 => (0u8..24, 0u32..3).prop_map(|(k, hits)| Op::Through { k, hits }),
        2 => (0u8..24, prop::bool::weighted(0.2)).prop_map(|(k, tamper)| Op::Take { k, tamper }),
        2 => (0u8..24).prop_map(|k| Op::Seen { k }),
        1 => Just(Op::EndCall),
    ]
}

fn run(cfgs: Vec<TierConfig>, gate: Option<GateConfig>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut tiers = Tiers::new(&cfgs, TierRules { gate, write_through: true }).expect("valid tiers");
    let s3 = cfgs.iter().map(|c| (c.policy == TierPolicy::S3Fifo).then(|| S3Model { cap: c.capacity_blocks, ..S3Model::default() })).collect();
    let mut model = Model { tiers: vec![Vec::new(); cfgs.len()], s3, cfgs: cfgs.clone(), taken: vec![0; cfgs.len()], tick: 0, gate: gate.map(|g| (g, HashMap::new(), 0)) };
    let mut shadow = vec![HashMap::new(); cfgs.len()];
    for op in ops {
        match op {
            Op::EndCall => {
                tiers.end_call();
                model.taken.iter_mut().for_each(|n| *n = 0);
            }
            Op::Seen { k } => {
                tiers.note_seen(&key(k));
                model.see(k);
            }
            Op::Offer { k, hits } => {
                let e = TierEntry { hits, parent: None, extra: None, tokens: Some(tokens(k)) };
                let moves = tiers.offer(BlockId(k as u32), key(k), e);
                match model.held(k) {
                    Some((t, i)) if model.tiers[t][i].3 => {
                        // Written through: it enters its tier again, no bytes move.
                        prop_assert!(moves.is_empty(), "{:?}", moves);
                        model.tick += 1;
                        model.tiers[t][i] = (k, hits, model.tick, false);
                        if let Some(s) = &mut model.s3[t] {
                            s.remove(k);
                            s.insert(k, hits);
                        }
                    }
                    _ => {
                        let stored = moves.iter().any(|m| matches!(m, Move::Store { .. }));
                        if model.must_admit(k) || stored {
                            // Admitted (the sketch may admit more than the exact counts).
                            model.remove(k);
                            prop_assert_eq!(model.insert(0, k, hits, false), stored);
                        }
                    }
                }
                apply(&mut shadow, &moves, Some(k));
            }
            Op::Through { k, hits } => {
                let e = TierEntry { hits, parent: None, extra: None, tokens: Some(tokens(k)) };
                let moves = tiers.copy_through(BlockId(k as u32), key(k), e);
                if let Some((t, i)) = model.held(k) {
                    prop_assert!(moves.is_empty(), "{:?}", moves);
                    model.tiers[t][i].3 = true;
                } else {
                    let stored = moves.iter().any(|m| matches!(m, Move::Store { .. }));
                    if model.must_admit(k) || stored {
                        prop_assert_eq!(model.insert(0, k, hits, true), stored);
                    }
                }
                apply(&mut shadow, &moves, Some(k));
            }
            Op::Take { k, tamper } => {
                let want = if tamper { vec![99u32; 4].into_boxed_slice() } else { tokens(k) };
                // A resident block is no hit: the device serves it.
                let held = model.held(k).is_some_and(|(t, i)| !model.tiers[t][i].3);
                let got = tiers.take(&key(k), None, None, Some(&want));
                prop_assert_eq!(got.is_some(), held && !tamper);
                if let Some((t, slot, _)) = got {
                    prop_assert_eq!(shadow[t].remove(&slot), Some(k));
                    model.remove(k);
                    model.taken[t] += 1;
                }
            }
        }
        for (t, stats) in tiers.stats().iter().enumerate() {
            let want = model.order(t);
            let have: Vec<u8> = tiers.order(t).iter().map(|k| (0..24).find(|&x| key(x) == *k).unwrap()).collect();
            prop_assert_eq!(&have, &want, "tier {} order", t);
            prop_assert_eq!(stats.held, want.len());
            let mut slots: Vec<u8> = shadow[t].values().copied().collect();
            slots.sort();
            let mut keys = want.clone();
            keys.sort();
            prop_assert_eq!(slots, keys, "the moves keep the bytes where the decisions are");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn tiers_follow_the_model(
        caps in prop::collection::vec(1usize..24, 1..=2),
        policies in prop::collection::vec(policy(), 2),
        gate in prop::option::of((1u32..4, 1u64..40)),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let cfgs = caps.iter().zip(&policies).map(|(&c, &p)| TierConfig { capacity_blocks: c, policy: p }).collect();
        run(cfgs, gate.map(|(min_seen, half_life)| GateConfig { min_seen, half_life }), ops)?;
    }
}

fn gate(g: GateConfig) -> TierRules {
    TierRules { gate: Some(g), write_through: false }
}

#[test]
fn bad_configurations_are_refused() {
    let lru = |c| TierConfig { capacity_blocks: c, policy: TierPolicy::Ranked(EvictionPolicy::Lru) };
    assert!(Tiers::new(&[], TierRules::default()).is_err());
    assert!(Tiers::new(&[lru(1), lru(1), lru(1)], TierRules::default()).is_err());
    assert!(Tiers::new(&[lru(0)], TierRules::default()).is_err());
    assert!(Tiers::new(&[TierConfig { capacity_blocks: 4, policy: TierPolicy::Ranked(EvictionPolicy::Priority) }], TierRules::default()).is_err());
    assert!(Tiers::new(&[lru(4)], gate(GateConfig { min_seen: 0, half_life: 8 })).is_err());
    assert!(Tiers::new(&[lru(4)], gate(GateConfig { min_seen: 2, half_life: 0 })).is_err());
    assert!(Tiers::new(&[lru(4)], gate(GateConfig { min_seen: 256, half_life: 8 })).is_err());
}

#[test]
fn the_gate_refuses_blocks_seen_once_and_forgets_old_sightings() {
    let cfg = [TierConfig { capacity_blocks: 8, policy: TierPolicy::Ranked(EvictionPolicy::Lru) }];
    let mut t = Tiers::new(&cfg, gate(GateConfig { min_seen: 2, half_life: 1000 })).unwrap();
    let e = || TierEntry { hits: 0, parent: None, extra: None, tokens: None };
    let k = (0, 42, 16);
    t.note_seen(&k);
    assert!(t.offer(BlockId(0), k, e()).is_empty(), "seen once: refused");
    assert_eq!(t.gated, 1);
    t.note_seen(&k);
    assert!(matches!(t.offer(BlockId(0), k, e())[..], [Move::Store { tier: 0, .. }]));
    // With a half-life of 2 observations, two sightings of a key decay before others'.
    let mut t = Tiers::new(&cfg, gate(GateConfig { min_seen: 2, half_life: 2 })).unwrap();
    let k2 = (0, 7, 16);
    t.note_seen(&k2);
    t.note_seen(&k2); // halved to 1
    assert!(t.offer(BlockId(1), k2, e()).is_empty());
}

#[test]
fn a_collision_is_a_miss_that_moves_nothing() {
    let cfg = [TierConfig { capacity_blocks: 2, policy: TierPolicy::Ranked(EvictionPolicy::Lru) }];
    let mut t = Tiers::new(&cfg, TierRules::default()).unwrap();
    let k = (1, 5, 16);
    let e = TierEntry { hits: 0, parent: Some(3), extra: Some(9), tokens: Some(tokens(5)) };
    t.offer(BlockId(0), k, e);
    assert!(t.take(&k, Some(4), Some(9), Some(&tokens(5))).is_none(), "another parent");
    assert!(t.take(&k, Some(3), None, Some(&tokens(5))).is_none(), "another extra key");
    assert!(t.take(&k, Some(3), Some(9), Some(&tokens(6))).is_none(), "other tokens");
    assert_eq!(t.stats()[0].collisions, 3);
    assert_eq!(t.stats()[0].held, 1);
    assert!(t.take(&k, Some(3), Some(9), Some(&tokens(5))).is_some());
    assert_eq!(t.stats()[0].held, 0);
}

#[test]
fn a_restored_block_keeps_its_token_record() {
    let lru = |c| TierConfig { capacity_blocks: c, policy: TierPolicy::Ranked(EvictionPolicy::Lru) };
    let mut t = Tiers::new(&[lru(2), lru(4)], TierRules::default()).unwrap();
    let (k, old) = ((1, 5, 0), (1, 6, 0));
    let meta = TierMeta { parent: Some(3), extra: None, hits: 2, tokens: Some(tokens(5)) };
    t.restore(1, k, meta).expect("room");
    t.restore(1, old, TierMeta { parent: Some(3), ..TierMeta::default() }).expect("room");
    assert_eq!(t.matches(&k, Some(3), None, Some(&tokens(6))), Some(false), "other tokens: a collision");
    assert_eq!(t.matches(&k, Some(3), None, Some(&tokens(5))), Some(true));
    assert_eq!(t.matches(&old, Some(3), None, Some(&tokens(6))), Some(true), "no record: parent and extra key only");
    assert!(t.take(&k, Some(3), None, Some(&tokens(6))).is_none());
    assert_eq!(t.stats()[1].collisions, 1);
    let (tier, _, entry) = t.take(&k, Some(3), None, Some(&tokens(5))).expect("a hit");
    assert_eq!((tier, entry.hits, entry.tokens), (1, 2, Some(tokens(5))));
}

// ------------------------------------------------------------ the pool with tiers

use pykvpool::prefix_cache::tiers::TierLoad;
use pykvpool::{BlockPool, CacheConfig, SeqId, StepOutput};

const BS: usize = 4;

fn pool(num_blocks: usize, host: usize, disk: Option<usize>) -> BlockPool {
    pool_with(num_blocks, host, disk, TierRules::default())
}

fn pool_with(num_blocks: usize, host: usize, disk: Option<usize>, rules: TierRules) -> BlockPool {
    let mut p = BlockPool::with_prefix_cache(num_blocks, BS, CacheConfig::default()).unwrap();
    let mut tiers = vec![TierConfig { capacity_blocks: host, policy: TierPolicy::Ranked(EvictionPolicy::Lru) }];
    tiers.extend(disk.map(|d| TierConfig { capacity_blocks: d, policy: TierPolicy::Ranked(EvictionPolicy::Lru) }));
    p.set_tiers(&tiers, rules).unwrap();
    p
}

/// The device blocks the moves of the calls since the last drain store into a tier.
fn stores(p: &mut BlockPool) -> Vec<BlockId> {
    let (mut moves, mut loads) = (Vec::new(), Vec::new());
    p.drain_tier_moves(&mut moves, &mut loads).unwrap();
    moves.iter().filter_map(|m| if let Move::Store { block, .. } = m { Some(*block) } else { None }).collect()
}

const THROUGH: TierRules = TierRules { gate: None, write_through: true };

#[test]
fn write_through_copies_a_block_once_its_kv_is_computed() {
    let mut p = pool_with(5, 8, None, THROUGH);
    let mut out = StepOutput::default();
    let a = prompt(1, 4);
    p.add_sequence_tokens(SeqId(1), &a, None, &mut out).unwrap();
    assert!(stores(&mut p).is_empty(), "cached at admission, but not computed yet");
    p.mark_computed(&[SeqId(1)]).unwrap();
    let table: Vec<BlockId> = (0..4).map(|i| p.table(SeqId(1), 0).unwrap().get(i).unwrap()).collect();
    assert_eq!(stores(&mut p), table, "computed: the four full blocks are copied, the device keeps them");
    assert_eq!(p.cached_prefix_len(&a, None).unwrap(), 4 * BS);
    // Evicting them moves no bytes; the second prompt's blocks are copied when it is freed.
    p.free(SeqId(1)).unwrap();
    visit(&mut p, 2, &prompt(2, 4), &mut out);
    let moved = stores(&mut p);
    assert_eq!(moved.len(), 4, "only b's blocks, at its free: {moved:?}");
    // a comes back from the host tier.
    assert_eq!(p.add_sequence_tokens(SeqId(3), &a, None, &mut out).unwrap(), 4 * BS);
    assert_eq!(out.loads.len(), 4);
    let (stats, _) = p.tier_stats().unwrap().unwrap();
    assert_eq!(stats[0].stored, 8);
    p.check_invariants().unwrap();
}

#[test]
fn write_through_waits_for_the_growth_after_store_tokens_and_skips_what_was_truncated() {
    let mut p = pool_with(12, 8, None, THROUGH);
    let mut out = StepOutput::default();
    let a = prompt(1, 4);
    // vLLM's order: join at the hit, grow, compute, store the ids.
    assert_eq!(p.add_sequence_hit(SeqId(1), &a, None).unwrap(), 0);
    p.step(&[SeqId(1)], &[a.len()], &mut out).unwrap();
    p.store_tokens(SeqId(1), &a).unwrap();
    assert!(stores(&mut p).is_empty(), "the frontier has not passed them yet");
    p.step(&[SeqId(1)], &[1], &mut out).unwrap();
    assert_eq!(stores(&mut p).len(), 4, "the next growth's frontier passed them");
    // Blocks truncated away before their KV was computed are never copied.
    let b = prompt(2, 4);
    p.add_sequence_tokens(SeqId(2), &b, None, &mut out).unwrap();
    p.truncate(SeqId(2), 2 * BS + 1).unwrap();
    p.mark_computed(&[SeqId(2)]).unwrap();
    assert_eq!(stores(&mut p).len(), 2);
    p.check_invariants().unwrap();
}

/// Prompt `p`'s token ids: `blocks` full blocks and one more token.
fn prompt(p: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * BS + 1) as u32).map(|i| p * 1000 + i).collect()
}

/// Admit and free `prompt` as `seq`, returning the tokens served from the cache.
fn visit(pool: &mut BlockPool, seq: u64, tokens: &[u32], out: &mut StepOutput) -> usize {
    let cached = pool.add_sequence_tokens(SeqId(seq), tokens, None, out).unwrap();
    pool.free(SeqId(seq)).unwrap();
    pool.check_invariants().unwrap();
    cached
}

#[test]
fn an_evicted_prompt_comes_back_from_the_host_tier() {
    // 5 blocks: a 4-block prompt (5 blocks with its last token), then another that evicts it.
    let mut p = pool(5, 8, None);
    let mut out = StepOutput::default();
    let (a, b) = (prompt(1, 4), prompt(2, 4));
    assert_eq!(visit(&mut p, 1, &a, &mut out), 0);
    assert_eq!(visit(&mut p, 2, &b, &mut out), 0);
    let (mut moves, mut loads) = (Vec::new(), Vec::new());
    p.drain_tier_moves(&mut moves, &mut loads).unwrap();
    assert!(loads.is_empty(), "no admission hit the tiers yet");
    let stored = moves.iter().filter(|m| matches!(m, Move::Store { .. })).count();
    assert_eq!(stored, 4, "a's four cached blocks went down: {moves:?}");
    // a again: its four full blocks come from the host tier, the last token is computed.
    let cached = p.add_sequence_tokens(SeqId(3), &a, None, &mut out).unwrap();
    assert_eq!(cached, 4 * BS);
    assert_eq!(out.total_tokens, 1, "only the last token is computed");
    assert_eq!(out.slots.len(), 1);
    assert_eq!(out.loads.len(), 4);
    moves.clear();
    p.drain_tier_moves(&mut moves, &mut loads).unwrap();
    assert_eq!(loads, out.loads, "the queue holds the admission's loads, for the byte layer");
    // Each load goes to the block the sequence's table holds at its position, in order.
    let table = p.table(SeqId(3), 0).unwrap();
    let blocks: Vec<BlockId> = out.loads.iter().map(|l: &TierLoad| l.block).collect();
    assert_eq!(blocks, (0..4).map(|i| table.get(i).unwrap()).collect::<Vec<_>>());
    // The loaded blocks are cached in the device again: a third visit hits them there.
    p.free(SeqId(3)).unwrap();
    let cached = p.add_sequence_tokens(SeqId(4), &a, None, &mut out).unwrap();
    assert_eq!((cached, out.loads.len()), (4 * BS, 0));
    p.check_invariants().unwrap();
}

#[test]
fn a_join_at_the_hit_continues_into_the_tiers() {
    let mut p = pool(5, 8, None);
    let mut out = StepOutput::default();
    let a = prompt(1, 4);
    visit(&mut p, 1, &a, &mut out);
    visit(&mut p, 2, &prompt(2, 4), &mut out);
    let (mut moves, mut loads) = (Vec::new(), Vec::new());
    p.drain_tier_moves(&mut moves, &mut loads).unwrap();
    // The four blocks below the device are allocated, cached and loaded at the join.
    assert_eq!(p.add_sequence_hit(SeqId(3), &a, None).unwrap(), 4 * BS);
    p.drain_tier_moves(&mut moves, &mut loads).unwrap();
    let table = p.table(SeqId(3), 0).unwrap();
    let blocks: Vec<BlockId> = loads.iter().map(|l| l.block).collect();
    assert_eq!(blocks, (0..4).map(|i| table.get(i).unwrap()).collect::<Vec<_>>());
    assert_eq!(p.seq_len(SeqId(3)).unwrap(), 4 * BS);
    p.check_invariants().unwrap();
    // They are cached: a second prompt sharing them hits them in the device.
    assert_eq!(p.cached_prefix_len(&a, None).unwrap(), 4 * BS);
    // Without room for them, the join takes the device's hit only.
    let mut q = pool(5, 8, None);
    visit(&mut q, 1, &a, &mut out);
    visit(&mut q, 2, &prompt(2, 4), &mut out);
    q.add_sequence_tokens(SeqId(9), &prompt(3, 3), None, &mut out).unwrap();
    assert_eq!(q.add_sequence_hit(SeqId(3), &a, None).unwrap(), 0);
    q.check_invariants().unwrap();
}

#[test]
fn moves_nobody_drains_are_dropped_at_the_end_of_each_call() {
    let mut p = pool(5, 8, None);
    p.keep_tier_moves(false).unwrap();
    let mut out = StepOutput::default();
    let a = prompt(1, 4);
    visit(&mut p, 1, &a, &mut out);
    visit(&mut p, 2, &prompt(2, 4), &mut out);
    assert_eq!(p.add_sequence_tokens(SeqId(3), &a, None, &mut out).unwrap(), 4 * BS);
    let (mut moves, mut loads) = (Vec::new(), Vec::new());
    p.drain_tier_moves(&mut moves, &mut loads).unwrap();
    assert!(moves.is_empty() && loads.is_empty(), "{moves:?} {loads:?}");
    assert_eq!(out.loads.len(), 4, "the call's own output still lists them");
}

#[test]
fn a_tier_hit_follows_the_chain_and_verifies_tokens() {
    let mut p = pool(5, 8, None);
    let mut out = StepOutput::default();
    let a = prompt(1, 4);
    visit(&mut p, 1, &a, &mut out);
    visit(&mut p, 2, &prompt(2, 4), &mut out);
    // Same first two blocks, then different tokens: two blocks come back.
    let mut c = a.clone();
    c[2 * BS] += 7;
    assert_eq!(p.add_sequence_tokens(SeqId(3), &c, None, &mut out).unwrap(), 2 * BS);
    assert_eq!(out.loads.len(), 2);
    p.free(SeqId(3)).unwrap();
    p.check_invariants().unwrap();
}

#[test]
fn victims_of_the_host_tier_go_to_disk_and_come_back() {
    // Host tier of 2 blocks, disk of 8: a's four blocks end up split across both.
    let mut p = pool(5, 2, Some(8));
    let mut out = StepOutput::default();
    let a = prompt(1, 4);
    visit(&mut p, 1, &a, &mut out);
    visit(&mut p, 2, &prompt(2, 4), &mut out);
    let cached = p.add_sequence_tokens(SeqId(3), &a, None, &mut out).unwrap();
    assert_eq!(cached, 4 * BS);
    let tiers: Vec<usize> = out.loads.iter().map(|l| l.tier).collect();
    assert!(tiers.contains(&0) && tiers.contains(&1), "loads from both tiers: {tiers:?}");
    p.free(SeqId(3)).unwrap();
    p.check_invariants().unwrap();
}

#[test]
fn a_pool_without_caching_or_with_a_window_refuses_tiers() {
    let cfg = [TierConfig { capacity_blocks: 4, policy: TierPolicy::Ranked(EvictionPolicy::Lru) }];
    let mut plain = BlockPool::new(8, BS).unwrap();
    assert!(plain.set_tiers(&cfg, TierRules::default()).is_err());
    let groups = vec![pykvpool::GroupSpec::Full, pykvpool::GroupSpec::sliding_window(8, 0).unwrap()];
    let mut windowed = BlockPool::with_options(16, BS, groups, Some(CacheConfig::default())).unwrap();
    assert!(windowed.set_tiers(&cfg, TierRules::default()).is_err());
}

#[test]
fn loads_only_what_is_faster_than_computing() {
    let cfg = [TierConfig { capacity_blocks: 4, policy: TierPolicy::Ranked(EvictionPolicy::Lru) }, TierConfig { capacity_blocks: 4, policy: TierPolicy::Ranked(EvictionPolicy::Lru) }];
    let mut t = Tiers::new(&cfg, TierRules::default()).unwrap();
    assert_eq!(t.worth_loading(&[0, 1, 1], 2, 16), 3, "without costs, everything found");
    assert!(t.set_costs(&[10], 5).is_err(), "one cost per tier");
    // A block of 16 tokens computes in 80 ns; loading it takes 2 x 10 from the host, 2 x 50 from disk.
    t.set_costs(&[10, 50], 5).unwrap();
    assert_eq!(t.worth_loading(&[0, 0, 1, 1], 2, 16), 2);
    // A cheap block after dear ones pays for them only if the sum saves time.
    assert_eq!(t.worth_loading(&[1, 0, 0], 2, 16), 3); // -20 + 60 + 60 > 0
    assert_eq!(t.worth_loading(&[1, 1, 1, 0], 2, 16), 0); // never above 0
    // A tie between counts takes the smaller.
    t.set_costs(&[40, 40], 5).unwrap();
    assert_eq!(t.worth_loading(&[0, 0], 2, 16), 0);
}
