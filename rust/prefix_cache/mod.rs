//! The prefix cache: block key <-> physical block, per-block verification data, the
//! eviction queue of idle blocks, pins, hit metrics and the KV event stream.
//!
//! States of a physical block when caching is on:
//!
//! - *free*: on the allocator's free list, holds nothing reusable;
//! - *live*: refcount > 0 (held by sequences), cached or not;
//! - *idle*: refcount 0 but cached: its KV stays reusable until it is evicted. Idle
//!   blocks count as free for allocation unless hard-pinned; an allocation takes free
//!   blocks first and only then evicts (see [`crate::prefix_cache::eviction`]).
//!
//! Cached blocks form a forest: each one records its parent (the cached block before it
//! in the sequence that stored it). Every holder of a cached block holds its parent too,
//! so `refcount(parent) >= refcount(child)`; and only leaves are evicted. Together these
//! make a lookup exact: a hit on block `i` whose recorded parent is the block just
//! matched at `i - 1`, whose extra key and (with verification) tokens are equal, holds
//! KV computed from exactly this prefix, even when keys collide.
//!
//! Layer groups: a pool whose sequences have one table per attention kind caches each
//! group's blocks under `(group, key)`; the same chained key names the same prefix in
//! every group, and a key cached in one group never hits another. A *full* group's blocks
//! form the forest above (a block's parent is the block before it in the same group). A
//! *windowed* group (sliding window, chunked) releases a sequence's early blocks long before
//! its later ones, so its blocks have no parent: each is verified on its own (its key, extra
//! key, fill and, with verification, its own tokens and the token records of its prefix,
//! the lineage, `lineage.rs`), is never a parent, and is therefore always a leaf: any idle windowed
//! block may be evicted, in the policy's order.
//!
//! Tiers (`tiers.rs`, `spill.rs`): with them, a block the cache evicts goes down to the
//! host tier and on to the disk tier instead of being forgotten, and an admission's hit
//! continues into them past the device's chain. Only the decisions live here; the bytes
//! follow the moves and loads the pool reports (`crate::offload`).
//!
//! The clock (`now`) is logical: the count of completed pool operations, or a step the
//! caller sets. It stamps events and expires pins; it never reads the wall clock.


pub mod block_hash;
mod check;
pub mod cursor;
mod events;
pub mod eviction;
mod lineage;
mod meta;
mod pinning;
mod spill;
pub mod tier_gate;
pub mod tier_order;
pub mod tiers;
pub mod pins;
mod types;

use rustc_hash::FxHashMap;

use crate::pool::allocator::BlockAllocator;
use crate::prefix_cache::block_hash::{BlockHasher, BlockKey};
use crate::error::{filled, Result};
use crate::prefix_cache::eviction::{EvictKey, EvictionPolicy, EvictionQueue, Recency};
use crate::invalid;
use crate::prefix_cache::pins::PinTable;
use crate::prefix_cache::tiers::{Move, TierLoad, Tiers};
use crate::types::BlockId;

use lineage::Lineage;
use meta::{Meta, HAS_EXTRA, HAS_TOKENS, IDLE, LINEAGE, QUEUED};
pub use types::{CacheConfig, CacheEvent, CacheEventKind, CacheStats, MAX_EVENTS_LIMIT, MEDIUM_DEVICE, MEDIUM_DISK, MEDIUM_HOST};

use events::EventQueue;

const NO_PARENT: u32 = u32::MAX;

/// Most layer groups one cache serves (a block records its group in one byte).
pub const MAX_CACHE_GROUPS: usize = 256;

/// Token ids the lineage of windowed blocks may hold per token the pool's blocks hold
/// (see `lineage.rs`): a prompt 32 times the pool's capacity still caches its window.
pub const LINEAGE_TOKENS_PER_TOKEN: usize = 32;

