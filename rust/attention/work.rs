//! What the instruction-set paths share: the work item they read (`Work`, walked in
//! `Chunk`s), the online-softmax state they write (`Partial`),
//! the merge of split results (`merge_row`) and their constants. The query they read is
//! prepared in `query.rs`.

use std::ops::Range;

use super::prefetch::{prefetch_line, HINT_L1, HINT_L2};
use super::query::QueryI8;
use crate::kv::quant::{Scales, TileScale};
use crate::kv::{DType, Elem, KvShape};

/// What one work item reads: tokens `start..ntok` counted from the first token of
/// `blocks[0]` (a window or a run of sinks may begin inside its first block; the tokens
/// before `start` are never read). `q` holds the item's query heads (`heads.len() * g`
/// rows of `head_dim`), pre-scaled by `scale * log2(e)`.
pub(crate) struct Work<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    /// The layer's scales (8-bit caches; `ScaleKind::None` otherwise): a value is its
    /// element's `to_f32()` times the tile's [`TileScale`] at its token.
    pub scales: Scales<'a>,
    pub shape: KvShape,
    pub g: usize,
    pub blocks: &'a [u32],
    /// First token read of `blocks[0]` (`< block_size`).
    pub start: usize,
    pub ntok: usize,
    pub heads: Range<usize>,
    pub q: &'a [f32],
    /// With a bf16 query (`Precision { q: BF16, .. }`): the same query rows rounded to
    /// bf16, unscaled, two dimensions per `u32` (`d.div_ceil(2)` per row, even dimension
    /// in the low half, an odd `head_dim`'s last pair completed by +0), and the factor
    /// `scale * log2(e)` that `q` carries. The `vdpbf16ps` path reads these; the others
    /// read `q`, which then holds the rounded query times that factor.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub q_bf16: Option<(&'a [u32], f32)>,
    /// With an int8 query (`Precision { q: I8, .. }`, int8 caches): the item's query rows
    /// quantized to int8 ([`QueryI8`]); `q` then holds the dequantized quantized query
    /// (code times the row's factor), which the paths without `vpdpbusd` read.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub q_i8: Option<QueryI8<'a>>,
    /// The logit soft cap in log2 units (`cap * log2(e)`, for scores in log2 units):
    /// every path maps each score `s` to `c * tanh(s / c)` ([`soft_cap`]) before the
    /// softmax.
    pub soft_cap: Option<f32>,
    /// e4m3: the codes may hold NaN codes (`KvCache::raw_writes`: a writable view was
    /// handed out), so the AVX-512 path checks each tile for them; the others ignore it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub nan_check: bool,
}

/// What [`Work`]'s walk calls per chunk: `chunk(hi, first, second, next)`, `hi` the head's
/// index in `heads`, `second` the chunk after `first` in the same tile when the walk takes
/// them two at a time ([`Work::visit_chunk_pairs`]), `next` the tiles to prefetch. A struct
/// whose `#[inline(always)]` method is compiled into the loop (a closure may be left out
/// of line: a call per chunk).
pub(crate) trait Visit<'s, E> {
    fn chunk(&mut self, hi: usize, a: &Chunk<'s, E>, b: Option<&Chunk<'s, E>>, next: Option<Ahead<'s, E>>);
}

/// The online-softmax state of one item, per query head: `acc` rows of `head_dim`.
/// Starts as `acc = 0, m = -inf, l = 0`.
pub(crate) struct Partial<'a> {
    pub acc: &'a mut [f32],
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
    /// Set by a path that reads e4m3 codes without honouring their NaN codes (AVX-512)
    /// when a tile it read holds one: the item must be run again by a path that does.
    pub nan_codes: bool,
}

impl Partial<'_> {
    /// Back to the state of an item not yet run.
    pub fn reset(&mut self) {
        self.acc.fill(0.0);
        self.m.fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
        self.nan_codes = false;
    }
}

