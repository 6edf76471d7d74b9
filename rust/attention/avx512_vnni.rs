//! AVX-512 VNNI scores (an int8 query, `Precision { q: I8, .. }`, on an int8 cache):
//! exact integer dot products of the int8 query ([`super::query::QueryI8`]) with the K
//! codes by `vpdpbusd`, plugged into the tile loop of [`super::simd`] (softmax, `P V`
//! and prefetch are that path's, unchanged).
//!
//! `vpdpbusd acc, a, b` multiplies the four unsigned bytes of each 32-bit lane of `a` by
//! the four signed bytes of the same lane of `b` and adds the four products to the lane's
//! i32, without saturation. Lane `t` must hold token `t`'s codes of four dimensions, so
//! four K rows (16 tokens each of the dimension-major tile) are transposed as 4 x 4 byte
//! blocks: one `vpermd` gathers each row's 4-token dword into the lane of those tokens,
//! one in-lane `vpshufb` interleaves the rows. The rows come from one 64-byte load when
//! they are adjacent (block size 16, any chunk offset: the lane mask repeats per row),
//! else from four masked 16-byte loads. The K codes are the unsigned operand, biased by
//! 128 (one `vpxord`, shared by the heads), the query codes the signed one, broadcast four
//! at a time; the bias adds `128 * sum_i q_i` per head, subtracted at the end
//! (`QueryI8::rows`). So one instruction does 64 multiply-adds, and a 64-byte K load
//! feeds up to 4 heads for 3 shuffle-class instructions.
//!
//! Exactness: every lane sum is at most `head_dim * 255 * 127 < 2^31` for the largest
//! `head_dim` a cache allows (65,536), so the integer dot product is exact; it becomes
//! f32 (one rounding, relative 2^-24) and is multiplied by the row's factor, then by the
//! token's K scale in the tile loop. The result is the score of the quantized query on
//! the stored codes, as the paths without VNNI compute it with f32 FMAs on the
//! dequantized quantized query (within f32 rounding, not bitwise).

// Register tiles are small fixed arrays indexed by head: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::lanes::{Avx512, Lanes};
use super::simd::{run_with, FloatPv, Scores};
use super::avx512_cvt::{chunk_mask};
use super::prefetch::{Prefetcher, Stream};
use super::query::QueryI8;
use super::work::{Chunk, Partial, Work, FREE_DOTS};
use crate::kv::{DType, Elem};

/// An int8 query (`Precision { q: I8, .. }`) on the AVX-512 path.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512vnni, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(crate) unsafe fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    // `decode_attention` rejects an int8 query on other caches and sets `q_i8` with it;
    // the caller routes here only with `q_i8`.
    assert!(E::DTYPE == DType::I8, "vpdpbusd needs an int8 cache");
    let q = w.q_i8.expect("an int8 query precision sets the int8 query");
    assert!(q.rows.len() * w.shape.head_dim.div_ceil(4) == q.codes.len());
    // SAFETY: this function's features are those of `run_with` and of `Dot`'s scores
    // (`FloatPv` needs fewer).
    unsafe { run_with::<Avx512, E, _, _, true>(Avx512::assume(), w, p, &Dot { q }, &FloatPv) }
}

/// `vpdpbusd` scores from the item's int8 query rows.
struct Dot<'a> {
    q: QueryI8<'a>,
}

/// `vpermd` indices: dword `4 L + r` of the result is dword `4 r + L` of the load (row
/// `r`'s tokens `4 L .. 4 L + 4` into lane `L`).
const GATHER: [i32; 16] = {
    let mut x = [0; 16];
    let mut i = 0;
    while i < 16 {
        x[i] = (4 * (i % 4) + i / 4) as i32;
        i += 1;
    }
    x
};

/// `vpshufb` indices (per 128-bit lane): byte `4 j + r` is byte `4 r + j` (the 4 x 4
/// transpose of row-major 4-token dwords into token-major 4-row dwords).
const TRANSPOSE: [i8; 64] = {
    let mut x = [0; 64];
    let mut i = 0;
    while i < 64 {
        let b = i % 16;
        x[i] = (4 * (b % 4) + b / 4) as i8;
        i += 1;
    }
    x
};

impl<E: Elem> Scores<Avx512, E> for Dot<'_> {
    // The `vpdpbusd` loop is a quarter of `P V`'s time.
    const K_IN_SCORES: bool = false;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    unsafe fn scores<const H: usize>(&self, _: Avx512, c: &Chunk<E>, qh: usize, next_k: Stream<E>) -> [__m512; H] {
        // One loop per load form, so the quad loop does not test it per quad.
        // SAFETY: this function's features are `dot`'s.
        unsafe {
            if c.bs == 16 {
                self.dot::<E, H, true>(c, qh, next_k)
            } else {
                self.dot::<E, H, false>(c, qh, next_k)
            }
        }
    }
}

