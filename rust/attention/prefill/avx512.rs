//! AVX-512 micro-kernels over the packed tiles (16 keys per register).
//!
//! - `Q K^T`: 6 rows x up to 4 vectors (64 keys) of accumulators in registers; per
//!   dimension, 4 loads of the K pack row and one broadcast query element per row feed
//!   24 FMAs.
//! - `vdpbf16ps` scores (a bf16 query): the same blocking over dimension pairs, one
//!   instruction per two dimensions.
//! - softmax: per row, a vector max, `exp2` by decode's polynomial and `vscalefps`.
//! - `P V`: 6 rows x 64 dimensions of accumulators; per key, 4 loads of the V pack row
//!   and one broadcast probability per row feed 24 FMAs.
//!
//! Every function checks its slices' lengths once with `assert!` and then indexes raw
//! pointers inside them; masked lanes are never accessed (fault suppression).

// Register tiles are small fixed arrays indexed by row and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::plan::TW;
use crate::attention::avx512::exp2;

const W: usize = 16;
/// Rows per register tile.
const R: usize = 6;
/// Vectors per register tile (keys for the scores, dimensions for `P V`).
const NV: usize = 4;

/// Lanes of the vector starting at element `i` of a row of `n`.
#[inline]
fn lane_mask(i: usize, n: usize) -> __mmask16 {
    let r = n.saturating_sub(i);
    if r >= W {
        0xffff
    } else {
        (1u16 << r) - 1
    }
}

/// Call `$f::<H, V>($args)` for a run-time `h` in 1..=6 and `v` in 1..=4.
macro_rules! dispatch {
    ($f:ident, $h:expr, $v:expr, $($a:expr),*) => {
        match ($h, $v) {
            (1, 1) => $f::<1, 1>($($a),*), (1, 2) => $f::<1, 2>($($a),*), (1, 3) => $f::<1, 3>($($a),*), (1, _) => $f::<1, 4>($($a),*),
            (2, 1) => $f::<2, 1>($($a),*), (2, 2) => $f::<2, 2>($($a),*), (2, 3) => $f::<2, 3>($($a),*), (2, _) => $f::<2, 4>($($a),*),
            (3, 1) => $f::<3, 1>($($a),*), (3, 2) => $f::<3, 2>($($a),*), (3, 3) => $f::<3, 3>($($a),*), (3, _) => $f::<3, 4>($($a),*),
            (4, 1) => $f::<4, 1>($($a),*), (4, 2) => $f::<4, 2>($($a),*), (4, 3) => $f::<4, 3>($($a),*), (4, _) => $f::<4, 4>($($a),*),
            (5, 1) => $f::<5, 1>($($a),*), (5, 2) => $f::<5, 2>($($a),*), (5, 3) => $f::<5, 3>($($a),*), (5, _) => $f::<5, 4>($($a),*),
            (_, 1) => $f::<6, 1>($($a),*), (_, 2) => $f::<6, 2>($($a),*), (_, 3) => $f::<6, 3>($($a),*), (_, _) => $f::<6, 4>($($a),*),
        }
    };
}

/// Scores `s[r][t] = q[r] . kp[.][t]` of `rows` rows for `ntok <= TW` keys (lanes up to
/// the next multiple of 16 are computed too, from whatever the pack holds).
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn qk(q: &[f32], rows: usize, d: usize, kp: &[f32], ntok: usize, s: &mut [f32]) {
    assert!(ntok <= TW && q.len() >= rows * d && kp.len() >= d * TW && s.len() >= rows * TW);
    let nv = ntok.div_ceil(W);
    let mut r = 0;
    while r < rows {
        let h = (rows - r).min(R);
        // SAFETY: rows r..r + h of q (h * d values) and of s (h * TW) exist (assert);
        // the block reads kp rows 0..d, vectors 0..nv <= 4, inside d * TW.
        unsafe {
            let (qp, sp) = (q.as_ptr().add(r * d), s.as_mut_ptr().add(r * TW));
            dispatch!(qk_block, h, nv, qp, d, kp.as_ptr(), sp)
        }
        r += h;
    }
}

/// # Safety
/// `q` holds `H * d` values, `kp` `d * TW`, `s` `H * TW`; the CPU has the features.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn qk_block<const H: usize, const V: usize>(q: *const f32, d: usize, kp: *const f32, s: *mut f32) {
    let mut acc = [[_mm512_setzero_ps(); V]; H];
    for i in 0..d {
        // SAFETY: row i < d of the K pack, vectors v < V <= 4 of its TW = 64 values;
        // query element j * d + i < H * d.
        unsafe {
            let mut k = [_mm512_setzero_ps(); V];
            for v in 0..V {
                k[v] = _mm512_loadu_ps(kp.add(i * TW + v * W));
            }
            for j in 0..H {
                let qv = _mm512_set1_ps(*q.add(j * d + i));
                for v in 0..V {
                    acc[j][v] = _mm512_fmadd_ps(qv, k[v], acc[j][v]);
                }
            }
        }
    }
    for j in 0..H {
        for v in 0..V {
            // SAFETY: s row j < H, vector v < 4 of TW.
            unsafe { _mm512_storeu_ps(s.add(j * TW + v * W), acc[j][v]) };
        }
    }
}

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

