//! The minimal instruction sequence each AVX-512 decode path issues per cached code, on
//! one L1-resident tile (16 tokens x head_dim 128 of K, dimension-major, and of V,
//! token-major), without the softmax: what the kernel cannot do without, per code.
//!
//! Per 16 codes of a K row (one dimension, 16 tokens) and g query heads:
//! - `bf16`: `vpmovzxwd` + `vpslld` + g FMAs;
//! - `int8`: `vpmovsxbd` (from memory) + `vcvtdq2ps` + g FMAs;
//! - `e5m2`: a broadcast load + `vpshufb` + `vcvtph2ps` + g FMAs;
//! - `e4m3`: the kernel's conversion to f16 bit positions (`vpmovsxbw`, `vpsllw`, `vpand`,
//!   `vcvtph2ps`) + g FMAs, or with AVX-512 VBMI (the kernel's choice there) per 64 codes
//!   (4 rows) its table widening (2 `vpermi2b`, `vpternlogd`, 2 `vpunpck*bw`, 2 `vpslld`,
//!   2 `vpandd`) + 4 g FMAs with a query vector per head;
//! - `int8_scores`: per 64 codes (4 rows), one 64-byte load, the 4 x 4 byte transpose
//!   the dimension-major tile needs (`vpermd`, `vpshufb`), the +128 bias (`vpxord`) and g
//!   `vpdpbusd` (query words broadcast from memory);
//! - `*_bf16_scores`: per 32 codes (2 rows), bf16: one load + `vpermw` (pair interleave);
//!   fp8: one 32-byte load, 2 `vpermi2b` (low and high byte of the bf16), `vpternlogd`
//!   (sign), `vpermt2b` (pair interleave); then g `vdpbf16ps`.
//!
//! Per 16 codes of a V row (one token, 16 dimensions) and g heads: the same widening as
//! the dtype's K row (bf16: one `vpunpck{l,h}wd` against zero per 16, from a 64-byte
//! load) + g FMAs with the broadcast probability; the fast paths keep their dtype's V.
//!
//! The query elements are broadcast from memory per FMA, as in the kernel (128 of them
//! per head do not fit in registers); the accumulators are enough independent chains
//! (at least 8 per loop) that latency does not bound the loop. Each tile's K chains are
//! summed and stored once per head (the kernel's scores before its softmax), so none is
//! live across the V loop. Code values are normal numbers (no subnormal or NaN inputs).

// Register tiles are small fixed arrays indexed by head and row: index loops read best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::memory::{Ahead, Layout, Stream};
use super::widen::{Widen, I8};

/// head_dim and tokens of the tile.
pub const D: usize = 128;
pub const T: usize = 16;

/// One cache line of the tile buffers (64-byte aligned loads).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// The L1-resident tile of one path (at most 2 x 4 KiB of bf16 codes, 2 KiB of queries);
/// with `ST`, its K and V are read from memory instead, the next pair each round
/// (`dot_rates --stream`: [`Tile::streaming`]). The paths call [`Tile::next_tile`] at
/// each round's start and [`Tile::pump`] at each step of its K and V loops; both compile to nothing
/// without `ST`, so the L1 rates are those of the sequences alone.
pub struct Tile<const ST: bool = false> {
    k: Vec<Line>,
    v: Vec<Line>,
    q: Vec<f32>,
    pub(super) qw: Vec<u32>,
    pub(super) p: Vec<f32>,
    /// The probabilities as f16 (`fp16_reduction`'s `P V`).
    pub(super) ph: Vec<u16>,
    /// The f16 query vectors of `fp16_reduction` (one per 4 dimensions and head).
    qh: Vec<Line>,
    pub(super) acc: Vec<f32>,
    /// Each tile's scores, 16 per head (the K loop's chains summed, as the kernel does
    /// before the softmax: no K accumulator stays live across the V loop).
    sc: Vec<Line>,
    /// Where K and V come from instead of `k` and `v` when read from memory.
    stream: Option<Stream>,
}

impl Tile<false> {
    /// A tile of `bytes`-wide elements whose byte `i` is `code(i)` (for 4- and 2-byte
    /// elements: their high byte, the low bytes 0), queries and probabilities small.
    pub fn new(bytes: usize, code: impl Fn(usize) -> u8) -> Self {
        Self::build(bytes, code, None)
    }
}

