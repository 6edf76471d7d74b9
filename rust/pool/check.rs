//! The pool's structural invariants, checked from scratch (for tests and the simulator's
//! `check_invariants`).

use super::block_table::blocks_for;
use super::BlockPool;
use crate::error::{filled, KvError, Result};

impl BlockPool {
    /// Check every structural invariant; the error names the first one broken.
    pub fn check_invariants(&self) -> Result<()> {
        let n = self.num_blocks();
        let bs = self.block_size;
        let mut expected = filled(0u32, n, "check_invariants")?;
        for (seq, e) in &self.seqs {
            let t = &e.table;
            let want = blocks_for(t.num_tokens(), bs);
            if t.blocks().len() != want {
                return Err(KvError::Invariant(format!(
                    "sequence {} holds {} tokens in {} blocks, expected ceil({}/{bs}) = {want}",
                    seq.0,
                    t.num_tokens(),
                    t.blocks().len(),
                    t.num_tokens()
                )));
            }
            if t.last() != t.blocks().last().copied() {
                return Err(KvError::Invariant(format!(
                    "sequence {} caches {:?} as its last block but its table ends with {:?}",
                    seq.0,
                    t.last(),
                    t.blocks().last()
                )));
            }
            for (i, &b) in t.blocks().iter().enumerate() {
                if b.index() >= n {
                    return Err(KvError::Invariant(format!("sequence {} maps to {b}, outside the pool of {n}", seq.0)));
                }
                expected[b.index()] += 1;
                // A sequence never reads more tokens of a cached block than it holds.
                let reads = bs.min(t.num_tokens() - i * bs);
                if let Some(held) = self.cache.as_ref().and_then(|c| c.filled(b)).filter(|&h| h < reads) {
                    return Err(KvError::Invariant(format!(
                        "sequence {} reads {reads} tokens of cached {b}, which holds {held}",
                        seq.0
                    )));
                }
            }
        }
        for (i, (&want, &have)) in expected.iter().zip(self.alloc.refcounts()).enumerate() {
            if want != have {
                return Err(KvError::Invariant(format!(
                    "block {i} has refcount {have} but {want} table references"
                )));
            }
        }
        let mut on_free = filled(false, n, "check_invariants")?;
        for &b in self.alloc.free_list() {
            if b.index() >= n {
                return Err(KvError::Invariant(format!("free list holds {b}, outside the pool of {n}")));
            }
            if on_free[b.index()] {
                return Err(KvError::Invariant(format!("{b} is on the free list twice")));
            }
            on_free[b.index()] = true;
            if expected[b.index()] != 0 {
                return Err(KvError::Invariant(format!("{b} is free but referenced {} times", expected[b.index()])));
            }
        }
        let shared = expected.iter().filter(|&&c| c > 1).count();
        if shared != self.alloc.num_shared() {
            return Err(KvError::Invariant(format!(
                "{shared} blocks are shared but the allocator counts {}",
                self.alloc.num_shared()
            )));
        }
        let used = expected.iter().filter(|&&c| c > 0).count();
        let idle = self.cache.as_ref().map_or(0, |c| c.idle_count());
        if used + self.alloc.num_free() + idle != n {
            return Err(KvError::Invariant(format!(
                "{used} used + {} free + {idle} idle cached blocks != {n} total (a block leaked)",
                self.alloc.num_free()
            )));
        }
        match &self.cache {
            Some(c) => c.check(&self.alloc),
            None => Ok(()),
        }
    }
}
