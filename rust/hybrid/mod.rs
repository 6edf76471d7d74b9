//! Layer groups in one pool: several attention kinds (full, sliding window with sinks,
//! chunked) sharing one physical block space, one block table per (sequence, group).
//!
//! The contract (positions, the release rule, holes, exports), in short: a sequence has one logical length; each group's table has
//! `ceil(len / block_size)` logical entries, each a block or a hole; at the start of every
//! growth a windowed group releases the blocks no query of that growth or a later one needs
//! (those blocks count as available for the same growth); a block belongs to one group.
//!
//! Files: the leaves ([`spec`] the attention kinds, [`table`] one (sequence, group) table),
//! this file
//! (`HybridPool`, its block accounting, fork, truncate, free), and the `impl HybridPool`
//! files that read it and are never read by it:
//! `step` (admission and growth: release, plan, check, apply; the one-pass decode),
//! [`prefix`] (prefix caching on the groups, on the one [`PrefixCache`]),
//! `exports` (tables, FlashInfer's layout, stored ranges, statistics) and `check`
//! (invariants).
//!
//! Every call validates and counts first and mutates only when it will succeed: an error
//! leaves every group of every sequence as it was; batches are atomic.

use crate::error::{KvError, Result};
use crate::invalid;
use crate::pool::allocator::BlockAllocator;
use crate::pool::seq_map::SeqMap;
use crate::pool::block_table;
use crate::pool::MAX_BLOCK_SIZE;
use crate::prefix_cache::cursor::TokenCursor;
use crate::prefix_cache::PrefixCache;
use crate::types::{BlockId, SeqId};
use table::{GroupTable, GroupTables};

mod check;
mod exports;
pub mod prefix;
pub mod spec;
mod step;
pub mod table;
#[cfg(test)]
mod tests;

pub use spec::GroupSpec;

/// Most groups a pool accepts.
pub const MAX_GROUPS: usize = 64;

/// One live sequence: its logical length, frontier and one table per group. `repr(C)`:
/// what a decode step reads (length, mark, the first group's hot fields) shares a line.
#[derive(Clone, Debug)]
#[repr(C)]
pub(crate) struct HybridEntry {
    /// Logical length in tokens.
    pub(crate) len: usize,
    /// First query position of the latest growth (the length before it).
    pub(crate) frontier: usize,
    /// Last batch this sequence appeared in (duplicate ids in one batch).
    pub(crate) mark: u64,
    /// The frontier before the latest one-pass decode (to undo it).
    pub(crate) prev_frontier: usize,
    /// One table per group, in group order.
    pub(crate) tables: GroupTables,
    /// Token ids and block keys of a sequence admitted by tokens (prefix caching); dropped
    /// when it grows by tokens the pool does not see.
    pub(crate) cursor: Option<Box<TokenCursor>>,
}

/// Outputs of an admission or a step, reusable across calls.
#[derive(Clone, Debug, Default)]
pub struct HybridStepOutput {
    /// Slot of every new token in every group, group-major: `slots[g * total_tokens + t]`.
    pub slots: Vec<i64>,
    /// New tokens of the call (the width of `slots`).
    pub total_tokens: usize,
    /// Copy-on-write pairs `(src, dst)` of every group (a block belongs to one group).
    pub cow: Vec<(BlockId, BlockId)>,
    /// Length of each sequence after the call, in tokens.
    pub seq_lens: Vec<i32>,
}

impl HybridStepOutput {
    pub fn clear(&mut self) {
        self.slots.clear();
        self.total_tokens = 0;
        self.cow.clear();
        self.seq_lens.clear();
    }
}

