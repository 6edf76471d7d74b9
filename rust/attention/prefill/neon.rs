//! NEON micro-kernels over the packed tiles (4 keys per register). 32 registers: `Q K^T`
//! keeps 4 rows x 4 vectors (16 keys) of accumulators, `P V` 4 rows x 4 vectors (16
//! dimensions); a dimension tail (d not a multiple of 4) is finished in scalar code.
//! Tested under qemu (`tests/aarch64.sh`) for correctness only.

// Register tiles are small fixed arrays indexed by row and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use super::plan::TW;
use crate::attention::neon::exp2;

const W: usize = 4;
const R: usize = 4;
const NV: usize = 4;

/// Call `$f::<H, V>($args)` for a run-time `h` and `v` in 1..=4.
macro_rules! dispatch {
    ($f:ident, $h:expr, $v:expr, $($a:expr),*) => {
        match ($h, $v) {
            (1, 1) => $f::<1, 1>($($a),*), (1, 2) => $f::<1, 2>($($a),*), (1, 3) => $f::<1, 3>($($a),*), (1, _) => $f::<1, 4>($($a),*),
            (2, 1) => $f::<2, 1>($($a),*), (2, 2) => $f::<2, 2>($($a),*), (2, 3) => $f::<2, 3>($($a),*), (2, _) => $f::<2, 4>($($a),*),
            (3, 1) => $f::<3, 1>($($a),*), (3, 2) => $f::<3, 2>($($a),*), (3, 3) => $f::<3, 3>($($a),*), (3, _) => $f::<3, 4>($($a),*),
            (_, 1) => $f::<4, 1>($($a),*), (_, 2) => $f::<4, 2>($($a),*), (_, 3) => $f::<4, 3>($($a),*), (_, _) => $f::<4, 4>($($a),*),
        }
    };
}

/// As [`super::scalar::qk`] (lanes up to the next multiple of 4 computed too).
///
/// # Safety
/// The CPU must support neon.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn qk(q: &[f32], rows: usize, d: usize, kp: &[f32], ntok: usize, s: &mut [f32]) {
    assert!(ntok <= TW && q.len() >= rows * d && kp.len() >= d * TW && s.len() >= rows * TW);
    let mut r = 0;
    while r < rows {
        let h = (rows - r).min(R);
        let mut c = 0;
        while c < ntok {
            let nv = (ntok - c).div_ceil(W).min(NV);
            // SAFETY: rows r..r + h of q and s exist; columns c..c + 4 nv <= TW.
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
/// `q` holds `H * d` values; `kp` rows of `TW` with `V * 4` columns from it; `s` `H` rows
/// of `TW` with `V * 4` columns.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn qk_block<const H: usize, const V: usize>(q: *const f32, d: usize, kp: *const f32, s: *mut f32) {
    let mut acc = [[vdupq_n_f32(0.0); V]; H];
    for i in 0..d {
        // SAFETY: per the function's contract.
        unsafe {
            let mut k = [vdupq_n_f32(0.0); V];
            for v in 0..V {
                k[v] = vld1q_f32(kp.add(i * TW + v * W));
            }
            for j in 0..H {
                let qv = *q.add(j * d + i);
                for v in 0..V {
                    acc[j][v] = vfmaq_n_f32(acc[j][v], k[v], qv);
                }
            }
        }
    }
    for j in 0..H {
        for v in 0..V {
            // SAFETY: per the function's contract.
            unsafe { vst1q_f32(s.add(j * TW + v * W), acc[j][v]) };
        }
    }
}

/// As [`super::scalar::softmax`].
///
/// # Safety
/// The CPU must support neon.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn softmax(s: &mut [f32], rows: usize, ntok: usize, m: &mut [f32], l: &mut [f32], alpha: &mut [f32]) {
    assert!(ntok <= TW && s.len() >= rows * TW && m.len() >= rows && l.len() >= rows && alpha.len() >= rows);
    let ninf = vdupq_n_f32(f32::NEG_INFINITY);
    let nv = ntok.div_ceil(W);
    let idx: [u32; 4] = [0, 1, 2, 3];
    // SAFETY: idx holds 4 values.
    let idx = unsafe { vld1q_u32(idx.as_ptr()) };
    for r in 0..rows {
        let row = s[r * TW..(r + 1) * TW].as_mut_ptr();
        let mut x = [ninf; TW / W];
        let mut mx = ninf;
        for v in 0..nv {
            let keep = vcltq_u32(idx, vdupq_n_u32(ntok.saturating_sub(v * W).min(W) as u32));
            // SAFETY: vector v < 16 of the row's TW values.
            x[v] = vbslq_f32(keep, unsafe { vld1q_f32(row.add(v * W)) }, ninf);
            mx = vmaxq_f32(mx, x[v]);
        }
        let mx = vmaxvq_f32(mx).max(m[r]);
        if mx == f32::NEG_INFINITY {
            for v in 0..nv {
                // SAFETY: as above.
                unsafe { vst1q_f32(row.add(v * W), vdupq_n_f32(0.0)) };
            }
            alpha[r] = 1.0;
            continue;
        }
        alpha[r] = crate::attention::work::weight(m[r] - mx);
        m[r] = mx;
        let mut sum = vdupq_n_f32(0.0);
        for v in 0..nv {
            // Lanes equal to -inf (masked) give 0.
            let hidden = vceqq_f32(x[v], ninf);
            let e = vbslq_f32(hidden, vdupq_n_f32(0.0), exp2(vsubq_f32(x[v], vdupq_n_f32(mx))));
            sum = vaddq_f32(sum, e);
            // SAFETY: as above.
            unsafe { vst1q_f32(row.add(v * W), e) };
        }
        l[r] = l[r] * alpha[r] + vaddvq_f32(sum);
    }
}

