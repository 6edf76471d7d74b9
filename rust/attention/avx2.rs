//! AVX2 + FMA + F16C kernel: 8 tokens per register, same structure as [`super::avx512`]
//! (head tiles of 4 with two partial sums each, online softmax in registers, V
//! accumulators of 4 heads x 16 dimensions held across the chunk, next-tile prefetch).
//!
//! AVX2 has no masked 16-bit load, so a partial chunk (fewer than 8 tokens, or a
//! `head_dim` tail) is staged through a zeroed stack buffer; full chunks load directly.
//!
//! 8-bit caches read 8 one-byte codes per load (`vmovq`) and dequantize in registers as
//! the AVX-512 path does: int8 by `vpmovsxbd` + `vcvtdq2ps`; fp8 e5m2 is the high byte of
//! an f16 (`vpmovzxbw`, a 16-bit shift, `vcvtph2ps`); fp8 e4m3 is moved into f16 bit
//! positions (sign << 8, the other seven bits << 7: exact, the value divided by 2^8; its
//! NaN codes OR'd to an f16 NaN) and widened by `vcvtph2ps`. A partial load stages the
//! codes (not their values) so that both go through one conversion. The scales never
//! touch the codes: the K scales (8 per-token scales for int8, one per head for fp8,
//! times 2^8 for e4m3) multiply the scores, the V scales the probabilities after the
//! softmax sum took them, so `P V` runs on the codes ([`scale_vector`]).

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::work::{load_factor, Ahead, Chunk, Partial, Work, LAZY_MAX};
use crate::kv::quant::TileScale;
use crate::kv::{DType, Elem};

const W: usize = 8;
const HT: usize = 4;
/// V accumulator vectors per head per pass: 4 heads x 2 (16 dimensions each) = 8 of the
/// 16 ymm registers, with the V row and the broadcast probability beside them (4 per
/// head spilled accumulators to the stack in the token loop: 8-bit decode 18-22% slower,
/// bf16 8%, at shape (a) of `benches/bench_quant.py`).
const VT: usize = 2;

/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    let g = w.g;
    let mut probs = [[0f32; W]; HT];
    w.for_each_chunk(W, |hi, chunk, pf| {
        let mut j0 = 0;
        while j0 < g {
            let qh = hi * g + j0;
            let pf = if j0 == 0 { pf } else { None };
            match g - j0 {
                1 => head_tile::<E, 1>(chunk, w.q, qh, p, &mut probs, pf),
                2 => head_tile::<E, 2>(chunk, w.q, qh, p, &mut probs, pf),
                3 => head_tile::<E, 3>(chunk, w.q, qh, p, &mut probs, pf),
                _ => head_tile::<E, 4>(chunk, w.q, qh, p, &mut probs, pf),
            }
            j0 += HT;
        }
    });
}

/// Load `min(n, 8)` elements of `x` starting at `at` as f32 (missing lanes are 0; 8-bit
/// codes as [`widen8`] gives them, e4m3 divided by 2^8).
/// Safe: the slice bounds are checked; only the full-width case uses a raw load.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load<E: Elem>(x: &[E], at: usize, n: usize) -> __m256 {
    if E::DTYPE.is_quantized() {
        return load8(x, at, n);
    }
    if n >= W {
        let s = &x[at..at + W];
        // SAFETY: `s` holds exactly 8 elements (checked slice).
        unsafe {
            match E::DTYPE {
                DType::F32 => _mm256_loadu_ps(s.as_ptr().cast()),
                DType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast())),
                _ => {
                    let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.as_ptr().cast()));
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
                }
            }
        }
    } else {
        let mut buf = [0f32; W];
        for (b, e) in buf.iter_mut().zip(&x[at..at + n]) {
            *b = e.to_f32();
        }
        // SAFETY: buf holds 8 f32.
        unsafe { _mm256_loadu_ps(buf.as_ptr()) }
    }
}

/// [`load`] for one-byte codes: 8 codes in one 64-bit load (fewer staged as codes, the
/// missing ones 0), widened by [`widen8`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load8<E: Elem>(x: &[E], at: usize, n: usize) -> __m256 {
    debug_assert!(std::mem::size_of::<E>() == 1);
    let s = &x[at..at + n.min(W)];
    let bits = if n >= W {
        // SAFETY: `s` holds exactly 8 one-byte elements (checked slice, `E` is a sealed
        // one-byte plain-data code for the 8-bit dtypes).
        unsafe { std::ptr::read_unaligned(s.as_ptr().cast::<u64>()) }
    } else {
        let mut b = [0u8; W];
        for (i, e) in s.iter().enumerate() {
            // SAFETY: `e` is one byte of plain data (as above).
            b[i] = unsafe { *(e as *const E).cast::<u8>() };
        }
        u64::from_le_bytes(b)
    };
    widen8::<E>(_mm_cvtsi64_si128(bits as i64))
}

