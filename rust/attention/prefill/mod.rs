//! Paged multi-query attention: prefill, chunked prefill, speculative verification and
//! video chunks, over the same paged cache as [`super::decode_attention`].
//!
//! Sequence `i` owns query rows `qo_indptr[i]..qo_indptr[i + 1]` of `q` (`[total_q, Hq,
//! d]`, as FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` and vLLM's `cu_seqlens_q`)
//! and attends over its `len_i` cached keys under a [`Mask`] on logical positions (key
//! `j` is at position `j`; queries default to the positions of the last `n_q` keys).
//!
//! # How the work is cut
//!
//! A *work item* is (sequence, KV head, tile of about [`ROWS`]` / g` queries, key range).
//! Its rows (every query of the tile times the `g` query heads of the KV head) walk the
//! key range in tiles of `TW` keys ([`tile`]): each key tile is gathered from its blocks
//! into a contiguous f32 pack once and reused by every row (FlashAttention-style), tiles
//! that no row sees are skipped, tiles every row sees fully skip the mask. The micro-
//! kernels (`Q K^T`, online softmax, `P V`) are [`scalar`] and `simd`, written once over
//! the instruction set's vector (`Lanes`) and entered per instruction set (AVX2, AVX-512,
//! NEON), plus `avx512_bf16` (`vdpbf16ps` for bf16 queries and probabilities). When the batch has fewer
//! query tiles than about four per thread, key ranges are split and the partial results
//! merged by log-sum-exp, as decode does; items run longest first on the kernel pool.
//!
//! Softmax state is f32 in log2 units (queries pre-multiplied by `scale * log2(e)`,
//! `exp2` by the same Taylor polynomial as decode); the LSE is returned in natural log.

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;

use super::isa::Features;
use super::route::{Kernel512, Route};
use super::options::{check_soft_cap, Kernel, Precision, Tuning};
use super::tables::{SeqTables, Visible};
use super::query::scaled_query;
use super::wide::{self, all_finite, Logits};
use super::work::lse_or_scratch;
use crate::error::Result;
use crate::invalid;
use crate::runtime::threads::{inline, run_workers};
use crate::kv::{DType, Elem, KvCache};

#[cfg(target_arch = "x86_64")]
mod avx512_bf16;
mod mask;
mod pack_q8;
mod plan;
mod scalar;
mod simd;
mod tile;

pub use mask::{Mask, Span};
use tile::{Ctx, PvMode};

/// Target rows (queries x heads of a group) per work item. Each item reads its keys'
/// K/V from the cache once, so more rows read less memory per FLOP: on shape (a) of
/// `benches/bench_prefill.py` (one thread, `tests::timing_rows_per_item`, five alternating
/// rounds) 60 rows gave a median 49 GFLOP/s, 120 rows 54-58, 192-384 rows 58-62.
pub(crate) const ROWS: usize = 192;

/// Per-call options; `Default` is bidirectional with no cap (the Python default is
/// causal).
#[derive(Clone, Debug, Default)]
pub struct PrefillOptions {
    pub mask: Mask,
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Gemma-2 logit soft cap: logits become `cap * tanh(logit / cap)`.
    pub logits_soft_cap: Option<f32>,
    /// The operand dtypes ([`Precision`]): a bf16 query (bf16 and fp8 caches; on
    /// AVX-512 with avx512_bf16 and a bf16 cache the scores take `vdpbf16ps`), bf16
    /// probabilities (bf16 caches: rounded to nearest even for `P V`, which then takes
    /// `vdpbf16ps` over token pairs with avx512_bf16, elsewhere f32 FMAs on the rounded
    /// probabilities; the softmax sum stays f32 on the unrounded ones, so each output
    /// moves by at most `2^-9 * max|V|`).
    pub precision: Precision,
    /// `kv_heads_per_item` must be `None`: items are cut by rows.
    pub tuning: Tuning,
    /// Rows (queries x heads of a group) per work item; `None` is [`ROWS`].
    pub rows_per_item: Option<usize>,
}