/// Occupancy of a pool with layer groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HybridStats {
    pub block_size: usize,
    pub total_blocks: usize,
    /// Free plus idle cached blocks (what an allocation can take).
    pub free_blocks: usize,
    /// Blocks held by at least one sequence.
    pub used_blocks: usize,
    pub num_seqs: usize,
    /// Sum of logical sequence lengths, in tokens.
    pub logical_tokens: u64,
    pub cow_copies: u64,
    pub idle_cached_blocks: usize,
    /// Per group: distinct blocks its tables hold.
    pub group_blocks: Vec<usize>,
    /// Per group: distinct filled slots of those blocks (a shared token counts once).
    pub group_stored_tokens: Vec<u64>,
    /// Per group: hole entries summed over sequences.
    pub group_holes: Vec<u64>,
}

/// What one visit of the one-pass decode did to a table (batch index, group), for undo.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Undo {
    /// Released this many blocks from the front of the window run.
    Release(u32, u32, u32),
    /// Appended a new block.
    Push(u32, u32),
    /// Filled a trailing hole with a new block.
    Fill(u32, u32),
}

/// Scratch of the one-pass decode, kept by the pool between steps.
#[derive(Clone, Debug, Default)]
pub(crate) struct DecodeScratch {
    pub(crate) log: Vec<Undo>,
    pub(crate) ones: Vec<usize>,
}

/// A block pool whose sequences have one block table per layer group.
#[derive(Clone, Debug)]
pub struct HybridPool {
    pub(crate) alloc: BlockAllocator,
    pub(crate) groups: Vec<GroupSpec>,
    pub(crate) block_size: usize,
    pub(crate) seqs: SeqMap<HybridEntry>,
    /// Prefix caching (`rust/hybrid/prefix.rs`), when enabled.
    pub(crate) cache: Option<Box<PrefixCache>>,
    pub(crate) cow_copies: u64,
    pub(crate) batch_mark: u64,
    /// Scratch of a step: the slot of each batch entry.
    pub(crate) slot_scratch: Vec<u32>,
    /// Scratch of a step: blocks the window rule releases in this batch.
    pub(crate) release_scratch: Vec<BlockId>,
    /// Scratch of a step: shared partial blocks already copied away in this batch.
    pub(crate) cow_scratch: Vec<(BlockId, u32)>,
    /// Scratch of the one-pass decode.
    pub(crate) decode: DecodeScratch,
    /// Identity for table mirrors ([`crate::pool::table_sync::TableSync`]).
    id: u64,
}

impl HybridPool {
    /// A pool of `num_blocks` blocks of `block_size` tokens shared by `groups` (1..=64).
    pub fn new(num_blocks: usize, block_size: usize, groups: Vec<GroupSpec>) -> Result<Self> {
        if block_size == 0 || block_size > MAX_BLOCK_SIZE {
            return Err(invalid!("block_size must be in 1..={MAX_BLOCK_SIZE} tokens, got {block_size}"));
        }
        if groups.is_empty() || groups.len() > MAX_GROUPS {
            return Err(invalid!("groups: expected 1..={MAX_GROUPS} layer groups, got {}", groups.len()));
        }
        for g in &groups {
            // Re-check what the checked constructors check: the enum's fields are public.
            match *g {
                GroupSpec::Full => {}
                GroupSpec::SlidingWindow { window, sink_tokens } => {
                    GroupSpec::sliding_window(window, sink_tokens)?;
                }
                GroupSpec::Chunked { chunk } => {
                    GroupSpec::chunked(chunk)?;
                }
            }
        }
        Ok(Self {
            alloc: BlockAllocator::new(num_blocks)?,
            groups,
            block_size,
            seqs: SeqMap::default(),
            cache: None,
            cow_copies: 0,
            batch_mark: 0,
            slot_scratch: Vec::new(),
            release_scratch: Vec::new(),
            cow_scratch: Vec::new(),
            decode: DecodeScratch::default(),
            id: crate::pool::next_pool_id(),
        })
    }

    #[inline]
    pub fn groups(&self) -> &[GroupSpec] {
        &self.groups
    }

    #[inline]
    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    #[inline]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    #[inline]
    pub fn num_blocks(&self) -> usize {
        self.alloc.num_blocks()
    }

