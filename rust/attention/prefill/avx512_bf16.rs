//! `vdpbf16ps` micro-kernels over the packed tiles (AVX-512 with avx512_bf16, 16 lanes),
//! in the blocking of [`super::simd`]: scores of a bf16 query over dimension pairs, and
//! `P V` of bf16-rounded probabilities over token pairs, one instruction per two
//! dimensions or tokens.
//!
//! Every function checks its slices' lengths once with `assert!` and then indexes raw
//! pointers inside them; masked lanes are never accessed (fault suppression).

// Register tiles are small fixed arrays indexed by row and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::plan::TW;
use super::simd::dispatch;
use crate::attention::avx512_cvt::lane_mask;

const W: usize = 16;
/// Rows per register tile.
const R: usize = 6;
/// Vectors per register tile (keys for the scores, dimensions for `P V`).
const NV: usize = 4;

/// `vdpbf16ps` scores: `s[r][t] = factor * sum_p qb[r][p] . kpb[p][t]` over `dp`
/// dimension pairs.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512bf16, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")]
pub(crate) unsafe fn qk_dot(qb: &[u32], rows: usize, dp: usize, kpb: &[u32], ntok: usize, factor: f32, s: &mut [f32]) {
    assert!(ntok <= TW && qb.len() >= rows * dp && kpb.len() >= dp * TW && s.len() >= rows * TW);
    let nv = ntok.div_ceil(W);
    let mut r = 0;
    while r < rows {
        let h = (rows - r).min(R);
        // SAFETY: as in `qk`, with dp pairs per row.
        unsafe {
            let (qp, sp) = (qb.as_ptr().add(r * dp), s.as_mut_ptr().add(r * TW));
            dispatch!(dot_block, h, nv, qp, dp, kpb.as_ptr(), factor, sp)
        }
        r += h;
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")]
fn bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// # Safety
/// `qb` holds `H * dp` pairs, `kpb` `dp * TW`, `s` `H * TW`; the CPU has the features.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")]
unsafe fn dot_block<const H: usize, const V: usize>(qb: *const u32, dp: usize, kpb: *const u32, factor: f32, s: *mut f32) {
    let mut acc = [[_mm512_setzero_ps(); V]; H];
    for p in 0..dp {
        // SAFETY: pair row p < dp of the pack, vectors v < 4 of TW; query pair j * dp + p.
        unsafe {
            let mut k = [bh(_mm512_setzero_si512()); V];
            for v in 0..V {
                k[v] = bh(_mm512_loadu_si512(kpb.add(p * TW + v * W).cast()));
            }
            for j in 0..H {
                let qv = bh(_mm512_set1_epi32(*qb.add(j * dp + p) as i32));
                for v in 0..V {
                    acc[j][v] = _mm512_dpbf16_ps(acc[j][v], qv, k[v]);
                }
            }
        }
    }
    let f = _mm512_set1_ps(factor);
    for j in 0..H {
        for v in 0..V {
            // SAFETY: s row j < H, vector v < 4 of TW.
            unsafe { _mm512_storeu_ps(s.add(j * TW + v * W), _mm512_mul_ps(f, acc[j][v])) };
        }
    }
}

/// `o[r] = alpha[r] * o[r] + sum_t p[r][t] * V[t]` with the probabilities rounded to bf16
/// and `vdpbf16ps` over token pairs (`vpb`: `[ceil(ntok / 2)][d]` pairs, as packed by the
/// tile loop).
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512bf16, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")]
pub(crate) unsafe fn pv_dot(p: &[f32], rows: usize, ntok: usize, d: usize, vpb: &[u32], alpha: &[f32], o: &mut [f32]) {
    let np = ntok.div_ceil(2);
    assert!(ntok <= TW && p.len() >= rows * TW && vpb.len() >= np * d && alpha.len() >= rows && o.len() >= rows * d);
    let mut r = 0;
    while r < rows {
        let h = (rows - r).min(R);
        // Rows r..r + h of P as bf16 pairs: 32 probabilities per conversion, in order, so
        // 32-bit element u holds (p[2u], p[2u + 1]).
        let mut pb = [[0u32; TW / 2]; R];
        for j in 0..h {
            let row = p[(r + j) * TW..(r + j + 1) * TW].as_ptr();
            for v in 0..TW / 32 {
                // SAFETY: 32 values at 32 v < TW of the row; pb[j] holds TW / 2 u32.
                unsafe {
                    let x = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row.add(32 * v + 16)), _mm512_loadu_ps(row.add(32 * v)));
                    _mm512_storeu_si512(pb[j].as_mut_ptr().add(16 * v).cast(), std::mem::transmute::<__m512bh, __m512i>(x));
                }
            }
        }
        // SAFETY: rows r..r + h of alpha and o exist (assert); pairs u < np of vpb.
        unsafe {
            let (ap, op) = (alpha.as_ptr().add(r), o.as_mut_ptr().add(r * d));
            let pp = pb.as_ptr().cast::<u32>();
            match h {
                1 => pv_dot_block::<1>(pp, np, d, vpb.as_ptr(), ap, op),
                2 => pv_dot_block::<2>(pp, np, d, vpb.as_ptr(), ap, op),
                3 => pv_dot_block::<3>(pp, np, d, vpb.as_ptr(), ap, op),
                4 => pv_dot_block::<4>(pp, np, d, vpb.as_ptr(), ap, op),
                5 => pv_dot_block::<5>(pp, np, d, vpb.as_ptr(), ap, op),
                _ => pv_dot_block::<6>(pp, np, d, vpb.as_ptr(), ap, op),
            }
        }
        r += h;
    }
}

/// # Safety
/// `pb` holds `H` rows of `TW / 2` pairs, `alpha` `H`, `o` `H * d`, `vpb` `np * d`; the
/// CPU has the features.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")]
unsafe fn pv_dot_block<const H: usize>(pb: *const u32, np: usize, d: usize, vpb: *const u32, alpha: *const f32, o: *mut f32) {
    let mut u0 = 0;
    while u0 < d {
        let mut mk = [0 as __mmask16; NV];
        for u in 0..NV {
            mk[u] = lane_mask(u0 + u * W, d);
        }
        let mut acc = [[_mm512_setzero_ps(); NV]; H];
        for j in 0..H {
            // SAFETY: alpha[j], j < H; unmasked lanes are dimensions < d of row j of o (a
            // fully masked vector accesses nothing).
            unsafe {
                let al = _mm512_set1_ps(*alpha.add(j));
                for u in 0..NV {
                    acc[j][u] = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(mk[u], o.wrapping_add(j * d + u0 + u * W)));
                }
            }
        }
        for t in 0..np {
            let mut v = [bh(_mm512_setzero_si512()); NV];
            for u in 0..NV {
                // SAFETY: pair row t < np, unmasked lanes inside its d values.
                v[u] = bh(unsafe { _mm512_maskz_loadu_epi32(mk[u], vpb.wrapping_add(t * d + u0 + u * W).cast()) });
            }
            for j in 0..H {
                // SAFETY: pair t < np <= TW / 2 of row j < H.
                let pj = bh(_mm512_set1_epi32(unsafe { *pb.add(j * (TW / 2) + t) } as i32));
                for u in 0..NV {
                    acc[j][u] = _mm512_dpbf16_ps(acc[j][u], pj, v[u]);
                }
            }
        }
        for j in 0..H {
            for u in 0..NV {
                // SAFETY: as for the load above.
                unsafe { _mm512_mask_storeu_ps(o.wrapping_add(j * d + u0 + u * W), mk[u], acc[j][u]) };
            }
        }
        u0 += NV * W;
    }
}
