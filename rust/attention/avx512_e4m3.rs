//! e4m3 widened by byte tables (AVX-512 VBMI), plugged into the tile loop of
//! [`super::simd`] as its [`Scores`] and [`Pv`] (softmax, scales, prefetch and the
//! NaN-code check are that path's, unchanged).
//!
//! Every e4m3 value over 2^8 is exactly a bf16 (3 mantissa bits; the exponents of
//! normals and subnormals alike fall in bf16's normal range), and a bf16 widens to f32 by
//! one 16-bit shift or `and`. Per 64 codes: two 128-entry `vpermi2b` lookups indexed by
//! the code's 7 low bits (the low and the high byte of the bf16 of its magnitude), the
//! sign or'ed into the high bytes (`vpternlogd`), `vpunpck{l,h}bw` into bf16 words and
//! `vpslld` / `vpandd` into the top halves of f32 lanes: 9 instructions, against 16 for
//! the f16 route of [`super::avx512_cvt::load_pair`] (`vpmovsxbw`, `vpsllw`, `vpand`,
//! `vextracti64x4` and two 2-micro-op `vcvtph2ps` per 32). The values are that route's bit
//! for bit (the two NaN codes too: +-1.875, which the tile loop's check handles as before).
//!
//! The unpacks stay within 128-bit lanes, so the four vectors of a 64-code run hold lane
//! `L`'s codes `16 L + {0, 2, 4, 6}`, `{1, 3, 5, 7}`, `{8, .., 14}`, `{9, .., 15}`
//! ([`quad_code`]):
//! - K (block size 16): a run is 4 dimension rows x 16 tokens, lane `L` one dimension. The
//!   query is laid out as one vector per 4 dimensions and head, each element repeated in
//!   its dimension's lane ([`lane_query`]), so one FMA per vector and head; the lanes
//!   are summed once per chunk and the tokens put back in order ([`lanes_to_tokens`]).
//! - V: a run is 64 elements of a token's row; the accumulators keep the quad order
//!   across the item and [`TablePv::finish`] puts each 64 back ([`quad_code`]).
//!
//! Taken for e4m3 caches with block size 16 and a head_dim that is a multiple of 64 on
//! CPUs with `avx512vbmi` (chosen by `decode.rs`'s `Route::select`); other e4m3 calls run the f16 route.

// Register tiles are small fixed arrays indexed by head and vector: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::lanes::{Avx512, Lanes};
use super::simd::{run_with, Pv, Scores, HT};
use super::avx512_cvt::{chunk_mask, W};
use super::avx512_bf16::{fp8_bf16_bits, Fp8Tables};
use super::avx512_cvt::load;
use super::query::repeat_in_lanes;
use super::work::{Chunk, Partial, Work};
use super::prefetch::{Prefetcher, Stream};
use crate::kv::{DType, Elem};

/// Codes per table widening: 4 vectors of 16.
const RUN: usize = 64;
/// The block size the K runs assume: 4 dimension rows of 16 tokens are 64 adjacent codes.
const BLOCK: usize = 16;

/// Runs one work item with [`TableScores`] and [`TablePv`].
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512vbmi, fma and f16c; `w` is an
/// e4m3 item of block size 16 and a head_dim that is a multiple of 64 (asserted).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,fma,f16c")]
pub(crate) unsafe fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    let (d, g) = (w.shape.head_dim, w.g);
    assert!(E::DTYPE == DType::E4M3 && w.shape.block_size == BLOCK && d.is_multiple_of(RUN));
    // The lane query takes 16 bytes per element: an item's KV heads run in groups
    // whose vectors fit in L1 beside the tiles (`Work::in_head_groups`).
    w.in_head_groups(p, |w, p| {
        let q = lane_query(w.q, d, g, HT);
        // SAFETY: the caller's features are those the two implementations are compiled for.
        unsafe { run_with::<Avx512, E, _, _, true>(Avx512::assume(), w, p, &TableScores { q: &q }, &TablePv) }
    });
}

