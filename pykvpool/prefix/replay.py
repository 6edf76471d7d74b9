"""Replay request traces through a prefix-caching :class:`~pykvpool.BlockPool`.

A trace gives each request's prompt as chained block ids (Mooncake's ``hash_ids``: one
id per 512-token block, equal ids at equal positions mean a shared prefix). The replay
admits the requests one after another into a pool of ``capacity_blocks`` blocks (with any
layer groups) with :meth:`~pykvpool.BlockPool.add_sequence_block_keys` and frees each
right after, so what stays resident is exactly what the cache retains: the hit rate
measures the cache, not a scheduler (the serving simulator adds concurrency and timing).
Every replay, a model's layer layout included (:mod:`pykvpool.prefix.groups_replay`),
runs through :func:`replay`.

Keys (:func:`pool_block_keys`): a pool block of ``block_size`` tokens dividing 512 is
keyed by ``(id of the 512-token block it ends in, the offset where it ends)``, a multiple
of 512 by the id of its last 512-token block (equal keys = equal prefix, since the
trace's ids are chained).

Hit rates:

- *block hit rate* = cached leading blocks found / blocks looked up (Mooncake's "cache
  ratio"; the paper reports 66% for the synthetic trace with an unbounded cache);
- *token hit rate* = prompt tokens reused / prompt tokens, after the rule that at least one
  prompt token is always computed.

Units: capacities and block sizes in *tokens* where a name says so, else in *blocks*.
Every function raises :class:`~pykvpool.InvalidArgumentError` on bad input; reading a
trace may also raise ``OSError``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pykvpool import _native
from pykvpool._native import BlockPool, InvalidArgumentError
from pykvpool.errors import TraceFormatError
from pykvpool.plotting import save, subplots
from pykvpool.tracefile import MAX_KEY, MAX_TOKENS, jsonl_records, named_trace_path, read_text, to_count

__all__ = [
    "POLICIES",
    "TRACE_BLOCK_SIZE",
    "ReplayResult",
    "TraceRequest",
    "block_keys_for",
    "default_capacities_tokens",
    "load_mooncake_trace",
    "plot_sweep",
    "pool_block_keys",
    "replay",
    "seen_prefix_hits",
    "sweep",
    "unbounded_capacity",
]

#: Tokens per block id in Mooncake traces.
TRACE_BLOCK_SIZE = 512
#: Eviction policies, in the order figures show them.
POLICIES: tuple[str, ...] = _native.EVICTION_POLICIES


@dataclass(frozen=True)
class TraceRequest:
    """One request of a block-id trace."""

    timestamp_ms: int
    input_length: int
    """Prompt tokens."""
    output_length: int
    """Generated tokens."""
    hash_ids: tuple[int, ...]
    """One chained id per ``TRACE_BLOCK_SIZE``-token block of the prompt."""


def load_mooncake_trace(path: str | os.PathLike[str] | None = None) -> list[TraceRequest]:
    """Read a Mooncake-format JSONL trace; by default the shipped copy of the FAST'25
    synthetic trace (3,993 requests, Apache-2.0, see ``pykvpool/data/mooncake_fast25``).

    Raises:
        OSError: the file cannot be read.
        TraceFormatError: (an InvalidArgumentError) a file that is not UTF-8 text or holds
            no request, or a malformed row (not a JSON object, a missing, non-integer or
            negative field, a length above ``tracefile.MAX_TOKENS``, a key above 2**63 - 1,
            or ``len(hash_ids) != ceil(input_length / 512)``), named by file and line.
    """
    p = os.fspath(named_trace_path("mooncake") if path is None else path)
    text = read_text(p)
    out: list[TraceRequest] = []
    for lineno, row in jsonl_records(p, text):
        def count(key: str, limit: int = MAX_TOKENS) -> int:
            if key not in row:
                raise TraceFormatError(p, lineno, f"no {key!r} field")
            return to_count(row[key], p, lineno, key, limit)

        ids = row.get("hash_ids")
        if not isinstance(ids, list):
            raise TraceFormatError(p, lineno, "hash_ids must be a list of integers")
        req = TraceRequest(
            timestamp_ms=count("timestamp", MAX_KEY),
            input_length=count("input_length"),
            output_length=count("output_length"),
            hash_ids=tuple(to_count(h, p, lineno, "hash_ids entry", MAX_KEY) for h in ids),
        )
        if len(req.hash_ids) != math.ceil(req.input_length / TRACE_BLOCK_SIZE):
            raise TraceFormatError(
                p, lineno, f"{len(req.hash_ids)} block ids for {req.input_length} tokens, "
                f"expected ceil({req.input_length}/{TRACE_BLOCK_SIZE})"
            )
        out.append(req)
    if not out:
        raise TraceFormatError(p, 0, "the file holds no request")
    return out


def _merge_factor(block_size: int, trace_block_size: int) -> int:
    if block_size <= 0 or trace_block_size <= 0 or block_size % trace_block_size:
        raise InvalidArgumentError(
            f"block_size {block_size} must be a positive multiple of the trace's "
            f"{trace_block_size}-token blocks"
        )
    return block_size // trace_block_size


def block_keys_for(
    req: TraceRequest, block_size: int = TRACE_BLOCK_SIZE, trace_block_size: int = TRACE_BLOCK_SIZE
) -> list[int]:
    """Keys of ``req``'s prompt in ``block_size``-token blocks.

    ``block_size`` must be a multiple ``k`` of the trace's block size: block ``j`` then
    covers trace blocks ``j*k .. (j+1)*k - 1`` and its key is the id of the last of them
    (ids are chained, so the last id names the whole prefix, and a partial group ends on a
    different id than a full one).

    Raises:
        InvalidArgumentError: ``block_size`` is not a positive multiple of
            ``trace_block_size``.
    """
    k = _merge_factor(block_size, trace_block_size)
    ids = req.hash_ids
    n = len(ids)
    return [ids[min((j + 1) * k, n) - 1] for j in range(-(-n // k))]


def seen_prefix_hits(trace: Sequence[TraceRequest]) -> tuple[int, int]:
    """The unbounded-cache rule, computed independently of the pool: for each request,
    the longest prefix of its block ids that appeared in any earlier request.

    Returns:
        ``(hit_blocks, total_blocks)`` over the trace.
    """
    seen: set[int] = set()
    hits = total = 0
    for req in trace:
        k = 0
        while k < len(req.hash_ids) and req.hash_ids[k] in seen:
            k += 1
        hits += k
        total += len(req.hash_ids)
        seen.update(req.hash_ids)
    return hits, total


def unbounded_capacity(trace: Sequence[TraceRequest], block_size: int = TRACE_BLOCK_SIZE) -> int:
    """Blocks that never force an eviction: every distinct key, plus room for the largest
    request's uncached blocks. In blocks of ``block_size`` tokens, per layer group.

    Raises:
        InvalidArgumentError: ``block_size`` neither divides 512 nor is a multiple of it.
    """
    keys: set[tuple[int, int]] = set()
    largest = 0
    for req in trace:
        ks = pool_block_keys(req, block_size)
        keys.update(zip(ks[:, 0].tolist(), ks[:, 1].tolist()))
        largest = max(largest, len(ks))
    return len(keys) + largest


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


@dataclass(frozen=True)
class ReplayResult:
    """Outcome of one replay."""

    policy: str
    block_size: int
    """Tokens per block."""
    capacity_blocks: int
    unbounded: bool
    """True when the capacity never forced an eviction by construction."""
    requests: int
    query_blocks: int
    hit_blocks: int
    query_tokens: int
    hit_tokens: int
    evictions: int
    block_hit_rate: float
    token_hit_rate: float
    tiers: tuple[dict[str, Any], ...] = ()
    """The tiers below the device (:meth:`~pykvpool.BlockPool.tier_stats`, host first);
    empty without ``host_blocks``. ``token_hit_rate`` counts their hits too."""

    @property
    def capacity_tokens(self) -> int:
        """The capacity in tokens: ``capacity_blocks x block_size``."""
        return self.capacity_blocks * self.block_size

    def as_dict(self) -> dict[str, Any]:
        """Every field and ``capacity_tokens`` as a JSON-ready dict."""
        d = asdict(self)
        d["capacity_tokens"] = self.capacity_tokens
        return d


def replay(
    trace: Sequence[TraceRequest],
    capacity_blocks: int | None = None,
    *,
    policy: str = "lru",
    block_size: int = TRACE_BLOCK_SIZE,
    retain_hits_for: int | None = None,
    groups: Sequence[Any] | None = None,
    host_blocks: int | None = None,
    disk_blocks: int | None = None,
    reuse_gate: int | None = None,
    tier_eviction: str | None = None,
    write_through: bool | None = None,
) -> ReplayResult:
    """Replay ``trace`` in order through a pool of ``capacity_blocks`` blocks of
    ``block_size`` tokens (``None``: :func:`unbounded_capacity` per group) with eviction
    ``policy`` and layer ``groups`` (``None``: one full-attention group; else the
    :class:`~pykvpool.BlockPool` ``groups`` argument, every group caching its blocks).

    Without pins the ``priority`` policy orders like ``lru``. ``retain_hits_for`` (only with
    ``policy="priority"``) soft-pins the reused prefix of every admission (every block its
    hit needs, in every group) with priority 1 for that many operations of the pool's clock
    (each request is two: admit and free), so prefixes that were shared recently outlive
    blocks that were never reused.

    ``host_blocks``, ``disk_blocks``, ``reuse_gate`` and ``write_through`` add tiers below
    the device, as the :class:`~pykvpool.BlockPool` arguments of those names (each tier
    ordered by ``tier_eviction``, default ``policy``; ``"s3fifo"`` is a tier order too):
    blocks the pool evicts go down them and come back on a hit. A request's blocks count
    as computed when it is freed (write-through copies them then).

    Raises:
        InvalidArgumentError: a capacity below the largest request (it could not be
            admitted at all), an unknown policy, a block size that neither divides 512 nor
            is a multiple of it, bad ``groups``, ``retain_hits_for`` without the priority
            policy or below 1. Tier arguments the pool refuses (see
            :class:`~pykvpool.BlockPool`; tiers take ``lru``, ``fifo``, ``lfu`` or
            ``s3fifo``).
    """
    if retain_hits_for is not None and (policy != "priority" or retain_hits_for < 1):
        raise InvalidArgumentError("retain_hits_for needs policy='priority' and a window of at least 1")
    keys = [pool_block_keys(r, block_size) for r in trace]
    width = 1 if groups is None else len(groups)
    largest = width * max((len(k) for k in keys), default=0)
    unbounded = capacity_blocks is None
    cap = width * unbounded_capacity(trace, block_size) if capacity_blocks is None else capacity_blocks
    if cap < max(largest, 1):
        raise InvalidArgumentError(
            f"capacity {cap} blocks is below the largest request ({largest} blocks of {block_size} tokens)"
        )
    tiers: dict[str, Any] = {}
    if host_blocks is not None:
        tiers = {"host_blocks": host_blocks, "disk_blocks": disk_blocks, "reuse_gate": reuse_gate,
                 "tier_eviction": tier_eviction or policy, "write_through": write_through}
    elif disk_blocks is not None or reuse_gate is not None or tier_eviction is not None or write_through is not None:
        raise InvalidArgumentError("disk_blocks, reuse_gate, tier_eviction and write_through need host_blocks")
    pool = BlockPool(cap, block_size, None if groups is None else list(groups), prefix_caching=True,
                     eviction=policy, verify_tokens=False, **tiers)
    for i, (req, ks) in enumerate(zip(trace, keys)):
        cached, _ = pool.add_sequence_block_keys(i, ks, req.input_length)
        if retain_hits_for is not None and cached >= block_size:
            now = pool.cache_stats().clock
            pool.pin_block_keys(ks[: cached // block_size], priority=1, expires_at=now + retain_hits_for)
        pool.free(i)
    s = pool.cache_stats()
    return ReplayResult(
        policy=policy,
        block_size=block_size,
        capacity_blocks=cap,
        unbounded=unbounded,
        requests=len(trace),
        query_blocks=s.query_blocks,
        hit_blocks=s.hit_blocks,
        query_tokens=s.query_tokens,
        hit_tokens=s.hit_tokens,
        evictions=s.evictions,
        block_hit_rate=s.block_hit_rate,
        token_hit_rate=s.hit_rate,
        tiers=tuple(pool.tier_stats()),
    )


def default_capacities_tokens() -> list[int]:
    """Cache sizes swept by default, in tokens: 512 x (384 .. 49,152 blocks, doubling);
    the smallest holds the synthetic trace's largest request (374 blocks)."""
    return [TRACE_BLOCK_SIZE * b for b in (384, 768, 1536, 3072, 6144, 12288, 24576, 49152)]


