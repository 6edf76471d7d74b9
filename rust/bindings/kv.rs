//! `KvCache`, `decode_attention`, the probes and the thread/ISA controls for Python.

use std::sync::{RwLock, RwLockReadGuard};

use numpy::ndarray::{ArrayView4, ShapeBuilder};
use numpy::{
    PyArray1, PyArray2, PyArray4, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;

use super::convert::{count, int_scalar, int_vec};
use super::errors::{invalid, IntoPyResult};
use crate::kernel::{self, DecodeOptions, Isa, SeqTables};
use crate::kv_storage::{DType, KvCache, KvShape};

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
}

impl PyKvCache {
    pub(super) fn read(&self) -> RwLockReadGuard<'_, KvCache> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// An f32 array argument: its shape and its values (borrowed when C-contiguous).
fn f32_values(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<(Vec<usize>, Vec<f32>)> {
    let py = obj.py();
    let arr = obj.cast::<PyArrayDyn<f32>>().map_err(|_| {
        let got = obj
            .cast::<PyUntypedArray>()
            .ok()
            .and_then(|a| a.dtype().str().ok().map(|s| s.to_string()))
            .unwrap_or_else(|| obj.get_type().name().map(|n| n.to_string()).unwrap_or_default());
        invalid(py, format!("{name} must be a float32 numpy array, got {got}"))
    })?;
    let ro = arr.try_readonly().map_err(|e| invalid(py, format!("{name}: {e}")))?;
    let values = match ro.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => ro.as_array().iter().copied().collect(),
    };
    Ok((arr.shape().to_vec(), values))
}

/// A 2-D integer array (or sequence of rows) with `cols` columns, flattened row-major.
fn int_matrix(obj: &Bound<'_, PyAny>, name: &str, cols: Option<usize>) -> PyResult<(Vec<i64>, usize, usize)> {
    let py = obj.py();
    let np = py.import("numpy")?;
    let arr = np.call_method1("asarray", (obj,))?;
    let arr = arr.cast::<PyUntypedArray>()?;
    let shape = arr.shape().to_vec();
    let (rows, width) = match (shape.as_slice(), cols) {
        ([r, c], Some(want)) if *c == want || *r == 0 => (*r, want),
        ([r, c], None) => (*r, *c),
        ([0], _) => (0, cols.unwrap_or(0)),
        _ => return Err(invalid(py, format!("{name} must be a 2-D integer array, got shape {shape:?}"))),
    };
    let flat = int_vec(&arr.call_method0("ravel")?, name)?;
    Ok((flat, rows, width))
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
        Ok(Self { inner: RwLock::new(cache) })
    }

