//! NEON (AArch64 Advanced SIMD) kernel: 4 f32 lanes per register, tokens in lanes, the
//! structure of [`super::avx512`] scaled to 128-bit registers.
//!
//! Per (block, KV head) tile and chunk of up to 16 tokens (4 vectors):
//! 1. scores for up to 4 query heads at once: per 4 dimensions, one vector load of each
//!    head's query, then every K row (one dimension, the chunk's tokens: the
//!    dimension-major tile makes it contiguous) is converted to f32 once and FMA'd into
//!    every head with `vfmaq_laneq_f32` (the query element is taken from a lane, no
//!    broadcast). A full tile keeps 16 independent accumulator chains; when fewer heads
//!    or vectors are live, even and odd dimensions go to two partial sums to hide the
//!    FMA latency; no horizontal sums in the loop;
//! 2. online softmax in registers (`exp2` by the degree-7 polynomial of the x86 paths and
//!    exponent bits) with the lazy running maximum of the AVX-512 path (moved only when a
//!    score passes it by 2^8);
//! 3. `acc += p_t * v_t` with the accumulators of 4 heads x 16 dimensions in registers
//!    across the chunk (16 of AArch64's 32 vector registers), rescaled when loaded.
//!
//! The next tile is prefetched line by line (`prfm pldl1keep` through `asm!`: the
//! `_prefetch` intrinsic is unstable), its K lines over the score loop, its V lines over
//! the V loop, as in [`super::avx512`].
//!
//! Storage: f32 loads directly; bf16 is widened exactly by a 16-bit shift
//! (`vshll_n_u16`); f16 by `fcvtl` through `asm!` (the intrinsic `vcvt_f32_f16` is stable
//! only since Rust 1.94, after this crate's MSRV 1.89), checked against `half` on all
//! 65536 bit patterns; the 8-bit codes are dequantized in registers
//! ([`super::neon_cvt`]), the K scales multiplying the scores and the V scales the
//! probabilities after the softmax sum took them, so `P V` runs on the codes. An exact integer-NEON conversion was tried first: its constants
//! and temporaries made LLVM spill the f16 loops (about 1700 stack vector accesses in the
//! f16 kernel against about 450 for f32, bf16 and `fcvtl`, in the release assembly).
//!
//! NEON has no masked loads: a chunk's last, partial token vector and a `head_dim` tail
//! that is not a multiple of 4 are read lane by lane into a zeroed register (a staging
//! copy calls memcpy, and a call in the loops makes LLVM spill the accumulators around
//! it); every raw access is inside a tile checked once per chunk.
//!
//! Verified for correctness only: the Rust tests of `kernel::tests` (every path against an
//! f64 reference over the kernel's test grid and at the bounds of the unsafe loads) run
//! under `qemu-aarch64` via `tests/aarch64.sh`. No aarch64 hardware was available, so the
//! path has no speed figure.

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;
use std::arch::asm;

use super::neon_cvt::{f16_to_f32, load_codes};
use super::work::{load_factor, Ahead, Chunk, Partial, Work, EXP2_ZERO_BELOW, LAZY_MAX};
use crate::kv::quant::TileScale;
use crate::kv::{DType, Elem};

/// f32 lanes per vector.
const W: usize = 4;
/// Token vectors per chunk: 16 tokens.
const TV: usize = 4;
/// Query heads per register tile.
const HT: usize = 4;
/// V accumulator vectors per head in registers (16 dimensions).
const VT: usize = 4;

/// # Safety
/// The CPU must support NEON (AArch64 Advanced SIMD).
#[target_feature(enable = "neon")]
pub(crate) unsafe fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    // A soft cap is an instantiation of its own, as on the x86 paths.
    match w.soft_cap {
        Some(c) => tiles::<E, true>(w, p, c),
        None => tiles::<E, false>(w, p, 0.0),
    }
}

