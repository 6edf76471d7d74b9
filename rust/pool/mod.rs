//! The block pool: live sequences of paged KV, one block table per (sequence, layer
//! group), over one [`BlockAllocator`] and, with prefix caching, one [`PrefixCache`].
//!
//! A pool has 1 to 64 layer groups, each an attention kind ([`GroupSpec`]: full, sliding
//! window with sinks, chunked); the default is one full-attention group. The contract: a
//! sequence has one logical length; each group's table has `ceil(len / block_size)`
//! logical entries, each a block or a hole; at the start of every growth a windowed group
//! releases the blocks no query of that growth or a later one needs (those blocks count as
//! available for the same growth); a block belongs to one group. A full group never
//! releases and has no holes, so a one-group pool is a classic paged block pool.
//!
//! Files: the leaves ([`allocator`], [`seq_map`], [`sizes`], [`spec`] the attention kinds,
//! [`group_table`] one (sequence, group) table), this file (`BlockPool`, its block
//! accounting, fork, truncate, free), and the `impl BlockPool` files that read it and are
//! never read by it: `step` (admission and growth: release, plan, check, apply; the
//! one-pass decode), [`prefix`] (prefix caching on the groups), `exports` (tables,
//! FlashInfer's layout, stored ranges, statistics), [`table_sync`] (incremental table
//! export) and `check` (invariants).
//!
//! Every call validates and counts first and mutates only when it will succeed: an error
//! leaves every group of every sequence as it was; batches are atomic.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{KvError, Result};
use crate::invalid;
use crate::prefix_cache::cursor::TokenCursor;
use crate::prefix_cache::tiers::TierLoad;
use crate::prefix_cache::{CacheConfig, PrefixCache};
use crate::types::{BlockId, SeqId};
use allocator::BlockAllocator;
use group_table::{GroupTable, GroupTables};
use seq_map::SeqMap;

pub mod allocator;
mod check;
mod exports;
pub mod group_table;
pub mod prefix;
mod rewind;
pub mod seq_map;
pub mod sizes;
pub mod spec;
mod step;
pub mod table_sync;
mod write_through;
#[cfg(test)]
mod tests;

pub use sizes::MAX_SEQ_TOKENS;
pub use spec::GroupSpec;

/// Largest block size accepted, in tokens.
pub const MAX_BLOCK_SIZE: usize = 1 << 16;

/// Distinguishes pools, so a table mirror synced from one pool is never trusted for another.
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// A pool identity no other pool of the process has (for table mirrors).
pub(crate) fn next_pool_id() -> u64 {
    NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed)
}

/// Most groups a pool accepts.
pub const MAX_GROUPS: usize = 64;

/// One live sequence: its logical length, frontier and one table per group. `repr(C)`:
/// what a decode step reads (length, mark, the first group's hot fields) shares a line.
#[derive(Clone, Debug)]
#[repr(C)]
pub(crate) struct SeqEntry {
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

/// A block the cache registered for `seq` at logical block `index` of `group`, holding
/// tokens up to `end`, that write-through copies once the sequence's KV is computed
/// there (module `write_through`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PendingThrough {
    pub(crate) seq: SeqId,
    pub(crate) group: usize,
    pub(crate) index: usize,
    pub(crate) block: BlockId,
    pub(crate) end: usize,
}

/// Outputs of an admission or a step, reusable across calls.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    /// Slot of every new token in every group, group-major: `slots[g * total_tokens + t]`.
    pub slots: Vec<i64>,
    /// New tokens of the call (the width of `slots`).
    pub total_tokens: usize,
    /// Copy-on-write pairs `(src, dst)` of every group (a block belongs to one group).
    pub cow: Vec<(BlockId, BlockId)>,
    /// Length of each sequence after the call, in tokens.
    pub seq_lens: Vec<i32>,
    /// Blocks an admission's hit takes from the tiers below the device: their bytes must
    /// arrive in the device blocks before anything reads those (after the call's tier
    /// moves, [`crate::prefix_cache::tiers::Move`]).
    pub loads: Vec<TierLoad>,
}

impl StepOutput {
    pub fn clear(&mut self) {
        self.slots.clear();
        self.total_tokens = 0;
        self.cow.clear();
        self.seq_lens.clear();
        self.loads.clear();
    }
}

/// Snapshot of the pool's occupancy.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolStats {
    pub block_size: usize,
    pub total_blocks: usize,
    /// Free plus idle cached blocks that may be evicted (what an allocation can take).
    pub free_blocks: usize,
    /// Blocks held by at least one sequence.
    pub used_blocks: usize,
    pub num_seqs: usize,
    /// Sum of logical sequence lengths, in tokens (a token shared by a fork counts once
    /// per sequence).
    pub logical_tokens: u64,
    /// Distinct filled slots in used blocks, every group (a shared token counts once).
    pub stored_tokens: u64,
    /// Used blocks referenced by more than one table.
    pub shared_blocks: usize,
    /// Copy-on-write copies since the pool was created.
    pub cow_copies: u64,
    /// Unfilled slots in used blocks: `used_blocks * block_size - stored_tokens`.
    pub empty_slots: u64,
    /// `stored_tokens / (used_blocks * block_size)`; 1.0 for an empty pool.
    pub utilization: f64,
    /// Cached blocks no sequence holds.
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
    Fill(u32, u32, u64),
}

