//! A model of prefix caching on layer groups, written from the contract: abstract blocks
//! with refcounts, a (group, key) and a parent each, the per-group index, the free count
//! and the idle blocks, evicted by the policy's order of their uses (stored, hit, released,
//! numbered by one clock: `rust/prefix_cache/mod.rs` and `eviction.rs`); sequences as
//! per-group lists of `Option<block>`. A full group's blocks are stored as chains (a block
//! only after the block before it in its table, which becomes its parent; a broken chain
//! or a taken key stops the group's stores for that call) and only leaves are evicted; a
//! windowed group's blocks are stored one by one, without parents, and any idle one may be
//! evicted. The hit is
//! found by brute force over every hit length (not by `longest_hit`). Steps are applied
//! the way the contract orders them (every release of the batch first, then every growth;
//! a copy-on-write takes its copy, then drops the source) on a copy of the model; a take
//! with nothing free or idle refuses the whole call.
//!
//! Verification (the cache keeps token ids): a cached block serves a query's logical block
//! `i` only when its KV was computed from exactly the query's prefix through `i` (the same
//! token ids and extra key), in every group kind; under forced key collisions that is what
//! tells a hit from a miss. A windowed block is cached only while the token records of
//! every cached windowed block's prefix stay one record per key (the lineage: a block
//! whose prefix puts a second record under a key is not cached), within
//! `LINEAGE_TOKENS_PER_TOKEN * num_blocks * BS` token ids.

use std::collections::{BTreeMap, HashMap, VecDeque};

use pykvpool::pool::GroupSpec;
use pykvpool::prefix_cache::block_hash::ROOT_PARENT;
use pykvpool::prefix_cache::LINEAGE_TOKENS_PER_TOKEN;
use pykvpool::{BlockHasher, BlockKey, EvictionPolicy, KvError};

pub const BS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Err {
    Exhausted,
    Unknown,
    Duplicate,
    Invalid,
}

pub fn kind(e: &KvError) -> Err {
    match e {
        KvError::PoolExhausted { .. } => Err::Exhausted,
        KvError::UnknownSequence(_) => Err::Unknown,
        KvError::DuplicateSequence(_) => Err::Duplicate,
        KvError::InvalidArgument(_) => Err::Invalid,
        KvError::Invariant(m) => panic!("invariant: {m}"),
        KvError::Storage { message, .. } => panic!("a pool without tiers reported storage: {message}"),
    }
}

#[derive(Clone, Debug)]
pub struct MBlock {
    pub rc: u32,
    pub key: Option<(usize, BlockKey)>,
    /// The cached block before it in a full group's chain.
    pub parent: Option<usize>,
    /// Clock of the last use, of the store, and hits since the store.
    pub last_use: u64,
    pub stored_at: u64,
    pub hits: u64,
    /// What its KV was computed from: the prompt's extra key, its keys and token ids
    /// through this block.
    pub extra: Option<u64>,
    pub keys: Vec<BlockKey>,
    pub prefix: Vec<u32>,
    /// Tokens of KV it holds (a keyed prompt's last block may be partly filled).
    pub fill: usize,
    /// Hard pins covering it, and its soft pins' priorities by pin id.
    pub hard: u32,
    pub soft: BTreeMap<u64, u32>,
}

/// A pin: its blocks, its priority (None: hard) and its expiry on the cache's clock.
#[derive(Clone, Debug)]
pub struct MPin {
    pub blocks: Vec<usize>,
    pub priority: Option<u32>,
    pub expires_at: Option<u64>,
}

/// A cache event as the model expects it: `(kind, group, key, parent key, tokens, clock)`,
/// kinds as `CacheEventKind` (0 stored, 1 removed, 2 all cleared).
pub type MEvent = (u8, u32, BlockKey, Option<BlockKey>, u32, u64);

