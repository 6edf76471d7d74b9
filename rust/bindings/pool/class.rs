//! The `BlockPool` Python class: its state, how a call reaches the core (the lock, the
//! GIL rule, the group of a per-group query) and the array helpers its methods share. Its one `#[pymethods]` block is in
//! [`super::methods`].

use std::sync::{Mutex, MutexGuard};

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2};
use pyo3::prelude::*;

use super::tier_io::TierIo;
use crate::bindings::errors::{invalid, to_py};
use crate::error::KvError;
use crate::pool::{BlockPool, GroupSpec, StepOutput};
use crate::types::{BlockId, SeqId};

/// Largest padded table `block_tables` returns or `BlockTableBuffer` holds, in entries
/// (1 GiB of int32). Anything larger is a caller error, and allocating it would take the
/// process down (the OS kills it when the pages are touched) instead of raising.
pub(crate) const MAX_TABLE_ENTRIES: usize = 1 << 28;

/// Buffers of `step`, reused by the next call on the same thread: a decode step otherwise
/// allocates and frees its counts, slots and lengths every time (measured: ~0.1 us of a
/// 211-sequence step from Python).
#[derive(Default)]
pub(super) struct StepScratch {
    pub(super) out: StepOutput,
    pub(super) counts: Vec<usize>,
    pub(super) ids: Vec<SeqId>,
}

/// Largest scratch buffer kept between calls, in entries: a long prefill's buffers are
/// dropped rather than held by the thread for good.
pub(super) const SCRATCH_KEEP: usize = 1 << 16;

thread_local! {
    pub(super) static STEP_SCRATCH: std::cell::Cell<StepScratch> = const {
        std::cell::Cell::new(StepScratch {
            out: StepOutput { slots: Vec::new(), total_tokens: 0, cow: Vec::new(), seq_lens: Vec::new(), loads: Vec::new() },
            counts: Vec::new(),
            ids: Vec::new(),
        })
    };
}

pub(super) type I32Array<'py> = Bound<'py, PyArray1<i32>>;
pub(super) type PairArray<'py> = Bound<'py, PyArray2<i64>>;

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

