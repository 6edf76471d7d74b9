//! Decode attention over a batch: check the call, cut it into work items (`plan`), run
//! each on the chosen instruction-set path (`run_item`, the dispatch) on the kernels'
//! thread pool; each item's partial becomes the output in [`super::partials`].

use std::ops::Range;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use super::isa::{Features, Isa, Supported};
use super::options::{check_soft_cap, Kernel, Precision, Tuning};
use super::scalar;
use super::tables::{SeqTables, Visible};
use super::query::{int8_query, scaled_query};
use super::partials::{finish_alone, merge_split, scratch_rows, slots, spans, Rows, Slot};
use super::wide::{self, all_finite, Logits};
use super::work::{lse_or_scratch, Partial, Work};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512, avx512_bf16, avx512_e4m3, avx512_fp16, avx512_vnni};
#[cfg(target_arch = "aarch64")]
use super::neon;
use crate::error::Result;
use crate::invalid;
use crate::runtime::threads::run_workers;
use crate::kv::{DType, Elem, KvCache, KvShape};

/// Per-call options; `Default` is what Python gets without keywords.
#[derive(Clone, Debug, Default)]
pub struct DecodeOptions {
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Gemma-2 logit soft cap: logits become `cap * tanh(logit / cap)`.
    pub logits_soft_cap: Option<f32>,
    /// Sliding window: the query at `p = len - 1` sees keys `k` with `p - k <= w`
    /// (`None`: every key).
    pub window_left: Option<usize>,
    /// Keys `k < sink_tokens` are visible whatever the window.
    pub sink_tokens: usize,
    /// The operand dtypes ([`Precision`]). A bf16 query (bf16 and fp8 caches) takes
    /// `vdpbf16ps` scores on AVX-512 with avx512_bf16 ([`avx512_bf16`]); an int8 query
    /// (int8 caches, quantized per row: `max|q| / 127`, round half to even) exact
    /// integer scores by `vpdpbusd` with avx512_vnni ([`avx512_vnni`]); f16 query and
    /// probabilities (fp8 caches) f16 products and sums with avx512fp16 for block size
    /// 16 and a head_dim that is a multiple of 64 ([`avx512_fp16`], which derives the
    /// bound). Every other path computes the rounded operands with f32 FMAs.
    pub precision: Precision,
    pub tuning: Tuning,
}

/// One work item: KV head group `group` of sequence `seq`, the blocks `blocks` of
/// [`Visible::blocks`], tokens `start..ntok` counted from the first block's first token.
#[derive(Clone, Debug)]
pub(super) struct Item {
    pub(super) seq: usize,
    pub(super) group: usize,
    pub(super) blocks: Range<usize>,
    pub(super) start: usize,
    pub(super) ntok: usize,
}

/// The keys the decode query of a sequence of `len` tokens sees (at `p = len - 1`): the
/// window `max(0, p - w)..len` and the sinks `0..min(sinks, len)`.
pub(super) fn visible_keys(len: usize, window_left: Option<usize>, sinks: usize, out: &mut Vec<Range<usize>>) {
    if len == 0 {
        return;
    }
    out.push(window_left.map_or(0, |w| (len - 1).saturating_sub(w))..len);
    out.push(0..sinks.min(len));
}

/// Decode attention over `layer` of `cache`.
///
/// `q`: f32 `[n, num_q_heads, head_dim]`; `out`: the same shape; `lse` (optional):
/// `[n, num_q_heads]` natural-log sum of `exp(scale * q.k)` (`-inf` for an empty
/// sequence, whose output is 0).
///
/// Only the blocks holding a key the query sees (window and sinks of `opts`, on logical
/// positions) are read, and only their table entries are checked.
///
/// Errors: shapes or head counts that do not match the cache, an unsupported or unknown
/// path, a non-finite scale, a KV head split that does not divide the KV heads, a block
/// holding visible keys that is not a block of the pool (a pad, a released page).
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
    decode_attention_on(Features::cpu(), cache, layer, q, num_q_heads, tables, out, lse, opts)
}