/// The prefix cache of one pool. The pool owns the allocator and passes it in.
#[derive(Clone, Debug)]
pub struct PrefixCache {
    cfg: CacheConfig,
    block_size: usize,
    /// [`slot`] of (group, key) -> block; the block's meta holds the full key and group,
    /// checked on every hit. Two entries equal in their slot cannot both be cached (the
    /// second one is a miss, like any collision). Removed eagerly on eviction: leaving stale
    /// entries for a bulk purge was tried and cost more (and gave millisecond spikes).
    map: FxHashMap<u64, BlockId>,
    /// Index entries of blocks evicted during the current allocation, removed from `map`
    /// by [`Self::flush_unmapped`] before anything reads the map again. Each removal is a
    /// cache miss on a random bucket; done one by one inside the eviction chain (where the
    /// next victim depends on the last) they stall in turn, done in one tight loop
    /// afterwards the CPU overlaps them.
    unmapped: Vec<u64>,
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
    events: EventQueue,
    /// Per layer group: windowed (blocks without parents, always leaves) or full.
    windowed: Vec<bool>,
    /// The prefixes of verified windowed blocks, token by token.
    lineage: Lineage,
    /// The tiers below the device, if any (`spill.rs`), and their decisions not yet drained.
    tiers: Option<Box<Tiers>>,
    tier_moves: Vec<Move>,
    tier_loads: Vec<TierLoad>,
    /// Whether `tier_moves` and `tier_loads` wait for a drain (else each call drops them).
    keep_moves: bool,
    /// Whether the tiers were emptied since the last drain.
    tiers_cleared: bool,
}

/// Result of a lookup: the matched chain (root first) and whether the walk stopped on a
/// key that failed verification.
#[derive(Clone, Debug, Default)]
pub struct Lookup {
    pub blocks: Vec<BlockId>,
    pub collision: bool,
}

