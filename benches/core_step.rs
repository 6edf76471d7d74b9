//! The Rust core alone, without Python: the hot calls of the scheduler-loop benchmark
//! (`benches/bench_scheduler.py`), to split a Python-side figure into core and binding
//! cost. `cargo bench --bench core_step`. Prints min and median over repeats (the
//! machine is shared and noisy: the minimum is the cleanest estimate of the cost).

use std::hint::black_box;
use std::time::Instant;

use pykvpool::pool::{BlockPool, StepOutput};
use pykvpool::types::SeqId;

const NUM_BLOCKS: usize = 31_232;
const BLOCK_SIZE: usize = 16;

fn summary(mut ns: Vec<f64>) -> (f64, f64) {
    ns.sort_by(|a, b| a.total_cmp(b));
    (ns[0] / 1e3, ns[ns.len() / 2] / 1e3)
}

/// A decode step of `batch` sequences whose lengths are staggered so that 1/16 of them
/// start a new block at each step, as in steady-state decoding.
fn decode_step(batch: usize) -> (f64, f64) {
    let ids: Vec<SeqId> = (0..batch as u64).map(SeqId).collect();
    let counts = vec![1usize; batch];
    let mut per_step = Vec::new();
    for _ in 0..100 {
        let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE).expect("pool");
        let mut slots = Vec::new();
        for (i, &s) in ids.iter().enumerate() {
            pool.add_sequence(s, 1000 + i, &mut slots).expect("add");
        }
        let mut out = StepOutput::default();
        let steps = 200;
        let t = Instant::now();
        for _ in 0..steps {
            pool.step(black_box(&ids), &counts, &mut out).expect("step");
        }
        per_step.push(t.elapsed().as_nanos() as f64 / steps as f64);
        pool.check_invariants().expect("invariants");
    }
    summary(per_step)
}

/// Admission of a 2,000-token prompt and the free of that sequence, on an empty pool.
fn admit_and_free() -> ((f64, f64), (f64, f64)) {
    let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE).expect("pool");
    let (mut admit, mut free) = (Vec::new(), Vec::new());
    for _ in 0..20_000 {
        let mut slots = Vec::new();
        let t0 = Instant::now();
        pool.add_sequence(SeqId(0), black_box(2000), &mut slots).expect("add");
        let t1 = Instant::now();
        pool.free(SeqId(0)).expect("free");
        let t2 = Instant::now();
        admit.push((t1 - t0).as_nanos() as f64);
        free.push((t2 - t1).as_nanos() as f64);
        black_box(slots);
    }
    (summary(admit), summary(free))
}

fn main() {
    println!("{:<40}{:>10}{:>10}", "core call (no Python)", "min us", "median us");
    for batch in [211, 256] {
        let (min, med) = decode_step(batch);
        println!("{:<40}{min:>10.3}{med:>10.3}", format!("decode step, {batch} sequences"));
    }
    let (admit, free) = admit_and_free();
    println!("{:<40}{:>10.3}{:>10.3}", "add_sequence, 2,000 tokens", admit.0, admit.1);
    println!("{:<40}{:>10.3}{:>10.3}", "free, 125 blocks", free.0, free.1);
}
