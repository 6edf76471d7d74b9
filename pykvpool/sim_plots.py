"""Figures of simulation results. Each function computes its data, draws it with
matplotlib (Agg, nothing shown) when ``path`` is given, and returns the data, so tests and
reports can use the numbers without the picture.

- :func:`utilization_over_time`: pool utilization, blocks used and concurrency per step;
- :func:`latency_cdf`: the CDF of a latency column for several runs;
- :func:`policy_comparison`: summary metrics side by side for several runs;
- :func:`throughput_vs_rate`: throughput and tail latency against arrival rate (a sweep).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from pykvpool.simulate import SimulationResult

__all__ = ["latency_cdf", "policy_comparison", "throughput_vs_rate", "utilization_over_time"]

PathLike = Union[str, "os.PathLike[str]"]


def _figure(ncols: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(6 * ncols, 4), squeeze=False)


def _save(fig: Any, path: PathLike) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def utilization_over_time(result: SimulationResult, path: Optional[PathLike] = None) -> dict[str, np.ndarray]:
    """Per-step series: ``time`` (s), ``utilization`` (tokens held / slots of held and
    reserved blocks), ``blocks_used``, ``running`` and ``waiting`` (requests).

    Raises:
        KeyError: ``result`` has no such step column.
        OSError: ``path`` cannot be written.
    """
    s = result.steps
    data = {k: np.asarray(s[k]) for k in ("time", "utilization", "blocks_used", "running", "waiting")}
    if path is not None:
        fig, ax = _figure(2)
        a, b = ax[0]
        a.plot(data["time"], data["utilization"], lw=0.8)
        a.set(xlabel="time (s)", ylabel="KV utilization", ylim=(0, 1.02), title="Utilization over time")
        b.plot(data["time"], data["running"], lw=0.8, label="running")
        b.plot(data["time"], data["waiting"], lw=0.8, label="waiting")
        b.set(xlabel="time (s)", ylabel="requests", title="Concurrency over time")
        b.legend()
        _save(fig, path)
    return data


def latency_cdf(
    results: Mapping[str, SimulationResult], metric: str = "ttft", path: Optional[PathLike] = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{name: (sorted values in s, cumulative fraction)}`` of ``metric`` (ttft, tpot,
    e2e, queueing) over finished requests of each run.

    Raises:
        KeyError: ``metric`` is not a request column.
        OSError: ``path`` cannot be written.
    """
    data = {}
    for name, r in results.items():
        v = np.sort(np.asarray(r.requests[metric], dtype=np.float64)[r.requests["outcome"] == 0])
        v = v[~np.isnan(v)]
        data[name] = (v, np.arange(1, v.size + 1) / max(v.size, 1))
    if path is not None:
        fig, ax = _figure()
        for name, (x, y) in data.items():
            ax[0][0].step(x, y, where="post", label=name)
        ax[0][0].set(xlabel=f"{metric} (s)", ylabel="fraction of requests", title=f"{metric} CDF")
        ax[0][0].legend()
        _save(fig, path)
    return data


def policy_comparison(
    results: Mapping[str, SimulationResult],
    metrics: Sequence[str] = ("output_throughput", "ttft_p99", "tpot_p99", "mean_utilization", "preemptions"),
    path: Optional[PathLike] = None,
) -> dict[str, dict[str, float]]:
    """``{run name: {metric: value}}`` from each run's summary, drawn as one bar panel per
    metric.

    Raises:
        KeyError: a metric is not in a run's summary.
        OSError: ``path`` cannot be written.
    """
    data = {name: {m: float(r.summary[m]) for m in metrics} for name, r in results.items()}
    if path is not None:
        fig, ax = _figure(len(metrics))
        names = list(data)
        for a, m in zip(ax[0], metrics):
            a.bar(names, [data[n][m] for n in names])
            a.set(title=m)
            a.tick_params(axis="x", rotation=30)
        _save(fig, path)
    return data


def throughput_vs_rate(rows: Sequence[Mapping[str, Any]], path: Optional[PathLike] = None) -> dict[str, dict[str, np.ndarray]]:
    """From sweep rows (``rate``, ``label``, summary keys): per label, arrays ``rate``,
    ``output_throughput`` (tokens/s), ``request_throughput`` and ``ttft_p99`` sorted by rate.

    Raises:
        KeyError: a row lacks one of those keys.
        OSError: ``path`` cannot be written.
    """
    data: dict[str, dict[str, np.ndarray]] = {}
    for label in sorted({str(r["label"]) for r in rows}):
        sel = sorted((r for r in rows if r["label"] == label), key=lambda r: float(r["rate"]))
        data[label] = {
            k: np.array([float(r[k]) for r in sel]) for k in ("rate", "output_throughput", "request_throughput", "ttft_p99")
        }
    if path is not None:
        fig, ax = _figure(2)
        a, b = ax[0]
        for label, d in data.items():
            a.plot(d["rate"], d["output_throughput"], marker="o", label=label)
            b.plot(d["rate"], d["ttft_p99"], marker="o", label=label)
        a.set(xlabel="arrival rate (req/s)", ylabel="output tokens/s", title="Throughput vs arrival rate")
        b.set(xlabel="arrival rate (req/s)", ylabel="p99 TTFT (s)", yscale="log", title="Tail TTFT vs arrival rate")
        a.legend()
        _save(fig, path)
    return data
