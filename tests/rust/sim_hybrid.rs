//! The simulator over a `BlockPool` (models with layer groups): a windowed group holds at
//! most its window's blocks per request, one full group reproduces the `BlockPool` run
//! exactly, runs are deterministic, and the pool's invariants and the engine's mirror of
//! it hold after every step (proptest over groups, block sizes and policies, with and
//! without prefix caching).

use proptest::prelude::*;
use pykvpool::pool::GroupSpec;
use pykvpool::prefix_cache::CacheConfig;
use pykvpool::sim::workload::{synthesize, Arrivals, LengthSpec, Lengths, SharedPrefixes, SyntheticSpec};
use pykvpool::EvictionPolicy;
use pykvpool::sim::*;

fn uniform(lo: u32, hi: u32) -> LengthSpec {
    LengthSpec { dist: Lengths::Uniform { lo, hi }, min: 1, max: MAX_REQUEST_TOKENS }
}

fn workload(n: usize, rate: f64, prompt: (u32, u32), output: (u32, u32), seed: u64) -> Workload {
    shared_workload(n, rate, prompt, output, seed, None)
}

/// Prompts of token ids opening with one of `prefixes` shared prefixes of `len` tokens.
fn shared_workload(n: usize, rate: f64, prompt: (u32, u32), output: (u32, u32), seed: u64, shared: Option<(usize, u32)>) -> Workload {
    synthesize(&SyntheticSpec {
        num_requests: n,
        arrivals: Arrivals::Poisson { rate },
        prompt: uniform(prompt.0, prompt.1),
        output: uniform(output.0, output.1),
        priority_levels: 3,
        shared_prefixes: shared.map(|(num_prefixes, prefix_len)| SharedPrefixes { num_prefixes, prefix_len, vocab_size: 32_000 }),
        seed,
    })
    .unwrap()
}

fn config(num_blocks: usize, bs: usize, groups: Option<Vec<GroupSpec>>) -> SimConfig {
    let mut cfg = SimConfig::new(num_blocks, bs);
    cfg.groups = groups;
    cfg.check_invariants = true;
    cfg
}

fn run(w: &Workload, cfg: &SimConfig) -> SimResult {
    simulate(w, cfg, &mut ConstantTime(0.01)).unwrap()
}

fn sliding(window: usize, sinks: usize) -> GroupSpec {
    GroupSpec::sliding_window(window, sinks).unwrap()
}

