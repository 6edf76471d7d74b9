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
//! A deployment may have several replicas (data parallelism, [`SimConfig::replicas`]):
//! each is that engine with its own pools ([`replica`]), a [`router`] sends each arrival to
//! one of them, and their steps run in time order on the one logical clock.
//!
//! Time is logical (the timer's seconds); the same workload and configuration give the
//! same result bit for bit.

pub mod device;
pub mod kv;
pub mod limits;
pub mod metrics;
pub mod request;
mod replica;
pub mod router;
pub mod scheduler;
pub mod stop;
pub mod timing;
pub mod workload;

use crate::error::{KvError, Result};
use crate::pool::GroupSpec;
use crate::invalid;
use crate::prefix_cache::CacheConfig;
use crate::error::{collect_n, filled, vec_for};
use replica::{add_shape, advance, check_accounting, record_step, Replica};
use router::Routing;

pub use kv::{Kv, Need};
pub use limits::{MAX_REPLICAS, MAX_REQUESTS, MAX_REQUEST_TOKENS, MAX_STEP_TOKENS};
pub use metrics::{Outcome, Percentiles, RequestMetrics, StepMetrics, Summary};
pub use metrics::UNROUTED;
pub use request::{Convention, ReqState, Status};
pub use router::Router;
pub use stop::{Attainment, StopWhen, Stopped};
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
    /// The model's layer groups: the device (and the host pool for swapping) is a
    /// `BlockPool` of them (None: one full-attention group); prefix caching caches every group.
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
    /// Replicas of the deployment (data parallelism), each a whole engine of this
    /// configuration with its own pools; 1 (default) to [`MAX_REPLICAS`].
    pub replicas: usize,
    /// How arrivals are spread over the replicas (see [`router`]).
    pub router: Router,
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
            replicas: 1,
            router: Router::RoundRobin,
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

/// Run `workload` to completion (or `max_steps`) and collect its metrics.
///
/// The replicas' steps and the arrivals are taken in time order (an arrival before a
/// step that starts at the same time; replicas by index): an arrival is routed at once
/// (a replica with nothing to do starts its next step then, or at the end of its last
/// step if that is later) and admitted at its replica's next step. The stop rule is
/// checked before each step, at its start, and when a replica runs out of work, at the
/// end of its last step once everything before it has happened: each time, every
/// request without its first token gets it at the end of a later step. With one replica
/// this is the classic loop (admit the arrivals, check, step or jump to the next arrival).
pub fn simulate(workload: &Workload, cfg: &SimConfig, timer: &mut dyn StepTimer) -> Result<SimResult> {
    let mut run = Run::new(workload, cfg)?;
    loop {
        let arrival = run.order.get(run.next).map(|&i| workload.arrival[i as usize]);
        let busy = run.next_busy();
        let next = match (arrival, busy) {
            (Some(a), Some((_, t))) => a.min(t),
            (Some(a), None) => a,
            (None, Some((_, t))) => t,
            (None, None) => f64::INFINITY,
        };
        if run.idle_checks_before(next, arrival.is_some_and(|a| a <= next)) {
            break;
        }
        let Some((r, t)) = busy.filter(|&(_, t)| arrival.is_none_or(|a| a > t)) else {
            if arrival.is_none() {
                break;
            }
            run.route_next();
            continue;
        };
        run.admit(r);
        if run.should_stop(t) {
            break;
        }
        if run.replicas[r].sched.is_idle() {
            continue;
        }
        if cfg.max_steps.is_some_and(|m| run.steps >= m) {
            break;
        }
        run.step(r, timer)?;
        if cfg.check_invariants {
            run.check(r)?;
        }
        if !run.replicas[r].has_work() {
            run.idle.push((run.replicas[r].clock, r));
        }
    }
    Ok(run.finish())
}

/// The state of one simulation run: the replicas, the router, every request and the
/// metrics collected so far.
struct Run<'a> {
    workload: &'a Workload,
    cfg: &'a SimConfig,
    replicas: Vec<Replica>,
    routing: Routing,
    /// Request indices by arrival time (ties by index).
    order: Vec<u32>,
    reqs: Vec<ReqState>,
    rm: RequestMetrics,
    ctr: Counters,
    sm: StepMetrics,
    /// `(request, first output token, finished)` of the current step.
    events: Vec<(u32, bool, bool)>,
    /// Next request of `order` to arrive.
    next: usize,
    /// Steps of every replica.
    steps: u64,
    /// `(end of its last step, replica)` of replicas that ran out of work, to check the
    /// stop rule at once everything before that time has happened.
    idle: Vec<(f64, usize)>,
    stop: Option<stop::StopState>,
    stopped: Option<Stopped>,
}