/// The index slot of `key` in `group` for a block holding `partial` tokens (0: full):
/// its low 64 bits, the high ones folded in (keys made from trace ids may differ only
/// there), an offset per group and one per fill; a full block's key below 2^64 in group 0
/// is its own slot. The fill is part of a block's identity: a keyed prompt's partly filled
/// last block and a full block under the same key are two entries, neither takes the
/// other's place.
#[inline]
fn slot(group: u8, key: BlockKey, partial: u16) -> u64 {
    let hi = ((key >> 64) as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (key as u64 ^ hi)
        .wrapping_add((group as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add((partial as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
}

/// What a windowed group's lookup of one block found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    Hit(BlockId),
    Miss,
    /// The key is cached but the block failed verification (extra key, fill, tokens).
    Collision,
}

impl PrefixCache {
    /// The cache of a pool of layer groups; `windowed[g]` says whether group `g` releases
    /// blocks (sliding window, chunked) rather than keeping its whole prefix.
    pub fn with_groups(num_blocks: usize, block_size: usize, cfg: CacheConfig, windowed: &[bool]) -> Result<Self> {
        cfg.hasher.validate()?;
        if windowed.is_empty() || windowed.len() > MAX_CACHE_GROUPS {
            return Err(invalid!("groups: a cache serves 1..={MAX_CACHE_GROUPS} layer groups, got {}", windowed.len()));
        }
        if !(1..=MAX_EVENTS_LIMIT).contains(&cfg.max_events) {
            return Err(invalid!("max_events must be in 1..={MAX_EVENTS_LIMIT}, got {}", cfg.max_events));
        }
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
            unmapped: Vec::new(),
            num_cached: 0,
            cached: filled(0, num_blocks.div_ceil(64), "prefix cache bitmap")?,
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
                group_hit_blocks: vec![0; windowed.len()],
                cached_blocks: 0,
                idle_blocks: 0,
                evictable_blocks: 0,
                pinned_blocks: 0,
                num_pins: 0,
                clock: 0,
                pending_events: 0,
                dropped_events: 0,
            },
            events: EventQueue::new(cfg.max_events),
            windowed: windowed.to_vec(),
            lineage: Lineage::new(num_blocks.saturating_mul(block_size).saturating_mul(LINEAGE_TOKENS_PER_TOKEN), block_size),
            tiers: None,
            tier_moves: Vec::new(),
            tier_loads: Vec::new(),
            keep_moves: true,
            tiers_cleared: false,
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

    /// The block cached under `key`'s slot in `group` for a fill of `partial` (its full
    /// key, group and fill are checked by the caller).
    #[inline]
    fn index_get(&self, group: u8, key: BlockKey, partial: u16) -> Option<BlockId> {
        debug_assert!(self.unmapped.is_empty(), "map read with evictions pending");
        self.map.get(&slot(group, key, partial)).copied()
    }

    /// Key of a cached block.
    pub fn key_of(&self, b: BlockId) -> Option<BlockKey> {
        self.is_cached(b).then(|| self.meta[b.index()].key)
    }

    /// The layer group a cached block is cached in.
    pub fn group_of(&self, b: BlockId) -> Option<usize> {
        self.is_cached(b).then(|| self.meta[b.index()].group as usize)
    }

    /// Layer groups the cache serves.
    pub fn num_groups(&self) -> usize {
        self.windowed.len()
    }

    /// Tokens a cached block holds (`block_size` unless it is a keyed prompt's partly
    /// filled last block).
    pub fn filled(&self, b: BlockId) -> Option<usize> {
        self.is_cached(b).then(|| match self.meta[b.index()].partial {
            0 => self.block_size,
            p => p as usize,
        })
    }

    /// The full block cached under `key` in `group`, unverified (what the index holds).
    pub fn block_of(&self, group: usize, key: BlockKey) -> Option<BlockId> {
        let b = self.index_get(u8::try_from(group).ok()?, key, 0)?;
        let m = &self.meta[b.index()];
        (m.key == key && m.group as usize == group && m.partial == 0).then_some(b)
    }

    /// The blocks an eviction may take now (idle, not hard-pinned leaves), the next victim
    /// first. Evicting one may make its parent a leaf, so this is not the whole future
    /// order.
    pub fn eviction_candidates(&self) -> Vec<BlockId> {
        self.queue.iter().collect()
    }

    /// Blocks cached now, live or idle.
    pub fn num_cached(&self) -> usize {
        self.num_cached
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

    /// Whether `b` is cached under at least one hard pin.
    #[inline]
    pub fn is_hard_pinned(&self, b: BlockId) -> bool {
        self.is_cached(b) && self.meta[b.index()].hard_pins > 0
    }

    /// Whether `b` is idle and not hard-pinned (so reviving it takes one from the
    /// allocatable count).
    #[inline]
    pub fn is_evictable(&self, b: BlockId, alloc: &BlockAllocator) -> bool {
        self.is_cached(b) && self.meta[b.index()].hard_pins == 0 && alloc.refcount(b) == 0
    }

    /// Longest verified cached chain for `keys` in full-attention group `group`: every key
    /// stands for a full block but the last, which stands for a block of `last_fill`
    /// tokens (`1..=block_size`; a keyed prompt's partly filled last block). A cached block
    /// matches only a block of the same fill (the fill is part of the index slot): a partly
    /// filled one never satisfies a full-block lookup (it holds fewer tokens of KV), and a
    /// full one never stands for a partial block. `tokens` (the prompt, covering the keys'
    /// blocks) enables token verification when the cache keeps tokens. Pure: nothing is
    /// touched.
    pub fn lookup_in(&self, group: usize, keys: &[BlockKey], tokens: Option<&[u32]>, extra: Option<u64>, last_fill: usize) -> Lookup {
        debug_assert!(!self.windowed[group], "a windowed group is looked up block by block");
        let g = group as u8;
        let mut out = Lookup { blocks: Vec::with_capacity(keys.len()), collision: false };
        let bs = self.block_size;
        let last_partial = if keys.is_empty() { 0 } else { Meta::partial_of(last_fill, bs) };
        let mut prev = NO_PARENT;
        for (i, &key) in keys.iter().enumerate() {
            let want_partial = if i + 1 == keys.len() { last_partial } else { 0 };
            let Some(b) = self.index_get(g, key, want_partial) else { break };
            let m = &self.meta[b.index()];
            let ok = m.key == key && m.group == g && m.parent == prev && m.extra() == extra && m.partial == want_partial;
            if !(ok && self.tokens_match(b, i, want_partial, tokens)) {
                out.collision = true;
                break;
            }
            out.blocks.push(b);
            prev = b.0;
        }
        out
    }

    /// Whether cached block `b` holds logical block `i` of `tokens` (`partial` tokens of
    /// it, or all when 0); true when not verifying or no tokens are given.
    #[inline]
    fn tokens_match(&self, b: BlockId, i: usize, partial: u16, tokens: Option<&[u32]>) -> bool {
        let (Some(t), true) = (tokens, self.cfg.verify_tokens) else { return true };
        let bs = self.block_size;
        let fill = if partial == 0 { bs } else { partial as usize };
        let start = b.index() * bs;
        self.meta[b.index()].has(HAS_TOKENS) && self.tokens[start..start + fill] == t[i * bs..i * bs + fill]
    }

    /// The cached full block of full-attention group `group` that holds exactly logical
    /// block `i` of `tokens` (with `extra`) after `parent` (None: the root): its key, parent,
    /// extra key and, when verifying, its token ids match. Pure.
    pub fn twin(&self, group: usize, i: usize, key: BlockKey, parent: Option<BlockId>, extra: Option<u64>, tokens: Option<&[u32]>) -> Option<BlockId> {
        let b = self.index_get(u8::try_from(group).ok()?, key, 0)?;
        let m = &self.meta[b.index()];
        let up = parent.map_or(NO_PARENT, |p| p.0);
        let ok = m.key == key && m.group as usize == group && m.partial == 0 && m.parent == up && m.extra() == extra;
        (ok && self.tokens_match(b, i, 0, tokens)).then_some(b)
    }

    /// The cached block of windowed group `group` holding logical block `i` of a prompt
    /// keyed `key`, `fill` tokens of it (`1..=block_size`; with `extra`; `tokens`, the
    /// prompt, enables verification of the block's own ids: the caller checks `i` against
    /// [`Self::verified_depth`] for the prefix before them). Pure.
    pub fn find(&self, group: usize, i: usize, key: BlockKey, fill: usize, tokens: Option<&[u32]>, extra: Option<u64>) -> Found {
        debug_assert!(self.windowed[group], "a full group is looked up as a chain");
        let partial = Meta::partial_of(fill, self.block_size);
        let Some(b) = self.index_get(group as u8, key, partial) else { return Found::Miss };
        let m = &self.meta[b.index()];
        let ok = m.key == key && m.group as usize == group && m.extra() == extra && m.partial == partial;
        if ok && self.tokens_match(b, i, partial, tokens) {
            Found::Hit(b)
        } else {
            Found::Collision
        }
    }

    /// How many leading full blocks of a prompt (`keys` of its token ids `tokens`, with
    /// `extra`; at most `max`) a windowed group's hit may use: the blocks whose whole
    /// prefix matches the lineage (`lineage.rs`). Unbounded (`usize::MAX`) when the cache
    /// does not verify or no ids are given. Pure.
    pub fn verified_depth(&self, keys: &[BlockKey], tokens: Option<&[u32]>, extra: Option<u64>, max: usize) -> usize {
        match tokens {
            Some(t) if self.cfg.verify_tokens => self.lineage.verified_depth(keys, t, extra, max),
            _ => usize::MAX,
        }
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
        self.seen(b);
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
        self.seen(b);
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
        self.spill(b);
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
        if m.has(LINEAGE) {
            m.set(LINEAGE, false);
            self.lineage.release(key);
        }
        if m.has(IDLE) {
            m.set(IDLE, false);
            self.idle -= 1;
            if m.hard_pins == 0 {
                self.evictable -= 1;
            }
        }
        self.unmapped.push(slot(m.group, key, m.partial));
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

    /// Remove the index entries of the blocks evicted since the last call. The pool calls
    /// it when an allocation is over (see `BlockPool::grow`) and at the end of every
    /// operation, so the map is exact whenever it is read.
    #[inline]
    pub fn flush_unmapped(&mut self) {
        for k in self.unmapped.drain(..) {
            self.map.remove(&k);
        }
    }

    /// Register live block `b` of layer group `group` (0 without groups), holding `filled`
    /// tokens (`1..=block_size`), under `key` as the child of `parent` (a full cached block
    /// of the same group held by the same sequence; a windowed group's block has none).
    /// Returns false, changing nothing, when the key is taken: the block then stays
    /// uncached (a duplicate or a collision). `tokens`, when given, are the block's
    /// `filled` token ids.
    #[allow(clippy::too_many_arguments)]
    pub fn register_in(
        &mut self,
        group: usize,
        b: BlockId,
        key: BlockKey,
        parent: Option<BlockId>,
        extra: Option<u64>,
        tokens: Option<&[u32]>,
        filled: usize,
    ) -> bool {
        debug_assert!(parent.is_none() || !self.windowed[group], "a windowed block has no parent");
        self.flush_unmapped();
        let slot = match self.map.entry(slot(group as u8, key, Meta::partial_of(filled, self.block_size))) {
            std::collections::hash_map::Entry::Occupied(_) => return false,
            std::collections::hash_map::Entry::Vacant(v) => v,
        };
        // One probe of the index: the entry is filled now, the rest of the state below.
        slot.insert(b);
        debug_assert!(!self.is_cached(b));
        let t = self.next_touch();
        let (parent, depth, parent_key) = match parent {
            Some(p) => {
                let pm = &mut self.meta[p.index()];
                debug_assert!(!pm.has(IDLE) && pm.partial == 0);
                pm.children += 1;
                (p.0, pm.depth + 1, Some(pm.key))
            }
            None => (NO_PARENT, 0, None),
        };
        debug_assert!(tokens.is_none_or(|t| t.len() == filled));
        let has_tokens = match tokens {
            Some(tok) if self.cfg.verify_tokens => {
                let start = b.index() * self.block_size;
                self.tokens[start..start + tok.len()].copy_from_slice(tok);
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
            partial: Meta::partial_of(filled, self.block_size),
            flags: 0,
            group: group as u8,
        };
        m.set(HAS_TOKENS, has_tokens);
        m.set(HAS_EXTRA, extra.is_some());
        self.meta[b.index()] = m;
        self.set_cached(b, true);
        self.num_cached += 1;
        self.stats.stored_blocks += 1;
        self.seen(b);
        let clock = self.clock;
        self.push_event(CacheEventKind::Stored, Some(b), key, parent_key, clock);
        true
    }

    /// Register live block `b` of windowed group `group` as the last of the full blocks
    /// keyed `keys` of a prompt of token ids `tokens` (with `extra`), as
    /// [`Self::register_in`] does; when verifying, the block also stands on its prefix's
    /// lineage, and stays uncached (false) where that disagrees. `depth`: the verified
    /// depth of the prompt ([`Self::verified_depth`]), kept by the caller across one
    /// registration's blocks.
    pub fn register_windowed(&mut self, group: usize, b: BlockId, keys: &[BlockKey], tokens: &[u32], extra: Option<u64>, depth: &mut usize) -> bool {
        let bs = self.block_size;
        let Some(i) = keys.len().checked_sub(1) else { return false };
        let own = &tokens[i * bs..(i + 1) * bs];
        if !self.cfg.verify_tokens {
            return self.register_in(group, b, keys[i], None, extra, Some(own), bs);
        }
        self.flush_unmapped();
        if self.map.contains_key(&slot(group as u8, keys[i], 0)) || !self.lineage.attach(keys, tokens, extra, depth) {
            return false;
        }
        let stored = self.register_in(group, b, keys[i], None, extra, Some(own), bs);
        debug_assert!(stored, "the slot was free");
        self.meta[b.index()].set(LINEAGE, true);
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

    /// Count the blocks one successful admission took from the cache, `held[g]` in group `g`.
    pub fn record_group_hits(&mut self, held: &[usize]) {
        for (c, &n) in self.stats.group_hit_blocks.iter_mut().zip(held) {
            *c += n as u64;
        }
    }

    // ----------------------------------------------------------------- reset, metrics

    /// Forget every cached block: idle ones return to the free list, live ones stay with
    /// their sequences but are no longer reusable; the tiers below the device are emptied
    /// too. Refused while pins exist.
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
        self.unmapped.clear();
        self.lineage.clear();
        self.clear_tiers();
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
        s.pending_events = self.events.len();
        s.dropped_events = self.events.dropped();
        s
    }

    /// Move every queued event into `out`, oldest first. The queue holds the newest
    /// `max_events` events; older undrained ones were dropped (`dropped_events`).
    pub fn drain_events(&mut self, out: &mut Vec<CacheEvent>) {
        self.events.drain_into(out);
    }

    fn push_event(&mut self, kind: CacheEventKind, block: Option<BlockId>, key: BlockKey, parent_key: Option<BlockKey>, clock: u64) {
        if self.cfg.record_events {
            // Read from the meta, which an eviction leaves in place.
            let tokens = block.map_or(0, |b| match self.meta[b.index()].partial {
                0 => self.block_size as u32,
                p => p as u32,
            });
            let group = block.map_or(0, |b| self.meta[b.index()].group as u32);
            self.events.push(CacheEvent { kind, block, key, parent_key, tokens, clock, group, medium: MEDIUM_DEVICE });
        }
    }
}
