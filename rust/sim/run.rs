//! One simulation run's state and its steps: the replicas, the routers, every request,
//! the metrics so far; [`super::simulate_with`] drives it in time order.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::config::SimConfig;
use super::limits::MAX_REPLICAS;
use super::metrics::{Outcome, RequestMetrics, SimResult, StepMetrics, Summary, UNROUTED};
use super::replica::{add_shape, advance, check_accounting, record_step, Replica, Role};
use super::request::{Convention, ReqState, Status};
use super::router::Routing;
use super::scheduler::{Allocation, Counters, Preemption};
use super::stop::{self, Stopped};
use super::timing::{StepShape, StepTimer};
use super::workload::Workload;
use crate::error::{collect_n, filled, vec_for, KvError, Result};
use crate::invalid;

/// The state of one simulation run: the replicas, the router, every request and the
/// metrics collected so far.
pub(super) struct Run<'a> {
    workload: &'a Workload,
    cfg: &'a SimConfig,
    pub(super) replicas: Vec<Replica>,
    /// Prefill instances with disaggregation (they come first), else every replica.
    prefill: usize,
    routing: Routing,
    /// Disaggregated: the router over the decode instances.
    decode_routing: Option<Routing>,
    /// Disaggregated: `(end, request, start)` (times as bits: non-negative floats order as
    /// their bits) of prefill steps whose request's KV is to move, by end then request.
    pub(super) handoffs: BinaryHeap<Reverse<(u64, u32, u64)>>,
    /// Bytes of the transfers scheduled.
    transfer_bytes: f64,
    transfers: u64,
    /// Request indices by arrival time (ties by index).
    pub(super) order: Vec<u32>,
    reqs: Vec<ReqState>,
    rm: RequestMetrics,
    ctr: Counters,
    sm: StepMetrics,
    /// `(request, first output token, finished)` of the current step.
    events: Vec<(u32, bool, bool)>,
    /// Next request of `order` to arrive.
    pub(super) next: usize,
    /// Steps of every replica.
    pub(super) steps: u64,
    /// `(end of its last step, replica)` of replicas that ran out of work, to check the
    /// stop rule at once everything before that time has happened.
    pub(super) idle: Vec<(f64, usize)>,
    stop: Option<stop::StopState>,
    stopped: Option<Stopped>,
}

