//! The simulator's KV memory: the real device pool (a [`crate::pool::BlockPool`], or a `BlockPool`
//! with layer groups, see [`super::device`]), an optional host pool for swapping, and the
//! bookkeeping the scheduler decides with (blocks promised to this step's batch, blocks
//! its growths release, blocks reserved for admitted requests, tokens held).
//!
//! Every allocation goes through the pool that users import: admissions add sequences,
//! a step grows the whole batch with one atomic `step`, finishing and preemption free
//! sequences, swapping moves a sequence between the two pools. Request index `i` is
//! sequence id `i` in both pools.
//!
//! With layer groups a growth of a sequence first releases the blocks its windowed groups
//! no longer need (the pool does it at the start of the growth, and the same step may
//! reuse them): a growth's [`Need`] is what it allocates in every group (new blocks and
//! copies) and what it releases, and the scheduler counts the releases of the batch so
//! far as free. `kv_tokens` then counts the tokens *stored* over all groups (a full group
//! stores the whole sequence, a windowed one its sinks and window), and the empty slots
//! are the unfilled slots of the blocks held: utilization is stored tokens over held
//! (and reserved) slots. Without groups (or with one full group) both are the logical
//! tokens and the empty slots of last blocks, as before. Swapping moves what each group
//! holds (a windowed group only its sinks and window) to a host pool of the same groups,
//! and back ([`Device::add_sequence_at`]), frontier included.
//!
//! With layer groups and prefix caching a hit shares blocks between sequences, so a window
//! release frees only the blocks no other sequence holds: the pool says how many
//! ([`crate::pool::BlockPool::release_gain`]), and a request's releases are applied
//! when it is scheduled ([`crate::pool::BlockPool::mark_computed`], what its growth would
//! release first), so the free count the rest of the step decides with is the pool's own.
//! The blocks and tokens per group then count each holder's (as tokens do without groups).
//! A caching admission allocates the whole prompt in every group at once (its windowed
//! groups release only from the first growth after it), so a prompt must fit whole.
//!
//! With prefix caching the device pool caches prompt blocks: a prompt given as token ids
//! is admitted with [`crate::pool::BlockPool::add_sequence_tokens`], one given as trace block keys
//! (Mooncake `hash_ids`) with [`crate::pool::BlockPool::add_sequence_block_keys`]; the whole prompt is
//! allocated at admission (its cached part is not computed again), later tokens grow
//! through the batched step. Admission is planned first (a lookup, no state change) so the
//! scheduler can refuse it before touching the pool.

use crate::prefix_cache::block_hash::BlockKey;
use crate::error::{KvError, Result};
use crate::pool::sizes::blocks_for;
use crate::pool::GroupSpec;
use crate::prefix_cache::CacheConfig;
use crate::types::SeqId;

use super::device::{held, holes, peak_alone, Device};
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

/// What growing a request takes: blocks allocated in every group (new blocks and copies),
/// blocks its windowed groups release first (0 without windowed groups) and cached partly
/// filled blocks its copies leave idle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Need {
    pub alloc: usize,
    pub release: usize,
    pub copied: usize,
    /// Whether the request grows (a growth by 0 tokens releases nothing).
    pub grows: bool,
}

/// A sequence held for a transfer: its request, the length and frontier it is held at,
/// and when the transfer is done (infinite until it is scheduled).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Detached {
    pub idx: u32,
    pub len: u32,
    pub frontier: u32,
    pub done: f64,
}

