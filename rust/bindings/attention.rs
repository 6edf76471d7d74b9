//! `decode_attention` and `decode_attention_paged` for Python: the two table forms of
//! one kernel call, sharing the option checks and the GIL-free run (`attend`).

use std::ops::Range;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;

use super::arrays::{checked_out, f32_input, int_matrix, F32Input};
use super::convert::{arg, int_vec};
use super::errors::{invalid, IntoPyResult};
use crate::error::filled;
use super::kv::PyKvCache;
use crate::attention::{self, DecodeOptions, Features, Isa, Precision, SeqTables, Tuning};

/// The options shared by both table forms.
#[allow(clippy::too_many_arguments)]
fn options(
    scale: Option<f32>,
    logits_soft_cap: Option<f32>,
    window_left: Option<usize>,
    sink_tokens: usize,
    q_dtype: &str,
    pv_dtype: &str,
    tuning: Option<&PyKernelTuning>,
) -> crate::Result<DecodeOptions> {
    let (precision, tuning) = (Precision::parse(q_dtype, pv_dtype)?, tuning.map_or_else(Tuning::default, |t| t.0));
    Ok(DecodeOptions { scale, logits_soft_cap, window_left, sink_tokens, precision, tuning })
}

/// How an attention call runs, never what it computes beyond f32 rounding: the kernel
/// path, the split size and the KV heads per work item. Pass it as ``tuning=`` to
/// :func:`decode_attention`, :func:`prefill_attention` and their paged forms. Immutable,
/// comparable and hashable.
///
/// Args:
///     isa: one of :func:`kernel_paths` (``"scalar"``; ``"avx2"``, ``"avx512"`` on
///         x86-64; ``"neon"`` on aarch64); None (default): the fastest.
///     split_size: tokens per split of a long sequence's keys, merged by log-sum-exp
///         (FlashDecoding): rounded up to whole blocks by decode, to key tiles by
///         prefill; 0: never split; None (default): decode splits sequences longer than
///         a quarter of a thread's share of the batch (at least 256 tokens per split),
///         prefill only when there are too few query tiles.
///     kv_heads_per_item: decode only: the KV heads one work item reads (it must divide
///         the cache's KV heads; None, the default, is all of them, which reads each
///         block as one contiguous run). Prefill refuses a tuning that sets it.
///
/// Raises:
///     TypeError: a positional argument, an ``isa`` that is not a str.
///     InvalidArgumentError: an unknown path or one this CPU lacks, a negative
///         ``split_size``, a ``kv_heads_per_item`` of 0, a bool or float where an int
///         is meant.
#[pyclass(name = "KernelTuning", module = "pykvpool", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyKernelTuning(pub Tuning);

#[pymethods]
impl PyKernelTuning {
    #[new]
    #[pyo3(signature = (*, isa = None, split_size = None, kv_heads_per_item = None))]
    fn new(
        py: Python<'_>,
        isa: Option<&str>,
        #[pyo3(from_py_with = arg::split_size)] split_size: Option<usize>,
        #[pyo3(from_py_with = arg::kv_heads_per_item)] kv_heads_per_item: Option<usize>,
    ) -> PyResult<Self> {
        let isa = isa.map(|s| Isa::parse(s).map_err(|e| invalid(py, format!("isa: {e}")))).transpose()?;
        if kv_heads_per_item == Some(0) {
            return Err(invalid(py, "kv_heads_per_item must be >= 1, got 0"));
        }
        let tuning = Tuning { isa, split_tokens: split_size, kv_heads_per_item, features: None };
        // The calls' own check of the path, early.
        tuning.path(Features::cpu()).map_err(|e| invalid(py, format!("isa: {e}")))?;
        Ok(Self(tuning))
    }

