"""Type stubs for the compiled core ``pykvpool._native`` (checked by ``mypy.stubtest``).

Units: *tokens* and *blocks* unless a name says *bytes*. Integer arguments named ``*_ids``
or ``num_tokens`` accept any 1-D integer numpy array (any integer dtype, any strides) or a
Python sequence of ints. Scalar integer arguments accept Python and numpy ints; floats,
bools, strings and ints outside int64 raise :class:`InvalidArgumentError` (not ``TypeError``),
as do arrays of those. Every call that fails raises a :class:`KvPoolError` subclass and
leaves the pool unchanged.
"""

from collections.abc import Sequence
from typing import Any, Final, Literal, SupportsIndex, TypeAlias, overload

from typing_extensions import final

import numpy as np
import numpy.typing as npt

__version__: Final[str]
__all__ = [
    "__version__",
    "BlockPool",
    "BlockTableBuffer",
    "CacheStats",
    "DuplicateSequenceError",
    "EVENT_ALL_CLEARED",
    "EVENT_REMOVED",
    "EVENT_STORED",
    "InvalidArgumentError",
    "InvariantError",
    "KvPoolError",
    "PoolExhaustedError",
    "PoolStats",
    "UnknownSequenceError",
    "KvCache",
    "cpu_features",
    "decode_attention",
    "decode_attention_paged",
    "get_num_threads",
    "kernel_paths",
    "peak_flops",
    "read_bandwidth",
    "set_num_threads",
    "run_simulation",
    "synthesize_workload",
]

_IntArrayLike: TypeAlias = npt.NDArray[np.integer[Any]] | Sequence[SupportsIndex]
_I32Array: TypeAlias = npt.NDArray[np.int32]
_I64Array: TypeAlias = npt.NDArray[np.int64]
_U64Array: TypeAlias = npt.NDArray[np.uint64]
_KeysLike: TypeAlias = npt.NDArray[np.integer[Any]] | Sequence[SupportsIndex]

# ---------------------------------------------------------------------------- errors

class KvPoolError(Exception):
    """Base class of every pykvpool error."""

class PoolExhaustedError(KvPoolError, MemoryError):
    """Not enough free blocks for the whole operation; nothing was changed.

    ``requested`` and ``free`` give the numbers, in blocks.
    """

    requested: int
    free: int

class UnknownSequenceError(KvPoolError, KeyError):
    """A sequence id that is not live in the pool; nothing was changed."""

    seq_id: int

class InvalidArgumentError(KvPoolError, ValueError):
    """A rejected argument (size, count, shape, dtype, index); nothing was changed."""

class DuplicateSequenceError(InvalidArgumentError):
    """A sequence id that is already live (add or fork target); nothing was changed."""

    seq_id: int

class InvariantError(KvPoolError, AssertionError):
    """An internal consistency check failed: always a pykvpool bug."""

# ------------------------------------------------------------------------------ pool

@final
class PoolStats:
    """Occupancy snapshot of a :class:`BlockPool`."""

    @property
    def block_size(self) -> int:
        """Token slots per block."""
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
        """Distinct filled token slots in used blocks (a shared token counts once)."""
    @property
    def shared_blocks(self) -> int:
        """Used blocks referenced by more than one sequence."""
    @property
    def cow_copies(self) -> int:
        """Copy-on-write block copies since the pool was created."""
    @property
    def empty_slots(self) -> int:
        """Unfilled token slots in used blocks: ``used_blocks * block_size - stored_tokens``."""
    @property
    def utilization(self) -> float:
        """``stored_tokens / (used_blocks * block_size)``; 1.0 when no block is used."""
    def as_dict(self) -> dict[str, int | float]:
        """All fields as a dict."""

