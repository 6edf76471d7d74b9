"""The figures page, ``benches/RESULTS.md``, checked against its records.

The records (``benches/results/*.json``, one file per area) are the measurements the page
quotes, each a figure exactly as the page prints it with its spread, unit, command and
machine. ``benches/results/headline.json`` lays out the page's headline table: its cells
name records as ``{id}`` (the figure), ``{id|spread}`` or ``{id|command}``.

``python benches/results_page.py --write`` rewrites the headline block of the page (between
the ``headline:begin`` / ``headline:end`` comments) from the records; ``--check`` exits 1,
listing the problems, when the block differs from its rendering, when a record's figure is
not on the page, or when a number in a table of the page is not the figure or the spread of
a record whose figure is in the same row. Numbers that are not measurements (row labels,
set-ups, normalisations) are in :data:`ALLOWLIST`. The headline block itself is checked by
its rendering: every figure in it is a record's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PAGE = HERE / "RESULTS.md"
RECORDS = HERE / "results"
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
KEYS = ("id", "figure", "spread", "unit", "command", "machine", "what")
HEADLINE_COLUMNS = ("what", "measured", "spread", "command")

#: Table cells whose numbers are not measurements: a column header (the whole column) or
#: a (column header, cell) pair, each with the reason.
ALLOWLIST: dict[str | tuple[str, str], str] = {
    "figure (median of 5 runs, loaded machine, load 5.4-6.5)": "names the figure of the row",
    "shape": "names the shape measured (its sizes are set-up, not measurements)",
    "threads": "the thread count the row was run with",
    "row": "names the cache dtype and kernel path (int8, e4m3, ...)",
    "pairs": "the number of A/B pairs the command was run for",
    "prompts": "the number of prompts in the workload",
    "case": "names the workload (request counts, block sizes, thread counts)",
    "round": "numbers the round",
    "block size": "the block size the row was run with",
    ("x bf16 (paired)", "1"): "bf16 against itself, the normalisation of the column",
    ("chunk attention, 1 thread, speed vs 16 (min-max over 9 rounds)", "1.00"):
        "block size 16 against itself, the normalisation of the column",
}

NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")
PLACEHOLDER = re.compile(r"\{([\w.+-]+)(?:\|(spread|command))?\}")


def load_records(folder: Path = RECORDS) -> dict[str, dict[str, Any]]:
    """Every record of ``folder/*.json`` but ``headline.json``, by id.

    Raises:
        ValueError: a record lacks a key or repeats an id.
    """
    records: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name == "headline.json":
            continue
        for rec in json.loads(path.read_text(encoding="utf-8")):
            missing = [k for k in KEYS if k not in rec]
            if missing or rec["id"] in records:
                raise ValueError(f"{path.name}: record {rec.get('id')!r}: "
                                 f"{'missing ' + ', '.join(missing) if missing else 'repeated id'}")
            records[rec["id"]] = rec
    return records


def _fill(template: str, records: dict[str, dict[str, Any]]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in records:
            raise KeyError(f"headline names no record {m.group(1)!r}")
        value = records[m.group(1)][m.group(2) or "figure"]
        if value is None:
            raise KeyError(f"record {m.group(1)!r} has no {m.group(2) or 'figure'}")
        return str(value)
    return PLACEHOLDER.sub(sub, template)


def render_headline(records: dict[str, dict[str, Any]], folder: Path = RECORDS) -> str:
    """The headline table, markers included, from the records and ``headline.json``.

    Raises:
        KeyError: a cell names a record, or a field of it, that does not exist.
    """
    rows = json.loads((folder / "headline.json").read_text(encoding="utf-8"))
    lines = [BEGIN, "| figure | measured | spread | command |", "|---|---|---|---|"]
    for row in rows:
        if not PLACEHOLDER.search(row["measured"]):
            raise KeyError(f"headline row {row['what']!r} quotes no record")
        lines.append("| " + " | ".join(_fill(row[c], records) for c in HEADLINE_COLUMNS) + " |")
    return "\n".join(lines + [END])


def _block(page: str) -> tuple[int, int]:
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {BEGIN} ... {END} block")
    return start, end + len(END)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str) -> Iterator[tuple[list[str], list[list[str]]]]:
    """The markdown tables of ``text``: (header cells, body rows of cells)."""
    lines = text.splitlines() + [""]
    table: list[str] = []
    for line in lines:
        if line.startswith("|"):
            table.append(line)
        elif table:
            yield _cells(table[0]), [_cells(row) for row in table[2:]]
            table = []


def _clean(cell: str) -> str:
    return re.sub(r"`[^`]*`", "", cell).replace("**", "")


def _found(figure: str, text: str) -> bool:
    return re.search(r"(?<![\w.])" + re.escape(figure) + r"(?!\d|\.\d)", text) is not None


def _tokens(*texts: object) -> set[str]:
    return {n for t in texts if t is not None for n in NUMBER.findall(str(t))}


def check(page: str, records: dict[str, dict[str, Any]], folder: Path = RECORDS) -> list[str]:
    """The page's problems against the records (none when the page is their rendering)."""
    start, end = _block(page)
    problems = []
    if page[start:end] != render_headline(records, folder):
        problems.append("the headline block differs from its rendering (run --write)")
    problems += [f"record {r['id']}: figure {r['figure']!r} is not on the page"
                 for r in records.values() if not _found(str(r["figure"]), page)]
    used: set[str | tuple[str, str]] = set()
    for header, rows in tables(page[:start] + page[end:]):
        for row in rows:
            kept = []
            for head, cell in zip(header, row):
                key = head if head in ALLOWLIST else (head, cell)
                if key in ALLOWLIST:
                    used.add(key)
                else:
                    kept.append(_clean(cell))
            text = " | ".join(kept)
            near = [r for r in records.values() if _found(str(r["figure"]), text)]
            loose = _tokens(text) - _tokens(*(x for r in near for x in (r["figure"], r["spread"])))
            if loose:
                problems.append(f"table row {row[0]!r}: {', '.join(sorted(loose))} "
                                f"quoted by no record of the row")
    problems += [f"allowlist entry {k!r} matches no cell" for k in ALLOWLIST if k not in used]
    return problems


def main(argv: list[str] | None = None) -> int:
    """Print, ``--write`` or ``--check`` the headline; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the page's headline block")
    mode.add_argument("--check", action="store_true", help="exit 1 when the page is off its records")
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--records", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    records = load_records(args.records)
    page = args.page.read_text(encoding="utf-8")
    if args.check:
        problems = check(page, records, args.records)
        for p in problems:
            print(f"{args.page.name}: {p}")
        return 1 if problems else 0
    block = render_headline(records, args.records)
    if args.write:
        start, end = _block(page)
        args.page.write_text(page[:start] + block + page[end:], encoding="utf-8")
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
