//! Hit rates on a Mooncake-format trace (ignored by default: it needs the trace file and a
//! release build). Run:
//!
//! ```text
//! PYKVPOOL_MOONCAKE_TRACE=<path>/synthetic_trace.jsonl \
//!     cargo test --release --test prefix_model -- --ignored --nocapture mooncake
//! ```
//!
//! A Gemma-3-like model (1 full-attention group + 5 sliding-window groups of 1024 tokens,
//! blocks of 16 tokens; each group holds a sixth of the layers, so one group block is a
//! sixth of the bytes of a whole-model block) against the same pool with every group full
//! (full-attention reuse) and against `BlockPool` with one group for all layers, at equal
//! bytes: a hybrid pool of `6 S` group blocks against a `BlockPool` of `S` blocks. Each
//! request is admitted by its block keys (the trace's 512-token ids mapped to 16-token
//! pool keys as the simulator does), then, in the `decode` mode, grows by its first
//! output token (the growth that releases the window groups' early blocks), then is freed:
//! what stays is what the cache retains, as `pykvpool/prefix/replay.py` measures it.

use pykvpool::pool::{BlockPool, GroupSpec, StepOutput};
use pykvpool::sim::kv::pool_keys;
use pykvpool::{CacheConfig, SeqId};

const TRACE_BLOCK: usize = 512;
const BS: usize = 16;
const GROUPS: usize = 6;

struct Req {
    len: usize,
    ids: Vec<u64>,
}

/// The integer after `"name":` in a JSON line.
fn field(line: &str, name: &str) -> usize {
    let at = line.find(&format!("\"{name}\"")).unwrap_or_else(|| panic!("no {name} in {line}"));
    let rest = line[at + name.len() + 2..].trim_start_matches([':', ' ']);
    let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    rest[..end].parse().unwrap()
}

fn read(path: &str) -> Vec<Req> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let len = field(line, "input_length");
        let at = line.find("\"hash_ids\"").unwrap();
        let open = at + line[at..].find('[').unwrap();
        let close = open + line[open..].find(']').unwrap();
        let ids: Vec<u64> = line[open + 1..close].split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().unwrap()).collect();
        assert_eq!(ids.len(), len.div_ceil(TRACE_BLOCK), "{line}");
        out.push(Req { len, ids });
    }
    out
}

/// (hit tokens, prompt tokens, evictions) of one hybrid replay.
fn replay_hybrid(trace: &[Req], blocks: usize, groups: Vec<GroupSpec>, decode: bool) -> (u64, u64, u64) {
    let mut p = BlockPool::with_options(blocks, BS, groups, Some(CacheConfig { verify_tokens: false, ..CacheConfig::default() })).unwrap();
    let (mut out, mut keys) = (StepOutput::default(), Vec::new());
    for (i, r) in trace.iter().enumerate() {
        let s = SeqId(i as u64);
        pool_keys(&r.ids, TRACE_BLOCK, r.len, BS, &mut keys);
        p.add_sequence_block_keys(s, &keys, r.len, &mut out).unwrap();
        if decode {
            p.step_decode(&[s], &mut out).unwrap();
        }
        p.free(s).unwrap();
    }
    let c = p.cache_stats().unwrap();
    (c.hit_tokens, c.query_tokens, c.evictions)
}

fn replay_block_pool(trace: &[Req], blocks: usize, decode: bool) -> (u64, u64, u64) {
    replay_hybrid(trace, blocks, vec![GroupSpec::Full], decode)
}

fn rate((hit, total, _): (u64, u64, u64)) -> f64 {
    100.0 * hit as f64 / total as f64
}

#[test]
#[ignore = "needs PYKVPOOL_MOONCAKE_TRACE and a release build"]
fn mooncake_hit_rates_gemma3_like() {
    let path = std::env::var("PYKVPOOL_MOONCAKE_TRACE").expect("set PYKVPOOL_MOONCAKE_TRACE to a Mooncake JSONL trace");
    let trace = read(&path);
    let largest = trace.iter().map(|r| r.len.div_ceil(BS)).max().unwrap();
    let distinct: std::collections::HashSet<u64> = trace.iter().flat_map(|r| r.ids.iter().copied()).collect();
    let unbounded = distinct.len() * (TRACE_BLOCK / BS) + largest + 1;
    let gemma: Vec<GroupSpec> = std::iter::once(GroupSpec::Full).chain((1..GROUPS).map(|_| GroupSpec::sliding_window(1024, 0).unwrap())).collect();
    let full = vec![GroupSpec::Full; GROUPS];
    println!("{} requests, largest prompt {largest} blocks of {BS} tokens, {} distinct trace ids", trace.len(), distinct.len());
    println!("mode   | S (whole-model blocks) | gemma3-like hybrid | all-full hybrid | BlockPool | evictions (gemma, full, BlockPool)");
    // PYKVPOOL_TRACE_QUICK=1: the admit mode at two sizes only.
    let quick = std::env::var_os("PYKVPOOL_TRACE_QUICK").is_some();
    let sizes = if quick { vec![4 * largest, 16 * largest] } else { vec![largest + 1, 2 * largest, 4 * largest, 8 * largest, 16 * largest, unbounded] };
    for decode in if quick { vec![false] } else { vec![false, true] } {
        for &s in &sizes {
            let g = replay_hybrid(&trace, GROUPS * s, gemma.clone(), decode);
            let f = replay_hybrid(&trace, GROUPS * s, full.clone(), decode);
            let b = replay_block_pool(&trace, s, decode);
            let mode = if decode { "decode" } else { "admit " };
            println!(
                "{mode} | {s:>22} | {:>17.2}% | {:>14.2}% | {:>8.2}% | {}, {}, {}",
                rate(g),
                rate(f),
                rate(b),
                g.2,
                f.2,
                b.2
            );
        }
    }
}
