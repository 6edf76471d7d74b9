//! AVX-512 (F, BW, VL) for the shared decode loop (`simd.rs`, through `lanes::Avx512`):
//! 16 cached values of any storage dtype widened to f32 in registers, the per-token or
//! per-head scales of a chunk, `exp2` and the soft cap, the lane masks of a row.
//!
//! f16 widens by `vcvtph2ps`, bf16 exactly by a 16-bit shift, int8 by `vpmovsxbd` +
//! `vcvtdq2ps`. fp8 e5m2 is the high byte of an f16: 16 codes broadcast to both 128-bit
//! lanes, one `vpshufb` into high bytes, `vcvtph2ps` ([`e5m2_16`]). fp8 e4m3 moves into f16
//! bit positions (the value divided by 2^8, exact for normals and subnormals:
//! [`e4m3_over_256`]), 32 codes at once where two rows are read together ([`load_pair`]).
//! Its two NaN codes would read as numbers, so the loop checks each tile once
//! ([`e4m3_nan_in`], `Elements::misreads`) and an item that read one runs again on the AVX2
//! path (`Partial::nan_codes`); only a cache that handed out a writable view
//! (`KvCache::raw_writes`) is checked, as its own writes never make a NaN code.
//! The precisions that compute with other instructions keep their files (`avx512_bf16`,
//! `avx512_vnni`, `avx512_fp16`, `avx512_e4m3`); AVX2 and NEON keep their loads in
//! [`super::avx2_cvt`] and `super::neon_cvt`.

use std::arch::x86_64::*;

use super::work::{load_factor, Chunk, EXP2_TAYLOR, EXP2_ZERO_BELOW, SOFT_CAP_ARG};
use crate::kv::quant::TileScale;
use crate::kv::{DType, Elem};

/// Lanes per vector.
pub(crate) const W: usize = 16;
/// Load 16 elements as f32; masked-off lanes read as 0 and are not accessed. e4m3's
/// two NaN codes read as +-1.875 / 2^8 ([`e4m3_over_256`]): the caller checks its tiles
/// for them.
///
/// # Safety
/// Every unmasked lane `i` must satisfy `p.add(i)` inside one live allocation.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn load<E: Elem>(p: *const E, mask: __mmask16) -> __m512 {
    // SAFETY: the caller guarantees every unmasked lane is in bounds; `E::DTYPE` is the
    // element type of `p` (a sealed `Elem`), so the lanes read are whole elements.
    unsafe {
        match E::DTYPE {
            DType::F32 => _mm512_maskz_loadu_ps(mask, p.cast()),
            DType::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p.cast())),
            DType::BF16 => {
                let x = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p.cast()));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x))
            }
            // A full mask takes a plain load, which folds into the widening instruction.
            DType::E5M2 if mask == 0xffff => e5m2_16(p.cast()),
            DType::I8 | DType::E4M3 | DType::E5M2 => {
                let x = if mask == 0xffff { _mm_loadu_si128(p.cast()) } else { _mm_maskz_loadu_epi8(mask, p.cast()) };
                match E::DTYPE {
                    DType::I8 => _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x)),
                    DType::E5M2 => _mm512_cvtph_ps(_mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(x))),
                    _ => e4m3_over_256(x),
                }
            }
        }
    }
}

/// `vpshufb` indices of [`e5m2_16`]: in 128-bit lane `L` (0, 1), word `i` takes code
/// `8 L + i` as its high byte and 0 as its low byte (an index with bit 7 set writes 0).
const E5M2_TO_F16: [i8; 32] = {
    let mut x = [0; 32];
    let mut j = 0;
    while j < 32 {
        let (lane, w) = (j / 16, (j % 16) / 2);
        x[j] = if j % 2 == 0 { -128 } else { (8 * lane + w) as i8 };
        j += 1;
    }
    x
};

/// 16 e5m2 codes at `p` as f32 (exact, infinities and NaNs included): a code is the high
/// byte of the f16 of the same value. The 16 bytes are broadcast to both 128-bit lanes (a
/// load: no shuffle port) and one in-lane `vpshufb` moves each lane's 8 codes into the
/// high bytes of its words, zeroing the low bytes; `vcvtph2ps` widens. One shuffle-port
/// instruction instead of `vpmovzxbw` + `vpsllw`.
///
/// # Safety
/// 16 bytes at `p` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn e5m2_16(p: *const u8) -> __m512 {
    // SAFETY: 16 readable bytes (caller); the table holds 32.
    let (x, idx) = unsafe { (_mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast())), _mm256_loadu_si256(E5M2_TO_F16.as_ptr().cast())) };
    _mm512_cvtph_ps(_mm256_shuffle_epi8(x, idx))
}

