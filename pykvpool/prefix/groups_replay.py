"""Prefix reuse on models with sliding-window layers: replay a block-id trace through a
prefix-caching :class:`~pykvpool.BlockPool` laid out for the model (vLLM's hybrid
grouping, :func:`pykvpool.planning.pool_groups.pool_layout`), against the same model with
every layer global, at equal bytes.

A hit of ``h`` tokens needs, in a full-attention group, every block before ``h``; in a
sliding-window group only its sink blocks and the blocks of the window before ``h`` (vLLM's
rule). So a window group's early blocks may be evicted without losing hits at the end of a
prompt, and the same bytes hold more reusable prefixes.

The replay is :func:`pykvpool.prefix.replay.replay` with the model's groups (requests
admitted one after another by their block keys, :func:`~pykvpool.prefix.replay.pool_block_keys`,
and freed right after): what stays resident is what the cache retains.

Units: capacities in bytes, block sizes in tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pykvpool._native import InvalidArgumentError
from pykvpool.planning.models import ModelConfig
from pykvpool.planning.pool_groups import pool_layout
from pykvpool.prefix.replay import TraceRequest, replay

__all__ = ["GroupReplayResult", "compare_layouts", "replay_groups"]


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
    layout = pool_layout(model, block_size=block_size)
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 1:
        raise InvalidArgumentError(f"capacity_bytes must be a positive int, got {capacity_bytes!r}")
    num_blocks = capacity_bytes // layout.block_bytes
    if num_blocks < 1:
        raise InvalidArgumentError(f"capacity_bytes: {capacity_bytes} B holds no block of {layout.block_bytes} B")
    r = replay(trace, num_blocks, policy=policy, block_size=block_size, retain_hits_for=retain_hits_for,
               groups=layout.specs())
    return GroupReplayResult(model.name, layout.describe(), policy, block_size, num_blocks,
                             num_blocks * layout.block_bytes, len(trace), r.query_tokens, r.hit_tokens,
                             r.evictions, r.token_hit_rate)


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
