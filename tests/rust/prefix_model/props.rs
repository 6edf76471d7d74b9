//! The property test: random programs (admissions of prompts sharing prefixes, with and
//! without an extra key, re-admissions, batched steps and decode steps, appends by token
//! ids, forks, truncations, frees, resets of the cache, event drains) on a small pool under
//! pressure, with group mixes of one to four groups, every eviction policy, and keys
//! either whole or cut to 3 bits (collisions everywhere, which verification must turn into
//! misses in every group kind). After every operation the pool agrees with
//! [`super::model::Model`]: the call's result (cached tokens, or the kind of refusal), the
//! free + idle count, every sequence's length, frontier and per-group table (stored or
//! hole; refcount and (group, key) of every stored block), the cached keys, the idle
//! blocks in the policy's eviction order (every policy; no pins), the statistics,
//! `cached_prefix_len` of every prompt seen, on every drain the exact events (kind, group,
//! key, parent key, tokens, clock); a failed call changed nothing (tables, lengths, pool
//! and cache statistics, events); and `check_invariants` and `check_cache` pass. And every
//! reused token's slot holds the KV of exactly that prefix: a simulated KV store records,
//! for each slot, what the caller computed (or copied) into it through the returned slots
//! and copy-on-write pairs.

use std::collections::HashMap;


use proptest::prelude::*;
use pykvpool::pool::{GroupSpec, BlockPool, StepOutput};
use pykvpool::prefix_cache::{CacheConfig, CacheEvent};
use pykvpool::{BlockHasher, BlockId, CacheEventKind, EvictionPolicy, SeqId};

use super::model::{kind, MEvent, Model, Q, BS};

#[derive(Clone, Debug)]
enum Op {
    /// `head`: the first block's variant; prompts of one family that differ only there
    /// share every later block's ids (and, when the first keys collide, every later key).
    Admit { family: u32, head: u32, shared: usize, tail: usize, extra: bool },
    Readmit { pick: usize },
    /// A prompt of block keys (trusted; the last may stand for a partly filled block):
    /// `shared` keys of the family's chain, then keys of a branch.
    AdmitKeys { family: u32, shared: usize, branch: u32, len: usize },
    Step { picks: Vec<usize>, counts: Vec<usize> },
    Decode { picks: Vec<usize> },
    Append { pick: usize, family: u32, n: usize },
    Fork { pick: usize },
    Truncate { pick: usize, n: usize },
    Free { pick: usize },
    Reset,
    Drain,
    /// Pin the hit of the first `blocks` full blocks of a prompt seen before.
    Pin { pick: usize, blocks: usize, soft: Option<u32>, ttl: Option<u64> },
    /// Pin the hit of `blocks` full blocks of a keyed prompt.
    PinKeys { family: u32, shared: usize, branch: u32, blocks: usize, soft: Option<u32>, ttl: Option<u64> },
    Unpin { pick: usize },
    Clock { step: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..3, 0u32..3, 0usize..30, 0usize..6, prop::bool::weighted(0.2))
            .prop_map(|(family, head, shared, tail, extra)| Op::Admit { family, head, shared, tail, extra }),
        3 => any::<usize>().prop_map(|pick| Op::Readmit { pick }),
        2 => (0u32..3, 0usize..5, 0u32..2, 0usize..22)
            .prop_map(|(family, shared, branch, len)| Op::AdmitKeys { family, shared, branch, len }),
        2 => (prop::collection::vec(any::<usize>(), 1..4), prop::collection::vec(0usize..7, 3))
            .prop_map(|(picks, counts)| Op::Step { picks, counts }),
        3 => prop::collection::vec(any::<usize>(), 1..4).prop_map(|picks| Op::Decode { picks }),
        2 => (any::<usize>(), 0u32..3, 0usize..7).prop_map(|(pick, family, n)| Op::Append { pick, family, n }),
        1 => any::<usize>().prop_map(|pick| Op::Fork { pick }),
        1 => (any::<usize>(), 0usize..7).prop_map(|(pick, n)| Op::Truncate { pick, n }),
        2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => Just(Op::Reset),
        1 => Just(Op::Drain),
        2 => (any::<usize>(), 0usize..9, prop::option::of(0u32..4), prop::option::of(0u64..6))
            .prop_map(|(pick, blocks, soft, ttl)| Op::Pin { pick, blocks, soft, ttl }),
        1 => (0u32..3, 0usize..5, 0u32..2, 0usize..5, prop::option::of(0u32..4), prop::option::of(0u64..6))
            .prop_map(|(family, shared, branch, blocks, soft, ttl)| Op::PinKeys { family, shared, branch, blocks, soft, ttl }),
        1 => any::<usize>().prop_map(|pick| Op::Unpin { pick }),
        1 => (0u64..4).prop_map(|step| Op::Clock { step }),
    ]
}