@final
class BlockPool:
    """A paged KV-cache block pool: ``num_blocks`` blocks of ``block_size`` token slots.

    Each live sequence (a caller-chosen non-negative int64 id) owns a block table mapping
    logical block ``i`` to a physical block id. Token ``t`` of a sequence lives at slot
    ``table[t // block_size] * block_size + t % block_size``.

    Thread-safe: calls from several Python threads are serialized by an internal lock,
    and the GIL is released while the core works, except for ``add_sequence``,
    ``add_sequence_tokens``, ``step`` and ``free`` calls whose work (sequences plus new
    tokens, or blocks freed) is below 4,096: those finish within about 10 microseconds,
    where releasing and retaking the GIL would add a sizeable share.

    With ``prefix_caching=True`` the pool caches full blocks by content (see the
    prefix-caching methods below; trace replay lives in :mod:`pykvpool.prefix_replay`):

    - ``eviction``: which idle cached block an allocation reclaims once no never-cached
      block is free (only leaves of the cache tree: a sequence's tail before its head):
      ``"lru"`` (default) the least recently used, where a block is used when it is
      stored, when an admission's lookup hits it and when its last holder releases it;
      ``"fifo"`` the earliest stored; ``"lfu"`` the fewest lookup hits, then the least
      recently used; ``"priority"`` the lowest soft-pin priority (0 without), then the
      least recently used;
    - ``verify_tokens`` (default True): keep each cached block's token ids
      (``4 * block_size`` bytes per block) and compare them on a hit, so a hash collision
      is a miss, never wrong KV;
    - ``cow_partial_hit`` (default False): when a fully cached prompt must recompute its
      last token, copy its last block (a copy-on-write pair) instead of recomputing it;
    - ``record_events`` (default False): record stored/removed/cleared events for
      :meth:`drain_events`;
    - ``max_events`` (default 100,000; needs ``record_events=True``): capacity of the event
      queue, in events (about 80 bytes each). When it is full a new event drops the oldest
      undrained one and counts it in :attr:`CacheStats.dropped_events`, so memory stays
      bounded however long nobody drains;
    - ``hash_bits`` (default 128): keep only the low bits of each key (tests force
      collisions with it).

    Raises:
        InvalidArgumentError: ``num_blocks`` not in ``1..=2**30`` or ``block_size`` not in
            ``1..=65536``; an unknown eviction policy; ``hash_bits`` not in ``1..=128``;
            ``max_events`` not in ``1..=2**24`` or given without ``record_events=True``;
            cache options given without ``prefix_caching=True``.
    """

    def __new__(
        cls,
        num_blocks: int,
        block_size: int,
        *,
        prefix_caching: bool = False,
        eviction: str | None = None,
        verify_tokens: bool | None = None,
        cow_partial_hit: bool | None = None,
        record_events: bool | None = None,
        hash_bits: int | None = None,
        max_events: int | None = None,
    ) -> BlockPool: ...
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
    @property
    def block_size(self) -> int:
        """Token slots per block."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: free blocks plus idle cached blocks that
        may be evicted (not hard-pinned)."""
    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence (idle cached blocks are not used)."""
    @property
    def num_seqs(self) -> int:
        """Live sequences."""
    def __len__(self) -> int: ...
    def __contains__(self, seq: object, /) -> bool: ...
    def add_sequence(self, seq_id: int, prompt_len: int = 0) -> _I64Array:
        """Add sequence ``seq_id`` holding ``prompt_len`` tokens.

        Returns:
            The int64 slots of the ``prompt_len`` tokens, in order.

        Raises:
            DuplicateSequenceError: ``seq_id`` is live.
            PoolExhaustedError: fewer than ``ceil(prompt_len / block_size)`` free blocks.
            InvalidArgumentError: negative id or length, or more than ``2**27`` tokens
                (one call adds at most ``2**27`` tokens; add longer prompts in chunks).
        """
    def append(self, seq_id: int, num_tokens: int = 1) -> tuple[_I64Array, _I64Array]:
        """Append ``num_tokens`` tokens to ``seq_id``, allocating blocks as needed.

        If the last block is partly filled and shared (after :meth:`fork`), the sequence
        first gets a private copy of it.

        Returns:
            ``(slots, cow)``: int64 slots of the new tokens, and an int64 ``[k, 2]`` array of
            ``(src, dst)`` block pairs whose filled slots the caller must copy (k <= 1).

        Raises:
            UnknownSequenceError, PoolExhaustedError, InvalidArgumentError (also for more
            than ``2**27`` tokens in one call).
        """
    def step(
        self, seq_ids: _IntArrayLike, num_tokens: _IntArrayLike | int | None = None
    ) -> tuple[_I64Array, _I64Array, _I32Array]:
        """One scheduler step: append ``num_tokens[i]`` tokens (default 1; an int applies
        to all) to ``seq_ids[i]`` for every i, atomically.

        Returns:
            ``(slot_mapping, cow_pairs, seq_lens)``: int64 slots of all new tokens in batch
            order; int64 ``[k, 2]`` copy-on-write ``(src, dst)`` block pairs; int32 length of
            each sequence after the step, in tokens.

        Raises:
            PoolExhaustedError: the whole step needs more blocks than are free (nothing
                was appended to any sequence).
            UnknownSequenceError: an id is not live.
            InvalidArgumentError: duplicate ids, negative counts, lengths that differ,
                non-integer or non-1-D arrays, more than ``2**27`` tokens in total.
        """
    def fork(self, parent: int, child: int) -> None:
        """Create ``child`` sharing every block of ``parent`` (refcounts go up; no copy).

        Raises:
            UnknownSequenceError: ``parent`` is not live.
            DuplicateSequenceError: ``child`` is live.
        """
    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Drop the last ``num_tokens`` tokens of ``seq_id``; blocks left empty lose this
        sequence's reference (freed at zero).

        Raises:
            UnknownSequenceError; InvalidArgumentError if ``num_tokens`` exceeds the length.
        """
    def free(self, seq_id: int) -> None:
        """Remove ``seq_id``; each of its blocks loses a reference and is freed at zero.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
        """
    def free_batch(self, seq_ids: _IntArrayLike) -> None:
        """Free several sequences; all ids are checked before any is freed.

        Raises:
            UnknownSequenceError, InvalidArgumentError (duplicate ids).
        """
    def blocks_needed(self, seq_id: int, num_tokens: int = 1) -> int:
        """Blocks that appending ``num_tokens`` to ``seq_id`` would allocate now,
        copy-on-write included."""
    def seq_len(self, seq_id: int) -> int:
        """Length of ``seq_id`` in tokens. Raises UnknownSequenceError."""
    def seq_ids(self) -> _I64Array:
        """Live sequence ids, ascending."""
    def block_table(self, seq_id: int) -> _I32Array:
        """The block table of ``seq_id`` (physical block ids), a copy."""
    def refcount(self, block_id: int) -> int:
        """References to physical block ``block_id``. Raises InvalidArgumentError when out
        of range."""
    def block_tables(
        self, seq_ids: _IntArrayLike, max_blocks: int | None = None, pad: int = ...
    ) -> _I32Array:
        """Block tables of ``seq_ids`` as an int32 ``[len(seq_ids), max_blocks]`` array
        padded with ``pad`` (default -1). ``max_blocks`` defaults to the longest table.

        Raises:
            UnknownSequenceError; InvalidArgumentError if a table is longer than
            ``max_blocks`` or the array would exceed ``2**28`` entries.
        """
    def flashinfer_tables(self, seq_ids: _IntArrayLike) -> tuple[_I32Array, _I32Array, _I32Array]:
        """FlashInfer's paged layout: ``(kv_indptr [n + 1], kv_indices [nnz],
        kv_last_page_len [n])``, all int32. ``kv_last_page_len`` is in
        ``1..=block_size``, or 0 for an empty sequence."""
    def stats(self) -> PoolStats:
        """Occupancy snapshot. O(table entries)."""
    def check_invariants(self) -> None:
        """Verify refcounts against tables, the free list, block accounting and table
        lengths, and with prefix caching the cache: each key maps to one block and back,
        idle cached blocks have refcount 0 and are queued for eviction exactly when they
        are unpinned leaves, no free-list block is cached, parents outlive children.
        Raises InvariantError naming the first broken invariant."""

    # -- prefix caching (pools built with prefix_caching=True; others raise
    # -- InvalidArgumentError from every method below)
    @property
    def prefix_caching(self) -> bool:
        """Whether this pool caches prefixes."""
    def add_sequence_tokens(
        self, seq_id: int, token_ids: _IntArrayLike, extra_key: int | None = None
    ) -> tuple[int, _I64Array, _I64Array]:
        """Admit ``seq_id`` with its prompt token ids (any integer dtype, each in
        ``0..2**32``), reusing the longest cached prefix of full blocks.

        ``extra_key`` (``0..2**63``: adapter id, tenant salt) enters every block's key:
        prompts with different extra keys never share blocks. At least one prompt token is
        always left to compute.

        Returns:
            ``(cached_tokens, slots, cow)``: the number of leading prompt tokens whose KV is
            reused; the int64 slots of the remaining ``len(token_ids) - cached_tokens``
            tokens; an int64 ``[k, 2]`` array of ``(src, dst)`` blocks to copy before
            computing (k <= 1, only with ``cow_partial_hit``).

        Raises:
            DuplicateSequenceError, PoolExhaustedError (nothing changed),
            InvalidArgumentError (negative or too large ids, non-integer or non-1-D arrays,
            caching off).
        """
    def add_sequence_block_keys(
        self, seq_id: int, block_keys: _KeysLike, prompt_len: int
    ) -> tuple[int, _I64Array]:
        """Admit ``seq_id`` from a trace giving block ids instead of tokens (Mooncake's
        ``hash_ids``): exactly ``ceil(prompt_len / block_size)`` keys, each standing for
        one block's chained content (equal keys = equal content, prefix and fill). Keys
        are a 1-D array of ints in ``0..2**64`` or a uint64 ``[n, 2]`` array of 128-bit
        keys as ``(high, low)`` halves. The last key may stand for a partly filled block
        (``prompt_len % block_size`` tokens): it is cached with its fill, matches only a
        later prompt's partly filled last block of the same key and fill (never a full
        block: a lookup never reuses more tokens than were written), and the sequence's
        first append copies it (copy-on-write). A fill mismatch counts as a collision.

        Returns:
            ``(cached_tokens, slots)`` as for :meth:`add_sequence_tokens`.

        Raises:
            DuplicateSequenceError, PoolExhaustedError, InvalidArgumentError (wrong key
            count or width, negative keys).
        """
    def append_tokens(self, seq_id: int, token_ids: _IntArrayLike) -> tuple[_I64Array, _I64Array]:
        """Append token ids to ``seq_id`` (as :meth:`append`); each block that fills is
        registered in the cache when the sequence was admitted with token ids and every
        block before it is cached. Writing into a cached block copies it first.

        Returns:
            ``(slots, cow)`` as for :meth:`append`.

        Raises:
            UnknownSequenceError, PoolExhaustedError, InvalidArgumentError.
        """
    def block_keys(self, token_ids: _IntArrayLike, extra_key: int | None = None) -> _U64Array:
        """Keys of the full blocks of ``token_ids`` as a uint64 ``[n, 2]`` array of
        ``(high, low)`` halves: XXH3-128 with seed ``b"pkvpool1"`` over
        ``parent key (16 bytes LE) || 0x00 | 0x01 extra (8 bytes LE) || token ids (4 bytes
        LE each)``, parent 0 for the first block. Stable across processes and runs."""
    def cached_prefix_len(self, token_ids: _IntArrayLike, extra_key: int | None = None) -> int:
        """Tokens of ``token_ids`` held by cached full blocks now (before the last-token
        rule). Changes nothing, touches nothing."""
    def pin_prefix(
        self,
        token_ids: _IntArrayLike,
        extra_key: int | None = None,
        *,
        priority: int | None = None,
        expires_at: int | None = None,
    ) -> int:
        """Pin the cached full blocks of ``token_ids`` and return a pin id.

        Without ``priority`` the pin is hard: the blocks are never evicted. With a
        ``priority`` (``0..2**32``) the pin is soft: under ``eviction="priority"`` idle
        blocks with lower priority go first. The pin lapses when the clock reaches
        ``expires_at`` (logical time, see :meth:`set_clock`).

        Raises:
            InvalidArgumentError: the prefix has no full block or is not fully cached;
                ``expires_at`` is not after the current clock.
        """
    def pin_block_keys(
        self, block_keys: _KeysLike, *, priority: int | None = None, expires_at: int | None = None
    ) -> int:
        """:meth:`pin_prefix` for a prefix given as block keys, each standing for a full
        block (a partly filled keyed block cannot be pinned)."""
    def unpin(self, pin_id: int) -> None:
        """Release a pin. Raises InvalidArgumentError for an unknown or lapsed pin id."""
    def set_clock(self, t: int) -> None:
        """Drive the logical clock from the caller's step counter from now on (by default
        it counts completed admissions, appends, steps, forks, truncations and frees).
        Lapsed pins are released. Raises InvalidArgumentError if ``t`` goes back."""
    def cache_stats(self) -> CacheStats:
        """Hit metrics and cache occupancy."""
    def drain_events(self) -> dict[str, npt.NDArray[Any]]:
        """Take the queued cache events (``record_events=True``), oldest first, as
        arrays of equal length: ``kind`` uint8 (:data:`EVENT_STORED`,
        :data:`EVENT_REMOVED`, :data:`EVENT_ALL_CLEARED`), ``block`` int64 (-1 for a
        clear), ``key`` and ``parent_key`` uint64 ``[n, 2]`` (high, low), ``has_parent``
        bool, ``tokens`` uint32 (tokens of KV the block holds: ``block_size``, fewer for a
        keyed prompt's partly filled last block, 0 for a clear), ``clock`` uint64.

        The queue keeps the newest ``max_events`` events: when
        :attr:`CacheStats.dropped_events` grew since the last drain, older events were
        lost and a consumer mirroring the cache must resynchronise."""
    def reset_prefix_cache(self) -> int:
        """Forget every cached block (idle ones become free; live ones stay with their
        sequences, uncached) and return how many. Raises InvalidArgumentError while pins
        are held."""