/// The bf16 bits of `value / 2^8` for the e4m3 magnitudes `0..128`, as the f16 route
/// reads them ([`super::avx512_cvt::e4m3_over_256`]): the NaN magnitude `0x7f` as 480
/// (1.875 after the division).
static TABLES: Fp8Tables = Fp8Tables::from_bits(&{
    let mut bits = [0u16; 128];
    let mut c = 0;
    while c < 128 {
        // 480 = 1.875 * 2^8 is e4m3's 0x7e pattern with the mantissa one step up: the
        // normal formula applied to the NaN code.
        let b = if c == 0x7f { 0x43f0 } else { fp8_bf16_bits(c as u8, 4, 3) };
        // Over 2^8: the exponent field 8 lower (every nonzero magnitude's is >= 118).
        bits[c] = if b == 0 { 0 } else { b - (8 << 7) };
        c += 1;
    }
    bits
});

/// The table registers of a widening.
#[derive(Clone, Copy)]
struct Regs {
    lo: [__m512i; 2],
    hi: [__m512i; 2],
    sign: __m512i,
    high_words: __m512i,
}

impl Regs {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
    fn new() -> Self {
        let (lo, hi) = TABLES.registers();
        Regs {
            lo,
            hi,
            sign: _mm512_set1_epi8(i8::MIN),
            high_words: _mm512_set1_epi32(0xffff_0000u32 as i32),
        }
    }

    /// The 64 codes of `x` as f32 values over 2^8, in the quad order ([`quad_code`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
    fn widen(&self, x: __m512i) -> [__m512; 4] {
        let lo = _mm512_permutex2var_epi8(self.lo[0], x, self.lo[1]);
        let hi = _mm512_permutex2var_epi8(self.hi[0], x, self.hi[1]);
        // hi | (x & sign)
        let hi = _mm512_ternarylogic_epi32::<0xf8>(hi, x, self.sign);
        let (a, b) = (_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi));
        let f = _mm512_castsi512_ps;
        [
            f(_mm512_slli_epi32::<16>(a)),
            f(_mm512_and_si512(a, self.high_words)),
            f(_mm512_slli_epi32::<16>(b)),
            f(_mm512_and_si512(b, self.high_words)),
        ]
    }
}

/// The code (`0..64`) of a 64-code run that element `e` of widened vector `u` holds: in
/// 128-bit lane `L = e / 4`, element `i = e % 4`, code `16 L + 8 (u / 2) + 2 i + u % 2`.
pub(crate) const fn quad_code(u: usize, e: usize) -> usize {
    let (l, i) = (e / 4, e % 4);
    16 * l + 8 * (u / 2) + 2 * i + u % 2
}

/// The query rows of each head tile (as [`super::query::interleave_query`] cuts them:
/// per KV head, tiles of up to `tile` heads) with each dimension repeated 4 times: tile
/// `qh .. qh + h` occupies `out[4 qh d .. 4 (qh + h) d]` as `d / 4` groups of `h`
/// vectors of 16, vector `(k, j)` holding `q_j[4k + L]` in lane `L`'s four elements.
/// Dimension `i` of head `j` is element `4 (i % 4)` of vector `(i / 4, j)`.
pub(crate) fn lane_query(q: &[f32], d: usize, g: usize, tile: usize) -> Vec<f32> {
    assert!(d.is_multiple_of(4) && g > 0 && tile > 0);
    let mut out = vec![0f32; 4 * q.len()];
    for (kv, group) in q.chunks_exact(g * d).enumerate() {
        for j0 in (0..g).step_by(tile) {
            let h = (g - j0).min(tile);
            let base = 4 * (kv * g + j0) * d;
            for j in 0..h {
                let row = &group[(j0 + j) * d..(j0 + j + 1) * d];
                repeat_in_lanes::<f32, { W / 4 }>(&mut out, base + j * W, h * W, row);
            }
        }
    }
    out
}