/// 16 e4m3 codes (the bytes of `x`) as f32 values divided by 2^8, in 4 instructions
/// (the first version's 8, the last one's 6): sign-extended to 16 bits and shifted left
/// by 7, a code's exponent and mantissa land in bits 7..14 of an f16 (whose bias is 8 more: exact for
/// normals and subnormals) and its sign in bits 15 and 14, bit 14 cleared by one `and`;
/// `vcvtph2ps` widens. Exact on every code but the two NaN codes (`0x7f`, `0xff`, whose
/// 7 low bits are all set), which read as +-1.875 (480 / 2^8): the tile loop checks each
/// tile for them once ([`e4m3_nan_in`]) and a tile holding one has its item run again by
/// the AVX2 path, instead of masking every conversion (`vpaddw` + `vptestmw` per 16
/// codes; without it a call took 0.91-0.95x the time: `docs/experiments.md`, "Decode
/// attention: conversions").
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) fn e4m3_over_256(x: __m128i) -> __m512 {
    let s = _mm256_cvtepi8_epi16(x);
    _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16::<7>(s), _mm256_set1_epi16(0xbfffu16 as i16)))
}

/// Two runs of 16 whole elements, `stride` elements apart (`p` and `p + stride`), widened
/// as [`load`] does. e4m3 widens both at once, 32 codes in one 512-bit register
/// ([`e4m3_32_over_256`]): one sign extension, shift and `and` for the 32 and one
/// `vextracti64x4` for the upper 16, 8 instructions instead of 2 x 5 (with a
/// `vinserti128` to join the runs where they are not adjacent); the other dtypes load
/// each run as [`load`] does.
///
/// # Safety
/// Elements `p .. p + 16` and `p + stride .. p + stride + 16` must lie inside one live
/// allocation.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn load_pair<E: Elem>(p: *const E, stride: usize) -> [__m512; 2] {
    // SAFETY: both runs of 16 elements are readable (the caller); an e4m3 element is one
    // byte, so the two 16-byte loads (one 32-byte load when adjacent) cover exactly them.
    unsafe {
        if E::DTYPE == DType::E4M3 {
            let b = p.cast::<u8>();
            let x = if stride == W {
                _mm256_loadu_si256(b.cast())
            } else {
                _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_loadu_si128(b.cast())), _mm_loadu_si128(b.add(stride).cast()))
            };
            e4m3_32_over_256(x)
        } else {
            [load(p, 0xffff), load(p.add(stride), 0xffff)]
        }
    }
}

/// 32 e4m3 codes (the bytes of `x`) as two vectors of f32 values divided by 2^8, codes
/// 0..16 then 16..32: [`e4m3_over_256`]'s sequence on 32 codes at once, the upper half's
/// f16 words moved down by `vextracti64x4` for the second `vcvtph2ps`. The same values,
/// NaN codes included (+-1.875).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) fn e4m3_32_over_256(x: __m256i) -> [__m512; 2] {
    let h = _mm512_and_si512(_mm512_slli_epi16::<7>(_mm512_cvtepi8_epi16(x)), _mm512_set1_epi16(0xbfffu16 as i16));
    [_mm512_cvtph_ps(_mm512_castsi512_si256(h)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h))]
}

/// Whether `codes` holds an e4m3 NaN code (7 low bits all set), 64 bytes per step: the
/// largest 7-bit magnitude of the run, one `and` and one `vpmaxub` per 64 codes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) fn e4m3_nan_in(codes: &[u8]) -> bool {
    let low = _mm512_set1_epi8(0x7f);
    let mut top = _mm512_setzero_si512();
    let mut chunks = codes.chunks_exact(64);
    for c in &mut chunks {
        // SAFETY: `c` is 64 readable bytes.
        let x = unsafe { _mm512_loadu_si512(c.as_ptr().cast()) };
        top = _mm512_max_epu8(top, _mm512_and_si512(x, low));
    }
    let rest = chunks.remainder();
    let mask = if rest.is_empty() { 0 } else { u64::MAX >> (64 - rest.len()) };
    // SAFETY: the mask covers the `rest.len() < 64` readable bytes; masked-off bytes
    // are not accessed (AVX-512 fault suppression) and read as 0.
    let x = unsafe { _mm512_maskz_loadu_epi8(mask, rest.as_ptr().cast()) };
    top = _mm512_max_epu8(top, _mm512_and_si512(x, low));
    _mm512_cmpeq_epi8_mask(top, low) != 0
}

