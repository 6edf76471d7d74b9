//! Eviction order of idle cached blocks (refcount 0, holding reusable KV).
//!
//! Only *leaves* of the cache tree are ever candidates: a block is queued when it is idle,
//! not hard-pinned and has no cached child. A parent therefore always outlives its
//! children, which gives "within a sequence the tail is evicted before the head" for every
//! policy, and guarantees that a cached block's parent is cached (lookups need the chain).
//! An allocation takes never-cached free blocks first and evicts only when there are none.
//!
//! # Specification
//!
//! A cached block is *used* (the event LRU orders by, and LFU and priority break ties by)
//! when, and only when:
//!
//! 1. it is **stored**: registered in the cache by an admission or an append that filled it;
//! 2. it is **hit**: an admission's lookup matches it, whether the admission takes it or
//!    the last-token rule leaves it to be recomputed (or copied, `cow_partial_hit`);
//! 3. it is **released**: its last holder drops it and it becomes idle (`free`,
//!    `truncate`, a copy-on-write away from it, the end of a copy-on-write hit).
//!
//! Nothing else uses a block: not `cached_prefix_len`, pins and unpins, forks, appends or
//! decode steps by sequences that already hold it, nor a call that fails (it changes
//! nothing). Uses are totally ordered: calls in the order they are made, and within one
//! call
//!
//! - an admission: its hits, root first; then the allocation of the blocks it computes
//!   (evicting as needed); then, with a copy-on-write hit, the release of the copied
//!   block (held during the allocation); then its stores, root first;
//! - an append (`append`, `append_tokens`, `step`): the copy of a shared or cached partly
//!   filled last block first (a block for the copy is taken, then the original
//!   released), then the new blocks, then (`append_tokens`) the stores of the blocks it
//!   filled, in order; a `step` does this sequence by sequence, in the order given;
//! - `free` and `free_batch` release each sequence's blocks head first, sequences in the
//!   order given; `truncate` releases the dropped blocks tail first. (The blocks one
//!   sequence releases form one chain, where a child is always evicted before its parent,
//!   so their order among themselves is never observable.)
//!
//! In a pool with layer groups the same rules hold per call, with these orders inside one
//! (`rust/pool/`): an admission's hits group by group, each group's blocks in logical
//! order, then its stores group by group; a growth's window releases (sequence by sequence,
//! each group's released blocks in logical order) before its new blocks; `free`, in a pool
//! with a windowed group, releases logical block by logical block, tail first, across all
//! groups (with full groups only, as above). So of the blocks one
//! window step releases together the *earlier* one was used first and goes first under
//! `Lru`: least recently used by *last attention*, since the last query that attends to a
//! windowed block is at its end plus the window, earlier for an earlier block. (vLLM frees
//! them later-first only because its sliding-window manager scans the skipped blocks
//! backwards; no query distinguishes them.) A full group's hits are its whole matched
//! chain, as above; a windowed group's are only the blocks the taken hit needs (its sinks
//! and window: what the admission holds). A windowed group's blocks are never parents, so
//! each idle one is a leaf and may be evicted.
//!
//! `hits` counts rule 2 since the block was stored. The *retention priority* of a block is
//! the largest priority among its live soft pins, 0 without. The policies evict, among the
//! idle, not hard-pinned leaves:
//!
//! | policy     | evicted first                                            |
//! |------------|----------------------------------------------------------|
//! | `Lru`      | least recently used                                      |
//! | `Fifo`     | earliest stored                                          |
//! | `Lfu`      | fewest hits, then least recently used                    |
//! | `Priority` | lowest retention priority, then least recently used      |
//!
//! Time is logical: uses are numbered by a counter (`touch`), never the wall clock, so
//! the order is total and a run is exactly reproducible.

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
            .ok_or_else(|| {
                let names: Vec<&str> = EvictionPolicy::ALL.iter().map(|p| p.name()).collect();
                crate::invalid!("unknown eviction policy {s:?}: expected one of {}", names.join(", "))
            })
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
///
/// Evicting a chain tail-first makes each victim's parent the next leaf, almost always
/// with the smallest key of all (it was touched just before its child). `front` holds
/// such a minimum outside the tree, so evicting a chain of n blocks costs n comparisons
/// instead of n tree inserts and n tree pops. Invariant: `front`, when set, is smaller
/// than every key in `set`.
#[derive(Clone, Debug, Default)]
pub struct EvictionQueue {
    front: Option<EvictKey>,
    set: BTreeSet<EvictKey>,
}

impl EvictionQueue {
    #[inline]
    pub fn insert(&mut self, k: EvictKey) {
        match self.front {
            Some(f) if k < f => {
                self.set.insert(f);
                self.front = Some(k);
            }
            Some(_) => {
                let fresh = self.set.insert(k);
                debug_assert!(fresh, "block queued twice");
            }
            None if self.set.first().is_none_or(|&m| k < m) => self.front = Some(k),
            None => {
                let fresh = self.set.insert(k);
                debug_assert!(fresh, "block queued twice");
            }
        }
    }

    #[inline]
    pub fn remove(&mut self, k: &EvictKey) -> bool {
        if self.front.as_ref() == Some(k) {
            self.front = None;
            return true;
        }
        self.set.remove(k)
    }

    /// The next victim, removed from the queue.
    #[inline]
    pub fn pop(&mut self) -> Option<BlockId> {
        self.front.take().or_else(|| self.set.pop_first()).map(|k| BlockId(k.2))
    }

    /// The next victim, left in the queue (the tests' view of the order).
    #[cfg(test)]
    pub fn peek(&self) -> Option<BlockId> {
        self.front.or_else(|| self.set.first().copied()).map(|k| BlockId(k.2))
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.set.len() + self.front.is_some() as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, k: &EvictKey) -> bool {
        self.front.as_ref() == Some(k) || self.set.contains(k)
    }

    /// The queued blocks, the next victim first.
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.front.iter().chain(self.set.iter()).map(|k| BlockId(k.2))
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

    #[test]
    fn front_slot_keeps_the_order() {
        // Any sequence of inserts, removals and pops must behave like a plain sorted set.
        let mut q = EvictionQueue::default();
        let mut model = BTreeSet::new();
        let mut x: u64 = 12345;
        for step in 0..5000u32 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let k: EvictKey = ((x >> 40) % 64, 0, step);
            match (x >> 20) % 4 {
                0 | 1 => {
                    q.insert(k);
                    model.insert(k);
                }
                2 => {
                    if let Some(&m) = model.iter().nth(((x >> 8) % 8) as usize) {
                        assert!(q.remove(&m));
                        model.remove(&m);
                    }
                }
                _ => assert_eq!(q.pop(), model.pop_first().map(|k| BlockId(k.2))),
            }
            assert_eq!(q.len(), model.len());
            assert_eq!(q.peek(), model.first().map(|k| BlockId(k.2)));
        }
    }
}