fn mixes() -> Vec<Vec<GroupSpec>> {
    let sw = |w, s| GroupSpec::sliding_window(w, s).unwrap();
    vec![
        vec![GroupSpec::Full],
        vec![sw(6, 0)],
        vec![GroupSpec::Full, sw(5, 2)],
        vec![GroupSpec::Full, GroupSpec::chunked(8).unwrap()],
        vec![sw(4, 0), GroupSpec::chunked(6).unwrap(), GroupSpec::Full],
        vec![sw(9, 5), sw(3, 0)],
        vec![GroupSpec::Full, sw(5, 0), GroupSpec::chunked(8).unwrap(), sw(7, 4)],
        vec![sw(5, 0), GroupSpec::chunked(8).unwrap()],
    ]
}

/// The block keys of a keyed prompt: above 2^64, so that they never meet a key of token
/// ids cut to a few bits, and never one of another family or branch past `shared`.
fn family_keys(family: u32, shared: usize, branch: u32, len: usize) -> Vec<u128> {
    (0..len.div_ceil(BS))
        .map(|j| {
            let tag = if j < shared { 0 } else { 1 + branch as u128 };
            (1u128 << 100) | tag << 80 | (family as u128) << 40 | j as u128
        })
        .collect()
}

/// Token `pos` of family `f`'s stream: prompts of one family share their prefixes.
fn stream(f: u32, pos: usize) -> u32 {
    f * 10_000 + pos as u32
}

/// What a failed call must leave as it was.
type Snapshot = (pykvpool::PoolStats, pykvpool::CacheStats, Vec<(SeqId, usize, usize, Vec<Vec<Option<BlockId>>>)>);

fn model_event(e: &CacheEvent) -> MEvent {
    let kind = match e.kind {
        CacheEventKind::Stored => 0,
        CacheEventKind::Removed => 1,
        CacheEventKind::AllCleared => 2,
    };
    (kind, e.group, e.key, e.parent_key, e.tokens, e.clock)
}

/// What a slot's KV was computed from: its group and the prompt through the position
/// (token ids with the extra key; trusted keys (a windowed group's block: its own) and the
/// offset), or an opaque count for tokens grown without ids.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kv {
    Prefix(usize, Option<u64>, Vec<u32>),
    Keyed(usize, Vec<u128>, usize),
    Opaque(u64),
}

struct Run {
    kv: HashMap<i64, Kv>,
    /// The keys and length of each sequence admitted by block keys.
    keyed: HashMap<u64, (Vec<u128>, usize)>,
    opaque: u64,
    pool: BlockPool,
    model: Model,
    prompts: Vec<(Vec<u32>, Option<u64>)>,
    next_id: u64,
    fresh: u32,
    /// The last call was refused.
    failed: bool,
}

impl Run {
    /// The live id at `pick`, or an id never used (error paths) one time in `n + 1`.
    fn pick(&self, pick: usize) -> u64 {
        let mut ids: Vec<u64> = self.model.seqs.keys().copied().collect();
        ids.sort_unstable();
        if pick % (ids.len() + 1) == ids.len() {
            10_000
        } else {
            ids[pick % (ids.len() + 1)]
        }
    }

    fn snapshot(&self) -> Snapshot {
        let p = &self.pool;
        let seqs = p
            .seq_ids()
            .into_iter()
            .map(|s| {
                let tables = (0..p.num_groups()).map(|g| p.table(s, g).unwrap().entries().collect()).collect();
                (s, p.seq_len(s).unwrap(), p.frontier(s).unwrap(), tables)
            })
            .collect();
        (p.stats(), p.cache_stats().unwrap(), seqs)
    }

