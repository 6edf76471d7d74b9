"""Serving simulator: replay a workload through continuous batching over the real pool.

The engine is Rust (``pykvpool._native.run_simulation``): every allocation of a run goes
through the same :class:`pykvpool.BlockPool` users import, the run releases the GIL and
its results depend only on its inputs (logical time, seeded workloads: bit for bit).

Units: times in seconds (logical, from the step-time model), lengths in tokens, memory in
blocks unless a name says bytes.

Typical use::

    from pykvpool import simulate as sim
    w = sim.synthetic_workload(2000, rate=20.0, seed=1)
    cfg = sim.SimConfig(num_blocks=20_000, block_size=16)
    res = sim.run(w, cfg, sim.roofline("llama-3-8b", "a100-80gb-sxm"))
    print(res.summary["ttft_p99"], res.summary["output_throughput"])

The request stream (:class:`Workload`, :func:`synthetic_workload`) lives in
:mod:`pykvpool.simulate.workload` (re-exported here), trace loading in :mod:`pykvpool.simulate.traces`, figures in :mod:`pykvpool.simulate.plots`,
sweeps and the ``pykvpool simulate`` subcommand in :mod:`pykvpool.simulate.sweep`.

Limits: a workload holds at most :data:`MAX_REQUESTS` requests, each prompt and each
output at most :data:`MAX_REQUEST_TOKENS` tokens, and a step computes at most
:data:`MAX_STEP_TOKENS` tokens (the budget when ``max_batched_tokens`` is None). Larger
values raise; a request that fits these limits but never fits the pool (or the
reservation) is not an error: it gets outcome 1 (rejected) and is counted.

An empty workload is normal: it simulates to empty columns and a summary whose counts
are 0 and whose statistics are None (a statistic over no request is None, never NaN).

Errors: :class:`pykvpool.InvalidArgumentError` (a ValueError) naming the argument for
any rejected workload column or configuration value, including wrong shapes (2-D or
ragged columns), bools where a count or a number is meant, NaN and infinite floats and
out-of-range integers (nothing runs); ``TypeError`` for a string where a flag is meant;
exceptions raised by a Python step-time callable propagate unchanged;
:class:`pykvpool.InvariantError` only for an engine bug.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Union

import numpy as np
import numpy.typing as npt

from pykvpool import _native
from pykvpool.planning.hardware import Hardware, hardware_preset
from pykvpool.planning.layers import LayerGroup
from pykvpool.errors import BudgetError
from pykvpool.planning.ledger import Budget, MemoryLedger, default_budget
from pykvpool.planning.models import ModelConfig, model_preset, storage_dtype
from pykvpool.planning.pool_groups import pool_layout
from pykvpool.planning.roofline import Roofline
from pykvpool.simulate.disagg import Disaggregation
from pykvpool.simulate.stop import StopWhen
from pykvpool.simulate.workload import (
    MAX_REQUEST_TOKENS,
    MAX_REQUESTS,
    Workload,
    check_prefix_caching,
    synthetic_workload,
)
from pykvpool.checks import check_count as _count, check_positive as _positive, invalid as _invalid

Array = npt.NDArray[np.generic]

#: ``f(prefill_tokens, decode_tokens, num_seqs, context_tokens, attention_pairs,
#: swapped_blocks) -> seconds``: a user step-time model.
StepTimeFn = Callable[[int, int, int, int, int, int], float]

#: Most replicas of one simulated deployment (:attr:`SimConfig.replicas`).
MAX_REPLICAS: int = _native.SIM_MAX_REPLICAS
#: How a deployment of several replicas routes arrivals (:attr:`SimConfig.router`).
ROUTERS: tuple[str, ...] = ("round_robin", "shortest_queue")

#: Most tokens one engine step computes (16 Mi): the largest ``max_batched_tokens``, and
#: the budget when it is None.
MAX_STEP_TOKENS: int = _native.SIM_MAX_STEP_TOKENS


__all__ = [
    "Disaggregation",
    "MAX_REPLICAS",
    "MAX_REQUESTS",
    "MAX_REQUEST_TOKENS",
    "MAX_STEP_TOKENS",
    "SchedulerConfig",
    "SimConfig",
    "SimulationResult",
    "StepTimeFn",
    "StopWhen",
    "GroupSpec",
    "ROUTERS",
    "TimeModel",
    "Workload",
    "kv_blocks_for_memory",
    "run",
    "synthetic_workload",
]


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching as in vLLM v1 (running requests first, then swapped, then waiting).

    Attributes:
        max_running: requests in flight at most.
        max_batched_tokens: tokens computed per step across the batch (None: unlimited).
        chunked_prefill: split prompts that exceed the remaining budget.
        watermark: fraction of the pool admission leaves free.
        queue: ``fcfs`` or ``priority`` (lower value first).
        allocation: how admission claims KV memory.

            - ``paged``: blocks on demand as tokens are computed (vLLM).
            - ``reserve``: Orca-style max-length reservation: every request reserves the
              blocks of ``reserve_tokens`` tokens at admission (pass the model's
              context, ``ModelConfig.max_context``). ``reserve_tokens`` is required
              (InvalidArgumentError naming it when None). A request whose
              ``prompt + output`` exceeds ``reserve_tokens`` can never be served: it gets
              outcome 1 (rejected) and is counted in ``summary["rejected"]``.
            - ``oracle``: each request reserves its own final length (``prompt + output
              - 1`` tokens under ``vllm``, ``prompt + output`` under ``decode_first``): an
              oracle that knows output lengths, the most favourable reservation.

            Neither reservation ever preempts.
        reserve_tokens: tokens reserved per request under ``reserve`` (1 to 2**32 - 1);
            ignored by ``paged`` and ``oracle``.
        preemption: ``recompute`` (free, requeue at the front) or ``swap`` (to a host pool
            of ``host_blocks`` blocks; recompute when it is full).
        victim: ``newest`` or ``lowest_priority``.
        convention: ``vllm`` (the step completing a prefill samples the first token;
            finished requests free after the step) or ``decode_first`` (the
            reference loop, :mod:`pykvpool.simulate.reference`: each step decodes, frees the
            finished, then admits; a prefill samples nothing, so a request ends holding
            ``prompt + output`` tokens).
    """

    max_running: int = 256
    max_batched_tokens: Optional[int] = 8192
    chunked_prefill: bool = True
    watermark: float = 0.0
    queue: Literal["fcfs", "priority"] = "fcfs"
    allocation: Literal["paged", "reserve", "oracle"] = "paged"
    reserve_tokens: Optional[int] = None
    preemption: Literal["recompute", "swap"] = "recompute"
    host_blocks: int = 0
    victim: Literal["newest", "lowest_priority"] = "newest"
    convention: Literal["vllm", "decode_first"] = "vllm"