impl Tile<true> {
    /// A tile of `bytes`-wide elements whose K and V come from `buf` laid out as
    /// `layout`, read from the runs `claim()` names, prefetching as `ahead` says
    /// ([`Stream`]).
    pub fn streaming(bytes: usize, buf: &'static [u8], layout: Layout, claim: fn() -> usize, ahead: &'static [Ahead]) -> Self {
        let stream = Stream::new(buf, layout, D * T * bytes, claim, ahead);
        let mut t = Self::build(bytes, |i| 0x3c + (i % 8) as u8, Some(stream));
        t.next_tile();
        t
    }
}

impl<const ST: bool> Tile<ST> {
    /// [`Tile::new`]'s tile, reading K and V from `stream` when there is one.
    fn build(bytes: usize, code: impl Fn(usize) -> u8, stream: Option<Stream>) -> Self {
        let lines = D * T * bytes / 64;
        let fill = |salt: usize| {
            let mut v = vec![Line([0; 64]); lines];
            for (i, b) in v.iter_mut().flat_map(|l| l.0.iter_mut()).enumerate() {
                *b = if i % bytes == bytes - 1 { code(i / bytes + salt) } else { 0 };
            }
            v
        };
        Tile {
            k: fill(0),
            v: fill(7),
            q: (0..4 * D).map(|i| 1e-3 * (1 + i % 5) as f32).collect(),
            qw: (0..4 * D).map(|i| 0x3a83_0102u32.wrapping_add(i as u32 % 3)).collect(),
            p: (0..4 * T).map(|i| 1e-3 * (1 + i % 3) as f32).collect(),
            // f16 1e-3 times 1..3 (0x1419: about 1e-3), and 2^-10 times 1..5 for the query.
            ph: (0..4 * T).map(|i| 0x1419 + (i % 3) as u16).collect(),
            qh: (0..D / 4 * 4).map(|i| Line([0x10, 0x10 + (i % 5) as u8].repeat(32).try_into().expect("64 bytes"))).collect(),
            acc: vec![0.0; 4 * D],
            sc: vec![Line([0; 64]); 4],
            stream,
        }
    }

    /// Moves a streaming tile to its next K, V pair (nothing for an L1-resident one).
    #[inline(always)]
    pub fn next_tile(&mut self) {
        if !ST {
            return;
        }
        if let Some(s) = &mut self.stream {
            s.advance();
        }
    }

    /// One step of the tile's K loop (`LOOP` 0) or V loop (1): the spread prefetches'
    /// next lines (nothing for an L1-resident tile or without spread prefetches).
    #[inline(always)]
    pub fn pump<const LOOP: usize>(&self) {
        if !ST {
            return;
        }
        if let Some(s) = &self.stream {
            s.pump(LOOP);
        }
    }

    /// The loops' bounds: K and V hold `D x T` elements of `bytes`, the queries,
    /// probabilities and accumulators 4 heads' worth (the runs take g <= 4).
    pub(super) fn check(&self, bytes: usize) {
        assert!(self.k.len() * 64 == D * T * bytes && self.v.len() == self.k.len());
        assert!(self.q.len() == 4 * D && self.qw.len() == 4 * D && self.p.len() == 4 * T && self.acc.len() == 4 * D);
        assert!(self.sc.len() == 4 && self.ph.len() == 4 * T && self.qh.len() == D);
    }

    /// The f16 query vectors (`D / 4` per head, 4 heads).
    pub(super) fn qhp(&self) -> *const u8 {
        self.qh.as_ptr().cast()
    }

    /// The tile's score lines (16 f32 per head).
    pub(super) fn scp(&mut self) -> *mut f32 {
        self.sc.as_mut_ptr().cast()
    }

    /// Bytes of one K (or V) tile.
    pub(super) fn tile_bytes(&self) -> usize {
        self.k.len() * 64
    }

    pub(super) fn kp(&self) -> *const u8 {
        match &self.stream {
            Some(s) if ST => s.kv()[0],
            _ => self.k.as_ptr().cast(),
        }
    }

    pub(super) fn vp(&self) -> *const u8 {
        match &self.stream {
            Some(s) if ST => s.kv()[1],
            _ => self.v.as_ptr().cast(),
        }
    }
}

/// Which loops a run covers: K (scores), V (`P V`) or both per tile, as the kernel does.
pub const K: u8 = 1;
pub const V: u8 = 2;
pub const KV: u8 = 3;

