//! The read roof of one decode call: the bytes [`super::decode_attention`] reads for a
//! block table, read in its order by its work items and nothing else.
//!
//! The sequential probe ([`crate::runtime::probe::read_bandwidth_of`]) streams a cache's
//! pages front to back; a decode reads them block by block in table order, one
//! contiguous run per block (its K and V tiles of every KV head, `2 * num_kv_heads *
//! block_size * head_dim` elements) plus, for int8, the block's scales (one run of
//! `2 * num_kv_heads * block_size` f32 elsewhere in the layer). With a scattered table
//! each run starts at a random address, so a shorter run (an 8-bit block of 8 heads of
//! 16 x 128 is 32 KiB) reads slower than a stream, whatever the kernel computes. This
//! sweep is the decode with its compute taken out: the same items ([`super::decode`]'s
//! `plan`, longest first, each thread taking the next), each block's runs summed in
//! order by the probe's SIMD sum, timed by the same clocks.

use std::hint::black_box;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::decode::{plan, visible_keys};
use super::tables::SeqTables;
use crate::error::Result;
use crate::invalid;
use crate::kv::KvCache;
use crate::runtime::clock::{slowest_thread, thread_cpu_seconds, Clock};
use crate::runtime::probe::{check_passes, sum_words};
use crate::runtime::threads::{pool_with, run_workers};

/// Bytes/s of the reads a decode of `layer` over `tables` makes (every key visible, all
/// KV heads per work item, the default split for `threads`), best of `passes` sweeps
/// (default 7) timed by `clock`. Whole blocks are read, including the unused slots of a
/// sequence's last block (a kernel reads their cache lines too when it reads the
/// block's tokens of one dimension).
///
/// Errors: a bad layer, thread count or `passes`; a table entry of a visible block
/// outside the cache; fewer than 1 MiB to read.
pub fn decode_read_bandwidth(
    cache: &KvCache,
    layer: usize,
    tables: &SeqTables,
    threads: Option<usize>,
    passes: Option<usize>,
    clock: Clock,
) -> Result<f64> {
    cache.check_layer(layer)?;
    let passes = check_passes(passes)?;
    let pool = pool_with(threads)?;
    let runs = item_runs(cache, layer, tables, pool.current_num_threads())?;
    let total: usize = runs.iter().flatten().map(|[c, s]| c.len() + s.len()).sum();
    if total < 1 << 20 {
        return Err(invalid!("block_tables and seq_lens read {total} bytes, the probe needs at least 1 MiB"));
    }
    let bytes = cache.bytes();
    let mut best = f64::INFINITY;
    for _ in 0..passes {
        let next = AtomicUsize::new(0);
        let pieces = Mutex::new(Vec::new());
        let t = Instant::now();
        run_workers(&pool, runs.len(), || {
            let t0 = thread_cpu_seconds();
            let mut sum = 0u32;
            while let Some(item) = runs.get(next.fetch_add(1, Ordering::Relaxed)) {
                sum = sum.wrapping_add(read_item(bytes, item));
            }
            let secs = thread_cpu_seconds() - t0;
            black_box(sum);
            pieces.lock().unwrap_or_else(|e| e.into_inner()).push((rayon::current_thread_index(), secs));
        });
        let wall = t.elapsed().as_secs_f64();
        let secs = match clock {
            Clock::Wall => wall,
            Clock::Cpu => slowest_thread(pieces.into_inner().unwrap_or_else(|e| e.into_inner())),
        };
        best = best.min(secs.max(1e-9));
    }
    Ok(total as f64 / best)
}

/// Per work item of a decode over `tables` with `threads` threads (all KV heads per
/// item, every key visible), its blocks' byte runs in [`KvCache::bytes`] (codes, scales)
/// in reading order; longest item first.
fn item_runs(cache: &KvCache, layer: usize, tables: &SeqTables, threads: usize) -> Result<Vec<Vec<[Range<usize>; 2]>>> {
    let bs = cache.shape().block_size;
    let vis = tables.select(|_, len, r| visible_keys(len, None, 0, r))?;
    let items = plan(&vis, tables.len(), bs, 1, threads, None);
    let mut runs: Vec<Vec<[Range<usize>; 2]>> = Vec::with_capacity(items.len());
    for it in &items {
        let blocks = &vis.blocks()[it.blocks.clone()];
        runs.push(blocks.iter().map(|&b| cache.block_bytes(layer, b as usize)).collect::<Result<_>>()?);
    }
    runs.sort_by_key(|r| std::cmp::Reverse(r.len()));
    Ok(runs)
}