impl<'a> Run<'a> {
    pub(super) fn new(workload: &'a Workload, cfg: &'a SimConfig) -> Result<Self> {
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
        let disagg = cfg.disaggregation.as_ref();
        if let Some(d) = disagg {
            d.validate()?;
            if cfg.scheduler.convention != Convention::Vllm || cfg.scheduler.allocation != Allocation::Paged {
                return Err(invalid!("disaggregation needs convention='vllm' and allocation='paged'"));
            }
        }
        let decode = disagg.map_or(0, |d| d.decode_replicas);
        let mut replicas = vec_for(cfg.replicas + decode, "replicas")?;
        let groups = cfg.groups.as_deref();
        for _ in 0..cfg.replicas {
            let mut p = Replica::new(&cfg.scheduler, cfg.num_blocks, cfg.block_size, cfg.prefix_cache, groups, host_blocks)?;
            p.role = if disagg.is_some() { Role::Prefill } else { Role::Both };
            replicas.push(p);
        }
        for _ in 0..decode {
            let blocks = disagg.map_or(0, |d| d.decode_num_blocks);
            let mut p = Replica::new(&cfg.scheduler, blocks, cfg.block_size, None, groups, host_blocks)?;
            p.role = Role::Decode;
            replicas.push(p);
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
            decode_replica: filled(UNROUTED, if decode > 0 { n } else { 0 }, "requests")?,
            kv_ready: filled(f64::NAN, if decode > 0 { n } else { 0 }, "requests")?,
            decode_start: filled(f64::NAN, if decode > 0 { n } else { 0 }, "requests")?,
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
            routing: Routing::new(cfg.router, cfg.replicas, disagg.is_some_and(|d| d.mixed_tokens.is_some()))?,
            decode_routing: disagg.map(|d| Routing::new(cfg.router, d.decode_replicas, false)).transpose()?,
            prefill: cfg.replicas,
            handoffs: BinaryHeap::new(),
            transfer_bytes: 0.0,
            transfers: 0,
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
    pub(super) fn next_busy(&self) -> Option<(usize, f64)> {
        let busy = self.replicas.iter().enumerate().filter_map(|(r, p)| p.next_start().map(|t| (r, t)));
        busy.min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
    }

    /// The replica whose decode serves request `i` now: its decode instance once its KV
    /// moved there, else the replica it was routed to.
    fn owner(&self, i: usize) -> u32 {
        match self.rm.decode_replica.get(i) {
            Some(&d) if d != UNROUTED => d,
            _ => self.rm.replica[i],
        }
    }

    /// The next prefill end whose request's KV moves on: pick its decode instance and
    /// schedule the transfer on both links.
    pub(super) fn hand_over(&mut self) -> Result<()> {
        let (Some(Reverse((end, i, start))), Some(d), Some(routing)) =
            (self.handoffs.pop(), self.cfg.disaggregation.as_ref(), self.decode_routing.as_mut())
        else {
            return Err(KvError::Invariant("a handoff without disaggregation".into()));
        };
        let (end, start, iu) = (f64::from_bits(end), f64::from_bits(start), i as usize);
        let target = self.prefill + routing.route(end, 1);
        let source = self.rm.replica[iu] as usize;
        let bytes = d.link.bytes_per_token * self.reqs[iu].kv_len as f64;
        let free = self.replicas[source].link_free.max(self.replicas[target].link_free);
        let (done, ready) = d.link.transfer(bytes, start, end, free);
        if !ready.is_finite() {
            return Err(invalid!("request {i}: the simulated clock overflowed moving its KV ({bytes} bytes)"));
        }
        self.replicas[source].link_free = done;
        self.replicas[target].link_free = done;
        self.replicas[source].kv.transfer_done_at(i, ready)?;
        self.replicas[target].incoming.push((ready, i));
        self.rm.decode_replica[iu] = target as u32;
        self.rm.kv_ready[iu] = ready;
        self.transfers += 1;
        self.transfer_bytes += bytes;
        Ok(())
    }

    /// Route the next arrival to its replica; one with nothing to do starts then.
    pub(super) fn route_next(&mut self) {
        let i = self.order[self.next];
        self.next += 1;
        let (at, prompt) = (self.workload.arrival[i as usize], self.workload.prompt_len[i as usize]);
        let mixed = self.cfg.disaggregation.as_ref().and_then(|d| d.mixed_tokens);
        let r = match (mixed, &mut self.decode_routing) {
            // Every prefill instance has that many tokens pending: a decode instance
            // serves the request whole.
            (Some(limit), Some(decode)) if self.routing.least_load(at) >= limit.min(i64::MAX as u64) as i64 => {
                self.prefill + decode.route(at, prompt)
            }
            _ => self.routing.route(at, prompt),
        };
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
    pub(super) fn idle_checks_before(&mut self, next: f64, arrival_next: bool) -> bool {
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

    /// Before replica `r`'s step at its clock: free what it held for transfers done by
    /// then, hand its scheduler the KV that has arrived, and queue the requests routed to
    /// it or reject those that can never run (with disaggregation: on a prefill instance
    /// with their prompt, or on a decode instance with their whole length).
    pub(super) fn admit(&mut self, r: usize) -> Result<()> {
        let now = self.replicas[r].clock;
        if !self.replicas[r].kv.detached.is_empty() {
            self.replicas[r].kv.drop_transferred(now)?;
        }
        self.replicas[r].deliver(now);
        let inbox = std::mem::take(&mut self.replicas[r].inbox);
        let conv = self.cfg.scheduler.convention;
        for &i in &inbox {
            let req = &self.reqs[i as usize];
            let keyed = self.workload.tokens(i as usize).is_some() || self.workload.block_keys(i as usize).is_some();
            let p = &self.replicas[r];
            let ok = if p.role == Role::Prefill {
                let d = &self.replicas[self.prefill];
                p.sched.admissible_alone(req, &p.kv, keyed, req.prompt_len as u64).is_ok()
                    && (req.output_len == 1 || d.sched.admissible_alone(req, &d.kv, false, req.max_kv(conv)).is_ok())
            } else {
                p.sched.admissible_alone(req, &p.kv, keyed, req.max_kv(conv)).is_ok()
            };
            let req = &mut self.reqs[i as usize];
            if !ok {
                req.status = Status::Rejected;
                self.rm.outcome[i as usize] = Outcome::Rejected as u8;
                if let Some(s) = &mut self.stop {
                    s.on_reject(i as usize);
                }
            } else {
                req.status = Status::Waiting;
                self.replicas[r].sched.enqueue(i, req, false);
            }
        }
        let mut inbox = inbox;
        inbox.clear();
        self.replicas[r].inbox = inbox;
        Ok(())
    }

    /// Schedule, time and commit one step of replica `r` (none when it is blocked).
    pub(super) fn step(&mut self, r: usize, timer: &mut dyn StepTimer) -> Result<()> {
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
        p.blocked = p.batch.items.is_empty() && p.batch.preemptions == 0 && !p.kv.detached.is_empty();
        if p.blocked {
            // Nothing was scheduled, so nothing changed: the step waits for a transfer.
            return Ok(());
        }
        if p.batch.items.is_empty() && p.batch.preemptions == 0 {
            return Err(KvError::Invariant(format!(
                "step {steps}: nothing could be scheduled with {} waiting, {} swapped and {} received",
                p.sched.num_waiting(),
                p.sched.num_swapped(),
                p.sched.num_received()
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
        if self.replicas[r].role == Role::Prefill {
            self.detach_prefilled(r, now, end);
        }
        let p = &mut self.replicas[r];
        p.sched.retire(&self.reqs);
        p.clock = end;
        self.steps += 1;
        Ok(())
    }

    /// Per-request times of replica `r`'s step that ran from `start` to `end`, and the
    /// routers' load changes at its end.
    fn record_events(&mut self, r: usize, start: f64, end: f64) {
        let rm = &mut self.rm;
        let role = self.replicas[r].role;
        for &(i, _) in &self.replicas[r].batch.items {
            let moved = rm.decode_replica.get(i as usize).is_some_and(|&d| d != UNROUTED);
            let col = if role == Role::Decode && moved { &mut rm.decode_start } else { &mut rm.first_scheduled };
            if col[i as usize].is_nan() {
                col[i as usize] = start;
            }
        }
        for &(i, first, finished) in &self.events {
            let i = i as usize;
            let prompt = self.workload.prompt_len[i] as i64;
            match role {
                // A prefill instance's request leaves it at its first token.
                Role::Prefill => self.routing.change(r, end, -prompt),
                Role::Both if first => self.routing.change(r, end, 1 - prompt - finished as i64),
                Role::Both if finished => self.routing.change(r, end, -1),
                // A request its prefill instance handed over counts 1 from then on; one a
                // mixed pool sent here whole counts its prompt until its first token.
                Role::Decode if first || finished => {
                    if let Some(d) = &mut self.decode_routing {
                        d.change(r - self.prefill, end, if first { 1 - prompt - finished as i64 } else { -1 });
                    }
                }
                _ => {}
            }
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
                    s.on_finish(i, if out > 1 { (end - rm.first_token[i]) / (out - 1) as f64 } else { f64::NAN });
                }
            }
        }
    }

    /// The requests prefill instance `r`'s step (from `start` to `end`) took to their
    /// first token and that go on: out of its batch, their blocks held for the transfer,
    /// to be handed over at `end`. On the decode side the KV is resumed from its length.
    fn detach_prefilled(&mut self, r: usize, start: f64, end: f64) {
        for &(i, first, finished) in &self.events {
            if !first || finished {
                continue;
            }
            let req = &mut self.reqs[i as usize];
            self.replicas[r].kv.detach(i, req);
            req.status = Status::Transferring;
            req.frontier = req.kv_len;
            self.handoffs.push(Reverse((end.to_bits(), i, start.to_bits())));
        }
    }

    /// Whether the stop rule ends the run at `now` (recording why).
    pub(super) fn should_stop(&mut self, now: f64) -> bool {
        let Some(s) = &mut self.stop else { return false };
        self.stopped = s.check(now, &self.order, &self.workload.arrival, &self.rm.first_token);
        self.stopped.is_some()
    }

    /// Replica `r`'s pools' invariants and the engine's accounting, after its step.
    pub(super) fn check(&self, r: usize) -> Result<()> {
        let kv = &self.replicas[r].kv;
        kv.device.check_invariants()?;
        if let Some(h) = &kv.host {
            h.check_invariants()?;
        }
        check_accounting(kv, &self.reqs, |i| self.owner(i) == r as u32)
    }

    pub(super) fn finish(mut self) -> Result<SimResult> {
        // Transfers scheduled (a finite end) complete: their prefill instance frees their
        // blocks; one not scheduled yet (an early stop) stays held.
        for p in &mut self.replicas {
            p.kv.drop_transferred(f64::MAX)?;
        }
        let mut rm = self.rm;
        rm.preemptions = self.ctr.preemptions;
        rm.swaps = self.ctr.swaps;
        rm.recomputed_tokens = self.ctr.recomputed;
        rm.cached_tokens = self.ctr.cached;
        let w = self.workload;
        let mut summary = Summary::compute(&rm, &self.sm, &w.prompt_len, &w.output_len, self.steps);
        summary.stopped = self.stopped.map(Stopped::name);
        summary.kv_transfers = self.transfers;
        summary.kv_transfer_bytes = self.transfer_bytes;
        let leaked_blocks = self.replicas.iter().map(|p| p.kv.used_blocks()).sum();
        Ok(SimResult { requests: rm, steps: self.sm, summary, leaked_blocks })
    }
}