impl Dot<'_> {
    /// [`Scores::scores`] with `ADJACENT` = (block size 16: four K rows are one 64-byte
    /// run).
    ///
    /// # Safety
    /// The CPU must support the features below.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    unsafe fn dot<E: Elem, const H: usize, const ADJACENT: bool>(&self, c: &Chunk<E>, qh: usize, next_k: Stream<E>) -> [__m512; H] {
        let (d, bs, mask) = (c.d, c.bs, chunk_mask(c));
        let quads = d.div_ceil(4);
        // Rows are bs codes apart, the chunk's tokens c0 .. c0 + lanes of each: the last
        // unmasked code read is (d - 1) * bs + c0 + lanes - 1 < d * bs. Query words
        // j * quads + i / 4 < H * quads past qp; rows qh .. qh + H exist.
        assert!(c.kt.len() >= d * bs && c.c0 + c.lanes <= bs);
        assert!(self.q.codes.len() >= (qh + H) * quads && self.q.rows.len() >= qh + H);
        let qp = self.q.codes[qh * quads..].as_ptr();
        let kp = c.kt.as_ptr().wrapping_add(c.c0).cast::<i8>();
        assert!(!ADJACENT || bs == 16);
        let m = mask as u64;
        let mask4 = m | m << 16 | m << 32 | m << 48;
        // SAFETY: both tables hold exactly 64 bytes.
        let (gather, transpose) =
            unsafe { (_mm512_loadu_si512(GATHER.as_ptr().cast()), _mm512_loadu_si512(TRANSPOSE.as_ptr().cast())) };
        let bias = _mm512_set1_epi8(-128);
        // Rows i .. i + rows (rows = min(4, d - i); past them, up to 4, rows read as 0 and meet
        // query code 0), lane t = the four codes of token c0 + t, plus 128 each.
        let quad = |i: usize, rows: usize| -> __m512i {
            debug_assert_eq!(rows, (d - i).min(4));
            // SAFETY: rows i + r < d only, lanes masked to the chunk's tokens of each
            // (adjacent: bytes 16 r .. 16 r + 16 are row i + r itself, as bs == 16),
            // inside kt by the assert above; masked-off bytes are not accessed.
            let x = unsafe {
                if ADJACENT {
                    let rmask = if rows >= 4 { u64::MAX } else { (1u64 << (16 * rows)) - 1 };
                    _mm512_maskz_loadu_epi8(mask4 & rmask, kp.wrapping_add(i * 16))
                } else {
                    let row = |r: usize| {
                        let mr = if r < rows { mask } else { 0 };
                        _mm_maskz_loadu_epi8(mr, kp.wrapping_add((i + r) * bs))
                    };
                    let x = _mm512_castsi128_si512(row(0));
                    let x = _mm512_inserti32x4::<1>(x, row(1));
                    let x = _mm512_inserti32x4::<2>(x, row(2));
                    _mm512_inserti32x4::<3>(x, row(3))
                }
            };
            if FREE_DOTS {
                return _mm512_xor_si512(x, bias);
            }
            let x = _mm512_shuffle_epi8(_mm512_permutexvar_epi32(gather, x), transpose);
            _mm512_xor_si512(x, bias)
        };
        // Query codes 4 k .. 4 k + 4 of head j, broadcast.
        // SAFETY: j < H and k < quads: inside the item's words (assert above).
        let qword = |j: usize, k: usize| _mm512_set1_epi32(unsafe { *qp.add(j * quads + k) } as i32);
        let mut pf = Prefetcher::<true>::with(next_k, quads.div_ceil(2));
        // Two partial sums per head (alternate quads) to hide the instruction's latency.
        let mut s0 = [_mm512_setzero_si512(); H];
        let mut s1 = [_mm512_setzero_si512(); H];
        // Pairs of whole quads (their row mask a constant), then at most one whole and one
        // partial quad.
        let mut k = 0;
        while k + 2 <= d / 4 {
            let (k0, k1) = (quad(4 * k, 4), quad(4 * k + 4, 4));
            pf.step();
            if FREE_DOTS {
                (s0[0], s1[0]) = (_mm512_xor_si512(s0[0], k0), _mm512_xor_si512(s1[0], k1));
            } else {
                for j in 0..H {
                    s0[j] = _mm512_dpbusd_epi32(s0[j], k0, qword(j, k));
                    s1[j] = _mm512_dpbusd_epi32(s1[j], k1, qword(j, k + 1));
                }
            }
            k += 2;
        }
        while k < quads {
            let k0 = quad(4 * k, (d - 4 * k).min(4));
            for j in 0..H {
                s0[j] = _mm512_dpbusd_epi32(s0[j], k0, qword(j, k));
            }
            k += 1;
        }
        // A loop, not `array::from_fn`: its closure would be an out-of-line call (closures
        // take the target features, `from_fn` does not).
        let mut out = [_mm512_setzero_ps(); H];
        for j in 0..H {
            let (f, b) = self.q.rows[qh + j];
            let dot = _mm512_sub_epi32(_mm512_add_epi32(s0[j], s1[j]), _mm512_set1_epi32(b));
            out[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(f));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transpose tables move token `t` of row `r` (byte `16 r + t` of a 64-byte load)
    /// to byte `r` of dword `t`.
    #[test]
    fn gather_then_transpose_puts_each_tokens_four_rows_in_its_lane() {
        for r in 0..4 {
            for t in 0..16 {
                // After vpermd: dword 4 L + r' holds load dword 4 r' + L.
                let (lane, j) = (t / 4, t % 4);
                let after_gather = |dw: usize, byte: usize| 4 * GATHER[dw] as usize + byte;
                // After vpshufb: byte 4 j + r of lane L is byte TRANSPOSE[4 j + r] of lane L.
                let src_in_lane = TRANSPOSE[4 * j + r] as usize;
                let src = after_gather(4 * lane + src_in_lane / 4, src_in_lane % 4);
                assert_eq!(src, 16 * r + t, "row {r} token {t}");
            }
        }
    }
}
