//! The idle blocks of a pool with layer groups, in the order its eviction policy evicts
//! them ([`super::cache`]).

use crate::error::{filled, Result};
use crate::prefix_cache::eviction::{EvictKey, EvictionPolicy, EvictionQueue};
use crate::types::BlockId;

/// The idle blocks in eviction order. Under `Lru` a block's key is its release, the newest
/// use of all, so the blocks in release order are in key order: a linked list in release
/// order answers in O(1) (an eviction-heavy replay ran twice as long on the ordered set).
/// Other policies need the ordered set.
#[derive(Clone, Debug)]
pub(super) enum IdleQueue {
    Released(ReleaseList),
    Ordered(EvictionQueue),
}

impl IdleQueue {
    pub(super) fn new(num_blocks: usize, policy: EvictionPolicy) -> Result<Self> {
        Ok(match policy {
            EvictionPolicy::Lru => Self::Released(ReleaseList::new(num_blocks)?),
            _ => Self::Ordered(EvictionQueue::default()),
        })
    }

    pub(super) fn push(&mut self, b: BlockId, k: EvictKey) {
        match self {
            Self::Released(l) => l.push_back(b),
            Self::Ordered(q) => q.insert(k),
        }
    }

    pub(super) fn remove(&mut self, b: BlockId, k: EvictKey) -> bool {
        match self {
            Self::Released(l) => l.remove(b),
            Self::Ordered(q) => q.remove(&k),
        }
    }

    pub(super) fn pop(&mut self) -> Option<BlockId> {
        match self {
            Self::Released(l) => l.pop_front(),
            Self::Ordered(q) => q.pop(),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Self::Released(l) => l.len,
            Self::Ordered(q) => q.len(),
        }
    }

    pub(super) fn contains(&self, b: BlockId, k: EvictKey) -> bool {
        match self {
            Self::Released(l) => l.contains(b),
            Self::Ordered(q) => q.contains(&k),
        }
    }
}

const NIL: u32 = u32::MAX;

/// A doubly linked list of blocks (push at the back, remove anywhere, pop the front).
#[derive(Clone, Debug)]
pub(super) struct ReleaseList {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    len: usize,
}

impl ReleaseList {
    fn new(num_blocks: usize) -> Result<Self> {
        Ok(Self {
            prev: filled(NIL, num_blocks, "prefix cache release list")?,
            next: filled(NIL, num_blocks, "prefix cache release list")?,
            head: NIL,
            tail: NIL,
            len: 0,
        })
    }

    fn contains(&self, b: BlockId) -> bool {
        self.prev[b.index()] != NIL || self.head == b.0
    }

    fn push_back(&mut self, b: BlockId) {
        let i = b.0;
        self.prev[i as usize] = self.tail;
        self.next[i as usize] = NIL;
        if self.tail == NIL {
            self.head = i;
        } else {
            self.next[self.tail as usize] = i;
        }
        self.tail = i;
        self.len += 1;
    }

    fn remove(&mut self, b: BlockId) -> bool {
        if !self.contains(b) {
            return false;
        }
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
        self.len -= 1;
        true
    }

    fn pop_front(&mut self) -> Option<BlockId> {
        let b = (self.head != NIL).then_some(BlockId(self.head))?;
        self.remove(b);
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_list_pushes_back_removes_anywhere_and_pops_the_front() {
        let mut l = ReleaseList::new(6).unwrap();
        for b in [4u32, 0, 5, 2] {
            l.push_back(BlockId(b));
        }
        assert!(l.remove(BlockId(5)) && !l.remove(BlockId(5)) && !l.contains(BlockId(1)));
        assert!(l.remove(BlockId(2)), "the tail");
        l.push_back(BlockId(1));
        let order: Vec<u32> = std::iter::from_fn(|| l.pop_front()).map(|b| b.0).collect();
        assert_eq!((order, l.len), (vec![4, 0, 1], 0));
        assert_eq!(l.pop_front(), None);
    }
}
