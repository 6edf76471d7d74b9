//! AVX-512 BF16 scores (`bf16_scores=True` on a bf16 cache): `vdpbf16ps` on the query
//! rounded to bf16, plugged into the tile loop of [`super::avx512`] (softmax, `P V`
//! and prefetch are that path's, unchanged).
//!
//! `vdpbf16ps` multiplies bf16 pairs and adds both products to an f32 lane. Here lane
//! `t` of the K operand holds the pair (K[i][t], K[i+1][t]) of two dimension rows of
//! the dimension-major tile, interleaved by one word permute: from one 64-byte load of
//! both rows when they are adjacent (block size 16), else from two masked 32-byte loads.
//! The query operand is the pair (q[i], q[i+1]) of each head, broadcast as one 32-bit
//! element. So one instruction does the work of two f32 FMAs and the two K-row
//! widenings, for up to 4 heads per K pair. An odd `head_dim`'s last row pairs with 0.
//!
//! Accuracy: products of two bf16 are exact in f32; the instruction accumulates in f32
//! with round-to-nearest-even, treats bf16 subnormal inputs as zero and flushes
//! subnormal results (both below 1.2e-38 in magnitude, negligible against any score).
//! The scores are those of the rounded query in f32 arithmetic, summed in another order
//! than the FMA paths (which compute the same `bf16_scores` semantics with f32 FMAs on
//! the rounded query), so the paths agree within f32 rounding, not bitwise. The
//! factor `scale * log2(e)` is applied to the finished scores, so the bf16 operand is
//! the rounded query itself.

// Register tiles are small fixed arrays indexed by head: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx512::{chunk_mask, run_with, Prefetcher, Scores};
use super::isa::cpu_features;
#[cfg(test)]
use super::isa::AVX512_WITHOUT_BF16;
use super::work::{Chunk, Partial, Work};
use crate::kv::{DType, Elem};

/// Whether this CPU has `vdpbf16ps` (the AVX-512 path's features are checked apart).
pub(crate) fn supported() -> bool {
    #[cfg(test)]
    if AVX512_WITHOUT_BF16.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    cpu_features().contains(&"avx512bf16")
}

/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512bf16, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")]
pub(crate) unsafe fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    // `decode_attention` rejects `bf16_scores` on other caches and sets `q_bf16` with it.
    assert!(E::DTYPE == DType::BF16, "vdpbf16ps scores need a bf16 cache");
    let (q, factor) = w.q_bf16.expect("bf16 query pairs");
    // SAFETY: this function's features are those of `run_with` and of `Dot`'s scores.
    unsafe { run_with(w, p, &Dot { q, factor }) }
}

/// `vdpbf16ps` scores from the item's bf16 query pairs (`Work::q_bf16`).
///
/// Its `scores` stays an out-of-line call per chunk and head tile: the intrinsic needs
/// the `avx512bf16` target feature, which the shared tile loop (also the exact path's)
/// is compiled without, so LLVM does not inline it there. Inlining it through `asm!`
/// (with the query pair broadcast from memory, as LLVM does for the intrinsic) measured
/// slower: (a) from cache (`--resident 16`, 1 thread) 2.86-2.94 ms against 2.72-2.82 ms,
/// four alternating runs each.
struct Dot<'a> {
    q: &'a [u32],
    factor: f32,
}

/// Word `w` of the K operand: lane `w / 2`, low word from row i, high word from row
/// i + 1. Adjacent rows (one 32-word load): row i + 1 starts at word 16; two loads
/// (`permutex2var`): row i + 1 is the second operand, words from 32. Only words 0..16 of
/// each 256-bit load are selected, so the undefined upper halves of the 256-to-512-bit
/// casts never reach a lane.
const PAIR_ADJACENT: [i16; 32] = pair_index(16);
const PAIR_TWO: [i16; 32] = pair_index(32);

const fn pair_index(second: i16) -> [i16; 32] {
    let mut x = [0i16; 32];
    let mut w = 0;
    while w < 32 {
        x[w] = (w / 2) as i16 + if w % 2 == 1 { second } else { 0 };
        w += 1;
    }
    x
}

/// The 512-bit bf16-pair vector type of the intrinsic, from integer lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 64 bytes of plain data; every bit pattern is a valid value.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

