//! Rolling a sequence back past its window: [`BlockPool::truncate`] refuses to go back to
//! a length whose queries need blocks the window rule released; a rewind allocates those
//! again instead, and says which, for the caller to fill (from a copy it kept, or by
//! computing them again). A video stream returning to an earlier frame is the use.

use super::group_table::{GroupTable, GroupTables};
use super::BlockPool;
use crate::error::{KvError, Result};
use crate::invalid;
use crate::types::SeqId;

impl BlockPool {
    /// Roll `seq` back to `len` tokens (at most its length): every group keeps the blocks
    /// it holds that a query at `len` needs, allocates fresh ones (never cached) where such
    /// a block was released, and releases the rest. The frontier becomes `len`. Returns,
    /// per group, the logical blocks allocated afresh, in order: their K/V is the
    /// caller's to write before anything attends to them. Atomic: `PoolExhausted` (nothing
    /// changed) when the free blocks, counting those the rollback frees, are too few.
    pub fn rewind(&mut self, seq: SeqId, len: usize) -> Result<Vec<Vec<usize>>> {
        let bs = self.block_size;
        let e = self.entry(seq)?;
        if len > e.len {
            return Err(invalid!("num_tokens: cannot rewind sequence {} of {} tokens to {len}", seq.0, e.len));
        }
        let nb = len.div_ceil(bs);
        // A kept block must hold K/V from its start (not one taken at a hole).
        let keep = |spec: &super::GroupSpec, t: &GroupTable, i: usize| -> Option<crate::types::BlockId> {
            (i < nb && !spec.releasable(i, bs, len) && t.fully_written(i)).then(|| t.get(i)).flatten()
        };
        let (mut need, mut gained) = (0, 0);
        for (spec, t) in self.groups.iter().zip(e.tables.iter()) {
            need += (0..nb).filter(|&i| !spec.releasable(i, bs, len) && keep(spec, t, i).is_none()).count();
            for (i, b) in t.stored() {
                let unshared = self.alloc.refcount(b) == 1 && !self.is_hard_pinned(b);
                gained += usize::from(keep(spec, t, i).is_none() && unshared);
            }
        }
        self.ensure_available(need, gained)?;
        let mut e = self.seqs.remove(&seq).ok_or(KvError::UnknownSequence(seq.0))?;
        let mut tables = GroupTables::with_capacity(self.groups.len());
        let mut fresh = Vec::with_capacity(self.groups.len());
        for (spec, old) in self.groups.clone().iter().zip(e.tables.iter()) {
            let kept: Vec<_> = (0..nb).map(|i| keep(spec, old, i)).collect();
            for (i, b) in old.stored() {
                if kept.get(i).copied().flatten() != Some(b) {
                    self.release_block(b);
                }
            }
            let (mut t, mut new) = (GroupTable::with_capacity(*spec, bs, nb), Vec::new());
            for (i, k) in kept.into_iter().enumerate() {
                match k {
                    _ if spec.releasable(i, bs, len) => t.push_hole()?,
                    Some(b) => t.push(b),
                    None => {
                        t.push(self.take_block()?);
                        new.push(i);
                    }
                }
            }
            tables.push(t);
            fresh.push(new);
        }
        e.tables = tables;
        (e.len, e.frontier, e.prev_frontier) = (len, len, len);
        if let Some(c) = e.cursor.as_mut() {
            c.truncate(len, bs);
        }
        self.seqs.insert(seq, e);
        self.end_op();
        Ok(fresh)
    }
}
