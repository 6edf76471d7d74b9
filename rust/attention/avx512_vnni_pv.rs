//! AVX-512 VNNI `P V` (`int8_pv=True` on an int8 cache, head_dim a multiple of 64): the
//! probabilities quantized to 8 bits per (chunk, query head) and multiplied with the V
//! codes by `vpdpbusd`, plugged into the tile loop of [`super::avx512`] as its
//! [`Pv`] (scores, softmax and prefetch are that path's).
//!
//! Per chunk of up to 16 tokens and query head `j`: the probabilities carry the tokens'
//! V scales (`P'_t = p_t * s_t`, as the f32 loops read them), so `M = max_t P'_t` and
//! `code_t = round_half_even(P'_t * 255 / M)` in `0..=255`; then
//! `acc_j += (M / 255) * sum_t code_t * V_t` with the sum exact in i32 (at most
//! `16 * 255 * 127 < 2^31`) and one f32 rounding for its conversion. `vpdpbusd` takes
//! four tokens per 32-bit lane: the P codes are its unsigned operand (four tokens'
//! codes broadcast), the V codes its signed one, so four V rows of 64 codes are
//! transposed into 4 x 4 byte blocks by two rounds of unpacks (8 instructions per 256
//! codes, shared by the tile's heads). One instruction then does one head's 64 products
//! of 4 tokens x 16 dimensions, for which the f32 loops run 4 FMAs and 8 widening
//! instructions (`vpmovsxbd` + `vcvtdq2ps` per 16 codes, shared by the heads).
//!
//! The unpacks work within 128-bit lanes, so accumulator vector `k` of a 64-dimension
//! segment holds dimension `16 L + 4 k + i` at lane `4 L + i`: the f32 accumulators keep
//! that order across the item and [`IntPv::finish`] puts them back ([`segment_position`]).
//!
//! Bound (against the f32 `P V` on the same scores): `|P'_t - code_t * M / 255| <= M / 510`
//! per token, `|V code| <= 127` and `M * 127 <= max_t p_t * max|V'|` (`V'` dequantized:
//! code times scale, whose largest magnitude per row is `127 * s_t`); the softmax sum
//! holds each chunk's largest `p_t`, so each output moves by at most
//! `(16 / 510) * max|V'|` (about 3% of the largest V magnitude of the sequence's head,
//! reached only when every chunk has one dominant token and 15 others just under half a
//! code), plus f32 rounding. Measured errors on normal data are far below it
//! (`benches/bench_quant.py`).

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx512::{Pv, HT, W};
use super::work::{Chunk, FREE_DOTS};
use super::x86_prefetch::{Prefetcher, Stream};
use crate::kv::{DType, Elem};

/// Dimensions per transposed segment: 4 V rows of 64 codes become 4 vectors, each 16
/// dimensions x 4 tokens.
const SEG: usize = 64;

/// Where dimension `dim` (`< 64`) of a segment sits in [`IntPv`]'s accumulator order
/// (an involution: lane `4 L + i` of vector `k` holds dimension `16 L + 4 k + i`).
// The order spelled out: the tests check the unpacks and `finish` against it.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const fn segment_position(dim: usize) -> usize {
    let (l, k, i) = (dim / 16, (dim % 16) / 4, dim % 4);
    16 * k + 4 * l + i
}

/// `P V` by `vpdpbusd` on 8-bit probabilities (see the module doc).
pub(crate) struct IntPv;