@final
class BlockTableBuffer:
    """A long-lived int32 ``[max_seqs, max_blocks]`` block-table matrix that
    :meth:`sync` updates in place, writing only entries that changed since the last sync
    (new blocks; whole rows only after copy-on-write, truncation or a new sequence).

    ``array`` is the numpy matrix itself (no copy); treat it as read-only, or call
    :meth:`invalidate` after writing to it.

    Raises:
        InvalidArgumentError: a zero shape or more than ``2**28`` entries.
    """

    def __new__(cls, max_seqs: int, max_blocks: int, pad: int = ...) -> BlockTableBuffer: ...
    @property
    def array(self) -> _I32Array:
        """The int32 ``[max_seqs, max_blocks]`` matrix, padded with :attr:`pad`."""
    @property
    def pad(self) -> int:
        """The padding value of unused entries."""
    def sync(self, pool: BlockPool, seq_ids: _IntArrayLike) -> int:
        """Make row ``i`` hold the table of ``seq_ids[i]``; rows past ``len(seq_ids)`` are
        left as they were.

        Returns:
            Number of entries written.

        Raises:
            UnknownSequenceError; InvalidArgumentError (too many ids, a table longer than
            ``max_blocks``). Nothing is written on error.
        """
    def invalidate(self) -> None:
        """Forget the matrix contents: the next sync rewrites every row it touches."""

