//! How a deployment of several replicas (data parallelism) spreads arrivals over them.
//!
//! Each replica is a whole serving engine: its own scheduler and device pool, the same
//! configuration and step-time model. The router sees every request once, at its
//! arrival, and sends it to one replica for good (no migration, no retry):
//!
//! - [`Router::RoundRobin`]: the `k`-th arrival (in arrival order, ties by workload index)
//!   goes to replica `k mod replicas`. It reads no state, so each replica serves exactly
//!   the requests a split of the trace gives it (the engine's tests check this).
//! - [`Router::ShortestQueue`]: join the shortest queue counted in tokens, as
//!   SplitwiseSim's token JSQ counts them: a request routed to a replica adds its prompt
//!   tokens until its first output token, then 1 until it finishes. The router knows
//!   prompt lengths and when each first token and finish happen (the end of the step
//!   that produced them), never output lengths. Ties go to the lowest replica index.
//!
//! The load a replica has at an arrival counts the events of the steps it has run whose
//! end is at or before the arrival; a step still running at the arrival has not ended.
//!
//! With prefill/decode disaggregation ([`super::disagg`]) one router spreads the arrivals
//! over the prefill instances (a request counts its prompt until its first token, when it
//! leaves) and a second one, of the same policy, the requests whose KV moves over the
//! decode instances at their prefill's end (each counts 1 until it finishes).

use std::collections::VecDeque;

use crate::error::{filled, Result};

/// The routing policy of a deployment of several replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Router {
    #[default]
    RoundRobin,
    ShortestQueue,
}

impl Router {
    /// Its name in the bindings and the summary.
    pub fn name(self) -> &'static str {
        match self {
            Router::RoundRobin => "round_robin",
            Router::ShortestQueue => "shortest_queue",
        }
    }
}

/// The router's state over a run.
pub(super) struct Routing {
    policy: Router,
    replicas: usize,
    /// Arrivals routed so far (the round-robin counter).
    routed: u64,
    /// Per replica: tokens pending, counting the changes due by the last arrival.
    load: Vec<i64>,
    /// Per replica: `(time, change)` of load changes at the end of steps already run,
    /// in time order (a replica's steps are run one after the other).
    due: Vec<VecDeque<(f64, i64)>>,
}

impl Routing {
    /// A router of `policy` over `replicas` replicas; it counts their pending tokens
    /// under the shortest-queue policy, or when `track` asks (a mixed pool reads them).
    pub(super) fn new(policy: Router, replicas: usize, track: bool) -> Result<Self> {
        let tracked = if policy == Router::ShortestQueue || track { replicas } else { 0 };
        Ok(Self {
            policy,
            replicas,
            routed: 0,
            load: filled(0, tracked, "replicas")?,
            due: (0..tracked).map(|_| VecDeque::new()).collect(),
        })
    }

    /// Apply the load changes due by `at`.
    fn settle(&mut self, at: f64) {
        for (load, due) in self.load.iter_mut().zip(&mut self.due) {
            while due.front().is_some_and(|&(t, _)| t <= at) {
                *load += due.pop_front().map_or(0, |(_, d)| d);
            }
        }
    }

    /// The fewest tokens pending on one replica at `at` (0 when loads are not counted).
    pub(super) fn least_load(&mut self, at: f64) -> i64 {
        self.settle(at);
        self.load.iter().copied().min().unwrap_or(0)
    }

    /// The replica an arrival at `at` adding `tokens` pending tokens goes to.
    pub(super) fn route(&mut self, at: f64, tokens: u32) -> usize {
        let k = self.routed;
        self.routed += 1;
        self.settle(at);
        let r = match self.policy {
            _ if self.replicas == 1 => 0,
            Router::RoundRobin => (k % self.replicas as u64) as usize,
            Router::ShortestQueue => (0..self.replicas).min_by_key(|&r| (self.load[r], r)).unwrap_or(0),
        };
        if let Some(load) = self.load.get_mut(r) {
            *load += tokens as i64;
        }
        r
    }

    /// `replica`'s pending tokens change by `delta` at `at` (the end of one of its steps).
    pub(super) fn change(&mut self, replica: usize, at: f64, delta: i64) {
        if let Some(due) = self.due.get_mut(replica) {
            due.push_back((at, delta));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_cycles_and_shortest_queue_counts_prompts_until_their_first_token() {
        let mut rr = Routing::new(Router::RoundRobin, 3, false).unwrap();
        assert_eq!((0..7).map(|k| rr.route(k as f64, 10)).collect::<Vec<_>>(), [0, 1, 2, 0, 1, 2, 0]);

        let mut q = Routing::new(Router::ShortestQueue, 2, false).unwrap();
        assert_eq!(q.route(0.0, 100), 0);
        assert_eq!(q.route(0.0, 10), 1);
        assert_eq!(q.route(0.0, 10), 1, "replica 1 holds 10 pending tokens, replica 0 100");
        // Replica 0's request gets its first token at 2.0: 1 token pending from then on.
        q.change(0, 2.0, 1 - 100);
        assert_eq!(q.route(1.5, 5), 1, "at 1.5 the step producing it has not ended");
        assert_eq!(q.route(2.0, 5), 0, "at 2.0 replica 0 has 100 - 100 + 1 = 1 pending token");
        q.change(0, 3.0, -1);
        q.change(1, 3.0, -10);
        // Replica 0: 1 + 5 - 1 = 5; replica 1: 10 + 10 + 5 - 10 = 15.
        assert_eq!(q.route(3.0, 1), 0);
    }
}
