//! AVX-512 BF16 scores (a bf16 query, `Precision { q: BF16, .. }`, on a bf16 cache):
//! `vdpbf16ps` on the query rounded to bf16, plugged into the tile loop of
//! [`super::simd`] (softmax, `P V` and prefetch are that path's, unchanged).
//!
//! `vdpbf16ps` multiplies bf16 pairs and adds both products to an f32 lane. Here lane
//! `t` of the K operand holds the pair (K\[i\]\[t\], K\[i+1\]\[t\]) of two dimension rows of
//! the dimension-major tile, interleaved by one word permute: from one 64-byte load of
//! both rows when they are adjacent (block size 16), else from two masked 32-byte loads.
//! The query operand is the pair (q\[i\], q\[i+1\]) of each head, broadcast as one 32-bit
//! element. So one instruction does the work of two f32 FMAs and the two K-row
//! widenings, for up to 4 heads per K pair. An odd `head_dim`'s last row pairs with 0.
//!
//! Accuracy: products of two bf16 are exact in f32; the instruction accumulates in f32
//! with round-to-nearest-even, treats bf16 subnormal inputs as zero and flushes
//! subnormal results (both below 1.2e-38 in magnitude, negligible against any score).
//! The scores are those of the rounded query in f32 arithmetic, summed in another order
//! than the FMA paths (which compute the same bf16-query semantics with f32 FMAs on
//! the rounded query), so the paths agree within f32 rounding, not bitwise. The
//! factor `scale * log2(e)` is applied to the finished scores, so the bf16 operand is
//! the rounded query itself.
//!
//! fp8 caches (e4m3, e5m2) take the same instruction: every fp8 code is exactly a bf16
//! (3 or 2 mantissa bits, 4 or 5 exponent bits, subnormals included, become bf16
//! normals), so the codes are widened to bf16 in registers ([`Fp8Dot`]: two `vpermi2b`
//! 128-entry byte tables, low and high byte of the bf16, indexed by the code's 7 low bits,
//! the sign or'ed in, one `vpermt2b` to interleave two rows into pairs: 4 instructions
//! per 32 codes) and the only rounding is the query's, as for bf16. The K scale
//! multiplies the finished scores (the tile loop's), so the bound of a bf16 query
//! carries over to the dequantized keys. The byte permutes need `avx512vbmi`; without
//! it the exact AVX-512 kernel runs on the rounded query.

// Register tiles are small fixed arrays indexed by head: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::lanes::{Avx512, Lanes};
use super::simd::{run_with, FloatPv, Scores};
use super::avx512_cvt::{chunk_mask};
use super::work::load_factor;
use super::prefetch::{Prefetcher, Stream};
use super::work::{Chunk, Partial, Work};
use crate::kv::{DType, Elem};

/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512bf16, fma and f16c, and
/// avx512vbmi too for fp8 caches.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")]
pub(crate) unsafe fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    // `decode_attention` rejects a bf16 query on other caches and sets `q_bf16` with it.
    let (q, factor) = w.q_bf16.expect("bf16 query pairs");
    match E::DTYPE {
        // SAFETY: this function's features are those of `run_with` and of `Dot`'s scores.
        DType::BF16 => unsafe { run_with::<Avx512, E, _, _, true>(Avx512::assume(), w, p, &Dot { q, factor }, &FloatPv) },
        DType::E4M3 | DType::E5M2 => {
            // `load_factor`: the tile loop's K scale carries the exact path's factor
            // (2^8 for e4m3), which these scores of the true code values must not.
            let dot = Fp8Dot { q, factor: factor / load_factor(E::DTYPE), tables: Fp8Tables::of(E::DTYPE) };
            // SAFETY: the caller's features include avx512vbmi for fp8 caches.
            unsafe { run_fp8(w, p, &dot) }
        }
        _ => panic!("vdpbf16ps scores need a bf16 or fp8 cache"),
    }
}

