//! `prefill_attention` and `prefill_attention_paged` for Python.
//!
//! Every argument is converted and checked with the GIL held and no Rust lock taken;
//! the cache's read lock is taken only inside `py.detach` (the GIL released), around
//! the table validation and the kernel, and any error is turned into a Python exception
//! after the guard is gone.

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use pyo3::prelude::*;

use super::arrays::f32_input;
use super::attention::{q_shape, run_into, PyKernelTuning, Tables};
use super::convert::{arg, int_vec};
use super::errors::{invalid, IntoPyResult};
use super::kv::PyKvCache;
use crate::attention::prefill::{self, Mask, PrefillOptions, Queries};
use crate::attention::{Precision, Tuning};
use crate::attention::tables::SeqTables;

/// An optional non-negative int keyword (absent or None is `None`), naming `name` in errors.
fn opt_count(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<usize>> {
    obj.map_or(Ok(None), |o| arg::opt_count(o, name))
}

/// The keyword options shared by both table forms.
struct Kw<'a, 'py> {
    q_positions: Option<&'a Bound<'py, PyAny>>,
    causal: bool,
    chunk_size: Option<&'a Bound<'py, PyAny>>,
    window_left: Option<&'a Bound<'py, PyAny>>,
    sink_tokens: Option<&'a Bound<'py, PyAny>>,
    scale: Option<f32>,
    logits_soft_cap: Option<f32>,
    out: Option<&'a Bound<'py, PyAny>>,
    return_lse: bool,
    q_dtype: &'a str,
    pv_dtype: &'a str,
    tuning: Option<PyRef<'py, PyKernelTuning>>,
}

impl Kw<'_, '_> {
    fn options(&self, py: Python<'_>) -> PyResult<PrefillOptions> {
        let chunk_size = opt_count(self.chunk_size, "chunk_size")?;
        if chunk_size == Some(0) {
            return Err(invalid(py, "chunk_size must be >= 1, got 0"));
        }
        if chunk_size.is_some() && !self.causal {
            return Err(invalid(py, "chunk_size (block-causal) needs causal=True"));
        }
        Ok(PrefillOptions {
            mask: Mask {
                causal: self.causal,
                chunk_size,
                window_left: opt_count(self.window_left, "window_left")?,
                sink_tokens: opt_count(self.sink_tokens, "sink_tokens")?.unwrap_or(0),
            },
            scale: self.scale,
            logits_soft_cap: self.logits_soft_cap,
            precision: Precision::parse(self.q_dtype, self.pv_dtype).py_err(py)?,
            tuning: self.tuning.as_deref().map_or_else(Tuning::default, |t| t.0),
            rows_per_item: None,
        })
    }
}

/// Validate everything, run the kernel with the GIL released, return `out` (and the LSE).
fn run<'py>(
    py: Python<'py>,
    cache: &Bound<'py, PyKvCache>,
    layer: usize,
    q: &Bound<'py, PyAny>,
    qo_indptr: &Bound<'py, PyAny>,
    tables: impl FnOnce(usize, usize, usize) -> crate::Result<SeqTables> + Send,
    kw: Kw<'_, 'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = kw.options(py)?;
    let indptr = int_vec(qo_indptr, "qo_indptr")?;
    let positions = kw.q_positions.filter(|p| !p.is_none()).map(|p| int_vec(p, "q_positions")).transpose()?;
    let qin = f32_input(q, "q")?;
    let (shape, storage) = cache.get().facts();
    let [total_q, hq, d] = q_shape(py, &qin, "total_q", shape.head_dim)?;
    if let Some(&end) = indptr.last().filter(|&&x| x != total_q as i64) {
        return Err(invalid(py, format!("qo_indptr ends at {end}, q has {total_q} rows")));
    }
    let (c, sinks, qv) = (cache.get(), opts.mask.sink_tokens, qin.values());
    run_into(py, q, kw.out, storage, [total_q, hq, d], kw.return_lse, |o, l| {
        let t = tables(shape.block_size, shape.num_blocks, sinks)?;
        let guard = c.read();
        let qs = Queries { q: qv, num_q_heads: hq, qo_indptr: &indptr, positions: positions.as_deref() };
        prefill::prefill_attention(&guard, layer, &qs, &t, o, l, &opts)
    })
}

