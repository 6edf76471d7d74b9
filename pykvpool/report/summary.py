"""The report's summary page: what a capacity planner reads in two minutes, first.

Every number on the page is a cell of a table printed in the section it links to, read
back from that section's Markdown (:func:`pykvpool.report.tables.parse_tables`): the page
formats nothing itself, so it cannot disagree with the report's tables.
"""

from __future__ import annotations

import re
from typing import Any

from pykvpool.planning.ledger import Budget
from pykvpool.report.dynamic import RATE_FACTORS, RATE_HEADER
from pykvpool.report.tables import Table, anchor, parse_tables

__all__ = ["SUMMARY_HEADING", "sections", "summary_section"]

SUMMARY_HEADING = "Summary for capacity planners"
"""The summary page's heading (the report's first section)."""
SUMMARY_MODEL = "Llama-3-8B"
"""The model of the summary's capacity table (the article's)."""


def sections(markdown: str) -> dict[str, str]:
    """``markdown`` cut at its ``## `` headings: heading text -> the section's text.

    Raises:
        Nothing: text before the first heading is left out.
    """
    out: dict[str, str] = {}
    head = None
    for line in markdown.splitlines():
        if line.startswith("## "):
            head = line[3:].strip()
            out[head] = ""
        elif head is not None:
            out[head] += line + "\n"
    return out


def _find(secs: dict[str, str], prefix: str) -> tuple[str, list[Table]] | None:
    for head, text in secs.items():
        if head.startswith(prefix):
            return head, parse_tables(text)
    return None


def _link(head: str, label: str) -> str:
    return f"[{label}]({anchor(head)})"


def _table_with(tables: list[Table], column: str) -> Table:
    return next(t for t in tables if column in t.header)


def _capacity(secs: dict[str, str]) -> list[str]:
    found = _find(secs, "Appendix: every preset")
    if found is None:
        return []
    head, tables = found
    t = next((t for t in tables if {"model", "hardware"} <= set(t.header)), None)
    if t is None:
        return []
    cols = [c for c in t.header if c != "model" and not c.startswith(("weights", "KV B/token"))]
    model = t.header.index("model")
    rows = [[r[t.header.index(c)] for c in cols] for r in t.rows
            if SUMMARY_MODEL in r[model].split(" = ")]
    return [f"**Capacity of {SUMMARY_MODEL} per accelerator** (every preset model: "
            f"{_link(head, 'appendix')}):\n", Table.of(cols, rows).markdown() + "\n"]


def _paging(secs: dict[str, str]) -> list[str]:
    found = _find(secs, "3.")
    if found is None:
        return []
    head, tables = found
    t = _table_with(tables, "gain")
    parts = []
    for wl in dict.fromkeys(t.column("workload")):
        def cell(col: str, wl: str = wl) -> str:
            return t.cell(col, {"workload": wl, "policy": "paged"})
        parts.append(f"{wl}: {cell('admitted')} requests, {cell('gain')} as many as contiguous "
                     f"reservation admits, {cell('utilization (admitted)')} of the reserved KV used")
    return [f"**Paging** ({_link(head, 'section 3')}, blocks of 16 in the KV budget): "
            + "; ".join(parts) + ".\n"]


def _serving(secs: dict[str, str], data: dict[str, Any]) -> list[str]:
    found = _find(secs, "6.")
    if found is None or "dynamic" not in data:
        return []
    head, tables = found
    t = _table_with(tables, RATE_HEADER[0])
    rate = str(data["dynamic"]["rates"][RATE_FACTORS.index(1.0)])

    def cell(policy: str, col: str) -> str:
        return t.cell(col, {RATE_HEADER[0]: rate, "policy": policy})

    return [f"**Serving under traffic** ({_link(head, 'section 6')}: the Azure conversation "
            f"trace at its own {rate} req/s, Llama-3-8B on one A100, simulated): with paging "
            f"{cell('paged', 'output tok/s')} output tok/s, p99 TTFT {cell('paged', 'TTFT p99 (s)')} s, "
            f"p50 TPOT {cell('paged', 'TPOT p50 (ms)')} ms, up to {cell('paged', 'peak running')} "
            f"requests at once; reserving the whole context per request (Orca) runs at most "
            f"{cell('reserve', 'peak running')} at once, p99 TTFT {cell('reserve', 'TTFT p99 (s)')} s.\n"]


def _video(secs: dict[str, str]) -> list[str]:
    found = _find(secs, "8.")
    if found is None:
        return []
    head, tables = found
    kv = _table_with(tables, "KV B/token bf16 / fp8_e4m3")
    serve = _table_with(tables, "streams at real time, bf16 KV")
    cache = next(c for p, c in zip(kv.column("preset"), kv.column("cache"))
                 if p == "longlive" and c != "full history")
    col60 = next(c for c in kv.header if c.startswith("60 s"))
    gib = kv.cell(col60, {"preset": "longlive", "cache": cache}).split(" / ")[0]
    gpus = [g for p, c, g in zip(serve.column("preset"), serve.column("cache"), serve.column("GPU"))
            if p == "longlive" and c == cache]
    counts = ", ".join(f"{g} {serve.cell('streams at real time, bf16 KV', {'preset': 'longlive', 'cache': cache, 'GPU': g})}"
                       for g in gpus)
    return [f"**Video generation** ({_link(head, 'section 8')}): a LongLive stream ({cache}) "
            f"holds {gib} GiB of bf16 KV whatever the video's length; streams per GPU at real "
            f"time (upper bounds, the binding resource in brackets): {counts}.\n"]


def _search(secs: dict[str, str], data: dict[str, Any]) -> list[str]:
    found = _find(secs, "9.")
    if found is None:
        return []
    head, tables = found
    t = _table_with(tables, "best configuration")
    cols = [c for c in t.header if c != "bounds"][:6]
    rows = [[r[t.header.index(c)] for c in cols] for r in t.rows]
    out = [f"**Deployment search** ({_link(head, 'section 9')}): the best configuration per "
           "SLO:\n", Table.of(cols, rows).markdown() + "\n"]
    found_search = data.get("search", {})
    caveat = found_search.get("scaling_model") or next(
        (v for k, v in found_search.items() if "caveat" in k and v), None)
    if caveat:
        out.append(f"{caveat}\n")
    return out


def summary_section(markdown: str, budget: Budget, data: dict[str, Any], roof: str | None) -> str:
    """The summary page of the report whose sections are ``markdown``: the budget, the
    capacity per accelerator, paging, the simulator, video and the search's best
    configurations, each quoting its section's table cells; ``roof`` is section 2's
    roof sentence (None: not measured). A section missing from ``markdown`` is left out.

    Raises:
        KeyError: a section's table lacks a row or column the page quotes (a bug).
    """
    secs = sections(markdown)
    ledger = next((h for h in secs if h.startswith("1.")), None)
    roofline = next((h for h in secs if h.startswith("2.")), None)
    lines = [f"## {SUMMARY_HEADING}\n",
             "Each number below is a cell of the table in the section it links to.\n",
             f"**Budget** ({_link(ledger, 'section 1') if ledger else 'every section'}): the "
             f"A100-80GB's {budget.describe()}; each accelerator gets its own memory with the "
             "same reserve, and the model's weights come out of it.\n"]
    lines += _capacity(secs) + _paging(secs) + _serving(secs, data) + _video(secs) + _search(secs, data)
    if roofline is not None:
        lines.append(f"**This machine** ({_link(roofline, 'section 2')}): "
                     + (f"measured read roof {roof}." if roof else "not measured in this run.")
                     + "\n")
    return "\n".join(lines)
