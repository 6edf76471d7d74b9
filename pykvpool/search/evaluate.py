"""Evaluating points: a point's deployment (pool and step-time model), its sustained rate
per SLO on the rate ladder, and the row a search records for it.

A chain is the points that differ only in their device count, in increasing order: more
devices mean more memory and faster steps, so the pruned strategy starts each point's
search at the rung the previous point sustained and skips a point no rate can make
better than the chain's best (its objective at the top rung is no higher).

Everything here is a pure function of its inputs (the simulator is deterministic), so a
row is the same on every backend and in every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from pykvpool.errors import BudgetError
from pykvpool.planning.hardware import Hardware, hardware_preset
from pykvpool.planning.ledger import DEFAULT_FRACTION, DEFAULT_RESERVE_BYTES, Budget, MemoryLedger
from pykvpool.planning.models import ModelConfig, storage_dtype
from pykvpool.planning.pool_groups import pool_layout
from pykvpool.planning.roofline import Roofline
from pykvpool.search.slo import SLO, Objective, RateLadder
from pykvpool.search.space import Point
from pykvpool.simulate.engine import SchedulerConfig, SimConfig, Workload, kv_blocks_for_memory, run
from pykvpool.simulate.sweep import at_rate

__all__ = ["METRICS", "STRATEGIES", "SearchSpec", "deploy", "evaluate_batch", "evaluate_chain", "make_batches"]

#: Strategies: every rung of every point, or the pruned search.
STRATEGIES = ("grid", "pruned")
#: Summary statistics recorded at each point's sustained rate (seconds, tokens/s, req/s).
METRICS = ("ttft_p99", "tpot_p50", "tpot_p99", "output_throughput", "request_throughput", "preemptions")


@dataclass(frozen=True)
class SearchSpec:
    """What every evaluation shares (put in a backend's object store once).

    Attributes:
        workload: the request stream, re-timed to each rung (its arrival span scaled).
        model: the served model; slos: the targets; ladder: the rates tried.
        objective: what ranks points; strategy: ``grid`` or ``pruned``.
    """

    workload: Workload
    model: ModelConfig
    slos: tuple[SLO, ...]
    ladder: RateLadder
    objective: Objective
    strategy: str = "pruned"


def replica_hardware(hw: Hardware, devices: int) -> Hardware:
    """``devices`` devices as one tensor-parallel replica: memory, bandwidth and FLOP/s
    multiplied (ideal scaling, no communication time).

    Raises:
        Nothing: arithmetic on a validated preset.
    """
    if devices == 1:
        return hw
    return Hardware(f"{devices}x {hw.name}", hw.memory_bytes * devices, hw.bandwidth * devices,
                    {k: v * devices for k, v in hw.peak_flops.items()}, hw.source)


def deploy(point: Point, model: ModelConfig) -> tuple[SimConfig, Roofline]:
    """The simulator configuration and step-time model of ``point`` serving ``model``: the
    KV pool is the budget of ``pykvpool ledger`` (all memory minus 4 GiB per device) less
    the weights, in blocks (layer groups: the model's hybrid pool's blocks).

    Raises:
        BudgetError: the weights leave no room for one block of KV.
    """
    hw = replica_hardware(hardware_preset(point.hardware), point.devices)
    budget = Budget(hw.memory_bytes, DEFAULT_FRACTION, DEFAULT_RESERVE_BYTES * point.devices)
    bs, groups = point.block_size, None
    if point.layer_groups:
        blocks = kv_blocks_for_memory(model, hw, bs, budget=budget, kv_dtype=point.kv_dtype)
        groups = tuple(pool_layout(model, point.kv_dtype, bs).specs())
    else:
        led = MemoryLedger(model, budget, storage_dtype(point.kv_dtype))
        blocks = max(led.token_capacity, 0) // bs
        if blocks < 1:
            raise BudgetError(f"{point.devices} x {point.hardware} leaves no KV block of {bs} tokens for "
                              f"{model.name}", needed_bytes=0, available_bytes=max(led.kv_budget_bytes, 0))
    preemption: Any = point.preemption
    sched = SchedulerConfig(max_running=point.max_running, max_batched_tokens=point.max_batched_tokens,
                            chunked_prefill=point.chunked_prefill, preemption=preemption,
                            host_blocks=blocks if point.preemption == "swap" else 0)
    cfg = SimConfig(num_blocks=blocks, block_size=bs, scheduler=sched, prefix_caching=point.prefix_caching,
                    eviction=point.eviction, record_steps=False, groups=groups)  # type: ignore[arg-type]
    return cfg, Roofline(model, hw, block_size=bs, kv_dtype=point.kv_dtype)


def sustained_rung(meets: Callable[[int], bool], rungs: int, strategy: str, hint: Optional[int]) -> int:
    """The highest rung below the first failing one (-1: the lowest fails). ``grid`` tries
    every rung; ``pruned`` bisects (first probing ``hint``), exact when meeting the SLO
    is monotone in the rate.

    Raises:
        Whatever ``meets`` raises.
    """
    if strategy == "grid":
        ok = [meets(i) for i in range(rungs)]
        k = -1
        while k + 1 < rungs and ok[k + 1]:
            k += 1
        return k
    lo, hi = -1, rungs
    if hint is not None and 0 <= hint < rungs:
        lo, hi = (hint, hi) if meets(hint) else (lo, hint)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo


class _Point:
    """One point's simulations, memoized by rung and shared by its SLOs."""

    def __init__(self, spec: SearchSpec, cfg: SimConfig, tm: Roofline) -> None:
        self.spec, self.cfg, self.tm = spec, cfg, tm
        self.rates = spec.ladder.rates()
        self.runs: dict[int, dict[str, Any]] = {}

    def summary(self, i: int) -> dict[str, Any]:
        if i not in self.runs:
            self.runs[i] = run(at_rate(self.spec.workload, self.rates[i]), self.cfg, self.tm).summary
        return self.runs[i]

    def meets(self, slo: SLO) -> Callable[[int], bool]:
        n = len(self.spec.workload)
        return lambda i: slo.meets(self.summary(i), n)


def _base_row(point: Point, spec: SearchSpec) -> dict[str, Any]:
    row: dict[str, Any] = {"key": point.key(), **point.as_dict(),
                           "cost": spec.objective.cost(point.hardware, point.devices)}
    for slo in spec.slos:
        row.update({f"{slo.name}_state": "infeasible", f"{slo.name}_rate": None, f"{slo.name}_objective": None})
        row.update({f"{slo.name}_{m}": None for m in METRICS})
    return row


def evaluate_chain(spec: SearchSpec, chain: list[Point]) -> list[dict[str, Any]]:
    """Rows of a chain's points, in order: ``key``, the point's fields, ``cost``,
    ``num_blocks``, ``status`` (``ok`` or why it cannot run), ``sims`` (runs made) and per
    SLO ``<slo>_state`` (``ok``; ``none``: not even the lowest rung; ``dominated``: pruned,
    not simulated; ``infeasible``), ``<slo>_rate`` (sustained, req/s), ``<slo>_objective``
    and the :data:`METRICS` at that rate. A point whose weights do not fit is a row
    with ``status`` ``infeasible: ...`` and no run.

    Raises:
        InvalidArgumentError: a configuration the simulator refuses, a hardware without a
            price under ``per_dollar``.
    """
    rows: list[dict[str, Any]] = []
    hints: dict[str, Optional[int]] = {s.name: None for s in spec.slos}
    best: dict[str, float] = {s.name: 0.0 for s in spec.slos}
    top = spec.ladder.rates()[-1]
    for point in chain:
        row = _base_row(point, spec)
        try:
            cfg, tm = deploy(point, spec.model)
        except BudgetError as e:
            rows.append({**row, "num_blocks": 0, "status": f"infeasible: {e}", "sims": 0})
            continue
        p = _Point(spec, cfg, tm)
        for slo in spec.slos:
            s = slo.name
            if spec.strategy == "pruned" and best[s] > 0 and best[s] >= spec.objective.value(top, row["cost"]):
                row[f"{s}_state"] = "dominated"
                continue
            k = sustained_rung(p.meets(slo), len(p.rates), spec.strategy, hints[s])
            hints[s] = k if k >= 0 else None
            rate = p.rates[k] if k >= 0 else 0.0
            obj = spec.objective.value(rate, row["cost"])
            best[s] = max(best[s], obj)
            row.update({f"{s}_state": "ok" if k >= 0 else "none", f"{s}_rate": rate, f"{s}_objective": obj})
            if k >= 0:
                row.update({f"{s}_{m}": p.summary(k).get(m) for m in METRICS})
        rows.append({**row, "num_blocks": cfg.num_blocks, "status": "ok", "sims": len(p.runs)})
    return rows


def evaluate_batch(spec: SearchSpec, chains: list[list[Point]]) -> list[dict[str, Any]]:
    """Rows of several chains (one backend task), chain after chain.

    Raises:
        InvalidArgumentError: as :func:`evaluate_chain`.
    """
    return [row for chain in chains for row in evaluate_chain(spec, chain)]


def make_batches(chains: list[list[Point]], parallelism: int, max_points: int = 64) -> list[list[list[Point]]]:
    """Chains grouped into batches: about four batches per worker (so the load balances),
    each of at most ``max_points`` points unless one chain is longer; order kept.

    Raises:
        Nothing: plain bookkeeping on lists.
    """
    total = sum(len(c) for c in chains)
    per = max(1, min(max_points, -(-total // max(4 * parallelism, 1))))
    out: list[list[list[Point]]] = []
    cur: list[list[Point]] = []
    size = 0
    for c in chains:
        if cur and size + len(c) > per:
            out.append(cur)
            cur, size = [], 0
        cur.append(c)
        size += len(c)
    if cur:
        out.append(cur)
    return out