/// The scales of a chunk's 16 token lanes (masked-off lanes 0) times `load_factor`, or
/// `None` for an unquantized cache (scale 1, nothing to multiply).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) fn scale_vector<E: Elem>(ts: &TileScale, c0: usize, mask: __mmask16) -> Option<__m512> {
    let f = load_factor(E::DTYPE);
    match ts {
        TileScale::One => None,
        TileScale::Head(s) => Some(_mm512_set1_ps(s * f)),
        TileScale::Token(s) => {
            assert!(c0 + (16 - mask.leading_zeros() as usize) <= s.len());
            // SAFETY: the unmasked lanes are tokens c0.. c0 + lanes, inside the tile's
            // block_size scales (assert above).
            let v = unsafe { _mm512_maskz_loadu_ps(mask, s.as_ptr().wrapping_add(c0)) };
            Some(if f == 1.0 { v } else { _mm512_mul_ps(v, _mm512_set1_ps(f)) })
        }
    }
}

/// `2^x` for `x <= LAZY_MAX`; exactly 0 below [`EXP2_ZERO_BELOW`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) fn exp2(x: __m512) -> __m512 {
    exp2_each([x])[0]
}

/// [`exp2`] of each vector, the polynomial's steps interleaved across them.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) fn exp2_each<const H: usize>(x: [__m512; H]) -> [__m512; H] {
    // Taylor series of 2^f = e^(f ln 2) on [-0.5, 0.5]; the degree-8 term is < 6e-9.
    const C: [f32; 8] = EXP2_TAYLOR;
    let low = _mm512_set1_ps(EXP2_ZERO_BELOW);
    let mut n = [_mm512_setzero_ps(); H];
    let mut f = [_mm512_setzero_ps(); H];
    let mut r = [_mm512_set1_ps(C[7]); H];
    let mut keep = [0 as __mmask16; H];
    for j in 0..H {
        // Not below the bound, or NaN.
        keep[j] = !_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x[j], low);
        let xj = _mm512_max_ps(x[j], low);
        n[j] = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(xj);
        f[j] = _mm512_sub_ps(xj, n[j]);
    }
    for &c in C[..7].iter().rev() {
        for j in 0..H {
            r[j] = _mm512_fmadd_ps(r[j], f[j], _mm512_set1_ps(c));
        }
    }
    for j in 0..H {
        r[j] = _mm512_maskz_mov_ps(keep[j], _mm512_scalef_ps(r[j], n[j]));
    }
    r
}

/// [`super::work::soft_cap`] of each score vector, the heads' `exp2` interleaved; the
/// argument is clamped to +-[`SOFT_CAP_ARG`] (where the result is `+-c` in f32), a NaN
/// score stays NaN.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) fn soft_cap_each<const H: usize>(s: [__m512; H], c: f32) -> [__m512; H] {
    let (k, lim) = (_mm512_set1_ps(2.0 * std::f32::consts::LOG2_E / c), _mm512_set1_ps(SOFT_CAP_ARG));
    let x = s.map(|v| _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, k), _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim));
    let e = exp2_each(x);
    let (cv, two_c, one) = (_mm512_set1_ps(c), _mm512_set1_ps(2.0 * c), _mm512_set1_ps(1.0));
    let mut out = e.map(|v| _mm512_sub_ps(cv, _mm512_div_ps(two_c, _mm512_add_ps(v, one))));
    for (o, v) in out.iter_mut().zip(s) {
        *o = _mm512_mask_mov_ps(*o, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v), v);
    }
    out
}

/// The lanes of a chunk's tokens.
#[inline]
pub(crate) fn chunk_mask<E>(c: &Chunk<E>) -> __mmask16 {
    lane_mask(0, c.lanes)
}

