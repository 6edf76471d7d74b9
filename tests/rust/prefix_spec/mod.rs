//! A reference model of a prefix-caching pool, written from the documentation: the rules
//! in `rust/pool/prefix.rs`'s module doc and the eviction specification in
//! `rust/prefix_cache/eviction.rs` (what *uses* a block, in which order, what each policy evicts
//! first). Plain data and linear scans; no code shared with the implementation. Block
//! keys are inputs (the caller computes them with the pool's hasher, whose encoding
//! `block_hash.rs` tests against independent vectors). Blocks live in an arena and are
//! named by index; the pool's physical ids are its own business.

use std::collections::{BTreeMap, HashMap};

use pykvpool::EvictionPolicy;

pub type Key = u128;

#[derive(Clone, Debug, Default)]
pub struct Block {
    pub refs: u32,
    pub cached: bool,
    pub key: Key,
    parent: Option<usize>,
    extra: Option<u64>,
    tokens: Option<Vec<u32>>,
    fill: usize,
    children: u32,
    last_use: u64,
    stored: u64,
    hits: u64,
    hard: u32,
    soft: BTreeMap<u64, u32>,
}

#[derive(Clone, Debug)]
pub struct Seq {
    pub table: Vec<usize>,
    pub ntokens: usize,
    pub tokens: Option<Vec<u32>>,
    pub extra: Option<u64>,
}

struct Pin {
    blocks: Vec<usize>,
    priority: Option<u32>,
    expires_at: Option<u64>,
}

/// `(kind, key, parent key, tokens, clock)`, kinds as `CacheEventKind`.
pub type Event = (u8, Key, Option<Key>, u32, u64);

/// The hit metrics of `CacheStats`, in its field order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub queries: u64,
    pub query_blocks: u64,
    pub hit_blocks: u64,
    pub query_tokens: u64,
    pub hit_tokens: u64,
    pub stored_blocks: u64,
    pub evictions: u64,
    pub collisions: u64,
    pub cow_hits: u64,
}

/// A prompt to admit: token ids with the keys of their full blocks, or block keys.
pub enum Prompt<'a> {
    Tokens { tokens: &'a [u32], keys: &'a [Key], extra: Option<u64> },
    Keys { keys: &'a [Key], len: usize },
}

pub struct Spec {
    bs: usize,
    policy: EvictionPolicy,
    cow: bool,
    pub free_blocks: usize,
    pub blocks: Vec<Block>,
    /// `(key, fill)` -> block: the fill is part of a block's identity.
    pub cache: HashMap<(Key, usize), usize>,
    pub seqs: HashMap<u64, Seq>,
    pins: BTreeMap<u64, Pin>,
    next_pin: u64,
    uses: u64,
    pub clock: u64,
    manual_clock: bool,
    pub events: Vec<Event>,
    pub stats: Stats,
}

impl Spec {
    pub fn new(bs: usize, num_blocks: usize, policy: EvictionPolicy, cow: bool) -> Self {
        Self {
            bs,
            policy,
            cow,
            free_blocks: num_blocks,
            blocks: Vec::new(),
            cache: HashMap::new(),
            seqs: HashMap::new(),
            pins: BTreeMap::new(),
            next_pin: 0,
            uses: 0,
            clock: 0,
            manual_clock: false,
            events: Vec::new(),
            stats: Stats::default(),
        }
    }