    /// The forced kernel path, or None (the fastest).
    #[getter]
    fn isa(&self) -> Option<&'static str> {
        self.0.isa.map(Isa::name)
    }

    /// Tokens per split (0: never split; None: chosen per call).
    #[getter]
    fn split_size(&self) -> Option<usize> {
        self.0.split_tokens
    }

    /// KV heads per decode work item (None: all of them).
    #[getter]
    fn kv_heads_per_item(&self) -> Option<usize> {
        self.0.kv_heads_per_item
    }

    fn __repr__(&self) -> String {
        let show = |x: Option<usize>| x.map_or("None".to_string(), |n| n.to_string());
        let isa = self.0.isa.map_or("None".to_string(), |i| format!("{:?}", i.name()));
        format!("KernelTuning(isa={isa}, split_size={}, kv_heads_per_item={})", show(self.0.split_tokens), show(self.0.kv_heads_per_item))
    }
}

/// `window_left`: `None` or an int >= 0.
fn window_left(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    arg::opt_count(obj, "window_left")
}

/// `sink_tokens`: an int >= 0 (not None).
fn sink_tokens(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    match arg::opt_count(obj, "sink_tokens")? {
        Some(n) => Ok(n),
        None => Err(invalid(obj.py(), "sink_tokens must be an int >= 0, got None")),
    }
}

/// The block tables of a kernel call in either form Python gives them, converted with
/// the GIL held; [`Tables::build`] checks them against the cache. Decode and prefill.
pub(super) enum Tables {
    /// `block_tables` `[n, width]` rows and `seq_lens`.
    Padded { table: Vec<i64>, width: usize, lens: Vec<i64> },
    /// FlashInfer's `kv_indptr`, `kv_indices`, `kv_last_page_len`, and the optional
    /// `kv_page_start` of windowed sequences.
    FlashInfer { indptr: Vec<i64>, indices: Vec<i64>, last: Vec<i64>, page_start: Option<Vec<i64>> },
}

impl Tables {
    pub(super) fn padded(py: Python<'_>, block_tables: &Bound<'_, PyAny>, seq_lens: &Bound<'_, PyAny>) -> PyResult<Self> {
        let lens = int_vec(seq_lens, "seq_lens")?;
        let (table, rows, width) = int_matrix(block_tables, "block_tables", None)?;
        if rows != lens.len() {
            return Err(invalid(py, format!("block_tables has {rows} rows for {} seq_lens", lens.len())));
        }
        Ok(Tables::Padded { table, width, lens })
    }

    pub(super) fn flashinfer(
        kv_indptr: &Bound<'_, PyAny>,
        kv_indices: &Bound<'_, PyAny>,
        kv_last_page_len: &Bound<'_, PyAny>,
        kv_page_start: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let indptr = int_vec(kv_indptr, "kv_indptr")?;
        let indices = int_vec(kv_indices, "kv_indices")?;
        let last = int_vec(kv_last_page_len, "kv_last_page_len")?;
        let page_start = kv_page_start.filter(|p| !p.is_none()).map(|p| int_vec(p, "kv_page_start")).transpose()?;
        Ok(Tables::FlashInfer { indptr, indices, last, page_start })
    }

    /// The tables for a cache of `num_blocks` blocks of `block_size` tokens and a call
    /// with `sink_tokens` sinks (which place FlashInfer pages before `kv_page_start`);
    /// entries are checked when the kernel selects the visible ones.
    pub(super) fn build(self, block_size: usize, num_blocks: usize, sink_tokens: usize) -> crate::error::Result<SeqTables> {
        match self {
            Tables::Padded { table, width, lens } => SeqTables::padded_owned(table, width, &lens, block_size, num_blocks),
            Tables::FlashInfer { indptr, indices, last, page_start } => {
                SeqTables::flashinfer_windowed(&indptr, &indices, &last, page_start.as_deref(), sink_tokens, block_size, num_blocks)
            }
        }
    }
}

