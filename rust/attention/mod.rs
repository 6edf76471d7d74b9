//! Paged decode attention: one query token per sequence against its cached K/V.
//!
//! `out[s, hq] = softmax(scale * q[s, hq] . K[s, hkv]^T) V[s, hkv]` with
//! `hkv = hq / g`, `g = Hq / Hkv` (GQA), K/V read through the sequence's block table.
//!
//! # How the work is cut
//!
//! A *work item* is (sequence, group of KV heads, run of whole blocks). Each item reads
//! every K/V byte of its range once for all `g` query heads of each KV head, keeps an
//! online softmax (running max `m`, sum `l`, unnormalised `acc`, all f32) and writes a
//! partial result. Sequences longer than a quarter of a thread's share of the batch are
//! split along their blocks (FlashDecoding: one long sequence still uses every core, and
//! uneven lengths balance); partials are merged by log-sum-exp in `merge`. Items run on
//! the [`crate::threads`] rayon pool.
//!
//! Queries are pre-multiplied by `scale * log2(e)` so the kernels use `exp2`; `m` is
//! therefore in log2 units and the returned LSE is converted back to natural log.
//!
//! # Instruction sets
//!
//! [`scalar`] is the portable reference; [`avx2`] (AVX2 + FMA + F16C) and [`avx512`]
//! (AVX-512 F/BW/VL) on x86-64, `neon` (Advanced SIMD) on aarch64, are chosen at run time
//! by [`Isa::best`], or forced per call (a path of the other architecture is reported as
//! unsupported). With the opt-in `bf16_scores` (bf16 caches), the AVX-512 path computes
//! the scores with `vdpbf16ps` ([`avx512_bf16`]) when the CPU has avx512_bf16; every
//! path then uses the bf16-rounded query, so the option means the same math everywhere. The NEON path is tested under qemu (`tests/aarch64.sh`), for correctness
//! only: no aarch64 hardware timed it.

use std::ops::Range;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;

use crate::error::Result;
use crate::invalid;
use crate::kv_storage::{DType, Elem, KvCache, KvShape};

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "x86_64")]
pub mod avx512_bf16;
#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod scalar;
pub mod tables;

pub use tables::SeqTables;

/// A kernel implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    Scalar,
    Neon,
    Avx2,
    Avx512,
}

impl Isa {
    /// Every path, fastest last among those of one architecture (x86-64 and aarch64 never
    /// both support one, so the order across them does not matter).
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Neon, Isa::Avx2, Isa::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|i| i.name() == s)
            .ok_or_else(|| invalid!("unknown kernel path {s:?}; known: scalar, neon, avx2, avx512"))
    }

    /// Whether this CPU can run the path.
    pub fn supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => ["avx2", "fma", "f16c"].iter().all(|f| cpu_features().contains(f)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                ["avx512f", "avx512bw", "avx512vl", "fma", "f16c"].iter().all(|f| cpu_features().contains(f))
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => cpu_features().contains(&"neon"),
            // Paths of another architecture.
            _ => false,
        }
    }

    /// Supported paths, fastest last.
    pub fn available() -> Vec<Isa> {
        Self::ALL.into_iter().filter(|i| i.supported()).collect()
    }

    /// The fastest supported path.
    pub fn best() -> Isa {
        *Self::available().last().unwrap_or(&Isa::Scalar)
    }
}

/// SIMD features of this CPU that the kernels and probes care about.
pub fn cpu_features() -> &'static [&'static str] {
    static FEATURES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    FEATURES.get_or_init(|| {
        #[allow(unused_mut)]
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            macro_rules! probe {
                ($($f:tt),*) => { $( if std::arch::is_x86_feature_detected!($f) { v.push($f); } )* };
            }
            probe!("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16", "avx512vnni");
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            v.push("neon");
        }
        v
    })
}

