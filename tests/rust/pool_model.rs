//! Model-based property test of [`BlockPool`]: random programs over the operation alphabet
//! (add, append, step, fork, truncate, free), failing operations included, checked after
//! every operation against a naive reference model.
//!
//! The model is deliberately dumb and independent of the pool's internals: per sequence a
//! `Vec` of physical block ids and a token count, a refcount map, a copy-on-write counter,
//! and a simulated KV store (slot -> token value) that the "caller" writes through the
//! returned slots and copy-on-write pairs. Which free block the pool hands out is the pool's
//! choice: the model learns the id from the answer and checks that it was free and is now
//! referenced once. Everything else (errors with their numbers, slots, tables, lengths,
//! copy-on-write pairs, statistics, exports, the KV contents every live sequence reads
//! back) is predicted and compared. A failed operation must leave the pool identical.
//!
//! `PROPTEST_CASES=100000 cargo test --release --test pool_model` runs a longer soak.

#[path = "support/flat.rs"]
mod flat;
use flat::Flat;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use pykvpool::pool::StepOutput;
use pykvpool::pool::table_sync::TableSync;
use pykvpool::{BlockId, BlockPool, KvError, PoolStats, SeqId};

/// Sequence ids are drawn from `0..ID_RANGE`, small enough for unknown and duplicate ids.
const ID_RANGE: u64 = 8;
/// Token counts go up to this, well past the capacity of the small pools generated.
const MAX_TOKENS: usize = 40;

/// How an operation names a sequence: mostly a live one (resolved when the operation runs,
/// so that programs stay meaningful while they shrink), sometimes any id at all.
#[derive(Clone, Copy, Debug)]
enum Pick {
    Live(usize),
    Any(u64),
}

/// One operation of a generated program, ids still unresolved.
#[derive(Clone, Debug)]
enum Gen {
    Add(Pick, usize),
    Append(Pick, usize),
    Step(Vec<(Pick, usize)>, Option<usize>),
    Fork(Pick, Pick),
    Truncate(Pick, usize),
    Free(Pick),
}

#[derive(Clone, Debug)]
enum Op {
    Add {
        seq: u64,
        len: usize,
    },
    Append {
        seq: u64,
        n: usize,
    },
    /// `counts.len() != seqs.len()` is a deliberate malformed batch.
    Step {
        seqs: Vec<u64>,
        counts: Vec<usize>,
    },
    Fork {
        parent: u64,
        child: u64,
    },
    Truncate {
        seq: u64,
        n: usize,
    },
    Free {
        seq: u64,
    },
}

fn pick(live_weight: u32, any_weight: u32) -> impl Strategy<Value = Pick> + Clone {
    prop_oneof![
        live_weight => any::<usize>().prop_map(Pick::Live),
        any_weight => (0..ID_RANGE).prop_map(Pick::Any),
    ]
}

fn gen_strategy() -> impl Strategy<Value = Gen> {
    // Existing sequences for most operations; mostly new ids for add and fork targets.
    let live = pick(8, 1);
    let fresh = pick(1, 4);
    let n = prop_oneof![5 => 0..=6usize, 1 => 0..=MAX_TOKENS];
    prop_oneof![
        4 => (fresh.clone(), n.clone()).prop_map(|(p, len)| Gen::Add(p, len)),
        4 => (live.clone(), n.clone()).prop_map(|(p, n)| Gen::Append(p, n)),
        5 => (proptest::collection::vec((live.clone(), n.clone()), 0..6), prop::option::weighted(0.05, 0..6usize))
            .prop_map(|(v, bad_len)| Gen::Step(v, bad_len)),
        // Pure decode batches (every count 1): the pool's one-pass path when nothing is shared.
        3 => proptest::collection::vec(live.clone(), 0..7)
            .prop_map(|v| Gen::Step(v.into_iter().map(|p| (p, 1)).collect(), None)),
        4 => (live.clone(), fresh).prop_map(|(p, c)| Gen::Fork(p, c)),
        2 => (live.clone(), n).prop_map(|(p, n)| Gen::Truncate(p, n)),
        1 => live.prop_map(Gen::Free),
    ]
}