/// Validate q/out, run the kernel with the GIL released, return `out` (and the LSE).
///
/// The cache's read lock is taken inside `py.detach` and dropped before the GIL is
/// retaken: a reader holding it while waiting for the GIL would deadlock against a
/// queued writer (`write`, `copy_blocks`) that blocks the reader holding the GIL.
#[allow(clippy::too_many_arguments)]
fn attend<'py>(
    py: Python<'py>,
    cache: &PyKvCache,
    layer: usize,
    q: &Bound<'py, PyAny>,
    tables: impl FnOnce(usize, usize) -> crate::error::Result<SeqTables>,
    out: Option<&Bound<'py, PyAny>>,
    return_lse: bool,
    opts: DecodeOptions,
) -> PyResult<Bound<'py, PyAny>> {
    let qin = f32_input(q, "q")?;
    let s = cache.shape;
    let [n, hq, d] = q_shape(py, &qin, "num_seqs", s.head_dim)?;
    if hq == 0 || !hq.is_multiple_of(s.num_kv_heads) {
        return Err(invalid(
            py,
            format!("q has {hq} query heads, not a positive multiple of the cache's {} KV heads", s.num_kv_heads),
        ));
    }
    let t = tables(s.block_size, s.num_blocks).py_err(py)?;
    if t.len() != n {
        return Err(invalid(py, format!("q has {n} sequences, the block tables {}", t.len())));
    }
    let qv = qin.values();
    run_into(py, q, out, &cache.storage, [n, hq, d], return_lse, |o, l| {
        attention::decode_attention(&cache.read(), layer, qv, hq, &t, o, l, &opts)
    })
}

/// `q`'s shape `[rows, num_q_heads, head_dim]` (`rows` names the first dimension in the
/// message), its head_dim the cache's.
pub(super) fn q_shape(py: Python<'_>, q: &F32Input<'_>, rows: &str, head_dim: usize) -> PyResult<[usize; 3]> {
    let [n, hq, d] = q.shape[..] else {
        return Err(invalid(py, format!("q must be [{rows}, num_q_heads, head_dim], got shape {:?}", q.shape)));
    };
    if d != head_dim {
        return Err(invalid(py, format!("q has head_dim {d}, the cache {head_dim}")));
    }
    Ok([n, hq, d])
}

/// Run `kernel` with the GIL released on the `[n, hq, d]` output (the caller's `out`,
/// checked by [`checked_out`], or a new array) and, with `return_lse`, an `[n, hq]` LSE;
/// return `out` (and the LSE). Decode and prefill.
pub(super) fn run_into<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    storage: &Range<usize>,
    [n, hq, d]: [usize; 3],
    return_lse: bool,
    kernel: impl FnOnce(&mut [f32], Option<&mut [f32]>) -> crate::error::Result<()> + Send,
) -> PyResult<Bound<'py, PyAny>> {
    // The kernel writes into the caller's `out` or into a new array.
    let out_arr = out.filter(|o| !o.is_none()).map(|o| checked_out::<PyKvCache>(o, q, [n, hq, d], storage)).transpose()?;
    let mut rw = out_arr.as_ref().map(|a| a.try_readwrite()).transpose().map_err(|e| invalid(py, format!("out: {e}")))?;
    let mut owned = if rw.is_none() { filled(0f32, n * hq * d, "the output").py_err(py)? } else { Vec::new() };
    let o_slice: &mut [f32] = match rw.as_mut() {
        Some(rw) => rw.as_slice_mut().map_err(|_| invalid(py, "out must be C-contiguous"))?,
        None => &mut owned,
    };
    let mut lse = if return_lse { filled(0f32, n * hq, "lse").py_err(py)? } else { Vec::new() };
    let done = py.detach(|| kernel(o_slice, return_lse.then_some(&mut lse[..])));
    drop(rw);
    done.py_err(py)?;
    // The caller's own `out` object: a torch tensor is returned as itself.
    let out_obj = match out_arr.and(out) {
        Some(o) => o.clone(),
        None => PyArray1::from_vec(py, owned).reshape([n, hq, d])?.into_any(),
    };
    if return_lse {
        let l: Bound<'py, PyArray2<f32>> = PyArray1::from_vec(py, lse).reshape([n, hq])?;
        Ok((out_obj, l).into_pyobject(py)?.into_any())
    } else {
        Ok(out_obj)
    }
}