def sweep(
    trace: Sequence[TraceRequest],
    capacities_tokens: Iterable[int] | None = None,
    policies: Iterable[str] = POLICIES,
    block_sizes: Iterable[int] = (TRACE_BLOCK_SIZE,),
    *,
    include_unbounded: bool = True,
    retain_hits_for: int | None = None,
) -> list[ReplayResult]:
    """Replay ``trace`` for every capacity (tokens, converted to whole blocks) x policy x
    block size, plus the unbounded pool per block size and policy. Capacities below a
    block size's largest request are skipped. ``retain_hits_for`` applies to the
    ``priority`` policy (see :func:`replay`).

    Raises:
        InvalidArgumentError: nothing left to replay, or a bad policy or block size.
    """
    caps = list(default_capacities_tokens() if capacities_tokens is None else capacities_tokens)
    out: list[ReplayResult] = []
    for bs in block_sizes:
        largest = max((-(-r.input_length // bs) for r in trace), default=0)
        for pol in policies:
            keep = retain_hits_for if pol == "priority" else None
            for c in caps:
                blocks = c // bs
                if blocks >= max(largest, 1):
                    out.append(replay(trace, blocks, policy=pol, block_size=bs, retain_hits_for=keep))
            if include_unbounded:
                out.append(replay(trace, None, policy=pol, block_size=bs, retain_hits_for=keep))
    if not out:
        raise InvalidArgumentError("no capacity holds the largest request: nothing to replay")
    return out


_STYLE = {"lru": ("o", "-", 9), "fifo": ("s", "--", 6), "lfu": ("^", "-.", 6), "priority": ("x", ":", 8)}


def plot_sweep(results: Sequence[ReplayResult], path: str | os.PathLike[str]) -> dict[str, Any]:
    """Plot block hit rate vs cache capacity (tokens, log scale), one panel per block size
    and one line per policy; the unbounded hit rate is a dashed line. Writes ``path``
    (PNG or any format matplotlib infers from the suffix).

    Returns:
        The plotted data: ``{"block_size": {bs: {"policy": {p: {"capacity_tokens": [...],
        "block_hit_rate": [...]}}, "unbounded": rate}}}``.

    Raises:
        InvalidArgumentError: ``results`` is empty.
        OSError: ``path`` cannot be written.
        ValueError: matplotlib cannot write the format of ``path``'s suffix.
    """
    data: dict[str, Any] = {"block_size": {}}
    sizes = sorted({r.block_size for r in results})
    if not sizes:
        raise InvalidArgumentError("no results to plot")
    fig, axes = subplots(len(sizes), (5.5 * len(sizes), 4.2))
    for ax, bs in zip(axes, sizes):
        rows = [r for r in results if r.block_size == bs]
        panel: dict[str, Any] = {"policy": {}, "unbounded": None}
        for pol in [p for p in POLICIES if any(r.policy == p for r in rows)]:
            pts = sorted((r.capacity_tokens, r.block_hit_rate) for r in rows if r.policy == pol and not r.unbounded)
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            panel["policy"][pol] = {"capacity_tokens": xs, "block_hit_rate": ys}
            # Policies often coincide (priority without pins is LRU): distinct markers and
            # dashes keep every line visible.
            marker, dash, size = _STYLE.get(pol, ("o", "-", 6))
            ax.plot(xs, ys, marker=marker, linestyle=dash, markersize=size, label=pol, alpha=0.85)
        unb = [r.block_hit_rate for r in rows if r.unbounded]
        if unb:
            panel["unbounded"] = unb[0]
            ax.axhline(unb[0], color="grey", linestyle="--", label=f"unbounded ({unb[0]:.3f})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("cache capacity (tokens)")
        ax.set_ylabel("block hit rate")
        ax.set_title(f"block size {bs} tokens")
        ax.set_ylim(0, 1)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        data["block_size"][bs] = panel
    save(fig, path)
    return data