/// `c * tanh(s / c)` written as `c - 2c / (2^(s * 2 log2(e) / c) + 1)`, the form the
/// SIMD paths compute with their `exp2` (exact at both ends: `+inf` gives `c`, `0`
/// gives `-c`, NaN stays NaN); near 0 the absolute error is a few f32 steps of `c`, which the softmax
/// turns into a relative error of the weights of that order.
#[inline]
pub(crate) fn soft_cap(s: f32, c: f32) -> f32 {
    c - 2.0 * c / ((s * (2.0 * std::f32::consts::LOG2_E / c)).clamp(-SOFT_CAP_ARG, SOFT_CAP_ARG).exp2() + 1.0)
}

/// The bound on [`soft_cap`]'s `exp2` argument: at 60 the result is `c` in f32 (and `-c`
/// at -60), inside the range where the SIMD paths' `exp2` holds.
pub(crate) const SOFT_CAP_ARG: f32 = 60.0;

impl<E: Elem> Work<'_, E> {
    /// Tokens of block `bi` of this item that hold data.
    #[inline]
    pub fn tokens_in(&self, bi: usize) -> usize {
        (self.ntok - bi * self.shape.block_size).min(self.shape.block_size)
    }

    /// The tokens of block `bi` the item reads: `start..` in the first block, all the
    /// others from 0.
    #[inline]
    pub fn span_in(&self, bi: usize) -> std::ops::Range<usize> {
        (if bi == 0 { self.start } else { 0 })..self.tokens_in(bi)
    }

    /// K and V tiles (`head_dim * block_size` elements each) of KV head `h` in block
    /// `bi`. Slicing is checked: block ids were validated against the pool.
    #[inline]
    pub fn tiles(&self, bi: usize, h: usize) -> (&[E], &[E]) {
        let tile = self.shape.tile();
        let at = self.blocks[bi] as usize * self.shape.block_stride() + h * tile;
        (&self.k[at..at + tile], &self.v[at..at + tile])
    }

    /// K and V scales of KV head `h` in block `bi` (`TileScale::One` when unquantized,
    /// known at compile time: the walks of unquantized dtypes carry no scale code, which
    /// had cost AVX2 bf16 decode 5-10%). Inlined, as `Scales::tile`: a call returning the
    /// pair stalled its read on store forwarding (MHA 8-bit decode 3-5%).
    #[inline(always)]
    pub fn tile_scales(&self, bi: usize, h: usize) -> (TileScale<'_>, TileScale<'_>) {
        if !E::DTYPE.is_quantized() {
            return (TileScale::One, TileScale::One);
        }
        self.scales.tile(self.blocks[bi] as usize, h)
    }

    /// Prefetch the per-token scales (int8) of a tile ahead (block `b`, KV head `h`):
    /// they live apart from the codes, so the codes' prefetch does not bring them, and
    /// the first chunk of a tile needs its K scales right after its scores (a demand miss
    /// there stalls the softmax and `P V` behind it).
    #[inline(always)]
    fn prefetch_scales(&self, b: usize, h: usize) {
        if let (TileScale::Token(ks), TileScale::Token(vs)) = self.tile_scales(b, h) {
            // One address per 64-byte line (16 scales).
            for line in ks.chunks(16).chain(vs.chunks(16)) {
                prefetch_line::<HINT_L1, _>(line.as_ptr());
            }
        }
    }

    /// Prefetch into L2 the first lines of block `b`'s K and V scale runs for the item's
    /// heads (int8), once per block, as its first tile comes near: the L2's stream
    /// prefetcher takes each run on from there, one line per KV head in the order the
    /// walk reads them, without the core's miss buffers. For items of at least
    /// [`SCALE_STREAM_HEADS`] KV heads; fewer take [`Self::prefetch_scales`] per tile.
    #[inline(always)]
    fn start_scale_streams(&self, b: usize) {
        if let (TileScale::Token(ks), TileScale::Token(vs)) = self.tile_scales(b, self.heads.start) {
            for run in [ks, vs] {
                // The head's line and the next: the run's first two lines (16 scales each).
                // The second address may lie past the scales: a prefetch makes no access.
                for line in [run.as_ptr(), run.as_ptr().wrapping_add(16)] {
                    prefetch_line::<HINT_L2, _>(line);
                }
            }
        }
    }

    /// The item's tiles in reading order (heads within a block, then the next block), cut
    /// into chunks of at most `width` tokens (the first block's from `start`, so a chunk
    /// may begin at any token of its tile): `v.chunk(hi, chunk, None, next)` with `next`
    /// given with a tile's first chunk only. The walk every SIMD path shares;
    /// `#[inline(always)]` so that the visit is compiled with the calling kernel's target
    /// features.
    #[inline(always)]
    #[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
    pub fn visit_chunks<'s>(&'s self, width: usize, v: impl Visit<'s, E>) {
        self.walk::<false>(width, v);
    }

    /// [`Self::visit_chunks`] with a tile's chunks taken two at a time: `chunk(hi, first,
    /// second, next)`, `second` the chunk after `first` in the same tile (`None` at the
    /// tile's end), so a path can spread its per-chunk work (the softmax's set-up, the
    /// accumulators' loads and stores) over twice the tokens where blocks hold more than
    /// `width` tokens.
    #[inline(always)]
    #[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
    pub fn visit_chunk_pairs<'s>(&'s self, width: usize, v: impl Visit<'s, E>) {
        self.walk::<true>(width, v);
    }

    /// The walk of [`Self::visit_chunks`] (`PAIRS` false: the second chunk is always
    /// `None`) and of [`Self::visit_chunk_pairs`].
    #[inline(always)]
    fn walk<'s, const PAIRS: bool>(&'s self, width: usize, mut f: impl Visit<'s, E>) {
        let (bs, d) = (self.shape.block_size, self.shape.head_dim);
        let (nh, nb) = (self.heads.len(), self.blocks.len());
        // The (block, head index) of the tiles `ahead` and `ahead + PREFETCH_L2_TILES`
        // steps ahead of the current one, stepped with it (past the last block: none).
        let ahead = prefetch_tiles(self.kv_tile_bytes());
        let at = |dist: usize| ahead_in(0, 0, dist, nh, usize::MAX).expect("prefetch distances are at least 1");
        let (mut near, mut far) = (at(ahead), at(ahead + PREFETCH_L2_TILES));
        let step = |(b, h): (usize, usize)| if h + 1 == nh { (b + 1, 0) } else { (b, h + 1) };
        for bi in 0..nb {
            let span = self.span_in(bi);
            let nt = span.end;
            for (hi, h) in self.heads.clone().enumerate() {
                let (kt, vt) = self.tiles(bi, h);
                let (ks, vs) = self.tile_scales(bi, h);
                let mut next = self.ahead_tiles(near, far);
                (near, far) = (step(near), step(far));
                debug_assert_eq!(Some(near), ahead_in(bi, hi, ahead + 1, nh, usize::MAX));
                let chunk = |c0: usize| Chunk { kt, vt, ks, vs, bs, d, c0, lanes: (nt - c0).min(width) };
                let mut c0 = span.start;
                while c0 < nt {
                    let second = (PAIRS && c0 + width < nt).then(|| chunk(c0 + width));
                    f.chunk(hi, &chunk(c0), second.as_ref(), next.take());
                    c0 += if second.is_some() { 2 * width } else { width };
                }
            }
        }
    }

    /// Runs `f` on the item's KV heads in groups whose query vectors, laid out 4x (16 bytes
    /// per element), take at most [`QUERY_BYTES`] (at least one head per group): each group
    /// a work item of its own (its heads' query rows) with the matching rows of `p`; the
    /// groups' `nan_codes` are or'ed into `p`. For the paths with that layout, whose
    /// vectors are read once per tile and outgrow L1 when an item holds many KV heads.
    ///
    /// Only where a KV head's vectors (`16 g d` bytes) outweigh its K and V tiles: a group
    /// walks every block for its heads alone, so it reads a block's run in pieces (at 8 KV
    /// heads of 16 x 128 fp8, 8 KiB of its 32 KiB), and where the tiles are the larger
    /// stream (g <= 2 at block size 16: MHA) the whole runs pay more than the vectors' trips
    /// to L2 cost: on MHA, groups of 8 heads had cost the fp8 lane-query paths 10-13%
    /// (`docs/experiments.md`, "Decode attention: work and scheduling").
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn in_head_groups(&self, p: &mut Partial, mut f: impl FnMut(&Work<'_, E>, &mut Partial)) {
        let (d, g, hs) = (self.shape.head_dim, self.g, self.heads.start);
        let query = 16 * g * d;
        let per_group = if query <= self.kv_tile_bytes() { self.heads.len() } else { (QUERY_BYTES / query.max(1)).max(1) };
        assert!(self.q.len() == self.heads.len() * g * d && p.acc.len() == self.q.len());
        assert!(p.m.len() == self.heads.len() * g && p.l.len() == p.m.len());
        assert!(self.q_bf16.is_none() && self.q_i8.is_none(), "grouped items carry the f32 query only");
        let mut h0 = hs;
        while h0 < self.heads.end {
            let h1 = (h0 + per_group).min(self.heads.end);
            let (r0, r1) = ((h0 - hs) * g, (h1 - hs) * g);
            let sub = Work { heads: h0..h1, q: &self.q[r0 * d..r1 * d], ..*self };
            let mut part = Partial {
                acc: &mut p.acc[r0 * d..r1 * d],
                m: &mut p.m[r0..r1],
                l: &mut p.l[r0..r1],
                nan_codes: false,
            };
            f(&sub, &mut part);
            p.nan_codes |= part.nan_codes;
            h0 = h1;
        }
    }

    /// Bytes of one K tile and its V tile.
    #[inline]
    fn kv_tile_bytes(&self) -> usize {
        2 * self.shape.tile() * std::mem::size_of::<E>()
    }

    /// The tiles at `near` (into L1, with its int8 scales) and `far` (into L2), as
    /// (block, head index); none from a block past the item's last.
    #[inline(always)]
    fn ahead_tiles(&self, near: (usize, usize), far: (usize, usize)) -> Option<Ahead<'_, E>> {
        let (nb, h0) = (self.blocks.len(), self.heads.start);
        if near.0 >= nb {
            return None;
        }
        if self.heads.len() < SCALE_STREAM_HEADS {
            self.prefetch_scales(near.0, h0 + near.1);
        } else if near.1 == 0 {
            self.start_scale_streams(near.0);
        }
        let (k, v) = self.tiles(near.0, h0 + near.1);
        let far = (far.0 < nb).then(|| self.tiles(far.0, h0 + far.1));
        Some(Ahead { k, v, far })
    }
}