impl Gen {
    /// Resolve picks against the sequences live now.
    fn resolve(&self, live: &[u64]) -> Op {
        let id = |p: &Pick| match *p {
            Pick::Live(i) if !live.is_empty() => live[i % live.len()],
            Pick::Live(i) => i as u64 % ID_RANGE,
            Pick::Any(s) => s,
        };
        match self {
            Gen::Add(p, len) => Op::Add { seq: id(p), len: *len },
            Gen::Append(p, n) => Op::Append { seq: id(p), n: *n },
            Gen::Step(v, bad_len) => {
                let seqs: Vec<u64> = v.iter().map(|(p, _)| id(p)).collect();
                let mut counts: Vec<usize> = v.iter().map(|(_, n)| *n).collect();
                if let Some(k) = bad_len {
                    // A malformed batch: as many counts as asked, but never the right number.
                    counts.resize(if *k == seqs.len() { k + 1 } else { *k }, 1);
                }
                Op::Step { seqs, counts }
            }
            Gen::Fork(p, c) => Op::Fork { parent: id(p), child: id(c) },
            Gen::Truncate(p, n) => Op::Truncate { seq: id(p), n: *n },
            Gen::Free(p) => Op::Free { seq: id(p) },
        }
    }
}

/// The reference model.
#[derive(Clone, Debug)]
struct Model {
    num_blocks: usize,
    bs: usize,
    /// seq -> (physical blocks, tokens)
    seqs: BTreeMap<u64, (Vec<u32>, usize)>,
    /// Referenced blocks only; absent means free.
    refc: HashMap<u32, u32>,
    cow_copies: u64,
    /// Simulated KV store written by the caller: slot -> token value.
    store: HashMap<i64, u64>,
    /// seq -> value of each of its tokens, what reading the KV back must give.
    contents: BTreeMap<u64, Vec<u64>>,
    next_value: u64,
}

/// What a failed operation must report.
#[derive(Debug)]
enum Expect {
    Exhausted { requested: usize, free: usize },
    Unknown(u64),
    Duplicate(u64),
    Invalid,
}

fn check_error(got: &KvError, want: &Expect) -> Result<(), TestCaseError> {
    let ok = match (got, want) {
        (KvError::PoolExhausted { requested, free }, Expect::Exhausted { requested: r, free: f }) => {
            requested == r && free == f
        }
        (KvError::UnknownSequence(a), Expect::Unknown(b)) => a == b,
        (KvError::DuplicateSequence(a), Expect::Duplicate(b)) => a == b,
        (KvError::InvalidArgument(msg), Expect::Invalid) => !msg.is_empty(),
        _ => false,
    };
    prop_assert!(ok, "error {:?}, expected {:?}", got, want);
    Ok(())
}

impl Model {
    fn new(num_blocks: usize, bs: usize) -> Self {
        Self {
            num_blocks,
            bs,
            seqs: BTreeMap::new(),
            refc: HashMap::new(),
            cow_copies: 0,
            store: HashMap::new(),
            contents: BTreeMap::new(),
            next_value: 0,
        }
    }

