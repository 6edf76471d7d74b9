//! One work item: gather its query rows, walk its keys in tiles of [`TW`], pack each tile
//! of K and V into contiguous f32 (or bf16 pairs for `vdpbf16ps`), and run the path's
//! micro-kernels: scores, mask (partial tiles only), online softmax, `P V`.
//!
//! 8-bit caches are dequantized in the pack (code as f32 times its scale, one f32
//! multiply per element, read once per item; [`super::pack_q8`]), so every path's
//! micro-kernels run on the same f32 values as the scalar reference.
//!
//! The pack is what makes the micro-kernels independent of the block size and dtype:
//! each K/V element of the tile is read from the cache once per item and reused by all
//! of its rows (64 by default), so the copy costs a few percent of the arithmetic.

use super::mask::{cover, Cover};
use super::pack_q8::{self, same, Dst, Lut};
use super::plan::Item;
use super::plan::TW;
use super::simd::on_path;
#[cfg(target_arch = "x86_64")]
use crate::attention::isa::Isa;
use crate::attention::isa::Supported;
use crate::attention::tables::Visible;
use super::mask::Span;
use crate::kv::quant::{Scales, TileScale};
use crate::kv::Elem;

/// Everything an item needs, shared by all threads.
pub(crate) struct Ctx<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    /// The layer's scales (8-bit caches), applied by the pack.
    pub scales: Scales<'a>,
    pub shape: crate::kv::KvShape,
    /// The keys some query of each sequence sees, with their checked blocks.
    pub vis: &'a Visible,
    /// `head_dim` zeros: the V row packed for a key no query sees (bf16 probabilities' path).
    pub zeros: &'a [E],
    pub hq: usize,
    pub g: usize,
    /// Query rows pre-scaled (see [`crate::attention::query::scaled_query`]).
    pub qs: &'a [f32],
    /// bf16 query pairs for `vdpbf16ps` and the factor to apply to their dot products.
    pub q_bf16: Option<(&'a [u32], f32)>,
    /// Per query row, the keys it sees.
    pub spans: &'a [Span],
    /// The path (the route's; a `Supported` proves the CPU runs it).
    pub path: Supported,
    pub soft_cap: Option<f32>,
    /// How `P V` runs: f32, f32 on bf16-rounded probabilities, or `vdpbf16ps`.
    pub pv: PvMode,
}

/// How `P V` is computed (see [`PrefillOptions::precision`](super::PrefillOptions::precision)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PvMode {
    F32,
    RoundedF32,
    Dot,
}



/// The online-softmax state of an item's rows: `acc` rows of `d`, `m` (log2 units), `l`.
pub(crate) struct Partial<'a> {
    pub acc: &'a mut [f32],
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
}

/// Per-thread buffers, reused across items.
pub(crate) struct Scratch {
    /// The item's query rows `[rows][d]` (pre-scaled).
    q: Vec<f32>,
    /// Its bf16 query pairs `[rows][ceil(d / 2)]` (`vdpbf16ps` path only).
    qb: Vec<u32>,
    /// K tile `[d][TW]` f32.
    kp: Vec<f32>,
    /// K tile as bf16 pairs `[ceil(d / 2)][TW]` (`vdpbf16ps` path only).
    kpb: Vec<u32>,
    /// V tile `[TW][d]` f32.
    vp: Vec<f32>,
    /// V tile as bf16 token pairs `[TW / 2][d]` (`vdpbf16ps` `P V` only).
    vpb: Vec<u32>,
    /// Scores, then probabilities, `[rows][TW]`.
    s: Vec<f32>,
    alpha: Vec<f32>,
    /// fp8: the code values times the head's scales.
    lut: Lut,
}

impl Scratch {
    pub fn new(d: usize) -> Self {
        Self {
            q: Vec::new(),
            qb: Vec::new(),
            kp: vec![0.0; d * TW],
            kpb: vec![0; d.div_ceil(2) * TW],
            vp: vec![0.0; d * TW],
            vpb: vec![0; d * TW / 2],
            s: Vec::new(),
            alpha: Vec::new(),
            lut: Lut::new(),
        }
    }
}

