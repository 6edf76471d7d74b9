//! The prefix cache's invariants, checked against the allocator by
//! `BlockPool::check_invariants`.

use super::{slot, PrefixCache, IDLE, LINEAGE, NO_PARENT, QUEUED};
use crate::pool::allocator::BlockAllocator;
use crate::error::{filled, KvError, Result};
use crate::types::BlockId;

impl PrefixCache {
    /// Check the cache against the allocator. Called by the pool after it checked
    /// refcounts against tables.
    pub fn check(&self, alloc: &BlockAllocator) -> Result<()> {
        let bad = |msg: String| Err(KvError::Invariant(msg));
        let n = self.meta.len();
        if !self.unmapped.is_empty() {
            return bad(format!("{} evicted blocks are still in the index", self.unmapped.len()));
        }
        let mut children = filled(0u32, n, "check_invariants")?;
        let mut hard = filled(0u32, n, "check_invariants")?;
        let (mut cached, mut idle, mut evictable, mut queued) = (0usize, 0usize, 0usize, 0usize);
        for (&k, &b) in &self.map {
            if !self.is_cached(b) || slot(self.meta[b.index()].group, self.meta[b.index()].key, self.meta[b.index()].partial) != k {
                return bad(format!("key {k:#x} maps to {b}, which does not map back to it"));
            }
        }
        let valid = self.map.len();
        for (i, m) in self.meta.iter().enumerate() {
            let b = BlockId(i as u32);
            let rc = alloc.refcount(b);
            if !self.is_cached(b) {
                if m.has(IDLE) || m.has(QUEUED) || m.has(LINEAGE) || m.children != 0 || m.hard_pins != 0 || self.soft.contains_key(&b.0) {
                    return bad(format!("{b} is not cached but idle, queued, pinned or a parent"));
                }
                continue;
            }
            cached += 1;
            if m.partial as usize >= self.block_size {
                return bad(format!("cached {b} is marked partly filled with {} tokens of {}", m.partial, self.block_size));
            }
            if self.index_get(m.group, m.key, m.partial) != Some(b) {
                return bad(format!("cached {b} has key {:#x}, which maps elsewhere", m.key));
            }
            if m.has(IDLE) != (rc == 0) {
                return bad(format!("cached {b} has refcount {rc} but idle = {}", m.has(IDLE)));
            }
            if m.group as usize >= self.windowed.len() {
                return bad(format!("cached {b} records group {} of {}", m.group, self.windowed.len()));
            }
            if m.has(LINEAGE) && !self.windowed[m.group as usize] {
                return bad(format!("{b} of full group {} stands on a lineage", m.group));
            }
            if m.parent != NO_PARENT && self.windowed[m.group as usize] {
                return bad(format!("{b} of windowed group {} has a parent", m.group));
            }
            if m.parent != NO_PARENT {
                let p = &self.meta[m.parent as usize];
                if p.group != m.group {
                    return bad(format!("{b} of group {} has a parent in group {}", m.group, p.group));
                }
                if !self.is_cached(BlockId(m.parent)) || p.depth + 1 != m.depth {
                    return bad(format!("cached {b} has a parent that is not cached one level up"));
                }
                if p.partial != 0 {
                    return bad(format!("cached {b} has a partly filled parent block {}", m.parent));
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
        let standing = self.cached_blocks().filter(|b| self.meta[b.index()].has(LINEAGE)).map(|b| self.meta[b.index()].key);
        self.lineage.check(standing).or_else(bad)?;
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
