//! Which K layout inside a (block, head) tile scores fastest: dimension-major
//! `[d][block_size]` (tokens in SIMD lanes: one broadcast-FMA per dimension and head, no
//! horizontal sums), as `KvCache` stores it, or token-major `[block_size][d]` (a dot
//! product per token and head, then a horizontal sum).
//!
//! Compute side only: 4 query heads (GQA g = 4), head_dim 128, 16-token tiles, f32, a
//! working set of 32 tiles (256 KiB, L2-resident) so memory does not hide the difference.
//! The read-pattern side (8 KiB tiles per head vs whole 64 KiB blocks) is measured on the
//! real kernel by `benches/bench_layout.py`.
//!
//! Run: `cargo bench --bench layout [-- --sample-count N]` (divan). An iteration scores
//! all 32 tiles once; the item rate is tiles per second. Off x86-64, or without
//! AVX-512, the benches register no timing (divan warns) and say why.

#![allow(clippy::needless_range_loop)]

use std::hint::black_box;

use divan::counter::ItemsCount;
use divan::Bencher;

const D: usize = 128;
const BS: usize = 16;
const H: usize = 4;
const TILES: usize = 32;

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::*;
    use std::arch::x86_64::*;

    /// Dimension-major: `k[i * BS + t]`.
    #[target_feature(enable = "avx512f,fma")]
    pub fn dim_major(k: &[f32], q: &[f32], out: &mut [f32; H * BS]) {
        assert!(k.len() >= D * BS && q.len() >= H * D);
        let mut s0 = [_mm512_setzero_ps(); H];
        let mut s1 = [_mm512_setzero_ps(); H];
        for i in (0..D).step_by(2) {
            // SAFETY: i + 1 < D, rows of BS = 16 floats inside k (asserted).
            let (k0, k1) = unsafe { (_mm512_loadu_ps(k.as_ptr().add(i * BS)), _mm512_loadu_ps(k.as_ptr().add((i + 1) * BS))) };
            for j in 0..H {
                s0[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j * D + i]), k0, s0[j]);
                s1[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j * D + i + 1]), k1, s1[j]);
            }
        }
        for j in 0..H {
            // SAFETY: out holds H * 16 floats.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(j * BS), _mm512_add_ps(s0[j], s1[j])) };
        }
    }

    /// Token-major: `k[t * D + i]`; q rows stay in registers across tokens.
    #[target_feature(enable = "avx512f,fma")]
    pub fn token_major(k: &[f32], q: &[f32], out: &mut [f32; H * BS]) {
        assert!(k.len() >= D * BS && q.len() >= H * D);
        for t in 0..BS {
            let mut acc = [_mm512_setzero_ps(); H];
            for u in 0..D / 16 {
                // SAFETY: t * D + 16u + 15 < BS * D (asserted).
                let kv = unsafe { _mm512_loadu_ps(k.as_ptr().add(t * D + 16 * u)) };
                for j in 0..H {
                    // SAFETY: j * D + 16u + 15 < H * D (asserted).
                    let qv = unsafe { _mm512_loadu_ps(q.as_ptr().add(j * D + 16 * u)) };
                    acc[j] = _mm512_fmadd_ps(qv, kv, acc[j]);
                }
            }
            for j in 0..H {
                out[j * BS + t] = _mm512_reduce_add_ps(acc[j]);
            }
        }
    }
}

fn main() {
    divan::main();
}

/// The tiles and the query of both layouts (their values differ only in where they sit).
fn inputs() -> (Vec<f32>, Vec<f32>) {
    let k: Vec<f32> = (0..TILES * D * BS).map(|x| ((x * 7919) % 1000) as f32 * 1e-3).collect();
    let q: Vec<f32> = (0..H * D).map(|x| ((x * 31) % 100) as f32 * 1e-2).collect();
    (k, q)
}

/// One tile's scores: `(k, q, out)`.
type ScoreTile = unsafe fn(&[f32], &[f32], &mut [f32; H * BS]);

/// The two layouts' score functions where this CPU runs them (x86-64 with AVX-512).
fn layouts() -> Option<[ScoreTile; 2]> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        return Some([imp::dim_major, imp::token_major]);
    }
    None
}

/// Scores of 4 heads x 16 tokens x d 128 over the 32 tiles in layout `which` (0:
/// dimension-major, 1: token-major).
fn score_tiles(bencher: Bencher, which: usize) {
    let Some(tiles) = layouts() else {
        eprintln!("layout: needs x86-64 with AVX-512; skipped");
        return;
    };
    let tile = tiles[which];
    let (k, q) = inputs();
    let mut out = [0f32; H * BS];
    bencher.counter(ItemsCount::new(TILES)).bench_local(|| {
        for t in 0..TILES {
            // SAFETY: `layouts` gave the functions only where the CPU supports avx512f;
            // fma comes with every AVX-512 CPU.
            unsafe { tile(&k[t * D * BS..], &q, &mut out) };
            black_box(&out);
        }
    });
}

/// Dimension-major K, as `KvCache` stores it.
#[divan::bench]
fn dimension_major(bencher: Bencher) {
    score_tiles(bencher, 0);
}

/// Token-major K.
#[divan::bench]
fn token_major(bencher: Bencher) {
    score_tiles(bencher, 1);
}