/// The exact paths' K loop: N rows widened, then G x N FMAs (N x G chains).
#[inline(always)]
pub(super) unsafe fn k_exact<W: Widen, const G: usize, const N: usize, const ST: bool>(t: &Tile<ST>, s: &mut [[__m512; G]; N]) {
    let (kp, qp) = (t.kp(), t.q.as_ptr());
    let mut i = 0;
    while i < D {
        t.pump::<0>();
        // SAFETY: rows i + r < D of 16 elements inside k; query elements j * D + i + r < 4 D.
        unsafe {
            let mut k = [_mm512_setzero_ps(); N];
            let mut r = 0;
            if W::QUADS {
                // The kernel's K runs (`avx512_e4m3.rs`; N a multiple of 4): four rows per widening, one query
                // vector per head and run (its lanes' dimensions, read from the buffer:
                // the values do not matter for the rate), one FMA per vector and head.
                while r + 3 < N {
                    let kq = W::k4(kp.add((i + r) * T * W::BYTES));
                    for j in 0..G {
                        let qv = _mm512_loadu_ps(qp.add(j * D + (i + r) % 64));
                        for u in 0..4 {
                            s[r + u][j] = _mm512_fmadd_ps(qv, kq[u], s[r + u][j]);
                        }
                    }
                    r += 4;
                }
                i += N;
                continue;
            }
            while G <= W::PAIRS_UP_TO_G && r + 1 < N {
                [k[r], k[r + 1]] = W::k2(kp.add((i + r) * T * W::BYTES), T * W::BYTES);
                r += 2;
            }
            while r < N {
                k[r] = W::k16(kp.add((i + r) * T * W::BYTES));
                r += 1;
            }
            for j in 0..G {
                for r in 0..N {
                    s[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(*qp.add(j * D + i + r)), k[r], s[r][j]);
                }
            }
        }
        i += N;
    }
}

/// The V loop: 16 tokens x VT vectors of 16 dimensions per block, G x VT accumulators
/// loaded and stored once per block (the kernel's per-chunk accumulators).
#[inline(always)]
unsafe fn v_loop<W: Widen, const G: usize, const VT: usize, const ST: bool>(t: &mut Tile<ST>) {
    let (vp, pp, ap) = (t.vp(), t.p.as_ptr(), t.acc.as_mut_ptr());
    let mut u0 = 0;
    while u0 < D {
        // SAFETY: accumulator rows j < G <= 4 of D floats; u0 + 16 VT <= D (D a multiple
        // of 16 VT); V rows tk < T of D elements; probabilities j * T + tk < 4 T.
        unsafe {
            let mut a = [[_mm512_setzero_ps(); VT]; G];
            for j in 0..G {
                for u in 0..VT {
                    a[j][u] = _mm512_loadu_ps(ap.add(j * D + u0 + 16 * u));
                }
            }
            for tk in 0..T {
                t.pump::<1>();
                let row = vp.add((tk * D + u0) * W::BYTES);
                let mut v = [_mm512_setzero_ps(); VT];
                let mut u = 0;
                while W::QUADS && u + 3 < VT {
                    [v[u], v[u + 1], v[u + 2], v[u + 3]] = W::v64(row.add(16 * u * W::BYTES));
                    u += 4;
                }
                while u < VT {
                    let p = row.add(16 * u * W::BYTES);
                    let x = if G <= W::PAIRS_UP_TO_G { W::v32(p) } else { [W::k16(p), W::k16(p.add(16 * W::BYTES))] };
                    (v[u], v[u + 1]) = (x[0], x[1]);
                    u += 2;
                }
                for j in 0..G {
                    let pj = _mm512_set1_ps(*pp.add(j * T + tk));
                    for u in 0..VT {
                        a[j][u] = _mm512_fmadd_ps(pj, v[u], a[j][u]);
                    }
                }
            }
            for j in 0..G {
                for u in 0..VT {
                    _mm512_storeu_ps(ap.add(j * D + u0 + 16 * u), a[j][u]);
                }
            }
        }
        u0 += 16 * VT;
    }
}

