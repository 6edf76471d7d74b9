//! `KvCache`, `decode_attention`, the probes and the thread/ISA controls for Python.

use std::ops::Range;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use numpy::ndarray::{ArrayView4, ShapeBuilder};
use numpy::{PyArray1, PyArray2, PyArray4, PyArrayMethods};
use pyo3::prelude::*;

use super::arrays::{checked_out, f32_values, int_matrix};
use super::convert::{arg, count, int_scalar, int_vec};
use super::errors::{invalid, IntoPyResult};
use crate::attention::{self, DecodeOptions, Isa, SeqTables};
use crate::kv::{DType, KvCache, KvShape};

/// KV storage owned by Rust: per layer, K and V for ``num_blocks`` blocks of
/// ``block_size`` token slots x ``num_kv_heads`` x ``head_dim``, in ``dtype``, in one
/// 2 MiB-aligned allocation advised for transparent huge pages.
///
/// Physical layout: per layer, block-major with each block's K (all KV heads) followed
/// by its V, so the kernel reads one contiguous run per block; inside a (block, head)
/// tile K is dimension-major ``[head_dim][block_size]`` and V token-major
/// ``[block_size][head_dim]``. :meth:`key` and :meth:`value` hide this behind the
/// logical shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` (strided views).
///
/// Args:
///     num_layers: layers.
///     num_blocks: blocks per layer (a :class:`BlockPool`'s ``num_blocks``).
///     block_size: token slots per block, at most 65536.
///     num_kv_heads: KV heads, at most 65536.
///     head_dim: elements per head, at most 65536.
///     dtype: the storage dtype: ``"f32"`` (default), ``"f16"`` or ``"bf16"``.
///
/// Raises:
///     InvalidArgumentError: a zero dimension, ``block_size``/``head_dim``/
///         ``num_kv_heads`` above 65536, an unknown dtype, or a size beyond memory.
#[pyclass(name = "KvCache", module = "pykvpool", frozen)]
pub struct PyKvCache {
    inner: RwLock<KvCache>,
    shape: KvShape,
    dtype: DType,
    nbytes: usize,
    huge_pages: bool,
    /// Addresses of the storage (every layer's K and V): an `out` inside it is refused.
    storage: Range<usize>,
}

impl PyKvCache {
    fn read(&self) -> RwLockReadGuard<'_, KvCache> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, KvCache> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyKvCache {
    #[new]
    #[pyo3(signature = (num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype = "f32"))]
    fn new(
        py: Python<'_>,
        num_layers: &Bound<'_, PyAny>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        num_kv_heads: &Bound<'_, PyAny>,
        head_dim: &Bound<'_, PyAny>,
        dtype: &str,
    ) -> PyResult<Self> {
        let c = |o: &Bound<'_, PyAny>, n: &str| count(py, int_scalar(o, n)?, n);
        let shape = KvShape {
            num_layers: c(num_layers, "num_layers")?,
            num_blocks: c(num_blocks, "num_blocks")?,
            block_size: c(block_size, "block_size")?,
            num_kv_heads: c(num_kv_heads, "num_kv_heads")?,
            head_dim: c(head_dim, "head_dim")?,
        };
        let dtype = DType::parse(dtype).py_err(py)?;
        let cache = py.detach(|| KvCache::new(shape, dtype)).py_err(py)?;
        let storage = cache.address_range();
        Ok(Self { shape, dtype, nbytes: cache.nbytes(), huge_pages: cache.huge_pages(), storage, inner: RwLock::new(cache) })
    }

