"""Evaluating points: a point's deployment (pool and step-time model), its sustained rate
per SLO on the rate ladder, and the row a search records for it.

A chain is the points that differ only in their devices and how they are split
(replicas x tensor parallelism), in increasing order; a family (:func:`families_of`) is
the chains that differ only in the scheduler's limits, evaluated in one task. The pruned
strategy starts each point's search at the rung a neighbour sustained (the same split in
the latest chain of its family that differs in one field, else the chain's previous
point) and gallops from there, and skips a
point (``dominated``) only when a cheaper point of its chain sustains the ladder's top
rung and is not flagged superlinear: no rate on the ladder can then put it on the cost
vs rate frontier or make it a best point, so the pruned search's frontier and best
points are the grid's. (A point whose objective at the top rung is below its chain's
best can still sustain more than every cheaper point: it belongs on the frontier, and
is simulated.) Every row carries the scaling checks of :mod:`pykvpool.search.scaling`.
Every run stops as soon as it certainly cannot meet any SLO
(:func:`pykvpool.search.slo.stop_rule`), which leaves every decision unchanged.

Everything here is a pure function of its inputs (the simulator is deterministic, and a
hint comes only from the same family, in a fixed order), so a row is the same on every
backend, with any batching, and in every run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Sequence

from pykvpool.errors import BudgetError
from pykvpool.planning.hardware import Hardware, hardware_preset
from pykvpool.planning.ledger import DEFAULT_FRACTION, DEFAULT_RESERVE_BYTES, Budget, MemoryLedger
from pykvpool.planning.models import ModelConfig, storage_dtype
from pykvpool.planning.pool_groups import pool_layout
from pykvpool.planning.roofline import Roofline
from pykvpool.search.scaling import SCALING_ID, flag_chain_point, scaling_factor
from pykvpool.search.slo import SLO, Objective, RateLadder, stop_rule
from pykvpool.search.space import Point
from pykvpool.simulate.disagg import Disaggregation
from pykvpool.simulate.engine import SchedulerConfig, SimConfig, SimulationResult, kv_blocks_for_memory, run
from pykvpool.simulate.workload import Workload
from pykvpool.simulate.sweep import at_rate

__all__ = ["FAMILY_CHAINS", "FAMILY_FREE", "METRICS", "ROUTER", "STRATEGIES", "SearchSpec", "deploy", "evaluate_batch",
           "evaluate_chain", "families_of", "make_batches", "summary_of"]

#: How a point's replicas share its arrivals (:attr:`pykvpool.simulate.SimConfig.router`).
ROUTER: Literal["round_robin", "shortest_queue"] = "shortest_queue"
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
        early_stop: runs stop as soon as no SLO can be met (exact: the same rows; off
            only to measure what it saves).
        neighbour_hints: the pruned search starts from a neighbouring chain's answer and
            gallops (exact under monotonicity: the same rates); off: the search before
            it (the fewer-devices hint probed, then bisection), only to measure it.
    """

    workload: Workload
    model: ModelConfig
    slos: tuple[SLO, ...]
    ladder: RateLadder
    objective: Objective
    strategy: str = "pruned"
    early_stop: bool = True
    neighbour_hints: bool = True


def replica_hardware(hw: Hardware, devices: int) -> Hardware:
    """``devices`` devices as one tensor-parallel group under
    :data:`pykvpool.search.scaling.SCALING_MODEL`: memory, bandwidth and FLOP/s multiplied
    by :func:`pykvpool.search.scaling.scaling_factor`; the link figures stay per device
    (the roofline adds the all-reduce time from them).

    Raises:
        Nothing: arithmetic on a validated preset.
    """
    if devices == 1:
        return hw
    f = scaling_factor(devices)
    return Hardware(f"{devices}x {hw.name}", hw.memory_bytes * f, hw.bandwidth * f,
                    {k: v * f for k, v in hw.peak_flops.items()}, hw.source, hw.link_bandwidth, hw.link_latency,
                    hw.power_watts * f, hw.network_bandwidth * f, hw.network_latency)