/// The (block, head index) `dist > 0` steps after (block `bi`, head index `hi < nh`) in
/// a reading order of `nh` heads per block over `nblocks` blocks, if any. Steps, not a
/// division: `dist` is a few tiles and `nh` is often 1. The walk asks it once per item
/// and steps its answers with the tiles (three of these per tile, as it was, were a
/// measurable part of the shortest tiles' time).
#[inline]
fn ahead_in(bi: usize, hi: usize, dist: usize, nh: usize, nblocks: usize) -> Option<(usize, usize)> {
    let (mut b, mut h) = (bi, hi + dist);
    while h >= nh {
        h -= nh;
        b += 1;
    }
    (dist > 0 && b < nblocks).then_some((b, h))
}

/// The tiles a path prefetches while it reads one: the K and V tiles [`prefetch_tiles`]
/// ahead into L1, and those [`PREFETCH_L2_TILES`] further on into L2 (`None` past the
/// item's last tile). The path spreads the lines over its loops (AVX-512 and AVX2 both
/// streams, NEON its L1 lines only).
pub(crate) struct Ahead<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    // NEON has no L2 prefetch here (it issues L1 ones only).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub far: Option<(&'a [E], &'a [E])>,
}

// By hand: a derive would ask `E: Copy`, and these are only slices.
impl<E> Clone for Ahead<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for Ahead<'_, E> {}

