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

#[derive(Clone, Debug, Default)]
struct Meta {
    cached: bool,
    /// Cached with refcount 0 (mirrors the allocator, so the forest can be updated
    /// without it).
    idle: bool,
    has_tokens: bool,
    key: BlockKey,
    parent: u32,
    depth: u32,
    extra: Option<u64>,
    children: u32,
    rec: Recency,
    hard_pins: u32,
    /// Live soft pins `(pin id, priority)`; cleared on eviction.
    soft: Vec<(u64, u32)>,
    queued: Option<EvictKey>,
}

/// The prefix cache of one pool. The pool owns the allocator and passes it in.
#[derive(Clone, Debug)]
pub struct PrefixCache {
    cfg: CacheConfig,
    block_size: usize,
    map: FxHashMap<BlockKey, BlockId>,
    meta: Vec<Meta>,
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
        meta.resize_with(num_blocks, || Meta { parent: NO_PARENT, ..Meta::default() });
        Ok(Self {
            cfg,
            block_size,
            map: FxHashMap::default(),
            meta,
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
        self.meta[b.index()].cached
    }

    /// Key of a cached block.
    pub fn key_of(&self, b: BlockId) -> Option<BlockKey> {
        let m = &self.meta[b.index()];
        m.cached.then_some(m.key)
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
        let m = &self.meta[b.index()];
        m.cached && m.hard_pins == 0 && alloc.refcount(b) == 0
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
        for (i, key) in keys.iter().enumerate() {
            let Some(&b) = self.map.get(key) else { break };
            let m = &self.meta[b.index()];
            let mut ok = m.parent == prev && m.extra == extra;
            if ok && self.cfg.verify_tokens {
                if let Some(t) = tokens {
                    let start = b.index() * bs;
                    ok = m.has_tokens && self.tokens[start..start + bs] == t[i * bs..(i + 1) * bs];
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

    fn next_touch(&mut self) -> u64 {
        self.touch += 1;
        self.touch
    }

    fn priority(m: &Meta) -> u32 {
        m.soft.iter().map(|&(_, p)| p).max().unwrap_or(0)
    }

    fn enqueue(&mut self, b: BlockId) {
        let m = &mut self.meta[b.index()];
        debug_assert!(m.queued.is_none());
        let mut rec = m.rec;
        rec.priority = Self::priority(m);
        let k = self.cfg.policy.key(&rec, b);
        m.queued = Some(k);
        self.queue.insert(k);
    }

    fn dequeue(&mut self, b: BlockId) {
        if let Some(k) = self.meta[b.index()].queued.take() {
            self.queue.remove(&k);
        }
    }

    /// Re-sort `b` after its recency or priority changed.
    fn requeue(&mut self, b: BlockId) {
        if self.meta[b.index()].queued.is_some() {
            self.dequeue(b);
            self.enqueue(b);
        }
    }

    fn queue_if_leaf(&mut self, b: BlockId) {
        let m = &self.meta[b.index()];
        if m.cached && m.idle && m.children == 0 && m.hard_pins == 0 && m.queued.is_none() {
            self.enqueue(b);
        }
    }

    /// A lookup hit that the sequence takes: revive an idle block or add a reference.
    pub fn acquire(&mut self, b: BlockId, alloc: &mut BlockAllocator) {
        let t = self.next_touch();
        let m = &mut self.meta[b.index()];
        m.rec.hits += 1;
        m.rec.last_touch = t;
        if alloc.refcount(b) == 0 {
            let pinned = m.hard_pins > 0;
            m.idle = false;
            self.dequeue(b);
            self.idle -= 1;
            if !pinned {
                self.evictable -= 1;
            }
            alloc.revive(b);
        } else {
            alloc.incref(b);
        }
    }

    /// A lookup hit the sequence does not take (dropped by the last-token rule).
    pub fn touch_hit(&mut self, b: BlockId) {
        let t = self.next_touch();
        let m = &mut self.meta[b.index()];
        m.rec.hits += 1;
        m.rec.last_touch = t;
        self.requeue(b);
    }

    /// A cached block's refcount just reached zero: it becomes idle, reusable.
    pub fn on_idle(&mut self, b: BlockId) {
        let t = self.next_touch();
        let m = &mut self.meta[b.index()];
        m.rec.last_touch = t;
        m.idle = true;
        self.idle += 1;
        if m.hard_pins == 0 {
            self.evictable += 1;
        }
        self.queue_if_leaf(b);
    }

    /// Reclaim the next victim for an allocation: it leaves the cache with refcount 1.
    pub fn evict(&mut self, alloc: &mut BlockAllocator) -> Option<BlockId> {
        let b = self.queue.pop()?;
        self.meta[b.index()].queued = None;
        self.uncache(b);
        self.stats.evictions += 1;
        alloc.revive(b);
        Some(b)
    }

    /// Remove `b` from the map and the forest (an idle leaf being evicted, or any block
    /// during a reset).
    fn uncache(&mut self, b: BlockId) {
        self.dequeue(b);
        let clock = self.clock;
        let m = &mut self.meta[b.index()];
        m.cached = false;
        m.soft.clear();
        let (key, parent) = (m.key, m.parent);
        if std::mem::take(&mut m.idle) {
            self.idle -= 1;
            if m.hard_pins == 0 {
                self.evictable -= 1;
            }
        }
        self.map.remove(&key);
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
        if self.map.contains_key(&key) {
            return false;
        }
        debug_assert!(!self.meta[b.index()].cached);
        let t = self.next_touch();
        let (parent, depth, parent_key) = match parent {
            Some(p) => {
                let pm = &mut self.meta[p.index()];
                debug_assert!(pm.cached && !pm.idle);
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
        let m = &mut self.meta[b.index()];
        *m = Meta {
            cached: true,
            idle: false,
            has_tokens,
            key,
            parent,
            depth,
            extra,
            children: 0,
            rec: Recency { last_touch: t, stored_at: t, hits: 0, priority: 0 },
            hard_pins: m.hard_pins,
            soft: std::mem::take(&mut m.soft),
            queued: None,
        };
        self.map.insert(key, b);
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
            let m = &mut self.meta[b.index()];
            match priority {
                None => {
                    m.hard_pins += 1;
                    if m.hard_pins == 1 && m.idle {
                        self.evictable -= 1;
                        self.dequeue(b);
                    }
                }
                Some(p) => {
                    m.soft.push((id, p));
                    self.requeue(b);
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
                    let m = &mut self.meta[b.index()];
                    debug_assert!(m.cached && m.key == key);
                    m.hard_pins -= 1;
                    if m.hard_pins == 0 && m.idle {
                        self.evictable += 1;
                        self.queue_if_leaf(b);
                    }
                }
                Some(_) => {
                    // A soft-pinned block may have been evicted (its soft list was
                    // cleared then) and even reused: match on the pin id.
                    let m = &mut self.meta[b.index()];
                    if let Some(i) = m.soft.iter().position(|&(p, _)| p == id) {
                        m.soft.swap_remove(i);
                        self.requeue(b);
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
    pub fn end_op(&mut self) {
        if !self.manual_clock {
            self.clock += 1;
        }
        self.expire_pins();
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
        let n = self.map.len();
        let record = std::mem::replace(&mut self.cfg.record_events, false);
        // Deepest first so that each removal sees a leaf.
        let mut blocks: Vec<BlockId> = self.map.values().copied().collect();
        blocks.sort_unstable_by_key(|b| std::cmp::Reverse((self.meta[b.index()].depth, b.0)));
        for b in blocks {
            let idle = self.meta[b.index()].idle;
            self.uncache(b);
            if idle {
                alloc.push_free(b);
            }
        }
        self.cfg.record_events = record;
        let clock = self.clock;
        self.push_event(CacheEventKind::AllCleared, None, 0, None, clock);
        Ok(n)
    }

    pub fn stats(&self) -> CacheStats {
        let mut s = self.stats.clone();
        s.cached_blocks = self.map.len();
        s.idle_blocks = self.idle;
        s.evictable_blocks = self.evictable;
        s.pinned_blocks = self.map.values().filter(|b| self.meta[b.index()].hard_pins > 0).count();
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
        for (&key, &b) in &self.map {
            let m = &self.meta[b.index()];
            if !m.cached || m.key != key {
                return bad(format!("key {key:#x} maps to {b}, which does not map back to it"));
            }
        }
        for (i, m) in self.meta.iter().enumerate() {
            let b = BlockId(i as u32);
            let rc = alloc.refcount(b);
            if !m.cached {
                if m.idle || m.queued.is_some() || m.children != 0 || m.hard_pins != 0 {
                    return bad(format!("{b} is not cached but idle, queued, pinned or a parent"));
                }
                continue;
            }
            cached += 1;
            if self.map.get(&m.key) != Some(&b) {
                return bad(format!("cached {b} has key {:#x}, which maps elsewhere", m.key));
            }
            if m.idle != (rc == 0) {
                return bad(format!("cached {b} has refcount {rc} but idle = {}", m.idle));
            }
            if m.parent != NO_PARENT {
                let p = &self.meta[m.parent as usize];
                if !p.cached || p.depth + 1 != m.depth {
                    return bad(format!("cached {b} has a parent that is not cached one level up"));
                }
                if alloc.refcount(BlockId(m.parent)) < rc {
                    return bad(format!("{b} has more holders than its parent block {}", m.parent));
                }
                children[m.parent as usize] += 1;
            } else if m.depth != 0 {
                return bad(format!("root {b} has depth {}", m.depth));
            }
            let should_queue = m.idle && m.hard_pins == 0 && m.children == 0;
            if m.idle {
                idle += 1;
                evictable += (m.hard_pins == 0) as usize;
            }
            match (should_queue, m.queued) {
                (true, Some(k)) => {
                    let mut rec = m.rec;
                    rec.priority = Self::priority(m);
                    if k != self.cfg.policy.key(&rec, b) || !self.queue.contains(&k) {
                        return bad(format!("{b} is queued under a stale eviction key"));
                    }
                    queued += 1;
                }
                (false, None) => {}
                _ => return bad(format!("{b}: queued = {}, expected {should_queue}", m.queued.is_some())),
            }
        }
        for (i, m) in self.meta.iter().enumerate() {
            if m.cached && m.children != children[i] {
                return bad(format!("block {i} counts {} cached children, has {}", m.children, children[i]));
            }
        }
        for &b in alloc.free_list() {
            if self.meta[b.index()].cached {
                return bad(format!("{b} is on the free list and cached"));
            }
        }
        for (id, pin) in self.pins.iter() {
            for &(b, key) in &pin.blocks {
                if pin.priority.is_none() {
                    let m = &self.meta[b.index()];
                    if !m.cached || m.key != key {
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
        if cached != self.map.len() || idle != self.idle || evictable != self.evictable || queued != self.queue.len() {
            return bad(format!(
                "counts: {cached} cached vs {} keys, {idle} idle vs {}, {evictable} evictable vs {}, {queued} queued vs {}",
                self.map.len(),
                self.idle,
                self.evictable,
                self.queue.len()
            ));
        }
        Ok(())
    }
}
