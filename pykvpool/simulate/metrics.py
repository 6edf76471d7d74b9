"""The units of a simulator run's summary (:attr:`SimulationResult.summary`), in one table,
and the summary as grouped text lines with a unit on every value (what ``pykvpool
simulate`` prints).

The summary itself keeps its keys and SI values (seconds, tokens, blocks, fractions: the
keys of ``summary.csv``); only the text shows TPOT in milliseconds and fractions in percent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from pykvpool.checks import invalid

__all__ = ["LATENCY_STATS", "METRIC_GROUPS", "Metric", "metric", "summary_lines"]

GIB = 2**30


@dataclass(frozen=True)
class Metric:
    """How one summary value reads: its group, the unit it is printed in, the factor from
    the summary's value to the printed one, and the digits after the point (0: an integer
    count with thousands separators)."""

    group: str
    unit: str
    scale: float = 1.0
    digits: int = 0

    def text(self, value: object) -> str:
        """``value`` (the summary's) in this metric's unit, without the unit; None is ``-``.

        Raises:
            Nothing.
        """
        if value is None:
            return "-"
        if isinstance(value, str):
            return value
        v = float(value) * self.scale  # type: ignore[arg-type]
        return f"{v:,.{self.digits}f}"


#: The summary's groups, in print order.
METRIC_GROUPS = ("requests", "latency", "throughput", "tokens", "memory", "preemption", "transfer")
#: The statistics of each latency (``ttft_p99``...), in print order.
LATENCY_STATS = ("mean", "p50", "p90", "p99", "max")
_LATENCIES = {"ttft": Metric("latency", "s", 1.0, 3), "tpot": Metric("latency", "ms", 1e3, 1),
              "e2e": Metric("latency", "s", 1.0, 3), "queueing": Metric("latency", "s", 1.0, 3),
              "kv_transfer": Metric("latency", "s", 1.0, 3), "decode_wait": Metric("latency", "s", 1.0, 3)}
#: Rows of the latency table printed only when they have a value (disaggregated runs).
_OPTIONAL_LATENCIES = ("kv_transfer", "decode_wait")

_METRICS: dict[str, Metric] = {
    "num_requests": Metric("requests", "requests"),
    "finished": Metric("requests", "requests"),
    "rejected": Metric("requests", "requests (never fit the pool or reservation)"),
    "stopped": Metric("requests", "(the early stop's target; - : ran to the end)"),
    "makespan": Metric("throughput", "s (first arrival to last finish)", 1.0, 2),
    "output_throughput": Metric("throughput", "tokens/s (output)", 1.0, 1),
    "total_throughput": Metric("throughput", "tokens/s (prompt + output)", 1.0, 1),
    "request_throughput": Metric("throughput", "req/s", 1.0, 3),
    "prompt_tokens": Metric("tokens", "tokens"),
    "output_tokens": Metric("tokens", "tokens"),
    "cached_tokens": Metric("tokens", "tokens (prompt tokens found in the prefix cache)"),
    "recomputed_tokens": Metric("tokens", "tokens (computed again after a preemption)"),
    "prefix_hit_rate": Metric("tokens", "% of looked-up prompt tokens", 100.0, 1),
    "peak_running": Metric("memory", "requests holding KV at once"),
    "peak_blocks_used": Metric("memory", "blocks"),
    "mean_utilization": Metric("memory", "% of held slots storing a token", 100.0, 1),
    "leaked_blocks": Metric("memory", "blocks (0 unless the pool has a bug)"),
    "preemptions": Metric("preemption", "preemptions"),
    "swaps": Metric("preemption", "swap-outs to the host pool"),
    "steps": Metric("preemption", "engine steps"),
    "kv_transfers": Metric("transfer", "KV transfers from prefill to decode instances"),
    "kv_transfer_bytes": Metric("transfer", "GB moved", 1e-9, 3),
}
_GROUP_PEAK = re.compile(r"peak_blocks_used_g\d+")
_LATENCY = re.compile(r"(ttft|tpot|e2e|queueing|kv_transfer|decode_wait)_(mean|p50|p90|p99|max)")


def metric(key: str) -> Metric:
    """The :class:`Metric` of a summary key (``ttft_p99``, ``peak_blocks_used_g3``...).

    Raises:
        InvalidArgumentError: ``key`` is no summary key the table knows.
    """
    if key in _METRICS:
        return _METRICS[key]
    if _GROUP_PEAK.fullmatch(key):
        return Metric("memory", "blocks of this layer group")
    m = _LATENCY.fullmatch(key)
    if m:
        return _LATENCIES[m.group(1)]
    raise invalid(f"key: no unit known for the summary key {key!r}")


def _latency_lines(summary: Mapping[str, Any]) -> list[str]:
    head = "latency (finished requests)"
    lines = [f"{head:<31}" + "".join(f"{s:>10}" for s in LATENCY_STATS)]
    for name, m in _LATENCIES.items():
        if name in _OPTIONAL_LATENCIES and all(summary.get(f"{name}_{s}") is None for s in LATENCY_STATS):
            continue
        label = f"{name} ({m.unit})"
        lines.append(f"  {label:<29}" + "".join(f"{m.text(summary.get(f'{name}_{s}')):>10}"
                                               for s in LATENCY_STATS))
    return lines


def summary_lines(summary: Mapping[str, Any], block_bytes: Optional[int] = None) -> list[str]:
    """The summary as text, one group after the other (:data:`METRIC_GROUPS`): the
    latencies as a table (rows ``ttft``, ``tpot``, ``e2e``, ``queueing`` with their unit,
    and in a disaggregated run ``kv_transfer`` and ``decode_wait``; columns
    :data:`LATENCY_STATS`), every other value as ``key  value  unit`` (the transfer
    group only when KV moved). With
    ``block_bytes`` (bytes of one block) the block peaks also read in GiB. A key the table does
    not know is printed last, as it is.

    Raises:
        Nothing.
    """
    groups: dict[str, list[str]] = {g: [] for g in METRIC_GROUPS}
    other = []
    for key, value in summary.items():
        if _LATENCY.fullmatch(key):
            continue
        try:
            m = metric(key)
        except ValueError:
            other.append(f"  {key:<22} {value}")
            continue
        if m.group == "transfer" and not summary.get("kv_transfers"):
            continue
        text, unit = m.text(value), m.unit
        if block_bytes and key.startswith("peak_blocks_used") and value is not None:
            unit += f" = {float(value) * block_bytes / GIB:,.2f} GiB"
        groups[m.group].append(f"  {key:<22} {text:>12} {unit}")
    out: list[str] = []
    for g in METRIC_GROUPS:
        if g == "latency":
            out += _latency_lines(summary)
        elif groups[g]:
            out += [g, *groups[g]]
    return out + (["other", *other] if other else [])
