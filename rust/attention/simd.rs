//! The decode tile loop written once over [`Lanes`], entered by the AVX2 and NEON paths
//! (`avx2::run`, `neon::run` below): one token per lane, a chunk of `W` tokens (8 on
//! AVX2, 4 on NEON), the structure of [`super::avx512`] without its policies:
//!
//! 1. scores of up to 4 query heads at once (their query rows interleaved): K rows
//!    `i` FMA'd with the broadcast query element, `R` rows and partial sums per head per
//!    step (two FMA pipes of 4 cycles' latency want 8 sums in flight: 1-2 heads take 4
//!    rows, 3-4 heads 2);
//! 2. online softmax in registers, the heads' `exp2` interleaved, with the lazy maximum
//!    of [`LAZY_MAX`] and each head's sum kept per lane;
//! 3. `P V` with `ACC_VECS` accumulator vectors per head held across the chunk (twice as
//!    many for 1-2 heads, so that 4-8 chains hide the FMA latency).
//!
//! The next tiles are prefetched into L1 and the far ones into L2, spread over the loops
//! by the [`Prefetcher`]. A full chunk's K rows and the V rows of a `head_dim` that is a
//! multiple of the pass take raw loads with stepped pointers, checked once per chunk;
//! partial ones take [`Elements::widen_part`](super::lanes::Elements::widen_part). 8-bit caches dequantize in registers; the
//! scales never touch the codes: the K scales multiply the scores, the V scales the
//! probabilities after the softmax sum took them, so `P V` runs on the codes.

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use super::lanes::{entry, Elements as Lanes};
use super::prefetch::{Prefetcher, Stream};
use super::query::interleave_query;
use super::work::{Ahead, Chunk, Partial, Visit, Work, LAZY_MAX};
use crate::kv::Elem;

/// Query heads per register tile.
const HT: usize = 4;
/// The widest vector a path here takes (AVX2's 8 lanes).
const MAX_W: usize = 8;

entry! {
    crate::attention::simd;
    [fn run<E: Elem>(w: &Work<E>, p: &mut Partial) = run;]
    #[cfg(target_arch = "x86_64")]
    avx2 = crate::attention::lanes::Avx2, "avx2,fma,f16c";
    #[cfg(target_arch = "aarch64")]
    neon = crate::attention::lanes::Neon, "neon";
}

/// One item. A soft cap is an instantiation of its own (tested at run time in the tile
/// loop, it cost the calls without one up to 1.07x: e4m3, AVX2).
#[inline(always)]
fn run<L: Lanes, E: Elem>(x: L, w: &Work<E>, p: &mut Partial) {
    // SAFETY: the stages below carry the features of this architecture's one `Elements`
    // (Avx2 on x86-64, Neon on AArch64: the trait is sealed), and `x` proves them.
    unsafe {
        match w.soft_cap {
            Some(c) => tiles::<L, E, true>(x, w, p, c),
            None => tiles::<L, E, false>(x, w, p, 0.0),
        }
    }
}

/// [`run`]'s loop; with `CAP` each score `s` becomes `cap * tanh(s / cap)`.
#[inline]
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma,f16c"))]
#[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))]
fn tiles<L: Lanes, E: Elem, const CAP: bool>(x: L, w: &Work<E>, p: &mut Partial, cap: f32) {
    assert!(L::W <= MAX_W);
    let g = w.g;
    let q = interleave_query(w.q, w.shape.head_dim, g, HT);
    let mut probs = [[0f32; MAX_W]; HT];
    // Each head's softmax sum per lane (`W` per head), from the incoming sums in lane 0.
    let mut l = vec![0f32; p.l.len() * L::W];
    for (j, &s) in p.l.iter().enumerate() {
        l[j * L::W] = s;
    }
    w.visit_chunks(L::W, Tiles::<L, CAP> { x, g, q: &q, p: &mut *p, l: &mut l, probs: &mut probs, cap });
    for (dst, lanes) in p.l.iter_mut().zip(l.chunks_exact(L::W)) {
        *dst = lanes.iter().sum();
    }
}

/// [`tiles`]' visit of each chunk, its head tiles of up to [`HT`] heads: a struct whose
/// `#[inline(always)]` method is compiled into [`tiles`] (a closure was left out of line:
/// a call per chunk, 3-13% of AVX2 decode).
struct Tiles<'b, 'p, L: Lanes, const CAP: bool> {
    x: L,
    g: usize,
    /// The item's query rows interleaved per head tile.
    q: &'b [f32],
    p: &'b mut Partial<'p>,
    /// Each head's softmax sum per lane (`W` per head).
    l: &'b mut [f32],
    probs: &'b mut [[f32; MAX_W]; HT],
    cap: f32,
}

