//! The decode step of a pool with layer groups against the single-group `BlockPool`:
//! ns per decode token for `BlockPool::step_decode`, `HybridPool` with `[Full]` and with
//! `[Full, SlidingWindow(4096)]` (256 sequences, lengths spread so that every step some
//! sequences open a block and, in the window group, release one), and the ratios.
//! `cargo bench --bench hybrid_step`. Prints min and median over repeats (the machine is
//! shared and noisy: the minimum is the cleanest estimate).

use std::hint::black_box;
use std::time::Instant;

use pykvpool::hybrid::{GroupSpec, HybridPool, HybridStepOutput};
use pykvpool::pool::{BlockPool, StepOutput};
use pykvpool::types::SeqId;

const BATCH: usize = 256;
const BLOCK_SIZE: usize = 16;
const STEPS: usize = 400;
const REPEATS: usize = 60;
/// Enough for the Full group's growth over every repeat's steps, twice for two groups.
const NUM_BLOCKS: usize = 2 * (BATCH * (6000 + STEPS) / BLOCK_SIZE + BATCH);

/// Lengths 4,000..~6,000: past a 4,096-token window for most, staggered by one token so
/// that 1/16 of the sequences open a block at each step.
fn prompt_len(i: usize) -> usize {
    4000 + i * 7
}

fn summary(mut ns: Vec<f64>) -> (f64, f64) {
    ns.sort_by(|a, b| a.total_cmp(b));
    (ns[0], ns[ns.len() / 2])
}

fn block_pool() -> (f64, f64) {
    let ids: Vec<SeqId> = (0..BATCH as u64).map(SeqId).collect();
    let mut per_token = Vec::new();
    for _ in 0..REPEATS {
        let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE).expect("pool");
        let mut slots = Vec::new();
        for (i, &s) in ids.iter().enumerate() {
            pool.add_sequence(s, prompt_len(i), &mut slots).expect("add");
        }
        let mut out = StepOutput::default();
        let t = Instant::now();
        for _ in 0..STEPS {
            pool.step_decode(black_box(&ids), &mut out).expect("step");
        }
        per_token.push(t.elapsed().as_nanos() as f64 / (STEPS * BATCH) as f64);
        pool.check_invariants().expect("invariants");
    }
    summary(per_token)
}

fn hybrid(groups: &[GroupSpec]) -> (f64, f64) {
    let ids: Vec<SeqId> = (0..BATCH as u64).map(SeqId).collect();
    let mut per_token = Vec::new();
    for _ in 0..REPEATS {
        let mut pool = HybridPool::new(NUM_BLOCKS, BLOCK_SIZE, groups.to_vec()).expect("pool");
        let mut out = HybridStepOutput::default();
        for (i, &s) in ids.iter().enumerate() {
            pool.add_sequence(s, prompt_len(i), &mut out).expect("add");
        }
        // One step so that every window group has released what the rule releases.
        pool.step_decode(&ids, &mut out).expect("step");
        let t = Instant::now();
        for _ in 0..STEPS {
            pool.step_decode(black_box(&ids), &mut out).expect("step");
        }
        per_token.push(t.elapsed().as_nanos() as f64 / (STEPS * BATCH) as f64);
        pool.check_invariants().expect("invariants");
    }
    summary(per_token)
}

fn main() {
    if std::env::var("HYBRID_STEP_ONLY").is_ok_and(|v| v == "two") {
        // Profiling aid: only the two-group pool.
        let two = hybrid(&[GroupSpec::Full, GroupSpec::sliding_window(4096, 0).expect("window")]);
        println!("HybridPool [Full, SlidingWindow(4096)]: min {:.2}, median {:.2} ns/token", two.0, two.1);
        return;
    }
    let one = block_pool();
    let full = hybrid(&[GroupSpec::Full]);
    let two = hybrid(&[GroupSpec::Full, GroupSpec::sliding_window(4096, 0).expect("window")]);
    println!("decode step, {BATCH} sequences, block size {BLOCK_SIZE}, {STEPS} steps x {REPEATS} repeats");
    println!("{:<44}{:>12}{:>12}", "pool", "min ns/tok", "median ns/tok");
    println!("{:<44}{:>12.2}{:>12.2}", "BlockPool::step_decode", one.0, one.1);
    println!("{:<44}{:>12.2}{:>12.2}", "HybridPool [Full]", full.0, full.1);
    println!("{:<44}{:>12.2}{:>12.2}", "HybridPool [Full, SlidingWindow(4096)]", two.0, two.1);
    println!("ratio [Full] / BlockPool: min {:.2}, median {:.2}", full.0 / one.0, full.1 / one.1);
    println!("ratio [Full, SW(4096)] / BlockPool: min {:.2}, median {:.2} (target <= 2)", two.0 / one.0, two.1 / one.1);
}
