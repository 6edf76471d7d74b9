//! The simulator's early stop (`SimConfig::stop_when`): a run it does not stop is the
//! complete run bit for bit, a run it stops misses the targets in its complete version
//! too (a proptest over random workloads, pools, policies, replicas behind either router,
//! disaggregated or not, and bounds placed around the complete run's own percentiles),
//! and it really shortens
//! overloaded runs.

use proptest::prelude::*;
use pykvpool::sim::*;

#[path = "support/sim.rs"]
mod support;

use support::timer;

fn workload(n: usize, rate: f64, prompt: (u32, u32), output: (u32, u32), seed: u64) -> Workload {
    support::workload(n, rate, prompt, output, 1, seed)
}

/// What a search's SLO asks of a run (`pykvpool.search.SLO.meets`), the attainment
/// counted from the requests as the specification says: finished, and both bounds met.
fn meets(r: &SimResult, w: &Workload, rule: &StopWhen) -> bool {
    let (s, n) = (&r.summary, w.len() as u64);
    let le = |v: Option<f64>, b: Option<f64>| b.is_none_or(|b| v.is_some_and(|v| v <= b));
    let (ttft, tpot) = (r.requests.ttft(), r.requests.tpot(&w.output_len));
    let attained = |a: &Attainment| {
        let ok = (0..w.len()).filter(|&i| r.requests.outcome[i] == Outcome::Finished as u8 && a.met(ttft[i], tpot[i]));
        ok.count() as f64 >= a.share * n as f64
    };
    s.stopped.is_none()
        && (rule.tolerate_rejections || s.finished == n)
        && le(s.ttft.map(|p| p.p99), rule.ttft_p99)
        && le(s.tpot.map(|p| p.p50), rule.tpot_p50)
        && le(s.tpot.map(|p| p.p99), rule.tpot_p99)
        && rule.min_output_throughput.is_none_or(|m| s.output_throughput.is_some_and(|t| t >= m))
        && rule.attainment.as_ref().is_none_or(attained)
}

