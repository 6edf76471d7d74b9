//! f16 query and probabilities (`Precision { q: F16, pv: F16 }`) on fp8 caches (AVX-512
//! FP16): the scores and `P V` as f16 products summed in f16 registers, plugged into the
//! tile loop of [`super::simd`] as its [`Scores`] and [`Pv`] (softmax, scales, prefetch
//! and the e4m3 NaN-code check are that path's, unchanged).
//!
//! Why: `vfmadd231ph` does 32 multiply-adds per instruction at the issue rate of the f32
//! `vfmadd231ps` (16), and every fp8 value is an f16 after one shift or `and` (e5m2: the
//! code is an f16's high byte) or two more (e4m3 over 2^8: an arithmetic shift and an
//! `and`), where the exact path spends 2-3 micro-ops per 16 codes on the widening to f32
//! and one FMA per 16 codes and query head. (`vdpbf16ps`, the dot product first
//! planned for fp8, issues at a quarter of the FMA rate on this project's machine: `cargo bench
//! --bench dot_rates`.)
//!
//! - K (block size 16): a 64-byte run is 4 dimension rows x 16 tokens, one row per
//!   128-bit lane; [`widen`] gives the even and the odd tokens of each row as f16. The query
//!   becomes one vector per 4 dimensions and head, dimension `4 k + L` repeated in lane
//!   `L` ([`F16Query`]), scaled by a power of two per query row so that no partial sum can
//!   pass 2^15 (f16's largest finite value is 65,504): each lane sums `head_dim / 4`
//!   products in f16; the lanes are widened to f32 and summed once per chunk
//!   ([`lanes_to_tokens`]) and the row's factor taken back out.
//! - V: the probabilities of a chunk (V scales folded in, as in the f32 path) times a power
//!   of two per chunk ([`prob_factor`]) are rounded to f16 and broadcast from memory into
//!   `vfmadd231ph`; each chunk's sums (16 tokens) are widened and added to the f32
//!   accumulators, which keep the widening's order ([`pv_code`]) until the end of the item.
//!   e5m2 values are read times 2^-8 (exact: e5m2's smallest subnormal, 2^-16, becomes f16's,
//!   2^-24), so that probabilities up to 2^8 fit beside values up to 57,344.
//!
//! The bound (derived in [`Scores`]'s and [`Pv`]'s implementations, enforced by
//! `tests_fp16.rs`): against the exact path on the same codes each score (log2 units)
//! moves by at most `(d / 4 + 2) 2^-11 sum_i |q_i k_i|` plus `d 2^-24` of the row's
//! scaled sum, and each chunk's `P V` by at most `18 * 2^-11 * sum_t p_t |v_t|` plus the
//! probabilities f16 cannot hold (`2^-25` each after scaling).
//!
//! Taken when the caller asks (that precision), for fp8 caches with block size 16, a
//! head_dim that is a multiple of 64 and scales in `[2^-64, 2^64]`, on CPUs with
//! `avx512fp16` (chosen by `decode.rs`'s `Route::select`, item by item [`scales_fit`]); everything else runs the exact path. f16 arithmetic has no
//! stable Rust intrinsics yet, so the two f16 instructions are inline assembly
//! ([`fma_ph`], [`fma_ph_bcast`], [`mul_ph`]).

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::asm;
use std::arch::x86_64::*;

use super::lanes::{Avx512, Lanes};
use super::simd::{run_with, Pv, Scores, HT};
use super::avx512_cvt::{chunk_mask, W};
use super::work::load_factor;
use super::query::repeat_in_lanes;
use super::work::{Chunk, Partial, Work, FREE_DOTS, LAZY_MAX};
use super::prefetch::{first_far_lines, Prefetcher, Stream};
use crate::kv::quant::TileScale;
use crate::kv::{DType, Elem};