    fn free_blocks(&self) -> usize {
        self.num_blocks - self.refc.len()
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.bs)
    }

    fn slot(&self, block: u32, pos: usize) -> i64 {
        block as i64 * self.bs as i64 + (pos % self.bs) as i64
    }

    fn decref(&mut self, b: u32) {
        let rc = self.refc.get_mut(&b).expect("model decref of a free block");
        *rc -= 1;
        if *rc == 0 {
            self.refc.remove(&b);
        }
    }

    /// Blocks a sequence of appends needs, in order: growth plus one copy for a partly
    /// filled last block that is still shared when its turn comes (an earlier copy in the
    /// same batch may have made it private).
    fn plan_need(&self, appends: &[(u64, usize)]) -> usize {
        let mut refc = self.refc.clone();
        let mut need = 0;
        for &(seq, n) in appends {
            if n == 0 {
                continue;
            }
            let (table, len) = &self.seqs[&seq];
            need += self.blocks_for(len + n) - table.len();
            if len % self.bs != 0 {
                let last = *table.last().unwrap();
                let rc = refc.get_mut(&last).unwrap();
                if *rc > 1 {
                    *rc -= 1;
                    need += 1;
                }
            }
        }
        need
    }

    /// Apply a successful append of `n` tokens to `seq` (a new sequence when `seq` is not
    /// in the model), checking the pool's `slots` and consuming its copy-on-write pairs
    /// from `cow[*ci..]`.
    fn apply_append(
        &mut self,
        seq: u64,
        n: usize,
        slots: &[i64],
        cow: &[(BlockId, BlockId)],
        ci: &mut usize,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(slots.len(), n, "slot count of {} new tokens", n);
        let (mut table, len) = self.seqs.get(&seq).cloned().unwrap_or_default();
        if n == 0 {
            self.seqs.insert(seq, (table, len));
            self.contents.entry(seq).or_default();
            return Ok(());
        }
        let bs = self.bs;
        if len % bs != 0 {
            let last = *table.last().unwrap();
            if self.refc[&last] > 1 {
                prop_assert!(*ci < cow.len(), "no copy-on-write pair for shared partial {}", last);
                let (src, dst) = cow[*ci];
                *ci += 1;
                prop_assert_eq!(src.0, last);
                prop_assert!((dst.0 as usize) < self.num_blocks);
                prop_assert!(!self.refc.contains_key(&dst.0), "copy target {} was not free", dst.0);
                // The caller copies the filled slots of its own partial block.
                for off in 0..len % bs {
                    let v = self.store[&self.slot(src.0, off)];
                    self.store.insert(self.slot(dst.0, off), v);
                }
                self.decref(src.0);
                self.refc.insert(dst.0, 1);
                *table.last_mut().unwrap() = dst.0;
                self.cow_copies += 1;
            }
        }
        let contents = self.contents.entry(seq).or_default();
        for (i, &slot) in slots.iter().enumerate() {
            let pos = len + i;
            let bi = pos / bs;
            prop_assert!(slot >= 0 && slot < (self.num_blocks * bs) as i64, "slot {} out of range", slot);
            prop_assert_eq!((slot % bs as i64) as usize, pos % bs, "slot offset of token {}", pos);
            let block = (slot / bs as i64) as u32;
            if bi < table.len() {
                prop_assert_eq!(block, table[bi], "slot {} of token {} is not in its block", slot, pos);
            } else {
                prop_assert_eq!(bi, table.len());
                prop_assert!(!self.refc.contains_key(&block), "new block {} was not free", block);
                self.refc.insert(block, 1);
                table.push(block);
            }
            self.store.insert(slot, self.next_value);
            contents.push(self.next_value);
            self.next_value += 1;
        }
        self.seqs.insert(seq, (table, len + n));
        Ok(())
    }

    fn truncate(&mut self, seq: u64, n: usize) {
        let (mut table, len) = self.seqs.remove(&seq).unwrap();
        let keep = self.blocks_for(len - n);
        for b in table.drain(keep..).rev() {
            self.decref(b);
        }
        self.seqs.insert(seq, (table, len - n));
        self.contents.get_mut(&seq).unwrap().truncate(len - n);
    }

    fn free(&mut self, seq: u64) {
        let (table, _) = self.seqs.remove(&seq).unwrap();
        for b in table {
            self.decref(b);
        }
        self.contents.remove(&seq);
    }

    /// Statistics as defined in the issue, computed from the model.
    fn stats(&self) -> PoolStats {
        let bs = self.bs;
        let mut fill: HashMap<u32, usize> = HashMap::new();
        let mut logical = 0u64;
        for (table, len) in self.seqs.values() {
            logical += *len as u64;
            for (i, &b) in table.iter().enumerate() {
                let f = (len - i * bs).min(bs);
                let e = fill.entry(b).or_insert(0);
                *e = (*e).max(f);
            }
        }
        let stored: u64 = fill.values().map(|&f| f as u64).sum();
        let used = self.refc.len();
        let capacity = (used * bs) as u64;
        PoolStats {
            block_size: bs,
            total_blocks: self.num_blocks,
            free_blocks: self.free_blocks(),
            used_blocks: used,
            num_seqs: self.seqs.len(),
            logical_tokens: logical,
            stored_tokens: stored,
            shared_blocks: self.refc.values().filter(|&&c| c > 1).count(),
            cow_copies: self.cow_copies,
            empty_slots: capacity - stored,
            utilization: if capacity == 0 { 1.0 } else { stored as f64 / capacity as f64 },
            idle_cached_blocks: 0,
            group_blocks: vec![used],
            group_stored_tokens: vec![stored],
            group_holes: vec![0],
        }
    }
}

