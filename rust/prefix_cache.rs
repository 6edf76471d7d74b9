//! The prefix cache: block key <-> physical block, per-block verification data, the
//! eviction queue of idle blocks, pins, hit metrics and the KV event stream.
//!
//! States of a physical block when caching is on:
//!
//! - *free*: on the allocator's free list, holds nothing reusable;
//! - *live*: refcount > 0 (held by sequences), cached or not;
//! - *idle*: refcount 0 but cached: its KV stays reusable until it is evicted. Idle
//!   blocks count as free for allocation unless hard-pinned; an allocation takes free
//!   blocks first and only then evicts (see [`crate::eviction`]).
//!
//! Cached blocks form a forest: each one records its parent (the cached block before it
//! in the sequence that stored it). Every holder of a cached block holds its parent too,
//! so `refcount(parent) >= refcount(child)`; and only leaves are evicted. Together these
//! make a lookup exact: a hit on block `i` whose recorded parent is the block just
//! matched at `i - 1`, whose extra key and (with verification) tokens are equal, holds
//! KV computed from exactly this prefix, even when keys collide.
//!
//! The clock (`now`) is logical: the count of completed pool operations, or a step the
//! caller sets. It stamps events and expires pins; it never reads the wall clock.

use rustc_hash::FxHashMap;

use crate::allocator::BlockAllocator;
use crate::block_hash::{BlockHasher, BlockKey};
use crate::error::{KvError, Result};
use crate::eviction::{EvictKey, EvictionPolicy, EvictionQueue, Recency};
use crate::invalid;
use crate::pins::{Pin, PinTable};
use crate::types::BlockId;

const NO_PARENT: u32 = u32::MAX;

/// How a pool caches prefixes.
#[derive(Clone, Copy, Debug)]
pub struct CacheConfig {
    pub policy: EvictionPolicy,
    /// Keep each cached block's token ids and compare them on a hit, so a key collision
    /// is a miss, never wrong KV. Costs `4 * block_size` bytes per block.
    pub verify_tokens: bool,
    /// When the last-token rule drops a fully cached last block, copy it (a CoW pair)
    /// instead, so only the final prompt token is computed.
    pub cow_partial_hit: bool,
    pub hasher: BlockHasher,
    /// Record [`CacheEvent`]s for [`PrefixCache::drain_events`].
    pub record_events: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            policy: EvictionPolicy::Lru,
            verify_tokens: true,
            cow_partial_hit: false,
            hasher: BlockHasher::Xxh3,
            record_events: false,
        }
    }
}

/// Hit metrics and occupancy of the cache. Hits count only admissions that succeeded.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheStats {
    pub policy: EvictionPolicy,
    /// Admissions that looked the cache up (token ids or block keys).
    pub queries: u64,
    /// Prompt blocks looked up (full blocks for token ids, every key for block keys).
    pub query_blocks: u64,
    /// Leading prompt blocks found cached (before the last-token rule).
    pub hit_blocks: u64,
    /// Prompt tokens admitted.
    pub query_tokens: u64,
    /// Prompt tokens returned as cached (after the last-token rule, CoW hits included).
    pub hit_tokens: u64,
    /// Blocks registered in the cache.
    pub stored_blocks: u64,
    /// Idle cached blocks reclaimed by allocations.
    pub evictions: u64,
    /// Lookups that found the key but failed verification (parent, extra key, tokens).
    pub collisions: u64,
    /// Admissions that took a copy-on-write partial hit.
    pub cow_hits: u64,
    pub cached_blocks: usize,
    /// Cached blocks with refcount 0.
    pub idle_blocks: usize,
    /// Idle blocks that are not hard-pinned (allocatable by eviction).
    pub evictable_blocks: usize,
    /// Cached blocks covered by at least one hard pin.
    pub pinned_blocks: usize,
    pub num_pins: usize,
    pub clock: u64,
}

