//! The decode step of a pool with layer groups against a one-group pool: ns per decode
//! token for `BlockPool::new` (one full group), `BlockPool::with_groups` of `[Full]` (the
//! same pool built the other way: a control, ratio 1 up to noise) and of
//! `[Full, SlidingWindow(4096)]` (256 sequences of 4,000..5,800 tokens, staggered so that
//! every step 1/16 of them open a block and, in the window group, 1/16 release one), and
//! the ratios. `cargo bench --bench hybrid_step`.
//!
//! The three run round-robin, one repeat each in turn, so that they share the machine's
//! noise (it is shared); the figures are the minimum and the median over repeats, and the
//! median of the per-round ratios. `-- --sample-count N`: N rounds (default 60).
//!
//! Timed by hand, not by divan: the figure is the median of per-round ratios of the three
//! pools measured in alternation, and divan runs one bench's samples after another's and
//! reports each alone, with no pairing across benches.

use std::hint::black_box;
use std::time::Instant;

use pykvpool::pool::{BlockPool, GroupSpec, StepOutput};
use pykvpool::types::SeqId;

const BATCH: usize = 256;
const BLOCK_SIZE: usize = 16;
const STEPS: usize = 400;
/// Rounds unless `--sample-count N` says otherwise.
const REPEATS: usize = 60;
/// Enough for the prompts and every step in both groups.
const NUM_BLOCKS: usize = 2 * (BATCH * (6000 + STEPS) / BLOCK_SIZE + BATCH);

/// Staggered by 7 tokens: lengths cover every offset in a block.
fn prompt_len(i: usize) -> usize {
    4000 + i * 7
}

fn ids() -> Vec<SeqId> {
    (0..BATCH as u64).map(SeqId).collect()
}

/// One repeat of `BlockPool::step_decode`: ns per token.
fn block_pool() -> f64 {
    let ids = ids();
    let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE).expect("pool");
    let mut out = StepOutput::default();
    for (i, &s) in ids.iter().enumerate() {
        pool.add_sequence(s, prompt_len(i), &mut out).expect("add");
    }
    // A first step (by `step`, so that a profile of `step_decode` counts only timed steps).
    pool.step(&ids, &vec![1; BATCH], &mut out).expect("step");
    let t = Instant::now();
    for _ in 0..STEPS {
        pool.step_decode(black_box(&ids), &mut out).expect("step");
    }
    let ns = t.elapsed().as_nanos() as f64 / (STEPS * BATCH) as f64;
    pool.check_invariants().expect("invariants");
    ns
}

/// One repeat of `BlockPool::step_decode` over `groups`: ns per token.
fn hybrid(groups: &[GroupSpec]) -> f64 {
    let ids = ids();
    let mut pool = BlockPool::with_groups(NUM_BLOCKS, BLOCK_SIZE, groups.to_vec()).expect("pool");
    let mut out = StepOutput::default();
    for (i, &s) in ids.iter().enumerate() {
        pool.add_sequence(s, prompt_len(i), &mut out).expect("add");
    }
    // A first step releases what the window rule releases after the prompts (by `step`,
    // so that a profile of `step_decode` counts only timed steps).
    pool.step(&ids, &vec![1; BATCH], &mut out).expect("step");
    let t = Instant::now();
    for _ in 0..STEPS {
        pool.step_decode(black_box(&ids), &mut out).expect("step");
    }
    let ns = t.elapsed().as_nanos() as f64 / (STEPS * BATCH) as f64;
    pool.check_invariants().expect("invariants");
    ns
}

fn min_median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[0], v[v.len() / 2])
}

/// `--sample-count N` (N >= 1), else [`REPEATS`]; other arguments (cargo's `--bench`) are
/// ignored.
fn rounds() -> usize {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--sample-count") else { return REPEATS };
    match args.get(i + 1).and_then(|n| n.parse::<usize>().ok()) {
        Some(n) if n >= 1 => n,
        _ => {
            eprintln!("hybrid_step: error: --sample-count takes a count >= 1");
            std::process::exit(2);
        }
    }
}

fn main() {
    let rounds = rounds();
    let two_groups = [GroupSpec::Full, GroupSpec::sliding_window(4096, 0).expect("window")];
    // Profiling aid: one pool alone (`one`: the default pool, `two`: the two-group one).
    match std::env::var("HYBRID_STEP_ONLY").as_deref() {
        Ok("two") => {
            let (min, med) = min_median((0..rounds).map(|_| hybrid(&two_groups)).collect());
            println!("BlockPool [Full, SlidingWindow(4096)]: min {min:.2}, median {med:.2} ns/token");
            return;
        }
        Ok("one") => {
            let (min, med) = min_median((0..rounds).map(|_| block_pool()).collect());
            println!("BlockPool: min {min:.2}, median {med:.2} ns/token");
            return;
        }
        _ => {}
    }
    let (mut one, mut full, mut two) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        one.push(block_pool());
        full.push(hybrid(&[GroupSpec::Full]));
        two.push(hybrid(&two_groups));
    }
    let ratios = |v: &[f64]| min_median(v.iter().zip(&one).map(|(a, b)| a / b).collect()).1;
    let (r_full, r_two) = (ratios(&full), ratios(&two));
    let (one, full, two) = (min_median(one), min_median(full), min_median(two));
    println!("decode step, {BATCH} sequences, block size {BLOCK_SIZE}, {STEPS} steps x {rounds} rounds");
    println!("{:<42}{:>14}{:>17}", "pool", "min ns/token", "median ns/token");
    println!("{:<42}{:>14.2}{:>17.2}", "BlockPool::step_decode", one.0, one.1);
    println!("{:<42}{:>14.2}{:>17.2}", "BlockPool [Full]", full.0, full.1);
    println!("{:<42}{:>14.2}{:>17.2}", "BlockPool [Full, SlidingWindow(4096)]", two.0, two.1);
    println!("[Full] / BlockPool: {:.2} (of minima), {r_full:.2} (median of per-round ratios)", full.0 / one.0);
    println!(
        "[Full, SlidingWindow(4096)] / BlockPool: {:.2} (of minima), {r_two:.2} (median of per-round ratios); target <= 1.5",
        two.0 / one.0
    );
}