# ---- serving simulator (rust/bindings/sim.rs; facade: pykvpool.simulate) ----------------

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
    """A seeded synthetic workload as columns: ``arrival`` (float64 s), ``prompt_len``,
    ``output_len``, ``priority`` (int64), and with ``shared_prefixes=(num, len, vocab)``
    also ``token_ids`` (uint32) and ``token_offsets`` (int64). Arrivals: ``burst``,
    ``poisson`` (``rate`` req/s), ``gamma`` (``rate``, ``cv``). Lengths: ``(kind, params)``
    with kind fixed/uniform/lognormal/pareto/empirical, clamped to ``*_clamp``.
    Same arguments, identical arrays. Raises InvalidArgumentError."""

def run_simulation(
    arrival: npt.NDArray[np.float64],
    prompt_len: _IntArrayLike,
    output_len: _IntArrayLike,
    priority: _IntArrayLike | None = ...,
    *,
    num_blocks: int,
    block_size: int,
    token_ids: _IntArrayLike | None = ...,
    token_offsets: _IntArrayLike | None = ...,
    block_keys: _IntArrayLike | None = ...,
    key_offsets: _IntArrayLike | None = ...,
    tokens_per_key: int = ...,
    max_running: int = ...,
    max_batched_tokens: int | None = ...,
    chunked_prefill: bool = ...,
    watermark: float = ...,
    queue: str = ...,
    allocation: str = ...,
    reserve_tokens: int | None = ...,
    preemption: str = ...,
    host_blocks: int = ...,
    victim: str = ...,
    convention: str = ...,
    prefix_caching: bool = ...,
    eviction: str = ...,
    time_model: object = ...,
    check_invariants: bool = ...,
    max_steps: int | None = ...,
    record_steps: bool = ...,
) -> dict[str, Any]:
    """Run the step-level serving simulator over a fresh BlockPool(num_blocks, block_size).

    ``time_model``: seconds per step (float, default 0.0: steps only), the 9 roofline
    figures ``[params, bytes/param, layers, q_dim, kv bytes/token, flop/s, bytes/s,
    overhead s, swap s/block]``, or a callable ``f(prefill_tokens, decode_tokens,
    num_seqs, context_tokens, attention_pairs, swapped_blocks) -> seconds`` (called with
    the GIL; its exception propagates). The GIL is released otherwise.

    ``prefix_caching`` caches prompts given as ``token_ids`` or ``block_keys`` (evicting
    idle blocks by ``eviction``: lru, fifo, lfu, priority); prompts given as lengths only
    never hit.

    Returns ``{"requests": {column: array}, "steps": {column: array}, "summary": {name:
    number}}``; see ``pykvpool.simulate.SimulationResult``.

    Raises:
        InvalidArgumentError: bad columns, policy names or sizes.
    """

