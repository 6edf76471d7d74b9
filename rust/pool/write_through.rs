//! When write-through copies a cached block: once its KV is computed. The cache registers
//! some blocks before that (an admission by tokens or keys, an append registers the
//! blocks its tokens fill, which the caller computes next), so the pool keeps each
//! registered block pending with its sequence and copies it through at the end of the
//! first call after which
//!
//! - the sequence's frontier (the first query of its latest growth, or its length after
//!   `mark_computed`) is at or past the block's last token, or
//! - the sequence is freed (from then on the cache serves the block as computed anyway).
//!
//! A pending block its sequence no longer holds at that index (a truncation, a twin
//! adopted in its place), or that is no longer cached (a reset), is forgotten. Blocks an
//! admission loads from a tier are not copied back: they go down again when evicted.

use super::BlockPool;
use crate::types::SeqId;

impl BlockPool {
    /// Copy through every pending block whose KV is computed (`freed`: a sequence about
    /// to be freed, whose blocks all count as computed); forget those that are stale.
    pub(crate) fn copy_computed_through(&mut self, freed: Option<SeqId>) {
        let mut pending = std::mem::take(&mut self.through);
        pending.retain(|p| {
            let Some(e) = self.seqs.get(&p.seq) else { return false };
            if freed != Some(p.seq) && e.frontier < p.end {
                return true;
            }
            let held = e.tables.get(p.group).and_then(|t| t.get(p.index)) == Some(p.block);
            if let Some(c) = self.cache.as_deref_mut().filter(|_| held) {
                c.write_through(p.block);
            }
            false
        });
        // A call during the copies cannot pend more: append what is left.
        pending.append(&mut self.through);
        self.through = pending;
    }
}
