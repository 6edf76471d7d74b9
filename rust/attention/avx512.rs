//! AVX-512 (F, BW, VL) kernel: 16 tokens per register.
//!
//! Per (block, KV head) tile and chunk of up to 16 tokens:
//! 1. scores for up to 4 query heads at once: each K row (one dimension, 16 tokens; the
//!    dimension-major tile makes it one load) is converted to f32 once and FMA'd with the
//!    broadcast query element of every head (the tile's query rows interleaved so that
//!    one pointer reaches them all: [`interleave_query`]), with two partial sums per head
//!    to hide FMA latency (four for an 8-bit cache with 1-2 heads per tile: see
//!    [`chains`]); no horizontal sums;
//! 2. online softmax in registers (`exp2` by a degree-7 polynomial and `vscalefps`, the
//!    heads' polynomials interleaved), with a lazy running maximum (moved only when a
//!    score exceeds it by 2^8) and the sums kept per lane until the item ends;
//! 3. `acc += p_t * v_t` with the accumulators of 4 heads x 64 dimensions in registers
//!    across the chunk, rescaled by `exp2(m_old - m_new)` as they are loaded.
//!
//! 8-bit caches whose blocks hold more than 16 tokens take a tile's chunks two at a time
//! ([`Work::for_each_chunk_pair`], where the scores prefetch K: [`pairs_apply`]): both
//! chunks' scores, one reference point for their softmax, one pass of `P V` over both (the
//! accumulators loaded and stored once per 32 tokens): 0.91-0.93x the time of one chunk
//! at a time at block size 32 (`docs/experiments.md`, "Decode attention: work and
//! scheduling").
//!
//! A tile ahead (the next head of the block, or the first head of the next block; more
//! for tiles under 4 KiB, see [`super::work::prefetch_tiles`]) is prefetched line by
//! line by a [`Prefetcher`] (`prefetch.rs`): its K lines spread over the score loop (over `P V` for the
//! dot-product score paths on 8-bit caches, whose score loops are short:
//! [`Scores::K_IN_SCORES`]), its V lines over the V loop, so the jump between scattered
//! blocks does not stall the stream and the misses do not arrive in one burst. The tile
//! after it is prefetched into L2 at the same steps
//! ([`super::work::PREFETCH_L2_TILES`]: one core's L1 misses in flight are too few to
//! cover memory's latency at an 8-bit decode's rate), or, by [`run`]'s f32 loops on 8-bit
//! tiles of at most 2 KiB, only its first lines at the loop's start (the L2's stream
//! prefetcher takes the rest: [`super::prefetch::FAR_START_LINES`]), and the next int8 tile's per-token
//! scales into L1 by the walk itself. The hot loops index through raw pointers
//! checked once per chunk (the bounds checks and the prefetch bookkeeping of the first
//! version cost 15-20% of the cache-resident time).
//!
//! f16 uses `vcvtph2ps`; bf16 is widened exactly by a 16-bit shift (K rows) or by one
//! unpack against zero per 16 values (V rows, when `head_dim` is a multiple of 32; the
//! accumulators then keep the unpack order until the end of the item). Queries stay f32
//! (rounding them to bf16 for `vdpbf16ps` costs about 3 significant digits of the
//! logits, beyond the 1e-5 accuracy contract; see `benches/RESULTS.md`). The opt-in bf16
//! query (`Precision { q: BF16, .. }`) does round them and plugs the `vdpbf16ps` scores
//! of [`super::avx512_bf16`] into the same tile loop ([`run_with`], [`Scores`]), as the
//! opt-in int8 query (`Precision { q: I8, .. }`) does with the `vpdpbusd` scores of
//! [`super::avx512_vnni`]; the fp8 paths plug their own `P V` in the same way ([`Pv`]).
//!
//! 8-bit caches read their one-byte codes and dequantize in registers: int8 by
//! `vpmovsxbd` + `vcvtdq2ps`; fp8 e5m2 is the high byte of an f16 (16 codes broadcast to
//! both 128-bit lanes, one `vpshufb` into high bytes, `vcvtph2ps`); fp8 e4m3 is moved into f16 bit positions (sign-extended, << 7,
//! bit 14 cleared: exact for normals and subnormals, the value divided by 2^8) and
//! widened by `vcvtph2ps` ([`super::avx512_cvt::e4m3_over_256`]; with 1-2 query heads
//! per KV head, where the widening rather than the FMAs is the work, 32 codes at once:
//! [`super::avx512_cvt::load_pair`], two K rows or 32 elements of a V row); its two NaN codes would
//! read as numbers, so each tile is checked for them once ([`nan_in_new_tile`]) and an
//! item that read one runs again on the AVX2 path ([`Partial::nan_codes`]). Only a cache
//! whose codes may hold them is checked: one that handed out a writable view
//! (`KvCache::raw_writes`, [`Work::nan_check`]); its own writes refuse non-finite values
//! and saturate, so they never make a NaN code.
//! With avx512vbmi, e4m3 caches of block size 16 and a head_dim that is a multiple of 64
//! run this tile loop with [`super::avx512_e4m3`]'s scores and `P V`, which widen the codes
//! by byte tables (9 instructions per 64 codes instead of 16; the same values).
//! The scales never touch the codes: the K scales (a vector of 16 per-token scales for
//! int8, one broadcast per head for fp8, times 2^8 for e4m3) multiply the scores, the V
//! scales the probabilities after the softmax sum took them, so `P V` runs on the codes
//! ([`scale_vector`]).
//!
//! 8-bit caches take leaner loops where the shape allows (on one core an 8-bit decode
//! is held back by the instructions it issues per code, widening and converting, more
//! than by the bytes it reads): a full chunk's K rows are plain loads folded into the
//! widening instruction ([`exact_scores`]), and `P V` over rows whose length is a multiple
//! of 64 runs on whole vectors with no mask or per-vector branch, 128 dimensions per pass
//! for 1-2 heads per tile ([`pv_full`]); the score and V loops step pointers instead of
//! recomputing addresses.
//!
//! Every memory access is a (masked) load or store inside a slice obtained with checked
//! indexing; masked-off lanes are never accessed (AVX-512 fault suppression).

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

