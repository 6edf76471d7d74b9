//! Data parallelism in the simulator (`SimConfig::replicas`, `SimConfig::router`),
//! checked against what the router's specification implies rather than against the
//! engine's own loop:
//!
//! - round robin reads no state, so a deployment of `k` replicas serves each request
//!   exactly as a one-replica run of its share of the trace (every `k`-th arrival) does,
//!   bit for bit, with the pools' invariants checked after every step;
//! - shortest queue sends an arrival where the fewest tokens are pending, counting a
//!   prompt until its first token and 1 from then on until the request finishes;
//! - the early stop stays exact over the merged requests (in `sim_stop.rs`'s proptest).

use proptest::prelude::*;
use pykvpool::sim::*;

#[path = "support/sim.rs"]
mod support;

use support::timer;

fn workload(n: usize, rate: f64, prompt: (u32, u32), output: (u32, u32), seed: u64) -> Workload {
    support::workload(n, rate, prompt, output, 2, seed)
}

fn run(w: &Workload, cfg: &SimConfig) -> SimResult {
    simulate(w, cfg, &mut timer()).unwrap()
}

/// Request indices in arrival order (ties by index), as the router sees them.
fn arrival_order(w: &Workload) -> Vec<usize> {
    let mut order: Vec<usize> = (0..w.len()).collect();
    order.sort_by(|&a, &b| w.arrival[a].total_cmp(&w.arrival[b]).then(a.cmp(&b)));
    order
}

/// The requests `idx` (ascending) of `w` as a workload of their own.
fn part(w: &Workload, idx: &[usize]) -> Workload {
    let arrival = idx.iter().map(|&i| w.arrival[i]).collect();
    let prompt = idx.iter().map(|&i| w.prompt_len[i]).collect();
    let output = idx.iter().map(|&i| w.output_len[i]).collect();
    let priority = idx.iter().map(|&i| w.priority[i]).collect();
    Workload::new(arrival, prompt, output, Some(priority)).unwrap()
}

fn bits(v: f64) -> u64 {
    v.to_bits()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]
    #[test]
    fn round_robin_replicas_serve_each_share_as_a_run_of_its_own(
        n in 0usize..90,
        rate in 1.0f64..300.0,
        seed in any::<u64>(),
        replicas in 1usize..5,
        blocks in 8usize..120,
        max_running in 1usize..24,
        chunked in any::<bool>(),
        swap in any::<bool>(),
        decode_first in any::<bool>(),
    ) {
        let w = workload(n, rate, (1, 200), (1, 40), seed);
        let mut cfg = SimConfig::new(blocks, 16);
        cfg.scheduler.max_running = max_running;
        cfg.scheduler.max_batched_tokens = Some(128);
        cfg.scheduler.chunked_prefill = chunked;
        cfg.scheduler.queue = QueuePolicy::Priority;
        cfg.check_invariants = true;
        if swap {
            cfg.scheduler.preemption = Preemption::Swap { host_blocks: blocks / 2 };
        }
        if decode_first {
            cfg.scheduler.convention = Convention::DecodeFirst;
        }
        let single = cfg.clone();
        cfg.replicas = replicas;
        let all = run(&w, &cfg);
        prop_assert_eq!(all.leaked_blocks, 0);
        let order = arrival_order(&w);
        let mut steps = 0;
        for r in 0..replicas {
            let mut mine: Vec<usize> = order.iter().skip(r).step_by(replicas).copied().collect();
            mine.sort_unstable();
            let alone = run(&part(&w, &mine), &single);
            steps += alone.summary.steps;
            for (j, &i) in mine.iter().enumerate() {
                let (a, b) = (&all.requests, &alone.requests);
                prop_assert_eq!(a.replica[i], r as u32);
                prop_assert_eq!(a.outcome[i], b.outcome[j]);
                prop_assert_eq!(bits(a.first_scheduled[i]), bits(b.first_scheduled[j]), "request {}", i);
                prop_assert_eq!(bits(a.first_token[i]), bits(b.first_token[j]), "request {}", i);
                prop_assert_eq!(bits(a.finish[i]), bits(b.finish[j]), "request {}", i);
                prop_assert_eq!(a.preemptions[i], b.preemptions[j]);
                prop_assert_eq!(a.swaps[i], b.swaps[j]);
                prop_assert_eq!(a.recomputed_tokens[i], b.recomputed_tokens[j]);
            }
            let mine_steps = all.steps.replica.iter().filter(|&&x| x == r as u32).count() as u64;
            prop_assert_eq!(mine_steps, alone.summary.steps);
        }
        prop_assert_eq!(all.summary.steps, steps);
        prop_assert!(all.steps.time.windows(2).all(|t| t[0] <= t[1]), "steps run in time order");
    }
}