/// Multi-query attention over the paged cache: prefill, chunked prefill, speculative
/// verification, video chunks.
///
/// Sequence ``i`` owns query rows ``qo_indptr[i]:qo_indptr[i + 1]`` of ``q`` and attends
/// over its ``seq_lens[i]`` cached tokens of layer ``layer``
/// (``out = softmax(scale * q K^T + mask) V`` per query head, ``K``/``V`` of KV head
/// ``h // g``, ``g = Hq / Hkv``). Positions are logical: key ``j`` of a sequence (the
/// token in slot ``j`` of its block table) has position ``j``; query rows take the
/// positions of the last ``n_q`` keys (chunked prefill after writing the chunk's K/V)
/// unless ``q_positions`` gives them. The masks combine (a key is visible when every
/// rule allows it): ``causal`` (``k <= p``), block-causal with ``chunk_size`` ``c``
/// (``k // c <= p // c``, replaces the token-causal rule), ``window_left`` ``w``
/// (``p - k <= w``) with ``sink_tokens`` ``s`` (keys ``k < s`` visible whatever the
/// window, still subject to the causal or block-causal rule); ``causal=False`` without
/// chunks is bidirectional. Only the blocks holding a key that some query of the sequence
/// sees are read, and only their table entries are checked: blocks a window left behind
/// may be pads (e.g. -1) or stale ids. The GIL is released while it runs, on the threads
/// of :func:`set_num_threads`; the arrays of :meth:`KvCache.key` / :meth:`KvCache.value`
/// for ``layer`` must not be written from another thread meanwhile.
///
/// 8-bit caches are dequantized (code x scale, f32) as each key tile is packed, so every
/// path computes on the values of :meth:`KvCache.dequantized`; the error against an
/// unquantized cache follows :func:`decode_attention`'s bound, row by row. As in
/// :func:`decode_attention`, the SIMD paths count a key under 2^-64 of their running
/// reference probability as 0 (a subnormal operand would cost an assist per multiply).
///
/// Args:
///     cache: the KV cache.
///     layer: ``0..cache.num_layers``.
///     q: float32 ``[total_q, Hq, head_dim]``, ``Hq`` a multiple of the cache's KV heads
///         (any strides: read in place when C-contiguous, else copied).
///     qo_indptr: ``n + 1`` int row offsets, from 0, non-decreasing, ending at ``total_q``.
///     block_tables: int ``[n, max_blocks]``, logical block ``b`` in column ``b``; only
///         the entries of blocks holding a visible key are read (entries past
///         ``ceil(seq_lens[i] / block_size)`` never are).
///     seq_lens: ``n`` logical lengths in tokens (keys of each sequence).
///     q_positions: ``total_q`` int logical positions (>= 0) of the query rows; default
///         the last ``n_q`` of ``seq_lens[i]``, which then needs ``n_q <= seq_lens[i]``.
///     causal: the causal rule (default True).
///     chunk_size: tokens per chunk of the block-causal rule (>= 1; needs ``causal``).
///     window_left: keys at most this many positions (tokens) behind the query are
///         visible (``window - 1``; FlashInfer's ``window_left``); None: no window.
///     sink_tokens: the first positions always visible under the window (tokens).
///     scale: the softmax scale, positive and finite (default ``1 / sqrt(head_dim)``).
///     logits_soft_cap: Gemma-2's cap ``c > 0``: logits become ``c * tanh(logit / c)``.
///     out: C-contiguous float32 ``[total_q, Hq, head_dim]`` written in place and
///         returned (default: a new array); must not share memory with ``q`` or with any
///         KvCache.
///     return_lse: also return the log-sum-exp, to merge partial results.
///     q_dtype: the query's dtype in the scores: ``"f32"`` (default, exact) or
///         ``"bf16"`` (bf16 and fp8 caches), as in :func:`decode_attention`, with its
///         bound; the ``"avx512"`` path of a CPU with avx512_bf16 uses ``vdpbf16ps`` on
///         bf16 caches.
///     pv_dtype: the probabilities' dtype in ``P V``: ``"f32"`` (default) or ``"bf16"``
///         (bf16 caches, with either ``q_dtype``): the probabilities rounded to bf16
///         (nearest even), ``vdpbf16ps`` over token pairs on the ``"avx512"`` path of a
///         CPU with avx512_bf16 (f32 FMAs on the rounded probabilities elsewhere); the
///         softmax sum stays f32 on the unrounded ones, so each output moves by at most
///         ``2^-9 * max|V|`` more.
///     tuning: a :class:`KernelTuning`: the kernel path and the split size (keys per
///         split of a query tile's key range, rounded up to key tiles; 0: never; None:
///         only when there are too few query tiles); ``kv_heads_per_item`` must be None.
///
/// Returns:
///     float32 ``[total_q, Hq, head_dim]`` (``out`` when given; a row that sees no key
///     gets zeros); with ``return_lse=True`` the pair ``(out, lse)``, ``lse`` float32
///     ``[total_q, Hq]``, the natural-log sum of ``exp(logit)`` over the visible keys
///     (``-inf`` for a row that sees none).
///
/// Raises:
///     InvalidArgumentError: naming the argument: wrong dtypes or shapes, head counts or
///         head_dim not matching the cache, bad ``qo_indptr`` offsets, more default-
///         positioned queries than keys, a negative position, a block holding a visible
///         key whose entry is not a block of the pool (a pad or a released block inside
///         a window, named ``block_tables[i, b]``) or a length beyond its table,
///         ``chunk_size`` of 0 or without ``causal``,
///         a negative ``window_left``/``sink_tokens``, a bool or float where an int is
///         meant, a ``scale`` or soft cap that is not positive and finite in float32,
///         an ``out`` that is not C-contiguous, not writable or overlaps ``q`` or the
///         cache, a tuning whose path this CPU lacks or that sets ``kv_heads_per_item``,
///         an unknown ``q_dtype`` or ``pv_dtype`` or a pair not valid on the cache (the
///         message lists the valid ones). ``out`` is not written on any error.
///     TypeError: ``tuning`` that is not a :class:`KernelTuning` or None, ``q_dtype`` or
///         ``pv_dtype`` that is not a str.
#[pyfunction]
#[pyo3(signature = (cache, layer, q, qo_indptr, block_tables, seq_lens, *, q_positions = None, causal = true, chunk_size = None, window_left = None, sink_tokens = None, scale = None, logits_soft_cap = None, out = None, return_lse = false, q_dtype = "f32", pv_dtype = "f32", tuning = None))]
#[allow(clippy::too_many_arguments)]
fn prefill_attention<'py>(
    py: Python<'py>,
    cache: &Bound<'py, PyKvCache>,
    #[pyo3(from_py_with = arg::layer)] layer: usize,
    q: &Bound<'py, PyAny>,
    qo_indptr: &Bound<'py, PyAny>,
    block_tables: &Bound<'py, PyAny>,
    seq_lens: &Bound<'py, PyAny>,
    q_positions: Option<&Bound<'py, PyAny>>,
    causal: bool,
    chunk_size: Option<&Bound<'py, PyAny>>,
    window_left: Option<&Bound<'py, PyAny>>,
    sink_tokens: Option<&Bound<'py, PyAny>>,
    #[pyo3(from_py_with = arg::scale)] scale: Option<f32>,
    #[pyo3(from_py_with = arg::logits_soft_cap)] logits_soft_cap: Option<f32>,
    out: Option<&Bound<'py, PyAny>>,
    return_lse: bool,
    q_dtype: &str,
    pv_dtype: &str,
    tuning: Option<PyRef<'py, PyKernelTuning>>,
) -> PyResult<Bound<'py, PyAny>> {
    let kw = Kw { q_positions, causal, chunk_size, window_left, sink_tokens, scale, logits_soft_cap, out, return_lse, q_dtype, pv_dtype, tuning };
    let t = Tables::padded(py, block_tables, seq_lens)?;
    run(py, cache, layer, q, qo_indptr, move |bs, nb, sinks| t.build(bs, nb, sinks), kw)
}

