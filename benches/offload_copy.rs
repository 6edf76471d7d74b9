//! Offload copy bandwidth: the transfer engine's copies of whole blocks between a device
//! `KvCache` (G1) and a `HostTier` (G2), against a plain memcpy of the same bytes.
//!
//! For each block size S in 64 KiB, 256 KiB, 1 MiB and 4 MiB, a 128 MiB device cache
//! (bf16, head_dim 128) and a 128 MiB tier (256 MiB working set, 8x this machine's L3, so
//! the figures are memory bandwidth), the rows are:
//!
//! - `memcpy`: `copy_from_slice` of each S-byte block from one 128 MiB buffer to another
//!   (both `AlignedBuf`s, huge-page advised like the cache and the tier): the baseline;
//! - `memcpy per-layer runs`: `copy_from_slice` of each run of the 32-layer cache below
//!   into a 128 MiB buffer, block after block (what the per-layer rows copy, without the
//!   engine): the cost of the layout alone;
//! - `store contiguous` / `load contiguous`: every block G1 -> G2 (store) or G2 -> G1
//!   (load) through the engine, for a one-layer cache: one run of S bytes per block;
//! - `store per-layer` / `load per-layer`: the same for a 32-layer cache, the KvCache layout
//!   of a real model: a block is 32 runs of S/32 bytes (2, 8, 32 and 128 KiB), one per
//!   layer region.
//!
//! An engine pass submits the blocks as batches of 32 MiB, all before waiting for any,
//! and waits for them all; the time includes each batch's checks on the calling thread.
//! The engine has one worker thread (`--threads T` to change it), as the baseline copies
//! on one. GB/s is 10^9 bytes copied per second.
//!
//! Timed by hand (`harness = false`), not by divan: the figure is the ratio of rows
//! measured in the same round. Each round runs every row of a size once, in alternating
//! order (forward, then backward), so the rows share the machine's noise; the output is
//! each row's median GB/s and, for the other rows, the median of the per-round ratios to
//! the memcpy row, with their interquartile range (and for per-layer rows the same against
//! the per-layer memcpy row). A warm-up pass of each row (not timed)
//! faults every page in first.
//!
//! `cargo bench --bench offload_copy` (`-- --rounds N`, default 15; under 20 s).

#[path = "paired/rounds.rs"]
mod paired;
use paired::{alternate, arg, quantile, ratio};

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use pykvpool::kv::aligned::AlignedBuf;
use pykvpool::kv::{DType, KvCache, KvShape};
use pykvpool::offload::host::{HostTier, Slot};
use pykvpool::offload::transfer::{slot_bytes_for, Batch, Handle, TransferEngine};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Bytes of the device cache and of the tier (each).
const SIDE: usize = 128 * MIB;
/// Bytes per submitted batch.
const BATCH: usize = 32 * MIB;
const SIZES: [usize; 4] = [64 * KIB, 256 * KIB, MIB, 4 * MIB];
const LAYERS_FRAGMENTED: usize = 32;

/// A row of the table: one way to move `SIDE` bytes.
#[derive(Clone, Copy, PartialEq)]
enum Row {
    Memcpy,
    MemcpyRuns,
    Store { layers: usize },
    Load { layers: usize },
}

impl Row {
    fn name(self) -> String {
        let layout = |l: usize| if l == 1 { "contiguous".to_string() } else { format!("per-layer ({l} runs)") };
        match self {
            Self::Memcpy => "memcpy".into(),
            Self::MemcpyRuns => format!("memcpy per-layer runs ({LAYERS_FRAGMENTED})"),
            Self::Store { layers } => format!("store G1->G2 {}", layout(layers)),
            Self::Load { layers } => format!("load  G2->G1 {}", layout(layers)),
        }
    }
}

/// A device cache of `SIDE` bytes in blocks of `block` bytes over `layers` layers.
fn cache(block: usize, layers: usize) -> Arc<KvCache> {
    // bf16, head_dim 128: a layer's block is 512 * heads * block_size bytes.
    let per = block / layers / 512;
    let heads = per.clamp(1, 8);
    let shape = KvShape { num_layers: layers, num_blocks: SIDE / block, block_size: per / heads, num_kv_heads: heads, head_dim: 128 };
    let c = KvCache::new(shape, DType::BF16).expect("cache");
    assert_eq!(slot_bytes_for(&c), block, "shape {shape:?}");
    Arc::new(c)
}

/// The setup of one block size: two caches, a tier, the baseline's buffers, an engine.
struct Setup {
    block: usize,
    caches: [Arc<KvCache>; 2],
    host: HostTier,
    slots: Vec<Slot>,
    src: AlignedBuf,
    dst: AlignedBuf,
    /// The per-layer cache's runs in slot order: (bytes in the cache, offset in `dst`).
    runs: Vec<(Range<usize>, usize)>,
    engine: TransferEngine,
}