impl CacheStats {
    /// `hit_tokens / query_tokens` (0.0 before any query).
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hit_tokens, self.query_tokens)
    }
    /// `hit_blocks / query_blocks` (0.0 before any query).
    pub fn block_hit_rate(&self) -> f64 {
        ratio(self.hit_blocks, self.query_blocks)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// What happened to the cache (vLLM's KV events: BlockStored, BlockRemoved, AllBlocksCleared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CacheEventKind {
    Stored = 0,
    Removed = 1,
    AllCleared = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheEvent {
    pub kind: CacheEventKind,
    /// `None` for `AllCleared`.
    pub block: Option<BlockId>,
    pub key: BlockKey,
    /// Key of the parent block; `None` for a root block or `AllCleared`.
    pub parent_key: Option<BlockKey>,
    pub clock: u64,
}

/// Per-block cache state, one cache line: eviction and lookup touch it for random blocks,
/// so its size is what an eviction costs. Rarely used data (soft pins) lives aside.
#[derive(Clone, Copy, Debug, Default)]
#[repr(align(64))]
struct Meta {
    key: BlockKey,
    last_touch: u64,
    stored_at: u64,
    /// The extra key (valid with `HAS_EXTRA`).
    extra: u64,
    parent: u32,
    depth: u32,
    children: u32,
    hard_pins: u32,
    hits: u32,
    flags: u8,
}

/// Cached with refcount 0 (mirrors the allocator, so the forest can be updated without it).
const IDLE: u8 = 1;
const HAS_TOKENS: u8 = 2;
const QUEUED: u8 = 4;
const HAS_EXTRA: u8 = 8;

impl Meta {
    #[inline]
    fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }
    #[inline]
    fn set(&mut self, f: u8, on: bool) {
        if on {
            self.flags |= f
        } else {
            self.flags &= !f
        }
    }
    #[inline]
    fn extra(&self) -> Option<u64> {
        self.has(HAS_EXTRA).then_some(self.extra)
    }
}

/// The prefix cache of one pool. The pool owns the allocator and passes it in.
#[derive(Clone, Debug)]
pub struct PrefixCache {
    cfg: CacheConfig,
    block_size: usize,
    /// Low 64 bits of a key -> block; the block's meta holds the full key, checked on
    /// every hit. Two keys equal in their low 64 bits cannot both be cached (the second
    /// one is a miss, like any collision). Removed eagerly on eviction: leaving stale
    /// entries for a bulk purge was tried and cost more (and gave millisecond spikes).
    map: FxHashMap<u64, BlockId>,
    /// Blocks cached now (valid entries of `map`).
    num_cached: usize,
    /// One bit per block: cached or not. Tested on every decode step (copy-on-write of a
    /// cached partial block), so it stays in L1 where the meta array would not.
    cached: Vec<u64>,
    meta: Vec<Meta>,
    /// Live soft pins of a block, `(pin id, priority)`; cleared on eviction.
    soft: FxHashMap<u32, Vec<(u64, u32)>>,
    /// Token ids of block `b` at `b * block_size ..`, when verifying.
    tokens: Vec<u32>,
    queue: EvictionQueue,
    pins: PinTable,
    idle: usize,
    evictable: usize,
    touch: u64,
    clock: u64,
    manual_clock: bool,
    stats: CacheStats,
    events: Vec<CacheEvent>,
}

/// Result of a lookup: the matched chain (root first) and whether the walk stopped on a
/// key that failed verification.
#[derive(Clone, Debug, Default)]
pub struct Lookup {
    pub blocks: Vec<BlockId>,
    pub collision: bool,
}

#[inline]
fn low(key: BlockKey) -> u64 {
    key as u64
}