/// # Safety
/// The CPU must support the features of [`run`] and avx512vbmi.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,fma,f16c")]
unsafe fn run_fp8<E: Elem>(w: &Work<E>, p: &mut Partial, dot: &Fp8Dot) {
    // SAFETY: this function's features are those of `run_with` and of `Fp8Dot`'s scores.
    unsafe { run_with::<Avx512, E, _, _, true>(Avx512::assume(), w, p, dot, &FloatPv) }
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

impl<E: Elem> Scores<Avx512, E> for Dot<'_> {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")]
    unsafe fn scores<const H: usize>(&self, _: Avx512, c: &Chunk<E>, qh: usize, next_k: Stream<E>) -> [__m512; H] {
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
        let mut pf = Prefetcher::<true>::with(next_k, d / 2);
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
        // A loop, not `array::from_fn`: its closure does not inherit the target features,
        // so each element was an out-of-line call.
        let f = _mm512_set1_ps(self.factor);
        let mut r = [_mm512_setzero_ps(); H];
        for j in 0..H {
            r[j] = _mm512_mul_ps(_mm512_add_ps(s0[j], s1[j]), f);
        }
        r
    }
}

/// The bf16 bits of the fp8 codes with magnitude `0..128` (the sign is bit 7 of a code,
/// bit 15 of its bf16): low and high bytes apart, one 128-entry `vpermi2b` table each.
#[repr(C, align(64))]
pub(crate) struct Fp8Tables {
    lo: [u8; 128],
    hi: [u8; 128],
}

impl Fp8Tables {
    const fn new(ebits: u32, mbits: u32) -> Self {
        let mut bits = [0u16; 128];
        let mut c = 0;
        while c < 128 {
            bits[c] = fp8_bf16_bits(c as u8, ebits, mbits);
            c += 1;
        }
        Self::from_bits(&bits)
    }

    /// The tables of the 16-bit words `bits` (one per magnitude), low and high bytes apart.
    pub(crate) const fn from_bits(bits: &[u16; 128]) -> Self {
        let mut t = Fp8Tables { lo: [0; 128], hi: [0; 128] };
        let mut c = 0;
        while c < 128 {
            t.lo[c] = bits[c] as u8;
            t.hi[c] = (bits[c] >> 8) as u8;
            c += 1;
        }
        t
    }

    /// The low-byte and the high-byte table, each as the two halves `vpermi2b` takes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn registers(&self) -> ([__m512i; 2], [__m512i; 2]) {
        // SAFETY: each load reads 64 aligned bytes (the struct is 64-byte aligned) of a
        // 128-byte table.
        let ld = |p: *const u8| unsafe { _mm512_load_si512(p.cast()) };
        ([ld(self.lo.as_ptr()), ld(self.lo[64..].as_ptr())], [ld(self.hi.as_ptr()), ld(self.hi[64..].as_ptr())])
    }

    fn of(dt: DType) -> &'static Self {
        static E4M3: Fp8Tables = Fp8Tables::new(4, 3);
        static E5M2: Fp8Tables = Fp8Tables::new(5, 2);
        match dt {
            DType::E4M3 => &E4M3,
            DType::E5M2 => &E5M2,
            _ => panic!("fp8 tables of a {dt:?} cache"),
        }
    }
}

