//! The decode tile loop's two micro-kernels, written once over [`Elements`] (`simd.rs` runs
//! them; its `Stages` compiles them per instruction set): the scores of a head tile's query
//! heads for a chunk of tokens, and `P V` over one or two chunks into the heads'
//! accumulators. Both read the tiles through raw pointers checked once per chunk.

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use super::lanes::Elements;
use super::prefetch::{Prefetcher, Stream};
use super::work::Chunk;
use crate::kv::Elem;

/// Query heads per register tile.
pub(crate) const HT: usize = 4;
/// The widest vector a path here takes (AVX-512's 16 lanes).
pub(crate) const MAX_W: usize = 16;
/// The probabilities of a chunk's tokens per head of a tile (V scales folded in, 0 past
/// the chunk's tokens).
pub(crate) type Probs = [[f32; MAX_W]; HT];

/// Scores in log2 units of the tile's `H` heads for the chunk's tokens: K rows `i` at
/// `kt[i * bs + c0..]`, FMA'd with the broadcast query element `qp[i * H + j]` (the
/// tile's rows interleaved), `R` rows and partial sums per head per step. `FULL` (`W`
/// tokens): whole loads (with 4 rows a step, two at a time: [`Elements::widen_pair`]),
/// pointers stepped; else [`Elements::widen_part`].
///
/// # Safety
/// `c.kt` holds `d * bs` elements with `c0 + lanes <= bs` (and `lanes == W` with `FULL`);
/// `qp` holds `H * d` f32.
#[inline(always)]
pub(crate) unsafe fn scores<L: Elements, E: Elem, const H: usize, const FULL: bool, const R: usize, const FAR: bool>(
    x: L,
    c: &Chunk<E>,
    qp: *const f32,
    next_k: Stream<E>,
) -> [L::V; H] {
    let (d, bs, n) = (c.d, c.bs, c.lanes);
    let mut pf = Prefetcher::<FAR>::with(next_k, d / R);
    let mut s = [[x.splat(0.0); H]; R];
    let (mut kr, mut qr) = (c.kt.as_ptr().wrapping_add(c.c0), qp);
    let mut i = 0;
    while i + R <= d {
        let mut k = [x.splat(0.0); R];
        let mut r = 0;
        // SAFETY: rows i + r < d, tokens c0 .. c0 + n <= bs of each (kr = kt + i * bs +
        // c0): inside kt (the contract).
        unsafe {
            while FULL && R >= 4 && r + 1 < R {
                [k[r], k[r + 1]] = x.widen_pair(kr.add(r * bs), bs);
                r += 2;
            }
            while r < R {
                k[r] = row::<L, E, FULL>(x, kr.add(r * bs), n);
                r += 1;
            }
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
unsafe fn row<L: Elements, E: Elem, const FULL: bool>(x: L, p: *const E, n: usize) -> L::V {
    // SAFETY: the contract.
    unsafe {
        if FULL {
            x.widen(p)
        } else {
            x.widen_part(p, n)
        }
    }
}

/// `acc[j] = alpha[j] * acc[j] + sum_t probs[n][j][t] v_t` (without `alpha` unless
/// `rescale`) for the V rows `v_t` of the `N` chunks `cs[n]`, `U` vectors of the `H`
/// heads' accumulators in registers per pass over all the chunks' rows. `FULL` (`d` a
/// multiple of `W U`): whole loads and stores (in pairs for 1-2 heads), the V row pointer
/// stepped by `d`; else partial loads and stores for the row's last vectors. `pf[n]`:
/// chunk `n`'s prefetchers (the next V tiles', and with `PK` the next K tiles'), a step
/// each per row.
///
/// # Safety
/// The CPU must support `L`'s features.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pv<L: Elements, E: Elem, const H: usize, const U: usize, const N: usize, const FULL: bool, const FAR: bool, const PK: bool>(
    x: L,
    cs: [&Chunk<E>; N],
    acc: &mut [f32],
    probs: &[Probs; 2],
    alpha: &[f32; H],
    rescale: bool,
    pf: &mut [[Prefetcher<FAR>; 2]; 2],
) {
    let (d, w) = (cs[0].d, L::W);
    assert!(N <= 2 && H <= HT && acc.len() == H * d && (!FULL || d.is_multiple_of(U * w)));
    for c in cs {
        assert!(c.d == d && c.lanes <= w && (c.c0 + c.lanes) * d <= c.vt.len());
    }
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
        for n in 0..N {
            let (c, pr, pf) = (cs[n], &probs[n], &mut pf[n]);
            let mut vr = c.vt.as_ptr().wrapping_add(c.c0 * d + u0);
            for t in 0..c.lanes {
                pf[0].step();
                if PK {
                    pf[1].step();
                }
                let mut v = [x.splat(0.0); U];
                // SAFETY: vr is row c0 + t of the V tile (inside vt, asserted), elements
                // u0 + u W .. + width[u] <= d of it.
                unsafe {
                    let mut u = 0;
                    while FULL && H <= 2 && u + 1 < U {
                        [v[u], v[u + 1]] = x.widen_pair(vr.add(u * w), w);
                        u += 2;
                    }
                    while u < U {
                        if FULL || width[u] > 0 {
                            v[u] = row::<L, E, FULL>(x, vr.add(u * w), width[u]);
                        }
                        u += 1;
                    }
                }
                for j in 0..H {
                    // SAFETY: j < H <= HT, t < lanes <= W <= MAX_W (asserted): unchecked, as a
                    // check per row cost MHA 8-bit decode 3-5%.
                    let pj = x.splat(unsafe { *pr.get_unchecked(j).get_unchecked(t) });
                    for u in 0..U {
                        a[j][u] = x.fma(pj, v[u], a[j][u]);
                    }
                }
                vr = vr.wrapping_add(d);
            }
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
