"""The simulator's figures (the CLI's ``utilization.png``, ``ttft_cdf.png``,
``throughput_vs_rate.png``; the report's figures 6 to 8) show the pool's occupancy and hide
nothing (:func:`pykvpool.plotting.collisions`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pykvpool import simulate as sim
from pykvpool.plotting import collisions
from pykvpool.simulate import plots as sim_plots


def _run(allocation: str, num_blocks: int, **kw: Any) -> sim.SimulationResult:
    w = sim.synthetic_workload(300, rate=40.0, prompt=("uniform", [100, 900]),
                               output=("uniform", [20, 200]), seed=4)
    cfg = sim.SchedulerConfig(allocation=allocation, max_running=64, **kw)
    return sim.run(w, sim.SimConfig(num_blocks=num_blocks, scheduler=cfg),
                   sim.roofline("llama-3-8b", "a100-80gb-sxm"))


def _hidden(fig: Any) -> list[Any]:
    """What ``fig`` hides once laid out as :func:`pykvpool.plotting.save` lays it out."""
    fig.set_dpi(120)
    fig.tight_layout()
    return collisions(fig)


def _labels(fig: Any) -> list[str]:
    return fig.axes[0].get_legend_handles_labels()[1]


def test_occupancy_without_the_pool_size_shows_blocks_held() -> None:
    r = _run("reserve", 3000, reserve_tokens=1200)
    d = sim_plots.utilization_over_time(r)
    held = r.steps["blocks_used"] + r.steps["blocks_reserved"]
    np.testing.assert_allclose(d["token_blocks"], r.steps["kv_tokens"] / 16.0, rtol=1e-9, atol=1e-9)
    assert (d["token_blocks"] <= held + 1e-9).all()
    fig = sim_plots.plot_utilization(d)
    labels = _labels(fig)
    assert labels[0] == f"blocks holding KV (peak {int(r.steps['blocks_used'].max()):,})"
    assert labels[1] == f"blocks reserved, not yet written (peak held in all {int(held.max()):,})"
    assert labels[2].startswith("tokens stored, in blocks' worth")
    assert fig.axes[0].get_ylabel() == "KV blocks" and fig.axes[0].get_ylim()[1] >= held.max()
    assert _hidden(fig) == []


def test_occupancy_against_the_pool_with_preemptions_marked() -> None:
    r = _run("paged", 1500)
    assert r.summary["preemptions"] > 0
    d = sim_plots.utilization_over_time(r, num_blocks=1500, block_size=16)
    fig = sim_plots.plot_utilization(d, num_blocks=1500)
    ax = fig.axes[0]
    held = r.steps["blocks_used"] + r.steps["blocks_reserved"]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    pool = lines[f"pool: 1,500 blocks (peak held {held.max() / 1500:.1%})"]
    assert list(pool.get_ydata()) == [1500, 1500]
    ticks = lines[f"step that preempted ({r.summary['preemptions']:,} preemptions in all)"]
    np.testing.assert_array_equal(ticks.get_xdata(), r.steps["time"][r.steps["preemptions"] > 0])
    assert "blocks reserved" not in " ".join(_labels(fig))  # paged reserves nothing
    assert any(c.get_ylabel() == "fraction of the pool" for c in ax.child_axes)
    assert _hidden(fig) == []


def test_the_cli_utilization_figure_shows_occupancy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pykvpool.cli import main

    drawn: list[Any] = []
    plot = sim_plots.plot_utilization

    def keep(*args: Any, **kw: Any) -> Any:
        drawn.append(plot(*args, **kw))
        return drawn[-1]

    monkeypatch.setattr(sim_plots, "plot_utilization", keep)
    assert main(["simulate", "--requests", "200", "--rate", "50", "--num-blocks", "2000",
                 "--out", str(tmp_path), "--quiet"]) == 0
    assert (tmp_path / "utilization.png").stat().st_size > 0
    labels = _labels(drawn[0])
    assert labels[0].startswith("blocks holding KV (peak ")
    assert "utilization: tokens / slots of held blocks" not in labels
    assert _hidden(drawn[0]) == []


def test_throughput_and_ttft_figures_hide_nothing() -> None:
    runs = {"paged": _run("paged", 3000), "reserve": _run("reserve", 3000, reserve_tokens=1200),
            "oracle": _run("oracle", 3000)}
    rows = [{"rate": rate, "label": k, **r.summary} for rate in (1.0, 2.0) for k, r in runs.items()]
    assert _hidden(sim_plots.plot_throughput_vs_rate(sim_plots.throughput_vs_rate(rows))) == []
    cdf = sim_plots.latency_cdf(runs, "ttft", title="TTFT CDF at 40 req/s")
    assert _hidden(sim_plots.plot_latency_cdf(cdf, "ttft", title="TTFT CDF at 40 req/s")) == []
