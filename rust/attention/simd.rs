//! The decode tile loop, written once over [`Elements`] and run by every SIMD path:
//! AVX-512 (16 tokens per vector), AVX2 (8) and NEON (4), one token per lane. Per
//! (block, KV head) tile and chunk of up to `W` tokens:
//!
//! 1. scores of up to 4 query heads at once ([`Scores`]; by default [`Exact`]): K row `i`
//!    (one dimension, `W` tokens: the dimension-major tile makes it one load) widened once
//!    and FMA'd with the broadcast query element of every head, the tile's query rows
//!    interleaved so that one pointer reaches them all ([`interleave_query`]), `R` rows and
//!    partial sums per head per step (two FMA pipes of 4 cycles' latency want 8 sums in
//!    flight: 1-2 heads take 4 rows, 3-4 heads 2); no horizontal sums;
//! 2. online softmax in registers, the heads' `exp2` interleaved, with a lazy running
//!    maximum (moved, and the accumulators rescaled, only when a score exceeds it by more
//!    than [`LAZY_MAX`]) and each head's sum kept per lane until the item ends;
//! 3. `P V` ([`Pv`]; by default [`pv`]) with `ACC_VECS` accumulator vectors per
//!    head held across the chunk (twice as many for 1-2 heads, so that 4-8 chains hide the
//!    FMA latency), rescaled as they are loaded.
//!
//! The precisions that compute scores or `P V` with other instructions (`vdpbf16ps`,
//! `vpdpbusd`, f16 arithmetic, byte tables: the `avx512_*` files) plug their [`Scores`] and
//! [`Pv`] into this loop through [`run_with`]; softmax, prefetch and the rest stay here.
//!
//! The next tiles are prefetched into L1 and the far ones into L2, spread over the loops
//! by a [`Prefetcher`] (K over the score loop, V over `P V`; K over `P V` too when the
//! scores are a short dot-product loop: [`Scores::K_IN_SCORES`]). A full chunk's K rows and
//! the V rows of a `head_dim` that is a multiple of the pass take whole loads with stepped
//! pointers, checked once per chunk; the others take partial loads. With 1-2 heads the
//! loads go in pairs ([`Elements::widen_pair`]: e4m3 widens 32 codes at once on AVX-512).
//!
//! 8-bit caches dequantize in registers; the scales never touch the codes: the K scales
//! multiply the scores, the V scales the probabilities after the softmax sum took them, so
//! `P V` runs on the codes. Where [`Stages::PAIRS`] and a block holds more than one chunk
//! of 8-bit codes, a tile's chunks go two at a time ([`Work::visit_chunk_pairs`]): both
//! chunks' scores, one reference point for their softmax, one pass of `P V` over both (the
//! accumulators loaded and stored once per two chunks: 0.91-0.93x the time at block size
//! 32 on AVX-512, `docs/experiments.md`, "Decode attention: work and scheduling").
//!
//! The stages are generic; [`Stages`] compiles them per instruction set with its features
//! and its choice of what stays out of line (`stages!`).

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use super::isa::{Isa, Supported};
use super::lanes::{entry, paths, Elements, Lanes};
use super::prefetch::{first_far_lines, Prefetcher, Stream};
use super::query::interleave_query;
use super::tile_kernels::{pv, scores};
pub(crate) use super::tile_kernels::{Probs, HT, MAX_W};
use super::work::{Ahead, Chunk, Partial, Visit, Work, LAZY_MAX};
use crate::kv::Elem;

paths!(entry! {
    crate::attention::simd;
    [fn run<E: Elem>(w: &Work<E>, p: &mut Partial) = run;]
});

/// How a head tile gets its scores: [`Exact`] (f32 query, K widened exactly) or a
/// precision's dot-product instructions.
pub(crate) trait Scores<L: Elements, E> {
    /// Whether the next K tiles are prefetched over the score loop (`next_k`) or, when
    /// false, over `P V` with the V tiles. The dot-product score loops (`vpdpbusd`,
    /// `vdpbf16ps`) take a quarter to a half of `P V`'s time, so their K lines came in
    /// bursts that stalled on the core's miss buffers (7.5% of an int8-query profile on
    /// `prefetcht1`).
    const K_IN_SCORES: bool = true;