/// Tokens `c0 .. c0 + lanes` of one (block, head) tile: the K tile (`d` rows of `bs`
/// tokens) and the V tile (`bs` rows of `d`), with their scales (by token slot).
pub(crate) struct Chunk<'a, E> {
    pub kt: &'a [E],
    pub vt: &'a [E],
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub ks: TileScale<'a>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub vs: TileScale<'a>,
    pub bs: usize,
    pub d: usize,
    pub c0: usize,
    pub lanes: usize,
}

/// Merge the partial results of one output row by log-sum-exp: `rows` index its partials
/// in `m`, `l` and `acc` (`out.len()` values per row of `acc`, unnormalised). Writes the
/// normalised row to `out` (zeros when no partial saw a key) and returns its LSE in
/// natural log (`-inf` then). Decode and prefill merge their splits with it.
pub(crate) fn merge_row(rows: impl Iterator<Item = usize> + Clone, acc: &[f32], m: &[f32], l: &[f32], out: &mut [f32]) -> f32 {
    let d = out.len();
    out.fill(0.0);
    let mx = rows.clone().map(|r| m[r]).fold(f32::NEG_INFINITY, f32::max);
    if mx == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let mut total = 0f32;
    for r in rows {
        let w = weight(m[r] - mx);
        total += w * l[r];
        for (x, &a) in out.iter_mut().zip(&acc[r * d..][..d]) {
            *x += w * a;
        }
    }
    let inv = 1.0 / total;
    out.iter_mut().for_each(|x| *x *= inv);
    (mx + total.log2()) * std::f32::consts::LN_2
}