// V accumulator vectors per head in registers (64 dimensions): what one bf16 V load fills.
use super::avx512_cvt::{e4m3_nan_in, lane_mask, load, load_bf16_permuted, load_pair, scale_vector, unpermute_bf16, VT};
pub(crate) use super::work::load_factor;
use super::prefetch::{first_far_lines, Prefetcher, Stream};
use super::query::interleave_query;
use super::work::{Ahead, Chunk, LaneSums, Partial, Work, EXP2_ZERO_BELOW, LAZY_MAX, SOFT_CAP_ARG};
use crate::kv::{DType, Elem};

pub(crate) const W: usize = 16;
/// Query heads per register tile.
pub(crate) const HT: usize = 4;

/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    let q = interleave_query(w.q, w.shape.head_dim, w.g, HT);
    // 8-bit tiles of at most 2 KiB: only the far tiles' first lines into L2
    // (`Prefetcher<false>`: MHA exact int8 0.943x, e5m2 0.933x the time; `docs/experiments.md`,
    // "Decode attention: prefetch").
    if first_far_lines::<E>(w.shape.tile()) {
        // SAFETY: the caller's features are those `Exact` is compiled for.
        unsafe { run_with::<E, _, _, false>(w, p, &Exact::<false> { q: &q }, &FloatPv) }
    } else {
        // SAFETY: as above.
        unsafe { run_with::<E, _, _, true>(w, p, &Exact::<true> { q: &q }, &FloatPv) }
    }
}

/// The tile loop of [`run`] with the scores computed by `sc` and `P V` by `pv` where it
/// takes the head_dim (else by this file's f32 loops, prefetching as `Prefetcher<FAR_LINES>`).
///
/// # Safety
/// The CPU must support the features of `run` and of `S`'s and `P`'s implementations.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) unsafe fn run_with<E: Elem, S: Scores<E>, P: Pv<E>, const FAR_LINES: bool>(
    w: &Work<E>,
    p: &mut Partial,
    sc: &S,
    pv: &P,
) {
    // A soft cap is an instantiation of its own: tested at run time in the tile loop, it
    // cost the calls without one 1.03-1.06x (int8 query, 64 x 512 tokens).
    // SAFETY: the caller's contract is `tile_loop`'s.
    unsafe {
        match w.soft_cap {
            Some(c) => tile_loop::<E, S, P, FAR_LINES, true>(w, p, sc, pv, c),
            None => tile_loop::<E, S, P, FAR_LINES, false>(w, p, sc, pv, 0.0),
        }
    }
}

