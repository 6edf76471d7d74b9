# Type stubs of the compiled core, checked against the built module by mypy.stubtest
# (tests/package/test_stubs.py). Every docstring here is also the object's run-time __doc__:
# tests/docsync.py copies it into rust/bindings/*.rs as /// lines. Edit it here, run
# `python tests/docsync.py --write` and rebuild; tests/package/test_docs.py checks both.
"""The compiled core of pykvpool (Rust, PyO3): the block pool and its prefix cache, KV
storage, the decode-attention kernels and the serving simulator. Everything public is
re-exported by :mod:`pykvpool`; import it from there.

Units: *tokens* and *blocks* unless a name says *bytes*. Integer arguments named ``*_ids``
or ``num_tokens`` accept any 1-D integer numpy array (any integer dtype, any strides) or a
Python sequence of ints. Scalar integer arguments accept Python and numpy ints; floats,
bools, strings and ints outside int64 raise :class:`InvalidArgumentError` (not ``TypeError``),
as do arrays of those. Every rejected value raises :class:`InvalidArgumentError` naming
the argument; an object of another type where a non-integer is expected (a ``cache`` that
is not a :class:`KvCache`, a ``dtype`` that is not a str) raises ``TypeError``. A failed
call leaves the pool, the cache and the caller's arrays unchanged.

Float32 inputs (``q``, ``k``, ``v``; numpy arrays or CPU tensors through DLPack) are read
in place when C-contiguous (no copy, the GIL released while the call reads them); other
layouts, and memory inside a :class:`KvCache`, are copied in logical order first (a
broadcast, zero-stride input only up to ``2**26`` elements: beyond, the copy would be the
one allocation the caller's memory does not bound, and :class:`InvalidArgumentError`
names the argument). Like the cache's views, an input read in place must not be written by
another thread while the call runs. A CPU torch tensor is read as torch's own ``.numpy()``
would read it, and refused where that refuses (:class:`InvalidArgumentError` naming the
argument): a tensor that requires grad (pass ``t.detach()``), or one whose negative or
conjugate bit is set (``t.resolve_neg()``, ``t.resolve_conj()``); a tensor on another
device is refused too.
"""

from collections.abc import Sequence
import os
from typing import Any, Final, Literal, SupportsIndex, TypeAlias, overload

from typing_extensions import final

import numpy as np
import numpy.typing as npt

from pykvpool._dlpack import DLPackArray

__version__: Final[str]
"""The package version, e.g. ``"0.1.0"``."""
__all__ = [
    "__version__",
    "BlockPool",
    "BlockTableBuffer",
    "CacheStats",
    "ChunkedAttention",
    "DuplicateSequenceError",
    "EVENT_ALL_CLEARED",
    "EVENT_REMOVED",
    "EVENT_STORED",
    "EVICTION_POLICIES",
    "TIER_EVICTION_POLICIES",
    "FullAttention",
    "InvalidArgumentError",
    "InvariantError",
    "KernelTuning",
    "KV_DTYPES",
    "KvPoolError",
    "PoolExhaustedError",
    "PoolStats",
    "SlidingWindow",
    "UnknownSequenceError",
    "KvCache",
    "cpu_features",
    "decode_attention",
    "decode_attention_paged",
    "get_num_threads",
    "kernel_paths",
    "peak_flops",
    "prefill_attention",
    "prefill_attention_paged",
    "read_bandwidth",
    "set_num_threads",
    "run_simulation",
    "synthesize_workload",
    "SIM_MAX_REQUESTS",
    "SIM_MAX_REQUEST_TOKENS",
    "SIM_MAX_STEP_TOKENS",
    "SIM_MAX_REPLICAS",
]

# An array of another library exporting DLPack (a CPU torch tensor): read through a numpy
# view of its memory, without a copy; another device, a tensor that requires grad and one
# with its negative or conjugate bit set are refused.
_DLPack: TypeAlias = DLPackArray

_IntArrayLike: TypeAlias = npt.NDArray[np.integer[Any]] | Sequence[SupportsIndex] | _DLPack
_I32Array: TypeAlias = npt.NDArray[np.int32]
_I64Array: TypeAlias = npt.NDArray[np.int64]
_U64Array: TypeAlias = npt.NDArray[np.uint64]
_KeysLike: TypeAlias = npt.NDArray[np.integer[Any]] | Sequence[SupportsIndex]

# ---------------------------------------------------------------------------- errors

class KvPoolError(Exception):
    """Base class of every pykvpool error: ``except pykvpool.KvPoolError`` catches them all."""

class PoolExhaustedError(KvPoolError, MemoryError):
    """Not enough free blocks for the whole operation; nothing was changed.

    Also a ``MemoryError``. Attributes: ``requested``, the blocks the operation needed, and
    ``free``, the blocks that were free (both in blocks).
    """

    requested: int
    free: int

class UnknownSequenceError(KvPoolError, KeyError):
    """A sequence id that is not live in the pool; nothing was changed.

    Also a ``KeyError``. Attribute: ``seq_id``, the id.
    """

    seq_id: int

class InvalidArgumentError(KvPoolError, ValueError):
    """A rejected argument value (a size, count, shape, dtype, index or option); nothing was
    changed.

    Also a ``ValueError``. The message names the argument.
    """

class DuplicateSequenceError(InvalidArgumentError):
    """A sequence id that is already live (the target of an add or a fork); nothing was changed.

    An :class:`InvalidArgumentError` (so also a ``ValueError``). Attribute: ``seq_id``, the id.
    """

    seq_id: int

class InvariantError(KvPoolError, AssertionError):
    """An internal consistency check failed: always a pykvpool bug, please report it.

    Also an ``AssertionError``. :meth:`BlockPool.check_invariants` raises it on purpose; any
    other call raising it has found a bug.
    """

# ------------------------------------------------------------------------------ pool

@final
class PoolStats:
    """Occupancy snapshot of a :class:`BlockPool`, taken by :meth:`BlockPool.stats`.

    Counts are in blocks and tokens: totals over the pool, and per-group lists with one
    entry per layer group in group order. The snapshot does not follow later changes of the
    pool.
    """

    @property
    def block_size(self) -> int:
        """Token slots per block (tokens)."""
    @property
    def total_blocks(self) -> int:
        """Blocks in the pool."""
    @property
    def free_blocks(self) -> int:
        """Blocks an allocation can take now."""
    @property
    def used_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
    @property
    def num_seqs(self) -> int:
        """Live sequences."""
    @property
    def logical_tokens(self) -> int:
        """Sum of sequence lengths, in tokens (a forked token counts once per sequence)."""
    @property
    def stored_tokens(self) -> int:
        """Distinct filled token slots in used blocks, in tokens (a shared token counts once)."""
    @property
    def shared_blocks(self) -> int:
        """Used blocks referenced by more than one sequence."""
    @property
    def cow_copies(self) -> int:
        """Copy-on-write block copies since the pool was created (blocks)."""
    @property
    def empty_slots(self) -> int:
        """Unfilled token slots in used blocks, in tokens: ``used_blocks * block_size -
        stored_tokens``.
        """
    @property
    def utilization(self) -> float:
        """``stored_tokens / (used_blocks * block_size)``, a fraction in 0..1; 1.0 when no block is
        used.
        """
    @property
    def idle_cached_blocks(self) -> int:
        """Cached blocks no sequence holds (evictable unless pinned; counted in
        ``free_blocks`` when evictable).
        """
    @property
    def group_blocks(self) -> list[int]:
        """Per group: distinct blocks its tables hold (blocks)."""
    @property
    def group_stored_tokens(self) -> list[int]:
        """Per group: distinct filled token slots of those blocks (tokens; a shared token
        counts once).
        """
    @property
    def group_holes(self) -> list[int]:
        """Per group: hole entries (released or never stored logical blocks) summed over
        sequences (blocks).
        """
    def as_dict(self) -> dict[str, int | float | list[int]]:
        """All fields as a dict.

        Returns:
            ``{name: value}`` for every property of this class: ints, ``utilization`` a
            float, and the per-group fields lists of ints.
        """