    /// Layers.
    #[getter]
    fn num_layers(&self) -> usize {
        self.read().shape().num_layers
    }
    /// Blocks per layer.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.read().shape().num_blocks
    }
    /// Token slots per block (tokens).
    #[getter]
    fn block_size(&self) -> usize {
        self.read().shape().block_size
    }
    /// KV heads.
    #[getter]
    fn num_kv_heads(&self) -> usize {
        self.read().shape().num_kv_heads
    }
    /// Elements per head.
    #[getter]
    fn head_dim(&self) -> usize {
        self.read().shape().head_dim
    }
    /// The storage dtype: "f32", "f16" or "bf16".
    #[getter]
    fn dtype(&self) -> &'static str {
        self.read().dtype().name()
    }
    /// Bytes of K plus V over all layers.
    #[getter]
    fn nbytes(&self) -> usize {
        self.read().nbytes()
    }
    /// Whether the OS accepted the transparent-huge-page advice.
    #[getter]
    fn huge_pages(&self) -> bool {
        self.read().huge_pages()
    }

    fn __repr__(&self) -> String {
        let c = self.read();
        let s = c.shape();
        format!(
            "KvCache(num_layers={}, num_blocks={}, block_size={}, num_kv_heads={}, head_dim={}, dtype='{}')",
            s.num_layers,
            s.num_blocks,
            s.block_size,
            s.num_kv_heads,
            s.head_dim,
            c.dtype().name()
        )
    }

    /// Zero-copy, writable view of layer ``layer``'s K. The view keeps the cache alive.
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
    ///
    /// Returns:
    ///     Shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` (strided), dtype float32,
    ///     float16, or ``ml_dtypes.bfloat16`` (raw uint16 bits when ml_dtypes is not
    ///     installed).
    ///
    /// Raises:
    ///     InvalidArgumentError: ``layer`` outside ``0..num_layers``.
    fn key<'py>(slf: Bound<'py, Self>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        view(slf, layer, false)
    }

    /// Zero-copy view of layer ``layer``'s V; as :meth:`key`, including the rule that it must
    /// not be written while a kernel call on the same layer runs in another thread.
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///
    /// Returns:
    ///     Shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` (strided), the dtype of
    ///     :meth:`key`.
    ///
    /// Raises:
    ///     InvalidArgumentError: ``layer`` outside ``0..num_layers``.
    fn value<'py>(slf: Bound<'py, Self>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        view(slf, layer, true)
    }

    /// Store K and V of ``tokens`` tokens of layer ``layer`` at their slots, rounding to the
    /// storage dtype (nearest even). The GIL is released while it copies.
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///     k: float32 ``[tokens, num_kv_heads, head_dim]`` or ``[tokens, num_kv_heads *
    ///         head_dim]``.
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
        layer: i64,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        slot_mapping: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let layer = count(py, layer, "layer")?;
        let slots = int_vec(slot_mapping, "slot_mapping")?;
        let (ks, kv) = f32_values(k, "k")?;
        let (vs, vv) = f32_values(v, "v")?;
        let s = self.read().shape();
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
        py.detach(|| self.inner.write().unwrap_or_else(|p| p.into_inner()).write(layer, &kv, &vv, &slots)).py_err(py)
    }

    /// Copy whole blocks ``src -> dst`` for every ``(src, dst)`` row of ``pairs``, in every
    /// layer, K and V, in row order (e.g. the copy-on-write pairs of :meth:`BlockPool.step`).
    ///
    /// Args:
    ///     pairs: int ``[k, 2]`` block ids.
    ///
    /// Raises:
    ///     InvalidArgumentError: a block id outside ``0..num_blocks`` or a bad shape; nothing
    ///         is copied.
    fn copy_blocks(&self, py: Python<'_>, pairs: &Bound<'_, PyAny>) -> PyResult<()> {
        let (flat, rows, _) = int_matrix(pairs, "pairs", Some(2))?;
        let pairs: Vec<(i64, i64)> = (0..rows).map(|r| (flat[2 * r], flat[2 * r + 1])).collect();
        py.detach(|| self.inner.write().unwrap_or_else(|p| p.into_inner()).copy_blocks(&pairs)).py_err(py)
    }
}

/// A zero-copy numpy view of one layer's K or V in the logical shape
/// `[num_blocks, block_size, num_kv_heads, head_dim]`, kept alive by the cache object.
///
/// The array aliases memory that `write`, `copy_blocks` and the kernels touch with the
/// GIL released (the `RwLock` guards the cache object, not this array): a Python thread
/// writing it while a kernel call runs on another is a data race the caller must avoid,
/// as the stubs document. Handing out views is what the zero-copy contract asks for.
fn view<'py>(slf: Bound<'py, PyKvCache>, layer: i64, value: bool) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let layer = count(py, layer, "layer")?;
    let (ptr, s, strides, dtype) = {
        let c = slf.get().read();
        let st = if value { c.value_strides() } else { c.key_strides() };
        (c.layer_ptr(layer, value).py_err(py)?, c.shape(), st, c.dtype())
    };
    let dims = (s.num_blocks, s.block_size, s.num_kv_heads, s.head_dim).strides((strides[0], strides[1], strides[2], strides[3]));
    let owner = slf.into_any();
    match dtype {
        DType::F32 => {
            // SAFETY: ptr addresses this layer's K (or V), shape().layer_span() f32
            // elements inside its region, which the strides above cover exactly (the
            // last block ends the span); the buffer never moves or shrinks
            // while the cache object (set as the array's base) is alive.
            let a = unsafe { ArrayView4::from_shape_ptr(dims, ptr.cast::<f32>()) };
            // SAFETY: as above; `owner` keeps the memory alive.
            Ok(unsafe { PyArray4::borrow_from_array(&a, owner) }.into_any())
        }
        DType::F16 | DType::BF16 => {
            // SAFETY: as for f32, with 2-byte elements.
            let a = unsafe { ArrayView4::from_shape_ptr(dims, ptr.cast::<u16>()) };
            // SAFETY: as above.
            let raw = unsafe { PyArray4::borrow_from_array(&a, owner) }.into_any();
            let target = if dtype == DType::F16 {
                Some(py.import("numpy")?.getattr("float16")?)
            } else {
                py.import("ml_dtypes").and_then(|m| m.getattr("bfloat16")).ok()
            };
            match target {
                Some(t) => raw.call_method1("view", (t,)),
                None => Ok(raw),
            }
        }
    }
}

