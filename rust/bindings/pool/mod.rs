//! `BlockPool`, `PoolStats` and `BlockTableBuffer` for Python.

use std::sync::{Mutex, MutexGuard};

use numpy::ndarray::Array2;
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
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

/// A paged KV-cache block pool: ``num_blocks`` blocks of ``block_size`` token slots.
///
/// Each live sequence (a caller-chosen non-negative int64 id) owns a block table mapping
/// logical block ``i`` to a physical block id. Token ``t`` of a sequence lives at slot
/// ``table[t // block_size] * block_size + t % block_size``.
///
/// Thread-safe: calls from several Python threads are serialized by an internal lock,
/// and the GIL is released while the core works, except for ``add_sequence``,
/// ``add_sequence_tokens``, ``step`` and ``free`` calls whose work (sequences plus new
/// tokens, or blocks freed) is below 4,096: those finish within about 10 microseconds,
/// where releasing and retaking the GIL would add a sizeable share.
///
/// With ``prefix_caching=True`` the pool caches full blocks by content (the prefix-caching
/// methods below; trace replay lives in :mod:`pykvpool.prefix.replay`); the other keyword
/// options configure that cache and need it.
///
/// Args:
///     num_blocks: blocks in the pool, ``1..=2**30``.
///     block_size: token slots per block, ``1..=65536`` tokens.
///     prefix_caching: cache full blocks by content (default False).
///     eviction: which idle cached block an allocation reclaims once no never-cached block
///         is free (only leaves of the cache tree: a sequence's tail before its head):
///         ``"lru"`` (default) the least recently used, where a block is used when it is
///         stored, when an admission's lookup hits it and when its last holder releases it;
///         ``"fifo"`` the earliest stored; ``"lfu"`` the fewest lookup hits, then the least
///         recently used; ``"priority"`` the lowest soft-pin priority (0 without, see
///         :meth:`pin_prefix`), then the least recently used.
///     verify_tokens: keep each cached block's token ids (``4 * block_size`` bytes per
///         block) and compare them on a hit, so a hash collision is a miss, never wrong KV
///         (default True).
///     cow_partial_hit: when a fully cached prompt must recompute its last token, copy its
///         last block (a copy-on-write pair) instead of recomputing it (default False).
///     record_events: record stored/removed/cleared events for :meth:`drain_events`
///         (default False).
///     hash_bits: keep only the low ``hash_bits`` bits of each key, ``1..=128`` (default
///         128; tests force collisions with it).
///     max_events: capacity of the event queue, in events (about 80 bytes each),
///         ``1..=2**24`` (default 100,000; needs ``record_events=True``). When it is full a
///         new event drops the oldest undrained one and counts it in
///         :attr:`CacheStats.dropped_events`, so memory stays bounded however long nobody
///         drains.
///
/// Raises:
///     InvalidArgumentError: ``num_blocks`` not in ``1..=2**30`` or ``block_size`` not in
///         ``1..=65536``; an unknown eviction policy; ``hash_bits`` not in ``1..=128``;
///         ``max_events`` not in ``1..=2**24`` or given without ``record_events=True``;
///         cache options given without ``prefix_caching=True``.
#[pyclass(name = "BlockPool", module = "pykvpool", frozen)]
pub struct PyBlockPool {
    inner: Mutex<BlockPool>,
    /// Fixed at construction: read by getters without the lock.
    num_blocks: usize,
    block_size: usize,
}

