//! The block pool: live sequences, their block tables, slot mapping and copy-on-write
//! forks, over a [`BlockAllocator`].
//!
//! Files: the leaves this module builds on ([`allocator`], [`block_table`], [`seq_map`]),
//! and the parts of `BlockPool` that build on it (each an `impl BlockPool` block that
//! reads this module, never read by it): `decode` (the one-pass decode step),
//! [`prefix`] (admission by token ids or block keys), `exports` (tables and
//! statistics), [`table_sync`] (incremental table export) and `check` (invariants).
//!
//! Every public operation validates and counts everything it needs first and mutates only
//! when it is sure to succeed, so an error leaves the pool bit-for-bit as it was. Batched
//! calls ([`BlockPool::step`]) are atomic over the whole batch.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{KvError, Result};
use crate::invalid;
use crate::prefix_cache::cursor::TokenCursor;
use crate::prefix_cache::PrefixCache;
use crate::types::{BlockId, SeqId};
use allocator::BlockAllocator;
use block_table::{blocks_for, BlockTable};
use seq_map::SeqMap;

pub mod allocator;
pub mod block_table;
mod check;
mod decode;
mod exports;
pub mod prefix;
pub mod seq_map;
pub mod table_sync;

/// Largest block size accepted, in tokens.
pub const MAX_BLOCK_SIZE: usize = 1 << 16;
pub use block_table::MAX_SEQ_TOKENS;

/// Distinguishes pools, so a table mirror synced from one pool is never trusted for another.
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// A pool identity no other pool of the process has (for table mirrors).
pub(crate) fn next_pool_id() -> u64 {
    NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed)
}

#[derive(Clone, Debug)]
pub(crate) struct SeqEntry {
    pub(crate) table: BlockTable,
    /// Last batch this sequence appeared in; catches duplicate ids in one batch without
    /// allocating a set per step.
    pub(crate) mark: u64,
    /// Token ids and block keys, for sequences whose blocks can enter the prefix cache.
    pub(crate) cursor: Option<Box<TokenCursor>>,
}

/// Output buffers of a batched step, reusable across steps to avoid allocation.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    /// Slot of every new token, sequence by sequence, in batch order.
    pub slots: Vec<i64>,
    /// Copy-on-write pairs `(src, dst)`: copy the filled slots of `src` into `dst`.
    pub cow: Vec<(BlockId, BlockId)>,
    /// Length of each sequence after the step, in tokens.
    pub seq_lens: Vec<i32>,
}

impl StepOutput {
    pub fn clear(&mut self) {
        self.slots.clear();
        self.cow.clear();
        self.seq_lens.clear();
    }
}

/// Snapshot of the pool's occupancy.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolStats {
    pub block_size: usize,
    pub total_blocks: usize,
    pub free_blocks: usize,
    pub used_blocks: usize,
    pub num_seqs: usize,
    /// Sum of sequence lengths (a token shared by a fork counts once per sequence).
    pub logical_tokens: u64,
    /// Distinct filled slots in used blocks (a shared token counts once).
    pub stored_tokens: u64,
    /// Used blocks referenced by more than one sequence.
    pub shared_blocks: usize,
    /// Copy-on-write copies since the pool was created.
    pub cow_copies: u64,
    /// Unfilled slots in used blocks: `used_blocks * block_size - stored_tokens`.
    pub empty_slots: u64,
    /// `stored_tokens / (used_blocks * block_size)`; 1.0 for an empty pool.
    pub utilization: f64,
}