impl<E: Elem> Pv<E> for IntPv {
    #[inline(always)]
    fn takes(&self, d: usize) -> bool {
        E::DTYPE == DType::I8 && d.is_multiple_of(SEG)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    unsafe fn pv<const H: usize>(
        &self,
        c: &Chunk<E>,
        acc: &mut [f32],
        probs: &[[f32; W]; HT],
        alpha: &[f32; H],
        rescale: bool,
        next: [Stream<E>; 2],
    ) {
        let d = c.d;
        assert!(E::DTYPE == DType::I8 && d.is_multiple_of(SEG) && H <= HT);
        let (codes, cs) = quantize::<H>(probs);
        // One MHA head's two segments per pass (8 accumulators); 4 heads' one.
        let wide = H == 1 && d.is_multiple_of(2 * SEG);
        // One step per group of 4 rows and segment.
        let steps = d / SEG * c.lanes.div_ceil(4);
        let pf = &mut [Prefetcher::new(next[0], steps), Prefetcher::new(next[1], steps)];
        // SAFETY: the features are ours; `pass`'s asserts check the rest.
        unsafe {
            if wide {
                pass::<E, H, 2>(c, acc, &codes, &cs, alpha, rescale, pf);
            } else {
                pass::<E, H, 1>(c, acc, &codes, &cs, alpha, rescale, pf);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    unsafe fn finish(&self, acc: &mut [f32], d: usize) {
        // Rows of d, a multiple of 64 (`takes`): every 64 floats are one segment.
        debug_assert!(d.is_multiple_of(SEG) && acc.len().is_multiple_of(d));
        for s in acc.chunks_exact_mut(SEG) {
            let s: &mut [f32; SEG] = s.try_into().expect("chunks of SEG");
            // SAFETY: this function's features include `unpermute_segment`'s.
            unsafe { unpermute_segment(s) };
        }
    }
}

/// Puts one segment back in dimension order: the 4 x 4 transpose of its 128-bit groups
/// (group `L` of vector `k` holds dimensions `16 L + 4 k ..`, [`segment_position`]), by
/// eight `vshuff32x4` (LLVM turned the index loop into 16 gathers, 10% of a short call's
/// tile loop).
///
/// # Safety
/// The CPU must support avx512f.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn unpermute_segment(s: &mut [f32; SEG]) {
    let p = s.as_mut_ptr();
    // SAFETY: the segment holds exactly 4 vectors of 16 f32.
    let a: [__m512; 4] = std::array::from_fn(|k| unsafe { _mm512_loadu_ps(p.add(k * W)) });
    // t0 = groups 0, 1 of a0, a1; t1 = groups 2, 3 of a0, a1; t2, t3 the same of a2, a3.
    let t0 = _mm512_shuffle_f32x4::<0x44>(a[0], a[1]);
    let t1 = _mm512_shuffle_f32x4::<0xee>(a[0], a[1]);
    let t2 = _mm512_shuffle_f32x4::<0x44>(a[2], a[3]);
    let t3 = _mm512_shuffle_f32x4::<0xee>(a[2], a[3]);
    // Vector L = group L of a0, a1, a2, a3.
    let r = [
        _mm512_shuffle_f32x4::<0x88>(t0, t2),
        _mm512_shuffle_f32x4::<0xdd>(t0, t2),
        _mm512_shuffle_f32x4::<0x88>(t1, t3),
        _mm512_shuffle_f32x4::<0xdd>(t1, t3),
    ];
    for (l, v) in r.into_iter().enumerate() {
        // SAFETY: as the loads.
        unsafe { _mm512_storeu_ps(p.add(l * W), v) };
    }
}

/// Each head's 16 probabilities as 8-bit codes (four tokens per `u32`, token `4 w + b` in
/// byte `b` of word `w`) and their step `M / 255`. A chunk whose largest probability is
/// 0 gets codes 0 and step 1 (and one too small for `255 / M` in f32 codes of at most
/// `M * f32::MAX`); a NaN probability makes the step NaN, so the output is NaN as on the
/// f32 loops.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
fn quantize<const H: usize>(probs: &[[f32; W]; HT]) -> ([[u32; 4]; H], [f32; H]) {
    let mut codes = [[0u32; 4]; H];
    let mut step = [0f32; H];
    for j in 0..H {
        // SAFETY: probs[j] holds exactly 16 f32, codes[j] 16 bytes.
        unsafe {
            let x = _mm512_loadu_ps(probs[j].as_ptr());
            let m = _mm512_reduce_max_ps(x);
            // All 0 (V rows of zeros have scale 0, so their probabilities carry 0): the codes
            // are 0 whatever r is, and the clamped 255 / 0 would make the step 1 / f32::MAX,
            // a subnormal result whose division takes a microcode assist (int8_pv on a
            // cache of zero V rows took 1.7x the time of random ones; `docs/experiments.md`,
            // "Subnormals").
            let r = if m > 0.0 { (255.0 / m).min(f32::MAX) } else { 1.0 };
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x) != 0;
            step[j] = if nan { f32::NAN } else { 1.0 / r };
            // MXCSR's rounding: nearest, ties to even; lanes at or below M give at most 255.
            let q = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(r)));
            _mm_storeu_si128(codes[j].as_mut_ptr().cast(), _mm512_cvtusepi32_epi8(q));
        }
    }
    (codes, step)
}