/// [`run`]'s loop; with `CAP` each score `s` becomes `cap * tanh(s / cap)`.
#[inline]
#[target_feature(enable = "neon")]
fn tiles<E: Elem, const CAP: bool>(w: &Work<E>, p: &mut Partial, cap: f32) {
    let g = w.g;
    w.for_each_chunk(TV * W, |hi, chunk, next| {
        let lanes = chunk.lanes;
        let mut j0 = 0;
        while j0 < g {
            let pf = if j0 == 0 { next } else { None };
            let qh = hi * g + j0;
            // Const heads and vectors: the register tiles are exactly as large as the
            // work, so nothing spills and no lane is computed for nothing.
            macro_rules! tile {
                ($($h:literal, $nv:literal);*) => {
                    match ((g - j0).min(HT), lanes.div_ceil(W)) {
                        $(($h, $nv) => head_tile::<E, $h, $nv, CAP>(chunk, w.q, qh, p, pf, cap),)*
                        _ => unreachable!("1..=4 heads and 1..=4 vectors"),
                    }
                };
            }
            tile!(1, 1; 1, 2; 1, 3; 1, 4; 2, 1; 2, 2; 2, 3; 2, 4;
                  3, 1; 3, 2; 3, 3; 3, 4; 4, 1; 4, 2; 4, 3; 4, 4);
            j0 += HT;
        }
    });
}

/// Load 4 consecutive elements as f32.
///
/// # Safety
/// `p .. p + 4` must lie inside one live allocation of `E`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load4<E: Elem>(p: *const E) -> float32x4_t {
    // SAFETY: forwarded to the caller; f16/bf16 are 16-bit plain data.
    unsafe {
        match E::DTYPE {
            DType::F32 => vld1q_f32(p.cast()),
            DType::F16 | DType::BF16 => widen::<E>(vld1_u16(p.cast())),
            DType::I8 | DType::E4M3 | DType::E5M2 => load_codes(p, W),
        }
    }
}

/// f16 or bf16 bits to f32, exactly.
#[inline]
#[target_feature(enable = "neon")]
fn widen<E: Elem>(x: uint16x4_t) -> float32x4_t {
    match E::DTYPE {
        DType::F16 => f16_to_f32(x),
        _ => vreinterpretq_f32_u32(vshll_n_u16::<16>(x)),
    }
}

/// Load the first `n` (0..=4) of 4 elements as f32, the rest 0. The partial case uses
/// lane loads, not a staging copy: a call (memcpy, `half`'s conversion) anywhere in the
/// loops would make the register allocator spill the accumulators around it.
///
/// # Safety
/// `p .. p + n` must lie inside one live allocation of `E`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_n<E: Elem>(p: *const E, n: usize) -> float32x4_t {
    // SAFETY: forwarded to the caller: lane k is loaded only when k < n.
    unsafe {
        if E::DTYPE.is_quantized() {
            return load_codes(p, n);
        }
        if n >= W {
            return load4(p);
        }
        // Lanes 0..n (n < 4) of `$x` loaded from `$p`.
        macro_rules! first_lanes {
            ($load:ident, $p:expr, $x:expr) => {{
                let (p, mut x) = ($p, $x);
                // Unrolled: a loop over the lanes costs the f32 kernel twice the spills.
                if n > 0 {
                    x = $load::<0>(p, x);
                }
                if n > 1 {
                    x = $load::<1>(p.add(1), x);
                }
                if n > 2 {
                    x = $load::<2>(p.add(2), x);
                }
                x
            }};
        }
        if E::DTYPE == DType::F32 {
            first_lanes!(vld1q_lane_f32, p.cast::<f32>(), vdupq_n_f32(0.0))
        } else {
            widen::<E>(first_lanes!(vld1_lane_u16, p.cast::<u16>(), vdup_n_u16(0)))
        }
    }
}

/// Store the first `n` (0..=4) lanes of `x`.
///
/// # Safety
/// `p .. p + n` must lie inside one live allocation of f32.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn store_n(p: *mut f32, x: float32x4_t, n: usize) {
    // SAFETY: forwarded to the caller: lane k is stored only when k < n.
    unsafe {
        if n >= W {
            vst1q_f32(p, x);
            return;
        }
        if n > 0 {
            vst1q_lane_f32::<0>(p, x);
        }
        if n > 1 {
            vst1q_lane_f32::<1>(p.add(1), x);
        }
        if n > 2 {
            vst1q_lane_f32::<2>(p.add(2), x);
        }
    }
}

/// Prefetches one tile (K or V) that comes next, `per` bytes per `step`, so the misses
/// are spread over a loop instead of arriving in one burst.
struct Prefetcher {
    p: *const u8,
    left: usize,
    per: usize,
}

