"""The search's multi-device scaling model, and what a search must not trust because of it.

The one definition of how a point's devices are modelled (:data:`SCALING_MODEL`,
:func:`scaling_factor`): ``N`` devices are ``N / T`` data-parallel replicas behind a
shortest-queue router (:mod:`pykvpool.simulate`'s ``replicas``, each simulated with its
own pool and scheduler), each a tensor-parallel group of ``T`` devices with ``T`` times
one device's memory, bandwidth and FLOP/s, whose every step pays two ring all-reduces
per layer over the devices' link (:class:`pykvpool.planning.roofline.Roofline`, the link
figures of :data:`pykvpool.planning.hardware.HARDWARE`); a group stores the weights once
(sharded), the memory reserve is per device. A point with a prefill:decode split runs
its replicas as prefill and decode instances (:mod:`pykvpool.simulate.disagg`), each
request's KV moved over the group's network adapters. Every output of a search (the command
line, ``best.json``, ``search.json`` and each row, the figures, the report's section)
states it in one line.

Two consequences are carried as data, per SLO, in every row:

- ``<slo>_rate_is_lower_bound``: the point sustains the ladder's top rung, so its rate
  is only known to be at least that (:func:`rate_text` prints it ``>= 64``).
- ``<slo>_superlinear``: the point's rate per device is more than scaling explains
  (:func:`is_superlinear`); its rate is an artefact of the ideal model, and the search
  ranks it neither as a best point nor on the frontier (it is drawn and listed, flagged).

The superlinear rule. Data parallelism is simulated as it is (each replica a whole
engine, the router's choices included), so what replicas gain over one, pooling of
arrivals among them, is the model's own result. Tensor parallelism is what the model
idealizes: a group's compute and memory work divide perfectly over its devices (only the
all-reduces cost). Sharding the weights over more devices leaves each device more KV
memory (the pool is T devices' memory less one copy of the weights), and that is true of
real tensor parallelism too: a rate limited by KV capacity may grow per device in
proportion; growth beyond the KV gain is the artefact. A point P of N devices in groups
of T is flagged when, for some point Q of its chain (the same configuration) with fewer
devices n in groups of fewer devices t < T that sustains a rate that is not a lower
bound, ``rate_P / N > rate_Q / n x max(1, kv_P / kv_Q) x (1 + SCALING_TOLERANCE)``,
where ``kv`` is KV blocks per device (a group's pool over its T devices). Rates are
rungs of the ladder, so the comparison is at the ladder's resolution (the default
ladder doubles every 3 rungs, so 1, 2, 4, 8 devices compare exactly; with other device
ratios a linearly scaling point can read one rung high and be flagged: the rule errs
towards refusing to rank). A point that sustains nothing (``none``) or was not
simulated is never flagged, and no point is compared with one whose rate is a lower
bound.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

__all__ = ["SCALING_ID", "SCALING_MODEL", "SCALING_TOLERANCE", "flag_chain_point", "is_superlinear", "rate_text",
           "scaling_factor", "scaling_note"]

Row = dict[str, Any]

#: The scaling model's name, in every row (``scaling``) and in ``search.json``: a folder
#: written under another model (or before this was recorded) is refused.
SCALING_ID = "dp-jsq-tp-ring-allreduce"
#: The scaling model in one line, as every output states it.
SCALING_MODEL = ("Scaling model: N devices are N/T replicas behind a shortest-queue router, each a T-way "
                 "tensor-parallel group with T x one device's memory, bandwidth and FLOP/s, plus two ring "
                 "all-reduces per layer and step over the device link; a P:D split runs them as prefill "
                 "and decode instances, each request's KV moved over the devices' network.")
#: How far (a fraction) a point's rate per device may exceed what its KV gain explains
#: before it is flagged superlinear.
SCALING_TOLERANCE = 0.05


def scaling_factor(devices: int) -> int:
    """What a tensor-parallel group of ``devices`` devices multiplies one device's
    memory, bandwidth and FLOP/s by under :data:`SCALING_MODEL` (``devices``: the
    group's roofs add up).

    Raises:
        Nothing: the identity on a validated count.
    """
    return devices


def scaling_note(flagged: int = 0) -> str:
    """:data:`SCALING_MODEL`, and how many configurations it flagged (``flagged``: a count
    of superlinear points, said when > 0), in one line.

    Raises:
        Nothing: string formatting.
    """
    if flagged <= 0:
        return SCALING_MODEL
    return (f"{SCALING_MODEL} {flagged} superlinear configuration{'s' * (flagged != 1)} (rate per device above "
            f"what fewer devices in smaller groups give, beyond the KV gain and {SCALING_TOLERANCE:.0%}) not ranked.")


def rate_text(rate: Optional[float], lower_bound: Optional[bool], digits: int = 3) -> str:
    """A sustained rate (requests/s) as printed: ``-`` for None, ``>= 64`` when it is the
    ladder's top rung (a lower bound), else ``8``.

    Raises:
        Nothing: string formatting.
    """
    if rate is None:
        return "-"
    return f"{'>= ' if lower_bound else ''}{rate:.{digits}g}"


def _kv_per_device(row: Row) -> float:
    return float(row["num_blocks"]) * float(row["block_size"]) / scaling_factor(int(row["tensor_parallel"]))


def is_superlinear(row: Row, fewer: Sequence[Row], slo: str) -> bool:
    """Whether ``row``'s rate for ``slo`` is superlinear against ``fewer`` (rows of its
    chain; those with fewer devices in smaller groups count: the rule is in the module
    docstring).

    Raises:
        KeyError: a row without ``devices``, ``tensor_parallel``, ``num_blocks``,
            ``block_size`` or the SLO's columns.
    """
    if row.get(f"{slo}_state") != "ok":
        return False
    per_device = row[f"{slo}_rate"] / row["devices"]
    for q in fewer:
        if q.get(f"{slo}_state") != "ok" or q.get(f"{slo}_rate_is_lower_bound") or q["devices"] >= row["devices"] \
                or q["tensor_parallel"] >= row["tensor_parallel"]:
            continue
        kv_gain = max(1.0, _kv_per_device(row) / _kv_per_device(q))
        allowed = q[f"{slo}_rate"] / q["devices"] * kv_gain * (1.0 + SCALING_TOLERANCE)
        if per_device > allowed:
            return True
    return False


def flag_chain_point(row: Row, fewer: Sequence[Row], slo: str, top: float) -> None:
    """Set ``row``'s ``<slo>_rate_is_lower_bound`` (its rate is the ladder's ``top``
    rung) and ``<slo>_superlinear`` (:func:`is_superlinear` against ``fewer``); both None
    when the row has no rate (not simulated, or infeasible).

    Raises:
        KeyError: as :func:`is_superlinear`.
    """
    rate = row.get(f"{slo}_rate")
    if rate is None:
        row[f"{slo}_rate_is_lower_bound"] = row[f"{slo}_superlinear"] = None
        return
    row[f"{slo}_rate_is_lower_bound"] = row[f"{slo}_state"] == "ok" and rate >= top
    row[f"{slo}_superlinear"] = is_superlinear(row, fewer, slo)
