//! `KvCache` for Python: the paged KV storage, its numpy views, writes and block copies.

use std::ops::Range;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;

use super::arrays::{byte_rows, f32_input, int_input, int_matrix, register_storage, release_storage};
use super::convert::{arg, count_arg};
use super::errors::{invalid, IntoPyResult};
use super::kv_views::{dequantized, scale_view, view, Region};
use crate::kv::{DType, KvCache, KvShape};
use crate::error::filled;
use crate::offload::transfer::{pack, slot_bytes_for, unpack, Handle};

/// Transfers a pool's tier storage runs on a cache's storage: every access to the cache
/// takes its lock and then waits for them, and a transfer is submitted only under the
/// write lock, so no Rust borrow of the storage ever overlaps a copy into it.
#[derive(Debug, Default)]
pub(crate) struct Fence(Mutex<Vec<Handle>>);

impl Fence {
    /// A transfer now in flight (the caller holds the cache's write lock).
    pub(crate) fn push(&self, h: Handle) {
        let mut hs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        hs.retain(|h| !h.poll());
        hs.push(h);
    }

    /// Wait for every transfer in flight (the caller holds the cache's lock, so none
    /// starts meanwhile). Their errors are the pool's to report (`wait_tiers`).
    fn wait(&self) {
        let hs = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        for h in hs {
            let _ = h.wait();
        }
    }
}

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
/// 8-bit dtypes store one-byte codes in that same layout, and f32 scales after each
/// layer's codes (value = code x scale):
///
/// - ``"int8"``: symmetric, one scale per (token, KV head) for K and for V, computed by
///   every :meth:`write` (``max|x| / 127`` over the token's ``head_dim`` values; codes
///   ``round_half_even(x / scale)`` clamped to +-127; an all-zero row has scale 0). Per
///   layer the scales are ``[num_blocks][2][num_kv_heads][block_size]`` (each block's K
///   scales, then its V scales), so :meth:`copy_blocks` carries them with the block.
/// - ``"fp8_e4m3"`` (``float8_e4m3fn``, largest 448) and ``"fp8_e5m2"`` (largest 57344):
///   one scale per (layer, KV head) for K and for V (``[2][num_kv_heads]`` per layer),
///   set by :meth:`set_fp8_scales` or, while still 0, calibrated by the first write to
///   the layer holding a non-zero value of that head (``max|x| / largest``); later
///   values beyond the calibrated range saturate. Conversion is saturating, round to
///   nearest even.
///
/// Args:
///     num_layers: layers.
///     num_blocks: blocks per layer (a :class:`BlockPool`'s ``num_blocks``).
///     block_size: token slots per block, at most 65536.
///     num_kv_heads: KV heads, at most 65536.
///     head_dim: elements per head, at most 65536.
///     dtype: the storage dtype: ``"f32"`` (default), ``"f16"``, ``"bf16"``, ``"int8"``,
///         ``"fp8_e4m3"`` or ``"fp8_e5m2"``.
///
/// Raises:
///     InvalidArgumentError: a zero dimension, ``block_size``/``head_dim``/
///         ``num_kv_heads`` above 65536, an unknown dtype, or a size beyond memory.
#[pyclass(name = "KvCache", module = "pykvpool", frozen)]
pub struct PyKvCache {
    inner: Arc<RwLock<KvCache>>,
    fence: Arc<Fence>,
    pub(super) shape: KvShape,
    pub(super) dtype: DType,
    nbytes: usize,
    huge_pages: bool,
    /// Addresses of the storage (every layer's K and V): an `out` inside it is refused.
    pub(super) storage: Range<usize>,
}