/// Scratch of the one-pass decode, kept by the pool between steps.
#[derive(Clone, Debug, Default)]
pub(crate) struct DecodeScratch {
    pub(crate) log: Vec<Undo>,
    pub(crate) ones: Vec<usize>,
}

/// A block pool whose sequences have one block table per layer group.
#[derive(Clone, Debug)]
pub struct BlockPool {
    pub(crate) alloc: BlockAllocator,
    pub(crate) groups: Vec<GroupSpec>,
    pub(crate) block_size: usize,
    pub(crate) seqs: SeqMap<SeqEntry>,
    /// Prefix caching (`rust/pool/prefix.rs`), when enabled.
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
    /// Cached blocks whose KV is still to be computed before write-through copies them.
    pub(crate) through: Vec<PendingThrough>,
    /// Identity for table mirrors ([`crate::pool::table_sync::TableSync`]).
    id: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` tokens with one full-attention group.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self> {
        Self::with_options(num_blocks, block_size, vec![GroupSpec::Full], None)
    }

    /// A pool whose blocks `groups` (1..=64 attention kinds) share.
    pub fn with_groups(num_blocks: usize, block_size: usize, groups: Vec<GroupSpec>) -> Result<Self> {
        Self::with_options(num_blocks, block_size, groups, None)
    }

    /// A one-group (full attention) pool with prefix caching configured by `cfg`.
    pub fn with_prefix_cache(num_blocks: usize, block_size: usize, cfg: CacheConfig) -> Result<Self> {
        Self::with_options(num_blocks, block_size, vec![GroupSpec::Full], Some(cfg))
    }

    /// The constructor: `num_blocks` blocks of `block_size` tokens shared by `groups`
    /// (1..=64), with prefix caching on every group when `cache` is given.
    pub fn with_options(num_blocks: usize, block_size: usize, groups: Vec<GroupSpec>, cache: Option<CacheConfig>) -> Result<Self> {
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
        let cache = match cache {
            Some(cfg) => {
                let windowed: Vec<bool> = groups.iter().map(|s| s.is_windowed()).collect();
                Some(Box::new(PrefixCache::with_groups(num_blocks, block_size, cfg, &windowed)?))
            }
            None => None,
        };
        Ok(Self {
            alloc: BlockAllocator::new(num_blocks)?,
            groups,
            block_size,
            seqs: SeqMap::default(),
            cache,
            cow_copies: 0,
            batch_mark: 0,
            slot_scratch: Vec::new(),
            release_scratch: Vec::new(),
            cow_scratch: Vec::new(),
            decode: DecodeScratch::default(),
            through: Vec::new(),
            id: next_pool_id(),
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
        if !self.through.is_empty() {
            self.copy_computed_through(None);
        }
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

    pub(crate) fn entry(&self, seq: SeqId) -> Result<&SeqEntry> {
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

    /// `tokens % block_size` ([`sizes::offset_in_block`]).
    #[inline]
    pub(crate) fn offset_in_block(&self, tokens: usize) -> usize {
        sizes::offset_in_block(tokens, self.block_size)
    }

    pub(crate) fn checked_len(len: usize, n: usize) -> Result<usize> {
        sizes::checked_len(len, n)
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
        let mut entry = SeqEntry {
            len: src.len,
            frontier: src.frontier,
            prev_frontier: src.frontier,
            mark: 0,
            tables: src.tables.clone(),
            cursor: src.cursor.clone(),
        };
        // Each table's stamp names one table: the copy is a new one.
        entry.tables.iter_mut().for_each(GroupTable::restamp);
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
            let first = spec.first_needed(l2);
            if let Some(i) = sinks.chain(window).find(|&i| !t.holds(i, first)) {
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

    /// Free `seq`: every stored block of every group drops one reference. A pool of full
    /// groups releases each table head first (the freed tail ends on top of the free list,
    /// the next to be reused; within a cached chain the order is not observable, since a
    /// child is always evicted before its parent). With a windowed group, whose cached
    /// blocks have no parent, the release goes logical block by logical block, tail
    /// first, across all groups: under `lru` every group's head (the prefix other prompts
    /// share, which a hit needs in every group) is then kept longest.
    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        if !self.through.is_empty() && self.seqs.contains_key(&seq) {
            self.copy_computed_through(Some(seq));
        }
        let mut e = self.seqs.remove(&seq).ok_or(KvError::UnknownSequence(seq.0))?;
        if self.groups.iter().any(|g| g.is_windowed()) && self.cache.is_some() {
            let n = e.tables.iter().map(|t| t.len_blocks()).max().unwrap_or(0);
            for keep in (0..n).rev() {
                for t in e.tables.iter_mut() {
                    t.truncate(keep, |b| self.release_block(b));
                }
            }
        } else if self.alloc.num_shared() == 0 && self.cache.is_none() {
            // Nothing shared or cached: every block drops from 1 to 0, in one sweep.
            for t in e.tables.iter_mut() {
                t.drain_head_first(|blocks| self.alloc.release_unshared(blocks));
            }
        } else {
            for t in e.tables.iter_mut() {
                t.drain_head_first(|blocks| blocks.iter().for_each(|&b| self.release_block(b)));
            }
        }
        self.end_op();
        Ok(())
    }
}