/// The 8 codes in the low 64 bits of `x` as f32: int8 and e5m2 exactly, e4m3 divided by
/// 2^8 (see [`load_factor`]), NaN codes as NaN.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn widen8<E: Elem>(x: __m128i) -> __m256 {
    match E::DTYPE {
        DType::I8 => _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)),
        DType::E5M2 => _mm256_cvtph_ps(_mm_slli_epi16::<8>(_mm_cvtepu8_epi16(x))),
        _ => {
            // e4m3: sign to bit 15, exponent and mantissa to bits 7..14 of an f16 (whose
            // bias is 8 more); the NaN codes (0x7f, 0xff) become 0xffff, an f16 NaN.
            let w = _mm_cvtepu8_epi16(x);
            let mag = _mm_and_si128(w, _mm_set1_epi16(0x7f));
            let sign = _mm_slli_epi16::<8>(_mm_and_si128(w, _mm_set1_epi16(0x80)));
            let h = _mm_or_si128(sign, _mm_slli_epi16::<7>(mag));
            let nan = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f));
            _mm256_cvtph_ps(_mm_or_si128(h, nan))
        }
    }
}

/// The scales of tokens `c0..c0 + n` (at most 8; missing lanes 0) times [`load_factor`],
/// or `None` for an unquantized cache (scale 1, nothing to multiply).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_vector<E: Elem>(ts: &TileScale, c0: usize, n: usize) -> Option<__m256> {
    let f = load_factor(E::DTYPE);
    match ts {
        TileScale::One => None,
        TileScale::Head(s) => Some(_mm256_set1_ps(s * f)),
        TileScale::Token(s) => {
            let v = load(s, c0, n);
            Some(if f == 1.0 { v } else { _mm256_mul_ps(v, _mm256_set1_ps(f)) })
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax(x: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(x: __m256) -> f32 {
    let m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)))
}

