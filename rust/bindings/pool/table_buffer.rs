//! `BlockTableBuffer`: a long-lived padded block-table matrix synced incrementally.

use std::sync::Mutex;

use numpy::{PyArray2, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::class::{lock, PyBlockPool, MAX_TABLE_ENTRIES};
use crate::bindings::convert::arg;
use crate::bindings::errors::{invalid, IntoPyResult};
use super::specs::group_arg;
use crate::pool::table_sync::TableSync;


/// A long-lived int32 ``[max_seqs, max_blocks]`` block-table matrix that :meth:`sync`
/// updates in place, writing only entries that changed since the last sync (new blocks;
/// whole rows only after copy-on-write, truncation or a new sequence).
///
/// ``array`` is the numpy matrix itself (no copy); treat it as read-only, or call
/// :meth:`invalidate` after writing to it.
///
/// Args:
///     max_seqs: rows (sequences).
///     max_blocks: columns (blocks per table).
///     pad: the value of unused entries, an int32 (default -1).
///
/// Raises:
///     InvalidArgumentError: a zero shape, more than ``2**28`` entries, or ``pad`` outside
///         int32.
#[pyclass(name = "BlockTableBuffer", module = "pykvpool", frozen)]
pub struct PyBlockTableBuffer {
    /// The matrix, Python-visible: its dtype, shape and memory can be changed from
    /// Python (`array.dtype = ...`, `array.resize(...)`), so `sync` re-checks all of them
    /// against the fields below before writing.
    array: Py<PyArray2<i32>>,
    /// Address of the int32 `[rows, width]` data allocated in `new`.
    data: usize,
    rows: usize,
    width: usize,
    pad: i32,
    sync: Mutex<TableSync>,
}

impl PyBlockTableBuffer {
    /// `array` if it still is the C-contiguous, writeable int32 `[rows, width]` matrix
    /// at the address allocated in `new`; else an `InvalidArgumentError`.
    fn checked_array<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i32>>> {
        let bad = |what: String| invalid(py, format!("BlockTableBuffer.array {what}; make a new BlockTableBuffer"));
        let any = self.array.bind(py).as_any();
        let untyped = any.cast::<PyUntypedArray>().map_err(|_| bad("is no longer an array".into()))?;
        let dtype = untyped.dtype();
        if !dtype.is_equiv_to(&numpy::dtype::<i32>(py)) {
            return Err(bad(format!("has dtype {}, not int32", dtype.str()?.to_cow()?)));
        }
        if untyped.shape() != [self.rows, self.width] {
            return Err(bad(format!("has shape {:?}, not [{}, {}]", untyped.shape(), self.rows, self.width)));
        }
        if !untyped.is_c_contiguous() {
            return Err(bad("is not C-contiguous".into()));
        }
        let arr = any.cast::<PyArray2<i32>>().map_err(|_| bad("is not a 2-D int32 array".into()))?;
        if arr.data() as usize != self.data {
            return Err(bad("no longer holds the memory it was allocated with (resized or replaced)".into()));
        }
        Ok(arr.clone())
    }
}

#[pymethods]
impl PyBlockTableBuffer {
    #[new]
    #[pyo3(signature = (max_seqs, max_blocks, pad = -1))]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = arg::max_seqs)] max_seqs: usize,
        #[pyo3(from_py_with = arg::max_blocks)] max_blocks: usize,
        #[pyo3(from_py_with = arg::pad)] pad: i32,
    ) -> PyResult<Self> {
        let (rows, width) = (max_seqs, max_blocks);
        if rows == 0 || width == 0 || rows.saturating_mul(width) > MAX_TABLE_ENTRIES {
            return Err(invalid(
                py,
                format!(
                    "max_seqs x max_blocks: a {rows} x {width} table buffer must be non-empty and hold at most \
                     {MAX_TABLE_ENTRIES} entries"
                ),
            ));
        }
        // Both allocations are fallible: a host that cannot hold them refuses, never aborts
        // (numpy's own allocation raises MemoryError; the matrix owns its data, as any
        // numpy array a caller may resize, which `checked_array` then refuses).
        let sync = TableSync::new(rows, width, pad).py_err(py)?;
        let array = py
            .import("numpy")?
            .call_method1("full", ((rows, width), pad, "int32"))?
            .cast_into::<PyArray2<i32>>()
            .map_err(PyErr::from)?;
        let data = array.data() as usize;
        Ok(Self { array: array.unbind(), data, rows, width, pad, sync: Mutex::new(sync) })
    }

    /// The int32 ``[max_seqs, max_blocks]`` matrix, padded with :attr:`pad`.
    #[getter]
    fn array<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray2<i32>> {
        self.array.bind(py).clone()
    }

    /// The padding value of unused entries.
    #[getter]
    fn pad(&self) -> i32 {
        self.pad
    }

    /// Make row ``i`` hold the block table of ``seq_ids[i]`` in ``group``; rows past
    /// ``len(seq_ids)`` are left as they were.
    ///
    /// A buffer mirrors one layer group's tables (keep one buffer per group). Holes (blocks
    /// a window released, or a prefix hit never stored) are ``pad``, as in
    /// :meth:`BlockPool.block_tables`; the entries a window released since the last sync
    /// become ``pad`` in place.
    ///
    /// Args:
    ///     pool: the :class:`BlockPool` the sequences live in.
    ///     seq_ids: at most ``max_seqs`` live sequence ids.
    ///     group: the layer group whose tables to mirror: required for a pool built with
    ///         ``groups``, 0 (the only one) by default for one built without.
    ///
    /// Returns:
    ///     The number of entries written.
    ///
    /// Raises:
    ///     UnknownSequenceError: an id is not live.
    ///     InvalidArgumentError: ``pool`` is not a BlockPool, ``group`` is not an int, not a
    ///         group of the pool or missing, too many ids, a table longer than
    ///         ``max_blocks``, or the array is not writable. Nothing is written on error.
    #[pyo3(signature = (pool, seq_ids, group = None))]
    fn sync(
        &self,
        py: Python<'_>,
        pool: &Bound<'_, PyAny>,
        seq_ids: &Bound<'_, PyAny>,
        group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let group = group.map(group_arg).transpose()?;
        let ids = crate::bindings::convert::seq_ids(seq_ids, "seq_ids")?;
        let Ok(pool) = pool.cast::<PyBlockPool>() else {
            let ty = pool.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            return Err(invalid(py, format!("pool must be a BlockPool, got {ty}")));
        };
        let pool = pool.get();
        let g = pool.group(py, group)?;
        let arr = self.checked_array(py)?;
        let mut rw = arr
            .try_readwrite()
            .map_err(|e| invalid(py, format!("table buffer array is not writable or is borrowed: {e}")))?;
        let out = rw.as_slice_mut().map_err(|e| invalid(py, e.to_string()))?;
        // Lock order: the pool, then the buffer's state (the only place taking both).
        pool.with(|p| lock(&self.sync).sync(p, g, &ids, out)).py_err(py)
    }

    /// Forget the matrix contents: the next sync rewrites every row it touches.
    fn invalidate(&self) {
        lock(&self.sync).invalidate()
    }
}