/// Decode attention over the paged cache: one query token per sequence against its cached
/// K/V in ``cache`` layer ``layer``.
///
/// ``out[s, h] = softmax(scale * q[s, h] . K[s, h // g]^T) V[s, h // g]`` with
/// ``g = Hq / Hkv``, over the keys the query sees. Positions are logical: key ``k`` is the
/// token in slot ``k`` of the sequence's table, the query sits at ``p = seq_lens[i] - 1``;
/// with ``window_left`` it sees keys ``p - k <= window_left`` and the sinks ``k <
/// sink_tokens``. Only blocks holding a visible key are read, and only their table entries
/// are checked: the other entries (a pad such as -1, a released block's stale id) are
/// never read, so the time does not grow with the logical length. The GIL is released
/// while it runs, on the threads of :func:`set_num_threads`. Meanwhile the arrays of
/// :meth:`KvCache.key` / :meth:`KvCache.value` for ``layer`` must not be written from
/// another thread (they alias the cache).
///
/// The SIMD paths (``"avx512"``, ``"avx2"``, ``"neon"``) count a key as 0 when its
/// probability is under 2^-64 of their running reference (at most 2^8 under the largest
/// probability, so every such key is under 2^-64 of the largest): scaled, it would be a
/// subnormal number, whose arithmetic costs a microcode assist per multiply (up to 6x the
/// call's time with a dominant sink), and it moves the output by at most 2^-64 of the
/// largest V per key.
///
/// 8-bit caches (``"int8"``, ``"fp8_e4m3"``, ``"fp8_e5m2"``) attend over the dequantized
/// values (:meth:`KvCache.dequantized`) with f32 arithmetic on every path, within 1e-5
/// of the output scale of an f64 reference on those values. The ``"avx512"``,
/// ``"avx2"`` and ``"neon"`` paths read the one-byte codes and dequantize in registers
/// (int8: sign extension + convert; fp8: bit moves into an f16 and ``vcvtph2ps`` /
/// ``fcvtl``), folding the K scales into the scores and the V scales into the
/// probabilities. Against the same
/// attention over the unquantized f32 values, write ``e_K`` / ``e_V`` for the largest
/// error of one stored K / V element: int8 ``0.5 * max|x| / 127`` of its row (its
/// token's ``head_dim`` values); e4m3 ``2^-4 |x| + 2^-10 s``, e5m2 ``2^-3 |x| + 2^-17
/// s`` (3 and 2 mantissa bits; the second term is half the subnormal step, ``s`` the
/// head's scale), assuming no value beyond the calibrated range (those saturate).
/// Each logit then moves by at most ``D = scale * max_t sum_i |q_i| e_K(t, i)``, each
/// softmax weight by at most a factor ``exp(+-2 D)``, so each output moves by at most
/// ``(exp(2 D) - 1) * max|V'| + max e_V`` (``V'`` the dequantized values; ``max|V'| <=
/// max|V|`` for int8, ``<= (1 + 2^-4) max|V| + 2^-10 s_V`` for e4m3); the LSE by at most D.
/// ``tests/attention/test_kv_quant.py`` checks this bound; benches/RESULTS.md has the typical
/// errors (well below it).
///
/// Precision is chosen by dtype: ``q_dtype`` is the query's in the scores ``q.K``,
/// ``pv_dtype`` the probabilities' in ``P V``. ``("f32", "f32")``, the default, is exact
/// on every cache. The other pairs are opt-in, each valid on the caches listed, and
/// compute the same values on every path: a path with the matching instruction uses it,
/// the others compute f32 FMAs on the rounded operands, so results agree across paths
/// within f32 rounding, not bitwise. Against the exact result on the same cache (``K``,
/// ``V`` the dequantized keys and values), each logit moves by at most ``D``, each output
/// by at most ``(exp(2 D) - 1) * max|V|`` (plus the term given) and the LSE by at most
/// ``D``:
///
/// - ``("bf16", "f32")``, bf16 and fp8 caches: ``q`` rounded to bf16 (nearest even);
///   the ``"avx512"`` path of a CPU with avx512_bf16 computes the scores with
///   ``vdpbf16ps`` (bf16 products exact, f32 sums; fp8 codes are widened to bf16 in
///   registers, which is exact, and need avx512vbmi too), the K scale multiplying the
///   finished scores. ``D = scale * 2^-8 * sum_i |q_i K_i|``; on standard-normal data
///   with d = 128 the output moves by about 2e-3 of its scale (benches/RESULTS.md).
/// - ``("int8", "f32")``, int8 caches: ``q`` quantized per (sequence, query head) to
///   int8 (symmetric, ``s_q = max|q| / 127``, round half to even); with avx512_vnni the
///   ``"avx512"`` path computes exact integer dot products of the codes by
///   ``vpdpbusd``, times ``s_q`` and each token's K scale. ``D = scale * (s_q / 2) *
///   max_t sum_i |K(t, i)|``.
/// - ``("f16", "f16")``, fp8 caches: on the ``"avx512"`` path of a CPU with
///   avx512_fp16, for block size 16 and a head_dim that is a multiple of 64 (K and V
///   scales within ``[2^-64, 2^64]``), each score is a sum of f16 products of the
///   f16-rounded ``q`` (times a power of two per row, so that no f16 sum overflows) with
///   the codes, ``head_dim / 4`` of them summed in f16 per lane, and each chunk of 16
///   tokens' ``P V`` a sum of f16 products of the f16-rounded probabilities with the
///   codes, summed in f16 over the chunk and added to f32 accumulators
///   (``vfmadd231ph``); every other path, block size and head_dim computes exactly. ``D
///   = scale * (head_dim / 4 + 3) * 2^-11 * max_t sum_i |q_i K_i|``, plus ``18 * 2^-11 *
///   max|V|`` on each output.
///
/// Args:
///     cache: the KV cache.
///     layer: ``0..cache.num_layers``.
///     q: float32 ``[n, Hq, head_dim]``, ``Hq`` a multiple of the cache's KV heads, any
///         strides; ``n = 0`` gives empty results.
///     block_tables: int ``[n, max_blocks]``, logical block ``b`` in column ``b`` (e.g.
///         :meth:`BlockPool.block_tables`); only the entries of blocks holding a visible key
///         are read (entries past ``ceil(seq_lens[i] / block_size)`` never are).
///     seq_lens: ``n`` logical lengths in tokens (0 gives a zero output and an LSE of -inf).
///     scale: the softmax scale, positive and finite (default ``1 / sqrt(head_dim)``).
///     out: C-contiguous, writeable float32 ``[n, Hq, head_dim]`` written in place and
///         returned (default: a new array); it must not share memory with ``q`` or with any
///         KvCache.
///     return_lse: also return the log-sum-exp, to merge partial results.
///     logits_soft_cap: Gemma-2's cap ``c > 0``: logits become ``c * tanh(logit / c)``
///         before the softmax (default None: no cap). Every path computes it as ``c - 2c /
///         (exp(2 logit / c) + 1)`` in f32, as :func:`prefill_attention` does up to f32
///         rounding.
///     window_left: sliding window in tokens: the query at ``p`` sees keys with ``p - k <=
///         window_left`` (``window_left = window - 1`` for a window of ``window`` positions
///         including the query's own; FlashInfer's ``window_left``); None (default): every
///         key. An int >= 0.
///     sink_tokens: attention sinks in tokens: keys ``k < sink_tokens`` are visible
///         whatever the window (default 0). An int >= 0.
///     q_dtype: the query's dtype in the scores: ``"f32"`` (default, exact), ``"bf16"``,
///         ``"int8"`` or ``"f16"``, as the precision pairs above allow.
///     pv_dtype: the probabilities' dtype in ``P V``: ``"f32"`` (default), or ``"f16"``
///         with ``q_dtype="f16"``.
///     tuning: how the call runs, never what it computes: a :class:`KernelTuning` (the
///         kernel path, the split size, the KV heads per work item); None: chosen.
///
/// Returns:
///     float32 ``[n, Hq, head_dim]`` (``out`` when given); with ``return_lse=True`` the pair
///     ``(out, lse)``, ``lse`` float32 ``[n, Hq]``, the natural-log sum of
///     ``exp(scale * q.k)`` over the visible keys.
///
/// Raises:
///     InvalidArgumentError: a block holding a visible key whose entry is not a block of
///         the pool (a pad or a released block inside the window or the sinks: the message
///         names ``block_tables[i, b]``), a length beyond its table, head count or head_dim
///         mismatches, a non-float32 ``q`` or ``out``, wrong shapes, an ``out`` that is not
///         C-contiguous, not writable or shares memory with ``q`` or a cache, a bad
///         ``scale`` or ``logits_soft_cap``, a bad ``layer``, ``window_left`` or
///         ``sink_tokens`` (a negative value, a bool, a float, None for ``sink_tokens``),
///         a tuning whose path this CPU lacks or whose ``kv_heads_per_item`` does not
///         divide the KV heads, an unknown ``q_dtype`` or ``pv_dtype`` or a pair not valid
///         on the cache (the message lists the valid ones). ``out`` is not written on any
///         error.
///     TypeError: ``tuning`` that is not a :class:`KernelTuning` or None, ``q_dtype`` or
///         ``pv_dtype`` that is not a str.
#[pyfunction]
#[pyo3(signature = (cache, layer, q, block_tables, seq_lens, scale = None, out = None, return_lse = false, *, logits_soft_cap = None, window_left = None, sink_tokens = 0, q_dtype = "f32", pv_dtype = "f32", tuning = None))]
#[allow(clippy::too_many_arguments)]
fn decode_attention<'py>(
    py: Python<'py>,
    cache: &Bound<'py, PyKvCache>,
    #[pyo3(from_py_with = arg::layer)] layer: usize,
    q: &Bound<'py, PyAny>,
    block_tables: &Bound<'py, PyAny>,
    seq_lens: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = arg::scale)] scale: Option<f32>,
    out: Option<&Bound<'py, PyAny>>,
    return_lse: bool,
    #[pyo3(from_py_with = arg::logits_soft_cap)] logits_soft_cap: Option<f32>,
    #[pyo3(from_py_with = window_left)] window_left: Option<usize>,
    #[pyo3(from_py_with = sink_tokens)] sink_tokens: usize,
    q_dtype: &str,
    pv_dtype: &str,
    tuning: Option<PyRef<'py, PyKernelTuning>>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = options(scale, logits_soft_cap, window_left, sink_tokens, q_dtype, pv_dtype, tuning.as_deref()).py_err(py)?;
    let t = Tables::padded(py, block_tables, seq_lens)?;
    attend(py, cache.get(), layer, q, |bs, nb| t.build(bs, nb, sink_tokens), out, return_lse, opts)
}