impl Prefetcher {
    /// Spread `tile`'s 64-byte lines over `iters` steps.
    #[inline]
    fn new<E>(tile: Option<&[E]>, iters: usize) -> Self {
        match tile {
            Some(t) => {
                let len = std::mem::size_of_val(t);
                Self { p: t.as_ptr().cast(), left: len, per: 64 * len.div_ceil(64).div_ceil(iters.max(1)) }
            }
            None => Self { p: std::ptr::null(), left: 0, per: 0 },
        }
    }

    #[inline]
    fn step(&mut self) {
        let mut off = 0;
        while off < self.per && off < self.left {
            let at = self.p.wrapping_add(off);
            // SAFETY: a prefetch hint never faults and writes nothing; the address stays
            // inside the next tile.
            unsafe { asm!("prfm pldl1keep, [{0}]", in(reg) at, options(nostack, readonly, preserves_flags)) };
            off += 64;
        }
        self.p = self.p.wrapping_add(off);
        self.left -= off.min(self.left);
    }
}

/// `2^x` for `x <= LAZY_MAX`; exactly 0 below [`EXP2_ZERO_BELOW`].
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn exp2(x: float32x4_t) -> float32x4_t {
    let zero = vcltq_f32(x, vdupq_n_f32(EXP2_ZERO_BELOW));
    let x = vmaxq_f32(x, vdupq_n_f32(EXP2_ZERO_BELOW));
    let n = vrndnq_f32(x);
    let f = vsubq_f32(x, n);
    let c = super::work::EXP2_TAYLOR;
    let mut r = vdupq_n_f32(c[7]);
    for &ci in c[..7].iter().rev() {
        r = vfmaq_f32(vdupq_n_f32(ci), r, f);
    }
    // 2^n with n in -64..=8 built in the exponent field: always a normal float.
    let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
    let r = vmulq_f32(r, vreinterpretq_f32_s32(e));
    vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(r), zero))
}

/// [`super::work::soft_cap`] of `s`, as the x86 paths': the `exp2` argument clamped to
/// +-[`super::work::SOFT_CAP_ARG`], a NaN score kept.
#[inline]
#[target_feature(enable = "neon")]
fn soft_cap(s: float32x4_t, c: f32) -> float32x4_t {
    let lim = super::work::SOFT_CAP_ARG;
    let x = vminq_f32(vmaxq_f32(vmulq_n_f32(s, 2.0 * std::f32::consts::LOG2_E / c), vdupq_n_f32(-lim)), vdupq_n_f32(lim));
    let t = vsubq_f32(vdupq_n_f32(c), vdivq_f32(vdupq_n_f32(2.0 * c), vaddq_f32(exp2(x), vdupq_n_f32(1.0))));
    vbslq_f32(vceqq_f32(s, s), t, s)
}