/// Options shared by both table forms.
fn options(
    py: Python<'_>,
    scale: Option<f64>,
    split_size: Option<i64>,
    kv_heads_per_item: Option<i64>,
    force_isa: Option<&str>,
    bf16_scores: bool,
) -> PyResult<DecodeOptions> {
    Ok(DecodeOptions {
        bf16_scores,
        scale: scale.map(|s| s as f32),
        split_tokens: split_size.map(|s| count(py, s, "split_size")).transpose()?,
        kv_heads_per_item: kv_heads_per_item.map(|s| count(py, s, "kv_heads_per_item")).transpose()?,
        isa: force_isa.map(Isa::parse).transpose().py_err(py)?,
    })
}

/// Validate q/out, run the kernel with the GIL released, return `out` (and the LSE).
#[allow(clippy::too_many_arguments)]
fn attend<'py>(
    py: Python<'py>,
    cache: &PyKvCache,
    layer: i64,
    q: &Bound<'py, PyAny>,
    tables: impl FnOnce(usize, usize) -> crate::Result<SeqTables>,
    out: Option<&Bound<'py, PyAny>>,
    return_lse: bool,
    opts: DecodeOptions,
) -> PyResult<Bound<'py, PyAny>> {
    let layer = count(py, layer, "layer")?;
    let (qshape, qv) = f32_values(q, "q")?;
    let [n, hq, d] = qshape[..] else {
        return Err(invalid(py, format!("q must be [num_seqs, num_q_heads, head_dim], got shape {qshape:?}")));
    };
    let guard = cache.read();
    let s = guard.shape();
    if d != s.head_dim {
        return Err(invalid(py, format!("q has head_dim {d}, the cache {}", s.head_dim)));
    }
    let t = tables(s.block_size, s.num_blocks).py_err(py)?;
    if t.len() != n {
        return Err(invalid(py, format!("q has {n} sequences, the block tables {}", t.len())));
    }
    let mut lse = if return_lse { vec![0f32; n * hq] } else { Vec::new() };
    // The kernel writes into the caller's `out` or into a new array.
    let out_arr = match out {
        Some(o) => {
            let arr = o
                .cast::<PyArrayDyn<f32>>()
                .map_err(|_| invalid(py, "out must be a float32 numpy array"))?;
            if arr.shape() != [n, hq, d] {
                return Err(invalid(py, format!("out must have shape [{n}, {hq}, {d}], got {:?}", arr.shape())));
            }
            Some(arr.clone())
        }
        None => None,
    };
    let mut rw = out_arr.as_ref().map(|a| a.try_readwrite()).transpose().map_err(|e| invalid(py, format!("out: {e}")))?;
    let mut owned = if rw.is_none() { vec![0f32; n * hq * d] } else { Vec::new() };
    let o_slice: &mut [f32] = match rw.as_mut() {
        Some(rw) => rw.as_slice_mut().map_err(|_| invalid(py, "out must be C-contiguous"))?,
        None => &mut owned,
    };
    py.detach(|| {
        let l = return_lse.then_some(&mut lse[..]);
        kernel::decode_attention(&guard, layer, &qv, hq, &t, o_slice, l, &opts)
    })
    .py_err(py)?;
    drop(rw);
    let out_obj = match out_arr {
        Some(a) => a.into_any(),
        None => PyArray1::from_vec(py, owned).reshape([n, hq, d])?.into_any(),
    };
    drop(guard);
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
///     q: float32 ``[n, Hq, head_dim]``, ``Hq`` a multiple of the cache's KV heads.
///     block_tables: int ``[n, max_blocks]`` (e.g. :meth:`BlockPool.block_tables`); entries
///         past ``ceil(seq_lens[i] / block_size)`` are never read.
///     seq_lens: ``n`` lengths in tokens (0 gives a zero output and an LSE of -inf).
///     scale: the softmax scale (default ``1 / sqrt(head_dim)``).
///     out: C-contiguous float32 ``[n, Hq, head_dim]`` written in place and returned
///         (default: a new array).
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
///         ``out`` that is not C-contiguous or not writable, an unknown path or one this
///         CPU lacks, ``kv_heads_per_item`` not dividing the KV heads, ``bf16_scores`` with
///         an f32 or f16 cache. ``out`` is not written on any error.
#[pyfunction]
#[pyo3(signature = (cache, layer, q, block_tables, seq_lens, scale = None, out = None, return_lse = false, *, split_size = None, kv_heads_per_item = None, force_isa = None, bf16_scores = false))]
#[allow(clippy::too_many_arguments)]
fn decode_attention<'py>(
    py: Python<'py>,
    cache: &Bound<'py, PyKvCache>,
    layer: i64,
    q: &Bound<'py, PyAny>,
    block_tables: &Bound<'py, PyAny>,
    seq_lens: &Bound<'py, PyAny>,
    scale: Option<f64>,
    out: Option<&Bound<'py, PyAny>>,
    return_lse: bool,
    split_size: Option<i64>,
    kv_heads_per_item: Option<i64>,
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
    layer: i64,
    q: &Bound<'py, PyAny>,
    kv_indptr: &Bound<'py, PyAny>,
    kv_indices: &Bound<'py, PyAny>,
    kv_last_page_len: &Bound<'py, PyAny>,
    scale: Option<f64>,
    out: Option<&Bound<'py, PyAny>>,
    return_lse: bool,
    split_size: Option<i64>,
    kv_heads_per_item: Option<i64>,
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
    nbytes: Option<i64>,
    threads: Option<i64>,
    cache: Option<&Bound<'_, PyKvCache>>,
    passes: Option<i64>,
) -> PyResult<f64> {
    let nbytes = nbytes.map(|n| count(py, n, "nbytes")).transpose()?;
    let threads = threads.map(|n| count(py, n, "threads")).transpose()?;
    let passes = passes.map(|n| count(py, n, "passes")).transpose()?;
    match cache {
        Some(_) if nbytes.is_some() => Err(invalid(py, String::from("give nbytes or cache, not both"))),
        Some(c) => {
            let c = c.get();
            py.detach(|| crate::probe::read_bandwidth_of(c.read().bytes(), threads, passes)).py_err(py)
        }
        None => py.detach(|| crate::probe::read_bandwidth(nbytes, threads, passes)).py_err(py),
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
fn peak_flops(py: Python<'_>, threads: Option<i64>) -> PyResult<f64> {
    let threads = threads.map(|n| count(py, n, "threads")).transpose()?;
    py.detach(|| crate::probe::peak_flops(threads)).py_err(py)
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
fn set_num_threads(py: Python<'_>, n: i64) -> PyResult<()> {
    let n = count(py, n, "n")?;
    py.detach(|| crate::threads::set_num_threads(n)).py_err(py)
}

/// Threads of the kernel pool.
///
/// Raises:
///     InvalidArgumentError: the pool could not be started (the OS refused the threads).
#[pyfunction]
fn get_num_threads(py: Python<'_>) -> PyResult<usize> {
    py.detach(crate::threads::num_threads).py_err(py)
}

/// SIMD features of this CPU relevant to the kernels.
///
/// Returns:
///     Feature names, e.g. ``["avx2", "fma", "avx512bf16"]`` or ``["neon"]``.
#[pyfunction]
fn cpu_features() -> Vec<&'static str> {
    kernel::cpu_features().to_vec()
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