/// Online softmax of the first `ntok` scores of each row, as [`super::scalar::softmax`].
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn softmax(s: &mut [f32], rows: usize, ntok: usize, m: &mut [f32], l: &mut [f32], alpha: &mut [f32]) {
    assert!(ntok <= TW && s.len() >= rows * TW && m.len() >= rows && l.len() >= rows && alpha.len() >= rows);
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let nv = ntok.div_ceil(W);
    for r in 0..rows {
        let row = s[r * TW..(r + 1) * TW].as_mut_ptr();
        let mut x = [ninf; TW / W];
        let mut mx = ninf;
        for v in 0..nv {
            // SAFETY: vector v < 4 of the row's TW values; lanes masked to ntok.
            x[v] = unsafe { _mm512_mask_loadu_ps(ninf, lane_mask(v * W, ntok), row.add(v * W)) };
            mx = _mm512_max_ps(mx, x[v]);
        }
        let mx = _mm512_reduce_max_ps(mx).max(m[r]);
        if mx == f32::NEG_INFINITY {
            for v in 0..nv {
                // SAFETY: as above.
                unsafe { _mm512_storeu_ps(row.add(v * W), _mm512_setzero_ps()) };
            }
            alpha[r] = 1.0;
            continue;
        }
        // exp2 of the vector unit, not libm's (a call per row and tile); m = -inf (and any
        // gap past `EXP2_ZERO_BELOW`) gives exactly 0.
        alpha[r] = _mm512_cvtss_f32(exp2(_mm512_set1_ps(m[r] - mx)));
        m[r] = mx;
        let mut sum = _mm512_setzero_ps();
        for v in 0..nv {
            let seen = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(x[v], ninf);
            let e = _mm512_maskz_mov_ps(seen, exp2(_mm512_sub_ps(x[v], _mm512_set1_ps(mx))));
            sum = _mm512_add_ps(sum, e);
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(row.add(v * W), e) };
        }
        l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(sum);
    }
}

/// `o[r] = alpha[r] * o[r] + sum_t p[r][t] * vp[t]` for `t < ntok`.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn pv(p: &[f32], rows: usize, ntok: usize, d: usize, vp: &[f32], alpha: &[f32], o: &mut [f32]) {
    assert!(ntok <= TW && p.len() >= rows * TW && vp.len() >= ntok * d && alpha.len() >= rows && o.len() >= rows * d);
    let mut r = 0;
    while r < rows {
        let h = (rows - r).min(R);
        // SAFETY: rows r..r + h of p, alpha and o exist (assert); V rows t < ntok.
        unsafe {
            let (pp, ap, op) = (p.as_ptr().add(r * TW), alpha.as_ptr().add(r), o.as_mut_ptr().add(r * d));
            match h {
                1 => pv_block::<1>(pp, ntok, d, vp.as_ptr(), ap, op),
                2 => pv_block::<2>(pp, ntok, d, vp.as_ptr(), ap, op),
                3 => pv_block::<3>(pp, ntok, d, vp.as_ptr(), ap, op),
                4 => pv_block::<4>(pp, ntok, d, vp.as_ptr(), ap, op),
                5 => pv_block::<5>(pp, ntok, d, vp.as_ptr(), ap, op),
                _ => pv_block::<6>(pp, ntok, d, vp.as_ptr(), ap, op),
            }
        }
        r += h;
    }
}

/// # Safety
/// `p` holds `H * TW` values, `alpha` `H`, `o` `H * d`, `vp` `ntok * d`; the CPU has the
/// features.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn pv_block<const H: usize>(p: *const f32, ntok: usize, d: usize, vp: *const f32, alpha: *const f32, o: *mut f32) {
    let mut u0 = 0;
    while u0 < d {
        let mut mk = [0 as __mmask16; NV];
        for u in 0..NV {
            mk[u] = lane_mask(u0 + u * W, d);
        }
        let mut acc = [[_mm512_setzero_ps(); NV]; H];
        for j in 0..H {
            // SAFETY: alpha[j], j < H.
            let al = _mm512_set1_ps(unsafe { *alpha.add(j) });
            for u in 0..NV {
                // SAFETY: unmasked lanes are dimensions < d of row j < H of o; a fully
                // masked vector accesses nothing (its address may pass the end).
                acc[j][u] = _mm512_mul_ps(al, unsafe { _mm512_maskz_loadu_ps(mk[u], o.wrapping_add(j * d + u0 + u * W)) });
            }
        }
        for t in 0..ntok {
            let mut v = [_mm512_setzero_ps(); NV];
            for u in 0..NV {
                // SAFETY: V row t < ntok, unmasked lanes inside its d values.
                v[u] = unsafe { _mm512_maskz_loadu_ps(mk[u], vp.wrapping_add(t * d + u0 + u * W)) };
            }
            for j in 0..H {
                // SAFETY: probability t < ntok <= TW of row j < H.
                let pj = _mm512_set1_ps(unsafe { *p.add(j * TW + t) });
                for u in 0..NV {
                    acc[j][u] = _mm512_fmadd_ps(pj, v[u], acc[j][u]);
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