/// [`run_with`]'s loop; with `CAP` each score `s` becomes `cap * tanh(s / cap)`.
///
/// # Safety
/// As [`run_with`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn tile_loop<E: Elem, S: Scores<E>, P: Pv<E>, const FAR_LINES: bool, const CAP: bool>(
    w: &Work<E>,
    p: &mut Partial,
    sc: &S,
    pv: &P,
    cap: f32,
) {
    let (d, g) = (w.shape.head_dim, w.g);
    let mut probs = [[[0f32; W]; HT]; 2];
    let mut l = LaneSums::<W>::new(p.l);
    let mut checked = std::ptr::null();
    let nan_check = E::DTYPE == DType::E4M3 && w.nan_check;
    if pairs_apply::<E, S, P>(pv, d, w.shape.block_size) {
        // A tile's chunks two at a time: the per-chunk work is spread over twice the
        // tokens (0.91-0.93x the time at block size 32; `docs/experiments.md`).
        w.for_each_chunk_pair(W, |hi, a, b, pf| {
            if nan_check {
                p.nan_codes |= nan_in_new_tile(a, &mut checked);
            }
            let mut j0 = 0;
            while j0 < g {
                let qh = hi * g + j0;
                let pf = if j0 == 0 { pf } else { None };
                let (lr, pr) = (l.rows(), &mut probs);
                match (b, g - j0) {
                    (Some(b), 1) => head_tile::<E, S, P, 1, 2, FAR_LINES, CAP>([a, b], sc, pv, qh, p, lr, pr, [pf, None], cap),
                    (Some(b), 2) => head_tile::<E, S, P, 2, 2, FAR_LINES, CAP>([a, b], sc, pv, qh, p, lr, pr, [pf, None], cap),
                    (Some(b), 3) => head_tile::<E, S, P, 3, 2, FAR_LINES, CAP>([a, b], sc, pv, qh, p, lr, pr, [pf, None], cap),
                    (Some(b), _) => head_tile::<E, S, P, 4, 2, FAR_LINES, CAP>([a, b], sc, pv, qh, p, lr, pr, [pf, None], cap),
                    (None, 1) => head_tile::<E, S, P, 1, 1, FAR_LINES, CAP>([a], sc, pv, qh, p, lr, pr, [pf], cap),
                    (None, 2) => head_tile::<E, S, P, 2, 1, FAR_LINES, CAP>([a], sc, pv, qh, p, lr, pr, [pf], cap),
                    (None, 3) => head_tile::<E, S, P, 3, 1, FAR_LINES, CAP>([a], sc, pv, qh, p, lr, pr, [pf], cap),
                    (None, _) => head_tile::<E, S, P, 4, 1, FAR_LINES, CAP>([a], sc, pv, qh, p, lr, pr, [pf], cap),
                }
                j0 += HT;
            }
        });
    } else {
        w.for_each_chunk(W, |hi, chunk, pf| {
            if nan_check {
                p.nan_codes |= nan_in_new_tile(chunk, &mut checked);
            }
            let mut j0 = 0;
            while j0 < g {
                let qh = hi * g + j0;
                let pf = if j0 == 0 { pf } else { None };
                let (lr, pr) = (l.rows(), &mut probs);
                match g - j0 {
                    1 => head_tile::<E, S, P, 1, 1, FAR_LINES, CAP>([chunk], sc, pv, qh, p, lr, pr, [pf], cap),
                    2 => head_tile::<E, S, P, 2, 1, FAR_LINES, CAP>([chunk], sc, pv, qh, p, lr, pr, [pf], cap),
                    3 => head_tile::<E, S, P, 3, 1, FAR_LINES, CAP>([chunk], sc, pv, qh, p, lr, pr, [pf], cap),
                    _ => head_tile::<E, S, P, 4, 1, FAR_LINES, CAP>([chunk], sc, pv, qh, p, lr, pr, [pf], cap),
                }
                j0 += HT;
            }
        });
    }
    l.finish(p.l);
    if pv.takes(d) {
        // SAFETY: `run_with`'s caller guarantees the features of `P`'s implementation.
        unsafe { pv.finish(p.acc, d) };
    } else if E::DTYPE == DType::BF16 && d.is_multiple_of(2 * W) {
        unpermute_bf16(p.acc, d);
    }
}

/// e4m3: whether the tile of `c` (its K and V codes, whole) holds a NaN code, which
/// [`load`] reads as a number; checked once per tile (`last`: the K tile checked last).
/// A tile's unread slots count too (a stale NaN code there only costs a rerun). Other
/// dtypes: never.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
fn nan_in_new_tile<E: Elem>(c: &Chunk<'_, E>, last: &mut *const E) -> bool {
    if E::DTYPE != DType::E4M3 || c.kt.as_ptr() == *last {
        return false;
    }
    *last = c.kt.as_ptr();
    // SAFETY: an e4m3 element is its one-byte code (`E4M3` is a transparent `u8`), so
    // the tile's elements are `len` readable bytes.
    let bytes = |t: &[E]| unsafe { std::slice::from_raw_parts(t.as_ptr().cast::<u8>(), t.len()) };
    e4m3_nan_in(bytes(c.kt)) || e4m3_nan_in(bytes(c.vt))
}

/// Whether the tile loop takes a tile's chunks two at a time ([`Work::for_each_chunk_pair`]):
/// where `P V` runs on [`pv_full`] (8-bit codes, rows a multiple of 64, not taken by
/// `pv`), a block holds more than one chunk, and the next K tiles are prefetched over the
/// score loop. (The `vpdpbusd` scores prefetch them over `P V`, which a pair starts only
/// after both chunks' scores: MHA with an int8 query at block size 32 took 1.10x the time.)
#[inline(always)]
fn pairs_apply<E: Elem, S: Scores<E>, P: Pv<E>>(pv: &P, d: usize, block_size: usize) -> bool {
    E::DTYPE.is_quantized() && S::K_IN_SCORES && !pv.takes(d) && d.is_multiple_of(VT * W) && block_size > W
}

/// The lanes of a chunk's tokens.
#[inline]
pub(crate) fn chunk_mask<E>(c: &Chunk<E>) -> __mmask16 {
    lane_mask(0, c.lanes)
}

