//! Property test of prefix caching: random programs over admission by token ids, appends
//! (with and without ids), forks, truncations, frees, pins and clock steps, on a small
//! pool under pressure, with the real hash and with keys cut to 2 bits (collisions
//! everywhere). After every operation:
//!
//! - `check_invariants` passes;
//! - every reused token's slot holds the KV of exactly that prefix: a simulated KV store
//!   records, for each slot, the token prefix whose KV was computed (or copied) into it;
//! - a failed operation changed nothing (tables, lengths, pool and cache statistics).

use std::collections::HashMap;

use proptest::prelude::*;
use pykvpool::block_hash::BlockHasher;
use pykvpool::{BlockId, BlockPool, CacheConfig, EvictionPolicy, SeqId};

const BS: usize = 4;
const BLOCKS: usize = 14;

#[derive(Clone, Debug)]
enum Op {
    Admit { family: u32, shared: usize, tail: usize, extra: bool },
    AppendTokens { pick: usize, n: usize },
    AppendPlain { pick: usize, n: usize },
    Fork { pick: usize },
    Truncate { pick: usize, n: usize },
    Free { pick: usize },
    Pin { family: u32, blocks: usize, soft: bool, ttl: Option<u64> },
    Unpin { pick: usize },
    Clock { step: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..3, 0usize..13, 0usize..6, any::<bool>())
            .prop_map(|(family, shared, tail, extra)| Op::Admit { family, shared, tail, extra }),
        2 => (any::<usize>(), 0usize..6).prop_map(|(pick, n)| Op::AppendTokens { pick, n }),
        1 => (any::<usize>(), 0usize..5).prop_map(|(pick, n)| Op::AppendPlain { pick, n }),
        1 => any::<usize>().prop_map(|pick| Op::Fork { pick }),
        1 => (any::<usize>(), 0usize..7).prop_map(|(pick, n)| Op::Truncate { pick, n }),
        3 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => (0u32..3, 0usize..3, any::<bool>(), prop::option::of(1u64..6))
            .prop_map(|(family, blocks, soft, ttl)| Op::Pin { family, blocks, soft, ttl }),
        1 => any::<usize>().prop_map(|pick| Op::Unpin { pick }),
        1 => (0u64..3).prop_map(|step| Op::Clock { step }),
    ]
}

fn prompt(family: u32, shared: usize, tail: usize, salt: u32) -> Vec<u32> {
    (0..shared as u32).map(|i| 1000 * family + i).chain((0..tail as u32).map(|i| 50_000 + salt * 10 + i)).collect()
}

/// What a slot holds: the extra key and token prefix whose KV was computed into it, or an
/// opaque id for tokens appended without ids.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kv {
    Prefix(Option<u64>, Vec<u32>),
    Opaque(u64),
}

struct World {
    pool: BlockPool,
    /// Per live sequence: its token ids (None once a plain append hid them) and extra key.
    seqs: HashMap<u64, (Option<Vec<u32>>, Option<u64>)>,
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
                let t = self.pool.table(s).unwrap();
                (s, t.blocks().to_vec(), t.num_tokens())
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
        self.pool.table(SeqId(seq)).unwrap().slot_of(pos, BS)
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

