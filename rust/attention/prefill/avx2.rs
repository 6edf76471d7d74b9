//! AVX2 + FMA micro-kernels over the packed tiles (8 keys per register).
//!
//! 16 registers: `Q K^T` keeps 4 rows x 2 vectors (16 keys) of accumulators, `P V` 4 rows
//! x 2 vectors (16 dimensions); the dimension tail of `P V` (d not a multiple of 8) uses
//! `vmaskmovps`. Score rows are always `TW` wide in the scratch, so the score and softmax
//! loads need no mask.

// Register tiles are small fixed arrays indexed by row and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::plan::TW;
use crate::attention::avx2_cvt::exp2;

const W: usize = 8;
const R: usize = 4;
const NV: usize = 2;

/// Call `$f::<H, V>($args)` for a run-time `h` in 1..=4 and `v` in 1..=2.
macro_rules! dispatch {
    ($f:ident, $h:expr, $v:expr, $($a:expr),*) => {
        match ($h, $v) {
            (1, 1) => $f::<1, 1>($($a),*), (1, _) => $f::<1, 2>($($a),*),
            (2, 1) => $f::<2, 1>($($a),*), (2, _) => $f::<2, 2>($($a),*),
            (3, 1) => $f::<3, 1>($($a),*), (3, _) => $f::<3, 2>($($a),*),
            (_, 1) => $f::<4, 1>($($a),*), (_, _) => $f::<4, 2>($($a),*),
        }
    };
}

/// As [`super::scalar::qk`] (lanes up to the next multiple of 8 computed too).
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn qk(q: &[f32], rows: usize, d: usize, kp: &[f32], ntok: usize, s: &mut [f32]) {
    assert!(ntok <= TW && q.len() >= rows * d && kp.len() >= d * TW && s.len() >= rows * TW);
    let mut r = 0;
    while r < rows {
        let h = (rows - r).min(R);
        let mut c = 0;
        while c < ntok {
            let nv = (ntok - c).div_ceil(W).min(NV);
            // SAFETY: rows r..r + h of q and s exist; columns c..c + 8 nv <= TW of kp and s.
            unsafe {
                let (qp, sp) = (q.as_ptr().add(r * d), s.as_mut_ptr().add(r * TW + c));
                dispatch!(qk_block, h, nv, qp, d, kp.as_ptr().add(c), sp)
            }
            c += NV * W;
        }
        r += h;
    }
}