    /// Layers.
    #[getter]
    fn num_layers(&self) -> usize {
        self.shape.num_layers
    }
    /// Blocks per layer.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.shape.num_blocks
    }
    /// Token slots per block (tokens).
    #[getter]
    fn block_size(&self) -> usize {
        self.shape.block_size
    }
    /// KV heads.
    #[getter]
    fn num_kv_heads(&self) -> usize {
        self.shape.num_kv_heads
    }
    /// Elements per head.
    #[getter]
    fn head_dim(&self) -> usize {
        self.shape.head_dim
    }
    /// The storage dtype: "f32", "f16" or "bf16".
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }
    /// Bytes of K plus V over all layers.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }
    /// Whether the OS accepted the transparent-huge-page advice.
    #[getter]
    fn huge_pages(&self) -> bool {
        self.huge_pages
    }

    fn __repr__(&self) -> String {
        let s = self.shape;
        format!(
            "KvCache(num_layers={}, num_blocks={}, block_size={}, num_kv_heads={}, head_dim={}, dtype='{}')",
            s.num_layers,
            s.num_blocks,
            s.block_size,
            s.num_kv_heads,
            s.head_dim,
            self.dtype.name()
        )
    }

    /// Zero-copy view of layer ``layer``'s K. The view keeps the cache alive.
    ///
    /// Writable by default, like a vLLM KV-cache tensor (and so that ``torch.from_numpy``
    /// accepts it); ``writable=False`` gives a read-only view for inspection. A view (or
    /// anything sharing the cache's memory) is refused as the ``out`` of
    /// :func:`decode_attention`.
    ///
    /// The view aliases the cache's memory: writes through it are seen by the next kernel
    /// call, and no copy protects a running one. :meth:`write`, :meth:`copy_blocks` and
    /// :func:`decode_attention` release the GIL, so writing this array (or a torch tensor
    /// wrapping it) from one Python thread while one of them runs on the same layer in
    /// another is a data race with undefined results; the caller must order the two (e.g.
    /// join the kernel call first).
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///     writable: False for a read-only view.
    ///
    /// Returns:
    ///     Shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` (strided), dtype float32,
    ///     float16, or ``ml_dtypes.bfloat16`` (a dependency: another dtype is never handed
    ///     out).
    ///
    /// Raises:
    ///     InvalidArgumentError: ``layer`` outside ``0..num_layers``.
    ///     ImportError: a bf16 cache and ``ml_dtypes`` cannot be imported.
    #[pyo3(signature = (layer, *, writable = true))]
    fn key<'py>(
        slf: Bound<'py, Self>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        writable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        view(slf, layer, false, writable)
    }

    /// Zero-copy view of layer ``layer``'s V; as :meth:`key`, including the rule that it must
    /// not be written while a kernel call on the same layer runs in another thread.
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///     writable: False for a read-only view.
    ///
    /// Returns:
    ///     Shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` (strided), the dtype of
    ///     :meth:`key`.
    ///
    /// Raises:
    ///     InvalidArgumentError: ``layer`` outside ``0..num_layers``.
    ///     ImportError: a bf16 cache and ``ml_dtypes`` cannot be imported.
    #[pyo3(signature = (layer, *, writable = true))]
    fn value<'py>(
        slf: Bound<'py, Self>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        writable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        view(slf, layer, true, writable)
    }

    /// Store K and V of ``tokens`` tokens of layer ``layer`` at their slots, rounding to the
    /// storage dtype (nearest even). The GIL is released while it copies.
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///     k: float32 ``[tokens, num_kv_heads, head_dim]`` or ``[tokens, num_kv_heads *
    ///         head_dim]``, any strides (read in logical order).
    ///     v: float32, the shape of ``k``.
    ///     slot_mapping: ``tokens`` int slots, ``block * block_size + offset``; -1 is padding,
    ///         skipped (e.g. the ``slot_mapping`` of :meth:`BlockPool.step`).
    ///
    /// Raises:
    ///     InvalidArgumentError: a bad layer, dtype or shape, or a slot outside
    ///         ``-1..num_blocks * block_size``. Nothing is written on error.
    fn write(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        slot_mapping: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let slots = int_vec(slot_mapping, "slot_mapping")?;
        let (ks, kv) = f32_values(k, "k")?;
        let (vs, vv) = f32_values(v, "v")?;
        let s = self.shape;
        for (name, shape) in [("k", &ks), ("v", &vs)] {
            let ok = matches!(shape.as_slice(), [n, h, d] if *n == slots.len() && *h == s.num_kv_heads && *d == s.head_dim)
                || matches!(shape.as_slice(), [n, hd] if *n == slots.len() && *hd == s.num_kv_heads * s.head_dim);
            if !ok {
                return Err(invalid(
                    py,
                    format!(
                        "{name} must have shape [{}, {}, {}] (tokens, kv heads, head dim), got {shape:?}",
                        slots.len(),
                        s.num_kv_heads,
                        s.head_dim
                    ),
                ));
            }
        }
        py.detach(|| self.write_lock().write(layer, &kv, &vv, &slots)).py_err(py)
    }

    /// Copy whole blocks ``src -> dst`` for every ``(src, dst)`` row of ``pairs``, in every
    /// layer, K and V, in row order (e.g. the copy-on-write pairs of :meth:`BlockPool.step`).
    ///
    /// No pairs (``[]``, ``np.empty((0, 2))``) is a no-op.
    ///
    /// Args:
    ///     pairs: int ``[k, 2]`` block ids.
    ///
    /// Raises:
    ///     InvalidArgumentError: a block id outside ``0..num_blocks``, a bad shape or ragged
    ///         rows; nothing is copied.
    fn copy_blocks(&self, py: Python<'_>, pairs: &Bound<'_, PyAny>) -> PyResult<()> {
        let (flat, rows, _) = int_matrix(pairs, "pairs", Some(2))?;
        if rows == 0 {
            return Ok(());
        }
        let pairs: Vec<(i64, i64)> = (0..rows).map(|r| (flat[2 * r], flat[2 * r + 1])).collect();
        py.detach(|| self.write_lock().copy_blocks(&pairs)).py_err(py)
    }
}