/// Everything observable about a pool, for "a failed operation changed nothing".
#[derive(Debug, PartialEq)]
struct Snapshot {
    stats: PoolStats,
    tables: Vec<(u64, Vec<BlockId>, usize)>,
    refcounts: Vec<u32>,
    /// The blocks the next allocations hand out, in order (free-list order).
    next_blocks: Vec<BlockId>,
}

fn snapshot(pool: &BlockPool) -> Snapshot {
    let tables = pool
        .seq_ids()
        .into_iter()
        .map(|s| {
            let t = pool.blocks_of(s).unwrap();
            (s.0, t, pool.seq_len(s).unwrap())
        })
        .collect();
    let refcounts = (0..pool.num_blocks() as u32).map(|b| pool.refcount(BlockId(b)).unwrap()).collect();
    // Taken on a clone: admit one sequence filling every free block and read its table.
    let mut probe = pool.clone();
    let all = SeqId(u64::MAX);
    probe.add_sequence_flat(all, probe.num_free_blocks() * probe.block_size(), &mut Vec::new()).unwrap();
    let next_blocks = probe.blocks_of(all).unwrap();
    Snapshot { stats: pool.stats(), tables, refcounts, next_blocks }
}

/// Full comparison of pool and model, exports included.
fn compare(pool: &BlockPool, model: &Model) -> Result<(), TestCaseError> {
    if let Err(e) = pool.check_invariants() {
        return Err(TestCaseError::fail(format!("check_invariants: {e}")));
    }
    let ids: Vec<SeqId> = model.seqs.keys().map(|&s| SeqId(s)).collect();
    prop_assert_eq!(pool.seq_ids(), ids.clone());
    for (&s, (table, len)) in &model.seqs {
        let t = pool.blocks_of(SeqId(s)).unwrap();
        let got: Vec<u32> = t.iter().map(|b| b.0).collect();
        prop_assert_eq!(&got, table, "table of sequence {}", s);
        prop_assert_eq!(pool.seq_len(SeqId(s)).unwrap(), *len, "length of sequence {}", s);
        for n in [0, 1, model.bs, 2 * model.bs + 1] {
            prop_assert_eq!(
                pool.blocks_needed(SeqId(s), n).unwrap(),
                model.plan_need(&[(s, n)]),
                "blocks_needed({}, {})",
                s,
                n
            );
        }
        // Every live token reads back its own value through the slot mapping.
        let contents = &model.contents[&s];
        prop_assert_eq!(contents.len(), *len);
        for (pos, &v) in contents.iter().enumerate() {
            let slot = model.slot(table[pos / model.bs], pos);
            prop_assert_eq!(model.store.get(&slot), Some(&v), "token {} of sequence {} at slot {}", pos, s, slot);
        }
    }
    for b in 0..model.num_blocks as u32 {
        let want = model.refc.get(&b).copied().unwrap_or(0);
        prop_assert_eq!(pool.refcount(BlockId(b)).unwrap(), want, "refcount of block {}", b);
    }
    prop_assert_eq!(pool.num_free_blocks(), model.free_blocks());
    prop_assert_eq!(pool.stats(), model.stats());

    // Exports, against the model's tables.
    let width = model.seqs.values().map(|(t, _)| t.len()).max().unwrap_or(0);
    let mut padded = vec![0i32; ids.len() * width];
    pool.padded_tables_into(&ids, 0, width, -7, &mut padded).unwrap();
    let (indptr, indices, last, _) = pool.flashinfer_tables(&ids, 0).unwrap();
    prop_assert_eq!(indptr.len(), ids.len() + 1);
    prop_assert_eq!(indptr[0], 0);
    for (i, (table, len)) in model.seqs.values().enumerate() {
        let row = &padded[i * width..(i + 1) * width];
        for (j, &e) in row.iter().enumerate() {
            prop_assert_eq!(e, table.get(j).map_or(-7, |&b| b as i32));
        }
        let (a, b) = (indptr[i] as usize, indptr[i + 1] as usize);
        let want: Vec<i32> = table.iter().map(|&b| b as i32).collect();
        prop_assert_eq!(&indices[a..b], &want[..]);
        let want_last = if *len == 0 { 0 } else { len - (table.len() - 1) * model.bs };
        prop_assert_eq!(last[i] as usize, want_last);
    }
    prop_assert_eq!(indices.len(), indptr[ids.len()] as usize);
    Ok(())
}