pub(crate) fn run_item<E: Elem>(ctx: &Ctx<E>, it: &Item, p: &mut Partial, sc: &mut Scratch) {
    let (d, g, hq) = (ctx.shape.head_dim, ctx.g, ctx.hq);
    let rows = (it.q1 - it.q0) * g;
    let dp = d.div_ceil(2);
    sc.q.clear();
    sc.qb.clear();
    for qi in it.q0..it.q1 {
        let at = qi * hq + it.head * g;
        sc.q.extend_from_slice(&ctx.qs[at * d..(at + g) * d]);
        if let Some((qb, _)) = ctx.q_bf16 {
            sc.qb.extend_from_slice(&qb[at * dp..(at + g) * dp]);
        }
    }
    sc.s.resize(rows * TW, 0.0);
    sc.alpha.resize(rows, 1.0);
    p.acc.fill(0.0);
    p.m.fill(f32::NEG_INFINITY);
    p.l.fill(0.0);
    let spans = &ctx.spans[it.q0..it.q1];
    // No row sees the keys between the last sink and the first window start (a long
    // sequence's released middle): jump over them rather than classify their tiles, so
    // the walk does not grow with the logical length.
    let sink_end = spans.iter().map(|s| s.sink_end).max().unwrap_or(0);
    let lo = spans.iter().filter(|s| s.lo < s.hi).map(|s| s.lo).min().unwrap_or(usize::MAX);
    let mut t0 = it.k0;
    while t0 < it.k1 {
        if (sink_end..lo).contains(&t0) {
            t0 = lo;
            continue;
        }
        let t1 = it.k1.min(t0 + TW);
        let how = cover(spans, t0, t1);
        if how != Cover::Empty {
            pack(ctx, it, t0, t1, sc);
            let ntok = t1 - t0;
            scores(ctx, sc, rows, ntok);
            if let Some(cap) = ctx.soft_cap {
                for row in sc.s.chunks_mut(TW) {
                    row[..ntok].iter_mut().for_each(|x| *x = cap * (*x / cap).tanh() * std::f32::consts::LOG2_E);
                }
            }
            if how == Cover::Partial {
                for (span, rs) in spans.iter().zip(sc.s.chunks_mut(g * TW)) {
                    for row in rs.chunks_mut(TW) {
                        for (t, x) in row[..ntok].iter_mut().enumerate() {
                            if !span.contains(t0 + t) {
                                *x = f32::NEG_INFINITY;
                            }
                        }
                    }
                }
            }
            softmax_pv(ctx, sc, rows, ntok, d, p);
        }
        t0 = t1;
    }
}

/// Gather keys `t0..t1` of the item's sequence and head into the packs. Keys no query of
/// the sequence sees are not read (their block may be released): packed as zeros, so
/// their masked scores and probabilities stay exactly 0.
fn pack<E: Elem>(ctx: &Ctx<E>, it: &Item, t0: usize, t1: usize, sc: &mut Scratch) {
    let s = &ctx.shape;
    let (bs, tile) = (s.block_size, s.tile());
    let runs = ctx.vis.runs(it.seq);
    let mut vrows: [&[E]; TW] = [&[]; TW];
    let mut t = t0;
    let mut r = runs.partition_point(|x| x.tok1 <= t0);
    while t < t1 {
        let (a, b) = match runs.get(r) {
            Some(run) if run.tok0 < t1 => (run.tok0.max(t), run.tok1.min(t1)),
            _ => (t1, t1),
        };
        if t < a {
            pack_zeros(ctx, t - t0, a - t, sc, &mut vrows);
        }
        t = a;
        while t < b {
            let run = runs[r];
            let (c0, lb) = (t % bs, t / bs);
            let n = (bs - c0).min(b - t);
            // Blocks of visible keys were checked against the pool by `SeqTables::select`;
            // slicing is checked.
            let block = ctx.vis.blocks()[run.at + lb - run.first_block(bs)] as usize;
            let at = block * s.block_stride() + it.head * tile;
            let tiles = (&ctx.k[at..at + tile], &ctx.v[at..at + tile]);
            pack_keys(ctx, tiles, ctx.scales.tile(block, it.head), c0, n, t - t0, sc, &mut vrows);
            t += n;
        }
        r += 1;
    }
    if ctx.pv == PvMode::Dot {
        pack_token_pairs(&vrows[..t1 - t0], ctx.shape.head_dim, &mut sc.vpb);
    }
}

