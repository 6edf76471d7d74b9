//! The methods of the Python `HybridPool` class, in one `#[pymethods]` block: the sequence
//! methods, the per-group exports, then the prefix-caching ones. Each checks its
//! arguments with the same helpers as `BlockPool` (`convert`, `convert::arg`), runs the core
//! call through [`PyHybridPool::run`] / [`PyHybridPool::with`] (never holding the pool lock
//! across Python) and builds the result.

use std::sync::Mutex;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyTuple};

use super::class::{slots_array, PyHybridPool};
use super::specs::{group_arg, groups_arg, kind_object};
use super::stats::PyHybridPoolStats;
use crate::bindings::convert::{self, arg, count, counts_into, int_scalar};
use crate::bindings::errors::{invalid, IntoPyResult};
use crate::bindings::pool::cache_args::{self, clock, expires_at, extra_key, hash_bits, pin_id, priority, CacheOptions};
use crate::bindings::pool::stats::PyCacheStats;
use crate::bindings::pool::class::{cow_array, MAX_TABLE_ENTRIES};
use crate::pool::{BlockPool, StepOutput};
use crate::prefix_cache::{CacheConfig, CacheEvent};
use crate::types::{BlockId, SeqId};

type I64Array<'py> = Bound<'py, PyArray1<i64>>;
type I32Array<'py> = Bound<'py, PyArray1<i32>>;
type Slots<'py> = Bound<'py, PyArray2<i64>>;