/// [`decode_attention`] choosing its routes by `features` (this CPU's, or fewer: a test
/// runs the routes of a CPU without some of them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_attention_on(
    features: Features,
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
    let Checked { g, scale, isa, kpi } = check_call(cache, n, q.len(), out.len(), lse.as_ref().map(|l| l.len()), num_q_heads, opts, features)?;
    let route = Route::select(isa, features, cache.dtype(), opts.precision, shape);
    let pool = crate::runtime::threads::pool()?;
    let vis = tables.select(|_, len, r| visible_keys(len, opts.window_left, opts.sink_tokens, r))?;
    let factor = scale * std::f32::consts::LOG2_E;
    let q_dtype = opts.precision.q;
    let (qs, q_bf16, q_i8) = if q_dtype == DType::I8 {
        let (deq, buf) = int8_query(q, d, factor);
        (deq, Vec::new(), Some(buf))
    } else {
        let (qs, pairs) = scaled_query(q, d, factor, q_dtype == DType::BF16);
        (qs, pairs, None)
    };
    let items = plan(&vis, n, shape.block_size, hkv / kpi, pool.current_num_threads(), opts.tuning.split_tokens);

    let per_item = kpi * g;
    let rows = Rows { per_item, d };
    let nan_check = cache.raw_writes();
    let spans = spans(items.iter().map(|it| (it.seq, it.group)));
    let mut lse_buf = Vec::new();
    let lse = lse_or_scratch(lse, &mut lse_buf, n * num_q_heads);
    let mut acc = vec![0f32; scratch_rows(&spans, rows) * d];
    let mut m = vec![f32::NEG_INFINITY; items.len() * per_item];
    let mut l = vec![0f32; items.len() * per_item];
    let (slots, splits) = slots(&spans, rows, out, lse, &mut acc, &mut m, &mut l);
    // Items alone in their chunk whose finished rows are not finite (see `wide`).
    let overflowed = Mutex::new(Vec::new());
    crate::with_elem!(cache.dtype(), E => {
        let (k, v) = cache.layer::<E>(layer)?;
        let scales = cache.scales(layer)?;
        // Longest item first, each thread taking the next item as it frees up (greedy
        // LPT list scheduling): with a few uneven items, rayon's halving of the item list
        // can leave one core waiting on the other's last long item.
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(items[i].ntok - items[i].start));
        let next = AtomicUsize::new(0);
        run_workers(&pool, items.len(), || {
            while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                let it = &items[i];
                let heads = it.group * kpi..(it.group + 1) * kpi;
                let qrow = (it.seq * num_q_heads + heads.start * g) * d;
                let work = Work {
                    k,
                    v,
                    scales,
                    shape,
                    g,
                    blocks: &vis.blocks()[it.blocks.clone()],
                    start: it.start,
                    ntok: it.ntok,
                    heads,
                    q: &qs[qrow..qrow + per_item * d],
                    q_bf16: (q_dtype == DType::BF16).then(|| {
                        let pairs = d.div_ceil(2);
                        let at = qrow / d * pairs;
                        (&q_bf16[at..at + per_item * pairs], factor)
                    }),
                    q_i8: q_i8.as_ref().map(|b| b.rows(qrow / d, per_item, d)),
                    soft_cap: opts.logits_soft_cap.map(|c| c * std::f32::consts::LOG2_E),
                    nan_check,
                };
                // Each index is handed out once, so the lock is never contended.
                let mut slot = slots[i].lock().unwrap_or_else(|e| e.into_inner());
                let Slot { p, lse } = &mut *slot;
                if lse.is_some() {
                    // The caller's output, whatever it held.
                    p.acc.fill(0.0);
                }
                route.run(&work, p);
                if lse.as_deref_mut().is_some_and(|lse| !finish_alone(p, lse, d)) {
                    overflowed.lock().unwrap_or_else(|e| e.into_inner()).push((it.seq, it.group));
                }
            }
        });
    });
    drop(slots);
    merge_split(splits, rows, &acc, &m, &l, &pool);
    // The chunks to compute again: alone items flagged above, split chunks checked here.
    let mut redo: Vec<(usize, usize)> = overflowed.into_inner().unwrap_or_else(|e| e.into_inner());
    if redo.is_empty() && spans.iter().all(|s| s.len() == 1) {
        return Ok(());
    }
    redo.extend(spans.iter().filter(|s| s.len() > 1).map(|s| (items[s.start].seq, items[s.start].group)));
    let call = Call { q, num_q_heads, g, per_item, logits: Logits { scale, soft_cap: opts.logits_soft_cap } };
    recompute(cache, layer, &vis, &call, redo, out, lse)
}

/// The parts of a checked call [`recompute`] reads.
struct Call<'a> {
    q: &'a [f32],
    num_q_heads: usize,
    g: usize,
    per_item: usize,
    logits: Logits,
}

