"""Static capacity sweeps: how many requests fit a KV budget under each allocation policy.

Every policy runs through the real :class:`pykvpool.BlockPool`, never a formula:

- **contiguous**: each request reserves ``max_len`` tokens up front. This is a pool whose
  block size is ``max_len`` (one block per request), which is exactly a contiguous
  reservation at the maximum length.
- **paged**: a pool of ``capacity // b`` blocks of ``b`` tokens; a request takes
  ``ceil(len / b)`` blocks.
- **paged + shared prefix** (beyond the article): every request starts with the same
  ``prefix_len``-token prefix (a system prompt) held once by a parent sequence and shared
  through :meth:`BlockPool.fork`; each request appends only its own tokens (copy-on-write
  of a partly filled shared block included).
- **hybrid concurrency** (:func:`hybrid_concurrency`): sequences of one context
  length in a :class:`pykvpool.BlockPool` of the model's groups
  (:func:`pykvpool.planning.pool_groups.pool_layout`), each grown by chunked prefill so
  that sliding windows release their blocks as the pool's release rule says.

Admission is greedy in request order until the pool raises :class:`PoolExhaustedError`,
as in the article. The budget is a KV token capacity (see
:attr:`pykvpool.planning.ledger.MemoryLedger.token_capacity`); bytes are tokens x ``bytes_per_token``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


from pykvpool._native import BlockPool, InvalidArgumentError, PoolExhaustedError
from pykvpool.planning.pool_groups import PoolLayout
from pykvpool.planning.workloads import Workload

__all__ = [
    "BLOCK_SIZES",
    "MAX_SWEEP_CALLS",
    "BlockSizeRow",
    "Concurrency",
    "SweepResult",
    "WasteDecomposition",
    "block_size_sweep",
    "contiguous",
    "hybrid_concurrency",
    "paged",
    "paged_shared_prefix",
    "waste_decomposition",
]

BLOCK_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Block sizes of the default sweep, tokens."""

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SweepResult:
    """One policy on one workload under one KV budget.

    Attributes:
        policy: ``"contiguous"``, ``"paged"`` or ``"paged+prefix"``.
        workload: the workload's name.
        block_size: tokens per block (``max_len`` for contiguous).
        capacity_tokens: the KV budget, tokens.
        bytes_per_token: KV bytes per token.
        admitted: requests admitted before the pool was exhausted.
        reserved_tokens: token slots of the blocks in use (``used_blocks x block_size``).
        stored_tokens: distinct filled slots (a shared prefix counts once).
        logical_tokens: sum of the admitted requests' lengths.
        table_entries: block-table entries of the admitted requests.
        shared_blocks: blocks referenced by more than one sequence.
    """

    policy: str
    workload: str
    block_size: int
    capacity_tokens: int
    bytes_per_token: int
    admitted: int
    reserved_tokens: int
    stored_tokens: int
    logical_tokens: int
    table_entries: int
    shared_blocks: int = 0

    @property
    def reserved_bytes(self) -> float:
        """Bytes of the blocks in use."""
        return float(self.reserved_tokens) * self.bytes_per_token

    @property
    def used_bytes(self) -> float:
        """Bytes really holding KV (distinct filled slots)."""
        return float(self.stored_tokens) * self.bytes_per_token

    @property
    def utilization(self) -> float:
        """``stored / reserved``; 0.0 when nothing was admitted."""
        return self.stored_tokens / self.reserved_tokens if self.reserved_tokens else 0.0

    @property
    def logical_per_reserved(self) -> float:
        """``logical / reserved``: above 1 when shared prefixes serve several requests."""
        return self.logical_tokens / self.reserved_tokens if self.reserved_tokens else 0.0

    def gain_over(self, baseline: SweepResult) -> float:
        """Admitted requests relative to ``baseline`` (e.g. paged / contiguous).

        Raises:
            InvalidArgumentError: the baseline admitted nothing.
        """
        if baseline.admitted == 0:
            raise InvalidArgumentError("the baseline admitted no request")
        return self.admitted / baseline.admitted


def _check_capacity(capacity_tokens: int, block_size: int) -> int:
    if block_size < 1:
        raise InvalidArgumentError(f"block_size must be >= 1 token, got {block_size}")
    if capacity_tokens < block_size:
        raise InvalidArgumentError(
            f"a KV capacity of {capacity_tokens} tokens holds no block of {block_size} tokens"
        )
    return capacity_tokens // block_size