/// The wrapping word sum of one item's blocks, each block's codes run then its scales
/// run. No software prefetch: prefetching the next block's codes into L2 while summing
/// one (1 KiB or 4 KiB of lines per 1 KiB or 4 KiB summed) read 0.96x and 0.90x the rate
/// of plain sums at 1 thread, 0.89x and 0.85x at 2 (`docs/experiments.md`, "Decode
/// attention: prefetch").
fn read_item(bytes: &[u8], blocks: &[[Range<usize>; 2]]) -> u32 {
    blocks.iter().fold(0u32, |sum, [codes, scales]| {
        sum.wrapping_add(sum_words(&bytes[codes.clone()])).wrapping_add(sum_words(&bytes[scales.clone()]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{DType, KvShape};

    fn cache(dtype: DType, layers: usize) -> KvCache {
        let shape = KvShape { num_layers: layers, num_blocks: 12, block_size: 16, num_kv_heads: 2, head_dim: 8 };
        KvCache::new(shape, dtype).unwrap()
    }

    /// Writing one token of block `b` changes bytes inside `block_bytes(layer, b)` only,
    /// and writing every slot of it covers its codes (int8: and scales) whole.
    #[test]
    fn block_bytes_are_where_a_blocks_writes_land() {
        for dtype in [DType::F32, DType::BF16, DType::I8, DType::E4M3, DType::E5M2] {
            let mut c = cache(dtype, 2);
            let (hk, d, bs) = (2, 8, 16);
            for (layer, b) in [(0, 0), (1, 5), (1, 11)] {
                let before = c.bytes().to_vec();
                let slots: Vec<i64> = (0..bs as i64).map(|t| b as i64 * bs as i64 + t).collect();
                let x: Vec<f32> = (0..bs * hk * d).map(|i| 1.0 + (i % 7) as f32).collect();
                c.write(layer, &x, &x, &slots).unwrap();
                let [codes, scales] = c.block_bytes(layer, b).unwrap();
                let changed: Vec<usize> = (0..before.len()).filter(|&i| before[i] != c.bytes()[i]).collect();
                let inside = |i: &usize| codes.contains(i) || scales.contains(i);
                let outside: Vec<_> = changed.iter().filter(|i| !inside(i)).collect();
                // fp8 calibrates the layer's scales on its first write: those sit outside.
                let per_layer = c.scale_layout().count * 4;
                assert!(outside.len() <= if dtype.scale_kind() == crate::kv::elem::ScaleKind::PerHead { per_layer } else { 0 },
                        "{dtype:?} layer {layer} block {b}: {} bytes changed outside", outside.len());
                assert_eq!(codes.len(), 2 * hk * bs * d * dtype.size());
                // Every code and scale of the block is non-zero after the write.
                assert!(c.bytes()[codes.clone()].chunks(dtype.size()).all(|e| e.iter().any(|&x| x != 0)), "{dtype:?}");
                let want_scales = if dtype == DType::I8 { 2 * hk * bs * 4 } else { 0 };
                assert_eq!(scales.len(), want_scales, "{dtype:?}");
                assert!(c.bytes()[scales].chunks(4).all(|e| e.iter().any(|&x| x != 0)), "{dtype:?}");
            }
            assert!(c.block_bytes(2, 0).is_err() && c.block_bytes(0, 12).is_err());
        }
    }

    /// The probe reads each visible block of each sequence once, in table order within
    /// the sequence, and nothing else.
    #[test]
    fn the_probe_reads_the_tables_blocks_in_order() {
        let c = cache(DType::I8, 2);
        let table = [3i64, 7, 1, -1, 9, 0, 11, 2];
        let t = SeqTables::padded(&table, 4, &[40, 64], 16, 12).unwrap();
        for threads in [1, 2, 4] {
            let runs = item_runs(&c, 1, &t, threads).unwrap();
            let mut got: Vec<Vec<usize>> = runs
                .iter()
                .map(|item| item.iter().map(|[codes, _]| (0..12).find(|&b| c.block_bytes(1, b).unwrap()[0] == *codes).unwrap()).collect())
                .collect();
            got.sort();
            // Sequences of 3 and 4 blocks; a thread's share is too small to split them.
            assert_eq!(got, vec![vec![3, 7, 1], vec![9, 0, 11, 2]], "{threads} threads");
        }
        assert!(item_runs(&c, 1, &SeqTables::padded(&[3, 12], 2, &[20], 16, 12).unwrap(), 1).is_err());
    }

    #[test]
    fn small_calls_and_bad_arguments_are_refused() {
        let c = cache(DType::I8, 1);
        let t = SeqTables::padded(&[0, 1], 2, &[32], 16, 12).unwrap();
        assert!(decode_read_bandwidth(&c, 0, &t, Some(1), Some(1), Clock::Wall).is_err()); // < 1 MiB
        assert!(decode_read_bandwidth(&c, 1, &t, Some(1), Some(1), Clock::Wall).is_err());
        assert!(decode_read_bandwidth(&c, 0, &t, Some(1), Some(0), Clock::Wall).is_err());
    }

    #[test]
    fn a_large_call_reads_at_a_finite_positive_rate() {
        let shape = KvShape { num_layers: 1, num_blocks: 64, block_size: 16, num_kv_heads: 8, head_dim: 128 };
        let c = KvCache::new(shape, DType::I8).unwrap();
        let table: Vec<i64> = (0..64).rev().collect();
        let t = SeqTables::padded(&table, 32, &[512, 512], 16, 64).unwrap();
        for threads in [1, 2] {
            let r = decode_read_bandwidth(&c, 0, &t, Some(threads), Some(2), Clock::Wall).unwrap();
            assert!(r.is_finite() && r > 0.0);
        }
    }
}
