//! The `int8_pv` paths' minimal sequence: `P V` by `vpdpbusd` on 8-bit probabilities
//! (`rust/attention/avx512_vnni_pv.rs`), after the exact int8 K loop (`int8_pv`) or the
//! `vpdpbusd` one (`int8_scores+int8_pv`).
//!
//! Per tile and head: the 16 probabilities quantized (`vreduce` max, a multiply,
//! `vcvtps2dq`, `vpmovusdb`); per 4 V rows (4 tokens) and 64 dimensions: 4 loads and 8
//! unpacks (the 4 x 4 byte transpose, shared by the heads), then per head one broadcast
//! of 4 probability codes and 4 `vpdpbusd`; per head and 16 dimensions at the tile's end:
//! the f32 accumulator loaded, `vcvtdq2ps`, an FMA by the step, stored.

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::paths::{k_dot, k_exact, store_f32, Tile, D, K, T, V};
use super::widen::I8;

/// `n` tiles of `int8_pv` (`SC = false`: K by the exact int8 loop) or
/// `int8_scores+int8_pv` (`SC = true`: K by `vpdpbusd`), part `P`; V as [`v_int`].
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub unsafe fn int8_pv<const SC: bool, const G: usize, const N: usize, const VT: usize, const P: u8, const ST: bool>(t: &mut Tile<ST>, n: u64) {
    const { assert!(G <= 4 && (D / 4).is_multiple_of(N) && D.is_multiple_of(16 * VT)) };
    t.check(1);
    for _ in 0..n {
        // Opaque each round (as if the tile changed), so no load is hoisted out of the loop.
        let t = std::hint::black_box(&mut *t);
        t.next_tile();
        // SAFETY: the features are this function's; the loops stay inside the tile.
        unsafe {
            if P & K != 0 {
                if SC {
                    k_dot::<G, N, ST>(t);
                } else {
                    let mut s = [[_mm512_setzero_ps(); G]; N];
                    k_exact::<I8, G, N, ST>(t, &mut s);
                    store_f32(t, s);
                }
            }
            if P & V != 0 {
                if G == 1 {
                    v_int::<G, 2, ST>(t);
                } else {
                    v_int::<G, 1, ST>(t);
                }
            }
        }
    }
}

/// The integer V loop, `S` segments of 64 dimensions per pass (the kernel's: 2 for one
/// head, 1 for more).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI (the caller's features; inlined).
#[inline(always)]
unsafe fn v_int<const G: usize, const S: usize, const ST: bool>(t: &mut Tile<ST>) {
    let (vp, pp, ap) = (t.vp().cast::<i8>(), t.p.as_ptr(), t.acc.as_mut_ptr());
    // The probabilities' codes and steps (the kernel's quantization per head and chunk).
    let mut codes = [[0u32; 4]; G];
    let mut step = [0f32; G];
    for j in 0..G {
        // SAFETY: probabilities j * T .. + 16 < 4 T; codes[j] holds 16 bytes.
        unsafe {
            let x = _mm512_loadu_ps(pp.add(j * T));
            let r = 255.0 / _mm512_reduce_max_ps(x);
            step[j] = 1.0 / r;
            let q = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(r)));
            _mm_storeu_si128(codes[j].as_mut_ptr().cast(), _mm512_cvtusepi32_epi8(q));
        }
    }
    let mut u0 = 0;
    while u0 < D {
        let mut a = [[_mm512_setzero_si512(); 8]; G];
        for grp in 0..T / 4 {
            for s in 0..S {
                t.pump::<1>();
                // SAFETY: rows 4 grp + r < T of D bytes, codes u0 + 64 s .. + 64 <= D.
                let x = unsafe {
                    let row = |r: usize| _mm512_loadu_si512(vp.add((4 * grp + r) * D + u0 + 64 * s).cast());
                    let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
                    let (a0, b0) = (_mm512_unpacklo_epi8(r0, r1), _mm512_unpackhi_epi8(r0, r1));
                    let (c0, e0) = (_mm512_unpacklo_epi8(r2, r3), _mm512_unpackhi_epi8(r2, r3));
                    [_mm512_unpacklo_epi16(a0, c0), _mm512_unpackhi_epi16(a0, c0), _mm512_unpacklo_epi16(b0, e0), _mm512_unpackhi_epi16(b0, e0)]
                };
                for j in 0..G {
                    let pj = _mm512_set1_epi32(codes[j][grp] as i32);
                    for k in 0..4 {
                        a[j][4 * s + k] = _mm512_dpbusd_epi32(a[j][4 * s + k], pj, x[k]);
                    }
                }
            }
        }
        for j in 0..G {
            let st = _mm512_set1_ps(step[j]);
            for k in 0..4 * S {
                // SAFETY: accumulator row j < G <= 4 of D floats, u0 + 16 k + 16 <= D.
                unsafe {
                    let at = ap.add(j * D + u0 + 16 * k);
                    _mm512_storeu_ps(at, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[j][k]), st, _mm512_loadu_ps(at)));
                }
            }
        }
        u0 += 64 * S;
    }
}