/// The bf16 bits of an fp8 code with `ebits` exponent and `mbits` mantissa bits (OCP
/// e4m3fn: the all-ones magnitude is NaN, no infinities; e5m2: IEEE-like). Exact: an fp8
/// value has at most 4 significant bits and its exponent range lies inside bf16's normal
/// range, subnormal codes included.
pub(crate) const fn fp8_bf16_bits(code: u8, ebits: u32, mbits: u32) -> u16 {
    let sign = ((code as u16) >> 7) << 15;
    let emax = (1u32 << ebits) - 1;
    let bias = (1i32 << (ebits - 1)) - 1;
    let e = (code as u32 >> mbits) & emax;
    let m = code as u32 & ((1 << mbits) - 1);
    let mag = if ebits == 4 && e == emax && m == (1 << mbits) - 1 {
        0x7fc0 // e4m3fn NaN
    } else if ebits == 5 && e == emax {
        if m == 0 {
            0x7f80 // inf
        } else {
            0x7f80 | (m << (7 - mbits)) as u16 // NaN, payload kept
        }
    } else if e == 0 && m == 0 {
        0
    } else if e == 0 {
        // m * 2^(1 - bias - mbits): normalise on m's top bit p.
        let mut p = 0;
        while m >> (p + 1) != 0 {
            p += 1;
        }
        let exp = (p + 1 - bias - mbits as i32 + 127) as u16;
        exp << 7 | ((m - (1 << p)) << (7 - p)) as u16
    } else {
        ((e as i32 - bias + 127) as u16) << 7 | (m << (7 - mbits)) as u16
    };
    sign | mag
}

/// Byte `b` of the pair vector: lane `t = b / 4` holds (bf16 of row i's code t, bf16 of
/// row i + 1's code t), low byte first; the bytes come from the low-byte lookup (index
/// `< 64`) and the high-byte lookup (`64 +`) of the 32 codes, row i's at 0..16, row i +
/// 1's at 16..32.
const INTERLEAVE: [u8; 64] = {
    let mut x = [0u8; 64];
    let mut b = 0;
    while b < 64 {
        x[b] = (b / 4) as u8 + if b % 4 >= 2 { 16 } else { 0 } + if b % 2 == 1 { 64 } else { 0 };
        b += 1;
    }
    x
};

/// `vdpbf16ps` scores of an fp8 cache: the codes widened to bf16 pairs in registers.
pub(crate) struct Fp8Dot<'a> {
    q: &'a [u32],
    /// `scale * log2(e)` over the tile loop's `load_factor`.
    factor: f32,
    tables: &'static Fp8Tables,
}

/// The registers of the widening: the two tables' halves, the interleave index and the
/// sign mask.
#[derive(Clone, Copy)]
struct Widen {
    lo: [__m512i; 2],
    hi: [__m512i; 2],
    interleave: __m512i,
    sign: __m512i,
}

impl Widen {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
    fn new(t: &Fp8Tables) -> Self {
        let (lo, hi) = t.registers();
        // SAFETY: the load reads the 64-byte index.
        let interleave = unsafe { _mm512_loadu_si512(INTERLEAVE.as_ptr().cast()) };
        Widen { lo, hi, interleave, sign: _mm512_set1_epi8(i8::MIN) }
    }

    /// The bf16 pairs of the 32 codes in bytes 0..32 of `x` (row i at 0..16, row i + 1
    /// at 16..32; the other bytes are don't-care): four instructions, the low and high
    /// bytes of each code's bf16 looked up (the 7-bit index ignores the sign), the sign
    /// or'ed into the high bytes, both interleaved into pairs.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
    fn bf16(&self, x: __m512i) -> __m512i {
        let lo = _mm512_permutex2var_epi8(self.lo[0], x, self.lo[1]);
        let hi = _mm512_permutex2var_epi8(self.hi[0], x, self.hi[1]);
        // hi | (x & sign)
        let hi = _mm512_ternarylogic_epi32::<0xf8>(hi, x, self.sign);
        _mm512_permutex2var_epi8(lo, self.interleave, hi)
    }

    /// Rows i and i + 1 of 16 codes each, adjacent (row i + 1 at byte 16 of one load).
    ///
    /// # Safety
    /// Unmasked bytes `p .. p + 32` (mask `mask | mask << 16`) inside one allocation.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
    unsafe fn adjacent(&self, p: *const u8, mask: __mmask16) -> __m512i {
        let mask2 = mask as u32 | (mask as u32) << 16;
        // SAFETY: forwarded to the caller; masked-off bytes are not accessed. The
        // undefined upper half of the cast is don't-care for `bf16`.
        self.bf16(_mm512_castsi256_si512(unsafe { _mm256_maskz_loadu_epi8(mask2, p.cast()) }))
    }