/// Scores, softmax update and V accumulation of query heads `qh..qh + H` over a chunk of
/// `NV` token vectors (the last one possibly partial).
#[inline]
#[target_feature(enable = "neon")]
fn head_tile<E: Elem, const H: usize, const NV: usize, const CAP: bool>(
    c: &Chunk<E>,
    q: &[f32],
    qh: usize,
    p: &mut Partial,
    prefetch: Option<Ahead<E>>,
    cap: f32,
) {
    let (d, bs) = (c.d, c.bs);
    // K rows are bs elements apart; the last loaded lane of the last row is
    // (d - 1) * bs + c0 + lanes - 1 < d * bs <= kt.len(). Query rows qh..qh + H exist.
    assert!(c.kt.len() >= d * bs && c.vt.len() >= d * bs && c.c0 + c.lanes <= bs && q.len() >= (qh + H) * d);
    debug_assert!(c.lanes.div_ceil(W) == NV);
    // Lanes of each token vector that hold a token: 4 but in the last vector (spelled so
    // that the compiler sees the full ones as constants).
    let last = c.lanes - (NV - 1) * W;
    let width: [usize; NV] = std::array::from_fn(|v| if v + 1 < NV { W } else { last });
    let qp = q[qh * d..].as_ptr();
    let kp = c.kt[c.c0..].as_ptr();
    let mut pf = Prefetcher::new(prefetch.map(|t| t.k), d / W);

    // Two partial sums (even and odd dimensions) unless the tile already has 16 chains.
    let two = H * NV <= 8;
    let mut s = [[[vdupq_n_f32(0.0); NV]; H]; 2];
    let mut i = 0;
    while i + W <= d {
        // SAFETY: query elements j * d + i + 3 < H * d past qp (assert above).
        let qv: [float32x4_t; H] = std::array::from_fn(|j| unsafe { vld1q_f32(qp.add(j * d + i)) });
        pf.step();
        macro_rules! row {
            ($r:literal) => {
                let k: [float32x4_t; NV] = std::array::from_fn(|v| {
                    // SAFETY: row i + r < d; vector v reads tokens c0 + 4v .. c0 + 4v +
                    // width[v] <= c0 + lanes of that row: inside kt (assert above).
                    unsafe { load_n(kp.add((i + $r) * bs + v * W), width[v]) }
                });
                let set = if two { $r % 2 } else { 0 };
                for j in 0..H {
                    for v in 0..NV {
                        s[set][j][v] = vfmaq_laneq_f32::<$r>(s[set][j][v], k[v], qv[j]);
                    }
                }
            };
        }
        row!(0);
        row!(1);
        row!(2);
        row!(3);
        i += W;
    }
    while i < d {
        // SAFETY: row i < d, tokens as above; query element j * d + i < H * d.
        unsafe {
            let k: [float32x4_t; NV] = std::array::from_fn(|v| load_n(kp.add(i * bs + v * W), width[v]));
            for j in 0..H {
                let qj = vdupq_n_f32(*qp.add(j * d + i));
                for v in 0..NV {
                    s[0][j][v] = vfmaq_f32(s[0][j][v], qj, k[v]);
                }
            }
        }
        i += 1;
    }

    // Online softmax per head, lazy maximum as in avx512: `l` and `acc` share the
    // reference point, so the quotient and the LSE are those of the exact maximum.
    // Lanes without a token get score -inf and probability 0.
    let valid: [uint32x4_t; NV] = std::array::from_fn(|v| {
        vcltq_u32(vld1q_u32_arr(&[0, 1, 2, 3]), vdupq_n_u32(width[v] as u32))
    });
    let neg_inf = vdupq_n_f32(f32::NEG_INFINITY);
    // 8-bit K: the scores carry the K scales; V: the probabilities carry the V scales.
    let kscale = scale_vectors::<E, NV>(&c.ks, c.c0, &width);
    let vscale = scale_vectors::<E, NV>(&c.vs, c.c0, &width);
    let mut probs = [[vdupq_n_f32(0.0); NV]; H];
    let mut alpha = [1f32; H];
    let mut rescale = false;
    for j in 0..H {
        let mut mx = neg_inf;
        for v in 0..NV {
            let sum = if two { vaddq_f32(s[0][j][v], s[1][j][v]) } else { s[0][j][v] };
            let sum = kscale.map_or(sum, |ks| vmulq_f32(sum, ks[v]));
            let sum = if CAP { soft_cap(sum, cap) } else { sum };
            s[0][j][v] = vbslq_f32(valid[v], sum, neg_inf);
            mx = vmaxq_f32(mx, s[0][j][v]);
        }
        let mx = vmaxvq_f32(mx);
        let m_old = p.m[qh + j];
        // Always taken on the first chunk (m = -inf).
        if mx > m_old + LAZY_MAX {
            alpha[j] = vgetq_lane_f32::<0>(exp2(vdupq_n_f32(m_old - mx)));
            p.m[qh + j] = mx;
            rescale = true;
        }
        let m = vdupq_n_f32(p.m[qh + j]);
        let mut total = vdupq_n_f32(0.0);
        for v in 0..NV {
            let e = exp2(vsubq_f32(s[0][j][v], m));
            probs[j][v] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e), valid[v]));
            total = vaddq_f32(total, probs[j][v]);
        }
        p.l[qh + j] = p.l[qh + j] * alpha[j] + vaddvq_f32(total);
        if let Some(vs) = vscale {
            for v in 0..NV {
                probs[j][v] = vmulq_f32(probs[j][v], vs[v]);
            }
        }
    }

    // acc[qh + j][u0 .. u0 + 16] in registers over the chunk's tokens.
    let acc = &mut p.acc[qh * d..(qh + H) * d];
    let ap = acc.as_mut_ptr();
    let vp = c.vt[c.c0 * d..].as_ptr();
    let mut pf = Prefetcher::new(prefetch.map(|t| t.v), d.div_ceil(VT * W) * c.lanes);
    let mut u0 = 0;
    while u0 < d {
        // Dimensions of each accumulator vector inside the row (4 but at a tail).
        let dw: [usize; VT] = std::array::from_fn(|u| d.saturating_sub(u0 + u * W).min(W));
        let mut a = [[vdupq_n_f32(0.0); VT]; H];
        for j in 0..H {
            for u in 0..VT {
                // SAFETY: dimensions u0 + 4u .. + dw[u] of row j lie in acc (j * d + d);
                // wrapping_add: with dw[u] = 0 the address may lie past the end, where
                // nothing is accessed.
                a[j][u] = unsafe { load_n(ap.wrapping_add(j * d + u0 + u * W).cast_const(), dw[u]) };
                if rescale {
                    a[j][u] = vmulq_n_f32(a[j][u], alpha[j]);
                }
            }
        }
        for v in 0..NV {
            macro_rules! token {
                ($r:literal) => {
                    let t = v * W + $r;
                    if t < c.lanes {
                        pf.step();
                        // SAFETY: token c0 + t < bs, dimensions u0 + 4u + dw[u] <= d: the
                        // accessed elements lie in vt (assert above); the address of an
                        // empty vector (dw[u] = 0) may not, hence wrapping_add.
                        let row: [float32x4_t; VT] = std::array::from_fn(|u| unsafe {
                            load_n(vp.wrapping_add(t * d + u0 + u * W), dw[u])
                        });
                        for j in 0..H {
                            for u in 0..VT {
                                a[j][u] = vfmaq_laneq_f32::<$r>(a[j][u], row[u], probs[j][v]);
                            }
                        }
                    }
                };
            }
            token!(0);
            token!(1);
            token!(2);
            token!(3);
        }
        for j in 0..H {
            for u in 0..VT {
                // SAFETY: same range as the load above.
                unsafe { store_n(ap.wrapping_add(j * d + u0 + u * W), a[j][u], dw[u]) };
            }
        }
        u0 += VT * W;
    }
}

