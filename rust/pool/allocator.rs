//! The block allocator: a reference count per physical block and a free list.
//!
//! Allocation and release are O(1): the free list is a stack of block ids, so the most
//! recently freed block (likely still warm in cache) is reused first. The allocator knows
//! nothing about sequences; [`crate::pool::BlockPool`] decides what a block holds.

use crate::error::{KvError, Result};
use crate::types::BlockId;

/// Largest pool accepted: table entries are int32 and a refcount array of this size is
/// already 4 GiB, so anything larger is a caller error, not a real configuration.
pub const MAX_BLOCKS: usize = 1 << 30;

/// Fixed set of blocks with refcounts and a LIFO free list.
#[derive(Clone, Debug)]
pub struct BlockAllocator {
    refcounts: Vec<u32>,
    free: Vec<BlockId>,
    /// Blocks with a refcount above 1. While it is 0 no copy-on-write can be pending, and
    /// the decode hot path skips reading the refcount of every sequence's last block.
    shared: usize,
}

impl BlockAllocator {
    /// A pool of `num_blocks` free blocks. Block 0 is handed out first.
    pub fn new(num_blocks: usize) -> Result<Self> {
        if num_blocks == 0 || num_blocks > MAX_BLOCKS {
            return Err(KvError::InvalidArgument(format!(
                "num_blocks must be in 1..={MAX_BLOCKS}, got {num_blocks}"
            )));
        }
        let mut refcounts = Vec::new();
        let mut free = Vec::new();
        // A caller can ask for up to MAX_BLOCKS; fail cleanly if the host cannot hold it.
        refcounts
            .try_reserve_exact(num_blocks)
            .and_then(|_| free.try_reserve_exact(num_blocks))
            .map_err(|_| {
                KvError::InvalidArgument(format!("cannot allocate bookkeeping for {num_blocks} blocks"))
            })?;
        refcounts.resize(num_blocks, 0);
        free.extend((0..num_blocks as u32).rev().map(BlockId));
        Ok(Self { refcounts, free, shared: 0 })
    }

    #[inline]
    pub fn num_blocks(&self) -> usize {
        self.refcounts.len()
    }

    #[inline]
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    #[inline]
    pub fn refcount(&self, b: BlockId) -> u32 {
        self.refcounts[b.index()]
    }

    /// Take a free block with refcount 1, or `None` when the free list is empty.
    #[inline]
    pub fn allocate(&mut self) -> Option<BlockId> {
        let b = self.free.pop()?;
        debug_assert_eq!(self.refcounts[b.index()], 0);
        self.refcounts[b.index()] = 1;
        Some(b)
    }

    /// Add a reference to a live block (fork, prefix hit).
    #[inline]
    pub fn incref(&mut self, b: BlockId) {
        let rc = &mut self.refcounts[b.index()];
        *rc += 1;
        if *rc == 2 {
            self.shared += 1;
        }
    }

    /// Drop a reference; returns the new count. A block reaching zero is *not* put back
    /// on the free list here: the owner decides (a prefix cache may keep it).
    #[inline]
    pub fn decref(&mut self, b: BlockId) -> u32 {
        let rc = &mut self.refcounts[b.index()];
        debug_assert!(*rc > 0, "decref of free {b}");
        if *rc == 2 {
            self.shared -= 1;
        }
        *rc -= 1;
        *rc
    }

    /// Return a block whose refcount is zero to the free list.
    #[inline]
    pub fn push_free(&mut self, b: BlockId) {
        debug_assert_eq!(self.refcounts[b.index()], 0);
        self.free.push(b);
    }

    /// Free `blocks`, each holding exactly one reference, onto the free list in order:
    /// what [`Self::release`] on each in turn does, without a branch per block.
    pub fn release_unshared(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            let rc = &mut self.refcounts[b.index()];
            debug_assert_eq!(*rc, 1, "release_unshared of {b}");
            *rc = 0;
        }
        self.free.extend_from_slice(blocks);
    }

    /// Drop a reference and free the block when it was the last one.
    #[inline]
    pub fn release(&mut self, b: BlockId) {
        if self.decref(b) == 0 {
            self.free.push(b);
        }
    }

    /// Refcount of a block that has been taken out of the free list by another path
    /// (a prefix-cache revival); the caller guarantees it is not on the free list.
    #[inline]
    pub fn revive(&mut self, b: BlockId) {
        debug_assert_eq!(self.refcounts[b.index()], 0);
        self.refcounts[b.index()] = 1;
    }

    /// Blocks referenced more than once.
    #[inline]
    pub fn num_shared(&self) -> usize {
        self.shared
    }

    pub fn free_list(&self) -> &[BlockId] {
        &self.free
    }

    pub fn refcounts(&self) -> &[u32] {
        &self.refcounts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_unshared_is_release_in_order() {
        let mut a = BlockAllocator::new(64).unwrap();
        let mut b = BlockAllocator::new(64).unwrap();
        let taken: Vec<BlockId> = (0..40).map(|_| a.allocate().unwrap()).collect();
        let _: Vec<BlockId> = (0..40).map(|_| b.allocate().unwrap()).collect();
        // Scattered ids, as a sequence's table holds after churn.
        let table: Vec<BlockId> = taken.iter().copied().filter(|x| x.0 % 3 != 1).rev().collect();
        a.release_unshared(&table);
        for &x in &table {
            b.release(x);
        }
        assert_eq!(a.free_list(), b.free_list());
        assert_eq!(a.refcounts(), b.refcounts());
        assert_eq!((a.num_free(), a.num_shared()), (b.num_free(), b.num_shared()));
    }

    #[test]
    fn allocates_in_order_and_reuses_last_freed() {
        let mut a = BlockAllocator::new(3).unwrap();
        assert_eq!(a.allocate(), Some(BlockId(0)));
        assert_eq!(a.allocate(), Some(BlockId(1)));
        a.release(BlockId(0));
        assert_eq!(a.allocate(), Some(BlockId(0)));
        assert_eq!(a.allocate(), Some(BlockId(2)));
        assert_eq!(a.allocate(), None);
        assert_eq!(a.num_free(), 0);
    }

    #[test]
    fn shared_block_freed_on_last_release() {
        let mut a = BlockAllocator::new(1).unwrap();
        let b = a.allocate().unwrap();
        a.incref(b);
        a.release(b);
        assert_eq!(a.num_free(), 0);
        assert_eq!(a.refcount(b), 1);
        a.release(b);
        assert_eq!(a.num_free(), 1);
    }

    #[test]
    fn counts_shared_blocks() {
        let mut a = BlockAllocator::new(2).unwrap();
        let (b, c) = (a.allocate().unwrap(), a.allocate().unwrap());
        a.incref(b);
        a.incref(b);
        a.incref(c);
        assert_eq!(a.num_shared(), 2);
        a.release(b);
        assert_eq!(a.num_shared(), 2);
        a.release(b);
        a.release(c);
        assert_eq!(a.num_shared(), 0);
        a.release(b);
        a.release(c);
        assert_eq!((a.num_shared(), a.num_free()), (0, 2));
    }

    #[test]
    fn rejects_zero_and_absurd_sizes() {
        assert!(BlockAllocator::new(0).is_err());
        assert!(BlockAllocator::new(MAX_BLOCKS + 1).is_err());
    }
}