    // ------------------------------------------------------------------ counts
    pub fn idle(&self) -> impl Iterator<Item = usize> + '_ {
        self.cache.values().copied().filter(|&b| self.blocks[b].refs == 0)
    }
    pub fn evictable(&self) -> usize {
        self.idle().filter(|&b| self.blocks[b].hard == 0).count()
    }
    pub fn num_free(&self) -> usize {
        self.free_blocks + self.evictable()
    }
    pub fn pinned(&self) -> usize {
        self.cache.values().filter(|&&b| self.blocks[b].hard > 0).count()
    }
    pub fn num_pins(&self) -> usize {
        self.pins.len()
    }

    // ------------------------------------------------------------------ uses, eviction
    fn use_block(&mut self, b: usize) {
        self.uses += 1;
        self.blocks[b].last_use = self.uses;
    }

    /// The policy's order: smallest evicted first.
    fn order(&self, b: usize) -> (u64, u64) {
        let m = &self.blocks[b];
        match self.policy {
            EvictionPolicy::Lru => (m.last_use, 0),
            EvictionPolicy::Fifo => (m.stored, 0),
            EvictionPolicy::Lfu => (m.hits, m.last_use),
            EvictionPolicy::Priority => (m.soft.values().copied().max().unwrap_or(0) as u64, m.last_use),
        }
    }

    /// Allocate `n` blocks: never-cached free ones first, then evict idle unpinned leaves.
    fn take(&mut self, n: usize) -> Vec<usize> {
        (0..n)
            .map(|_| {
                if self.free_blocks > 0 {
                    self.free_blocks -= 1;
                } else {
                    let victim = self
                        .idle()
                        .filter(|&b| self.blocks[b].hard == 0 && self.blocks[b].children == 0)
                        .min_by_key(|&b| self.order(b))
                        .expect("a reservation guaranteed an evictable leaf");
                    self.uncache(victim, true);
                    self.stats.evictions += 1;
                }
                self.blocks.push(Block { refs: 1, ..Block::default() });
                self.blocks.len() - 1
            })
            .collect()
    }

    fn uncache(&mut self, b: usize, record: bool) {
        self.cache.remove(&(self.blocks[b].key, self.blocks[b].fill));
        if record {
            self.emit(1, Some(b));
        }
        self.blocks[b].cached = false;
        self.blocks[b].soft.clear();
        if let Some(p) = self.blocks[b].parent {
            self.blocks[p].children -= 1;
        }
    }

    fn release(&mut self, b: usize) {
        self.blocks[b].refs -= 1;
        if self.blocks[b].refs == 0 {
            if self.blocks[b].cached {
                self.use_block(b); // rule 3: it became idle
            } else {
                self.free_blocks += 1;
            }
        }
    }

    fn emit(&mut self, kind: u8, b: Option<usize>) {
        let e = match b {
            None => (kind, 0, None, 0, self.clock),
            Some(b) => {
                let m = &self.blocks[b];
                (kind, m.key, m.parent.map(|p| self.blocks[p].key), m.fill as u32, self.clock)
            }
        };
        self.events.push(e);
    }

    fn store(&mut self, b: usize, key: Key, parent: Option<usize>, extra: Option<u64>, tokens: Option<Vec<u32>>, fill: usize) {
        self.use_block(b); // rule 1
        let stored = self.uses;
        let m = &mut self.blocks[b];
        (m.cached, m.key, m.parent, m.extra, m.tokens, m.fill) = (true, key, parent, extra, tokens, fill);
        (m.children, m.hits, m.stored) = (0, 0, stored);
        if let Some(p) = parent {
            self.blocks[p].children += 1;
        }
        self.cache.insert((key, fill), b);
        self.stats.stored_blocks += 1;
        self.emit(0, Some(b));
    }

    fn end_op(&mut self) {
        if !self.manual_clock {
            self.clock += 1;
        }
        self.expire();
    }

    fn expire(&mut self) {
        let due: Vec<u64> =
            self.pins.iter().filter(|(_, p)| p.expires_at.is_some_and(|t| t <= self.clock)).map(|(&id, _)| id).collect();
        for id in due {
            self.unpin(id);
        }
    }

    // ------------------------------------------------------------------ lookups
    /// Longest chain matching key, parent, extra key, fill and (for token prompts) token
    /// ids; and whether a found key failed.
    fn lookup(&self, keys: &[Key], fills: &[usize], tokens: Option<&[u32]>, extra: Option<u64>) -> (Vec<usize>, bool) {
        let mut chain: Vec<usize> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let Some(&b) = self.cache.get(&(*k, fills[i])) else { return (chain, false) };
            let m = &self.blocks[b];
            let mut ok = m.parent == chain.last().copied() && m.extra == extra && m.fill == fills[i];
            if let Some(t) = tokens {
                ok &= m.tokens.as_deref() == Some(&t[i * self.bs..i * self.bs + fills[i]]);
            }
            if !ok {
                return (chain, true);
            }
            chain.push(b);
        }
        (chain, false)
    }

    pub fn cached_prefix_len(&self, tokens: &[u32], keys: &[Key], extra: Option<u64>) -> usize {
        self.lookup(keys, &vec![self.bs; keys.len()], Some(tokens), extra).0.len() * self.bs
    }

    // ------------------------------------------------------------------ operations
    /// `Some((cached tokens, copy-on-write hit))`, or None where the pool must refuse.
    pub fn admit(&mut self, seq: u64, prompt: Prompt<'_>) -> Option<(usize, bool)> {
        let bs = self.bs;
        let (n, keys, tokens, extra) = match prompt {
            Prompt::Tokens { tokens, keys, extra } => (tokens.len(), keys, Some(tokens), extra),
            Prompt::Keys { keys, len } => (len, keys, None, None),
        };
        let fills: Vec<usize> = (0..keys.len()).map(|i| bs.min(n - i * bs)).collect();
        let (chain, collision) = self.lookup(keys, &fills, tokens, extra);
        let h = chain.len();
        let used = h.min(n.saturating_sub(1) / bs);
        let cow = self.cow && tokens.is_some() && h > used && n.saturating_sub(1) > used * bs;
        let cached = if cow { n - 1 } else { used * bs };
        let need = n.div_ceil(bs) - used;
        let held: Vec<usize> = chain[..used + cow as usize].to_vec();
        let reserved = held.iter().filter(|&&b| self.blocks[b].refs == 0 && self.blocks[b].hard == 0).count();
        if need > self.num_free() - reserved {
            return None;
        }
        for &b in &chain {
            self.blocks[b].hits += 1; // rule 2, root first
            self.use_block(b);
        }
        for &b in &held {
            self.blocks[b].refs += 1;
        }
        let mut table = chain[..used].to_vec();
        table.extend(self.take(need));
        if cow {
            self.release(chain[used]);
        }
        for i in used..keys.len() {
            let parent_ok = i == 0 || (self.blocks[table[i - 1]].cached && self.blocks[table[i - 1]].key == keys[i - 1]);
            if !parent_ok || self.cache.contains_key(&(keys[i], fills[i])) {
                break;
            }
            let tok = tokens.map(|t| t[i * bs..i * bs + fills[i]].to_vec());
            self.store(table[i], keys[i], (i > 0).then(|| table[i - 1]), extra, tok, fills[i]);
        }
        let s = &mut self.stats;
        s.queries += 1;
        s.query_blocks += keys.len() as u64;
        s.hit_blocks += h as u64;
        s.query_tokens += n as u64;
        s.hit_tokens += cached as u64;
        s.collisions += collision as u64;
        s.cow_hits += cow as u64;
        self.seqs.insert(seq, Seq { table, ntokens: n, tokens: tokens.map(|t| t.to_vec()), extra });
        self.end_op();
        Some((cached, cow))
    }

    /// Append `n` tokens (`new` their ids, with `keys` the keys of every full block of the
    /// grown sequence, or None); returns the copy-on-write pairs, None if refused.
    pub fn append(&mut self, seq: u64, n: usize, new: Option<(&[u32], &[Key])>) -> Option<usize> {
        let bs = self.bs;
        let s = &self.seqs[&seq];
        let last = s.table.last().copied();
        let copy = n > 0 && !s.ntokens.is_multiple_of(bs) && last.is_some_and(|b| self.blocks[b].refs > 1 || self.blocks[b].cached);
        let need = (s.ntokens + n).div_ceil(bs) - s.table.len() + copy as usize;
        if need > self.num_free() {
            return None;
        }
        if copy {
            let fresh = self.take(1)[0]; // the copy first: take its block, release the original
            let old = std::mem::replace(self.seqs.get_mut(&seq).unwrap().table.last_mut().unwrap(), fresh);
            self.release(old);
        }
        let more = self.take(need - copy as usize);
        let s = self.seqs.get_mut(&seq).unwrap();
        s.table.extend(more);
        let old_full = s.ntokens / bs;
        s.ntokens += n;
        match new {
            None if n > 0 => s.tokens = None,
            Some((ids, keys)) if s.tokens.is_some() => {
                s.tokens.as_mut().unwrap().extend_from_slice(ids);
                let (table, tokens, extra) = (s.table.clone(), s.tokens.clone().unwrap(), s.extra);
                for i in old_full..s.ntokens / bs {
                    let b = table[i];
                    let parent_ok = i == 0 || (self.blocks[table[i - 1]].cached && self.blocks[table[i - 1]].key == keys[i - 1]);
                    if !parent_ok || self.blocks[b].cached || self.cache.contains_key(&(keys[i], self.bs)) {
                        break;
                    }
                    let tok = tokens[i * bs..(i + 1) * bs].to_vec();
                    self.store(b, keys[i], (i > 0).then(|| table[i - 1]), extra, Some(tok), bs);
                }
            }
            _ => {}
        }
        self.end_op();
        Some(copy as usize)
    }

    pub fn free(&mut self, seq: u64) {
        for b in self.seqs.remove(&seq).unwrap().table {
            self.release(b); // head first
        }
        self.end_op();
    }

    pub fn fork(&mut self, parent: u64, child: u64) {
        let s = self.seqs[&parent].clone();
        for &b in &s.table {
            self.blocks[b].refs += 1;
        }
        self.seqs.insert(child, s);
        self.end_op();
    }

    pub fn truncate(&mut self, seq: u64, n: usize) {
        let s = self.seqs.get_mut(&seq).unwrap();
        s.ntokens -= n;
        let keep = s.ntokens.div_ceil(self.bs);
        let len = s.ntokens;
        if let Some(t) = s.tokens.as_mut() {
            t.truncate(len);
        }
        let dropped: Vec<usize> = s.table.drain(keep..).rev().collect();
        for b in dropped {
            self.release(b); // tail first
        }
        self.end_op();
    }

    pub fn pin(&mut self, keys: &[Key], tokens: Option<&[u32]>, priority: Option<u32>, expires_at: Option<u64>) -> Option<u64> {
        let (chain, _) = self.lookup(keys, &vec![self.bs; keys.len()], tokens, None);
        if keys.is_empty() || chain.len() < keys.len() || expires_at.is_some_and(|t| t <= self.clock) {
            return None;
        }
        self.next_pin += 1;
        for &b in &chain {
            match priority {
                None => self.blocks[b].hard += 1,
                Some(p) => {
                    self.blocks[b].soft.insert(self.next_pin, p);
                }
            }
        }
        self.pins.insert(self.next_pin, Pin { blocks: chain, priority, expires_at });
        Some(self.next_pin)
    }

    pub fn unpin(&mut self, id: u64) -> bool {
        let Some(p) = self.pins.remove(&id) else { return false };
        for b in p.blocks {
            match p.priority {
                None => self.blocks[b].hard -= 1,
                Some(_) => {
                    self.blocks[b].soft.remove(&id);
                }
            }
        }
        true
    }

    pub fn set_clock(&mut self, t: u64) -> bool {
        if t < self.clock {
            return false;
        }
        (self.manual_clock, self.clock) = (true, t);
        self.expire();
        true
    }

    pub fn reset(&mut self) -> Option<usize> {
        if !self.pins.is_empty() {
            return None;
        }
        let all: Vec<usize> = self.cache.values().copied().collect();
        for &b in &all {
            self.uncache(b, false);
            if self.blocks[b].refs == 0 {
                self.free_blocks += 1;
            }
        }
        self.emit(2, None);
        Some(all.len())
    }
}
