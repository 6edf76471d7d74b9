//! AVX2 + FMA + F16C kernel: 8 tokens per register, same structure as [`super::avx512`]
//! (head tiles of 4 with two partial sums each, their query rows interleaved; online
//! softmax in registers with the heads' `exp2` interleaved and the sums kept per lane;
//! V accumulators of 4 heads x 16 dimensions held across the chunk; the next tiles
//! prefetched into L1 and the far ones into L2, spread over the loops by the x86
//! [`Prefetcher`]).
//!
//! AVX2 has no masked 16-bit load, so a partial chunk (fewer than 8 tokens, or a
//! `head_dim` tail) is staged through a zeroed stack buffer by checked loads; a full
//! chunk's K rows and the V rows of a `head_dim` that is a multiple of 16 take raw loads
//! with stepped pointers, checked once per chunk (the checked loads of the first version
//! held bf16 and 8-bit decode near 1x of each other and far under the FMA roof).
//!
//! 8-bit caches dequantize in registers ([`super::avx2_cvt`]); the scales never touch the
//! codes: the K scales (8 per-token scales for int8, one per head for fp8, times 2^8 for
//! e4m3) multiply the scores, the V scales the probabilities after the softmax sum took
//! them, so `P V` runs on the codes.

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx2_cvt::{exp2, exp2_each, hmax, load, load_full, scale_vector, soft_cap_each};
use super::query::interleave_query;
use super::work::{Ahead, Chunk, LaneSums, Partial, Work, LAZY_MAX};
use super::x86_prefetch::{Prefetcher, Stream};
use crate::kv::Elem;

const W: usize = 8;
const HT: usize = 4;
/// V accumulator vectors per head per pass: 4 heads x 2 (16 dimensions each) = 8 of the
/// 16 ymm registers, with the V row and the broadcast probability beside them (4 per
/// head spilled accumulators to the stack in the token loop: 8-bit decode 18-22% slower,
/// bf16 8%, at shape (a) of `benches/bench_quant.py`).
const VT: usize = 2;

/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    // A soft cap is an instantiation of its own, as on the AVX-512 path (tested at run
    // time in the tile loop, it cost the calls without one up to 1.07x: e4m3, AVX2).
    match w.soft_cap {
        Some(c) => tiles::<E, true>(w, p, c),
        None => tiles::<E, false>(w, p, 0.0),
    }
}

/// [`run`]'s loop; with `CAP` each score `s` becomes `cap * tanh(s / cap)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tiles<E: Elem, const CAP: bool>(w: &Work<E>, p: &mut Partial, cap: f32) {
    let g = w.g;
    let q = interleave_query(w.q, w.shape.head_dim, g, HT);
    let mut probs = [[0f32; W]; HT];
    let mut l = LaneSums::<W>::new(p.l);
    w.for_each_chunk(W, |hi, chunk, pf| {
        let mut j0 = 0;
        while j0 < g {
            let qh = hi * g + j0;
            let pf = if j0 == 0 { pf } else { None };
            match g - j0 {
                1 => head_tile::<E, 1, CAP>(chunk, &q, qh, p, l.rows(), &mut probs, pf, cap),
                2 => head_tile::<E, 2, CAP>(chunk, &q, qh, p, l.rows(), &mut probs, pf, cap),
                3 => head_tile::<E, 3, CAP>(chunk, &q, qh, p, l.rows(), &mut probs, pf, cap),
                _ => head_tile::<E, 4, CAP>(chunk, &q, qh, p, l.rows(), &mut probs, pf, cap),
            }
            j0 += HT;
        }
    });
    l.finish(p.l);
}