/// # Safety
/// `q` holds `H * d` values; `kp` rows of `TW` with `V * 8` columns from it; `s` `H` rows
/// of `TW` with `V * 8` columns; the CPU has the features.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_block<const H: usize, const V: usize>(q: *const f32, d: usize, kp: *const f32, s: *mut f32) {
    let mut acc = [[_mm256_setzero_ps(); V]; H];
    for i in 0..d {
        // SAFETY: per the function's contract.
        unsafe {
            let mut k = [_mm256_setzero_ps(); V];
            for v in 0..V {
                k[v] = _mm256_loadu_ps(kp.add(i * TW + v * W));
            }
            for j in 0..H {
                let qv = _mm256_set1_ps(*q.add(j * d + i));
                for v in 0..V {
                    acc[j][v] = _mm256_fmadd_ps(qv, k[v], acc[j][v]);
                }
            }
        }
    }
    for j in 0..H {
        for v in 0..V {
            // SAFETY: per the function's contract.
            unsafe { _mm256_storeu_ps(s.add(j * TW + v * W), acc[j][v]) };
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax(x: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(x: __m256) -> f32 {
    let m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_add_ss(m, _mm_shuffle_ps::<1>(m, m)))
}

/// The lanes `< n - i` of an 8-lane vector, as a `vmaskmovps` mask.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lanes(i: usize, n: usize) -> __m256i {
    let r = n.saturating_sub(i).min(W) as i32;
    _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

/// As [`super::scalar::softmax`].
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn softmax(s: &mut [f32], rows: usize, ntok: usize, m: &mut [f32], l: &mut [f32], alpha: &mut [f32]) {
    assert!(ntok <= TW && s.len() >= rows * TW && m.len() >= rows && l.len() >= rows && alpha.len() >= rows);
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let nv = ntok.div_ceil(W);
    for r in 0..rows {
        let row = s[r * TW..(r + 1) * TW].as_mut_ptr();
        let mut x = [ninf; TW / W];
        let mut mx = ninf;
        for v in 0..nv {
            let keep = _mm256_castsi256_ps(lanes(v * W, ntok));
            // SAFETY: vector v < 8 of the row's TW values.
            x[v] = _mm256_blendv_ps(ninf, unsafe { _mm256_loadu_ps(row.add(v * W)) }, keep);
            mx = _mm256_max_ps(mx, x[v]);
        }
        let mx = hmax(mx).max(m[r]);
        if mx == f32::NEG_INFINITY {
            for v in 0..nv {
                // SAFETY: as above.
                unsafe { _mm256_storeu_ps(row.add(v * W), _mm256_setzero_ps()) };
            }
            alpha[r] = 1.0;
            continue;
        }
        alpha[r] = crate::attention::work::weight(m[r] - mx);
        m[r] = mx;
        let mut sum = _mm256_setzero_ps();
        for v in 0..nv {
            let seen = _mm256_cmp_ps::<_CMP_NEQ_UQ>(x[v], ninf);
            let e = _mm256_and_ps(seen, exp2(_mm256_sub_ps(x[v], _mm256_set1_ps(mx))));
            sum = _mm256_add_ps(sum, e);
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(row.add(v * W), e) };
        }
        l[r] = l[r] * alpha[r] + hsum(sum);
    }
}

/// As [`super::scalar::pv`].
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pv(p: &[f32], rows: usize, ntok: usize, d: usize, vp: &[f32], alpha: &[f32], o: &mut [f32]) {
    assert!(ntok <= TW && p.len() >= rows * TW && vp.len() >= ntok * d && alpha.len() >= rows && o.len() >= rows * d);
    let mut r = 0;
    while r < rows {
        let h = (rows - r).min(R);
        // SAFETY: rows r..r + h of p, alpha and o exist; V rows t < ntok.
        unsafe {
            let (pp, ap, op) = (p.as_ptr().add(r * TW), alpha.as_ptr().add(r), o.as_mut_ptr().add(r * d));
            match h {
                1 => pv_block::<1>(pp, ntok, d, vp.as_ptr(), ap, op),
                2 => pv_block::<2>(pp, ntok, d, vp.as_ptr(), ap, op),
                3 => pv_block::<3>(pp, ntok, d, vp.as_ptr(), ap, op),
                _ => pv_block::<4>(pp, ntok, d, vp.as_ptr(), ap, op),
            }
        }
        r += h;
    }
}

/// # Safety
/// `p` holds `H * TW` values, `alpha` `H`, `o` `H * d`, `vp` `ntok * d`; the CPU has the
/// features.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_block<const H: usize>(p: *const f32, ntok: usize, d: usize, vp: *const f32, alpha: *const f32, o: *mut f32) {
    let mut u0 = 0;
    while u0 < d {
        let mut mk = [_mm256_setzero_si256(); NV];
        for u in 0..NV {
            mk[u] = lanes(u0 + u * W, d);
        }
        let mut acc = [[_mm256_setzero_ps(); NV]; H];
        for j in 0..H {
            // SAFETY: alpha[j], j < H; masked lanes are dimensions < d of row j of o
            // (vmaskmovps does not access masked-off lanes).
            unsafe {
                let al = _mm256_set1_ps(*alpha.add(j));
                for u in 0..NV {
                    acc[j][u] = _mm256_mul_ps(al, _mm256_maskload_ps(o.wrapping_add(j * d + u0 + u * W), mk[u]));
                }
            }
        }
        for t in 0..ntok {
            let mut v = [_mm256_setzero_ps(); NV];
            for u in 0..NV {
                // SAFETY: V row t < ntok, lanes masked to its d values.
                v[u] = unsafe { _mm256_maskload_ps(vp.wrapping_add(t * d + u0 + u * W), mk[u]) };
            }
            for j in 0..H {
                // SAFETY: probability t < TW of row j < H.
                let pj = _mm256_set1_ps(unsafe { *p.add(j * TW + t) });
                for u in 0..NV {
                    acc[j][u] = _mm256_fmadd_ps(pj, v[u], acc[j][u]);
                }
            }
        }
        for j in 0..H {
            for u in 0..NV {
                // SAFETY: as for the load.
                unsafe { _mm256_maskstore_ps(o.wrapping_add(j * d + u0 + u * W), mk[u], acc[j][u]) };
            }
        }
        u0 += NV * W;
    }
}
