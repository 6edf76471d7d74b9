//! Engine-level tests of the simulator: conservation, determinism, expected directions,
//! and a proptest over small random workloads and policies with the pool's invariants
//! checked after every step.

use proptest::prelude::*;
use pykvpool::prefix_cache::eviction::EvictionPolicy;
use pykvpool::prefix_cache::CacheConfig;
use pykvpool::sim::workload::{synthesize, Arrivals, LengthSpec, Lengths, SharedPrefixes, SyntheticSpec};
use pykvpool::sim::*;

fn uniform(lo: u32, hi: u32) -> LengthSpec {
    LengthSpec { dist: Lengths::Uniform { lo, hi }, min: 1, max: MAX_REQUEST_TOKENS }
}

fn workload(n: usize, arrivals: Arrivals, prompt: (u32, u32), output: (u32, u32), seed: u64) -> Workload {
    synthesize(&SyntheticSpec {
        num_requests: n,
        arrivals,
        prompt: uniform(prompt.0, prompt.1),
        output: uniform(output.0, output.1),
        priority_levels: 3,
        shared_prefixes: None,
        seed,
    })
    .unwrap()
}

fn shared_workload(n: usize, rate: f64, prompt: (u32, u32), prefixes: (usize, u32), seed: u64) -> Workload {
    synthesize(&SyntheticSpec {
        num_requests: n,
        arrivals: Arrivals::Poisson { rate },
        prompt: uniform(prompt.0, prompt.1),
        output: uniform(1, 40),
        priority_levels: 2,
        shared_prefixes: Some(SharedPrefixes { num_prefixes: prefixes.0, prefix_len: prefixes.1, vocab_size: 1000 }),
        seed,
    })
    .unwrap()
}

/// The same prompts as trace block keys (Mooncake style): one chained id per `per_key`
/// tokens, equal ids exactly for equal prefixes.
fn as_block_keys(w: &Workload, per_key: usize) -> Workload {
    let mut ids: std::collections::HashMap<Vec<u32>, u64> = std::collections::HashMap::new();
    let (mut keys, mut offsets) = (Vec::new(), vec![0]);
    for i in 0..w.len() {
        let t = w.tokens(i).unwrap();
        for end in (per_key..t.len() + per_key).step_by(per_key) {
            let prefix = t[..end.min(t.len())].to_vec();
            let next = ids.len() as u64;
            keys.push(*ids.entry(prefix).or_insert(next));
        }
        offsets.push(keys.len());
    }
    let plain = Workload::new(w.arrival.clone(), w.prompt_len.clone(), w.output_len.clone(), Some(w.priority.clone())).unwrap();
    plain.with_block_keys(keys, offsets, per_key).unwrap()
}

fn cache(policy: EvictionPolicy) -> Option<CacheConfig> {
    Some(CacheConfig { policy, ..CacheConfig::default() })
}

fn run(w: &Workload, cfg: &SimConfig, dt: f64) -> SimResult {
    simulate(w, cfg, &mut ConstantTime(dt)).unwrap()
}

fn assert_conserved(w: &Workload, r: &SimResult, conv: Convention) {
    let last = if conv == Convention::Vllm { 1 } else { 0 };
    assert_eq!(r.leaked_blocks, 0, "blocks still held at the end");
    for i in 0..w.len() {
        if r.requests.outcome[i] == Outcome::Finished as u8 {
            assert!(r.requests.finish[i] >= r.requests.first_token[i]);
            assert!(r.requests.first_token[i] >= r.requests.arrival[i]);
        }
    }
    let s = &r.summary;
    assert_eq!(s.finished + s.rejected, w.len() as u64);
    // Every token computed is a prompt token, a decode of a generated token, or a
    // recompute; cached prompt tokens are not computed.
    let computed: u64 = r.steps.prefill_tokens.iter().chain(&r.steps.decode_tokens).map(|&x| x as u64).sum();
    let mut expect = 0u64;
    for i in 0..w.len() {
        if r.requests.outcome[i] == Outcome::Finished as u8 {
            expect += (w.prompt_len[i] + w.output_len[i] - last) as u64 + r.requests.recomputed_tokens[i]
                - r.requests.cached_tokens[i];
        }
    }
    assert_eq!(computed, expect);
}

#[test]
fn allocator_benchmark_workload_completes_and_preempts() {
    let w = workload(2000, Arrivals::Burst, (256, 4096), (128, 384), 0);
    let mut cfg = SimConfig::new(31_232 / 5, 16);
    cfg.scheduler.max_batched_tokens = None;
    cfg.scheduler.chunked_prefill = false;
    let r = run(&w, &cfg, 0.0);
    assert_conserved(&w, &r, Convention::Vllm);
    assert_eq!(r.summary.finished, 2000);
    assert!(r.summary.preemptions > 0);
    assert!(r.steps.running.iter().all(|&x| x <= 256));
}

