//! The widening of each dtype's codes to f32 in the decode paths' instruction sequences
//! ([`super::paths`]): bf16 `vpmovzxwd` + `vpslld` (K) or one unpack against
//! zero per 16 (V); int8 `vpmovsxbd` + `vcvtdq2ps`; e5m2 a broadcast load + `vpshufb` +
//! `vcvtph2ps`; e4m3 the kernel's conversion to f16 bit positions (32 codes at once, two K
//! rows or 32 elements of a V row, at g <= 2), without the per-tile NaN-code check that
//! the kernel runs only on a cache that handed out a writable view (not the measured calls),
//! or, with AVX-512 VBMI, the kernel's byte tables (`rust/attention/avx512_e4m3.rs`: 64
//! codes at once, four K rows or 64 elements of a V row, in the quad order).

use std::arch::x86_64::*;

/// A dtype's widening of codes to f32 (values, unscaled).
pub trait Widen {
    /// Bytes per element.
    const BYTES: usize;
    /// The largest number of query heads per KV head at which the kernel widens two K
    /// rows at once ([`Self::k2`]) and a V row by [`Self::v32`]; above it, 16 elements
    /// at a time ([`Self::k16`]).
    const PAIRS_UP_TO_G: usize = usize::MAX;
    /// 16 elements of a K row as f32.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL, FMA and F16C; `16 * BYTES` readable bytes at `p`.
    unsafe fn k16(p: *const u8) -> __m512;
    /// 32 elements of a V row as two f32 vectors (in any fixed order).
    ///
    /// # Safety
    /// As `k16`, `32 * BYTES` readable bytes.
    #[inline(always)]
    unsafe fn v32(p: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded to the caller.
        unsafe { [Self::k16(p), Self::k16(p.add(16 * Self::BYTES))] }
    }
    /// Two K rows of 16 elements, `stride` bytes apart.
    ///
    /// # Safety
    /// As `k16` at `p` and at `p + stride`.
    #[inline(always)]
    unsafe fn k2(p: *const u8, stride: usize) -> [__m512; 2] {
        // SAFETY: forwarded to the caller.
        unsafe { [Self::k16(p), Self::k16(p.add(stride))] }
    }
    /// Whether the K loop takes runs of four adjacent rows ([`Self::k4`]), whose vectors
    /// each hold the four rows in their 128-bit lanes (so the query operand is a vector
    /// with one dimension per lane, not a broadcast), and the V loop 64 elements at a time
    /// ([`Self::v64`]).
    const QUADS: bool = false;
    /// Four adjacent K rows of 16 elements (64 elements at `p`), in the widening's order.
    ///
    /// # Safety
    /// As `k16`, `64 * BYTES` readable bytes.
    #[inline(always)]
    unsafe fn k4(p: *const u8) -> [__m512; 4] {
        // SAFETY: forwarded to the caller.
        unsafe { [Self::k16(p), Self::k16(p.add(16 * Self::BYTES)), Self::k16(p.add(32 * Self::BYTES)), Self::k16(p.add(48 * Self::BYTES))] }
    }
    /// 64 elements of a V row as four f32 vectors (in the widening's order).
    ///
    /// # Safety
    /// As `k4`.
    #[inline(always)]
    unsafe fn v64(p: *const u8) -> [__m512; 4] {
        // SAFETY: forwarded to the caller.
        unsafe { Self::k4(p) }
    }
}

pub struct Bf16;
pub struct I8;
pub struct E5m2;
pub struct E4m3;

impl Widen for Bf16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn k16(p: *const u8) -> __m512 {
        // SAFETY: 32 readable bytes (caller); the features are the caller's.
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())))) }
    }
    #[inline(always)]
    unsafe fn v32(p: *const u8) -> [__m512; 2] {
        // SAFETY: 64 readable bytes (caller); the features are the caller's.
        unsafe {
            let (z, x) = (_mm512_setzero_si512(), _mm512_loadu_si512(p.cast()));
            [_mm512_castsi512_ps(_mm512_unpacklo_epi16(z, x)), _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, x))]
        }
    }
}

impl Widen for I8 {
    const BYTES: usize = 1;
    #[inline(always)]
    unsafe fn k16(p: *const u8) -> __m512 {
        // SAFETY: 16 readable bytes (caller); the features are the caller's.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))) }
    }
}

/// The kernel's e5m2 shuffle indices: in each 128-bit lane `L`, word `i` gets code
/// `8 L + i` as its high byte and a zero low byte.
const E5M2_TO_F16: [i8; 32] = {
    let mut x = [0; 32];
    let mut j = 0;
    while j < 32 {
        x[j] = if j % 2 == 0 { -128 } else { (8 * (j / 16) + (j % 16) / 2) as i8 };
        j += 1;
    }
    x
};

impl Widen for E5m2 {
    const BYTES: usize = 1;
    #[inline(always)]
    unsafe fn k16(p: *const u8) -> __m512 {
        // SAFETY: 16 readable bytes (caller); the table holds 32; the features are the caller's.
        unsafe {
            let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
            _mm512_cvtph_ps(_mm256_shuffle_epi8(x, _mm256_loadu_si256(E5M2_TO_F16.as_ptr().cast())))
        }
    }
}

