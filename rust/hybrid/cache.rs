//! The prefix cache of a pool with layer groups: `(group, block key) -> block`, and the
//! idle cached blocks in the order an eviction policy gives them.
//!
//! Keys are the chained 128-bit block keys of [`crate::prefix_cache::block_hash`]: a key
//! stands for the whole prefix up to the end of its block, so a hit needs no physical
//! parent, and any idle block may be evicted (a windowed group's early blocks are released
//! long before its later ones; the forest rule of the full-attention cache, leaves first,
//! does not hold here). A block is cached in one group at most.
//!
//! States of a physical block: free (on the allocator's free list), live (refcount > 0,
//! cached or not), idle (refcount 0, cached: queued for eviction).
//!
//! # Eviction order
//!
//! Any idle block may be evicted; the policy orders them as the full-attention cache's
//! policies do ([`crate::prefix_cache::eviction`]): `Lru` least recently used first,
//! `Fifo` earliest stored first, `Lfu` fewest hits first, then least recently used. A
//! cached block is *used* when it is **stored** ([`GroupCache::insert`]), **hit** (an
//! admission takes it: [`GroupCache::hit`]) and **released** (its last holder drops it:
//! [`GroupCache::on_idle`]), in the order the pool makes those calls: an admission's hits
//! group by group, each group's blocks in logical order, then its stores; a growth's window
//! releases (sequence by sequence, each group's released blocks in logical order, so the
//! earlier of the blocks one step releases was used first) before its new blocks; `free`
//! releases logical block by logical block, tail first, across all groups.
//! Releasing in logical order is least-recently-used by *last attention*: the last query
//! that attends to a windowed block is at its end plus the window, earlier for an earlier
//! block. `Priority` needs soft pins, which this cache does not have, and is refused.

use rustc_hash::FxHashMap;

use crate::error::{filled, KvError, Result};
use crate::invalid;
use crate::pool::allocator::BlockAllocator;
use crate::prefix_cache::block_hash::{BlockHasher, BlockKey};
use super::idle::IdleQueue;
use crate::prefix_cache::eviction::{EvictKey, EvictionPolicy, Recency};
use crate::types::BlockId;

/// What a cached block is cached as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    group: u32,
    key: BlockKey,
}

/// The index and the eviction queue of idle blocks.
#[derive(Clone, Debug)]
pub struct GroupCache {
    map: FxHashMap<(u32, BlockKey), BlockId>,
    entry: Vec<Option<Entry>>,
    /// What the policy reads of each cached block (stale for a block not cached).
    rec: Vec<Recency>,
    /// Idle blocks, ordered by the policy (smallest key evicted first).
    queue: IdleQueue,
    queued: Vec<bool>,
    policy: EvictionPolicy,
    /// Use counter: the logical time of the last store, hit or release.
    touch: u64,
    idle: usize,
    pub(crate) evictions: u64,
    /// How token ids become keys.
    pub(crate) hasher: BlockHasher,
    /// Admissions that looked the cache up, their prompt tokens, and the tokens reused.
    pub(crate) queries: u64,
    pub(crate) query_tokens: u64,
    pub(crate) hit_tokens: u64,
    /// Blocks each group's hits took (held by the admitted sequence), per group.
    pub(crate) group_hit_blocks: Vec<u64>,
    /// Blocks ever registered.
    pub(crate) stored_blocks: u64,
}

/// Counters of a pool's group cache (all cumulative except `cached_blocks` and
/// `idle_blocks`, which are the state now).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HybridCacheStats {
    /// Admissions through the cache (by token ids or block keys).
    pub queries: u64,
    /// Prompt tokens of those admissions.
    pub query_tokens: u64,
    /// Prompt tokens reused (not computed) by them.
    pub hit_tokens: u64,
    /// Blocks the hits took in each group (a window group takes only its sinks and window).
    pub group_hit_blocks: Vec<u64>,
    /// Blocks registered (one per (group, key) stored).
    pub stored_blocks: u64,
    /// Idle cached blocks evicted to make room.
    pub evictions: u64,
    /// Blocks cached now, live or idle.
    pub cached_blocks: usize,
    /// Cached blocks no sequence holds (evictable, counted as free).
    pub idle_blocks: usize,
}