/// How a head tile gets its scores: [`Exact`] (f32 query, K widened exactly) or
/// `vdpbf16ps` on the bf16-rounded query ([`super::avx512_bf16`]).
pub(crate) trait Scores<E> {
    /// Whether the next K tiles are prefetched over the score loop ([`Self::scores`]'s
    /// `next_k`) or, when false, over `P V` with the V tiles. A prefetcher spreads its
    /// lines over the loop it is given; the dot-product score loops (`vpdpbusd`,
    /// `vdpbf16ps`) take a quarter to a half of `P V`'s time, so their K lines came in
    /// bursts that stalled on the core's miss buffers (7.5% of an int8-query profile
    /// on `prefetcht1`).
    const K_IN_SCORES: bool = true;

    /// Scores in log2 units (the query's `scale * log2(e)` applied) of query heads
    /// `qh .. qh + H` for the chunk's tokens (lanes beyond `c.lanes` are don't-care),
    /// prefetching the lines of `next_k` (the next K tiles) over the loop.
    ///
    /// # Safety
    /// The CPU must support the features the implementation is compiled for.
    unsafe fn scores<const H: usize>(&self, c: &Chunk<E>, qh: usize, next_k: Stream<E>) -> [__m512; H];
}

/// How a head tile's `P V` runs when not by this file's f32 loops: f16 arithmetic for
/// f16 probabilities (`Precision { q: F16, pv: F16 }`, [`super::avx512_fp16`]) or byte
/// tables for e4m3 ([`super::avx512_e4m3`]); [`FloatPv`] takes nothing.
pub(crate) trait Pv<E> {
    /// Whether [`Self::pv`] takes every chunk of an item of head_dim `d` (then
    /// [`Self::finish`] ends the item).
    fn takes(&self, d: usize) -> bool;

    /// `acc[j] = alpha[j] * acc[j] + P_j V` (without `alpha` unless `rescale`) for the
    /// chunk's tokens and the `H` heads' probabilities `probs[j][t]` (V scales folded
    /// in, 0 past `c.lanes`), `acc` the heads' `H` rows of `d` in the implementation's
    /// order; the lines of `next` (the next V tiles, then the next K tiles) are
    /// prefetched over the loop.
    ///
    /// # Safety
    /// The CPU must support the features the implementation is compiled for.
    unsafe fn pv<const H: usize>(
        &self,
        c: &Chunk<E>,
        acc: &mut [f32],
        probs: &[[f32; W]; HT],
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

/// `P V` by this file's f32 loops (V widened exactly).
pub(crate) struct FloatPv;

impl<E> Pv<E> for FloatPv {
    #[inline(always)]
    fn takes(&self, _: usize) -> bool {
        false
    }

    unsafe fn pv<const H: usize>(&self, _: &Chunk<E>, _: &mut [f32], _: &[[f32; W]; HT], _: &[f32; H], _: bool, _: [Stream<E>; 2]) {
        unreachable!("FloatPv takes no chunk")
    }

    unsafe fn finish(&self, _: &mut [f32], _: usize) {}
}

/// f32 scores from the pre-scaled f32 query rows of the item, each head tile's rows
/// interleaved ([`interleave_query`]), prefetching as `Prefetcher<FAR_LINES>`.
pub(crate) struct Exact<'a, const FAR_LINES: bool> {
    pub q: &'a [f32],
}

impl<E: Elem, const FAR_LINES: bool> Scores<E> for Exact<'_, FAR_LINES> {
    /// Each K row (one dimension, 16 tokens) is widened once and FMA'd with the
    /// broadcast query element of every head, with [`chains`] partial sums per head.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn scores<const H: usize>(&self, c: &Chunk<E>, qh: usize, next_k: Stream<E>) -> [__m512; H] {
        let (d, bs, q, mask) = (c.d, c.bs, self.q, chunk_mask(c));
        // K rows are bs elements apart; the last unmasked lane of the last row is
        // (d - 1) * bs + c0 + lanes - 1 < d * bs <= kt.len(). Query rows qh..qh + H exist
        // (interleaved: the tile's H * d elements from qh * d).
        assert!(c.kt.len() >= d * bs && c.c0 + c.lanes <= bs && q.len() >= (qh + H) * d);
        let qp = q[qh * d..].as_ptr();
        let kp = c.kt.as_ptr().wrapping_add(c.c0);
        // A full chunk of an 8-bit cache takes plain loads that fold into the widening
        // instruction (the masked form is a separate load).
        // SAFETY: the assert above is `exact_scores`'s contract.
        unsafe {
            if E::DTYPE.is_quantized() && mask == 0xffff {
                exact_scores::<E, H, true, FAR_LINES>(kp, qp, d, bs, mask, next_k)
            } else {
                exact_scores::<E, H, false, FAR_LINES>(kp, qp, d, bs, mask, next_k)
            }
        }
    }
}

