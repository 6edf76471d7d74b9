//! One replica of a deployment: a scheduler and its device (and host) pool, the clock of
//! its next step, and what one step records. The engine ([`super::simulate`]) runs the
//! replicas' steps in time order; a deployment of one replica is the classic engine.

use super::kv::Kv;
use super::metrics::StepMetrics;
use super::request::{Convention, ReqState, Status};
use super::scheduler::{Batch, Scheduler, SchedulerConfig};
use super::timing::StepShape;
use super::device;
use crate::error::{KvError, Result};
use crate::pool::GroupSpec;
use crate::prefix_cache::CacheConfig;

/// A replica's engine state.
pub(super) struct Replica {
    pub(super) sched: Scheduler,
    pub(super) kv: Kv,
    pub(super) batch: Batch,
    /// When its next step may start: the end of its last step, or the arrival that woke it.
    pub(super) clock: f64,
    /// Requests routed to it and not admitted yet, in arrival order.
    pub(super) inbox: Vec<u32>,
    pub(super) role: Role,
    /// Decode instance: `(when its KV arrives, request)` of transfers to it not delivered
    /// to its scheduler yet.
    pub(super) incoming: Vec<(f64, u32)>,
    /// Disaggregated: when its link (outgoing on a prefill instance, incoming on a decode
    /// one) is free of the transfers scheduled so far.
    pub(super) link_free: f64,
    /// A prefill instance whose last step could schedule nothing because blocks held for
    /// transfers fill its pool: it waits for the first of them to be done.
    pub(super) blocked: bool,
}

/// What a replica serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Prompts and generation (colocated serving).
    Both,
    /// Prompts to their first token, then the KV moves to a decode instance.
    Prefill,
    /// Generation of requests whose KV arrived from a prefill instance.
    Decode,
}

impl Replica {
    pub(super) fn new(
        sched: &SchedulerConfig,
        num_blocks: usize,
        block_size: usize,
        cache: Option<CacheConfig>,
        groups: Option<&[GroupSpec]>,
        host_blocks: usize,
    ) -> Result<Self> {
        let watermark = (sched.watermark * num_blocks as f64) as usize;
        // The configuration is checked before the pools are allocated.
        let sched = Scheduler::new(sched.clone())?;
        let kv = Kv::new(num_blocks, block_size, cache, groups, host_blocks, watermark)?;
        Ok(Self {
            sched,
            kv,
            batch: Batch::default(),
            clock: 0.0,
            inbox: Vec::new(),
            role: Role::Both,
            incoming: Vec::new(),
            link_free: 0.0,
            blocked: false,
        })
    }

    /// Whether it has anything to do: requests routed to it, waiting, running, swapped or
    /// on their way to it.
    pub(super) fn has_work(&self) -> bool {
        !self.inbox.is_empty() || !self.sched.is_idle() || !self.incoming.is_empty()
    }

    /// When its next step starts: at its clock with requests to schedule, else once the
    /// first transfer to it has arrived (blocked: once the first transfer from it is
    /// done); None without work (or blocked before its transfers are scheduled).
    pub(super) fn next_start(&self) -> Option<f64> {
        if self.blocked {
            let done = self.kv.detached.iter().map(|d| d.done).filter(|t| t.is_finite()).min_by(f64::total_cmp);
            return done.map(|t| self.clock.max(t));
        }
        if !self.inbox.is_empty() || !self.sched.is_idle() {
            return Some(self.clock);
        }
        self.incoming.iter().map(|&(t, _)| t).min_by(f64::total_cmp).map(|t| self.clock.max(t))
    }

    /// Hand the requests whose KV has arrived by `now` to its scheduler, by arrival time
    /// (ties by request index).
    pub(super) fn deliver(&mut self, now: f64) {
        if self.incoming.is_empty() {
            return;
        }
        self.incoming.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let due = self.incoming.iter().take_while(|&&(t, _)| t <= now).count();
        for (_, i) in self.incoming.drain(..due) {
            self.sched.deliver(i);
        }
    }
}

/// A step column entry: every one is bounded by a validated input (requests by
/// `MAX_REQUESTS`, tokens by the step budget, blocks by the pool's `MAX_BLOCKS`), so a
/// value beyond `u32` is an engine bug.
pub(super) fn narrow<T: TryInto<u32> + Copy + std::fmt::Display>(v: T, what: &str) -> Result<u32> {
    v.try_into().map_err(|_| KvError::Invariant(format!("step column {what}: {v} does not fit in u32")))
}