@final
class BlockPool:
    """A paged KV-cache block pool: ``num_blocks`` blocks of ``block_size`` token slots,
    shared by one or more layer groups.

    Each live sequence (a caller-chosen non-negative int64 id) has one length and, in each
    layer group, a block table mapping logical block ``i`` (positions ``i * block_size ..
    (i + 1) * block_size``) to a physical block id. Token ``t`` of a sequence lives, in
    group ``g``, at slot ``table_g[t // block_size] * block_size + t % block_size``.

    Without ``groups`` the pool has one full-attention group and returns per-group results
    without a group axis: slots are int64 ``[n]``, and per-group queries
    (:meth:`block_table`, :meth:`block_tables`, :meth:`flashinfer_tables`,
    :meth:`stored_ranges`) read group 0. With ``groups`` (even one), slots are int64
    ``[num_groups, n]``, one row per group, and per-group queries need ``group=``. At the
    start of each growth (:meth:`add_sequence`, :meth:`append`, :meth:`step`) a
    sliding-window or chunked group releases the blocks no query of that growth or a later
    one sees; their table entries become *holes* (``pad`` in :meth:`block_tables`, absent
    from :meth:`flashinfer_tables`), so such a group holds a bounded number of blocks
    whatever the length. With tensor sharing, one :class:`KvCache` of ``num_blocks`` blocks
    serves every group: a block belongs to one group at a time.

    Thread-safe: calls from several Python threads are serialized by an internal lock,
    and the GIL is released while the core works, except for calls whose work (sequences
    plus new tokens, or blocks freed, times the groups) is below 4,096: those finish within
    about 10 microseconds, where releasing and retaking the GIL would add a sizeable share.

    With ``prefix_caching=True`` the pool caches full blocks by content, per group (the
    prefix-caching methods below; trace replay lives in :mod:`pykvpool.prefix.replay`): a
    full group's blocks form chains, a windowed group's blocks are cached one by one. The
    other keyword options configure that cache and need it.

    Args:
        num_blocks: blocks in the pool, shared by all groups, ``1..=2**30``.
        block_size: token slots per block, ``1..=65536`` tokens.
        groups: None (default: one full-attention group, results without a group axis), or
            the attention kind of each layer group in group order: 1 to 64
            :class:`FullAttention`, :class:`SlidingWindow` or :class:`ChunkedAttention`
            objects.
        prefix_caching: cache full blocks by content (default False).
        eviction: which idle cached block an allocation reclaims once no never-cached block
            is free: ``"lru"`` (default) the least recently used, where a block is used when
            it is stored, when an admission's lookup hits it and when its last holder
            releases it; ``"fifo"`` the earliest stored; ``"lfu"`` the fewest lookup hits,
            then the least recently used; ``"priority"`` the lowest soft-pin priority (0
            without, see :meth:`pin_prefix`), then the least recently used. A full group's
            blocks go tail first (only leaves of its chains); any idle windowed block may
            go; the blocks one growth's window releases are released in logical order.
        verify_tokens: keep each cached block's token ids (``4 * block_size`` bytes per
            block) and compare them on a hit, so a hash collision is a miss, never wrong KV
            (default True): a full group's chain of blocks; a windowed group's block on
            its own ids and on the ids of every block before it, which the cache keeps as
            its *lineage* while such a block is cached (shared by equal prefixes; at most
            ``32 * num_blocks * block_size`` token ids: a block whose prefix would pass
            that is not cached).
        cow_partial_hit: when a fully cached prompt must recompute its last token, copy the
            block holding it (a copy-on-write pair, in every group that needs it) instead of
            recomputing the block (default False).
        record_events: record stored/removed/cleared events for :meth:`drain_events`
            (default False); each names its group.
        hash_bits: keep only the low ``hash_bits`` bits of each key, ``1..=128`` (default
            128; tests force collisions with it).
        max_events: capacity of the event queue, in events (about 80 bytes each),
            ``1..=2**24`` (default 100,000; needs ``record_events=True``). When it is full a
            new event drops the oldest undrained one and counts it in
            :attr:`CacheStats.dropped_events`, so memory stays bounded however long nobody
            drains.
        host_blocks: a host-memory tier below the device, in blocks, ``1..2**32 - 1``
            (default None: no tiers; needs ``prefix_caching=True`` and full-attention groups
            only). A cached block the device evicts goes down to it instead of being
            forgotten (write-back), and an admission's hit continues into it past the device's
            chain: those blocks are allocated in the device like computed ones but count as
            cached tokens. Tiers are exclusive (a block is in the device or in one tier)
            except for the copies ``write_through`` keeps. The tiers
            keep decisions only until :meth:`attach_tier_storage` gives them bytes: alone
            they model what a tiered cache would hold (trace replay, planning;
            :meth:`tier_stats`).
        disk_blocks: a disk tier below the host tier, in blocks, ``1..2**32 - 1`` (default
            None; needs ``host_blocks``): the host tier's victims go down to it.
        tier_eviction: each tier's order (default ``"lru"``): a block is used in a tier only
            when it enters it (a hit takes it out), so ``"lru"`` and ``"fifo"`` both evict in
            entry order and ``"lfu"`` the fewest hits the block had in the device, then
            entry order; these evict a chain tail first. ``"s3fifo"`` resists scans: new
            blocks enter a small FIFO (a tenth of the tier) whose blocks never hit in the
            device leave first, unless their key left it recently (then they enter the main
            FIFO). ``"priority"`` is refused.
        reuse_gate: store a block below the device only once its key was seen (stored or
            hit in the device) this many times, ``1..=255`` (default None: every evicted
            block); the counts halve every ``4 * (host_blocks + disk_blocks)`` sightings.
        write_through: also copy each cached block to the host tier as soon as its KV is
            computed, not only when the device evicts it (default False: write-back). A
            block counts as computed once its sequence's frontier passes it (its next
            growth, :meth:`mark_computed`) or its sequence is freed. The device keeps the
            block, so evicting it later moves no bytes; a host tier evicting such a copy
            drops it (the device has it) rather than moving it to disk. With ``reuse_gate``
            only blocks seen that many times are copied (SGLang's selective write-through).
            Blocks an admission loads from a tier are not copied back. Costs a host copy of
            every computed block, evicted or not (:meth:`tier_stats`' ``stored``).

    Raises:
        InvalidArgumentError: ``num_blocks`` not in ``1..=2**30`` or ``block_size`` not in
            ``1..=65536``; no group or more than 64; an unknown eviction policy;
            ``hash_bits`` not in ``1..=128``; ``max_events`` not in ``1..=2**24`` or given
            without ``record_events=True``; cache options given without
            ``prefix_caching=True``; ``host_blocks`` without ``prefix_caching=True`` or with
            a sliding-window or chunked group; a tier's blocks out of range; ``disk_blocks``,
            ``tier_eviction``, ``reuse_gate`` or ``write_through`` without ``host_blocks``;
            an unknown or
            ``"priority"`` ``tier_eviction``; ``reuse_gate`` not in ``1..=255``.
        TypeError: ``groups`` is not a sequence of attention kinds, a flag not a bool, or
            ``eviction`` not a str.
    """

    def __new__(
        cls,
        num_blocks: int,
        block_size: int,
        groups: Sequence[_GroupKind] | None = None,
        *,
        prefix_caching: bool = False,
        eviction: str | None = None,
        verify_tokens: bool | None = None,
        cow_partial_hit: bool | None = None,
        record_events: bool | None = None,
        hash_bits: int | None = None,
        max_events: int | None = None,
        host_blocks: int | None = None,
        disk_blocks: int | None = None,
        tier_eviction: str | None = None,
        reuse_gate: int | None = None,
        write_through: bool | None = None,
    ) -> BlockPool: ...
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, shared by all groups."""
    @property
    def block_size(self) -> int:
        """Token slots per block (tokens)."""
    @property
    def groups(self) -> tuple[_GroupKind, ...]:
        """The attention kind of each group, in group order (one :class:`FullAttention` for a
        pool built without ``groups``).
        """
    @property
    def num_groups(self) -> int:
        """Layer groups (attention kinds) of the pool."""
    @property
    def prefix_caching(self) -> bool:
        """Whether this pool caches prefixes (``prefix_caching=True``)."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: free blocks plus idle cached blocks that may be
        evicted (not hard-pinned).
        """
    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence (idle cached blocks are not used)."""
    @property
    def num_seqs(self) -> int:
        """Live sequences."""
    def __len__(self) -> int: ...
    def __contains__(self, seq: object, /) -> bool: ...
    def blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``, the free
        blocks a new sequence with a prompt of ``num_tokens`` tokens needs (without prefix-cache
        hits). Changes nothing.

        Args:
            num_tokens: tokens, >= 0.

        Returns:
            A number of blocks.

        Raises:
            InvalidArgumentError: a negative, non-integer or bool count.
        """
    def add_sequence(self, seq_id: int, prompt_len: int = 0) -> _I64Array:
        """Add sequence ``seq_id`` holding ``prompt_len`` tokens, in ``ceil(prompt_len /
        block_size)`` new blocks in every group.

        Args:
            seq_id: the new sequence's id, a non-negative int64.
            prompt_len: tokens it holds now (default 0: an empty sequence), at most ``2**27`` in
                one call (add longer prompts in chunks with :meth:`append`).

        Returns:
            int64 ``[prompt_len]`` (``[num_groups, prompt_len]`` with ``groups``): the slot of
            each prompt token, in order.

        Raises:
            DuplicateSequenceError: ``seq_id`` is live.
            PoolExhaustedError: fewer free blocks than the prompt needs in all groups together
                (nothing changed).
            InvalidArgumentError: a negative id or length, or more than ``2**27`` tokens.
        """
    def append(self, seq_id: int, num_tokens: int = 1) -> tuple[_I64Array, _I64Array]:
        """Append ``num_tokens`` tokens to ``seq_id``, allocating blocks as needed.

        If the last block is partly filled and shared (after :meth:`fork`), the sequence first
        gets a private copy of it (copy-on-write).

        Args:
            seq_id: a live sequence.
            num_tokens: tokens to add (default 1), at most ``2**27`` in one call.

        Returns:
            ``(slots, cow)``: int64 ``[num_tokens]`` slots of the new tokens, and an int64
            ``[k, 2]`` array of ``(src, dst)`` block pairs whose filled slots the caller must
            copy before writing (k <= 1).

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            PoolExhaustedError: not enough free blocks (nothing was appended).
            InvalidArgumentError: a negative count, or more than ``2**27`` tokens.
        """
    def step(
        self, seq_ids: _IntArrayLike, num_tokens: _IntArrayLike | int | None = None
    ) -> tuple[_I64Array, _I64Array, _I32Array]:
        """One scheduler step: append ``num_tokens[i]`` tokens to ``seq_ids[i]`` for every i, in
        every group, atomically (windowed groups first release what no query from now on
        sees; those blocks count as free for the step).

        Args:
            seq_ids: ``n`` distinct live sequence ids.
            num_tokens: tokens to append to each sequence: ``n`` counts, one int for all, or
                None for 1 token each (a decode step); at most ``2**27`` tokens in total.

        Returns:
            ``(slot_mapping, cow_pairs, seq_lens)``: int64 slots of all new tokens in batch
            order (``sum(num_tokens)`` of them; ``[num_groups, sum(num_tokens)]`` with
            ``groups``, row ``g`` for group ``g``); int64 ``[k, 2]`` copy-on-write ``(src, dst)``
            block pairs to copy before writing; int32 ``[n]`` length of each sequence after the
            step, in tokens.

        Raises:
            PoolExhaustedError: the whole step needs more blocks than are free (nothing was
                appended to any sequence).
            UnknownSequenceError: an id is not live.
            InvalidArgumentError: duplicate ids, negative counts, ``num_tokens`` of another
                length than ``seq_ids``, non-integer or non-1-D arrays, more than ``2**27``
                tokens in total.
        """
    def fork(self, parent: int, child: int) -> None:
        """Create ``child`` sharing every block of ``parent`` (refcounts go up; nothing is copied).

        The first append to either sequence that writes into their shared, partly filled last
        block copies that block first (copy-on-write).

        Args:
            parent: a live sequence.
            child: the new sequence's id, a non-negative int64.

        Raises:
            UnknownSequenceError: ``parent`` is not live.
            DuplicateSequenceError: ``child`` is live.
            InvalidArgumentError: a negative id.
        """
    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Drop the last ``num_tokens`` tokens of ``seq_id``; blocks left empty lose this
        sequence's reference (freed at zero). In a windowed group the rollback stays within
        what the group still holds: the query at the new length must see only positions
        whose KV the group holds. Positions the window rule released are not held, and
        neither are the positions of a block taken at a hole (a growth from a length whose
        block was released) before the growth that took it.

        Args:
            seq_id: a live sequence.
            num_tokens: tokens to drop, at most the sequence's length.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            InvalidArgumentError: ``num_tokens`` is negative or exceeds the length, or the
                query at the new length would see a position a windowed group does not
                hold (nothing is dropped).
        """
    def rewind(self, seq_id: int, num_tokens: int) -> _I64Array | list[_I64Array]:
        """Roll ``seq_id`` back to ``num_tokens`` tokens (at most its length), also past
        what its windowed groups still hold, which :meth:`truncate` refuses: every group
        keeps the blocks it holds that a query at the new length needs, allocates fresh
        blocks (never cached) where such a block was released (or holds no K/V from its
        start: taken at a hole), and frees the rest. The frontier becomes the new length.
        The fresh blocks' K/V is the caller's to write (a copy it kept, or computed again)
        before anything attends to them; their ids are in :meth:`block_table` at the
        returned logical indices. A video stream going back to an earlier frame is the
        use (:meth:`pykvpool.video.VideoCache.rewind`).

        Args:
            seq_id: a live sequence.
            num_tokens: the sequence's length after the rewind, in tokens, at most its
                length.

        Returns:
            The logical blocks (indices into the block table) allocated afresh, int64,
            ascending: one array for a pool built without ``groups``, else a list of one
            array per group.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            InvalidArgumentError: ``num_tokens`` is negative or exceeds the length.
            PoolExhaustedError: too few free blocks, counting those the rewind frees
                (nothing changed).
        """
    def free(self, seq_id: int) -> None:
        """Remove ``seq_id``; each of its blocks loses a reference and is freed at zero (with
        prefix caching, a cached block stays cached, idle, until an allocation evicts it).

        Args:
            seq_id: a live sequence.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            InvalidArgumentError: a negative id.
        """
    def free_batch(self, seq_ids: _IntArrayLike) -> None:
        """Free several sequences atomically: all ids are checked before any is freed.

        Args:
            seq_ids: distinct live sequence ids.

        Raises:
            UnknownSequenceError: an id is not live (nothing was freed).
            InvalidArgumentError: an id appears twice, or a negative or non-integer id.
        """
    def mark_computed(self, seq_ids: _IntArrayLike) -> None:
        """Record that every query up to the current length of each of ``seq_ids`` has been
        computed: each sequence's frontier becomes its length, and every windowed or chunked
        group releases now the blocks the release rule releases for a next query at that
        length (the blocks the next growth would release first; never the sinks). A video
        chunk committed as history gives back at once the frames that left the window.

        Atomic and idempotent: all ids are checked before anything changes, and a second
        call (or an id listed twice) releases nothing more. A later :meth:`truncate` may not
        roll back into what it released.

        Args:
            seq_ids: live sequence ids (an empty list is a no-op).

        Raises:
            UnknownSequenceError: an id is not live (nothing changed).
            InvalidArgumentError: a negative or non-integer id, or not a 1-D list or array.
        """
    def blocks_needed(self, seq_id: int, num_tokens: int = 1) -> int:
        """Blocks that appending ``num_tokens`` tokens to ``seq_id`` would allocate now, the
        copy-on-write copy of a shared last block included. Changes nothing.

        Args:
            seq_id: a live sequence.
            num_tokens: tokens that would be appended (default 1).

        Returns:
            A number of blocks.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            InvalidArgumentError: a negative id or count.
        """
    def seq_len(self, seq_id: int) -> int:
        """Length of ``seq_id``, in tokens.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            InvalidArgumentError: a negative id.
        """
    def frontier(self, seq_id: int) -> int:
        """Position of the first query of the latest growth of ``seq_id`` (its length before that
        growth), in tokens: 0 for a new sequence, the cached length after a prefix-cache hit.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            InvalidArgumentError: a negative id.
        """
    def seq_ids(self) -> _I64Array:
        """Live sequence ids.

        Returns:
            int64 ``[num_seqs]``, ascending.
        """
    def block_table(self, seq_id: int, *, group: int | None = None) -> _I32Array:
        """The block table of ``seq_id`` in ``group`` (a copy).

        Args:
            seq_id: a live sequence.
            group: a group index, ``0..num_groups``; required with ``groups``, 0 without.

        Returns:
            int32 ``[ceil(seq_len / block_size)]``: the physical block of each logical block,
            -1 for a hole (a block the group released or never stored).

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            InvalidArgumentError: a negative id, ``group`` out of range or missing.
        """
    def block_tables(
        self, seq_ids: _IntArrayLike, max_blocks: int | None = None, pad: int = ..., *, group: int | None = None
    ) -> _I32Array:
        """Block tables of ``seq_ids`` in ``group`` as one padded matrix.

        Args:
            seq_ids: live sequence ids, one row each.
            max_blocks: columns (blocks); default the longest table.
            pad: the value of holes and past each table's end, an int32 (default -1).
            group: a group index, ``0..num_groups``; required with ``groups``, 0 without.

        Returns:
            int32 ``[len(seq_ids), max_blocks]``: logical block ``i`` of ``seq_ids[r]`` in row
            ``r``, column ``i``.

        Raises:
            UnknownSequenceError: an id is not live.
            InvalidArgumentError: ``group`` out of range or missing, a table longer than
                ``max_blocks``, more than ``2**28`` entries, or ``pad`` outside int32.
        """
    def flashinfer_tables(
        self, seq_ids: _IntArrayLike, *, group: int | None = None
    ) -> tuple[_I32Array, ...]:
        """The tables of ``seq_ids`` in ``group`` in FlashInfer's paged layout (what
        :func:`decode_attention_paged` takes): each sequence's stored pages in logical order,
        the sink pages first, then the contiguous window run.

        Page ``j`` of sequence ``i`` is logical block ``j`` when ``j < s_i``, else
        ``kv_page_start[i] + j - s_i``, with ``s_i = min(ceil(sink_tokens / block_size),
        kv_page_start[i])``. A full-attention group has no holes: its ``kv_page_start`` is 0.

        Args:
            seq_ids: live sequence ids.
            group: a group index, ``0..num_groups``; required with ``groups``, 0 without.

        Returns:
            ``(kv_indptr, kv_indices, kv_last_page_len)`` without ``groups``, and
            ``kv_page_start`` fourth with, all int32: ``kv_indptr`` ``[n + 1]`` offsets into
            ``kv_indices`` ``[nnz]``, the stored block ids; ``kv_last_page_len`` ``[n]``, the
            tokens of each sequence's last logical block, in ``1..=block_size`` (0 for a
            sequence without pages); ``kv_page_start`` ``[n]``, the logical block of the first
            page after the sink pages (blocks).

        Raises:
            UnknownSequenceError: an id is not live.
            InvalidArgumentError: a negative or non-integer id, ``group`` out of range or
                missing.
        """
    def stored_ranges(self, seq_id: int, *, group: int | None = None) -> list[tuple[int, int]]:
        """The logical token ranges of ``seq_id`` whose K/V ``group`` stores.

        Args:
            seq_id: a live sequence.
            group: a group index, ``0..num_groups``; required with ``groups``, 0 without.

        Returns:
            ``[(start, end), ...]``: sorted, merged half-open ranges of positions (tokens).

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            InvalidArgumentError: a negative id, ``group`` out of range or missing.
        """
    def refcount(self, block_id: int) -> int:
        """References to physical block ``block_id``: the sequences holding it (0 for a free or an
        idle cached block).

        Raises:
            InvalidArgumentError: ``block_id`` outside ``0..num_blocks``.
        """
    def stats(self) -> PoolStats:
        """Occupancy snapshot in blocks and tokens, totals and per group; O(table entries).

        Returns:
            A :class:`PoolStats`.
        """
    def check_invariants(self) -> None:
        """Verify the bookkeeping, changing nothing: refcounts against the tables of every group,
        the free list, block accounting, each block in one group, table lengths and the hole
        pattern of each table against the release rule; with prefix caching also the cache: each key maps to one
        block and back, idle cached blocks have refcount 0 and are queued for eviction exactly
        when they are unpinned leaves, no free-list block is cached, parents outlive children.

        Raises:
            InvariantError: the first broken invariant, named (a pykvpool bug).
        """

    # -- prefix caching (pools built with prefix_caching=True; others raise
    # -- InvalidArgumentError from every method below)
    def add_sequence_tokens(
        self, seq_id: int, token_ids: _IntArrayLike, extra_key: int | None = None
    ) -> tuple[int, _I64Array, _I64Array]:
        """Admit ``seq_id`` with its prompt token ids, reusing the longest cached prefix of full
        blocks.

        At least one prompt token is always left to compute (its logits are needed), so a fully
        cached prompt reports one token fewer than its length as cached.

        Args:
            seq_id: the new sequence's id, a non-negative int64.
            token_ids: the prompt's token ids (any integer dtype, each in ``0..2**32``).
            extra_key: ``0..2**63``, mixed into every block's key (an adapter id, a tenant salt):
                prompts with different extra keys never share blocks (default: none).

        Returns:
            ``(cached_tokens, slots, cow)``: the number of leading prompt tokens whose KV is
            reused; the int64 slots of the remaining ``len(token_ids) - cached_tokens`` tokens;
            an int64 ``[k, 2]`` array of ``(src, dst)`` blocks to copy before computing (k <= 1,
            only with ``cow_partial_hit``).

        Raises:
            DuplicateSequenceError: ``seq_id`` is live.
            PoolExhaustedError: not enough free or evictable blocks (nothing changed).
            InvalidArgumentError: a negative id, a token id outside ``0..2**32``, an
                ``extra_key`` outside ``0..2**63``, a non-integer or non-1-D array, or caching
                off.
        """
    def add_sequence_block_keys(
        self, seq_id: int, block_keys: _KeysLike, prompt_len: int
    ) -> tuple[int, _I64Array]:
        """Admit ``seq_id`` from a trace that gives block ids instead of tokens (Mooncake's
        ``hash_ids``), reusing the longest cached prefix.

        Each key stands for one block's chained content (equal keys = equal content, prefix
        and fill). The last key may stand for a partly filled block (``prompt_len %
        block_size`` tokens): it is cached with its fill in every layer group, and the fill
        is part of its identity: it matches only a later prompt's partly filled last block
        of the same key and fill, and a full block under the same key is another entry (a
        lookup never reuses more tokens than were written). The sequence's first append
        copies it (copy-on-write).

        Args:
            seq_id: the new sequence's id, a non-negative int64.
            block_keys: exactly ``ceil(prompt_len / block_size)`` keys: a 1-D array of ints in
                ``0..2**64``, or a uint64 ``[n, 2]`` array of 128-bit keys as ``(high, low)``
                halves.
            prompt_len: the prompt's length, in tokens (at most ``2**27``).

        Returns:
            ``(cached_tokens, slots)`` as for :meth:`add_sequence_tokens`.

        Raises:
            DuplicateSequenceError: ``seq_id`` is live.
            PoolExhaustedError: not enough free or evictable blocks (nothing changed).
            InvalidArgumentError: a wrong key count or width, negative keys, a negative id or
                length, or caching off.
        """
    def append_tokens(self, seq_id: int, token_ids: _IntArrayLike) -> tuple[_I64Array, _I64Array]:
        """Append token ids to ``seq_id`` (as :meth:`append`), registering each block that fills
        in the cache when the sequence was admitted with token ids and every block before it is
        cached. Writing into a cached block copies it first.

        Args:
            seq_id: a live sequence.
            token_ids: the new tokens' ids (any integer dtype, each in ``0..2**32``).

        Returns:
            ``(slots, cow)`` as for :meth:`append`.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            PoolExhaustedError: not enough free or evictable blocks (nothing was appended).
            InvalidArgumentError: a token id outside ``0..2**32``, a non-integer or non-1-D
                array, or caching off.
        """
    def add_sequence_hit(self, seq_id: int, token_ids: _IntArrayLike, extra_key: int | None = None) -> int:
        """Join ``seq_id`` holding only the longest cached prefix of the prompt ``token_ids``
        (at most ``len - 1`` tokens: the last prompt token is always computed), allocating
        nothing else and registering nothing: its length is the cached tokens, returned.

        The scheduler's order, as vLLM's: look up the hit, then grow the sequence by the
        prompt's rest as compute allows (:meth:`step` or :meth:`append`; the sequence keeps
        its token record through them), then, once that KV is computed, give the ids to
        :meth:`store_tokens`, which caches the blocks they fill. So no block is cached before
        its KV exists (:meth:`add_sequence_tokens` caches the prompt's blocks at admission).
        The lookup counts in :meth:`cache_stats` as an admission's.

        With tiers (``host_blocks``) the hit continues below the pool: the blocks found
        there (those worth loading, :meth:`set_tier_costs`) are allocated, cached and
        counted in the returned length, and with :meth:`attach_tier_storage` their bytes
        are copied in before the cache is next read. When the pool lacks free blocks for
        them, none is taken (the caller computes them).

        Args:
            seq_id: the new sequence's id, a non-negative int64.
            token_ids: the prompt's token ids (any integer dtype, each in ``0..2**32``).
            extra_key: as for :meth:`add_sequence_tokens`.

        Returns:
            The cached tokens: the sequence's length, a multiple of ``block_size`` below
            ``len(token_ids)``.

        Raises:
            DuplicateSequenceError: ``seq_id`` is live.
            InvalidArgumentError: a negative id, a token id outside ``0..2**32``, an
                ``extra_key`` outside ``0..2**63``, a non-integer or non-1-D array, a prompt
                longer than ``2**27`` tokens, or caching off (nothing changed).
        """
    def store_tokens(self, seq_id: int, token_ids: _IntArrayLike) -> None:
        """Give ``seq_id`` the ids of its next stored tokens, whose KV is now computed, and
        cache each block they fill (as :meth:`append_tokens` does, without growing): the
        last step of :meth:`add_sequence_hit`'s order. A full block whose content a cached
        block already holds (another sequence computed the same prefix in the same pass)
        is replaced by that block in ``seq_id``'s table, its own freed, so one copy stays
        and the chain goes on past it; a table read before this call is stale for it.

        Args:
            seq_id: a live sequence joined by :meth:`add_sequence_hit` (or a fork of one).
            token_ids: the ids of the tokens after those it has given, in order (any
                integer dtype, each in ``0..2**32``).

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            InvalidArgumentError: the sequence keeps no token record (admitted or grown
                without token ids), more ids than it stores tokens, a token id outside
                ``0..2**32``, a non-integer or non-1-D array, or caching off (nothing
                changed).
        """
    def block_keys(self, token_ids: _IntArrayLike, extra_key: int | None = None) -> _U64Array:
        """Keys of the full blocks of ``token_ids`` (a partial last block has none). Stable across
        processes and runs.

        Each key is XXH3-128 with seed ``b"pkvpool1"`` over ``parent key (16 bytes LE) || 0x00 |
        0x01 extra (8 bytes LE) || token ids (4 bytes LE each)``, parent 0 for the first block.

        Args:
            token_ids: token ids (any integer dtype, each in ``0..2**32``).
            extra_key: as for :meth:`add_sequence_tokens`.

        Returns:
            uint64 ``[len(token_ids) // block_size, 2]``: each key's ``(high, low)`` halves.

        Raises:
            InvalidArgumentError: a token id outside ``0..2**32``, an ``extra_key`` outside
                ``0..2**63``, or caching off.
        """
    def cached_prefix_len(self, token_ids: _IntArrayLike, extra_key: int | None = None) -> int:
        """Tokens of ``token_ids`` held by cached full blocks now (before the last-token rule of
        :meth:`add_sequence_tokens`). Changes nothing and touches nothing.

        Args:
            token_ids: token ids (any integer dtype, each in ``0..2**32``).
            extra_key: as for :meth:`add_sequence_tokens`.

        Returns:
            A number of tokens, a multiple of ``block_size``.

        Raises:
            InvalidArgumentError: a token id outside ``0..2**32``, an ``extra_key`` outside
                ``0..2**63``, or caching off.
        """
    def cache_stats(self) -> CacheStats:
        """Hit metrics and occupancy of the prefix cache.

        Returns:
            A :class:`CacheStats` snapshot.

        Raises:
            InvalidArgumentError: caching off.
        """
    def pin_prefix(
        self,
        token_ids: _IntArrayLike,
        extra_key: int | None = None,
        *,
        priority: int | None = None,
        expires_at: int | None = None,
    ) -> int:
        """Pin the cached full blocks of ``token_ids`` and return a pin id for :meth:`unpin`.

        Without ``priority`` the pin is hard: the blocks are never evicted. With a ``priority``
        the pin is soft: under ``eviction="priority"`` idle blocks with a lower priority go
        first.

        Args:
            token_ids: the prefix's token ids (any integer dtype, each in ``0..2**32``).
            extra_key: as for :meth:`add_sequence_tokens`.
            priority: ``0..2**32`` for a soft pin; None (default) for a hard pin.
            expires_at: the logical time (see :meth:`set_clock`) at which the pin lapses; None
                (default) for never.

        Returns:
            The pin id.

        Raises:
            InvalidArgumentError: the prefix has no full block or is not fully cached;
                ``expires_at`` is not after the current clock; a value out of range; caching
                off.
        """
    def pin_block_keys(
        self,
        block_keys: _IntArrayLike,
        *,
        priority: int | None = None,
        expires_at: int | None = None,
    ) -> int:
        """:meth:`pin_prefix` for a prefix given as block keys, each standing for a full block
        (a partly filled keyed block cannot be pinned).

        Args:
            block_keys: as for :meth:`add_sequence_block_keys`, one key per full block to pin.
            priority: as for :meth:`pin_prefix`.
            expires_at: as for :meth:`pin_prefix`.

        Returns:
            The pin id.

        Raises:
            InvalidArgumentError: no key, a key that is not cached as a full block, a wrong key
                width or a negative key; ``expires_at`` is not after the current clock;
                caching off.
        """
    def unpin(self, pin_id: int) -> None:
        """Release a pin; its blocks become evictable again once no other pin holds them.

        Raises:
            InvalidArgumentError: an unknown, released or lapsed pin id, or caching off.
        """
    def set_clock(self, t: int) -> None:
        """Drive the logical clock from the caller's step counter from now on (by default it counts
        completed admissions, appends, steps, forks, truncations and frees). Pins whose
        ``expires_at`` is reached are released.

        Args:
            t: the new time, ``0..2**63``, not before the current one.

        Raises:
            InvalidArgumentError: ``t`` goes back or is out of range, or caching off.
        """
    def drain_events(self) -> dict[str, npt.NDArray[Any]]:
        """Take the queued cache events (``record_events=True``; none otherwise), oldest first.

        The queue keeps the newest ``max_events`` events: when
        :attr:`CacheStats.dropped_events` grew since the last drain, older events were lost
        and a consumer mirroring the cache must resynchronise.

        Returns:
            A dict of arrays of equal length ``n``: ``kind`` uint8 (:data:`EVENT_STORED`,
            :data:`EVENT_REMOVED`, :data:`EVENT_ALL_CLEARED`), ``block`` int64 (-1 for a clear),
            ``key`` and ``parent_key`` uint64 ``[n, 2]`` (high, low), ``has_parent`` bool,
            ``tokens`` uint32 (tokens of KV the block holds: ``block_size``, fewer for a keyed
            prompt's partly filled last block, 0 for a clear), ``clock`` uint64 (logical
            time), ``group`` uint32 (the block's layer group: 0 in this pool), ``medium``
            uint8 (0 the pool itself, 1 the host tier, 2 the disk tier; a tier's events have
            block -1: a block moving down is removed from one medium and stored in the next,
            a hit below the pool removes it from its tier before the pool stores it).

        Raises:
            InvalidArgumentError: caching off.
        """
    def reset_prefix_cache(self) -> int:
        """Forget every cached block: idle ones become free, live ones stay with their sequences,
        uncached.

        Returns:
            The number of blocks that were cached.

        Raises:
            InvalidArgumentError: pins are held, or caching off.
        """
    def tier_stats(self) -> list[dict[str, Any]]:
        """The counts of the tiers below the device (``host_blocks``, ``disk_blocks``).

        Returns:
            One dict per tier, host first (an empty list without tiers): ``tier``
            (``"host"`` or ``"disk"``), ``stored`` (blocks that entered it, from the device
            or the tier above), ``hits`` (blocks an admission took back from it),
            ``evicted`` (blocks it pushed down or dropped), ``collisions`` (lookups whose
            key it held with other tokens, parent or extra key: misses), ``held`` (blocks
            now); in the host entry only (0 in the disk one), ``gated`` (evicted blocks the
            reuse gate kept out), ``loads_won`` (admissions that loaded blocks from below
            the pool) and ``recompute_won`` (admissions that found blocks below the pool
            but computed some or all of them, as faster: see :meth:`set_tier_costs`).

        Raises:
            InvalidArgumentError: caching off.
        """
    def set_tier_costs(self, load_ns_per_block: _IntArrayLike, recompute_ns_per_token: int) -> None:
        """Say what loading a block from each tier and computing a prompt token cost, so that
        an admission never loads what is faster to compute.

        From then on an admission whose hit continues below the pool loads only the leading
        tier blocks that save the most time: block by block along the chain, each saves
        ``block_size * recompute_ns_per_token`` and costs its tier's load (times the number
        of groups); the count with the largest saving is loaded, the rest computed (the
        smallest such count on a tie; none when no count saves time). Without costs every
        block found below is loaded. :meth:`tier_stats` counts how often each side won.

        Args:
            load_ns_per_block: one cost per tier, host first, in nanoseconds per block (a
                measured bandwidth's ``block bytes / bytes per ns`` plus the latency), each
                ``0..2**63``.
            recompute_ns_per_token: nanoseconds to compute one prompt token's KV (from the
                caller's roofline), ``0..2**63``.

        Raises:
            InvalidArgumentError: caching off, no tiers, a cost count other than the
                tiers', a negative cost or one that is not an int.
        """

    def attach_tier_storage(self, cache: KvCache, *, disk_dir: str | os.PathLike[str] | None = None,
                            model_id: str | None = None, transfer_threads: int = 2, fsync: bool = True) -> None:
        """Give the tiers bytes: from now on every block the pool moves below the device is
        copied out of ``cache`` into host memory (and from there to ``disk_dir``), and every
        block an admission takes from a tier is copied back into its new block of
        ``cache`` before anything reads it.

        Device <-> host copies run on ``transfer_threads`` threads of their own while the
        caller goes on, disk writes on a thread of the disk tier's own (in the order
        decided; at most about 256 MiB queued); a disk read runs in the pool call whose
        hit needs it, after the writes queued before it.
        Every access to ``cache`` (writes, attention, dequantize, copies) first waits for
        the copies in flight, so a block is never read before its bytes arrived; numpy or
        torch views of the cache are not waited for: call :meth:`wait_tiers` before using
        them. The host tier maps ``host_blocks`` slots of one block's bytes across all
        layers (plus 16 staging slots with a disk tier).

        The disk folder holds one checksummed file per block (format in the
        documentation); it is tied to ``model_id`` and the cache's layout and dtype, and
        a folder of another model or layout is refused. Blocks an earlier run left there
        go back into the disk tier (a warm restart: a later prompt hits them), up to
        ``disk_blocks``; the rest are removed. A restored block is verified by its chained
        key, parent key and extra key (not its token ids, which the folder does not keep)
        and by its checksum when it is loaded.

        Args:
            cache: the pool's KV storage: as many blocks of as many tokens as the pool.
            disk_dir: the disk tier's folder (created if missing), exactly when the pool
                has ``disk_blocks``.
            model_id: names the model whose KV the folder holds (weights and version), with
                ``disk_dir`` only.
            transfer_threads: copy threads, ``1..=64`` (default 2).
            fsync: sync each disk block before it counts as written (default True: it
                survives a power loss; False: it survives the process being killed).

        Raises:
            InvalidArgumentError: the pool has no tiers or already evicted a block into
                them, storage is already attached, ``cache``'s blocks or block size differ
                from the pool's, ``disk_dir`` given without ``disk_blocks`` (or missing
                with), ``model_id`` missing with ``disk_dir`` or given without it,
                ``transfer_threads`` out of range, or host memory for the slots cannot be
                mapped.
            PermissionError: the folder may not be created, read or written.
            OSError: another I/O failure, or another open tier holds the folder.
            TypeError: ``cache`` is not a :class:`KvCache`.
        """
    def probe_tier_loads(self, blocks: int = 16) -> list[int]:
        """Measure what loading one block from each tier costs on this machine, on the
        attached storage: nanoseconds per block, host first (then disk), the figures
        :meth:`set_tier_costs` takes.

        The host figure times the copy of device blocks ``0..blocks`` into fresh host
        slots by the transfer threads (a copy costs the same both ways). The disk figure
        writes those blocks to the folder, drops them from the page cache, and times
        reading them back with their checksums, plus the host copy; they are removed
        after. A shared machine's figures vary: probe when the machine is as loaded as
        when it serves. Every access to the cache waits for the probe.

        Args:
            blocks: blocks to move, ``1..=256`` and at most the pool's (default 16).

        Returns:
            One cost per tier, in nanoseconds per block.

        Raises:
            InvalidArgumentError: no storage attached, or ``blocks`` out of range.
            OSError: the folder may not be written or read (``PermissionError`` when not
                permitted).
        """
    def wait_tiers(self, *, disk_writes: bool = True) -> None:
        """Wait until the tier copies in flight have finished (see
        :meth:`attach_tier_storage`); report the first failure since the last call.

        Blocks going down to disk are written on a thread of the disk tier's own, in the
        order decided, while the pool goes on (a load from disk waits for the writes
        queued before it).

        Args:
            disk_writes: wait for the disk writes queued too (default True); False waits
                for the device <-> host copies only (what a read of the cache needs).

        Raises:
            OSError: a disk block failed its checksum or vanished and was not loaded, or a
                disk write failed (the block is then lost: a later hit on it is such a
                failed load). A sequence admitted since the last call may then hold a
                block with stale bytes: the pool forgot every cached block (as
                :meth:`reset_prefix_cache`; the tiers too) so that nothing hits it again;
                free those sequences and admit them again (their blocks are computed).
            InvalidArgumentError: a copy was refused (a bug).
        """
    def tier_transfer_stats(self) -> dict[str, int] | None:
        """What the attached tier storage copied (None before :meth:`attach_tier_storage`).

        Returns:
            A dict of counts in blocks: ``host_stores`` (device -> host), ``host_loads``
            (host -> device), ``disk_writes`` (host -> disk), ``disk_loads`` (disk ->
            device), ``disk_lost`` (disk blocks that failed their checks, never loaded),
            ``flushes`` (copies waited for inside a call, where one decision needed an
            earlier one's bytes); and ``slot_bytes`` (one block across all layers) and
            ``host_bytes`` (host memory mapped), in bytes.

        Raises:
            Nothing.
        """