/// Codes per run: 4 K rows of a block, or 64 elements of a V row.
const RUN: usize = 64;
/// The block size the K runs assume: 4 dimension rows of 16 tokens are 64 adjacent codes.
const BLOCK: usize = 16;
/// The largest magnitude any f16 sum may reach: 2^15 (under f16's 65,504 by a factor 2).
const SUM_MAX: f32 = 32768.0;
/// The largest probability the tile loop hands `P V` (before the V scales): `2^LAZY_MAX`.
const P_MAX: f32 = (1u32 << LAZY_MAX as u32) as f32;
/// f16 bits of 2^-8, the factor e5m2 V values are read with.
const E5M2_V_BITS: i16 = 0x1c00;
/// Scales outside `[2^-SCALE_EXP, 2^SCALE_EXP]` take the exact path: the powers of two
/// that keep the f16 sums in range stay normal f32 numbers.
const SCALE_EXP: i32 = 64;

/// Whether an item's K and V scales let its f16 sums stay in range (the route's shape and
/// the CPU's avx512fp16 are the selection's: `decode.rs`'s `Route::select`).
pub(crate) fn scales_fit<E: Elem>(w: &Work<E>) -> bool {
    let (lo, hi) = (2f32.powi(-SCALE_EXP), 2f32.powi(SCALE_EXP));
    let scale = |t: TileScale| matches!(t, TileScale::Head(s) if (lo..=hi).contains(&s));
    !w.blocks.is_empty()
        && w.heads.clone().all(|h| {
            let (k, v) = w.tile_scales(0, h);
            scale(k) && scale(v)
        })
}

/// Runs one work item with [`F16Scores`] and [`F16Pv`].
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512fp16, fma and f16c, and
/// [`scales_fit`] must hold for `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    let (d, g) = (w.shape.head_dim, w.g);
    assert!(matches!(E::DTYPE, DType::E4M3 | DType::E5M2) && w.shape.block_size == BLOCK && d.is_multiple_of(RUN));
    // The query vectors take 16 bytes per element (each repeated over its lane): an
    // item's KV heads run in groups whose vectors fit in L1 beside the tiles.
    w.in_head_groups(p, |w, p| {
        let q = F16Query::new(w.q, d, g, k_max::<E>());
        // 8-bit tiles of at most 2 KiB: only the far tiles' first lines (the exact path's choice, `simd.rs`'s `run`).
        if first_far_lines::<E>(w.shape.tile()) {
            // SAFETY: the caller's features are those the two implementations are compiled
            // for (the f16 instructions need avx512fp16, which the caller checked).
            unsafe { run_with::<Avx512, E, _, _, false>(Avx512::assume(), w, p, &F16Scores::<false> { q: &q }, &F16Pv::<false>) }
        } else {
            // SAFETY: as above.
            unsafe { run_with::<Avx512, E, _, _, true>(Avx512::assume(), w, p, &F16Scores::<true> { q: &q }, &F16Pv::<true>) }
        }
    });
}


/// An upper bound of every K code's magnitude as the loads read it (a power of two):
/// e4m3 over 2^8 is below 1.875 (the NaN codes' reading), e5m2 below 57,344 finite.
const fn k_max<E: Elem>() -> f32 {
    if matches!(E::DTYPE, DType::E4M3) {
        2.0
    } else {
        65536.0
    }
}

/// An upper bound of every V code's magnitude as [`widen_v`] reads it: e5m2 times 2^-8.
const fn v_max<E: Elem>() -> f32 {
    if matches!(E::DTYPE, DType::E4M3) {
        2.0
    } else {
        256.0
    }
}

/// `a + b * c` on 32 f16 lanes (`vfmadd231ph`, round to nearest even).
///
/// # Safety
/// The CPU must support avx512fp16.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fma_ph(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    let mut a = a;
    // SAFETY: registers only; the caller guarantees the instruction exists.
    unsafe {
        asm!("vfmadd231ph {a}, {b}, {c}", a = inout(zmm_reg) a, b = in(zmm_reg) b, c = in(zmm_reg) c,
             options(pure, nomem, nostack, preserves_flags))
    };
    a
}