#[derive(Clone, Debug)]
pub struct MSeq {
    pub len: usize,
    pub frontier: usize,
    pub tables: Vec<Vec<Option<usize>>>,
    pub cursor: Option<(Vec<u32>, Vec<BlockKey>)>,
    pub extra: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MStats {
    pub queries: u64,
    pub query_blocks: u64,
    pub hit_blocks: u64,
    pub cow_hits: u64,
    pub query_tokens: u64,
    pub hit_tokens: u64,
    pub group_hit_blocks: Vec<u64>,
    pub stored: u64,
    pub evictions: u64,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub specs: Vec<GroupSpec>,
    pub blocks: Vec<MBlock>,
    pub free: usize,
    /// `(group, key, fill)` -> cached block: the fill is part of a block's identity.
    pub index: HashMap<(usize, BlockKey, usize), usize>,
    pub idle: VecDeque<usize>,
    pub seqs: HashMap<u64, MSeq>,
    pub stats: MStats,
    pub policy: EvictionPolicy,
    pub clock: u64,
    pub hasher: BlockHasher,
    pub num_blocks: usize,
    /// Successful operations (the cache's logical clock) and the events since the last drain.
    pub ops: u64,
    pub events: Vec<MEvent>,
    /// Copy-on-write partial hits are on; the copies the last admission made.
    pub cow: bool,
    pub last_copies: usize,
    /// The caller drives the clock (`set_clock`): operations no longer advance it.
    pub manual: bool,
    pub pins: BTreeMap<u64, MPin>,
    pub next_pin: u64,
}

pub fn keys_of(hasher: BlockHasher, tokens: &[u32], extra: Option<u64>) -> Vec<BlockKey> {
    let mut keys = Vec::new();
    hasher.chain_keys(ROOT_PARENT, tokens, BS, extra, &mut keys, &mut Vec::new());
    keys
}

/// A prompt looked up: token ids (with the extra key; `keys` of their full blocks), or
/// trusted block keys (`tokens` None; the last key may stand for a partly filled block).
#[derive(Clone, Copy, Debug)]
pub struct Q<'a> {
    pub keys: &'a [BlockKey],
    pub tokens: Option<&'a [u32]>,
    pub extra: Option<u64>,
    pub len: usize,
}

impl Q<'_> {
    /// Tokens of logical block `i`.
    pub fn fill(&self, i: usize) -> usize {
        BS.min(self.len - i * BS)
    }
}

impl Model {
    pub fn new(specs: Vec<GroupSpec>, num_blocks: usize, policy: EvictionPolicy, hasher: BlockHasher) -> Self {
        let g = specs.len();
        Self {
            specs,
            blocks: Vec::new(),
            free: num_blocks,
            index: HashMap::new(),
            idle: VecDeque::new(),
            seqs: HashMap::new(),
            stats: MStats { group_hit_blocks: vec![0; g], ..MStats::default() },
            policy,
            clock: 0,
            hasher,
            num_blocks,
            ops: 0,
            events: Vec::new(),
            manual: false,
            cow: false,
            last_copies: 0,
            pins: BTreeMap::new(),
            next_pin: 0,
        }
    }

    pub fn keys(&self, tokens: &[u32], extra: Option<u64>) -> Vec<BlockKey> {
        keys_of(self.hasher, tokens, extra)
    }

    /// A successful mutating operation: the cache's clock advances (unless the caller
    /// drives it) and pins that lapse by then go.
    pub fn end_op(&mut self) {
        if !self.manual {
            self.ops += 1;
        }
        self.expire();
    }

    fn expire(&mut self) {
        let due: Vec<u64> = self.pins.iter().filter(|(_, p)| p.expires_at.is_some_and(|t| t <= self.ops)).map(|(&id, _)| id).collect();
        for id in due {
            self.unpin(id).expect("a live pin");
        }
    }

    /// Idle blocks an allocation may evict: idle and not hard-pinned.
    pub fn evictable(&self) -> usize {
        self.idle.iter().filter(|&&m| self.blocks[m].hard == 0).count()
    }

    /// Blocks an allocation can take now: free, or evictable.
    pub fn available(&self) -> usize {
        self.free + self.evictable()
    }