/// Sums the four lanes of each of `s` (four sums per lane: tokens `{0,2,4,6}`,
/// `{1,3,5,7}`, `{8,..,14}`, `{9,..,15}`) and returns the 16 tokens in order: six
/// `vshuff32x4`, three adds and one `vpermps`.
#[inline]
#[target_feature(enable = "avx512f")]
fn lanes_to_tokens(s: [__m512; 4]) -> __m512 {
    // [A0+A1, A2+A3, B0+B1, B2+B3] and the same of C, D.
    let ab = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(s[0], s[1]), _mm512_shuffle_f32x4::<0xdd>(s[0], s[1]));
    let cd = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(s[2], s[3]), _mm512_shuffle_f32x4::<0xdd>(s[2], s[3]));
    // Lane u = the sum of vector u's lanes.
    let r = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(ab, cd), _mm512_shuffle_f32x4::<0xdd>(ab, cd));
    // Token t is element i of lane u with quad_code(u, i) = t.
    const IDX: [i32; 16] = {
        let mut x = [0; 16];
        let mut t = 0;
        while t < 16 {
            x[t] = (4 * (2 * (t / 8) + t % 2) + (t % 8) / 2) as i32;
            t += 1;
        }
        x
    };
    // SAFETY: a 16-element array.
    _mm512_permutexvar_ps(unsafe { _mm512_loadu_si512(IDX.as_ptr().cast()) }, r)
}

/// Scores of the f32 query on the table-widened keys ([`lane_query`] rows).
pub(crate) struct TableScores<'a> {
    q: &'a [f32],
}

impl<E: Elem> Scores<Avx512, E> for TableScores<'_> {
    /// A whole chunk: runs of 4 dimension rows widened once, one FMA per widened vector
    /// and head, the lanes summed at the end. A partial one: [`load`]'s masked rows, the
    /// query elements broadcast from the same layout.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,fma,f16c")]
    unsafe fn scores<const H: usize>(&self, _: Avx512, c: &Chunk<E>, qh: usize, next_k: Stream<E>) -> [__m512; H] {
        let (d, mask) = (c.d, chunk_mask(c));
        // K rows are 16 codes apart: run k is codes 64 k .. 64 k + 64 < 16 d <= kt.len();
        // a partial chunk's last unmasked lane (d - 1) * 16 + c0 + lanes - 1 < 16 d. The
        // tile's query vectors: (d / 4) * H of 16 f32 from 4 qh d.
        assert!(E::DTYPE == DType::E4M3 && c.bs == BLOCK && d.is_multiple_of(RUN));
        assert!(c.kt.len() >= d * BLOCK && c.c0 + c.lanes <= BLOCK && self.q.len() >= 4 * (qh + H) * d);
        let qp = self.q[4 * qh * d..].as_ptr();
        let kp = c.kt.as_ptr().cast::<u8>();
        let mut pf = Prefetcher::<true>::with(next_k, d / 4);
        if mask != 0xffff {
            let mut s = [[_mm512_setzero_ps(); H]; 2];
            for i in 0..d {
                pf.step();
                // SAFETY: row i < d at lanes c0 .. c0 + lanes (masked), inside kt; query
                // element ((i / 4) * H + j) * 16 + 4 (i % 4) < 4 H d past qp.
                unsafe {
                    let k = load(c.kt.as_ptr().add(i * BLOCK + c.c0), mask);
                    for j in 0..H {
                        let qv = _mm512_set1_ps(*qp.add(((i / 4) * H + j) * W + 4 * (i % 4)));
                        s[i % 2][j] = _mm512_fmadd_ps(qv, k, s[i % 2][j]);
                    }
                }
            }
            let mut out = [_mm512_setzero_ps(); H];
            for j in 0..H {
                out[j] = _mm512_add_ps(s[0][j], s[1][j]);
            }
            return out;
        }
        let t = Regs::new();
        let mut s = [[_mm512_setzero_ps(); 4]; H];
        let (mut kr, mut qr) = (kp, qp);
        for _ in 0..d / 4 {
            // SAFETY: run k = (kr - kp) / 64 < d / 4 (64 bytes inside kt, see above);
            // query vectors k * H + j < (d / 4) * H past qp (qr = qp + 16 k H).
            unsafe {
                let x = t.widen(_mm512_loadu_si512(kr.cast()));
                pf.step();
                for j in 0..H {
                    let qv = _mm512_loadu_ps(qr.add(j * W));
                    for u in 0..4 {
                        s[j][u] = _mm512_fmadd_ps(qv, x[u], s[j][u]);
                    }
                }
            }
            kr = kr.wrapping_add(RUN);
            qr = qr.wrapping_add(H * W);
        }
        let mut out = [_mm512_setzero_ps(); H];
        for j in 0..H {
            out[j] = lanes_to_tokens(s[j]);
        }
        out
    }
}