/// Lanes of the 16-wide vector starting at element `i` of a row of `n` elements.
#[inline]
pub(crate) fn lane_mask(i: usize, n: usize) -> __mmask16 {
    let r = n.saturating_sub(i);
    if r >= W {
        0xffff
    } else {
        (1u16 << r) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::test_util::check_every_code;
    use crate::kv::elem::{E4M3, E5M2};

    /// The in-register conversions of [`load`] on all 256 codes, 16 at a time, and with a
    /// partial mask.
    fn all_codes<E: Elem>(code: impl Fn(u8) -> E) {
        if !crate::attention::isa::Isa::Avx512.supported() {
            eprintln!("SKIPPED AVX-512 fp8/int8 conversions: no AVX-512 on this CPU");
            return;
        }
        check_every_code(code, 16, &[16, 8], load_factor(E::DTYPE), |codes, at, n| {
            let mut got = [0f32; 16];
            // SAFETY: the CPU check above; the n lanes at..at + n lie inside `codes`.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), load(codes.as_ptr().add(at), ((1u32 << n) - 1) as u16)) };
            got.to_vec()
        });
    }

    #[test]
    fn register_dequantization_is_exact_on_every_code() {
        all_codes(|c| c as i8);
        // e4m3's two NaN codes (checked per tile instead) read as +-480 (+-1.875 before
        // the load factor); every other code must come out exact.
        all_codes(|c| E4M3(if c & 0x7f == 0x7f { c - 1 } else { c }));
        all_codes(E5M2);
        if crate::attention::isa::Isa::Avx512.supported() {
            for (code, want) in [(0x7fu8, 1.875f32), (0xff, -1.875)] {
                let x = [code; 16];
                let mut got = [0f32; 16];
                // SAFETY: the CPU check above; 16 readable codes.
                unsafe { _mm512_storeu_ps(got.as_mut_ptr(), load(x.as_ptr().cast::<E4M3>(), 0xffff)) };
                assert!(got.iter().all(|&g| g == want), "{code:#x}: {got:?}");
            }
        }
    }

    /// [`load_pair`] reads bit for bit what two [`load`]s read, on every code (NaN codes
    /// included) at both halves, with adjacent runs (a tile of 16 tokens, a V row) and
    /// runs further apart (tiles of 32 and 48 tokens).
    fn pairs_match<E: Elem>(code: impl Fn(u8) -> E) {
        let codes: Vec<E> = (0..4 * 256).map(|i| code((i * 7 + i / 256) as u8)).collect();
        for stride in [16, 32, 48] {
            for at in (0..codes.len() - stride - 16).step_by(5) {
                let (mut got, mut want) = ([[0f32; 16]; 2], [[0f32; 16]; 2]);
                // SAFETY: the callers' CPU check; at + stride + 16 <= codes.len().
                unsafe {
                    let p = codes.as_ptr().add(at);
                    let pair = load_pair(p, stride);
                    for h in 0..2 {
                        _mm512_storeu_ps(got[h].as_mut_ptr(), pair[h]);
                        _mm512_storeu_ps(want[h].as_mut_ptr(), load(p.add(h * stride), 0xffff));
                    }
                }
                for h in 0..2 {
                    let (g, w) = (got[h].map(f32::to_bits), want[h].map(f32::to_bits));
                    assert_eq!(g, w, "{:?} stride {stride} at {at} half {h}", E::DTYPE);
                }
            }
        }
    }

    #[test]
    fn a_pair_load_reads_what_two_loads_read() {
        if !crate::attention::isa::Isa::Avx512.supported() {
            eprintln!("SKIPPED AVX-512 pair loads: no AVX-512 on this CPU");
            return;
        }
        pairs_match(E4M3);
        pairs_match(E5M2);
        pairs_match(|c| c as i8);
    }

    /// The tile check finds a NaN code (0x7f or 0xff) at every position of runs of 0 to
    /// 200 bytes (whole 64-byte steps and every tail), and nothing in runs of every other
    /// code, the near misses (0x7e, 0xfe, 0x3f, 0xbf) included.
    #[test]
    fn the_tile_check_finds_every_nan_code_and_nothing_else() {
        if !crate::attention::isa::Isa::Avx512.supported() {
            eprintln!("SKIPPED the AVX-512 e4m3 tile check: no AVX-512 on this CPU");
            return;
        }
        // SAFETY: the CPU check above.
        let has = |x: &[u8]| unsafe { e4m3_nan_in(x) };
        let others: Vec<u8> = (0..=255u8).filter(|c| c & 0x7f != 0x7f).collect();
        for n in 0..=200usize {
            let run: Vec<u8> = (0..n).map(|i| others[(i * 37 + n) % others.len()]).collect();
            assert!(!has(&run), "n={n}");
            for at in 0..n {
                for nan in [0x7f, 0xff] {
                    let mut x = run.clone();
                    x[at] = nan;
                    assert!(has(&x), "n={n} at={at} {nan:#x}");
                }
            }
        }
        // Past the run's end a NaN code is not read (a slice of a longer buffer).
        let mut x = vec![0u8; 130];
        x[129] = 0x7f;
        assert!(!has(&x[..129]) && has(&x));
    }
}