/// Scores, softmax update and V accumulation of query heads `qh..qh + H` over a chunk of
/// up to 8 tokens; `q` holds the item's query rows interleaved per head tile, `l` each
/// head's softmax sum per lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn head_tile<E: Elem, const H: usize, const CAP: bool>(
    c: &Chunk<E>,
    q: &[f32],
    qh: usize,
    p: &mut Partial,
    l: &mut [[f32; W]],
    probs: &mut [[f32; W]; HT],
    prefetch: Option<Ahead<E>>,
    cap: f32,
) {
    let (d, bs, n) = (c.d, c.bs, c.lanes);
    // K rows are bs apart (the last token read: (d - 1) * bs + c0 + n - 1 < d * bs), V
    // rows d apart (c0 + n <= bs rows); the tile's query rows qh .. qh + H exist.
    assert!(c.kt.len() >= d * bs && c.vt.len() >= d * bs && n <= W && c.c0 + n <= bs);
    assert!(q.len() >= (qh + H) * d && l.len() >= qh + H && p.acc.len() >= (qh + H) * d);
    // The next tiles into L1, the far ones into L2, spread over the loops (a burst of L2
    // prefetches at the tile's start stalls on the miss buffers).
    let (next_k, next_v) = match prefetch {
        Some(Ahead { k, v, far }) => {
            (Stream { l1: Some(k), l2: far.map(|f| f.0) }, Stream { l1: Some(v), l2: far.map(|f| f.1) })
        }
        None => (Stream::NONE, Stream::NONE),
    };
    let qp = q[qh * d..].as_ptr();
    // SAFETY: the asserts above are `scores`' contract.
    let mut scores = unsafe {
        match (n == W, H <= 2) {
            (true, true) => scores::<E, H, true, 4>(c, qp, next_k),
            (true, false) => scores::<E, H, true, 2>(c, qp, next_k),
            (false, true) => scores::<E, H, false, 4>(c, qp, next_k),
            (false, false) => scores::<E, H, false, 2>(c, qp, next_k),
        }
    };

    // 8-bit K: the scores carry the K scales; V: the probabilities carry the V scales.
    let kscale = scale_vector::<E>(&c.ks, c.c0, n);
    if CAP {
        // The cap applies to the finished logit: K scales first.
        if let Some(ks) = kscale {
            scores = scores.map(|s| _mm256_mul_ps(s, ks));
        }
        scores = soft_cap_each(scores, cap);
    }
    let vscale = scale_vector::<E>(&c.vs, c.c0, n);
    // Lanes >= n hold no token: force their score to -inf, hence probability 0.
    let valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    let valid = _mm256_castsi256_ps(valid);
    // The lazy maximum of `LAZY_MAX`: moved (and the accumulators rescaled) only when a
    // score exceeds it by more than that, as on the AVX-512 path.
    let mut alpha = [1f32; H];
    let mut rescale = false;
    let mut x = [_mm256_setzero_ps(); H];
    for j in 0..H {
        let s = if CAP { scores[j] } else { kscale.map_or(scores[j], |ks| _mm256_mul_ps(scores[j], ks)) };
        let s = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, valid);
        let m_old = p.m[qh + j];
        // Always taken on the first chunk (m = -inf); lanes without a token are -inf.
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(s, _mm256_set1_ps(m_old + LAZY_MAX))) != 0 {
            let m_new = hmax(s);
            // exp2 of the vector unit, not libm's: a call would spill every register.
            alpha[j] = _mm256_cvtss_f32(exp2(_mm256_set1_ps(m_old - m_new)));
            p.m[qh + j] = m_new;
            rescale = true;
        }
        x[j] = _mm256_sub_ps(s, _mm256_set1_ps(p.m[qh + j]));
    }
    let e = exp2_each(x);
    for j in 0..H {
        let e = _mm256_and_ps(e[j], valid);
        // SAFETY: l[qh + j] (asserted to exist) and probs[j] hold exactly 8 f32.
        unsafe {
            let lp = l.as_mut_ptr().add(qh + j).cast::<f32>();
            let mut lv = _mm256_loadu_ps(lp);
            if rescale {
                lv = _mm256_mul_ps(lv, _mm256_set1_ps(alpha[j]));
            }
            _mm256_storeu_ps(lp, _mm256_add_ps(lv, e));
            let e = vscale.map_or(e, |vs| _mm256_mul_ps(e, vs));
            _mm256_storeu_ps(probs[j].as_mut_ptr(), e);
        }
    }

    let acc = &mut p.acc[qh * d..(qh + H) * d];
    let passes = d.div_ceil(if H <= 2 { 2 * VT * W } else { VT * W });
    let mut pf = Prefetcher::new(next_v, passes * n);
    // SAFETY: `pv` asserts its contract; the features are ours.
    unsafe {
        if H <= 2 && d.is_multiple_of(2 * VT * W) {
            // 1-2 heads: 32 dimensions per pass, so that 4-8 accumulator chains hide the
            // FMA latency.
            pv::<E, H, { 2 * VT }, true>(c, acc, probs, &alpha, rescale, &mut pf);
        } else if d.is_multiple_of(VT * W) {
            pv::<E, H, VT, true>(c, acc, probs, &alpha, rescale, &mut pf);
        } else {
            pv::<E, H, VT, false>(c, acc, probs, &alpha, rescale, &mut pf);
        }
    }
}