    /// Record what the slots of positions `from..` of `seq` now hold.
    fn write(&mut self, seq: u64, from: usize, slots: &[i64]) {
        let (tokens, extra) = self.seqs[&seq].clone();
        for (j, &slot) in slots.iter().enumerate() {
            let v = match &tokens {
                Some(t) => Kv::Prefix(extra, t[..from + j + 1].to_vec()),
                None => {
                    self.next += 1;
                    Kv::Opaque(self.next)
                }
            };
            self.kv.insert(slot, v);
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), pykvpool::KvError> {
        match *op {
            Op::Admit { family, shared, tail, extra } => {
                self.next += 1;
                let seq = self.next;
                let tokens = prompt(family, shared, tail, seq as u32);
                let extra = extra.then_some(7);
                let (mut slots, mut cow) = (Vec::new(), Vec::new());
                let cached = self.pool.add_sequence_tokens_cow(SeqId(seq), &tokens, extra, &mut slots, &mut cow)?;
                assert!(cached <= tokens.len().saturating_sub(1));
                self.seqs.insert(seq, (Some(tokens.clone()), extra));
                self.copy(&cow);
                for p in 0..cached {
                    let want = Kv::Prefix(extra, tokens[..p + 1].to_vec());
                    assert_eq!(self.kv.get(&self.slot(seq, p)), Some(&want), "wrong KV reused at token {p}");
                }
                self.write(seq, cached, &slots);
            }
            Op::AppendTokens { pick, n } | Op::AppendPlain { pick, n } => {
                let Some(seq) = self.pick(pick) else { return Ok(()) };
                let from = self.pool.seq_len(SeqId(seq)).unwrap();
                let new: Vec<u32> = (0..n as u32).map(|i| 70_000 + seq as u32 * 10 + i).collect();
                let (mut slots, mut cow) = (Vec::new(), Vec::new());
                if matches!(op, Op::AppendTokens { .. }) {
                    self.pool.append_tokens(SeqId(seq), &new, &mut slots, &mut cow)?;
                    if let Some(t) = self.seqs.get_mut(&seq).unwrap().0.as_mut() {
                        t.extend(&new);
                    }
                } else {
                    self.pool.append(SeqId(seq), n, &mut slots, &mut cow)?;
                    if n > 0 {
                        self.seqs.get_mut(&seq).unwrap().0 = None;
                    }
                }
                self.copy(&cow);
                self.write(seq, from, &slots);
            }
            Op::Fork { pick } => {
                let Some(seq) = self.pick(pick) else { return Ok(()) };
                self.next += 1;
                self.pool.fork(SeqId(seq), SeqId(self.next))?;
                let s = self.seqs[&seq].clone();
                self.seqs.insert(self.next, s);
            }
            Op::Truncate { pick, n } => {
                let Some(seq) = self.pick(pick) else { return Ok(()) };
                self.pool.truncate(SeqId(seq), n)?;
                let len = self.pool.seq_len(SeqId(seq)).unwrap();
                if let Some(t) = self.seqs.get_mut(&seq).unwrap().0.as_mut() {
                    t.truncate(len);
                }
            }
            Op::Free { pick } => {
                let Some(seq) = self.pick(pick) else { return Ok(()) };
                self.pool.free(SeqId(seq))?;
                self.seqs.remove(&seq);
            }
            Op::Pin { family, blocks, soft, ttl } => {
                let now = self.pool.cache_stats().unwrap().clock;
                let tokens = prompt(family, blocks * BS, 0, 0);
                let id = self.pool.pin_prefix_tokens(&tokens, None, soft.then_some(3), ttl.map(|t| now + t))?;
                self.pins.push(id);
            }
            Op::Unpin { pick } => {
                let id = if self.pins.is_empty() { 999 } else { self.pins[pick % self.pins.len()] };
                self.pool.unpin(id)?;
            }
            Op::Clock { step } => {
                let now = self.pool.cache_stats().unwrap().clock;
                self.pool.set_clock(now + step)?;
            }
        }
        Ok(())
    }
}

fn run(ops: &[Op], cfg: CacheConfig) {
    let mut w = World {
        pool: BlockPool::with_prefix_cache(BLOCKS, BS, cfg).unwrap(),
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
    }
    let ids: Vec<u64> = w.seqs.keys().copied().collect();
    for s in ids {
        w.pool.free(SeqId(s)).unwrap();
    }
    w.pool.check_invariants().unwrap();
    assert_eq!(w.pool.num_free_blocks(), BLOCKS - w.pool.cache_stats().unwrap().pinned_blocks);
}

fn policy() -> impl Strategy<Value = EvictionPolicy> {
    prop::sample::select(EvictionPolicy::ALL.to_vec())
}

// 256 programs per test by default; `PROPTEST_CASES=100000 cargo test --release --test
// prefix_model` for a soak.
proptest! {
    #[test]
    fn reused_kv_is_exact(ops in prop::collection::vec(op(), 1..60), policy in policy(), cow in any::<bool>()) {
        run(&ops, CacheConfig { policy, cow_partial_hit: cow, ..CacheConfig::default() });
    }

    #[test]
    fn reused_kv_is_exact_under_collisions(ops in prop::collection::vec(op(), 1..60), policy in policy(), cow in any::<bool>()) {
        let hasher = BlockHasher::Truncated { bits: 2 };
        run(&ops, CacheConfig { policy, cow_partial_hit: cow, hasher, ..CacheConfig::default() });
    }
}