/// Per-call options; `Default` is what Python gets without keywords.
#[derive(Clone, Debug, Default)]
pub struct DecodeOptions {
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Tokens per split (rounded up to whole blocks); `Some(0)` never splits, `None`
    /// splits sequences longer than a quarter of a thread's share of the batch (at least
    /// 256 tokens per split).
    pub split_tokens: Option<usize>,
    /// KV heads per work item (must divide the KV head count); `None` is all of them,
    /// which reads each block as one contiguous run (see `benches/RESULTS.md`).
    pub kv_heads_per_item: Option<usize>,
    /// Kernel path; `None` is [`Isa::best`].
    pub isa: Option<Isa>,
    /// bf16 caches only: round the query to bf16 (nearest even) and compute the scores
    /// from the rounded query; with the AVX-512 path on a CPU with avx512_bf16 they are
    /// computed by `vdpbf16ps` ([`avx512_bf16`]), elsewhere by f32 FMAs on the rounded
    /// query (the same products, exact in f32, summed in another order). Softmax and
    /// `P V` are unchanged (f32, V widened exactly).
    pub bf16_scores: bool,
}

/// What one work item reads. `q` holds the item's query heads (`heads.len() * g` rows of
/// `head_dim`), pre-scaled by `scale * log2(e)`.
pub(crate) struct Work<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    pub shape: KvShape,
    pub g: usize,
    pub blocks: &'a [u32],
    pub ntok: usize,
    pub heads: Range<usize>,
    pub q: &'a [f32],
    /// With `bf16_scores`: the same query rows rounded to bf16, unscaled, two dimensions
    /// per `u32` (`d.div_ceil(2)` per row, even dimension in the low half, an odd
    /// `head_dim`'s last pair completed by +0), and the factor `scale * log2(e)` that
    /// `q` carries. The `vdpbf16ps` path reads these; the others read `q`, which then
    /// holds the rounded query times that factor.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub q_bf16: Option<(&'a [u32], f32)>,
}

/// The online-softmax state of one item, per query head: `acc` rows of `head_dim`.
/// Starts as `acc = 0, m = -inf, l = 0`.
pub(crate) struct Partial<'a> {
    pub acc: &'a mut [f32],
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
}

impl<E: Elem> Work<'_, E> {
    /// Tokens of block `bi` of this item that hold data.
    #[inline]
    pub fn tokens_in(&self, bi: usize) -> usize {
        (self.ntok - bi * self.shape.block_size).min(self.shape.block_size)
    }

    /// K and V tiles (`head_dim * block_size` elements each) of KV head `h` in block
    /// `bi`. Slicing is checked: block ids were validated against the pool.
    #[inline]
    pub fn tiles(&self, bi: usize, h: usize) -> (&[E], &[E]) {
        let tile = self.shape.tile();
        let at = self.blocks[bi] as usize * self.shape.block_stride() + h * tile;
        (&self.k[at..at + tile], &self.v[at..at + tile])
    }

    /// The tiles `dist` steps after (block `bi`, head index `hi`) in the item's reading
    /// order (heads within a block, then the next block), if any.
    #[inline]
    pub fn tiles_ahead(&self, bi: usize, hi: usize, dist: usize) -> Option<(&[E], &[E])> {
        let nh = self.heads.len();
        let idx = bi * nh + hi + dist;
        (dist > 0 && idx / nh < self.blocks.len()).then(|| self.tiles(idx / nh, self.heads.start + idx % nh))
    }

    /// The item's tiles in reading order (heads within a block, then the next block), cut
    /// into chunks of at most `width` tokens: `f(hi, chunk, next)` with `hi` the head's
    /// index in `heads` and `next` the tile to prefetch, given with a tile's first chunk
    /// only. The walk every SIMD path shares; `#[inline(always)]` so that `f` is compiled
    /// with the calling kernel's target features.
    #[inline(always)]
    pub fn for_each_chunk<'s>(&'s self, width: usize, mut f: impl FnMut(usize, &Chunk<'s, E>, Option<(&'s [E], &'s [E])>)) {
        let (bs, d) = (self.shape.block_size, self.shape.head_dim);
        for bi in 0..self.blocks.len() {
            let nt = self.tokens_in(bi);
            for (hi, h) in self.heads.clone().enumerate() {
                let (kt, vt) = self.tiles(bi, h);
                let mut next = self.tiles_ahead(bi, hi, PREFETCH_TILES);
                let mut c0 = 0;
                while c0 < nt {
                    f(hi, &Chunk { kt, vt, bs, d, c0, lanes: (nt - c0).min(width) }, next.take());
                    c0 += width;
                }
            }
        }
    }
}

