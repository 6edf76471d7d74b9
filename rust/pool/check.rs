//! The structural invariants of a pool with layer groups, checked from scratch (tests,
//! the simulator, `check_invariants` from Python).

use super::BlockPool;
use crate::error::{filled, KvError, Result};
use crate::types::BlockId;

const NO_GROUP: u32 = u32::MAX;

fn broken(msg: String) -> KvError {
    KvError::Invariant(msg)
}

impl BlockPool {
    /// Check every invariant; the error names the first one broken:
    /// - each table has `ceil(len / block_size)` entries and its shape (sinks stored, one
    ///   run of window blocks, holes between);
    /// - every block a query at or after the frontier needs is stored (the sinks and the
    ///   blocks meeting `[first_needed(frontier), len)`), every stored block is one the
    ///   release rule keeps for the frontier;
    /// - refcounts equal the references from tables (idle cached blocks at 0), each block
    ///   belongs to one group, the free list is disjoint from held and idle blocks, and
    ///   used + free + idle is the pool.
    pub fn check_invariants(&self) -> Result<()> {
        let n = self.num_blocks();
        let mut refs = filled(0u32, n, "check_invariants")?;
        let mut owner = filled(NO_GROUP, n, "check_invariants")?;
        for (seq, e) in &self.seqs {
            if e.tables.len() != self.groups.len() || e.frontier > e.len {
                return Err(broken(format!(
                    "sequence {} has {} tables for {} groups, frontier {} of length {}",
                    seq.0,
                    e.tables.len(),
                    self.groups.len(),
                    e.frontier,
                    e.len
                )));
            }
            for (g, t) in e.tables.iter().enumerate() {
                let at = |msg: String| broken(format!("sequence {} group {g}: {msg}", seq.0));
                self.check_table(e.len, e.frontier, g, t).map_err(at)?;
                for (i, b) in t.stored() {
                    if b.index() >= n {
                        return Err(at(format!("logical block {i} maps to {b}, outside the pool of {n}")));
                    }
                    refs[b.index()] += 1;
                    if owner[b.index()] != NO_GROUP && owner[b.index()] != g as u32 {
                        return Err(at(format!("{b} is also held by group {}", owner[b.index()])));
                    }
                    owner[b.index()] = g as u32;
                    if let Some(cg) = self.cache.as_ref().and_then(|c| c.group_of(b)) {
                        if cg != g {
                            return Err(at(format!("{b} is cached in group {cg}")));
                        }
                    }
                    // A sequence never reads more tokens of a cached block than it holds.
                    let reads = self.block_size.min(e.len - i * self.block_size);
                    if let Some(held) = self.cache.as_ref().and_then(|c| c.filled(b)).filter(|&h| h < reads) {
                        return Err(at(format!("reads {reads} tokens of cached {b}, which holds {held}")));
                    }
                }
            }
        }
        self.check_counts(&refs)?;
        self.check_cache()
    }

    /// One table against its sequence's length and frontier.
    fn check_table(&self, len: usize, frontier: usize, g: usize, t: &super::group_table::GroupTable) -> Result<(), String> {
        let bs = self.block_size;
        let spec = self.groups[g];
        if t.len_blocks() != len.div_ceil(bs) {
            return Err(format!("{} entries for {len} tokens, expected {}", t.len_blocks(), len.div_ceil(bs)));
        }
        if let Some(msg) = t.shape_error() {
            return Err(msg);
        }
        let sinks = spec.sink_tokens().min(len);
        let first = spec.first_needed(frontier);
        for (i, b) in t.entries().enumerate() {
            let (lo, hi) = (i * bs, ((i + 1) * bs).min(len));
            let needed = lo < sinks || lo.max(first) < hi;
            match b {
                None if needed => {
                    return Err(format!("logical block {i} is a hole but a query at or after {frontier} needs it"))
                }
                Some(b) if spec.releasable(i, bs, frontier) => {
                    return Err(format!("logical block {i} ({b}) is stored but released for frontier {frontier}"))
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn check_counts(&self, refs: &[u32]) -> Result<()> {
        let n = refs.len();
        for (i, (&want, &have)) in refs.iter().zip(self.alloc.refcounts()).enumerate() {
            if want != have {
                return Err(broken(format!("block {i} has refcount {have} but {want} table references")));
            }
        }
        let mut state = filled(0u8, n, "check_invariants")?;
        for &b in self.alloc.free_list() {
            if b.index() >= n || state[b.index()] != 0 {
                return Err(broken(format!("{b} is on the free list twice or outside the pool")));
            }
            state[b.index()] = 1;
            if refs[b.index()] != 0 || self.is_cached(b) {
                return Err(broken(format!("{b} is free but held {} times or cached", refs[b.index()])));
            }
        }
        let idle = match &self.cache {
            Some(c) => {
                let mut idle = 0;
                for b in (0..n as u32).map(BlockId).filter(|&b| c.is_cached(b) && refs[b.index()] == 0) {
                    if state[b.index()] != 0 {
                        return Err(broken(format!("idle {b} is on the free list")));
                    }
                    idle += 1;
                }
                if idle != c.idle_count() {
                    return Err(broken(format!("{idle} cached blocks are held by no sequence, {} counted idle", c.idle_count())));
                }
                idle
            }
            None => 0,
        };
        let used = refs.iter().filter(|&&c| c > 0).count();
        if used + self.alloc.num_free() + idle != n {
            return Err(broken(format!(
                "{used} used + {} free + {idle} idle blocks != {n} total (a block leaked)",
                self.alloc.num_free()
            )));
        }
        let shared = refs.iter().filter(|&&c| c > 1).count();
        if shared != self.alloc.num_shared() {
            return Err(broken(format!("{shared} blocks are shared but the allocator counts {}", self.alloc.num_shared())));
        }
        Ok(())
    }
}