    /// What position `p` of `seq` holds in group `g`.
    fn content(&mut self, g: usize, seq: u64, p: usize) -> Kv {
        let e = &self.model.seqs[&seq];
        match (&e.cursor, self.keyed.get(&seq)) {
            (Some((t, _)), _) if p < t.len() => Kv::Prefix(g, e.extra, t[..p + 1].to_vec()),
            (_, Some((keys, len))) if p < *len => {
                let from = if self.model.specs[g].is_windowed() { p / BS } else { 0 };
                Kv::Keyed(g, keys[from..=p / BS].to_vec(), p % BS)
            }
            _ => {
                self.opaque += 1;
                Kv::Opaque(self.opaque)
            }
        }
    }

    /// Apply a call's copies, then record what the caller computes into its slots: `runs`
    /// of `(seq, first position, tokens)` in the order of `out.slots` (group-major).
    fn write(&mut self, out: &StepOutput, runs: &[(u64, usize, usize)]) {
        for &(src, dst) in &out.cow {
            for j in 0..BS as i64 {
                if let Some(v) = self.kv.get(&(src.first_slot(BS) + j)).cloned() {
                    self.kv.insert(dst.first_slot(BS) + j, v);
                }
            }
        }
        let mut at = 0;
        for g in 0..self.model.specs.len() {
            for &(seq, from, n) in runs {
                for p in from..from + n {
                    let v = self.content(g, seq, p);
                    self.kv.insert(out.slots[at], v);
                    at += 1;
                }
            }
        }
        assert_eq!(at, out.slots.len(), "slots of {runs:?}");
    }

    /// The `(seq, first position, tokens)` runs a batch growing `ids` by `counts` writes.
    fn runs(&self, ids: &[u64], counts: &[usize]) -> Vec<(u64, usize, usize)> {
        ids.iter().zip(counts).filter(|x| *x.1 > 0).map(|(&s, &n)| (s, self.model.seqs.get(&s).map_or(0, |e| e.len), n)).collect()
    }

    /// Every token an admission reused reads KV computed from exactly its prefix.
    fn check_reused(&mut self, seq: u64, cached: usize) {
        for g in 0..self.model.specs.len() {
            for p in 0..cached {
                let Some(b) = self.pool.table(SeqId(seq), g).unwrap().entries().nth(p / BS).flatten() else { continue };
                let want = self.content(g, seq, p);
                assert_eq!(self.kv.get(&(b.first_slot(BS) + (p % BS) as i64)), Some(&want), "KV of token {p}, group {g}, sequence {seq}");
            }
        }
    }

    /// After a successful admission of `len` tokens serving `cached`.
    fn admitted(&mut self, seq: u64, out: &StepOutput, len: usize, cached: usize) {
        let computed = if out.total_tokens == 1 && cached == len - 1 { (len - 1, 1) } else { (cached, len - cached) };
        self.write(out, &[(seq, computed.0, computed.1)]);
        self.check_reused(seq, cached);
    }

    fn admit(&mut self, tokens: Vec<u32>, extra: Option<u64>) {
        let id = self.next_id;
        self.next_id += 1;
        let mut out = StepOutput::default();
        let got = self.pool.add_sequence_tokens(SeqId(id), &tokens, extra, &mut out).map_err(|e| kind(&e));
        let want = self.model.admit(id, &tokens, extra);
        assert_eq!(got, want, "admission of {tokens:?} (extra {extra:?})");
        self.failed = got.is_err();
        if let Ok(hit) = got {
            assert_eq!((out.total_tokens, out.slots.len()), (tokens.len() - hit, self.model.specs.len() * (tokens.len() - hit)));
            assert_eq!(out.cow.len(), self.model.last_copies, "copy-on-write pairs");
            self.admitted(id, &out, tokens.len(), hit);
        }
        self.prompts.push((tokens, extra));
    }

    fn drain(&mut self) {
        let mut got = Vec::new();
        self.pool.drain_events(&mut got).unwrap();
        let got: Vec<MEvent> = got.iter().map(model_event).collect();
        assert_eq!(got, std::mem::take(&mut self.model.events), "events");
    }