/// The queries of a call: `q` `[total_q, num_q_heads, d]`, `qo_indptr` `n + 1` row
/// offsets, optional logical positions per row.
pub struct Queries<'a> {
    pub q: &'a [f32],
    pub num_q_heads: usize,
    pub qo_indptr: &'a [i64],
    pub positions: Option<&'a [i64]>,
}

/// Multi-query attention over `layer` of `cache`.
///
/// `out`: `[total_q, Hq, d]`; `lse` (optional): `[total_q, Hq]`, natural log of the sum
/// of `exp(logit)` over the visible keys (`-inf`, with a zero output, for a row that sees
/// none).
///
/// Only the blocks holding a key some query sees are read, and only their table entries
/// are checked (a window's released blocks may be pads or stale ids).
///
/// Errors: shapes or head counts that do not match, offsets that are not a
/// non-decreasing cover of the rows, more default-positioned queries than keys, negative
/// positions, `chunk_size` without `causal` or of 0, a non-finite scale, a soft cap that
/// is not finite and positive, an unsupported path, a precision not valid on the cache
/// ([`Precision::check`]), `kv_heads_per_item` in the tuning, a block holding visible keys that is not a block of the pool.
pub fn prefill_attention(
    cache: &KvCache,
    layer: usize,
    qs: &Queries,
    tables: &SeqTables,
    out: &mut [f32],
    lse: Option<&mut [f32]>,
    opts: &PrefillOptions,
) -> Result<()> {
    let features = opts.tuning.features();
    let shape = cache.shape();
    let (d, hkv, hq) = (shape.head_dim, shape.num_kv_heads, qs.num_q_heads);
    if hq == 0 || !hq.is_multiple_of(hkv) {
        return Err(invalid!("{hq} query heads is not a positive multiple of {hkv} KV heads"));
    }
    let total_q = check_indptr(qs.qo_indptr, tables.len())?;
    let want = total_q.checked_mul(hq * d).ok_or_else(|| invalid!("qo_indptr: too many query rows"))?;
    if qs.q.len() != want || out.len() != want {
        return Err(invalid!(
            "q and out must be [{total_q}, {hq}, {d}] ({want} values), got {} and {}",
            qs.q.len(),
            out.len()
        ));
    }
    if lse.as_ref().is_some_and(|l| l.len() != total_q * hq) {
        return Err(invalid!("lse must be [{total_q}, {hq}]"));
    }
    let (scale, factor) = check_options(cache, opts, d, features)?;
    if opts.rows_per_item == Some(0) {
        return Err(invalid!("rows_per_item must be >= 1"));
    }
    let spans = spans(qs, tables, &opts.mask, total_q)?;
    // Only the keys some query sees are looked up, checked and read (a window's released
    // blocks, a pad, never); `tile::pack` zero-fills the others.
    let vis = tables.select(|i, _, r| {
        for s in &spans[qs.qo_indptr[i] as usize..qs.qo_indptr[i + 1] as usize] {
            r.extend([0..s.sink_end, s.lo..s.hi]);
        }
    })?;
    let path = opts.tuning.path(features)?;
    let route = Route::select(Kernel::Prefill, path, features, cache.dtype(), opts.precision, shape);
    let pool = crate::runtime::threads::pool()?;
    let Precision { q: q_dtype, pv: pv_dtype } = opts.precision;
    let (qv, q_bf16) = scaled_query(qs.q, d, factor, q_dtype == DType::BF16);
    let dot = route.kernel() == Kernel512::Bf16Dot;
    let use_dot = q_dtype == DType::BF16 && dot;
    let g = hq / hkv;
    let item_rows = opts.rows_per_item.unwrap_or(ROWS);
    let plan = plan::plan(qs.qo_indptr, &spans, hkv, g, pool.current_num_threads(), opts.tuning.split_tokens, item_rows);
    let items = &plan.items;
    let offsets: Vec<usize> = std::iter::once(0)
        .chain(items.iter().scan(0, |acc, it| {
            *acc += (it.q1 - it.q0) * g;
            Some(*acc)
        }))
        .collect();
    let rows = *offsets.last().unwrap_or(&0);
    let mut acc = vec![0f32; rows * d];
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0f32; rows];
    crate::with_elem!(cache.dtype(), E => {
        let (k, v) = cache.layer::<E>(layer)?;
        let zeros = vec![E::from_f32(0.0); d];
        let ctx = Ctx {
            k, v, scales: cache.scales(layer)?, shape, vis: &vis, zeros: &zeros, hq, g, qs: &qv, spans: &spans, path,
            q_bf16: use_dot.then_some((&q_bf16[..], scale * if opts.logits_soft_cap.is_some() { 1.0 } else { std::f32::consts::LOG2_E })),
            soft_cap: opts.logits_soft_cap,
            pv: match (pv_dtype == DType::BF16, dot) {
                (false, _) => PvMode::F32,
                (true, false) => PvMode::RoundedF32,
                (true, true) => PvMode::Dot,
            },
        };
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(items[i].cost));
        let mut parts: Vec<Mutex<tile::Partial>> = Vec::with_capacity(items.len());
        let (mut a_rest, mut m_rest, mut l_rest) = (&mut acc[..], &mut m[..], &mut l[..]);
        for i in 0..items.len() {
            let r = offsets[i + 1] - offsets[i];
            let (a, a2) = std::mem::take(&mut a_rest).split_at_mut(r * d);
            let (mm, m2) = std::mem::take(&mut m_rest).split_at_mut(r);
            let (ll, l2) = std::mem::take(&mut l_rest).split_at_mut(r);
            (a_rest, m_rest, l_rest) = (a2, m2, l2);
            parts.push(Mutex::new(tile::Partial { acc: a, m: mm, l: ll }));
        }
        let next = AtomicUsize::new(0);
        run_workers(&pool, items.len(), || {
            let mut scratch = tile::Scratch::new(d);
            while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                // Each index is handed out once, so the lock is never contended.
                let mut p = parts[i].lock().unwrap_or_else(|e| e.into_inner());
                tile::run_item(&ctx, &items[i], &mut p, &mut scratch);
            }
        });
    });
    let parts = plan::Parts { plan: &plan, offsets: &offsets, acc: &acc, m: &m, l: &l, g, d };
    let mut lse_buf = Vec::new();
    let lse = lse_or_scratch(lse, &mut lse_buf, total_q * hq);
    let overflowed = merge(&parts, total_q, hq, out, lse, &pool);
    if overflowed.is_empty() {
        return Ok(());
    }
    let logits = Logits { scale, soft_cap: opts.logits_soft_cap };
    recompute(cache, layer, qs, &vis, &spans, logits, overflowed, out, lse)
}