/// Tokens `c0 .. c0 + lanes` of one (block, head) tile: the K tile (`d` rows of `bs`
/// tokens) and the V tile (`bs` rows of `d`).
pub(crate) struct Chunk<'a, E> {
    pub kt: &'a [E],
    pub vt: &'a [E],
    pub bs: usize,
    pub d: usize,
    pub c0: usize,
    pub lanes: usize,
}

/// Prefetch distance in (block, head) tiles, into L1. Measured on shape (a) of
/// `benches/bench_attention.py` (f32 and bf16): distances 1, 2, 3 and 4 are within noise of
/// each other, the L2 hint (T1) is slightly slower, and no prefetch is 3-5x slower (the
/// hardware prefetchers do not follow jumps between scattered blocks).
pub(crate) const PREFETCH_TILES: usize = 1;

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

#[derive(Clone, Debug)]
struct Item {
    seq: usize,
    group: usize,
    blocks: Range<usize>,
    ntok: usize,
}

/// Decode attention over `layer` of `cache`.
///
/// `q`: f32 `[n, num_q_heads, head_dim]`; `out`: the same shape; `lse` (optional):
/// `[n, num_q_heads]` natural-log sum of `exp(scale * q.k)` (`-inf` for an empty
/// sequence, whose output is 0).
///
/// Errors: shapes or head counts that do not match the cache, an unsupported or unknown
/// path, a non-finite scale, a KV head split that does not divide the KV heads.
#[allow(clippy::too_many_arguments)]
pub fn decode_attention(
    cache: &KvCache,
    layer: usize,
    q: &[f32],
    num_q_heads: usize,
    tables: &SeqTables,
    out: &mut [f32],
    lse: Option<&mut [f32]>,
    opts: &DecodeOptions,
) -> Result<()> {
    let shape = cache.shape();
    let (n, d, hkv) = (tables.len(), shape.head_dim, shape.num_kv_heads);
    if num_q_heads == 0 || !num_q_heads.is_multiple_of(hkv) {
        return Err(invalid!("{num_q_heads} query heads is not a positive multiple of {hkv} KV heads"));
    }
    let g = num_q_heads / hkv;
    let want = n * num_q_heads * d;
    if q.len() != want || out.len() != want {
        return Err(invalid!(
            "q and out must be [{n}, {num_q_heads}, {d}] ({want} values), got {} and {}",
            q.len(),
            out.len()
        ));
    }
    if let Some(l) = &lse {
        if l.len() != n * num_q_heads {
            return Err(invalid!("lse must be [{n}, {num_q_heads}], got {} values", l.len()));
        }
    }
    let scale = opts.scale.unwrap_or(1.0 / (d as f32).sqrt());
    if !scale.is_finite() {
        return Err(invalid!("scale must be finite, got {scale}"));
    }
    let isa = opts.isa.unwrap_or_else(Isa::best);
    let Some(isa) = Supported::check(isa) else {
        return Err(invalid!("kernel path {} is not supported by this CPU", isa.name()));
    };
    let kpi = opts.kv_heads_per_item.unwrap_or(hkv);
    if kpi == 0 || !hkv.is_multiple_of(kpi) {
        return Err(invalid!("kv_heads_per_item {kpi} must divide the {hkv} KV heads"));
    }
    if opts.bf16_scores && cache.dtype() != DType::BF16 {
        return Err(invalid!("bf16_scores needs a bf16 cache, this one stores {}", cache.dtype().name()));
    }
    let pool = crate::threads::pool()?;
    let (qs, q_bf16) = scaled_query(q, d, scale * std::f32::consts::LOG2_E, opts.bf16_scores);
    let items = plan(tables, shape.block_size, hkv / kpi, pool.current_num_threads(), opts.split_tokens);

    let per_item = kpi * g;
    let mut acc = vec![0f32; items.len() * per_item * d];
    let mut m = vec![f32::NEG_INFINITY; items.len() * per_item];
    let mut l = vec![0f32; items.len() * per_item];
    crate::with_elem!(cache.dtype(), E => {
        let (k, v) = cache.layer::<E>(layer)?;
        // Longest item first, each thread taking the next item as it frees up (greedy
        // LPT list scheduling): with a few uneven items, rayon's halving of the item list
        // can leave one core waiting on the other's last long item.
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(items[i].ntok));
        let parts: Vec<Mutex<Partial>> = acc
            .chunks_mut(per_item * d)
            .zip(m.chunks_mut(per_item))
            .zip(l.chunks_mut(per_item))
            .map(|((acc, m), l)| Mutex::new(Partial { acc, m, l }))
            .collect();
        let next = AtomicUsize::new(0);
        pool.broadcast(|_| {
            while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                let it = &items[i];
                let (blocks, _) = tables.seq(it.seq);
                let heads = it.group * kpi..(it.group + 1) * kpi;
                let qrow = (it.seq * num_q_heads + heads.start * g) * d;
                let work = Work {
                    k,
                    v,
                    shape,
                    g,
                    blocks: &blocks[it.blocks.clone()],
                    ntok: it.ntok,
                    heads,
                    q: &qs[qrow..qrow + per_item * d],
                    q_bf16: opts.bf16_scores.then(|| {
                        let pairs = d.div_ceil(2);
                        let at = qrow / d * pairs;
                        (&q_bf16[at..at + per_item * pairs], scale * std::f32::consts::LOG2_E)
                    }),
                };
                // Each index is handed out once, so the lock is never contended.
                let mut p = parts[i].lock().unwrap_or_else(|e| e.into_inner());
                run_item(isa, &work, &mut p);
            }
        });
    });
    merge(&items, &acc, &m, &l, per_item, d, out, lse, &pool);
    Ok(())
}