/// A [`TableSync`] mirror of every live table, one row per sequence in id order.
struct Mirror {
    sync: TableSync,
    buf: Vec<i32>,
}

impl Mirror {
    fn new(num_blocks: usize) -> Self {
        let rows = ID_RANGE as usize;
        Self { sync: TableSync::new(rows, num_blocks, -1).unwrap(), buf: vec![-1; rows * num_blocks] }
    }

    /// Sync, check that the mirror equals the model's tables, return the entries written.
    fn check(&mut self, pool: &BlockPool, model: &Model) -> Result<usize, TestCaseError> {
        let ids: Vec<SeqId> = model.seqs.keys().map(|&s| SeqId(s)).collect();
        let written = match self.sync.sync(pool, 0, &ids, &mut self.buf) {
            Ok(w) => w,
            Err(e) => return Err(TestCaseError::fail(format!("sync: {e}"))),
        };
        let cols = self.sync.width();
        for (i, (table, _)) in model.seqs.values().enumerate() {
            for (j, &e) in self.buf[i * cols..(i + 1) * cols].iter().enumerate() {
                prop_assert_eq!(e, table.get(j).map_or(-1, |&b| b as i32), "mirror row {} col {}", i, j);
            }
        }
        Ok(written)
    }
}

/// The model's verdict on an operation that must fail, or `None` when it must succeed.
fn expected_error(model: &Model, op: &Op) -> Option<Expect> {
    let known = |s: &u64| model.seqs.contains_key(s);
    let exhausted = |need: usize| {
        (need > model.free_blocks()).then(|| Expect::Exhausted { requested: need, free: model.free_blocks() })
    };
    match op {
        Op::Add { seq, len } => {
            if known(seq) {
                return Some(Expect::Duplicate(*seq));
            }
            exhausted(model.blocks_for(*len))
        }
        Op::Append { seq, n } => {
            if !known(seq) {
                return Some(Expect::Unknown(*seq));
            }
            exhausted(model.plan_need(&[(*seq, *n)]))
        }
        Op::Step { seqs, counts } => {
            if seqs.len() != counts.len() {
                return Some(Expect::Invalid);
            }
            let mut seen = BTreeSet::new();
            for s in seqs {
                if !known(s) {
                    return Some(Expect::Unknown(*s));
                }
                if !seen.insert(*s) {
                    return Some(Expect::Invalid);
                }
            }
            let batch: Vec<(u64, usize)> = seqs.iter().copied().zip(counts.iter().copied()).collect();
            exhausted(model.plan_need(&batch))
        }
        Op::Fork { parent, child } => {
            if known(child) {
                return Some(Expect::Duplicate(*child));
            }
            (!known(parent)).then_some(Expect::Unknown(*parent))
        }
        Op::Truncate { seq, n } => match model.seqs.get(seq) {
            None => Some(Expect::Unknown(*seq)),
            Some((_, len)) => (n > len).then_some(Expect::Invalid),
        },
        Op::Free { seq } => (!known(seq)).then_some(Expect::Unknown(*seq)),
    }
}