impl Widen for E4m3 {
    const BYTES: usize = 1;
    /// As the kernel: 32 codes at once only with 1-2 query heads per KV head.
    const PAIRS_UP_TO_G: usize = 2;
    /// The instruction sequence of the kernel's e4m3 widening (value / 2^8; a NaN code
    /// reads as +-480, which only a cache that handed out a writable view checks for).
    #[inline(always)]
    unsafe fn k16(p: *const u8) -> __m512 {
        // SAFETY: 16 readable bytes (caller); the features are the caller's.
        unsafe {
            let s = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast()));
            _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16::<7>(s), _mm256_set1_epi16(0xbfffu16 as i16)))
        }
    }
    /// The kernel's V widening: 32 codes at once, the upper half's f16 words moved down
    /// for the second `vcvtph2ps`.
    #[inline(always)]
    unsafe fn v32(p: *const u8) -> [__m512; 2] {
        // SAFETY: 32 readable bytes (caller); the features are the caller's.
        unsafe { e4m3_32(_mm256_loadu_si256(p.cast())) }
    }
    /// The kernel's K widening of two rows at once (one 32-byte load where they are
    /// adjacent, as in a tile of 16 tokens).
    #[inline(always)]
    unsafe fn k2(p: *const u8, stride: usize) -> [__m512; 2] {
        // SAFETY: 16 readable bytes at p and at p + stride (caller); the features are the caller's.
        unsafe {
            let x = if stride == 16 {
                _mm256_loadu_si256(p.cast())
            } else {
                _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_loadu_si128(p.cast())), _mm_loadu_si128(p.add(stride).cast()))
            };
            e4m3_32(x)
        }
    }
}

/// The kernel's `e4m3_32_over_256`: 32 codes to f16 bit positions in one 512-bit register.
#[inline(always)]
unsafe fn e4m3_32(x: __m256i) -> [__m512; 2] {
    // SAFETY: register-only; the features are the caller's.
    unsafe {
        let h = _mm512_and_si512(_mm512_slli_epi16::<7>(_mm512_cvtepi8_epi16(x)), _mm512_set1_epi16(0xbfffu16 as i16));
        [_mm512_cvtph_ps(_mm512_castsi512_si256(h)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h))]
    }
}

/// The kernel's e4m3 widening by byte tables (AVX-512 VBMI; `avx512_e4m3.rs`): per 64
/// codes two 128-entry `vpermi2b` lookups (the low and high byte of the bf16 of each
/// magnitude over 2^8), the sign (`vpternlogd`), `vpunpck{l,h}bw` into bf16 words and
/// `vpslld` / `vpandd` into f32 lanes.
pub struct E4m3Tables;

#[repr(C, align(64))]
struct Tables {
    lo: [u8; 128],
    hi: [u8; 128],
}

/// The kernel's tables: bf16 bits of each e4m3 magnitude over 2^8 (the NaN magnitude as
/// 480 over 2^8, as the f16 route reads it).
static TABLES: Tables = {
    let mut t = Tables { lo: [0; 128], hi: [0; 128] };
    let mut c = 0;
    while c < 128 {
        let (e, m) = ((c >> 3) as u16, (c & 7) as u16);
        let b = if e == 0 && m == 0 {
            0
        } else if e == 0 {
            // m * 2^-9 over 2^8: normalised on m's top bit p.
            let p = if m >= 4 { 2 } else if m >= 2 { 1 } else { 0 };
            (p + 1 + 127 - 10 - 8) << 7 | (m - (1 << p)) << (7 - p)
        } else {
            (e + 127 - 7 - 8) << 7 | m << 4
        };
        t.lo[c] = b as u8;
        t.hi[c] = (b >> 8) as u8;
        c += 1;
    }
    t
};

#[inline(always)]
unsafe fn e4m3_64(x: __m512i) -> [__m512; 4] {
    // SAFETY: aligned 64-byte loads inside the static tables; the features are the caller's.
    unsafe {
        let t = &TABLES;
        let ld = |p: *const u8| _mm512_load_si512(p.cast());
        let lo = _mm512_permutex2var_epi8(ld(t.lo.as_ptr()), x, ld(t.lo.as_ptr().add(64)));
        let hi = _mm512_permutex2var_epi8(ld(t.hi.as_ptr()), x, ld(t.hi.as_ptr().add(64)));
        let hi = _mm512_ternarylogic_epi32::<0xf8>(hi, x, _mm512_set1_epi8(i8::MIN));
        let (a, b) = (_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi));
        let m = _mm512_set1_epi32(0xffff_0000u32 as i32);
        let f = _mm512_castsi512_ps;
        [f(_mm512_slli_epi32::<16>(a)), f(_mm512_and_si512(a, m)), f(_mm512_slli_epi32::<16>(b)), f(_mm512_and_si512(b, m))]
    }
}

impl Widen for E4m3Tables {
    const BYTES: usize = 1;
    const QUADS: bool = true;
    #[inline(always)]
    unsafe fn k16(p: *const u8) -> __m512 {
        // SAFETY: 16 readable bytes (caller); the features are the caller's.
        unsafe { e4m3_64(_mm512_castsi128_si512(_mm_loadu_si128(p.cast())))[0] }
    }
    #[inline(always)]
    unsafe fn k4(p: *const u8) -> [__m512; 4] {
        // SAFETY: 64 readable bytes (caller); the features are the caller's.
        unsafe { e4m3_64(_mm512_loadu_si512(p.cast())) }
    }
}
