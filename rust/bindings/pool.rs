//! `BlockPool`, `PoolStats` and `BlockTableBuffer` for Python.

use std::sync::{Mutex, MutexGuard};

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyInt;

use super::convert::{arg, count, counts_into, int_scalar, MAX_CALL_TOKENS};
use super::errors::{invalid, IntoPyResult};
use crate::pool::{BlockPool, PoolStats, StepOutput};
use crate::table_sync::TableSync;
use crate::types::{BlockId, SeqId};

/// Largest padded table `block_tables` returns or `BlockTableBuffer` holds, in entries
/// (1 GiB of int32). Anything larger is a caller error, and allocating it would take the
/// process down (the OS kills it when the pages are touched) instead of raising.
const MAX_TABLE_ENTRIES: usize = 1 << 28;

/// Buffers of `step`, reused by the next call on the same thread: a decode step otherwise
/// allocates and frees its counts, slots and lengths every time (measured: ~0.1 us of a
/// 211-sequence step from Python).
#[derive(Default)]
struct StepScratch {
    out: StepOutput,
    counts: Vec<usize>,
    ids: Vec<SeqId>,
}

/// Largest scratch buffer kept between calls, in entries: a long prefill's buffers are
/// dropped rather than held by the thread for good.
const SCRATCH_KEEP: usize = 1 << 16;

thread_local! {
    static STEP_SCRATCH: std::cell::Cell<StepScratch> = const {
        std::cell::Cell::new(StepScratch {
            out: StepOutput { slots: Vec::new(), cow: Vec::new(), seq_lens: Vec::new() },
            counts: Vec::new(),
            ids: Vec::new(),
        })
    };
}

type I64Array<'py> = Bound<'py, PyArray1<i64>>;
type I32Array<'py> = Bound<'py, PyArray1<i32>>;
type PairArray<'py> = Bound<'py, PyArray2<i64>>;

/// Lock a mutex, recovering from poisoning: core operations never panic half-way, and a
/// poisoned lock would otherwise make the pool unusable from Python forever.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Work (sequences + new tokens, or blocks) below which a call keeps the GIL. Releasing
/// and retaking it costs ~0.2 us, a sixth of a whole 211-sequence decode step in the core,
/// while a call this small finishes within ~10 us (the slowest: a 2,176-token prompt
/// admitted with prefix caching that evicts 136 blocks, ~8 us); anything larger (a long
/// prefill, a batch of thousands) releases it so other Python threads run meanwhile.
pub(crate) const INLINE_WORK: usize = 4096;

/// Run `f` on the pool: under the GIL when `work` is below [`INLINE_WORK`], else with
/// the GIL released. The lock is always dropped before the GIL is retaken, so a thread
/// waiting for the pool under the GIL cannot deadlock against one returning from `detach`.
fn with_pool<R: Send>(
    py: Python<'_>,
    m: &Mutex<BlockPool>,
    work: usize,
    f: impl FnOnce(&mut BlockPool) -> R + Send,
) -> R {
    if work < INLINE_WORK {
        f(&mut lock(m))
    } else {
        py.detach(|| f(&mut lock(m)))
    }
}

pub(crate) fn cow_array<'py>(py: Python<'py>, pairs: &[(BlockId, BlockId)]) -> PyResult<Bound<'py, PyArray2<i64>>> {
    if pairs.is_empty() {
        // The usual case: no reshape, no data buffer to build. (A shared read-only
        // empty array would save ~0.07 us, but numpy lets a caller reshape or resize an
        // array in place, which would change what every later call returns.)
        return Ok(PyArray2::zeros(py, [0, 2], false));
    }
    let flat: Vec<i64> = pairs.iter().flat_map(|(s, d)| [s.0 as i64, d.0 as i64]).collect();
    // Built in its final shape: a numpy reshape call costs more than the whole decode
    // bookkeeping of a small batch.
    let arr = Array2::from_shape_vec((pairs.len(), 2), flat).map_err(|e| invalid(py, e.to_string()))?;
    Ok(arr.into_pyarray(py))
}

#[pyclass(name = "BlockPool", module = "pykvpool", frozen)]
pub struct PyBlockPool {
    inner: Mutex<BlockPool>,
}

impl PyBlockPool {
    pub(crate) fn pool(&self) -> MutexGuard<'_, BlockPool> {
        lock(&self.inner)
    }

    /// [`with_pool`] on this pool.
    pub(crate) fn run<R: Send>(&self, py: Python<'_>, work: usize, f: impl FnOnce(&mut BlockPool) -> R + Send) -> R {
        with_pool(py, &self.inner, work, f)
    }
}