#[pymethods]
impl PyHybridPool {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, groups, *, prefix_caching = false, eviction = None,
        verify_tokens = None, record_events = None, hash_bits = None, max_events = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        groups: &Bound<'_, PyAny>,
        prefix_caching: bool,
        eviction: Option<&str>,
        verify_tokens: Option<bool>,
        record_events: Option<bool>,
        #[pyo3(from_py_with = hash_bits)] hash_bits: Option<u32>,
        max_events: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let nb = count(py, int_scalar(num_blocks, "num_blocks")?, "num_blocks")?;
        let bs = count(py, int_scalar(block_size, "block_size")?, "block_size")?;
        let specs = groups_arg(groups)?;
        let opts = CacheOptions { eviction, verify_tokens, cow_partial_hit: None, record_events, hash_bits, max_events };
        // As this class always did: a keyed prompt's partial last block is not cached.
        let cfg = opts.config(py, prefix_caching)?.map(|c| CacheConfig { cache_partial_keys: false, touch_untaken_hits: false, ..c });
        let g = specs.clone();
        let pool = py
            .detach(move || BlockPool::with_options(nb, bs, g, cfg))
            .py_err(py)?;
        Ok(Self {
            num_blocks: pool.num_blocks(),
            block_size: pool.block_size(),
            groups: specs,
            prefix_caching,
            inner: Mutex::new(pool),
        })
    }

    /// Blocks in the pool, shared by all groups.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Token slots per block (tokens).
    #[getter]
    fn block_size(&self) -> usize {
        self.block_size
    }

    /// The attention kind of each group, in group order.
    #[getter]
    fn groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let objs = self.groups.iter().map(|&s| kind_object(py, s)).collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, objs)
    }

    /// Layer groups (attention kinds) of the pool.
    #[getter]
    fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// Whether this pool caches prefixes (``prefix_caching=True``).
    #[getter]
    fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks an allocation can take now: free blocks plus idle cached blocks.
    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.with(|p| p.num_free_blocks())
    }

    /// Blocks held by at least one sequence, in any group (idle cached blocks are not used).
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
        let groups: Vec<String> = self.groups.iter().map(|g| g.to_string()).collect();
        format!(
            "HybridPool(num_blocks={}, block_size={}, groups=[{}], free={free}, seqs={seqs})",
            self.num_blocks,
            self.block_size,
            groups.join(", ")
        )
    }

    /// Add sequence ``seq_id`` holding ``prompt_len`` tokens, in every group.
    ///
    /// Args:
    ///     seq_id: the new sequence's id, a non-negative int64.
    ///     prompt_len: tokens it holds now (default 0: an empty sequence), at most ``2**27`` in
    ///         one call (add longer prompts in chunks with :meth:`append`).
    ///
    /// Returns:
    ///     int64 ``[num_groups, prompt_len]``: row ``g`` holds the slot of each prompt token
    ///     in group ``g``, in order.
    ///
    /// Raises:
    ///     DuplicateSequenceError: ``seq_id`` is live.
    ///     PoolExhaustedError: fewer free blocks than the prompt needs in all groups together
    ///         (nothing changed).
    ///     InvalidArgumentError: a negative id or length, or more than ``2**27`` tokens.
    #[pyo3(signature = (seq_id, prompt_len = 0))]
    fn add_sequence<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::prompt_len)] prompt_len: usize,
    ) -> PyResult<Slots<'py>> {
        let mut out = StepOutput::default();
        self.run(py, self.work(1, prompt_len), |p| p.add_sequence(seq_id, prompt_len, &mut out)).py_err(py)?;
        slots_array(py, self.groups.len(), &mut out)
    }

    /// Append ``num_tokens`` tokens to ``seq_id`` in every group: windowed groups first
    /// release the blocks no query from now on sees, then each group allocates as needed.
    ///
    /// A partly filled last block that is shared (after :meth:`fork`) or cached is copied
    /// first (copy-on-write), in each group where that holds.
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     num_tokens: tokens to add (default 1), at most ``2**27`` in one call.
    ///
    /// Returns:
    ///     ``(slots, cow)``: int64 ``[num_groups, num_tokens]`` slots of the new tokens (row
    ///     ``g`` for group ``g``), and an int64 ``[k, 2]`` array of ``(src, dst)`` block pairs
    ///     whose filled slots the caller must copy before writing (at most one per group; a
    ///     block belongs to one group, so :meth:`KvCache.copy_blocks` copies exactly it).
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     PoolExhaustedError: not enough free blocks, counting the blocks this growth
    ///         releases (nothing changed, nothing released).
    ///     InvalidArgumentError: a negative id or count, or more than ``2**27`` tokens.
    #[pyo3(signature = (seq_id, num_tokens = 1))]
    fn append<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::new_tokens)] num_tokens: usize,
    ) -> PyResult<(Slots<'py>, Bound<'py, PyArray2<i64>>)> {
        let mut out = StepOutput::default();
        self.run(py, self.work(1, num_tokens), |p| p.step(&[seq_id], &[num_tokens], &mut out)).py_err(py)?;
        Ok((slots_array(py, self.groups.len(), &mut out)?, cow_array(py, &out.cow)?))
    }

    /// One scheduler step: append ``num_tokens[i]`` tokens to ``seq_ids[i]`` for every i, in
    /// every group, atomically.
    ///
    /// Args:
    ///     seq_ids: ``n`` distinct live sequence ids.
    ///     num_tokens: tokens to append to each sequence: ``n`` counts, one int for all, or
    ///         None for 1 token each (a decode step); at most ``2**27`` tokens in total.
    ///
    /// Returns:
    ///     ``(slot_mapping, cow_pairs, seq_lens)``: int64 ``[num_groups, sum(num_tokens)]``
    ///     slots of all new tokens in batch order, row ``g`` for group ``g``; int64 ``[k, 2]``
    ///     copy-on-write ``(src, dst)`` block pairs of all groups, to copy before writing;
    ///     int32 ``[n]`` length of each sequence after the step, in tokens.
    ///
    /// Raises:
    ///     PoolExhaustedError: the whole step needs more blocks than are free, counting the
    ///         blocks it releases (nothing changed in any sequence or group).
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
    ) -> PyResult<(Slots<'py>, Bound<'py, PyArray2<i64>>, I32Array<'py>)> {
        let mut ids = Vec::new();
        convert::seq_ids_into(seq_ids, "seq_ids", &mut ids)?;
        let mut out = StepOutput::default();
        let decode = match num_tokens {
            None => true,
            Some(o) => o.is_exact_instance_of::<PyInt>() && o.extract::<i64>().is_ok_and(|v| v == 1),
        };
        if decode && ids.len() <= convert::MAX_CALL_TOKENS {
            self.run(py, self.work(ids.len(), ids.len()), |p| p.step_decode(&ids, &mut out)).py_err(py)?;
        } else {
            let one = 1i64.into_pyobject(py)?;
            let mut n = Vec::new();
            counts_into(num_tokens.unwrap_or(one.as_any()), ids.len(), "num_tokens", &mut n)?;
            // `counts_into` caps the total at MAX_CALL_TOKENS, so this sum cannot overflow.
            let work = self.work(ids.len(), n.iter().sum::<usize>());
            self.run(py, work, |p| p.step(&ids, &n, &mut out)).py_err(py)?;
        }
        let lens = std::mem::take(&mut out.seq_lens);
        Ok((slots_array(py, self.groups.len(), &mut out)?, cow_array(py, &out.cow)?, PyArray1::from_vec(py, lens)))
    }

    /// Create ``child`` sharing every stored block of every group of ``parent`` (refcounts go
    /// up; nothing is copied; holes stay holes), with the same length and frontier.
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

    /// Drop the last ``num_tokens`` tokens of ``seq_id`` (a rollback within the window):
    /// table entries past the new end lose this sequence's reference; the frontier becomes at
    /// most the new length.
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     num_tokens: tokens to drop, at most the sequence's length.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: ``num_tokens`` is negative or exceeds the length, or some group
    ///         already released a block the query at the new length sees (nothing changed).
    fn truncate(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::num_tokens)] num_tokens: usize,
    ) -> PyResult<()> {
        self.detached(py, |p| p.truncate(seq_id, num_tokens)).py_err(py)
    }

    /// Remove ``seq_id``; each stored block of each group loses a reference and is freed at
    /// zero (with prefix caching, a cached block stays cached, idle, until evicted).
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id.
    fn free(&self, py: Python<'_>, #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId) -> PyResult<()> {
        self.detached(py, |p| p.free(seq_id)).py_err(py)
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
        let ids = convert::seq_ids(seq_ids, "seq_ids")?;
        let mut sorted: Vec<u64> = ids.iter().map(|s| s.0).collect();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(py, format!("seq_ids: sequence id {} appears twice", w[0])));
        }
        self.detached(py, |pool| {
            if let Some(s) = ids.iter().find(|&&s| !pool.contains(s)) {
                return Err(crate::error::KvError::UnknownSequence(s.0));
            }
            ids.iter().try_for_each(|&s| pool.free(s))
        })
        .py_err(py)
    }

    /// Record that every query up to the current length of each of ``seq_ids`` has been
    /// computed: each sequence's frontier becomes its length, and every windowed or chunked
    /// group releases now the blocks the release rule releases for a next query at that
    /// length (the blocks the next growth would release first; never the sinks). A video
    /// chunk committed as history gives back at once the frames that left the window.
    ///
    /// Atomic and idempotent: all ids are checked before anything changes, and a second
    /// call (or an id listed twice) releases nothing more. A later :meth:`truncate` may not
    /// roll back into what it released.
    ///
    /// Args:
    ///     seq_ids: live sequence ids (an empty list is a no-op).
    ///
    /// Raises:
    ///     UnknownSequenceError: an id is not live (nothing changed).
    ///     InvalidArgumentError: a negative or non-integer id, or not a 1-D list or array.
    fn mark_computed(&self, py: Python<'_>, seq_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = convert::seq_ids(seq_ids, "seq_ids")?;
        self.run(py, self.work(ids.len(), 0), |p| p.mark_computed(&ids)).py_err(py)
    }

    /// Blocks that appending ``num_tokens`` tokens to ``seq_id`` would allocate now in all
    /// groups together (new blocks and copy-on-write copies), before the blocks the growth
    /// releases are counted back. Changes nothing.
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

    /// Logical length of ``seq_id``, in tokens (released tokens included).
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id.
    fn seq_len(&self, py: Python<'_>, #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId) -> PyResult<usize> {
        self.with(|p| p.seq_len(seq_id)).py_err(py)
    }

    /// Position of the first query of the latest growth of ``seq_id`` (its length before that
    /// growth), in tokens: 0 for a new sequence, the cached length after a prefix-cache hit.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id.
    fn frontier(&self, py: Python<'_>, #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId) -> PyResult<usize> {
        self.with(|p| p.frontier(seq_id)).py_err(py)
    }

    /// Live sequence ids.
    ///
    /// Returns:
    ///     int64 ``[num_seqs]``, ascending.
    fn seq_ids<'py>(&self, py: Python<'py>) -> I64Array<'py> {
        let ids: Vec<i64> = self.with(|p| p.seq_ids()).into_iter().map(|s| s.0 as i64).collect();
        PyArray1::from_vec(py, ids)
    }

    /// The block table of ``seq_id`` in ``group`` (a copy).
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     group: a group index, ``0..num_groups``.
    ///
    /// Returns:
    ///     int32 ``[ceil(seq_len / block_size)]``: the physical block of each logical block,
    ///     -1 for a hole (a block the group released or never stored).
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id, ``group`` out of range.
    fn block_table<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = group_arg)] group: usize,
    ) -> PyResult<I32Array<'py>> {
        let g = self.group(py, group)?;
        let v = self.with(|p| p.table(seq_id, g).map(|t| t.entries().map(|b| b.map_or(-1, |b| b.as_i32())).collect()));
        Ok(PyArray1::from_vec(py, v.py_err(py)?))
    }

    /// Block tables of ``seq_ids`` in ``group`` as one padded matrix.
    ///
    /// Args:
    ///     seq_ids: live sequence ids, one row each.
    ///     group: a group index, ``0..num_groups``.
    ///     max_blocks: columns (blocks); default the longest table.
    ///     pad: the value of holes and past each table's end, an int32 (default -1).
    ///
    /// Returns:
    ///     int32 ``[len(seq_ids), max_blocks]``: logical block ``i`` of ``seq_ids[r]`` in row
    ///     ``r``, column ``i``.
    ///
    /// Raises:
    ///     UnknownSequenceError: an id is not live.
    ///     InvalidArgumentError: ``group`` out of range, a table longer than ``max_blocks``,
    ///         more than ``2**28`` entries, or ``pad`` outside int32.
    #[pyo3(signature = (seq_ids, group, max_blocks = None, pad = -1))]
    fn block_tables<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = group_arg)] group: usize,
        #[pyo3(from_py_with = arg::opt_max_blocks)] max_blocks: Option<usize>,
        #[pyo3(from_py_with = arg::pad)] pad: i32,
    ) -> PyResult<Bound<'py, PyArray2<i32>>> {
        let ids = convert::seq_ids(seq_ids, "seq_ids")?;
        let g = self.group(py, group)?;
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
                let mut flat = crate::error::filled(0i32, size, "the padded table")?;
                pool.padded_tables_into(&ids, g, width, pad, &mut flat)?;
                Ok((flat, width))
            })
            .py_err(py)?;
        PyArray1::from_vec(py, flat).reshape([ids.len(), width])
    }

    /// The tables of ``seq_ids`` in ``group`` in FlashInfer's paged layout: each sequence's
    /// stored pages in logical order, the sink pages first, then the contiguous window run.
    ///
    /// Page ``j`` of sequence ``i`` is logical block ``j`` when ``j < s_i``, else
    /// ``kv_page_start[i] + j - s_i``, with ``s_i = min(ceil(sink_tokens / block_size),
    /// kv_page_start[i])``. A full-attention group has no holes: its ``kv_page_start`` is 0
    /// and the rest equals :meth:`BlockPool.flashinfer_tables`.
    ///
    /// Args:
    ///     seq_ids: live sequence ids.
    ///     group: a group index, ``0..num_groups``.
    ///
    /// Returns:
    ///     ``(kv_indptr, kv_indices, kv_last_page_len, kv_page_start)``, all int32:
    ///     ``kv_indptr`` ``[n + 1]`` offsets into ``kv_indices`` ``[nnz]``, the stored block
    ///     ids; ``kv_last_page_len`` ``[n]``, the tokens of each sequence's last logical block,
    ///     in ``1..=block_size`` (0 for a sequence without pages); ``kv_page_start`` ``[n]``,
    ///     the logical block of the first page after the sink pages (blocks).
    ///
    /// Raises:
    ///     UnknownSequenceError: an id is not live.
    ///     InvalidArgumentError: a negative or non-integer id, ``group`` out of range.
    #[allow(clippy::type_complexity)]
    fn flashinfer_tables<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = group_arg)] group: usize,
    ) -> PyResult<(I32Array<'py>, I32Array<'py>, I32Array<'py>, I32Array<'py>)> {
        let ids = convert::seq_ids(seq_ids, "seq_ids")?;
        let g = self.group(py, group)?;
        let (a, b, c, d) = self.detached(py, |p| p.flashinfer_tables(&ids, g)).py_err(py)?;
        let v = |x| PyArray1::from_vec(py, x);
        Ok((v(a), v(b), v(c), v(d)))
    }

    /// The logical token ranges of ``seq_id`` whose K/V ``group`` stores.
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     group: a group index, ``0..num_groups``.
    ///
    /// Returns:
    ///     ``[(start, end), ...]``: sorted, merged half-open ranges of positions (tokens).
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id, ``group`` out of range.
    fn stored_ranges(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = group_arg)] group: usize,
    ) -> PyResult<Vec<(usize, usize)>> {
        let g = self.group(py, group)?;
        self.with(|p| p.stored_ranges(seq_id, g)).py_err(py)
    }

    /// References to physical block ``block_id``: the sequences holding it, in whichever
    /// group it belongs to (0 for a free or an idle cached block).
    ///
    /// Raises:
    ///     InvalidArgumentError: ``block_id`` outside ``0..num_blocks``.
    fn refcount(&self, py: Python<'_>, #[pyo3(from_py_with = arg::block_id)] block_id: i64) -> PyResult<u32> {
        let b = u32::try_from(block_id).map_err(|_| invalid(py, format!("block_id {block_id} is out of range")))?;
        self.with(|p| p.refcount(BlockId(b))).py_err(py)
    }

    /// Occupancy snapshot in blocks and tokens, totals and per group; O(table entries).
    ///
    /// Returns:
    ///     A :class:`HybridPoolStats`.
    fn stats(&self, py: Python<'_>) -> PyHybridPoolStats {
        PyHybridPoolStats(self.detached(py, |p| p.stats()))
    }

    /// Verify the bookkeeping, changing nothing: refcounts against the tables of every group,
    /// the free list, block accounting, each block in one group, the hole pattern of each
    /// table against the release rule; with prefix caching also the per-group index.
    ///
    /// Raises:
    ///     InvariantError: the first broken invariant, named (a pykvpool bug).
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        // The core keeps the cache's own check apart (`check_cache`); Python gets both.
        self.detached(py, |p| p.check_invariants().and_then(|_| p.check_cache())).py_err(py)
    }

    // Prefix caching.

    /// Admit ``seq_id`` with its prompt token ids, reusing the longest cached prefix valid for
    /// every group: a full-attention group needs every block before the hit, a sliding window
    /// its sink blocks and the window before the hit, a chunked group the hit's chunk.
    ///
    /// At least one prompt token is always left to compute. The other logical blocks before
    /// the hit are holes; the frontier is the hit length.
    ///
    /// Args:
    ///     seq_id: the new sequence's id, a non-negative int64.
    ///     token_ids: the prompt's token ids (any integer dtype, each in ``0..2**32``), at
    ///         most ``2**27``.
    ///     extra_key: ``0..2**63``, mixed into every block's key (an adapter id, a tenant salt):
    ///         prompts with different extra keys never share blocks (default: none).
    ///
    /// Returns:
    ///     ``(cached_tokens, slots)``: the leading prompt tokens whose KV is reused (a multiple
    ///     of ``block_size``), and int64 ``[num_groups, len(token_ids) - cached_tokens]`` slots
    ///     of the remaining tokens, row ``g`` for group ``g``.
    ///
    /// Raises:
    ///     DuplicateSequenceError: ``seq_id`` is live.
    ///     PoolExhaustedError: not enough free or evictable blocks (nothing changed).
    ///     InvalidArgumentError: a negative id, a token id outside ``0..2**32``, an
    ///         ``extra_key`` outside ``0..2**63``, a non-integer or non-1-D array, more than
    ///         ``2**27`` tokens, or caching off.
    #[pyo3(signature = (seq_id, token_ids, extra_key = None))]
    fn add_sequence_tokens<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        token_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
    ) -> PyResult<(usize, Slots<'py>)> {
        let tokens = cache_args::token_ids(token_ids, "token_ids")?;
        convert::new_tokens(py, tokens.len() as i64, "token_ids")?;
        let mut out = StepOutput::default();
        let cached = self
            .run(py, self.work(1, tokens.len()), |p| p.add_sequence_tokens(seq_id, &tokens, extra_key, &mut out))
            .py_err(py)?;
        Ok((cached, slots_array(py, self.groups.len(), &mut out)?))
    }

    /// Admit ``seq_id`` from a trace that gives block keys instead of tokens (Mooncake's
    /// ``hash_ids``), reusing the longest cached prefix valid for every group (as
    /// :meth:`add_sequence_tokens`).
    ///
    /// Each key stands for one block's chained content (equal keys = equal content and
    /// prefix). A partly filled last block's key is never cached.
    ///
    /// Args:
    ///     seq_id: the new sequence's id, a non-negative int64.
    ///     block_keys: exactly ``ceil(prompt_len / block_size)`` keys: a 1-D array of ints in
    ///         ``0..2**64``, or a uint64 ``[n, 2]`` array of 128-bit keys as ``(high, low)``
    ///         halves.
    ///     prompt_len: the prompt's length, in tokens (at most ``2**27``).
    ///
    /// Returns:
    ///     ``(cached_tokens, slots)`` as for :meth:`add_sequence_tokens`.
    ///
    /// Raises:
    ///     DuplicateSequenceError: ``seq_id`` is live.
    ///     PoolExhaustedError: not enough free or evictable blocks (nothing changed).
    ///     InvalidArgumentError: a wrong key count or width, negative keys, a negative id or
    ///         length, or caching off.
    fn add_sequence_block_keys<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        block_keys: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = arg::prompt_len)] prompt_len: usize,
    ) -> PyResult<(usize, Slots<'py>)> {
        let keys = convert::block_keys(block_keys, "block_keys")?;
        let mut out = StepOutput::default();
        let cached = self
            .run(py, self.work(1, prompt_len), |p| p.add_sequence_block_keys(seq_id, &keys, prompt_len, &mut out))
            .py_err(py)?;
        Ok((cached, slots_array(py, self.groups.len(), &mut out)?))
    }

    /// Append token ids to ``seq_id`` (as :meth:`append`), registering in each group every
    /// block that fills, when the sequence was admitted with token ids and the pool has seen
    /// every id since.
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     token_ids: the new tokens' ids (any integer dtype, each in ``0..2**32``), at most
    ///         ``2**27``.
    ///
    /// Returns:
    ///     ``(slots, cow)`` as for :meth:`append`.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     PoolExhaustedError: not enough free or evictable blocks (nothing changed).
    ///     InvalidArgumentError: a token id outside ``0..2**32``, a non-integer or non-1-D
    ///         array, more than ``2**27`` tokens, or caching off.
    fn append_tokens<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        token_ids: &Bound<'py, PyAny>,
    ) -> PyResult<(Slots<'py>, Bound<'py, PyArray2<i64>>)> {
        let tokens = cache_args::token_ids(token_ids, "token_ids")?;
        convert::new_tokens(py, tokens.len() as i64, "token_ids")?;
        let mut out = StepOutput::default();
        self.run(py, self.work(1, tokens.len()), |p| p.append_tokens(seq_id, &tokens, &mut out)).py_err(py)?;
        Ok((slots_array(py, self.groups.len(), &mut out)?, cow_array(py, &out.cow)?))
    }

    /// Tokens of ``token_ids`` an admission would reuse now: the longest cached prefix valid
    /// for every group (before the last-token rule of :meth:`add_sequence_tokens`). Changes
    /// nothing and touches nothing.
    ///
    /// Args:
    ///     token_ids: token ids (any integer dtype, each in ``0..2**32``).
    ///     extra_key: as for :meth:`add_sequence_tokens`.
    ///
    /// Returns:
    ///     A number of tokens, a multiple of ``block_size``.
    ///
    /// Raises:
    ///     InvalidArgumentError: a token id outside ``0..2**32``, an ``extra_key`` outside
    ///         ``0..2**63``, or caching off.
    #[pyo3(signature = (token_ids, extra_key = None))]
    fn cached_prefix_len(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
    ) -> PyResult<usize> {
        let tokens = cache_args::token_ids(token_ids, "token_ids")?;
        self.detached(py, |p| p.cached_prefix_len(&tokens, extra_key)).py_err(py)
    }

    /// Hit metrics and occupancy of the prefix cache, totals and per group
    /// (:attr:`CacheStats.group_hit_blocks`).
    ///
    /// Returns:
    ///     A :class:`CacheStats` snapshot.
    ///
    /// Raises:
    ///     InvalidArgumentError: caching off.
    fn cache_stats(&self, py: Python<'_>) -> PyResult<PyCacheStats> {
        self.with(|p| p.cache_stats()).py_err(py).map(PyCacheStats)
    }

    /// Pin what an admission of ``token_ids`` (followed by more tokens) would reuse: every
    /// full group's cached chain and each windowed group's sink and window blocks before the
    /// prefix's last full block ends, until :meth:`unpin` or until the logical clock reaches
    /// ``expires_at``.
    ///
    /// Without ``priority`` the pin is hard: the blocks are never evicted. With a ``priority``
    /// the pin is soft: under ``eviction="priority"`` idle blocks with a lower priority go
    /// first.
    ///
    /// Args:
    ///     token_ids: the prefix's token ids (any integer dtype, each in ``0..2**32``).
    ///     extra_key: as for :meth:`add_sequence_tokens`.
    ///     priority: ``0..2**32`` for a soft pin; None (default) for a hard pin.
    ///     expires_at: the logical time (see :meth:`set_clock`) at which the pin lapses; None
    ///         (default) for never.
    ///
    /// Returns:
    ///     The pin id.
    ///
    /// Raises:
    ///     InvalidArgumentError: the prefix has no full block, or a group lacks a block the
    ///         hit needs; ``expires_at`` is not after the current clock; a value out of
    ///         range; caching off.
    #[pyo3(signature = (token_ids, extra_key = None, *, priority = None, expires_at = None))]
    fn pin_prefix(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
        #[pyo3(from_py_with = priority)] priority: Option<u32>,
        #[pyo3(from_py_with = expires_at)] expires_at: Option<u64>,
    ) -> PyResult<u64> {
        let tokens = cache_args::token_ids(token_ids, "token_ids")?;
        self.detached(py, |p| p.pin_prefix_tokens(&tokens, extra_key, priority, expires_at)).py_err(py)
    }

    /// :meth:`pin_prefix` for a prefix given as block keys, one per full block.
    ///
    /// Args:
    ///     block_keys: as for :meth:`add_sequence_block_keys`, one key per full block.
    ///     priority: as for :meth:`pin_prefix`.
    ///     expires_at: as for :meth:`pin_prefix`.
    ///
    /// Returns:
    ///     The pin id.
    ///
    /// Raises:
    ///     InvalidArgumentError: no key, a group lacks a block the hit needs, a wrong key
    ///         width or a negative key; ``expires_at`` is not after the current clock;
    ///         caching off.
    #[pyo3(signature = (block_keys, *, priority = None, expires_at = None))]
    fn pin_block_keys(
        &self,
        py: Python<'_>,
        block_keys: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = priority)] priority: Option<u32>,
        #[pyo3(from_py_with = expires_at)] expires_at: Option<u64>,
    ) -> PyResult<u64> {
        let keys = convert::block_keys(block_keys, "block_keys")?;
        self.detached(py, |p| p.pin_prefix_keys(&keys, priority, expires_at)).py_err(py)
    }

    /// Release a pin; its blocks become evictable again once no other pin holds them.
    ///
    /// Raises:
    ///     InvalidArgumentError: an unknown, released or lapsed pin id, or caching off.
    fn unpin(&self, py: Python<'_>, #[pyo3(from_py_with = pin_id)] pin_id: u64) -> PyResult<()> {
        self.with(|p| p.unpin(pin_id)).py_err(py)
    }

    /// Drive the logical clock from the caller's step counter from now on (by default it counts
    /// completed admissions, steps, appends, forks, truncations, frees and
    /// :meth:`mark_computed` calls). Pins whose ``expires_at`` is reached are released.
    ///
    /// Args:
    ///     t: the new time, ``0..2**63``, not before the current one.
    ///
    /// Raises:
    ///     InvalidArgumentError: ``t`` goes back or is out of range, or caching off.
    fn set_clock(&self, py: Python<'_>, #[pyo3(from_py_with = clock)] t: u64) -> PyResult<()> {
        self.with(|p| p.set_clock(t)).py_err(py)
    }

    /// Take the queued cache events (``record_events=True``; none otherwise), oldest first,
    /// as :meth:`BlockPool.drain_events`; ``group`` (uint32) names each block's layer group.
    ///
    /// Returns:
    ///     A dict of arrays of equal length ``n``: ``kind``, ``block``, ``key``,
    ///     ``parent_key``, ``has_parent``, ``tokens``, ``clock`` as for
    ///     :meth:`BlockPool.drain_events`, and ``group`` uint32 (0 for a clear).
    ///
    /// Raises:
    ///     InvalidArgumentError: caching off.
    fn drain_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let mut ev: Vec<CacheEvent> = Vec::new();
        self.with(|p| p.drain_events(&mut ev)).py_err(py)?;
        cache_args::events_dict(py, &ev)
    }

    /// Forget every cached block of every group: idle ones become free, live ones stay with
    /// their sequences, uncached, so no later admission hits what was cached before. Not
    /// counted as evictions.
    ///
    /// Returns:
    ///     The number of blocks that were cached.
    ///
    /// Raises:
    ///     InvalidArgumentError: pins are held, or caching off.
    fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<usize> {
        self.detached(py, |p| p.reset_prefix_cache()).py_err(py)
    }
}
