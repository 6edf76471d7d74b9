//! The simulator's KV memory: the real device [`BlockPool`], an optional host pool for
//! swapping, and the bookkeeping the scheduler decides with (blocks promised to this
//! step's batch, blocks reserved for admitted requests, tokens held).
//!
//! Every allocation goes through the pool that users import: admissions add sequences,
//! a step grows the whole batch with one atomic [`BlockPool::step`], finishing and
//! preemption free sequences, swapping moves a sequence between the two pools. Request
//! index `i` is sequence id `i` in both pools.

use crate::block_table::blocks_for;
use crate::error::{KvError, Result};
use crate::pool::{BlockPool, StepOutput};
use crate::types::SeqId;

use super::request::ReqState;

pub struct Kv {
    pub device: BlockPool,
    pub host: Option<BlockPool>,
    pub block_size: usize,
    /// Blocks admission must leave free (vLLM v0's watermark).
    pub watermark: usize,
    /// Blocks promised to the batch being scheduled, not allocated until `commit`.
    pub committed: usize,
    /// Blocks promised to running requests under the reservation policy and not allocated.
    pub reserved: usize,
    /// KV tokens held on the device.
    pub kv_tokens: u64,
    ids: Vec<SeqId>,
    counts: Vec<usize>,
    out: StepOutput,
}

#[inline]
fn blocks(tokens: u32, bs: usize) -> usize {
    blocks_for(tokens as usize, bs)
}

impl Kv {
    pub fn new(device: BlockPool, host: Option<BlockPool>, watermark: usize) -> Self {
        let block_size = device.block_size();
        Self {
            device,
            host,
            block_size,
            watermark,
            committed: 0,
            reserved: 0,
            kv_tokens: 0,
            ids: Vec::new(),
            counts: Vec::new(),
            out: StepOutput::default(),
        }
    }

    /// Blocks the rest of this step can still take for growth.
    #[inline]
    pub fn free_now(&self) -> usize {
        self.device.num_free_blocks() - self.committed
    }

    /// Blocks an admission can take: growth headroom minus reservations and the watermark.
    #[inline]
    pub fn admissible(&self) -> usize {
        self.free_now().saturating_sub(self.reserved + self.watermark)
    }

    /// New device blocks computing `n` more tokens of `r` takes.
    #[inline]
    pub fn grow_need(&self, r: &ReqState, n: u32) -> usize {
        let end = r.kv_len.max(r.computed + n);
        blocks(end, self.block_size) - blocks(r.kv_len, self.block_size)
    }

    /// Promise `need` blocks to `r` for this step (taken from its reservation, if any).
    #[inline]
    pub fn promise(&mut self, r: &ReqState, need: usize) {
        self.committed += need;
        if r.reserve_blocks > 0 {
            self.reserved -= need;
        }
    }

    /// Undo `promise` for a request taken out of the batch again.
    #[inline]
    pub fn unpromise(&mut self, r: &ReqState, need: usize) {
        self.committed -= need;
        if r.reserve_blocks > 0 {
            self.reserved += need;
        }
    }

    /// Create the (empty) device sequence of a newly admitted request.
    pub fn admit(&mut self, idx: usize, r: &mut ReqState) -> Result<()> {
        self.device.add_sequence(SeqId(idx as u64), 0, &mut self.out.slots)?;
        r.kv_len = 0;
        r.computed = 0;
        self.reserved += r.reserve_blocks as usize;
        Ok(())
    }

    /// Drop `r`'s device sequence (finish or recompute preemption).
    pub fn release(&mut self, idx: usize, r: &mut ReqState) -> Result<()> {
        self.device.free(SeqId(idx as u64))?;
        if r.reserve_blocks > 0 {
            self.reserved -= r.reserve_blocks as usize - blocks(r.kv_len, self.block_size);
        }
        self.kv_tokens -= r.kv_len as u64;
        r.kv_len = 0;
        Ok(())
    }

    /// Move `r`'s computed KV to the host pool. Returns the blocks moved, or `None` (and
    /// changes nothing) when there is no host pool or it has no room.
    pub fn swap_out(&mut self, idx: usize, r: &mut ReqState) -> Result<Option<usize>> {
        let Some(host) = self.host.as_mut() else { return Ok(None) };
        let moved = blocks(r.kv_len, self.block_size);
        if r.kv_len != r.computed || moved > host.num_free_blocks() {
            return Ok(None);
        }
        host.add_sequence(SeqId(idx as u64), r.kv_len as usize, &mut self.out.slots)?;
        self.out.slots.clear();
        let kv = r.kv_len;
        self.release(idx, r)?;
        r.kv_len = kv;
        Ok(Some(moved))
    }

    /// Bring a swapped request back: its KV moves from the host to the device.
    pub fn swap_in(&mut self, idx: usize, r: &mut ReqState) -> Result<usize> {
        let host = self.host.as_mut().ok_or_else(|| KvError::Invariant("swap-in without a host pool".into()))?;
        host.free(SeqId(idx as u64))?;
        self.device.add_sequence(SeqId(idx as u64), r.kv_len as usize, &mut self.out.slots)?;
        self.out.slots.clear();
        self.kv_tokens += r.kv_len as u64;
        Ok(blocks(r.kv_len, self.block_size))
    }

    /// Grow every request of the batch by its promised tokens, atomically, through the
    /// pool's batched step call.
    pub fn commit(&mut self, batch: &[(u32, u32)], reqs: &mut [ReqState]) -> Result<()> {
        self.ids.clear();
        self.counts.clear();
        for &(i, n) in batch {
            let r = &reqs[i as usize];
            let end = r.kv_len.max(r.computed + n);
            self.ids.push(SeqId(i as u64));
            self.counts.push((end - r.kv_len) as usize);
        }
        self.device.step(&self.ids, &self.counts, &mut self.out)?;
        self.committed = 0;
        for (&(i, _), &c) in batch.iter().zip(&self.counts) {
            reqs[i as usize].kv_len += c as u32;
            self.kv_tokens += c as u64;
        }
        Ok(())
    }

    /// Device blocks held by sequences.
    #[inline]
    pub fn used_blocks(&self) -> usize {
        self.device.num_blocks() - self.device.num_free_blocks()
    }
}
