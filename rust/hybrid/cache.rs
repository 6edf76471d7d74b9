//! The prefix cache of a pool with layer groups: `(group, block key) -> block`, and the
//! idle cached blocks in least-recently-used order.
//!
//! Keys are the chained 128-bit block keys of [`crate::prefix_cache::block_hash`]: a key
//! stands for the whole prefix up to the end of its block, so a hit needs no physical
//! parent, and any idle block may be evicted (a windowed group's early blocks are released
//! long before its later ones; the forest rule of the full-attention cache, leaves first,
//! does not hold here). A block is cached in one group at most.
//!
//! States of a physical block: free (on the allocator's free list), live (refcount > 0,
//! cached or not), idle (refcount 0, cached: on the LRU list, evictable).

use rustc_hash::FxHashMap;

use crate::prefix_cache::block_hash::BlockKey;
use crate::types::BlockId;

const NIL: u32 = u32::MAX;

/// What a cached block is cached as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    group: u32,
    key: BlockKey,
}

/// The index and the LRU list of idle blocks.
#[derive(Clone, Debug)]
pub struct GroupCache {
    map: FxHashMap<(u32, BlockKey), BlockId>,
    entry: Vec<Option<Entry>>,
    /// Doubly linked LRU list of idle blocks (head = least recently used).
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    idle: usize,
    pub(crate) evictions: u64,
}

impl GroupCache {
    pub fn new(num_blocks: usize) -> Self {
        Self {
            map: FxHashMap::default(),
            entry: vec![None; num_blocks],
            prev: vec![NIL; num_blocks],
            next: vec![NIL; num_blocks],
            head: NIL,
            tail: NIL,
            idle: 0,
            evictions: 0,
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
        true
    }

    /// The group and key `b` is cached under.
    pub fn key_of(&self, b: BlockId) -> Option<(usize, BlockKey)> {
        self.entry[b.index()].map(|e| (e.group as usize, e.key))
    }

    #[inline]
    pub fn is_idle(&self, b: BlockId) -> bool {
        self.prev[b.index()] != NIL || self.head == b.0
    }

    /// The last holder of cached block `b` released it: it becomes the most recently used
    /// idle block.
    pub fn on_idle(&mut self, b: BlockId) {
        let i = b.0;
        self.prev[i as usize] = self.tail;
        self.next[i as usize] = NIL;
        if self.tail == NIL {
            self.head = i;
        } else {
            self.next[self.tail as usize] = i;
        }
        self.tail = i;
        self.idle += 1;
    }

    /// A hit takes idle block `b` back (the caller sets its refcount to 1).
    pub fn revive(&mut self, b: BlockId) {
        let i = b.index();
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.idle -= 1;
    }

    /// Evict the least recently used idle block: it leaves the index and is handed to the
    /// caller as a block with refcount 0 holding nothing.
    pub fn evict(&mut self) -> Option<BlockId> {
        if self.head == NIL {
            return None;
        }
        let b = BlockId(self.head);
        self.revive(b);
        if let Some(e) = self.entry[b.index()].take() {
            self.map.remove(&(e.group, e.key));
        }
        self.evictions += 1;
        Some(b)
    }

    /// Idle blocks from least to most recently used.
    pub fn idle_blocks(&self) -> Vec<BlockId> {
        let mut v = Vec::with_capacity(self.idle);
        let mut i = self.head;
        while i != NIL {
            v.push(BlockId(i));
            i = self.next[i as usize];
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_blocks_are_evicted_least_recently_used_first() {
        let mut c = GroupCache::new(8);
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
}