/// Compute again in f64 ([`wide`]) every chunk `(sequence, KV head group)` of `chunks`
/// whose rows of `out` are not finite. Kept out of line: it runs only after an overflow.
#[cold]
#[inline(never)]
fn recompute(cache: &KvCache, layer: usize, vis: &Visible, c: &Call, mut chunks: Vec<(usize, usize)>, out: &mut [f32], lse: &mut [f32]) -> Result<()> {
    let d = cache.shape().head_dim;
    chunks.retain(|&(seq, group)| {
        let at = (seq * c.num_q_heads + group * c.per_item) * d;
        !all_finite(&out[at..at + c.per_item * d])
    });
    crate::with_elem!(cache.dtype(), E => {
        let (k, v) = cache.layer::<E>(layer)?;
        let layer = wide::Layer { k, v, scales: cache.scales(layer)?, shape: cache.shape() };
        for (seq, group) in chunks {
            for qh in group * c.per_item..(group + 1) * c.per_item {
                let at = (seq * c.num_q_heads + qh) * d;
                let row = &mut out[at..at + d];
                lse[seq * c.num_q_heads + qh] = wide::row(&layer, vis, seq, |_| true, &c.q[at..at + d], qh / c.g, c.logits, row);
            }
        }
    });
    Ok(())
}

/// What a checked call runs with: query heads per KV head, the softmax scale, the path
/// and the KV heads per work item.
struct Checked {
    g: usize,
    scale: f32,
    isa: Supported,
    kpi: usize,
}

/// Every check of [`decode_attention`] on its arguments (`n` sequences), before any work.
#[allow(clippy::too_many_arguments)]
fn check_call(
    cache: &KvCache,
    n: usize,
    q_len: usize,
    out_len: usize,
    lse_len: Option<usize>,
    num_q_heads: usize,
    opts: &DecodeOptions,
    features: Features,
) -> Result<Checked> {
    let shape = cache.shape();
    let (d, hkv) = (shape.head_dim, shape.num_kv_heads);
    if num_q_heads == 0 || !num_q_heads.is_multiple_of(hkv) {
        return Err(invalid!("{num_q_heads} query heads is not a positive multiple of {hkv} KV heads"));
    }
    let want = n * num_q_heads * d;
    if q_len != want || out_len != want {
        return Err(invalid!("q and out must be [{n}, {num_q_heads}, {d}] ({want} values), got {q_len} and {out_len}"));
    }
    if let Some(l) = lse_len {
        if l != n * num_q_heads {
            return Err(invalid!("lse must be [{n}, {num_q_heads}], got {l} values"));
        }
    }
    let scale = opts.scale.unwrap_or(1.0 / (d as f32).sqrt());
    if !scale.is_finite() {
        return Err(invalid!("scale must be finite, got {scale}"));
    }
    let isa = opts.tuning.path(features)?;
    let kpi = opts.tuning.kv_heads_per_item.unwrap_or(hkv);
    if kpi == 0 || !hkv.is_multiple_of(kpi) {
        return Err(invalid!("kv_heads_per_item {kpi} must divide the {hkv} KV heads"));
    }
    check_soft_cap(opts.logits_soft_cap)?;
    opts.precision.check(Kernel::Decode, cache.dtype())?;
    Ok(Checked { g: num_q_heads / hkv, scale, isa, kpi })
}

/// The kernel every work item of a call runs, chosen once per call by [`Route::select`]
/// from the path, the features, the cache's dtype, the precision and the shape. Only
/// `select` makes one (the fields are private to this module), so holding one proves the
/// feature checks the `unsafe` calls of [`Route::run`] rely on.
#[derive(Clone, Copy, Debug)]
struct Route {
    path: Supported,
    kernel: Kernel512,
    /// The features the route was chosen with (for the NaN-code rerun's path).
    features: Features,
}

/// The AVX-512 path's kernels beyond its own tile loop (`Plain` elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel512 {
    Plain,
    /// `vdpbf16ps` scores: a bf16 query on a bf16 cache, or on fp8 with avx512vbmi.
    Bf16Dot,
    /// `vpdpbusd` scores: an int8 query on an int8 cache.
    Int8Dot,
    /// f16 scores and `P V` (fp8, block size 16, head_dim a multiple of 64) where an
    /// item's scales allow it, else `Tables` (`tables`) or `Plain`.
    F16 { tables: bool },
    /// e4m3 widened by byte tables (block size 16, head_dim a multiple of 64, avx512vbmi).
    Tables,
}