#[pymethods]
impl PyBlockPool {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, *, prefix_caching = false, eviction = None,
        verify_tokens = None, cow_partial_hit = None, record_events = None, hash_bits = None, max_events = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        prefix_caching: bool,
        eviction: Option<&str>,
        verify_tokens: Option<bool>,
        cow_partial_hit: Option<bool>,
        record_events: Option<bool>,
        hash_bits: Option<u32>,
        max_events: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let nb = count(py, int_scalar(num_blocks, "num_blocks")?, "num_blocks")?;
        let bs = count(py, int_scalar(block_size, "block_size")?, "block_size")?;
        let opts =
            super::prefix::CacheOptions { eviction, verify_tokens, cow_partial_hit, record_events, hash_bits, max_events };
        let cfg = opts.config(py, prefix_caching)?;
        let pool = py
            .detach(|| match cfg {
                Some(cfg) => BlockPool::with_prefix_cache(nb, bs, cfg),
                None => BlockPool::new(nb, bs),
            })
            .py_err(py)?;
        Ok(Self { inner: Mutex::new(pool) })
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.pool().num_blocks()
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.pool().block_size()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.pool().num_free_blocks()
    }

    #[getter]
    fn num_used_blocks(&self) -> usize {
        self.pool().num_used_blocks()
    }

    #[getter]
    fn num_seqs(&self) -> usize {
        self.pool().num_seqs()
    }

    fn __len__(&self) -> usize {
        self.pool().num_seqs()
    }

    fn __contains__(&self, py: Python<'_>, seq: &Bound<'_, PyAny>) -> bool {
        match int_scalar(seq, "seq_id") {
            Ok(v) if v >= 0 => self.pool().contains(SeqId(v as u64)),
            _ => {
                let _ = py;
                false
            }
        }
    }

    fn __repr__(&self) -> String {
        let p = self.pool();
        format!(
            "BlockPool(num_blocks={}, block_size={}, free={}, seqs={})",
            p.num_blocks(),
            p.block_size(),
            p.num_free_blocks(),
            p.num_seqs()
        )
    }

    #[pyo3(signature = (seq_id, prompt_len = 0))]
    fn add_sequence<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::prompt_len)] prompt_len: usize,
    ) -> PyResult<I64Array<'py>> {
        let slots = with_pool(py, &self.inner, prompt_len, |pool| {
            let mut slots = Vec::new();
            pool.add_sequence(seq_id, prompt_len, &mut slots).map(|_| slots)
        })
        .py_err(py)?;
        // The Vec is handed to numpy as is: copying into a numpy-allocated array measured
        // 0.1 us slower for a 2,000-token prompt.
        Ok(PyArray1::from_vec(py, slots))
    }

    #[pyo3(signature = (seq_id, num_tokens = 1))]
    #[allow(clippy::type_complexity)]
    fn append<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::new_tokens)] num_tokens: usize,
    ) -> PyResult<(I64Array<'py>, PairArray<'py>)> {
        let (slots, cow) = py
            .detach(|| {
                let (mut slots, mut cow) = (Vec::new(), Vec::new());
                self.pool().append(seq_id, num_tokens, &mut slots, &mut cow).map(|_| (slots, cow))
            })
            .py_err(py)?;
        Ok((PyArray1::from_vec(py, slots), cow_array(py, &cow)?))
    }

    #[pyo3(signature = (seq_ids, num_tokens = None))]
    fn step<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        num_tokens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(I64Array<'py>, PairArray<'py>, I32Array<'py>)> {
        let mut scratch = STEP_SCRATCH.take();
        let StepScratch { out, counts: n, ids } = &mut scratch;
        super::convert::seq_ids_into(seq_ids, "seq_ids", ids)?;
        let ids = &ids[..];
        // A decode step (`num_tokens` absent or the int 1) needs no counts at all; anything
        // else goes through the checked conversion, and so does an explicit 1 for a batch
        // beyond MAX_CALL_TOKENS, which that conversion refuses.
        let counted = match num_tokens {
            Some(o) if o.is_exact_instance_of::<PyInt>() && o.extract::<i64>().is_ok_and(|v| v == 1) => None,
            other => other,
        };
        match counted {
            None if num_tokens.is_none() || ids.len() <= MAX_CALL_TOKENS => {
                with_pool(py, &self.inner, 2 * ids.len(), |pool| pool.step_decode(ids, out)).py_err(py)?;
            }
            _ => {
                let one = 1i64.into_pyobject(py)?;
                counts_into(counted.unwrap_or(one.as_any()), ids.len(), "num_tokens", n)?;
                // `counts_into` caps the total at MAX_CALL_TOKENS, so this sum cannot overflow.
                let work = ids.len() + n.iter().sum::<usize>();
                with_pool(py, &self.inner, work, |pool| pool.step(ids, n, out)).py_err(py)?;
            }
        }
        // Copies into numpy-owned buffers: cheaper than handing the Vecs over, which makes
        // numpy keep a Python owner object per array.
        let r = (PyArray1::from_slice(py, &out.slots), cow_array(py, &out.cow)?, PyArray1::from_slice(py, &out.seq_lens));
        if out.slots.capacity() <= SCRATCH_KEEP && n.capacity() <= SCRATCH_KEEP && ids.len() <= SCRATCH_KEEP {
            STEP_SCRATCH.set(scratch);
        }
        Ok(r)
    }

    fn fork(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::parent)] parent: SeqId,
        #[pyo3(from_py_with = arg::child)] child: SeqId,
    ) -> PyResult<()> {
        py.detach(|| self.pool().fork(parent, child)).py_err(py)
    }

    fn truncate(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::num_tokens)] num_tokens: usize,
    ) -> PyResult<()> {
        py.detach(|| self.pool().truncate(seq_id, num_tokens)).py_err(py)
    }

    fn free(&self, py: Python<'_>, #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId) -> PyResult<()> {
        // The work is the sequence's table; an unknown id is reported by `free` itself.
        // One lock for the usual short table; a long one is freed without the GIL.
        {
            let mut pool = self.pool();
            if pool.table(seq_id).map_or(0, |t| t.blocks().len()) < INLINE_WORK {
                return pool.free(seq_id).py_err(py);
            }
        }
        py.detach(|| self.pool().free(seq_id)).py_err(py)
    }

    /// Free several sequences atomically: all ids are checked (known, no duplicates)
    /// before any is freed.
    fn free_batch(&self, py: Python<'_>, seq_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = super::convert::seq_ids(seq_ids, "seq_ids")?;
        let mut sorted: Vec<u64> = ids.iter().map(|s| s.0).collect();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(py, format!("sequence id {} appears twice", w[0])));
        }
        py.detach(|| {
            let mut pool = self.pool();
            pool.check_known(&ids)?;
            ids.iter().try_for_each(|&s| pool.free(s))
        })
        .py_err(py)
    }

    #[pyo3(signature = (seq_id, num_tokens = 1))]
    fn blocks_needed(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::num_tokens)] num_tokens: usize,
    ) -> PyResult<usize> {
        self.pool().blocks_needed(seq_id, num_tokens).py_err(py)
    }

    fn seq_len(&self, py: Python<'_>, #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId) -> PyResult<usize> {
        self.pool().seq_len(seq_id).py_err(py)
    }

    fn seq_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let ids: Vec<i64> = self.pool().seq_ids().into_iter().map(|s| s.0 as i64).collect();
        PyArray1::from_vec(py, ids)
    }

    fn block_table<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
    ) -> PyResult<I32Array<'py>> {
        let v: Vec<i32> = self.pool().table(seq_id).py_err(py)?.blocks().iter().map(|b| b.as_i32()).collect();
        Ok(PyArray1::from_vec(py, v))
    }

    fn refcount(&self, py: Python<'_>, #[pyo3(from_py_with = arg::block_id)] block_id: i64) -> PyResult<u32> {
        let b = u32::try_from(block_id).map_err(|_| invalid(py, format!("block_id {block_id} is out of range")))?;
        self.pool().refcount(BlockId(b)).py_err(py)
    }

    #[pyo3(signature = (seq_ids, max_blocks = None, pad = -1))]
    fn block_tables<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = arg::opt_max_blocks)] max_blocks: Option<usize>,
        #[pyo3(from_py_with = arg::pad)] pad: i32,
    ) -> PyResult<Bound<'py, PyArray2<i32>>> {
        let ids = super::convert::seq_ids(seq_ids, "seq_ids")?;
        let (flat, width) = py
            .detach(|| {
                let pool = self.pool();
                // Unknown ids are reported before anything is allocated.
                let width = max_blocks.unwrap_or(pool.max_table_len(&ids)?);
                let size = ids.len().checked_mul(width).filter(|&s| s <= MAX_TABLE_ENTRIES).ok_or_else(|| {
                    crate::invalid!(
                        "a {} x {width} table exceeds the limit of {MAX_TABLE_ENTRIES} entries",
                        ids.len()
                    )
                })?;
                let mut flat = vec![0i32; size];
                pool.padded_tables_into(&ids, width, pad, &mut flat)?;
                Ok((flat, width))
            })
            .py_err(py)?;
        PyArray1::from_vec(py, flat).reshape([ids.len(), width])
    }

    fn flashinfer_tables<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
    ) -> PyResult<(I32Array<'py>, I32Array<'py>, I32Array<'py>)> {
        let ids = super::convert::seq_ids(seq_ids, "seq_ids")?;
        let (indptr, indices, last) = py.detach(|| self.pool().flashinfer_tables(&ids)).py_err(py)?;
        Ok((PyArray1::from_vec(py, indptr), PyArray1::from_vec(py, indices), PyArray1::from_vec(py, last)))
    }

    fn stats(&self, py: Python<'_>) -> PyPoolStats {
        PyPoolStats(py.detach(|| self.pool().stats()))
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.pool().check_invariants()).py_err(py)
    }
}