/// [`Exact`]'s score loop: K rows `kp + i * bs` (16 lanes, `mask`, or all 16 with
/// `FULL`), query element `i` of head `j` at `qp + i * H + j` (interleaved). Pointers
/// are stepped, not recomputed per row.
///
/// # Safety
/// Rows `0..d` of `kp` (stride `bs`) are readable at the unmasked lanes (all with `FULL`),
/// `qp` holds `H * d` f32; the CPU has the features below.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn exact_scores<E: Elem, const H: usize, const FULL: bool, const FAR_LINES: bool>(
    kp: *const E,
    qp: *const f32,
    d: usize,
    bs: usize,
    mask: __mmask16,
    next_k: Stream<E>,
) -> [__m512; H] {
    let mask = if FULL { 0xffff } else { mask };
    let n = chains::<E>(H);
    let pairs = E::DTYPE == DType::E4M3 && H <= 2;
    // The next K tile is prefetched over this loop, the next V tile over the V loop,
    // so the misses overlap FMAs instead of arriving in one burst.
    let mut pf = Prefetcher::<FAR_LINES>::with(next_k, d / n);
    let mut s = [[_mm512_setzero_ps(); H]; 4];
    let (mut kr, mut qr) = (kp, qp);
    let mut i = 0;
    while i + n <= d {
        // SAFETY: rows i .. i + n <= d (kr = kp + i * bs), lanes masked to the tile;
        // query elements (i + r) * H + j < H * d past qp (qr = qp + i * H).
        unsafe {
            let mut k = [_mm512_setzero_ps(); 4];
            let mut r = 0;
            // e4m3 widens two whole rows at once (`load_pair`) where the widening, not
            // the FMAs, is the work: 1-2 heads per K row (MHA 0.94-0.97x the time, GQA-4
            // 1.01-1.03x; `docs/experiments.md`, "Decode attention: conversions").
            while FULL && pairs && r + 1 < n {
                [k[r], k[r + 1]] = load_pair(kr.wrapping_add(r * bs), bs);
                r += 2;
            }
            while r < n {
                k[r] = load(kr.wrapping_add(r * bs), mask);
                r += 1;
            }
            pf.step();
            for j in 0..H {
                for r in 0..n {
                    s[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(*qr.add(r * H + j)), k[r], s[r][j]);
                }
            }
        }
        kr = kr.wrapping_add(n * bs);
        qr = qr.wrapping_add(n * H);
        i += n;
    }
    while i < d {
        // SAFETY: row i < d, masked as above; query element i * H + j < H * d.
        unsafe {
            let k0 = load(kp.wrapping_add(i * bs), mask);
            for j in 0..H {
                s[0][j] = _mm512_fmadd_ps(_mm512_set1_ps(*qp.add(i * H + j)), k0, s[0][j]);
            }
        }
        i += 1;
    }
    for j in 0..H {
        for r in 1..n {
            s[0][j] = _mm512_add_ps(s[0][j], s[r][j]);
        }
    }
    s[0]
}

/// Independent partial sums per head in [`Exact`]'s score loop: the FMA latency (4
/// cycles) needs about 4 chains in flight. With 1-2 heads per tile an 8-bit cache takes 4
/// (its rows cost a quarter of f32's bytes, so a latency-bound loop is what limits an
/// MHA decode: 2 chains held it near 8 bytes per cycle); 3-4 heads already give 6-8 chains
/// with 2, and the unquantized dtypes keep the 2 they were measured with.
#[inline(always)]
fn chains<E: Elem>(heads: usize) -> usize {
    if heads <= 2 && E::DTYPE.is_quantized() {
        4
    } else {
        2
    }
}

/// `2^x` for `x <= LAZY_MAX`; exactly 0 below [`EXP2_ZERO_BELOW`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(crate) fn exp2(x: __m512) -> __m512 {
    exp2_each([x])[0]
}

/// [`exp2`] of each vector, the polynomial's steps interleaved across them.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
fn exp2_each<const H: usize>(x: [__m512; H]) -> [__m512; H] {
    // Taylor series of 2^f = e^(f ln 2) on [-0.5, 0.5]; the degree-8 term is < 6e-9.
    const C: [f32; 8] = super::work::EXP2_TAYLOR;
    let low = _mm512_set1_ps(EXP2_ZERO_BELOW);
    let mut n = [_mm512_setzero_ps(); H];
    let mut f = [_mm512_setzero_ps(); H];
    let mut r = [_mm512_set1_ps(C[7]); H];
    let mut keep = [0 as __mmask16; H];
    for j in 0..H {
        // Not below the bound, or NaN.
        keep[j] = !_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x[j], low);
        let xj = _mm512_max_ps(x[j], low);
        n[j] = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(xj);
        f[j] = _mm512_sub_ps(xj, n[j]);
    }
    for &c in C[..7].iter().rev() {
        for j in 0..H {
            r[j] = _mm512_fmadd_ps(r[j], f[j], _mm512_set1_ps(c));
        }
    }
    for j in 0..H {
        r[j] = _mm512_maskz_mov_ps(keep[j], _mm512_scalef_ps(r[j], n[j]));
    }
    r
}