/// A paged KV-cache block pool with per-sequence block tables.
#[derive(Clone, Debug)]
pub struct BlockPool {
    pub(crate) alloc: BlockAllocator,
    pub(crate) block_size: usize,
    pub(crate) seqs: SeqMap<SeqEntry>,
    pub(crate) cow_copies: u64,
    next_stamp: u64,
    batch_mark: u64,
    id: u64,
    /// Scratch for `step`: shared partial blocks already copied away in this batch.
    cow_scratch: Vec<(BlockId, u32)>,
    /// Scratch for `step`: the slot of each batch entry, found once by the plan.
    slot_scratch: Vec<u32>,
    /// Counts of `step_decode`: ones, as many as its largest batch.
    ones: Vec<usize>,
    /// Automatic prefix caching, when enabled (see [`prefix`]).
    pub(crate) cache: Option<Box<PrefixCache>>,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` token slots each.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self> {
        if block_size == 0 || block_size > MAX_BLOCK_SIZE {
            return Err(invalid!("block_size must be in 1..={MAX_BLOCK_SIZE} tokens, got {block_size}"));
        }
        Ok(Self {
            alloc: BlockAllocator::new(num_blocks)?,
            block_size,
            seqs: SeqMap::default(),
            cow_copies: 0,
            next_stamp: 1,
            batch_mark: 0,
            id: next_pool_id(),
            cow_scratch: Vec::new(),
            slot_scratch: Vec::new(),
            ones: Vec::new(),
            cache: None,
        })
    }

    #[inline]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    #[inline]
    pub fn num_blocks(&self) -> usize {
        self.alloc.num_blocks()
    }

    /// Blocks an allocation can take right now: free blocks plus idle cached blocks that
    /// may be evicted.
    #[inline]
    pub fn num_free_blocks(&self) -> usize {
        self.alloc.num_free() + self.cache.as_ref().map_or(0, |c| c.evictable_count())
    }

    /// Blocks held by at least one sequence (idle cached blocks are not used).
    #[inline]
    pub fn num_used_blocks(&self) -> usize {
        self.num_blocks() - self.alloc.num_free() - self.cache.as_ref().map_or(0, |c| c.idle_count())
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

    pub fn table(&self, seq: SeqId) -> Result<&BlockTable> {
        self.seqs.get(&seq).map(|e| &e.table).ok_or(KvError::UnknownSequence(seq.0))
    }

    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.table(seq)?.num_tokens())
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

    pub(crate) fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    pub(crate) fn ensure_available(&self, requested: usize) -> Result<()> {
        let free = self.num_free_blocks();
        if requested > free {
            return Err(KvError::PoolExhausted { requested, free });
        }
        Ok(())
    }

    pub(crate) fn checked_len(len: usize, n: usize) -> Result<usize> {
        block_table::checked_len(len, n)
    }

    /// Blocks that appending `n` tokens to `table` takes, copy-on-write included, and the
    /// shared (or cached, hence immutable) partial block it copies away, if any. `copies` lists, per shared partial
    /// block, how many of its holders copy it away earlier in the same batch.
    pub(crate) fn blocks_needed_for(
        &self,
        table: &BlockTable,
        n: usize,
        copies: &[(BlockId, u32)],
    ) -> Result<(usize, Option<BlockId>)> {
        if n == 0 {
            return Ok((0, None));
        }
        let len = table.num_tokens();
        let end = Self::checked_len(len, n)?;
        let filled = self.offset_in_block(len);
        // One token (decode) needs a new block exactly at a block boundary: no division.
        let grow = if n == 1 {
            (filled == 0) as usize
        } else {
            blocks_for(end, self.block_size) - table.blocks().len()
        };
        // Without any shared or cached block there is nothing to copy: skip reading the table.
        if filled == 0 || (self.alloc.num_shared() == 0 && self.cache.is_none()) {
            return Ok((grow, None));
        }
        let Some(&last) = table.blocks().last() else {
            return Ok((grow, None));
        };
        let rc = self.alloc.refcount(last);
        // Cached blocks are immutable: even their last holder writes into a copy.
        let cached = self.is_cached(last);
        if rc <= 1 && !cached {
            return Ok((grow, None));
        }
        let copied = copies.iter().find(|(b, _)| *b == last).map_or(0, |e| e.1);
        Ok(if rc - copied > 1 || cached { (grow + 1, Some(last)) } else { (grow, None) })
    }

    /// Blocks appending `n` tokens to `seq` would allocate (copy-on-write included).
    pub fn blocks_needed(&self, seq: SeqId, n: usize) -> Result<usize> {
        Ok(self.blocks_needed_for(self.table(seq)?, n, &[])?.0)
    }

    /// Add a new sequence holding `prompt_len` tokens; their slots are appended to `slots`.
    pub fn add_sequence(&mut self, seq: SeqId, prompt_len: usize, slots: &mut Vec<i64>) -> Result<()> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSequence(seq.0));
        }
        Self::checked_len(0, prompt_len)?;
        self.ensure_available(blocks_for(prompt_len, self.block_size))?;
        let stamp = self.stamp();
        // Sized up front: growing the table block by block would reallocate it ~log2(n) times.
        let mut table = BlockTable::with_blocks(Vec::with_capacity(blocks_for(prompt_len, self.block_size)), 0, stamp);
        let mut cow = Vec::new();
        let r = self.grow(&mut table, prompt_len, slots, &mut cow);
        if r.is_err() {
            for b in table.take_blocks().into_iter().rev() {
                self.release_block(b);
            }
            return r;
        }
        debug_assert!(cow.is_empty());
        self.seqs.insert(seq, SeqEntry { table, mark: 0, cursor: None });
        self.end_op();
        Ok(())
    }

    /// Append `n` tokens to `seq`; new slots go to `slots`, copy-on-write pairs to `cow`.
    pub fn append(
        &mut self,
        seq: SeqId,
        n: usize,
        slots: &mut Vec<i64>,
        cow: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<()> {
        let (need, _) = self.blocks_needed_for(self.table(seq)?, n, &[])?;
        self.ensure_available(need)?;
        let mut entry = self.seqs.remove(&seq).ok_or(KvError::UnknownSequence(seq.0))?;
        let r = self.grow(&mut entry.table, n, slots, cow);
        if n > 0 {
            // Tokens of unknown ids: the sequence's later blocks cannot be cached.
            entry.cursor = None;
        }
        self.seqs.insert(seq, entry);
        self.end_op();
        r
    }

    /// Append `counts[i]` tokens to `seqs[i]` for every i, atomically: either every
    /// sequence grows or none does. Outputs are appended to `out` (cleared first).
    pub fn step(&mut self, seqs: &[SeqId], counts: &[usize], out: &mut StepOutput) -> Result<()> {
        out.clear();
        if seqs.len() != counts.len() {
            return Err(invalid!(
                "{} sequence ids but {} token counts",
                seqs.len(),
                counts.len()
            ));
        }
        self.step_run(seqs, counts, false, out)
    }

    /// [`Self::step`] with one token for every sequence (a decode step), without the
    /// caller building a slice of ones or the pool scanning it.
    pub fn step_decode(&mut self, seqs: &[SeqId], out: &mut StepOutput) -> Result<()> {
        out.clear();
        let mut ones = std::mem::take(&mut self.ones);
        if ones.len() < seqs.len() {
            ones.resize(seqs.len(), 1);
        }
        let r = self.step_run(seqs, &ones[..seqs.len()], true, out);
        self.ones = ones;
        r
    }

    /// `step` on counts of the right length; `all_ones` says the caller knows every
    /// count is 1.
    fn step_run(&mut self, seqs: &[SeqId], counts: &[usize], all_ones: bool, out: &mut StepOutput) -> Result<()> {
        // The map is moved out for the call so that a table can be borrowed mutably next
        // to the allocator. It is put back on every path.
        let mut map = std::mem::take(&mut self.seqs);
        let mut slots = std::mem::take(&mut self.slot_scratch);
        let r = self.step_in(&mut map, &mut slots, seqs, counts, all_ones, out);
        self.seqs = map;
        self.slot_scratch = slots;
        if r.is_ok() {
            self.end_op();
        }
        r
    }

    fn step_in(
        &mut self,
        map: &mut SeqMap<SeqEntry>,
        slots: &mut Vec<u32>,
        seqs: &[SeqId],
        counts: &[usize],
        all_ones: bool,
        out: &mut StepOutput,
    ) -> Result<()> {
        self.batch_mark += 1;
        if self.one_pass_fits(seqs.len()) && (all_ones || counts.iter().all(|&n| n == 1)) {
            if self.decode_one_pass(map, seqs, self.batch_mark, out)? {
                return Ok(());
            }
            // Ran out of free blocks part-way (undone): the plan below reports it.
            self.batch_mark += 1;
        }
        let mark = self.batch_mark;
        let mut need = 0usize;
        let mut total_tokens = 0usize;
        let mut scratch = std::mem::take(&mut self.cow_scratch);
        scratch.clear();
        slots.clear();
        slots.reserve(seqs.len());
        let mut result = Ok(());
        // With no shared and no cached block nothing can be copied on write, so a one-token
        // append needs a block exactly at a block boundary, and writes the slot after the
        // last one or the first slot of that new block. Fixed for the whole step: a
        // one-token append shares nothing.
        let plain = self.alloc.num_shared() == 0 && self.cache.is_none();
        // Plan: one hash lookup per id; the apply pass below reaches entries by slot.
        for (&seq, &n) in seqs.iter().zip(counts) {
            let Some(slot) = map.slot(&seq) else {
                result = Err(KvError::UnknownSequence(seq.0));
                break;
            };
            slots.push(slot);
            let Some(entry) = map.at_mut(slot) else {
                result = Err(KvError::Invariant("sequence index points past the entries".into()));
                break;
            };
            if entry.mark == mark {
                result = Err(invalid!("sequence id {} appears twice in one step", seq.0));
                break;
            }
            entry.mark = mark;
            if plain && n == 1 && entry.table.num_tokens() < MAX_SEQ_TOKENS {
                // `blocks_needed_for`'s answer without copy-on-write: a block at a boundary.
                need += (self.offset_in_block(entry.table.num_tokens()) == 0) as usize;
                total_tokens += 1;
                continue;
            }
            match self.blocks_needed_for(&entry.table, n, &scratch) {
                Ok((k, copied)) => {
                    need += k;
                    total_tokens += n;
                    if let Some(b) = copied {
                        match scratch.iter_mut().find(|(x, _)| *x == b) {
                            Some(e) => e.1 += 1,
                            None => scratch.push((b, 1)),
                        }
                    }
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.cow_scratch = scratch;
        result?;
        self.ensure_available(need)?;
        out.slots.reserve(total_tokens);
        out.seq_lens.reserve(seqs.len());
        for (&slot, &n) in slots.iter().zip(counts) {
            // Every slot was just found by the plan; a miss would be a bug, reported.
            let entry =
                map.at_mut(slot).ok_or_else(|| KvError::Invariant("batch entry lost between plan and apply".into()))?;
            if plain && n == 1 {
                let t = &mut entry.table;
                let len = t.num_tokens();
                let off = self.offset_in_block(len);
                let b = match t.last() {
                    Some(b) if off != 0 => b,
                    _ => {
                        let b = self.take_block()?;
                        t.push(b);
                        b
                    }
                };
                out.slots.push(b.first_slot(self.block_size) + off as i64);
                t.set_num_tokens(len + 1);
                out.seq_lens.push((len + 1) as i32);
                continue;
            }
            self.grow(&mut entry.table, n, &mut out.slots, &mut out.cow)?;
            out.seq_lens.push(entry.table.num_tokens() as i32);
            if n > 0 && entry.cursor.is_some() {
                // Tokens of unknown ids: the sequence's later blocks cannot be cached.
                entry.cursor = None;
            }
        }
        Ok(())
    }

    /// Grow `table` by `n` tokens. The caller has checked that enough blocks are free,
    /// so the error path is only reachable through a bug; it reports instead of panicking.
    pub(crate) fn grow(
        &mut self,
        table: &mut BlockTable,
        n: usize,
        slots: &mut Vec<i64>,
        cow: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<()> {
        let r = self.grow_blocks(table, n, slots, cow);
        // Evictions defer their index removals to here, where they run back to back.
        if let Some(c) = self.cache.as_mut() {
            c.flush_unmapped();
        }
        r
    }

    fn grow_blocks(
        &mut self,
        table: &mut BlockTable,
        n: usize,
        slots: &mut Vec<i64>,
        cow: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let bs = self.block_size;
        let mut pos = table.num_tokens();
        let off = self.offset_in_block(pos);
        // A shared or cached, partly filled last block is copied before anything is
        // written to it (cached blocks are immutable: even their last holder copies).
        let may_copy = off != 0 && (self.alloc.num_shared() != 0 || self.cache.is_some());
        if let Some(&src) =
            table.blocks().last().filter(|&&b| may_copy && (self.alloc.refcount(b) > 1 || self.is_cached(b)))
        {
            let dst = self.take_block()?;
            self.release_block(src);
            table.replace(table.blocks().len() - 1, dst);
            table.restamp(self.stamp());
            cow.push((src, dst));
            self.cow_copies += 1;
        }
        if n == 1 {
            // Decode: one slot, in the last block or in a new one at a block boundary.
            let b = match table.last() {
                Some(b) if off != 0 => b,
                _ => {
                    let b = self.take_block()?;
                    table.push(b);
                    b
                }
            };
            slots.push(b.first_slot(bs) + off as i64);
            table.set_num_tokens(pos + 1);
            return Ok(());
        }
        let end = pos + n;
        slots.reserve(n);
        // The table holds ceil(pos / bs) blocks: the rest of a partly filled last block
        // first, then one new block per bs tokens. No division per block (a runtime `/`
        // and `%` by bs cost more than the rest of a prefill's per-block work).
        if off != 0 {
            let b = table.last().ok_or_else(|| KvError::Invariant("partly filled table without blocks".into()))?;
            let run = (bs - off).min(n);
            let first = b.first_slot(bs) + off as i64;
            slots.extend(first..first + run as i64);
            pos += run;
        }
        while pos < end {
            let b = self.take_block()?;
            table.push(b);
            let run = bs.min(end - pos);
            let first = b.first_slot(bs);
            slots.extend(first..first + run as i64);
            pos += run;
        }
        table.set_num_tokens(end);
        Ok(())
    }

    /// A free block, or else an evicted idle cached one; only called after
    /// `ensure_available` reserved it.
    #[inline]
    pub(crate) fn take_block(&mut self) -> Result<BlockId> {
        match self.alloc.allocate() {
            Some(b) => Ok(b),
            None => self.evict_block(),
        }
    }

    /// [`Self::take_block`]'s slow path: no free block, so evict an idle cached one.
    #[cold]
    fn evict_block(&mut self) -> Result<BlockId> {
        let evicted = match self.cache.as_mut() {
            Some(c) => c.evict(&mut self.alloc),
            None => None,
        };
        evicted.ok_or_else(|| KvError::Invariant("allocation after a successful reservation failed".into()))
    }

    /// Drop one reference; a block at zero goes back to the free list, or stays in the
    /// prefix cache as idle (reusable, evictable) when it holds cached content.
    pub(crate) fn release_block(&mut self, b: BlockId) {
        if self.alloc.decref(b) == 0 {
            match self.cache.as_mut() {
                Some(c) if c.is_cached(b) => c.on_idle(b),
                _ => self.alloc.push_free(b),
            }
        }
    }

    #[inline]
    pub(crate) fn is_cached(&self, b: BlockId) -> bool {
        self.cache.as_ref().is_some_and(|c| c.is_cached(b))
    }

    /// Close a successful mutating operation (advances the cache's operation clock).
    pub(crate) fn end_op(&mut self) {
        if let Some(c) = self.cache.as_mut() {
            c.end_op();
        }
    }

    /// A child sharing every block of `parent` (parallel sampling, beam search).
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<()> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::DuplicateSequence(child.0));
        }
        let src = self.table(parent)?;
        let blocks = src.blocks().to_vec();
        let len = src.num_tokens();
        for &b in &blocks {
            self.alloc.incref(b);
        }
        let cursor = self.seqs[&parent].cursor.clone();
        let stamp = self.stamp();
        self.seqs.insert(child, SeqEntry { table: BlockTable::with_blocks(blocks, len, stamp), mark: 0, cursor });
        self.end_op();
        Ok(())
    }

    /// Drop the last `n` tokens of `seq` (speculative-decoding rollback); blocks that
    /// become empty lose this sequence's reference.
    pub fn truncate(&mut self, seq: SeqId, n: usize) -> Result<()> {
        let len = self.seq_len(seq)?;
        if n > len {
            return Err(invalid!("num_tokens: cannot truncate {n} tokens from sequence {} of {len} tokens", seq.0));
        }
        let new_len = len - n;
        let keep = blocks_for(new_len, self.block_size);
        let stamp = self.stamp();
        let mut entry = self.seqs.remove(&seq).ok_or(KvError::UnknownSequence(seq.0))?;
        if keep < entry.table.blocks().len() {
            let mut dropped = Vec::new();
            entry.table.truncate_blocks(keep, |b| dropped.push(b));
            for b in dropped {
                self.release_block(b);
            }
            entry.table.restamp(stamp);
        }
        entry.table.set_num_tokens(new_len);
        if let Some(c) = entry.cursor.as_mut() {
            c.truncate(new_len, self.block_size);
        }
        self.seqs.insert(seq, entry);
        self.end_op();
        Ok(())
    }

    /// Free `seq`: every block loses a reference; blocks at zero return to the free list.
    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        let mut entry = self.seqs.remove(&seq).ok_or(KvError::UnknownSequence(seq.0))?;
        // Head first, so the tail ends on top of the free list (most recently used).
        // Cached blocks go idle instead; only leaves are evicted, so tails go first anyway.
        let blocks = entry.table.take_blocks();
        if self.alloc.num_shared() == 0 && self.cache.is_none() {
            // Nothing shared or cached: every block drops from 1 to 0, in one sweep.
            self.alloc.release_unshared(&blocks);
        } else {
            for b in blocks {
                self.release_block(b);
            }
        }
        self.end_op();
        Ok(())
    }
}