/// A zero-copy numpy view of one layer's K or V in the logical shape
/// `[num_blocks, block_size, num_kv_heads, head_dim]`, kept alive by the cache object;
/// read-only unless `writable`.
///
/// The array aliases memory that `write`, `copy_blocks` and the kernels touch with the
/// GIL released (the `RwLock` guards the cache object, not this array): a Python thread
/// writing it while a kernel call runs on another is a data race the caller must avoid,
/// as the stubs document. Handing out views is what the zero-copy contract asks for.
fn view(slf: Bound<'_, PyKvCache>, layer: usize, value: bool, writable: bool) -> PyResult<Bound<'_, PyAny>> {
    let py = slf.py();
    let cache = slf.get();
    let (s, dtype) = (cache.shape, cache.dtype);
    // A bf16 view needs ml_dtypes' bfloat16: never hand out the raw uint16 bits instead.
    let target = match dtype {
        DType::F32 => None,
        DType::F16 => Some(py.import("numpy")?.getattr("float16")?),
        DType::BF16 => Some(py.import("ml_dtypes").and_then(|m| m.getattr("bfloat16")).map_err(|e| {
            let msg = format!(
                "a view of a bf16 KvCache needs ml_dtypes (a pykvpool dependency: pip install ml_dtypes), \
                 which failed to import: {e}"
            );
            pyo3::exceptions::PyImportError::new_err(msg)
        })?),
    };
    // The lock is held for the pointer only, never while a Python object is made.
    let (ptr, strides) = {
        let c = cache.read();
        (c.layer_ptr(layer, value), if value { c.value_strides() } else { c.key_strides() })
    };
    let ptr = ptr.py_err(py)?;
    let dims = (s.num_blocks, s.block_size, s.num_kv_heads, s.head_dim).strides((strides[0], strides[1], strides[2], strides[3]));
    let owner = slf.clone().into_any();
    let raw = match dtype {
        DType::F32 => {
            // SAFETY: ptr addresses this layer's K (or V), shape().layer_span() f32
            // elements inside its region, which the strides above cover exactly (the
            // last block ends the span); the buffer never moves or shrinks
            // while the cache object (set as the array's base) is alive.
            let a = unsafe { ArrayView4::from_shape_ptr(dims, ptr.cast::<f32>()) };
            // SAFETY: as above; `owner` keeps the memory alive.
            unsafe { PyArray4::borrow_from_array(&a, owner) }.into_any()
        }
        DType::F16 | DType::BF16 => {
            // SAFETY: as for f32, with 2-byte elements.
            let a = unsafe { ArrayView4::from_shape_ptr(dims, ptr.cast::<u16>()) };
            // SAFETY: as above.
            unsafe { PyArray4::borrow_from_array(&a, owner) }.into_any()
        }
    };
    if !writable {
        raw.getattr("flags")?.setattr("writeable", false)?;
    }
    match target {
        Some(t) => raw.call_method1("view", (t,)),
        None => Ok(raw),
    }
}

/// Options shared by both table forms.
fn options(
    py: Python<'_>,
    scale: Option<f32>,
    split_tokens: Option<usize>,
    kv_heads_per_item: Option<usize>,
    force_isa: Option<&str>,
    bf16_scores: bool,
) -> PyResult<DecodeOptions> {
    let isa = force_isa.map(|s| Isa::parse(s).map_err(|e| invalid(py, format!("force_isa: {e}")))).transpose()?;
    if let Some(i) = isa.filter(|i| !i.supported()) {
        return Err(invalid(py, format!("force_isa: kernel path {} is not supported by this CPU", i.name())));
    }
    Ok(DecodeOptions { bf16_scores, scale, split_tokens, kv_heads_per_item, isa })
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
    let (qshape, qv) = f32_values(q, "q")?;
    let [n, hq, d] = qshape[..] else {
        return Err(invalid(py, format!("q must be [num_seqs, num_q_heads, head_dim], got shape {qshape:?}")));
    };
    let s = cache.shape;
    if d != s.head_dim {
        return Err(invalid(py, format!("q has head_dim {d}, the cache {}", s.head_dim)));
    }
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
    let mut lse = if return_lse { vec![0f32; n * hq] } else { Vec::new() };
    // The kernel writes into the caller's `out` or into a new array.
    let out_arr = out.map(|o| checked_out::<PyKvCache>(o, q, [n, hq, d], &cache.storage)).transpose()?;
    let mut rw = out_arr.as_ref().map(|a| a.try_readwrite()).transpose().map_err(|e| invalid(py, format!("out: {e}")))?;
    let mut owned = if rw.is_none() { vec![0f32; n * hq * d] } else { Vec::new() };
    let o_slice: &mut [f32] = match rw.as_mut() {
        Some(rw) => rw.as_slice_mut().map_err(|_| invalid(py, "out must be C-contiguous"))?,
        None => &mut owned,
    };
    let done = py.detach(|| {
        let l = return_lse.then_some(&mut lse[..]);
        attention::decode_attention(&cache.read(), layer, &qv, hq, &t, o_slice, l, &opts)
    });
    drop(rw);
    done.py_err(py)?;
    let out_obj = match out_arr {
        Some(a) => a.into_any(),
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
/// ``g = Hq / Hkv``. The GIL is released while it runs, on the threads of
/// :func:`set_num_threads`. Meanwhile the arrays of :meth:`KvCache.key` / :meth:`KvCache.value`
/// for ``layer`` must not be written from another thread (they alias the cache).
///
/// Args:
///     cache: the KV cache.
///     layer: ``0..cache.num_layers``.
///     q: float32 ``[n, Hq, head_dim]``, ``Hq`` a multiple of the cache's KV heads, any
///         strides; ``n = 0`` gives empty results.
///     block_tables: int ``[n, max_blocks]`` (e.g. :meth:`BlockPool.block_tables`); entries
///         past ``ceil(seq_lens[i] / block_size)`` are never read.
///     seq_lens: ``n`` lengths in tokens (0 gives a zero output and an LSE of -inf).
///     scale: the softmax scale, positive and finite (default ``1 / sqrt(head_dim)``).
///     out: C-contiguous, writeable float32 ``[n, Hq, head_dim]`` written in place and
///         returned (default: a new array); it must not share memory with ``q`` or with any
///         KvCache.
///     return_lse: also return the log-sum-exp, to merge partial results.
///     split_size: tokens per FlashDecoding split (None: automatic, for sequences longer
///         than a quarter of a thread's share of the batch; 0: never split).
///     kv_heads_per_item: KV heads read by one work item (default all; must divide the
///         cache's KV heads).
///     force_isa: one of :func:`kernel_paths` (``"scalar"``; ``"avx2"``, ``"avx512"`` on
///         x86-64; ``"neon"`` on aarch64); default the fastest.
///     bf16_scores: bf16 caches only (default False = exact): round q to bf16 (nearest
///         even) and compute the scores q.K from the rounded q; softmax and P.V are
///         unchanged (f32, V exact). On the ``"avx512"`` path of a CPU with avx512_bf16
///         the scores use ``vdpbf16ps`` (bf16 products exact, f32 sums); every other path
///         computes the same thing with f32 FMAs on the rounded q, so results agree across
///         paths within f32 rounding, not bitwise. Against the exact-q result each logit
///         moves by at most ``D = scale * 2^-8 * sum_i |q_i K_i|`` (bf16 keeps 8
///         significant bits), each output by at most ``(exp(2 D) - 1) * max|V|`` and the
///         LSE by at most D; on standard-normal data with d = 128 the measured output
///         deviation is about 2e-3 of the output scale (see benches/RESULTS.md).
///
/// Returns:
///     float32 ``[n, Hq, head_dim]`` (``out`` when given); with ``return_lse=True`` the pair
///     ``(out, lse)``, ``lse`` float32 ``[n, Hq]``, the natural-log sum of
///     ``exp(scale * q.k)``.
///
/// Raises:
///     InvalidArgumentError: a block id outside the pool, a length beyond its table, head
///         count or head_dim mismatches, a non-float32 ``q`` or ``out``, wrong shapes, an
///         ``out`` that is not C-contiguous, not writable or shares memory with ``q`` or a
///         cache, a bad ``scale``, ``layer`` or ``split_size``, an unknown path or one this
///         CPU lacks, ``kv_heads_per_item`` not dividing the KV heads, ``bf16_scores`` with
///         an f32 or f16 cache. ``out`` is not written on any error.
#[pyfunction]
#[pyo3(signature = (cache, layer, q, block_tables, seq_lens, scale = None, out = None, return_lse = false, *, split_size = None, kv_heads_per_item = None, force_isa = None, bf16_scores = false))]
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
    #[pyo3(from_py_with = arg::split_size)] split_size: Option<usize>,
    #[pyo3(from_py_with = arg::kv_heads_per_item)] kv_heads_per_item: Option<usize>,
    force_isa: Option<&str>,
    bf16_scores: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = options(py, scale, split_size, kv_heads_per_item, force_isa, bf16_scores)?;
    let lens = int_vec(seq_lens, "seq_lens")?;
    let (table, rows, width) = int_matrix(block_tables, "block_tables", None)?;
    if rows != lens.len() {
        return Err(invalid(py, format!("block_tables has {rows} rows for {} seq_lens", lens.len())));
    }
    let tables = |bs, nb| SeqTables::padded(&table, width, &lens, bs, nb);
    attend(py, cache.get(), layer, q, tables, out, return_lse, opts)
}

/// :func:`decode_attention` with the tables in FlashInfer's paged layout, as
/// :meth:`BlockPool.flashinfer_tables` exports them.
///
/// Args:
///     cache: the KV cache.
///     layer: ``0..cache.num_layers``.
///     q: float32 ``[n, Hq, head_dim]``.
///     kv_indptr: ``n + 1`` non-decreasing offsets into ``kv_indices``.
///     kv_indices: the block ids of all sequences, concatenated.
///     kv_last_page_len: ``n`` token counts of each sequence's last block, in
///         ``1..=block_size`` (0 for a sequence without blocks).
///     scale: as for :func:`decode_attention`.
///     out: as for :func:`decode_attention`.
///     return_lse: as for :func:`decode_attention`.
///     split_size: as for :func:`decode_attention`.
///     kv_heads_per_item: as for :func:`decode_attention`.
///     force_isa: as for :func:`decode_attention`.
///     bf16_scores: as for :func:`decode_attention`.
///
/// Returns:
///     As :func:`decode_attention`.
///
/// Raises:
///     InvalidArgumentError: as :func:`decode_attention`, and offsets that are not a range
///         inside ``kv_indices`` or a last-page length outside ``1..=block_size``.
#[pyfunction]
#[pyo3(signature = (cache, layer, q, kv_indptr, kv_indices, kv_last_page_len, scale = None, out = None, return_lse = false, *, split_size = None, kv_heads_per_item = None, force_isa = None, bf16_scores = false))]
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
    #[pyo3(from_py_with = arg::split_size)] split_size: Option<usize>,
    #[pyo3(from_py_with = arg::kv_heads_per_item)] kv_heads_per_item: Option<usize>,
    force_isa: Option<&str>,
    bf16_scores: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = options(py, scale, split_size, kv_heads_per_item, force_isa, bf16_scores)?;
    let indptr = int_vec(kv_indptr, "kv_indptr")?;
    let indices = int_vec(kv_indices, "kv_indices")?;
    let last = int_vec(kv_last_page_len, "kv_last_page_len")?;
    let tables = |bs, nb| SeqTables::flashinfer(&indptr, &indices, &last, bs, nb);
    attend(py, cache.get(), layer, q, tables, out, return_lse, opts)
}

/// Read bandwidth in bytes/s: the best of ``passes`` multi-accumulator SIMD sweeps with
/// ``threads`` threads, each thread streaming one contiguous share.
///
/// Without ``cache`` the sweep reads a fresh ``nbytes`` buffer of 2 MiB-aligned,
/// huge-page-advised memory, allocated like a KV cache. With ``cache`` it reads that
/// cache's own storage (``cache.nbytes`` bytes, every layer's K and V): the pages the
/// kernel reads, the fair ceiling for :func:`decode_attention` on a machine (a VM) where
/// the read rate depends on where pages landed.
///
/// Args:
///     nbytes: bytes of the fresh buffer, 1 MiB..1 TiB (default 256 MiB); not with
///         ``cache``.
///     threads: threads, ``1..=1024`` (default: the kernel pool's, see
///         :func:`set_num_threads`).
///     cache: a :class:`KvCache` of at least 1 MiB to read instead.
///     passes: sweeps, ``1..=1000`` (default 7); the best is kept.
///
/// Raises:
///     InvalidArgumentError: both ``nbytes`` and ``cache``, ``nbytes`` outside
///         1 MiB..1 TiB, a cache smaller than 1 MiB, ``passes`` outside ``1..=1000``, or a
///         thread count outside ``1..=1024``.
#[pyfunction]
#[pyo3(signature = (nbytes = None, threads = None, *, cache = None, passes = None))]
fn read_bandwidth(
    py: Python<'_>,
    #[pyo3(from_py_with = arg::nbytes)] nbytes: Option<usize>,
    #[pyo3(from_py_with = arg::threads)] threads: Option<usize>,
    cache: Option<&Bound<'_, PyKvCache>>,
    #[pyo3(from_py_with = arg::passes)] passes: Option<usize>,
) -> PyResult<f64> {
    match cache {
        Some(_) if nbytes.is_some() => Err(invalid(py, String::from("give nbytes or cache, not both"))),
        Some(c) => {
            let c = c.get();
            py.detach(|| crate::runtime::probe::read_bandwidth_of(c.read().bytes(), threads, passes)).py_err(py)
        }
        None => py.detach(|| crate::runtime::probe::read_bandwidth(nbytes, threads, passes)).py_err(py),
    }
}

/// Peak f32 FLOP/s of register-only FMA chains (2 FLOP per lane per FMA), best of 3 runs.
///
/// Args:
///     threads: threads, ``1..=1024`` (default: the kernel pool's).
///
/// Raises:
///     InvalidArgumentError: a thread count outside ``1..=1024``.
#[pyfunction]
#[pyo3(signature = (threads = None))]
fn peak_flops(py: Python<'_>, #[pyo3(from_py_with = arg::threads)] threads: Option<usize>) -> PyResult<f64> {
    py.detach(|| crate::runtime::probe::peak_flops(threads)).py_err(py)
}

/// Set the threads of the kernel pool (initially ``PYKVPOOL_NUM_THREADS`` or all CPUs);
/// calls already running keep their pool.
///
/// Args:
///     n: threads, ``1..=1024``.
///
/// Raises:
///     InvalidArgumentError: ``n`` outside ``1..=1024``, or the OS refused the threads.
#[pyfunction]
fn set_num_threads(py: Python<'_>, #[pyo3(from_py_with = arg::n_threads)] n: usize) -> PyResult<()> {
    let max = crate::runtime::threads::MAX_THREADS;
    if !(1..=max).contains(&n) {
        return Err(invalid(py, format!("n must be in 1..={max} threads, got {n}")));
    }
    py.detach(|| crate::runtime::threads::set_num_threads(n)).py_err(py)
}

/// Threads of the kernel pool.
///
/// Raises:
///     InvalidArgumentError: the pool could not be started (the OS refused the threads).
#[pyfunction]
fn get_num_threads(py: Python<'_>) -> PyResult<usize> {
    py.detach(crate::runtime::threads::num_threads).py_err(py)
}

/// SIMD features of this CPU relevant to the kernels.
///
/// Returns:
///     Feature names, e.g. ``["avx2", "fma", "avx512bf16"]`` or ``["neon"]``.
#[pyfunction]
fn cpu_features() -> Vec<&'static str> {
    attention::cpu_features().to_vec()
}

/// Decode-attention paths this CPU supports, fastest last: ``"scalar"`` always, then
/// ``"avx2"`` and ``"avx512"`` on x86-64 or ``"neon"`` on aarch64 when the CPU has them.
#[pyfunction]
fn kernel_paths() -> Vec<&'static str> {
    Isa::available().into_iter().map(Isa::name).collect()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKvCache>()?;
    m.add_function(wrap_pyfunction!(decode_attention, m)?)?;
    m.add_function(wrap_pyfunction!(decode_attention_paged, m)?)?;
    m.add_function(wrap_pyfunction!(read_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(peak_flops, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_features, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_paths, m)?)?;
    Ok(())
}