    /// Scores in log2 units (the query's `scale * log2(e)` applied) of query heads
    /// `qh .. qh + H` for the chunk's tokens (lanes past `c.lanes` are don't-care),
    /// prefetching the lines of `next_k` over the loop.
    ///
    /// # Safety
    /// The CPU must support the features the implementation is compiled for.
    unsafe fn scores<const H: usize>(&self, x: L, c: &Chunk<E>, qh: usize, next_k: Stream<E>) -> [L::V; H];
}

/// How a head tile's `P V` runs when not by [`pv`] ([`FloatPv`] takes nothing).
pub(crate) trait Pv<L: Elements, E> {
    /// Whether [`Self::pv`] takes every chunk of an item of head_dim `d` (then
    /// [`Self::finish`] ends the item).
    fn takes(&self, d: usize) -> bool;

    /// `acc[j] = alpha[j] * acc[j] + P_j V` (without `alpha` unless `rescale`) for the
    /// chunk's tokens, `acc` the `H` heads' rows of `d` in the implementation's order; the
    /// lines of `next` (the next V tiles, then the next K tiles) prefetched over the loop.
    ///
    /// # Safety
    /// The CPU must support the features the implementation is compiled for.
    #[allow(clippy::too_many_arguments)]
    unsafe fn pv<const H: usize>(
        &self,
        x: L,
        c: &Chunk<E>,
        acc: &mut [f32],
        probs: &Probs,
        alpha: &[f32; H],
        rescale: bool,
        next: [Stream<E>; 2],
    );

    /// Puts an item's accumulator rows (of `d`) back in dimension order.
    ///
    /// # Safety
    /// The CPU must support the features the implementation is compiled for.
    unsafe fn finish(&self, acc: &mut [f32], d: usize);
}

/// `P V` by this file's [`pv`] (V widened exactly).
pub(crate) struct FloatPv;

impl<L: Elements, E> Pv<L, E> for FloatPv {
    #[inline(always)]
    fn takes(&self, _: usize) -> bool {
        false
    }

    unsafe fn pv<const H: usize>(&self, _: L, _: &Chunk<E>, _: &mut [f32], _: &Probs, _: &[f32; H], _: bool, _: [Stream<E>; 2]) {
        unreachable!("FloatPv takes no chunk")
    }

    unsafe fn finish(&self, _: &mut [f32], _: usize) {}
}

/// The stages compiled with one instruction set's features, and its choices: what stays
/// out of line (a macro writes each implementation: `stages!`).
pub(crate) trait Stages: Elements {
    /// Whether 8-bit tiles of at most 2 KiB prefetch only the far tile's first lines into
    /// L2 ([`first_far_lines`]; AVX-512: MHA exact int8 0.943x, e5m2 0.933x the time).
    const FIRST_FAR_LINES: bool;
    /// Whether 8-bit caches whose blocks hold more than one chunk take a tile's chunks two
    /// at a time.
    const PAIRS: bool;

    /// [`head_tile`].
    ///
    /// # Safety
    /// As [`head_tile`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn head_tile<E: Elem, S: Scores<Self, E>, P: Pv<Self, E>, const H: usize, const N: usize, const FAR: bool, const CAP: bool>(
        self,
        cs: [&Chunk<E>; N],
        sc: &S,
        pv: &P,
        qh: usize,
        p: &mut Partial,
        l: &mut [f32],
        probs: &mut [Probs; 2],
        prefetch: [Option<Ahead<E>>; N],
        cap: f32,
    );

    /// [`scores`], out of line where `stages!` says so.
    ///
    /// # Safety
    /// As [`scores`].
    unsafe fn scores<E: Elem, const H: usize, const FULL: bool, const R: usize, const FAR: bool>(
        self,
        c: &Chunk<E>,
        qp: *const f32,
        next_k: Stream<E>,
    ) -> [Self::V; H];

    /// [`pv`], out of line where `stages!` says so.
    ///
    /// # Safety
    /// As [`pv`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn pv<E: Elem, const H: usize, const U: usize, const N: usize, const FULL: bool, const FAR: bool, const PK: bool>(
        self,
        cs: [&Chunk<E>; N],
        acc: &mut [f32],
        probs: &[Probs; 2],
        alpha: &[f32; H],
        rescale: bool,
        pf: &mut [[Prefetcher<FAR>; 2]; 2],
    );
}