/// [`super::work::soft_cap`] of each score vector, the heads' `exp2` interleaved; the
/// argument is clamped to +-[`SOFT_CAP_ARG`] (where the result is `+-c` in f32), a NaN
/// score stays NaN.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
fn soft_cap_each<const H: usize>(s: [__m512; H], c: f32) -> [__m512; H] {
    let (k, lim) = (_mm512_set1_ps(2.0 * std::f32::consts::LOG2_E / c), _mm512_set1_ps(SOFT_CAP_ARG));
    let x = s.map(|v| _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, k), _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim));
    let e = exp2_each(x);
    let (cv, two_c, one) = (_mm512_set1_ps(c), _mm512_set1_ps(2.0 * c), _mm512_set1_ps(1.0));
    let mut out = e.map(|v| _mm512_sub_ps(cv, _mm512_div_ps(two_c, _mm512_add_ps(v, one))));
    for (o, v) in out.iter_mut().zip(s) {
        *o = _mm512_mask_mov_ps(*o, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v), v);
    }
    out
}

/// Scores, softmax update and V accumulation of query heads `qh..qh + H` over `N` (1 or
/// 2) chunks of one KV head (two from [`Work::for_each_chunk_pair`], whose `P V` then runs
/// on [`pv_full`] only); `l` holds each head's softmax sum per lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn head_tile<E: Elem, S: Scores<E>, P: Pv<E>, const H: usize, const N: usize, const FAR_LINES: bool, const CAP: bool>(
    cs: [&Chunk<E>; N],
    sc: &S,
    pv: &P,
    qh: usize,
    p: &mut Partial,
    l: &mut [[f32; W]],
    probs: &mut [[[f32; W]; HT]; 2],
    prefetch: [Option<Ahead<E>>; N],
    cap: f32,
) {
    let d = cs[0].d;
    assert!(N <= 2 && l.len() >= qh + H);
    for c in cs {
        assert!(c.d == d && c.vt.len() >= d * c.bs && c.c0 + c.lanes <= c.bs);
    }
    let mut masks = [0 as __mmask16; N];
    let mut scores = [[_mm512_setzero_ps(); H]; N];
    let mut vscale = [None; N];
    let mut next_v = [Stream::NONE; N];
    let mut pv_k = [Stream::NONE; N];
    for n in 0..N {
        let c = cs[n];
        // Matches, not `Option::map` closures: an out-of-line call clobbers every zmm register.
        let (next_k, nv) = match prefetch[n] {
            Some(Ahead { k, v, far: Some((fk, fv)) }) => (Stream { l1: Some(k), l2: Some(fk) }, Stream { l1: Some(v), l2: Some(fv) }),
            Some(Ahead { k, v, far: None }) => (Stream { l1: Some(k), l2: None }, Stream { l1: Some(v), l2: None }),
            None => (Stream::NONE, Stream::NONE),
        };
        // The integer `P V` is as short as the dot-product score loops: K stays with the scores.
        let (next_k, pk) = if S::K_IN_SCORES || pv.takes(d) { (next_k, Stream::NONE) } else { (Stream::NONE, next_k) };
        (next_v[n], pv_k[n]) = (nv, pk);
        masks[n] = chunk_mask(c);
        // SAFETY: `run_with`'s caller guarantees the features of `S`'s implementation.
        scores[n] = unsafe { sc.scores::<H>(c, qh, next_k) };
        if let Some(ks) = scale_vector::<E>(&c.ks, c.c0, masks[n]) {
            for s in scores[n].iter_mut() {
                *s = _mm512_mul_ps(*s, ks);
            }
        }
        if CAP {
            scores[n] = soft_cap_each(scores[n], cap);
        }
        vscale[n] = scale_vector::<E>(&c.vs, c.c0, masks[n]);
    }

    // Online softmax per head; masked-off lanes get probability 0. The running maximum
    // is lazy: it moves only when a score exceeds it by more than `LAZY_MAX`, so the
    // probabilities (up to 2^LAZY_MAX) do not wait for a horizontal max and the
    // accumulators are rarely rescaled. `l` and `acc` share the reference point, so the
    // quotient and the LSE are those of the exact maximum. The chunks of a pair share
    // one reference point (it moves on the larger of their scores).
    let mut alpha = [1f32; H];
    let mut rescale = false;
    let mut x = [[_mm512_setzero_ps(); H]; N];
    for j in 0..H {
        let mut top = _mm512_set1_ps(f32::NEG_INFINITY);
        for n in 0..N {
            x[n][j] = _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), masks[n], scores[n][j]);
            top = if n == 0 { x[n][j] } else { _mm512_max_ps(top, x[n][j]) };
        }
        let m_old = p.m[qh + j];
        // Always taken on the first chunk (m = -inf); masked lanes are -inf, never above.
        if _mm512_cmp_ps_mask::<_CMP_GT_OQ>(top, _mm512_set1_ps(m_old + LAZY_MAX)) != 0 {
            let m_new = _mm512_reduce_max_ps(top);
            // exp2 of the vector unit, not libm's: a call would spill every register.
            alpha[j] = _mm512_cvtss_f32(exp2(_mm512_set1_ps(m_old - m_new)));
            p.m[qh + j] = m_new;
            rescale = true;
        }
        let m = _mm512_set1_ps(p.m[qh + j]);
        for n in 0..N {
            x[n][j] = _mm512_sub_ps(x[n][j], m);
        }
    }
    for n in 0..N {
        // The heads' polynomials step together: one head's is a chain of dependent FMAs.
        let e = exp2_each(x[n]);
        for j in 0..H {
            x[n][j] = _mm512_maskz_mov_ps(masks[n], e[j]);
        }
    }
    for j in 0..H {
        // SAFETY: l[qh + j] (asserted to exist) and probs[n][j] hold exactly 16 f32.
        unsafe {
            let lp = l.as_mut_ptr().add(qh + j).cast::<f32>();
            let mut lv = _mm512_loadu_ps(lp);
            if rescale {
                lv = _mm512_mul_ps(lv, _mm512_set1_ps(alpha[j]));
            }
            for n in 0..N {
                lv = _mm512_add_ps(lv, x[n][j]);
                // 8-bit V: the probabilities carry the V scales, `P V` reads the codes.
                let e = vscale[n].map_or(x[n][j], |vs| _mm512_mul_ps(x[n][j], vs));
                _mm512_storeu_ps(probs[n][j].as_mut_ptr(), e);
            }
            _mm512_storeu_ps(lp, lv);
        }
    }

    let acc = &mut p.acc[qh * d..(qh + H) * d];
    if N == 1 && pv.takes(d) {
        // SAFETY: `run_with`'s caller guarantees the features of `P`'s implementation.
        unsafe { pv.pv::<H>(cs[0], acc, &probs[0], &alpha, rescale, [next_v[0], pv_k[0]]) };
        return;
    }
    // 8-bit V rows whose length is a multiple of 64: whole vectors, unmasked loads
    // folded into the widening, pointers stepped; 128 dimensions per pass for 1-2 heads.
    if E::DTYPE.is_quantized() && d.is_multiple_of(VT * W) {
        let wide = H <= 2 && d.is_multiple_of(2 * VT * W);
        let passes = d / if wide { 2 * VT * W } else { VT * W };
        let idle = || Prefetcher::<FAR_LINES>::with(Stream::<E>::NONE, 0);
        let mut pf = [[idle(), idle()], [idle(), idle()]];
        for n in 0..N {
            let steps = passes * cs[n].lanes;
            pf[n] = [Prefetcher::with(next_v[n], steps), Prefetcher::with(pv_k[n], steps)];
        }
        // SAFETY: `pv_full`'s contract is checked by its asserts; the features are ours.
        unsafe {
            if wide {
                pv_full::<E, H, { 2 * VT }, N, FAR_LINES>(cs, acc, probs, &alpha, rescale, &mut pf);
            } else {
                pv_full::<E, H, VT, N, FAR_LINES>(cs, acc, probs, &alpha, rescale, &mut pf);
            }
        }
        return;
    }
    // One chunk from here on (`pairs_apply` pairs chunks only where `pv_full` runs).
    assert!(N == 1, "pairs of chunks take pv_full");
    let (c, probs, next_v, pv_k) = (cs[0], &probs[0], next_v[0], pv_k[0]);
    // acc[qh + j][u0 .. u0 + 64] in registers over the chunk's tokens.
    let ap = acc.as_mut_ptr();
    let vp = c.vt.as_ptr();
    let steps = d.div_ceil(VT * W) * c.lanes;
    let (mut pf, mut pfk) = (Prefetcher::<FAR_LINES>::with(next_v, steps), Prefetcher::<FAR_LINES>::with(pv_k, steps));
    let mut u0 = 0;
    while u0 < d {
        // A loop, not `array::from_fn`, whose closure became an out-of-line call.
        let mut m = [0 as __mmask16; VT];
        for u in 0..VT {
            m[u] = lane_mask(u0 + u * W, d);
        }
        let mut a = [[_mm512_setzero_ps(); VT]; H];
        for j in 0..H {
            let al = _mm512_set1_ps(alpha[j]);
            for u in 0..VT {
                // SAFETY: unmasked lanes lie in row j of acc (j * d + u0 + u*16 + lane <
                // (j + 1) * d); the address is formed with wrapping_add because a fully
                // masked vector may point past the end, where nothing is accessed.
                a[j][u] = unsafe { _mm512_maskz_loadu_ps(m[u], ap.wrapping_add(j * d + u0 + u * W)) };
                if rescale {
                    a[j][u] = _mm512_mul_ps(al, a[j][u]);
                }
            }
        }
        for t in 0..c.lanes {
            pf.step();
            pfk.step();
            let row = (c.c0 + t) * d + u0;
            let v: [__m512; VT] = if E::DTYPE == DType::BF16 && d.is_multiple_of(2 * W) {
                // SAFETY: as below; each 32-element load is all in or all out of the row
                // (d is a multiple of 32), its mask taken from the vector pair it fills.
                unsafe { load_bf16_permuted(vp.wrapping_add(row), [m[0], m[2]]) }
            } else {
                // A loop, not `array::from_fn`: a closure does not inherit the target
                // features, so `load` would be an out-of-line call per vector.
                let mut v = [_mm512_setzero_ps(); VT];
                for u in 0..VT {
                    // SAFETY: token c0 + t < bs, lanes masked to the row's d elements: inside vt.
                    v[u] = unsafe { load(vp.wrapping_add(row + u * W), m[u]) };
                }
                v
            };
            for j in 0..H {
                let pj = _mm512_set1_ps(probs[j][t]);
                for u in 0..VT {
                    a[j][u] = _mm512_fmadd_ps(pj, v[u], a[j][u]);
                }
            }
        }
        for j in 0..H {
            for u in 0..VT {
                // SAFETY: same range as the load above.
                unsafe { _mm512_mask_storeu_ps(ap.wrapping_add(j * d + u0 + u * W), m[u], a[j][u]) };
            }
        }
        u0 += VT * W;
    }
}