pub struct Kv {
    pub device: Device,
    /// The host pool for swapping: the device's kind, the same groups.
    pub host: Option<Device>,
    pub block_size: usize,
    /// Blocks admission must leave free (vLLM v0's watermark).
    pub watermark: usize,
    /// Blocks promised to the batch being scheduled, not allocated until `commit`.
    pub committed: usize,
    /// Blocks the promised growths release (windowed groups) at `commit`, free for the batch.
    pub releasing: usize,
    /// Cached partly filled blocks the promised growths copy away, idle after `commit` (not
    /// free for the batch: the pool's step allocates before it releases them).
    pub copying: usize,
    /// Blocks promised to running requests under the reservation policy and not allocated.
    pub reserved: usize,
    /// KV tokens stored on the device, over all groups (the logical tokens without groups).
    pub kv_tokens: u64,
    /// Unfilled slots of the blocks device sequences hold (of their last blocks without groups).
    pub empty_slots: u64,
    /// Device blocks held per group, mirrored from the requests' lengths and frontiers.
    pub group_blocks: Vec<usize>,
    /// The device's groups (`[Full]` for a `BlockPool`).
    pub specs: Vec<GroupSpec>,
    /// Whether the device is a `BlockPool` (a run configured with groups).
    pub hybrid: bool,
    pub caching: bool,
    /// Sequences a prefill instance still holds while their KV moves to a decode instance
    /// ([`super::disagg`]): counted as held until dropped.
    pub detached: Vec<Detached>,
    keys: Vec<BlockKey>,
    ids: Vec<SeqId>,
    counts: Vec<usize>,
}

#[inline]
fn blocks(tokens: u32, bs: usize) -> usize {
    blocks_for(tokens as usize, bs)
}