/// `stages!(Type, "features", far: bool, pairs: bool, apart: bool)`: [`Stages`] for
/// `Type`, each method calling its generic stage compiled with the features: `head_tile`
/// inlined at LLVM's choice; with `apart`, `scores` and `pv` out of line (AVX2: inlined,
/// they took the fp8 rows of `benches/ab_decode.py` 1.06-1.13x the time, the loops'
/// constants reloaded from memory for want of registers), else `scores` at LLVM's choice
/// and `pv` inlined (AVX-512: out of line beside the pairs' instances, block size 16 lost 2%).
/// Out of line means called through an opaque pointer: rustc's MIR inliner puts an
/// `#[inline(never)]` `#[target_feature]` function into a caller of the same features (rustc
/// 1.95), through a known pointer too.
macro_rules! stages {
    ($lanes:ty, $features:literal, far: $far:literal, pairs: $pairs:literal, apart: $apart:literal) => {
        impl Stages for $lanes {
            const FIRST_FAR_LINES: bool = $far;
            const PAIRS: bool = $pairs;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn head_tile<E: Elem, S: Scores<Self, E>, P: Pv<Self, E>, const H: usize, const N: usize, const FAR: bool, const CAP: bool>(
                self,
                cs: [&Chunk<E>; N],
                sc: &S,
                pv: &P,
                qh: usize,
                p: &mut Partial,
                l: &mut [f32],
                probs: &mut [Probs; 2],
                prefetch: [Option<Ahead<E>>; N],
                cap: f32,
            ) {
                // SAFETY: forwarded (`self` proves the features).
                unsafe { head_tile::<Self, E, S, P, H, N, FAR, CAP>(self, cs, sc, pv, qh, p, l, probs, prefetch, cap) }
            }

            #[inline(always)]
            unsafe fn scores<E: Elem, const H: usize, const FULL: bool, const R: usize, const FAR: bool>(
                self,
                c: &Chunk<E>,
                qp: *const f32,
                next_k: Stream<E>,
            ) -> [Self::V; H] {
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn out<E: Elem, const H: usize, const FULL: bool, const R: usize, const FAR: bool>(
                    x: $lanes,
                    c: &Chunk<E>,
                    qp: *const f32,
                    next_k: Stream<E>,
                ) -> [<$lanes as Lanes>::V; H] {
                    // SAFETY: forwarded.
                    unsafe { scores::<$lanes, E, H, FULL, R, FAR>(x, c, qp, next_k) }
                }
                let out: unsafe fn(_, _, _, _) -> _ = out::<E, H, FULL, R, FAR>;
                let out = if $apart { std::hint::black_box(out) } else { out };
                // SAFETY: forwarded (`self` proves the features).
                unsafe { out(self, c, qp, next_k) }
            }

            #[inline(always)]
            unsafe fn pv<E: Elem, const H: usize, const U: usize, const N: usize, const FULL: bool, const FAR: bool, const PK: bool>(
                self,
                cs: [&Chunk<E>; N],
                acc: &mut [f32],
                probs: &[Probs; 2],
                alpha: &[f32; H],
                rescale: bool,
                pf: &mut [[Prefetcher<FAR>; 2]; 2],
            ) {
                #[inline(never)]
                #[target_feature(enable = $features)]
                #[allow(clippy::too_many_arguments)]
                unsafe fn out<E: Elem, const H: usize, const U: usize, const N: usize, const FULL: bool, const FAR: bool, const PK: bool>(
                    x: $lanes,
                    cs: [&Chunk<E>; N],
                    acc: &mut [f32],
                    probs: &[Probs; 2],
                    alpha: &[f32; H],
                    rescale: bool,
                    pf: &mut [[Prefetcher<FAR>; 2]; 2],
                ) {
                    // SAFETY: forwarded.
                    unsafe { pv::<$lanes, E, H, U, N, FULL, FAR, PK>(x, cs, acc, probs, alpha, rescale, pf) }
                }
                // SAFETY: forwarded (`self` proves the features).
                unsafe {
                    if $apart {
                        let out: unsafe fn(_, _, _, _, _, _, _) = out::<E, H, U, N, FULL, FAR, PK>;
                        std::hint::black_box(out)(self, cs, acc, probs, alpha, rescale, pf)
                    } else {
                        pv::<$lanes, E, H, U, N, FULL, FAR, PK>(self, cs, acc, probs, alpha, rescale, pf)
                    }
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
stages!(crate::attention::lanes::Avx512, "avx512f,avx512bw,avx512vl,fma,f16c", far: true, pairs: true, apart: false);
#[cfg(target_arch = "x86_64")]
stages!(crate::attention::lanes::Avx2, "avx2,fma,f16c", far: false, pairs: false, apart: true);
#[cfg(target_arch = "aarch64")]
stages!(crate::attention::lanes::Neon, "neon", far: false, pairs: false, apart: true);

/// One item on `path`'s tile loop (the scalar loop for a path without SIMD). The one list
/// of the decode paths.
pub(crate) fn run_on<E: Elem>(path: Supported, w: &Work<E>, p: &mut Partial) {
    match path.isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Supported` holds only a path this CPU runs: the CPU has its features.
        Isa::Avx512 => unsafe { avx512::run(w, p) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { avx2::run(w, p) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        Isa::Neon => unsafe { neon::run(w, p) },
        _ => super::scalar::run(w, p),
    }
}

/// One item on the path's own scores and `P V`.
#[inline(always)]
fn run<L: Stages, E: Elem>(x: L, w: &Work<E>, p: &mut Partial) {
    let q = interleave_query(w.q, w.shape.head_dim, w.g, HT);
    // SAFETY: `Exact` and `FloatPv` take the path's own features, which `x` proves.
    unsafe {
        if L::FIRST_FAR_LINES && first_far_lines::<E>(w.shape.tile()) {
            run_with::<L, E, _, _, false>(x, w, p, &Exact::<false> { q: &q }, &FloatPv)
        } else {
            run_with::<L, E, _, _, true>(x, w, p, &Exact::<true> { q: &q }, &FloatPv)
        }
    }
}

/// The tile loop with the scores of `sc`, and `P V` by `pv` where it takes the head_dim
/// (else by [`pv`]), prefetching as `Prefetcher<FAR>`. A soft cap is an instantiation of
/// its own (tested at run time in the tile loop, it cost the calls without one 1.03-1.07x).
///
/// # Safety
/// The CPU must support the features of `S`'s and `P`'s implementations (`x` proves `L`'s).
#[inline(always)]
pub(crate) unsafe fn run_with<L: Stages, E: Elem, S: Scores<L, E>, P: Pv<L, E>, const FAR: bool>(
    x: L,
    w: &Work<E>,
    p: &mut Partial,
    sc: &S,
    pv: &P,
) {
    let d = w.shape.head_dim;
    assert!(L::W <= MAX_W);
    // Each head's softmax sum per lane (`W` per head), from the incoming sums in lane 0.
    let mut l = vec![0f32; p.l.len() * L::W];
    for (j, &s) in p.l.iter().enumerate() {
        l[j * L::W] = s;
    }
    let mut probs = [[[0f32; MAX_W]; HT]; 2];
    let pairs = L::PAIRS
        && E::DTYPE.is_quantized()
        && S::K_IN_SCORES
        && !pv.takes(d)
        && d.is_multiple_of(L::ACC_VECS * L::W)
        && w.shape.block_size > L::W;
    let cap = w.soft_cap.unwrap_or(0.0);
    let t = Tiles::<L, S, P, FAR> { x, g: w.g, sc, pv, p: &mut *p, l: &mut l, probs: &mut probs, cap, nan_check: w.nan_check, checked: 0 };
    match (w.soft_cap.is_some(), pairs) {
        (true, true) => w.visit_chunk_pairs(L::W, Capped::<_, true>(t)),
        (true, false) => w.visit_chunks(L::W, Capped::<_, true>(t)),
        (false, true) => w.visit_chunk_pairs(L::W, Capped::<_, false>(t)),
        (false, false) => w.visit_chunks(L::W, Capped::<_, false>(t)),
    }
    for (dst, lanes) in p.l.iter_mut().zip(l.chunks_exact(L::W)) {
        *dst = lanes.iter().sum();
    }
    if pv.takes(d) {
        // SAFETY: the caller guarantees the features of `P`'s implementation.
        unsafe { pv.finish(p.acc, d) };
    }
}

/// The tile loop's state across an item's chunks.
struct Tiles<'b, 'p, L: Stages, S, P, const FAR: bool> {
    x: L,
    g: usize,
    sc: &'b S,
    pv: &'b P,
    p: &'b mut Partial<'p>,
    /// Each head's softmax sum per lane (`W` per head).
    l: &'b mut [f32],
    probs: &'b mut [Probs; 2],
    cap: f32,
    /// Whether the tiles may hold codes the path misreads ([`Elements::misreads`]), and
    /// the address of the K tile checked last.
    nan_check: bool,
    checked: usize,
}

/// [`Tiles`] with the soft cap (`CAP`) or without, as a visit of each chunk: a struct whose
/// `#[inline(always)]` method is compiled into the loop (a closure was left out of line: a
/// call per chunk, 3-13% of AVX2 decode).
struct Capped<T, const CAP: bool>(T);

impl<'s, L, E, S, P, const FAR: bool, const CAP: bool> Visit<'s, E> for Capped<Tiles<'_, '_, L, S, P, FAR>, CAP>
where
    L: Stages,
    E: Elem,
    S: Scores<L, E>,
    P: Pv<L, E>,
{
    #[inline(always)]
    fn chunk(&mut self, hi: usize, a: &Chunk<'s, E>, b: Option<&Chunk<'s, E>>, next: Option<Ahead<'s, E>>) {
        let t = &mut self.0;
        let (x, g, sc, pv, cap) = (t.x, t.g, t.sc, t.pv, t.cap);
        if t.nan_check && a.kt.as_ptr() as usize != t.checked {
            t.checked = a.kt.as_ptr() as usize;
            t.p.nan_codes |= x.misreads(a.kt) || x.misreads(a.vt);
        }
        let mut j0 = 0;
        while j0 < g {
            let qh = hi * g + j0;
            let pf = if j0 == 0 { next } else { None };
            let (p, l, pr) = (&mut *t.p, &mut *t.l, &mut *t.probs);
            // SAFETY: `run_with`'s contract: `x` proves `L`'s features, the caller those of
            // `S` and `P`.
            unsafe {
                match (b, g - j0) {
                    (Some(b), 1) => x.head_tile::<E, S, P, 1, 2, FAR, CAP>([a, b], sc, pv, qh, p, l, pr, [pf, None], cap),
                    (Some(b), 2) => x.head_tile::<E, S, P, 2, 2, FAR, CAP>([a, b], sc, pv, qh, p, l, pr, [pf, None], cap),
                    (Some(b), 3) => x.head_tile::<E, S, P, 3, 2, FAR, CAP>([a, b], sc, pv, qh, p, l, pr, [pf, None], cap),
                    (Some(b), _) => x.head_tile::<E, S, P, 4, 2, FAR, CAP>([a, b], sc, pv, qh, p, l, pr, [pf, None], cap),
                    (None, 1) => x.head_tile::<E, S, P, 1, 1, FAR, CAP>([a], sc, pv, qh, p, l, pr, [pf], cap),
                    (None, 2) => x.head_tile::<E, S, P, 2, 1, FAR, CAP>([a], sc, pv, qh, p, l, pr, [pf], cap),
                    (None, 3) => x.head_tile::<E, S, P, 3, 1, FAR, CAP>([a], sc, pv, qh, p, l, pr, [pf], cap),
                    (None, _) => x.head_tile::<E, S, P, 4, 1, FAR, CAP>([a], sc, pv, qh, p, l, pr, [pf], cap),
                }
            }
            j0 += HT;
        }
    }
}

/// A tile's next K and V streams from what the walk gives it to prefetch.
#[inline(always)]
fn streams<E>(a: Option<Ahead<E>>) -> (Stream<E>, Stream<E>) {
    // Matches, not `Option::map` closures: an out-of-line call clobbers every register.
    match a {
        Some(Ahead { k, v, far: Some((fk, fv)) }) => (Stream { l1: Some(k), l2: Some(fk) }, Stream { l1: Some(v), l2: Some(fv) }),
        Some(Ahead { k, v, far: None }) => (Stream { l1: Some(k), l2: None }, Stream { l1: Some(v), l2: None }),
        None => (Stream::NONE, Stream::NONE),
    }
}

/// Scores, softmax update and V accumulation of query heads `qh..qh + H` over `N` (1 or
/// 2) chunks of one KV head (two from [`Work::visit_chunk_pairs`]); `l` holds each head's
/// softmax sum per lane (`W` per head). The chunks of a pair share one reference point
/// (it moves on the larger of their scores).
///
/// # Safety
/// The CPU must support `L`'s features and those of `S`'s and `P`'s implementations.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn head_tile<L: Stages, E: Elem, S: Scores<L, E>, P: Pv<L, E>, const H: usize, const N: usize, const FAR: bool, const CAP: bool>(
    x: L,
    cs: [&Chunk<E>; N],
    sc: &S,
    pv: &P,
    qh: usize,
    p: &mut Partial,
    l: &mut [f32],
    probs: &mut [Probs; 2],
    prefetch: [Option<Ahead<E>>; N],
    cap: f32,
) {
    let (d, w) = (cs[0].d, L::W);
    assert!(N <= 2 && H <= HT && l.len() >= (qh + H) * w && p.m.len() >= qh + H && p.acc.len() >= (qh + H) * d);
    for c in cs {
        assert!(c.d == d && c.lanes <= w && c.c0 + c.lanes <= c.bs && c.vt.len() >= d * c.bs);
    }
    let mut valid = [x.first(0); N];
    let mut scores = [[x.splat(0.0); H]; N];
    let mut vscale = [None; N];
    let (mut next_v, mut pv_k) = ([Stream::NONE; N], [Stream::NONE; N]);
    for n in 0..N {
        let c = cs[n];
        let (next_k, nv) = streams(prefetch[n]);
        // A `P V` as short as a dot-product score loop takes the K lines too.
        let (next_k, pk) = if S::K_IN_SCORES || pv.takes(d) { (next_k, Stream::NONE) } else { (Stream::NONE, next_k) };
        (next_v[n], pv_k[n]) = (nv, pk);
        valid[n] = x.first(c.lanes);
        // SAFETY: the caller guarantees the features of `S`'s implementation.
        scores[n] = unsafe { sc.scores::<H>(x, c, qh, next_k) };
        // 8-bit K: the scores carry the K scales (before the cap: it applies to the logit).
        if let Some(ks) = x.scales::<E>(&c.ks, c.c0, c.lanes) {
            for s in scores[n].iter_mut() {
                *s = x.mul(*s, ks);
            }
        }
        if CAP {
            scores[n] = x.soft_cap_each(scores[n], cap);
        }
        vscale[n] = x.scales::<E>(&c.vs, c.c0, c.lanes);
    }

    // Online softmax per head; lanes without a token get probability 0. `l` and `acc`
    // share the lazy reference point, so the quotient and the LSE are those of the exact
    // maximum.
    let ninf = x.splat(f32::NEG_INFINITY);
    let mut alpha = [1f32; H];
    let mut rescale = false;
    let mut e = [[ninf; H]; N];
    for j in 0..H {
        let mut top = ninf;
        for n in 0..N {
            e[n][j] = x.select(valid[n], scores[n][j], ninf);
            top = if n == 0 { e[n][j] } else { x.max(top, e[n][j]) };
        }
        let m_old = p.m[qh + j];
        // Always taken on the first chunk (m = -inf); lanes without a token are -inf.
        if x.any_above(top, m_old + LAZY_MAX) {
            let m_new = x.hmax(top);
            // exp2 of the vector unit, not libm's: a call would spill every register.
            alpha[j] = x.exp2_one(m_old - m_new);
            p.m[qh + j] = m_new;
            rescale = true;
        }
        let m = x.splat(p.m[qh + j]);
        for n in 0..N {
            e[n][j] = x.sub(e[n][j], m);
        }
    }
    for n in 0..N {
        // The heads' polynomials step together: one head's is a chain of dependent FMAs.
        let ex = x.exp2_each(e[n]);
        for j in 0..H {
            e[n][j] = x.keep(valid[n], ex[j]);
        }
    }
    for j in 0..H {
        let lp = l[(qh + j) * w..].as_mut_ptr();
        // SAFETY: the W lane sums of head qh + j (asserted to exist); probs[n][j] holds
        // MAX_W >= W f32.
        unsafe {
            let mut lv = x.load(lp);
            if rescale {
                lv = x.mul(lv, x.splat(alpha[j]));
            }
            for n in 0..N {
                lv = x.add(lv, e[n][j]);
                // 8-bit V: the probabilities carry the V scales, `P V` reads the codes.
                let pr = match vscale[n] {
                    Some(vs) => x.mul(e[n][j], vs),
                    None => e[n][j],
                };
                x.store(probs[n][j].as_mut_ptr(), pr);
            }
            x.store(lp, lv);
        }
    }

    let acc = &mut p.acc[qh * d..(qh + H) * d];
    if N == 1 && pv.takes(d) {
        // SAFETY: the caller guarantees the features of `P`'s implementation.
        unsafe { pv.pv::<H>(x, cs[0], acc, &probs[0], &alpha, rescale, [next_v[0], pv_k[0]]) };
        return;
    }
    // 1-2 heads: twice the dimensions per pass, so that 4-8 accumulator chains hide the
    // FMA latency. (`U` is a constant: the paths take 2 or 4 vectors a pass.)
    let vt = L::ACC_VECS;
    let wide = H <= 2 && d.is_multiple_of(2 * vt * w);
    let passes = d.div_ceil(if wide { 2 * vt * w } else { vt * w });
    let idle = || Prefetcher::<FAR>::with(Stream::<E>::NONE, 0);
    let mut pf = [[idle(), idle()], [idle(), idle()]];
    for n in 0..N {
        let steps = passes * cs[n].lanes;
        pf[n] = [Prefetcher::with(next_v[n], steps), Prefetcher::with(pv_k[n], steps)];
    }
    let (probs, pf) = (&*probs, &mut pf);
    // SAFETY: `x` proves the features.
    unsafe {
        if S::K_IN_SCORES {
            passes_of::<L, E, H, N, FAR, false>(x, cs, acc, probs, &alpha, rescale, pf)
        } else {
            passes_of::<L, E, H, N, FAR, true>(x, cs, acc, probs, &alpha, rescale, pf)
        }
    }
}

/// [`pv`] with the vectors per pass (`U`) and the form (`FULL`) the head_dim takes.
///
/// # Safety
/// The CPU must support `L`'s features.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn passes_of<L: Stages, E: Elem, const H: usize, const N: usize, const FAR: bool, const PK: bool>(
    x: L,
    cs: [&Chunk<E>; N],
    acc: &mut [f32],
    probs: &[Probs; 2],
    alpha: &[f32; H],
    rescale: bool,
    pf: &mut [[Prefetcher<FAR>; 2]; 2],
) {
    let (d, w, vt) = (cs[0].d, L::W, L::ACC_VECS);
    let wide = H <= 2 && d.is_multiple_of(2 * vt * w);
    // SAFETY: `pv` checks its bounds; the features are the caller's.
    unsafe {
        match (wide, d.is_multiple_of(vt * w), vt) {
            (true, _, 2) => x.pv::<E, H, 4, N, true, FAR, PK>(cs, acc, probs, alpha, rescale, pf),
            (true, _, _) => x.pv::<E, H, 8, N, true, FAR, PK>(cs, acc, probs, alpha, rescale, pf),
            (false, true, 2) => x.pv::<E, H, 2, N, true, FAR, PK>(cs, acc, probs, alpha, rescale, pf),
            (false, true, _) => x.pv::<E, H, 4, N, true, FAR, PK>(cs, acc, probs, alpha, rescale, pf),
            (false, false, 2) => x.pv::<E, H, 2, N, false, FAR, PK>(cs, acc, probs, alpha, rescale, pf),
            (false, false, _) => x.pv::<E, H, 4, N, false, FAR, PK>(cs, acc, probs, alpha, rescale, pf),
        }
    }
}

/// f32 scores from the pre-scaled f32 query rows of the item, each head tile's rows
/// interleaved ([`interleave_query`]), prefetching as `Prefetcher<FAR>`.
pub(crate) struct Exact<'a, const FAR: bool> {
    pub q: &'a [f32],
}

impl<L: Stages, E: Elem, const FAR: bool> Scores<L, E> for Exact<'_, FAR> {
    #[inline(always)]
    unsafe fn scores<const H: usize>(&self, x: L, c: &Chunk<E>, qh: usize, next_k: Stream<E>) -> [L::V; H] {
        let (d, bs, n, q) = (c.d, c.bs, c.lanes, self.q);
        // K rows are bs apart (the last token read: (d - 1) * bs + c0 + n - 1 < d * bs);
        // the tile's query rows qh .. qh + H exist (interleaved: H * d elements from qh * d).
        assert!(c.kt.len() >= d * bs && n <= L::W && c.c0 + n <= bs && q.len() >= (qh + H) * d);
        let qp = q[qh * d..].as_ptr();
        // SAFETY: the assert above is `scores`' contract; `x` proves the features.
        unsafe {
            match (n == L::W, H <= 2) {
                (true, true) => x.scores::<E, H, true, 4, FAR>(c, qp, next_k),
                (true, false) => x.scores::<E, H, true, 2, FAR>(c, qp, next_k),
                (false, true) => x.scores::<E, H, false, 4, FAR>(c, qp, next_k),
                (false, false) => x.scores::<E, H, false, 2, FAR>(c, qp, next_k),
            }
        }
    }
}