/// `a + b * x` on 32 f16 lanes, `x` the f16 at `p` broadcast (`vfmadd231ph` with an
/// embedded broadcast: a load, no shuffle).
///
/// # Safety
/// The CPU must support avx512fp16; `p` must point to 2 readable bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fma_ph_bcast(a: __m512i, b: __m512i, p: *const u16) -> __m512i {
    let mut a = a;
    // SAFETY: reads the 2 bytes at `p` (the caller's contract); no other memory.
    unsafe {
        asm!("vfmadd231ph {a}, {b}, word ptr [{p}]{{1to32}}", a = inout(zmm_reg) a, b = in(zmm_reg) b, p = in(reg) p,
             options(pure, readonly, nostack, preserves_flags))
    };
    a
}

/// `a * b` on 32 f16 lanes (`vmulph`).
///
/// # Safety
/// The CPU must support avx512fp16.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn mul_ph(a: __m512i, b: __m512i) -> __m512i {
    let mut a = a;
    // SAFETY: registers only; the caller guarantees the instruction exists.
    unsafe { asm!("vmulph {a}, {a}, {b}", a = inout(zmm_reg) a, b = in(zmm_reg) b, options(pure, nomem, nostack, preserves_flags)) };
    a
}

/// The 64 codes of `x` as f16 without a shuffle: `[0]` the even bytes (word `w` holds byte
/// `2 w`), `[1]` the odd bytes (byte `2 w + 1`), each in its word's high byte. e5m2: the
/// code is the f16's high byte (exact): the even bytes shifted up, the odd ones with the
/// low byte cleared. e4m3: then shifted right by one (sign copied) and bits 14 and 0-6
/// cleared: the value over 2^8, exact for normals and subnormals (the NaN codes read as
/// +-1.875, as on the f32 path). Five instructions per 64 e4m3 codes, where unpacking to
/// the high bytes first took six, two of them on the shuffle port the f16 FMAs also use.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn widen<E: Elem>(x: __m512i) -> [__m512i; 2] {
    let even = _mm512_slli_epi16::<8>(x);
    if E::DTYPE == DType::E4M3 {
        let keep = _mm512_set1_epi16(0xbf80u16 as i16);
        [_mm512_and_si512(_mm512_srai_epi16::<1>(even), keep), _mm512_and_si512(_mm512_srai_epi16::<1>(x), keep)]
    } else {
        [even, _mm512_and_si512(x, _mm512_set1_epi16(0xff00u16 as i16))]
    }
}

/// [`widen`] for V: e5m2 values times 2^-8 (exact), e4m3 as [`widen`].
///
/// # Safety
/// The CPU must support avx512fp16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn widen_v<E: Elem>(x: __m512i) -> [__m512i; 2] {
    let [lo, hi] = widen::<E>(x);
    if E::DTYPE == DType::E5M2 {
        let f = _mm512_set1_epi16(E5M2_V_BITS);
        // SAFETY: forwarded to the caller.
        unsafe { [mul_ph(lo, f), mul_ph(hi, f)] }
    } else {
        [lo, hi]
    }
}

/// The power of two `f <= x` of a positive normal `x` (its exponent, mantissa cleared).
#[inline]
fn pow2_floor(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0xff80_0000)
}

/// The query of a work item for [`F16Scores`]: per head tile (as
/// [`super::query::interleave_query`] cuts them: per KV head, tiles of up to `HT` heads)
/// `d / 4` groups of one vector per head, vector `(k, j)` of 32 f16 holding
/// `q'_j[4 k + L]` in the 8 words of lane `L`; `q'` = the row times `factor` (a power of two
/// with `sum_i |q'_i| * k_max <= 2^15`), rounded to f16; `inverse[row]` = 1 / factor.
pub(crate) struct F16Query {
    words: Vec<u16>,
    inverse: Vec<f32>,
}

