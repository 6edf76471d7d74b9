//! The Rust core alone, without Python: the hot calls of the scheduler-loop benchmark
//! (`benches/bench_scheduler.py`), to split a Python-side figure into core and binding
//! cost. `cargo bench --bench core_step [-- --sample-count N]` (divan; its `fastest` column
//! is the minimum over samples, the cleanest estimate of the cost on a shared machine).
//!
//! Every sample is one call (`sample_size = 1`; a larger `--sample-size` would take more
//! decode steps than a pool has blocks for): a decode step, or an admission / a free on
//! one pool whose other half (the free before an admission, the admission before a free)
//! runs untimed in divan's input generator, as does the rebuild of the decode pool.

use std::cell::RefCell;
use std::hint::black_box;

use divan::Bencher;
use pykvpool::pool::{BlockPool, StepOutput};
use pykvpool::types::SeqId;

const NUM_BLOCKS: usize = 31_232;
const BLOCK_SIZE: usize = 16;
/// The prompt of the admission and the free: 125 blocks.
const PROMPT: usize = 2000;

fn main() {
    divan::main();
}

/// Decode steps on one pool at a time, rebuilt after [`STEPS`] steps.
struct Decoding {
    pool: BlockPool,
    ids: Vec<SeqId>,
    out: StepOutput,
    steps: usize,
}

/// Steps per pool: 1/16 of the sequences open a block at each step, so the free blocks
/// last about 800.
const STEPS: usize = 200;

impl Decoding {
    /// A pool holding `batch` sequences of `1000 + i` tokens: staggered so that 1/16 of
    /// them start a new block at each step, as in steady-state decoding.
    fn new(batch: usize) -> Self {
        let ids: Vec<SeqId> = (0..batch as u64).map(SeqId).collect();
        let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE).expect("pool");
        let mut out = StepOutput::default();
        for (i, &s) in ids.iter().enumerate() {
            pool.add_sequence(s, 1000 + i, &mut out).expect("add");
        }
        Decoding { pool, ids, out: StepOutput::default(), steps: 0 }
    }
}

/// One decode step (one token per sequence) of `batch` sequences; each pool takes
/// [`STEPS`] steps (the first included) before the input generator builds the next.
#[divan::bench(args = [211, 256], sample_size = 1, sample_count = 20_000)]
fn decode_step(bencher: Bencher, batch: usize) {
    let counts = vec![1usize; batch];
    let state = RefCell::new(Decoding::new(batch));
    bencher
        .with_inputs(|| {
            let mut d = state.borrow_mut();
            if d.steps == STEPS {
                d.pool.check_invariants().expect("invariants");
                *d = Decoding::new(batch);
            }
            d.steps += 1;
        })
        .bench_local_refs(|()| {
            let d = &mut *state.borrow_mut();
            d.pool.step(black_box(&d.ids), &counts, &mut d.out).expect("step");
        });
}

/// Admission of a 2,000-token prompt on an empty pool (the output's slots grow in the call).
#[divan::bench(sample_size = 1, sample_count = 20_000)]
fn add_sequence(bencher: Bencher) {
    let pool = RefCell::new(BlockPool::new(NUM_BLOCKS, BLOCK_SIZE).expect("pool"));
    bencher
        .with_inputs(|| {
            let mut p = pool.borrow_mut();
            if p.contains(SeqId(0)) {
                p.free(SeqId(0)).expect("free");
            }
            StepOutput::default()
        })
        .bench_local_refs(|out| pool.borrow_mut().add_sequence(SeqId(0), black_box(PROMPT), out).expect("add"));
    pool.borrow().check_invariants().expect("invariants");
}

/// The free of that sequence (125 blocks).
#[divan::bench(sample_size = 1, sample_count = 20_000)]
fn free(bencher: Bencher) {
    let pool = RefCell::new(BlockPool::new(NUM_BLOCKS, BLOCK_SIZE).expect("pool"));
    bencher
        .with_inputs(|| {
            let mut p = pool.borrow_mut();
            if !p.contains(SeqId(0)) {
                p.add_sequence(SeqId(0), PROMPT, &mut StepOutput::default()).expect("add");
            }
        })
        .bench_local_refs(|()| pool.borrow_mut().free(black_box(SeqId(0))).expect("free"));
    pool.borrow().check_invariants().expect("invariants");
}
