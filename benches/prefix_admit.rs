//! The Rust core alone, without Python: admission of a 2,176-token prompt with prefix
//! caching on (136 blocks of 16), cold (never seen), cold while evicting (the pool is full
//! of idle cached blocks) and warm (135 blocks reused), and the free of such a sequence;
//! and cold on a pool of `[Full, SlidingWindow(1024)]`, with token verification (a windowed
//! block then also records its prefix's token ids, the lineage) and without (the baseline:
//! the same pool trusting 128-bit keys).
//! Splits `benches/bench_prefix_cache.py`'s Python figures into core and binding cost.
//! `cargo bench --bench prefix_admit [-- --sample-count N]` (divan).
//!
//! Every sample is one call (`sample_size = 1`) on one pool; the free before an admission
//! (the admission before a free) and the next prompt's token ids are made untimed in
//! divan's input generator. Every prompt but the warm one is new to its pool; the prompts
//! are made before any timing (as a scheduler's are: read from memory, not just written),
//! [`PROMPTS`] of them, taken in turn.

use std::cell::RefCell;
use std::hint::black_box;
use std::sync::OnceLock;

use divan::Bencher;
use pykvpool::pool::GroupSpec;
use pykvpool::{BlockPool, CacheConfig, SeqId, StepOutput};

const NUM_BLOCKS: usize = 31_232;
const BLOCK_SIZE: usize = 16;
const TOKENS: usize = 2176;
/// Prompts the pool holds cached before an admission has to evict.
const FITS: usize = NUM_BLOCKS / (TOKENS / BLOCK_SIZE);

fn main() {
    divan::main();
}

/// Distinct prompts, more than twice [`FITS`]: the LRU pool has evicted a prompt long
/// before it comes round again.
const PROMPTS: usize = 2000 + FITS;

/// The `i`-th distinct prompt (`i` modulo [`PROMPTS`]).
fn prompt(i: usize) -> &'static [u32] {
    static ALL: OnceLock<Vec<Vec<u32>>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        (0..PROMPTS).map(|i| (0..TOKENS as u32).map(|t| 32_000 + (i * TOKENS) as u32 + t).collect()).collect()
    });
    &all[i % PROMPTS]
}

/// A pool with prefix caching, the next new prompt's index and an output buffer.
struct Admitting {
    pool: BlockPool,
    next: usize,
    out: StepOutput,
}

impl Admitting {
    /// An empty pool; with `full`, [`FITS`] prompts admitted and freed first, so that it
    /// holds only idle cached blocks and every new admission evicts.
    fn new(full: bool) -> Self {
        let pool = BlockPool::with_prefix_cache(NUM_BLOCKS, BLOCK_SIZE, CacheConfig::default()).expect("pool");
        Self::on(pool, full)
    }

    /// A pool of a full and a sliding-window group (twice the blocks: the same prompts fit).
    fn groups(verify_tokens: bool) -> Self {
        let groups = vec![GroupSpec::Full, GroupSpec::sliding_window(1024, 0).expect("window")];
        let cfg = CacheConfig { verify_tokens, ..CacheConfig::default() };
        Self::on(BlockPool::with_options(2 * NUM_BLOCKS, BLOCK_SIZE, groups, Some(cfg)).expect("pool"), false)
    }

    fn on(pool: BlockPool, full: bool) -> Self {
        let mut a = Admitting { pool, next: 0, out: StepOutput::default() };
        if full {
            while a.next < FITS {
                let p = a.new_prompt();
                a.admit(p);
                a.free_if_held();
            }
        }
        a
    }

    fn new_prompt(&mut self) -> &'static [u32] {
        self.next += 1;
        prompt(self.next - 1)
    }

    fn admit(&mut self, p: &[u32]) {
        self.pool.add_sequence_tokens(SeqId(0), black_box(p), None, &mut self.out).expect("admit");
    }

    fn free_if_held(&mut self) {
        if self.pool.contains(SeqId(0)) {
            self.pool.free(SeqId(0)).expect("free");
        }
    }
}

/// Time the admission of the prompts `next` makes from a pool `state`'s sequence was freed.
fn admissions(bencher: Bencher, state: Admitting, mut next: impl FnMut(&mut Admitting) -> &'static [u32]) {
    let state = RefCell::new(state);
    bencher
        .with_inputs(|| {
            let mut a = state.borrow_mut();
            a.free_if_held();
            next(&mut a)
        })
        .bench_local_refs(|p| {
            let a = &mut *state.borrow_mut();
            a.pool.add_sequence_tokens(SeqId(0), black_box(*p), None, &mut a.out).expect("admit");
        });
    state.borrow().pool.check_invariants().expect("invariants");
}

/// A prompt never seen, on a pool with free blocks (rebuilt once it has none; the prompts
/// go on through the table).
#[divan::bench(sample_size = 1, sample_count = 2000)]
fn cold(bencher: Bencher) {
    admissions(bencher, Admitting::new(false), |a| {
        if a.next > 0 && a.next.is_multiple_of(FITS) {
            let next = a.next;
            *a = Admitting::new(false);
            a.next = next;
        }
        a.new_prompt()
    });
}

/// [`cold`] on `[Full, SlidingWindow(1024)]`, verifying (`true`) or trusting keys.
#[divan::bench(args = [true, false], sample_size = 1, sample_count = 2000)]
fn cold_groups(bencher: Bencher, verify_tokens: bool) {
    admissions(bencher, Admitting::groups(verify_tokens), move |a| {
        if a.next > 0 && a.next.is_multiple_of(FITS) {
            let next = a.next;
            *a = Admitting::groups(verify_tokens);
            a.next = next;
        }
        a.new_prompt()
    });
}

/// A prompt never seen, on a pool full of idle cached blocks: 136 evictions.
#[divan::bench(sample_size = 1, sample_count = 2000)]
fn cold_evicting(bencher: Bencher) {
    admissions(bencher, Admitting::new(true), Admitting::new_prompt);
}

/// The same prompt again: 135 of its 136 blocks reused.
#[divan::bench(sample_size = 1, sample_count = 2000)]
fn warm(bencher: Bencher) {
    let mut a = Admitting::new(false);
    let p = a.new_prompt();
    a.admit(p);
    admissions(bencher, a, |_| p);
}

/// The free of a sequence just admitted from a new prompt (its 136 blocks stay cached;
/// the first [`FITS`] admissions are cold, the rest evict).
#[divan::bench(sample_size = 1, sample_count = 2000)]
fn free(bencher: Bencher) {
    let state = RefCell::new(Admitting::new(false));
    bencher
        .with_inputs(|| {
            let mut a = state.borrow_mut();
            let p = a.new_prompt();
            a.admit(p);
        })
        .bench_local_refs(|()| state.borrow_mut().pool.free(black_box(SeqId(0))).expect("free"));
    state.borrow().pool.check_invariants().expect("invariants");
}