#[pyclass(name = "PoolStats", module = "pykvpool", frozen)]
pub struct PyPoolStats(pub PoolStats);

#[pymethods]
impl PyPoolStats {
    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size
    }
    #[getter]
    fn total_blocks(&self) -> usize {
        self.0.total_blocks
    }
    #[getter]
    fn free_blocks(&self) -> usize {
        self.0.free_blocks
    }
    #[getter]
    fn used_blocks(&self) -> usize {
        self.0.used_blocks
    }
    #[getter]
    fn num_seqs(&self) -> usize {
        self.0.num_seqs
    }
    #[getter]
    fn logical_tokens(&self) -> u64 {
        self.0.logical_tokens
    }
    #[getter]
    fn stored_tokens(&self) -> u64 {
        self.0.stored_tokens
    }
    #[getter]
    fn shared_blocks(&self) -> usize {
        self.0.shared_blocks
    }
    #[getter]
    fn cow_copies(&self) -> u64 {
        self.0.cow_copies
    }
    #[getter]
    fn empty_slots(&self) -> u64 {
        self.0.empty_slots
    }
    #[getter]
    fn utilization(&self) -> f64 {
        self.0.utilization
    }

    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        let s = &self.0;
        d.set_item("block_size", s.block_size)?;
        d.set_item("total_blocks", s.total_blocks)?;
        d.set_item("free_blocks", s.free_blocks)?;
        d.set_item("used_blocks", s.used_blocks)?;
        d.set_item("num_seqs", s.num_seqs)?;
        d.set_item("logical_tokens", s.logical_tokens)?;
        d.set_item("stored_tokens", s.stored_tokens)?;
        d.set_item("shared_blocks", s.shared_blocks)?;
        d.set_item("cow_copies", s.cow_copies)?;
        d.set_item("empty_slots", s.empty_slots)?;
        d.set_item("utilization", s.utilization)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let s = &self.0;
        format!(
            "PoolStats(used_blocks={}/{}, seqs={}, stored_tokens={}, shared_blocks={}, cow_copies={}, utilization={:.4})",
            s.used_blocks, s.total_blocks, s.num_seqs, s.stored_tokens, s.shared_blocks, s.cow_copies, s.utilization
        )
    }
}

