//! The portable reference micro-kernels (plain loops over the packed tiles), the oracle
//! of the SIMD paths in the Rust tests.

use super::plan::TW;

/// `s[r][t] = q[r] . kp[.][t]` for `t < ntok` (`q`: `[rows][d]`, `kp`: `[d][TW]`).
pub(crate) fn qk(q: &[f32], rows: usize, d: usize, kp: &[f32], ntok: usize, s: &mut [f32]) {
    for r in 0..rows {
        let qr = &q[r * d..(r + 1) * d];
        for t in 0..ntok {
            s[r * TW + t] = qr.iter().enumerate().map(|(i, &x)| x * kp[i * TW + t]).sum();
        }
    }
}

/// Online softmax over the first `ntok` scores of each row (log2 units; `-inf` is
/// masked): moves `m`, rescales `l`, writes the probabilities in place and each row's
/// rescale factor of its accumulator into `alpha`.
pub(crate) fn softmax(s: &mut [f32], rows: usize, ntok: usize, m: &mut [f32], l: &mut [f32], alpha: &mut [f32]) {
    for r in 0..rows {
        let row = &mut s[r * TW..r * TW + ntok];
        let mx = row.iter().copied().fold(m[r], f32::max);
        if mx == f32::NEG_INFINITY {
            row.fill(0.0);
            alpha[r] = 1.0;
            continue;
        }
        alpha[r] = (m[r] - mx).exp2();
        m[r] = mx;
        let mut sum = 0f32;
        for x in row.iter_mut() {
            *x = if *x == f32::NEG_INFINITY { 0.0 } else { (*x - mx).exp2() };
            sum += *x;
        }
        l[r] = l[r] * alpha[r] + sum;
    }
}

/// `o[r] = alpha[r] * o[r] + sum_t p[r][t] * vp[t]` (`vp`: `[TW][d]`).
pub(crate) fn pv(p: &[f32], rows: usize, ntok: usize, d: usize, vp: &[f32], alpha: &[f32], o: &mut [f32]) {
    for r in 0..rows {
        let orow = &mut o[r * d..(r + 1) * d];
        orow.iter_mut().for_each(|x| *x *= alpha[r]);
        for t in 0..ntok {
            let w = p[r * TW + t];
            for (x, &v) in orow.iter_mut().zip(&vp[t * d..(t + 1) * d]) {
                *x += w * v;
            }
        }
    }
}