/// Where a call's LSEs go: the caller's `lse`, else `n` values of scratch kept in `buf`.
pub(crate) fn lse_or_scratch<'a>(lse: Option<&'a mut [f32]>, buf: &'a mut Vec<f32>, n: usize) -> &'a mut [f32] {
    match lse {
        Some(x) => x,
        None => {
            *buf = vec![0f32; n];
            buf
        }
    }
}

/// [`merge_row`] of a single partial, in place: `row` holds its unnormalised `acc` and
/// becomes the normalised output (zeros when it saw no key); returns the LSE. The same
/// operations in the same order, so the same values (signed zeros included; a NaN's
/// sign and payload are not specified). Adds the outputs into `sums`, [`LANES`]
/// independent lanes a caller can check for finiteness in one go ([`lanes_finite`]): one
/// vector add per vector of outputs, where a compare per value cost 5% of a decode call of
/// 64 sequences of 16 tokens.
pub(crate) fn finish_row(row: &mut [f32], m: f32, l: f32, sums: &mut [f32; LANES]) -> f32 {
    let mx = f32::NEG_INFINITY.max(m);
    if mx == f32::NEG_INFINITY {
        row.fill(0.0);
        return f32::NEG_INFINITY;
    }
    let w = weight(m - mx);
    let total = 0.0 + w * l;
    let inv = 1.0 / total;
    // A partial finished alone has its own maximum as the reference (`w` is 1, or NaN):
    // `w * x` is then `x` to the bit, and leaving the multiply out pays for the sums' add.
    if w == 1.0 {
        map_summing(row, sums, |x| (0.0 + x) * inv);
    } else {
        map_summing(row, sums, |x| (0.0 + w * x) * inv);
    }
    (mx + total.log2()) * std::f32::consts::LN_2
}