# ------------------------------------------------------- KV storage and decode attention

_F32Array: TypeAlias = npt.NDArray[np.float32]
_KernelPath: TypeAlias = Literal["scalar", "neon", "avx2", "avx512"]

@final
class KvCache:
    """KV storage owned by Rust: per layer, K and V for ``num_blocks`` blocks of
    ``block_size`` token slots x ``num_kv_heads`` x ``head_dim``, in ``dtype`` ("f32",
    "f16" or "bf16"), in one 2 MiB-aligned allocation advised for transparent huge pages.

    Physical layout: per layer, block-major with each block's K (all KV heads) followed
    by its V, so the kernel reads one contiguous run per block; inside a (block, head)
    tile K is dimension-major ``[head_dim][block_size]`` and V token-major
    ``[block_size][head_dim]``. :meth:`key` and :meth:`value` hide this behind the
    logical shape ``[num_blocks, block_size, num_kv_heads, head_dim]`` (strided views).

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
    def num_layers(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int:
        """Token slots per block."""
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def dtype(self) -> str:
        """"f32", "f16" or "bf16"."""
    @property
    def nbytes(self) -> int:
        """Bytes of K plus V over all layers."""
    @property
    def huge_pages(self) -> bool:
        """Whether the OS accepted the transparent-huge-page advice."""
    def key(self, layer: int) -> npt.NDArray[Any]:
        """Zero-copy, writable view of layer ``layer``'s K, shape ``[num_blocks,
        block_size, num_kv_heads, head_dim]`` (strided). dtype float32, float16, or
        ``ml_dtypes.bfloat16`` (raw uint16 bits when ml_dtypes is not installed). The
        view keeps the cache alive. Raises InvalidArgumentError for a bad layer.

        The view aliases the cache's memory: writes through it are seen by the next
        kernel call, and no copy protects a running one. :meth:`write`,
        :meth:`copy_blocks` and :func:`decode_attention` release the GIL, so writing
        this array (or a torch tensor wrapping it) from one Python thread while one of
        them runs on the same layer in another is a data race with undefined results;
        the caller must order the two (e.g. join the kernel call first)."""
    def value(self, layer: int) -> npt.NDArray[Any]:
        """Zero-copy view of layer ``layer``'s V; as :meth:`key`, including the rule that
        it must not be written while a kernel call on the same layer runs in another
        thread."""
    def write(self, layer: int, k: _F32Array, v: _F32Array, slot_mapping: _IntArrayLike) -> None:
        """Store float32 ``k`` and ``v`` (``[tokens, num_kv_heads, head_dim]`` or
        ``[tokens, num_kv_heads * head_dim]``) at ``slot_mapping`` (``tokens`` int
        slots, ``block * block_size + offset``; -1 is padding, skipped), rounding to the
        storage dtype (nearest even).

        Raises:
            InvalidArgumentError: bad layer, dtype or shape, a slot outside
                ``-1..num_blocks * block_size``. Nothing is written on error.
        """
    def copy_blocks(self, pairs: npt.NDArray[np.integer[Any]] | Sequence[Sequence[int]]) -> None:
        """Copy whole blocks ``src -> dst`` for every ``(src, dst)`` row of ``pairs``
        (``[k, 2]``, e.g. the copy-on-write pairs of :meth:`BlockPool.step`), in every
        layer, K and V, in row order.

        Raises:
            InvalidArgumentError: a block id outside ``0..num_blocks`` or a bad shape;
                nothing is copied.
        """

# decode_attention(cache, layer, q, block_tables, seq_lens, ...) -> out [n, Hq, d] float32
#
# One query token per sequence against its cached K/V in ``cache`` layer ``layer``:
# ``out[s, h] = softmax(scale * q[s, h] . K[s, h // g]^T) V[s, h // g]``, g = Hq / Hkv.
# ``q``: float32 [n, Hq, head_dim]; ``block_tables``: int [n, max_blocks] (padding
# entries past ``ceil(seq_lens[i] / block_size)`` are never read); ``seq_lens``: n token
# counts (0 gives a zero output and LSE -inf). ``scale`` defaults to 1/sqrt(head_dim).
# ``out``: optional C-contiguous float32 [n, Hq, d] written in place and returned.
# ``return_lse``: also return float32 [n, Hq] natural-log sum of exp(scale * q.k), to
# merge partial results. ``split_size``: tokens per FlashDecoding split (None: automatic
# for sequences longer than a quarter of a thread's share of the batch; 0: never). ``kv_heads_per_item``:
# KV heads read by one work item (default all; must divide Hkv). ``force_isa``: one of
# :func:`kernel_paths` ("scalar"; "avx2", "avx512" on x86-64; "neon" on aarch64); a path
# this CPU lacks raises. The GIL is released; the threads are :func:`set_num_threads`'.
# While it runs, the arrays of KvCache.key/value for ``layer`` must not be written from another
# thread (they alias the cache; see KvCache.key).
# decode_attention_paged takes FlashInfer's (kv_indptr, kv_indices, kv_last_page_len)
# instead, as exported by BlockPool.flashinfer_tables.
# ``bf16_scores`` (bf16 caches only; default False = exact): round q to bf16 (nearest
# even) and compute the scores q.K from the rounded q; softmax and P.V are unchanged (f32,
# V exact). On the "avx512" path of a CPU with avx512_bf16 the scores use ``vdpbf16ps``
# (bf16 products exact, f32 sums); every other path computes the same thing with f32 FMAs
# on the rounded q, so results agree across paths within f32 rounding, not bitwise.
# Against the exact-q result: each logit moves by at most D = scale * 2^-8 * sum_i
# |q_i K_i| (bf16 keeps 8 significant bits), each output by at most (exp(2 D) - 1) * max|V|
# and the LSE by at most D; on standard-normal data with d = 128 the measured output
# deviation is about 2e-3 of the output scale (see benches/RESULTS.md).
# Raises InvalidArgumentError for a block id outside the pool, a length beyond the table,
# head count or head_dim mismatches, a non-float32 q/out, wrong shapes, an unknown or
# unsupported path, ``bf16_scores`` with an f32 or f16 cache (``out`` is not written on
# any error).
@overload
def decode_attention(
    cache: KvCache,
    layer: int,
    q: _F32Array,
    block_tables: npt.NDArray[np.integer[Any]] | Sequence[Sequence[int]],
    seq_lens: _IntArrayLike,
    scale: float | None = None,
    out: _F32Array | None = None,
    return_lse: Literal[False] = False,
    *,
    split_size: int | None = None,
    kv_heads_per_item: int | None = None,
    force_isa: _KernelPath | None = None,
    bf16_scores: bool = False,
) -> _F32Array: ...
@overload
def decode_attention(
    cache: KvCache,
    layer: int,
    q: _F32Array,
    block_tables: npt.NDArray[np.integer[Any]] | Sequence[Sequence[int]],
    seq_lens: _IntArrayLike,
    scale: float | None = None,
    out: _F32Array | None = None,
    *,
    return_lse: Literal[True],
    split_size: int | None = None,
    kv_heads_per_item: int | None = None,
    force_isa: _KernelPath | None = None,
    bf16_scores: bool = False,
) -> tuple[_F32Array, _F32Array]: ...
@overload
def decode_attention_paged(
    cache: KvCache,
    layer: int,
    q: _F32Array,
    kv_indptr: _IntArrayLike,
    kv_indices: _IntArrayLike,
    kv_last_page_len: _IntArrayLike,
    scale: float | None = None,
    out: _F32Array | None = None,
    return_lse: Literal[False] = False,
    *,
    split_size: int | None = None,
    kv_heads_per_item: int | None = None,
    force_isa: _KernelPath | None = None,
    bf16_scores: bool = False,
) -> _F32Array: ...
@overload
def decode_attention_paged(
    cache: KvCache,
    layer: int,
    q: _F32Array,
    kv_indptr: _IntArrayLike,
    kv_indices: _IntArrayLike,
    kv_last_page_len: _IntArrayLike,
    scale: float | None = None,
    out: _F32Array | None = None,
    *,
    return_lse: Literal[True],
    split_size: int | None = None,
    kv_heads_per_item: int | None = None,
    force_isa: _KernelPath | None = None,
    bf16_scores: bool = False,
) -> tuple[_F32Array, _F32Array]: ...
def read_bandwidth(
    nbytes: int | None = None,
    threads: int | None = None,
    *,
    cache: KvCache | None = None,
    passes: int | None = None,
) -> float:
    """Read bandwidth in bytes/s: the best of ``passes`` (default 7) multi-accumulator
    SIMD sweeps with ``threads`` threads (default: the kernel pool's), each thread
    streaming one contiguous share.

    Without ``cache`` the sweep reads a fresh ``nbytes`` buffer (default 256 MiB) of
    2 MiB-aligned, huge-page-advised memory, allocated like a KV cache. With ``cache``
    it reads that cache's own storage (``cache.nbytes`` bytes, every layer's K and V):
    the pages the kernel reads, the fair ceiling for :func:`decode_attention` on a
    machine (a VM) where the read rate depends on where pages landed.

    Raises InvalidArgumentError for both ``nbytes`` and ``cache``, ``nbytes`` outside
    1 MiB..1 TiB, a cache smaller than 1 MiB, ``passes`` outside 1..1000, or a bad
    thread count."""
def peak_flops(threads: int | None = None) -> float:
    """Peak f32 FLOP/s of register-only FMA chains (2 FLOP per lane per FMA)."""
def set_num_threads(n: int) -> None:
    """Threads of the kernel pool (initially ``PYKVPOOL_NUM_THREADS`` or all CPUs).
    Raises InvalidArgumentError outside ``1..=1024``."""
def get_num_threads() -> int:
    """Threads of the kernel pool."""
def cpu_features() -> list[str]:
    """SIMD features of this CPU relevant to the kernels (e.g. "avx2", "avx512bf16",
    "neon")."""
def kernel_paths() -> list[str]:
    """Decode-attention paths this CPU supports, fastest last: "scalar" always, then
    "avx2" and "avx512" on x86-64 or "neon" on aarch64 when the CPU has them."""

# ------------------------------------------------------------------- prefix caching

EVENT_STORED: Final[int]
EVENT_REMOVED: Final[int]
EVENT_ALL_CLEARED: Final[int]

@final
class CacheStats:
    """Prefix-cache metrics of a :class:`BlockPool` (hits count successful admissions)."""

    @property
    def policy(self) -> str:
        """Eviction policy name."""
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
        """Lookups that found a key whose block failed verification: parent, extra key,
        token ids or fill (a miss)."""
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
        """Current logical time."""
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
        """All fields as a dict."""