impl<'s, L: Lanes, E: Elem, const CAP: bool> Visit<'s, E> for Tiles<'_, '_, L, CAP> {
    #[inline(always)]
    fn chunk(&mut self, hi: usize, chunk: &Chunk<'s, E>, _: Option<&Chunk<'s, E>>, next: Option<Ahead<'s, E>>) {
        let (x, g, cap) = (self.x, self.g, self.cap);
        let mut j0 = 0;
        while j0 < g {
            let qh = hi * g + j0;
            let pf = if j0 == 0 { next } else { None };
            let (q, p, l, probs) = (self.q, &mut *self.p, &mut *self.l, &mut *self.probs);
            // SAFETY: as in `run`: `x` proves the features `head_tile` carries.
            unsafe {
                match g - j0 {
                    1 => head_tile::<L, E, 1, CAP>(x, chunk, q, qh, p, l, probs, pf, cap),
                    2 => head_tile::<L, E, 2, CAP>(x, chunk, q, qh, p, l, probs, pf, cap),
                    3 => head_tile::<L, E, 3, CAP>(x, chunk, q, qh, p, l, probs, pf, cap),
                    _ => head_tile::<L, E, 4, CAP>(x, chunk, q, qh, p, l, probs, pf, cap),
                }
            }
            j0 += HT;
        }
    }
}

/// Scores, softmax update and V accumulation of query heads `qh..qh + H` over a chunk of
/// up to `W` tokens; `q` holds the item's query rows interleaved per head tile, `l` each
/// head's softmax sum per lane (`W` per head).
#[inline]
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma,f16c"))]
#[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))]
#[allow(clippy::too_many_arguments)]
fn head_tile<L: Lanes, E: Elem, const H: usize, const CAP: bool>(
    x: L,
    c: &Chunk<E>,
    q: &[f32],
    qh: usize,
    p: &mut Partial,
    l: &mut [f32],
    probs: &mut [[f32; MAX_W]; HT],
    prefetch: Option<Ahead<E>>,
    cap: f32,
) {
    let (d, bs, n, w) = (c.d, c.bs, c.lanes, L::W);
    // K rows are bs apart (the last token read: (d - 1) * bs + c0 + n - 1 < d * bs), V
    // rows d apart (c0 + n <= bs rows); the tile's query rows qh .. qh + H exist.
    assert!(c.kt.len() >= d * bs && c.vt.len() >= d * bs && n <= w && c.c0 + n <= bs);
    assert!(q.len() >= (qh + H) * d && l.len() >= (qh + H) * w && p.acc.len() >= (qh + H) * d);
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
        match (n == w, H <= 2) {
            (true, true) => scores::<L, E, H, true, 4>(x, c, qp, next_k),
            (true, false) => scores::<L, E, H, true, 2>(x, c, qp, next_k),
            (false, true) => scores::<L, E, H, false, 4>(x, c, qp, next_k),
            (false, false) => scores::<L, E, H, false, 2>(x, c, qp, next_k),
        }
    };

    // 8-bit K: the scores carry the K scales; V: the probabilities carry the V scales.
    let kscale = x.scales::<E>(&c.ks, c.c0, n);
    if CAP {
        // The cap applies to the finished logit: K scales first.
        if let Some(ks) = kscale {
            for j in 0..H {
                scores[j] = x.mul(scores[j], ks);
            }
        }
        scores = x.soft_cap_each(scores, cap);
    }
    let vscale = x.scales::<E>(&c.vs, c.c0, n);
    // Lanes >= n hold no token: their score is -inf, their probability 0.
    let valid = x.first(n);
    let ninf = x.splat(f32::NEG_INFINITY);
    // The lazy maximum of `LAZY_MAX`: moved (and the accumulators rescaled) only when a
    // score exceeds it by more than that, as on the AVX-512 path.
    let mut alpha = [1f32; H];
    let mut rescale = false;
    let mut e = [ninf; H];
    for j in 0..H {
        let s = if CAP { scores[j] } else { kscale.map_or(scores[j], |ks| x.mul(scores[j], ks)) };
        let s = x.select(valid, s, ninf);
        let m_old = p.m[qh + j];
        // Always taken on the first chunk (m = -inf); lanes without a token are -inf.
        if x.any_above(s, m_old + LAZY_MAX) {
            let m_new = x.hmax(s);
            // exp2 of the vector unit, not libm's: a call would spill every register.
            alpha[j] = x.exp2_one(m_old - m_new);
            p.m[qh + j] = m_new;
            rescale = true;
        }
        e[j] = x.sub(s, x.splat(p.m[qh + j]));
    }
    let e = x.exp2_each(e);
    for j in 0..H {
        let e = x.keep(valid, e[j]);
        let lp = l[(qh + j) * w..].as_mut_ptr();
        // SAFETY: the W lane sums of head qh + j (asserted to exist); probs[j] holds
        // MAX_W >= W f32.
        unsafe {
            let mut lv = x.load(lp);
            if rescale {
                lv = x.mul(lv, x.splat(alpha[j]));
            }
            x.store(lp, x.add(lv, e));
            x.store(probs[j].as_mut_ptr(), vscale.map_or(e, |vs| x.mul(e, vs)));
        }
    }

    let acc = &mut p.acc[qh * d..(qh + H) * d];
    let vt = L::ACC_VECS;
    let passes = d.div_ceil(if H <= 2 { 2 * vt * w } else { vt * w });
    let mut pf = Prefetcher::new(next_v, passes * n);
    let (probs, pf) = (&probs[..], &mut pf);
    // 1-2 heads: twice the dimensions per pass, so that 4-8 accumulator chains hide the
    // FMA latency. (`U` is a constant: the paths take 2 or 4 vectors a pass.)
    match (H <= 2 && d.is_multiple_of(2 * vt * w), d.is_multiple_of(vt * w), vt) {
        (true, _, 2) => pv::<L, E, H, 4, true>(x, c, acc, probs, &alpha, rescale, pf),
        (true, _, _) => pv::<L, E, H, 8, true>(x, c, acc, probs, &alpha, rescale, pf),
        (false, true, 2) => pv::<L, E, H, 2, true>(x, c, acc, probs, &alpha, rescale, pf),
        (false, true, _) => pv::<L, E, H, 4, true>(x, c, acc, probs, &alpha, rescale, pf),
        (false, false, 2) => pv::<L, E, H, 2, false>(x, c, acc, probs, &alpha, rescale, pf),
        (false, false, _) => pv::<L, E, H, 4, false>(x, c, acc, probs, &alpha, rescale, pf),
    }
}

