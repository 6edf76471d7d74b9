//! `KvCache` for Python: the paged KV storage, its numpy views, writes and block copies.

use std::ops::Range;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use numpy::ndarray::{ArrayView4, ShapeBuilder};
use numpy::PyArray4;
use pyo3::prelude::*;

use super::arrays::{f32_values, int_matrix, register_storage, release_storage};
use super::convert::{arg, count, int_scalar, int_vec};
use super::errors::{invalid, IntoPyResult};
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
    pub(super) shape: KvShape,
    dtype: DType,
    nbytes: usize,
    huge_pages: bool,
    /// Addresses of the storage (every layer's K and V): an `out` inside it is refused.
    pub(super) storage: Range<usize>,
}

impl PyKvCache {
    pub(super) fn read(&self) -> RwLockReadGuard<'_, KvCache> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The immutable facts other binding modules check against: shape and storage
    /// addresses (no lock needed).
    pub(super) fn facts(&self) -> (KvShape, &Range<usize>) {
        (self.shape, &self.storage)
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, KvCache> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
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
        register_storage(storage.clone());
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKvCache>()?;
    Ok(())
}
