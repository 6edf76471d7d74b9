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

#[pyclass(name = "KvCache", module = "pykvpool", frozen)]
pub struct PyKvCache {
    inner: RwLock<KvCache>,
}

impl PyKvCache {
    fn read(&self) -> RwLockReadGuard<'_, KvCache> {
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

    #[getter]
    fn num_layers(&self) -> usize {
        self.read().shape().num_layers
    }
    #[getter]
    fn num_blocks(&self) -> usize {
        self.read().shape().num_blocks
    }
    #[getter]
    fn block_size(&self) -> usize {
        self.read().shape().block_size
    }
    #[getter]
    fn num_kv_heads(&self) -> usize {
        self.read().shape().num_kv_heads
    }
    #[getter]
    fn head_dim(&self) -> usize {
        self.read().shape().head_dim
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.read().dtype().name()
    }
    #[getter]
    fn nbytes(&self) -> usize {
        self.read().nbytes()
    }
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

    fn key<'py>(slf: Bound<'py, Self>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        view(slf, layer, false)
    }

    fn value<'py>(slf: Bound<'py, Self>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        view(slf, layer, true)
    }

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

#[pyfunction]
#[pyo3(signature = (threads = None))]
fn peak_flops(py: Python<'_>, threads: Option<i64>) -> PyResult<f64> {
    let threads = threads.map(|n| count(py, n, "threads")).transpose()?;
    py.detach(|| crate::probe::peak_flops(threads)).py_err(py)
}

#[pyfunction]
fn set_num_threads(py: Python<'_>, n: i64) -> PyResult<()> {
    let n = count(py, n, "n")?;
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