#[test]
fn same_input_same_result_bit_for_bit() {
    let w = workload(300, Arrivals::Gamma { rate: 40.0, cv: 3.0 }, (10, 600), (1, 200), 3);
    let mut cfg = SimConfig::new(400, 16);
    cfg.scheduler.queue = QueuePolicy::Priority;
    cfg.scheduler.victim = Victim::LowestPriority;
    cfg.scheduler.preemption = Preemption::Swap { host_blocks: 100 };
    let mut t = Roofline {
        num_params: 1e9,
        bytes_per_param: 2.0,
        num_layers: 16.0,
        q_dim: 2048.0,
        kv_bytes_per_token: 65536.0,
        flops: 1e14,
        bandwidth: 1e12,
        overhead: 1e-3,
        swap_time_per_block: 1e-5,
        comm_per_step: 0.0,
        comm_per_token: 0.0,
    };
    let a = simulate(&w, &cfg, &mut t).unwrap();
    let b = simulate(&w, &cfg, &mut t).unwrap();
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.requests.finish), bits(&b.requests.finish));
    assert_eq!(bits(&a.steps.time), bits(&b.steps.time));
    assert_eq!(a.summary, b.summary);
    assert!(a.summary.swaps > 0, "the host pool was never used");
    assert_conserved(&w, &a, Convention::Vllm);
}

#[test]
fn low_load_has_no_preemption_and_ttft_is_one_prefill_step() {
    // One request every 10 s, each done in < 300 steps of 10 ms.
    let w = workload(50, Arrivals::Poisson { rate: 0.1 }, (100, 500), (10, 200), 1);
    let r = run(&w, &SimConfig::new(10_000, 16), 0.01);
    assert_eq!(r.summary.preemptions, 0);
    // A request arriving mid-step waits for the step boundary, then prefills in one step.
    for &ttft in &r.requests.ttft() {
        assert!((0.01 - 1e-12..0.02).contains(&ttft), "ttft {ttft}");
    }
    assert_conserved(&w, &r, Convention::Vllm);
}

#[test]
fn past_saturation_the_queue_grows() {
    let w = workload(2000, Arrivals::Poisson { rate: 200.0 }, (200, 400), (100, 200), 2);
    let mut cfg = SimConfig::new(2000, 16);
    cfg.scheduler.max_running = 32;
    let r = run(&w, &cfg, 0.02);
    // Arrivals last about 10 s; look at the queue 2 s and 8 s in.
    let at = |t: f64| r.steps.waiting[r.steps.time.partition_point(|&x| x < t)] as f64;
    let (early, late) = (at(2.0), at(8.0));
    assert!(late > 2.0 * early.max(1.0), "waiting {early} -> {late}");
    assert_conserved(&w, &r, Convention::Vllm);
}

#[test]
fn paged_admits_more_than_reservation() {
    let w = workload(400, Arrivals::Burst, (100, 300), (50, 1000), 4);
    let mut cfg = SimConfig::new(1500, 16);
    let paged = run(&w, &cfg, 0.01);
    cfg.scheduler.allocation = Allocation::Reserve { tokens: 2048 };
    let orca = run(&w, &cfg, 0.01);
    assert!(paged.summary.peak_running > orca.summary.peak_running);
    assert_eq!(orca.summary.preemptions, 0);
    assert!(paged.summary.mean_utilization.unwrap() > orca.summary.mean_utilization.unwrap());
    assert!(paged.summary.makespan.unwrap() < orca.summary.makespan.unwrap());
    assert_conserved(&w, &orca, Convention::Vllm);
}

#[test]
fn reserve_rejects_what_exceeds_the_reservation_and_holds_it_whole() {
    // prompt + output: 100 fits a 100-token reservation, 101 never can.
    let w = Workload::new(vec![0.0; 4], vec![60, 61, 10, 30], vec![40, 40, 5, 70], None).unwrap();
    let mut cfg = SimConfig::new(100, 16);
    cfg.scheduler.allocation = Allocation::Reserve { tokens: 100 };
    cfg.check_invariants = true;
    let r = run(&w, &cfg, 1.0);
    let (ok, no) = (Outcome::Finished as u8, Outcome::Rejected as u8);
    assert_eq!(r.requests.outcome, vec![ok, no, ok, ok]);
    // Each running request holds ceil(100 / 16) = 7 blocks, allocated or promised.
    for (i, &running) in r.steps.running.iter().enumerate() {
        assert_eq!(r.steps.blocks_used[i] + r.steps.blocks_reserved[i], 7 * running, "step {i}");
    }
    assert_conserved(&w, &r, Convention::Vllm);
    cfg.scheduler.allocation = Allocation::Reserve { tokens: 0 };
    assert!(simulate(&w, &cfg, &mut ConstantTime(1.0)).is_err());
}