#: A layer group of the device pool: a :class:`pykvpool.planning.layers.LayerGroup` (its
#: ``layers`` count does not matter to the pool), a :class:`pykvpool.FullAttention`,
#: :class:`pykvpool.SlidingWindow` or :class:`pykvpool.ChunkedAttention` (what
#: ``PoolLayout.specs()`` gives), or a tuple ``("full",)``,
#: ``("sliding", window)``, ``("sliding", window, sink_tokens)`` or ``("chunked",
#: chunk_size)`` (tokens).
GroupSpec = Union[LayerGroup, "_native.FullAttention", "_native.SlidingWindow", "_native.ChunkedAttention",
                  tuple[Any, ...]]

_GROUP_FORMS = ("a LayerGroup, FullAttention, SlidingWindow, ChunkedAttention or ('full',), "
                "('sliding', window[, sink_tokens]), ('chunked', chunk_size)")


def _group_spec(g: object, i: int) -> tuple[Any, ...]:
    """One group as the tuple ``run_simulation`` takes, or InvalidArgumentError naming it."""
    if isinstance(g, _native.FullAttention):
        g = ("full",)
    elif isinstance(g, _native.SlidingWindow):
        g = ("sliding", g.window, g.sink_tokens)
    elif isinstance(g, _native.ChunkedAttention):
        g = ("chunked", g.chunk_size)
    if isinstance(g, LayerGroup):
        g = (g.kind,) if g.window is None else (g.kind, g.window, g.sink_tokens) if g.kind == "sliding" \
            else (g.kind, g.window)
    if not isinstance(g, (tuple, list)) or not g or not isinstance(g[0], str):
        raise _invalid(f"groups[{i}] must be {_GROUP_FORMS}, got {g!r}")
    sizes = {"full": (0, 0), "sliding": (1, 2), "chunked": (1, 1)}.get(g[0])
    if sizes is None or not sizes[0] <= len(g) - 1 <= sizes[1]:
        raise _invalid(f"groups[{i}] must be {_GROUP_FORMS}, got {tuple(g)!r}")
    for j, v in enumerate(g[1:]):
        what, lo = ("sink_tokens", 0) if j == 1 else ("chunk_size" if g[0] == "chunked" else "window", 1)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= int(v) <= 2**31 - 1:
            raise _invalid(f"groups[{i}] {what} must be an integer in {lo}..=2**31-1 tokens, got {v!r}")
    return (g[0], *(int(v) for v in g[1:]))