impl PrefixCache {
    pub fn new(num_blocks: usize, block_size: usize, cfg: CacheConfig) -> Result<Self> {
        cfg.hasher.validate()?;
        let mut tokens = Vec::new();
        if cfg.verify_tokens {
            let n = num_blocks
                .checked_mul(block_size)
                .filter(|&n| tokens.try_reserve_exact(n).is_ok())
                .ok_or_else(|| {
                    invalid!(
                        "cannot hold token ids of {num_blocks} blocks x {block_size} for verification; \
                         use verify_tokens=False"
                    )
                })?;
            tokens.resize(n, 0);
        }
        let mut meta = Vec::new();
        meta.try_reserve_exact(num_blocks)
            .map_err(|_| invalid!("cannot allocate cache bookkeeping for {num_blocks} blocks"))?;
        meta.resize(num_blocks, Meta { parent: NO_PARENT, ..Meta::default() });
        Ok(Self {
            cfg,
            block_size,
            map: FxHashMap::default(),
            num_cached: 0,
            cached: vec![0; num_blocks.div_ceil(64)],
            meta,
            soft: FxHashMap::default(),
            tokens,
            queue: EvictionQueue::default(),
            pins: PinTable::default(),
            idle: 0,
            evictable: 0,
            touch: 0,
            clock: 0,
            manual_clock: false,
            stats: CacheStats {
                policy: cfg.policy,
                queries: 0,
                query_blocks: 0,
                hit_blocks: 0,
                query_tokens: 0,
                hit_tokens: 0,
                stored_blocks: 0,
                evictions: 0,
                collisions: 0,
                cow_hits: 0,
                cached_blocks: 0,
                idle_blocks: 0,
                evictable_blocks: 0,
                pinned_blocks: 0,
                num_pins: 0,
                clock: 0,
            },
            events: Vec::new(),
        })
    }

    #[inline]
    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    #[inline]
    pub fn hasher(&self) -> BlockHasher {
        self.cfg.hasher
    }

    #[inline]
    pub fn is_cached(&self, b: BlockId) -> bool {
        let i = b.index();
        self.cached[i / 64] >> (i % 64) & 1 != 0
    }

    #[inline]
    fn set_cached(&mut self, b: BlockId, on: bool) {
        let i = b.index();
        if on {
            self.cached[i / 64] |= 1 << (i % 64);
        } else {
            self.cached[i / 64] &= !(1 << (i % 64));
        }
    }

    /// The block cached under `key`'s index (its full key is checked by the caller).
    #[inline]
    fn index_get(&self, key: BlockKey) -> Option<BlockId> {
        self.map.get(&low(key)).copied()
    }

    /// Key of a cached block.
    pub fn key_of(&self, b: BlockId) -> Option<BlockKey> {
        self.is_cached(b).then(|| self.meta[b.index()].key)
    }

    /// Idle cached blocks (refcount 0), pinned or not.
    #[inline]
    pub fn idle_count(&self) -> usize {
        self.idle
    }

    /// Idle blocks an allocation may evict.
    #[inline]
    pub fn evictable_count(&self) -> usize {
        self.evictable
    }

    /// Whether `b` is idle and not hard-pinned (so reviving it takes one from the
    /// allocatable count).
    #[inline]
    pub fn is_evictable(&self, b: BlockId, alloc: &BlockAllocator) -> bool {
        self.is_cached(b) && self.meta[b.index()].hard_pins == 0 && alloc.refcount(b) == 0
    }

    #[inline]
    pub fn now(&self) -> u64 {
        self.clock
    }

    /// Longest verified cached chain for `keys`. `tokens` (the prompt, at least
    /// `keys.len()` full blocks) enables token verification when the cache keeps tokens.
    /// Pure: nothing is touched.
    pub fn lookup(&self, keys: &[BlockKey], tokens: Option<&[u32]>, extra: Option<u64>) -> Lookup {
        let mut out = Lookup { blocks: Vec::with_capacity(keys.len()), collision: false };
        let bs = self.block_size;
        let mut prev = NO_PARENT;
        for (i, &key) in keys.iter().enumerate() {
            let Some(b) = self.index_get(key) else { break };
            let m = &self.meta[b.index()];
            let mut ok = m.key == key && m.parent == prev && m.extra() == extra;
            if ok && self.cfg.verify_tokens {
                if let Some(t) = tokens {
                    let start = b.index() * bs;
                    ok = m.has(HAS_TOKENS) && self.tokens[start..start + bs] == t[i * bs..(i + 1) * bs];
                }
            }
            if !ok {
                out.collision = true;
                break;
            }
            out.blocks.push(b);
            prev = b.0;
        }
        out
    }

    #[inline]
    fn next_touch(&mut self) -> u64 {
        self.touch += 1;
        self.touch
    }