def _result(policy: str, wl: Workload, pool: BlockPool, capacity_tokens: int,
            bytes_per_token: int, admitted: int, logical: int, entries: int) -> SweepResult:
    st = pool.stats()
    return SweepResult(policy, wl.name, pool.block_size, capacity_tokens, bytes_per_token,
                       admitted, st.used_blocks * st.block_size, st.stored_tokens, logical,
                       entries, st.shared_blocks)


def _greedy(pool: BlockPool, lengths: Sequence[int], progress: Progress | None) -> int:
    n = len(lengths)
    for i, length in enumerate(lengths):
        try:
            pool.add_sequence(i, length)
        except PoolExhaustedError:
            return i
        if progress is not None and i % 256 == 0:
            progress(i, n)
    return n


def paged(workload: Workload, capacity_tokens: int, block_size: int = 16,
          bytes_per_token: int = 1, progress: Progress | None = None) -> SweepResult:
    """Greedy admission into a pool of ``capacity_tokens // block_size`` blocks.

    Raises:
        InvalidArgumentError: block_size < 1 or a capacity below one block.
    """
    pool = BlockPool(_check_capacity(capacity_tokens, block_size), block_size)
    lens = workload.lengths.tolist()
    k = _greedy(pool, lens, progress)
    entries = pool.num_used_blocks
    return _result("paged", workload, pool, capacity_tokens, bytes_per_token, k,
                   int(sum(lens[:k])), entries)


def contiguous(workload: Workload, capacity_tokens: int, max_len: int,
               bytes_per_token: int = 1, progress: Progress | None = None) -> SweepResult:
    """Greedy admission with a ``max_len``-token reservation per request (a pool with one
    ``max_len``-token block per request).

    Raises:
        InvalidArgumentError: a request longer than ``max_len`` (use
            :meth:`Workload.clipped`), max_len < 1 or a capacity below ``max_len``.
    """
    longest = int(workload.lengths.max())
    if longest > max_len:
        raise InvalidArgumentError(
            f"{workload.name}: a request of {longest} tokens exceeds max_len={max_len}"
        )
    res = paged(workload, capacity_tokens, max_len, bytes_per_token, progress)
    return SweepResult("contiguous", res.workload, max_len, capacity_tokens, bytes_per_token,
                       res.admitted, res.reserved_tokens, res.stored_tokens,
                       res.logical_tokens, res.table_entries)


def paged_shared_prefix(workload: Workload, capacity_tokens: int, prefix_len: int,
                        block_size: int = 16, bytes_per_token: int = 1,
                        progress: Progress | None = None) -> SweepResult:
    """Greedy admission where every request starts with one shared ``prefix_len``-token
    prefix, stored once (a parent sequence) and shared by :meth:`BlockPool.fork`.

    Raises:
        InvalidArgumentError: prefix_len < 0 or longer than the shortest request,
            block_size < 1, or a capacity below one block.
    """
    nblocks = _check_capacity(capacity_tokens, block_size)
    if prefix_len < 0 or prefix_len > int(workload.lengths.min()):
        raise InvalidArgumentError(
            f"prefix_len must be in 0..{int(workload.lengths.min())} (the shortest request), "
            f"got {prefix_len}"
        )
    pool = BlockPool(nblocks, block_size)
    lens = workload.lengths.tolist()
    parent = len(lens)  # request ids are 0..n-1
    admitted = 0
    try:
        pool.add_sequence(parent, prefix_len)
    except PoolExhaustedError:
        lens = []
    for i, length in enumerate(lens):
        pool.fork(parent, i)
        try:
            pool.append(i, length - prefix_len)
        except PoolExhaustedError:
            pool.free(i)
            break
        admitted = i + 1
        if progress is not None and i % 256 == 0:
            progress(i, len(lens))
    entries = sum(int(pool.block_table(i).size) for i in range(admitted))
    res = _result("paged+prefix", workload, pool, capacity_tokens, bytes_per_token, admitted,
                  int(sum(lens[:admitted])), entries)
    return res