fn run(w: &Workload, cfg: &SimConfig) -> SimResult {
    simulate(w, cfg, &mut timer()).unwrap()
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A bound `f` times the complete run's own statistic (exactly it when `f` is 1).
fn around(v: Option<f64>, f: Option<f64>) -> Option<f64> {
    match (v, f) {
        (Some(v), Some(f)) if v * f > 0.0 => Some(v * f),
        (None, Some(f)) => Some(f),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn a_stopped_run_misses_the_targets_and_an_unstopped_one_is_the_complete_run(
        n in 1usize..80,
        rate in 1.0f64..400.0,
        seed in any::<u64>(),
        blocks in 6usize..200,
        max_running in 1usize..64,
        chunked in any::<bool>(),
        swap in any::<bool>(),
        replicas in 1usize..4,
        jsq in any::<bool>(),
        f in prop::array::uniform4(prop::option::of(prop_oneof![Just(1.0f64), 0.3f64..1.7])),
        attain in prop::option::of((prop::option::of(0.3f64..1.7), prop::option::of(0.3f64..1.7),
                                    prop::option::of(0.05f64..1.0))),
        tolerate in any::<bool>(),
        long in any::<bool>(),
        decode in 0usize..3,
    ) {
        // `long`: prompts up to 4,000 tokens, so that small pools reject some.
        let w = workload(n, rate, (1, if long { 4000 } else { 300 }), (1, 60), seed);
        let mut cfg = SimConfig::new(blocks, 16);
        cfg.scheduler.max_running = max_running;
        cfg.scheduler.max_batched_tokens = Some(256);
        cfg.scheduler.chunked_prefill = chunked;
        if swap {
            cfg.scheduler.preemption = Preemption::Swap { host_blocks: blocks / 2 };
        }
        cfg.replicas = replicas;
        cfg.router = if jsq { Router::ShortestQueue } else { Router::RoundRobin };
        if decode > 0 {
            // The prefill side with `blocks`, the decode side with twice as many, KV at
            // 1 GB/s (transfers of a few ms, longer than the steps of small batches).
            let link = KvLink { bandwidth: 1e9, latency: 1e-4, bytes_per_token: 65536.0, layers: 1 + (seed % 4) as u32 };
            let mixed_tokens = (seed % 3 == 0).then_some(seed % 2000);
            cfg.disaggregation = Some(Disaggregation { decode_replicas: decode, decode_num_blocks: 2 * blocks, link, mixed_tokens });
        }
        let full = run(&w, &cfg);
        let s = &full.summary;
        // Attainment bounds around the complete run's median TTFT and TPOT; the share
        // given, or (None) exactly the share the complete run attains: the closest case.
        let attainment = attain.and_then(|(t, p, share)| {
            let ttft = around(s.ttft.map(|q| q.p50), t);
            let tpot = around(s.tpot.map(|q| q.p50), p);
            let mut a = Attainment { ttft, tpot, share: 1.0 };
            let (tt, tp) = (full.requests.ttft(), full.requests.tpot(&w.output_len));
            let met = (0..w.len()).filter(|&i| full.requests.outcome[i] == Outcome::Finished as u8 && a.met(tt[i], tp[i]));
            a.share = share.unwrap_or(met.count() as f64 / w.len() as f64);
            (a.share > 0.0 && (ttft.is_some() || tpot.is_some())).then_some(a)
        });
        let rule = StopWhen {
            ttft_p99: around(s.ttft.map(|p| p.p99), f[0]),
            tpot_p50: around(s.tpot.map(|p| p.p50), f[1]),
            tpot_p99: around(s.tpot.map(|p| p.p99), f[2]),
            min_output_throughput: around(s.output_throughput, f[3]),
            attainment,
            tolerate_rejections: tolerate,
        };
        cfg.stop_when = Some(rule);
        let cut = run(&w, &cfg);
        prop_assert_eq!(meets(&cut, &w, &rule), meets(&full, &w, &rule));
        if cut.summary.stopped.is_none() {
            prop_assert_eq!(&cut.summary, s);
            prop_assert_eq!(bits(&cut.requests.finish), bits(&full.requests.finish));
            prop_assert_eq!(bits(&cut.requests.first_token), bits(&full.requests.first_token));
        } else {
            prop_assert!(!meets(&full, &w, &rule));
            prop_assert!(cut.summary.steps <= s.steps);
        }
    }
}

#[test]
fn an_overloaded_run_stops_early_and_says_why() {
    let w = workload(2000, 400.0, (100, 2000), (50, 300), 7);
    let mut cfg = SimConfig::new(4000, 16);
    let full = run(&w, &cfg);
    let rule = StopWhen { ttft_p99: Some(0.5), tpot_p99: Some(0.05), ..Default::default() };
    assert!(!meets(&full, &w, &rule) && full.summary.stopped.is_none());
    cfg.stop_when = Some(rule);
    let cut = run(&w, &cfg);
    assert_eq!(cut.summary.stopped, Some("ttft_p99"));
    assert!(cut.summary.steps * 10 < full.summary.steps, "{} of {} steps", cut.summary.steps, full.summary.steps);
    assert!(cut.requests.outcome.contains(&(Outcome::Unfinished as u8)));
    // Light load: no stop, the complete run.
    let light = workload(200, 2.0, (100, 2000), (50, 300), 7);
    cfg.stop_when = Some(StopWhen { ttft_p99: Some(5.0), ..Default::default() });
    let a = run(&light, &cfg);
    cfg.stop_when = None;
    assert_eq!(a.summary, run(&light, &cfg).summary);
}

#[test]
fn each_trigger_names_itself() {
    let w = workload(300, 50.0, (100, 600), (20, 80), 3);
    let mut cfg = SimConfig::new(3000, 16);
    let cases = [
        (StopWhen { tpot_p50: Some(1e-6), ..Default::default() }, "tpot_p50"),
        (StopWhen { tpot_p99: Some(1e-6), ..Default::default() }, "tpot_p99"),
        (StopWhen { min_output_throughput: Some(1e12), ..Default::default() }, "throughput"),
        (StopWhen { ttft_p99: Some(1e-6), ..Default::default() }, "ttft_p99"),
        (StopWhen { attainment: Some(Attainment { ttft: Some(1e-6), tpot: None, share: 0.5 }), ..Default::default() }, "attainment"),
        (StopWhen { attainment: Some(Attainment { ttft: None, tpot: Some(1e-6), share: 0.5 }), ..Default::default() }, "attainment"),
    ];
    for (rule, why) in cases {
        cfg.stop_when = Some(rule);
        assert_eq!(run(&w, &cfg).summary.stopped, Some(why));
    }
    // A request longer than the pool is rejected: the run stops at once.
    let mut tiny = SimConfig::new(4, 16);
    tiny.stop_when = Some(StopWhen::default());
    assert_eq!(run(&w, &tiny).summary.stopped, Some("rejected"));
    // Tolerated, a rejection is only a miss of the attainment target: all requests
    // needed, the run stops; half of them, it runs on.
    let attain = |share| Some(Attainment { ttft: Some(1e3), tpot: None, share });
    tiny.stop_when = Some(StopWhen { attainment: attain(1.0), tolerate_rejections: true, ..Default::default() });
    assert_eq!(run(&w, &tiny).summary.stopped, Some("attainment"));
    let mut small = SimConfig::new(40, 16);
    small.stop_when = Some(StopWhen { attainment: attain(0.5), tolerate_rejections: true, ..Default::default() });
    let some = run(&w, &small);
    assert!(some.summary.rejected > 0 && some.summary.stopped.is_none(), "{:?}", some.summary);
    for bad in [0.0, 1.5, f64::NAN] {
        tiny.stop_when = Some(StopWhen { attainment: attain(bad), ..Default::default() });
        let e = simulate(&w, &tiny, &mut timer()).unwrap_err().to_string();
        assert!(e.contains("attain_share"), "{e}");
    }
    tiny.stop_when = Some(StopWhen { ttft_p99: Some(f64::NAN), ..Default::default() });
    let e = simulate(&w, &tiny, &mut timer()).unwrap_err().to_string();
    assert!(e.contains("stop_when.ttft_p99"), "{e}");
}