    fn priority(&self, b: BlockId) -> u32 {
        self.soft.get(&b.0).and_then(|v| v.iter().map(|&(_, p)| p).max()).unwrap_or(0)
    }

    /// The eviction key of `b` from its current state (computed, not stored: the state
    /// it reads only changes while `b` is out of the queue).
    fn evict_key(&self, b: BlockId) -> EvictKey {
        let m = &self.meta[b.index()];
        let priority = if self.cfg.policy == EvictionPolicy::Priority { self.priority(b) } else { 0 };
        let rec = Recency { last_touch: m.last_touch, stored_at: m.stored_at, hits: m.hits as u64, priority };
        self.cfg.policy.key(&rec, b)
    }

    fn enqueue(&mut self, b: BlockId) {
        debug_assert!(!self.meta[b.index()].has(QUEUED));
        let k = self.evict_key(b);
        self.queue.insert(k);
        self.meta[b.index()].set(QUEUED, true);
    }

    /// Take `b` out of the queue (if queued); returns whether it was.
    fn dequeue(&mut self, b: BlockId) -> bool {
        if !self.meta[b.index()].has(QUEUED) {
            return false;
        }
        let k = self.evict_key(b);
        let found = self.queue.remove(&k);
        debug_assert!(found, "queued {b} not found under its key");
        self.meta[b.index()].set(QUEUED, false);
        true
    }

    fn queue_if_leaf(&mut self, b: BlockId) {
        let m = &self.meta[b.index()];
        if self.is_cached(b) && m.has(IDLE) && m.children == 0 && m.hard_pins == 0 && !m.has(QUEUED) {
            self.enqueue(b);
        }
    }

    /// A lookup hit that the sequence takes: revive an idle block or add a reference.
    pub fn acquire(&mut self, b: BlockId, alloc: &mut BlockAllocator) {
        self.dequeue(b);
        let t = self.next_touch();
        let m = &mut self.meta[b.index()];
        m.hits = m.hits.saturating_add(1);
        m.last_touch = t;
        if alloc.refcount(b) == 0 {
            m.set(IDLE, false);
            self.idle -= 1;
            if m.hard_pins == 0 {
                self.evictable -= 1;
            }
            alloc.revive(b);
        } else {
            alloc.incref(b);
        }
    }

    /// A lookup hit the sequence does not take (dropped by the last-token rule).
    pub fn touch_hit(&mut self, b: BlockId) {
        let queued = self.dequeue(b);
        let t = self.next_touch();
        let m = &mut self.meta[b.index()];
        m.hits = m.hits.saturating_add(1);
        m.last_touch = t;
        if queued {
            self.enqueue(b);
        }
    }

    /// A cached block's refcount just reached zero: it becomes idle, reusable.
    pub fn on_idle(&mut self, b: BlockId) {
        let t = self.next_touch();
        let m = &mut self.meta[b.index()];
        m.last_touch = t;
        m.set(IDLE, true);
        self.idle += 1;
        if m.hard_pins == 0 {
            self.evictable += 1;
        }
        self.queue_if_leaf(b);
    }

    /// Reclaim the next victim for an allocation: it leaves the cache with refcount 1.
    pub fn evict(&mut self, alloc: &mut BlockAllocator) -> Option<BlockId> {
        let b = self.queue.pop()?;
        self.meta[b.index()].set(QUEUED, false);
        self.uncache(b);
        self.stats.evictions += 1;
        alloc.revive(b);
        Some(b)
    }

    /// Remove `b` from the map and the forest (an idle leaf being evicted, or any block
    /// during a reset).
    fn uncache(&mut self, b: BlockId) {
        self.dequeue(b);
        self.set_cached(b, false);
        if !self.soft.is_empty() {
            self.soft.remove(&b.0);
        }
        let clock = self.clock;
        let m = &mut self.meta[b.index()];
        let (key, parent) = (m.key, m.parent);
        if m.has(IDLE) {
            m.set(IDLE, false);
            self.idle -= 1;
            if m.hard_pins == 0 {
                self.evictable -= 1;
            }
        }
        self.map.remove(&low(key));
        self.num_cached -= 1;
        let mut parent_key = None;
        if parent != NO_PARENT {
            let p = &mut self.meta[parent as usize];
            p.children -= 1;
            parent_key = Some(p.key);
            self.queue_if_leaf(BlockId(parent));
        }
        self.push_event(CacheEventKind::Removed, Some(b), key, parent_key, clock);
    }