/// Scores in log2 units of the tile's `H` heads for the chunk's tokens: K rows `i` at
/// `kt[i * bs + c0..]`, FMA'd with the broadcast query element `qp[i * H + j]` (the
/// tile's rows interleaved), `R` rows and partial sums per head per step (two FMA
/// pipes of 4 cycles' latency want 8 sums in flight: 1-2 heads take 4 rows, 3-4 heads
/// 2). `FULL` (8 tokens): raw loads, pointers stepped; else each row through the
/// checked, staged [`load`].
///
/// # Safety
/// `c.kt` holds `d * bs` elements with `c0 + lanes <= bs` (and `lanes == 8` with
/// `FULL`); `qp` holds `H * d` f32; the CPU has the features below.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores<E: Elem, const H: usize, const FULL: bool, const R: usize>(
    c: &Chunk<E>,
    qp: *const f32,
    next_k: Stream<E>,
) -> [__m256; H] {
    let (d, bs, n) = (c.d, c.bs, c.lanes);
    // Row i of the chunk: `kr` (stepped with i) + r * bs with `FULL`, else checked.
    let row = |kr: *const E, i: usize, r: usize| -> __m256 {
        if FULL {
            // SAFETY: row i + r < d, tokens c0 .. c0 + 8 <= bs of it (kr = kt + i * bs +
            // c0): inside kt.
            unsafe { load_full(kr.add(r * bs)) }
        } else {
            load(c.kt, (i + r) * bs + c.c0, n)
        }
    };
    let mut pf = Prefetcher::new(next_k, d / R);
    let mut s = [[_mm256_setzero_ps(); H]; R];
    let (mut kr, mut qr) = (c.kt.as_ptr().wrapping_add(c.c0), qp);
    let mut i = 0;
    while i + R <= d {
        let mut k = [_mm256_setzero_ps(); R];
        for r in 0..R {
            k[r] = row(kr, i, r);
        }
        pf.step();
        for r in 0..R {
            for j in 0..H {
                // SAFETY: query element (i + r) * H + j < H * d (qr = qp + i * H).
                s[r][j] = _mm256_fmadd_ps(_mm256_set1_ps(unsafe { *qr.add(r * H + j) }), k[r], s[r][j]);
            }
        }
        kr = kr.wrapping_add(R * bs);
        qr = qr.wrapping_add(R * H);
        i += R;
    }
    while i < d {
        let k0 = row(kr, i, 0);
        for j in 0..H {
            // SAFETY: query element i * H + j < H * d.
            s[0][j] = _mm256_fmadd_ps(_mm256_set1_ps(unsafe { *qr.add(j) }), k0, s[0][j]);
        }
        kr = kr.wrapping_add(bs);
        qr = qr.wrapping_add(H);
        i += 1;
    }
    for j in 0..H {
        for r in 1..R {
            s[0][j] = _mm256_add_ps(s[0][j], s[r][j]);
        }
    }
    s[0]
}