#[test]
fn one_replica_is_the_classic_engine_whatever_the_router() {
    let w = workload(300, 80.0, (50, 900), (5, 120), 11);
    let mut cfg = SimConfig::new(1500, 16);
    let a = run(&w, &cfg);
    cfg.router = Router::ShortestQueue;
    let b = run(&w, &cfg);
    assert_eq!(a.summary, b.summary);
    assert!(a.requests.replica.iter().all(|&r| r == 0));
    assert!(a.steps.replica.iter().all(|&r| r == 0));
}

/// One request per line: `(arrival, prompt, output)`.
fn trace(reqs: &[(f64, u32, u32)]) -> Workload {
    Workload::new(reqs.iter().map(|r| r.0).collect(), reqs.iter().map(|r| r.1).collect(), reqs.iter().map(|r| r.2).collect(), None)
        .unwrap()
}

#[test]
fn shortest_queue_sends_arrivals_where_the_fewest_tokens_are_pending() {
    // Steps of 1 s each; every prefill fits one step.
    let mut cfg = SimConfig::new(1000, 16);
    cfg.replicas = 3;
    cfg.router = Router::ShortestQueue;
    let w = trace(&[
        (0.0, 900, 50), // -> 0 (all empty: the lowest index); first token at 1.0
        (0.0, 100, 50), // -> 1 (0 holds 900)
        (0.0, 200, 50), // -> 2 (1 holds 100, 2 nothing)
        (0.5, 50, 50),  // -> 1 (900, 100, 200): 1 holds 150 after it
        (0.5, 60, 50),  // -> 1 (900, 150, 200): 210
        (1.0, 10, 50),  // first tokens at 1.0: 0 holds 1, 1 holds 1 + 110 pending, 2 holds 1 -> 0
        (1.0, 10, 50),  // (11, 111, 1) -> 2
    ]);
    let res = simulate(&w, &cfg, &mut ConstantTime(1.0)).unwrap();
    assert_eq!(res.requests.replica, [0, 1, 2, 1, 1, 0, 2]);
    // Round robin ignores load: 0, 1, 2, 0, 1, 2, 0.
    cfg.router = Router::RoundRobin;
    let rr = simulate(&w, &cfg, &mut ConstantTime(1.0)).unwrap();
    assert_eq!(rr.requests.replica, [0, 1, 2, 0, 1, 2, 0]);
    assert_eq!(res.leaked_blocks + rr.leaked_blocks, 0);
}

#[test]
fn an_idle_replica_starts_at_the_arrival_a_busy_one_at_the_end_of_its_step() {
    let mut cfg = SimConfig::new(1000, 16);
    cfg.replicas = 2;
    // 0 -> replica 0 at 0 (steps of 1 s); 1 -> replica 1 at 0.25; 2 -> replica 0 at 0.5,
    // which is mid-step: it is first scheduled when that step ends, at 1.0.
    let w = trace(&[(0.0, 10, 3), (0.25, 10, 3), (0.5, 10, 3)]);
    let res = simulate(&w, &cfg, &mut ConstantTime(1.0)).unwrap();
    assert_eq!(res.requests.replica, [0, 1, 0]);
    assert_eq!(res.requests.first_scheduled, [0.0, 0.25, 1.0]);
    assert_eq!(res.requests.first_token, [1.0, 1.25, 2.0]);
    assert_eq!(res.steps.time, [0.0, 0.25, 1.0, 1.25, 2.0, 2.25, 3.0]);
    assert_eq!(res.steps.replica, [0, 1, 0, 1, 0, 1, 0]);
}

#[test]
fn a_deployment_is_refused_without_replicas_or_with_too_many() {
    let w = trace(&[(0.0, 10, 3)]);
    for bad in [0, MAX_REPLICAS + 1] {
        let mut cfg = SimConfig::new(100, 16);
        cfg.replicas = bad;
        let e = simulate(&w, &cfg, &mut ConstantTime(1.0)).unwrap_err().to_string();
        assert!(e.contains("replicas"), "{e}");
    }
}