/// Sum the N chains of each of G heads and store the scores (f32 lanes).
#[inline(always)]
pub(super) unsafe fn store_f32<const G: usize, const N: usize, const ST: bool>(t: &mut Tile<ST>, s: [[__m512; G]; N]) {
    for j in 0..G {
        let mut x = s[0][j];
        for r in 1..N {
            x = _mm512_add_ps(x, s[r][j]);
        }
        // SAFETY: head j < G <= 4 of the 4 score lines.
        unsafe { _mm512_storeu_ps(t.sc.as_mut_ptr().add(j).cast(), x) };
    }
}

/// Sum the N chains of each of G heads and store the scores (i32 lanes).
#[inline(always)]
unsafe fn store_i32<const G: usize, const N: usize, const ST: bool>(t: &mut Tile<ST>, s: [[__m512i; G]; N]) {
    for j in 0..G {
        let mut x = s[0][j];
        for r in 1..N {
            x = _mm512_add_epi32(x, s[r][j]);
        }
        // SAFETY: head j < G <= 4 of the 4 score lines.
        unsafe { _mm512_storeu_si512(t.sc.as_mut_ptr().add(j).cast(), x) };
    }
}

/// `n` tiles of an exact path (part `P`): K by f32 FMAs on the widened rows, V as [`v_loop`].
///
/// # Safety
/// AVX-512 F/BW/VL, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub unsafe fn exact<W: Widen, const G: usize, const N: usize, const VT: usize, const P: u8, const ST: bool>(t: &mut Tile<ST>, n: u64) {
    // SAFETY: the features are this function's.
    unsafe { exact_body::<W, G, N, VT, P, ST>(t, n) }
}

/// [`exact`]'s loop, with no target features of its own so that `#[inline(always)]` puts
/// it into each caller, compiled with that caller's features.
///
/// # Safety
/// The caller's features include `W`'s widening's.
#[inline(always)]
unsafe fn exact_body<W: Widen, const G: usize, const N: usize, const VT: usize, const P: u8, const ST: bool>(t: &mut Tile<ST>, n: u64) {
    const { assert!(G <= 4 && D.is_multiple_of(N) && D.is_multiple_of(16 * VT) && VT.is_multiple_of(2)) };
    t.check(W::BYTES);
    for _ in 0..n {
        // Opaque each round (as if the tile changed), so no load is hoisted out of the loop.
        let t = std::hint::black_box(&mut *t);
        t.next_tile();
        // SAFETY: the caller's features; the loops stay inside the tile.
        unsafe {
            if P & K != 0 {
                let mut s = [[_mm512_setzero_ps(); G]; N];
                k_exact::<W, G, N, ST>(t, &mut s);
                store_f32(t, s);
            }
            if P & V != 0 {
                v_loop::<W, G, VT, ST>(t);
            }
        }
    }
}

/// [`exact`] compiled with AVX-512 VBMI too (the e4m3 table widening).
///
/// # Safety
/// AVX-512 F/BW/VL/VBMI, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,fma,f16c")]
pub unsafe fn exact_vbmi<W: Widen, const G: usize, const N: usize, const VT: usize, const P: u8, const ST: bool>(t: &mut Tile<ST>, n: u64) {
    // SAFETY: the features are this function's.
    unsafe { exact_body::<W, G, N, VT, P, ST>(t, n) }
}

/// `vpermd` indices of the 4 x 4 transpose: dword `4 L + r` takes dword `4 r + L`.
const fn gather() -> [i32; 16] {
    let mut x = [0; 16];
    let mut i = 0;
    while i < 16 {
        x[i] = (4 * (i % 4) + i / 4) as i32;
        i += 1;
    }
    x
}

/// `vpshufb` indices (per 128-bit lane): byte `4 j + r` takes byte `4 r + j`.
const fn transpose() -> [i8; 64] {
    let mut x = [0; 64];
    let mut i = 0;
    while i < 64 {
        x[i] = (4 * (i % 16 % 4) + i % 16 / 4) as i8;
        i += 1;
    }
    x
}

static GATHER: [i32; 16] = gather();
static TRANSPOSE: [i8; 64] = transpose();