impl Setup {
    fn new(block: usize, threads: usize) -> Self {
        let caches = [cache(block, 1), cache(block, LAYERS_FRAGMENTED)];
        let mut host = HostTier::new(block, SIDE / block).expect("tier");
        let slots = (0..host.capacity()).map(|_| host.alloc().expect("slot")).collect();
        let mut src = AlignedBuf::zeroed(SIDE).expect("buffer");
        src.as_mut_slice().fill(1);
        let dst = AlignedBuf::zeroed(SIDE).expect("buffer");
        let engine = TransferEngine::new(threads).expect("engine");
        let runs = gather_runs(&caches[1]);
        Self { block, caches, host, slots, src, dst, runs, engine }
    }

    /// Run `row` once; seconds.
    fn run(&mut self, row: Row) -> f64 {
        let t = Instant::now();
        match row {
            Row::Memcpy => {
                let src = self.src.as_slice();
                for (d, s) in self.dst.as_mut_slice().chunks_mut(self.block).zip(src.chunks(self.block)) {
                    d.copy_from_slice(s);
                }
            }
            Row::MemcpyRuns => {
                let (src, dst) = (self.caches[1].bytes(), self.dst.as_mut_slice());
                for (r, at) in &self.runs {
                    dst[*at..*at + r.len()].copy_from_slice(&src[r.clone()]);
                }
            }
            Row::Store { layers } | Row::Load { layers } => {
                let handles = self.submit(layers, matches!(row, Row::Load { .. }));
                handles.iter().for_each(|h| h.wait().expect("copy"));
            }
        }
        t.elapsed().as_secs_f64()
    }

    /// Every block stored into (or loaded from) its slot, in batches of `BATCH` bytes.
    fn submit(&mut self, layers: usize, load: bool) -> Vec<Handle> {
        let cache = &self.caches[usize::from(layers != 1)];
        let per_batch = (BATCH / self.block).max(1);
        let mut handles = Vec::new();
        for (n, slots) in self.slots.chunks(per_batch).enumerate() {
            let mut batch = Batch::new(cache.clone());
            for (i, &slot) in slots.iter().enumerate() {
                let block = n * per_batch + i;
                if load {
                    batch.load(slot, block);
                } else {
                    batch.store(block, slot);
                }
            }
            // SAFETY: nothing else touches the cache; each block is in one batch, and
            // every batch is waited for before the next pass.
            handles.push(unsafe { self.engine.submit(&mut self.host, batch) });
        }
        handles
    }
}

/// Every run of every block of `cache`, block-major, with its offset in a buffer of the
/// blocks' slots end to end.
fn gather_runs(cache: &KvCache) -> Vec<(Range<usize>, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    for block in 0..cache.shape().num_blocks {
        for layer in 0..cache.shape().num_layers {
            for r in cache.block_bytes(layer, block).expect("block") {
                let len = r.len();
                out.push((r, at));
                at += len;
            }
        }
    }
    out
}

const ROWS: [Row; 6] = [
    Row::Memcpy,
    Row::MemcpyRuns,
    Row::Store { layers: 1 },
    Row::Load { layers: 1 },
    Row::Store { layers: LAYERS_FRAGMENTED },
    Row::Load { layers: LAYERS_FRAGMENTED },
];

/// Seconds of each row (by `ROWS` index) in each of `rounds` rounds, and whether every
/// buffer got huge pages.
fn measure(block: usize, threads: usize, rounds: usize) -> (Vec<Vec<f64>>, bool) {
    let mut s = Setup::new(block, threads);
    let huge = s.host.huge_pages() && s.caches.iter().all(|c| c.huge_pages()) && s.src.huge_pages();
    for &row in &ROWS {
        s.run(row); // warm-up: fault every page in
    }
    let secs = alternate(ROWS.len(), rounds, |i| s.run(ROWS[i]));
    (secs, huge)
}

fn print_table(secs: &[Vec<f64>]) {
    println!("  {:<34} {:>8}   {:>24}   {:>24}", "row", "GB/s", "vs memcpy [IQR]", "vs memcpy of runs [IQR]");
    for (i, row) in ROWS.iter().enumerate() {
        let gbs: Vec<f64> = secs[i].iter().map(|t| SIDE as f64 / t / 1e9).collect();
        let first = if *row == Row::Memcpy { String::new() } else { ratio(secs, 0, i) };
        let per_layer = matches!(row, Row::Store { layers } | Row::Load { layers } if *layers > 1);
        let second = if per_layer { ratio(secs, 1, i) } else { String::new() };
        println!("  {:<34} {:>8.2}   {:>24}   {:>24}", row.name(), quantile(&gbs, 0.5), first, second);
    }
}

fn main() {
    let rounds = arg("--rounds", 15).max(3);
    let threads = arg("--threads", 1);
    println!("offload_copy: {rounds} rounds, engine threads {threads}, {} MiB each side; GB/s = 1e9 B/s", SIDE / MIB);
    for block in SIZES {
        let (secs, huge) = measure(block, threads, rounds);
        println!("\nblock {} KiB ({} blocks, huge pages: {huge})", block / KIB, SIDE / block);
        print_table(&secs);
    }
}