impl F16Query {
    pub(crate) fn new(q: &[f32], d: usize, g: usize, k_max: f32) -> Self {
        use half::slice::HalfFloatSliceExt;
        assert!(d.is_multiple_of(4) && g > 0 && q.len().is_multiple_of(d));
        let rows = q.len() / d;
        let mut words = vec![0u16; 8 * q.len()];
        let mut inverse = vec![1f32; rows];
        // One row scaled, then rounded to f16 at once (F16C where the CPU has it).
        let (mut scaled, mut rounded) = (vec![0f32; d], vec![half::f16::ZERO; d]);
        for (kv, group) in q.chunks_exact(g * d).enumerate() {
            for j0 in (0..g).step_by(HT) {
                let h = (g - j0).min(HT);
                let base = 8 * (kv * g + j0) * d;
                for j in 0..h {
                    let row = &group[(j0 + j) * d..(j0 + j + 1) * d];
                    let sum = abs_sum(row) * k_max;
                    // Rows of zeros (or NaN / inf, which the result carries anyway) keep 1.
                    let factor = if sum > 0.0 && sum.is_finite() {
                        pow2_floor((SUM_MAX / sum).clamp(f32::MIN_POSITIVE, 2f32.powi(SCALE_EXP)))
                    } else {
                        1.0
                    };
                    inverse[kv * g + j0 + j] = 1.0 / factor;
                    scaled.iter_mut().zip(row).for_each(|(y, &x)| *y = x * factor);
                    rounded.convert_from_f32_slice(&scaled);
                    repeat_in_lanes::<u16, 8>(&mut words, base + j * 32, h * 32, rounded.reinterpret_cast());
                }
            }
        }
        F16Query { words, inverse }
    }
}

/// The sum of the magnitudes of `row`, 16 partial sums at a time (vectorized; a plain
/// sum is one dependent chain of scalar additions).
fn abs_sum(row: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for part in row.chunks(16) {
        lanes.iter_mut().zip(part).for_each(|(s, x)| *s += x.abs());
    }
    lanes.iter().sum()
}

/// The 16 tokens of a chunk in order, in f32, from the two f16 sum vectors of a head
/// (`s[0]`: the even tokens of each lane's dimensions, `s[1]`: the odd ones): each half
/// widened, the lanes summed and the tokens interleaved (four `vcvtph2ps`, two extracts,
/// two two-source permutes, three adds).
#[inline]
#[target_feature(enable = "avx512f,f16c")]
fn lanes_to_tokens(s: [__m512i; 2]) -> __m512 {
    // a, b: [L0 + L2, L1 + L3] of the even (a) and odd (b) tokens, 8 each.
    let (a, b) = (halves_sum(s[0]), halves_sum(s[1]));
    // Token 2 i: a[i] + a[8 + i]; token 2 i + 1: b[i] + b[8 + i] (b is 16.. of the pair).
    let first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
    _mm512_add_ps(_mm512_permutex2var_ps(a, first, b), _mm512_permutex2var_ps(a, second, b))
}

/// The two 256-bit halves of 32 f16 widened and added: `[L0 + L2, L1 + L3]` of 8 values
/// each (a function, not a closure: closures do not take the target features).
#[inline]
#[target_feature(enable = "avx512f,f16c")]
fn halves_sum(v: __m512i) -> __m512 {
    _mm512_add_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(v)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(v)))
}

/// Scores from [`F16Query`] on the f16 keys.
pub(crate) struct F16Scores<'a, const FAR_LINES: bool> {
    q: &'a F16Query,
}