/// `acc[j] = alpha[j] * acc[j] + sum_t probs[j][t] v_t` (without `alpha` unless
/// `rescale`) for the chunk's V rows, `U` vectors of the `H` heads' accumulators in
/// registers per pass. `FULL` (`d` a multiple of `8 U`): raw loads and stores, the V row
/// pointer stepped by `d`; else checked loads and stores, a last partial vector staged.
///
/// # Safety
/// `c.vt` holds rows `c0 .. c0 + lanes` of `d` elements (asserted); with `FULL`, `d` is a
/// multiple of `8 U` (asserted); the CPU has the features below.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv<E: Elem, const H: usize, const U: usize, const FULL: bool>(
    c: &Chunk<E>,
    acc: &mut [f32],
    probs: &[[f32; W]; HT],
    alpha: &[f32; H],
    rescale: bool,
    pf: &mut Prefetcher,
) {
    let d = c.d;
    assert!(H <= HT && acc.len() == H * d && (!FULL || d.is_multiple_of(U * W)));
    assert!(c.lanes <= W && (c.c0 + c.lanes) * d <= c.vt.len());
    // Only the `FULL` branches use `ap`, and they use nothing else of `acc`.
    let ap = acc.as_mut_ptr();
    let mut u0 = 0;
    while u0 < d {
        // Elements of each vector inside the row (all 8 with `FULL`; 0: past the row).
        let mut w = [W; U];
        if !FULL {
            for u in 0..U {
                w[u] = d.saturating_sub(u0 + u * W).min(W);
            }
        }
        let mut a = [[_mm256_setzero_ps(); U]; H];
        for j in 0..H {
            for u in 0..U {
                let at = j * d + u0 + u * W;
                if FULL {
                    // SAFETY: at + 8 <= H * d = acc.len() (d a multiple of 8 U).
                    a[j][u] = unsafe { _mm256_loadu_ps(ap.add(at)) };
                } else if w[u] > 0 {
                    a[j][u] = load(acc, at, w[u]);
                }
                if rescale {
                    a[j][u] = _mm256_mul_ps(_mm256_set1_ps(alpha[j]), a[j][u]);
                }
            }
        }
        let mut vr = c.vt.as_ptr().wrapping_add(c.c0 * d + u0);
        for t in 0..c.lanes {
            pf.step();
            // A loop, not `array::from_fn`: a closure does not inherit the target
            // features, so `load` would be an out-of-line call per vector.
            let mut v = [_mm256_setzero_ps(); U];
            for u in 0..U {
                if FULL {
                    // SAFETY: vr is row c0 + t of the V tile (inside vt, asserted),
                    // elements u0 + u * 8 .. + 8 <= d of it.
                    v[u] = unsafe { load_full(vr.add(u * W)) };
                } else if w[u] > 0 {
                    v[u] = load(c.vt, (c.c0 + t) * d + u0 + u * W, w[u]);
                }
            }
            for j in 0..H {
                let pj = _mm256_set1_ps(probs[j][t]);
                for u in 0..U {
                    a[j][u] = _mm256_fmadd_ps(pj, v[u], a[j][u]);
                }
            }
            vr = vr.wrapping_add(d);
        }
        for j in 0..H {
            for u in 0..U {
                let at = j * d + u0 + u * W;
                if FULL {
                    // SAFETY: as the load above.
                    unsafe { _mm256_storeu_ps(ap.add(at), a[j][u]) };
                } else if w[u] == W {
                    let dst = &mut acc[at..at + W];
                    // SAFETY: dst holds exactly 8 f32 (checked slice).
                    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), a[j][u]) };
                } else if w[u] > 0 {
                    let mut buf = [0f32; W];
                    // SAFETY: buf holds 8 f32.
                    unsafe { _mm256_storeu_ps(buf.as_mut_ptr(), a[j][u]) };
                    acc[at..at + w[u]].copy_from_slice(&buf[..w[u]]);
                }
            }
        }
        u0 += U * W;
    }
}
