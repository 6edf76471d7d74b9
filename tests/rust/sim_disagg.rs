//! Prefill/decode disaggregation in the simulator (`SimConfig::disaggregation`), checked
//! against what its specification implies rather than against the engine's loop:
//!
//! - a prefill instance is an engine whose requests leave at their first token: with a
//!   link that moves KV at once, the prefill side of a disaggregated run is a colocated
//!   run of the same trace with one output token per request, bit for bit;
//! - the link is first come first served per sender and per receiver: each transfer's
//!   arrival follows from the earlier ones (a model of the link written from the spec);
//! - a decode instance admits a request at its first step that starts once its KV has
//!   arrived (when memory and the running limit allow), and then decodes it one token per
//!   step;
//! - a mixed pool under constant pressure is a colocated deployment of the decode
//!   instances, and one never under pressure is the plain disaggregated run;
//! - hand-computed runs, and the refusals.

use proptest::prelude::*;
use pykvpool::sim::*;

#[path = "support/sim.rs"]
mod support;

use support::timer;

fn link(bandwidth: f64, latency: f64, layers: u32) -> KvLink {
    KvLink { bandwidth, latency, bytes_per_token: 1000.0, layers }
}

fn disagg(decode_replicas: usize, decode_num_blocks: usize, link: KvLink) -> Option<Disaggregation> {
    Some(Disaggregation { decode_replicas, decode_num_blocks, link, mixed_tokens: None })
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The steps of `res` run by replicas `< below`, as `(replica, start, duration,
/// prefill tokens, preemptions)`.
fn steps_below(res: &SimResult, below: u32) -> Vec<(u32, u64, u64, u32, u32)> {
    let s = &res.steps;
    (0..s.time.len())
        .filter(|&k| s.replica[k] < below)
        .map(|k| (s.replica[k], s.time[k].to_bits(), s.duration[k].to_bits(), s.prefill_tokens[k], s.preemptions[k]))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn prefill_instances_serve_prompts_as_a_colocated_run_of_one_token_outputs(
        n in 0usize..80,
        rate in 1.0f64..400.0,
        seed in any::<u64>(),
        prefill in 1usize..4,
        decode in 1usize..4,
        blocks in 8usize..100,
        max_running in 1usize..16,
        chunked in any::<bool>(),
        jsq in any::<bool>(),
        caching in any::<bool>(),
    ) {
        let w = support::workload(n, rate, (1, 200), (1, 40), 2, seed);
        let mut cfg = SimConfig::new(blocks, 16);
        cfg.scheduler.max_running = max_running;
        // Without chunks a budget that any request's whole length fits: the decode
        // side's admission check (a recompute of the whole length) rejects nothing.
        cfg.scheduler.max_batched_tokens = Some(if chunked { 128 } else { 256 });
        cfg.scheduler.chunked_prefill = chunked;
        cfg.scheduler.queue = QueuePolicy::Priority;
        cfg.check_invariants = true;
        cfg.replicas = prefill;
        cfg.router = if jsq { Router::ShortestQueue } else { Router::RoundRobin };
        if caching {
            cfg.prefix_cache = Some(Default::default());
        }
        let mut colocated = cfg.clone();
        // KV that moves at once: each transfer is done at the end of its prefill.
        cfg.disaggregation = disagg(decode, 2048, link(f64::MAX, 0.0, 1));
        let res = simulate(&w, &cfg, &mut timer()).unwrap();
        prop_assert_eq!(res.leaked_blocks, 0);

        let ones = Workload::new(w.arrival.clone(), w.prompt_len.clone(), vec![1; n], Some(w.priority.clone())).unwrap();
        colocated.record_steps = true;
        let base = simulate(&ones, &colocated, &mut timer()).unwrap();
        prop_assert_eq!(bits(&res.requests.first_token), bits(&base.requests.first_token));
        prop_assert_eq!(bits(&res.requests.first_scheduled), bits(&base.requests.first_scheduled));
        prop_assert_eq!(&res.requests.replica, &base.requests.replica);
        prop_assert_eq!(&res.requests.outcome, &base.requests.outcome);
        prop_assert_eq!(&res.requests.cached_tokens, &base.requests.cached_tokens);
        prop_assert_eq!(steps_below(&res, prefill as u32), steps_below(&base, prefill as u32));
        // The decode instances' pools never run short here: no preemption there.
        prop_assert_eq!(&res.requests.preemptions, &base.requests.preemptions);
    }

    #[test]
    fn transfers_queue_on_both_links_and_decode_admits_once_the_kv_has_arrived(
        n in 0usize..70,
        rate in 1.0f64..400.0,
        seed in any::<u64>(),
        prefill in 1usize..4,
        decode in 1usize..4,
        bandwidth in 1e5f64..1e8,
        latency in 0.0f64..0.05,
        max_running in 1usize..12,
    ) {
        let w = support::workload(n, rate, (1, 300), (1, 30), 1, seed);
        let mut cfg = SimConfig::new(64, 16);
        cfg.scheduler.max_running = 64;
        cfg.scheduler.max_batched_tokens = Some(256);
        cfg.check_invariants = true;
        cfg.replicas = prefill;
        let link = link(bandwidth, latency, 1);
        // A decode pool that never runs short, the running limit the only bound.
        let mut dcfg = cfg.clone();
        dcfg.scheduler.max_running = max_running;
        cfg.scheduler.max_running = max_running.max(8);
        cfg.disaggregation = disagg(decode, 2048, link);
        let step = 0.004;
        let res = simulate_with(&w, &cfg, &mut timer(), Some(&mut ConstantTime(step))).unwrap();
        prop_assert_eq!(res.leaked_blocks, 0);
        prop_assert_eq!(res.summary.finished, n as u64);
        let q = &res.requests;
        let p = prefill as u32;

        // The link model: transfers in order of their prefill's end (ties by request),
        // each after the sender's and the receiver's previous one.
        let mut moved: Vec<usize> = (0..n).filter(|&i| w.output_len[i] > 1).collect();
        moved.sort_by(|&a, &b| q.first_token[a].total_cmp(&q.first_token[b]).then(a.cmp(&b)));
        let mut free = vec![0.0f64; prefill + decode];
        for (k, &i) in moved.iter().enumerate() {
            let (src, dst) = (q.replica[i] as usize, q.decode_replica[i] as usize);
            // Round robin over the decode instances, in handoff order.
            prop_assert_eq!(dst, prefill + k % decode);
            let done = q.first_token[i].max(free[src]).max(free[dst]) + w.prompt_len[i] as f64 * 1000.0 / bandwidth;
            prop_assert_eq!(q.kv_ready[i].to_bits(), (done + latency).to_bits(), "request {}", i);
            free[src] = done;
            free[dst] = done;
        }
        prop_assert_eq!(res.summary.kv_transfers, moved.len() as u64);
        for i in (0..n).filter(|&i| w.output_len[i] == 1) {
            prop_assert_eq!(q.decode_replica[i], UNROUTED);
            prop_assert!(q.kv_ready[i].is_nan() && q.decode_start[i].is_nan());
        }

        // Decode: the first step of its instance that starts once the KV arrived and has
        // room under the running limit admits it; then one token per step.
        let s = &res.steps;
        for &i in &moved {
            let d = q.decode_replica[i];
            prop_assert!(q.decode_start[i] >= q.kv_ready[i]);
            let earlier = (0..s.time.len()).filter(|&k| s.replica[k] == d && s.time[k] >= q.kv_ready[i] && s.time[k] < q.decode_start[i]);
            for k in earlier {
                prop_assert!(s.running[k] as usize >= max_running, "request {} waited at a step with room", i);
            }
            let decode_time = q.finish[i] - q.decode_start[i];
            let want = (w.output_len[i] - 1) as f64 * step;
            prop_assert!((decode_time - want).abs() <= 1e-9 * want.max(1.0), "request {}: {} s decoding, {} expected", i, decode_time, want);
        }
        for k in 0..s.time.len() {
            if s.replica[k] < p {
                prop_assert_eq!(s.decode_tokens[k], 0);
            } else {
                prop_assert_eq!(s.prefill_tokens[k], 0);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn a_mixed_pool_is_colocated_under_constant_pressure_and_plain_without_any(
        n in 0usize..60,
        rate in 1.0f64..400.0,
        seed in any::<u64>(),
        prefill in 1usize..3,
        decode in 1usize..4,
        jsq in any::<bool>(),
        blocks in 16usize..120,
    ) {
        let w = support::workload(n, rate, (1, 200), (1, 30), 1, seed);
        let mut cfg = SimConfig::new(blocks, 16);
        cfg.scheduler.max_batched_tokens = Some(256);
        cfg.check_invariants = true;
        cfg.router = if jsq { Router::ShortestQueue } else { Router::RoundRobin };
        let mut colocated = cfg.clone();
        colocated.replicas = decode;
        cfg.replicas = prefill;
        let link = link(1e8, 1e-3, 1);
        // Pressure at 0 pending tokens: always. The decode instances serve every request.
        cfg.disaggregation = Some(Disaggregation { decode_replicas: decode, decode_num_blocks: blocks, link, mixed_tokens: Some(0) });
        let mixed = simulate(&w, &cfg, &mut timer()).unwrap();
        let base = simulate(&w, &colocated, &mut timer()).unwrap();
        prop_assert_eq!(mixed.summary.kv_transfers, 0);
        prop_assert_eq!(bits(&mixed.requests.first_token), bits(&base.requests.first_token));
        prop_assert_eq!(bits(&mixed.requests.finish), bits(&base.requests.finish));
        prop_assert_eq!(bits(&mixed.requests.first_scheduled), bits(&base.requests.first_scheduled));
        let shifted: Vec<u32> = base.requests.replica.iter().map(|&r| if r == UNROUTED { r } else { r + prefill as u32 }).collect();
        prop_assert_eq!(&mixed.requests.replica, &shifted);
        prop_assert_eq!(&mixed.requests.outcome, &base.requests.outcome);
        prop_assert_eq!(mixed.summary.steps, base.summary.steps);
        prop_assert_eq!(mixed.leaked_blocks, 0);
        // No pressure ever: the plain disaggregated run.
        cfg.disaggregation = Some(Disaggregation { decode_replicas: decode, decode_num_blocks: blocks, link, mixed_tokens: Some(u64::MAX) });
        let never = simulate(&w, &cfg, &mut timer()).unwrap();
        cfg.disaggregation = disagg(decode, blocks, link);
        let plain = simulate(&w, &cfg, &mut timer()).unwrap();
        prop_assert_eq!(bits(&never.requests.finish), bits(&plain.requests.finish));
        prop_assert_eq!(&never.requests.decode_replica, &plain.requests.decode_replica);
        prop_assert_eq!(&never.summary, &plain.summary);
    }
}

/// A mixed pool by hand: the second prompt arrives while the only prefill instance has
/// 20 tokens pending (at least the pool's 10), so the decode instance serves it whole.
#[test]
fn a_decode_instance_takes_a_prompt_under_pressure() {
    let w = Workload::new(vec![0.0, 0.25], vec![20, 8], vec![2, 3], None).unwrap();
    let mut cfg = SimConfig::new(64, 4);
    cfg.check_invariants = true;
    let link = KvLink { bandwidth: 200.0, latency: 0.0, bytes_per_token: 10.0, layers: 1 };
    cfg.disaggregation = Some(Disaggregation { decode_replicas: 1, decode_num_blocks: 64, link, mixed_tokens: Some(10) });
    let res = simulate_with(&w, &cfg, &mut ConstantTime(1.0), Some(&mut ConstantTime(0.5))).unwrap();
    let q = &res.requests;
    assert_eq!(q.replica, [0, 1]);
    assert_eq!(q.decode_replica, [1, UNROUTED]);
    // Request 1 on the decode instance: prompt 0.25-0.75 (first token), two decodes.
    assert_eq!(q.first_scheduled[1], 0.25);
    assert_eq!(q.first_token[1], 0.75);
    assert_eq!(q.finish[1], 1.75);
    // Request 0: prefill 0-1, 200 bytes at 200 B/s, ready at 2; its decode waits for the
    // decode instance's step running from 1.75 to... none: that instance is idle then.
    assert_eq!(q.kv_ready[0], 2.0);
    assert_eq!((q.decode_start[0], q.finish[0]), (2.0, 2.5));
    assert_eq!(res.summary.kv_transfers, 1);
    assert_eq!(res.leaked_blocks, 0);
}

/// Two requests by hand: 1 prefill instance (1 s steps), 1 decode instance (0.5 s
/// steps), 10 bytes per token at 100 bytes/s with 0.25 s of latency.
#[test]
fn a_hand_computed_disaggregated_run() {
    let w = Workload::new(vec![0.0, 0.0], vec![10, 20], vec![3, 1], None).unwrap();
    for (layers, ready) in [(1, 2.25), (4, 1.5)] {
        let mut cfg = SimConfig::new(64, 4);
        cfg.check_invariants = true;
        cfg.disaggregation = disagg(1, 64, KvLink { bandwidth: 100.0, latency: 0.25, bytes_per_token: 10.0, layers });
        let res = simulate_with(&w, &cfg, &mut ConstantTime(1.0), Some(&mut ConstantTime(0.5))).unwrap();
        let q = &res.requests;
        // One prefill step (0 to 1) computes both prompts: the first token of each at 1 s;
        // the one-token request finishes there. The other's 100 bytes take 1 s on the
        // wire after the step (or stream over its 4 layers: the last quarter leaves 0.25 s
        // after the step), then 0.25 s of latency.
        assert_eq!(q.first_token, [1.0, 1.0]);
        assert_eq!(q.finish[1], 1.0);
        assert_eq!(q.decode_replica, [1, UNROUTED]);
        assert_eq!(q.kv_ready[0], ready, "layers {layers}");
        // Two decode steps from the arrival: tokens 2 and 3.
        assert_eq!(q.decode_start[0], ready);
        assert_eq!(q.finish[0], ready + 1.0);
        assert_eq!(res.summary.kv_transfers, 1);
        assert_eq!(res.summary.kv_transfer_bytes, 100.0);
        assert_eq!(res.summary.kv_transfer.unwrap().mean, ready - 1.0);
        assert_eq!(res.summary.decode_wait.unwrap().max, 0.0);
        assert_eq!(res.steps.replica, [0, 1, 1]);
        assert_eq!(res.leaked_blocks, 0);
    }
}

/// A prefill instance holds the request's blocks until its transfer is done.
#[test]
fn the_prefill_instance_holds_the_kv_until_the_transfer_is_done() {
    // Two 16-token prompts on a 4-block prefill pool of 4-token blocks: the second fits
    // only once the first one's transfer (160 bytes at 40 bytes/s: 4 s) is done.
    let w = Workload::new(vec![0.0, 0.5], vec![16, 16], vec![2, 2], None).unwrap();
    let mut cfg = SimConfig::new(4, 4);
    cfg.check_invariants = true;
    cfg.disaggregation = disagg(1, 64, KvLink { bandwidth: 40.0, latency: 0.0, bytes_per_token: 10.0, layers: 1 });
    let res = simulate(&w, &cfg, &mut ConstantTime(1.0)).unwrap();
    let q = &res.requests;
    assert_eq!(q.first_token[0], 1.0);
    assert_eq!(q.kv_ready[0], 5.0);
    assert_eq!(q.first_scheduled[1], 5.0, "the prefill pool is full until the first transfer is done");
    assert_eq!(q.first_token[1], 6.0);
    assert_eq!(q.kv_ready[1], 10.0);
    assert_eq!(res.leaked_blocks, 0);
}

#[test]
fn requests_too_long_for_either_side_are_rejected_and_bad_configurations_refused() {
    // 40 tokens fit a 10-block prefill pool of 4-token blocks; prompt + output - 1 = 59
    // tokens do not fit a 12-block decode pool, unless the request ends at its first token.
    let w = Workload::new(vec![0.0, 0.0, 0.0], vec![40, 40, 41], vec![20, 1, 1], None).unwrap();
    let mut cfg = SimConfig::new(10, 4);
    cfg.disaggregation = disagg(1, 12, link(1e9, 0.0, 1));
    let res = simulate(&w, &cfg, &mut ConstantTime(1.0)).unwrap();
    assert_eq!(res.requests.outcome, [Outcome::Rejected as u8, Outcome::Finished as u8, Outcome::Rejected as u8]);

    let refuse = |cfg: &SimConfig, what: &str| {
        let e = simulate(&w, cfg, &mut ConstantTime(1.0)).unwrap_err().to_string();
        assert!(e.contains(what), "{e}");
    };
    let mut bad = cfg.clone();
    bad.disaggregation = disagg(0, 12, link(1e9, 0.0, 1));
    refuse(&bad, "decode_replicas");
    bad.disaggregation = disagg(1, 12, link(0.0, 0.0, 1));
    refuse(&bad, "bandwidth must be");
    bad.disaggregation = disagg(1, 12, link(1e9, 0.0, 0));
    refuse(&bad, "layers must be");
    bad = cfg.clone();
    bad.scheduler.convention = Convention::DecodeFirst;
    refuse(&bad, "convention='vllm'");
    bad = cfg.clone();
    bad.scheduler.allocation = Allocation::Oracle;
    refuse(&bad, "allocation='paged'");
}