/// `x = f(x)` over `row`, each new value added into its lane of `sums`.
#[inline(always)]
fn map_summing(row: &mut [f32], sums: &mut [f32; LANES], f: impl Fn(f32) -> f32) {
    let mut chunks = row.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (x, s) in c.iter_mut().zip(sums.iter_mut()) {
            *x = f(*x);
            *s += *x;
        }
    }
    for (x, s) in chunks.into_remainder().iter_mut().zip(sums.iter_mut()) {
        *x = f(*x);
        *s += *x;
    }
}

/// Lanes of [`finish_row`]'s sums: enough independent add chains that a row of 128 values
/// adds at most 4 deep into each (fewer lanes made the adds' latency the loop's bound).
pub(crate) const LANES: usize = 32;

/// Whether every value of `rows` is finite, given `sums`, what [`finish_row`] added of
/// them: finite sums say so at once; a sum that is not (a non-finite value, or finite
/// values near `f32::MAX` adding up past it) is told apart by a look at the rows.
pub(crate) fn lanes_finite(sums: &[f32; LANES], rows: &[f32]) -> bool {
    sums.iter().all(|s| s.is_finite()) || rows.iter().all(|x| x.is_finite())
}

/// Whether this is a bound build (cargo feature `bound-free-dots`, see [`super`]'s module
/// doc): the opt-in AVX-512 dot products are skipped and their outputs are wrong.
pub const FREE_DOTS: bool = cfg!(feature = "bound-free-dots");

/// Bytes of query vectors one group of an item's KV heads may take in the paths that lay
/// the query out 4x (16 bytes per element: `avx512_e4m3`, `avx512_fp16`), which run an
/// item in groups ([`Work::in_head_groups`]) so that the vectors stay in L1 beside the
/// tiles: measured against 8 KV heads (64 KiB of vectors) at once, see
/// `docs/experiments.md`, "Decode attention: work and scheduling".
const QUERY_BYTES: usize = 16 << 10;

/// Work items of at least this many KV heads leave their int8 scale lines to the L2's
/// stream prefetcher after the first two of each run per block
/// ([`Work::start_scale_streams`]), fewer prefetch each tile's two lines into L1 as they
/// come near. MHA (32 KV heads, 1 thread, B / A time against a prefetch per tile): exact
/// int8 0.945, int8 query 0.958; GQA's 8 KV heads read 1.005-1.029 that way (runs of 8
/// lines), so they keep the prefetch per tile (`docs/experiments.md`, "Decode attention:
/// int8 scales").
const SCALE_STREAM_HEADS: usize = 16;

/// Prefetch distance in (block, head) tiles, into L1. Measured on shape (a) of
/// `benches/bench_attention.py` (f32 and bf16): distances 1, 2, 3 and 4 are within noise of
/// each other, the L2 hint (T1) is slightly slower, and no prefetch is 3-5x slower (the
/// hardware prefetchers do not follow jumps between scattered blocks).
pub(crate) const PREFETCH_TILES: usize = 1;

/// Bytes (K + V) the L1 prefetch runs ahead of the tile being read, at least: an 8-bit
/// tile pair at head_dim 128 and block size 16 (the next tile of every dtype there;
/// smaller tiles prefetch more tiles ahead). With [`PREFETCH_L2_TILES`] 1, against 8 KiB
/// and 2 (two 8-bit tiles into L1, two more into L2) on shape `full` read from memory
/// (`ab_decode.py --layers 8 --reallocate 25`, 200 pairs over 8 placements, B / A time):
/// e5m2 / e4m3 with the f16 precision 0.964 / 0.972, int8 with an int8 query and 8-bit
/// `P V` (an option since removed: it did not pay) 0.975, bf16
/// (one tile ahead into L1 in both) 0.999. The L2 prefetch alone, without the L1 one,
/// took 1.08-1.14x the time (one placement; `docs/experiments.md`, "Decode attention:
/// prefetch").
const PREFETCH_BYTES: usize = 4 << 10;

