//! The simulator's KV memory: the real device [`BlockPool`], an optional host pool for
//! swapping, and the bookkeeping the scheduler decides with (blocks promised to this
//! step's batch, blocks reserved for admitted requests, tokens held).
//!
//! Every allocation goes through the pool that users import: admissions add sequences,
//! a step grows the whole batch with one atomic [`BlockPool::step`], finishing and
//! preemption free sequences, swapping moves a sequence between the two pools. Request
//! index `i` is sequence id `i` in both pools.
//!
//! With prefix caching the device pool caches prompt blocks: a prompt given as token ids
//! is admitted with [`BlockPool::add_sequence_tokens`], one given as trace block keys
//! (Mooncake `hash_ids`) with [`BlockPool::add_sequence_block_keys`]; the whole prompt is
//! allocated at admission (its cached part is not computed again), later tokens grow
//! through the batched step. Admission is planned first (a lookup, no state change) so the
//! scheduler can refuse it before touching the pool.

use crate::prefix_cache::block_hash::BlockKey;
use crate::pool::block_table::blocks_for;
use crate::error::{KvError, Result};
use crate::pool::{BlockPool, StepOutput};
use crate::prefix_cache::CacheConfig;
use crate::types::SeqId;

use super::request::ReqState;
use super::workload::Workload;

/// What admitting a request would take, from a cache lookup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Prompt tokens the cache already holds.
    pub cached: u32,
    /// Tokens the admission itself allocates (the whole prompt with caching, else 0).
    pub kv_len: u32,
    /// Allocatable blocks the admission consumes (new blocks plus revived idle ones).
    pub blocks: usize,
}

/// SplitMix64's finalizer: a bijection on u64 that spreads every input bit.
#[inline]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Pool keys for a prompt given as trace keys of `per_key` tokens each: pool block `i`
/// (tokens `i*bs .. min((i+1)*bs, len)`) is keyed by the trace key of its last token's
/// block and the offset where it ends in that block. Trace keys are chained (equal key =
/// equal prefix), so equal pool keys mean equal content at any block size.
pub fn pool_keys(trace: &[u64], per_key: usize, len: usize, bs: usize, out: &mut Vec<BlockKey>) {
    out.clear();
    let mut start = 0;
    while start < len {
        let end = (start + bs).min(len);
        let k = (end - 1) / per_key;
        let off = end - k * per_key;
        // High half: the trace id (+1, so no key is 0); low half: a bijective mix of
        // (id, offset). The prefix cache indexes on the low 64 bits, so they must differ
        // between the pool blocks of one trace block and between trace blocks.
        let lo = mix64(trace[k].wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ off as u64);
        out.push(((trace[k] as u128 + 1) << 64) | lo as u128);
        start = end;
    }
}

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
    /// Unfilled slots in the last blocks of device sequences.
    pub empty_slots: u64,
    pub caching: bool,
    keys: Vec<BlockKey>,
    ids: Vec<SeqId>,
    counts: Vec<usize>,
    out: StepOutput,
}

#[inline]
fn blocks(tokens: u32, bs: usize) -> usize {
    blocks_for(tokens as usize, bs)
}

impl Kv {
    /// The device pool (`num_blocks` x `block_size`, caching with `cache`), a host pool of
    /// `host_blocks` (none when 0), and the admission watermark in blocks.
    pub fn new(num_blocks: usize, block_size: usize, cache: Option<CacheConfig>, host_blocks: usize, watermark: usize) -> Result<Self> {
        let device = match cache {
            Some(c) => BlockPool::with_prefix_cache(num_blocks, block_size, c)?,
            None => BlockPool::new(num_blocks, block_size)?,
        };
        let host = if host_blocks > 0 { Some(BlockPool::new(host_blocks, block_size)?) } else { None };
        Ok(Self {
            device,
            host,
            block_size,
            watermark,
            committed: 0,
            reserved: 0,
            kv_tokens: 0,
            empty_slots: 0,
            caching: cache.is_some(),
            keys: Vec::new(),
            ids: Vec::new(),
            counts: Vec::new(),
            out: StepOutput::default(),
        })
    }

    #[inline]
    fn waste(&self, kv: u32) -> u64 {
        (blocks(kv, self.block_size) * self.block_size) as u64 - kv as u64
    }

    /// Start holding `kv` tokens of a request on the device (admission, swap-in).
    fn hold(&mut self, kv: u32) {
        self.kv_tokens += kv as u64;
        self.empty_slots += self.waste(kv);
    }

