//! The SIMD micro-kernels over the packed tiles, written once over [`Lanes`] and entered
//! per instruction set (`avx2`, `avx512`, `neon` below): each is [`super::scalar`]'s
//! function of the same name.
//!
//! - `Q K^T`: `ROWS` query rows x `VECS` vectors of keys of accumulators in registers
//!   (AVX-512 6 x 4 = 64 keys, AVX2 4 x 2, NEON 4 x 4); per dimension, `VECS` loads of the
//!   K pack row and one broadcast query element per row feed `ROWS x VECS` FMAs.
//! - softmax: per row, a vector max, then `exp2` by the path's polynomial (exactly 0 for a
//!   masked `-inf` score).
//! - `P V`: `ROWS` rows x `VECS` vectors of dimensions of accumulators; per key, `VECS`
//!   loads of the V pack row and one broadcast probability per row; the dimension tail
//!   (d not a multiple of the lanes) is a partial vector.
//!
//! Every stage checks its slices' lengths once with `assert!` and then indexes raw
//! pointers inside them; lanes outside a partial vector are never accessed.

// Register tiles are small fixed arrays indexed by row and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use super::plan::TW;
use crate::attention::lanes::{entry, paths, Lanes};

/// Call `$f::<[$l,] H, V>($args)` for a run-time `h` in 1..=6 and `v` in 1..=4 (the
/// stages here bound them by `L::ROWS` and `L::VECS`, so the larger arms fold away).
macro_rules! dispatch {
    ($f:ident $(<$l:ty>)?, $h:expr, $v:expr, $($a:expr),*) => {
        match ($h, $v) {
            (1, 1) => $f::<$($l,)? 1, 1>($($a),*), (1, 2) => $f::<$($l,)? 1, 2>($($a),*), (1, 3) => $f::<$($l,)? 1, 3>($($a),*), (1, _) => $f::<$($l,)? 1, 4>($($a),*),
            (2, 1) => $f::<$($l,)? 2, 1>($($a),*), (2, 2) => $f::<$($l,)? 2, 2>($($a),*), (2, 3) => $f::<$($l,)? 2, 3>($($a),*), (2, _) => $f::<$($l,)? 2, 4>($($a),*),
            (3, 1) => $f::<$($l,)? 3, 1>($($a),*), (3, 2) => $f::<$($l,)? 3, 2>($($a),*), (3, 3) => $f::<$($l,)? 3, 3>($($a),*), (3, _) => $f::<$($l,)? 3, 4>($($a),*),
            (4, 1) => $f::<$($l,)? 4, 1>($($a),*), (4, 2) => $f::<$($l,)? 4, 2>($($a),*), (4, 3) => $f::<$($l,)? 4, 3>($($a),*), (4, _) => $f::<$($l,)? 4, 4>($($a),*),
            (5, 1) => $f::<$($l,)? 5, 1>($($a),*), (5, 2) => $f::<$($l,)? 5, 2>($($a),*), (5, 3) => $f::<$($l,)? 5, 3>($($a),*), (5, _) => $f::<$($l,)? 5, 4>($($a),*),
            (_, 1) => $f::<$($l,)? 6, 1>($($a),*), (_, 2) => $f::<$($l,)? 6, 2>($($a),*), (_, 3) => $f::<$($l,)? 6, 3>($($a),*), (_, _) => $f::<$($l,)? 6, 4>($($a),*),
        }
    };
}
#[cfg(target_arch = "x86_64")]
pub(super) use dispatch;