impl GroupCache {
    /// An empty cache over `num_blocks` blocks evicting by `policy`; `InvalidArgument` when
    /// the host cannot hold its per-block index (never an abort) or the policy is
    /// `Priority` (it orders by soft pins, which this cache does not have).
    pub fn new(num_blocks: usize, policy: EvictionPolicy) -> Result<Self> {
        if policy == EvictionPolicy::Priority {
            return Err(invalid!(
                "eviction \"priority\" orders by soft pins, which a pool with layer groups does not have; \
                 use lru, fifo or lfu"
            ));
        }
        Ok(Self {
            map: FxHashMap::default(),
            entry: filled(None, num_blocks, "prefix cache index")?,
            rec: filled(Recency::default(), num_blocks, "prefix cache eviction state")?,
            queue: IdleQueue::new(num_blocks, policy)?,
            queued: filled(false, num_blocks, "prefix cache eviction state")?,
            policy,
            touch: 0,
            idle: 0,
            evictions: 0,
            hasher: BlockHasher::default(),
            queries: 0,
            query_tokens: 0,
            hit_tokens: 0,
            group_hit_blocks: Vec::new(),
            stored_blocks: 0,
        })
    }

    /// The same cache keying token ids with `hasher`.
    pub fn with_hasher(mut self, hasher: BlockHasher) -> Self {
        self.hasher = hasher;
        self
    }

    pub fn hasher(&self) -> BlockHasher {
        self.hasher
    }

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    #[inline]
    fn next_touch(&mut self) -> u64 {
        self.touch += 1;
        self.touch
    }

    #[inline]
    fn evict_key(&self, b: BlockId) -> EvictKey {
        self.policy.key(&self.rec[b.index()], b)
    }

    /// Count one admission: `len` prompt tokens, `hit` tokens reused, `held[g]` blocks
    /// taken in group `g`.
    pub fn record_query(&mut self, len: usize, hit: usize, held: &[usize]) {
        self.queries += 1;
        self.query_tokens += len as u64;
        self.hit_tokens += hit as u64;
        if self.group_hit_blocks.len() < held.len() {
            self.group_hit_blocks.resize(held.len(), 0);
        }
        for (c, &n) in self.group_hit_blocks.iter_mut().zip(held) {
            *c += n as u64;
        }
    }

    /// The counters, with `num_groups` entries per group.
    pub fn stats(&self, num_groups: usize) -> HybridCacheStats {
        let mut group_hit_blocks = self.group_hit_blocks.clone();
        group_hit_blocks.resize(num_groups, 0);
        HybridCacheStats {
            queries: self.queries,
            query_tokens: self.query_tokens,
            hit_tokens: self.hit_tokens,
            group_hit_blocks,
            stored_blocks: self.stored_blocks,
            evictions: self.evictions,
            cached_blocks: self.num_cached(),
            idle_blocks: self.idle,
        }
    }

    #[inline]
    pub fn is_cached(&self, b: BlockId) -> bool {
        self.entry[b.index()].is_some()
    }

    /// Blocks cached now (live or idle).
    pub fn num_cached(&self) -> usize {
        self.map.len()
    }

    /// Idle cached blocks: refcount 0, all evictable.
    #[inline]
    pub fn idle_count(&self) -> usize {
        self.idle
    }

    /// The block cached under `key` in `group`.
    #[inline]
    pub fn lookup(&self, group: usize, key: BlockKey) -> Option<BlockId> {
        self.map.get(&(group as u32, key)).copied()
    }

    /// Cache live block `b` under `key` in `group`; false (nothing changes) when that key
    /// is already cached in that group or `b` is already cached.
    pub fn insert(&mut self, group: usize, key: BlockKey, b: BlockId) -> bool {
        if self.entry[b.index()].is_some() || self.map.contains_key(&(group as u32, key)) {
            return false;
        }
        self.map.insert((group as u32, key), b);
        self.entry[b.index()] = Some(Entry { group: group as u32, key });
        let t = self.next_touch();
        self.rec[b.index()] = Recency { last_touch: t, stored_at: t, hits: 0, priority: 0 };
        self.stored_blocks += 1;
        true
    }

    /// The group and key `b` is cached under.
    pub fn key_of(&self, b: BlockId) -> Option<(usize, BlockKey)> {
        self.entry[b.index()].map(|e| (e.group as usize, e.key))
    }

    #[inline]
    pub fn is_idle(&self, b: BlockId) -> bool {
        self.queued[b.index()]
    }

    /// The last holder of cached block `b` released it (a use): it becomes idle, queued
    /// for eviction.
    pub fn on_idle(&mut self, b: BlockId) {
        debug_assert!(self.is_cached(b) && !self.queued[b.index()]);
        self.rec[b.index()].last_touch = self.next_touch();
        self.queue.push(b, self.evict_key(b));
        self.queued[b.index()] = true;
        self.idle += 1;
    }