/// :func:`decode_attention` with the tables in FlashInfer's paged layout, as
/// :meth:`BlockPool.flashinfer_tables` (and the hybrid pool's, with ``kv_page_start``)
/// export them.
///
/// A windowed sequence lists only its stored pages: with ``ps = kv_page_start[i]``,
/// ``P`` pages and ``sp = min(ceil(sink_tokens / block_size), ps, P)``, page ``j`` is
/// logical block ``j`` when ``j < sp`` (the sink pages) and ``ps + j - sp`` after (the
/// window run). The logical length is ``(ps + P - sp - 1) * block_size +
/// kv_last_page_len[i]`` when the window run is non-empty (``P > sp``); when every page is
/// a sink page the sequence ends inside its sinks: ``(P - 1) * block_size +
/// kv_last_page_len[i]`` (``ps`` only bounds ``sp``); 0 without pages. With
/// ``kv_page_start`` all zeros (the default) this is FlashInfer's plain layout. Only the
/// pages of blocks holding a visible key are read and checked; a visible key in a block
/// that is not among the pages (before ``ps``, past the sinks) is an error.
///
/// Args:
///     cache: the KV cache.
///     layer: ``0..cache.num_layers``.
///     q: float32 ``[n, Hq, head_dim]``.
///     kv_indptr: ``n + 1`` non-decreasing offsets into ``kv_indices``.
///     kv_indices: the block ids of all sequences' stored pages, concatenated.
///     kv_last_page_len: ``n`` token counts of each sequence's last page, in
///         ``1..=block_size`` (0 for a sequence without pages).
///     scale: as for :func:`decode_attention`.
///     out: as for :func:`decode_attention`.
///     return_lse: as for :func:`decode_attention`.
///     logits_soft_cap: as for :func:`decode_attention`.
///     window_left: as for :func:`decode_attention`.
///     sink_tokens: as for :func:`decode_attention`; also places the sink pages.
///     q_dtype: as for :func:`decode_attention`.
///     pv_dtype: as for :func:`decode_attention`.
///     tuning: as for :func:`decode_attention`.
///     kv_page_start: ``n`` logical block indices (>= 0) of each sequence's first page
///         after its sink pages (default None: zeros).
///
/// Returns:
///     As :func:`decode_attention`.
///
/// Raises:
///     InvalidArgumentError: as :func:`decode_attention`, and offsets that are not a range
///         inside ``kv_indices``, a last-page length outside ``1..=block_size``, a
///         ``kv_page_start`` that is not ``n`` ints >= 0 or whose logical length
///         overflows, a visible key whose block is not among the pages (named
///         ``kv_page_start``) or whose page is not a block of the pool (``kv_indices``).
#[pyfunction]
#[pyo3(signature = (cache, layer, q, kv_indptr, kv_indices, kv_last_page_len, scale = None, out = None, return_lse = false, *, logits_soft_cap = None, window_left = None, sink_tokens = 0, q_dtype = "f32", pv_dtype = "f32", tuning = None, kv_page_start = None))]
#[allow(clippy::too_many_arguments)]
fn decode_attention_paged<'py>(
    py: Python<'py>,
    cache: &Bound<'py, PyKvCache>,
    #[pyo3(from_py_with = arg::layer)] layer: usize,
    q: &Bound<'py, PyAny>,
    kv_indptr: &Bound<'py, PyAny>,
    kv_indices: &Bound<'py, PyAny>,
    kv_last_page_len: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = arg::scale)] scale: Option<f32>,
    out: Option<&Bound<'py, PyAny>>,
    return_lse: bool,
    #[pyo3(from_py_with = arg::logits_soft_cap)] logits_soft_cap: Option<f32>,
    #[pyo3(from_py_with = window_left)] window_left: Option<usize>,
    #[pyo3(from_py_with = sink_tokens)] sink_tokens: usize,
    q_dtype: &str,
    pv_dtype: &str,
    tuning: Option<PyRef<'py, PyKernelTuning>>,
    kv_page_start: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = options(scale, logits_soft_cap, window_left, sink_tokens, q_dtype, pv_dtype, tuning.as_deref()).py_err(py)?;
    let t = Tables::flashinfer(kv_indptr, kv_indices, kv_last_page_len, kv_page_start)?;
    attend(py, cache.get(), layer, q, |bs, nb| t.build(bs, nb, sink_tokens), out, return_lse, opts)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKernelTuning>()?;
    m.add_function(wrap_pyfunction!(decode_attention, m)?)?;
    m.add_function(wrap_pyfunction!(decode_attention_paged, m)?)?;
    Ok(())
}