    /// Blocks an allocation can take now: free plus idle cached blocks that may be evicted
    /// (not hard-pinned).
    #[inline]
    pub fn num_free_blocks(&self) -> usize {
        self.alloc.num_free() + self.cache.as_ref().map_or(0, |c| c.evictable_count())
    }

    /// Blocks held by at least one sequence (idle cached blocks are not used).
    #[inline]
    pub fn num_used_blocks(&self) -> usize {
        self.num_blocks() - self.alloc.num_free() - self.cache.as_ref().map_or(0, |c| c.idle_count())
    }

    /// Close a successful mutating call: the cache's clock advances (unless the caller
    /// drives it), lapsed pins go, evicted keys leave the index.
    #[inline]
    pub(crate) fn end_op(&mut self) {
        if let Some(c) = self.cache.as_mut() {
            c.end_op();
        }
    }

    /// Whether cached block `b` is hard-pinned (idle, it stays unavailable).
    #[inline]
    pub(crate) fn is_hard_pinned(&self, b: BlockId) -> bool {
        self.cache.as_ref().is_some_and(|c| c.is_hard_pinned(b))
    }

    #[inline]
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// Unique id of this pool instance (for table mirrors).
    #[inline]
    pub fn pool_id(&self) -> u64 {
        self.id
    }

    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Live sequence ids in ascending order.
    pub fn seq_ids(&self) -> Vec<SeqId> {
        let mut v: Vec<SeqId> = self.seqs.keys().copied().collect();
        v.sort_unstable();
        v
    }