    fn unhold(&mut self, kv: u32) {
        self.kv_tokens -= kv as u64;
        self.empty_slots -= self.waste(kv);
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

    /// Allocatable blocks computing `n` more tokens of request `idx` takes. With caching,
    /// the pool decides (a cached partial last block is copied before it is written).
    #[inline]
    pub fn grow_need(&self, idx: u32, r: &ReqState, n: u32) -> Result<usize> {
        let end = r.kv_len.max(r.computed + n);
        if self.caching && end > r.kv_len {
            return self.device.blocks_needed(SeqId(idx as u64), (end - r.kv_len) as usize);
        }
        Ok(blocks(end, self.block_size) - blocks(r.kv_len, self.block_size))
    }

    /// Plan the admission of request `idx`: a cache lookup when caching is on and the
    /// workload has token ids or block keys. Changes nothing.
    pub fn plan(&mut self, idx: usize, r: &ReqState, w: &Workload) -> Result<Plan> {
        if !self.caching {
            return Ok(Plan::default());
        }
        let bs = self.block_size;
        let len = r.prompt_len as usize;
        let cache = self.device.prefix_cache().ok_or_else(|| KvError::Invariant("caching without a cache".into()))?;
        let found = if let Some(tokens) = w.tokens(idx) {
            let keys = self.device.block_keys(tokens, None)?;
            cache.lookup(&keys, Some(tokens), None)
        } else if let Some((trace, per_key)) = w.block_keys(idx) {
            pool_keys(trace, per_key, len, bs, &mut self.keys);
            cache.lookup(&self.keys, None, None)
        } else {
            return Ok(Plan::default());
        };
        // The pool's rule: at least one prompt token is left to compute.
        let used = found.blocks.len().min((len - 1) / bs);
        let revived = found.blocks[..used].iter().filter(|&&b| cache.is_evictable(b, &self.device.alloc)).count();
        Ok(Plan { cached: (used * bs) as u32, kv_len: len as u32, blocks: blocks_for(len, bs) - used + revived })
    }

    /// Promise `need` blocks to `r` for this step, drawn from its reservation first.
    #[inline]
    pub fn promise(&mut self, r: &mut ReqState, need: usize) {
        self.committed += need;
        let take = u32::try_from(need).unwrap_or(u32::MAX).min(r.reserve_left);
        r.reserve_left -= take;
        r.reserve_taken = take;
        self.reserved -= take as usize;
    }

    /// Undo `promise` for a request taken out of the batch again.
    #[inline]
    pub fn unpromise(&mut self, r: &mut ReqState, need: usize) {
        self.committed -= need;
        r.reserve_left += r.reserve_taken;
        self.reserved += r.reserve_taken as usize;
        r.reserve_taken = 0;
    }

    /// Create the device sequence of a newly admitted request as planned: empty, or the
    /// whole prompt with its cached part reused. Returns the cached tokens.
    pub fn admit(&mut self, idx: usize, r: &mut ReqState, w: &Workload, plan: Plan) -> Result<u32> {
        let seq = SeqId(idx as u64);
        let free_before = self.device.num_free_blocks();
        self.out.slots.clear();
        let cached = if plan.kv_len == 0 {
            self.device.add_sequence(seq, 0, &mut self.out.slots)?;
            0
        } else if let Some(tokens) = w.tokens(idx) {
            self.device.add_sequence_tokens(seq, tokens, None, &mut self.out.slots)?
        } else {
            // `plan` left this request's pool keys in `self.keys`.
            self.device.add_sequence_block_keys(seq, &self.keys, plan.kv_len as usize, &mut self.out.slots)?
        };
        self.out.slots.clear();
        let took = free_before - self.device.num_free_blocks();
        if cached != plan.cached as usize || took != plan.blocks {
            return Err(KvError::Invariant(format!(
                "admission of request {idx}: planned {} cached tokens and {} blocks, got {cached} and {took}",
                plan.cached, plan.blocks
            )));
        }
        r.kv_len = plan.kv_len;
        r.computed = plan.cached;
        self.hold(r.kv_len);
        // At most `reserve_blocks`, a u32.
        r.reserve_left = r.reserve_blocks.saturating_sub(blocks(r.kv_len, self.block_size).try_into().unwrap_or(u32::MAX));
        self.reserved += r.reserve_left as usize;
        Ok(plan.cached)
    }

    /// Drop `r`'s device sequence (finish or recompute preemption).
    pub fn release(&mut self, idx: usize, r: &mut ReqState) -> Result<()> {
        self.device.free(SeqId(idx as u64))?;
        self.reserved -= r.reserve_left as usize;
        r.reserve_left = 0;
        self.unhold(r.kv_len);
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
        self.hold(r.kv_len);
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
            let r = &mut reqs[i as usize];
            let old = r.kv_len;
            r.kv_len += c as u32;
            self.kv_tokens += c as u64;
            self.empty_slots = self.empty_slots + self.waste(r.kv_len) - self.waste(old);
        }
        Ok(())
    }

    /// Device blocks held by sequences.
    #[inline]
    pub fn used_blocks(&self) -> usize {
        self.device.num_used_blocks()
    }
}
