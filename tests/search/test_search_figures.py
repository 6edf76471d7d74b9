"""The search CLI's figures (``frontier.png``, ``frontier_latency.png``,
``sustained_rate.png``) hide nothing (:func:`pykvpool.plotting.collisions`): no point on
another point, no line or point under a label, on small searches whose configurations
share device counts and rates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pykvpool.cli import main
from pykvpool.plotting import collisions
from pykvpool.search.figures import DPI, frontier_figure, latency_figure, rates_figure
from pykvpool.search.folder import read_search

BASE = ["search", "--trace", "azure-conv", "--limit", "200", "--inline", "--quiet"]
SEARCHES = {
    # two SLOs, many configurations tied at one device count and one rate
    "tied": ["--rates", "0.5,64,8", "--ttft-p99", "2", "--slo", "loose:ttft_p99=30", "--devices", "1,2,4",
             "--max-running", "4,16,128", "--kv-dtypes", "bf16,fp8"],
    # one device count: every configuration in one column, two GPUs, two SLOs
    "one device count": ["--rates", "1,32,6", "--slo", "chat:ttft_p99=1,tpot_p99=0.05",
                         "--slo", "batch:ttft_p99=20", "--hardware", "a100-80gb-sxm,h100-sxm",
                         "--devices", "1", "--max-batched-tokens", "2048,8192"],
}


@pytest.fixture(scope="module", params=list(SEARCHES))
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("search")
    assert main([*BASE, *SEARCHES[request.param], "--out", str(out)]) == 0
    for name in ("frontier.png", "frontier_latency.png", "sustained_rate.png"):
        assert (out / name).stat().st_size > 0
    return read_search(out)


def test_the_frontier_figure_hides_nothing(folder: Any) -> None:
    fig = frontier_figure(folder.rows, [s.name for s in folder.slos], folder.cost_unit)
    assert fig.dpi == DPI  # laid out at the resolution it is written at
    assert collisions(fig) == []


def test_the_rates_figure_hides_nothing(folder: Any) -> None:
    assert collisions(rates_figure(folder.rows, [s.name for s in folder.slos])) == []


def test_the_latency_figure_hides_nothing(folder: Any) -> None:
    rates = (folder.latency or {}).get("reference_rates", {})
    fig = latency_figure(folder.rows, folder.entries, folder.slos, rates, folder.requests, folder.cost_unit)
    assert fig.dpi == DPI
    assert collisions(fig) == []
