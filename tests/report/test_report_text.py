"""The report's text tells what its tables say: the summary page comes first and quotes
the sections' table cells, every sentence that restates a table number restates its cell,
the article is named where it first appears, and no heading or sentence cites internal
tracker numbers. Numbers are parsed out of the built report, never written here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pykvpool.report.summary import SUMMARY_HEADING, sections
from pykvpool.report.tables import Table, anchor, parse_tables

NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?%?")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    from pykvpool.report.build import build_report

    res = build_report(tmp_path_factory.mktemp("report"), measure=False, progress=False)
    return res.markdown.read_text(encoding="utf-8"), res


def _section(md: str, prefix: str) -> tuple[str, str]:
    return next((h, t) for h, t in sections(md).items() if h.startswith(prefix))


def _cells(tables: list[Table]) -> set[str]:
    """Every cell, and each part of a ``a / b`` cell and of a ``n (why)`` cell."""
    out: set[str] = set()
    for t in tables:
        for row in t.rows:
            for c in row:
                out.add(c)
                out.update(p.strip() for p in c.split(" / "))
                out.add(c.split(" (")[0])
    return out


def _prose(text: str) -> str:
    """``text`` without its tables, figure lines and link targets."""
    lines = [ln for ln in text.splitlines() if not ln.startswith(("|", "!["))]
    return re.sub(r"\]\([^)]*\)", "]", "\n".join(lines))


def test_summary_is_the_first_section_and_links_to_real_sections(report: tuple[str, Any]) -> None:
    md, _ = report
    heads = [h for h in sections(md)]
    assert heads[0] == SUMMARY_HEADING
    links = re.findall(r"\]\((#[^)]*)\)", sections(md)[SUMMARY_HEADING])
    assert len(links) >= 5 and set(links) <= {anchor(h) for h in heads}


def test_summary_numbers_are_cells_of_the_linked_section(report: tuple[str, Any]) -> None:
    """Each paragraph of the summary quotes the tables of the section it links to: every
    number in it (but the link's own label) is one of that section's cells, and every
    cell of a summary table is a cell of the linked section's tables."""
    md, _ = report
    secs = sections(md)
    by_anchor = {anchor(h): t for h, t in secs.items()}
    paragraphs = secs[SUMMARY_HEADING].split("\n\n")
    checked = 0
    for i, para in enumerate(paragraphs):
        links = re.findall(r"\[([^\]]*)\]\((#[^)]*)\)", para)
        if not links or links[0][1] not in by_anchor:
            continue
        label, target = links[0]
        cells = _cells(parse_tables(by_anchor[target]))
        text = para.replace(f"[{label}]({target})", "")
        if "**Budget**" in para:
            continue  # the budget sentence is Budget.describe(), checked below
        nums = [n for n in NUMBER.findall(_prose(text)) if n not in ("16",)]  # "blocks of 16"
        missing = [n for n in nums if n not in cells and not any(n in c for c in cells)]
        assert not missing, f"summary numbers not in {target}: {missing}\n{para}"
        # a summary table follows its paragraph: each of its cells is a section cell
        following = paragraphs[i + 1] if i + 1 < len(paragraphs) else ""
        if following.startswith("|"):
            for row in parse_tables(following)[0].rows:
                assert set(row) <= cells, (row, target)
        checked += 1
    assert checked >= 5


def test_budget_sentence_is_the_budget(report: tuple[str, Any]) -> None:
    md, res = report
    assert res.data["budget"] in sections(md)[SUMMARY_HEADING]


def test_dynamic_text_restates_its_table(report: tuple[str, Any]) -> None:
    """The p99 TTFT, TPOT, peak running and token utilization the section's text gives at
    the trace's own rate are the cells of the table's row at that rate."""
    md, _ = report
    _, text = _section(md, "6.")
    table = next(t for t in parse_tables(text) if "TTFT p99 (s)" in t.header)
    prose = _prose(text)
    rate = re.search(r"At the trace's own rate \(([\d.]+) req/s\)", prose).group(1)

    def cell(policy: str, col: str) -> str:
        return table.cell(col, {"rate (req/s)": rate, "policy": policy})

    m = re.search(r"full of tokens.*?p99 TTFT (\S+) s, p50 TPOT (\S+) ms", prose, re.S)
    assert m and (m.group(1), m.group(2)) == (cell("paged", "TTFT p99 (s)"), cell("paged", "TPOT p50 (ms)"))
    util = re.search(r"blocks held are (\S+) full of tokens", prose).group(1)
    assert util == cell("paged", "mean utilization (tokens / held slots)")
    orca = re.search(r"holds at most (\d+) requests in the same memory \(p99 TTFT (\S+) s\)", prose)
    assert orca and orca.groups() == (cell("reserve", "peak running"), cell("reserve", "TTFT p99 (s)"))
    med = re.search(r"median (\S+) s paged, (\S+) s reserve, (\S+) s oracle", prose)
    assert med and med.groups() == tuple(cell(p, "TTFT p50 (s)") for p in ("paged", "reserve", "oracle"))


def test_video_text_restates_its_kv_table(report: tuple[str, Any]) -> None:
    md, _ = report
    _, text = _section(md, "8.")
    kv = next(t for t in parse_tables(text) if any(h.startswith("240 s") for h in t.header))
    col = next(h for h in kv.header if h.startswith("240 s"))
    prose = _prose(text)
    m = re.search(r"stream over 240 s through the simulator's pool: (\S+) GiB at 240 s with full "
                  r"history, flat at (\S+) GiB", prose)
    assert m
    caches = [c for p, c in zip(kv.column("preset"), kv.column("cache")) if p == "longlive"]
    assert [kv.cell(col, {"preset": "longlive", "cache": c}).split(" / ")[0] for c in caches] == list(m.groups())
    fps = re.search(r"alone on the H100 runs at (\S+) fps", prose).group(1)
    serve = next(t for t in parse_tables(text) if "one stream alone, slowest chunk (fps)" in t.header)
    assert fps == serve.cell("one stream alone, slowest chunk (fps)",
                             {"preset": "longlive", "cache": caches[1], "GPU": "H100 SXM"})


def test_one_column_name_one_value_across_tables(report: tuple[str, Any]) -> None:
    """A paged, block-16 row of a workload says the same under the same column name in the
    capacity tables and in the block-size sweeps (a number that differs because it counts
    other requests carries another name)."""
    md, _ = report
    tables = parse_tables(md)
    static = [t for t in tables if {"workload", "policy", "block (tokens)"} <= set(t.header)]
    sweeps = [t for t in tables if "block size" in t.header and ("trace" in t.header or "admitted" in t.header)]
    compared = 0
    for st in static:
        for row in st.rows:
            r = dict(zip(st.header, row))
            if r["policy"] != "paged" or r["block (tokens)"] != "16":
                continue
            for sw in sweeps:
                key = {"trace": r["workload"]} if "trace" in sw.header else None
                if key is not None and r["workload"] not in sw.column("trace"):
                    continue
                if key is None and not r["workload"].startswith("uniform"):
                    continue
                other = dict(zip(sw.header, next(x for x in sw.rows if dict(zip(sw.header, x))["block size"] == "16"
                                                 and (key is None or dict(zip(sw.header, x))["trace"] == r["workload"]))))
                for col in set(st.header) & set(sw.header) - {"block size"}:
                    assert r[col] == other[col], (r["workload"], col, r[col], other[col])
                compared += 1
    assert compared >= 3


def test_the_article_is_named_where_it_first_appears(report: tuple[str, Any]) -> None:
    from pykvpool.report.article import ARTICLE

    md, _ = report
    first = md.lower().index("the article")
    assert md.index(ARTICLE) == first + len("the article ")


def test_no_tracker_numbers_in_headings_or_text(report: tuple[str, Any]) -> None:
    md, _ = report
    text = _prose(md)
    assert not re.search(r"\bissues?\b|\bwave\b|#\d", text, re.I), re.findall(r".{30}(?:issue|wave|#\d).{30}", text, re.I)


def test_search_best_configuration_in_the_summary(report: tuple[str, Any]) -> None:
    md, res = report
    summary = sections(md)[SUMMARY_HEADING]
    for slo, best in res.data["search"]["best"].items():
        if best is not None:
            assert str(best["key"]).replace("|", "\\|") in summary, slo


def test_readme_lists_exactly_the_figures_a_report_writes(report: tuple[str, Any]) -> None:
    _, res = report
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    job = readme[readme.index("## The main job"):]
    job = job[: job.index("\n## ", 1)]
    table = next(t for t in parse_tables(job) if t.header[0] == "file")
    listed = {n for c in table.column("file") for n in re.findall(r"`([^`]+\.png)`", c)}
    written = {p.name for p in res.out_dir.glob("*.png")}
    assert listed == written
    assert set(res.figures) == {Path(n).stem for n in written}


def test_figure_10_keeps_every_line_visible() -> None:
    """Two GPUs with the same counts and nearly the same budget still draw apart: no drawn
    line of a panel lies exactly on another one."""
    from pykvpool.report import video_serving as vs

    n = len(vs.WINDOWS)
    same = [4, 3, 3, 2, 1, 1, 1, 1, 0]
    sweep = {"a100-80gb-sxm": same, "h100-sxm": same, "h200": [5] * n,
             "a100-80gb-sxm memory": [9] * n, "h100-sxm memory": [9] * n, "h200 memory": [20] * n}
    mem = {"video_s": [1.0, 2.0], "full": [1.0, 2.0], "windowed": [1.0, 1.0],
           "kv_budget_gib": {"a100-80gb-sxm": 73.6, "h100-sxm": 73.2, "h200": 134.0}}
    _, lines = vs._draw(sweep, mem)
    for panel in {p for p, *_ in lines}:
        drawn = [(tuple(x), tuple(y)) for p, _, x, y in lines if p == panel]
        assert len(set(drawn)) == len(drawn), panel
    # every GPU appears in each of the two count panels
    for panel in (0, 1):
        assert {label for p, label, *_ in lines if p == panel} == {"A100-80GB SXM", "H100 SXM", "H200 SXM"}


def _measured(probes: list[tuple[float, ...]]) -> Any:
    from pykvpool.planning.hardware import Hardware
    from pykvpool.planning.roofline import KernelPoint, Spread
    from pykvpool.report.build import ROOF_RULE, Measured

    spreads = [Spread(p, ROOF_RULE.k, ROOF_RULE.rel_tol) for p in probes]
    kernel = [KernelPoint(g, 8, 4096, 8, 128, 1e9 * g, 2.7e8, 0.02, s.value, s)
              for g, s in zip((1, 4, 8), spreads)]
    roof = Spread.pooled(spreads)
    machine = Hardware("this machine (CPU)", 8 << 30, roof.value, {"fp32": 1e11}, "test")
    return Measured(machine, kernel, [], 2e10, roof)


@pytest.mark.parametrize("stable", [True, False])
def test_roof_is_stated_with_its_spread_in_section_2_and_the_summary(stable: bool) -> None:
    from pykvpool.planning.hardware import hardware_preset
    from pykvpool.planning.ledger import default_budget
    from pykvpool.report.article import article_ledgers
    from pykvpool.report.build import _roofline_text, roof_sentence
    from pykvpool.report.summary import summary_section

    probes = [(9e9, 30e9, 31e9, 29.5e9), (12e9, 30.5e9), (7e9, 30e9)] if stable else \
             [(7e9, 15e9), (9e9, 10e9), (33e9, 6e9)]
    m = _measured(probes)
    fig2 = {"kernel": [{"group_size": k.group_size, "share_of_roof": 0.5, "above_roof": False}
                       for k in m.kernel], "prefill": []}
    text = "\n".join(_roofline_text(article_ledgers()[0], m, fig2))
    sentence = roof_sentence(m.roof)
    lo, hi = min(min(p) for p in probes) / 1e9, max(max(p) for p in probes) / 1e9
    assert f"all probes {lo:.1f}-{hi:.1f} GB/s" in sentence and sentence in text
    assert f"of {sum(map(len, probes))} probes" in sentence
    assert ("did not settle" in text) != stable
    md = "## 2. Roofline\n\n" + text
    summary = summary_section(md, default_budget(hardware_preset("a100-80gb-sxm")), {}, sentence)
    assert sentence in summary


def test_a_number_the_text_repeats_is_printed_the_same_way(report: tuple[str, Any]) -> None:
    """Section 6 states the pool's peak occupancy twice: the same string both times."""
    md, _ = report
    prose = _prose(_section(md, "6.")[1])
    peak = re.search(r"peak occupancy (\S+),", prose).group(1)
    again = re.search(r"the pool is at most (\S+) occupied", prose)
    assert again is None or again.group(1) == peak