    /// Register live block `b` under `key` as the child of `parent` (a cached block held
    /// by the same sequence). Returns false, changing nothing, when the key is taken: the
    /// block then stays uncached (a duplicate or a collision).
    pub fn register(
        &mut self,
        b: BlockId,
        key: BlockKey,
        parent: Option<BlockId>,
        extra: Option<u64>,
        tokens: Option<&[u32]>,
    ) -> bool {
        if self.map.contains_key(&low(key)) {
            return false;
        }
        debug_assert!(!self.is_cached(b));
        let t = self.next_touch();
        let (parent, depth, parent_key) = match parent {
            Some(p) => {
                let pm = &mut self.meta[p.index()];
                debug_assert!(!pm.has(IDLE));
                pm.children += 1;
                (p.0, pm.depth + 1, Some(pm.key))
            }
            None => (NO_PARENT, 0, None),
        };
        let has_tokens = match tokens {
            Some(tok) if self.cfg.verify_tokens => {
                let start = b.index() * self.block_size;
                self.tokens[start..start + self.block_size].copy_from_slice(tok);
                true
            }
            _ => false,
        };
        let hard_pins = self.meta[b.index()].hard_pins;
        let mut m = Meta {
            key,
            last_touch: t,
            stored_at: t,
            extra: extra.unwrap_or(0),
            parent,
            depth,
            children: 0,
            hard_pins,
            hits: 0,
            flags: 0,
        };
        m.set(HAS_TOKENS, has_tokens);
        m.set(HAS_EXTRA, extra.is_some());
        self.meta[b.index()] = m;
        self.set_cached(b, true);
        self.map.insert(low(key), b);
        self.num_cached += 1;
        self.stats.stored_blocks += 1;
        let clock = self.clock;
        self.push_event(CacheEventKind::Stored, Some(b), key, parent_key, clock);
        true
    }

    /// Record the metrics of one successful admission.
    pub fn record_query(&mut self, blocks: usize, hit_blocks: usize, tokens: usize, hit_tokens: usize, collision: bool, cow: bool) {
        let s = &mut self.stats;
        s.queries += 1;
        s.query_blocks += blocks as u64;
        s.hit_blocks += hit_blocks as u64;
        s.query_tokens += tokens as u64;
        s.hit_tokens += hit_tokens as u64;
        s.collisions += collision as u64;
        s.cow_hits += cow as u64;
    }

    // ------------------------------------------------------------------ pins and clock

    /// Pin a cached chain (root first, as returned by [`Self::lookup`]).
    pub fn pin(&mut self, chain: &[BlockId], priority: Option<u32>, expires_at: Option<u64>) -> Result<u64> {
        if let Some(t) = expires_at {
            if t <= self.clock {
                return Err(invalid!("expires_at {t} is not after the current clock {}", self.clock));
            }
        }
        let blocks: Vec<(BlockId, BlockKey)> = chain.iter().map(|&b| (b, self.meta[b.index()].key)).collect();
        let id = self.pins.insert(Pin { blocks, priority, expires_at });
        for &b in chain {
            match priority {
                None => {
                    let m = &mut self.meta[b.index()];
                    m.hard_pins += 1;
                    if m.hard_pins == 1 && m.has(IDLE) {
                        self.evictable -= 1;
                        self.dequeue(b);
                    }
                }
                Some(p) => {
                    let queued = self.dequeue(b);
                    self.soft.entry(b.0).or_default().push((id, p));
                    if queued {
                        self.enqueue(b);
                    }
                }
            }
        }
        Ok(id)
    }

