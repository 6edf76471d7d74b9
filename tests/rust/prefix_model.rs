//! Property test of prefix caching against a reference model: random programs over
//! admission by token ids and by block keys (partly filled last blocks, fills that
//! disagree with an earlier admission of the same key), appends (with and without ids),
//! forks, truncations, frees, pins (by tokens and by keys, hard and soft, with expiry),
//! clock steps, resets and event drains, on a small pool under pressure, with the real
//! hash and with keys cut to 2 bits (collisions everywhere). After every operation:
//!
//! - `check_invariants` passes;
//! - the pool agrees with [`prefix_spec::Spec`], a model written from the documented rules
//!   and the eviction specification: the result of every call (cached tokens, copy-on-write
//!   pairs, refusals, pin ids), every cache statistic and count, which keys are cached and
//!   which of them idle, which position of every sequence holds which cached block and
//!   with what refcount, `cached_prefix_len` probes, and on every drain the exact events
//!   (kind, key, parent key, tokens, clock), which pin down what each eviction picked;
//! - every reused token's slot holds the KV of exactly that prefix: a simulated KV store
//!   records, for each slot, the token prefix whose KV was computed (or copied) into it;
//! - a failed operation changed nothing (tables, lengths, pool and cache statistics).

mod prefix_spec;

#[path = "support/flat.rs"]
mod flat;
use flat::Flat;
use std::collections::{HashMap, HashSet};

use prefix_spec::{Key, Prompt, Spec};
use proptest::prelude::*;
use pykvpool::prefix_cache::block_hash::BlockHasher;
use pykvpool::{BlockId, BlockPool, CacheConfig, CacheEventKind, EvictionPolicy, SeqId};

const BS: usize = 4;
const BLOCKS: usize = 14;

#[derive(Clone, Debug)]
enum Op {
    Admit { family: u32, shared: usize, tail: usize, extra: bool },
    AdmitKeys { family: u32, shared: usize, branch: u32, len: usize },
    /// A prompt admitted before (hits, copy-on-write hits, other fills under the same key).
    Readmit { pick: usize },
    AppendTokens { pick: usize, n: usize },
    AppendPlain { pick: usize, n: usize },
    Fork { pick: usize },
    Truncate { pick: usize, n: usize },
    Free { pick: usize },
    Pin { family: u32, blocks: usize, soft: Option<u32>, ttl: Option<u64>, by_keys: bool },
    Unpin { pick: usize },
    Clock { step: u64 },
    Reset,
    Drain,
}

/// One operation; `pins` weighs pins and unpins (the priority policy's programs pin more).
fn op(pins: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..3, 0usize..13, 0usize..6, any::<bool>())
            .prop_map(|(family, shared, tail, extra)| Op::Admit { family, shared, tail, extra }),
        2 => (0u32..3, 0usize..4, 0u32..2, 0usize..15)
            .prop_map(|(family, shared, branch, len)| Op::AdmitKeys { family, shared, branch, len }),
        2 => any::<usize>().prop_map(|pick| Op::Readmit { pick }),
        2 => (any::<usize>(), 0usize..6).prop_map(|(pick, n)| Op::AppendTokens { pick, n }),
        1 => (any::<usize>(), 0usize..5).prop_map(|(pick, n)| Op::AppendPlain { pick, n }),
        1 => any::<usize>().prop_map(|pick| Op::Fork { pick }),
        1 => (any::<usize>(), 0usize..7).prop_map(|(pick, n)| Op::Truncate { pick, n }),
        3 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        pins => (0u32..3, 0usize..4, prop::option::of(prop::sample::select(vec![1u32, 5])), prop::option::of(1u64..6), any::<bool>())
            .prop_map(|(family, blocks, soft, ttl, by_keys)| Op::Pin { family, blocks, soft, ttl, by_keys }),
        pins => any::<usize>().prop_map(|pick| Op::Unpin { pick }),
        1 => (0u64..3).prop_map(|step| Op::Clock { step }),
        1 => Just(Op::Reset),
        1 => Just(Op::Drain),
    ]
}

