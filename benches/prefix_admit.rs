//! The Rust core alone, without Python: admission of a 2,176-token prompt with prefix
//! caching on (136 blocks of 16), cold (never seen), cold while evicting (the pool is full
//! of idle cached blocks) and warm (135 blocks reused). `cargo bench --bench prefix_admit`.
//! Splits `benches/bench_prefix_cache.py`'s Python figures into core and binding cost.

use std::hint::black_box;
use std::time::Instant;

use pykvpool::{BlockPool, CacheConfig, SeqId};

const NUM_BLOCKS: usize = 31_232;
const BLOCK_SIZE: usize = 16;
const TOKENS: usize = 2176;

fn summary(mut ns: Vec<f64>) -> (f64, f64) {
    ns.sort_by(|a, b| a.total_cmp(b));
    (ns[0] / 1e3, ns[ns.len() / 2] / 1e3)
}

fn main() {
    let reps = 2000;
    let prompts: Vec<Vec<u32>> =
        (0..reps).map(|i| (0..TOKENS as u32).map(|t| 32_000 + (i * TOKENS) as u32 + t).collect()).collect();
    let mut pool = BlockPool::with_prefix_cache(NUM_BLOCKS, BLOCK_SIZE, CacheConfig::default()).expect("pool");
    let mut slots = Vec::new();
    let (mut cold, mut evicting, mut warm, mut free) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let fits = NUM_BLOCKS / (TOKENS / BLOCK_SIZE);
    for (i, p) in prompts.iter().enumerate() {
        slots.clear();
        let t = Instant::now();
        pool.add_sequence_tokens(SeqId(0), black_box(p), None, &mut slots).expect("admit");
        let ns = t.elapsed().as_nanos() as f64;
        if i < fits { cold.push(ns) } else { evicting.push(ns) }
        let t = Instant::now();
        pool.free(SeqId(0)).expect("free");
        free.push(t.elapsed().as_nanos() as f64);
    }
    let last = &prompts[reps - 1];
    for _ in 0..reps {
        slots.clear();
        let t = Instant::now();
        pool.add_sequence_tokens(SeqId(0), black_box(last), None, &mut slots).expect("admit");
        warm.push(t.elapsed().as_nanos() as f64);
        pool.free(SeqId(0)).expect("free");
    }
    pool.check_invariants().expect("invariants");
    for (name, v) in [("cold", cold), ("cold, evicting", evicting), ("warm", warm), ("free (136 cached blocks)", free)] {
        let (min, med) = summary(v);
        println!("admission of {TOKENS} tokens, {name:<26} min {min:7.2} us   median {med:7.2} us");
    }
}