/// `n` tiles of `int8_scores` (part `P`): per 4 K rows one 64-byte load, `vpermd` +
/// `vpshufb` (token-major quads) + `vpxord` (+128), then G `vpdpbusd`; N quads per
/// step (N x G chains); V as the int8 exact path.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub unsafe fn int8_scores<const G: usize, const N: usize, const VT: usize, const P: u8, const ST: bool>(t: &mut Tile<ST>, n: u64) {
    const { assert!(G <= 4 && (D / 4).is_multiple_of(N) && D.is_multiple_of(16 * VT) && VT.is_multiple_of(2)) };
    t.check(1);
    for _ in 0..n {
        // Opaque each round (as if the tile changed), so no load is hoisted out of the loop.
        let t = std::hint::black_box(&mut *t);
        t.next_tile();
        // SAFETY: the features are this function's; the loops stay inside the tile.
        unsafe {
            if P & K != 0 {
                k_dot::<G, N, ST>(t);
            }
            if P & V != 0 {
                v_loop::<I8, G, VT, ST>(t);
            }
        }
    }
}

/// `int8_scores`' K loop: per 4 K rows one 64-byte load, `vpermd` + `vpshufb` + `vpxord`,
/// then G `vpdpbusd`; N quads per step (N x G chains); the scores stored per head.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI (the caller's features; inlined).
#[inline(always)]
pub(super) unsafe fn k_dot<const G: usize, const N: usize, const ST: bool>(t: &mut Tile<ST>) {
    // SAFETY: both tables hold 64 bytes.
    let (gi, ti) = unsafe { (_mm512_loadu_si512(GATHER.as_ptr().cast()), _mm512_loadu_si512(TRANSPOSE.as_ptr().cast())) };
    let bias = _mm512_set1_epi8(-128);
    let mut s = [[_mm512_setzero_si512(); G]; N];
    let (kp, qp) = (t.kp(), t.qw.as_ptr());
    let mut k = 0;
    while k < D / 4 {
        t.pump::<0>();
        // SAFETY: quads k + r < D / 4 of 64 bytes inside k; query words
        // j * D / 4 + k + r < 4 D.
        unsafe {
            let mut x = [_mm512_setzero_si512(); N];
            for r in 0..N {
                let raw = _mm512_loadu_si512(kp.add(64 * (k + r)).cast());
                x[r] = _mm512_xor_si512(_mm512_shuffle_epi8(_mm512_permutexvar_epi32(gi, raw), ti), bias);
            }
            for j in 0..G {
                for r in 0..N {
                    let qw = _mm512_set1_epi32(*qp.add(j * D / 4 + k + r) as i32);
                    s[r][j] = _mm512_dpbusd_epi32(s[r][j], x[r], qw);
                }
            }
        }
        k += N;
    }
    // SAFETY: the caller's features.
    unsafe { store_i32(t, s) };
}

