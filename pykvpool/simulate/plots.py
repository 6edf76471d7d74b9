"""Figures of simulation results. Each function computes its data, draws it when ``path``
is given, and returns the data, so tests and reports can use the numbers without the
picture; the ``plot_*`` functions build the :class:`matplotlib.figure.Figure` from that
data (tests inspect it). Figures render on their own Agg canvas: nothing here selects a
global backend or uses ``pyplot``.

- :func:`utilization_over_time`: pool occupancy (blocks held, reserved, tokens stored,
  preemptions) and concurrency per step;
- :func:`latency_cdf`: the CDF of a latency column for several runs (log time axis);
- :func:`policy_comparison`: summary metrics side by side for several runs;
- :func:`throughput_vs_rate`: throughput and tail latency against arrival rate (a sweep).

Runs are drawn with distinct line styles and markers (:func:`line_style`), hollow above
the first, so a run whose curve coincides with another's stays visible on top of it.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from pykvpool.plotting import save, subplots
from pykvpool.simulate.engine import SimulationResult

__all__ = [
    "latency_cdf",
    "line_style",
    "plot_latency_cdf",
    "plot_throughput_vs_rate",
    "plot_utilization",
    "policy_comparison",
    "throughput_vs_rate",
    "utilization_over_time",
]

PathLike = Union[str, "os.PathLike[str]"]

#: Styles of the simulator's allocations; later entries draw on top of earlier ones.
_STYLES: dict[str, dict[str, Any]] = {
    "paged": {"color": "#1f4e79", "linestyle": "-", "marker": "o", "lw": 2.4, "ms": 6, "zorder": 3},
    "reserve": {"color": "#c1440e", "linestyle": "-.", "marker": "^", "lw": 1.6, "ms": 7, "mfc": "none",
                "mew": 1.6, "zorder": 4},
    "oracle": {"color": "#2e7d32", "linestyle": "--", "marker": "s", "lw": 1.4, "ms": 9,
               "mfc": "none", "mew": 1.6, "zorder": 5},
}
_FALLBACK = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 1)), "P"))
_COLORS = ("#1f4e79", "#c1440e", "#2e7d32", "#7b1fa2", "#00838f", "#6d4c41")


def line_style(label: str, index: int = 0) -> dict[str, Any]:
    """Matplotlib line keywords for run ``label``: the allocation's own style (``paged``,
    ``reserve``, ``oracle``, matched on the label's first word) or, for any other label,
    the ``index``-th of a cycle of distinct line styles, markers and colors. Every style
    but the lowest (``paged``, index 0) has hollow markers, drawn above the ones before:
    a point another run shares stays visible."""
    key = label.split()[0] if label.split() else label
    if key in _STYLES:
        return dict(_STYLES[key])
    ls, marker = _FALLBACK[index % len(_FALLBACK)]
    hollow = {"mfc": "none", "mew": 1.4} if index else {}
    return {"color": _COLORS[index % len(_COLORS)], "linestyle": ls, "marker": marker,
            "lw": 1.6, "ms": 6 if index else 5, "zorder": 3 + index, **hollow}


def _figure(ncols: int = 1, height: float = 4.0) -> tuple[Any, list[Any]]:
    return subplots(ncols, (6 * ncols, height))


def _number(value: Any) -> float:
    """A summary statistic as a float; a statistic over no request (None) is NaN, which
    matplotlib leaves out of the drawing."""
    return float("nan") if value is None else float(value)


def utilization_over_time(
    result: SimulationResult,
    path: Optional[PathLike] = None,
    *,
    num_blocks: Optional[int] = None,
    block_size: Optional[int] = None,
    title: str = "",
) -> dict[str, np.ndarray]:
    """Per-step series: ``time`` (s), ``utilization`` (the simulator's: tokens held / slots
    of held and reserved blocks), ``blocks_used``, ``blocks_reserved``, ``running`` and
    ``waiting`` (requests), ``preemptions`` (requests preempted in the step),
    ``token_blocks`` (the stored tokens in blocks' worth: utilization x blocks held, so
    its gap to the blocks held is the slots held but empty); with ``num_blocks``,
    ``occupancy`` (blocks used or reserved / ``num_blocks``); with ``block_size``,
    ``token_utilization`` (stored tokens / slots of the used blocks, 1.0 for an empty
    pool). The figure (:func:`plot_utilization`) draws the pool's occupancy in blocks
    beside the concurrency.

    Raises:
        KeyError: ``result`` has no such step column.
        OSError: ``path`` cannot be written.
    """
    s = result.steps
    keys = ("time", "utilization", "blocks_used", "blocks_reserved", "running", "waiting", "preemptions")
    data = {k: np.asarray(s[k]) for k in keys}
    held = data["blocks_used"].astype(np.float64) + data["blocks_reserved"].astype(np.float64)
    data["token_blocks"] = data["utilization"].astype(np.float64) * held
    if num_blocks is not None:
        data["occupancy"] = held / float(num_blocks)
    if block_size is not None:
        slots = data["blocks_used"].astype(np.float64) * block_size
        tokens = np.asarray(s["kv_tokens"], dtype=np.float64)
        data["token_utilization"] = np.divide(tokens, slots, out=np.ones_like(slots), where=slots > 0)
    if path is not None:
        save(plot_utilization(data, num_blocks=num_blocks, title=title), path)
    return data


def _pool_panel(a: Any, data: Mapping[str, np.ndarray], num_blocks: Optional[int]) -> None:
    """Blocks holding KV and blocks reserved (stacked areas), the stored tokens in blocks'
    worth (a line: the gap above it is empty slots), the pool's size, and the steps that
    preempted a request (ticks along the top)."""
    t = data["time"]
    used = data["blocks_used"].astype(np.float64)
    reserved = data["blocks_reserved"].astype(np.float64)
    peak = int(np.max(used + reserved, initial=0))
    a.fill_between(t, 0, used, color="#9ec3e6", lw=0,
                   label=f"blocks holding KV (peak {int(used.max(initial=0)):,})")
    if reserved.max(initial=0) > 0:
        a.fill_between(t, used, used + reserved, color="#f2b48f", lw=0,
                       label=f"blocks reserved, not yet written (peak held in all {peak:,})")
    a.plot(t, data["token_blocks"], lw=0.8, color="#1f4e79",
           label="tokens stored, in blocks' worth (gap above: empty slots)")
    top = max(peak, num_blocks or 0, 1)
    if num_blocks:
        a.axhline(num_blocks, color="#b71c1c", ls="--", lw=1.2,
                  label=f"pool: {num_blocks:,} blocks (peak held {peak / num_blocks:.1%})")
        a.secondary_yaxis("right", functions=(lambda b: b / num_blocks, lambda f: f * num_blocks)
                          ).set_ylabel("fraction of the pool")
    pre = data["preemptions"] > 0
    count = int(data["preemptions"].sum())
    a.plot(t[pre], np.full(int(pre.sum()), top * 1.06), "|", ms=7, color="#b71c1c",
           label=f"step that preempted ({count:,} preemptions in all)" if count else "no request preempted")
    a.set(xlabel="time (s)", ylabel="KV blocks", ylim=(0, top * 1.1))
    a.grid(alpha=0.25)


def plot_utilization(data: Mapping[str, np.ndarray], *, num_blocks: Optional[int] = None,
                     title: str = "") -> Any:
    """The figure of :func:`utilization_over_time`'s data: left, the pool's occupancy in
    blocks (held, reserved, the stored tokens in blocks' worth, the pool's size and a
    fraction-of-the-pool axis when ``num_blocks`` is given, ticks at the steps that
    preempted); right, running and waiting requests. Legends sit under the panels.

    Raises:
        KeyError: ``data`` lacks ``time``, ``blocks_used``, ``blocks_reserved``,
            ``token_blocks``, ``preemptions``, ``running`` or ``waiting``.
        ValueError: series of different lengths (matplotlib).
    """
    fig, (a, b) = _figure(2, 5.0)
    _pool_panel(a, data, num_blocks)
    a.set_title(title or "KV pool over time")
    b.plot(data["time"], data["running"], lw=0.8, color="#1f4e79", label="running")
    b.plot(data["time"], data["waiting"], lw=0.8, color="#c1440e", label="waiting")
    b.set(xlabel="time (s)", ylabel="requests", title="Concurrency over time")
    b.grid(alpha=0.25)
    for ax in (a, b):
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    return fig


def latency_cdf(
    results: Mapping[str, SimulationResult],
    metric: str = "ttft",
    path: Optional[PathLike] = None,
    *,
    title: str = "",
    log_x: bool = True,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{name: (sorted values in s, cumulative fraction)}`` of ``metric`` (ttft, tpot,
    e2e, queueing) over finished requests of each run. The figure's time axis is
    logarithmic unless ``log_x`` is False (values <= 0 are then left out of the drawing,
    not of the data); ``title`` should name the arrival rate.

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
        save(plot_latency_cdf(data, metric, title=title, log_x=log_x), path)
    return data


def plot_latency_cdf(data: Mapping[str, tuple[np.ndarray, np.ndarray]], metric: str = "ttft", *,
                     title: str = "", log_x: bool = True) -> Any:
    """The figure of :func:`latency_cdf`'s data.

    Raises:
        IndexError: a run's values and fractions differ in length.
    """
    fig, (ax,) = _figure(1, 4.4)
    for i, (name, (x, y)) in enumerate(data.items()):
        st = line_style(name, i)
        keep = x > 0 if log_x else np.ones(x.shape, dtype=bool)
        every = max(1, int(keep.sum()) // 12)
        ax.step(x[keep], y[keep], where="post", label=name, markevery=every, **st)
    if log_x:
        ax.set_xscale("log")
    ax.set(xlabel=f"{metric} (s{', log scale' if log_x else ''})", ylabel="fraction of requests",
           ylim=(0, 1.02), title=title or f"{metric} CDF")
    ax.grid(alpha=0.25, which="both")
    ax.legend(fontsize=8, loc="lower right")
    return fig


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
    data = {name: {m: _number(r.summary[m]) for m in metrics} for name, r in results.items()}
    if path is not None:
        fig, ax = _figure(len(metrics))
        names = list(data)
        for a, m in zip(ax, metrics):
            a.bar(names, [data[n][m] for n in names])
            a.set(title=m)
            a.tick_params(axis="x", rotation=30)
        save(fig, path)
    return data


def throughput_vs_rate(rows: Sequence[Mapping[str, Any]], path: Optional[PathLike] = None) -> dict[str, dict[str, np.ndarray]]:
    """From sweep rows (``rate``, ``label``, summary keys): per label, arrays ``rate``,
    ``output_throughput`` (tokens/s), ``request_throughput`` and ``ttft_p99`` sorted by rate.
    Labels keep their first-seen order.

    Raises:
        KeyError: a row lacks one of those keys.
        OSError: ``path`` cannot be written.
    """
    data: dict[str, dict[str, np.ndarray]] = {}
    for label in dict.fromkeys(str(r["label"]) for r in rows):
        sel = sorted((r for r in rows if r["label"] == label), key=lambda r: float(r["rate"]))
        data[label] = {
            k: np.array([_number(r[k]) for r in sel]) for k in ("rate", "output_throughput", "request_throughput", "ttft_p99")
        }
    if path is not None:
        save(plot_throughput_vs_rate(data), path)
    return data


def plot_throughput_vs_rate(data: Mapping[str, Mapping[str, np.ndarray]]) -> Any:
    """The figure of :func:`throughput_vs_rate`'s data.

    Raises:
        KeyError: a label lacks ``rate``, ``output_throughput`` or ``ttft_p99``.
        ValueError: a label's arrays differ in length (matplotlib).
    """
    fig, (a, b) = _figure(2)
    for i, (label, d) in enumerate(data.items()):
        st = line_style(label, i)
        a.plot(d["rate"], d["output_throughput"], label=label, **st)
        b.plot(d["rate"], d["ttft_p99"], label=label, **st)
    a.set(xlabel="arrival rate (req/s)", ylabel="output tokens/s", title="Throughput vs arrival rate")
    b.set(xlabel="arrival rate (req/s)", ylabel="p99 TTFT (s)", yscale="log", title="Tail TTFT vs arrival rate")
    for ax in (a, b):
        ax.grid(alpha=0.25, which="both")
    a.legend(fontsize=8)
    return fig
