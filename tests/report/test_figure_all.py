"""Every figure of the report, as built, hides nothing (:func:`pykvpool.plotting.collisions`:
no label over a label, no marker over a marker, no line or marker under a label): figures
1 to 10 through what their sections record just before saving, figures 11 to 13 (the
report's own small search) drawn again from the search folder by the functions that drew
them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pykvpool.plotting import collisions
from pykvpool.report.build import ReportResult, build_report
from pykvpool.report.search_section import FIGURES
from pykvpool.search.figures import frontier_figure, latency_figure, rates_figure
from pykvpool.search.folder import read_search


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    return build_report(tmp_path_factory.mktemp("report"), measure=False, progress=False)


def _search_figure(out: Path, name: str) -> Any:
    """Figure ``name`` of :data:`FIGURES` drawn from the report's search folder."""
    folder = read_search(out / "search")
    names = [s.name for s in folder.slos]
    if name == FIGURES[0]:
        return frontier_figure(folder.rows, names, folder.cost_unit)
    if name == FIGURES[2]:
        return rates_figure(folder.rows, names)
    rates = (folder.latency or {}).get("reference_rates", {})
    return latency_figure(folder.rows, folder.entries, folder.slos, rates, folder.requests, folder.cost_unit)


def _recorded(data: dict[str, Any]) -> dict[str, list[Any]]:
    """What each figure of figures 1 to 10 hides, as its section recorded it."""
    found = {name: data[f"fig{name[3]}"]["collisions"] for name in
             ("fig1_memory_ledger", "fig2_roofline", "fig3_paging", "fig4_video", "fig5_block_size_traces")}
    for section in ("dynamic", "windows", "video_serving"):
        found.update(data[section]["collisions"])
    return found


def test_every_report_figure_is_checked(report: ReportResult) -> None:
    assert set(_recorded(report.data)) | set(FIGURES) == set(report.figures)


def test_figures_1_to_10_hide_nothing(report: ReportResult) -> None:
    hidden = {name: found for name, found in _recorded(report.data).items() if found}
    assert hidden == {}


@pytest.mark.parametrize("name", FIGURES)
def test_the_search_figures_hide_nothing(report: ReportResult, name: str) -> None:
    assert collisions(_search_figure(report.out_dir, name)) == []


def test_figure_10_memory_is_the_simulators_and_the_reported_fps_is_quoted(report: ReportResult) -> None:
    """Figure 10's right panel: the pages one LongLive stream holds in the simulator's pool
    during each chunk; the text quotes the frame rate LongLive's authors report."""
    from pykvpool.planning.hardware import HARDWARE
    from pykvpool.planning.ledger import GIB
    from pykvpool.planning.video import VIDEO_MODELS
    from pykvpool.report.video_serving import BLOCK_SIZE, LONG_VIDEO
    from pykvpool.simulate.video import VideoRoofline, simulate_video, video_requests
    from pykvpool.simulate.video_plots import REPORTED_FPS

    mem = report.data["video_serving"]["memory"]
    for windowed, key in ((False, "full"), (True, "windowed")):
        m = VIDEO_MODELS["longlive"].variant(windowed)
        res = simulate_video(video_requests(1, float(LONG_VIDEO)), VideoRoofline(m, HARDWARE["h100-sxm"]),
                             m.peak_blocks(LONG_VIDEO, BLOCK_SIZE), BLOCK_SIZE)
        assert mem[key] == [b * res.bytes_per_block / GIB for _, b in res.streams[0].memory[:-1]]
    md = report.markdown.read_text()
    assert f"LongLive's README reports {REPORTED_FPS['longlive'].fps:g} fps on an H100" in md