/// Run `op` on the pool; on success apply it to the model, checking the pool's outputs.
fn run_op(pool: &mut BlockPool, model: &mut Model, op: &Op) -> Result<Result<(), KvError>, TestCaseError> {
    let mut slots = Vec::new();
    let mut cow = Vec::new();
    let mut ci = 0;
    let r = match op {
        Op::Add { seq, len } => pool.add_sequence_flat(SeqId(*seq), *len, &mut slots),
        Op::Append { seq, n } => pool.append_flat(SeqId(*seq), *n, &mut slots, &mut cow),
        Op::Step { seqs, counts } => {
            let ids: Vec<SeqId> = seqs.iter().map(|&s| SeqId(s)).collect();
            let mut out = StepOutput::default();
            // Odd-length pure decode batches go through `step_decode`, the rest `step`.
            let r = if seqs.len() % 2 == 1 && counts.len() == seqs.len() && counts.iter().all(|&n| n == 1) {
                pool.step_decode(&ids, &mut out)
            } else {
                pool.step(&ids, counts, &mut out)
            };
            if r.is_ok() {
                let mut at = 0;
                for (i, (&s, &n)) in seqs.iter().zip(counts).enumerate() {
                    prop_assert!(at + n <= out.slots.len(), "step returned too few slots");
                    model.apply_append(s, n, &out.slots[at..at + n], &out.cow, &mut ci)?;
                    at += n;
                    prop_assert_eq!(out.seq_lens[i] as usize, model.seqs[&s].1, "seq_lens[{}]", i);
                }
                prop_assert_eq!(at, out.slots.len(), "step returned extra slots");
                prop_assert_eq!(out.seq_lens.len(), seqs.len());
                prop_assert_eq!(ci, out.cow.len(), "step returned extra copy-on-write pairs");
            }
            return Ok(r);
        }
        Op::Fork { parent, child } => pool.fork(SeqId(*parent), SeqId(*child)),
        Op::Truncate { seq, n } => pool.truncate(SeqId(*seq), *n),
        Op::Free { seq } => pool.free(SeqId(*seq)),
    };
    if r.is_ok() {
        match op {
            Op::Add { seq, len } => model.apply_append(*seq, *len, &slots, &[], &mut ci)?,
            Op::Append { seq, n } => model.apply_append(*seq, *n, &slots, &cow, &mut ci)?,
            Op::Fork { parent, child } => {
                let (table, len) = model.seqs[parent].clone();
                for b in &table {
                    *model.refc.get_mut(b).unwrap() += 1;
                }
                model.seqs.insert(*child, (table, len));
                let c = model.contents[parent].clone();
                model.contents.insert(*child, c);
            }
            Op::Truncate { seq, n } => model.truncate(*seq, *n),
            Op::Free { seq } => model.free(*seq),
            Op::Step { .. } => unreachable!(),
        }
        prop_assert_eq!(ci, cow.len(), "unexpected copy-on-write pairs {:?}", cow);
    }
    Ok(r)
}

/// Run a program (its operations resolved one by one against the model) and tear down.
/// One table mirror syncs after every operation, a second one only every `sync_period`
/// operations, so that it sees several changes of a table at once.
fn run_program(
    num_blocks: usize,
    bs: usize,
    sync_period: usize,
    len: usize,
    mut next_op: impl FnMut(usize, &Model) -> Op,
) -> Result<(), TestCaseError> {
    let mut pool = BlockPool::new(num_blocks, bs).unwrap();
    let mut model = Model::new(num_blocks, bs);
    let mut eager = Mirror::new(num_blocks);
    let mut lazy = Mirror::new(num_blocks);
    compare(&pool, &model)?;
    eager.check(&pool, &model)?;
    for step in 0..len {
        if step % sync_period == 0 {
            lazy.check(&pool, &model)?;
        }
        let op = &next_op(step, &model);
        let before = snapshot(&pool);
        let expect = expected_error(&model, op);
        match (run_op(&mut pool, &mut model, op)?, expect) {
            (Ok(()), None) => {
                compare(&pool, &model)?;
                eager.check(&pool, &model)?;
            }
            (Err(e), Some(want)) => {
                check_error(&e, &want).map_err(|f| TestCaseError::fail(format!("op {step} {op:?}: {f}")))?;
                prop_assert_eq!(&snapshot(&pool), &before, "op {} {:?} failed but changed the pool", step, op);
                // Nothing changed, so the mirror has nothing to write.
                compare(&pool, &model)?;
                prop_assert_eq!(eager.check(&pool, &model)?, 0, "op {} {:?}", step, op);
            }
            (got, want) => {
                prop_assert!(false, "op {} {:?}: pool gave {:?}, model expected {:?}", step, op, got, want);
            }
        }
    }
    // Teardown: freeing every sequence returns every block.
    for s in model.seqs.keys().copied().collect::<Vec<_>>() {
        pool.free(SeqId(s)).unwrap();
        model.free(s);
        compare(&pool, &model)?;
        eager.check(&pool, &model)?;
    }
    lazy.check(&pool, &model)?;
    prop_assert_eq!(pool.num_free_blocks(), num_blocks);
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 20_000, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_model(
        num_blocks in 1usize..=32,
        bs in 1usize..=6,
        sync_period in 1usize..=6,
        program in proptest::collection::vec(gen_strategy(), 1..80),
    ) {
        run_program(num_blocks, bs, sync_period, program.len(), |i, model| {
            let live: Vec<u64> = model.seqs.keys().copied().collect();
            program[i].resolve(&live)
        })?;
    }
}