/// Tokens `c0..c0 + n` of one (block, head) K/V tile into the packs at key `o`.
#[allow(clippy::too_many_arguments)]
fn pack_keys<'a, E: Elem>(
    ctx: &Ctx<'a, E>,
    (kt, vt): (&'a [E], &'a [E]),
    (ks, vs): (TileScale, TileScale),
    c0: usize,
    n: usize,
    o: usize,
    sc: &mut Scratch,
    vrows: &mut [&'a [E]; TW],
) {
    let (bs, d) = (ctx.shape.block_size, ctx.shape.head_dim);
    if E::DTYPE.is_quantized() {
        // 8-bit (a bf16 query comes as the rounded f32 one; bf16 probabilities are
        // refused for them): codes times scales.
        pack_q8::codes(kt, vt, (ks, vs), Dst { kp: &mut sc.kp, vp: &mut sc.vp, o, c0, n, bs, d }, &mut sc.lut);
        return;
    }
    if ctx.q_bf16.is_some() {
        pack_pairs(kt, bs, c0, n, d, &mut sc.kpb[o..]);
    } else {
        for i in 0..d {
            widen(&kt[i * bs + c0..i * bs + c0 + n], &mut sc.kp[i * TW + o..i * TW + o + n]);
        }
    }
    if ctx.pv == PvMode::Dot {
        for (i, r) in vrows[o..o + n].iter_mut().enumerate() {
            *r = &vt[(c0 + i) * d..(c0 + i + 1) * d];
        }
    } else {
        widen(&vt[c0 * d..(c0 + n) * d], &mut sc.vp[o * d..(o + n) * d]);
    }
}

/// Zeros for keys `o..o + n` of the packs (keys no query sees).
fn pack_zeros<'a, E: Elem>(ctx: &Ctx<'a, E>, o: usize, n: usize, sc: &mut Scratch, vrows: &mut [&'a [E]; TW]) {
    let d = ctx.shape.head_dim;
    if ctx.q_bf16.is_some() {
        for p in 0..d.div_ceil(2) {
            sc.kpb[p * TW + o..p * TW + o + n].fill(0);
        }
    } else {
        for i in 0..d {
            sc.kp[i * TW + o..i * TW + o + n].fill(0.0);
        }
    }
    if ctx.pv == PvMode::Dot {
        vrows[o..o + n].fill(ctx.zeros);
    } else {
        sc.vp[o * d..(o + n) * d].fill(0.0);
    }
}

/// Pack V rows (`d` bf16 each) as token pairs: `dst[u * d + i]` holds dimension `i` of
/// token `2u` in its low half and of token `2u + 1` in its high half (+0 past an odd
/// count). Only called for bf16 caches (bf16 probabilities).
fn pack_token_pairs<E: Elem>(rows: &[&[E]], d: usize, dst: &mut [u32]) {
    for (u, pair) in rows.chunks(2).enumerate() {
        let Some(a) = same::<E, half::bf16>(pair[0]) else {
            unreachable!("bf16 probabilities are refused for caches other than bf16");
        };
        let out = &mut dst[u * d..(u + 1) * d];
        let a = &a[..d];
        match pair.get(1).and_then(|b| same::<E, half::bf16>(b)) {
            Some(b) => {
                let b = &b[..d];
                for i in 0..d {
                    out[i] = a[i].to_bits() as u32 | (b[i].to_bits() as u32) << 16;
                }
            }
            None => {
                for i in 0..d {
                    out[i] = a[i].to_bits() as u32;
                }
            }
        }
    }
}

/// Widen `src` to f32 into `dst` (same length): a copy for f32, half's SIMD conversions
/// for f16 and bf16.
fn widen<E: Elem>(src: &[E], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    if let Some(x) = same::<E, f32>(src) {
        dst.copy_from_slice(x);
    } else if let Some(x) = same::<E, half::f16>(src) {
        x.convert_to_f32_slice(dst);
    } else if let Some(x) = same::<E, half::bf16>(src) {
        x.convert_to_f32_slice(dst);
    } else {
        dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
    }
}