    /// Pin every block a hit of all the full blocks of `tokens` needs, in every group;
    /// `Invalid` when one is not cached validly, for no full block, or for an expiry not
    /// after the clock. Returns the pin id (from 1, never reused).
    pub fn pin(&mut self, q: Q<'_>, priority: Option<u32>, expires_at: Option<u64>) -> Result<u64, Err> {
        let n = q.keys.len();
        let mut blocks = Vec::new();
        for g in 0..self.specs.len() {
            for i in self.needed(g, n * BS) {
                blocks.push(self.valid(g, q, i).ok_or(Err::Invalid)?);
            }
        }
        if n == 0 || expires_at.is_some_and(|t| t <= self.ops) {
            return Err(Err::Invalid);
        }
        self.next_pin += 1;
        let id = self.next_pin;
        for &m in &blocks {
            match priority {
                None => self.blocks[m].hard += 1,
                Some(p) => {
                    self.blocks[m].soft.insert(id, p);
                }
            }
        }
        self.pins.insert(id, MPin { blocks, priority, expires_at });
        Ok(id)
    }

    pub fn unpin(&mut self, id: u64) -> Result<(), Err> {
        let pin = self.pins.remove(&id).ok_or(Err::Invalid)?;
        for m in pin.blocks {
            match pin.priority {
                None => self.blocks[m].hard -= 1,
                Some(_) => {
                    self.blocks[m].soft.remove(&id);
                }
            }
        }
        Ok(())
    }

    /// The caller sets the clock (never back): pins lapse by it.
    pub fn set_clock(&mut self, t: u64) -> Result<(), Err> {
        if t < self.ops {
            return Err(Err::Invalid);
        }
        (self.manual, self.ops) = (true, t);
        self.expire();
        Ok(())
    }

    fn emit(&mut self, kind: u8, m: usize) {
        let b = &self.blocks[m];
        let (g, key) = b.key.expect("an event names a cached block");
        let parent = b.parent.map(|p| self.blocks[p].key.expect("a parent is cached").1);
        self.events.push((kind, g as u32, key, parent, b.fill as u32, self.ops));
    }

    /// The block of group `g` that serves logical block `i` of `q`, if cached: for token ids
    /// one computed from exactly the prompt through `i` (ids and extra key); for trusted
    /// keys one stored under the same keys through `i` without an extra key (a windowed
    /// group's block: under its own key), of the same fill.
    pub fn valid(&self, g: usize, q: Q<'_>, i: usize) -> Option<usize> {
        let m = *self.index.get(&(g, q.keys[i], q.fill(i)))?;
        let b = &self.blocks[m];
        let ok = match q.tokens {
            Some(t) => b.extra == q.extra && t.get(..(i + 1) * BS) == Some(&b.prefix[..]),
            None => b.extra.is_none() && (self.specs[g].is_windowed() || b.keys == q.keys[..=i]),
        };
        ok.then_some(m)
    }