/// The query times `factor` (`scale * log2(e)`) for the kernels and, with `bf16`, first
/// rounded to bf16, plus its bf16 pairs for the `vdpbf16ps` path (empty without `bf16`).
fn scaled_query(q: &[f32], d: usize, factor: f32, bf16: bool) -> (Vec<f32>, Vec<u32>) {
    if !bf16 {
        return (q.iter().map(|&x| x * factor).collect(), Vec::new());
    }
    let bits = |x: f32| half::bf16::from_f32(x).to_bits();
    let qs = q.iter().map(|&x| half::bf16::from_bits(bits(x)).to_f32() * factor).collect();
    let pairs = q
        .chunks(d.max(1))
        .flat_map(|row| row.chunks(2).map(|p| bits(p[0]) as u32 | (p.get(1).map_or(0, |&x| bits(x)) as u32) << 16))
        .collect();
    (qs, pairs)
}

pub(crate) use supported::Supported;

mod supported {
    use super::Isa;

    /// A kernel path this CPU runs: only [`Supported::check`] makes one (the field is
    /// private to this module), so holding one proves the check that the `unsafe`
    /// dispatch of [`super::run_item`] relies on.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Supported(Isa);

    impl Supported {
        /// `isa` if this CPU has every feature its path is compiled for.
        pub(crate) fn check(isa: Isa) -> Option<Self> {
            isa.supported().then_some(Self(isa))
        }

        pub(crate) fn isa(self) -> Isa {
            self.0
        }
    }
}