/// `2^x` for `x <= LAZY_MAX` (inputs below -126 give about 1e-38).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn exp2(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(-126.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm256_sub_ps(x, n);
    const C: [f32; 8] = super::work::EXP2_TAYLOR;
    let mut r = _mm256_set1_ps(C[7]);
    for &c in C[..7].iter().rev() {
        r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(c));
    }
    // 2^n with n in -126..=LAZY_MAX built in the exponent field: always a normal float.
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(r, _mm256_castsi256_ps(e))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn head_tile<E: Elem, const H: usize>(
    c: &Chunk<E>,
    q: &[f32],
    qh: usize,
    p: &mut Partial,
    probs: &mut [[f32; W]; HT],
    prefetch: Option<Ahead<E>>,
) {
    let (d, bs, n) = (c.d, c.bs, c.lanes);
    // One slice of exactly d per head lets the compiler drop the index checks below.
    let qr: [&[f32]; H] = std::array::from_fn(|j| &q[(qh + j) * d..(qh + j + 1) * d]);
    // The next tiles into L1 and the far ones into L2, spread over the score loop (a
    // burst of L2 prefetches at the tile's start stalls on the miss buffers).
    let (pf_k, pf_v, pf_row) = match prefetch {
        Some(Ahead { k, v, .. }) => (k.as_ptr().cast::<i8>(), v.as_ptr().cast::<i8>(), std::mem::size_of_val(k) / d),
        None => (std::ptr::null(), std::ptr::null(), 0),
    };
    let (far_k, far_v) = match prefetch.and_then(|a| a.far) {
        Some((k, v)) => (k.as_ptr().cast::<i8>(), v.as_ptr().cast::<i8>()),
        None => (std::ptr::null(), std::ptr::null()),
    };
    let mut s0 = [_mm256_setzero_ps(); H];
    let mut s1 = [_mm256_setzero_ps(); H];
    let mut i = 0;
    while i + 2 <= d {
        let k0 = load(c.kt, i * bs + c.c0, n);
        let k1 = load(c.kt, (i + 1) * bs + c.c0, n);
        if !pf_k.is_null() {
            // Prefetches never fault; the addresses stay inside the next tile.
            // Two rows per iteration: cover their share of both next tiles, whole lines.
            let mut off = i * pf_row;
            while off < (i + 2) * pf_row {
                _mm_prefetch::<_MM_HINT_T0>(pf_k.wrapping_add(off));
                _mm_prefetch::<_MM_HINT_T0>(pf_v.wrapping_add(off));
                if !far_k.is_null() {
                    // The far tiles have the next ones' size (every tile of a cache does).
                    _mm_prefetch::<_MM_HINT_T1>(far_k.wrapping_add(off));
                    _mm_prefetch::<_MM_HINT_T1>(far_v.wrapping_add(off));
                }
                off += 64;
            }
        }
        for j in 0..H {
            s0[j] = _mm256_fmadd_ps(_mm256_set1_ps(qr[j][i]), k0, s0[j]);
            s1[j] = _mm256_fmadd_ps(_mm256_set1_ps(qr[j][i + 1]), k1, s1[j]);
        }
        i += 2;
    }
    if i < d {
        let k0 = load(c.kt, i * bs + c.c0, n);
        for j in 0..H {
            s0[j] = _mm256_fmadd_ps(_mm256_set1_ps(qr[j][i]), k0, s0[j]);
        }
    }

    // 8-bit K: the scores carry the K scales; V: the probabilities carry the V scales.
    let kscale = scale_vector::<E>(&c.ks, c.c0, n);
    let vscale = scale_vector::<E>(&c.vs, c.c0, n);
    // Lanes >= n hold no token: force their score to -inf, hence probability 0.
    let valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    let valid = _mm256_castsi256_ps(valid);
    // The lazy maximum of `LAZY_MAX`: moved (and the accumulators rescaled) only when a
    // score exceeds it by more than that, as on the AVX-512 path.
    let mut alpha = [1f32; H];
    let mut rescale = false;
    for j in 0..H {
        let s = _mm256_add_ps(s0[j], s1[j]);
        let s = kscale.map_or(s, |ks| _mm256_mul_ps(s, ks));
        let s = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, valid);
        let m_old = p.m[qh + j];
        // Always taken on the first chunk (m = -inf); lanes without a token are -inf.
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(s, _mm256_set1_ps(m_old + LAZY_MAX))) != 0 {
            let m_new = hmax(s);
            // exp2 of the vector unit, not libm's: a call would spill every register.
            alpha[j] = _mm256_cvtss_f32(exp2(_mm256_set1_ps(m_old - m_new)));
            p.m[qh + j] = m_new;
            rescale = true;
        }
        let e = _mm256_and_ps(exp2(_mm256_sub_ps(s, _mm256_set1_ps(p.m[qh + j]))), valid);
        p.l[qh + j] = p.l[qh + j] * alpha[j] + hsum(e);
        let e = vscale.map_or(e, |vs| _mm256_mul_ps(e, vs));
        // SAFETY: probs[j] holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(probs[j].as_mut_ptr(), e) };
    }

    let acc = &mut p.acc[qh * d..(qh + H) * d];
    let mut u0 = 0;
    while u0 < d {
        let w: [usize; VT] = std::array::from_fn(|u| d.saturating_sub(u0 + u * W).min(W));
        let mut a = [[_mm256_setzero_ps(); VT]; H];
        for j in 0..H {
            let al = _mm256_set1_ps(alpha[j]);
            for u in 0..VT {
                if w[u] > 0 {
                    a[j][u] = load(acc, j * d + u0 + u * W, w[u]);
                    if rescale {
                        a[j][u] = _mm256_mul_ps(al, a[j][u]);
                    }
                }
            }
        }
        for t in 0..c.lanes {
            let row = (c.c0 + t) * d + u0;
            // A loop, not `array::from_fn`: a closure does not inherit the target
            // features, so `load` would be an out-of-line call per vector.
            let mut v = [_mm256_setzero_ps(); VT];
            for u in 0..VT {
                if w[u] > 0 {
                    v[u] = load(c.vt, row + u * W, w[u]);
                }
            }
            for j in 0..H {
                let pj = _mm256_set1_ps(probs[j][t]);
                for u in 0..VT {
                    a[j][u] = _mm256_fmadd_ps(pj, v[u], a[j][u]);
                }
            }
        }
        for j in 0..H {
            for u in 0..VT {
                let at = j * d + u0 + u * W;
                if w[u] == W {
                    let dst = &mut acc[at..at + W];
                    // SAFETY: dst holds exactly 8 f32 (checked slice).
                    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), a[j][u]) };
                } else if w[u] > 0 {
                    let mut buf = [0f32; W];
                    // SAFETY: buf holds 8 f32.
                    unsafe { _mm256_storeu_ps(buf.as_mut_ptr(), a[j][u]) };
                    acc[at..at + w[u]].copy_from_slice(&buf[..w[u]]);
                }
            }
        }
        u0 += VT * W;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::test_util::check_every_code;
    use crate::kv::elem::{E4M3, E5M2};

    /// [`load8`]'s in-register conversions on all 256 codes, 8 at a time at full width and
    /// staged (1..7 codes, the rest 0).
    fn all_codes<E: Elem>(code: impl Fn(u8) -> E) {
        if !crate::attention::isa::Isa::Avx2.supported() {
            eprintln!("SKIPPED AVX2 fp8/int8 conversions: no AVX2 on this CPU");
            return;
        }
        let counts: Vec<usize> = (1..=W).collect();
        check_every_code(code, W, &counts, load_factor(E::DTYPE), |codes, at, n| {
            let mut got = [0f32; W];
            // SAFETY: the CPU check above; got holds 8 f32.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), load(codes, at, n)) };
            got.to_vec()
        });
    }

    #[test]
    fn register_dequantization_is_exact_on_every_code() {
        all_codes(|c| c as i8);
        all_codes(E4M3);
        all_codes(E5M2);
    }
}