    /// A hit takes idle block `b` back (the caller sets its refcount to 1); it leaves the
    /// queue. The hit itself is counted by [`Self::hit`].
    pub fn revive(&mut self, b: BlockId) {
        debug_assert!(self.queued[b.index()]);
        let found = self.queue.remove(b, self.evict_key(b));
        debug_assert!(found, "queued {b} not found under its key");
        self.queued[b.index()] = false;
        self.idle -= 1;
    }

    /// An admission took cached block `b` as part of its hit (a use), after reviving it if
    /// it was idle.
    pub fn hit(&mut self, b: BlockId) {
        debug_assert!(self.is_cached(b) && !self.queued[b.index()]);
        let t = self.next_touch();
        let r = &mut self.rec[b.index()];
        r.hits += 1;
        r.last_touch = t;
    }

    /// Evict the idle block the policy puts first: it leaves the index and is handed to the
    /// caller as a block with refcount 0 holding nothing.
    pub fn evict(&mut self) -> Option<BlockId> {
        let b = self.queue.pop()?;
        self.queued[b.index()] = false;
        self.idle -= 1;
        if let Some(e) = self.entry[b.index()].take() {
            self.map.remove(&(e.group, e.key));
        }
        self.evictions += 1;
        Some(b)
    }

    /// Forget every cached block: idle ones go to `alloc`'s free list in eviction order,
    /// live ones stay with their holders, uncached. Not evictions; returns the blocks that
    /// were cached.
    pub fn reset(&mut self, alloc: &mut BlockAllocator) -> usize {
        let n = self.map.len();
        while let Some(b) = self.queue.pop() {
            self.queued[b.index()] = false;
            alloc.push_free(b);
        }
        self.idle = 0;
        self.map.clear();
        self.entry.iter_mut().for_each(|e| *e = None);
        n
    }

    /// Idle blocks in eviction order (the policy's first victim first).
    pub fn idle_blocks(&self) -> Vec<BlockId> {
        let mut v: Vec<(EvictKey, BlockId)> = (0..self.queued.len() as u32)
            .map(BlockId)
            .filter(|b| self.queued[b.index()])
            .map(|b| (self.evict_key(b), b))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, b)| b).collect()
    }
}