def _group_specs(groups: object) -> Optional[list[tuple[Any, ...]]]:
    """``groups`` as ``run_simulation``'s list of tuples (None stays None)."""
    if groups is None:
        return None
    if not isinstance(groups, (tuple, list)) or not 1 <= len(groups) <= 64:
        raise _invalid(f"groups must be None or a tuple of 1 to 64 layer groups, got {groups!r}")
    return [_group_spec(g, i) for i, g in enumerate(groups)]


@dataclass(frozen=True)
class SimConfig:
    """Pool shape, scheduler, and run options.

    Attributes:
        num_blocks: device blocks; block_size: tokens per block (the pool's limits apply:
            at most 2**30 blocks of at most 65,536 tokens).
        prefix_caching: cache prompt blocks of workloads given as token ids or block keys
            (the pool's automatic prefix caching; :func:`run` refuses it for a workload of
            lengths only, where it would cache nothing); ``eviction`` picks idle cached blocks
            to reclaim: one of :data:`pykvpool.EVICTION_POLICIES` (``lru``, ...). A cached admission
            allocates the whole prompt at once (its full blocks are registered then, even
            when chunked prefill computes them over several steps); output tokens are
            not cached (the workload has no ids for them).
        check_invariants: run the pool's ``check_invariants`` after every step (slow).
        max_steps: stop early (unfinished requests get outcome 2).
        record_steps: keep per-step columns (the utilization figures and the summary's
            peak, utilization and ``prefix_hit_rate`` figures need them: without them the
            peaks and ``prefix_hit_rate`` read 0 and ``mean_utilization`` is None;
            ``cached_tokens`` and the latency percentiles do not need them).
        groups: the model's layer groups (:data:`GroupSpec` each, e.g.
            ``ModelConfig.groups``): the device is then a ``BlockPool`` whose ``num_blocks``
            blocks all groups share (one block table per request and group; a block holds
            ``block_size`` tokens of one group's layers, so with G groups of equal layer
            counts the memory of N whole-model blocks holds G x N of them). A sliding or chunked group frees
            the blocks no later query needs at the start of each growth, and the scheduler
            counts them free. ``None`` (default): one full group, today's ``BlockPool``.
            With ``prefix_caching`` every group caches (a hit shares blocks, which the
            per-group columns then count once per holder; a windowed group's release frees
            only blocks no other request holds; an admission allocates its whole prompt in
            every group, so a prompt larger than the pool is rejected). With
            ``preemption="swap"`` the host pool has the same groups and a swap moves what
            each group holds (a window only its sinks and window). With groups the steps gain
            ``blocks_used_g0..`` and the summary ``peak_blocks_used_g0..``, ``kv_tokens`` counts
            the tokens stored over all groups, and a reservation (``reserve``, ``oracle``)
            counts every logical block of every group.
        stop_when: a :class:`pykvpool.simulate.stop.StopWhen` (SLO targets): stop as soon
            as the run certainly cannot meet them; ``summary["stopped"]`` names the target
            (None: the run went to the end, the same as without the rule). Default None.
        replicas: data parallelism: this many replicas, 1 (default) to :data:`MAX_REPLICAS`,
            each a whole engine of this configuration (its own ``num_blocks`` pool,
            scheduler and the same step-time model) behind one router; their steps run
            in time order on one logical clock. An arrival goes to one replica for good:
            ``router="round_robin"`` (default) sends the k-th arrival to replica k mod
            ``replicas`` (each replica then serves exactly what a one-replica run of its
            share of the trace serves); ``"shortest_queue"`` to the replica with the
            fewest pending tokens (SplitwiseSim's token JSQ: a routed request counts its
            prompt tokens until its first token, then 1 until it finishes; events count
            from the end of the step that made them; ties to the lowest index). Requests
            gain a ``replica`` column (-1: never routed), steps a ``replica`` column; the
            summary's latencies and throughputs are over all requests, its peaks the most
            one replica held at once, ``steps`` every replica's. One replica is the
            classic engine, bit for bit.
        disaggregation: a :class:`pykvpool.simulate.disagg.Disaggregation`: the
            ``replicas`` are prefill instances, its decode instances follow them (replica
            indices ``replicas`` on; :func:`run`'s ``decode_time_model`` times their
            steps) and each request's KV moves between them over its link. Needs
            ``allocation="paged"`` and ``convention="vllm"``. Default None: colocated.

    Raises:
        InvalidArgumentError: ``groups`` not None or a tuple/list of 1 to 64 groups, an
            unknown kind, a window or chunk < 1, negative sinks (naming ``groups[i]``);
            ``replicas`` not an integer in 1..=:data:`MAX_REPLICAS`, an unknown ``router``;
            ``disaggregation`` with another allocation or convention.
        TypeError: ``stop_when`` or ``disaggregation`` of the wrong type.
    """

    num_blocks: int
    block_size: int = 16
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    prefix_caching: bool = False
    eviction: str = "lru"
    check_invariants: bool = False
    max_steps: Optional[int] = None
    record_steps: bool = True
    groups: Optional[tuple[GroupSpec, ...]] = None
    stop_when: Optional[StopWhen] = None
    replicas: int = 1
    router: Literal["round_robin", "shortest_queue"] = "round_robin"
    disaggregation: Optional[Disaggregation] = None

    def __post_init__(self) -> None:
        _group_specs(self.groups)
        if _count(self.replicas, "replicas", 1) > MAX_REPLICAS:
            raise _invalid(f"replicas must be in 1..={MAX_REPLICAS}, got {self.replicas}")
        if self.router not in ROUTERS:
            raise _invalid(f"unknown router={self.router!r} (one of {', '.join(ROUTERS)})")
        if self.stop_when is not None and not isinstance(self.stop_when, StopWhen):
            raise TypeError(f"stop_when must be a StopWhen or None, got {type(self.stop_when).__name__}")
        if self.disaggregation is not None:
            if not isinstance(self.disaggregation, Disaggregation):
                raise TypeError(f"disaggregation must be a Disaggregation or None, got {type(self.disaggregation).__name__}")
            s = self.scheduler
            if s.allocation != "paged" or s.convention != "vllm":
                raise _invalid("disaggregation needs allocation='paged' and convention='vllm', "
                               f"got {s.allocation!r} and {s.convention!r}")