/// Float columns equal bit for bit (NaN included).
fn same(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn assert_same_requests(a: &RequestMetrics, b: &RequestMetrics) {
    assert!(same(&a.arrival, &b.arrival) && same(&a.first_scheduled, &b.first_scheduled));
    assert!(same(&a.first_token, &b.first_token) && same(&a.finish, &b.finish));
    assert_eq!((&a.preemptions, &a.swaps, &a.outcome), (&b.preemptions, &b.swaps, &b.outcome));
    assert_eq!((&a.recomputed_tokens, &a.cached_tokens), (&b.recomputed_tokens, &b.cached_tokens));
}

/// Blocks a windowed group holds at most per request during a growth of `n` tokens
/// (the spec's bound).
fn window_bound(window: usize, sinks: usize, bs: usize, n: usize) -> usize {
    sinks.div_ceil(bs) + (window - 1).div_ceil(bs) + 1 + n.div_ceil(bs)
}

#[test]
fn a_windowed_group_holds_at_most_its_window_per_request() {
    let (bs, window, sinks, budget) = (16, 256, 4, 128);
    let w = workload(60, 4.0, (300, 2000), (50, 400), 7);
    let mut cfg = config(4000, bs, Some(vec![GroupSpec::Full, sliding(window, sinks)]));
    cfg.scheduler.max_batched_tokens = Some(budget);
    let r = run(&w, &cfg);
    assert_eq!(r.summary.finished, 60);
    assert_eq!(r.leaked_blocks, 0);
    let (full, win) = (&r.steps.group_blocks[0], &r.steps.group_blocks[1]);
    let bound = window_bound(window, sinks, bs, budget);
    let mut longest_full = 0;
    for s in 0..r.steps.running.len() {
        assert_eq!(full[s] + win[s], r.steps.blocks_used[s], "step {s}: groups add up to the pool");
        assert!(win[s] as usize <= bound * r.steps.running[s] as usize, "step {s}: {} blocks for {} requests", win[s], r.steps.running[s]);
        longest_full = longest_full.max(full[s]);
    }
    assert_eq!(r.summary.peak_group_blocks, vec![longest_full as u64, *win.iter().max().unwrap() as u64]);
    // Long requests: the full group holds far more than the window.
    assert!(r.summary.peak_group_blocks[1] * 2 < r.summary.peak_group_blocks[0], "{:?}", r.summary.peak_group_blocks);
}

#[test]
fn one_full_group_is_the_block_pool_run_exactly() {
    let w = workload(120, 30.0, (20, 700), (1, 300), 3);
    let mut policies = vec![];
    for conv in [Convention::Vllm, Convention::DecodeFirst] {
        for alloc in [Allocation::Paged, Allocation::Oracle, Allocation::Reserve { tokens: 1100 }] {
            let mut s = SchedulerConfig { convention: conv, allocation: alloc, max_running: 40, ..Default::default() };
            s.max_batched_tokens = Some(512);
            s.watermark = 0.01;
            policies.push(s);
        }
    }
    let mut preempted = 0;
    for s in policies {
        let mut plain = config(700, 16, None);
        plain.scheduler = s.clone();
        let mut full = plain.clone();
        full.groups = Some(vec![GroupSpec::Full]);
        let (a, b) = (run(&w, &plain), run(&w, &full));
        assert_same_requests(&a.requests, &b.requests);
        assert_eq!((&a.steps.blocks_used, &a.steps.kv_tokens, &a.steps.running), (&b.steps.blocks_used, &b.steps.kv_tokens, &b.steps.running));
        assert!(same(&a.steps.utilization, &b.steps.utilization));
        assert_eq!(b.steps.group_blocks, vec![b.steps.blocks_used.clone()]);
        assert!(a.steps.group_blocks.is_empty() && a.summary.peak_group_blocks.is_empty());
        let mut sb = b.summary.clone();
        assert_eq!(sb.peak_group_blocks, vec![sb.peak_blocks_used]);
        sb.peak_group_blocks.clear();
        assert_eq!(a.summary, sb);
        preempted += a.summary.preemptions;
    }
    assert!(preempted > 0, "the comparison must cover preemption");
}

#[test]
fn same_input_same_result_bit_for_bit() {
    let w = workload(80, 20.0, (50, 900), (1, 200), 11);
    let groups = vec![sliding(128, 0), GroupSpec::chunked(200).unwrap(), GroupSpec::Full];
    let mut cfg = config(600, 8, Some(groups));
    cfg.scheduler.max_batched_tokens = Some(300);
    let (a, b) = (run(&w, &cfg), run(&w, &cfg));
    assert_same_requests(&a.requests, &b.requests);
    assert_eq!(a.steps.group_blocks, b.steps.group_blocks);
    assert_eq!(a.steps.kv_tokens, b.steps.kv_tokens);
    assert_eq!(a.summary, b.summary);
    assert!(a.summary.preemptions > 0 && a.summary.finished == 80);
}

#[test]
fn a_window_sustains_more_concurrency_than_full_attention_at_the_same_blocks() {
    // Mistral-7B-like: every layer slides over 4096 tokens; 16k-token requests.
    let w = workload(40, 1000.0, (12_000, 16_000), (200, 400), 5);
    let mut full = config(8_000, 16, None);
    full.check_invariants = false;
    let mut win = full.clone();
    win.groups = Some(vec![sliding(4096, 0)]);
    let (a, b) = (run(&w, &full), run(&w, &win));
    assert_eq!((a.summary.finished, b.summary.finished), (40, 40));
    assert!(b.summary.peak_running >= 2 * a.summary.peak_running, "{} vs {}", b.summary.peak_running, a.summary.peak_running);
    assert!(b.summary.makespan.unwrap() < a.summary.makespan.unwrap());
    // Stored tokens over held slots: the window stores what it holds.
    assert!(b.summary.mean_utilization.unwrap() > 0.9);
}

#[test]
fn caching_with_one_full_group_hits_what_the_block_pool_hits() {
    // A pool that never evicts: every request reuses exactly the cached full blocks of
    // the prompts admitted before it, through either pool.
    let w = shared_workload(60, 20.0, (40, 400), (1, 50), 4, Some((3, 200)));
    let mut plain = config(4000, 16, None);
    plain.prefix_cache = Some(CacheConfig::default());
    let mut full = plain.clone();
    full.groups = Some(vec![GroupSpec::Full]);
    let (a, b) = (run(&w, &plain), run(&w, &full));
    assert_eq!(a.requests.cached_tokens, b.requests.cached_tokens);
    assert!(a.summary.cached_tokens > 0 && a.summary.finished == 60);
    assert_same_requests(&a.requests, &b.requests);
}

#[test]
fn caching_with_windows_reuses_prefixes_under_pressure() {
    // Gemma-like: a full group and a 64-token window; a small pool evicts and preempts.
    let w = shared_workload(80, 40.0, (100, 600), (20, 200), 9, Some((4, 300)));
    for policy in EvictionPolicy::ALL {
        let mut cfg = config(260, 16, Some(vec![GroupSpec::Full, sliding(64, 4)]));
        cfg.prefix_cache = Some(CacheConfig { policy, ..CacheConfig::default() });
        cfg.scheduler.max_batched_tokens = Some(512);
        let r = run(&w, &cfg);
        assert_eq!((r.summary.finished, r.leaked_blocks), (80, 0), "{policy}");
        assert!(r.summary.cached_tokens > 0, "{policy}: shared prefixes are reused");
        assert!(r.summary.preemptions > 0, "{policy}: the pool is under pressure");
        let again = run(&w, &cfg);
        assert_eq!(r.summary, again.summary, "{policy}: deterministic");
    }
}

#[test]
fn swapping_with_groups_moves_what_each_group_holds() {
    // One full group swaps exactly as the BlockPool run does.
    let w = workload(120, 30.0, (20, 700), (1, 300), 3);
    let mut plain = config(700, 16, None);
    plain.scheduler.max_running = 40;
    plain.scheduler.max_batched_tokens = Some(512);
    plain.scheduler.preemption = Preemption::Swap { host_blocks: 400 };
    let mut full = plain.clone();
    full.groups = Some(vec![GroupSpec::Full]);
    let (a, b) = (run(&w, &plain), run(&w, &full));
    assert!(a.summary.swaps > 0, "the comparison must cover swapping");
    assert_same_requests(&a.requests, &b.requests);
    assert_eq!(a.steps.swapped_blocks, b.steps.swapped_blocks);
    // A window moves only its sinks and window: fewer blocks per swap than full attention.
    let long = workload(60, 50.0, (600, 1500), (50, 400), 8);
    let mut win = config(500, 16, Some(vec![GroupSpec::Full, sliding(128, 4)]));
    win.scheduler.max_batched_tokens = Some(512);
    win.scheduler.preemption = Preemption::Swap { host_blocks: 600 };
    let r = run(&long, &win);
    assert_eq!((r.summary.finished, r.leaked_blocks), (60, 0));
    let swaps: u64 = r.requests.swaps.iter().map(|&s| s as u64).sum();
    assert!(swaps > 0 && r.summary.swaps > 0);
    let moved: u64 = r.steps.swapped_blocks.iter().map(|&b| b as u64).sum();
    let mut flat = win.clone();
    flat.groups = Some(vec![GroupSpec::Full, GroupSpec::Full]);
    let f = run(&long, &flat);
    let flat_moved: u64 = f.steps.swapped_blocks.iter().map(|&b| b as u64).sum();
    let flat_swaps: u64 = f.requests.swaps.iter().map(|&s| s as u64).sum();
    assert!(flat_swaps > 0);
    assert!((moved as f64 / swaps as f64) < (flat_moved as f64 / flat_swaps as f64), "{moved}/{swaps} vs {flat_moved}/{flat_swaps}");
}

#[test]
fn a_request_longer_than_the_pool_but_within_the_window_runs() {
    // 2,000 tokens in 30 blocks of 16 cannot be held whole; a 64-token window can.
    let w = workload(4, 1.0, (1_500, 1_500), (500, 500), 2);
    let mut cfg = config(30, 16, Some(vec![sliding(64, 0)]));
    cfg.scheduler.max_batched_tokens = Some(64);
    let r = run(&w, &cfg);
    assert_eq!(r.summary.finished, 4);
    // With caching too: each growth fits only with the blocks its own window releases.
    cfg.prefix_cache = Some(CacheConfig::default());
    let cached = run(&w, &cfg);
    assert_eq!((cached.summary.finished, cached.summary.preemptions), (4, r.summary.preemptions));
    let mut plain = config(30, 16, None);
    plain.scheduler.max_batched_tokens = Some(64);
    assert_eq!(run(&w, &plain).summary.rejected, 4);
}

fn group() -> impl Strategy<Value = GroupSpec> {
    prop_oneof![
        Just(GroupSpec::Full),
        (1usize..80, 0usize..20).prop_map(|(w, s)| GroupSpec::sliding_window(w, s).unwrap()),
        (1usize..80).prop_map(|c| GroupSpec::chunked(c).unwrap()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any groups, block size and policy: the run completes, frees everything, and the
    /// pool's invariants and the engine's mirror (frontiers, blocks per group, stored
    /// tokens, net blocks of each step) hold at every step.
    #[test]
    fn invariants_hold_at_every_step(
        groups in prop::collection::vec(group(), 1..4),
        bs in prop::sample::select(vec![1usize, 4, 16]),
        blocks in 60usize..400,
        budget in 8usize..200,
        conv in prop::sample::select(vec![Convention::Vllm, Convention::DecodeFirst]),
        alloc in prop::sample::select(vec![Allocation::Paged, Allocation::Oracle]),
        caching in prop::option::of(prop::sample::select(EvictionPolicy::ALL.to_vec())),
        swap in prop::option::of(10usize..200),
        seed in 0u64..1000,
    ) {
        let w = shared_workload(25, 50.0, (1, 120), (1, 60), seed, Some((2, 40)));
        let mut cfg = config(blocks, bs, Some(groups));
        cfg.scheduler = SchedulerConfig { convention: conv, allocation: alloc, max_running: 12, max_batched_tokens: Some(budget), ..Default::default() };
        cfg.prefix_cache = caching.map(|policy| CacheConfig { policy, ..CacheConfig::default() });
        if let Some(host_blocks) = swap {
            cfg.scheduler.preemption = Preemption::Swap { host_blocks };
        }
        let r = run(&w, &cfg);
        prop_assert_eq!(r.leaked_blocks, 0);
        prop_assert_eq!(r.summary.finished + r.summary.rejected, 25);
        for s in 0..r.steps.blocks_used.len() {
            // With caching a shared block counts once per holder.
            let sum: u32 = r.steps.group_blocks.iter().map(|c| c[s]).sum();
            if caching.is_some() {
                prop_assert!(sum >= r.steps.blocks_used[s]);
            } else {
                prop_assert_eq!(sum, r.steps.blocks_used[s]);
            }
        }
    }
}