    fn apply(&mut self, op: &Op) {
        let mut out = StepOutput::default();
        match op {
            Op::Admit { family, head, shared, tail, extra } => {
                self.fresh += 1;
                let mut t: Vec<u32> = (0..*shared).map(|p| stream(*family, p) + if p < BS { head * 100 } else { 0 }).collect();
                t.extend((0..*tail).map(|k| 900_000 + self.fresh * 10 + k as u32));
                self.admit(t, extra.then_some(7));
            }
            Op::AdmitKeys { family, shared, branch, len } => {
                let (id, keys) = (self.next_id, family_keys(*family, *shared, *branch, *len));
                self.next_id += 1;
                let got = self.pool.add_sequence_block_keys(SeqId(id), &keys, *len, &mut out).map_err(|e| kind(&e));
                assert_eq!(got, self.model.admit_keys(id, &keys, *len), "admission of keys {keys:x?} for {len} tokens");
                self.failed = got.is_err();
                if let Ok(hit) = got {
                    self.keyed.insert(id, (keys, *len));
                    self.admitted(id, &out, *len, hit);
                }
            }
            Op::Readmit { pick } => {
                if !self.prompts.is_empty() {
                    let (t, extra) = self.prompts[pick % self.prompts.len()].clone();
                    self.admit(t, extra);
                }
            }
            Op::Step { picks, counts } => {
                let ids: Vec<u64> = picks.iter().map(|&p| self.pick(p)).collect();
                let counts = &counts[..ids.len()];
                let sids: Vec<SeqId> = ids.iter().map(|&i| SeqId(i)).collect();
                let runs = self.runs(&ids, counts);
                let got = self.pool.step(&sids, counts, &mut out).map_err(|e| kind(&e));
                assert_eq!(got, self.model.step(&ids, counts, false), "step {ids:?} {counts:?}");
                self.failed = got.is_err();
                if got.is_ok() {
                    self.write(&out, &runs);
                }
            }
            Op::Decode { picks } => {
                let ids: Vec<u64> = picks.iter().map(|&p| self.pick(p)).collect();
                let sids: Vec<SeqId> = ids.iter().map(|&i| SeqId(i)).collect();
                let runs = self.runs(&ids, &vec![1; ids.len()]);
                let got = self.pool.step_decode(&sids, &mut out).map_err(|e| kind(&e));
                assert_eq!(got, self.model.step(&ids, &vec![1; ids.len()], false), "decode {ids:?}");
                self.failed = got.is_err();
                if got.is_ok() {
                    self.write(&out, &runs);
                }
            }
            Op::Append { pick, family, n } => {
                let id = self.pick(*pick);
                let len = self.model.seqs.get(&id).map_or(0, |e| e.len);
                let t: Vec<u32> = (len..len + n).map(|p| stream(*family, p)).collect();
                let got = self.pool.append_tokens(SeqId(id), &t, &mut out).map_err(|e| kind(&e));
                assert_eq!(got, self.model.append_tokens(id, &t), "append {t:?} to {id}");
                self.failed = got.is_err();
                if got.is_ok() {
                    self.write(&out, &[(id, len, *n)]);
                }
            }
            Op::Fork { pick } => {
                let (parent, child) = (self.pick(*pick), self.next_id);
                self.next_id += 1;
                let got = self.pool.fork(SeqId(parent), SeqId(child)).map_err(|e| kind(&e));
                assert_eq!(got, self.model.fork(parent, child));
                self.failed = got.is_err();
                if let (Ok(()), Some(k)) = (got, self.keyed.get(&parent).cloned()) {
                    self.keyed.insert(child, k);
                }
            }
            Op::Truncate { pick, n } => {
                let id = self.pick(*pick);
                let got = self.pool.truncate(SeqId(id), *n).map_err(|e| kind(&e));
                assert_eq!(got, self.model.truncate(id, *n), "truncate {n} of {id}");
                self.failed = got.is_err();
            }
            Op::Free { pick } => {
                let id = self.pick(*pick);
                let got = self.pool.free(SeqId(id)).map_err(|e| kind(&e));
                assert_eq!(got, self.model.free_seq(id));
                self.failed = got.is_err();
            }
            Op::Reset => {
                let got = self.pool.reset_prefix_cache().map_err(|e| kind(&e));
                assert_eq!(got, self.model.reset(), "reset");
                self.failed = got.is_err();
            }
            Op::Pin { pick, blocks, soft, ttl } => {
                if self.prompts.is_empty() {
                    return;
                }
                let (t, extra) = &self.prompts[pick % self.prompts.len()];
                let t = &t[..(blocks * BS).min(t.len())];
                let expires_at = ttl.map(|d| self.model.ops + d);
                let got = self.pool.pin_prefix_tokens(t, *extra, *soft, expires_at).map_err(|e| kind(&e));
                let keys = self.model.keys(t, *extra);
                let q = Q { keys: &keys, tokens: Some(t), extra: *extra, len: t.len() };
                assert_eq!(got, self.model.pin(q, *soft, expires_at), "pin {t:?}");
                self.failed = got.is_err();
            }
            Op::PinKeys { family, shared, branch, blocks, soft, ttl } => {
                let keys = family_keys(*family, *shared, *branch, blocks * BS);
                let expires_at = ttl.map(|d| self.model.ops + d);
                let got = self.pool.pin_prefix_keys(&keys, *soft, expires_at).map_err(|e| kind(&e));
                let q = Q { keys: &keys, tokens: None, extra: None, len: keys.len() * BS };
                assert_eq!(got, self.model.pin(q, *soft, expires_at), "pin keys {keys:x?}");
                self.failed = got.is_err();
            }
            Op::Unpin { pick } => {
                let ids: Vec<u64> = self.model.pins.keys().copied().collect();
                let id = if ids.is_empty() || pick % 4 == 0 { 1000 } else { ids[pick % ids.len()] };
                let got = self.pool.unpin(id).map_err(|e| kind(&e));
                assert_eq!(got, self.model.unpin(id), "unpin {id}");
                self.failed = got.is_err();
            }
            Op::Clock { step } => {
                let t = (self.model.ops + step).saturating_sub(1);
                let got = self.pool.set_clock(t).map_err(|e| kind(&e));
                assert_eq!(got, self.model.set_clock(t), "set_clock({t})");
                self.failed = got.is_err();
            }
            Op::Drain => self.drain(),
        }
    }

