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
//! Prefill and decode may run on separate instances with the KV moved between them over
//! a link ([`SimConfig::disaggregation`], [`disagg`]).
//!
//! Time is logical (the timer's seconds); the same workload and configuration give the
//! same result bit for bit.

mod config;
pub mod device;
pub mod disagg;
pub mod kv;
pub mod limits;
pub mod metrics;
pub mod request;
mod replica;
pub mod router;
mod run;
pub mod scheduler;
pub mod stop;
pub mod timing;
pub mod workload;

use crate::error::Result;
use replica::Role;
use run::Run;
use std::cmp::Reverse;

pub use config::SimConfig;
pub use disagg::{Disaggregation, KvLink, MAX_LINK_LAYERS};
pub use kv::{Kv, Need};
pub use limits::{MAX_REPLICAS, MAX_REQUESTS, MAX_REQUEST_TOKENS, MAX_STEP_TOKENS};
pub use metrics::{Outcome, Percentiles, RequestMetrics, SimResult, StepMetrics, Summary};
pub use metrics::UNROUTED;
pub use request::{Convention, ReqState, Status};
pub use router::Router;
pub use stop::{Attainment, StopWhen, Stopped};
pub use scheduler::{Allocation, Batch, Counters, Preemption, QueuePolicy, Scheduler, SchedulerConfig, Victim};
pub use timing::{ConstantTime, Roofline, StepShape, StepTimer};
pub use workload::Workload;

/// Run `workload` to completion (or `max_steps`) and collect its metrics, every step
/// timed by `timer` (see [`simulate_with`]).
pub fn simulate(workload: &Workload, cfg: &SimConfig, timer: &mut dyn StepTimer) -> Result<SimResult> {
    simulate_with(workload, cfg, timer, None)
}

/// Run `workload` to completion (or `max_steps`) and collect its metrics; a
/// disaggregated deployment's decode instances' steps are timed by `decode_timer` when
/// given (their hardware or parallelism differs), every other step by `timer`.
///
/// The replicas' steps and the events (arrivals, and with disaggregation the ends of
/// prefills whose KV moves on) are taken in time order (an event before a step that
/// starts at the same time, an arrival before a prefill's end; replicas by index): an
/// arrival is routed at once (a replica with nothing to do starts its next step then, or
/// at the end of its last step if that is later) and admitted at its replica's next
/// step. The stop rule is checked before each step, at its start, and when a replica
/// runs out of work, at the end of its last step once everything before it has happened:
/// each time, every request without its first token gets it at the end of a later step.
/// With one replica this is the classic loop (admit the arrivals, check, step or jump to
/// the next arrival).
pub fn simulate_with(
    workload: &Workload,
    cfg: &SimConfig,
    timer: &mut dyn StepTimer,
    mut decode_timer: Option<&mut dyn StepTimer>,
) -> Result<SimResult> {
    let mut run = Run::new(workload, cfg)?;
    loop {
        let arrival = run.order.get(run.next).map(|&i| workload.arrival[i as usize]);
        let handoff = run.handoffs.peek().map(|Reverse(h)| f64::from_bits(h.0));
        let event = match (arrival, handoff) {
            (Some(a), Some(h)) => Some(a.min(h)),
            (a, h) => a.or(h),
        };
        let busy = run.next_busy();
        let next = match (event, busy) {
            (Some(e), Some((_, t))) => e.min(t),
            (Some(e), None) => e,
            (None, Some((_, t))) => t,
            (None, None) => f64::INFINITY,
        };
        if run.idle_checks_before(next, event.is_some_and(|e| e <= next)) {
            break;
        }
        let Some((r, t)) = busy.filter(|&(_, t)| event.is_none_or(|e| e > t)) else {
            match (arrival, handoff) {
                (None, None) => break,
                (Some(a), h) if h.is_none_or(|h| a <= h) => run.route_next(),
                _ => run.hand_over()?,
            }
            continue;
        };
        run.replicas[r].clock = t;
        run.admit(r)?;
        if run.should_stop(t) {
            break;
        }
        if run.replicas[r].sched.is_idle() {
            continue;
        }
        if cfg.max_steps.is_some_and(|m| run.steps >= m) {
            break;
        }
        let timer: &mut dyn StepTimer = match (run.replicas[r].role, decode_timer.as_deref_mut()) {
            (Role::Decode, Some(d)) => d,
            _ => &mut *timer,
        };
        run.step(r, timer)?;
        if cfg.check_invariants {
            run.check(r)?;
        }
        if !run.replicas[r].has_work() {
            run.idle.push((run.replicas[r].clock, r));
        }
    }
    run.finish()
}