/// `on_path!(path, stage(args))`: the micro-kernel `stage` on the `Supported` `path`, its
/// entry below (the scalar one for a path without SIMD). The one list of this file's paths.
macro_rules! on_path {
    ($path:expr, $stage:ident($($a:expr),*)) => {
        match $path.isa() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Supported` holds only a path this CPU runs: the CPU has its features.
            $crate::attention::isa::Isa::Avx512 => unsafe { $crate::attention::prefill::simd::avx512::$stage($($a),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            $crate::attention::isa::Isa::Avx2 => unsafe { $crate::attention::prefill::simd::avx2::$stage($($a),*) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above.
            $crate::attention::isa::Isa::Neon => unsafe { $crate::attention::prefill::simd::neon::$stage($($a),*) },
            _ => $crate::attention::prefill::scalar::$stage($($a),*),
        }
    };
}
pub(super) use on_path;

paths!(entry! {
    crate::attention::prefill::simd;
    [
        fn qk(q: &[f32], rows: usize, d: usize, kp: &[f32], ntok: usize, s: &mut [f32]) = qk;
        fn softmax(s: &mut [f32], rows: usize, ntok: usize, m: &mut [f32], l: &mut [f32], alpha: &mut [f32]) = softmax;
        fn pv(p: &[f32], rows: usize, ntok: usize, d: usize, vp: &[f32], alpha: &[f32], o: &mut [f32]) = pv;
    ]
});

/// Scores `s[r][t] = q[r] . kp[.][t]` of `rows` rows for `ntok <= TW` keys (lanes up to
/// the next multiple of `W` are computed too, from whatever the pack holds).
#[inline(always)]
fn qk<L: Lanes>(x: L, q: &[f32], rows: usize, d: usize, kp: &[f32], ntok: usize, s: &mut [f32]) {
    assert!(ntok <= TW && q.len() >= rows * d && kp.len() >= d * TW && s.len() >= rows * TW);
    let mut r = 0;
    while r < rows {
        let h = (rows - r).min(L::ROWS);
        let mut c = 0;
        while c < ntok {
            let nv = (ntok - c).div_ceil(L::W).min(L::VECS);
            // SAFETY: rows r..r + h of q (h * d values) and of s (h * TW) exist (assert);
            // the block reads kp rows 0..d, columns c..c + W nv <= TW.
            unsafe {
                let (qp, sp) = (q.as_ptr().add(r * d), s.as_mut_ptr().add(r * TW + c));
                dispatch!(qk_block<L>, h, nv, x, qp, d, kp.as_ptr().add(c), sp)
            }
            c += L::VECS * L::W;
        }
        r += h;
    }
}

/// # Safety
/// `q` holds `H * d` values; `kp` rows of `TW` with `V * W` columns from it; `s` `H` rows
/// of `TW` with `V * W` columns.
#[inline(always)]
unsafe fn qk_block<L: Lanes, const H: usize, const V: usize>(x: L, q: *const f32, d: usize, kp: *const f32, s: *mut f32) {
    let mut acc = [[x.splat(0.0); V]; H];
    for i in 0..d {
        let mut k = [x.splat(0.0); V];
        for v in 0..V {
            // SAFETY: row i < d of the K pack, vector v < V (the contract).
            k[v] = unsafe { x.load(kp.add(i * TW + v * L::W)) };
        }
        for j in 0..H {
            // SAFETY: query element j * d + i < H * d.
            let qv = x.splat(unsafe { *q.add(j * d + i) });
            for v in 0..V {
                acc[j][v] = x.fma(qv, k[v], acc[j][v]);
            }
        }
    }
    for j in 0..H {
        for v in 0..V {
            // SAFETY: s row j < H, vector v < V (the contract).
            unsafe { x.store(s.add(j * TW + v * L::W), acc[j][v]) };
        }
    }
}

/// Online softmax of the first `ntok` scores of each row (log2 units; `-inf` is masked):
/// moves `m`, rescales `l`, writes the probabilities in place and each row's rescale
/// factor of its accumulator into `alpha`.
#[inline(always)]
fn softmax<L: Lanes>(x: L, s: &mut [f32], rows: usize, ntok: usize, m: &mut [f32], l: &mut [f32], alpha: &mut [f32]) {
    assert!(ntok <= TW && s.len() >= rows * TW && m.len() >= rows && l.len() >= rows && alpha.len() >= rows);
    let ninf = x.splat(f32::NEG_INFINITY);
    let nv = ntok.div_ceil(L::W);
    for r in 0..rows {
        let row = s[r * TW..(r + 1) * TW].as_mut_ptr();
        let mut mx = ninf;
        for v in 0..nv {
            // SAFETY: v < nv <= TW / W; the row holds TW values.
            mx = x.max(mx, unsafe { masked(x, row, v, ntok) });
        }
        let mx = x.hmax(mx).max(m[r]);
        if mx == f32::NEG_INFINITY {
            for v in 0..nv {
                // SAFETY: as above.
                unsafe { x.store(row.add(v * L::W), x.splat(0.0)) };
            }
            alpha[r] = 1.0;
            continue;
        }
        // m = -inf (and any gap past `EXP2_ZERO_BELOW`) gives exactly 0.
        alpha[r] = x.exp2_one(m[r] - mx);
        m[r] = mx;
        let mut sum = x.splat(0.0);
        for v in 0..nv {
            // SAFETY: as above.
            let e = x.exp2(x.sub(unsafe { masked(x, row, v, ntok) }, x.splat(mx)));
            sum = x.add(sum, e);
            // SAFETY: as above.
            unsafe { x.store(row.add(v * L::W), e) };
        }
        l[r] = l[r] * alpha[r] + x.hsum(sum);
    }
}

/// Vector `v` of a score row, `-inf` past its `ntok` scores (no closure: one would not be
/// compiled with the entry's features).
///
/// # Safety
/// `row` holds `TW` values and `v * W < TW`.
#[inline(always)]
unsafe fn masked<L: Lanes>(x: L, row: *const f32, v: usize, ntok: usize) -> L::V {
    // SAFETY: vector v of the row (the contract).
    x.select(x.first(ntok - v * L::W), unsafe { x.load(row.add(v * L::W)) }, x.splat(f32::NEG_INFINITY))
}

/// `o[r] = alpha[r] * o[r] + sum_t p[r][t] * vp[t]` for `t < ntok` (`vp`: `[TW][d]`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pv<L: Lanes>(x: L, p: &[f32], rows: usize, ntok: usize, d: usize, vp: &[f32], alpha: &[f32], o: &mut [f32]) {
    assert!(ntok <= TW && p.len() >= rows * TW && vp.len() >= ntok * d && alpha.len() >= rows && o.len() >= rows * d);
    let mut r = 0;
    while r < rows {
        let h = (rows - r).min(L::ROWS);
        let mut u0 = 0;
        while u0 < d {
            let nv = (d - u0).div_ceil(L::W).min(L::VECS);
            // SAFETY: rows r..r + h of p, alpha and o exist (assert); dimensions u0.. of
            // each row and of V rows t < ntok, masked to d.
            unsafe {
                let (pp, ap, op) = (p.as_ptr().add(r * TW), alpha.as_ptr().add(r), o.as_mut_ptr().add(r * d + u0));
                dispatch!(pv_block<L>, h, nv, x, pp, ntok, d - u0, d, vp.as_ptr().add(u0), ap, op)
            }
            u0 += L::VECS * L::W;
        }
        r += h;
    }
}

/// `V` vectors of dimensions (the lanes `< n` of them) of `H` rows.
///
/// # Safety
/// `p` holds `H` rows of `TW`, `alpha` `H`; `o` `H` rows of stride `d` and `vp` `ntok`
/// rows of stride `d`, each with `n` values from it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_block<L: Lanes, const H: usize, const V: usize>(
    x: L,
    p: *const f32,
    ntok: usize,
    n: usize,
    d: usize,
    vp: *const f32,
    alpha: *const f32,
    o: *mut f32,
) {
    let mut mk = [x.first(n); V];
    for u in 1..V {
        mk[u] = x.first(n.saturating_sub(u * L::W));
    }
    let mut acc = [[x.splat(0.0); V]; H];
    for j in 0..H {
        // SAFETY: alpha[j], j < H; the lanes in mk[u] of row j (the contract).
        let al = x.splat(unsafe { *alpha.add(j) });
        for u in 0..V {
            // SAFETY: as above.
            acc[j][u] = x.mul(al, unsafe { x.load_part(o.wrapping_add(j * d + u * L::W), mk[u]) });
        }
    }
    for t in 0..ntok {
        let mut v = [x.splat(0.0); V];
        for u in 0..V {
            // SAFETY: V row t < ntok, the lanes in mk[u] (the contract).
            v[u] = unsafe { x.load_part(vp.wrapping_add(t * d + u * L::W), mk[u]) };
        }
        for j in 0..H {
            // SAFETY: probability t < ntok <= TW of row j < H.
            let pj = x.splat(unsafe { *p.add(j * TW + t) });
            for u in 0..V {
                acc[j][u] = x.fma(pj, v[u], acc[j][u]);
            }
        }
    }
    for j in 0..H {
        for u in 0..V {
            // SAFETY: as for the load.
            unsafe { x.store_part(o.wrapping_add(j * d + u * L::W), mk[u], acc[j][u]) };
        }
    }
}