impl PyKvCache {
    /// The cache, read-locked, once no transfer is in flight.
    pub(super) fn read(&self) -> RwLockReadGuard<'_, KvCache> {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        self.fence.wait();
        g
    }

    /// The lock and fence a pool's tier storage shares (`BlockPool.attach_tier_storage`).
    pub(crate) fn shared(&self) -> (Arc<RwLock<KvCache>>, Arc<Fence>) {
        (self.inner.clone(), self.fence.clone())
    }

    /// The immutable facts other binding modules check against: shape and storage
    /// addresses (no lock needed).
    pub(super) fn facts(&self) -> (KvShape, &Range<usize>) {
        (self.shape, &self.storage)
    }

    /// The cache, write-locked, once no transfer is in flight.
    fn write_lock(&self) -> RwLockWriteGuard<'_, KvCache> {
        let g = self.inner.write().unwrap_or_else(|p| p.into_inner());
        self.fence.wait();
        g
    }
}

impl PyKvCache {
    /// `blocks` as block ids, each in `0..num_blocks` (`InvalidArgumentError` naming
    /// `blocks` otherwise, before anything is read or written).
    fn block_ids(&self, py: Python<'_>, blocks: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
        let ids = int_input(blocks, "blocks")?;
        let n = self.shape.num_blocks;
        ids.values()
            .iter()
            .map(|&b| usize::try_from(b).ok().filter(|&b| b < n).ok_or_else(|| invalid(py, format!("blocks: block {b} is outside 0..{n}"))))
            .collect()
    }
}