impl<E: Elem, const FAR_LINES: bool> Scores<Avx512, E> for F16Scores<'_, FAR_LINES> {
    /// Per 64-code run: one (masked) load, [`widen`], one `vfmadd231ph` per half and
    /// head. Bound: `q'` rounds each element by at most 2^-11 relative, each product
    /// rounds by 2^-11 relative (or 2^-25 absolute below f16's normal range), and each lane
    /// adds `d / 4` of them in f16 (each addition 2^-11 relative of a partial sum no larger
    /// than the sum of magnitudes): at most `(d / 4 + 2) 2^-11 sum_i |q'_i k_i| + d 2^-24`
    /// in all, times the row's inverse factor; the f32 steps after add f32 rounding.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn scores<const H: usize>(&self, _: Avx512, c: &Chunk<E>, qh: usize, next_k: Stream<E>) -> [__m512; H] {
        let (d, mask) = (c.d, chunk_mask(c));
        let runs = d / 4;
        // Run k: bytes 64 k + c0 .. + 64 of kt, those of lanes >= c0 + lanes masked off:
        // row 4 k + r's tokens c0 .. c0 + lanes sit at 64 k + 16 r + c0 .., below 16 d.
        // The tile's query vectors: runs * H of 32 words from 32 runs qh.
        assert!(c.bs == BLOCK && d.is_multiple_of(RUN) && c.kt.len() >= d * BLOCK && c.c0 + c.lanes <= BLOCK);
        assert!(self.q.words.len() >= 32 * runs * (qh + H) && self.q.inverse.len() >= qh + H);
        let m = mask as u64;
        let mask4 = m | m << 16 | m << 32 | m << 48;
        let qp = self.q.words[32 * runs * qh..].as_ptr();
        let kp = c.kt.as_ptr().cast::<u8>().wrapping_add(c.c0);
        let mut pf = Prefetcher::<FAR_LINES>::with(next_k, runs);
        // Two sets of sums for 1-2 heads (alternate runs), so 4-8 FMA chains are in flight.
        let mut s = [[[_mm512_setzero_si512(); 2]; H]; 2];
        // A full chunk's runs are plain loads; the K and query pointers are stepped.
        let full = mask4 == u64::MAX;
        let (mut kr, mut qr) = (kp, qp);
        for k in 0..runs {
            let set = if H <= 2 { k % 2 } else { 0 };
            pf.step();
            // SAFETY: kr = kp + 64 k: masked bytes are inside kt (above), masked-off ones
            // not accessed (all 64 inside when full); qr = qp + 32 H k: query vectors
            // k * H + j < runs * H past qp. avx512fp16: the route's selection.
            unsafe {
                let raw = if full { _mm512_loadu_si512(kr.cast()) } else { _mm512_maskz_loadu_epi8(mask4, kr.cast()) };
                let x = widen::<E>(raw);
                if FREE_DOTS {
                    s[set][0] = [_mm512_xor_si512(s[set][0][0], x[0]), _mm512_xor_si512(s[set][0][1], x[1])];
                } else {
                    for j in 0..H {
                        let qv = _mm512_loadu_si512(qr.add(j * 32).cast());
                        s[set][j][0] = fma_ph(s[set][j][0], qv, x[0]);
                        s[set][j][1] = fma_ph(s[set][j][1], qv, x[1]);
                    }
                }
            }
            kr = kr.wrapping_add(RUN);
            qr = qr.wrapping_add(32 * H);
        }
        let mut out = [_mm512_setzero_ps(); H];
        for j in 0..H {
            let mut t = lanes_to_tokens(s[0][j]);
            if H <= 2 {
                t = _mm512_add_ps(t, lanes_to_tokens(s[1][j]));
            }
            out[j] = _mm512_mul_ps(t, _mm512_set1_ps(self.q.inverse[qh + j]));
        }
        out
    }
}

/// The power of two `P V` multiplies a chunk's probabilities by before rounding them to
/// f16, and the factor that takes it (and [`widen_v`]'s) back out: with every probability at most `2^LAZY_MAX` times the V scale
/// (times the e4m3 load factor) and every value below [`v_max`], 16 tokens' products sum
/// to at most 2^15. `vs` is a fp8 tile's scale, in range ([`scales_fit`]).
#[inline]
fn prob_factor<E: Elem>(vs: &TileScale) -> (f32, f32) {
    let s = match *vs {
        TileScale::Head(s) => s,
        _ => 1.0,
    } * load_factor(E::DTYPE);
    let f = pow2_floor(SUM_MAX / (W as f32 * P_MAX * s * v_max::<E>()));
    // e5m2 values were read times 2^-8: the inverse puts that back too.
    let read = if E::DTYPE == DType::E5M2 { 2f32.powi(-8) } else { 1.0 };
    (f, 1.0 / (f * read))
}

/// The dimension (`0..64`) of a 64-element run that position `pos` of its f32 accumulators
/// holds: vector `u = pos / 32` of [`widen`] (bytes `2 w + u`), its words `w = pos % 32` in
/// order (its two halves widened to 16 f32 each).
pub(crate) const fn pv_code(pos: usize) -> usize {
    2 * (pos % 32) + pos / 32
}