def deploy(point: Point, model: ModelConfig) -> tuple[SimConfig, Roofline]:
    """The simulator configuration and step-time model of ``point`` serving ``model``:
    :attr:`Point.replicas` replicas behind the shortest-queue router, each a
    tensor-parallel group of ``point.tensor_parallel`` devices whose KV pool is the budget
    of ``pykvpool ledger`` (all its memory minus 4 GiB per device) less the weights, in
    blocks (layer groups: the model's hybrid pool's blocks), divided by the copies of each
    token's KV the group keeps (:meth:`pykvpool.planning.models.ModelConfig.kv_replicas`);
    ``num_blocks`` is one replica's pool. A point with a prefill:decode split
    (:attr:`Point.disaggregation`) runs :attr:`Point.prefill_replicas` of its replicas as
    prefill instances and the others as decode instances (on
    :attr:`Point.decode_hardware`: their own pool and roofline, in the configuration's
    ``disaggregation``), each request's KV (the model's bytes per token in the point's
    dtype) moved over the groups' networks (every device's adapter: ``network_bandwidth x
    T``, the slower side's; ``network_latency`` per transfer), pipelined layer by layer
    with the last prefill step.

    Raises:
        BudgetError: the weights leave no room for one block of KV (on either side).
    """
    hw, blocks, groups = _pool(point, model, point.hardware)
    bs, tp = point.block_size, point.tensor_parallel
    preemption: Any = point.preemption
    sched = SchedulerConfig(max_running=point.max_running, max_batched_tokens=point.max_batched_tokens,
                            chunked_prefill=point.chunked_prefill, preemption=preemption,
                            host_blocks=blocks if point.preemption == "swap" else 0)
    disagg = None
    if point.split is not None:
        d_hw, d_blocks, decode_tm = hw, blocks, None
        if point.decode_hardware != point.hardware:
            d_hw, d_blocks, _ = _pool(point, model, point.decode_hardware)
            decode_tm = Roofline(model, d_hw, block_size=bs, kv_dtype=point.kv_dtype, devices=tp)
        disagg = Disaggregation(decode_replicas=point.decode_replicas,
                                bandwidth=min(hw.network_bandwidth, d_hw.network_bandwidth),
                                bytes_per_token=model.kv_bytes_per_token(point.kv_dtype),
                                latency=max(hw.network_latency, d_hw.network_latency), layers=model.num_layers,
                                decode_num_blocks=d_blocks, decode_time_model=decode_tm)
    cfg = SimConfig(num_blocks=blocks, block_size=bs, scheduler=sched, prefix_caching=point.prefix_caching,
                    eviction=point.eviction, record_steps=False, groups=groups, replicas=point.prefill_replicas,
                    router=ROUTER, disaggregation=disagg)
    return cfg, Roofline(model, hw, block_size=bs, kv_dtype=point.kv_dtype, devices=tp)


def _pool(point: Point, model: ModelConfig, hardware: str) -> tuple[Hardware, int, Any]:
    """One replica of ``point`` on ``hardware``: its tensor-parallel group's hardware, its
    KV pool in blocks and the pool's layer groups (None without)."""
    tp = point.tensor_parallel
    hw = replica_hardware(hardware_preset(hardware), tp)
    budget = Budget(hw.memory_bytes, DEFAULT_FRACTION, DEFAULT_RESERVE_BYTES * tp)
    bs, groups = point.block_size, None
    if point.layer_groups:
        blocks = kv_blocks_for_memory(model, hw, bs, budget=budget, kv_dtype=point.kv_dtype)
        groups = tuple(pool_layout(model, point.kv_dtype, bs).specs())
    else:
        led = MemoryLedger(model, budget, storage_dtype(point.kv_dtype))
        blocks = max(led.token_capacity, 0) // bs
        if blocks < 1:
            raise BudgetError(f"{tp} x {hardware} leaves no KV block of {bs} tokens for "
                              f"{model.name}", needed_bytes=0, available_bytes=max(led.kv_budget_bytes, 0))
    copies = model.kv_replicas(tp)
    blocks = int(blocks / copies)
    if blocks < 1:
        raise BudgetError(f"{tp} x {hardware} keeps {copies:g} copies of each token's KV and has no "
                          f"KV block of {bs} tokens left for {model.name}", needed_bytes=0, available_bytes=0)
    return hw, blocks, groups