/// Tiles beyond the L1 distance ([`prefetch_tiles`]) whose every line is prefetched into
/// L2 ([`Ahead::far`]; on the exact AVX-512 path's and the f16 precision's 8-bit tiles of at
/// most 2 KiB, only their first lines: `prefetch::FAR_START_LINES`), so a tile's misses are already on their way from memory when its
/// L1 prefetch comes. One core keeps only a couple of dozen L1 misses in flight, too
/// few to cover memory's latency at the rate an 8-bit decode reads; the L2 takes more.
/// Measured on `benches/bench_quant.py`'s shapes at 1 thread (same build, same session,
/// tokens/s, the L2 lines issued at each tile's start): MHA int8 513-537 -> 616-623,
/// int8 query 542-567 -> 626-697, e5m2 464-480 -> 499-506; GQA bf16 634-746 -> 976-1,024,
/// int8 898-980 -> 1,194-1,206, int8 query 1,085-1,121 -> 1,468-1,609; distances 3, 4
/// and 6 were no better than 2. Spread over the loops instead (AVX-512), bf16 gained
/// another 20% (GQA) and 42% (MHA); see `docs/experiments.md`, "Decode attention:
/// prefetch". With the L1 prefetch one 8-bit tile ahead, one L2 tile beyond it: see
/// [`PREFETCH_BYTES`] for the pair's measurement (taken over 8 placements of the caches:
/// single placements moved a build against itself by 6%).
pub(crate) const PREFETCH_L2_TILES: usize = 1;

/// Prefetch distance in tiles for tiles of `tile_bytes` (K + V).
pub(crate) fn prefetch_tiles(tile_bytes: usize) -> usize {
    PREFETCH_TILES.max(PREFETCH_BYTES.div_ceil(tile_bytes.max(1)))
}

/// How far (log2 units) a score may exceed the running maximum before the SIMD paths
/// move the maximum (a lazy maximum: no horizontal max and no rescale of the
/// accumulators per chunk): probabilities stay below 2^8, far from f32 overflow even
/// summed over 2^32 tokens, and relative rounding is unchanged. `l` and `acc` share the
/// reference point, so the quotient and the LSE are those of the exact maximum.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
pub(crate) const LAZY_MAX: f32 = 8.0;

/// Below this (log2 units under the softmax's reference point) every SIMD path's `exp2`
/// gives exactly 0: a probability under 2^-64 of the reference moves an output by at most
/// 2^-64 of its largest V per token (2^-32 over 2^32 tokens), while kept, it becomes
/// subnormal once multiplied by an 8-bit cache's V scale or a value, and a subnormal
/// operand makes every multiply of the `P V` loop take a microcode assist. With one
/// token's score 100-200 nats above the rest (a dominant sink), exact int8 and fp8 e5m2
/// decode took 5.6-6.0x their time (`benches/bench_sink.py`; `docs/experiments.md`,
/// "Subnormals").
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
pub(crate) const EXP2_ZERO_BELOW: f32 = -64.0;

/// `2^x` by libm, or exactly 0 below [`EXP2_ZERO_BELOW`]: the weight of a partial result
/// or the rescale factor of accumulators, which would otherwise be subnormal (2^-126 to
/// 2^-149) for a gap of 87-103 nats and make every multiply by it take a microcode
/// assist (decode merging the splits of a sequence with a dominant sink: 1.27-1.39x the
/// time; `docs/experiments.md`, "Subnormals").
#[inline]
pub(crate) fn weight(x: f32) -> f32 {
    if x < EXP2_ZERO_BELOW {
        0.0
    } else {
        x.exp2()
    }
}

/// Taylor coefficients of `2^f = e^(f ln 2)` on `[-0.5, 0.5]` up to degree 7 (the
/// degree-8 term is below 6e-9), for every SIMD path's polynomial `exp2`.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
pub(crate) const EXP2_TAYLOR: [f32; 8] = [
    1.0,
    std::f32::consts::LN_2,
    0.240_226_5,
    0.055_504_11,
    0.009_618_129,
    0.001_333_355_8,
    0.000_154_035_3,
    0.000_015_252_734,
];