/// `P V` in f16 per chunk, added to f32 accumulators in the [`pv_code`] order.
pub(crate) struct F16Pv<const FAR_LINES: bool>;

impl<E: Elem, const FAR_LINES: bool> Pv<Avx512, E> for F16Pv<FAR_LINES> {
    #[inline(always)]
    fn takes(&self, d: usize) -> bool {
        matches!(E::DTYPE, DType::E4M3 | DType::E5M2) && d.is_multiple_of(RUN)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn pv<const H: usize>(
        &self,
        _: Avx512,
        c: &Chunk<E>,
        acc: &mut [f32],
        probs: &[[f32; W]; HT],
        alpha: &[f32; H],
        rescale: bool,
        next: [Stream<E>; 2],
    ) {
        // Up to 16 f16 accumulators: 4 runs per pass for 1-2 heads, 2 for 3-4.
        // SAFETY: the features are ours and avx512fp16 (the route's selection); `pass` checks its bounds.
        unsafe {
            if H <= 2 && c.d.is_multiple_of(4 * RUN) {
                pass::<E, H, 4, FAR_LINES>(c, acc, probs, alpha, rescale, next);
            } else if c.d.is_multiple_of(2 * RUN) {
                pass::<E, H, 2, FAR_LINES>(c, acc, probs, alpha, rescale, next);
            } else {
                pass::<E, H, 1, FAR_LINES>(c, acc, probs, alpha, rescale, next);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn finish(&self, acc: &mut [f32], d: usize) {
        debug_assert!(d.is_multiple_of(RUN) && acc.len().is_multiple_of(d));
        for s in acc.chunks_exact_mut(RUN) {
            let mut held = [0f32; RUN];
            held.copy_from_slice(s);
            for (pos, &x) in held.iter().enumerate() {
                s[pv_code(pos)] = x;
            }
        }
    }
}

/// `acc[j] = alpha[j] * acc[j] + sum_t p_t v_t` (without `alpha` unless `rescale`) for the
/// chunk's token rows, `R` runs of 64 per pass (`2 R` f16 sums per head in registers).
/// Bound: each probability rounds to f16 by 2^-11 relative (2^-25 absolute after the
/// scaling, below f16's normal range), each product by 2^-11, and 16 additions in f16 by
/// 2^-11 of a partial sum each: at most `18 * 2^-11 * sum_t p_t |v_t|` plus `2^-25 |v_t|`
/// per token (in scaled units), then f32 rounding.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512fp16, fma and f16c.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn pass<E: Elem, const H: usize, const R: usize, const FAR_LINES: bool>(
    c: &Chunk<E>,
    acc: &mut [f32],
    probs: &[[f32; W]; HT],
    alpha: &[f32; H],
    rescale: bool,
    next: [Stream<E>; 2],
) {
    let d = c.d;
    assert!(H <= HT && d.is_multiple_of(R * RUN) && acc.len() == H * d);
    assert!(c.lanes <= W && (c.c0 + c.lanes) * d <= c.vt.len());
    let (f, inverse) = prob_factor::<E>(&c.vs);
    let mut pw = [[0u16; W]; HT];
    for j in 0..H {
        // SAFETY: 16 f32 in, 16 f16 out.
        unsafe {
            let p = _mm512_mul_ps(_mm512_loadu_ps(probs[j].as_ptr()), _mm512_set1_ps(f));
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(p);
            _mm256_storeu_si256(pw[j].as_mut_ptr().cast(), h);
        }
    }
    let steps = d / (R * RUN) * c.lanes;
    let mut pf = [Prefetcher::<FAR_LINES>::with(next[0], steps), Prefetcher::<FAR_LINES>::with(next[1], steps)];
    let ap = acc.as_mut_ptr();
    let inv = _mm512_set1_ps(inverse);
    let mut u0 = 0;
    // SAFETY: every access below: V row c0 + t < c0 + lanes (inside vt, asserted),
    // elements u0 .. u0 + 64 R <= d of it; probabilities pw[j][t], j < H <= HT, t < lanes
    // <= 16; accumulator row j < H, elements u0 .. u0 + 64 R <= d, below H d = acc.len().
    // The features are this function's and avx512fp16 (the contract).
    unsafe {
        while u0 < d {
            let mut a = [[[_mm512_setzero_si512(); 2]; R]; H];
            let mut vr = c.vt.as_ptr().add(c.c0 * d + u0).cast::<u8>();
            for t in 0..c.lanes {
                pf[0].step();
                pf[1].step();
                let mut v = [[_mm512_setzero_si512(); 2]; R];
                for r in 0..R {
                    v[r] = widen_v::<E>(_mm512_loadu_si512(vr.add(r * RUN).cast()));
                }
                if FREE_DOTS {
                    for r in 0..R {
                        a[0][r] = [_mm512_xor_si512(a[0][r][0], v[r][0]), _mm512_xor_si512(a[0][r][1], v[r][1])];
                    }
                } else {
                    for j in 0..H {
                        let pp = pw[j].as_ptr().add(t);
                        for r in 0..R {
                            a[j][r][0] = fma_ph_bcast(a[j][r][0], v[r][0], pp);
                            a[j][r][1] = fma_ph_bcast(a[j][r][1], v[r][1], pp);
                        }
                    }
                }
                vr = vr.add(d);
            }
            for j in 0..H {
                let al = _mm512_set1_ps(alpha[j]);
                for r in 0..R {
                    for u in 0..2 {
                        let x = a[j][r][u];
                        let halves = [_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64::<1>(x)];
                        for (h, half) in halves.into_iter().enumerate() {
                            let at = ap.add(j * d + u0 + r * RUN + 32 * u + 16 * h);
                            let old = _mm512_loadu_ps(at);
                            let old = if rescale { _mm512_mul_ps(old, al) } else { old };
                            _mm512_storeu_ps(at, _mm512_fmadd_ps(_mm512_cvtph_ps(half), inv, old));
                        }
                    }
                }
            }
            u0 += R * RUN;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every position of a run's accumulators names a distinct dimension, and it is the
    /// one [`widen`] and the half-widening put there: byte `2 w + u` for vector `u`, word `w`.
    #[test]
    fn pv_code_is_a_permutation_matching_the_widening() {
        let mut seen = [false; RUN];
        for pos in 0..RUN {
            let c = pv_code(pos);
            assert!(!seen[c], "{pos} -> {c} twice");
            seen[c] = true;
            let (u, w) = (pos / 32, pos % 32);
            assert_eq!(c, 2 * w + u, "{pos}");
        }
    }

    /// [`lanes_to_tokens`] sums the four lanes of each token and puts the tokens in order:
    /// word `8 L + i` of `s[u]` is token `2 i + u` of lane `L`.
    #[test]
    fn lanes_to_tokens_sums_the_lanes_of_each_token_in_order() {
        if !crate::attention::isa::Isa::Avx512.supported() {
            eprintln!("SKIPPED: no AVX-512");
            return;
        }
        let value = |lane: usize, token: usize| (lane * 100 + token * 3 + 1) as f32;
        let words: [[u16; 32]; 2] =
            std::array::from_fn(|u| std::array::from_fn(|k| half::f16::from_f32(value(k / 8, 2 * (k % 8) + u)).to_bits()));
        let mut out = [0f32; 16];
        // SAFETY: AVX-512 F checked above (f16c with it); 2 x 64 bytes in, 64 out.
        unsafe {
            let s = words.map(|w| _mm512_loadu_si512(w.as_ptr().cast()));
            _mm512_storeu_ps(out.as_mut_ptr(), lanes_to_tokens(s));
        }
        for (t, &got) in out.iter().enumerate() {
            assert_eq!(got, (0..4).map(|l| value(l, t)).sum::<f32>(), "token {t}");
        }
    }

    /// The widening reads every code at every byte position as the f16 of its value (over
    /// 2^8 for e4m3, whose NaN codes read as +-1.875), in the word [`pv_code`] names
    /// (vector `u` word `k` at position `32 u + k`).
    #[test]
    fn the_widening_reads_every_code_at_its_word() {
        use crate::kv::fp8::{E4M3, E5M2};
        if !crate::attention::isa::Isa::Avx512.supported() {
            eprintln!("SKIPPED: no AVX-512");
            return;
        }
        for shift in 0..4 {
            let codes: [u8; RUN] = std::array::from_fn(|i| (i * 4 + shift) as u8);
            // SAFETY: AVX-512 F/BW checked above; 64 bytes in, 2 x 64 out.
            let (e4, e5) = unsafe {
                let x = _mm512_loadu_si512(codes.as_ptr().cast());
                (widen::<E4M3>(x), widen::<E5M2>(x))
            };
            for (e4m3, v) in [(true, e4), (false, e5)] {
                let mut words = [[0u16; 32]; 2];
                // SAFETY: 32 words each.
                unsafe { v.iter().zip(&mut words).for_each(|(x, w)| _mm512_storeu_si512(w.as_mut_ptr().cast(), *x)) };
                for (u, row) in words.iter().enumerate() {
                    for (k, &bits) in row.iter().enumerate() {
                        let c = codes[pv_code(32 * u + k)];
                        let got = half::f16::from_bits(bits).to_f32();
                        let want = if e4m3 {
                            let m = c & 0x7f;
                            let v = if m == 0x7f { 480.0 } else { E4M3(m).to_f32() } / 256.0;
                            if c & 0x80 != 0 { -v } else { v }
                        } else {
                            E5M2(c).to_f32()
                        };
                        assert!(got == want || (got.is_nan() && want.is_nan()), "{e4m3} code {c:#x}: {got} vs {want}");
                    }
                }
            }
        }
    }

    /// The query layout: dimension `4 k + L` of head `j` in the 8 words of lane `L` of
    /// vector `(k, j)`, times the row's power of two, which keeps the row's sum of
    /// magnitudes times the code bound at most 2^15.
    #[test]
    fn the_f16_query_repeats_each_dimension_in_its_lane_and_bounds_the_sums() {
        let (d, g) = (8, 6);
        let q: Vec<f32> = (0..2 * g * d).map(|i| (i as f32 - 40.0) * 0.37).collect();
        let fq = F16Query::new(&q, d, g, 65536.0);
        for kv in 0..2 {
            for j0 in [0, 4] {
                let h = (g - j0).min(HT);
                for j in 0..h {
                    let row = kv * g + j0 + j;
                    let factor = 1.0 / fq.inverse[row];
                    assert_eq!(factor.to_bits() & 0x007f_ffff, 0, "a power of two");
                    let sum: f32 = q[row * d..(row + 1) * d].iter().map(|x| x.abs()).sum::<f32>() * 65536.0;
                    assert!(sum * factor <= SUM_MAX && sum * factor > SUM_MAX / 2.0, "row {row}: {}", sum * factor);
                    for i in 0..d {
                        let at = 8 * (kv * g + j0) * d + ((i / 4) * h + j) * 32 + 8 * (i % 4);
                        let want = half::f16::from_f32(q[row * d + i] * factor).to_bits();
                        assert!(fq.words[at..at + 8].iter().all(|&w| w == want), "row {row} dim {i}");
                    }
                }
            }
        }
    }

    /// The chunk factor keeps 16 tokens of the largest probability times the largest
    /// value at most 2^15, and is a power of two within a factor 2 of that limit.
    #[test]
    fn the_probability_factor_keeps_sixteen_products_in_range() {
        use crate::kv::fp8::{E4M3, E5M2};
        for s in [2f32.powi(-60), 1e-3, 0.37, 1.0, 448.0, 2f32.powi(60)] {
            let check = |f: f32, inv: f32, lf: f32, vmax: f32| {
                assert_eq!(f * inv, if vmax == 256.0 { 256.0 } else { 1.0 });
                let top = W as f32 * P_MAX * s * lf * vmax * f;
                assert!(top <= SUM_MAX && top > SUM_MAX / 2.0, "scale {s}: {top}");
            };
            let (f, inv) = prob_factor::<E4M3>(&TileScale::Head(s));
            check(f, inv, 256.0, 2.0);
            let (f, inv) = prob_factor::<E5M2>(&TileScale::Head(s));
            check(f, inv, 1.0, 256.0);
        }
    }
}
