"""The report's deployment-search section: rendered from a search folder (with and without
its reference-rate runs), in the whole report with ``--search DIR``, and every folder that
is not a finished search refused with exit 2 and one ``pykvpool: error:`` line before
the report does any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pykvpool import InvalidArgumentError
from pykvpool.report.search_section import FIGURES, search_section
from pykvpool.search.folder import read_search
from pykvpool.search.latency import candidates, latency_frontier
from pykvpool.search.output import frontier
from figcheck import assert_png

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ["search", "--trace", "azure-conv", "--limit", "200", "--rates", "0.5,64,8", "--inline", "--quiet",
          "--ttft-p99", "2", "--slo", "loose:ttft_p99=30", "--devices", "1,2", "--max-running", "4,128"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYKVPOOL_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True,
                          check=False, timeout=300, env=env)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("searches")
    out = {"full": base / "full", "bare": base / "bare"}
    for name, extra in (("full", []), ("bare", ["--no-latency", "--no-figures"])):
        r = run(*SEARCH, *extra, "--out", str(out[name]))
        assert r.returncode == 0, r.stderr
    return out


def test_the_search_cli_writes_the_latency_files(folders: dict[str, Path]) -> None:
    full, bare = folders["full"], folders["bare"]
    for name in ("frontier_latency.csv", "frontier_latency.png", "latency.json", "latency.jsonl"):
        assert (full / name).stat().st_size > 0, name
        assert not (bare / name).exists(), name
    assert_png(full / "frontier_latency.png")
    doc = json.loads((full / "latency.json").read_text())
    best = json.loads((full / "best.json").read_text())["best"]
    assert doc["source"] == "best point"
    assert doc["reference_rates"] == {s: best[s][f"{s}_rate"] for s in ("slo", "loose")}


def test_the_section_from_a_search_folder(folders: dict[str, Path], tmp_path: Path) -> None:
    folder = read_search(folders["full"])
    md, data, figs = search_section(tmp_path, folder, progress=False)
    assert md.startswith("## 9. Deployment search") and "--search" in md
    assert sorted(figs) == sorted(FIGURES)
    for name, path in figs.items():
        assert f"]({name}.png)" in md
        assert_png(path)
    best = json.loads((folders["full"] / "best.json").read_text())["best"]
    assert data["best"] == best and data["reference_rates"] == folder.latency["reference_rates"]  # type: ignore[index]
    for s in ("slo", "loose"):
        key = best[s]["key"].replace("|", "\\|")
        assert f"| {s} | " in md and f"`{key}`" in md
        assert data["frontier"][s] == [r["key"] for r in frontier(folder.rows, s)]
        cands = candidates(folder.rows, folder.entries, next(x for x in folder.slos if x.name == s), "reference",
                           folder.latency["reference_rates"][s], folder.requests)  # type: ignore[index]
        rate = f"{folder.latency['reference_rates'][s]:.3g}"  # type: ignore[index]
        for metric, label in (("ttft_p99", "TTFT"), ("tpot_p99", "TPOT")):
            rows = [line for line in md.splitlines() if line.startswith(f"| {s} | {rate} | {label} |")]
            assert len(rows) == len(latency_frontier(cands, metric)) >= 1
    # Every table row has the header's number of cells (the keys' pipes are escaped).
    for block in md.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.startswith("|")]
        if lines:
            widths = {ln.replace("\\|", "").count("|") for ln in lines}
            assert len(widths) == 1, block


def test_the_section_without_reference_runs_says_so(folders: dict[str, Path], tmp_path: Path) -> None:
    folder = read_search(folders["bare"])
    assert folder.latency is None and folder.entries == {}
    md, data, figs = search_section(tmp_path, folder, progress=False)
    assert "ran without its reference-rate runs (`--no-latency`)" in md
    assert data["latency_frontier"] == [] and data["reference_rates"] == {}
    assert_png(figs["fig12_search_latency"])


def test_the_whole_report_with_a_search_folder(folders: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "rep"
    r = run("report", "--no-measure", "--quiet", "--search", str(folders["full"]), "--out", str(out))
    assert r.returncode == 0, r.stderr
    md = (out / "report.md").read_text()
    assert md.index("## 8. Video") < md.index("## 9. Deployment search") < md.index("## Closing note")
    assert "The finished search in `full`" in md and not (out / "search").exists()
    data = json.loads((out / "report.json").read_text())
    assert data["search"]["configurations"] == 6 and data["search"]["folder"] == str(folders["full"])
    for name in FIGURES:
        assert_png(out / f"{name}.png")


def _unfinished(d: Path, full: Path) -> None:
    d.mkdir()
    for name in ("search.json", "points.jsonl"):
        (d / name).write_bytes((full / name).read_bytes())


@pytest.mark.parametrize("case, message", [
    ("missing", "no such folder"),
    ("empty", "not the output of `pykvpool search` (no search.json)"),
    ("file", "not a folder"),
    ("unfinished", "the search did not finish (no points.json)"),
    ("bad-json", "points.json:1: not valid JSON"),
    ("not-a-list", "points.json: must be a JSON list of rows, got an object"),
    ("no-best", "no best.json"),
    ("with-no-search", "--search and --no-search exclude each other"),
])
def test_a_folder_that_is_not_a_finished_search_is_refused(folders: dict[str, Path], tmp_path: Path, case: str,
                                                           message: str) -> None:
    d = tmp_path / case
    full = folders["full"]
    if case == "empty":
        d.mkdir()
    elif case == "file":
        d.write_text("x")
    elif case == "unfinished":
        _unfinished(d, full)
    elif case in ("bad-json", "not-a-list", "no-best"):
        _unfinished(d, full)
        (d / "points.json").write_text({"bad-json": "[{", "not-a-list": "{}", "no-best": "[]"}[case])
    elif case == "with-no-search":
        d = full
    out = tmp_path / "rep"
    extra = ["--no-search"] if case == "with-no-search" else []
    r = run("report", "--no-measure", "--quiet", "--search", str(d), *extra, "--out", str(out))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("pykvpool: error: ") and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert not out.exists()  # refused before any work
    if case != "with-no-search":
        with pytest.raises(InvalidArgumentError, match=case):
            read_search(d)


@pytest.mark.parametrize("args, message", [
    (["--latency-rate", "0"], "argument --latency-rate: must be > 0"),
    (["--latency-rate", "2", "--no-latency"], "--latency-rate and --no-latency exclude each other"),
])
def test_search_latency_options_are_checked(tmp_path: Path, args: list[str], message: str) -> None:
    r = run(*SEARCH, *args, "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and r.stderr.startswith("pykvpool: error: ") and message in r.stderr, r.stderr
    assert not (tmp_path / "o" / "points.jsonl").exists()