    /// Rows i (at `a`) and i + 1 (at `b`, or none: code 0, +0) of 16 codes each.
    ///
    /// # Safety
    /// Unmasked bytes `a .. a + 16` and `b .. b + 16` inside one allocation each.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
    unsafe fn two(&self, a: *const u8, b: Option<*const u8>, mask: __mmask16) -> __m512i {
        // SAFETY: forwarded to the caller; masked-off bytes are not accessed. The
        // undefined upper half of the last cast is don't-care for `bf16`.
        unsafe {
            let x = _mm_maskz_loadu_epi8(mask, a.cast());
            let y = b.map_or(_mm_setzero_si128(), |b| _mm_maskz_loadu_epi8(mask, b.cast()));
            self.bf16(_mm512_castsi256_si512(_mm256_set_m128i(y, x)))
        }
    }
}

impl<E: Elem> Scores<Avx512, E> for Fp8Dot<'_> {
    // The `vdpbf16ps` loop on one-byte codes is about half of `P V`'s time. (Not on a
    // bf16 cache, [`Dot`]: its K tiles are twice the lines, and over its `P V` loop they
    // cost 4-9% of its tokens/s.)
    const K_IN_SCORES: bool = false;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,fma,f16c")]
    unsafe fn scores<const H: usize>(&self, _: Avx512, c: &Chunk<E>, qh: usize, next_k: Stream<E>) -> [__m512; H] {
        let (d, bs, mask) = (c.d, c.bs, chunk_mask(c));
        let pairs = d.div_ceil(2);
        // One-byte codes, rows bs apart: the last unmasked byte read is (d - 1) * bs + c0
        // + lanes - 1 < d * bs. Query pair j * pairs + i / 2 < H * pairs past qp.
        assert!(std::mem::size_of::<E>() == 1, "fp8 codes are bytes");
        assert!(c.kt.len() >= d * bs && c.c0 + c.lanes <= bs && self.q.len() >= (qh + H) * pairs);
        let qp = self.q[qh * pairs..].as_ptr();
        let kp = c.kt.as_ptr().wrapping_add(c.c0).cast::<u8>();
        let wd = Widen::new(self.tables);
        let adjacent = bs == 16;
        // K pair of rows i, i + 1 (i + 1 < d).
        let pair = |i: usize| {
            // SAFETY: rows i, i + 1 < d (adjacent: bs == 16, so row i + 1 is bytes 16..32
            // of the load), lanes masked to the chunk: inside kt by the assert above.
            bh(unsafe {
                if adjacent {
                    wd.adjacent(kp.add(i * bs), mask)
                } else {
                    wd.two(kp.add(i * bs), Some(kp.add((i + 1) * bs)), mask)
                }
            })
        };
        // Query pair i / 2 of head j, broadcast.
        // SAFETY: j < H and i / 2 < pairs: inside the item's pairs (assert above).
        let qpair = |j: usize, i: usize| bh(_mm512_set1_epi32(unsafe { *qp.add(j * pairs + i / 2) } as i32));
        let mut pf = Prefetcher::<true>::with(next_k, d / 2);
        // Two partial sums per head (alternate pairs) to hide the instruction's latency.
        let mut s0 = [_mm512_setzero_ps(); H];
        let mut s1 = [_mm512_setzero_ps(); H];
        let mut i = 0;
        while i + 4 <= d {
            let (k0, k1) = (pair(i), pair(i + 2));
            pf.step();
            pf.step();
            for j in 0..H {
                s0[j] = _mm512_dpbf16_ps(s0[j], k0, qpair(j, i));
                s1[j] = _mm512_dpbf16_ps(s1[j], k1, qpair(j, i + 2));
            }
            i += 4;
        }
        if i + 2 <= d {
            let k0 = pair(i);
            pf.step();
            for j in 0..H {
                s0[j] = _mm512_dpbf16_ps(s0[j], k0, qpair(j, i));
            }
            i += 2;
        }
        if i < d {
            // The last row of an odd head_dim, paired with code 0 (+0), against (q[i], +0).
            // SAFETY: row i < d, lanes masked to the chunk.
            let k = bh(unsafe { wd.two(kp.add(i * bs), None, mask) });
            for j in 0..H {
                s1[j] = _mm512_dpbf16_ps(s1[j], k, qpair(j, i));
            }
        }
        // A new array, not s0 updated and returned: with the latter LLVM kept s0 in the
        // return slot and stored every accumulator to memory on every iteration.
        let f = _mm512_set1_ps(self.factor);
        let mut r = [_mm512_setzero_ps(); H];
        for j in 0..H {
            r[j] = _mm512_mul_ps(_mm512_add_ps(s0[j], s1[j]), f);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::elem::{E4M3, E5M2};

    /// The bf16 of every code (NaN codes NaN) is its value's, against `Elem::to_f32`.
    fn table_exact<E: Elem>(code: impl Fn(u8) -> E, ebits: u32, mbits: u32) {
        for c in 0..=255u8 {
            let want = code(c).to_f32();
            let got = half::bf16::from_bits(fp8_bf16_bits(c, ebits, mbits)).to_f32();
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{c:#x}: {got} vs {want}");
        }
    }

    #[test]
    fn fp8_bf16_bits_are_exact_on_every_code() {
        table_exact(E4M3, 4, 3);
        table_exact(E5M2, 5, 2);
    }

    /// The register widening of both loads (adjacent rows, two rows, one row and +0) on
    /// all 256 codes in both rows, with a full and a partial lane mask.
    #[test]
    fn register_widening_to_bf16_pairs_is_exact_on_every_code() {
        let f = crate::attention::isa::Features::cpu();
        if !(crate::attention::isa::Isa::Avx512.supported() && f.has("avx512bf16") && f.has("avx512vbmi")) {
            eprintln!("SKIPPED fp8 -> bf16 widening: this CPU lacks avx512_bf16 or avx512vbmi");
            return;
        }
        for (dt, ebits, mbits) in [(DType::E4M3, 4, 3), (DType::E5M2, 5, 2)] {
            // Row i: codes at..at + 16; row i + 1 the reversed codes (every pair differs).
            let rows: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
            for at in (0..256).step_by(16) {
                for mask in [0xffffu16, 0x7fff, 0x0001, 0x00f0] {
                    let mut adj = [0u8; 32];
                    adj[..16].copy_from_slice(&rows[at..at + 16]);
                    adj[16..].copy_from_slice(&rows[256 + at..256 + at + 16]);
                    let mut got = [[0u32; 16]; 3];
                    // SAFETY: the CPU check above; every load reads inside `adj`.
                    unsafe {
                        let wd = Widen::new(Fp8Tables::of(dt));
                        let p = adj.as_ptr();
                        for (g, v) in got.iter_mut().zip([
                            wd.adjacent(p, mask),
                            wd.two(p, Some(p.add(16)), mask),
                            wd.two(p, None, mask),
                        ]) {
                            _mm512_storeu_si512(g.as_mut_ptr().cast(), v);
                        }
                    }
                    let bits = |c: u8| fp8_bf16_bits(c, ebits, mbits) as u32;
                    for t in 0..16 {
                        let on = mask >> t & 1 == 1;
                        let (a, b) = if on { (bits(adj[t]), bits(adj[16 + t])) } else { (0, 0) };
                        assert_eq!(got[0][t], a | b << 16, "{dt:?} adjacent at {at} lane {t} mask {mask:#x}");
                        assert_eq!(got[1][t], a | b << 16, "{dt:?} two at {at} lane {t} mask {mask:#x}");
                        assert_eq!(got[2][t], a, "{dt:?} one at {at} lane {t} mask {mask:#x}");
                    }
                }
            }
        }
    }
}