impl Kv {
    /// The device pool (`num_blocks` x `block_size`, caching with `cache`; a `BlockPool`
    /// of `groups` when given), a host pool of `host_blocks` (none when 0; with `groups`
    /// it has them too, without caching), and the admission watermark in blocks.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        cache: Option<CacheConfig>,
        groups: Option<&[GroupSpec]>,
        host_blocks: usize,
        watermark: usize,
    ) -> Result<Self> {
        let device = Device::new(num_blocks, block_size, cache, groups)?;
        let host = if host_blocks > 0 { Some(Device::new(host_blocks, block_size, None, groups)?) } else { None };
        let specs = groups.map_or_else(|| vec![GroupSpec::Full], <[GroupSpec]>::to_vec);
        Ok(Self {
            device,
            host,
            block_size,
            watermark,
            committed: 0,
            releasing: 0,
            copying: 0,
            reserved: 0,
            kv_tokens: 0,
            empty_slots: 0,
            group_blocks: vec![0; specs.len()],
            specs,
            hybrid: groups.is_some(),
            caching: cache.is_some(),
            detached: Vec::new(),
            keys: Vec::new(),
            ids: Vec::new(),
            counts: Vec::new(),
        })
    }

    /// Groups of the device pool (1 without groups).
    #[inline]
    pub fn num_groups(&self) -> usize {
        self.specs.len()
    }

    /// Add (`sign` true) or remove the blocks and tokens a sequence of `len` tokens whose
    /// latest growth started at `frontier` holds in every group.
    fn account(&mut self, len: u32, frontier: u32, add: bool) {
        let bs = self.block_size;
        for (g, spec) in self.specs.iter().enumerate() {
            let (b, t) = held(spec, bs, len as usize, frontier as usize);
            let (t, e) = (t as u64, (b * bs - t) as u64);
            if add {
                self.group_blocks[g] += b;
                self.kv_tokens += t;
                self.empty_slots += e;
            } else {
                self.group_blocks[g] -= b;
                self.kv_tokens -= t;
                self.empty_slots -= e;
            }
        }
    }

    /// Start holding request `r`'s `kv_len` tokens on the device (admission, swap-in).
    fn hold(&mut self, r: &ReqState) {
        self.account(r.kv_len, r.frontier, true);
    }

    fn unhold(&mut self, r: &ReqState) {
        self.account(r.kv_len, r.frontier, false);
    }

    /// Blocks the rest of this step can still take for growth (the batch's releases count).
    #[inline]
    pub fn free_now(&self) -> usize {
        self.device.num_free_blocks() + self.releasing - self.committed
    }

    /// Whether a growth taking `need` fits what the step has left.
    #[inline]
    pub fn fits(&self, need: Need) -> bool {
        need.alloc <= self.free_now() + need.release
    }

    /// Blocks one request needs at most to run alone (its longest KV `longest`, growths of
    /// at most `chunk` tokens): the admission check of requests that can never fit.
    pub fn peak_alone(&self, longest: usize, chunk: usize) -> usize {
        self.specs.iter().map(|s| peak_alone(s, self.block_size, longest, chunk)).sum()
    }

    /// Blocks a reservation of `tokens` tokens takes: every logical block of every group
    /// (a windowed group's released blocks go back to the free pool, not to the reservation).
    #[inline]
    pub fn reserve_blocks(&self, tokens: usize) -> usize {
        blocks_for(tokens, self.block_size) * self.num_groups()
    }

    /// Allocatable blocks the first growth of a newly admitted request (to `end` tokens)
    /// takes, the admission's own included.
    pub fn admission_need(&self, plan: Plan, end: usize) -> usize {
        let bs = self.block_size;
        let len = plan.kv_len as usize;
        // Writing past a cached partial last block copies it first: one more block.
        let cow = (!len.is_multiple_of(bs) && end > len) as usize;
        plan.blocks + (blocks_for(end, bs) - blocks_for(len, bs) + cow) * self.num_groups()
    }

    /// Blocks an admission can take: growth headroom minus reservations and the watermark.
    #[inline]
    pub fn admissible(&self) -> usize {
        self.free_now().saturating_sub(self.reserved + self.watermark)
    }

    /// What computing `n` more tokens of request `idx` takes. With caching or groups the
    /// pool counts the allocation (a cached partial last block is copied before it is
    /// written); windowed groups release the blocks no query from `kv_len` on needs.
    #[inline]
    pub fn grow_need(&self, idx: u32, r: &ReqState, n: u32) -> Result<Need> {
        let end = r.kv_len.max(r.computed + n);
        let copied = if self.caching { self.device.copy_gain(SeqId(idx as u64), (end - r.kv_len) as usize)? } else { 0 };
        if !self.hybrid {
            let alloc = if self.caching && end > r.kv_len {
                self.device.blocks_needed(SeqId(idx as u64), (end - r.kv_len) as usize)?
            } else {
                blocks(end, self.block_size) - blocks(r.kv_len, self.block_size)
            };
            return Ok(Need { alloc, release: 0, copied, grows: end > r.kv_len });
        }
        if end == r.kv_len {
            return Ok(Need::default());
        }
        let alloc = self.device.blocks_needed(SeqId(idx as u64), (end - r.kv_len) as usize)?;
        let (bs, len, f) = (self.block_size, r.kv_len as usize, r.frontier as usize);
        let release = if self.caching {
            // Shared blocks stay held: the pool knows which its releases free.
            self.device.release_gain(SeqId(idx as u64))?
        } else {
            self.specs.iter().map(|s| holes(s, bs, len) - holes(s, bs, f)).sum()
        };
        Ok(Need { alloc, release, copied, grows: true })
    }

    /// Plan the admission of request `idx`: a cache lookup when caching is on and the
    /// workload has token ids or block keys. Changes nothing.
    pub fn plan(&mut self, idx: usize, r: &ReqState, w: &Workload) -> Result<Plan> {
        if !self.caching {
            return Ok(Plan::default());
        }
        let bs = self.block_size;
        let len = r.prompt_len as usize;
        let pool = &*self.device;
        let (cached, blocks) = if let Some(tokens) = w.tokens(idx) {
            pool.admission_plan(&pool.block_keys(tokens, None)?, Some(tokens), None, len)?
        } else if let Some((trace, per_key)) = w.block_keys(idx) {
            pool_keys(trace, per_key, len, bs, &mut self.keys);
            pool.admission_plan(&self.keys, None, None, len)?
        } else {
            return Ok(Plan::default());
        };
        Ok(Plan { cached: cached as u32, kv_len: len as u32, blocks })
    }

    /// Promise `need` to request `idx` (`r`) for this step, its allocation drawn from its
    /// reservation first. With layer groups and caching its growth's releases are applied
    /// now (the module doc), otherwise counted as free for the batch until `commit`.
    #[inline]
    pub fn promise(&mut self, idx: u32, r: &mut ReqState, need: Need) -> Result<()> {
        self.committed += need.alloc;
        self.releasing += self.released_at_commit(need);
        self.copying += need.copied;
        if self.hybrid && self.caching && need.grows && r.frontier != r.kv_len {
            let (pool, _) = self.device.pool_mut();
            pool.mark_computed(&[SeqId(idx as u64)])?;
            self.unhold(r);
            r.frontier = r.kv_len;
            self.hold(r);
        }
        let take = u32::try_from(need.alloc).unwrap_or(u32::MAX).min(r.reserve_left);
        r.reserve_left -= take;
        r.reserve_taken = take;
        self.reserved -= take as usize;
        Ok(())
    }

    /// Blocks `need`'s window releases free for the batch: none when they are applied at
    /// the promise (layer groups with caching).
    #[inline]
    fn released_at_commit(&self, need: Need) -> usize {
        if self.hybrid && self.caching { 0 } else { need.release }
    }

    /// Undo `promise` for a request taken out of the batch again (releases applied at the
    /// promise stay applied: the request is preempted next).
    #[inline]
    pub fn unpromise(&mut self, r: &mut ReqState, need: Need) {
        self.committed -= need.alloc;
        self.releasing -= self.released_at_commit(need);
        self.copying -= need.copied;
        r.reserve_left += r.reserve_taken;
        self.reserved += r.reserve_taken as usize;
        r.reserve_taken = 0;
    }

    /// Create the device sequence of a newly admitted request as planned: empty, or the
    /// whole prompt with its cached part reused. Returns the cached tokens.
    pub fn admit(&mut self, idx: usize, r: &mut ReqState, w: &Workload, plan: Plan) -> Result<u32> {
        let seq = SeqId(idx as u64);
        let free_before = self.device.num_free_blocks();
        let cached = if plan.kv_len == 0 {
            self.device.add_sequence(seq, 0)?;
            0
        } else {
            let (pool, out) = self.device.pool_mut();
            let cached = match w.tokens(idx) {
                Some(tokens) => pool.add_sequence_tokens(seq, tokens, None, out)?,
                // `plan` left this request's pool keys in `self.keys`.
                None => pool.add_sequence_block_keys(seq, &self.keys, plan.kv_len as usize, out)?,
            };
            out.clear();
            cached
        };
        let took = free_before - self.device.num_free_blocks();
        if cached != plan.cached as usize || took != plan.blocks {
            return Err(KvError::Invariant(format!(
                "admission of request {idx}: planned {} cached tokens and {} blocks, got {cached} and {took}",
                plan.cached, plan.blocks
            )));
        }
        r.kv_len = plan.kv_len;
        r.computed = plan.cached;
        // A cache hit's frontier is the hit length (the pool's rule).
        r.frontier = plan.cached;
        self.hold(r);
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
        self.unhold(r);
        r.kv_len = 0;
        r.frontier = 0;
        Ok(())
    }

    /// Blocks a sequence of `len` tokens whose latest growth started at `frontier` holds
    /// over every group (what a swap moves).
    fn held_blocks(&self, len: u32, frontier: u32) -> usize {
        self.specs.iter().map(|s| held(s, self.block_size, len as usize, frontier as usize).0).sum()
    }

    /// Whether `r` can be swapped in and grow by `n` tokens in this step: what it holds
    /// plus every group's new blocks (a window's releases not counted) fit what admission
    /// may take, and what it holds fits the blocks free now (it is allocated at once,
    /// before the step's releases).
    pub fn swap_in_fits(&self, r: &ReqState, n: u32) -> bool {
        let bs = self.block_size;
        let held = self.held_blocks(r.kv_len, r.frontier);
        let grow = blocks(r.kv_len + n, bs) - blocks(r.kv_len, bs);
        held + grow * self.num_groups() <= self.admissible() && held <= self.device.num_free_blocks()
    }

    /// Move `r`'s computed KV to the host pool. Returns the blocks moved, or `None` (and
    /// changes nothing) when there is no host pool or it has no room.
    /// A swapped sequence has every token computed, so it moves as if its next query were
    /// at its length: a window group keeps only what that query needs.
    pub fn swap_out(&mut self, idx: usize, r: &mut ReqState) -> Result<Option<usize>> {
        let (kv, frontier) = (r.kv_len, r.kv_len);
        let moved = self.held_blocks(kv, frontier);
        let Some(host) = self.host.as_mut() else { return Ok(None) };
        if r.kv_len != r.computed || moved > host.num_free_blocks() {
            return Ok(None);
        }
        host.add_sequence_at(SeqId(idx as u64), kv as usize, frontier as usize)?;
        self.release(idx, r)?;
        r.kv_len = kv;
        r.frontier = frontier;
        Ok(Some(moved))
    }

    /// Bring a swapped request back: its KV moves from the host to the device.
    pub fn swap_in(&mut self, idx: usize, r: &mut ReqState) -> Result<usize> {
        let host = self.host.as_mut().ok_or_else(|| KvError::Invariant("swap-in without a host pool".into()))?;
        host.free(SeqId(idx as u64))?;
        self.device.add_sequence_at(SeqId(idx as u64), r.kv_len as usize, r.frontier as usize)?;
        self.hold(r);
        Ok(self.held_blocks(r.kv_len, r.frontier))
    }

    /// Keep request `idx`'s sequence held (as it is) for its transfer to a decode instance,
    /// no longer as a running request's: its reservation is released.
    pub fn detach(&mut self, idx: u32, r: &mut ReqState) {
        self.reserved -= r.reserve_left as usize;
        r.reserve_left = 0;
        self.detached.push(Detached { idx, len: r.kv_len, frontier: r.frontier, done: f64::INFINITY });
    }

    /// Request `idx`'s transfer is done at `done`.
    pub fn transfer_done_at(&mut self, idx: u32, done: f64) -> Result<()> {
        let d = self.detached.iter_mut().find(|d| d.idx == idx);
        let d = d.ok_or_else(|| KvError::Invariant(format!("request {idx} is not held for a transfer")))?;
        d.done = done;
        Ok(())
    }

    /// Free the sequences whose transfer is done at `now` (every scheduled one with `f64::MAX`;
    /// one not scheduled yet has an infinite end).
    pub fn drop_transferred(&mut self, now: f64) -> Result<()> {
        let mut k = 0;
        while k < self.detached.len() {
            let d = self.detached[k];
            if d.done <= now {
                self.device.free(SeqId(d.idx as u64))?;
                self.account(d.len, d.frontier, false);
                self.detached.swap_remove(k);
            } else {
                k += 1;
            }
        }
        Ok(())
    }

    /// Admit a request whose KV arrived from a prefill instance: its computed tokens
    /// land in the device pool as they were held (a windowed group only its sinks and
    /// window). Returns the blocks it takes.
    pub fn receive(&mut self, idx: usize, r: &mut ReqState) -> Result<usize> {
        self.device.add_sequence_at(SeqId(idx as u64), r.kv_len as usize, r.frontier as usize)?;
        self.hold(r);
        Ok(self.held_blocks(r.kv_len, r.frontier))
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
        let free_before = self.device.num_free_blocks();
        self.device.step(&self.ids, &self.counts)?;
        let (taken, released, copied) = (self.committed, self.releasing, self.copying);
        self.committed = 0;
        self.releasing = 0;
        self.copying = 0;
        for (k, &(i, _)) in batch.iter().enumerate() {
            let (r, c) = (&mut reqs[i as usize], self.counts[k]);
            if c == 0 {
                continue;
            }
            self.unhold(r);
            r.frontier = r.kv_len;
            r.kv_len += c as u32;
            self.hold(r);
        }
        // The promises are what the pool did: a wrong mirror fails here, not later.
        if self.hybrid && self.device.num_free_blocks() + taken != free_before + released + copied {
            return Err(KvError::Invariant(format!(
                "step took {} blocks net, the engine promised {taken} and counted {released} released and {copied} copied away",
                free_before as i64 - self.device.num_free_blocks() as i64
            )));
        }
        Ok(())
    }

    /// Device blocks held by sequences.
    #[inline]
    pub fn used_blocks(&self) -> usize {
        self.device.num_used_blocks()
    }
}