/// `P V` on the table-widened values, the accumulators in the quad order.
pub(crate) struct TablePv;

impl<E: Elem> Pv<Avx512, E> for TablePv {
    #[inline(always)]
    fn takes(&self, d: usize) -> bool {
        E::DTYPE == DType::E4M3 && d.is_multiple_of(RUN)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,fma,f16c")]
    unsafe fn pv<const H: usize>(
        &self,
        _: Avx512,
        c: &Chunk<E>,
        acc: &mut [f32],
        probs: &[[f32; W]; HT],
        alpha: &[f32; H],
        rescale: bool,
        next: [Stream<E>; 2],
    ) {
        // 128 dimensions per pass for 1-2 heads (8 vectors each), else 64.
        // SAFETY: the features are ours; `pass` checks its bounds.
        unsafe {
            if H <= 2 && c.d.is_multiple_of(2 * RUN) {
                pass::<E, H, 2>(c, acc, probs, alpha, rescale, next);
            } else {
                pass::<E, H, 1>(c, acc, probs, alpha, rescale, next);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,fma,f16c")]
    unsafe fn finish(&self, acc: &mut [f32], d: usize) {
        debug_assert!(d.is_multiple_of(RUN) && acc.len().is_multiple_of(d));
        for s in acc.chunks_exact_mut(RUN) {
            let mut held = [0f32; RUN];
            held.copy_from_slice(s);
            for u in 0..4 {
                for e in 0..W {
                    s[quad_code(u, e)] = held[u * W + e];
                }
            }
        }
    }
}

/// `acc[j] = alpha[j] * acc[j] + sum_t probs[j][t] v_t` (without `alpha` unless
/// `rescale`) over the chunk's token rows, `R` runs of 64 elements per pass (4 R
/// accumulator vectors per head in registers), each run widened once for the `H` heads.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512vbmi and fma.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,fma,f16c")]
unsafe fn pass<E: Elem, const H: usize, const R: usize>(
    c: &Chunk<E>,
    acc: &mut [f32],
    probs: &[[f32; W]; HT],
    alpha: &[f32; H],
    rescale: bool,
    next: [Stream<E>; 2],
) {
    let d = c.d;
    assert!(H <= HT && d.is_multiple_of(R * RUN) && acc.len() == H * d);
    assert!(c.lanes <= W && (c.c0 + c.lanes) * d <= c.vt.len());
    let steps = d / (R * RUN) * c.lanes;
    let mut pf = [Prefetcher::<true>::with(next[0], steps), Prefetcher::<true>::with(next[1], steps)];
    let t = Regs::new();
    let ap = acc.as_mut_ptr();
    let mut u0 = 0;
    // SAFETY: every access below: accumulator row j < H, elements u0 .. u0 + 64 R <= d
    // (d a multiple of 64 R), so below H d = acc.len(); V row c0 + t < c0 + lanes (inside
    // vt, asserted), elements u0 .. u0 + 64 R <= d of it; probabilities j < H <= HT, t <
    // lanes <= 16. The features are this function's.
    unsafe {
        while u0 < d {
            let mut a = [[[_mm512_setzero_ps(); 4]; R]; H];
            for j in 0..H {
                let al = _mm512_set1_ps(alpha[j]);
                for r in 0..R {
                    for u in 0..4 {
                        a[j][r][u] = _mm512_loadu_ps(ap.add(j * d + u0 + r * RUN + u * W));
                        if rescale {
                            a[j][r][u] = _mm512_mul_ps(al, a[j][r][u]);
                        }
                    }
                }
            }
            let mut vr = c.vt.as_ptr().add(c.c0 * d + u0).cast::<u8>();
            for tk in 0..c.lanes {
                pf[0].step();
                pf[1].step();
                let mut v = [[_mm512_setzero_ps(); 4]; R];
                for r in 0..R {
                    v[r] = t.widen(_mm512_loadu_si512(vr.add(r * RUN).cast()));
                }
                for j in 0..H {
                    let pj = _mm512_set1_ps(*probs.get_unchecked(j).get_unchecked(tk));
                    for r in 0..R {
                        for u in 0..4 {
                            a[j][r][u] = _mm512_fmadd_ps(pj, v[r][u], a[j][r][u]);
                        }
                    }
                }
                vr = vr.add(d);
            }
            for j in 0..H {
                for r in 0..R {
                    for u in 0..4 {
                        _mm512_storeu_ps(ap.add(j * d + u0 + r * RUN + u * W), a[j][r][u]);
                    }
                }
            }
            u0 += R * RUN;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::elem::E4M3;

    fn vbmi() -> bool {
        crate::attention::isa::Isa::Avx512.supported() && crate::attention::isa::Features::cpu().has("avx512vbmi")
    }

    /// Every code at every position of a run widens to what [`load`] (the f16 route)
    /// reads, bit for bit, NaN codes included, at the element [`quad_code`] names.
    #[test]
    fn the_tables_read_every_code_as_the_f16_route() {
        if !vbmi() {
            eprintln!("SKIPPED: no avx512vbmi");
            return;
        }
        for shift in 0..4 {
            let codes: [u8; RUN] = std::array::from_fn(|i| (i * 4 + shift) as u8);
            let mut got = [[0f32; W]; 4];
            let mut want = [0f32; RUN];
            // SAFETY: the CPU has the features (checked); 64 readable bytes; the f16
            // route reads 16 codes per load inside the array.
            unsafe {
                let x = _mm512_loadu_si512(codes.as_ptr().cast());
                let v = Regs::new().widen(x);
                for u in 0..4 {
                    _mm512_storeu_ps(got[u].as_mut_ptr(), v[u]);
                }
                for r in 0..4 {
                    let e: *const E4M3 = codes[16 * r..].as_ptr().cast();
                    _mm512_storeu_ps(want[16 * r..].as_mut_ptr(), load(e, 0xffff));
                }
            }
            for u in 0..4 {
                for e in 0..W {
                    let code = quad_code(u, e);
                    assert_eq!(got[u][e].to_bits(), want[code].to_bits(), "code {:#04x}", codes[code]);
                }
            }
        }
    }

    /// [`quad_code`] is a bijection of each run, and [`lanes_to_tokens`] sums each
    /// token's four lanes into its own position.
    #[test]
    fn the_quad_order_covers_every_code_once_and_the_lane_sums_land_in_token_order() {
        let mut seen = [false; RUN];
        for u in 0..4 {
            for e in 0..W {
                assert!(!std::mem::replace(&mut seen[quad_code(u, e)], true));
            }
        }
        if !crate::attention::isa::Isa::Avx512.supported() {
            return;
        }
        // Lane L of vector u holds dimension L's partial sums of tokens quad_code(u, e) % 16.
        let vals: [[f32; W]; 4] = std::array::from_fn(|u| std::array::from_fn(|e| (quad_code(u, e) % 16) as f32 * 10.0 + (e / 4) as f32));
        let mut out = [0f32; W];
        // SAFETY: the CPU has avx512f (checked); 16-element arrays.
        unsafe {
            let s = vals.map(|v| _mm512_loadu_ps(v.as_ptr()));
            _mm512_storeu_ps(out.as_mut_ptr(), lanes_to_tokens(s));
        }
        for (t, &x) in out.iter().enumerate() {
            assert_eq!(x, 40.0 * t as f32 + 6.0, "token {t}");
        }
    }

    /// Each dimension of each head lands at element `4 (i % 4)` of its group's vector,
    /// repeated over its lane, per head tile.
    #[test]
    fn the_lane_query_repeats_each_dimension_in_its_lane() {
        let (d, g) = (8, 6);
        let q: Vec<f32> = (0..2 * g * d).map(|x| x as f32).collect();
        let out = lane_query(&q, d, g, 4);
        for kv in 0..2 {
            for (j0, h) in [(0, 4), (4, 2)] {
                for j in 0..h {
                    for i in 0..d {
                        let x = q[(kv * g + j0 + j) * d + i];
                        let at = 4 * (kv * g + j0) * d + ((i / 4) * h + j) * W + 4 * (i % 4);
                        assert_eq!(&out[at..at + 4], &[x; 4]);
                    }
                }
            }
        }
    }
}