/// `acc[j] = alpha[j] * acc[j] + sum_t probs[n][j][t] v_t` (if `rescale`, else without
/// `alpha`) for the token rows `v_t` of `d` elements (a multiple of `U * 16`) of the `N`
/// chunks `cs[n]` (their probabilities `probs[n]`), `U` vectors of each of the `H` heads'
/// accumulator rows in registers per pass over all the chunks' rows: every load whole (no
/// masks, no per-vector branch), the V row pointer stepped by `d`. `pf[n]`: chunk `n`'s
/// prefetchers, the next V tiles' and the next K tiles' (idle unless
/// [`Scores::K_IN_SCORES`] is false), one step each per row of the chunk.
///
/// No target features of its own, so that `#[inline(always)]` may put it into
/// [`head_tile`] (the two cannot be combined): out of line, with the pairs of chunks'
/// instances beside the single ones, LLVM kept it and its caller apart and a block size
/// of 16 lost 2% (`docs/experiments.md`, "Decode attention: compute").
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, fma and f16c (the caller is compiled
/// for them).
#[inline(always)]
unsafe fn pv_full<E: Elem, const H: usize, const U: usize, const N: usize, const FAR_LINES: bool>(
    cs: [&Chunk<E>; N],
    acc: &mut [f32],
    probs: &[[[f32; W]; HT]; 2],
    alpha: &[f32; H],
    rescale: bool,
    pf: &mut [[Prefetcher<FAR_LINES>; 2]; 2],
) {
    let d = cs[0].d;
    assert!(N <= 2 && H <= HT && d.is_multiple_of(U * W) && acc.len() == H * d);
    for c in cs {
        assert!(c.d == d && c.lanes <= W && (c.c0 + c.lanes) * d <= c.vt.len());
    }
    let ap = acc.as_mut_ptr();
    let mut u0 = 0;
    // SAFETY: the CPU has this file's features (the contract), for every intrinsic below.
    // Memory: row j of acc, elements u0 + u * 16 .. + 16 <= d (d a multiple of U * 16),
    // so j * d + u0 + u * 16 + 16 <= H * d = acc.len(); V row c0 + t < c0 + lanes of each
    // chunk's tile (asserted inside vt), elements u0 + u * 16 .. + 16 <= d of it; the
    // probabilities at j < H <= HT, t < lanes <= 16.
    unsafe {
        while u0 < d {
            let mut a = [[_mm512_setzero_ps(); U]; H];
            for j in 0..H {
                let al = _mm512_set1_ps(alpha[j]);
                for u in 0..U {
                    a[j][u] = _mm512_loadu_ps(ap.add(j * d + u0 + u * W));
                    if rescale {
                        a[j][u] = _mm512_mul_ps(al, a[j][u]);
                    }
                }
            }
            for n in 0..N {
                let (c, pr, pf) = (cs[n], &probs[n], &mut pf[n]);
                let mut vr = c.vt.as_ptr().wrapping_add(c.c0 * d + u0);
                for t in 0..c.lanes {
                    pf[0].step();
                    pf[1].step();
                    let mut v = [_mm512_setzero_ps(); U];
                    if E::DTYPE == DType::E4M3 && H <= 2 {
                        // U is even: 32 codes per widening (`load_pair`), as in the K loop.
                        for u in (0..U).step_by(2) {
                            [v[u], v[u + 1]] = load_pair(vr.add(u * W), W);
                        }
                    } else {
                        for u in 0..U {
                            v[u] = load(vr.add(u * W), 0xffff);
                        }
                    }
                    for j in 0..H {
                        let pj = _mm512_set1_ps(*pr.get_unchecked(j).get_unchecked(t));
                        for u in 0..U {
                            a[j][u] = _mm512_fmadd_ps(pj, v[u], a[j][u]);
                        }
                    }
                    vr = vr.wrapping_add(d);
                }
            }
            for j in 0..H {
                for u in 0..U {
                    _mm512_storeu_ps(ap.add(j * d + u0 + u * W), a[j][u]);
                }
            }
            u0 += U * W;
        }
    }
}