def point_cost(objective: Objective, point: Point) -> float:
    """What ``point`` costs under ``objective``: its devices on their hardware (the prefill
    and the decode instances' each on its own with a split naming decode hardware).

    Raises:
        As :meth:`pykvpool.search.slo.Objective.cost`.
    """
    if point.decode_hardware == point.hardware:
        return objective.cost(point.hardware, point.devices)
    tp = point.tensor_parallel
    return (objective.cost(point.hardware, point.prefill_replicas * tp)
            + objective.cost(point.decode_hardware, point.decode_replicas * tp))


def _gallop(meets: Callable[[int], bool], rungs: int, hint: int) -> tuple[int, int]:
    """A bracket ``(lo, hi)`` (``lo`` meets or is -1, ``hi`` fails or is ``rungs``) around
    the answer, from ``hint``: probe it, then hint +- 1, 2, 4, ... until the answer flips."""
    h = min(max(hint, 0), rungs - 1)
    if meets(h):
        lo, hi, off = h, rungs, 1
        while lo < rungs - 1:
            probe = min(h + off, rungs - 1)
            if not meets(probe):
                return lo, probe
            lo, off = probe, off * 2
        return lo, hi
    lo, hi, off = -1, h, 1
    while hi > 0:
        probe = max(h - off, 0)
        if meets(probe):
            return probe, hi
        hi, off = probe, off * 2
    return lo, hi