impl Route {
    /// The one selection: what runs on `path` with `features` (a subset of this CPU's).
    fn select(path: Supported, features: Features, kv: DType, precision: Precision, shape: KvShape) -> Self {
        let has = |f: &str| features.has(f);
        let tables = kv == DType::E4M3 && has("avx512vbmi") && avx512_tables_fit(shape);
        let fp8 = matches!(kv, DType::E4M3 | DType::E5M2);
        let kernel = match (path.isa(), precision.q) {
            (Isa::Avx512, DType::BF16) if has("avx512bf16") && (kv == DType::BF16 || fp8 && has("avx512vbmi")) => Kernel512::Bf16Dot,
            (Isa::Avx512, DType::I8) if has("avx512vnni") => Kernel512::Int8Dot,
            (Isa::Avx512, DType::F16) if fp8 && has("avx512fp16") && avx512_tables_fit(shape) => Kernel512::F16 { tables },
            (Isa::Avx512, _) if tables => Kernel512::Tables,
            _ => Kernel512::Plain,
        };
        Route { path, kernel, features }
    }

    /// Run one work item; safe for any input because only [`Route::select`] makes a route.
    fn run<E: Elem>(self, w: &Work<E>, p: &mut Partial) {
        #[cfg(target_arch = "x86_64")]
        if self.path.isa() == Isa::Avx512 {
            // SAFETY: (every arm) `self.path` holds the AVX-512 path, so the CPU has its
            // features (`Supported`); `select` chose each other kernel only where
            // `features`, a subset of this CPU's, has the feature it adds.
            unsafe {
                match self.kernel {
                    Kernel512::Bf16Dot => avx512_bf16::run(w, p),
                    Kernel512::Int8Dot => avx512_vnni::run(w, p),
                    Kernel512::F16 { .. } if avx512_fp16::scales_fit(w) => avx512_fp16::run(w, p),
                    Kernel512::F16 { tables: true } | Kernel512::Tables => avx512_e4m3::run(w, p),
                    Kernel512::F16 { tables: false } | Kernel512::Plain => avx512::run(w, p),
                }
            }
        } else {
            self.run_path(w, p);
        }
        #[cfg(not(target_arch = "x86_64"))]
        self.run_path(w, p);
        // The AVX-512 path read an e4m3 NaN code as a number (it checks tiles instead of
        // every conversion): the item runs again on the AVX2 path, whose conversion gives
        // NaN codes NaN and whose softmax treats a NaN score as the AVX-512 one did (a zero
        // weight), else on the scalar one.
        if p.nan_codes {
            p.reset();
            #[cfg(target_arch = "x86_64")]
            if Supported::check(Isa::Avx2, self.features).is_some() {
                // SAFETY: `Supported::check` found the AVX2 path's features.
                unsafe { avx2::run(w, p) };
                return;
            }
            scalar::run(w, p);
        }
    }