@dataclass(frozen=True)
class WasteDecomposition:
    """Where reserved-but-unused KV goes, per request, over the whole workload.

    Attributes:
        reservation_waste_tokens: mean ``max_len - len`` (contiguous), tokens.
        last_block_waste_tokens: mean empty slots of the last block (paged), tokens.
        bytes_per_token: KV bytes per token.
    """

    workload: str
    max_len: int
    block_size: int
    mean_length: float
    reservation_waste_tokens: float
    last_block_waste_tokens: float
    bytes_per_token: int

    @property
    def reservation_waste_bytes(self) -> float:
        """Per request, bytes."""
        return self.reservation_waste_tokens * self.bytes_per_token

    @property
    def last_block_waste_bytes(self) -> float:
        """Per request, bytes."""
        return self.last_block_waste_tokens * self.bytes_per_token

    @property
    def ratio(self) -> float:
        """Reservation waste / last-block waste (inf when the blocks fit exactly)."""
        if self.last_block_waste_tokens == 0:
            return float("inf")
        return self.reservation_waste_tokens / self.last_block_waste_tokens


def _empty_slots_all(workload: Workload, block_size: int) -> tuple[int, int, int]:
    """Admit every request into a pool just large enough; return (empty slots, used
    blocks, stored tokens) from its stats."""
    need = int(((workload.lengths + block_size - 1) // block_size).sum())
    pool = BlockPool(need, block_size)
    if _greedy(pool, workload.lengths.tolist(), None) != len(workload):
        raise AssertionError("a pool sized for the whole workload ran out of blocks")
    st = pool.stats()
    return st.empty_slots, st.used_blocks, st.stored_tokens


def waste_decomposition(workload: Workload, max_len: int, block_size: int = 16,
                        bytes_per_token: int = 1) -> WasteDecomposition:
    """Reservation waste (contiguous at ``max_len``) vs last-block waste (paged at
    ``block_size``), averaged over every request of the workload, measured on pools that
    hold the whole workload.

    Raises:
        InvalidArgumentError: a request longer than ``max_len``; block_size < 1.
    """
    if int(workload.lengths.max()) > max_len:
        raise InvalidArgumentError(f"{workload.name}: a request exceeds max_len={max_len}")
    if block_size < 1:
        raise InvalidArgumentError(f"block_size must be >= 1 token, got {block_size}")
    n = len(workload)
    reserve_empty, _, _ = _empty_slots_all(workload, max_len)
    block_empty, _, _ = _empty_slots_all(workload, block_size)
    return WasteDecomposition(workload.name, max_len, block_size, workload.mean_length,
                              reserve_empty / n, block_empty / n, bytes_per_token)


@dataclass(frozen=True)
class BlockSizeRow:
    """One block size over the whole workload (pool sized to hold all of it), and the
    admitted requests under the KV budget.

    Attributes:
        empty_slots_per_request: mean empty slots of the last block, tokens.
        utilization: stored / reserved slots.
        table_entries_per_request: mean block-table length, entries.
        admitted: requests admitted greedily under the budget (0 when no budget given).
        mean_length: the workload's mean request length, tokens.
    """

    block_size: int
    empty_slots_per_request: float
    utilization: float
    table_entries_per_request: float
    admitted: int
    mean_length: float

    @property
    def empty_fraction(self) -> float:
        """Empty slots / reserved slots (1 - utilization)."""
        return 1.0 - self.utilization

    @property
    def empty_over_length(self) -> float:
        """Empty slots per request / mean request length (the article's "0.32% at 16")."""
        return self.empty_slots_per_request / self.mean_length


def block_size_sweep(workload: Workload, block_sizes: Sequence[int] = BLOCK_SIZES,
                     capacity_tokens: int | None = None,
                     progress: Progress | None = None) -> list[BlockSizeRow]:
    """Empty slots, utilization and table entries per request for each block size, and the
    admitted requests under ``capacity_tokens`` when given.

    Raises:
        InvalidArgumentError: an empty list or a block size < 1.
    """
    if not block_sizes:
        raise InvalidArgumentError("no block size to sweep")
    rows = []
    n = len(workload)
    for j, b in enumerate(block_sizes):
        if b < 1:
            raise InvalidArgumentError(f"block sizes must be >= 1 token, got {b}")
        empty, used, stored = _empty_slots_all(workload, b)
        admitted = paged(workload, capacity_tokens, b).admitted if capacity_tokens else 0
        rows.append(BlockSizeRow(b, empty / n, stored / (used * b), used / n, admitted,
                                workload.mean_length))
        if progress is not None:
            progress(j + 1, len(block_sizes))
    return rows


MAX_SWEEP_CALLS = 1 << 20
"""Most pool calls :func:`hybrid_concurrency` makes (sequences x chunks per sequence, by
the ledger's count): a bound on its run time."""


@dataclass(frozen=True)
class Concurrency:
    """Sequences of one context length a hybrid pool holds (:func:`hybrid_concurrency`).

    Attributes:
        model: the model's name.
        seq_len: each sequence's length, tokens.
        chunk_tokens: prefill chunk, tokens.
        block_size: tokens per block.
        num_blocks: blocks of the pool.
        admitted: sequences grown to ``seq_len`` through the real pool before it raised
            :class:`PoolExhaustedError`.
        ledger: the ledger's count, ``num_blocks // blocks_per_sequence``.
        blocks_per_sequence: blocks one sequence holds in the ledger's count (every group).
        held_per_sequence: the most blocks one admitted sequence held in the pool at
            ``seq_len`` (0 when none was admitted).
        peak_per_sequence: the most blocks one sequence held during its prefill (the
            one-chunk transient of its windowed groups included).
    """

    model: str
    seq_len: int
    chunk_tokens: int
    block_size: int
    num_blocks: int
    admitted: int
    ledger: int
    blocks_per_sequence: int
    held_per_sequence: int
    peak_per_sequence: int


def _grow(p: BlockPool, seq: int, seq_len: int, chunk: int) -> tuple[int, int]:
    """Prefill ``seq`` to ``seq_len - 1`` tokens in chunks of ``chunk``, then one decode
    token; return (peak blocks held during the prefill, blocks held at ``seq_len``).
    Raises PoolExhaustedError with the sequence freed (the pool as before)."""
    base = p.num_used_blocks
    peak = 0
    try:
        done = min(chunk, seq_len - 1) or 1
        p.add_sequence(seq, done)
        peak = p.num_used_blocks - base
        while done < seq_len - 1:
            n = min(chunk, seq_len - 1 - done)
            p.append(seq, n)
            done += n
            peak = max(peak, p.num_used_blocks - base)
        if done < seq_len:
            p.append(seq, 1)
    except PoolExhaustedError:
        if seq in p:
            p.free(seq)
        raise
    return peak, p.num_used_blocks - base


def hybrid_concurrency(layout: PoolLayout, num_blocks: int, seq_len: int,
                       chunk_tokens: int = 2048) -> Concurrency:
    """How many sequences of ``seq_len`` tokens a :class:`pykvpool.BlockPool` of
    ``layout``'s groups and ``num_blocks`` blocks holds: sequences are admitted one after
    the other, each prefilled to ``seq_len - 1`` tokens in chunks of ``chunk_tokens``
    (``add_sequence`` then ``append``: every growth first releases the blocks its window no
    longer needs) and given one decode token (``append(seq, 1)``, which releases down to the
    window), until the pool raises :class:`PoolExhaustedError`. A sequence holds its
    window's blocks after the decode token, but needs about one chunk more per windowed
    group while it is prefilled: the count is the ledger's, or a little less when that
    transient does not fit beside the others.

    Raises:
        InvalidArgumentError: ``seq_len``, ``chunk_tokens`` or ``num_blocks`` < 1, or a
            sweep that would take more than :data:`MAX_SWEEP_CALLS` pool calls.
    """
    for name, value in (("seq_len", seq_len), ("chunk_tokens", chunk_tokens), ("num_blocks", num_blocks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
    per_seq = layout.blocks_per_sequence(seq_len)
    ledger = num_blocks // per_seq
    calls = (ledger + 1) * (-(-seq_len // chunk_tokens) + 1)
    if calls > MAX_SWEEP_CALLS:
        raise InvalidArgumentError(
            f"seq_len {seq_len} in chunks of chunk_tokens {chunk_tokens} with {num_blocks} blocks "
            f"would take about {calls:,} pool calls (more than {MAX_SWEEP_CALLS:,})")
    pool = BlockPool(num_blocks, layout.block_size, layout.specs())
    admitted = held = peak = 0
    while True:
        try:
            p, h = _grow(pool, admitted, seq_len, chunk_tokens)
        except PoolExhaustedError:
            break
        admitted, held, peak = admitted + 1, max(held, h), max(peak, p, h)
    return Concurrency(layout.model, seq_len, chunk_tokens, layout.block_size, num_blocks,
                       admitted, ledger, per_seq, held, peak)