/// Scenarios the random search must not miss, run as fixed programs through the same model.
#[test]
fn fixed_programs() {
    use Op::*;
    let programs: Vec<(usize, usize, Vec<Op>)> = vec![
        // Fork a partly filled sequence; both sides append in one step: one copy only.
        (
            8,
            4,
            vec![Add { seq: 0, len: 6 }, Fork { parent: 0, child: 1 }, Step { seqs: vec![0, 1], counts: vec![1, 1] }],
        ),
        // Full shared blocks are never copied.
        (6, 4, vec![Add { seq: 0, len: 8 }, Fork { parent: 0, child: 1 }, Append { seq: 1, n: 3 }]),
        // A block full for the parent but partial for a truncated child is copied.
        (
            6,
            4,
            vec![
                Add { seq: 0, len: 8 },
                Fork { parent: 0, child: 1 },
                Truncate { seq: 1, n: 2 },
                Append { seq: 1, n: 1 },
                Append { seq: 0, n: 1 },
            ],
        ),
        // Exhaustion counted with the copy: 1 free block, append needs copy + growth.
        (3, 2, vec![Add { seq: 0, len: 3 }, Fork { parent: 0, child: 1 }, Append { seq: 1, n: 2 }]),
        // Failing steps: duplicate, unknown, mismatched lengths, exhaustion.
        (
            4,
            2,
            vec![
                Add { seq: 0, len: 1 },
                Step { seqs: vec![0, 0], counts: vec![1, 1] },
                Step { seqs: vec![0, 5], counts: vec![1, 1] },
                Step { seqs: vec![0], counts: vec![1, 1] },
                Step { seqs: vec![0], counts: vec![40] },
                Truncate { seq: 0, n: 2 },
                Fork { parent: 3, child: 4 },
                Fork { parent: 0, child: 0 },
            ],
        ),
    ];
    for (nb, bs, ops) in programs {
        if let Err(e) = run_program(nb, bs, 3, ops.len(), |i, _| ops[i].clone()) {
            panic!("{ops:?}: {e}");
        }
    }
}

/// Lengths are exported as int32: growth past `MAX_SEQ_TOKENS` is refused as an invalid
/// argument before blocks are counted, whatever room the pool has; exactly at the limit
/// it is a matter of room.
#[test]
fn length_limit() {
    use pykvpool::pool::MAX_SEQ_TOKENS;
    let mut pool = BlockPool::new(4, 1 << 16).unwrap();
    let (mut slots, mut cow, mut out) = (Vec::new(), Vec::new(), StepOutput::default());
    let invalid = |r: Result<(), KvError>| matches!(r, Err(KvError::InvalidArgument(_)));
    assert!(invalid(pool.add_sequence_flat(SeqId(0), MAX_SEQ_TOKENS + 1, &mut slots)));
    pool.add_sequence_flat(SeqId(0), 5, &mut slots).unwrap();
    assert!(invalid(pool.append_flat(SeqId(0), MAX_SEQ_TOKENS - 4, &mut slots, &mut cow)));
    assert!(invalid(pool.step(&[SeqId(0)], &[MAX_SEQ_TOKENS - 4], &mut out)));
    assert!(invalid(pool.step(&[SeqId(0)], &[usize::MAX], &mut out)));
    assert!(pool.blocks_needed(SeqId(0), usize::MAX).is_err());
    let at_limit = pool.append_flat(SeqId(0), MAX_SEQ_TOKENS - 5, &mut slots, &mut cow);
    assert_eq!(at_limit, Err(KvError::PoolExhausted { requested: 32767, free: 3 }));
    assert_eq!((pool.seq_len(SeqId(0)).unwrap(), slots.len(), pool.num_free_blocks()), (5, 5, 3));
    pool.check_invariants().unwrap();
}
