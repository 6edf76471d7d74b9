//! A deterministic step-level serving simulator over the real [`BlockPool`](crate::BlockPool) (or, for a
//! model with layer groups, the real [`crate::pool::BlockPool`]).
//!
//! [`simulate`] replays a [`Workload`] through a [`Scheduler`] (continuous batching) whose
//! every allocation goes through the pool users import. Each engine step: requests that
//! have arrived by the step's start join the queue; the scheduler picks a batch and
//! promises its blocks; the pool grows every sequence of the batch in one atomic step; the
//! [`StepTimer`] gives the step's duration; requests whose computation reached their last
//! token sample one output token, and those at their output length finish and free their
//! blocks. When nothing is in flight the clock jumps to the next arrival.
//!
//! Time is logical (the timer's seconds); the same workload and configuration give the
//! same result bit for bit.

pub mod device;
pub mod kv;
pub mod limits;
pub mod metrics;
pub mod request;
pub mod scheduler;
pub mod stop;
pub mod timing;
pub mod workload;

use crate::error::{KvError, Result};
use crate::pool::GroupSpec;
use crate::invalid;
use crate::prefix_cache::CacheConfig;
use crate::error::{collect_n, filled, vec_for};

pub use kv::{Kv, Need};
pub use limits::{MAX_REQUESTS, MAX_REQUEST_TOKENS, MAX_STEP_TOKENS};
pub use metrics::{Outcome, Percentiles, RequestMetrics, StepMetrics, Summary};
pub use request::{Convention, ReqState, Status};
pub use stop::{StopWhen, Stopped};
pub use scheduler::{Allocation, Batch, Counters, Preemption, QueuePolicy, Scheduler, SchedulerConfig, Victim};
pub use timing::{ConstantTime, Roofline, StepShape, StepTimer};
pub use workload::Workload;

/// Everything but the workload and the timer.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub num_blocks: usize,
    pub block_size: usize,
    pub scheduler: SchedulerConfig,
    /// Automatic prefix caching of prompts given as token ids or block keys (None: off).
    pub prefix_cache: Option<CacheConfig>,
    /// The model's layer groups: the device is a `BlockPool` of them (None: a
    /// `BlockPool`, one full-attention group). Refused with prefix caching or swapping.
    pub groups: Option<Vec<GroupSpec>>,
    /// Run `check_invariants` on both pools after every step (slow; for tests).
    pub check_invariants: bool,
    /// Stop after this many steps (requests still in flight are reported `Unfinished`).
    pub max_steps: Option<u64>,
    /// Record per-step columns (the summary's utilization needs them).
    pub record_steps: bool,
    /// Stop as soon as the run certainly cannot meet these targets (see [`stop`]); the
    /// summary's `stopped` says why. None: run to the end.
    pub stop_when: Option<StopWhen>,
}

impl SimConfig {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            num_blocks,
            block_size,
            scheduler: SchedulerConfig::default(),
            prefix_cache: None,
            groups: None,
            check_invariants: false,
            max_steps: None,
            record_steps: true,
            stop_when: None,
        }
    }
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct SimResult {
    pub requests: RequestMetrics,
    pub steps: StepMetrics,
    pub summary: Summary,
    /// Blocks still held when the run ended (0 after a complete run: conservation).
    pub leaked_blocks: usize,
}

/// A step column entry: every one is bounded by a validated input (requests by
/// `MAX_REQUESTS`, tokens by the step budget, blocks by the pool's `MAX_BLOCKS`), so a
/// value beyond `u32` is an engine bug.
fn narrow<T: TryInto<u32> + Copy + std::fmt::Display>(v: T, what: &str) -> Result<u32> {
    v.try_into().map_err(|_| KvError::Invariant(format!("step column {what}: {v} does not fit in u32")))
}