/// Keys of a `len`-token keyed prompt: `shared` blocks of the family, then a branch. They
/// stay apart from every 2-bit token key: keys are trusted content ids (equal keys mean
/// equal content), a contract a keyed prompt colliding with a token block would break.
fn family_keys(family: u32, shared: usize, branch: u32, len: usize) -> Vec<Key> {
    (0..len.div_ceil(BS))
        .map(|i| {
            let local = if i < shared { i as u128 + 1 } else { 1000 * (branch as u128 + 1) + i as u128 };
            (1 << 32) + 10_000 * family as u128 + local
        })
        .collect()
}

fn prompt(family: u32, shared: usize, tail: usize, salt: u32) -> Vec<u32> {
    (0..shared as u32).map(|i| 1000 * family + i).chain((0..tail as u32).map(|i| 50_000 + salt * 10 + i)).collect()
}

/// What a slot holds: the extra key and token prefix whose KV was computed into it, a
/// keyed block's key and offset, or an opaque id for tokens appended without ids.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kv {
    Prefix(Option<u64>, Vec<u32>),
    Keyed(Key, usize),
    Opaque(u64),
}

/// What a live sequence holds: token ids (None once a plain append hid them) and extra
/// key, or the keys of a keyed prompt and how many of its tokens are still there.
#[derive(Clone, Debug)]
enum Ident {
    Tokens(Option<Vec<u32>>, Option<u64>),
    Keys(Vec<Key>, usize),
}

/// A prompt as admitted: token ids and extra key, or block keys and length.
#[derive(Clone, Debug)]
enum Admitted {
    Tokens(Vec<u32>, Option<u64>),
    Keys(Vec<Key>, usize),
}

struct World {
    pool: BlockPool,
    model: Spec,
    history: Vec<Admitted>,
    seqs: HashMap<u64, Ident>,
    kv: HashMap<i64, Kv>,
    pins: Vec<u64>,
    next: u64,
}

type Snapshot = (pykvpool::PoolStats, pykvpool::CacheStats, Vec<(SeqId, Vec<BlockId>, usize)>);

impl World {
    fn snapshot(&self) -> Snapshot {
        let tables = self
            .pool
            .seq_ids()
            .into_iter()
            .map(|s| {
                let t = self.pool.blocks_of(s).unwrap();
                (s, t, self.pool.seq_len(s).unwrap())
            })
            .collect();
        (self.pool.stats(), self.pool.cache_stats().unwrap(), tables)
    }

    fn pick(&self, pick: usize) -> Option<u64> {
        let mut ids: Vec<u64> = self.seqs.keys().copied().collect();
        ids.sort_unstable();
        (!ids.is_empty()).then(|| ids[pick % ids.len()])
    }

    fn slot(&self, seq: u64, pos: usize) -> i64 {
        self.pool.slot_of(SeqId(seq), pos).unwrap()
    }

    fn copy(&mut self, cow: &[(BlockId, BlockId)]) {
        for &(src, dst) in cow {
            for j in 0..BS as i64 {
                if let Some(v) = self.kv.get(&(src.first_slot(BS) + j)).cloned() {
                    self.kv.insert(dst.first_slot(BS) + j, v);
                }
            }
        }
    }

    /// What position `p` of `seq` holds.
    fn content(&mut self, seq: u64, p: usize) -> Kv {
        match &self.seqs[&seq] {
            Ident::Tokens(Some(t), extra) => Kv::Prefix(*extra, t[..p + 1].to_vec()),
            Ident::Keys(keys, len) if p < *len => Kv::Keyed(keys[p / BS], p % BS),
            _ => {
                self.next += 1;
                Kv::Opaque(self.next)
            }
        }
    }

    /// Record what the slots of positions `from..` of `seq` now hold.
    fn write(&mut self, seq: u64, from: usize, slots: &[i64]) {
        for (j, &slot) in slots.iter().enumerate() {
            let v = self.content(seq, from + j);
            self.kv.insert(slot, v);
        }
    }

    fn check_reused(&mut self, seq: u64, cached: usize) {
        for p in 0..cached {
            let want = self.content(seq, p);
            assert_eq!(self.kv.get(&self.slot(seq, p)), Some(&want), "wrong KV reused at token {p}");
        }
    }

    /// Keys of the full blocks of `tokens` under the pool's hasher.
    fn keys(&self, tokens: &[u32], extra: Option<u64>) -> Vec<Key> {
        self.pool.block_keys(tokens, extra).unwrap()
    }