/// Run one work item on the path `isa`; safe for any input because [`Supported`] can
/// only hold a path this CPU runs.
fn run_item<E: Elem>(isa: Supported, w: &Work<E>, p: &mut Partial) {
    match isa.isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `avx512_bf16::supported()` is this CPU having avx512_bf16 on top of
        // the AVX-512 path's features (`Supported` holds only a path this CPU runs).
        Isa::Avx512 if w.q_bf16.is_some() && avx512_bf16::supported() => unsafe { avx512_bf16::run(w, p) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Supported` holds only a path this CPU runs, i.e. the CPU has every
        // feature the path is compiled for.
        Isa::Avx512 => unsafe { avx512::run(w, p) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { avx2::run(w, p) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        Isa::Neon => unsafe { neon::run(w, p) },
        _ => scalar::run(w, p),
    }
}

/// Cut every (sequence, head group) into runs of whole blocks.
fn plan(tables: &SeqTables, bs: usize, groups: usize, threads: usize, split: Option<usize>) -> Vec<Item> {
    let n = tables.len();
    let chunk_blocks = match split {
        Some(0) => usize::MAX,
        Some(t) => t.div_ceil(bs).max(1),
        None => {
            // About four items per thread, so that uneven lengths still balance; only
            // sequences longer than that share are split, and never below 256 tokens:
            // smaller chunks cost more in merging and lost streaming than they gain.
            let blocks: usize = (0..n).map(|i| tables.seq(i).0.len()).sum::<usize>() * groups;
            blocks.div_ceil(4 * threads).max(256usize.div_ceil(bs)).max(1)
        }
    };
    let mut items = Vec::new();
    for seq in 0..n {
        let (blocks, len) = tables.seq(seq);
        for group in 0..groups {
            let mut b0 = 0usize;
            loop {
                let b1 = blocks.len().min(b0.saturating_add(chunk_blocks));
                let ntok = len.min(b1 * bs) - (b0 * bs).min(len);
                items.push(Item { seq, group, blocks: b0..b1, ntok });
                b0 = b1;
                if b0 >= blocks.len() {
                    break;
                }
            }
        }
    }
    items
}

/// Combine the partials of each (sequence, head group) into `out` (and `lse`).
#[allow(clippy::too_many_arguments)]
fn merge(
    items: &[Item],
    acc: &[f32],
    m: &[f32],
    l: &[f32],
    per_item: usize,
    d: usize,
    out: &mut [f32],
    lse: Option<&mut [f32]>,
    pool: &rayon::ThreadPool,
) {
    // Items are ordered by (seq, group): consecutive runs belong to one output chunk.
    let mut starts = vec![0];
    for i in 1..items.len() {
        if (items[i].seq, items[i].group) != (items[i - 1].seq, items[i - 1].group) {
            starts.push(i);
        }
    }
    starts.push(items.len());
    let mut lse_buf;
    let lse = match lse {
        Some(x) => x,
        None => {
            lse_buf = vec![0f32; out.len() / d.max(1)];
            &mut lse_buf[..]
        }
    };
    pool.install(|| {
        out.par_chunks_mut(per_item * d).zip(lse.par_chunks_mut(per_item)).enumerate().for_each(|(c, (o, ls))| {
            let parts = starts[c]..starts[c + 1];
            for h in 0..per_item {
                let mx = parts.clone().map(|i| m[i * per_item + h]).fold(f32::NEG_INFINITY, f32::max);
                let row = &mut o[h * d..(h + 1) * d];
                row.fill(0.0);
                if mx == f32::NEG_INFINITY {
                    ls[h] = f32::NEG_INFINITY;
                    continue;
                }
                let mut total = 0f32;
                for i in parts.clone() {
                    let w = (m[i * per_item + h] - mx).exp2();
                    total += w * l[i * per_item + h];
                    for (x, &a) in row.iter_mut().zip(&acc[(i * per_item + h) * d..][..d]) {
                        *x += w * a;
                    }
                }
                let inv = 1.0 / total;
                row.iter_mut().for_each(|x| *x *= inv);
                ls[h] = (mx + total.log2()) * std::f32::consts::LN_2;
            }
        })
    });
}

#[cfg(test)]
mod tests;