def sustained_rung(meets: Callable[[int], bool], rungs: int, strategy: str, hint: Optional[int],
                   gallop: bool = True) -> int:
    """The highest rung below the first failing one (-1: the lowest fails). ``grid`` tries
    every rung; ``pruned`` gallops from ``hint`` (-1 to ``rungs - 1``: probe it, then
    hint +- 1, 2, 4, ... until the answer flips; a right guess costs 2 runs) and bisects
    what is left, or bisects the whole ladder without a hint: exact when meeting the SLO
    is monotone in the rate. Without ``gallop``: probe ``hint`` (0 to ``rungs - 1``),
    then bisect (the search before galloping, kept to measure it).

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
    if hint is not None and -1 <= hint < rungs and gallop:
        lo, hi = _gallop(meets, rungs, hint)
    elif hint is not None and 0 <= hint < rungs:
        lo, hi = (hint, hi) if meets(hint) else (lo, hint)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo


class _Point:
    """One point's simulations, memoized by rung and shared by its SLOs (each run stops
    early, exactly, once no SLO can be met: :func:`pykvpool.search.slo.stop_rule`)."""

    def __init__(self, spec: SearchSpec, cfg: SimConfig, tm: Roofline) -> None:
        self.spec, self.tm = spec, tm
        self.cfg = dataclasses.replace(cfg, stop_when=stop_rule(spec.slos)) if spec.early_stop else cfg
        self.rates = spec.ladder.rates()
        self.runs: dict[int, dict[str, Any]] = {}

    def summary(self, i: int) -> dict[str, Any]:
        if i not in self.runs:
            self.runs[i] = summary_of(run(at_rate(self.spec.workload, self.rates[i]), self.cfg, self.tm),
                                      self.spec.slos)
        return self.runs[i]

    def meets(self, slo: SLO) -> Callable[[int], bool]:
        n = len(self.spec.workload)
        return lambda i: slo.meets(self.summary(i), n)


def summary_of(result: SimulationResult, slos: Sequence[SLO]) -> dict[str, Any]:
    """A run's summary with, for each SLO of per-request bounds, the requests that met
    them under its :attr:`pykvpool.search.slo.SLO.attained_key` (what its ``meets`` reads).

    Raises:
        Nothing: counts over the run's columns.
    """
    out = dict(result.summary)
    for slo in slos:
        if slo.attainment is not None:
            out[slo.attained_key] = slo.attained(result.requests)
    return out


def _base_row(point: Point, spec: SearchSpec) -> dict[str, Any]:
    row: dict[str, Any] = {"key": point.key(), **point.as_dict(),
                           "cost": point_cost(spec.objective, point), "scaling": SCALING_ID}
    for slo in spec.slos:
        row.update({f"{slo.name}_state": "infeasible", f"{slo.name}_rate": None, f"{slo.name}_objective": None,
                    f"{slo.name}_rate_is_lower_bound": None, f"{slo.name}_superlinear": None})
        row.update({f"{slo.name}_{m}": None for m in METRICS})
        row[f"{slo.name}_attained"] = None
    return row


#: Fields the chains of one family may differ in (besides devices): the scheduler's
#: limits, which move a point's sustained rate by a rung or two at most.
FAMILY_FREE = ("max_running", "max_batched_tokens")
#: Most chains in one family (a larger group is cut, in order).
FAMILY_CHAINS = 32
_FIELDS = tuple(f for f in Point.__dataclass_fields__ if f not in ("devices", "tensor_parallel"))


def _family_key(p: Point) -> tuple[Any, ...]:
    return tuple(getattr(p, f) for f in _FIELDS if f not in FAMILY_FREE)


def families_of(chains: list[list[Point]]) -> list[list[list[Point]]]:
    """Chains grouped into families: equal in every field but :data:`FAMILY_FREE` (and
    the devices and their split), in first-seen order, cut into pieces of at most :data:`FAMILY_CHAINS`. A
    family is evaluated in one task, each point starting from a neighbour's answer, so
    its rows depend only on the family, never on the backend or the batching.

    Raises:
        Nothing: bookkeeping on lists.
    """
    groups: dict[tuple[Any, ...], list[list[Point]]] = {}
    for c in chains:
        groups.setdefault(_family_key(c[0]), []).append(c)
    return [g[i:i + FAMILY_CHAINS] for g in groups.values() for i in range(0, len(g), FAMILY_CHAINS)]


#: Where a point sits in its chain: devices and tensor-parallel degree.
_Split = tuple[int, int]


class _Hints:
    """Sustained rungs found so far in a family, by chain fields, split and SLO."""

    def __init__(self) -> None:
        self.found: list[tuple[tuple[Any, ...], dict[tuple[_Split, str], int]]] = []

    def start(self, chain: list[Point]) -> dict[tuple[_Split, str], int]:
        fields = tuple(getattr(chain[0], f) for f in _FIELDS)
        self.found.append((fields, {}))
        return self.found[-1][1]

    def neighbour(self, split: _Split, slo: str) -> Optional[int]:
        """The answer, for the same split and SLO, of the latest earlier chain that
        differs from the current one in one field."""
        cur = self.found[-1][0]
        for fields, ks in reversed(self.found[:-1]):
            if sum(a != b for a, b in zip(fields, cur)) == 1 and (split, slo) in ks:
                k: int = ks[(split, slo)]
                return k
        return None


def evaluate_chain(spec: SearchSpec, chain: list[Point], hints: Optional[_Hints] = None) -> list[dict[str, Any]]:
    """Rows of a chain's points, in order: ``key``, the point's fields, ``cost``,
    ``scaling`` (:data:`pykvpool.search.scaling.SCALING_ID`), ``num_blocks``, ``status``
    (``ok`` or why it cannot run), ``sims`` (runs made) and per SLO ``<slo>_state``
    (``ok``; ``none``: not even the lowest rung; ``dominated``: pruned, not simulated;
    ``infeasible``), ``<slo>_rate`` (sustained, req/s), ``<slo>_objective``,
    ``<slo>_rate_is_lower_bound`` and ``<slo>_superlinear`` (the scaling checks of
    :mod:`pykvpool.search.scaling`; None without a rate), ``<slo>_attained`` (for an SLO
    of per-request bounds, the requests that met them at that rate; else None) and the :data:`METRICS` at that
    rate. A point whose weights do not fit is a row
    with ``status`` ``infeasible: ...`` and no run. The pruned search starts each point
    from the answer of the same devices in a neighbouring chain of ``hints`` (its
    family), else from the same chain's fewer devices.

    Raises:
        InvalidArgumentError: a configuration the simulator refuses, a hardware without a
            price under ``per_dollar``.
    """
    rows: list[dict[str, Any]] = []
    hints = hints or _Hints()
    mine = hints.start(chain)
    prev: dict[str, Optional[int]] = {s.name: None for s in spec.slos}
    done: list[dict[str, Any]] = []
    top = spec.ladder.rates()[-1]
    for point in chain:
        row = _base_row(point, spec)
        try:
            cfg, tm = deploy(point, spec.model)
        except BudgetError as e:
            rows.append({**row, "num_blocks": 0, "status": f"infeasible: {e}", "sims": 0})
            continue
        p = _Point(spec, cfg, tm)
        row["num_blocks"] = cfg.num_blocks
        split = (point.devices, point.tensor_parallel)
        for slo in spec.slos:
            s = slo.name
            if spec.strategy == "pruned" and _capped(done, s, row["cost"]):
                row[f"{s}_state"] = "dominated"
                continue
            near = hints.neighbour(split, s) if spec.neighbour_hints else None
            k = sustained_rung(p.meets(slo), len(p.rates), spec.strategy, prev[s] if near is None else near,
                               spec.neighbour_hints)
            prev[s] = mine[(split, s)] = k
            rate = p.rates[k] if k >= 0 else 0.0
            row.update({f"{s}_state": "ok" if k >= 0 else "none", f"{s}_rate": rate,
                        f"{s}_objective": spec.objective.value(rate, row["cost"])})
            if k >= 0:
                row.update({f"{s}_{m}": p.summary(k).get(m) for m in METRICS})
                row[f"{s}_attained"] = p.summary(k).get(slo.attained_key)
            flag_chain_point(row, done, s, top)
        row.update({"status": "ok", "sims": len(p.runs)})
        done.append(row)
        rows.append(row)
    return rows


def _capped(done: list[dict[str, Any]], slo: str, cost: float) -> bool:
    """Whether a point of the chain cheaper than ``cost`` sustains the ladder's top rung
    for ``slo`` and is not flagged superlinear: no rate can then put a costlier one on
    the frontier or make it a best point (the pruned search skips it)."""
    return any(r[f"{slo}_state"] == "ok" and r[f"{slo}_rate_is_lower_bound"] and not r[f"{slo}_superlinear"]
               and r["cost"] < cost for r in done)


def evaluate_batch(spec: SearchSpec, families: list[list[list[Point]]]) -> list[dict[str, Any]]:
    """Rows of several families (one backend task), family after family, chain after
    chain (the hints flow within a family only).

    Raises:
        InvalidArgumentError: as :func:`evaluate_chain`.
    """
    rows: list[dict[str, Any]] = []
    for fam in families:
        hints = _Hints()
        for chain in fam:
            rows += evaluate_chain(spec, chain, hints)
    return rows


def make_batches(families: list[list[list[Point]]], parallelism: int,
                 max_points: int = 64) -> list[list[list[list[Point]]]]:
    """Families (:func:`families_of`) grouped into batches: about four batches per worker
    (so the load balances), each of at most ``max_points`` points unless one family is
    larger; order kept, families whole.

    Raises:
        Nothing: plain bookkeeping on lists.
    """
    def size(f: list[list[Point]]) -> int:
        return sum(len(c) for c in f)

    total = sum(size(f) for f in families)
    per = max(1, min(max_points, -(-total // max(4 * parallelism, 1))))
    out: list[list[list[list[Point]]]] = []
    cur: list[list[list[Point]]] = []
    n = 0
    for f in families:
        if cur and n + size(f) > per:
            out.append(cur)
            cur, n = [], 0
        cur.append(f)
        n += size(f)
    if cur:
        out.append(cur)
    return out