#[pyclass(name = "BlockTableBuffer", module = "pykvpool", frozen)]
pub struct PyBlockTableBuffer {
    array: Py<PyArray2<i32>>,
    sync: Mutex<TableSync>,
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
                format!("a {rows} x {width} table buffer must be non-empty and hold at most {MAX_TABLE_ENTRIES} entries"),
            ));
        }
        let array = PyArray2::<i32>::zeros(py, [rows, width], false);
        array.readwrite().as_slice_mut().map_err(|e| invalid(py, e.to_string()))?.fill(pad);
        Ok(Self { array: array.unbind(), sync: Mutex::new(TableSync::new(rows, width, pad)) })
    }

    #[getter]
    fn array<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray2<i32>> {
        self.array.bind(py).clone()
    }

    #[getter]
    fn pad(&self) -> i32 {
        lock(&self.sync).pad()
    }

    fn sync(&self, py: Python<'_>, pool: &Bound<'_, PyAny>, seq_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let pool = pool.cast::<PyBlockPool>().map_err(|_| {
            let ty = pool.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            invalid(py, format!("pool must be a BlockPool, got {ty}"))
        })?;
        let ids = super::convert::seq_ids(seq_ids, "seq_ids")?;
        let arr = self.array.bind(py);
        let mut rw = arr
            .try_readwrite()
            .map_err(|e| invalid(py, format!("table buffer array is not writable or is borrowed: {e}")))?;
        let out = rw.as_slice_mut().map_err(|e| invalid(py, e.to_string()))?;
        let pool = pool.get().pool();
        lock(&self.sync).sync(&pool, &ids, out).py_err(py)
    }

    fn invalidate(&self) {
        lock(&self.sync).invalidate()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBlockPool>()?;
    m.add_class::<PyPoolStats>()?;
    m.add_class::<PyBlockTableBuffer>()?;
    Ok(())
}