    /// The paths without kernels of their own.
    fn run_path<E: Elem>(self, w: &Work<E>, p: &mut Partial) {
        match self.path.isa() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Supported` holds only a path this CPU runs, i.e. the CPU has every
            // feature the path is compiled for.
            Isa::Avx2 => unsafe { avx2::run(w, p) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above.
            Isa::Neon => unsafe { neon::run(w, p) },
            _ => scalar::run(w, p),
        }
    }
}

/// The shape the AVX-512 byte-table and f16 kernels take: block size 16, head_dim a
/// multiple of 64 (4 rows of 16 tokens are 64 adjacent codes).
fn avx512_tables_fit(shape: KvShape) -> bool {
    shape.block_size == 16 && shape.head_dim.is_multiple_of(64)
}

/// Cut every (sequence, head group)'s visible runs into items of whole blocks (at least
/// one item per pair, empty for a sequence without keys, so that the merge sees it).
pub(super) fn plan(vis: &Visible, n: usize, bs: usize, groups: usize, threads: usize, split: Option<usize>) -> Vec<Item> {
    let chunk_blocks = match split {
        Some(0) => usize::MAX,
        Some(t) => t.div_ceil(bs).max(1),
        None => {
            // About four items per thread, so that uneven lengths still balance; only
            // sequences longer than that share are split, and never below 256 tokens:
            // smaller chunks cost more in merging and lost streaming than they gain.
            let blocks: usize = (0..n).flat_map(|i| vis.runs(i)).map(|r| r.num_blocks(bs)).sum::<usize>() * groups;
            blocks.div_ceil(4 * threads).max(256usize.div_ceil(bs)).max(1)
        }
    };
    let mut items = Vec::new();
    for seq in 0..n {
        for group in 0..groups {
            let first = items.len();
            for run in vis.runs(seq) {
                let (b0, nb) = (run.first_block(bs), run.num_blocks(bs));
                let mut c = 0;
                while c < nb {
                    let c1 = nb.min(c.saturating_add(chunk_blocks));
                    let base = (b0 + c) * bs;
                    let (lo, hi) = (run.tok0.max(base), run.tok1.min((b0 + c1) * bs));
                    items.push(Item { seq, group, blocks: run.at + c..run.at + c1, start: lo - base, ntok: hi - base });
                    c = c1;
                }
            }
            if items.len() == first {
                items.push(Item { seq, group, blocks: 0..0, start: 0, ntok: 0 });
            }
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(block_size: usize, head_dim: usize) -> KvShape {
        KvShape { num_layers: 1, num_blocks: 4, block_size, num_kv_heads: 1, head_dim }
    }

    fn pair(q: DType, pv: DType) -> Precision {
        Precision { q, pv }
    }

    /// Each kernel is chosen exactly where its feature, dtype, precision and shape allow,
    /// and a set without the feature falls back as a CPU without it would.
    #[test]
    fn the_route_follows_the_features_it_is_given() {
        let cpu = Features::cpu();
        let Some(avx512) = Supported::check(Isa::Avx512, cpu) else {
            eprintln!("SKIPPED the AVX-512 routes: this CPU lacks AVX-512");
            return;
        };
        let kernel = |f: Features, kv, p, s| Route::select(avx512, f, kv, p, s).kernel;
        let (exact, bf16, int8, f16) = (Precision::EXACT, pair(DType::BF16, DType::F32), pair(DType::I8, DType::F32), pair(DType::F16, DType::F16));
        let (tiles, odd) = (shape(16, 128), shape(8, 65));
        let none = cpu.without(&["avx512bf16", "avx512vnni", "avx512vbmi", "avx512fp16"]);
        for s in [tiles, odd] {
            for (kv, p) in [(DType::BF16, bf16), (DType::E5M2, bf16), (DType::I8, int8), (DType::E5M2, f16), (DType::E4M3, exact)] {
                assert_eq!(kernel(none, kv, p, s), Kernel512::Plain, "{kv:?} {p:?} {s:?}");
            }
        }
        let has = |f: &str| cpu.has(f);
        let expect = |on: bool, k| if on { k } else { Kernel512::Plain };
        assert_eq!(kernel(cpu, DType::BF16, bf16, odd), expect(has("avx512bf16"), Kernel512::Bf16Dot));
        assert_eq!(kernel(cpu, DType::E5M2, bf16, odd), expect(has("avx512bf16") && has("avx512vbmi"), Kernel512::Bf16Dot));
        assert_eq!(kernel(cpu.without(&["avx512vbmi"]), DType::E5M2, bf16, odd), Kernel512::Plain);
        assert_eq!(kernel(cpu, DType::I8, int8, odd), expect(has("avx512vnni"), Kernel512::Int8Dot));
        assert_eq!(kernel(cpu, DType::I8, exact, tiles), Kernel512::Plain);
        assert_eq!(kernel(cpu, DType::E4M3, exact, tiles), expect(has("avx512vbmi"), Kernel512::Tables));
        assert_eq!(kernel(cpu, DType::E4M3, exact, odd), Kernel512::Plain);
        assert_eq!(kernel(cpu, DType::E5M2, exact, tiles), Kernel512::Plain);
        let tables = has("avx512vbmi");
        assert_eq!(kernel(cpu, DType::E4M3, f16, tiles), if has("avx512fp16") { Kernel512::F16 { tables } } else { expect(tables, Kernel512::Tables) });
        assert_eq!(kernel(cpu, DType::E4M3, f16, odd), Kernel512::Plain);
        // The other paths have no kernels of their own.
        for isa in [Isa::Scalar, Isa::Avx2] {
            let path = Supported::check(isa, cpu).expect("an AVX-512 CPU runs AVX2 and scalar");
            assert_eq!(Route::select(path, cpu, DType::BF16, bf16, odd).kernel, Kernel512::Plain);
        }
    }
}