    /// Drop pin `id`. Errors with `InvalidArgument` for an unknown or lapsed pin.
    pub fn unpin(&mut self, id: u64) -> Result<()> {
        let pin = self.pins.remove(id).ok_or_else(|| invalid!("unknown pin id {id} (never issued, unpinned or expired)"))?;
        for &(b, key) in &pin.blocks {
            match pin.priority {
                None => {
                    // Hard-pinned blocks are never evicted, so `b` still holds `key`.
                    debug_assert!(self.key_of(b) == Some(key));
                    let m = &mut self.meta[b.index()];
                    m.hard_pins -= 1;
                    if m.hard_pins == 0 && m.has(IDLE) {
                        self.evictable += 1;
                        self.queue_if_leaf(b);
                    }
                }
                Some(_) => {
                    // A soft-pinned block may have been evicted (its soft list was
                    // cleared then) and even reused: match on the pin id.
                    let has = self.soft.get(&b.0).is_some_and(|v| v.iter().any(|&(p, _)| p == id));
                    if has {
                        let queued = self.dequeue(b);
                        if let Some(v) = self.soft.get_mut(&b.0) {
                            v.retain(|&(p, _)| p != id);
                            if v.is_empty() {
                                self.soft.remove(&b.0);
                            }
                        }
                        if queued {
                            self.enqueue(b);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn expire_pins(&mut self) {
        for id in self.pins.expired(self.clock) {
            // Listed just now, so present.
            let _ = self.unpin(id);
        }
    }

    /// End of a successful pool operation: the operation clock advances (unless the
    /// caller drives the clock) and lapsed pins are released.
    #[inline]
    pub fn end_op(&mut self) {
        if !self.manual_clock {
            self.clock += 1;
        }
        if !self.pins.is_empty() {
            self.expire_pins();
        }
    }

    /// Drive the clock from the caller's step counter from now on. It never goes back.
    pub fn set_clock(&mut self, t: u64) -> Result<()> {
        if t < self.clock {
            return Err(invalid!("the clock cannot go back from {} to {t}", self.clock));
        }
        self.manual_clock = true;
        self.clock = t;
        self.expire_pins();
        Ok(())
    }

    pub fn num_pins(&self) -> usize {
        self.pins.len()
    }

    // ----------------------------------------------------------------- reset, metrics

    /// Forget every cached block: idle ones return to the free list, live ones stay with
    /// their sequences but are no longer reusable. Refused while pins exist.
    pub fn reset(&mut self, alloc: &mut BlockAllocator) -> Result<usize> {
        if !self.pins.is_empty() {
            return Err(invalid!("cannot reset the prefix cache while {} pins are held", self.pins.len()));
        }
        let n = self.num_cached;
        let record = std::mem::replace(&mut self.cfg.record_events, false);
        // Deepest first so that each removal sees a leaf.
        let mut blocks: Vec<BlockId> = self.cached_blocks().collect();
        blocks.sort_unstable_by_key(|b| std::cmp::Reverse((self.meta[b.index()].depth, b.0)));
        for b in blocks {
            let idle = self.meta[b.index()].has(IDLE);
            self.uncache(b);
            if idle {
                alloc.push_free(b);
            }
        }
        self.map.clear();
        self.cfg.record_events = record;
        let clock = self.clock;
        self.push_event(CacheEventKind::AllCleared, None, 0, None, clock);
        Ok(n)
    }

    fn cached_blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        (0..self.meta.len() as u32).map(BlockId).filter(|&b| self.is_cached(b))
    }

    pub fn stats(&self) -> CacheStats {
        let mut s = self.stats.clone();
        s.cached_blocks = self.num_cached;
        s.idle_blocks = self.idle;
        s.evictable_blocks = self.evictable;
        s.pinned_blocks = self.cached_blocks().filter(|b| self.meta[b.index()].hard_pins > 0).count();
        s.num_pins = self.pins.len();
        s.clock = self.clock;
        s
    }

    /// Move every recorded event into `out` (oldest first).
    pub fn drain_events(&mut self, out: &mut Vec<CacheEvent>) {
        out.append(&mut self.events);
    }

    fn push_event(&mut self, kind: CacheEventKind, block: Option<BlockId>, key: BlockKey, parent_key: Option<BlockKey>, clock: u64) {
        if self.cfg.record_events {
            self.events.push(CacheEvent { kind, block, key, parent_key, clock });
        }
    }

    /// Check the cache against the allocator. Called by the pool after it checked
    /// refcounts against tables.
    pub fn check(&self, alloc: &BlockAllocator) -> Result<()> {
        let bad = |msg: String| Err(KvError::Invariant(msg));
        let n = self.meta.len();
        let mut children = vec![0u32; n];
        let mut hard = vec![0u32; n];
        let (mut cached, mut idle, mut evictable, mut queued) = (0usize, 0usize, 0usize, 0usize);
        for (&k, &b) in &self.map {
            if !self.is_cached(b) || low(self.meta[b.index()].key) != k {
                return bad(format!("key {k:#x} maps to {b}, which does not map back to it"));
            }
        }
        let valid = self.map.len();
        for (i, m) in self.meta.iter().enumerate() {
            let b = BlockId(i as u32);
            let rc = alloc.refcount(b);
            if !self.is_cached(b) {
                if m.has(IDLE) || m.has(QUEUED) || m.children != 0 || m.hard_pins != 0 || self.soft.contains_key(&b.0) {
                    return bad(format!("{b} is not cached but idle, queued, pinned or a parent"));
                }
                continue;
            }
            cached += 1;
            if self.index_get(m.key) != Some(b) {
                return bad(format!("cached {b} has key {:#x}, which maps elsewhere", m.key));
            }
            if m.has(IDLE) != (rc == 0) {
                return bad(format!("cached {b} has refcount {rc} but idle = {}", m.has(IDLE)));
            }
            if m.parent != NO_PARENT {
                let p = &self.meta[m.parent as usize];
                if !self.is_cached(BlockId(m.parent)) || p.depth + 1 != m.depth {
                    return bad(format!("cached {b} has a parent that is not cached one level up"));
                }
                if alloc.refcount(BlockId(m.parent)) < rc {
                    return bad(format!("{b} has more holders than its parent block {}", m.parent));
                }
                children[m.parent as usize] += 1;
            } else if m.depth != 0 {
                return bad(format!("root {b} has depth {}", m.depth));
            }
            let should_queue = m.has(IDLE) && m.hard_pins == 0 && m.children == 0;
            if m.has(IDLE) {
                idle += 1;
                evictable += (m.hard_pins == 0) as usize;
            }
            if should_queue != m.has(QUEUED) {
                return bad(format!("{b}: queued = {}, expected {should_queue}", m.has(QUEUED)));
            }
            if should_queue {
                if !self.queue.contains(&self.evict_key(b)) {
                    return bad(format!("{b} is queued under a stale eviction key"));
                }
                queued += 1;
            }
        }
        for (i, m) in self.meta.iter().enumerate() {
            if self.is_cached(BlockId(i as u32)) && m.children != children[i] {
                return bad(format!("block {i} counts {} cached children, has {}", m.children, children[i]));
            }
        }
        for &b in alloc.free_list() {
            if self.is_cached(b) {
                return bad(format!("{b} is on the free list and cached"));
            }
        }
        for (id, pin) in self.pins.iter() {
            for &(b, key) in &pin.blocks {
                if pin.priority.is_none() {
                    if self.key_of(b) != Some(key) {
                        return bad(format!("pin {id} covers {b}, which no longer holds its key"));
                    }
                    hard[b.index()] += 1;
                }
            }
        }
        for (i, m) in self.meta.iter().enumerate() {
            if m.hard_pins != hard[i] {
                return bad(format!("block {i} counts {} hard pins, {} pins cover it", m.hard_pins, hard[i]));
            }
        }
        if cached != self.num_cached || valid != cached || idle != self.idle || evictable != self.evictable || queued != self.queue.len() {
            return bad(format!(
                "counts: {cached} cached vs {} counted and {valid} keys, {idle} idle vs {}, {evictable} evictable vs {}, {queued} queued vs {}",
                self.num_cached,
                self.idle,
                self.evictable,
                self.queue.len()
            ));
        }
        Ok(())
    }
}