#[test]
fn oracle_reserves_each_request_own_final_length() {
    for (conv, longest) in [(Convention::Vllm, 70 + 41 - 1), (Convention::DecodeFirst, 70 + 41)] {
        let w = workload(200, Arrivals::Burst, (70, 70), (41, 41), 9);
        let mut cfg = SimConfig::new(120, 16);
        cfg.scheduler.allocation = Allocation::Oracle;
        cfg.scheduler.convention = conv;
        cfg.check_invariants = true;
        let r = run(&w, &cfg, 1.0);
        let per_request = (longest as u32).div_ceil(16);
        for (i, &running) in r.steps.running.iter().enumerate() {
            assert_eq!(r.steps.blocks_used[i] + r.steps.blocks_reserved[i], per_request * running, "{conv:?} step {i}");
        }
        assert_eq!(r.summary.peak_running, (120 / per_request) as u64);
        assert_eq!(r.summary.preemptions, 0);
        assert_conserved(&w, &r, conv);
    }
}

#[test]
fn limits_are_errors_and_an_empty_run_has_no_statistics() {
    let too_long = Workload::new(vec![0.0], vec![MAX_REQUEST_TOKENS + 1], vec![1], None);
    assert!(matches!(too_long, Err(pykvpool::KvError::InvalidArgument(m)) if m.contains("prompt_len[0]")));
    let spec = |n| SyntheticSpec {
        num_requests: n,
        arrivals: Arrivals::Burst,
        prompt: uniform(1, 10),
        output: uniform(1, 10),
        priority_levels: 1,
        shared_prefixes: None,
        seed: 0,
    };
    assert!(synthesize(&spec(MAX_REQUESTS + 1)).is_err());
    assert!(synthesize(&spec(usize::MAX)).is_err());
    let mut cfg = SimConfig::new(10, 16);
    cfg.scheduler.max_batched_tokens = Some(MAX_STEP_TOKENS as usize + 1);
    assert!(simulate(&synthesize(&spec(3)).unwrap(), &cfg, &mut ConstantTime(0.0)).is_err());
    let empty = run(&synthesize(&spec(0)).unwrap(), &SimConfig::new(10, 16), 1.0);
    let s = &empty.summary;
    assert_eq!((s.num_requests, s.steps, s.finished), (0, 0, 0));
    assert!(s.ttft.is_none() && s.makespan.is_none() && s.output_throughput.is_none() && s.mean_utilization.is_none());
}

#[test]
fn the_longest_requests_keep_their_arithmetic_in_range() {
    // 2^24 + 2^24 - 1 tokens of KV: rejected by a pool of 2^24 + 2^16 tokens; a 2^24-token
    // prompt with one output token fits it and runs.
    let big = MAX_REQUEST_TOKENS;
    let w = Workload::new(vec![0.0, 0.0], vec![big, big], vec![big, 1], None).unwrap();
    let mut cfg = SimConfig::new(257, 1 << 16);
    cfg.max_steps = Some(4);
    let r = run(&w, &cfg, 1.0);
    assert_eq!(r.requests.outcome, vec![Outcome::Rejected as u8, Outcome::Unfinished as u8]);
    assert_eq!(r.steps.prefill_tokens, vec![8192; 4]);
}

#[test]
fn oversized_requests_are_rejected_not_livelocked() {
    let w = Workload::new(vec![0.0, 0.0], vec![100, 5000], vec![10, 10], None).unwrap();
    let r = run(&w, &SimConfig::new(64, 16), 1.0);
    assert_eq!(r.requests.outcome, vec![Outcome::Finished as u8, Outcome::Rejected as u8]);
}

#[test]
fn max_steps_stops_early() {
    let w = workload(50, Arrivals::Burst, (10, 20), (100, 100), 5);
    let mut cfg = SimConfig::new(1000, 16);
    cfg.max_steps = Some(10);
    let r = run(&w, &cfg, 1.0);
    assert_eq!(r.summary.steps, 10);
    assert_eq!(r.summary.finished, 0);
}