impl GroupCache {
    /// The index against the allocator: the map and the per-block entries agree, idle
    /// blocks are exactly the cached blocks with refcount 0, each queued under its current
    /// key and counted, and no free block is cached. `holders` lists `(group, block)` for
    /// every stored table entry: a cached block is held only in its own group.
    pub fn check(&self, alloc: &BlockAllocator, holders: impl Iterator<Item = (usize, BlockId)>) -> Result<()> {
        let bad = |m: String| Err(KvError::Invariant(m));
        if self.entry.len() != alloc.num_blocks() {
            return bad(format!("cache sized for {} blocks, pool has {}", self.entry.len(), alloc.num_blocks()));
        }
        for (&(g, k), &b) in &self.map {
            if self.entry[b.index()] != Some(Entry { group: g, key: k }) {
                return bad(format!("{b} is indexed under group {g} key {k:#x} but records {:?}", self.entry[b.index()]));
            }
        }
        let entries = self.entry.iter().filter(|e| e.is_some()).count();
        if entries != self.map.len() {
            return bad(format!("{entries} blocks record a key, the index has {}", self.map.len()));
        }
        let idle = self.idle_blocks();
        if idle.len() != self.idle || self.queue.len() != self.idle {
            return bad(format!("{} blocks marked idle, {} queued, counted {}", idle.len(), self.queue.len(), self.idle));
        }
        for (i, e) in self.entry.iter().enumerate() {
            let b = BlockId(i as u32);
            let rc = alloc.refcount(b);
            if self.queued[i] != (e.is_some() && rc == 0) {
                return bad(format!("{b}: cached {}, refcount {rc}, idle {}", e.is_some(), self.queued[i]));
            }
            if self.queued[i] && !self.queue.contains(b, self.evict_key(b)) {
                return bad(format!("idle {b} is not queued under its key"));
            }
        }
        if let Some(b) = alloc.free_list().iter().find(|b| self.is_cached(**b)) {
            return bad(format!("{b} is on the free list and cached"));
        }
        for (g, b) in holders {
            if let Some(e) = self.entry[b.index()] {
                if e.group as usize != g {
                    return bad(format!("{b} is cached in group {} but held in group {g}", e.group));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_blocks_are_evicted_least_recently_used_first() {
        let mut c = GroupCache::new(8, EvictionPolicy::Lru).unwrap();
        for (i, b) in [3u32, 5, 1, 6].into_iter().enumerate() {
            assert!(c.insert(i % 2, 100 + i as u128, BlockId(b)));
        }
        assert!(!c.insert(0, 100, BlockId(7)), "key taken in its group");
        assert!(c.insert(1, 100, BlockId(7)), "same key, other group");
        for b in [5u32, 3, 6, 1] {
            c.on_idle(BlockId(b));
        }
        c.revive(BlockId(6));
        assert_eq!(c.idle_blocks(), [BlockId(5), BlockId(3), BlockId(1)]);
        assert_eq!(c.evict(), Some(BlockId(5)));
        assert!(!c.is_cached(BlockId(5)) && c.lookup(1, 101).is_none());
        assert_eq!(c.lookup(0, 100), Some(BlockId(3)));
        assert_eq!((c.idle_count(), c.num_cached()), (2, 4));
        assert_eq!(c.evict(), Some(BlockId(3)));
        assert_eq!(c.evict(), Some(BlockId(1)));
        assert_eq!(c.evict(), None);
    }

    #[test]
    fn each_policy_evicts_in_its_order_and_priority_is_refused() {
        assert!(GroupCache::new(4, EvictionPolicy::Priority).is_err());
        // Blocks 0..4 stored in order; 2 and 0 hit once (2 first); released 3, 1, 0, 2.
        let order = |policy| {
            let mut c = GroupCache::new(4, policy).unwrap();
            for b in 0..4u32 {
                assert!(c.insert(0, b as u128, BlockId(b)));
            }
            c.hit(BlockId(2));
            c.hit(BlockId(0));
            for b in [3u32, 1, 0, 2] {
                c.on_idle(BlockId(b));
            }
            let idle = c.idle_blocks();
            let evicted: Vec<BlockId> = std::iter::from_fn(|| c.evict()).collect();
            assert_eq!(idle, evicted, "idle_blocks lists the eviction order");
            evicted.into_iter().map(|b| b.0).collect::<Vec<_>>()
        };
        assert_eq!(order(EvictionPolicy::Lru), [3, 1, 0, 2], "release order");
        assert_eq!(order(EvictionPolicy::Fifo), [0, 1, 2, 3], "store order");
        assert_eq!(order(EvictionPolicy::Lfu), [3, 1, 0, 2], "unhit first, then by last use");
    }

    #[test]
    fn a_revived_block_is_requeued_under_its_new_use() {
        let mut c = GroupCache::new(3, EvictionPolicy::Lfu).unwrap();
        for b in 0..3u32 {
            assert!(c.insert(0, b as u128, BlockId(b)));
            c.on_idle(BlockId(b));
        }
        c.revive(BlockId(0));
        c.hit(BlockId(0));
        c.on_idle(BlockId(0));
        assert_eq!(c.idle_blocks(), [BlockId(1), BlockId(2), BlockId(0)], "the hit block outlives the others");
    }

    #[test]
    fn check_accepts_consistent_states_and_names_what_breaks() {
        let mut a = BlockAllocator::new(4).unwrap();
        let mut c = GroupCache::new(4, EvictionPolicy::Lru).unwrap();
        let (b0, b1) = (a.allocate().unwrap(), a.allocate().unwrap());
        assert!(c.insert(0, 7, b0) && c.insert(1, 7, b1));
        assert_eq!(c.stats(2).stored_blocks, 2);
        let held = [(0usize, b0), (1, b1)];
        c.check(&a, held.into_iter()).unwrap();
        let err = c.check(&a, [(1usize, b0)].into_iter()).unwrap_err();
        assert!(err.to_string().contains("cached in group 0 but held in group 1"), "{err}");
        // Refcount 0 but not idle: a leak the check reports.
        a.decref(b0);
        assert!(c.check(&a, std::iter::empty()).is_err());
        c.on_idle(b0);
        c.check(&a, std::iter::empty()).unwrap();
        c.record_query(40, 16, &[2, 1]);
        c.record_query(8, 0, &[0, 0]);
        let s = c.stats(3);
        assert_eq!((s.queries, s.query_tokens, s.hit_tokens), (2, 48, 16));
        assert_eq!(s.group_hit_blocks, [2, 1, 0]);
        assert_eq!((s.cached_blocks, s.idle_blocks, s.evictions), (2, 1, 0));
    }
}
