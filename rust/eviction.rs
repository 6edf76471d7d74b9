//! Eviction order of idle cached blocks (refcount 0, holding reusable KV).
//!
//! Only *leaves* of the cache tree are ever candidates: a block is queued when it is idle,
//! not hard-pinned and has no cached child. A parent therefore always outlives its
//! children, which gives "within a sequence the tail is evicted before the head" for every
//! policy, and guarantees that a cached block's parent is cached (lookups need the chain).
//!
//! Time is logical: `touch` is a counter the cache bumps on every access (hit, store,
//! release), never the wall clock, so a run is exactly reproducible. The order is total
//! (the touch counter is unique per access), hence deterministic:
//!
//! | policy     | evicted first                                          |
//! |------------|--------------------------------------------------------|
//! | `Lru`      | least recently touched                                 |
//! | `Fifo`     | earliest stored                                        |
//! | `Lfu`      | fewest hits, then least recently touched               |
//! | `Priority` | lowest retention priority (see pins), then LRU         |

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use crate::error::KvError;
use crate::types::BlockId;

/// Which idle cached block an allocation reclaims first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum EvictionPolicy {
    #[default]
    Lru,
    Fifo,
    Lfu,
    Priority,
}

impl EvictionPolicy {
    pub const ALL: [EvictionPolicy; 4] =
        [EvictionPolicy::Lru, EvictionPolicy::Fifo, EvictionPolicy::Lfu, EvictionPolicy::Priority];

    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Fifo => "fifo",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Priority => "priority",
        }
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EvictionPolicy {
    type Err = KvError;
    fn from_str(s: &str) -> Result<Self, KvError> {
        EvictionPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| crate::invalid!("unknown eviction policy {s:?}: expected lru, fifo, lfu or priority"))
    }
}

/// What a policy reads about a block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recency {
    /// Touch counter value of the last access.
    pub last_touch: u64,
    /// Touch counter value when the block was stored.
    pub stored_at: u64,
    /// Lookup hits since the block was stored.
    pub hits: u64,
    /// Retention priority (0 unless a soft pin raised it).
    pub priority: u32,
}

/// Sort key of a queued block: smaller is evicted first. The block id is a final
/// tie-break that never decides in practice (touch counters are unique).
pub type EvictKey = (u64, u64, u32);

impl EvictionPolicy {
    #[inline]
    pub fn key(self, r: &Recency, b: BlockId) -> EvictKey {
        match self {
            EvictionPolicy::Lru => (r.last_touch, 0, b.0),
            EvictionPolicy::Fifo => (r.stored_at, 0, b.0),
            EvictionPolicy::Lfu => (r.hits, r.last_touch, b.0),
            EvictionPolicy::Priority => (r.priority as u64, r.last_touch, b.0),
        }
    }
}

/// The ordered set of evictable leaves.
#[derive(Clone, Debug, Default)]
pub struct EvictionQueue {
    set: BTreeSet<EvictKey>,
}

impl EvictionQueue {
    #[inline]
    pub fn insert(&mut self, k: EvictKey) {
        let fresh = self.set.insert(k);
        debug_assert!(fresh, "block queued twice");
    }

    #[inline]
    pub fn remove(&mut self, k: &EvictKey) -> bool {
        self.set.remove(k)
    }

    /// The next victim, removed from the queue.
    #[inline]
    pub fn pop(&mut self) -> Option<BlockId> {
        self.set.pop_first().map(|k| BlockId(k.2))
    }

    /// The next victim, left in the queue.
    pub fn peek(&self) -> Option<BlockId> {
        self.set.first().map(|k| BlockId(k.2))
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.set.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    pub fn contains(&self, k: &EvictKey) -> bool {
        self.set.contains(k)
    }

    pub fn clear(&mut self) {
        self.set.clear()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_policy_and_rejects_others() {
        for p in EvictionPolicy::ALL {
            assert_eq!(p.name().parse::<EvictionPolicy>().unwrap(), p);
        }
        assert!("LRU ".parse::<EvictionPolicy>().is_err());
    }

    #[test]
    fn keys_order_as_documented() {
        let old = Recency { last_touch: 1, stored_at: 9, hits: 5, priority: 2 };
        let new = Recency { last_touch: 8, stored_at: 2, hits: 1, priority: 1 };
        let (a, b) = (BlockId(0), BlockId(1));
        assert!(EvictionPolicy::Lru.key(&old, a) < EvictionPolicy::Lru.key(&new, b));
        assert!(EvictionPolicy::Fifo.key(&new, b) < EvictionPolicy::Fifo.key(&old, a));
        assert!(EvictionPolicy::Lfu.key(&new, b) < EvictionPolicy::Lfu.key(&old, a));
        assert!(EvictionPolicy::Priority.key(&new, b) < EvictionPolicy::Priority.key(&old, a));
        let mut q = EvictionQueue::default();
        q.insert(EvictionPolicy::Lru.key(&new, b));
        q.insert(EvictionPolicy::Lru.key(&old, a));
        assert_eq!(q.peek(), Some(a));
        assert_eq!(q.pop(), Some(a));
        assert_eq!(q.pop(), Some(b));
        assert!(q.is_empty());
    }
}