/// :func:`prefill_attention` with the tables in FlashInfer's paged layout, as
/// :meth:`BlockPool.flashinfer_tables` (and the hybrid pool's, with ``kv_page_start``)
/// export them. Pages map to logical blocks, and give the logical length, as for
/// :func:`decode_attention_paged` (``sink_tokens`` places the sink pages); only the pages
/// of blocks holding a key some query sees are read and checked.
///
/// Args:
///     cache: the KV cache.
///     layer: ``0..cache.num_layers``.
///     q: as for :func:`prefill_attention`.
///     qo_indptr: as for :func:`prefill_attention`.
///     kv_indptr: ``n + 1`` non-decreasing offsets into ``kv_indices``.
///     kv_indices: the block ids of all sequences' stored pages, concatenated.
///     kv_last_page_len: ``n`` token counts of each sequence's last page, in
///         ``1..=block_size`` (0 for a sequence without pages).
///     q_positions: as for :func:`prefill_attention`.
///     causal: as for :func:`prefill_attention`.
///     chunk_size: as for :func:`prefill_attention`.
///     window_left: as for :func:`prefill_attention`.
///     sink_tokens: as for :func:`prefill_attention`.
///     scale: as for :func:`prefill_attention`.
///     logits_soft_cap: as for :func:`prefill_attention`.
///     out: as for :func:`prefill_attention`.
///     return_lse: as for :func:`prefill_attention`.
///     q_dtype: as for :func:`prefill_attention`.
///     pv_dtype: as for :func:`prefill_attention`.
///     tuning: as for :func:`prefill_attention`.
///     kv_page_start: ``n`` logical block indices (>= 0) of each sequence's first page
///         after its sink pages (default None: zeros), as for
///         :func:`decode_attention_paged`.
///
/// Returns:
///     As :func:`prefill_attention`.
///
/// Raises:
///     InvalidArgumentError: as :func:`prefill_attention`, and offsets that are not a
///         range inside ``kv_indices``, a last-page length outside ``1..=block_size``, a
///         ``kv_page_start`` that is not ``n`` ints >= 0 or whose logical length
///         overflows, a visible key whose block is not among the pages (named
///         ``kv_page_start``) or whose page is not a block of the pool (``kv_indices``).
#[pyfunction]
#[pyo3(signature = (cache, layer, q, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, *, q_positions = None, causal = true, chunk_size = None, window_left = None, sink_tokens = None, scale = None, logits_soft_cap = None, out = None, return_lse = false, q_dtype = "f32", pv_dtype = "f32", tuning = None, kv_page_start = None))]
#[allow(clippy::too_many_arguments)]
fn prefill_attention_paged<'py>(
    py: Python<'py>,
    cache: &Bound<'py, PyKvCache>,
    #[pyo3(from_py_with = arg::layer)] layer: usize,
    q: &Bound<'py, PyAny>,
    qo_indptr: &Bound<'py, PyAny>,
    kv_indptr: &Bound<'py, PyAny>,
    kv_indices: &Bound<'py, PyAny>,
    kv_last_page_len: &Bound<'py, PyAny>,
    q_positions: Option<&Bound<'py, PyAny>>,
    causal: bool,
    chunk_size: Option<&Bound<'py, PyAny>>,
    window_left: Option<&Bound<'py, PyAny>>,
    sink_tokens: Option<&Bound<'py, PyAny>>,
    #[pyo3(from_py_with = arg::scale)] scale: Option<f32>,
    #[pyo3(from_py_with = arg::logits_soft_cap)] logits_soft_cap: Option<f32>,
    out: Option<&Bound<'py, PyAny>>,
    return_lse: bool,
    q_dtype: &str,
    pv_dtype: &str,
    tuning: Option<PyRef<'py, PyKernelTuning>>,
    kv_page_start: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let kw = Kw { q_positions, causal, chunk_size, window_left, sink_tokens, scale, logits_soft_cap, out, return_lse, q_dtype, pv_dtype, tuning };
    let t = Tables::flashinfer(kv_indptr, kv_indices, kv_last_page_len, kv_page_start)?;
    run(py, cache, layer, q, qo_indptr, move |bs, nb, sinks| t.build(bs, nb, sinks), kw)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(prefill_attention, m)?)?;
    m.add_function(wrap_pyfunction!(prefill_attention_paged, m)?)?;
    Ok(())
}