    fn compare(&self) {
        let (p, m) = (&self.pool, &self.model);
        p.check_invariants().unwrap();
        p.check_cache().unwrap();
        let c = p.prefix_cache().unwrap();
        assert_eq!(p.num_free_blocks(), m.available(), "free + evictable");
        let mut ids: Vec<u64> = m.seqs.keys().copied().collect();
        ids.sort_unstable();
        assert_eq!(p.seq_ids(), ids.iter().map(|&i| SeqId(i)).collect::<Vec<_>>());
        for (&id, e) in &m.seqs {
            let s = SeqId(id);
            assert_eq!((p.seq_len(s).unwrap(), p.frontier(s).unwrap()), (e.len, e.frontier), "sequence {id}");
            for (g, mt) in e.tables.iter().enumerate() {
                let pt: Vec<_> = p.table(s, g).unwrap().entries().collect();
                assert_eq!(pt.len(), mt.len(), "sequence {id} group {g}");
                for (i, (pb, mb)) in pt.iter().zip(mt).enumerate() {
                    match (pb, mb) {
                        (None, None) => {}
                        (Some(b), Some(x)) => {
                            let mb = &m.blocks[*x];
                            let key = c.key_of(*b).map(|k| (c.group_of(*b).unwrap(), k));
                            assert_eq!((p.refcount(*b).unwrap(), key), (mb.rc, mb.key), "sequence {id} group {g} block {i}");
                        }
                        _ => panic!("sequence {id} group {g} block {i}: pool {pb:?}, model {mb:?}"),
                    }
                }
            }
        }
        let idle: Vec<_> = c.eviction_candidates().into_iter().map(|b| c.key_of(b).map(|k| (c.group_of(b).unwrap(), k))).collect();
        let want: Vec<_> = m.eviction_order().into_iter().map(|x| m.blocks[x].key).collect();
        assert_eq!(idle, want, "evictable idle blocks in {} order", m.policy);
        assert_eq!(c.num_cached(), m.index.len());
        for &(g, k, _) in m.index.keys().filter(|x| x.2 == BS) {
            assert!(c.block_of(g, k).is_some(), "group {g} key {k:#x} cached in the model");
        }
        let s = p.cache_stats().unwrap();
        let ms = &m.stats;
        assert_eq!(
            (s.queries, s.query_tokens, s.hit_tokens, &s.group_hit_blocks, s.stored_blocks, s.evictions, s.idle_blocks),
            (ms.queries, ms.query_tokens, ms.hit_tokens, &ms.group_hit_blocks, ms.stored, ms.evictions, m.idle.len())
        );
        assert_eq!((s.query_blocks, s.hit_blocks, s.cow_hits), (ms.query_blocks, ms.hit_blocks, ms.cow_hits), "hit metrics");
        let pinned = m.blocks.iter().filter(|b| b.key.is_some() && b.hard > 0).count();
        assert_eq!((s.num_pins, s.pinned_blocks, s.evictable_blocks, s.clock), (m.pins.len(), pinned, m.evictable(), m.ops), "pins");
        for (t, extra) in &self.prompts {
            let keys = m.keys(t, *extra);
            let want = m.longest(Q { keys: &keys, tokens: Some(t), extra: *extra, len: t.len() }, keys.len()) * BS;
            assert_eq!(p.cached_prefix_len(t, *extra).unwrap(), want, "cached_prefix_len({t:?})");
        }
    }
}