    pub(crate) fn entry(&self, seq: SeqId) -> Result<&HybridEntry> {
        self.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq.0))
    }

    pub(crate) fn check_group(&self, group: usize) -> Result<()> {
        if group >= self.groups.len() {
            return Err(invalid!("group: {group} is not a group of this pool ({} groups)", self.groups.len()));
        }
        Ok(())
    }

    /// Logical length of `seq`, in tokens.
    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.entry(seq)?.len)
    }

    /// First query position of the latest growth of `seq` (its length before it).
    pub fn frontier(&self, seq: SeqId) -> Result<usize> {
        Ok(self.entry(seq)?.frontier)
    }

    /// The table of `seq` in `group`.
    pub fn table(&self, seq: SeqId, group: usize) -> Result<&GroupTable> {
        self.check_group(group)?;
        Ok(&self.entry(seq)?.tables[group])
    }

    pub fn refcount(&self, b: BlockId) -> Result<u32> {
        if b.index() >= self.num_blocks() {
            return Err(invalid!("block_id: {b} is outside the pool of {} blocks", self.num_blocks()));
        }
        Ok(self.alloc.refcount(b))
    }

    /// `tokens % block_size` ([`block_table::offset_in_block`]).
    #[inline]
    pub(crate) fn offset_in_block(&self, tokens: usize) -> usize {
        block_table::offset_in_block(tokens, self.block_size)
    }

    pub(crate) fn checked_len(len: usize, n: usize) -> Result<usize> {
        block_table::checked_len(len, n)
    }

    pub(crate) fn ensure_available(&self, requested: usize, gained: usize) -> Result<()> {
        let free = self.num_free_blocks() + gained;
        if requested > free {
            return Err(KvError::PoolExhausted { requested, free });
        }
        Ok(())
    }

    #[inline]
    pub(crate) fn is_cached(&self, b: BlockId) -> bool {
        self.cache.as_ref().is_some_and(|c| c.is_cached(b))
    }

    /// Whether writing into partly filled stored block `b` copies it first: shared, or
    /// cached (cached blocks are immutable; only full blocks are cached, so this is a
    /// block cut by a truncation).
    #[inline]
    pub(crate) fn must_copy(&self, b: BlockId, copied_away: u32, released: u32) -> bool {
        self.alloc.refcount(b) - released - copied_away > 1 || self.is_cached(b)
    }

    /// A free block, else an evicted idle cached one; only called after a successful
    /// capacity check.
    #[inline]
    pub(crate) fn take_block(&mut self) -> Result<BlockId> {
        match self.alloc.allocate() {
            Some(b) => Ok(b),
            None => self.evict_block(),
        }
    }

    #[cold]
    fn evict_block(&mut self) -> Result<BlockId> {
        // The cache hands the victim over with refcount 1.
        self.cache
            .as_mut()
            .and_then(|c| c.evict(&mut self.alloc))
            .ok_or_else(|| KvError::Invariant("allocation after a successful capacity check failed".into()))
    }

    /// Drop one reference; at zero a cached block goes idle (evictable), any other block
    /// back to the free list.
    #[inline]
    pub(crate) fn release_block(&mut self, b: BlockId) {
        if self.alloc.decref(b) == 0 {
            match self.cache.as_mut() {
                Some(c) if c.is_cached(b) => c.on_idle(b),
                _ => self.alloc.push_free(b),
            }
        }
    }

    /// A child sharing every stored block of every group of `parent` (holes stay holes),
    /// with the same length and frontier.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<()> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::DuplicateSequence(child.0));
        }
        let src = self.entry(parent)?;
        let entry = HybridEntry {
            len: src.len,
            frontier: src.frontier,
            prev_frontier: src.frontier,
            mark: 0,
            tables: src.tables.clone(),
            cursor: src.cursor.clone(),
        };
        for t in entry.tables.iter() {
            for (_, b) in t.stored() {
                self.alloc.incref(b);
            }
        }
        self.seqs.insert(child, entry);
        self.end_op();
        Ok(())
    }

    /// Drop the last `n` tokens of `seq` (rollback). Refused when a group lacks a block
    /// the query at the new length needs (rollback only within the window).
    pub fn truncate(&mut self, seq: SeqId, n: usize) -> Result<()> {
        let bs = self.block_size;
        let e = self.entry(seq)?;
        if n > e.len {
            return Err(invalid!("num_tokens: cannot truncate {n} tokens from sequence {} of {} tokens", seq.0, e.len));
        }
        let l2 = e.len - n;
        for (g, (spec, t)) in self.groups.iter().zip(e.tables.iter()).enumerate() {
            let [sinks, window] = spec.needed_before(l2, bs);
            if let Some(i) = sinks.chain(window).find(|&i| t.get(i).is_none()) {
                return Err(invalid!(
                    "num_tokens: cannot truncate {n} tokens from sequence {}: group {g} ({spec}) released \
                     logical block {i}, which a query at position {l2} needs (rollback only within the window)",
                    seq.0
                ));
            }
        }
        let keep = l2.div_ceil(bs);
        let mut e = self.seqs.remove(&seq).ok_or(KvError::UnknownSequence(seq.0))?;
        for t in e.tables.iter_mut() {
            t.truncate(keep, |b| self.release_block(b));
        }
        {
            e.len = l2;
            e.frontier = e.frontier.min(l2);
            if let Some(c) = e.cursor.as_mut() {
                c.truncate(l2, bs);
            }
        }
        self.seqs.insert(seq, e);
        self.end_op();
        Ok(())
    }

    /// Free `seq`: every stored block of every group drops one reference, tail first.
    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        let mut e = self.seqs.remove(&seq).ok_or(KvError::UnknownSequence(seq.0))?;
        if self.cache.is_none() {
            for t in e.tables.iter_mut() {
                t.truncate(0, |b| self.release_block(b));
            }
            return Ok(());
        }
        // Cached blocks go idle in release order, and under `lru` the least recently used
        // idle block is evicted first. Releasing logical block by logical block, tail first, across
        // all groups keeps every group's head (the prefix other prompts share) longest;
        // group after group would let the first group's head go before the last group's
        // tail, and a hit needs every group.
        let n = e.tables.iter().map(|t| t.len_blocks()).max().unwrap_or(0);
        for keep in (0..n).rev() {
            for t in e.tables.iter_mut() {
                t.truncate(keep, |b| self.release_block(b));
            }
        }
        self.end_op();
        Ok(())
    }
}