/// The 512-bit bf16-pair type of `vdpbf16ps`, from integer lanes.
#[inline(always)]
fn bh(x: __m512i) -> __m512bh {
    // SAFETY: 64 bytes of plain data either way.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// `vpermw` indices: word `w` of a pair vector takes row word `w / 2` (row i) or `16 +
/// w / 2` (row i + 1).
static PAIR: [i16; 32] = {
    let mut x = [0i16; 32];
    let mut w = 0;
    while w < 32 {
        x[w] = (w / 2) as i16 + if w % 2 == 1 { 16 } else { 0 };
        w += 1;
    }
    x
};

/// `vpermt2b` indices interleaving the low-byte (0..32) and high-byte (64..) lookups of
/// 32 codes into bf16 pairs: byte `b` is row `b % 4 / 2`'s code `b / 4`, low or high.
static INTERLEAVE: [u8; 64] = {
    let mut x = [0u8; 64];
    let mut b = 0;
    while b < 64 {
        x[b] = (b / 4) as u8 + if b % 4 >= 2 { 16 } else { 0 } + if b % 2 == 1 { 64 } else { 0 };
        b += 1;
    }
    x
};

/// `n` tiles of `bf16_scores` (part `P`) on a bf16 (`FP8 = false`) or fp8 cache: per 2 K
/// rows (32 codes) a pair vector (bf16: one 64-byte load + `vpermw`; fp8: one 32-byte
/// load, 2 `vpermi2b`, `vpternlogd`, `vpermt2b`), then G `vdpbf16ps`; N pairs per step;
/// V as the dtype `W`'s exact path.
///
/// # Safety
/// AVX-512 F/BW/VL/BF16/VBMI, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,fma,f16c")]
pub unsafe fn bf16_scores<W: Widen, const FP8: bool, const G: usize, const N: usize, const VT: usize, const P: u8, const ST: bool>(
    t: &mut Tile<ST>,
    n: u64,
) {
    const { assert!(G <= 4 && (D / 2).is_multiple_of(N) && D.is_multiple_of(16 * VT) && VT.is_multiple_of(2)) };
    t.check(W::BYTES);
    // Tables of normal bf16 values (the widening's cost does not depend on them).
    let lo = [_mm512_set1_epi8(0x10), _mm512_set1_epi8(0x20)];
    let hi = [_mm512_set1_epi8(0x3c), _mm512_set1_epi8(0x3e)];
    let sign = _mm512_set1_epi8(i8::MIN);
    // SAFETY: each table holds 64 bytes.
    let (pair, inter) = unsafe { (_mm512_loadu_si512(PAIR.as_ptr().cast()), _mm512_loadu_si512(INTERLEAVE.as_ptr().cast())) };
    for _ in 0..n {
        // Opaque each round (as if the tile changed), so no load is hoisted out of the loop.
        let t = std::hint::black_box(&mut *t);
        t.next_tile();
        if P & K != 0 {
            let mut s = [[_mm512_setzero_ps(); G]; N];
            let (kp, qp) = (t.kp(), t.qw.as_ptr());
            let mut i = 0;
            while i < D / 2 {
                t.pump::<0>();
                // SAFETY: row pairs i + r < D / 2 of 32 elements inside k; query pairs
                // j * D / 2 + i + r < 4 D.
                unsafe {
                    let mut x = [_mm512_setzero_si512(); N];
                    for r in 0..N {
                        x[r] = if FP8 {
                            let c = _mm512_castsi256_si512(_mm256_loadu_si256(kp.add(32 * (i + r)).cast()));
                            let l = _mm512_permutex2var_epi8(lo[0], c, lo[1]);
                            let h = _mm512_ternarylogic_epi32::<0xf8>(_mm512_permutex2var_epi8(hi[0], c, hi[1]), c, sign);
                            _mm512_permutex2var_epi8(l, inter, h)
                        } else {
                            _mm512_permutexvar_epi16(pair, _mm512_loadu_si512(kp.add(64 * (i + r)).cast()))
                        };
                    }
                    for j in 0..G {
                        for r in 0..N {
                            let qp2 = bh(_mm512_set1_epi32(*qp.add(j * D / 2 + i + r) as i32));
                            s[r][j] = _mm512_dpbf16_ps(s[r][j], bh(x[r]), qp2);
                        }
                    }
                }
                i += N;
            }
            // SAFETY: the features are this function's.
            unsafe { store_f32(t, s) };
        }
        if P & V != 0 {
            // SAFETY: the features are this function's; the loop stays inside the tile.
            unsafe { v_loop::<W, G, VT, ST>(t) };
        }
    }
}

/// The kernel's `exp2` instruction sequence (the compare for lanes below
/// `EXP2_ZERO_BELOW`, clamp, round, subtract, 7 FMAs of the degree-7 polynomial,
/// `vscalefps` zeroing those lanes: 12 instructions per 16 scores) on `n` x 8
/// independent vectors of 16 scores read from L1, summed (one add each) so nothing is
/// dead.
///
/// # Safety
/// AVX-512 F.
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn exp2(x: &[f32; 128], n: u64) {
    let mut c = [1f32; 8];
    for k in 1..8 {
        c[k] = c[k - 1] * std::f32::consts::LN_2 / k as f32;
    }
    let mut sum = [_mm512_setzero_ps(); 8];
    for _ in 0..n {
        // Opaque each round, so the loads and the polynomial are not hoisted out of the loop.
        let xs = std::hint::black_box(x);
        for v in 0..8 {
            // SAFETY: vector v < 8 of 16 floats inside x.
            let x = unsafe { _mm512_loadu_ps(xs.as_ptr().add(16 * v)) };
            let keep = !_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-64.0));
            let x = _mm512_max_ps(x, _mm512_set1_ps(-64.0));
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            let f = _mm512_sub_ps(x, r);
            let mut p = _mm512_set1_ps(c[7]);
            for &ck in c[..7].iter().rev() {
                p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(ck));
            }
            sum[v] = _mm512_add_ps(sum[v], _mm512_maskz_scalef_ps(keep, p, r));
        }
    }
    std::hint::black_box(sum);
}

/// Instructions of the exp2 sequence per 16 scores (see [`exp2`]).
pub const EXP2_INSTR: u32 = 12;