fn run(mix: usize, policy: EvictionPolicy, hasher: BlockHasher, cow: bool, blocks: usize, ops: &[Op]) {
    let specs = mixes()[mix].clone();
    let cfg = CacheConfig { policy, hasher, cow_partial_hit: cow, record_events: true, ..CacheConfig::default() };
    let pool = BlockPool::with_options(blocks, BS, specs.clone(), Some(cfg)).unwrap();
    let mut model = Model::new(specs, blocks, policy, hasher);
    model.cow = cow;
    let mut run = Run { kv: HashMap::new(), keyed: HashMap::new(), opaque: 0, pool, model, prompts: Vec::new(), next_id: 0, fresh: 0, failed: false };
    for op in ops {
        let (before, events) = (run.snapshot(), run.model.events.len());
        run.failed = false;
        run.apply(op);
        if run.failed {
            assert_eq!(run.snapshot(), before, "{op:?} failed but changed the pool");
            assert_eq!(run.model.events.len(), events);
        }
        run.compare();
    }
    // Free everything: every block ends free or idle, still cached.
    for id in run.model.seqs.keys().copied().collect::<Vec<_>>() {
        run.pool.free(SeqId(id)).unwrap();
        run.model.free_seq(id).unwrap();
    }
    run.compare();
    run.drain();
    let pinned = run.pool.cache_stats().unwrap().pinned_blocks;
    assert_eq!(run.pool.num_free_blocks(), blocks - pinned);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn pool_follows_the_model(
        mix in 0usize..8,
        policy in prop::sample::select(EvictionPolicy::ALL.to_vec()),
        cow in any::<bool>(),
        blocks in 10usize..40,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(mix, policy, BlockHasher::Xxh3, cow, blocks, &ops);
    }

    /// Keys cut to 3 bits: most lookups find a key some other prefix stored. Pools without
    /// a full group, where only the cache's record of each windowed block's prefix tells
    /// a colliding prefix from the query's, are drawn more often.
    #[test]
    fn pool_follows_the_model_under_collisions(
        mix in prop_oneof![0usize..8, prop::sample::select(vec![1usize, 7])],
        policy in prop::sample::select(EvictionPolicy::ALL.to_vec()),
        cow in any::<bool>(),
        blocks in 10usize..40,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(mix, policy, BlockHasher::Truncated { bits: 3 }, cow, blocks, &ops);
    }
}

#[test]
fn model_matches_a_hand_checked_case() {
    // Sanity of the model itself: a window hit holds sinks + window, holes between.
    let specs = vec![GroupSpec::sliding_window(8, 4).unwrap()];
    let mut m = Model::new(specs, 30, EvictionPolicy::Lru, BlockHasher::Xxh3);
    let a: Vec<u32> = (0..40).collect();
    assert_eq!(m.admit(0, &a, None), Ok(0));
    assert_eq!(m.admit(1, &[&a[..], &[1]].concat(), None), Ok(40));
    let held: Vec<bool> = m.seqs[&1].tables[0].iter().map(|x| x.is_some()).collect();
    assert_eq!(held, (0..11).map(|i| i == 0 || i >= 8).collect::<Vec<_>>());
}
