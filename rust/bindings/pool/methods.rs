//! The methods of the Python `BlockPool` class, in one `#[pymethods]` block: the
//! sequence and table methods, then the prefix-caching ones. Each checks its arguments,
//! runs the core call through [`PyBlockPool::run`] / [`PyBlockPool::with`] (never holding
//! the pool lock across Python) and builds the result.

use std::path::PathBuf;
use std::sync::Mutex;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PyTuple};

use super::cache_args::{self, clock, expires_at, extra_key, hash_bits, keys_array, pin_id, priority, CacheOptions, TierOptions};
use super::class::*;
use super::specs::{group_arg, groups_arg, kind_object};
use super::stats::{PyCacheStats, PyPoolStats};
use super::tier_io::{DiskArgs, TierIo};
use crate::bindings::kv::PyKvCache;
use crate::invalid;
use crate::bindings::convert::{self, arg, count_arg, counts_into, int_scalar, MAX_CALL_TOKENS};
use crate::bindings::errors::{invalid, IntoPyResult};
use crate::pool::{BlockPool, GroupSpec, StepOutput};
use crate::prefix_cache::CacheEvent;
use crate::types::{BlockId, SeqId};

#[pymethods]
impl PyBlockPool {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, groups = None, *, prefix_caching = false, eviction = None,
        verify_tokens = None, cow_partial_hit = None, record_events = None, hash_bits = None, max_events = None,
        host_blocks = None, disk_blocks = None, tier_eviction = None, reuse_gate = None, write_through = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        groups: Option<&Bound<'_, PyAny>>,
        prefix_caching: bool,
        eviction: Option<&str>,
        verify_tokens: Option<bool>,
        cow_partial_hit: Option<bool>,
        record_events: Option<bool>,
        #[pyo3(from_py_with = hash_bits)] hash_bits: Option<u32>,
        max_events: Option<&Bound<'_, PyAny>>,
        host_blocks: Option<&Bound<'_, PyAny>>,
        disk_blocks: Option<&Bound<'_, PyAny>>,
        tier_eviction: Option<&str>,
        reuse_gate: Option<&Bound<'_, PyAny>>,
        write_through: Option<bool>,
    ) -> PyResult<Self> {
        let (nb, bs) = (count_arg(num_blocks, "num_blocks")?, count_arg(block_size, "block_size")?);
        let opts =
            CacheOptions { eviction, verify_tokens, cow_partial_hit, record_events, hash_bits, max_events };
        let grouped = groups.is_some_and(|g| !g.is_none());
        let specs = match groups.filter(|_| grouped) {
            Some(g) => groups_arg(g)?,
            None => vec![GroupSpec::Full],
        };
        let cfg = opts.config(py, prefix_caching)?;
        let tier_opts = TierOptions { host_blocks, disk_blocks, tier_eviction, reuse_gate, write_through };
        let (tiers, rules) = tier_opts.configs(py, prefix_caching)?;
        let tier_sizes = tiers.first().map(|h| (h.capacity_blocks, tiers.get(1).map(|d| d.capacity_blocks)));
        let g = specs.clone();
        let pool = py
            .detach(move || {
                let mut pool = BlockPool::with_options(nb, bs, g, cfg)?;
                if !tiers.is_empty() {
                    pool.set_tiers(&tiers, rules)?;
                    // Decisions only until storage is attached: nobody drains them.
                    pool.keep_tier_moves(false)?;
                }
                Ok(pool)
            })
            .py_err(py)?;
        Ok(Self {
            num_blocks: pool.num_blocks(),
            block_size: pool.block_size(),
            groups: specs,
            grouped,
            prefix_caching,
            tiers: tier_sizes,
            tier_io: Mutex::new(None),
            inner: Mutex::new(pool),
        })
    }

    /// Blocks in the pool, shared by all groups.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// The attention kind of each group, in group order (one :class:`FullAttention` for a
    /// pool built without ``groups``).
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
        let groups = if self.grouped {
            let g: Vec<String> = self.groups.iter().map(|g| g.to_string()).collect();
            format!(", groups=[{}]", g.join(", "))
        } else {
            String::new()
        };
        format!("BlockPool(num_blocks={}, block_size={}{groups}, free={free}, seqs={seqs})", self.num_blocks, self.block_size)
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
    /// block_size)`` new blocks in every group.
    ///
    /// Args:
    ///     seq_id: the new sequence's id, a non-negative int64.
    ///     prompt_len: tokens it holds now (default 0: an empty sequence), at most ``2**27`` in
    ///         one call (add longer prompts in chunks with :meth:`append`).
    ///
    /// Returns:
    ///     int64 ``[prompt_len]`` (``[num_groups, prompt_len]`` with ``groups``): the slot of
    ///     each prompt token, in order.
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
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut out = StepOutput::default();
        self.run(py, self.work(0, prompt_len), |pool| pool.add_sequence(seq_id, prompt_len, &mut out))
            .py_err(py)?;
        // The Vec is handed to numpy as is: copying into a numpy-allocated array measured
        // 0.1 us slower for a 2,000-token prompt.
        self.slots(py, &mut out)
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
    ) -> PyResult<(Bound<'py, PyAny>, PairArray<'py>)> {
        let mut out = StepOutput::default();
        self.run(py, self.work(1, num_tokens), |p| p.step(&[seq_id], &[num_tokens], &mut out)).py_err(py)?;
        Ok((self.slots(py, &mut out)?, cow_array(py, &out.cow)?))
    }

    /// One scheduler step: append ``num_tokens[i]`` tokens to ``seq_ids[i]`` for every i, in
    /// every group, atomically (windowed groups first release what no query from now on
    /// sees; those blocks count as free for the step).
    ///
    /// Args:
    ///     seq_ids: ``n`` distinct live sequence ids.
    ///     num_tokens: tokens to append to each sequence: ``n`` counts, one int for all, or
    ///         None for 1 token each (a decode step); at most ``2**27`` tokens in total.
    ///
    /// Returns:
    ///     ``(slot_mapping, cow_pairs, seq_lens)``: int64 slots of all new tokens in batch
    ///     order (``sum(num_tokens)`` of them; ``[num_groups, sum(num_tokens)]`` with
    ///     ``groups``, row ``g`` for group ``g``); int64 ``[k, 2]`` copy-on-write ``(src, dst)``
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
    ) -> PyResult<(Bound<'py, PyAny>, PairArray<'py>, I32Array<'py>)> {
        let mut scratch = STEP_SCRATCH.take();
        let StepScratch { out, counts: n, ids } = &mut scratch;
        convert::seq_ids_into(seq_ids, "seq_ids", ids)?;
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
                self.run(py, self.work(ids.len(), ids.len()), |pool| pool.step_decode(ids, out)).py_err(py)?;
            }
            _ => {
                let one = 1i64.into_pyobject(py)?;
                counts_into(counted.unwrap_or(one.as_any()), ids.len(), "num_tokens", n)?;
                // `counts_into` caps the total at MAX_CALL_TOKENS, so this sum cannot overflow.
                let work = self.work(ids.len(), n.iter().sum::<usize>());
                self.run(py, work, |pool| pool.step(ids, n, out)).py_err(py)?;
            }
        }
        // Copies into numpy-owned buffers: cheaper than handing the Vecs over, which makes
        // numpy keep a Python owner object per array.
        let slots = if self.grouped { self.slots(py, out)? } else { PyArray1::from_slice(py, &out.slots).into_any() };
        let r = (slots, cow_array(py, &out.cow)?, PyArray1::from_slice(py, &out.seq_lens));
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
    /// sequence's reference (freed at zero). In a windowed group the rollback stays within
    /// what the group still holds: the query at the new length must see only positions
    /// whose KV the group holds. Positions the window rule released are not held, and
    /// neither are the positions of a block taken at a hole (a growth from a length whose
    /// block was released) before the growth that took it.
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     num_tokens: tokens to drop, at most the sequence's length.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: ``num_tokens`` is negative or exceeds the length, or the
    ///         query at the new length would see a position a windowed group does not
    ///         hold (nothing is dropped).
    fn truncate(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::num_tokens)] num_tokens: usize,
    ) -> PyResult<()> {
        self.detached(py, |p| p.truncate(seq_id, num_tokens)).py_err(py)
    }

    /// Roll ``seq_id`` back to ``num_tokens`` tokens (at most its length), also past
    /// what its windowed groups still hold, which :meth:`truncate` refuses: every group
    /// keeps the blocks it holds that a query at the new length needs, allocates fresh
    /// blocks (never cached) where such a block was released (or holds no K/V from its
    /// start: taken at a hole), and frees the rest. The frontier becomes the new length.
    /// The fresh blocks' K/V is the caller's to write (a copy it kept, or computed again)
    /// before anything attends to them; their ids are in :meth:`block_table` at the
    /// returned logical indices. A video stream going back to an earlier frame is the
    /// use (:meth:`pykvpool.video.VideoCache.rewind`).
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     num_tokens: the sequence's length after the rewind, in tokens, at most its
    ///         length.
    ///
    /// Returns:
    ///     The logical blocks (indices into the block table) allocated afresh, int64,
    ///     ascending: one array for a pool built without ``groups``, else a list of one
    ///     array per group.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: ``num_tokens`` is negative or exceeds the length.
    ///     PoolExhaustedError: too few free blocks, counting those the rewind frees
    ///         (nothing changed).
    fn rewind<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        #[pyo3(from_py_with = arg::num_tokens)] num_tokens: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fresh = self.detached(py, |p| p.rewind(seq_id, num_tokens)).py_err(py)?;
        let arrays: Vec<Bound<'py, PyArray1<i64>>> =
            fresh.into_iter().map(|v| PyArray1::from_vec(py, v.into_iter().map(|i| i as i64).collect())).collect();
        if self.grouped {
            Ok(PyList::new(py, arrays)?.into_any())
        } else {
            Ok(arrays.into_iter().next().map(Bound::into_any).unwrap_or_else(|| PyArray1::<i64>::zeros(py, 0, false).into_any()))
        }
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
            let held: usize = (0..pool.num_groups()).map(|g| pool.table(seq_id, g).map_or(0, |t| t.num_stored())).sum();
            let short = held < INLINE_WORK;
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

    /// Position of the first query of the latest growth of ``seq_id`` (its length before that
    /// growth), in tokens: 0 for a new sequence, the cached length after a prefix-cache hit.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id.
    fn frontier(&self, py: Python<'_>, #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId) -> PyResult<usize> {
        self.with(|p| p.frontier(seq_id)).py_err(py)
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

    /// The block table of ``seq_id`` in ``group`` (a copy).
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     group: a group index, ``0..num_groups``; required with ``groups``, 0 without.
    ///
    /// Returns:
    ///     int32 ``[ceil(seq_len / block_size)]``: the physical block of each logical block,
    ///     -1 for a hole (a block the group released or never stored).
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id, ``group`` out of range or missing.
    #[pyo3(signature = (seq_id, *, group = None))]
    fn block_table<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        group: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<I32Array<'py>> {
        let g = self.group(py, group.map(group_arg).transpose()?)?;
        let v = self.with(|p| p.table(seq_id, g).map(|t| t.entries().map(|b| b.map_or(-1, |b| b.as_i32())).collect()));
        Ok(PyArray1::from_vec(py, v.py_err(py)?))
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

    /// Block tables of ``seq_ids`` in ``group`` as one padded matrix.
    ///
    /// Args:
    ///     seq_ids: live sequence ids, one row each.
    ///     max_blocks: columns (blocks); default the longest table.
    ///     pad: the value of holes and past each table's end, an int32 (default -1).
    ///     group: a group index, ``0..num_groups``; required with ``groups``, 0 without.
    ///
    /// Returns:
    ///     int32 ``[len(seq_ids), max_blocks]``: logical block ``i`` of ``seq_ids[r]`` in row
    ///     ``r``, column ``i``.
    ///
    /// Raises:
    ///     UnknownSequenceError: an id is not live.
    ///     InvalidArgumentError: ``group`` out of range or missing, a table longer than
    ///         ``max_blocks``, more than ``2**28`` entries, or ``pad`` outside int32.
    #[pyo3(signature = (seq_ids, max_blocks = None, pad = -1, *, group = None))]
    fn block_tables<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = arg::opt_max_blocks)] max_blocks: Option<usize>,
        #[pyo3(from_py_with = arg::pad)] pad: i32,
        group: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray2<i32>>> {
        let ids = convert::seq_ids(seq_ids, "seq_ids")?;
        let g = self.group(py, group.map(group_arg).transpose()?)?;
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

    /// The tables of ``seq_ids`` in ``group`` in FlashInfer's paged layout (what
    /// :func:`decode_attention_paged` takes): each sequence's stored pages in logical order,
    /// the sink pages first, then the contiguous window run.
    ///
    /// Page ``j`` of sequence ``i`` is logical block ``j`` when ``j < s_i``, else
    /// ``kv_page_start[i] + j - s_i``, with ``s_i = min(ceil(sink_tokens / block_size),
    /// kv_page_start[i])``. A full-attention group has no holes: its ``kv_page_start`` is 0.
    ///
    /// Args:
    ///     seq_ids: live sequence ids.
    ///     group: a group index, ``0..num_groups``; required with ``groups``, 0 without.
    ///
    /// Returns:
    ///     ``(kv_indptr, kv_indices, kv_last_page_len)`` without ``groups``, and
    ///     ``kv_page_start`` fourth with, all int32: ``kv_indptr`` ``[n + 1]`` offsets into
    ///     ``kv_indices`` ``[nnz]``, the stored block ids; ``kv_last_page_len`` ``[n]``, the
    ///     tokens of each sequence's last logical block, in ``1..=block_size`` (0 for a
    ///     sequence without pages); ``kv_page_start`` ``[n]``, the logical block of the first
    ///     page after the sink pages (blocks).
    ///
    /// Raises:
    ///     UnknownSequenceError: an id is not live.
    ///     InvalidArgumentError: a negative or non-integer id, ``group`` out of range or
    ///         missing.
    #[pyo3(signature = (seq_ids, *, group = None))]
    fn flashinfer_tables<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        group: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let ids = convert::seq_ids(seq_ids, "seq_ids")?;
        let g = self.group(py, group.map(group_arg).transpose()?)?;
        let (a, b, c, d) = self.detached(py, |p| p.flashinfer_tables(&ids, g)).py_err(py)?;
        let v = |x| PyArray1::from_vec(py, x);
        if self.grouped {
            PyTuple::new(py, [v(a), v(b), v(c), v(d)])
        } else {
            PyTuple::new(py, [v(a), v(b), v(c)])
        }
    }

    /// The logical token ranges of ``seq_id`` whose K/V ``group`` stores.
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     group: a group index, ``0..num_groups``; required with ``groups``, 0 without.
    ///
    /// Returns:
    ///     ``[(start, end), ...]``: sorted, merged half-open ranges of positions (tokens).
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: a negative id, ``group`` out of range or missing.
    #[pyo3(signature = (seq_id, *, group = None))]
    fn stored_ranges(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<(usize, usize)>> {
        let g = self.group(py, group.map(group_arg).transpose()?)?;
        self.with(|p| p.stored_ranges(seq_id, g)).py_err(py)
    }

    /// Occupancy snapshot in blocks and tokens, totals and per group; O(table entries).
    ///
    /// Returns:
    ///     A :class:`PoolStats`.
    fn stats(&self, py: Python<'_>) -> PyPoolStats {
        PyPoolStats(self.detached(py, |p| p.stats()))
    }

    /// Verify the bookkeeping, changing nothing: refcounts against the tables of every group,
    /// the free list, block accounting, each block in one group, table lengths and the hole
    /// pattern of each table against the release rule; with prefix caching also the cache: each key maps to one
    /// block and back, idle cached blocks have refcount 0 and are queued for eviction exactly
    /// when they are unpinned leaves, no free-list block is cached, parents outlive children.
    ///
    /// Raises:
    ///     InvariantError: the first broken invariant, named (a pykvpool bug).
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, |p| p.check_invariants()).py_err(py)
    }

    // Prefix caching.

    /// Whether this pool caches prefixes (``prefix_caching=True``).
    #[getter]
    fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Admit ``seq_id`` with its prompt token ids, reusing the longest cached prefix of full
    /// blocks.
    ///
    /// At least one prompt token is always left to compute (its logits are needed), so a fully
    /// cached prompt reports one token fewer than its length as cached.
    ///
    /// Args:
    ///     seq_id: the new sequence's id, a non-negative int64.
    ///     token_ids: the prompt's token ids (any integer dtype, each in ``0..2**32``).
    ///     extra_key: ``0..2**63``, mixed into every block's key (an adapter id, a tenant salt):
    ///         prompts with different extra keys never share blocks (default: none).
    ///
    /// Returns:
    ///     ``(cached_tokens, slots, cow)``: the number of leading prompt tokens whose KV is
    ///     reused; the int64 slots of the remaining ``len(token_ids) - cached_tokens`` tokens;
    ///     an int64 ``[k, 2]`` array of ``(src, dst)`` blocks to copy before computing (k <= 1,
    ///     only with ``cow_partial_hit``).
    ///
    /// Raises:
    ///     DuplicateSequenceError: ``seq_id`` is live.
    ///     PoolExhaustedError: not enough free or evictable blocks (nothing changed).
    ///     InvalidArgumentError: a negative id, a token id outside ``0..2**32``, an
    ///         ``extra_key`` outside ``0..2**63``, a non-integer or non-1-D array, or caching
    ///         off.
    #[pyo3(signature = (seq_id, token_ids, extra_key = None))]
    fn add_sequence_tokens<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        token_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
    ) -> PyResult<(usize, Bound<'py, PyAny>, PairArray<'py>)> {
        let (seq, extra) = (seq_id, extra_key);
        let tokens = cache_args::token_ids(token_ids, "token_ids")?;
        let mut out = StepOutput::default();
        let cached =
            self.run(py, self.work(1, tokens.len()), |pool| pool.add_sequence_tokens(seq, &tokens, extra, &mut out)).py_err(py)?;
        Ok((cached, self.slots(py, &mut out)?, cow_array(py, &out.cow)?))
    }

    /// Admit ``seq_id`` from a trace that gives block ids instead of tokens (Mooncake's
    /// ``hash_ids``), reusing the longest cached prefix.
    ///
    /// Each key stands for one block's chained content (equal keys = equal content, prefix
    /// and fill). The last key may stand for a partly filled block (``prompt_len %
    /// block_size`` tokens): it is cached with its fill in every layer group, and the fill
    /// is part of its identity: it matches only a later prompt's partly filled last block
    /// of the same key and fill, and a full block under the same key is another entry (a
    /// lookup never reuses more tokens than were written). The sequence's first append
    /// copies it (copy-on-write).
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
    ) -> PyResult<(usize, Bound<'py, PyAny>)> {
        let (seq, len) = (seq_id, prompt_len);
        let keys = convert::block_keys(block_keys, "block_keys")?;
        let mut out = StepOutput::default();
        let cached = self.run(py, self.work(1, len), |p| p.add_sequence_block_keys(seq, &keys, len, &mut out)).py_err(py)?;
        Ok((cached, self.slots(py, &mut out)?))
    }

    /// Append token ids to ``seq_id`` (as :meth:`append`), registering each block that fills
    /// in the cache when the sequence was admitted with token ids and every block before it is
    /// cached. Writing into a cached block copies it first.
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     token_ids: the new tokens' ids (any integer dtype, each in ``0..2**32``).
    ///
    /// Returns:
    ///     ``(slots, cow)`` as for :meth:`append`.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     PoolExhaustedError: not enough free or evictable blocks (nothing was appended).
    ///     InvalidArgumentError: a token id outside ``0..2**32``, a non-integer or non-1-D
    ///         array, or caching off.
    fn append_tokens<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        token_ids: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, PairArray<'py>)> {
        let seq = seq_id;
        let tokens = cache_args::token_ids(token_ids, "token_ids")?;
        let mut out = StepOutput::default();
        self.run(py, self.work(1, tokens.len()), |p| p.append_tokens(seq, &tokens, &mut out)).py_err(py)?;
        Ok((self.slots(py, &mut out)?, cow_array(py, &out.cow)?))
    }

    /// Join ``seq_id`` holding only the longest cached prefix of the prompt ``token_ids``
    /// (at most ``len - 1`` tokens: the last prompt token is always computed), allocating
    /// nothing else and registering nothing: its length is the cached tokens, returned.
    ///
    /// The scheduler's order, as vLLM's: look up the hit, then grow the sequence by the
    /// prompt's rest as compute allows (:meth:`step` or :meth:`append`; the sequence keeps
    /// its token record through them), then, once that KV is computed, give the ids to
    /// :meth:`store_tokens`, which caches the blocks they fill. So no block is cached before
    /// its KV exists (:meth:`add_sequence_tokens` caches the prompt's blocks at admission).
    /// The lookup counts in :meth:`cache_stats` as an admission's.
    ///
    /// With tiers (``host_blocks``) the hit continues below the pool: the blocks found
    /// there (those worth loading, :meth:`set_tier_costs`) are allocated, cached and
    /// counted in the returned length, and with :meth:`attach_tier_storage` their bytes
    /// are copied in before the cache is next read. When the pool lacks free blocks for
    /// them, none is taken (the caller computes them).
    ///
    /// Args:
    ///     seq_id: the new sequence's id, a non-negative int64.
    ///     token_ids: the prompt's token ids (any integer dtype, each in ``0..2**32``).
    ///     extra_key: as for :meth:`add_sequence_tokens`.
    ///
    /// Returns:
    ///     The cached tokens: the sequence's length, a multiple of ``block_size`` below
    ///     ``len(token_ids)``.
    ///
    /// Raises:
    ///     DuplicateSequenceError: ``seq_id`` is live.
    ///     InvalidArgumentError: a negative id, a token id outside ``0..2**32``, an
    ///         ``extra_key`` outside ``0..2**63``, a non-integer or non-1-D array, a prompt
    ///         longer than ``2**27`` tokens, or caching off (nothing changed).
    #[pyo3(signature = (seq_id, token_ids, extra_key = None))]
    fn add_sequence_hit(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        token_ids: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
    ) -> PyResult<usize> {
        let tokens = cache_args::token_ids(token_ids, "token_ids")?;
        self.run(py, self.work(1, tokens.len()), |p| p.add_sequence_hit(seq_id, &tokens, extra_key)).py_err(py)
    }

    /// Give ``seq_id`` the ids of its next stored tokens, whose KV is now computed, and
    /// cache each block they fill (as :meth:`append_tokens` does, without growing): the
    /// last step of :meth:`add_sequence_hit`'s order. A full block whose content a cached
    /// block already holds (another sequence computed the same prefix in the same pass)
    /// is replaced by that block in ``seq_id``'s table, its own freed, so one copy stays
    /// and the chain goes on past it; a table read before this call is stale for it.
    ///
    /// Args:
    ///     seq_id: a live sequence joined by :meth:`add_sequence_hit` (or a fork of one).
    ///     token_ids: the ids of the tokens after those it has given, in order (any
    ///         integer dtype, each in ``0..2**32``).
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     InvalidArgumentError: the sequence keeps no token record (admitted or grown
    ///         without token ids), more ids than it stores tokens, a token id outside
    ///         ``0..2**32``, a non-integer or non-1-D array, or caching off (nothing
    ///         changed).
    fn store_tokens(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let tokens = cache_args::token_ids(token_ids, "token_ids")?;
        self.run(py, self.work(1, tokens.len()), |p| p.store_tokens(seq_id, &tokens)).py_err(py)
    }

    /// Keys of the full blocks of ``token_ids`` (a partial last block has none). Stable across
    /// processes and runs.
    ///
    /// Each key is XXH3-128 with seed ``b"pkvpool1"`` over ``parent key (16 bytes LE) || 0x00 |
    /// 0x01 extra (8 bytes LE) || token ids (4 bytes LE each)``, parent 0 for the first block.
    ///
    /// Args:
    ///     token_ids: token ids (any integer dtype, each in ``0..2**32``).
    ///     extra_key: as for :meth:`add_sequence_tokens`.
    ///
    /// Returns:
    ///     uint64 ``[len(token_ids) // block_size, 2]``: each key's ``(high, low)`` halves.
    ///
    /// Raises:
    ///     InvalidArgumentError: a token id outside ``0..2**32``, an ``extra_key`` outside
    ///         ``0..2**63``, or caching off.
    #[pyo3(signature = (token_ids, extra_key = None))]
    fn block_keys<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
    ) -> PyResult<Bound<'py, PyArray2<u64>>> {
        let tokens = cache_args::token_ids(token_ids, "token_ids")?;
        let extra = extra_key;
        let keys = self.detached(py, |p| p.block_keys(&tokens, extra)).py_err(py)?;
        keys_array(py, keys.into_iter())
    }

    /// Tokens of ``token_ids`` held by cached full blocks now (before the last-token rule of
    /// :meth:`add_sequence_tokens`). Changes nothing and touches nothing.
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
        let extra = extra_key;
        self.detached(py, |p| p.cached_prefix_len(&tokens, extra)).py_err(py)
    }

    /// Pin the cached full blocks of ``token_ids`` and return a pin id for :meth:`unpin`.
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
    ///     InvalidArgumentError: the prefix has no full block or is not fully cached;
    ///         ``expires_at`` is not after the current clock; a value out of range; caching
    ///         off.
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

    /// :meth:`pin_prefix` for a prefix given as block keys, each standing for a full block
    /// (a partly filled keyed block cannot be pinned).
    ///
    /// Args:
    ///     block_keys: as for :meth:`add_sequence_block_keys`, one key per full block to pin.
    ///     priority: as for :meth:`pin_prefix`.
    ///     expires_at: as for :meth:`pin_prefix`.
    ///
    /// Returns:
    ///     The pin id.
    ///
    /// Raises:
    ///     InvalidArgumentError: no key, a key that is not cached as a full block, a wrong key
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
    /// completed admissions, appends, steps, forks, truncations and frees). Pins whose
    /// ``expires_at`` is reached are released.
    ///
    /// Args:
    ///     t: the new time, ``0..2**63``, not before the current one.
    ///
    /// Raises:
    ///     InvalidArgumentError: ``t`` goes back or is out of range, or caching off.
    fn set_clock(&self, py: Python<'_>, #[pyo3(from_py_with = clock)] t: u64) -> PyResult<()> {
        self.with(|p| p.set_clock(t)).py_err(py)
    }

    /// Hit metrics and occupancy of the prefix cache.
    ///
    /// Returns:
    ///     A :class:`CacheStats` snapshot.
    ///
    /// Raises:
    ///     InvalidArgumentError: caching off.
    fn cache_stats(&self, py: Python<'_>) -> PyResult<PyCacheStats> {
        self.with(|p| p.cache_stats()).py_err(py).map(PyCacheStats)
    }

    /// Take the queued cache events (``record_events=True``; none otherwise), oldest first.
    ///
    /// The queue keeps the newest ``max_events`` events: when
    /// :attr:`CacheStats.dropped_events` grew since the last drain, older events were lost
    /// and a consumer mirroring the cache must resynchronise.
    ///
    /// Returns:
    ///     A dict of arrays of equal length ``n``: ``kind`` uint8 (:data:`EVENT_STORED`,
    ///     :data:`EVENT_REMOVED`, :data:`EVENT_ALL_CLEARED`), ``block`` int64 (-1 for a clear),
    ///     ``key`` and ``parent_key`` uint64 ``[n, 2]`` (high, low), ``has_parent`` bool,
    ///     ``tokens`` uint32 (tokens of KV the block holds: ``block_size``, fewer for a keyed
    ///     prompt's partly filled last block, 0 for a clear), ``clock`` uint64 (logical
    ///     time), ``group`` uint32 (the block's layer group: 0 in this pool), ``medium``
    ///     uint8 (0 the pool itself, 1 the host tier, 2 the disk tier; a tier's events have
    ///     block -1: a block moving down is removed from one medium and stored in the next,
    ///     a hit below the pool removes it from its tier before the pool stores it).
    ///
    /// Raises:
    ///     InvalidArgumentError: caching off.
    fn drain_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut ev: Vec<CacheEvent> = Vec::new();
        self.with(|p| p.drain_events(&mut ev)).py_err(py)?;
        cache_args::events_dict(py, &ev)
    }

    /// Forget every cached block: idle ones become free, live ones stay with their sequences,
    /// uncached.
    ///
    /// Returns:
    ///     The number of blocks that were cached.
    ///
    /// Raises:
    ///     InvalidArgumentError: pins are held, or caching off.
    fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<usize> {
        self.detached(py, |p| p.reset_prefix_cache()).py_err(py)
    }

    /// The counts of the tiers below the device (``host_blocks``, ``disk_blocks``).
    ///
    /// Returns:
    ///     One dict per tier, host first (an empty list without tiers): ``tier``
    ///     (``"host"`` or ``"disk"``), ``stored`` (blocks that entered it, from the device
    ///     or the tier above), ``hits`` (blocks an admission took back from it),
    ///     ``evicted`` (blocks it pushed down or dropped), ``collisions`` (lookups whose
    ///     key it held with other tokens, parent or extra key: misses), ``held`` (blocks
    ///     now); in the host entry only (0 in the disk one), ``gated`` (evicted blocks the
    ///     reuse gate kept out), ``loads_won`` (admissions that loaded blocks from below
    ///     the pool) and ``recompute_won`` (admissions that found blocks below the pool
    ///     but computed some or all of them, as faster: see :meth:`set_tier_costs`).
    ///
    /// Raises:
    ///     InvalidArgumentError: caching off.
    fn tier_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let stats = self.with(|p| p.tier_stats()).py_err(py)?;
        let (tiers, choices) = stats.unwrap_or_default();
        cache_args::tier_stats_list(py, &tiers, choices)
    }

    /// Say what loading a block from each tier and computing a prompt token cost, so that
    /// an admission never loads what is faster to compute.
    ///
    /// From then on an admission whose hit continues below the pool loads only the leading
    /// tier blocks that save the most time: block by block along the chain, each saves
    /// ``block_size * recompute_ns_per_token`` and costs its tier's load (times the number
    /// of groups); the count with the largest saving is loaded, the rest computed (the
    /// smallest such count on a tie; none when no count saves time). Without costs every
    /// block found below is loaded. :meth:`tier_stats` counts how often each side won.
    ///
    /// Args:
    ///     load_ns_per_block: one cost per tier, host first, in nanoseconds per block (a
    ///         measured bandwidth's ``block bytes / bytes per ns`` plus the latency), each
    ///         ``0..2**63``.
    ///     recompute_ns_per_token: nanoseconds to compute one prompt token's KV (from the
    ///         caller's roofline), ``0..2**63``.
    ///
    /// Raises:
    ///     InvalidArgumentError: caching off, no tiers, a cost count other than the
    ///         tiers', a negative cost or one that is not an int.
    #[pyo3(signature = (load_ns_per_block, recompute_ns_per_token))]
    fn set_tier_costs(&self, py: Python<'_>, load_ns_per_block: &Bound<'_, PyAny>, recompute_ns_per_token: &Bound<'_, PyAny>) -> PyResult<()> {
        let values = convert::int_vec(load_ns_per_block, "load_ns_per_block")?;
        let load: Vec<u64> = convert::ints_as(py, values, "load_ns_per_block", " is negative")?;
        let per_token = u64::try_from(count_arg(recompute_ns_per_token, "recompute_ns_per_token")?).unwrap_or(u64::MAX);
        self.with(|p| p.set_tier_costs(&load, per_token)).py_err(py)
    }

    /// Give the tiers bytes: from now on every block the pool moves below the device is
    /// copied out of ``cache`` into host memory (and from there to ``disk_dir``), and every
    /// block an admission takes from a tier is copied back into its new block of
    /// ``cache`` before anything reads it.
    ///
    /// Device <-> host copies run on ``transfer_threads`` threads of their own while the
    /// caller goes on, disk writes on a thread of the disk tier's own (in the order
    /// decided; at most about 256 MiB queued); a disk read runs in the pool call whose
    /// hit needs it, after the writes queued before it.
    /// Every access to ``cache`` (writes, attention, dequantize, copies) first waits for
    /// the copies in flight, so a block is never read before its bytes arrived; numpy or
    /// torch views of the cache are not waited for: call :meth:`wait_tiers` before using
    /// them. The host tier maps ``host_blocks`` slots of one block's bytes across all
    /// layers (plus 16 staging slots with a disk tier).
    ///
    /// The disk folder holds one checksummed file per block (format in the
    /// documentation); it is tied to ``model_id`` and the cache's layout and dtype, and
    /// a folder of another model or layout is refused. Blocks an earlier run left there
    /// go back into the disk tier (a warm restart: a later prompt hits them), up to
    /// ``disk_blocks``; the rest are removed. A restored block is verified by its chained
    /// key, parent key and extra key (not its token ids, which the folder does not keep)
    /// and by its checksum when it is loaded.
    ///
    /// Args:
    ///     cache: the pool's KV storage: as many blocks of as many tokens as the pool.
    ///     disk_dir: the disk tier's folder (created if missing), exactly when the pool
    ///         has ``disk_blocks``.
    ///     model_id: names the model whose KV the folder holds (weights and version), with
    ///         ``disk_dir`` only.
    ///     transfer_threads: copy threads, ``1..=64`` (default 2).
    ///     fsync: sync each disk block before it counts as written (default True: it
    ///         survives a power loss; False: it survives the process being killed).
    ///
    /// Raises:
    ///     InvalidArgumentError: the pool has no tiers or already evicted a block into
    ///         them, storage is already attached, ``cache``'s blocks or block size differ
    ///         from the pool's, ``disk_dir`` given without ``disk_blocks`` (or missing
    ///         with), ``model_id`` missing with ``disk_dir`` or given without it,
    ///         ``transfer_threads`` out of range, or host memory for the slots cannot be
    ///         mapped.
    ///     PermissionError: the folder may not be created, read or written.
    ///     OSError: another I/O failure, or another open tier holds the folder.
    ///     TypeError: ``cache`` is not a :class:`KvCache`.
    #[pyo3(signature = (cache, *, disk_dir = None, model_id = None, transfer_threads = 2, fsync = true))]
    fn attach_tier_storage(
        &self,
        py: Python<'_>,
        cache: &Bound<'_, PyKvCache>,
        disk_dir: Option<PathBuf>,
        model_id: Option<String>,
        #[pyo3(from_py_with = transfer_threads)] transfer_threads: usize,
        fsync: bool,
    ) -> PyResult<()> {
        let Some(tiers) = self.tiers else {
            return Err(invalid(py, "cache: the pool has no tiers (build it with host_blocks=)"));
        };
        let threads = transfer_threads;
        let disk = match (disk_dir, model_id) {
            (Some(dir), Some(model_id)) => Some(DiskArgs { dir, model_id, fsync }),
            (None, None) => None,
            (Some(_), None) => return Err(invalid(py, "model_id: needed with disk_dir (the folder holds this model's KV)")),
            (None, Some(_)) => return Err(invalid(py, "model_id: given without disk_dir")),
        };
        let c = cache.get();
        py.detach(|| {
            let mut pool = lock(&self.inner);
            let mut io = lock(&self.tier_io);
            if io.is_some() {
                return Err(invalid!("cache: tier storage is already attached"));
            }
            if pool.tier_stats()?.is_some_and(|(t, _)| t.iter().any(|s| s.stored > 0)) {
                return Err(invalid!("cache: the tiers already hold blocks without bytes; attach before the pool evicts"));
            }
            let t = TierIo::new(&mut pool, tiers, c, disk, threads)?;
            pool.keep_tier_moves(true)?;
            *io = Some(Box::new(t));
            Ok(())
        })
        .py_err(py)
    }

    /// Measure what loading one block from each tier costs on this machine, on the
    /// attached storage: nanoseconds per block, host first (then disk), the figures
    /// :meth:`set_tier_costs` takes.
    ///
    /// The host figure times the copy of device blocks ``0..blocks`` into fresh host
    /// slots by the transfer threads (a copy costs the same both ways). The disk figure
    /// writes those blocks to the folder, drops them from the page cache, and times
    /// reading them back with their checksums, plus the host copy; they are removed
    /// after. A shared machine's figures vary: probe when the machine is as loaded as
    /// when it serves. Every access to the cache waits for the probe.
    ///
    /// Args:
    ///     blocks: blocks to move, ``1..=256`` and at most the pool's (default 16).
    ///
    /// Returns:
    ///     One cost per tier, in nanoseconds per block.
    ///
    /// Raises:
    ///     InvalidArgumentError: no storage attached, or ``blocks`` out of range.
    ///     OSError: the folder may not be written or read (``PermissionError`` when not
    ///         permitted).
    #[pyo3(signature = (blocks = 16))]
    fn probe_tier_loads(&self, py: Python<'_>, #[pyo3(from_py_with = probe_blocks)] blocks: usize) -> PyResult<Vec<u64>> {
        py.detach(|| {
            let _pool = lock(&self.inner);
            match lock(&self.tier_io).as_deref_mut() {
                Some(io) => io.probe(blocks),
                None => Err(invalid!("blocks: no tier storage to probe; attach_tier_storage first")),
            }
        })
        .py_err(py)
    }

    /// Wait until the tier copies in flight have finished (see
    /// :meth:`attach_tier_storage`); report the first failure since the last call.
    ///
    /// Blocks going down to disk are written on a thread of the disk tier's own, in the
    /// order decided, while the pool goes on (a load from disk waits for the writes
    /// queued before it).
    ///
    /// Args:
    ///     disk_writes: wait for the disk writes queued too (default True); False waits
    ///         for the device <-> host copies only (what a read of the cache needs).
    ///
    /// Raises:
    ///     OSError: a disk block failed its checksum or vanished and was not loaded, or a
    ///         disk write failed (the block is then lost: a later hit on it is such a
    ///         failed load). A sequence admitted since the last call may then hold a
    ///         block with stale bytes: the pool forgot every cached block (as
    ///         :meth:`reset_prefix_cache`; the tiers too) so that nothing hits it again;
    ///         free those sequences and admit them again (their blocks are computed).
    ///     InvalidArgumentError: a copy was refused (a bug).
    #[pyo3(signature = (*, disk_writes = true))]
    fn wait_tiers(&self, py: Python<'_>, disk_writes: bool) -> PyResult<()> {
        py.detach(|| lock(&self.tier_io).as_deref_mut().map_or(Ok(()), |io| io.wait(disk_writes))).py_err(py)
    }

    /// What the attached tier storage copied (None before :meth:`attach_tier_storage`).
    ///
    /// Returns:
    ///     A dict of counts in blocks: ``host_stores`` (device -> host), ``host_loads``
    ///     (host -> device), ``disk_writes`` (host -> disk), ``disk_loads`` (disk ->
    ///     device), ``disk_lost`` (disk blocks that failed their checks, never loaded),
    ///     ``flushes`` (copies waited for inside a call, where one decision needed an
    ///     earlier one's bytes); and ``slot_bytes`` (one block across all layers) and
    ///     ``host_bytes`` (host memory mapped), in bytes.
    ///
    /// Raises:
    ///     Nothing.
    fn tier_transfer_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some((s, host_bytes, slot_bytes)) = lock(&self.tier_io).as_deref().map(TierIo::stats) else { return Ok(None) };
        let d = PyDict::new(py);
        d.set_item("host_stores", s.host_stores)?;
        d.set_item("host_loads", s.host_loads)?;
        d.set_item("disk_writes", s.disk_writes)?;
        d.set_item("disk_loads", s.disk_loads)?;
        d.set_item("disk_lost", s.disk_lost)?;
        d.set_item("flushes", s.flushes)?;
        d.set_item("slot_bytes", slot_bytes)?;
        d.set_item("host_bytes", host_bytes)?;
        Ok(Some(d))
    }
}

/// `transfer_threads`: a count (the engine checks its range).
fn transfer_threads(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    count_arg(obj, "transfer_threads")
}

/// `blocks` of `probe_tier_loads`: a count (the probe checks its range).
fn probe_blocks(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    count_arg(obj, "blocks")
}