fn record_step(m: &mut StepMetrics, sched: &Scheduler, kv: &Kv, batch: &Batch, shape: &StepShape, t: f64, dt: f64) -> Result<()> {
    let used = kv.used_blocks();
    let capacity = ((used + kv.reserved) * kv.block_size) as f64;
    // Empty slots of last blocks and reserved-but-unallocated blocks are the waste.
    let waste = kv.empty_slots as f64 + (kv.reserved * kv.block_size) as f64;
    m.time.push(t);
    m.duration.push(dt);
    m.running.push(narrow(sched.running.len(), "running")?);
    m.batch.push(narrow(batch.items.len(), "batch")?);
    m.waiting.push(narrow(sched.num_waiting(), "waiting")?);
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

fn add_shape(s: &mut StepShape, items: &[(u32, u32)], reqs: &[ReqState], conv: Convention) {
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
fn advance(items: &[(u32, u32)], reqs: &mut [ReqState], kv: &mut Kv, conv: Convention, events: &mut Vec<(u32, bool, bool)>) -> Result<()> {
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

/// Run `workload` to completion (or `max_steps`) and collect its metrics.
pub fn simulate(workload: &Workload, cfg: &SimConfig, timer: &mut dyn StepTimer) -> Result<SimResult> {
    let mut run = Run::new(workload, cfg)?;
    loop {
        run.admit_arrivals();
        if run.should_stop() {
            break;
        }
        if run.sched.is_idle() {
            if run.next == run.order.len() {
                break;
            }
            run.now = run.now.max(workload.arrival[run.order[run.next] as usize]);
            continue;
        }
        if cfg.max_steps.is_some_and(|m| run.steps >= m) {
            break;
        }
        run.step(timer)?;
        if cfg.check_invariants {
            run.check()?;
        }
    }
    Ok(run.finish())
}

/// The state of one simulation run: the scheduler, the pools, every request and the
/// metrics collected so far.
struct Run<'a> {
    workload: &'a Workload,
    cfg: &'a SimConfig,
    sched: Scheduler,
    kv: Kv,
    /// Request indices by arrival time (ties by index).
    order: Vec<u32>,
    reqs: Vec<ReqState>,
    rm: RequestMetrics,
    ctr: Counters,
    sm: StepMetrics,
    batch: Batch,
    /// `(request, first output token, finished)` of the current step.
    events: Vec<(u32, bool, bool)>,
    now: f64,
    /// Next request of `order` to arrive.
    next: usize,
    steps: u64,
    stop: Option<stop::StopState>,
    stopped: Option<Stopped>,
}

impl<'a> Run<'a> {
    fn new(workload: &'a Workload, cfg: &'a SimConfig) -> Result<Self> {
        workload.validate()?;
        let n = workload.len();
        let host_blocks = match cfg.scheduler.preemption {
            Preemption::Swap { host_blocks } => host_blocks,
            Preemption::Recompute => 0,
        };
        // The configuration is checked before the pools are allocated.
        let sched = Scheduler::new(cfg.scheduler.clone())?;
        let watermark = (cfg.scheduler.watermark * cfg.num_blocks as f64) as usize;
        if let Some(s) = &cfg.stop_when {
            s.validate()?;
        }
        let kv = Kv::new(cfg.num_blocks, cfg.block_size, cfg.prefix_cache, cfg.groups.as_deref(), host_blocks, watermark)?;

        // `validate` bounds n by MAX_REQUESTS < 2^32: indices and ranks fit in u32.
        let mut order: Vec<u32> = collect_n(n, "requests", |i| i as u32)?;
        order.sort_by(|&a, &b| workload.arrival[a as usize].total_cmp(&workload.arrival[b as usize]).then(a.cmp(&b)));
        let mut reqs: Vec<ReqState> =
            collect_n(n, "requests", |i| ReqState::new(workload.prompt_len[i], workload.output_len[i], workload.priority[i]))?;
        for (rank, &i) in order.iter().enumerate() {
            reqs[i as usize].ordinal = rank as u32;
        }
        let nan = || filled(f64::NAN, n, "requests");
        let mut arrival = vec_for(n, "requests")?;
        arrival.extend_from_slice(&workload.arrival);
        let rm = RequestMetrics {
            arrival,
            first_scheduled: nan()?,
            first_token: nan()?,
            finish: nan()?,
            outcome: filled(Outcome::Unfinished as u8, n, "requests")?,
            ..Default::default()
        };
        // One block column per group, in runs with groups only.
        let sm = StepMetrics { group_blocks: vec![Vec::new(); if kv.hybrid { kv.num_groups() } else { 0 }], ..Default::default() };
        let ctr = Counters {
            preemptions: filled(0, n, "requests")?,
            swaps: filled(0, n, "requests")?,
            recomputed: filled(0, n, "requests")?,
            cached: filled(0, n, "requests")?,
        };
        Ok(Self {
            workload,
            cfg,
            sched,
            kv,
            order,
            reqs,
            rm,
            ctr,
            sm,
            batch: Batch::default(),
            events: Vec::new(),
            now: 0.0,
            next: 0,
            steps: 0,
            stop: cfg.stop_when.as_ref().map(|s| stop::StopState::new(s, &workload.arrival, &workload.output_len)),
            stopped: None,
        })
    }

    /// Queue every request that has arrived by `now`, or reject it if it can never run.
    fn admit_arrivals(&mut self) {
        let n = self.order.len();
        while self.next < n && self.workload.arrival[self.order[self.next] as usize] <= self.now {
            let i = self.order[self.next];
            self.next += 1;
            let r = &mut self.reqs[i as usize];
            let keyed = self.workload.tokens(i as usize).is_some() || self.workload.block_keys(i as usize).is_some();
            if self.sched.admissible_alone(r, &self.kv, keyed).is_err() {
                r.status = Status::Rejected;
                self.rm.outcome[i as usize] = Outcome::Rejected as u8;
                if let Some(s) = &mut self.stop {
                    s.on_reject();
                }
            } else {
                r.status = Status::Waiting;
                self.sched.enqueue(i, r, false);
            }
        }
    }

    /// Schedule, time and commit one step.
    fn step(&mut self, timer: &mut dyn StepTimer) -> Result<()> {
        let (conv, steps, now) = (self.cfg.scheduler.convention, self.steps, self.now);
        // vLLM: running, then admissions, one batch, finishes after the step. DecodeFirst:
        // the running batch decodes and frees its finished requests before admission.
        self.sched.schedule_running(&mut self.reqs, &mut self.kv, &mut self.batch, &mut self.ctr)?;
        let mut shape = StepShape::default();
        self.events.clear();
        let split = if conv == Convention::DecodeFirst {
            add_shape(&mut shape, &self.batch.items, &self.reqs, conv);
            self.kv.commit(&self.batch.items, &mut self.reqs)?;
            advance(&self.batch.items, &mut self.reqs, &mut self.kv, conv, &mut self.events)?;
            self.sched.retire(&self.reqs);
            self.batch.items.len()
        } else {
            0
        };
        self.sched.schedule_admissions(&mut self.reqs, &mut self.kv, self.workload, &mut self.batch, &mut self.ctr)?;
        if self.batch.items.is_empty() && self.batch.preemptions == 0 {
            return Err(KvError::Invariant(format!(
                "step {steps}: nothing could be scheduled with {} waiting and {} swapped",
                self.sched.num_waiting(),
                self.sched.num_swapped()
            )));
        }
        let rest = &self.batch.items[split..];
        add_shape(&mut shape, rest, &self.reqs, conv);
        shape.num_seqs = self.batch.items.len() as u64;
        shape.swapped_blocks = self.batch.swapped_blocks;
        self.kv.commit(rest, &mut self.reqs)?;
        let dt = timer.step_time(&shape)?;
        if !(dt.is_finite() && dt >= 0.0) {
            return Err(invalid!("time_model returned {dt} s at step {steps}; step durations must be finite and >= 0"));
        }
        let end = now + dt;
        if !end.is_finite() {
            return Err(invalid!("step {steps}: the simulated clock overflowed ({now} s + {dt} s); time_model durations are too large"));
        }
        if self.cfg.record_steps {
            record_step(&mut self.sm, &self.sched, &self.kv, &self.batch, &shape, now, dt)?;
        }
        advance(&self.batch.items[split..], &mut self.reqs, &mut self.kv, conv, &mut self.events)?;
        self.record_events(end);
        self.sched.retire(&self.reqs);
        self.now = end;
        self.steps += 1;
        Ok(())
    }

    /// Per-request times of the step that ran from `self.now` to `end`.
    fn record_events(&mut self, end: f64) {
        let rm = &mut self.rm;
        for &(i, _) in &self.batch.items {
            if rm.first_scheduled[i as usize].is_nan() {
                rm.first_scheduled[i as usize] = self.now;
            }
        }
        for &(i, first, finished) in &self.events {
            let i = i as usize;
            if first {
                rm.first_token[i] = end;
                if let Some(s) = &mut self.stop {
                    s.on_first_token(i, end - rm.arrival[i]);
                }
            }
            if finished {
                rm.finish[i] = end;
                rm.outcome[i] = Outcome::Finished as u8;
                if let Some(s) = &mut self.stop {
                    // As `RequestMetrics::tpot` computes it.
                    let out = self.workload.output_len[i];
                    s.on_finish(if out > 1 { (end - rm.first_token[i]) / (out - 1) as f64 } else { f64::NAN });
                }
            }
        }
    }

    /// Whether the stop rule ends the run here (recording why).
    fn should_stop(&mut self) -> bool {
        let Some(s) = &mut self.stop else { return false };
        self.stopped = s.check(self.now, &self.order, &self.workload.arrival, &self.rm.first_token);
        self.stopped.is_some()
    }

    /// Both pools' invariants and the engine's accounting, after a step.
    fn check(&self) -> Result<()> {
        self.kv.device.check_invariants()?;
        if let Some(h) = &self.kv.host {
            h.check_invariants()?;
        }
        check_accounting(&self.kv, &self.reqs)
    }

    fn finish(self) -> SimResult {
        let mut rm = self.rm;
        rm.preemptions = self.ctr.preemptions;
        rm.swaps = self.ctr.swaps;
        rm.recomputed_tokens = self.ctr.recomputed;
        rm.cached_tokens = self.ctr.cached;
        let w = self.workload;
        let mut summary = Summary::compute(&rm, &self.sm, &w.prompt_len, &w.output_len, self.steps);
        summary.stopped = self.stopped.map(Stopped::name);
        SimResult { requests: rm, steps: self.sm, summary, leaked_blocks: self.kv.used_blocks() }
    }
}

/// The engine's mirror of the pool agrees with the pool.
fn check_accounting(kv: &Kv, reqs: &[ReqState]) -> Result<()> {
    let mut tokens = 0u64;
    let mut empty = 0u64;
    let mut reserved = 0usize;
    let mut groups = vec![0usize; kv.num_groups()];
    let bs = kv.block_size;
    for (i, r) in reqs.iter().enumerate() {
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
    kv.device.check_mirror(reqs.iter().enumerate().filter(|(_, r)| r.status == Status::Running).map(|(i, r)| (i, r.frontier)), &kv.group_blocks, kv.kv_tokens)
}