/// Scores in log2 units of the tile's `H` heads for the chunk's tokens: K rows `i` at
/// `kt[i * bs + c0..]`, FMA'd with the broadcast query element `qp[i * H + j]` (the
/// tile's rows interleaved), `R` rows and partial sums per head per step. `FULL` (`W`
/// tokens): raw loads, pointers stepped; else `widen_part`.
///
/// # Safety
/// `c.kt` holds `d * bs` elements with `c0 + lanes <= bs` (and `lanes == W` with `FULL`);
/// `qp` holds `H * d` f32.
///
/// Out of line, as `pv`: inlined into `head_tile` at LLVM's choice, AVX2 int8 decode read
/// 1.07-1.09x the time at shape `l2` of `benches/ab_decode.py`.
#[inline(never)]
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma,f16c"))]
#[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))]
unsafe fn scores<L: Lanes, E: Elem, const H: usize, const FULL: bool, const R: usize>(
    x: L,
    c: &Chunk<E>,
    qp: *const f32,
    next_k: Stream<E>,
) -> [L::V; H] {
    let (d, bs, n) = (c.d, c.bs, c.lanes);
    let mut pf = Prefetcher::new(next_k, d / R);
    let mut s = [[x.splat(0.0); H]; R];
    let (mut kr, mut qr) = (c.kt.as_ptr().wrapping_add(c.c0), qp);
    let mut i = 0;
    while i + R <= d {
        let mut k = [x.splat(0.0); R];
        for r in 0..R {
            // SAFETY: row i + r < d, tokens c0 .. c0 + n <= bs of it (kr = kt + i * bs +
            // c0): inside kt (the contract).
            k[r] = unsafe { row::<L, E, FULL>(x, kr.add(r * bs), n) };
        }
        pf.step();
        for r in 0..R {
            for j in 0..H {
                // SAFETY: query element (i + r) * H + j < H * d (qr = qp + i * H).
                s[r][j] = x.fma(x.splat(unsafe { *qr.add(r * H + j) }), k[r], s[r][j]);
            }
        }
        kr = kr.wrapping_add(R * bs);
        qr = qr.wrapping_add(R * H);
        i += R;
    }
    while i < d {
        // SAFETY: as above, one row.
        let k0 = unsafe { row::<L, E, FULL>(x, kr, n) };
        for j in 0..H {
            // SAFETY: query element i * H + j < H * d.
            s[0][j] = x.fma(x.splat(unsafe { *qr.add(j) }), k0, s[0][j]);
        }
        kr = kr.wrapping_add(bs);
        qr = qr.wrapping_add(H);
        i += 1;
    }
    for j in 0..H {
        for r in 1..R {
            s[0][j] = x.add(s[0][j], s[r][j]);
        }
    }
    s[0]
}