    fn admit(&mut self, prompt: Admitted) -> Result<(), pykvpool::KvError> {
        self.next += 1;
        let seq = self.next;
        self.history.push(prompt.clone());
        let (cached, slots) = match prompt {
            Admitted::Tokens(tokens, extra) => {
                let keys = self.keys(&tokens, extra);
                let want = self.model.admit(seq, Prompt::Tokens { tokens: &tokens, keys: &keys, extra });
                let (mut slots, mut cow) = (Vec::new(), Vec::new());
                let r = self.pool.add_sequence_tokens_cow_flat(SeqId(seq), &tokens, extra, &mut slots, &mut cow);
                assert_eq!(r.as_ref().ok().map(|&c| (c, !cow.is_empty())), want, "admission of {tokens:?}");
                let cached = r?;
                self.seqs.insert(seq, Ident::Tokens(Some(tokens), extra));
                self.copy(&cow);
                (cached, slots)
            }
            Admitted::Keys(keys, len) => {
                let want = self.model.admit(seq, Prompt::Keys { keys: &keys, len });
                let mut slots = Vec::new();
                let r = self.pool.add_sequence_block_keys_flat(SeqId(seq), &keys, len, &mut slots);
                assert_eq!(r.as_ref().ok().map(|&c| (c, false)), want, "admission of keys {keys:?}, {len} tokens");
                let cached = r?;
                self.seqs.insert(seq, Ident::Keys(keys, len));
                (cached, slots)
            }
        };
        self.check_reused(seq, cached);
        self.write(seq, cached, &slots);
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), pykvpool::KvError> {
        match *op {
            Op::Admit { family, shared, tail, extra } => {
                let tokens = prompt(family, shared, tail, self.next as u32 + 1);
                self.admit(Admitted::Tokens(tokens, extra.then_some(7)))?;
            }
            Op::AdmitKeys { family, shared, branch, len } => {
                self.admit(Admitted::Keys(family_keys(family, shared, branch, len), len))?;
            }
            Op::Readmit { pick } => {
                if !self.history.is_empty() {
                    self.admit(self.history[pick % self.history.len()].clone())?;
                }
            }
            Op::AppendTokens { pick, n } | Op::AppendPlain { pick, n } => {
                let Some(seq) = self.pick(pick) else { return Ok(()) };
                let from = self.pool.seq_len(SeqId(seq)).unwrap();
                let new: Vec<u32> = (0..n as u32).map(|i| 70_000 + seq as u32 * 10 + i).collect();
                let (mut slots, mut cow) = (Vec::new(), Vec::new());
                if matches!(op, Op::AppendTokens { .. }) {
                    let grown = match &self.seqs[&seq] {
                        Ident::Tokens(Some(t), extra) => Some(([t.as_slice(), &new].concat(), *extra)),
                        _ => None,
                    };
                    let keys = grown.as_ref().map(|(t, extra)| self.keys(t, *extra)).unwrap_or_default();
                    let want = self.model.append(seq, n, Some((&new, &keys)));
                    let r = self.pool.append_tokens_flat(SeqId(seq), &new, &mut slots, &mut cow);
                    assert_eq!(r.as_ref().ok().map(|_| cow.len()), want, "append_tokens({seq}, {n})");
                    r?;
                    if let (Ident::Tokens(t, _), Some((g, _))) = (self.seqs.get_mut(&seq).unwrap(), grown) {
                        *t = Some(g);
                    }
                } else {
                    let want = self.model.append(seq, n, None);
                    let r = self.pool.append_flat(SeqId(seq), n, &mut slots, &mut cow);
                    assert_eq!(r.as_ref().ok().map(|_| cow.len()), want, "append({seq}, {n})");
                    r?;
                    if let (Ident::Tokens(t, _), true) = (self.seqs.get_mut(&seq).unwrap(), n > 0) {
                        *t = None;
                    }
                }
                self.copy(&cow);
                self.write(seq, from, &slots);
            }
            Op::Fork { pick } => {
                let Some(seq) = self.pick(pick) else { return Ok(()) };
                self.next += 1;
                self.pool.fork(SeqId(seq), SeqId(self.next))?;
                self.model.fork(seq, self.next);
                let s = self.seqs[&seq].clone();
                self.seqs.insert(self.next, s);
            }
            Op::Truncate { pick, n } => {
                let Some(seq) = self.pick(pick) else { return Ok(()) };
                let n = n.min(self.pool.seq_len(SeqId(seq)).unwrap());
                self.pool.truncate(SeqId(seq), n)?;
                self.model.truncate(seq, n);
                let len = self.pool.seq_len(SeqId(seq)).unwrap();
                match self.seqs.get_mut(&seq).unwrap() {
                    Ident::Tokens(Some(t), _) => t.truncate(len),
                    Ident::Keys(_, l) => *l = (*l).min(len),
                    _ => {}
                }
            }
            Op::Free { pick } => {
                let Some(seq) = self.pick(pick) else { return Ok(()) };
                self.pool.free(SeqId(seq))?;
                self.model.free(seq);
                self.seqs.remove(&seq);
            }
            Op::Pin { family, blocks, soft, ttl, by_keys } => {
                let now = self.pool.cache_stats().unwrap().clock;
                let tokens = prompt(family, blocks * BS, 0, 0);
                let (priority, expires) = (soft, ttl.map(|t| now + t));
                let r = if by_keys {
                    let keys = family_keys(family, blocks, 0, blocks * BS);
                    let want = self.model.pin(&keys, None, priority, expires);
                    let r = self.pool.pin_prefix_keys(&keys, priority, expires);
                    assert_eq!(r.as_ref().ok().copied(), want, "pin of keys {keys:?}");
                    r
                } else {
                    let keys = self.keys(&tokens, None);
                    let want = self.model.pin(&keys, Some(&tokens), priority, expires);
                    let r = self.pool.pin_prefix_tokens(&tokens, None, priority, expires);
                    assert_eq!(r.as_ref().ok().copied(), want, "pin of {tokens:?}");
                    r
                };
                self.pins.push(r?);
            }
            Op::Unpin { pick } => {
                let id = if self.pins.is_empty() { 999 } else { self.pins[pick % self.pins.len()] };
                let want = self.model.unpin(id);
                let r = self.pool.unpin(id);
                assert_eq!(r.is_ok(), want, "unpin {id}");
                r?;
            }
            Op::Clock { step } => {
                let now = self.pool.cache_stats().unwrap().clock;
                assert!(self.model.set_clock(now + step));
                self.pool.set_clock(now + step)?;
            }
            Op::Reset => {
                let want = self.model.reset();
                let r = self.pool.reset_prefix_cache();
                assert_eq!(r.as_ref().ok().copied(), want, "reset");
                r?;
            }
            Op::Drain => self.drain(),
        }
        Ok(())
    }