/// A paged KV-cache block pool: ``num_blocks`` blocks of ``block_size`` token slots,
/// shared by one or more layer groups.
///
/// Each live sequence (a caller-chosen non-negative int64 id) has one length and, in each
/// layer group, a block table mapping logical block ``i`` (positions ``i * block_size ..
/// (i + 1) * block_size``) to a physical block id. Token ``t`` of a sequence lives, in
/// group ``g``, at slot ``table_g[t // block_size] * block_size + t % block_size``.
///
/// Without ``groups`` the pool has one full-attention group and returns per-group results
/// without a group axis: slots are int64 ``[n]``, and per-group queries
/// (:meth:`block_table`, :meth:`block_tables`, :meth:`flashinfer_tables`,
/// :meth:`stored_ranges`) read group 0. With ``groups`` (even one), slots are int64
/// ``[num_groups, n]``, one row per group, and per-group queries need ``group=``. At the
/// start of each growth (:meth:`add_sequence`, :meth:`append`, :meth:`step`) a
/// sliding-window or chunked group releases the blocks no query of that growth or a later
/// one sees; their table entries become *holes* (``pad`` in :meth:`block_tables`, absent
/// from :meth:`flashinfer_tables`), so such a group holds a bounded number of blocks
/// whatever the length. With tensor sharing, one :class:`KvCache` of ``num_blocks`` blocks
/// serves every group: a block belongs to one group at a time.
///
/// Thread-safe: calls from several Python threads are serialized by an internal lock,
/// and the GIL is released while the core works, except for calls whose work (sequences
/// plus new tokens, or blocks freed, times the groups) is below 4,096: those finish within
/// about 10 microseconds, where releasing and retaking the GIL would add a sizeable share.
///
/// With ``prefix_caching=True`` the pool caches full blocks by content, per group (the
/// prefix-caching methods below; trace replay lives in :mod:`pykvpool.prefix.replay`): a
/// full group's blocks form chains, a windowed group's blocks are cached one by one. The
/// other keyword options configure that cache and need it.
///
/// Args:
///     num_blocks: blocks in the pool, shared by all groups, ``1..=2**30``.
///     block_size: token slots per block, ``1..=65536`` tokens.
///     groups: None (default: one full-attention group, results without a group axis), or
///         the attention kind of each layer group in group order: 1 to 64
///         :class:`FullAttention`, :class:`SlidingWindow` or :class:`ChunkedAttention`
///         objects.
///     prefix_caching: cache full blocks by content (default False).
///     eviction: which idle cached block an allocation reclaims once no never-cached block
///         is free: ``"lru"`` (default) the least recently used, where a block is used when
///         it is stored, when an admission's lookup hits it and when its last holder
///         releases it; ``"fifo"`` the earliest stored; ``"lfu"`` the fewest lookup hits,
///         then the least recently used; ``"priority"`` the lowest soft-pin priority (0
///         without, see :meth:`pin_prefix`), then the least recently used. A full group's
///         blocks go tail first (only leaves of its chains); any idle windowed block may
///         go; the blocks one growth's window releases are released in logical order.
///     verify_tokens: keep each cached block's token ids (``4 * block_size`` bytes per
///         block) and compare them on a hit, so a hash collision is a miss, never wrong KV
///         (default True): a full group's chain of blocks; a windowed group's block on
///         its own ids and on the ids of every block before it, which the cache keeps as
///         its *lineage* while such a block is cached (shared by equal prefixes; at most
///         ``32 * num_blocks * block_size`` token ids: a block whose prefix would pass
///         that is not cached).
///     cow_partial_hit: when a fully cached prompt must recompute its last token, copy the
///         block holding it (a copy-on-write pair, in every group that needs it) instead of
///         recomputing the block (default False).
///     record_events: record stored/removed/cleared events for :meth:`drain_events`
///         (default False); each names its group.
///     hash_bits: keep only the low ``hash_bits`` bits of each key, ``1..=128`` (default
///         128; tests force collisions with it).
///     max_events: capacity of the event queue, in events (about 80 bytes each),
///         ``1..=2**24`` (default 100,000; needs ``record_events=True``). When it is full a
///         new event drops the oldest undrained one and counts it in
///         :attr:`CacheStats.dropped_events`, so memory stays bounded however long nobody
///         drains.
///     host_blocks: a host-memory tier below the device, in blocks, ``1..2**32 - 1``
///         (default None: no tiers; needs ``prefix_caching=True`` and full-attention groups
///         only). A cached block the device evicts goes down to it instead of being
///         forgotten (write-back), and an admission's hit continues into it past the device's
///         chain: those blocks are allocated in the device like computed ones but count as
///         cached tokens. Tiers are exclusive (a block is in the device or in one tier)
///         except for the copies ``write_through`` keeps. The tiers
///         keep decisions only until :meth:`attach_tier_storage` gives them bytes: alone
///         they model what a tiered cache would hold (trace replay, planning;
///         :meth:`tier_stats`).
///     disk_blocks: a disk tier below the host tier, in blocks, ``1..2**32 - 1`` (default
///         None; needs ``host_blocks``): the host tier's victims go down to it.
///     tier_eviction: each tier's order (default ``"lru"``): a block is used in a tier only
///         when it enters it (a hit takes it out), so ``"lru"`` and ``"fifo"`` both evict in
///         entry order and ``"lfu"`` the fewest hits the block had in the device, then
///         entry order; these evict a chain tail first. ``"s3fifo"`` resists scans: new
///         blocks enter a small FIFO (a tenth of the tier) whose blocks never hit in the
///         device leave first, unless their key left it recently (then they enter the main
///         FIFO). ``"priority"`` is refused.
///     reuse_gate: store a block below the device only once its key was seen (stored or
///         hit in the device) this many times, ``1..=255`` (default None: every evicted
///         block); the counts halve every ``4 * (host_blocks + disk_blocks)`` sightings.
///     write_through: also copy each cached block to the host tier as soon as its KV is
///         computed, not only when the device evicts it (default False: write-back). A
///         block counts as computed once its sequence's frontier passes it (its next
///         growth, :meth:`mark_computed`) or its sequence is freed. The device keeps the
///         block, so evicting it later moves no bytes; a host tier evicting such a copy
///         drops it (the device has it) rather than moving it to disk. With ``reuse_gate``
///         only blocks seen that many times are copied (SGLang's selective write-through).
///         Blocks an admission loads from a tier are not copied back. Costs a host copy of
///         every computed block, evicted or not (:meth:`tier_stats`' ``stored``).
///
/// Raises:
///     InvalidArgumentError: ``num_blocks`` not in ``1..=2**30`` or ``block_size`` not in
///         ``1..=65536``; no group or more than 64; an unknown eviction policy;
///         ``hash_bits`` not in ``1..=128``; ``max_events`` not in ``1..=2**24`` or given
///         without ``record_events=True``; cache options given without
///         ``prefix_caching=True``; ``host_blocks`` without ``prefix_caching=True`` or with
///         a sliding-window or chunked group; a tier's blocks out of range; ``disk_blocks``,
///         ``tier_eviction``, ``reuse_gate`` or ``write_through`` without ``host_blocks``;
///         an unknown or
///         ``"priority"`` ``tier_eviction``; ``reuse_gate`` not in ``1..=255``.
///     TypeError: ``groups`` is not a sequence of attention kinds, a flag not a bool, or
///         ``eviction`` not a str.
#[pyclass(name = "BlockPool", module = "pykvpool", frozen)]
pub struct PyBlockPool {
    pub(super) inner: Mutex<BlockPool>,
    /// Fixed at construction: read by getters without the lock.
    pub(super) num_blocks: usize,
    pub(super) block_size: usize,
    pub(super) groups: Vec<GroupSpec>,
    /// Built with ``groups``: results carry the group axis, per-group queries need ``group=``.
    pub(super) grouped: bool,
    pub(super) prefix_caching: bool,
    /// Blocks of the host and disk tiers, if the pool has tiers.
    pub(super) tiers: Option<(usize, Option<usize>)>,
    /// The tiers' bytes, once attached (`attach_tier_storage`). Locked after `inner`.
    pub(super) tier_io: Mutex<Option<Box<TierIo>>>,
}