/// Four V rows (64 codes each, from `rows[r]`) as the 4 accumulator-order vectors of
/// their segment: lane `4 L + i` of vector `k` holds the four rows' codes of dimension
/// `16 L + 4 k + i`, row `r` in byte `r`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn transpose(r: [__m512i; 4]) -> [__m512i; 4] {
    if FREE_DOTS {
        return r;
    }
    let (a, b) = (_mm512_unpacklo_epi8(r[0], r[1]), _mm512_unpackhi_epi8(r[0], r[1]));
    let (c, e) = (_mm512_unpacklo_epi8(r[2], r[3]), _mm512_unpackhi_epi8(r[2], r[3]));
    [_mm512_unpacklo_epi16(a, c), _mm512_unpackhi_epi16(a, c), _mm512_unpacklo_epi16(b, e), _mm512_unpackhi_epi16(b, e)]
}

/// [`IntPv::pv`] with `S` segments of each head's row per pass (`4 * S` i32
/// accumulators per head in registers over the chunk).
///
/// # Safety
/// The CPU must support the features below.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn pass<E: Elem, const H: usize, const S: usize>(
    c: &Chunk<E>,
    acc: &mut [f32],
    codes: &[[u32; 4]; H],
    step: &[f32; H],
    alpha: &[f32; H],
    rescale: bool,
    pf: &mut [Prefetcher; 2],
) {
    let d = c.d;
    assert!(d.is_multiple_of(S * SEG) && acc.len() == H * d);
    assert!(c.lanes <= W && (c.c0 + c.lanes) * d <= c.vt.len());
    let (full, rest) = (c.lanes / 4, c.lanes % 4);
    let ap = acc.as_mut_ptr();
    let mut u0 = 0;
    while u0 < d {
        let mut a = [[_mm512_setzero_si512(); 8]; H];
        let mut vr = c.vt.as_ptr().wrapping_add(c.c0 * d + u0).cast::<i8>();
        let mut g = 0;
        while g < full + usize::from(rest > 0) {
            // Rows past the chunk's tokens read as 0 (their P codes are 0 too).
            let live = if g < full { 4 } else { rest };
            for s in 0..S {
                pf[0].step();
                pf[1].step();
                let mut r = [_mm512_setzero_si512(); 4];
                for t in 0..4 {
                    // SAFETY: row c0 + 4 g + t < c0 + lanes of the V tile (asserted inside vt)
                    // when t < live, codes u0 + 64 s .. + 64 <= d of it; masked-off rows are
                    // not accessed.
                    r[t] = unsafe {
                        let p = vr.wrapping_add(t * d + s * SEG);
                        if g < full {
                            _mm512_loadu_si512(p.cast())
                        } else {
                            _mm512_maskz_loadu_epi8(if t < live { u64::MAX } else { 0 }, p)
                        }
                    };
                }
                let x = transpose(r);
                if FREE_DOTS {
                    for k in 0..4 {
                        a[0][4 * s + k] = _mm512_xor_si512(a[0][4 * s + k], x[k]);
                    }
                } else {
                    for j in 0..H {
                        let pj = _mm512_set1_epi32(codes[j][g] as i32);
                        // Unsigned operand: the P codes; signed: the V codes.
                        for k in 0..4 {
                            a[j][4 * s + k] = _mm512_dpbusd_epi32(a[j][4 * s + k], pj, x[k]);
                        }
                    }
                }
            }
            vr = vr.wrapping_add(4 * d);
            g += 1;
        }
        for j in 0..H {
            let (al, st) = (_mm512_set1_ps(alpha[j]), _mm512_set1_ps(step[j]));
            for k in 0..4 * S {
                // SAFETY: j * d + u0 + 16 k + 16 <= H * d = acc.len() (d a multiple of S * 64).
                unsafe {
                    let at = ap.add(j * d + u0 + k * W);
                    let mut f = _mm512_loadu_ps(at);
                    if rescale {
                        f = _mm512_mul_ps(al, f);
                    }
                    _mm512_storeu_ps(at, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[j][k]), st, f));
                }
            }
        }
        u0 += S * SEG;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unpacks' order, checked on the instructions: row r's code of dimension `dim`
    /// lands in byte r of the dword at [`segment_position`]`(dim)`.
    #[test]
    fn transpose_puts_each_dimensions_four_rows_in_its_segment_position() {
        // The unpacks need avx512f and avx512bw only: the AVX-512 path's own check.
        if !super::super::isa::Isa::Avx512.supported() {
            eprintln!("SKIPPED the int8_pv transpose check: this CPU lacks AVX-512");
            return;
        }
        let rows: [[i8; 64]; 4] = std::array::from_fn(|r| std::array::from_fn(|dim| (r * 64 + dim) as i8));
        let mut out = [[0i8; 64]; 4];
        // SAFETY: the CPU has avx512f and avx512bw (checked above); each array holds 64 bytes.
        unsafe {
            let r = std::array::from_fn(|t| _mm512_loadu_si512(rows[t].as_ptr().cast()));
            for (o, x) in out.iter_mut().zip(transpose(r)) {
                _mm512_storeu_si512(o.as_mut_ptr().cast(), x);
            }
        }
        for dim in 0..64 {
            let p = segment_position(dim);
            for r in 0..4 {
                assert_eq!(out[p / 16][4 * (p % 16) + r], rows[r][dim], "dimension {dim} row {r}");
            }
        }
        assert!((0..64).all(|dim| segment_position(segment_position(dim)) == dim));
    }

    /// `quantize` at its edges: a chunk of zero probabilities gets codes 0 and a normal
    /// step (not the subnormal `1 / f32::MAX`, whose division takes a microcode assist);
    /// the largest probability gets code 255 and every code times the step is within half
    /// a step of its probability; a NaN makes only its own head's step NaN.
    #[test]
    fn quantize_codes_zero_chunks_with_a_normal_step_and_keeps_each_heads_nan() {
        if !super::super::isa::cpu_features().contains(&"avx512vnni") || !super::super::isa::Isa::Avx512.supported() {
            eprintln!("SKIPPED the int8_pv quantize check: this CPU lacks AVX-512 VNNI");
            return;
        }
        let mut probs = [[0f32; W]; HT];
        // Head 1: 16 probabilities up to 3.5 (V scales folded in); head 2: one NaN.
        probs[1] = std::array::from_fn(|t| 3.5 * (t as f32 + 1.0) / 16.0);
        probs[2][5] = f32::NAN;
        probs[3] = std::array::from_fn(|t| if t % 3 == 0 { 1e-30 } else { 0.0 });
        // SAFETY: the CPU has the features (checked above).
        let (codes, step) = unsafe { quantize::<4>(&probs) };
        let code = |j: usize, t: usize| (codes[j][t / 4] >> (8 * (t % 4))) & 0xff;
        assert!(step[0].is_normal(), "zero chunk's step {}", step[0]);
        assert!((0..W).all(|t| code(0, t) == 0));
        assert!(step[2].is_nan() && !step[1].is_nan() && !step[3].is_nan());
        for j in [1, 3] {
            assert_eq!(code(j, W - 1).max(code(j, 0)), 255, "head {j}");
            for t in 0..W {
                let back = code(j, t) as f32 * step[j];
                assert!((back - probs[j][t]).abs() <= 0.5 * step[j] * (1.0 + 1e-5), "head {j} token {t}");
            }
        }
    }

    /// `finish` moves the accumulator at [`segment_position`]`(dim)` to `dim`, segment by
    /// segment, over rows of 64 and 128.
    #[test]
    fn finish_puts_every_segment_back_in_dimension_order() {
        if !super::super::isa::Isa::Avx512.supported() {
            eprintln!("SKIPPED the int8_pv finish check: this CPU lacks AVX-512");
            return;
        }
        for d in [64, 128] {
            // Two rows; the value of dimension `dim` of row `r` is 1000 r + dim.
            let want: Vec<f32> = (0..2 * d).map(|x| (1000 * (x / d) + x % d) as f32).collect();
            let mut acc = vec![0f32; 2 * d];
            for (x, &v) in want.iter().enumerate() {
                let (seg, dim) = (x / SEG, x % SEG);
                acc[seg * SEG + segment_position(dim)] = v;
            }
            if !super::super::isa::cpu_features().contains(&"avx512vnni") {
                eprintln!("SKIPPED the int8_pv finish check: this CPU lacks AVX-512 VNNI");
                return;
            }
            // SAFETY: the CPU has the AVX-512 path's features and avx512_vnni (checked above).
            unsafe { <IntPv as Pv<i8>>::finish(&IntPv, &mut acc, d) };
            assert_eq!(acc, want, "head_dim {d}");
        }
    }
}