/// The `n` elements at `p` (`W` of them with `FULL`) as f32.
///
/// # Safety
/// `p .. p + n` is readable, `n == W` with `FULL`.
#[inline(always)]
unsafe fn row<L: Lanes, E: Elem, const FULL: bool>(x: L, p: *const E, n: usize) -> L::V {
    // SAFETY: the contract.
    unsafe {
        if FULL {
            x.widen(p)
        } else {
            x.widen_part(p, n)
        }
    }
}

/// `acc[j] = alpha[j] * acc[j] + sum_t probs[j][t] v_t` (without `alpha` unless
/// `rescale`) for the chunk's V rows, `U` vectors of the `H` heads' accumulators in
/// registers per pass. `FULL` (`d` a multiple of `W U`): raw loads and stores, the V row
/// pointer stepped by `d`; else partial loads and stores for the row's last vectors.
#[inline(never)]
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma,f16c"))]
#[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))]
fn pv<L: Lanes, E: Elem, const H: usize, const U: usize, const FULL: bool>(
    x: L,
    c: &Chunk<E>,
    acc: &mut [f32],
    probs: &[[f32; MAX_W]],
    alpha: &[f32; H],
    rescale: bool,
    pf: &mut Prefetcher,
) {
    let (d, w) = (c.d, L::W);
    assert!(H <= probs.len() && acc.len() == H * d && (!FULL || d.is_multiple_of(U * w)));
    assert!(c.lanes <= w && (c.c0 + c.lanes) * d <= c.vt.len());
    let ap = acc.as_mut_ptr();
    let mut u0 = 0;
    while u0 < d {
        // Elements of each vector inside the row (all W with `FULL`; 0: past the row).
        let mut width = [w; U];
        if !FULL {
            for u in 0..U {
                width[u] = d.saturating_sub(u0 + u * w).min(w);
            }
        }
        let mut a = [[x.splat(0.0); U]; H];
        for j in 0..H {
            for u in 0..U {
                let at = ap.wrapping_add(j * d + u0 + u * w);
                // SAFETY: elements u0 + u W .. + width[u] <= d of row j < H of acc
                // (acc.len() == H * d, asserted); nothing is read past the row.
                a[j][u] = unsafe {
                    match (FULL, width[u]) {
                        (true, _) => x.load(at),
                        (false, 0) => x.splat(0.0),
                        (false, k) => x.load_part(at, x.first(k)),
                    }
                };
                if rescale {
                    a[j][u] = x.mul(x.splat(alpha[j]), a[j][u]);
                }
            }
        }
        let mut vr = c.vt.as_ptr().wrapping_add(c.c0 * d + u0);
        for t in 0..c.lanes {
            pf.step();
            let mut v = [x.splat(0.0); U];
            for u in 0..U {
                if FULL || width[u] > 0 {
                    // SAFETY: vr is row c0 + t of the V tile (inside vt, asserted),
                    // elements u0 + u W .. + width[u] <= d of it.
                    v[u] = unsafe { row::<L, E, FULL>(x, vr.add(u * w), width[u]) };
                }
            }
            for j in 0..H {
                let pj = x.splat(probs[j][t]);
                for u in 0..U {
                    a[j][u] = x.fma(pj, v[u], a[j][u]);
                }
            }
            vr = vr.wrapping_add(d);
        }
        for j in 0..H {
            for u in 0..U {
                let at = ap.wrapping_add(j * d + u0 + u * w);
                // SAFETY: as the load above.
                unsafe {
                    match (FULL, width[u]) {
                        (true, _) => x.store(at, a[j][u]),
                        (false, 0) => {}
                        (false, k) => x.store_part(at, x.first(k), a[j][u]),
                    }
                }
            }
        }
        u0 += U * w;
    }
}