/// Compute the query rows `rows` again in f64 ([`wide`]): their merged output was not
/// finite. Kept out of line: it runs only after an overflow.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn recompute(
    cache: &KvCache,
    layer: usize,
    qs: &Queries,
    vis: &Visible,
    spans: &[Span],
    logits: Logits,
    rows: Vec<usize>,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    let (d, hq) = (cache.shape().head_dim, qs.num_q_heads);
    let g = hq / cache.shape().num_kv_heads;
    crate::with_elem!(cache.dtype(), E => {
        let (k, v) = cache.layer::<E>(layer)?;
        let layer = wide::Layer { k, v, scales: cache.scales(layer)?, shape: cache.shape() };
        for qi in rows {
            let seq = qs.qo_indptr.partition_point(|&x| x as usize <= qi) - 1;
            let Span { sink_end, lo, hi } = spans[qi];
            let sees = |t: usize| t < sink_end || (lo..hi).contains(&t);
            for h in 0..hq {
                let at = (qi * hq + h) * d;
                let row = &mut out[at..at + d];
                lse[qi * hq + h] = wide::row(&layer, vis, seq, sees, &qs.q[at..at + d], h / g, logits, row);
            }
        }
    });
    Ok(())
}

/// Validate `qo_indptr` for `n` sequences; returns the total query rows.
fn check_indptr(indptr: &[i64], n: usize) -> Result<usize> {
    if indptr.len() != n + 1 {
        return Err(invalid!("qo_indptr has {} entries for {n} sequences (expected n + 1)", indptr.len()));
    }
    if indptr[0] != 0 {
        return Err(invalid!("qo_indptr[0] must be 0, got {}", indptr[0]));
    }
    if let Some(i) = (0..n).find(|&i| indptr[i + 1] < indptr[i]) {
        return Err(invalid!("qo_indptr must be non-decreasing: qo_indptr[{}] = {} < {}", i + 1, indptr[i + 1], indptr[i]));
    }
    Ok(indptr[n] as usize)
}

