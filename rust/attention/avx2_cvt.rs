//! Element loads and vector helpers of the AVX2 path (`Avx2` in [`super::lanes`]): 8
//! cached values of any storage dtype as f32 (f16 by `vcvtph2ps`, bf16 by a 16-bit
//! shift, int8 by `vpmovsxbd` + `vcvtdq2ps`, fp8 through f16 bits; a partial row staged
//! through a zeroed buffer by a checked load), the per-token or per-head scales of a
//! chunk, the horizontal maximum and `exp2`.
//!
//! 8-bit caches read 8 one-byte codes per load (`vmovq`) and dequantize in registers as
//! the AVX-512 path does: int8 by `vpmovsxbd` + `vcvtdq2ps`; fp8 e5m2 is the high byte of
//! an f16 (one `vpunpcklbw` against zero, `vcvtph2ps`); fp8 e4m3 is moved into f16 bit
//! positions (sign << 8, the other seven bits << 7: exact, the value divided by 2^8; its
//! NaN codes OR'd to an f16 NaN) and widened by `vcvtph2ps`. A partial load stages the
//! codes (not their values) so that both go through one conversion.

use std::arch::x86_64::*;

use super::work::load_factor;
use crate::kv::quant::TileScale;
use crate::kv::{DType, Elem};

/// f32 lanes per register.
const W: usize = 8;

/// Load `min(n, 8)` elements of `x` starting at `at` as f32 (missing lanes are 0; 8-bit
/// codes as [`widen8`] gives them, e4m3 divided by 2^8).
/// Safe: the slice bounds are checked; only the full-width case uses a raw load.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load<E: Elem>(x: &[E], at: usize, n: usize) -> __m256 {
    if E::DTYPE.is_quantized() {
        return load8(x, at, n);
    }
    if n >= W {
        let s = &x[at..at + W];
        // SAFETY: `s` holds exactly 8 elements (checked slice).
        unsafe { load_full(s.as_ptr()) }
    } else {
        let mut buf = [0f32; W];
        for (b, e) in buf.iter_mut().zip(&x[at..at + n]) {
            *b = e.to_f32();
        }
        // SAFETY: buf holds 8 f32.
        unsafe { _mm256_loadu_ps(buf.as_ptr()) }
    }
}

/// 8 elements at `p` as f32 (8-bit codes as [`widen8`] gives them).
///
/// # Safety
/// `p .. p + 8` is readable; the CPU has the features below.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load_full<E: Elem>(p: *const E) -> __m256 {
    // SAFETY: 8 elements of `size_of::<E>()` bytes at p (the caller's contract): 32, 16
    // or 8 bytes, as each load reads.
    unsafe {
        match E::DTYPE {
            DType::F32 => _mm256_loadu_ps(p.cast()),
            DType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            DType::BF16 => {
                let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
            }
            _ => widen8::<E>(_mm_loadl_epi64(p.cast())),
        }
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
        // Each code the high byte of a word whose low byte is 0: one unpack.
        DType::E5M2 => _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), x)),
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
pub(crate) fn scale_vector<E: Elem>(ts: &TileScale, c0: usize, n: usize) -> Option<__m256> {
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
pub(crate) fn hmax(x: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum(x: __m256) -> f32 {
    let m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)))
}

/// `2^x` for `x <= LAZY_MAX` (inputs below -126 give about 1e-38).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn exp2(x: __m256) -> __m256 {
    exp2_each([x])[0]
}

/// [`exp2`] of each vector, the polynomial's steps interleaved across them (one
/// head's is a chain of dependent FMAs).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn exp2_each<const H: usize>(x: [__m256; H]) -> [__m256; H] {
    const C: [f32; 8] = super::work::EXP2_TAYLOR;
    let mut n = [_mm256_setzero_ps(); H];
    let mut f = [_mm256_setzero_ps(); H];
    let low = _mm256_set1_ps(super::work::EXP2_ZERO_BELOW);
    let mut r = [_mm256_set1_ps(C[7]); H];
    // All ones where x is below the bound (not where it is NaN).
    let mut zero = [_mm256_setzero_ps(); H];
    for j in 0..H {
        zero[j] = _mm256_cmp_ps::<_CMP_LT_OQ>(x[j], low);
        let xj = _mm256_max_ps(x[j], low);
        n[j] = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(xj);
        f[j] = _mm256_sub_ps(xj, n[j]);
    }
    for &c in C[..7].iter().rev() {
        for j in 0..H {
            r[j] = _mm256_fmadd_ps(r[j], f[j], _mm256_set1_ps(c));
        }
    }
    for j in 0..H {
        // 2^n with n in -64..=LAZY_MAX built in the exponent field: always a normal float.
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n[j]), _mm256_set1_epi32(127)));
        r[j] = _mm256_andnot_ps(zero[j], _mm256_mul_ps(r[j], _mm256_castsi256_ps(e)));
    }
    r
}

/// [`super::work::soft_cap`] of each score vector, as the AVX-512 path's: the `exp2`
/// argument clamped to +-[`super::work::SOFT_CAP_ARG`], a NaN score kept.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn soft_cap_each<const H: usize>(s: [__m256; H], c: f32) -> [__m256; H] {
    let (k, lim) = (_mm256_set1_ps(2.0 * std::f32::consts::LOG2_E / c), _mm256_set1_ps(super::work::SOFT_CAP_ARG));
    let x = s.map(|v| _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, k), _mm256_sub_ps(_mm256_setzero_ps(), lim)), lim));
    let e = exp2_each(x);
    let (cv, two_c, one) = (_mm256_set1_ps(c), _mm256_set1_ps(2.0 * c), _mm256_set1_ps(1.0));
    let mut out = e.map(|v| _mm256_sub_ps(cv, _mm256_div_ps(two_c, _mm256_add_ps(v, one))));
    for (o, v) in out.iter_mut().zip(s) {
        *o = _mm256_blendv_ps(*o, v, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    }
    out
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