#[test]
fn prefix_caching_lowers_ttft_on_shared_prefixes() {
    let w = shared_workload(400, 20.0, (1000, 1500), (4, 900), 6);
    let mut cfg = SimConfig::new(3000, 16);
    let t = |c: &SimConfig| {
        let mut roof = Roofline {
            num_params: 8e9,
            bytes_per_param: 2.0,
            num_layers: 32.0,
            q_dim: 4096.0,
            kv_bytes_per_token: 131072.0,
            flops: 1.9e14,
            bandwidth: 1.6e12,
            overhead: 2e-3,
            swap_time_per_block: 0.0,
            comm_per_step: 0.0,
            comm_per_token: 0.0,
        };
        simulate(&w, c, &mut roof).unwrap()
    };
    let off = t(&cfg);
    cfg.prefix_cache = cache(EvictionPolicy::Lru);
    cfg.check_invariants = true;
    let on = t(&cfg);
    assert!(on.summary.prefix_hit_rate > 0.4, "hit rate {}", on.summary.prefix_hit_rate);
    let (on_ttft, off_ttft) = (on.summary.ttft.unwrap().mean, off.summary.ttft.unwrap().mean);
    assert!(on_ttft < 0.8 * off_ttft, "{on_ttft} vs {off_ttft}");
    assert_eq!(off.summary.cached_tokens, 0);
    assert_conserved(&w, &on, Convention::Vllm);
}

#[test]
fn block_keys_hit_the_longest_seen_prefix_at_any_block_size() {
    // Two requests share 2 of 3 trace blocks (512 tokens each); the third repeats the first.
    let w = Workload::new(vec![0.0, 1.0, 2.0], vec![1500, 1400, 1500], vec![2, 2, 2], None)
        .unwrap()
        .with_block_keys(vec![1, 2, 3, 1, 2, 9, 1, 2, 3], vec![0, 3, 6, 9], 512)
        .unwrap();
    for bs in [16, 256, 512, 1024] {
        let mut cfg = SimConfig::new(64 * 1024 / bs, bs);
        cfg.prefix_cache = cache(EvictionPolicy::Lru);
        cfg.check_invariants = true;
        let r = run(&w, &cfg, 1.0);
        let c = &r.requests.cached_tokens;
        // Shared prefix 1024 tokens, in whole pool blocks; the repeat leaves its last token.
        assert_eq!(c[0], 0);
        assert_eq!(c[1] as usize, 1024 / bs * bs, "bs {bs}");
        assert_eq!(c[2] as usize, (1499 / bs) * bs, "bs {bs}");
        assert_conserved(&w, &r, Convention::Vllm);
    }
}

fn policy() -> impl Strategy<Value = SchedulerConfig> {
    (
        1usize..8,
        prop::option::of(8usize..200),
        any::<bool>(),
        prop_oneof![Just(0.0), Just(0.05)],
        any::<bool>(),
        prop_oneof![Just(Allocation::Paged), Just(Allocation::Oracle), (20u32..150).prop_map(|tokens| Allocation::Reserve { tokens })],
        prop_oneof![Just(Preemption::Recompute), (0usize..30).prop_map(|h| Preemption::Swap { host_blocks: h })],
        any::<bool>(),
        prop_oneof![Just(Convention::Vllm), Just(Convention::DecodeFirst)],
    )
        .prop_map(|(max_running, budget, chunked, watermark, prio, allocation, preemption, lowest, convention)| SchedulerConfig {
            max_running,
            max_batched_tokens: budget,
            chunked_prefill: chunked,
            watermark,
            queue: if prio { QueuePolicy::Priority } else { QueuePolicy::Fcfs },
            allocation,
            preemption,
            victim: if lowest { Victim::LowestPriority } else { Victim::Newest },
            convention,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]
    #[test]
    fn invariants_hold_with_prefix_caching(
        sched in policy(),
        n in 1usize..25,
        seed in any::<u64>(),
        bs in prop_oneof![Just(1usize), Just(4), Just(16)],
        blocks in 30usize..120,
        evict in prop::sample::select(EvictionPolicy::ALL.to_vec()),
        keys in prop::option::of(prop_oneof![Just(3usize), Just(4), Just(16)]),
    ) {
        let w = shared_workload(n, 5.0, (1, 80), (3, 24), seed);
        let w = match keys {
            Some(per_key) => as_block_keys(&w, per_key),
            None => w,
        };
        let conv = sched.convention;
        let mut cfg = SimConfig::new(blocks, bs);
        cfg.scheduler = sched;
        cfg.prefix_cache = cache(evict);
        cfg.check_invariants = true;
        let r = simulate(&w, &cfg, &mut ConstantTime(0.05)).unwrap();
        assert_conserved(&w, &r, conv);
    }

    #[test]
    fn invariants_hold_at_every_step(
        sched in policy(),
        n in 1usize..25,
        seed in any::<u64>(),
        bs in prop_oneof![Just(1usize), Just(4), Just(16)],
        blocks in 8usize..60,
    ) {
        let w = workload(n, Arrivals::Poisson { rate: 5.0 }, (1, 80), (1, 40), seed);
        let mut cfg = SimConfig::new(blocks, bs);
        let conv = sched.convention;
        cfg.scheduler = sched;
        cfg.check_invariants = true;
        let r = simulate(&w, &cfg, &mut ConstantTime(0.05)).unwrap();
        assert_conserved(&w, &r, conv);
    }
}