impl PyBlockPool {
    /// `f` on the locked pool, under the GIL. The guard lives inside this call only, so
    /// whatever the caller does with the result (build an exception, allocate arrays)
    /// runs without the lock: a thread blocked on the pool while holding the GIL can
    /// never wait on one that needs the GIL back. `f` itself must not touch Python.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut BlockPool) -> R) -> R {
        f(&mut lock(&self.inner))
    }

    /// [`Self::with`] with the GIL released (the lock is taken and dropped inside).
    pub(crate) fn detached<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut BlockPool) -> R + Send) -> R {
        py.detach(|| f(&mut lock(&self.inner)))
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
        #[pyo3(from_py_with = super::prefix::hash_bits)] hash_bits: Option<u32>,
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
        Ok(Self { num_blocks: pool.num_blocks(), block_size: pool.block_size(), inner: Mutex::new(pool) })
    }

    /// Blocks in the pool.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Token slots per block (tokens).
    #[getter]
    fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks an allocation can take now: free blocks plus idle cached blocks that may be
    /// evicted (not hard-pinned).
    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.with(|p| p.num_free_blocks())
    }

    /// Blocks held by at least one sequence (idle cached blocks are not used).
    #[getter]
    fn num_used_blocks(&self) -> usize {
        self.with(|p| p.num_used_blocks())
    }

    /// Live sequences.
    #[getter]
    fn num_seqs(&self) -> usize {
        self.with(|p| p.num_seqs())
    }

    fn __len__(&self) -> usize {
        self.with(|p| p.num_seqs())
    }

    fn __contains__(&self, seq: &Bound<'_, PyAny>) -> bool {
        match int_scalar(seq, "seq_id") {
            Ok(v) if v >= 0 => self.with(|p| p.contains(SeqId(v as u64))),
            _ => false,
        }
    }

    fn __repr__(&self) -> String {
        let (free, seqs) = self.with(|p| (p.num_free_blocks(), p.num_seqs()));
        format!("BlockPool(num_blocks={}, block_size={}, free={free}, seqs={seqs})", self.num_blocks, self.block_size)
    }

    /// Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``, the free
    /// blocks a new sequence with a prompt of ``num_tokens`` tokens needs (without prefix-cache
    /// hits). Changes nothing.
    ///
    /// Args:
    ///     num_tokens: tokens, >= 0.
    ///
    /// Returns:
    ///     A number of blocks.
    ///
    /// Raises:
    ///     InvalidArgumentError: a negative, non-integer or bool count.
    fn blocks_for_tokens(&self, #[pyo3(from_py_with = arg::num_tokens)] num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// Add sequence ``seq_id`` holding ``prompt_len`` tokens, in ``ceil(prompt_len /
    /// block_size)`` new blocks.
    ///
    /// Args:
    ///     seq_id: the new sequence's id, a non-negative int64.
    ///     prompt_len: tokens it holds now (default 0: an empty sequence), at most ``2**27`` in
    ///         one call (add longer prompts in chunks with :meth:`append`).
    ///
    /// Returns:
    ///     int64 ``[prompt_len]``: the slot of each prompt token, in order.
    ///
    /// Raises:
    ///     DuplicateSequenceError: ``seq_id`` is live.
    ///     PoolExhaustedError: fewer than ``ceil(prompt_len / block_size)`` free blocks.
    ///     InvalidArgumentError: a negative id or length, or more than ``2**27`` tokens.
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

    /// Append ``num_tokens`` tokens to ``seq_id``, allocating blocks as needed.
    ///
    /// If the last block is partly filled and shared (after :meth:`fork`), the sequence first
    /// gets a private copy of it (copy-on-write).
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     num_tokens: tokens to add (default 1), at most ``2**27`` in one call.
    ///
    /// Returns:
    ///     ``(slots, cow)``: int64 ``[num_tokens]`` slots of the new tokens, and an int64
    ///     ``[k, 2]`` array of ``(src, dst)`` block pairs whose filled slots the caller must
    ///     copy before writing (k <= 1).
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     PoolExhaustedError: not enough free blocks (nothing was appended).
    ///     InvalidArgumentError: a negative count, or more than ``2**27`` tokens.
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
                self.with(|p| p.append(seq_id, num_tokens, &mut slots, &mut cow)).map(|_| (slots, cow))
            })
            .py_err(py)?;
        Ok((PyArray1::from_vec(py, slots), cow_array(py, &cow)?))
    }

    /// One scheduler step: append ``num_tokens[i]`` tokens to ``seq_ids[i]`` for every i,
    /// atomically.
    ///
    /// Args:
    ///     seq_ids: ``n`` distinct live sequence ids.
    ///     num_tokens: tokens to append to each sequence: ``n`` counts, one int for all, or
    ///         None for 1 token each (a decode step); at most ``2**27`` tokens in total.
    ///
    /// Returns:
    ///     ``(slot_mapping, cow_pairs, seq_lens)``: int64 slots of all new tokens in batch
    ///     order (``sum(num_tokens)`` of them); int64 ``[k, 2]`` copy-on-write ``(src, dst)``
    ///     block pairs to copy before writing; int32 ``[n]`` length of each sequence after the
    ///     step, in tokens.
    ///
    /// Raises:
    ///     PoolExhaustedError: the whole step needs more blocks than are free (nothing was
    ///         appended to any sequence).
    ///     UnknownSequenceError: an id is not live.
    ///     InvalidArgumentError: duplicate ids, negative counts, ``num_tokens`` of another
    ///         length than ``seq_ids``, non-integer or non-1-D arrays, more than ``2**27``
    ///         tokens in total.
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

    /// Create ``child`` sharing every block of ``parent`` (refcounts go up; nothing is copied).
    ///
    /// The first append to either sequence that writes into their shared, partly filled last
    /// block copies that block first (copy-on-write).
    ///
    /// Args:
    ///     parent: a live sequence.
    ///     child: the new sequence's id, a non-negative int64.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``parent`` is not live.
    ///     DuplicateSequenceError: ``child`` is live.
    ///     InvalidArgumentError: a negative id.
    fn fork(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::parent)] parent: SeqId,
        #[pyo3(from_py_with = arg::child)] child: SeqId,
    ) -> PyResult<()> {
        self.detached(py, |p| p.fork(parent, child)).py_err(py)
    }

    /// Drop the last ``num_tokens`` tokens of ``seq_id``; blocks left empty lose this
    /// sequence's reference (freed at zero).
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     num_tokens: tokens to drop, at most the sequence's length.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: ``num_tokens`` is negative or exceeds the length.
    fn truncate(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::num_tokens)] num_tokens: usize,
    ) -> PyResult<()> {
        self.detached(py, |p| p.truncate(seq_id, num_tokens)).py_err(py)
    }

    /// Remove ``seq_id``; each of its blocks loses a reference and is freed at zero (with
    /// prefix caching, a cached block stays cached, idle, until an allocation evicts it).
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id.
    fn free(&self, py: Python<'_>, #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId) -> PyResult<()> {
        // The work is the sequence's table; an unknown id is reported by `free` itself.
        // One lock for the usual short table (`None`: not freed, too long to hold the
        // GIL for); a long one is freed without the GIL.
        let done = self.with(|pool| {
            let short = pool.table(seq_id).map_or(0, |t| t.blocks().len()) < INLINE_WORK;
            short.then(|| pool.free(seq_id))
        });
        match done {
            Some(r) => r.py_err(py),
            None => self.detached(py, |p| p.free(seq_id)).py_err(py),
        }
    }

    /// Free several sequences atomically: all ids are checked before any is freed.
    ///
    /// Args:
    ///     seq_ids: distinct live sequence ids.
    ///
    /// Raises:
    ///     UnknownSequenceError: an id is not live (nothing was freed).
    ///     InvalidArgumentError: an id appears twice, or a negative or non-integer id.
    fn free_batch(&self, py: Python<'_>, seq_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = super::convert::seq_ids(seq_ids, "seq_ids")?;
        let mut sorted: Vec<u64> = ids.iter().map(|s| s.0).collect();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(py, format!("sequence id {} appears twice", w[0])));
        }
        self.detached(py, |pool| {
            pool.check_known(&ids)?;
            ids.iter().try_for_each(|&s| pool.free(s))
        })
        .py_err(py)
    }

    /// Blocks that appending ``num_tokens`` tokens to ``seq_id`` would allocate now, the
    /// copy-on-write copy of a shared last block included. Changes nothing.
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     num_tokens: tokens that would be appended (default 1).
    ///
    /// Returns:
    ///     A number of blocks.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id or count.
    #[pyo3(signature = (seq_id, num_tokens = 1))]
    fn blocks_needed(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::num_tokens)] num_tokens: usize,
    ) -> PyResult<usize> {
        self.with(|p| p.blocks_needed(seq_id, num_tokens)).py_err(py)
    }

    /// Length of ``seq_id``, in tokens.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id.
    fn seq_len(&self, py: Python<'_>, #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId) -> PyResult<usize> {
        self.with(|p| p.seq_len(seq_id)).py_err(py)
    }

    /// Live sequence ids.
    ///
    /// Returns:
    ///     int64 ``[num_seqs]``, ascending.
    fn seq_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let ids: Vec<i64> = self.with(|p| p.seq_ids()).into_iter().map(|s| s.0 as i64).collect();
        PyArray1::from_vec(py, ids)
    }

    /// The block table of ``seq_id`` (a copy).
    ///
    /// Returns:
    ///     int32 ``[blocks]``: the physical block id of each logical block, in order.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id.
    fn block_table<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
    ) -> PyResult<I32Array<'py>> {
        let v = self.with(|p| p.table(seq_id).map(|t| t.blocks().iter().map(|b| b.as_i32()).collect::<Vec<i32>>()));
        let v = v.py_err(py)?;
        Ok(PyArray1::from_vec(py, v))
    }

    /// References to physical block ``block_id``: the sequences holding it (0 for a free or an
    /// idle cached block).
    ///
    /// Raises:
    ///     InvalidArgumentError: ``block_id`` outside ``0..num_blocks``.
    fn refcount(&self, py: Python<'_>, #[pyo3(from_py_with = arg::block_id)] block_id: i64) -> PyResult<u32> {
        let b = u32::try_from(block_id).map_err(|_| invalid(py, format!("block_id {block_id} is out of range")))?;
        self.with(|p| p.refcount(BlockId(b))).py_err(py)
    }

    /// Block tables of ``seq_ids`` as one padded matrix.
    ///
    /// Args:
    ///     seq_ids: live sequence ids, one row each.
    ///     max_blocks: columns (blocks); default the longest table.
    ///     pad: the value past each table's end, an int32 (default -1).
    ///
    /// Returns:
    ///     int32 ``[len(seq_ids), max_blocks]``: row ``i`` is the table of ``seq_ids[i]``.
    ///
    /// Raises:
    ///     UnknownSequenceError: an id is not live.
    ///     InvalidArgumentError: a table longer than ``max_blocks``, more than ``2**28``
    ///         entries, or ``pad`` outside int32.
    #[pyo3(signature = (seq_ids, max_blocks = None, pad = -1))]
    fn block_tables<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = arg::opt_max_blocks)] max_blocks: Option<usize>,
        #[pyo3(from_py_with = arg::pad)] pad: i32,
    ) -> PyResult<Bound<'py, PyArray2<i32>>> {
        let ids = super::convert::seq_ids(seq_ids, "seq_ids")?;
        let (flat, width) = self
            .detached(py, |pool| {
                // Unknown ids are reported before anything is allocated.
                let width = max_blocks.unwrap_or(pool.max_table_len(&ids)?);
                let size = ids.len().checked_mul(width).filter(|&s| s <= MAX_TABLE_ENTRIES).ok_or_else(|| {
                    crate::invalid!(
                        "seq_ids x max_blocks: a {} x {width} table exceeds the limit of {MAX_TABLE_ENTRIES} entries",
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

    /// The block tables of ``seq_ids`` in FlashInfer's paged layout (what
    /// :func:`decode_attention_paged` takes).
    ///
    /// Returns:
    ///     ``(kv_indptr, kv_indices, kv_last_page_len)``, all int32: ``kv_indptr`` ``[n + 1]``
    ///     offsets into ``kv_indices`` ``[nnz]``, the block ids of all tables concatenated; and
    ///     ``kv_last_page_len`` ``[n]``, the tokens in each sequence's last block, in
    ///     ``1..=block_size`` (0 for an empty sequence).
    ///
    /// Raises:
    ///     UnknownSequenceError: an id is not live.
    ///     InvalidArgumentError: a negative or non-integer id.
    fn flashinfer_tables<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
    ) -> PyResult<(I32Array<'py>, I32Array<'py>, I32Array<'py>)> {
        let ids = super::convert::seq_ids(seq_ids, "seq_ids")?;
        let (indptr, indices, last) = self.detached(py, |p| p.flashinfer_tables(&ids)).py_err(py)?;
        Ok((PyArray1::from_vec(py, indptr), PyArray1::from_vec(py, indices), PyArray1::from_vec(py, last)))
    }

    /// Occupancy snapshot in blocks and tokens; O(table entries).
    ///
    /// Returns:
    ///     A :class:`PoolStats`.
    fn stats(&self, py: Python<'_>) -> PyPoolStats {
        PyPoolStats(self.detached(py, |p| p.stats()))
    }

    /// Verify the bookkeeping, changing nothing: refcounts against tables, the free list, block
    /// accounting and table lengths; with prefix caching also the cache: each key maps to one
    /// block and back, idle cached blocks have refcount 0 and are queued for eviction exactly
    /// when they are unpinned leaves, no free-list block is cached, parents outlive children.
    ///
    /// Raises:
    ///     InvariantError: the first broken invariant, named (a pykvpool bug).
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, |p| p.check_invariants()).py_err(py)
    }
}

/// Occupancy snapshot of a :class:`BlockPool`, taken by :meth:`BlockPool.stats`.
///
/// Counts are in blocks and tokens; the snapshot does not follow later changes of the pool.
#[pyclass(name = "PoolStats", module = "pykvpool", frozen)]
pub struct PyPoolStats(pub PoolStats);

#[pymethods]
impl PyPoolStats {
    /// Token slots per block (tokens).
    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size
    }
    /// Blocks in the pool.
    #[getter]
    fn total_blocks(&self) -> usize {
        self.0.total_blocks
    }
    /// Blocks an allocation can take now.
    #[getter]
    fn free_blocks(&self) -> usize {
        self.0.free_blocks
    }
    /// Blocks referenced by at least one sequence.
    #[getter]
    fn used_blocks(&self) -> usize {
        self.0.used_blocks
    }
    /// Live sequences.
    #[getter]
    fn num_seqs(&self) -> usize {
        self.0.num_seqs
    }
    /// Sum of sequence lengths, in tokens (a forked token counts once per sequence).
    #[getter]
    fn logical_tokens(&self) -> u64 {
        self.0.logical_tokens
    }
    /// Distinct filled token slots in used blocks, in tokens (a shared token counts once).
    #[getter]
    fn stored_tokens(&self) -> u64 {
        self.0.stored_tokens
    }
    /// Used blocks referenced by more than one sequence.
    #[getter]
    fn shared_blocks(&self) -> usize {
        self.0.shared_blocks
    }
    /// Copy-on-write block copies since the pool was created (blocks).
    #[getter]
    fn cow_copies(&self) -> u64 {
        self.0.cow_copies
    }
    /// Unfilled token slots in used blocks, in tokens: ``used_blocks * block_size -
    /// stored_tokens``.
    #[getter]
    fn empty_slots(&self) -> u64 {
        self.0.empty_slots
    }
    /// ``stored_tokens / (used_blocks * block_size)``, a fraction in 0..1; 1.0 when no block is
    /// used.
    #[getter]
    fn utilization(&self) -> f64 {
        self.0.utilization
    }

    /// All fields as a dict.
    ///
    /// Returns:
    ///     ``{name: value}`` for every property of this class: ints, and ``utilization`` a float.
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
        let array = PyArray2::<i32>::zeros(py, [rows, width], false);
        array.readwrite().as_slice_mut().map_err(|e| invalid(py, e.to_string()))?.fill(pad);
        let data = array.data() as usize;
        Ok(Self { array: array.unbind(), data, rows, width, pad, sync: Mutex::new(TableSync::new(rows, width, pad)) })
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

    /// Make row ``i`` hold the block table of ``seq_ids[i]``; rows past ``len(seq_ids)`` are
    /// left as they were.
    ///
    /// Args:
    ///     pool: the :class:`BlockPool` the sequences live in.
    ///     seq_ids: at most ``max_seqs`` live sequence ids.
    ///
    /// Returns:
    ///     The number of entries written.
    ///
    /// Raises:
    ///     UnknownSequenceError: an id is not live.
    ///     InvalidArgumentError: ``pool`` is not a BlockPool, too many ids, a table longer
    ///         than ``max_blocks``, or the array is not writable. Nothing is written on error.
    fn sync(&self, py: Python<'_>, pool: &Bound<'_, PyAny>, seq_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let pool = pool.cast::<PyBlockPool>().map_err(|_| {
            let ty = pool.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            invalid(py, format!("pool must be a BlockPool, got {ty}"))
        })?;
        let ids = super::convert::seq_ids(seq_ids, "seq_ids")?;
        let arr = self.checked_array(py)?;
        let mut rw = arr
            .try_readwrite()
            .map_err(|e| invalid(py, format!("table buffer array is not writable or is borrowed: {e}")))?;
        let out = rw.as_slice_mut().map_err(|e| invalid(py, e.to_string()))?;
        // Lock order: the pool, then the buffer's state (the only place taking both).
        let done = pool.get().with(|p| lock(&self.sync).sync(p, &ids, out));
        done.py_err(py)
    }

    /// Forget the matrix contents: the next sync rewrites every row it touches.
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