/// As [`super::scalar::pv`].
///
/// # Safety
/// The CPU must support neon.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn pv(p: &[f32], rows: usize, ntok: usize, d: usize, vp: &[f32], alpha: &[f32], o: &mut [f32]) {
    assert!(ntok <= TW && p.len() >= rows * TW && vp.len() >= ntok * d && alpha.len() >= rows && o.len() >= rows * d);
    let dv = d / W * W;
    let mut r = 0;
    while r < rows {
        let h = (rows - r).min(R);
        let mut u0 = 0;
        while u0 < dv {
            let nv = ((dv - u0) / W).min(NV);
            // SAFETY: rows r..r + h of p, alpha and o exist; dimensions u0..u0 + 4 nv <= dv
            // <= d of each row; V rows t < ntok.
            unsafe {
                let (pp, ap, op) = (p.as_ptr().add(r * TW), alpha.as_ptr().add(r), o.as_mut_ptr().add(r * d + u0));
                dispatch!(pv_block, h, nv, pp, ntok, d, vp.as_ptr().add(u0), ap, op)
            }
            u0 += NV * W;
        }
        for j in r..r + h {
            for i in dv..d {
                let mut x = o[j * d + i] * alpha[j];
                for t in 0..ntok {
                    x += p[j * TW + t] * vp[t * d + i];
                }
                o[j * d + i] = x;
            }
        }
        r += h;
    }
}

/// # Safety
/// `p` holds `H` rows of `TW`, `alpha` `H`, `o` `H` rows of stride `d` with `V * 4`
/// values from it, `vp` `ntok` rows of stride `d` with `V * 4` values from it.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn pv_block<const H: usize, const V: usize>(p: *const f32, ntok: usize, d: usize, vp: *const f32, alpha: *const f32, o: *mut f32) {
    let mut acc = [[vdupq_n_f32(0.0); V]; H];
    for j in 0..H {
        for u in 0..V {
            // SAFETY: per the function's contract.
            acc[j][u] = unsafe { vmulq_n_f32(vld1q_f32(o.add(j * d + u * W)), *alpha.add(j)) };
        }
    }
    for t in 0..ntok {
        // SAFETY: per the function's contract.
        unsafe {
            let mut v = [vdupq_n_f32(0.0); V];
            for u in 0..V {
                v[u] = vld1q_f32(vp.add(t * d + u * W));
            }
            for j in 0..H {
                let pj = *p.add(j * TW + t);
                for u in 0..V {
                    acc[j][u] = vfmaq_n_f32(acc[j][u], v[u], pj);
                }
            }
        }
    }
    for j in 0..H {
        for u in 0..V {
            // SAFETY: per the function's contract.
            unsafe { vst1q_f32(o.add(j * d + u * W), acc[j][u]) };
        }
    }
}