pub(super) fn record_step(m: &mut StepMetrics, replica: usize, p: &Replica, shape: &StepShape, t: f64, dt: f64) -> Result<()> {
    let (sched, kv, batch) = (&p.sched, &p.kv, &p.batch);
    let used = kv.used_blocks();
    let capacity = ((used + kv.reserved) * kv.block_size) as f64;
    // Empty slots of last blocks and reserved-but-unallocated blocks are the waste.
    let waste = kv.empty_slots as f64 + (kv.reserved * kv.block_size) as f64;
    m.time.push(t);
    m.replica.push(narrow(replica, "replica")?);
    m.duration.push(dt);
    m.running.push(narrow(sched.running.len(), "running")?);
    m.batch.push(narrow(batch.items.len(), "batch")?);
    m.waiting.push(narrow(sched.num_waiting() + sched.num_received(), "waiting")?);
    m.swapped.push(narrow(sched.num_swapped(), "swapped")?);
    m.prefill_tokens.push(narrow(shape.prefill_tokens, "prefill_tokens")?);
    m.decode_tokens.push(narrow(shape.decode_tokens, "decode_tokens")?);
    m.blocks_used.push(narrow(used, "blocks_used")?);
    m.blocks_reserved.push(narrow(kv.reserved, "blocks_reserved")?);
    m.kv_tokens.push(kv.kv_tokens);
    if kv.hybrid {
        for (col, &b) in m.group_blocks.iter_mut().zip(&kv.group_blocks) {
            col.push(narrow(b, "group_blocks")?);
        }
    }
    m.utilization.push(if capacity > 0.0 { (1.0 - waste / capacity).max(0.0) } else { 1.0 });
    m.cache_query_tokens.push(batch.cache_query_tokens);
    m.cache_hit_tokens.push(batch.cache_hit_tokens);
    let (q, h) = (batch.cache_query_tokens, batch.cache_hit_tokens);
    m.prefix_hit_rate.push(if q > 0 { h as f64 / q as f64 } else { f64::NAN });
    m.preemptions.push(batch.preemptions);
    m.swapped_blocks.push(narrow(batch.swapped_blocks, "swapped_blocks")?);
    Ok(())
}

pub(super) fn add_shape(s: &mut StepShape, items: &[(u32, u32)], reqs: &[ReqState], conv: Convention) {
    for &(i, n) in items {
        let r = &reqs[i as usize];
        let (n, c) = (n as u64, r.computed as u64);
        if r.is_decode(conv) {
            s.decode_tokens += n;
        } else {
            s.prefill_tokens += n;
        }
        s.context_tokens += c + n;
        s.attention_pairs += n * c + n * (n + 1) / 2;
    }
}

/// Account for a committed batch: sample, and free the requests that are done.
/// Events are `(request, first output token, finished)`.
pub(super) fn advance(items: &[(u32, u32)], reqs: &mut [ReqState], kv: &mut Kv, conv: Convention, events: &mut Vec<(u32, bool, bool)>) -> Result<()> {
    for &(i, n) in items {
        let r = &mut reqs[i as usize];
        if !r.advance(n, conv) {
            continue;
        }
        let finished = r.generated == r.output_len;
        if finished {
            kv.release(i as usize, r)?;
            r.status = Status::Finished;
        }
        events.push((i, r.generated == 1, finished));
    }
    Ok(())
}

/// The engine's mirror of a replica's pool agrees with the pool; `mine` tells the
/// requests routed to it.
pub(super) fn check_accounting(kv: &Kv, reqs: &[ReqState], mine: impl Fn(usize) -> bool) -> Result<()> {
    let mut tokens = 0u64;
    let mut empty = 0u64;
    let mut reserved = 0usize;
    let mut groups = vec![0usize; kv.num_groups()];
    let bs = kv.block_size;
    for (i, r) in reqs.iter().enumerate().filter(|&(i, _)| mine(i)) {
        let seq = crate::types::SeqId(i as u64);
        match r.status {
            Status::Running => {
                let len = kv.device.seq_len(seq)?;
                if len != r.kv_len as usize {
                    return Err(KvError::Invariant(format!("request {i}: pool holds {len} tokens, engine {}", r.kv_len)));
                }
                for (g, spec) in kv.specs.iter().enumerate() {
                    let (b, t) = device::held(spec, bs, len, r.frontier as usize);
                    groups[g] += b;
                    tokens += t as u64;
                    empty += (b * bs - t) as u64;
                }
                reserved += r.reserve_left as usize;
            }
            Status::Transferring if kv.detached.iter().any(|d| d.idx as usize == i) => {}
            Status::Swapped => {
                if kv.device.contains(seq) || !kv.host.as_ref().is_some_and(|h| h.contains(seq)) {
                    return Err(KvError::Invariant(format!("swapped request {i} is not (only) on the host")));
                }
            }
            _ => {
                if kv.device.contains(seq) {
                    return Err(KvError::Invariant(format!("request {i} ({:?}) still holds device blocks", r.status)));
                }
            }
        }
    }
    for d in &kv.detached {
        for (g, spec) in kv.specs.iter().enumerate() {
            let (b, t) = device::held(spec, bs, d.len as usize, d.frontier as usize);
            groups[g] += b;
            tokens += t as u64;
            empty += (b * bs - t) as u64;
        }
    }
    if tokens != kv.kv_tokens {
        return Err(KvError::Invariant(format!("engine counts {} KV tokens, requests hold {tokens}", kv.kv_tokens)));
    }
    if reserved != kv.reserved {
        return Err(KvError::Invariant(format!("engine reserves {} blocks, requests hold {reserved}", kv.reserved)));
    }
    if empty != kv.empty_slots {
        return Err(KvError::Invariant(format!("engine counts {} empty slots, requests hold {empty}", kv.empty_slots)));
    }
    if groups != kv.group_blocks {
        return Err(KvError::Invariant(format!("engine counts {:?} blocks per group, requests hold {groups:?}", kv.group_blocks)));
    }
    if kv.committed != 0 || kv.releasing != 0 || kv.copying != 0 {
        return Err(KvError::Invariant(format!("{} blocks promised, {} to release after commit", kv.committed, kv.releasing)));
    }
    let running = reqs.iter().enumerate().filter(|&(i, r)| mine(i) && r.status == Status::Running).map(|(i, r)| (i, r.frontier));
    let held = kv.detached.iter().map(|d| (d.idx as usize, d.frontier));
    kv.device.check_mirror(running.chain(held), &kv.group_blocks, kv.kv_tokens)
}
