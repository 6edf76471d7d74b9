"""Prefix reuse on models with sliding-window layers: replay a block-id trace through a
prefix-caching :class:`~pykvpool.BlockPool` laid out for the model (vLLM's hybrid
grouping, :func:`pykvpool.planning.pool_groups.pool_layout`), against the same model with
every layer global, at equal bytes.

A hit of ``h`` tokens needs, in a full-attention group, every block before ``h``; in a
sliding-window group only its sink blocks and the blocks of the window before ``h`` (vLLM's
rule). So a window group's early blocks may be evicted without losing hits at the end of a
prompt, and the same bytes hold more reusable prefixes.

Requests are admitted one after another by their block keys and freed right after (as
:func:`pykvpool.prefix.replay.replay` does): what stays resident is what the cache retains.
Keys: a Mooncake id stands for 512 tokens; a pool block of ``block_size`` tokens dividing
512 is keyed by ``(id of the 512-token block it ends in, the offset where it ends)``, a
multiple of 512 by the id of its last 512-token block (equal keys = equal prefix, since the
trace's ids are chained).

Units: capacities in bytes, block sizes in tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pykvpool._native import BlockPool, InvalidArgumentError
from pykvpool.planning.models import ModelConfig
from pykvpool.planning.pool_groups import pool_layout
from pykvpool.prefix.replay import TRACE_BLOCK_SIZE, TraceRequest, block_keys_for

__all__ = ["GroupReplayResult", "compare_layouts", "pool_block_keys", "replay_groups"]


@dataclass(frozen=True)
class GroupReplayResult:
    """One replay of a trace through one pool layout."""

    model: str
    layout: str
    """A description of the pool's groups (:meth:`PoolLayout.describe`)."""
    policy: str
    """The eviction policy."""
    block_size: int
    """Tokens per block."""
    num_blocks: int
    """Group blocks in the pool."""
    capacity_bytes: int
    """``num_blocks x`` the bytes of one group block."""
    requests: int
    query_tokens: int
    hit_tokens: int
    evictions: int
    token_hit_rate: float
    """``hit_tokens / query_tokens`` (0 for an empty trace)."""

    def as_dict(self) -> dict[str, Any]:
        """Every field as a JSON-ready dict."""
        return asdict(self)


def pool_block_keys(req: TraceRequest, block_size: int) -> npt.NDArray[np.uint64]:
    """The keys of ``req``'s pool blocks of ``block_size`` tokens (see the module doc), as
    the uint64 ``[n, 2]`` (high, low) array :meth:`BlockPool.add_sequence_block_keys`
    takes; ``n = ceil(input_length / block_size)``.

    Raises:
        InvalidArgumentError: ``block_size`` neither divides 512 nor is a multiple of it.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise InvalidArgumentError(f"block_size must be a positive int of tokens, got {block_size!r}")
    if block_size % TRACE_BLOCK_SIZE == 0:
        ids = np.asarray(block_keys_for(req, block_size), dtype=np.uint64)
        return np.stack([ids + np.uint64(1), np.zeros_like(ids)], axis=1)
    if TRACE_BLOCK_SIZE % block_size:
        raise InvalidArgumentError(
            f"block_size must divide {TRACE_BLOCK_SIZE} or be a multiple of it, got {block_size}")
    n = req.input_length
    ends = np.minimum(np.arange(1, -(-n // block_size) + 1, dtype=np.int64) * block_size, n)
    k = (ends - 1) // TRACE_BLOCK_SIZE
    ids = np.asarray(req.hash_ids, dtype=np.uint64)[k]
    off = (ends - k * TRACE_BLOCK_SIZE).astype(np.uint64)
    return np.stack([ids + np.uint64(1), off], axis=1)


def replay_groups(trace: Sequence[TraceRequest], model: ModelConfig, capacity_bytes: int,
                  block_size: int = 16, policy: str = "lru",
                  retain_hits_for: int | None = None) -> GroupReplayResult:
    """Replay ``trace`` through a prefix-caching :class:`~pykvpool.BlockPool` with
    ``model``'s groups (:func:`pool_layout`) and as many blocks as ``capacity_bytes`` holds.

    Args:
        trace: the requests (:func:`pykvpool.prefix.replay.load_mooncake_trace`).
        model: the model whose layer kinds lay out the pool.
        capacity_bytes: KV bytes of the pool (the blocks are ``capacity_bytes //
            block_bytes``).
        block_size: tokens per block, dividing 512 or a multiple of it.
        policy: the pool's eviction policy, a name of :data:`pykvpool.EVICTION_POLICIES`
            (:class:`~pykvpool.BlockPool`); without pins ``"priority"`` orders like
            ``"lru"``.
        retain_hits_for: with ``policy="priority"``, soft-pin what each admission reused
            (every group's blocks of its hit) with priority 1 for that many operations of
            the pool's clock (each request is two: admit and free), as
            :func:`pykvpool.prefix.replay.replay` does.

    Returns:
        A :class:`GroupReplayResult`.

    Raises:
        InvalidArgumentError: a bad block size, a capacity below one block, a request
            larger than the pool, an unknown policy, or ``retain_hits_for`` without the
            priority policy or below 1.
    """
    if retain_hits_for is not None and (policy != "priority" or retain_hits_for < 1):
        raise InvalidArgumentError("retain_hits_for needs policy='priority' and a window of at least 1")
    layout = pool_layout(model, block_size=block_size)
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 1:
        raise InvalidArgumentError(f"capacity_bytes must be a positive int, got {capacity_bytes!r}")
    num_blocks = capacity_bytes // layout.block_bytes
    if num_blocks < 1:
        raise InvalidArgumentError(f"capacity_bytes: {capacity_bytes} B holds no block of {layout.block_bytes} B")
    pool = BlockPool(num_blocks, block_size, layout.specs(), prefix_caching=True, eviction=policy,
                      verify_tokens=False)
    for i, req in enumerate(trace):
        keys = pool_block_keys(req, block_size)
        cached, _ = pool.add_sequence_block_keys(i, keys, req.input_length)
        if retain_hits_for is not None and cached >= block_size:
            now = pool.cache_stats().clock
            pool.pin_block_keys(keys[: cached // block_size], priority=1, expires_at=now + retain_hits_for)
        pool.free(i)
    s = pool.cache_stats()
    return GroupReplayResult(model.name, layout.describe(), policy, block_size, num_blocks,
                             num_blocks * layout.block_bytes, len(trace), s.query_tokens, s.hit_tokens,
                             s.evictions, s.hit_tokens / s.query_tokens if s.query_tokens else 0.0)


def compare_layouts(trace: Sequence[TraceRequest], model: ModelConfig, capacities_bytes: Sequence[int],
                    block_size: int = 16, policy: str = "lru",
                    retain_hits_for: int | None = None) -> list[tuple[GroupReplayResult, GroupReplayResult]]:
    """``(model, model with every layer global)`` replays at each capacity, equal bytes.

    Raises:
        InvalidArgumentError: as :func:`replay_groups`.
    """
    everything_global = model.all_global()
    return [(replay_groups(trace, model, c, block_size, policy, retain_hits_for),
             replay_groups(trace, everything_global, c, block_size, policy, retain_hits_for))
            for c in capacities_bytes]