impl<E: Elem> Scores<E> for Dot<'_> {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")]
    unsafe fn scores<const H: usize>(&self, c: &Chunk<E>, qh: usize, next_k: Option<&[E]>) -> [__m512; H] {
        let (d, bs, mask) = (c.d, c.bs, chunk_mask(c));
        let pairs = d.div_ceil(2);
        // Rows are bs elements apart, the chunk's tokens c0 .. c0 + lanes of each: the
        // last unmasked element read is (d - 1) * bs + c0 + lanes - 1 < d * bs. Query
        // pair j * pairs + i / 2 < H * pairs past qp.
        assert!(c.kt.len() >= d * bs && c.c0 + c.lanes <= bs && self.q.len() >= (qh + H) * pairs);
        let qp = self.q[qh * pairs..].as_ptr();
        let kp = c.kt.as_ptr().wrapping_add(c.c0).cast::<i16>();
        // One 64-byte load covers rows i and i + 1 when they are adjacent (block size 16):
        // word t is token c0 + t of row i, word 16 + t the same token of row i + 1, for
        // any c0 (a window's first chunk starts inside its block); the mask repeats the
        // lane mask.
        let adjacent = bs == 16;
        let mask2 = mask as u32 | (mask as u32) << 16;
        // SAFETY: both tables hold exactly 32 i16.
        let (idx_adj, idx_two) =
            unsafe { (_mm512_loadu_epi16(PAIR_ADJACENT.as_ptr()), _mm512_loadu_epi16(PAIR_TWO.as_ptr())) };
        // K pair of rows i, i + 1 (i + 1 < d).
        let pair = |i: usize| -> __m512i {
            // SAFETY: rows i, i + 1 < d; unmasked words are the chunk's tokens of those
            // rows (adjacent: words 16..32 are row i + 1 itself, as bs == 16), inside
            // kt by the assert above; masked-off words are not accessed.
            unsafe {
                if adjacent {
                    _mm512_permutexvar_epi16(idx_adj, _mm512_maskz_loadu_epi16(mask2, kp.add(i * bs)))
                } else {
                    let a = _mm256_maskz_loadu_epi16(mask, kp.add(i * bs));
                    let b = _mm256_maskz_loadu_epi16(mask, kp.add((i + 1) * bs));
                    _mm512_permutex2var_epi16(_mm512_castsi256_si512(a), idx_two, _mm512_castsi256_si512(b))
                }
            }
        };
        // Query pair i / 2 of head j, broadcast.
        // SAFETY: j < H and i / 2 < pairs: inside the item's pairs (assert above).
        let qpair = |j: usize, i: usize| bh(_mm512_set1_epi32(unsafe { *qp.add(j * pairs + i / 2) } as i32));
        let mut pf = Prefetcher::new(next_k, d / 2);
        // Two partial sums per head (alternate pairs) to hide the instruction's latency.
        let mut s0 = [_mm512_setzero_ps(); H];
        let mut s1 = [_mm512_setzero_ps(); H];
        let mut i = 0;
        while i + 4 <= d {
            let (k0, k1) = (bh(pair(i)), bh(pair(i + 2)));
            pf.step();
            pf.step();
            for j in 0..H {
                s0[j] = _mm512_dpbf16_ps(s0[j], k0, qpair(j, i));
                s1[j] = _mm512_dpbf16_ps(s1[j], k1, qpair(j, i + 2));
            }
            i += 4;
        }
        if i + 2 <= d {
            let k0 = bh(pair(i));
            pf.step();
            for j in 0..H {
                s0[j] = _mm512_dpbf16_ps(s0[j], k0, qpair(j, i));
            }
            i += 2;
        }
        if i < d {
            // The last row of an odd head_dim, zero-extended: lane t = (K[i][t], +0),
            // against the query pair (q[i], +0).
            // SAFETY: row i < d, lanes masked to the chunk.
            let k0 = bh(_mm512_cvtepu16_epi32(unsafe { _mm256_maskz_loadu_epi16(mask, kp.add(i * bs)) }));
            for j in 0..H {
                s1[j] = _mm512_dpbf16_ps(s1[j], k0, qpair(j, i));
            }
        }
        let f = _mm512_set1_ps(self.factor);
        std::array::from_fn(|j| _mm512_mul_ps(_mm512_add_ps(s0[j], s1[j]), f))
    }
}