    /// Whether a windowed block standing on the prefix `keys`, `tokens` (with `extra`) keeps
    /// the lineage one record per key within its budget.
    fn lineage_admits(&self, keys: &[BlockKey], tokens: &[u32], extra: Option<u64>) -> bool {
        // key -> (the key before it, extra key, its block's ids)
        type Record<'a> = (Option<BlockKey>, Option<u64>, &'a [u32]);
        let mut records: HashMap<BlockKey, Record<'_>> = HashMap::new();
        let standing = self.blocks.iter().filter(|b| !b.prefix.is_empty() && b.key.is_some_and(|(g, _)| self.specs[g].is_windowed()));
        let prefixes = standing.map(|b| (&b.keys[..], &b.prefix[..], b.extra)).chain(std::iter::once((keys, tokens, extra)));
        for (ks, ts, e) in prefixes {
            for (j, &k) in ks.iter().enumerate() {
                let rec = (j.checked_sub(1).map(|p| ks[p]), e, &ts[j * BS..(j + 1) * BS]);
                if *records.entry(k).or_insert(rec) != rec {
                    return false;
                }
            }
        }
        records.len() * BS <= LINEAGE_TOKENS_PER_TOKEN * self.num_blocks * BS
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The idle blocks an eviction may take now (not hard-pinned, and no cached block has
    /// them as parent), in the order the policy evicts them.
    pub fn eviction_order(&self) -> Vec<usize> {
        let parents: Vec<usize> = self.blocks.iter().filter(|b| b.key.is_some()).filter_map(|b| b.parent).collect();
        let mut v: Vec<usize> = self.idle.iter().copied().filter(|m| !parents.contains(m) && self.blocks[*m].hard == 0).collect();
        v.sort_by_key(|&m| {
            let b = &self.blocks[m];
            match self.policy {
                EvictionPolicy::Lru => (b.last_use, 0),
                EvictionPolicy::Priority => (b.soft.values().copied().max().unwrap_or(0) as u64, b.last_use),
                EvictionPolicy::Fifo => (b.stored_at, 0),
                EvictionPolicy::Lfu => (b.hits, b.last_use),
            }
        });
        v
    }

    fn take(&mut self) -> Result<usize, Err> {
        if self.free > 0 {
            self.free -= 1;
        } else {
            let v = *self.eviction_order().first().ok_or(Err::Exhausted)?;
            self.idle.retain(|&x| x != v);
            self.emit(1, v);
            self.blocks[v].soft.clear();
            let (g, k) = self.blocks[v].key.take().expect("idle blocks are cached");
            self.blocks[v].parent = None;
            self.index.remove(&(g, k, self.blocks[v].fill));
            self.stats.evictions += 1;
        }
        self.blocks.push(MBlock { rc: 1, key: None, parent: None, last_use: 0, stored_at: 0, hits: 0, extra: None, keys: Vec::new(), prefix: Vec::new(), fill: 0, hard: 0, soft: BTreeMap::new() });
        Ok(self.blocks.len() - 1)
    }

    fn release(&mut self, m: usize) {
        let t = self.tick();
        let b = &mut self.blocks[m];
        b.rc -= 1;
        if b.rc == 0 {
            if b.key.is_some() {
                b.last_use = t;
                self.idle.push_back(m);
            } else {
                self.free += 1;
            }
        }
    }

    /// An admission's hit takes cached block `m` (a use).
    fn hold(&mut self, m: usize) {
        if self.blocks[m].rc == 0 {
            let at = self.idle.iter().position(|&x| x == m).expect("refcount 0 cached block is idle");
            self.idle.remove(at);
        }
        let t = self.tick();
        let b = &mut self.blocks[m];
        b.rc += 1;
        b.hits += 1;
        b.last_use = t;
    }

    /// Store the blocks of `tables` from logical block `from` on under `q.keys`: in a full
    /// group as a chain, in a windowed group each block that is not cached yet and (for
    /// token ids) that the lineage admits.
    fn register(&mut self, tables: &[Vec<Option<usize>>], q: Q<'_>, from: usize) {
        for (g, t) in tables.iter().enumerate() {
            let windowed = self.specs[g].is_windowed();
            for (i, &key) in q.keys.iter().enumerate().skip(from) {
                let Some(m) = t.get(i).copied().flatten() else { continue };
                let fill = q.fill(i);
                if self.blocks[m].key == Some((g, key)) && self.blocks[m].fill == fill {
                    continue;
                }
                let parent = match (windowed, i) {
                    (true, _) | (false, 0) => None,
                    (false, _) => match t[i - 1] {
                        Some(p) if self.blocks[p].key == Some((g, q.keys[i - 1])) && self.blocks[p].fill == BS => Some(p),
                        _ => break,
                    },
                };
                let prefix = q.tokens.map_or(&[][..], |t| &t[..(i + 1) * BS]);
                let taken = self.blocks[m].key.is_some() || self.index.contains_key(&(g, key, fill));
                let lineage = !windowed || q.tokens.is_none() || self.lineage_admits(&q.keys[..=i], prefix, q.extra);
                if taken || !lineage {
                    if windowed {
                        continue;
                    }
                    break;
                }
                self.index.insert((g, key, fill), m);
                let t = self.tick();
                let b = &mut self.blocks[m];
                (b.key, b.parent, b.stored_at, b.last_use, b.hits) = (Some((g, key)), parent, t, t, 0);
                (b.extra, b.keys, b.prefix, b.fill) = (q.extra, q.keys[..=i].to_vec(), prefix.to_vec(), fill);
                self.stats.stored += 1;
                self.emit(0, m);
            }
        }
    }

    /// Logical blocks group `g` needs before token position `p`.
    fn needed(&self, g: usize, p: usize) -> Vec<usize> {
        self.specs[g].needed_before(p, BS).into_iter().flatten().collect()
    }

    /// The longest prefix of at most `max` blocks cached validly for every group, by trying
    /// every length.
    pub fn longest(&self, q: Q<'_>, max: usize) -> usize {
        let ok = |h: usize| (0..self.specs.len()).all(|g| self.needed(g, h * BS).iter().all(|&i| self.valid(g, q, i).is_some()));
        (0..=max).rev().find(|&h| ok(h)).unwrap_or(0)
    }

    /// Admit `seq` with a prompt of token ids.
    pub fn admit(&mut self, seq: u64, tokens: &[u32], extra: Option<u64>) -> Result<usize, Err> {
        let keys = self.keys(tokens, extra);
        self.admit_q(seq, Q { keys: &keys, tokens: Some(tokens), extra, len: tokens.len() })
    }

    /// Admit `seq` with the block keys of a `len`-token prompt.
    pub fn admit_keys(&mut self, seq: u64, keys: &[BlockKey], len: usize) -> Result<usize, Err> {
        if self.seqs.contains_key(&seq) {
            return Err(Err::Duplicate);
        }
        if keys.len() != len.div_ceil(BS) {
            return Err(Err::Invalid);
        }
        self.admit_q(seq, Q { keys, tokens: None, extra: None, len })
    }

    /// The admission: the largest valid hit (before and after the last-token rule), a
    /// copy-on-write partial hit where allowed, the capacity check, then holds, uses,
    /// growth, copies and stores in the contract's order.
    fn admit_q(&mut self, seq: u64, q: Q<'_>) -> Result<usize, Err> {
        if self.seqs.contains_key(&seq) {
            return Err(Err::Duplicate);
        }
        let (len, g_count, full) = (q.len, self.specs.len(), q.keys.len());
        let found = self.longest(q, full);
        let cap = (len.saturating_sub(1) / BS).min(full);
        let hb = if found <= cap { found } else { self.longest(q, cap) };
        let last = len.saturating_sub(1);
        // A copy-on-write partial hit: the last-token rule left out block `hb`, which the
        // prompt fills, and every block the query at the last token needs is cached.
        let copies = if self.cow && q.tokens.is_some() && last > hb * BS && last / BS == hb && hb < full { self.copies(q, hb, last) } else { None };
        let p = if copies.is_some() { last } else { hb * BS };
        let mut held = Vec::new();
        for g in 0..g_count {
            for i in self.needed(g, p).into_iter().filter(|&i| i < hb) {
                held.push((g, i, self.valid(g, q, i).expect("a valid hit")));
            }
        }
        let copied = copies.iter().flatten().map(|c| c.1);
        let mut revived: Vec<usize> = held.iter().map(|h| h.2).chain(copied).filter(|&m| self.blocks[m].rc == 0 && self.blocks[m].hard == 0).collect();
        revived.sort_unstable();
        revived.dedup();
        let need = g_count * (len.div_ceil(BS) - hb);
        if need > self.available() - revived.len() {
            return Err(Err::Exhausted);
        }
        let mut tables = vec![vec![None; hb]; g_count];
        for &(g, i, m) in &held {
            self.hold(m);
            tables[g][i] = Some(m);
            self.stats.group_hit_blocks[g] += 1;
        }
        let copies = copies.unwrap_or_default();
        for &(_, m) in &copies {
            self.hold(m);
        }
        // A full group's cached chain past the hit is hit too (a use), though not taken.
        let full_groups: Vec<usize> = (0..g_count).filter(|&g| !self.specs[g].is_windowed()).collect();
        for g in full_groups {
            let mut prev = None;
            for i in 0..full {
                let Some(m) = self.valid(g, q, i) else { break };
                if self.blocks[m].parent != prev {
                    break;
                }
                prev = Some(m);
                if i >= hb && !copies.iter().any(|c| c.1 == m) {
                    let t = self.tick();
                    let b = &mut self.blocks[m];
                    b.hits += 1;
                    b.last_use = t;
                }
            }
        }
        for t in &mut tables {
            self.grow(t, hb * BS, len - hb * BS).expect("checked");
        }
        for &(_, m) in &copies {
            self.release(m);
        }
        self.last_copies = copies.len();
        let cached = if copies.is_empty() { hb * BS } else { len - 1 };
        self.register(&tables, q, hb);
        let s = &mut self.stats;
        s.queries += 1;
        s.query_blocks += full as u64;
        s.hit_blocks += found as u64;
        s.query_tokens += len as u64;
        s.hit_tokens += cached as u64;
        s.cow_hits += !copies.is_empty() as u64;
        let cursor = q.tokens.map(|t| (t.to_vec(), q.keys.to_vec()));
        self.seqs.insert(seq, MSeq { len, frontier: cached, tables, cursor, extra: q.extra });
        self.end_op();
        Ok(cached)
    }

    /// The copy sources of a partial hit at token `p` past `hb` blocks: `(group, block
    /// hb)` of every group that needs it, or None unless every block the query at `p`
    /// needs is cached validly in every group.
    fn copies(&self, q: Q<'_>, hb: usize, p: usize) -> Option<Vec<(usize, usize)>> {
        let mut out = Vec::new();
        for g in 0..self.specs.len() {
            for i in self.needed(g, p) {
                let m = self.valid(g, q, i)?;
                if i == hb {
                    out.push((g, m));
                }
            }
        }
        Some(out)
    }

    fn grow(&mut self, t: &mut Vec<Option<usize>>, len: usize, n: usize) -> Result<(), Err> {
        let off = len % BS;
        let mut w = 0;
        if off != 0 && n > 0 {
            let last = t.len() - 1;
            match t[last] {
                Some(b) if self.blocks[b].rc > 1 || self.blocks[b].key.is_some() => {
                    let dst = self.take()?;
                    self.release(b);
                    t[last] = Some(dst);
                }
                Some(_) => {}
                None => t[last] = Some(self.take()?),
            }
            w = (BS - off).min(n);
        }
        while w < n {
            t.push(Some(self.take()?));
            w += BS.min(n - w);
        }
        Ok(())
    }

    /// A batched growth (the cursor is dropped unless `keep_cursor`). The capacity rule:
    /// the blocks the growths take (new blocks, copies, filled holes) are at most the free
    /// and idle blocks plus those the batch's window releases drop to zero references (a
    /// copy's source dropped after its copy is not counted, as in `BlockPool`).
    pub fn step(&mut self, seqs: &[u64], counts: &[usize], keep_cursor: bool) -> Result<(), Err> {
        let mut seen = Vec::new();
        for &s in seqs {
            if !self.seqs.contains_key(&s) {
                return Err(Err::Unknown);
            }
            if seen.contains(&s) {
                return Err(Err::Invalid);
            }
            seen.push(s);
        }
        let mut m = self.clone();
        let mut gained = 0;
        for (&s, &n) in seqs.iter().zip(counts) {
            if n == 0 {
                continue;
            }
            let mut e = m.seqs.remove(&s).unwrap();
            for (g, t) in e.tables.iter_mut().enumerate() {
                for (i, x) in t.iter_mut().enumerate() {
                    if let Some(b) = *x {
                        if m.specs[g].releasable(i, BS, e.len) {
                            m.release(b);
                            gained += (m.blocks[b].rc == 0 && m.blocks[b].hard == 0) as usize;
                            *x = None;
                        }
                    }
                }
            }
            m.seqs.insert(s, e);
        }
        for (&s, &n) in seqs.iter().zip(counts) {
            if n == 0 {
                continue;
            }
            let mut e = m.seqs.remove(&s).unwrap();
            for t in &mut e.tables {
                m.grow(t, e.len, n)?;
            }
            e.frontier = e.len;
            e.len += n;
            if !keep_cursor {
                e.cursor = None;
            }
            m.seqs.insert(s, e);
        }
        if m.blocks.len() - self.blocks.len() > self.available() + gained {
            return Err(Err::Exhausted);
        }
        *self = m;
        if !keep_cursor {
            self.end_op();
        }
        Ok(())
    }

    pub fn append_tokens(&mut self, seq: u64, tokens: &[u32]) -> Result<(), Err> {
        self.step(&[seq], &[tokens.len()], true)?;
        let e = self.seqs.get_mut(&seq).unwrap();
        let extra = e.extra;
        let Some((mut toks, mut keys)) = e.cursor.take() else {
            self.end_op();
            return Ok(());
        };
        let first = keys.len();
        toks.extend_from_slice(tokens);
        let tables = e.tables.clone();
        keys = self.keys(&toks, extra);
        self.register(&tables, Q { keys: &keys, tokens: Some(&toks), extra, len: toks.len() }, first);
        self.seqs.get_mut(&seq).unwrap().cursor = Some((toks, keys));
        self.end_op();
        Ok(())
    }

    pub fn fork(&mut self, parent: u64, child: u64) -> Result<(), Err> {
        if self.seqs.contains_key(&child) {
            return Err(Err::Duplicate);
        }
        let e = self.seqs.get(&parent).ok_or(Err::Unknown)?.clone();
        for m in e.tables.iter().flatten().flatten() {
            self.blocks[*m].rc += 1;
        }
        self.seqs.insert(child, e);
        self.end_op();
        Ok(())
    }

    pub fn truncate(&mut self, seq: u64, n: usize) -> Result<(), Err> {
        let e = self.seqs.get(&seq).ok_or(Err::Unknown)?;
        if n > e.len {
            return Err(Err::Invalid);
        }
        let l2 = e.len - n;
        for (g, t) in e.tables.iter().enumerate() {
            let [a, b] = self.specs[g].needed_before(l2, BS);
            if a.chain(b).any(|i| t[i].is_none()) {
                return Err(Err::Invalid);
            }
        }
        let mut e = self.seqs.remove(&seq).unwrap();
        for t in &mut e.tables {
            while t.len() > l2.div_ceil(BS) {
                if let Some(m) = t.pop().unwrap() {
                    self.release(m);
                }
            }
        }
        e.len = l2;
        e.frontier = e.frontier.min(l2);
        if let Some((toks, keys)) = e.cursor.as_mut() {
            toks.truncate(l2);
            keys.truncate(l2 / BS);
        }
        self.seqs.insert(seq, e);
        self.end_op();
        Ok(())
    }

    /// Forget every cached block: idle ones become free, live ones uncached. Returns the
    /// blocks that were cached.
    pub fn reset(&mut self) -> Result<usize, Err> {
        if !self.pins.is_empty() {
            return Err(Err::Invalid);
        }
        let n = self.index.len();
        self.free += self.idle.len();
        self.idle.clear();
        self.index.clear();
        self.blocks.iter_mut().for_each(|b| (b.key, b.parent, b.soft) = (None, None, BTreeMap::new()));
        self.events.push((2, 0, 0, None, 0, self.ops));
        Ok(n)
    }

    pub fn free_seq(&mut self, seq: u64) -> Result<(), Err> {
        let e = self.seqs.remove(&seq).ok_or(Err::Unknown)?;
        // Logical block by logical block, tail first; within a block, group by group.
        let n = e.tables.iter().map(|t| t.len()).max().unwrap_or(0);
        for i in (0..n).rev() {
            for t in &e.tables {
                if let Some(Some(m)) = t.get(i) {
                    self.release(*m);
                }
            }
        }
        self.end_op();
        Ok(())
    }
}
