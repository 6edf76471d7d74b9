//! The `HybridPool` Python class: its state, how a call reaches the core (the lock, the
//! GIL rule) and the array helpers its methods share. Its one `#[pymethods]` block is in
//! [`super::methods`].

use std::sync::Mutex;

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2};
use pyo3::prelude::*;

use crate::bindings::errors::{invalid, to_py};
use crate::error::KvError;
use crate::bindings::pool::class::{lock, INLINE_WORK};
use crate::pool::{GroupSpec, BlockPool, StepOutput};

/// A block pool whose sequences have one block table per layer group (attention kind),
/// all groups sharing ``num_blocks`` blocks of ``block_size`` token slots.
///
/// Positions are logical: a sequence has one length, and in every group logical block
/// ``i`` holds positions ``i * block_size .. (i + 1) * block_size``. At the start of each
/// growth (:meth:`add_sequence`, :meth:`append`, :meth:`step`) a sliding-window or chunked
/// group releases the blocks no query of that growth or a later one sees; their table
/// entries become *holes* (``pad`` in :meth:`block_tables`, absent from
/// :meth:`flashinfer_tables`), so such a group holds a bounded number of blocks whatever
/// the length. Token ``t`` of a sequence lives, in group ``g``, at slot
/// ``table_g[t // block_size] * block_size + t % block_size``; the slots of new tokens come
/// back as int64 ``[num_groups, n]`` arrays, one row per group.
///
/// With tensor sharing, one :class:`KvCache` of ``num_blocks`` blocks serves every group:
/// a block belongs to one group at a time, so the layers of group ``g`` read and write the
/// cache's layers at the blocks of group ``g``'s tables.
///
/// Thread-safe: calls from several Python threads are serialized by an internal lock, and
/// the GIL is released while the core works, except for calls whose work (sequences plus
/// new tokens, or blocks) is below 4,096.
///
/// Args:
///     num_blocks: blocks in the pool, shared by all groups, ``1..=2**30``.
///     block_size: token slots per block, ``1..=65536`` tokens.
///     groups: the attention kind of each layer group, in group order: 1 to 64
///         :class:`FullAttention`, :class:`SlidingWindow` or :class:`ChunkedAttention`
///         objects.
///     prefix_caching: cache full blocks by content, per group (default False), in the
///         same prefix cache as :class:`BlockPool`'s: a full group's blocks form chains, a
///         windowed group's blocks are verified one by one; the other keyword options
///         configure that cache and need it.
///     eviction: which idle cached block an allocation reclaims once no never-cached block
///         is free: ``"lru"`` (default) the least recently used, ``"fifo"`` the earliest
///         stored, ``"lfu"`` the least often hit, then the least recently used,
///         ``"priority"`` the lowest soft-pin priority (see :meth:`pin_prefix`), then the
///         least recently used. A block is used when it is stored, taken by a hit and
///         released by its last holder; the blocks one growth's window releases are
///         released in logical order, so the earlier one counts as used first (its last
///         query came first). A full group's blocks go tail first (only leaves of its
///         chains); any idle windowed block may go.
///     verify_tokens: as for :class:`BlockPool` (default True): a windowed group's block is
///         compared on its own token ids, a full group's on its chain's.
///     record_events: as for :class:`BlockPool` (default False); each event names its
///         group.
///     hash_bits: as for :class:`BlockPool` (default 128).
///     max_events: as for :class:`BlockPool` (default 100,000; needs
///         ``record_events=True``).
///
/// Raises:
///     InvalidArgumentError: ``num_blocks`` not in ``1..=2**30``, ``block_size`` not in
///         ``1..=65536``, no group or more than 64; an unknown eviction policy;
///         ``hash_bits`` not in ``1..=128``; ``max_events`` not in ``1..=2**24`` or given
///         without ``record_events=True``; cache options given without
///         ``prefix_caching=True``.
///     TypeError: ``groups`` is not a sequence of attention kinds, ``prefix_caching``
///         or a flag not a bool, or ``eviction`` not a str.
#[pyclass(name = "HybridPool", module = "pykvpool", frozen)]
pub struct PyHybridPool {
    pub(super) inner: Mutex<BlockPool>,
    /// Fixed at construction: read without the lock.
    pub(super) num_blocks: usize,
    pub(super) block_size: usize,
    pub(super) groups: Vec<GroupSpec>,
    pub(super) prefix_caching: bool,
}

impl PyHybridPool {
    /// `f` on the locked pool, under the GIL. The guard lives inside this call only, so
    /// whatever the caller does with the result (build an exception, allocate arrays) runs
    /// without the lock. `f` itself must not touch Python.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut BlockPool) -> R) -> R {
        f(&mut lock(&self.inner))
    }

    /// [`Self::with`] with the GIL released (the lock is taken and dropped inside).
    pub(super) fn detached<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut BlockPool) -> R + Send) -> R {
        py.detach(|| f(&mut lock(&self.inner)))
    }

    /// [`Self::with`] when `work` is below [`INLINE_WORK`], else [`Self::detached`].
    pub(super) fn run<R: Send>(&self, py: Python<'_>, work: usize, f: impl FnOnce(&mut BlockPool) -> R + Send) -> R {
        if work < INLINE_WORK {
            self.with(f)
        } else {
            self.detached(py, f)
        }
    }

    /// A `group` index of this pool (checked without the lock: groups never change).
    pub(super) fn group(&self, py: Python<'_>, g: usize) -> PyResult<usize> {
        if g >= self.groups.len() {
            let n = self.groups.len();
            return Err(invalid(py, format!("group must be in 0..{n} (this pool has {n} groups), got {g}")));
        }
        Ok(g)
    }

    /// Work of a call growing `seqs` sequences by `tokens` tokens, in every group.
    pub(super) fn work(&self, seqs: usize, tokens: usize) -> usize {
        seqs.saturating_add(tokens).saturating_mul(self.groups.len())
    }
}

/// The slots of a call's new tokens as int64 `[num_groups, total_tokens]` (moved, not
/// copied).
pub(super) fn slots_array<'py>(py: Python<'py>, groups: usize, out: &mut StepOutput) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let slots = std::mem::take(&mut out.slots);
    let n = out.total_tokens;
    let arr = Array2::from_shape_vec((groups, n), slots)
        .map_err(|e| to_py(py, KvError::Invariant(format!("slots of {groups} groups x {n} tokens: {e}"))))?;
    Ok(arr.into_pyarray(py))
}