/// The scales of the chunk's token vectors (`width[v]` lanes each, the others 0) times
/// [`load_factor`], or `None` for an unquantized cache (scale 1, nothing to multiply).
#[inline]
#[target_feature(enable = "neon")]
fn scale_vectors<E: Elem, const NV: usize>(ts: &TileScale, c0: usize, width: &[usize; NV]) -> Option<[float32x4_t; NV]> {
    let f = load_factor(E::DTYPE);
    match ts {
        TileScale::One => None,
        TileScale::Head(s) => Some([vdupq_n_f32(s * f); NV]),
        TileScale::Token(s) => {
            assert!(c0 + (NV - 1) * W + width[NV - 1] <= s.len());
            let p = s.as_ptr();
            // SAFETY: vector v reads scales c0 + 4v .. c0 + 4v + width[v], inside the
            // tile's block_size scales (assert above).
            Some(std::array::from_fn(|v| unsafe { vmulq_n_f32(load_n(p.add(c0 + v * W), width[v]), f) }))
        }
    }
}

/// A `uint32x4_t` from 4 constants.
#[inline]
#[target_feature(enable = "neon")]
fn vld1q_u32_arr(x: &[u32; 4]) -> uint32x4_t {
    // SAFETY: x holds exactly 4 u32.
    unsafe { vld1q_u32(x.as_ptr()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector `exp2` stays within 2 ulp-ish (2e-7 relative) of libm over its range and
    /// is exactly 0 below [`EXP2_ZERO_BELOW`].
    #[test]
    fn exp2_matches_libm() {
        for x in [-1e30, -200.0, -126.0, EXP2_ZERO_BELOW - 0.01, f32::NEG_INFINITY] {
            let mut got = [1f32; 4];
            // SAFETY: got holds 4 f32.
            unsafe { vst1q_f32(got.as_mut_ptr(), exp2(vdupq_n_f32(x))) };
            assert_eq!(got[0].to_bits(), 0, "{x}");
        }
        let mut x = EXP2_ZERO_BELOW;
        while x <= LAZY_MAX {
            let mut got = [0f32; 4];
            // SAFETY: got holds 4 f32.
            unsafe { vst1q_f32(got.as_mut_ptr(), exp2(vdupq_n_f32(x))) };
            let want = (x as f64).exp2();
            assert!(((got[0] as f64) - want).abs() <= 2e-7 * want, "{x}: {} vs {want}", got[0]);
            x += 0.037;
        }
    }
}