impl<'a> Run<'a> {
    fn new(workload: &'a Workload, cfg: &'a SimConfig) -> Result<Self> {
        workload.validate()?;
        if !(1..=MAX_REPLICAS).contains(&cfg.replicas) {
            return Err(invalid!("replicas must be in 1..={MAX_REPLICAS}, got {}", cfg.replicas));
        }
        let n = workload.len();
        let host_blocks = match cfg.scheduler.preemption {
            Preemption::Swap { host_blocks } => host_blocks,
            Preemption::Recompute => 0,
        };
        if let Some(s) = &cfg.stop_when {
            s.validate()?;
        }
        let mut replicas = vec_for(cfg.replicas, "replicas")?;
        for _ in 0..cfg.replicas {
            replicas.push(Replica::new(&cfg.scheduler, cfg.num_blocks, cfg.block_size, cfg.prefix_cache, cfg.groups.as_deref(), host_blocks)?);
        }

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
            replica: filled(UNROUTED, n, "requests")?,
            ..Default::default()
        };
        // One block column per group, in runs with groups only.
        let kv = &replicas[0].kv;
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
            routing: Routing::new(cfg.router, cfg.replicas)?,
            replicas,
            order,
            reqs,
            rm,
            ctr,
            sm,
            events: Vec::new(),
            next: 0,
            steps: 0,
            idle: Vec::new(),
            stop: cfg.stop_when.as_ref().map(|s| stop::StopState::new(s, &workload.arrival, &workload.output_len)),
            stopped: None,
        })
    }

    /// The replica with work whose next step starts first (ties: the lowest index), and when.
    fn next_busy(&self) -> Option<(usize, f64)> {
        let busy = self.replicas.iter().enumerate().filter(|(_, p)| p.has_work());
        busy.map(|(r, p)| (r, p.clock)).min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
    }

    /// Route the next arrival to its replica; one with nothing to do starts then.
    fn route_next(&mut self) {
        let i = self.order[self.next];
        self.next += 1;
        let at = self.workload.arrival[i as usize];
        let r = self.routing.route(at, self.workload.prompt_len[i as usize]);
        let p = &mut self.replicas[r];
        if !p.has_work() {
            p.clock = p.clock.max(at);
        }
        p.inbox.push(i);
        self.rm.replica[i as usize] = r as u32;
    }

    /// The stop rule at the end of each replica's last step before `next` (the next
    /// event; at it too when it is a step, not an arrival) of those still without work.
    /// Whether the run stops.
    fn idle_checks_before(&mut self, next: f64, arrival_next: bool) -> bool {
        if self.idle.is_empty() {
            return false;
        }
        self.idle.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let due = self.idle.iter().take_while(|&&(t, _)| t < next || (t == next && !arrival_next)).count();
        let checks: Vec<(f64, usize)> = self.idle.drain(..due).collect();
        for (t, r) in checks {
            if !self.replicas[r].has_work() && self.should_stop(t) {
                return true;
            }
        }
        false
    }

    /// Queue the requests routed to replica `r`, or reject those that can never run.
    fn admit(&mut self, r: usize) {
        let p = &mut self.replicas[r];
        for i in p.inbox.drain(..) {
            let req = &mut self.reqs[i as usize];
            let keyed = self.workload.tokens(i as usize).is_some() || self.workload.block_keys(i as usize).is_some();
            if p.sched.admissible_alone(req, &p.kv, keyed).is_err() {
                req.status = Status::Rejected;
                self.rm.outcome[i as usize] = Outcome::Rejected as u8;
                if let Some(s) = &mut self.stop {
                    s.on_reject(i as usize);
                }
            } else {
                req.status = Status::Waiting;
                p.sched.enqueue(i, req, false);
            }
        }
    }

    /// Schedule, time and commit one step of replica `r`.
    fn step(&mut self, r: usize, timer: &mut dyn StepTimer) -> Result<()> {
        let (conv, steps) = (self.cfg.scheduler.convention, self.steps);
        let p = &mut self.replicas[r];
        let now = p.clock;
        // vLLM: running, then admissions, one batch, finishes after the step. DecodeFirst:
        // the running batch decodes and frees its finished requests before admission.
        p.sched.schedule_running(&mut self.reqs, &mut p.kv, &mut p.batch, &mut self.ctr)?;
        let mut shape = StepShape::default();
        self.events.clear();
        let split = if conv == Convention::DecodeFirst {
            add_shape(&mut shape, &p.batch.items, &self.reqs, conv);
            p.kv.commit(&p.batch.items, &mut self.reqs)?;
            advance(&p.batch.items, &mut self.reqs, &mut p.kv, conv, &mut self.events)?;
            p.sched.retire(&self.reqs);
            p.batch.items.len()
        } else {
            0
        };
        p.sched.schedule_admissions(&mut self.reqs, &mut p.kv, self.workload, &mut p.batch, &mut self.ctr)?;
        if p.batch.items.is_empty() && p.batch.preemptions == 0 {
            return Err(KvError::Invariant(format!(
                "step {steps}: nothing could be scheduled with {} waiting and {} swapped",
                p.sched.num_waiting(),
                p.sched.num_swapped()
            )));
        }
        let rest = &p.batch.items[split..];
        add_shape(&mut shape, rest, &self.reqs, conv);
        shape.num_seqs = p.batch.items.len() as u64;
        shape.swapped_blocks = p.batch.swapped_blocks;
        p.kv.commit(rest, &mut self.reqs)?;
        let dt = timer.step_time(&shape)?;
        if !(dt.is_finite() && dt >= 0.0) {
            return Err(invalid!("time_model returned {dt} s at step {steps}; step durations must be finite and >= 0"));
        }
        let end = now + dt;
        if !end.is_finite() {
            return Err(invalid!("step {steps}: the simulated clock overflowed ({now} s + {dt} s); time_model durations are too large"));
        }
        if self.cfg.record_steps {
            record_step(&mut self.sm, r, p, &shape, now, dt)?;
        }
        advance(&p.batch.items[split..], &mut self.reqs, &mut p.kv, conv, &mut self.events)?;
        self.record_events(r, now, end);
        let p = &mut self.replicas[r];
        p.sched.retire(&self.reqs);
        p.clock = end;
        self.steps += 1;
        Ok(())
    }

    /// Per-request times of replica `r`'s step that ran from `start` to `end`.
    fn record_events(&mut self, r: usize, start: f64, end: f64) {
        let rm = &mut self.rm;
        for &(i, _) in &self.replicas[r].batch.items {
            if rm.first_scheduled[i as usize].is_nan() {
                rm.first_scheduled[i as usize] = start;
            }
        }
        for &(i, first, finished) in &self.events {
            let i = i as usize;
            if first {
                rm.first_token[i] = end;
                self.routing.on_first_token(r, end, self.workload.prompt_len[i], finished);
                if let Some(s) = &mut self.stop {
                    s.on_first_token(i, end - rm.arrival[i]);
                }
            } else if finished {
                self.routing.on_finish(r, end);
            }
            if finished {
                rm.finish[i] = end;
                rm.outcome[i] = Outcome::Finished as u8;
                if let Some(s) = &mut self.stop {
                    // As `RequestMetrics::tpot` computes it.
                    let out = self.workload.output_len[i];
                    s.on_finish(i, if out > 1 { (end - rm.first_token[i]) / (out - 1) as f64 } else { f64::NAN });
                }
            }
        }
    }

    /// Whether the stop rule ends the run at `now` (recording why).
    fn should_stop(&mut self, now: f64) -> bool {
        let Some(s) = &mut self.stop else { return false };
        self.stopped = s.check(now, &self.order, &self.workload.arrival, &self.rm.first_token);
        self.stopped.is_some()
    }

    /// Replica `r`'s pools' invariants and the engine's accounting, after its step.
    fn check(&self, r: usize) -> Result<()> {
        let kv = &self.replicas[r].kv;
        kv.device.check_invariants()?;
        if let Some(h) = &kv.host {
            h.check_invariants()?;
        }
        check_accounting(kv, &self.reqs, |i| self.rm.replica[i] == r as u32)
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
        let leaked_blocks = self.replicas.iter().map(|p| p.kv.used_blocks()).sum();
        SimResult { requests: rm, steps: self.sm, summary, leaked_blocks }
    }
}
