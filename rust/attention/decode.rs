//! Decode attention over a batch: check the call, cut it into work items (`plan`), run
//! each on the chosen instruction-set path (`run_item`, the dispatch) on the kernels'
//! thread pool; each item's partial becomes the output in [`super::partials`].

use std::ops::Range;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
#[cfg(target_arch = "x86_64")]
use super::isa::Isa;
use super::isa::{Features, Supported};
#[cfg(target_arch = "x86_64")]
use super::route::Kernel512;
use super::route::Route;
use super::options::{check_soft_cap, Kernel, Precision, Tuning};
use super::scalar;
use super::tables::{SeqTables, Visible};
use super::query::{int8_query, scaled_query};
use super::partials::{finish_alone, merge_split, scratch_rows, slots, spans, Rows, Slot};
use super::wide::{self, all_finite, Logits};
use super::work::{lse_or_scratch, Partial, Work};
use super::simd::run_on;
#[cfg(target_arch = "x86_64")]
use super::{avx512_bf16, avx512_e4m3, avx512_fp16, avx512_vnni};
use crate::error::Result;
use crate::invalid;
use crate::runtime::threads::run_workers;
use crate::kv::{DType, Elem, KvCache};

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
    let features = opts.tuning.features();
    let shape = cache.shape();
    let (n, d, hkv) = (tables.len(), shape.head_dim, shape.num_kv_heads);
    let Checked { g, scale, isa, kpi } = check_call(cache, n, q.len(), out.len(), lse.as_ref().map(|l| l.len()), num_q_heads, opts, features)?;
    let route = Route::select(Kernel::Decode, isa, features, cache.dtype(), opts.precision, shape);
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
                run_item(route, &work, p);
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

/// Run one work item on its call's route; safe for any input because only
/// [`Route::select`] makes a route.
fn run_item<E: Elem>(route: Route, w: &Work<E>, p: &mut Partial) {
    if !run_precision(route, w, p) {
        run_on(route.path(), w, p);
    }
    // The AVX-512 path read an e4m3 NaN code as a number (it checks tiles instead of
    // every conversion): the item runs again on the AVX2 path, whose conversion gives
    // NaN codes NaN and whose softmax treats a NaN score as the AVX-512 one did (a zero
    // weight), else on the scalar one.
    if p.nan_codes {
        p.reset();
        #[cfg(target_arch = "x86_64")]
        if let Some(avx2) = Supported::check(Isa::Avx2, route.features()) {
            run_on(avx2, w, p);
            return;
        }
        scalar::run(w, p);
    }
}

/// The item on the kernel of an AVX-512 precision that computes with other instructions,
/// where the route chose one: whether it ran (else the path's own loop runs it).
#[cfg(target_arch = "x86_64")]
fn run_precision<E: Elem>(route: Route, w: &Work<E>, p: &mut Partial) -> bool {
    if route.path().isa() != Isa::Avx512 {
        return false;
    }
    // SAFETY: (every arm) the route's path is AVX-512, so the CPU has its features
    // (`Supported`); `Route::select` chose each kernel only where its features, a subset
    // of this CPU's, have the feature the kernel adds.
    unsafe {
        match route.kernel() {
            Kernel512::Bf16Dot => avx512_bf16::run(w, p),
            Kernel512::Int8Dot => avx512_vnni::run(w, p),
            Kernel512::F16 { .. } if avx512_fp16::scales_fit(w) => avx512_fp16::run(w, p),
            Kernel512::F16 { tables: true } | Kernel512::Tables => avx512_e4m3::run(w, p),
            Kernel512::F16 { tables: false } | Kernel512::Plain => return false,
        }
    }
    true
}

/// No precision has a kernel of its own off x86-64.
#[cfg(not(target_arch = "x86_64"))]
fn run_precision<E: Elem>(_: Route, _: &Work<E>, _: &mut Partial) -> bool {
    false
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