/// Validate the options; returns `(scale, factor)`, the factor the query is multiplied by
/// (`scale * log2(e)`, or `scale` alone with a soft cap, applied after the cap).
fn check_options(cache: &KvCache, opts: &PrefillOptions, d: usize, features: Features) -> Result<(f32, f32)> {
    let scale = opts.scale.unwrap_or(1.0 / (d as f32).sqrt());
    if !scale.is_finite() {
        return Err(invalid!("scale must be finite, got {scale}"));
    }
    check_soft_cap(opts.logits_soft_cap)?;
    let mk = &opts.mask;
    if mk.chunk_size == Some(0) {
        return Err(invalid!("chunk_size must be >= 1"));
    }
    if mk.chunk_size.is_some() && !mk.causal {
        return Err(invalid!("chunk_size (block-causal) needs causal=True; causal=False with chunks is contradictory"));
    }
    opts.tuning.path(features)?;
    if opts.tuning.kv_heads_per_item.is_some() {
        return Err(invalid!("kv_heads_per_item is a decode knob: prefill cuts its items by rows"));
    }
    opts.precision.check(Kernel::Prefill, cache.dtype())?;
    let factor = if opts.logits_soft_cap.is_some() { scale } else { scale * std::f32::consts::LOG2_E };
    Ok((scale, factor))
}

/// The visible keys of every query row.
fn spans(qs: &Queries, tables: &SeqTables, mask: &Mask, total_q: usize) -> Result<Vec<Span>> {
    if let Some(p) = qs.positions {
        if p.len() != total_q {
            return Err(invalid!("q_positions has {} entries for {total_q} query rows", p.len()));
        }
        if let Some(i) = p.iter().position(|&x| x < 0) {
            return Err(invalid!("q_positions[{i}] = {} is negative", p[i]));
        }
    }
    let mut out = Vec::with_capacity(total_q);
    for i in 0..tables.len() {
        let len = tables.seq_len(i);
        let (a, b) = (qs.qo_indptr[i] as usize, qs.qo_indptr[i + 1] as usize);
        if qs.positions.is_none() && b - a > len {
            return Err(invalid!(
                "sequence {i} has {} queries but only {len} keys (seq_lens): default positions \
                 are those of the last n_q keys; pass q_positions",
                b - a
            ));
        }
        for r in a..b {
            let p = match qs.positions {
                Some(p) => p[r] as u64,
                None => (len - (b - a) + (r - a)) as u64,
            };
            out.push(mask.span(p, len));
        }
    }
    Ok(out)
}

/// Combine the partials of every (query tile, KV head) into `out` and `lse`; returns the
/// query rows whose output is not finite (for [`wide`]).
fn merge(parts: &plan::Parts, total_q: usize, hq: usize, out: &mut [f32], lse: &mut [f32], pool: &rayon::ThreadPool) -> Vec<usize> {
    let d = parts.d;
    if d == 0 || total_q == 0 {
        return Vec::new();
    }
    let overflowed = Mutex::new(Vec::new());
    let body = |(qi, (o, ls)): (usize, (&mut [f32], &mut [f32]))| {
        parts.merge_row(qi, o, ls);
        if !all_finite(o) {
            overflowed.lock().unwrap_or_else(|e| e.into_inner()).push(qi);
        }
    };
    // One query row, or one thread: merged on the calling thread.
    if inline(pool, total_q) {
        out.chunks_mut(hq * d).zip(lse.chunks_mut(hq)).enumerate().for_each(body);
    } else {
        pool.install(|| out.par_chunks_mut(hq * d).zip(lse.par_chunks_mut(hq)).enumerate().for_each(body));
    }
    overflowed.into_inner().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
