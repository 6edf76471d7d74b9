//! `fp16_reduction`'s minimal instruction sequence (`rust/attention/avx512_fp16.rs`), on
//! the tile of [`super::paths`]: per 64 K codes (4 dimension rows x 16 tokens) one load,
//! the widening to f16 (e5m2: 2 `vpunpck*bw`; e4m3: and 2 `vpsraw` + 2 `vpandq`) and 2 g
//! `vfmadd231ph` with a query vector per head; each tile's lanes summed to 16 f32 scores
//! per head (4 `vcvtph2ps`, 2 shuffles, 3 adds), as the kernel does once per chunk. Per 64
//! V codes of a token row the same widening (e5m2 also 2 `vmulph` by 2^-8) and 2 g
//! `vfmadd231ph` with the probability broadcast from memory; per tile the f16 sums
//! widened and added to the f32 accumulators. The f16 instructions are inline assembly
//! (no stable intrinsics), as in the kernel.

#![allow(clippy::needless_range_loop)]

use std::arch::asm;
use std::arch::x86_64::*;

use super::paths::{Tile, D, K, T, V};

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fma_ph(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    let mut a = a;
    // SAFETY: registers only; the caller checked avx512fp16.
    unsafe { asm!("vfmadd231ph {a}, {b}, {c}", a = inout(zmm_reg) a, b = in(zmm_reg) b, c = in(zmm_reg) c, options(pure, nomem, nostack, preserves_flags)) };
    a
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fma_ph_bcast(a: __m512i, b: __m512i, p: *const u16) -> __m512i {
    let mut a = a;
    // SAFETY: reads the 2 bytes at `p` (inside the tile's probabilities).
    unsafe {
        asm!("vfmadd231ph {a}, {b}, word ptr [{p}]{{1to32}}", a = inout(zmm_reg) a, b = in(zmm_reg) b, p = in(reg) p,
             options(pure, readonly, nostack, preserves_flags))
    };
    a
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn mul_ph(a: __m512i, b: __m512i) -> __m512i {
    let mut a = a;
    // SAFETY: registers only.
    unsafe { asm!("vmulph {a}, {a}, {b}", a = inout(zmm_reg) a, b = in(zmm_reg) b, options(pure, nomem, nostack, preserves_flags)) };
    a
}

/// 64 codes as two vectors of 32 f16, the even bytes and the odd ones, each in its
/// word's high byte (the kernel's `widen`: a shift for the even codes, an `and` for the
/// odd ones; e4m3 then an arithmetic shift and an `and` each).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn widen<const E4: bool>(x: __m512i) -> [__m512i; 2] {
    let even = _mm512_slli_epi16::<8>(x);
    if E4 {
        let keep = _mm512_set1_epi16(0xbf80u16 as i16);
        [_mm512_and_si512(_mm512_srai_epi16::<1>(even), keep), _mm512_and_si512(_mm512_srai_epi16::<1>(x), keep)]
    } else {
        [even, _mm512_and_si512(x, _mm512_set1_epi16(0xff00u16 as i16))]
    }
}

/// The two halves of 32 f16 widened and added (the kernel's lane sums).
#[inline]
#[target_feature(enable = "avx512f,f16c")]
fn halves_sum(v: __m512i) -> __m512 {
    _mm512_add_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(v)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(v)))
}

/// `n` tiles of `fp16_reduction` (part `P`) at g = `G` heads; `N` and `VT` (the table's
/// run shapes for the f32 paths) are not used: the f16 path's shapes are fixed by the
/// 64-code runs.
///
/// # Safety
/// AVX-512 F/BW/VL, FMA, F16C and FP16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub unsafe fn fp16<const E4: bool, const G: usize, const N: usize, const VT: usize, const P: u8, const ST: bool>(t: &mut Tile<ST>, n: u64) {
    const { assert!(G <= 4 && D.is_multiple_of(128)) };
    t.check(1);
    for _ in 0..n {
        // Opaque each round (as if the tile changed), so no load is hoisted out of the loop.
        let t = std::hint::black_box(&mut *t);
        t.next_tile();
        // SAFETY: the features; K runs k < D / 4 of 64 bytes inside k; query vectors
        // (k * G + j) % D < D lines; V rows tk < T of D bytes; probabilities j * T + tk <
        // 4 T; accumulators j * D + 128 < 4 D; score lines j < 4.
        unsafe {
            if P & K != 0 {
                let (kp, qp) = (t.kp(), t.qhp());
                let mut s = [[_mm512_setzero_si512(); 2]; G];
                for k in 0..D / 4 {
                    t.pump::<0>();
                    let x = widen::<E4>(_mm512_loadu_si512(kp.add(64 * k).cast()));
                    for j in 0..G {
                        let qv = _mm512_loadu_si512(qp.add(64 * ((k * G + j) % D)).cast());
                        s[j][0] = fma_ph(s[j][0], qv, x[0]);
                        s[j][1] = fma_ph(s[j][1], qv, x[1]);
                    }
                }
                let sc = t.scp();
                for j in 0..G {
                    let (a, b) = (halves_sum(s[j][0]), halves_sum(s[j][1]));
                    _mm512_storeu_ps(sc.add(16 * j), _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xee>(a, b)));
                }
            }
            if P & V != 0 {
                let (vp, pp, ap) = (t.vp(), t.ph.as_ptr(), t.acc.as_mut_ptr());
                let f = _mm512_set1_epi16(0x1c00);
                let mut a = [[_mm512_setzero_si512(); 4]; G];
                for tk in 0..T {
                    t.pump::<1>();
                    let mut v = [_mm512_setzero_si512(); 4];
                    for r in 0..2 {
                        let [lo, hi] = widen::<E4>(_mm512_loadu_si512(vp.add(tk * D + 64 * r).cast()));
                        (v[2 * r], v[2 * r + 1]) = if E4 { (lo, hi) } else { (mul_ph(lo, f), mul_ph(hi, f)) };
                    }
                    for j in 0..G {
                        for u in 0..4 {
                            a[j][u] = fma_ph_bcast(a[j][u], v[u], pp.add(j * T + tk));
                        }
                    }
                }
                for j in 0..G {
                    for u in 0..4 {
                        for (h, half) in [_mm512_castsi512_si256(a[j][u]), _mm512_extracti64x4_epi64::<1>(a[j][u])].into_iter().enumerate() {
                            let at = ap.add(j * D + 32 * u + 16 * h);
                            _mm512_storeu_ps(at, _mm512_add_ps(_mm512_loadu_ps(at), _mm512_cvtph_ps(half)));
                        }
                    }
                }
            }
        }
    }
}