    /// The pool's events against the model's, exactly.
    fn drain(&mut self) {
        let mut ev = Vec::new();
        self.pool.drain_events(&mut ev).unwrap();
        let kind = |k: CacheEventKind| match k {
            CacheEventKind::Stored => 0,
            CacheEventKind::Removed => 1,
            CacheEventKind::AllCleared => 2,
        };
        let got: Vec<prefix_spec::Event> = ev.iter().map(|e| (kind(e.kind), e.key, e.parent_key, e.tokens, e.clock)).collect();
        assert_eq!(got, std::mem::take(&mut self.model.events), "events");
    }

    /// Everything observable about the cache, against the model.
    fn compare(&self) {
        let (m, c) = (&self.model, self.pool.prefix_cache().unwrap());
        let s = self.pool.cache_stats().unwrap();
        let got = prefix_spec::Stats {
            queries: s.queries,
            query_blocks: s.query_blocks,
            hit_blocks: s.hit_blocks,
            query_tokens: s.query_tokens,
            hit_tokens: s.hit_tokens,
            stored_blocks: s.stored_blocks,
            evictions: s.evictions,
            collisions: s.collisions,
            cow_hits: s.cow_hits,
        };
        assert_eq!(got, m.stats, "statistics");
        assert_eq!(self.pool.num_free_blocks(), m.num_free(), "free blocks");
        let counts = (s.cached_blocks, s.idle_blocks, s.evictable_blocks, s.pinned_blocks, s.num_pins, s.clock);
        assert_eq!(counts, (m.cache.len(), m.idle().count(), m.evictable(), m.pinned(), m.num_pins(), m.clock));
        assert_eq!(s.pending_events, m.events.len());
        // Which keys are cached, and which of them are idle.
        let cached: HashSet<(Key, usize, bool)> = (0..BLOCKS as u32)
            .map(BlockId)
            .filter_map(|b| c.key_of(b).map(|k| (k, c.filled(b).unwrap(), self.pool.refcount(b).unwrap() == 0)))
            .collect();
        let want: HashSet<(Key, usize, bool)> = m.cache.iter().map(|(&(k, f), &b)| (k, f, m.blocks[b].refs == 0)).collect();
        assert_eq!(cached, want, "cached keys (key, fill, idle)");
        // Which position of each sequence holds which cached block, with what refcount.
        for (&seq, ms) in &m.seqs {
            let t = self.pool.blocks_of(SeqId(seq)).unwrap();
            assert_eq!(self.pool.seq_len(SeqId(seq)).unwrap(), ms.ntokens);
            let got: Vec<(Option<Key>, u32)> = t.iter().map(|&b| (c.key_of(b), self.pool.refcount(b).unwrap())).collect();
            let want: Vec<(Option<Key>, u32)> =
                ms.table.iter().map(|&b| (m.blocks[b].cached.then_some(m.blocks[b].key), m.blocks[b].refs)).collect();
            assert_eq!(got, want, "table of sequence {seq}");
        }
        for family in 0..3 {
            let probe = prompt(family, 12, 0, 0);
            let keys = self.keys(&probe, None);
            assert_eq!(self.pool.cached_prefix_len(&probe, None).unwrap(), m.cached_prefix_len(&probe, &keys, None));
        }
    }
}