impl PyBlockPool {
    /// `f` on the locked pool, under the GIL. The guard lives inside this call only, so
    /// whatever the caller does with the result (build an exception, allocate arrays)
    /// runs without the lock: a thread blocked on the pool while holding the GIL can
    /// never wait on one that needs the GIL back. `f` itself must not touch Python.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut BlockPool) -> R) -> R {
        self.locked(f)
    }

    /// [`Self::with`] with the GIL released (the lock is taken and dropped inside).
    pub(crate) fn detached<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut BlockPool) -> R + Send) -> R {
        py.detach(|| self.locked(f))
    }

    /// [`Self::with`] under the GIL when `work` is below [`INLINE_WORK`], else with the
    /// GIL released. The lock is always dropped before the GIL is retaken, so a thread
    /// waiting for the pool under the GIL cannot deadlock against one returning from
    /// `detach`.
    pub(crate) fn run<R: Send>(&self, py: Python<'_>, work: usize, f: impl FnOnce(&mut BlockPool) -> R + Send) -> R {
        if work < INLINE_WORK {
            self.locked(f)
        } else {
            py.detach(|| self.locked(f))
        }
    }

    /// `f` on the locked pool, then the tiers' moves and loads it decided carried out on
    /// the attached storage (if any) before the lock is released, so they run in the
    /// order the pool made them.
    fn locked<R>(&self, f: impl FnOnce(&mut BlockPool) -> R) -> R {
        let mut pool = lock(&self.inner);
        let r = f(&mut pool);
        if let Some(io) = lock(&self.tier_io).as_deref_mut() {
            io.carry_out(&mut pool);
        }
        r
    }

    /// Work of a call growing `seqs` sequences by `tokens` tokens, in every group.
    pub(super) fn work(&self, seqs: usize, tokens: usize) -> usize {
        seqs.saturating_add(tokens).saturating_mul(self.groups.len())
    }

    /// The group a per-group query reads: `group`, required on a pool built with
    /// ``groups``; 0 (the only one) by default on one built without. Checked without the
    /// lock: groups never change.
    pub(crate) fn group(&self, py: Python<'_>, group: Option<usize>) -> PyResult<usize> {
        let n = self.groups.len();
        match group {
            None if self.grouped => {
                Err(invalid(py, format!("group: this pool has layer groups; pass group= (0..{n})")))
            }
            None => Ok(0),
            Some(g) if g < n => Ok(g),
            Some(g) => Err(invalid(py, format!("group must be in 0..{n} (this pool has {n} groups), got {g}"))),
        }
    }

    /// The slots of a call's new tokens (moved, not copied): int64 ``[n]`` without
    /// ``groups``, ``[num_groups, n]`` with.
    pub(super) fn slots<'py>(&self, py: Python<'py>, out: &mut StepOutput) -> PyResult<Bound<'py, PyAny>> {
        let slots = std::mem::take(&mut out.slots);
        if !self.grouped {
            return Ok(PyArray1::from_vec(py, slots).into_any());
        }
        let (g, n) = (self.groups.len(), out.total_tokens);
        let arr = Array2::from_shape_vec((g, n), slots)
            .map_err(|e| to_py(py, KvError::Invariant(format!("slots of {g} groups x {n} tokens: {e}"))))?;
        Ok(arr.into_pyarray(py).into_any())
    }
}