@final
class FullAttention:
    """Full (global) attention: a query at position ``p`` sees every key ``0..=p``.

    Its blocks are never released: the group's table grows with the sequence.

    Raises:
        TypeError: any argument (it takes none).
    """

    def __new__(cls) -> FullAttention: ...
    @property
    def window(self) -> None:
        """None: full attention has no window (tokens)."""
    @property
    def sink_tokens(self) -> int:
        """0: full attention has no sinks (tokens)."""
    @property
    def chunk_size(self) -> None:
        """None: full attention is not chunked (tokens)."""
    @property
    def window_left(self) -> None:
        """None: the kernels' ``window_left`` for full attention (no window)."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class SlidingWindow:
    """Sliding-window attention with optional attention sinks: a query at position ``p`` sees
    the keys ``k`` with ``p - k < window`` (the ``window`` most recent positions, its own
    included; Hugging Face's ``sliding_window``), plus the sinks ``k < sink_tokens``.

    A pool releases the group's blocks that no later query sees, so a sequence holds about
    ``ceil(sink_tokens / block_size) + ceil((window - 1) / block_size) + 1`` blocks of this
    group whatever its length.

    Args:
        window: visible positions, the query's own included, ``1..=2**31 - 1`` tokens
            (a kernel's ``window_left`` is ``window - 1``).
        sink_tokens: leading positions every query sees, ``0..=2**31 - 1`` tokens
            (default 0).

    Raises:
        InvalidArgumentError: ``window`` or ``sink_tokens`` out of range, a bool or a
            non-integer.
    """

    def __new__(cls, window: int, sink_tokens: int | None = None) -> SlidingWindow: ...
    @property
    def window(self) -> int:
        """Visible positions, the query's own included (tokens)."""
    @property
    def sink_tokens(self) -> int:
        """Leading positions every query sees (tokens)."""
    @property
    def chunk_size(self) -> None:
        """None: a sliding window is not chunked (tokens)."""
    @property
    def window_left(self) -> int:
        """``window - 1``: the kernels' ``window_left`` (keys with ``p - k <= window_left`` are
        visible), in tokens.
        """
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class ChunkedAttention:
    """Chunked (block-local) attention, Llama 4's ``attention_chunk_size``: a query at
    position ``p`` sees the keys of its own chunk, ``k // chunk_size == p // chunk_size``.

    A pool releases the group's blocks of finished chunks.

    Args:
        chunk_size: positions per chunk, ``1..=2**31 - 1`` tokens.

    Raises:
        InvalidArgumentError: ``chunk_size`` out of range, a bool or a non-integer.
    """

    def __new__(cls, chunk_size: int) -> ChunkedAttention: ...
    @property
    def window(self) -> None:
        """None: chunked attention has no sliding window (tokens)."""
    @property
    def sink_tokens(self) -> int:
        """0: chunked attention has no sinks (tokens)."""
    @property
    def chunk_size(self) -> int:
        """Positions per chunk (tokens)."""
    @property
    def window_left(self) -> None:
        """None: chunked attention is not a sliding window (the kernels take ``chunk_size``)."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

_GroupKind: TypeAlias = FullAttention | SlidingWindow | ChunkedAttention

@final
class BlockTableBuffer:
    """A long-lived int32 ``[max_seqs, max_blocks]`` block-table matrix that :meth:`sync`
    updates in place, writing only entries that changed since the last sync (new blocks;
    whole rows only after copy-on-write, truncation or a new sequence).

    ``array`` is the numpy matrix itself (no copy); treat it as read-only, or call
    :meth:`invalidate` after writing to it.

    Args:
        max_seqs: rows (sequences).
        max_blocks: columns (blocks per table).
        pad: the value of unused entries, an int32 (default -1).

    Raises:
        InvalidArgumentError: a zero shape, more than ``2**28`` entries, or ``pad`` outside
            int32.
    """

    def __new__(cls, max_seqs: int, max_blocks: int, pad: int = ...) -> BlockTableBuffer: ...
    @property
    def array(self) -> _I32Array:
        """The int32 ``[max_seqs, max_blocks]`` matrix, padded with :attr:`pad`."""
    @property
    def pad(self) -> int:
        """The padding value of unused entries."""
    def sync(self, pool: BlockPool, seq_ids: _IntArrayLike, group: int | None = None) -> int:
        """Make row ``i`` hold the block table of ``seq_ids[i]`` in ``group``; rows past
        ``len(seq_ids)`` are left as they were.

        A buffer mirrors one layer group's tables (keep one buffer per group). Holes (blocks
        a window released, or a prefix hit never stored) are ``pad``, as in
        :meth:`BlockPool.block_tables`; the entries a window released since the last sync
        become ``pad`` in place.

        Args:
            pool: the :class:`BlockPool` the sequences live in.
            seq_ids: at most ``max_seqs`` live sequence ids.
            group: the layer group whose tables to mirror: required for a pool built with
                ``groups``, 0 (the only one) by default for one built without.

        Returns:
            The number of entries written.

        Raises:
            UnknownSequenceError: an id is not live.
            InvalidArgumentError: ``pool`` is not a BlockPool, ``group`` is not an int, not a
                group of the pool or missing, too many ids, a table longer than
                ``max_blocks``, or the array is not writable. Nothing is written on error.
        """
    def invalidate(self) -> None:
        """Forget the matrix contents: the next sync rewrites every row it touches."""

# ---- serving simulator (rust/bindings/sim.rs; facade: pykvpool.simulate) ----------------

SIM_MAX_REQUESTS: Final[int]
"""Most requests in one simulator workload (2**24)."""
SIM_MAX_REQUEST_TOKENS: Final[int]
"""Most tokens in one prompt, and in one output, of a simulated request (2**24)."""
SIM_MAX_STEP_TOKENS: Final[int]
"""Most tokens one simulator step computes (2**24): the largest ``max_batched_tokens``."""
SIM_MAX_REPLICAS: Final[int]
"""Most replicas of one simulated deployment (1,024): ``run_simulation``'s ``replicas``."""

def synthesize_workload(
    num_requests: int,
    *,
    arrivals: str = ...,
    rate: float = ...,
    cv: float = ...,
    prompt: tuple[str, Sequence[float]] = ...,
    prompt_clamp: tuple[int, int] = ...,
    output: tuple[str, Sequence[float]] = ...,
    output_clamp: tuple[int, int] = ...,
    priority_levels: int = ...,
    shared_prefixes: tuple[int, int, int] | None = ...,
    seed: int = ...,
) -> dict[str, npt.NDArray[Any]]:
    """A seeded synthetic workload as columns; same arguments, identical arrays (bit for bit).

    Args:
        num_requests: requests to draw, 0 to ``SIM_MAX_REQUESTS`` (0: empty columns).
        arrivals: ``"burst"`` (all at 0 s), ``"poisson"`` (exponential gaps at ``rate``) or
            ``"gamma"`` (mean gap ``1 / rate``, coefficient of variation ``cv``).
        rate: mean arrival rate, requests/s (finite, > 0).
        cv: coefficient of variation of the gamma gaps (finite, > 0; above 1 is bursty).
        prompt: prompt lengths as ``(kind, params)``, in tokens: ``("fixed", [n])``,
            ``("uniform", [lo, hi])`` (inclusive), ``("lognormal", [median, sigma])``,
            ``("pareto", [scale, shape])`` or ``("empirical", [values...])`` (resampled).
        prompt_clamp: ``(min, max)`` tokens each drawn prompt length is clamped to, with
            ``1 <= min <= max <= SIM_MAX_REQUEST_TOKENS`` (default: that whole range).
        output: output lengths, as ``prompt``.
        output_clamp: as ``prompt_clamp``, for output lengths.
        priority_levels: priorities drawn uniformly from ``0..priority_levels``.
        shared_prefixes: ``(num_prefixes, prefix_len, vocab_size)``: prompts become token ids
            starting with one of ``num_prefixes`` random prefixes of ``prefix_len`` tokens
            (at most 2**28 prefix token ids, and 2**28 prompt token ids in all).
        seed: the random seed, any int in ``0..2**64``.

    Returns:
        ``{column: array}`` with ``arrival`` float64 (seconds), ``prompt_len``,
        ``output_len`` and ``priority`` int64 (tokens; priority levels), and with
        ``shared_prefixes`` also ``token_ids`` uint32 (all prompts concatenated) and
        ``token_offsets`` int64 (``num_requests + 1`` offsets into ``token_ids``).

    Raises:
        InvalidArgumentError: any argument out of range, naming it: a negative count or
            one above its limit, a bool where a count or a number is meant, an unknown
            arrival process or length distribution, a rate or cv that is not finite and
            positive, a wrong number of distribution parameters, a bad clamp or
            shared-prefix shape, a seed outside ``0..2**64``.
    """

def run_simulation(
    workload: dict[str, Any],
    config: dict[str, Any],
    time_model: object = ...,
    decode_time_model: object = ...,
) -> dict[str, Any]:
    """Run the step-level serving simulator over a fresh ``BlockPool(num_blocks, block_size)``
    (with ``groups``: ``BlockPool(num_blocks, block_size, groups)``).

    The facade :func:`pykvpool.simulate.run` builds both dicts from a
    :class:`pykvpool.simulate.Workload` and a :class:`pykvpool.simulate.SimConfig`, whose
    docs describe each policy. The GIL is released while the engine runs, except around
    calls to a Python ``time_model``. A request that can never run (longer than the pool,
    than ``reserve_tokens``, or than the token budget without chunked prefill) is not an
    error: it gets outcome 1 (rejected) and is counted. A key missing from a dict takes
    its default; an unknown key is an error.

    Args:
        workload: the requests' columns, by key:
            ``arrival`` (required): arrival time of each request, seconds (finite, >= 0):
            a 1-D float array or a sequence of numbers; at most ``SIM_MAX_REQUESTS``
            requests (empty: an empty result).
            ``prompt_len`` (required): prompt length of each request, tokens (1 to
            ``SIM_MAX_REQUEST_TOKENS``).
            ``output_len`` (required): generated tokens of each request (1 to
            ``SIM_MAX_REQUEST_TOKENS``).
            ``priority``: int32 priority of each request (lower first under
            ``queue="priority"``; default all 0).
            ``token_ids``: all prompts' token ids concatenated (with ``token_offsets``),
            for prefix caching.
            ``token_offsets``: ``len(arrival) + 1`` offsets into ``token_ids``.
            ``block_keys``: all prompts' block keys concatenated (with ``key_offsets``),
            one key per ``tokens_per_key`` prompt tokens (a trace's ``hash_ids``), each in
            ``0..2**64`` (a negative key is an error, as for :class:`BlockPool`).
            ``key_offsets``: ``len(arrival) + 1`` offsets into ``block_keys``.
            ``tokens_per_key``: prompt tokens per block key (default 0).
        config: the pool and the scheduler, by key:
            ``num_blocks`` (required): device blocks of the pool.
            ``block_size`` (required): tokens per block.
            ``max_running``: requests in flight at most (default 256).
            ``max_batched_tokens``: tokens computed per step across the batch, at most
            ``SIM_MAX_STEP_TOKENS`` (default 8192; None: that limit).
            ``chunked_prefill``: split prompts that exceed the remaining token budget
            (default True).
            ``watermark``: fraction of the pool admission leaves free, in ``[0, 1)``
            (default 0.0).
            ``queue``: ``"fcfs"`` (default) or ``"priority"``.
            ``allocation``: ``"paged"`` (default: blocks on demand), ``"reserve"`` (Orca:
            every request reserves ``reserve_tokens`` tokens at admission; a request whose
            prompt + output exceeds them is rejected) or ``"oracle"`` (each request
            reserves its own final length: ``prompt + output - 1`` tokens under
            ``"vllm"``, ``prompt + output`` under ``"decode_first"``).
            ``reserve_tokens``: tokens reserved per request under ``allocation="reserve"``
            (required there, 1 to 2**32 - 1; the model's context); ignored otherwise.
            ``preemption``: ``"recompute"`` (default) or ``"swap"`` (to a host pool of
            ``host_blocks`` blocks).
            ``host_blocks``: host blocks for swapping (default 0).
            ``victim``: ``"newest"`` (default) or ``"lowest_priority"``.
            ``convention``: ``"vllm"`` (default) or ``"decode_first"``.
            ``prefix_caching``: cache prompts given as ``token_ids`` or ``block_keys``
            (prompts given as lengths only never hit; default False).
            ``eviction``: idle cached blocks to reclaim first: ``"lru"`` (default),
            ``"fifo"``, ``"lfu"`` or ``"priority"``.
            ``check_invariants``: check the pool's invariants after every step (slow;
            default False).
            ``max_steps``: stop after this many steps (default None: run to the end).
            ``record_steps``: keep the per-step columns (default True).
            ``groups``: the model's layer groups (default None: one full-attention group,
            a ``BlockPool``): a list of 1 to 64 tuples ``("full",)``, ``("sliding",
            window)``, ``("sliding", window, sink_tokens)`` or ``("chunked", chunk_size)``
            (tokens; window and chunk >= 1), sharing the ``num_blocks`` blocks. A
            windowed group releases the blocks no later query needs at the start of each
            growth and the scheduler counts them free; a reservation counts every logical
            block of every group. The steps then gain a column ``blocks_used_g{j}`` per
            group (blocks it holds; they add up to ``blocks_used``), the summary
            ``peak_blocks_used_g{j}``, and ``kv_tokens`` counts the tokens stored over all
            groups (utilization: stored tokens over held and reserved slots). With
            ``prefix_caching`` the pool caches every group (:class:`BlockPool`): a hit
            shares blocks, which ``blocks_used_g{j}`` and ``kv_tokens`` then count once per
            holder, and an admission allocates its whole prompt in every group at once (a
            prompt larger than the pool is rejected). With ``preemption="swap"`` the host
            pool has the same groups (``host_blocks`` of them) and a swap moves what each
            group holds (a window only its sinks and window).
            ``stop_when``: None (default: run to the end) or a dict of SLO targets, each
            None or a number finite and > 0: ``ttft_p99``, ``tpot_p50``, ``tpot_p99``
            (seconds) and ``min_output_throughput`` (output tokens/s); ``attain_ttft``,
            ``attain_tpot`` (seconds) with ``attain_share`` (in (0, 1]): that share of
            the requests each finishes within both bounds (DistServe's attainment);
            ``tolerate_rejections`` (a bool, default False): a rejected request alone
            does not stop the run. The run stops as soon as its complete version
            certainly misses them (a request rejected, enough latencies above a bound
            that the percentile of the complete run is above it, or too few requests
            left that can meet the attainment bounds: :mod:`pykvpool.simulate.stop`); the
            summary's ``stopped`` names the target (``rejected``, ``ttft_p99``,
            ``tpot_p50``, ``tpot_p99``, ``throughput``, ``attainment``), None when the
            run went to the end (then it is the run without the rule, bit for bit).
            ``replicas``: data parallelism: replicas of this configuration behind one
            router, 1 (default) to ``SIM_MAX_REPLICAS``, each with its own pools and the
            same ``time_model``; their steps run in time order on one clock.
            ``router``: ``"round_robin"`` (default: the k-th arrival to replica k mod
            ``replicas``) or ``"shortest_queue"`` (the fewest pending tokens: a request
            counts its prompt until its first token, then 1 until it finishes). Requests
            and steps gain a ``replica`` column (-1: never routed).
            ``disaggregation``: None (default: every replica serves both phases) or a
            dict: the ``replicas`` are prefill instances and ``decode_replicas`` (1 to
            ``SIM_MAX_REPLICAS``) decode instances of ``decode_num_blocks`` blocks each
            (default ``num_blocks``; no prefix caching) follow them, replica indices
            ``replicas`` on. A request's prompt runs on a prefill instance (its first
            token ends there); one of more output tokens then leaves its batch, its
            blocks held there until its KV (``prompt_len * bytes_per_token`` bytes) has
            moved over the link: ``bandwidth`` bytes/s per instance (finite, > 0),
            ``latency`` s per transfer (default 0), first come first served on the
            sender's and the receiver's link, pipelined over ``layers`` parts of the last
            prefill step (default 1: after it; at most 65,536). The router's policy over
            the decode instances picks one at the prefill's end (a request counts 1 token
            until it finishes); it admits the request at its first step once the KV has
            arrived and fits. ``mixed_tokens`` (0 to 2**63 - 1; default None: never): a mixed pool, an
            arrival that finds every prefill instance with at least that many tokens
            pending (the router's count) goes to a decode instance (the decode router's
            choice), which serves it whole. Needs ``allocation="paged"`` and
            ``convention="vllm"``.
            Requests gain ``decode_replica`` (-1: none), ``kv_ready`` and
            ``decode_start`` (s; NaN: none); the summary ``kv_transfers``,
            ``kv_transfer_bytes`` and the ``kv_transfer_*`` (first token to KV arrived)
            and ``decode_wait_*`` (KV arrived to admission) statistics.
        time_model: seconds per step (float, default 0.0: steps only); the 11 roofline
            figures ``[params, bytes/param, layers, q_dim, kv bytes/token, flop/s, bytes/s,
            overhead s, swap s/block, all-reduce s/step, all-reduce s/token]``
            (:meth:`pykvpool.planning.roofline.Roofline.figures`); or a callable ``f(prefill_tokens, decode_tokens,
            num_seqs, context_tokens, attention_pairs, swapped_blocks) -> seconds``, called
            with the GIL held.
        decode_time_model: with ``disaggregation``, the decode instances' step time, as
            ``time_model`` (default None: ``time_model`` times every step).

    Returns:
        ``{"requests": {column: array}, "steps": {column: array}, "summary": {name:
        int | float | None}}``; the columns are those of
        :class:`pykvpool.simulate.SimulationResult`. A summary statistic over an empty set
        (no finished request, no step) is None, never NaN; ``summary["stopped"]`` is None
        or the ``stop_when`` target that ended the run early.

    Raises:
        InvalidArgumentError: an unknown or missing required key; bad columns (2-D or
            ragged, lengths that differ, a zero or out-of-range length, a bad arrival time
            or offsets, a negative block key, more than ``SIM_MAX_REQUESTS`` requests), an
            unknown policy name, ``"reserve"`` without ``reserve_tokens``, a size out of
            range or a bool as a count, token ids mixed with block keys, a malformed
            ``groups`` entry (naming ``groups[i]``), a ``stop_when`` bound that is not a number finite and
            > 0 (naming ``stop_when.<key>``), a bad ``disaggregation`` entry (naming
            ``disaggregation.<key>``; with ``allocation`` other than ``"paged"`` or
            ``convention="decode_first"``), ``decode_time_model`` without
            ``disaggregation``, or a bad time model or step time; each names the key.
        TypeError: a dict that is not a dict (``stop_when`` and ``disaggregation``
            included), a flag that is not a bool or a policy name
            that is not a str (naming the key).
        InvariantError: the engine broke an invariant (a pykvpool bug).
        Exception: whatever a Python ``time_model`` raises, unchanged.
    """

# ------------------------------------------------------- KV storage and decode attention

_F32Array: TypeAlias = npt.NDArray[np.float32]
_F32In: TypeAlias = npt.NDArray[np.float32] | _DLPack
_KernelPath: TypeAlias = Literal["scalar", "neon", "avx2", "avx512"]
_Operand: TypeAlias = Literal["f32", "bf16", "f16", "int8"]

KV_DTYPES: Final[tuple[str, ...]]
"""The storage dtype names :class:`KvCache` accepts, each in its one spelling: ``("f32",
"f16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2")`` (aliases such as ``"float32"`` or
``"e4m3"`` are accepted too and read as these). Planning, the CLI and the search read it."""

@final
class KvCache:
    """KV storage owned by Rust: per layer, K and V for ``num_blocks`` blocks of
    ``block_size`` token slots x ``num_kv_heads`` x ``head_dim``, in ``dtype``, in one
    2 MiB-aligned allocation advised for transparent huge pages.

    Physical layout: per layer, block-major with each block's K (all KV heads) followed
    by its V, so the kernel reads one contiguous run per block; inside a (block, head)
    tile K is dimension-major ``[head_dim][block_size]`` and V token-major
    ``[block_size][head_dim]``. :meth:`key` and :meth:`value` hide this behind the
    logical shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` (strided views).

    8-bit dtypes store one-byte codes in that same layout, and f32 scales after each
    layer's codes (value = code x scale):

    - ``"int8"``: symmetric, one scale per (token, KV head) for K and for V, computed by
      every :meth:`write` (``max|x| / 127`` over the token's ``head_dim`` values; codes
      ``round_half_even(x / scale)`` clamped to +-127; an all-zero row has scale 0). Per
      layer the scales are ``[num_blocks][2][num_kv_heads][block_size]`` (each block's K
      scales, then its V scales), so :meth:`copy_blocks` carries them with the block.
    - ``"fp8_e4m3"`` (``float8_e4m3fn``, largest 448) and ``"fp8_e5m2"`` (largest 57344):
      one scale per (layer, KV head) for K and for V (``[2][num_kv_heads]`` per layer),
      set by :meth:`set_fp8_scales` or, while still 0, calibrated by the first write to
      the layer holding a non-zero value of that head (``max|x| / largest``); later
      values beyond the calibrated range saturate. Conversion is saturating, round to
      nearest even.

    Args:
        num_layers: layers.
        num_blocks: blocks per layer (a :class:`BlockPool`'s ``num_blocks``).
        block_size: token slots per block, at most 65536.
        num_kv_heads: KV heads, at most 65536.
        head_dim: elements per head, at most 65536.
        dtype: the storage dtype: ``"f32"`` (default), ``"f16"``, ``"bf16"``, ``"int8"``,
            ``"fp8_e4m3"`` or ``"fp8_e5m2"``.

    Raises:
        InvalidArgumentError: a zero dimension, ``block_size``/``head_dim``/
            ``num_kv_heads`` above 65536, an unknown dtype, or a size beyond memory.
    """

    def __new__(
        cls,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str = "f32",
    ) -> KvCache: ...
    @property
    def num_layers(self) -> int:
        """Layers."""
    @property
    def num_blocks(self) -> int:
        """Blocks per layer."""
    @property
    def block_size(self) -> int:
        """Token slots per block (tokens)."""
    @property
    def num_kv_heads(self) -> int:
        """KV heads."""
    @property
    def head_dim(self) -> int:
        """Elements per head."""
    @property
    def dtype(self) -> str:
        """The storage dtype: "f32", "f16", "bf16", "int8", "fp8_e4m3" or "fp8_e5m2"."""
    @property
    def nbytes(self) -> int:
        """Bytes of K plus V over all layers: codes, the padding before each layer's scales
        (to 64 bytes) and the scales; ``num_layers * num_blocks * block_size *``
        :meth:`bytes_per_token` plus, per layer, that padding and the fp8 per-head scales."""
    @property
    def huge_pages(self) -> bool:
        """Whether the OS accepted the transparent-huge-page advice."""
    def key(self, layer: int, *, writable: bool = True) -> npt.NDArray[Any]:
        """Zero-copy view of layer ``layer``'s K. The view keeps the cache alive.

        Writable by default, like a vLLM KV-cache tensor (and so that ``torch.from_numpy``
        accepts it); ``writable=False`` gives a read-only view for inspection. A view (or
        anything sharing the cache's memory) is refused as the ``out`` of
        :func:`decode_attention`.

        The view aliases the cache's memory: writes through it are seen by the next kernel
        call, and no copy protects a running one. :meth:`write`, :meth:`copy_blocks` and
        :func:`decode_attention` release the GIL, so writing this array (or a torch tensor
        wrapping it) from one Python thread while one of them runs on the same layer in
        another is a data race with undefined results; the caller must order the two (e.g.
        join the kernel call first).

        A writable view lets the caller store any code, ``fp8_e4m3``'s two NaN codes
        included (:meth:`write` refuses non-finite values and saturates, so it never makes
        one). Once a cache has handed one out (K or V, any layer), the AVX-512 decode path
        checks each e4m3 tile it reads for NaN codes (measured at 4-7% of an MHA call:
        ``docs/experiments.md``, conversions); read-only views do not cost it.

        Args:
            layer: ``0..num_layers``.
            writable: False for a read-only view.

        Returns:
            Shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` (strided), dtype float32,
            float16, ``ml_dtypes.bfloat16`` (a dependency: another dtype is never handed
            out); for 8-bit caches the raw codes: int8, ``ml_dtypes.float8_e4m3fn`` or
            ``ml_dtypes.float8_e5m2`` (unscaled: see :meth:`key_scales`,
            :meth:`dequantized`).

        Raises:
            InvalidArgumentError: ``layer`` outside ``0..num_layers``.
            ImportError: a bf16 or fp8 cache and ``ml_dtypes`` cannot be imported.
        """
    def value(self, layer: int, *, writable: bool = True) -> npt.NDArray[Any]:
        """Zero-copy view of layer ``layer``'s V; as :meth:`key`, including the rule that it must
        not be written while a kernel call on the same layer runs in another thread, and
        the e4m3 NaN-code check a writable view turns on.

        Args:
            layer: ``0..num_layers``.
            writable: False for a read-only view.

        Returns:
            Shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` (strided), the dtype of
            :meth:`key`.

        Raises:
            InvalidArgumentError: ``layer`` outside ``0..num_layers``.
            ImportError: a bf16 or fp8 cache and ``ml_dtypes`` cannot be imported.
        """
    def key_scales(self, layer: int, *, writable: bool = True) -> _F32Array:
        """Zero-copy float32 view of layer ``layer``'s K scales (8-bit caches), aliasing the
        cache as :meth:`key` does (same threading rule). Writing it rescales the codes it
        covers.

        Args:
            layer: ``0..num_layers``.
            writable: False for a read-only view.

        Returns:
            int8: ``[num_blocks, block_size, num_kv_heads]`` (strided), the scale of each
            token slot's K row of each head; fp8: ``[num_kv_heads]``, the layer's scales.

        Raises:
            InvalidArgumentError: ``layer`` outside ``0..num_layers``, or a cache without
                scales (f32, f16, bf16).
        """
    def value_scales(self, layer: int, *, writable: bool = True) -> _F32Array:
        """Zero-copy float32 view of layer ``layer``'s V scales; as :meth:`key_scales`.

        Args:
            layer: ``0..num_layers``.
            writable: False for a read-only view.

        Returns:
            The shape of :meth:`key_scales`.

        Raises:
            InvalidArgumentError: ``layer`` outside ``0..num_layers``, or a cache without
                scales (f32, f16, bf16).
        """
    def set_fp8_scales(self, layer: int, k_scales: _F32Array, v_scales: _F32Array) -> None:
        """Set layer ``layer``'s fp8 scales, one per KV head for K and for V (e.g. a model's
        calibrated ``k_scale``/``v_scale``). Codes already stored are not converted: they
        are read with the new scales. A scale of 0 means "not set": the next write with a
        non-zero value of that head calibrates it.

        Args:
            layer: ``0..num_layers``.
            k_scales: float32 ``[num_kv_heads]``, finite and >= 0.
            v_scales: float32 ``[num_kv_heads]``, finite and >= 0.

        Raises:
            InvalidArgumentError: not an fp8 cache, a bad ``layer``, a scale array that is not
                float32 of shape ``[num_kv_heads]``, a negative or non-finite scale (the
                message names ``k_scales`` or ``v_scales``). Nothing is set on error.
        """
    def dequantized(self, layer: int) -> tuple[_F32Array, _F32Array]:
        """Float32 copies of layer ``layer``'s K and V: codes times their scales (8-bit
        caches) or the elements widened, the values every kernel attends over. The GIL is
        released while it copies.

        Args:
            layer: ``0..num_layers``.

        Returns:
            ``(k, v)``, each float32 ``[num_blocks, block_size, num_kv_heads, head_dim]``
            (C-contiguous, new arrays).

        Raises:
            InvalidArgumentError: ``layer`` outside ``0..num_layers``.
        """
    @staticmethod
    def bytes_per_token(num_kv_heads: int, head_dim: int, dtype: str) -> int:
        """Bytes one token slot takes in one layer of a cache, K and V: codes plus the
        per-token scales, ``2 * num_kv_heads * (head_dim * element bytes + 4 if int8)``
        (the per-layer fp8 scales and the region padding are not per token; see
        :attr:`nbytes`). The ledger's 8-bit and 16/32-bit storage formats use this.

        Args:
            num_kv_heads: KV heads, 1..65536.
            head_dim: elements per head, 1..65536.
            dtype: a storage dtype as :class:`KvCache` accepts.

        Returns:
            Bytes per token slot per layer.

        Raises:
            InvalidArgumentError: ``num_kv_heads`` or ``head_dim`` outside 1..65536 (or not
                an int), an unknown dtype.
        """
    def write(self, layer: int, k: _F32In, v: _F32In, slot_mapping: _IntArrayLike) -> None:
        """Store K and V of ``tokens`` tokens of layer ``layer`` at their slots, rounding to the
        storage dtype (nearest even); 8-bit caches quantize (int8: a scale per token and
        head; fp8: the layer's scales, calibrated by this write where still 0; see
        :class:`KvCache`). The GIL is released while it copies; C-contiguous ``k``,
        ``v`` (and an int64 ``slot_mapping``) are read in place, without a copy, and must
        not be written by another thread meanwhile.

        Args:
            layer: ``0..num_layers``.
            k: float32 ``[tokens, num_kv_heads, head_dim]`` or ``[tokens, num_kv_heads *
                head_dim]``, any strides (read in logical order: any other layout than
                C-contiguous, or a view of a cache, is copied first).
            v: float32, the shape of ``k``.
            slot_mapping: ``tokens`` int slots, ``block * block_size + offset``; -1 is padding,
                skipped (e.g. the ``slot_mapping`` of :meth:`BlockPool.step`).

        Raises:
            InvalidArgumentError: a bad layer, dtype or shape, a slot outside
                ``-1..num_blocks * block_size``, or (8-bit caches) a non-finite value in
                ``k`` or ``v``. Nothing is written on error.
        """
    def copy_blocks(self, pairs: npt.NDArray[np.integer[Any]] | Sequence[Sequence[int]] | _DLPack) -> None:
        """Copy whole blocks ``src -> dst`` for every ``(src, dst)`` row of ``pairs``, in every
        layer, K and V, in row order (e.g. the copy-on-write pairs of :meth:`BlockPool.step`).

        No pairs (``[]``, ``np.empty((0, 2))``) is a no-op.

        Args:
            pairs: int ``[k, 2]`` block ids.

        Raises:
            InvalidArgumentError: a block id outside ``0..num_blocks``, a bad shape or ragged
                rows; nothing is copied.
        """
    def export_blocks(self, blocks: _IntArrayLike) -> npt.NDArray[np.uint8]:
        """Copy whole blocks out of the cache, as bytes: per block, every layer's K and V
        codes as the cache stores them (and int8's per-token scales), the byte order the
        tiers below a pool store (:meth:`BlockPool.attach_tier_storage`). A block's bytes
        go back with :meth:`import_blocks`, into any block of this cache or of a cache of
        the same shape and dtype (fp8: with the same :meth:`set_fp8_scales`, which belong
        to no block).

        Args:
            blocks: block ids, each in ``0..num_blocks`` (a 1-D int array or list).

        Returns:
            uint8 ``[len(blocks), block_bytes]``, a new array; ``block_bytes`` is
            ``num_layers x block_size x`` :meth:`bytes_per_token`.

        Raises:
            InvalidArgumentError: naming ``blocks``: a block id out of range, a bad array.
            TypeError: ``blocks`` not an int array or sequence.
        """
    def import_blocks(self, blocks: _IntArrayLike, data: npt.NDArray[np.uint8]) -> None:
        """Write whole blocks from bytes :meth:`export_blocks` made: row ``i`` of ``data``
        becomes block ``blocks[i]`` (every layer, K and V, int8 scales). Codes a write
        never makes (an fp8 NaN, int8's -128) are then checked for by the kernels.

        Args:
            blocks: block ids, each in ``0..num_blocks``; a block listed twice takes its
                last row.
            data: uint8 ``[len(blocks), block_bytes]``, C-contiguous (read in place; copied
                first when it is a view of a :class:`KvCache`).

        Raises:
            InvalidArgumentError: naming the argument: a block id out of range, ``data`` of
                another shape or not C-contiguous. Nothing is written on error.
            TypeError: ``data`` not a uint8 numpy array, ``blocks`` not ints.
        """

@final
class KernelTuning:
    """How an attention call runs, never what it computes beyond f32 rounding: the kernel
    path, the split size and the KV heads per work item. Pass it as ``tuning=`` to
    :func:`decode_attention`, :func:`prefill_attention` and their paged forms. Immutable,
    comparable and hashable.

    Args:
        isa: one of :func:`kernel_paths` (``"scalar"``; ``"avx2"``, ``"avx512"`` on
            x86-64; ``"neon"`` on aarch64); None (default): the fastest.
        split_size: tokens per split of a long sequence's keys, merged by log-sum-exp
            (FlashDecoding): rounded up to whole blocks by decode, to key tiles by
            prefill; 0: never split; None (default): decode splits sequences longer than
            a quarter of a thread's share of the batch (at least 256 tokens per split),
            prefill only when there are too few query tiles.
        kv_heads_per_item: decode only: the KV heads one work item reads (it must divide
            the cache's KV heads; None, the default, is all of them, which reads each
            block as one contiguous run). Prefill refuses a tuning that sets it.

    Raises:
        TypeError: a positional argument, an ``isa`` that is not a str.
        InvalidArgumentError: an unknown path or one this CPU lacks, a negative
            ``split_size``, a ``kv_heads_per_item`` of 0, a bool or float where an int
            is meant.
    """

    def __new__(
        cls,
        *,
        isa: _KernelPath | None = None,
        split_size: int | None = None,
        kv_heads_per_item: int | None = None,
    ) -> KernelTuning: ...
    @property
    def isa(self) -> _KernelPath | None:
        """The forced kernel path, or None (the fastest)."""
    @property
    def split_size(self) -> int | None:
        """Tokens per split (0: never split; None: chosen per call)."""
    @property
    def kv_heads_per_item(self) -> int | None:
        """KV heads per decode work item (None: all of them)."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@overload
def decode_attention(
    cache: KvCache,
    layer: int,
    q: _F32In,
    block_tables: npt.NDArray[np.integer[Any]] | Sequence[Sequence[int]] | _DLPack,
    seq_lens: _IntArrayLike,
    scale: float | None = None,
    out: _F32In | None = None,
    return_lse: Literal[False] = False,
    *,
    logits_soft_cap: float | None = None,
    window_left: int | None = None,
    sink_tokens: int = 0,
    q_dtype: _Operand = "f32",
    pv_dtype: _Operand = "f32",
    tuning: KernelTuning | None = None,
) -> _F32Array:
    """Decode attention over the paged cache: one query token per sequence against its cached
    K/V in ``cache`` layer ``layer``.

    ``out[s, h] = softmax(scale * q[s, h] . K[s, h // g]^T) V[s, h // g]`` with
    ``g = Hq / Hkv``, over the keys the query sees. Positions are logical: key ``k`` is the
    token in slot ``k`` of the sequence's table, the query sits at ``p = seq_lens[i] - 1``;
    with ``window_left`` it sees keys ``p - k <= window_left`` and the sinks ``k <
    sink_tokens``. Only blocks holding a visible key are read, and only their table entries
    are checked: the other entries (a pad such as -1, a released block's stale id) are
    never read, so the time does not grow with the logical length. The GIL is released
    while it runs, on the threads of :func:`set_num_threads`. Meanwhile the arrays of
    :meth:`KvCache.key` / :meth:`KvCache.value` for ``layer`` must not be written from
    another thread (they alias the cache).

    The SIMD paths (``"avx512"``, ``"avx2"``, ``"neon"``) count a key as 0 when its
    probability is under 2^-64 of their running reference (at most 2^8 under the largest
    probability, so every such key is under 2^-64 of the largest): scaled, it would be a
    subnormal number, whose arithmetic costs a microcode assist per multiply (up to 6x the
    call's time with a dominant sink), and it moves the output by at most 2^-64 of the
    largest V per key.

    8-bit caches (``"int8"``, ``"fp8_e4m3"``, ``"fp8_e5m2"``) attend over the dequantized
    values (:meth:`KvCache.dequantized`) with f32 arithmetic on every path, within 1e-5
    of the output scale of an f64 reference on those values. The ``"avx512"``,
    ``"avx2"`` and ``"neon"`` paths read the one-byte codes and dequantize in registers
    (int8: sign extension + convert; fp8: bit moves into an f16 and ``vcvtph2ps`` /
    ``fcvtl``), folding the K scales into the scores and the V scales into the
    probabilities. Against the same
    attention over the unquantized f32 values, write ``e_K`` / ``e_V`` for the largest
    error of one stored K / V element: int8 ``0.5 * max|x| / 127`` of its row (its
    token's ``head_dim`` values); e4m3 ``2^-4 |x| + 2^-10 s``, e5m2 ``2^-3 |x| + 2^-17
    s`` (3 and 2 mantissa bits; the second term is half the subnormal step, ``s`` the
    head's scale), assuming no value beyond the calibrated range (those saturate).
    Each logit then moves by at most ``D = scale * max_t sum_i |q_i| e_K(t, i)``, each
    softmax weight by at most a factor ``exp(+-2 D)``, so each output moves by at most
    ``(exp(2 D) - 1) * max|V'| + max e_V`` (``V'`` the dequantized values; ``max|V'| <=
    max|V|`` for int8, ``<= (1 + 2^-4) max|V| + 2^-10 s_V`` for e4m3); the LSE by at most D.
    ``tests/attention/test_kv_quant.py`` checks this bound; benches/RESULTS.md has the typical
    errors (well below it).

    Precision is chosen by dtype: ``q_dtype`` is the query's in the scores ``q.K``,
    ``pv_dtype`` the probabilities' in ``P V``. ``("f32", "f32")``, the default, is exact
    on every cache. The other pairs are opt-in, each valid on the caches listed, and
    compute the same values on every path: a path with the matching instruction uses it,
    the others compute f32 FMAs on the rounded operands, so results agree across paths
    within f32 rounding, not bitwise. Against the exact result on the same cache (``K``,
    ``V`` the dequantized keys and values), each logit moves by at most ``D``, each output
    by at most ``(exp(2 D) - 1) * max|V|`` (plus the term given) and the LSE by at most
    ``D``:

    - ``("bf16", "f32")``, bf16 and fp8 caches: ``q`` rounded to bf16 (nearest even);
      the ``"avx512"`` path of a CPU with avx512_bf16 computes the scores with
      ``vdpbf16ps`` (bf16 products exact, f32 sums; fp8 codes are widened to bf16 in
      registers, which is exact, and need avx512vbmi too), the K scale multiplying the
      finished scores. ``D = scale * 2^-8 * sum_i |q_i K_i|``; on standard-normal data
      with d = 128 the output moves by about 2e-3 of its scale (benches/RESULTS.md).
    - ``("int8", "f32")``, int8 caches: ``q`` quantized per (sequence, query head) to
      int8 (symmetric, ``s_q = max|q| / 127``, round half to even); with avx512_vnni the
      ``"avx512"`` path computes exact integer dot products of the codes by
      ``vpdpbusd``, times ``s_q`` and each token's K scale. ``D = scale * (s_q / 2) *
      max_t sum_i |K(t, i)|``.
    - ``("f16", "f16")``, fp8 caches: on the ``"avx512"`` path of a CPU with
      avx512_fp16, for block size 16 and a head_dim that is a multiple of 64 (K and V
      scales within ``[2^-64, 2^64]``), each score is a sum of f16 products of the
      f16-rounded ``q`` (times a power of two per row, so that no f16 sum overflows) with
      the codes, ``head_dim / 4`` of them summed in f16 per lane, and each chunk of 16
      tokens' ``P V`` a sum of f16 products of the f16-rounded probabilities with the
      codes, summed in f16 over the chunk and added to f32 accumulators
      (``vfmadd231ph``); every other path, block size and head_dim computes exactly. ``D
      = scale * (head_dim / 4 + 3) * 2^-11 * max_t sum_i |q_i K_i|``, plus ``18 * 2^-11 *
      max|V|`` on each output.

    Args:
        cache: the KV cache.
        layer: ``0..cache.num_layers``.
        q: float32 ``[n, Hq, head_dim]``, ``Hq`` a multiple of the cache's KV heads, any
            strides; ``n = 0`` gives empty results.
        block_tables: int ``[n, max_blocks]``, logical block ``b`` in column ``b`` (e.g.
            :meth:`BlockPool.block_tables`); only the entries of blocks holding a visible key
            are read (entries past ``ceil(seq_lens[i] / block_size)`` never are).
        seq_lens: ``n`` logical lengths in tokens (0 gives a zero output and an LSE of -inf).
        scale: the softmax scale, positive and finite (default ``1 / sqrt(head_dim)``).
        out: C-contiguous, writeable float32 ``[n, Hq, head_dim]`` written in place and
            returned (default: a new array); it must not share memory with ``q`` or with any
            KvCache.
        return_lse: also return the log-sum-exp, to merge partial results.
        logits_soft_cap: Gemma-2's cap ``c > 0``: logits become ``c * tanh(logit / c)``
            before the softmax (default None: no cap). Every path computes it as ``c - 2c /
            (exp(2 logit / c) + 1)`` in f32, as :func:`prefill_attention` does up to f32
            rounding.
        window_left: sliding window in tokens: the query at ``p`` sees keys with ``p - k <=
            window_left`` (``window_left = window - 1`` for a window of ``window`` positions
            including the query's own; FlashInfer's ``window_left``); None (default): every
            key. An int >= 0.
        sink_tokens: attention sinks in tokens: keys ``k < sink_tokens`` are visible
            whatever the window (default 0). An int >= 0.
        q_dtype: the query's dtype in the scores: ``"f32"`` (default, exact), ``"bf16"``,
            ``"int8"`` or ``"f16"``, as the precision pairs above allow.
        pv_dtype: the probabilities' dtype in ``P V``: ``"f32"`` (default), or ``"f16"``
            with ``q_dtype="f16"``.
        tuning: how the call runs, never what it computes: a :class:`KernelTuning` (the
            kernel path, the split size, the KV heads per work item); None: chosen.

    Returns:
        float32 ``[n, Hq, head_dim]`` (``out`` when given); with ``return_lse=True`` the pair
        ``(out, lse)``, ``lse`` float32 ``[n, Hq]``, the natural-log sum of
        ``exp(scale * q.k)`` over the visible keys.

    Raises:
        InvalidArgumentError: a block holding a visible key whose entry is not a block of
            the pool (a pad or a released block inside the window or the sinks: the message
            names ``block_tables[i, b]``), a length beyond its table, head count or head_dim
            mismatches, a non-float32 ``q`` or ``out``, wrong shapes, an ``out`` that is not
            C-contiguous, not writable or shares memory with ``q`` or a cache, a bad
            ``scale`` or ``logits_soft_cap``, a bad ``layer``, ``window_left`` or
            ``sink_tokens`` (a negative value, a bool, a float, None for ``sink_tokens``),
            a tuning whose path this CPU lacks or whose ``kv_heads_per_item`` does not
            divide the KV heads, an unknown ``q_dtype`` or ``pv_dtype`` or a pair not valid
            on the cache (the message lists the valid ones). ``out`` is not written on any
            error.
        TypeError: ``tuning`` that is not a :class:`KernelTuning` or None, ``q_dtype`` or
            ``pv_dtype`` that is not a str.
    """
@overload
def decode_attention(
    cache: KvCache,
    layer: int,
    q: _F32In,
    block_tables: npt.NDArray[np.integer[Any]] | Sequence[Sequence[int]] | _DLPack,
    seq_lens: _IntArrayLike,
    scale: float | None = None,
    out: _F32In | None = None,
    *,
    return_lse: Literal[True],
    logits_soft_cap: float | None = None,
    window_left: int | None = None,
    sink_tokens: int = 0,
    q_dtype: _Operand = "f32",
    pv_dtype: _Operand = "f32",
    tuning: KernelTuning | None = None,
) -> tuple[_F32Array, _F32Array]: ...
@overload
def decode_attention_paged(
    cache: KvCache,
    layer: int,
    q: _F32In,
    kv_indptr: _IntArrayLike,
    kv_indices: _IntArrayLike,
    kv_last_page_len: _IntArrayLike,
    scale: float | None = None,
    out: _F32In | None = None,
    return_lse: Literal[False] = False,
    *,
    logits_soft_cap: float | None = None,
    window_left: int | None = None,
    sink_tokens: int = 0,
    q_dtype: _Operand = "f32",
    pv_dtype: _Operand = "f32",
    tuning: KernelTuning | None = None,
    kv_page_start: _IntArrayLike | None = None,
) -> _F32Array:
    """:func:`decode_attention` with the tables in FlashInfer's paged layout, as
    :meth:`BlockPool.flashinfer_tables` (and the hybrid pool's, with ``kv_page_start``)
    export them.

    A windowed sequence lists only its stored pages: with ``ps = kv_page_start[i]``,
    ``P`` pages and ``sp = min(ceil(sink_tokens / block_size), ps, P)``, page ``j`` is
    logical block ``j`` when ``j < sp`` (the sink pages) and ``ps + j - sp`` after (the
    window run). The logical length is ``(ps + P - sp - 1) * block_size +
    kv_last_page_len[i]`` when the window run is non-empty (``P > sp``); when every page is
    a sink page the sequence ends inside its sinks: ``(P - 1) * block_size +
    kv_last_page_len[i]`` (``ps`` only bounds ``sp``); 0 without pages. With
    ``kv_page_start`` all zeros (the default) this is FlashInfer's plain layout. Only the
    pages of blocks holding a visible key are read and checked; a visible key in a block
    that is not among the pages (before ``ps``, past the sinks) is an error.

    Args:
        cache: the KV cache.
        layer: ``0..cache.num_layers``.
        q: float32 ``[n, Hq, head_dim]``.
        kv_indptr: ``n + 1`` non-decreasing offsets into ``kv_indices``.
        kv_indices: the block ids of all sequences' stored pages, concatenated.
        kv_last_page_len: ``n`` token counts of each sequence's last page, in
            ``1..=block_size`` (0 for a sequence without pages).
        scale: as for :func:`decode_attention`.
        out: as for :func:`decode_attention`.
        return_lse: as for :func:`decode_attention`.
        logits_soft_cap: as for :func:`decode_attention`.
        window_left: as for :func:`decode_attention`.
        sink_tokens: as for :func:`decode_attention`; also places the sink pages.
        q_dtype: as for :func:`decode_attention`.
        pv_dtype: as for :func:`decode_attention`.
        tuning: as for :func:`decode_attention`.
        kv_page_start: ``n`` logical block indices (>= 0) of each sequence's first page
            after its sink pages (default None: zeros).

    Returns:
        As :func:`decode_attention`.

    Raises:
        InvalidArgumentError: as :func:`decode_attention`, and offsets that are not a range
            inside ``kv_indices``, a last-page length outside ``1..=block_size``, a
            ``kv_page_start`` that is not ``n`` ints >= 0 or whose logical length
            overflows, a visible key whose block is not among the pages (named
            ``kv_page_start``) or whose page is not a block of the pool (``kv_indices``).
    """
@overload
def decode_attention_paged(
    cache: KvCache,
    layer: int,
    q: _F32In,
    kv_indptr: _IntArrayLike,
    kv_indices: _IntArrayLike,
    kv_last_page_len: _IntArrayLike,
    scale: float | None = None,
    out: _F32In | None = None,
    *,
    return_lse: Literal[True],
    logits_soft_cap: float | None = None,
    window_left: int | None = None,
    sink_tokens: int = 0,
    q_dtype: _Operand = "f32",
    pv_dtype: _Operand = "f32",
    tuning: KernelTuning | None = None,
    kv_page_start: _IntArrayLike | None = None,
) -> tuple[_F32Array, _F32Array]: ...
@overload
def prefill_attention(
    cache: KvCache,
    layer: int,
    q: _F32In,
    qo_indptr: _IntArrayLike,
    block_tables: npt.NDArray[np.integer[Any]] | Sequence[Sequence[int]] | _DLPack,
    seq_lens: _IntArrayLike,
    *,
    q_positions: _IntArrayLike | None = None,
    causal: bool = True,
    chunk_size: int | None = None,
    window_left: int | None = None,
    sink_tokens: int | None = None,
    scale: float | None = None,
    logits_soft_cap: float | None = None,
    out: _F32In | None = None,
    return_lse: Literal[False] = False,
    q_dtype: _Operand = "f32",
    pv_dtype: _Operand = "f32",
    tuning: KernelTuning | None = None,
) -> _F32Array:
    """Multi-query attention over the paged cache: prefill, chunked prefill, speculative
    verification, video chunks.

    Sequence ``i`` owns query rows ``qo_indptr[i]:qo_indptr[i + 1]`` of ``q`` and attends
    over its ``seq_lens[i]`` cached tokens of layer ``layer``
    (``out = softmax(scale * q K^T + mask) V`` per query head, ``K``/``V`` of KV head
    ``h // g``, ``g = Hq / Hkv``). Positions are logical: key ``j`` of a sequence (the
    token in slot ``j`` of its block table) has position ``j``; query rows take the
    positions of the last ``n_q`` keys (chunked prefill after writing the chunk's K/V)
    unless ``q_positions`` gives them. The masks combine (a key is visible when every
    rule allows it): ``causal`` (``k <= p``), block-causal with ``chunk_size`` ``c``
    (``k // c <= p // c``, replaces the token-causal rule), ``window_left`` ``w``
    (``p - k <= w``) with ``sink_tokens`` ``s`` (keys ``k < s`` visible whatever the
    window, still subject to the causal or block-causal rule); ``causal=False`` without
    chunks is bidirectional. Only the blocks holding a key that some query of the sequence
    sees are read, and only their table entries are checked: blocks a window left behind
    may be pads (e.g. -1) or stale ids. The GIL is released while it runs, on the threads
    of :func:`set_num_threads`; the arrays of :meth:`KvCache.key` / :meth:`KvCache.value`
    for ``layer`` must not be written from another thread meanwhile.

    8-bit caches are dequantized (code x scale, f32) as each key tile is packed, so every
    path computes on the values of :meth:`KvCache.dequantized`; the error against an
    unquantized cache follows :func:`decode_attention`'s bound, row by row. As in
    :func:`decode_attention`, the SIMD paths count a key under 2^-64 of their running
    reference probability as 0 (a subnormal operand would cost an assist per multiply).

    Args:
        cache: the KV cache.
        layer: ``0..cache.num_layers``.
        q: float32 ``[total_q, Hq, head_dim]``, ``Hq`` a multiple of the cache's KV heads
            (any strides: read in place when C-contiguous, else copied).
        qo_indptr: ``n + 1`` int row offsets, from 0, non-decreasing, ending at ``total_q``.
        block_tables: int ``[n, max_blocks]``, logical block ``b`` in column ``b``; only
            the entries of blocks holding a visible key are read (entries past
            ``ceil(seq_lens[i] / block_size)`` never are).
        seq_lens: ``n`` logical lengths in tokens (keys of each sequence).
        q_positions: ``total_q`` int logical positions (>= 0) of the query rows; default
            the last ``n_q`` of ``seq_lens[i]``, which then needs ``n_q <= seq_lens[i]``.
        causal: the causal rule (default True).
        chunk_size: tokens per chunk of the block-causal rule (>= 1; needs ``causal``).
        window_left: keys at most this many positions (tokens) behind the query are
            visible (``window - 1``; FlashInfer's ``window_left``); None: no window.
        sink_tokens: the first positions always visible under the window (tokens).
        scale: the softmax scale, positive and finite (default ``1 / sqrt(head_dim)``).
        logits_soft_cap: Gemma-2's cap ``c > 0``: logits become ``c * tanh(logit / c)``.
        out: C-contiguous float32 ``[total_q, Hq, head_dim]`` written in place and
            returned (default: a new array); must not share memory with ``q`` or with any
            KvCache.
        return_lse: also return the log-sum-exp, to merge partial results.
        q_dtype: the query's dtype in the scores: ``"f32"`` (default, exact) or
            ``"bf16"`` (bf16 and fp8 caches), as in :func:`decode_attention`, with its
            bound; the ``"avx512"`` path of a CPU with avx512_bf16 uses ``vdpbf16ps`` on
            bf16 caches.
        pv_dtype: the probabilities' dtype in ``P V``: ``"f32"`` (default) or ``"bf16"``
            (bf16 caches, with either ``q_dtype``): the probabilities rounded to bf16
            (nearest even), ``vdpbf16ps`` over token pairs on the ``"avx512"`` path of a
            CPU with avx512_bf16 (f32 FMAs on the rounded probabilities elsewhere); the
            softmax sum stays f32 on the unrounded ones, so each output moves by at most
            ``2^-9 * max|V|`` more.
        tuning: a :class:`KernelTuning`: the kernel path and the split size (keys per
            split of a query tile's key range, rounded up to key tiles; 0: never; None:
            only when there are too few query tiles); ``kv_heads_per_item`` must be None.

    Returns:
        float32 ``[total_q, Hq, head_dim]`` (``out`` when given; a row that sees no key
        gets zeros); with ``return_lse=True`` the pair ``(out, lse)``, ``lse`` float32
        ``[total_q, Hq]``, the natural-log sum of ``exp(logit)`` over the visible keys
        (``-inf`` for a row that sees none).

    Raises:
        InvalidArgumentError: naming the argument: wrong dtypes or shapes, head counts or
            head_dim not matching the cache, bad ``qo_indptr`` offsets, more default-
            positioned queries than keys, a negative position, a block holding a visible
            key whose entry is not a block of the pool (a pad or a released block inside
            a window, named ``block_tables[i, b]``) or a length beyond its table,
            ``chunk_size`` of 0 or without ``causal``,
            a negative ``window_left``/``sink_tokens``, a bool or float where an int is
            meant, a ``scale`` or soft cap that is not positive and finite in float32,
            an ``out`` that is not C-contiguous, not writable or overlaps ``q`` or the
            cache, a tuning whose path this CPU lacks or that sets ``kv_heads_per_item``,
            an unknown ``q_dtype`` or ``pv_dtype`` or a pair not valid on the cache (the
            message lists the valid ones). ``out`` is not written on any error.
        TypeError: ``tuning`` that is not a :class:`KernelTuning` or None, ``q_dtype`` or
            ``pv_dtype`` that is not a str.
    """
@overload
def prefill_attention(
    cache: KvCache,
    layer: int,
    q: _F32In,
    qo_indptr: _IntArrayLike,
    block_tables: npt.NDArray[np.integer[Any]] | Sequence[Sequence[int]] | _DLPack,
    seq_lens: _IntArrayLike,
    *,
    q_positions: _IntArrayLike | None = None,
    causal: bool = True,
    chunk_size: int | None = None,
    window_left: int | None = None,
    sink_tokens: int | None = None,
    scale: float | None = None,
    logits_soft_cap: float | None = None,
    out: _F32In | None = None,
    return_lse: Literal[True],
    q_dtype: _Operand = "f32",
    pv_dtype: _Operand = "f32",
    tuning: KernelTuning | None = None,
) -> tuple[_F32Array, _F32Array]: ...
@overload
def prefill_attention_paged(
    cache: KvCache,
    layer: int,
    q: _F32In,
    qo_indptr: _IntArrayLike,
    kv_indptr: _IntArrayLike,
    kv_indices: _IntArrayLike,
    kv_last_page_len: _IntArrayLike,
    *,
    q_positions: _IntArrayLike | None = None,
    causal: bool = True,
    chunk_size: int | None = None,
    window_left: int | None = None,
    sink_tokens: int | None = None,
    scale: float | None = None,
    logits_soft_cap: float | None = None,
    out: _F32In | None = None,
    return_lse: Literal[False] = False,
    q_dtype: _Operand = "f32",
    pv_dtype: _Operand = "f32",
    tuning: KernelTuning | None = None,
    kv_page_start: _IntArrayLike | None = None,
) -> _F32Array:
    """:func:`prefill_attention` with the tables in FlashInfer's paged layout, as
    :meth:`BlockPool.flashinfer_tables` (and the hybrid pool's, with ``kv_page_start``)
    export them. Pages map to logical blocks, and give the logical length, as for
    :func:`decode_attention_paged` (``sink_tokens`` places the sink pages); only the pages
    of blocks holding a key some query sees are read and checked.

    Args:
        cache: the KV cache.
        layer: ``0..cache.num_layers``.
        q: as for :func:`prefill_attention`.
        qo_indptr: as for :func:`prefill_attention`.
        kv_indptr: ``n + 1`` non-decreasing offsets into ``kv_indices``.
        kv_indices: the block ids of all sequences' stored pages, concatenated.
        kv_last_page_len: ``n`` token counts of each sequence's last page, in
            ``1..=block_size`` (0 for a sequence without pages).
        q_positions: as for :func:`prefill_attention`.
        causal: as for :func:`prefill_attention`.
        chunk_size: as for :func:`prefill_attention`.
        window_left: as for :func:`prefill_attention`.
        sink_tokens: as for :func:`prefill_attention`.
        scale: as for :func:`prefill_attention`.
        logits_soft_cap: as for :func:`prefill_attention`.
        out: as for :func:`prefill_attention`.
        return_lse: as for :func:`prefill_attention`.
        q_dtype: as for :func:`prefill_attention`.
        pv_dtype: as for :func:`prefill_attention`.
        tuning: as for :func:`prefill_attention`.
        kv_page_start: ``n`` logical block indices (>= 0) of each sequence's first page
            after its sink pages (default None: zeros), as for
            :func:`decode_attention_paged`.

    Returns:
        As :func:`prefill_attention`.

    Raises:
        InvalidArgumentError: as :func:`prefill_attention`, and offsets that are not a
            range inside ``kv_indices``, a last-page length outside ``1..=block_size``, a
            ``kv_page_start`` that is not ``n`` ints >= 0 or whose logical length
            overflows, a visible key whose block is not among the pages (named
            ``kv_page_start``) or whose page is not a block of the pool (``kv_indices``).
    """
@overload
def prefill_attention_paged(
    cache: KvCache,
    layer: int,
    q: _F32In,
    qo_indptr: _IntArrayLike,
    kv_indptr: _IntArrayLike,
    kv_indices: _IntArrayLike,
    kv_last_page_len: _IntArrayLike,
    *,
    q_positions: _IntArrayLike | None = None,
    causal: bool = True,
    chunk_size: int | None = None,
    window_left: int | None = None,
    sink_tokens: int | None = None,
    scale: float | None = None,
    logits_soft_cap: float | None = None,
    out: _F32In | None = None,
    return_lse: Literal[True],
    q_dtype: _Operand = "f32",
    pv_dtype: _Operand = "f32",
    tuning: KernelTuning | None = None,
    kv_page_start: _IntArrayLike | None = None,
) -> tuple[_F32Array, _F32Array]: ...
def read_bandwidth(
    nbytes: int | None = None,
    threads: int | None = None,
    *,
    cache: KvCache | None = None,
    passes: int | None = None,
    clock: Literal["wall", "cpu"] = "wall",
    block_tables: _IntArrayLike | None = None,
    seq_lens: _IntArrayLike | None = None,
    layer: int = 0,
) -> float:
    """Read bandwidth in bytes/s: the best of ``passes`` multi-accumulator SIMD sweeps with
    ``threads`` threads, each thread streaming one contiguous share.

    Without ``cache`` the sweep reads a fresh ``nbytes`` buffer of 2 MiB-aligned,
    huge-page-advised memory, allocated like a KV cache. With ``cache`` it reads that
    cache's own storage (every layer's K and V, scales and padding: ``cache.nbytes``
    bytes plus under 4 KiB per layer) front to back: the pages the kernel reads, the
    fair ceiling for :func:`decode_attention` on a machine (a VM) where the read rate
    depends on where pages landed.

    With ``cache``, ``block_tables`` and ``seq_lens`` it reads instead exactly what
    :func:`decode_attention` on ``layer`` reads for those tables (every key visible),
    in its order and split into its work items: block by block in table order, each
    block's K and V tiles of every KV head (one run of ``2 * num_kv_heads *
    block_size * head_dim`` elements; whole blocks, a last block's unused slots too)
    and, for int8, its scales.
    The rate counts those bytes. With a scattered table each block starts at a random
    address, and a short run (an int8 block of 8 heads of 16 x 128 is 32 KiB) reads
    slower than a stream: this is the ceiling of that call's access pattern.

    Args:
        nbytes: bytes of the fresh buffer, 1 MiB..1 TiB (default 256 MiB); not with
            ``cache``.
        threads: threads, ``1..=1024`` (default: the kernel pool's, see
            :func:`set_num_threads`).
        cache: a :class:`KvCache` of at least 1 MiB to read instead.
        passes: sweeps, ``1..=1000`` (default 7); the best is kept.
        clock: ``"wall"`` (default) times a sweep from its start to its last thread's end;
            ``"cpu"`` by the CPU seconds of its busiest thread, which leave out the time a
            shared virtual machine's CPU was taken away (steal) or given to another
            process, as kernel calls timed by thread CPU time do.
        block_tables: int ``[n, max_blocks]``, as for :func:`decode_attention`; with
            ``seq_lens`` and ``cache`` only.
        seq_lens: ``n`` lengths in tokens, as for :func:`decode_attention`.
        layer: the cache layer read with ``block_tables`` (default 0).

    Raises:
        TypeError: ``clock`` not a str; a table or length not an integer array.
        InvalidArgumentError: both ``nbytes`` and ``cache``, ``nbytes`` outside
            1 MiB..1 TiB, a cache smaller than 1 MiB, ``passes`` outside ``1..=1000``, a
            thread count outside ``1..=1024``, ``clock`` neither ``"wall"`` nor ``"cpu"``;
            ``block_tables`` without ``seq_lens`` (or the reverse), either or ``layer``
            without ``cache``, ``layer`` out of range or without tables, a table or length
            :func:`decode_attention` would refuse, or tables that read under 1 MiB.
    """
def peak_flops(threads: int | None = None, *, clock: Literal["wall", "cpu"] = "wall") -> float:
    """Peak f32 FLOP/s of register-only FMA chains (2 FLOP per lane per FMA), best of 3 runs.

    Args:
        threads: threads, ``1..=1024`` (default: the kernel pool's).
        clock: ``"wall"`` (default) or ``"cpu"``, as for :func:`read_bandwidth`.

    Raises:
        TypeError: ``clock`` not a str.
        InvalidArgumentError: a thread count outside ``1..=1024``, or ``clock`` neither
            ``"wall"`` nor ``"cpu"``.
    """
def set_num_threads(n: int) -> None:
    """Set the threads of the kernel pool (initially ``PYKVPOOL_NUM_THREADS`` or all CPUs);
    calls already running keep their pool. A call that one thread can do (a one-thread
    pool, or a single work item) runs on the calling thread, without the hand-over to the
    pool (30-100 us on a shared machine).

    Args:
        n: threads, ``1..=1024``.

    Raises:
        InvalidArgumentError: ``n`` outside ``1..=1024``, or the OS refused the threads.
    """
def get_num_threads() -> int:
    """Threads of the kernel pool.

    Raises:
        InvalidArgumentError: the pool could not be started (the OS refused the threads).
    """
def cpu_features() -> list[str]:
    """SIMD features of this CPU relevant to the kernels.

    Returns:
        Feature names, e.g. ``["avx2", "fma", "avx512bf16"]`` or ``["neon"]``.
    """
def kernel_paths() -> list[str]:
    """Decode-attention paths this CPU supports, fastest last: ``"scalar"`` always, then
    ``"avx2"`` and ``"avx512"`` on x86-64 or ``"neon"`` on aarch64 when the CPU has them.
    """

# ------------------------------------------------------------------- prefix caching

EVENT_STORED: Final[int]
"""``kind`` of a :meth:`BlockPool.drain_events` event: a block was registered in the cache."""
EVENT_REMOVED: Final[int]
"""``kind`` of an event: a block left the cache (evicted)."""
EVENT_ALL_CLEARED: Final[int]
"""``kind`` of an event: :meth:`BlockPool.reset_prefix_cache` cleared the cache."""
EVICTION_POLICIES: Final[tuple[str, ...]]
"""The eviction policy names the pools and the simulator accept: ``("lru", "fifo", "lfu",
"priority")``. The one list: the CLI, replay, search and simulator read it."""
TIER_EVICTION_POLICIES: Final[tuple[str, ...]]
"""The orders a tier below the pool accepts (``BlockPool(tier_eviction=)``): ``("lru",
"fifo", "lfu", "s3fifo")``. The one list: replay and the CLI read it."""

@final
class CacheStats:
    """Prefix-cache metrics of a pool, taken by :meth:`BlockPool.cache_stats`
    (hits count successful admissions). Counts are in blocks, tokens and admissions.
    """

    @property
    def policy(self) -> str:
        """Eviction policy name."""
    @property
    def group_hit_blocks(self) -> list[int]:
        """Per layer group, in group order (one entry for a pool without groups): blocks
        the admissions took from the cache in that group (a windowed group takes only
        its sinks and window).
        """
    @property
    def queries(self) -> int:
        """Admissions that looked the cache up."""
    @property
    def query_blocks(self) -> int:
        """Prompt blocks looked up (full blocks for token ids; every key for block keys)."""
    @property
    def hit_blocks(self) -> int:
        """Leading prompt blocks found cached, before the last-token rule."""
    @property
    def query_tokens(self) -> int:
        """Prompt tokens admitted."""
    @property
    def hit_tokens(self) -> int:
        """Prompt tokens returned as cached (after the last-token rule)."""
    @property
    def stored_blocks(self) -> int:
        """Blocks registered in the cache so far."""
    @property
    def evictions(self) -> int:
        """Idle cached blocks reclaimed by allocations so far."""
    @property
    def collisions(self) -> int:
        """Lookups that found a key whose block failed verification: parent, extra key or
        token ids (a miss)."""
    @property
    def cow_hits(self) -> int:
        """Admissions that took a copy-on-write partial hit."""
    @property
    def cached_blocks(self) -> int:
        """Blocks in the cache now (live or idle)."""
    @property
    def idle_blocks(self) -> int:
        """Cached blocks with refcount 0."""
    @property
    def evictable_blocks(self) -> int:
        """Idle blocks that are not hard-pinned (counted in ``num_free_blocks``)."""
    @property
    def pinned_blocks(self) -> int:
        """Cached blocks under at least one hard pin."""
    @property
    def num_pins(self) -> int:
        """Live pins."""
    @property
    def clock(self) -> int:
        """Current logical time (see :meth:`BlockPool.set_clock`)."""
    @property
    def pending_events(self) -> int:
        """Events recorded and not drained yet (at most ``max_events``)."""
    @property
    def dropped_events(self) -> int:
        """Events dropped so far, oldest first, because the queue was full."""
    @property
    def hit_rate(self) -> float:
        """``hit_tokens / query_tokens`` (0.0 before any query)."""
    @property
    def block_hit_rate(self) -> float:
        """``hit_blocks / query_blocks`` (0.0 before any query)."""
    def as_dict(self) -> dict[str, int | float | str]:
        """All fields as a dict.

        Returns:
            ``{name: value}`` for every property of this class: ints, the rates floats,
            ``policy`` a str.
        """