/// The factor the SIMD kernels' loads of 8-bit codes leave out, which they fold into the
/// scales: e4m3 codes are widened through f16 bit positions as their value divided by
/// 2^8 (exact for normals and subnormals), so 2^8 for e4m3, else 1.
pub(crate) const fn load_factor(dt: DType) -> f32 {
    if matches!(dt, DType::E4M3) {
        256.0
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::{ahead_in, finish_row, lanes_finite, merge_row, weight, EXP2_ZERO_BELOW, LANES};

    /// Weights are libm's `exp2` down to the bound and exactly 0 below it (never
    /// subnormal); a partial that far below the largest adds nothing to the merge.
    #[test]
    fn weights_are_never_subnormal_and_far_partials_merge_to_nothing() {
        for x in [0.0f32, -1.0, -63.9, EXP2_ZERO_BELOW] {
            assert_eq!(weight(x), x.exp2(), "{x}");
            assert!(weight(x).is_normal());
        }
        for x in [-64.01f32, -130.0, -144.0, -200.0, f32::NEG_INFINITY] {
            assert_eq!(weight(x).to_bits(), 0, "{x}");
        }
        // Two partials of one row (d = 2): the second 140 log2 units under the first,
        // where 2^-140 would be a subnormal weight.
        let (acc, m, l) = ([3.0f32, -6.0, 1e38, 1e38], [5.0f32, -135.0], [1.5f32, 7.0]);
        let mut out = [0f32; 2];
        let lse = merge_row(0..2, &acc, &m, &l, &mut out);
        assert_eq!(out, [2.0, -4.0]);
        assert_eq!(lse, (5.0 + 1.5f32.log2()) * std::f32::consts::LN_2);
    }

    /// One partial normalized in place gives merge_row's bits and LSE, for every kind of
    /// running max (none seen, NaN, infinite, finite) and sum, and values with signed
    /// zeros, infinities and NaN.
    #[test]
    fn finishing_one_partial_in_place_is_merging_it() {
        let acc = [3.0f32, -0.0, 0.0, f32::INFINITY, f32::NAN, -7.5e-39, 1e38];
        for m in [f32::NEG_INFINITY, f32::NAN, f32::INFINITY, -200.0, 0.0, 5.25] {
            for l in [0.0f32, 1.5, 7e30, f32::INFINITY, f32::NAN] {
                let mut want = [0f32; 7];
                let want_lse = merge_row(0..1, &acc, &[m], &[l], &mut want);
                let mut row = acc;
                let mut sums = [0f32; LANES];
                let lse = finish_row(&mut row, m, l, &mut sums);
                assert_eq!(lanes_finite(&sums, &row), row.iter().all(|x| x.is_finite()));
                // Bits (signed zeros count), except that any NaN matches any NaN: Rust
                // does not fix a NaN result's sign or payload (unoptimised builds differ).
                let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                assert!(row.iter().zip(&want).all(|(&a, &b)| same(a, b)), "m {m}, l {l}: {row:?} vs {want:?}");
                assert!(same(lse, want_lse), "m {m}, l {l}: lse {lse} vs {want_lse}");
            }
        }
    }

    /// The tile `dist` ahead is the one at position `bi * nh + hi + dist` of the reading
    /// order (heads within a block, then the next block), none past the last block or
    /// at distance 0.
    #[test]
    fn ahead_counts_heads_within_a_block_then_blocks() {
        for nh in 1..5 {
            for nblocks in 1..5 {
                for bi in 0..nblocks {
                    for hi in 0..nh {
                        for dist in 0..9 {
                            let idx = bi * nh + hi + dist;
                            let want = (dist > 0 && idx / nh < nblocks).then_some((idx / nh, idx % nh));
                            assert_eq!(ahead_in(bi, hi, dist, nh, nblocks), want, "{bi} {hi} {dist} of {nh} x {nblocks}");
                        }
                    }
                }
            }
        }
    }
}
