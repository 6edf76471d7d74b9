//! `KvCache`, `decode_attention`, the probes and the thread/ISA controls for Python.

use std::ops::Range;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use numpy::ndarray::{ArrayView4, ShapeBuilder};
use numpy::{PyArray1, PyArray2, PyArray4, PyArrayMethods};
use pyo3::prelude::*;

use super::arrays::{checked_out, f32_values, int_matrix};
use super::convert::{arg, count, int_scalar, int_vec};
use super::errors::{invalid, IntoPyResult};
use crate::kernel::{self, DecodeOptions, Isa, SeqTables};
use crate::kv_storage::{DType, KvCache, KvShape};

/// `KvCache` for Python. The lock guards the storage only; the shape and dtype never
/// change, so they are copied out at construction and read without it. Every method
/// takes the lock inside a scope that touches no Python object (or inside `py.detach`)
/// and drops it before converting a result or an error.
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

    #[getter]
    fn num_layers(&self) -> usize {
        self.shape.num_layers
    }
    #[getter]
    fn num_blocks(&self) -> usize {
        self.shape.num_blocks
    }
    #[getter]
    fn block_size(&self) -> usize {
        self.shape.block_size
    }
    #[getter]
    fn num_kv_heads(&self) -> usize {
        self.shape.num_kv_heads
    }
    #[getter]
    fn head_dim(&self) -> usize {
        self.shape.head_dim
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }
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

    #[pyo3(signature = (layer, *, writable = true))]
    fn key<'py>(
        slf: Bound<'py, Self>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        writable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        view(slf, layer, false, writable)
    }

    #[pyo3(signature = (layer, *, writable = true))]
    fn value<'py>(
        slf: Bound<'py, Self>,
        #[pyo3(from_py_with = arg::layer)] layer: usize,
        writable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        view(slf, layer, true, writable)
    }

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
    tables: impl FnOnce(usize, usize) -> crate::Result<SeqTables>,
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
    let out_arr = out.map(|o| checked_out(o, q, [n, hq, d], &cache.storage)).transpose()?;
    let mut rw = out_arr.as_ref().map(|a| a.try_readwrite()).transpose().map_err(|e| invalid(py, format!("out: {e}")))?;
    let mut owned = if rw.is_none() { vec![0f32; n * hq * d] } else { Vec::new() };
    let o_slice: &mut [f32] = match rw.as_mut() {
        Some(rw) => rw.as_slice_mut().map_err(|_| invalid(py, "out must be C-contiguous"))?,
        None => &mut owned,
    };
    let done = py.detach(|| {
        let l = return_lse.then_some(&mut lse[..]);
        kernel::decode_attention(&cache.read(), layer, &qv, hq, &t, o_slice, l, &opts)
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
            py.detach(|| crate::probe::read_bandwidth_of(c.read().bytes(), threads, passes)).py_err(py)
        }
        None => py.detach(|| crate::probe::read_bandwidth(nbytes, threads, passes)).py_err(py),
    }
}

#[pyfunction]
#[pyo3(signature = (threads = None))]
fn peak_flops(py: Python<'_>, #[pyo3(from_py_with = arg::threads)] threads: Option<usize>) -> PyResult<f64> {
    py.detach(|| crate::probe::peak_flops(threads)).py_err(py)
}

#[pyfunction]
fn set_num_threads(py: Python<'_>, #[pyo3(from_py_with = arg::n_threads)] n: usize) -> PyResult<()> {
    let max = crate::threads::MAX_THREADS;
    if !(1..=max).contains(&n) {
        return Err(invalid(py, format!("n must be in 1..={max} threads, got {n}")));
    }
    py.detach(|| crate::threads::set_num_threads(n)).py_err(py)
}

#[pyfunction]
fn get_num_threads(py: Python<'_>) -> PyResult<usize> {
    py.detach(crate::threads::num_threads).py_err(py)
}

#[pyfunction]
fn cpu_features() -> Vec<&'static str> {
    kernel::cpu_features().to_vec()
}

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