impl Drop for PyKvCache {
    fn drop(&mut self) {
        release_storage(&self.storage);
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
        let shape = KvShape {
            num_layers: count_arg(num_layers, "num_layers")?,
            num_blocks: count_arg(num_blocks, "num_blocks")?,
            block_size: count_arg(block_size, "block_size")?,
            num_kv_heads: count_arg(num_kv_heads, "num_kv_heads")?,
            head_dim: count_arg(head_dim, "head_dim")?,
        };
        let dtype = DType::parse(dtype).py_err(py)?;
        let cache = py.detach(|| KvCache::new(shape, dtype)).py_err(py)?;
        let storage = cache.address_range();
        register_storage(storage.clone());
        Ok(Self { shape, dtype, nbytes: cache.nbytes(), huge_pages: cache.huge_pages(), storage, inner: Arc::new(RwLock::new(cache)), fence: Arc::default() })
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
    /// The storage dtype: "f32", "f16", "bf16", "int8", "fp8_e4m3" or "fp8_e5m2".
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }
    /// Bytes of K plus V over all layers: codes, the padding before each layer's scales
    /// (to 64 bytes) and the scales; ``num_layers * num_blocks * block_size *``
    /// :meth:`bytes_per_token` plus, per layer, that padding and the fp8 per-head scales.
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
    /// A writable view lets the caller store any code, ``fp8_e4m3``'s two NaN codes
    /// included (:meth:`write` refuses non-finite values and saturates, so it never makes
    /// one). Once a cache has handed one out (K or V, any layer), the AVX-512 decode path
    /// checks each e4m3 tile it reads for NaN codes (measured at 4-7% of an MHA call:
    /// ``docs/experiments.md``, conversions); read-only views do not cost it.
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///     writable: False for a read-only view.
    ///
    /// Returns:
    ///     Shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` (strided), dtype float32,
    ///     float16, ``ml_dtypes.bfloat16`` (a dependency: another dtype is never handed
    ///     out); for 8-bit caches the raw codes: int8, ``ml_dtypes.float8_e4m3fn`` or
    ///     ``ml_dtypes.float8_e5m2`` (unscaled: see :meth:`key_scales`,
    ///     :meth:`dequantized`).
    ///
    /// Raises:
    ///     InvalidArgumentError: ``layer`` outside ``0..num_layers``.
    ///     ImportError: a bf16 or fp8 cache and ``ml_dtypes`` cannot be imported.
    #[pyo3(signature = (layer, *, writable = true))]
    fn key<'py>(
        slf: Bound<'py, Self>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        writable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        layer_view(slf, layer, false, writable)
    }

    /// Zero-copy view of layer ``layer``'s V; as :meth:`key`, including the rule that it must
    /// not be written while a kernel call on the same layer runs in another thread, and
    /// the e4m3 NaN-code check a writable view turns on.
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
    ///     ImportError: a bf16 or fp8 cache and ``ml_dtypes`` cannot be imported.
    #[pyo3(signature = (layer, *, writable = true))]
    fn value<'py>(
        slf: Bound<'py, Self>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        writable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        layer_view(slf, layer, true, writable)
    }

    /// Store K and V of ``tokens`` tokens of layer ``layer`` at their slots, rounding to the
    /// storage dtype (nearest even); 8-bit caches quantize (int8: a scale per token and
    /// head; fp8: the layer's scales, calibrated by this write where still 0; see
    /// :class:`KvCache`). The GIL is released while it copies; C-contiguous ``k``,
    /// ``v`` (and an int64 ``slot_mapping``) are read in place, without a copy, and must
    /// not be written by another thread meanwhile.
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///     k: float32 ``[tokens, num_kv_heads, head_dim]`` or ``[tokens, num_kv_heads *
    ///         head_dim]``, any strides (read in logical order: any other layout than
    ///         C-contiguous, or a view of a cache, is copied first).
    ///     v: float32, the shape of ``k``.
    ///     slot_mapping: ``tokens`` int slots, ``block * block_size + offset``; -1 is padding,
    ///         skipped (e.g. the ``slot_mapping`` of :meth:`BlockPool.step`).
    ///
    /// Raises:
    ///     InvalidArgumentError: a bad layer, dtype or shape, a slot outside
    ///         ``-1..num_blocks * block_size``, or (8-bit caches) a non-finite value in
    ///         ``k`` or ``v``. Nothing is written on error.
    fn write(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        slot_mapping: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let slots = int_input(slot_mapping, "slot_mapping")?;
        let slots = slots.values();
        let (k, v) = (f32_input(k, "k")?, f32_input(v, "v")?);
        let s = self.shape;
        for (name, shape) in [("k", &k.shape), ("v", &v.shape)] {
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
        let (kv, vv) = (k.values(), v.values());
        py.detach(|| self.write_lock().write(layer, kv, vv, slots)).py_err(py)
    }

    /// Zero-copy float32 view of layer ``layer``'s K scales (8-bit caches), aliasing the
    /// cache as :meth:`key` does (same threading rule). Writing it rescales the codes it
    /// covers.
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///     writable: False for a read-only view.
    ///
    /// Returns:
    ///     int8: ``[num_blocks, block_size, num_kv_heads]`` (strided), the scale of each
    ///     token slot's K row of each head; fp8: ``[num_kv_heads]``, the layer's scales.
    ///
    /// Raises:
    ///     InvalidArgumentError: ``layer`` outside ``0..num_layers``, or a cache without
    ///         scales (f32, f16, bf16).
    #[pyo3(signature = (layer, *, writable = true))]
    fn key_scales<'py>(
        slf: Bound<'py, Self>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        writable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let r = region(slf, |c| c.scales_ptr(layer))?;
        scale_view(r, false, writable)
    }

    /// Zero-copy float32 view of layer ``layer``'s V scales; as :meth:`key_scales`.
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///     writable: False for a read-only view.
    ///
    /// Returns:
    ///     The shape of :meth:`key_scales`.
    ///
    /// Raises:
    ///     InvalidArgumentError: ``layer`` outside ``0..num_layers``, or a cache without
    ///         scales (f32, f16, bf16).
    #[pyo3(signature = (layer, *, writable = true))]
    fn value_scales<'py>(
        slf: Bound<'py, Self>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        writable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let r = region(slf, |c| c.scales_ptr(layer))?;
        scale_view(r, true, writable)
    }

    /// Set layer ``layer``'s fp8 scales, one per KV head for K and for V (e.g. a model's
    /// calibrated ``k_scale``/``v_scale``). Codes already stored are not converted: they
    /// are read with the new scales. A scale of 0 means "not set": the next write with a
    /// non-zero value of that head calibrates it.
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///     k_scales: float32 ``[num_kv_heads]``, finite and >= 0.
    ///     v_scales: float32 ``[num_kv_heads]``, finite and >= 0.
    ///
    /// Raises:
    ///     InvalidArgumentError: not an fp8 cache, a bad ``layer``, a scale array that is not
    ///         float32 of shape ``[num_kv_heads]``, a negative or non-finite scale (the
    ///         message names ``k_scales`` or ``v_scales``). Nothing is set on error.
    fn set_fp8_scales(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        k_scales: &Bound<'_, PyAny>,
        v_scales: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let hk = self.shape.num_kv_heads;
        let mut vals = Vec::with_capacity(2);
        for (name, x) in [("k_scales", k_scales), ("v_scales", v_scales)] {
            let v = f32_input(x, name)?;
            if v.shape.as_slice() != [hk] {
                return Err(invalid(py, format!("{name} must have shape [{hk}] (one scale per KV head), got {:?}", v.shape)));
            }
            vals.push(v);
        }
        let r = self.write_lock().set_fp8_scales(layer, vals[0].values(), vals[1].values());
        r.py_err(py)
    }

    /// Float32 copies of layer ``layer``'s K and V: codes times their scales (8-bit
    /// caches) or the elements widened, the values every kernel attends over. The GIL is
    /// released while it copies.
    ///
    /// Args:
    ///     layer: ``0..num_layers``.
    ///
    /// Returns:
    ///     ``(k, v)``, each float32 ``[num_blocks, block_size, num_kv_heads, head_dim]``
    ///     (C-contiguous, new arrays).
    ///
    /// Raises:
    ///     InvalidArgumentError: ``layer`` outside ``0..num_layers``.
    fn dequantized<'py>(
        slf: &Bound<'py, Self>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let py = slf.py();
        let this = slf.get();
        let kv = py.detach(|| this.read().dequantize(layer)).py_err(py)?;
        dequantized(py, this.shape, kv)
    }

    /// Bytes one token slot takes in one layer of a cache, K and V: codes plus the
    /// per-token scales, ``2 * num_kv_heads * (head_dim * element bytes + 4 if int8)``
    /// (the per-layer fp8 scales and the region padding are not per token; see
    /// :attr:`nbytes`). The ledger's 8-bit and 16/32-bit storage formats use this.
    ///
    /// Args:
    ///     num_kv_heads: KV heads, 1..65536.
    ///     head_dim: elements per head, 1..65536.
    ///     dtype: a storage dtype as :class:`KvCache` accepts.
    ///
    /// Returns:
    ///     Bytes per token slot per layer.
    ///
    /// Raises:
    ///     InvalidArgumentError: ``num_kv_heads`` or ``head_dim`` outside 1..65536 (or not
    ///         an int), an unknown dtype.
    #[staticmethod]
    fn bytes_per_token(py: Python<'_>, num_kv_heads: &Bound<'_, PyAny>, head_dim: &Bound<'_, PyAny>, dtype: &str) -> PyResult<usize> {
        let (hk, d) = (count_arg(num_kv_heads, "num_kv_heads")?, count_arg(head_dim, "head_dim")?);
        if hk == 0 || d == 0 || hk > 1 << 16 || d > 1 << 16 {
            return Err(invalid(py, format!("num_kv_heads and head_dim must be in 1..=65536, got {hk} and {d}")));
        }
        let dtype = DType::parse(dtype).py_err(py)?;
        Ok(crate::kv::quant::bytes_per_token(hk, d, dtype).unwrap_or(usize::MAX))
    }

    /// Copy whole blocks out of the cache, as bytes: per block, every layer's K and V
    /// codes as the cache stores them (and int8's per-token scales), the byte order the
    /// tiers below a pool store (:meth:`BlockPool.attach_tier_storage`). A block's bytes
    /// go back with :meth:`import_blocks`, into any block of this cache or of a cache of
    /// the same shape and dtype (fp8: with the same :meth:`set_fp8_scales`, which belong
    /// to no block).
    ///
    /// Args:
    ///     blocks: block ids, each in ``0..num_blocks`` (a 1-D int array or list).
    ///
    /// Returns:
    ///     uint8 ``[len(blocks), block_bytes]``, a new array; ``block_bytes`` is
    ///     ``num_layers x block_size x`` :meth:`bytes_per_token`.
    ///
    /// Raises:
    ///     InvalidArgumentError: naming ``blocks``: a block id out of range, a bad array.
    ///     TypeError: ``blocks`` not an int array or sequence.
    fn export_blocks<'py>(&self, py: Python<'py>, blocks: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let ids = self.block_ids(py, blocks)?;
        let row = slot_bytes_for(&self.read());
        let mut out = filled(0u8, ids.len().saturating_mul(row), "blocks").py_err(py)?;
        py.detach(|| {
            let c = self.read();
            ids.iter().zip(out.chunks_exact_mut(row.max(1))).try_for_each(|(&b, o)| pack(&c, b, o))
        })
        .py_err(py)?;
        Ok(PyArray1::from_vec(py, out).reshape([ids.len(), row])?.into_any())
    }

    /// Write whole blocks from bytes :meth:`export_blocks` made: row ``i`` of ``data``
    /// becomes block ``blocks[i]`` (every layer, K and V, int8 scales). Codes a write
    /// never makes (an fp8 NaN, int8's -128) are then checked for by the kernels.
    ///
    /// Args:
    ///     blocks: block ids, each in ``0..num_blocks``; a block listed twice takes its
    ///         last row.
    ///     data: uint8 ``[len(blocks), block_bytes]``, C-contiguous (read in place; copied
    ///         first when it is a view of a :class:`KvCache`).
    ///
    /// Raises:
    ///     InvalidArgumentError: naming the argument: a block id out of range, ``data`` of
    ///         another shape or not C-contiguous. Nothing is written on error.
    ///     TypeError: ``data`` not a uint8 numpy array, ``blocks`` not ints.
    fn import_blocks(&self, py: Python<'_>, blocks: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = self.block_ids(py, blocks)?;
        let row = slot_bytes_for(&self.read());
        let rows = byte_rows(data, "data", ids.len(), row)?;
        let bytes = rows.bytes();
        py.detach(|| {
            let mut c = self.write_lock();
            ids.iter().zip(bytes.chunks_exact(row.max(1))).try_for_each(|(&b, d)| unpack(d, &mut c, b))
        })
        .py_err(py)
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

/// The cache object and the pointer `f` takes from the cache, read under the lock (held
/// for the pointer only, never while a Python object is made).
fn region<'py>(slf: Bound<'py, PyKvCache>, f: impl FnOnce(&KvCache) -> crate::error::Result<*const u8>) -> PyResult<Region<'py>> {
    let py = slf.py();
    let (s, dtype) = (slf.get().shape, slf.get().dtype);
    let ptr = f(&slf.get().read());
    Ok(Region { ptr: ptr.py_err(py)?, s, dtype, owner: slf.into_any() })
}

/// [`view`] of `layer`'s K (or V).
fn layer_view(slf: Bound<'_, PyKvCache>, layer: usize, value: bool, writable: bool) -> PyResult<Bound<'_, PyAny>> {
    let mut strides = [0; 4];
    let r = region(slf, |c| {
        strides = if value { c.value_strides() } else { c.key_strides() };
        let ptr = c.layer_ptr(layer, value);
        if writable && ptr.is_ok() {
            // The caller may now write any code, e4m3's NaN codes included.
            c.note_raw_writes();
        }
        ptr
    })?;
    view(r, strides, writable)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKvCache>()?;
    // The one list of storage dtype names: every Python module that names a dtype reads it.
    let names: Vec<&str> = crate::kv::DType::ALL.iter().map(|d| d.name()).collect();
    m.add("KV_DTYPES", pyo3::types::PyTuple::new(m.py(), names)?)?;
    Ok(())
}