fn run(ops: &[Op], cfg: CacheConfig) {
    let cfg = CacheConfig { record_events: true, ..cfg };
    let mut w = World {
        pool: BlockPool::with_prefix_cache(BLOCKS, BS, cfg).unwrap(),
        model: Spec::new(BS, BLOCKS, cfg.policy, cfg.cow_partial_hit),
        history: Vec::new(),
        seqs: HashMap::new(),
        kv: HashMap::new(),
        pins: Vec::new(),
        next: 0,
    };
    for op in ops {
        let before = w.snapshot();
        if w.apply(op).is_err() {
            assert_eq!(w.snapshot(), before, "failed {op:?} changed the pool");
        }
        w.pool.check_invariants().unwrap_or_else(|e| panic!("after {op:?}: {e}"));
        w.compare();
    }
    let mut ids: Vec<u64> = w.seqs.keys().copied().collect();
    ids.sort_unstable();
    for s in ids {
        w.pool.free(SeqId(s)).unwrap();
        w.model.free(s);
    }
    w.pool.check_invariants().unwrap();
    w.compare();
    w.drain();
    assert_eq!(w.pool.num_free_blocks(), BLOCKS - w.pool.cache_stats().unwrap().pinned_blocks);
}

fn policy() -> impl Strategy<Value = EvictionPolicy> {
    prop::sample::select(EvictionPolicy::ALL.to_vec())
}

// 256 programs per test by default; `PROPTEST_CASES=100000 cargo test --release --test
// prefix_model` for a soak.
proptest! {
    #[test]
    fn pool_matches_the_model(ops in prop::collection::vec(op(1), 1..60), policy in policy(), cow in any::<bool>()) {
        run(&ops, CacheConfig { policy, cow_partial_hit: cow, ..CacheConfig::default() });
    }

    /// Soft pins decide the priority policy's order: programs that pin often.
    #[test]
    fn priority_policy_matches_the_model(ops in prop::collection::vec(op(4), 1..60), cow in any::<bool>()) {
        run(&ops, CacheConfig { policy: EvictionPolicy::Priority, cow_partial_hit: cow, ..CacheConfig::default() });
    }

    #[test]
    fn pool_matches_the_model_under_collisions(ops in prop::collection::vec(op(1), 1..60), policy in policy(), cow in any::<bool>()) {
        let hasher = BlockHasher::Truncated { bits: 2 };
        run(&ops, CacheConfig { policy, cow_partial_hit: cow, hasher, ..CacheConfig::default() });
    }
}