def kv_blocks_for_memory(
    model: ModelConfig,
    hardware: Hardware,
    block_size: int = 16,
    *,
    budget: Optional[Budget] = None,
    kv_dtype: str = "bf16",
) -> int:
    """Blocks of ``block_size`` tokens left for KV by ``budget`` (default:
    :func:`pykvpool.planning.ledger.default_budget` of ``hardware``, the budget ``pykvpool ledger``
    uses) in the model's hybrid pool (:func:`pykvpool.planning.pool_groups.pool_layout`: one
    block holds ``block_size`` tokens of ``layers_per_group`` layers):
    ``floor(floor(kv_budget / (layers_per_group x layer bytes)) / block_size)``. A model of one
    attention kind (every full-attention model, Mistral's all-sliding one) has one group of
    all its layers, so this is ``MemoryLedger(model, budget, kv_dtype).token_capacity //
    block_size`` (Llama-3-8B BF16 on the A100-80GB: 500,063 tokens = 31,253 blocks of 16);
    a hybrid model's blocks are smaller (Gemma-3-12B: 8 of its 48 layers, six groups) and a
    sequence holds blocks in every group, windowed groups only their window's.

    Raises:
        BudgetError: (an InvalidArgumentError) the weights plus the reserve leave no room
            for one block of KV.
        InvalidArgumentError: ``block_size`` < 1, a bad dtype or budget.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise _native.InvalidArgumentError(f"block_size must be an integer >= 1, got {block_size!r}")
    ledger = MemoryLedger(model, default_budget(hardware) if budget is None else budget, storage_dtype(kv_dtype))
    layout = pool_layout(model, ledger.dtype, block_size)
    blocks = layout.num_blocks(ledger.kv_budget_bytes)
    if blocks < 1:
        raise BudgetError(f"the KV budget ({ledger.kv_budget_bytes / 2**30:.2f} GiB) holds no block of "
                          f"{block_size} tokens", needed_bytes=layout.block_bytes,
                          available_bytes=ledger.kv_budget_bytes)
    return blocks


#: seconds per step (constant), a :class:`Roofline`, or a Python callable.
TimeModel = Union[float, Roofline, StepTimeFn]


@dataclass
class SimulationResult:
    """Columns of one run.

    Attributes:
        requests: per request (workload order): arrival, first_scheduled, first_token,
            finish, ttft, tpot, e2e, queueing (seconds, NaN if it never happened),
            preemptions, swaps, recomputed_tokens, cached_tokens, prompt_len, output_len,
            priority, outcome (0 finished, 1 rejected: can never fit, 2 unfinished), replica
            (the replica that served it; -1: the run ended before it arrived); with
            ``SimConfig.disaggregation`` decode_replica (-1: none), kv_ready and
            decode_start (s; NaN: no transfer), and so (-1, NaN) in a colocated run.
        steps: per step (every replica's, by start time): time (start), duration, replica, running (requests holding KV after the
            step's admissions), batch (requests computing), waiting, swapped, prefill_tokens,
            decode_tokens, blocks_used, blocks_reserved, kv_tokens, utilization (partly
            filled and reserved blocks count as waste), cache_query_tokens,
            cache_hit_tokens, prefix_hit_rate (NaN without a cached admission), preemptions,
            swapped_blocks; with ``SimConfig.groups``, ``blocks_used_g{j}`` per group ``j``
            (they add up to blocks_used), and kv_tokens counts the tokens stored over all
            groups (a window stores its sinks and window only; utilization is stored
            tokens over held and reserved slots).
        summary: scalars: counts (int), makespan (s), throughput (tokens/s, requests/s),
            peak running and blocks (with groups also ``peak_blocks_used_g{j}``), mean
            utilization, prefix hit rate (0 when nothing was looked up), and ``{ttft,tpot,e2e,queueing}_{mean,p50,p90,p99,max}`` (s) over
            finished requests; kv_transfers, kv_transfer_bytes, and
            ``{kv_transfer,decode_wait}_{mean,...}`` (s) over the finished requests whose
            KV moved (None in a colocated run). A statistic over an empty set is None, never NaN: the
            latencies without a finished request (TPOT: without a finished request of 2 or
            more output tokens), makespan without a finished request, throughputs
            without a positive makespan, mean utilization without a recorded step.
            ``stopped``: None, or the target of ``SimConfig.stop_when`` that stopped the
            run early (``rejected``, ``ttft_p99``, ``tpot_p50``, ``tpot_p99``,
            ``throughput``).
    """

    requests: dict[str, Array]
    steps: dict[str, Array]
    #: int, float, or None (see above).
    summary: dict[str, Any]

    def to_csv(self, directory: Union[str, os.PathLike[str]], prefix: str = "") -> list[str]:
        """Write ``requests.csv``, ``steps.csv`` and ``summary.csv`` into ``directory``
        (created if needed), each name after ``prefix``; returns the paths written. A None
        summary value is an empty cell.

        Raises:
            OSError: ``directory`` cannot be created or a file cannot be written.
        """
        os.makedirs(directory, exist_ok=True)
        paths = []
        for name, cols in (("requests", self.requests), ("steps", self.steps)):
            path = os.path.join(directory, f"{prefix}{name}.csv")
            keys = list(cols)
            with open(path, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(keys)
                w.writerows(zip(*(cols[k].tolist() for k in keys)))
            paths.append(path)
        path = os.path.join(directory, f"{prefix}summary.csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["metric", "value"])
            w.writerows(sorted(self.summary.items()))
        paths.append(path)
        return paths


def _time_arg(time_model: TimeModel) -> object:
    if isinstance(time_model, Roofline):
        return time_model.figures()
    return time_model


def _columns(workload: Workload) -> dict[str, object]:
    """The workload dict of :func:`pykvpool._native.run_simulation`."""
    w = workload
    return {"arrival": w.arrival, "prompt_len": w.prompt_len, "output_len": w.output_len, "priority": w.priority,
            "token_ids": w.token_ids, "token_offsets": w.token_offsets, "block_keys": w.block_keys,
            "key_offsets": w.key_offsets, "tokens_per_key": w.tokens_per_key}


def _options(config: SimConfig) -> dict[str, object]:
    """The configuration dict of :func:`pykvpool._native.run_simulation`."""
    s = config.scheduler
    return {"num_blocks": config.num_blocks, "block_size": config.block_size, "max_running": s.max_running,
            "max_batched_tokens": s.max_batched_tokens, "chunked_prefill": s.chunked_prefill,
            "watermark": s.watermark, "queue": s.queue, "allocation": s.allocation,
            "reserve_tokens": s.reserve_tokens, "preemption": s.preemption, "host_blocks": s.host_blocks,
            "victim": s.victim, "convention": s.convention, "prefix_caching": config.prefix_caching,
            "eviction": config.eviction, "check_invariants": config.check_invariants,
            "max_steps": config.max_steps, "record_steps": config.record_steps,
            "groups": _group_specs(config.groups),
            "stop_when": None if config.stop_when is None else config.stop_when.as_dict(),
            "replicas": config.replicas, "router": config.router,
            "disaggregation": None if config.disaggregation is None else config.disaggregation.as_dict()}


def run(workload: Workload, config: SimConfig, time_model: TimeModel = 0.0,
        decode_time_model: Optional[TimeModel] = None) -> SimulationResult:
    """Simulate ``workload`` under ``config``; steps last ``time_model`` seconds.

    A constant 0.0 counts steps only (every time is 0). A Python callable is called once
    per step with the GIL held; its exceptions propagate. An empty workload gives empty
    columns and a summary of zero counts and None statistics. With
    ``config.disaggregation``, ``decode_time_model`` (default None: the disaggregation's
    own ``decode_time_model``, else ``time_model``) times the decode instances' steps
    (their hardware or parallelism may differ).

    Raises:
        InvalidArgumentError: bad columns (2-D, ragged, mismatched lengths, lengths outside
            ``1..=MAX_REQUEST_TOKENS``, more than :data:`MAX_REQUESTS` requests, NaN or
            negative arrivals) or configuration (unknown policy names, ``reserve``
            without ``reserve_tokens``, counts out of range, bools as counts), each naming
            the argument;
            ``prefix_caching`` on a workload whose prompts are lengths only (neither
            token ids nor block keys: nothing could be cached; see
            :func:`pykvpool.simulate.workload.check_prefix_caching`); a step-time callable
            returning something other than seconds; ``decode_time_model`` without
            ``config.disaggregation``.
    """
    if config.prefix_caching is True:
        check_prefix_caching(workload)
    if decode_time_model is None and config.disaggregation is not None:
        decode_time_model = config.disaggregation.decode_time_model
    decode = None if decode_time_model is None else _time_arg(decode_time_model)
    d = _native.run_simulation(_columns(workload), _options(config), _time_arg(time_model), decode)
    return SimulationResult(requests=d["requests"], steps=d["steps"], summary=d["summary"])