/// Pack tokens `c0..c0 + n` of a bf16 K tile (`[d][bs]`) as dimension pairs: `dst[p * TW
/// + t]` holds dimension `2p` of token `t` in its low half and `2p + 1` in its high half
/// (+0 past an odd `d`). Only called for bf16 caches (a bf16 query on the `vdpbf16ps` path).
fn pack_pairs<E: Elem>(kt: &[E], bs: usize, c0: usize, n: usize, d: usize, dst: &mut [u32]) {
    let Some(k) = same::<E, half::bf16>(kt) else {
        unreachable!("the vdpbf16ps scores run on bf16 caches only");
    };
    // Plain index loops over slices of length n: the bounds checks fold away and the
    // loops vectorise (iterator adapters here were out-of-line calls per row).
    for p in 0..d.div_ceil(2) {
        let a = &k[2 * p * bs + c0..2 * p * bs + c0 + n];
        let out = &mut dst[p * TW..p * TW + n];
        if 2 * p + 1 < d {
            let b = &k[(2 * p + 1) * bs + c0..(2 * p + 1) * bs + c0 + n];
            for t in 0..n {
                out[t] = a[t].to_bits() as u32 | (b[t].to_bits() as u32) << 16;
            }
        } else {
            for t in 0..n {
                out[t] = a[t].to_bits() as u32;
            }
        }
    }
}

/// Scores of every row for the tile's `ntok` keys into `sc.s` (log2 units, or natural
/// units before the soft cap).
fn scores<E>(ctx: &Ctx<E>, sc: &mut Scratch, rows: usize, ntok: usize) {
    let d = ctx.shape.head_dim;
    #[cfg(target_arch = "x86_64")]
    if ctx.path.isa() == Isa::Avx512 && ctx.q_bf16.is_some() {
        let factor = ctx.q_bf16.map_or(1.0, |x| x.1);
        // SAFETY: `q_bf16` is set only where `Route::select` chose `vdpbf16ps` for (features
        // with avx512bf16, a subset of this CPU's), on the AVX-512 path (`Supported`).
        unsafe { super::avx512_bf16::qk_dot(&sc.qb, rows, d.div_ceil(2), &sc.kpb, ntok, factor, &mut sc.s) };
        return;
    }
    on_path!(ctx.path, qk(&sc.q, rows, d, &sc.kp, ntok, &mut sc.s));
}

/// Online softmax of the tile's scores and `acc = alpha * acc + P V`.
fn softmax_pv<E>(ctx: &Ctx<E>, sc: &mut Scratch, rows: usize, ntok: usize, d: usize, p: &mut Partial) {
    let (s, alpha, vp) = (&mut sc.s, &mut sc.alpha, &sc.vp);
    on_path!(ctx.path, softmax(s, rows, ntok, p.m, p.l, alpha));
    #[cfg(target_arch = "x86_64")]
    if ctx.path.isa() == Isa::Avx512 && ctx.pv == PvMode::Dot {
        // SAFETY: `PvMode::Dot` is set only where `Route::select` chose `vdpbf16ps` (features
        // with avx512bf16, a subset of this CPU's) on the AVX-512 path.
        unsafe { super::avx512_bf16::pv_dot(s, rows, ntok, d, &sc.vpb, alpha, p.acc) };
        return;
    }
    round_probs(ctx.pv, s, rows, ntok);
    on_path!(ctx.path, pv(s, rows, ntok, d, vp, alpha, p.acc));
}

/// With bf16 probabilities off the `vdpbf16ps` path: round the probabilities to bf16 in place.
fn round_probs(pv: PvMode, s: &mut [f32], rows: usize, ntok: usize) {
    if pv == PvMode::RoundedF32 {
        for row in s[..rows * TW].chunks_mut(TW) {
            row[..ntok].iter_mut().for_each(|x| *x = half::bf16::from_f32(*x).to_f32());
        }
    }
}
