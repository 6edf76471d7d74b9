"""Markdown tables, the report's number formatters and JSON-ready values shared by the
report's sections.

A number the report prints is formatted once: a section builds its table from the
formatters below (:func:`fmt_s`, :func:`fmt_pct`, ...) into a :class:`Table`, and any
sentence (or the summary page) that restates the number quotes the table's cell
(:meth:`Table.cell`), never the value formatted a second time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

import numpy as np

from pykvpool.planning.ledger import GIB

__all__ = ["Table", "anchor", "fmt_count", "fmt_gib", "fmt_ms", "fmt_pct", "fmt_s", "fmt_x", "jsonable",
           "markdown_table", "parse_tables"]


def fmt_s(seconds: float, digits: int = 2) -> str:
    """``seconds`` with ``digits`` decimals (the unit, s, is the caller's header).

    Raises:
        TypeError: ``seconds`` is not a number.
    """
    return f"{seconds:.{digits}f}"


def fmt_ms(seconds: float, digits: int = 1) -> str:
    """``seconds`` in milliseconds with ``digits`` decimals.

    Raises:
        TypeError: ``seconds`` is not a number.
    """
    return f"{seconds * 1e3:.{digits}f}"


def fmt_pct(share: float, digits: int = 2) -> str:
    """``share`` (1.0 = 100%) as a percentage with ``digits`` decimals and the % sign.

    Raises:
        TypeError: ``share`` is not a number.
    """
    return f"{share:.{digits}%}"


def fmt_gib(nbytes: float, digits: int = 2) -> str:
    """``nbytes`` bytes in GiB (2^30 bytes) with ``digits`` decimals.

    Raises:
        TypeError: ``nbytes`` is not a number.
    """
    return f"{nbytes / GIB:.{digits}f}"


def fmt_count(n: int) -> str:
    """An integer count with thousands separators.

    Raises:
        TypeError, ValueError: ``n`` is not a number (``int`` refuses it).
    """
    return f"{int(n):,}"


def fmt_x(ratio: float, digits: int = 2) -> str:
    """A ratio as ``1.75x``.

    Raises:
        TypeError: ``ratio`` is not a number.
    """
    return f"{ratio:.{digits}f}x"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class Table:
    """A table of formatted cells: what the report prints, and what its sentences quote.

    Attributes:
        header: column names.
        rows: one list of cell strings per row, as many as ``header``.
    """

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, header: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
        """A table of ``rows`` (each cell turned into its string once).

        Raises:
            ValueError: a row's length differs from the header's.
        """
        cells = tuple(tuple(str(c) for c in r) for r in rows)
        if any(len(r) != len(header) for r in cells):
            raise ValueError(f"every row needs {len(header)} cells")
        return cls(tuple(header), cells)

    def markdown(self) -> str:
        """The table in GitHub-flavoured Markdown.

        Raises:
            Nothing: the cells are strings already.
        """
        return markdown_table(self.header, self.rows)

    def cell(self, column: str, where: Mapping[str, str]) -> str:
        """The cell of ``column`` in the one row whose cells match ``where`` (column name:
        the cell's text).

        Raises:
            KeyError: an unknown column, or no row or several rows match.
        """
        col = self._index(column)
        keys = {self._index(k): v for k, v in where.items()}
        found = [r for r in self.rows if all(r[i] == v for i, v in keys.items())]
        if len(found) != 1:
            raise KeyError(f"{len(found)} rows match {dict(where)} (column {column!r})")
        return found[0][col]

    def column(self, column: str) -> list[str]:
        """Every cell of ``column``, top to bottom.

        Raises:
            KeyError: an unknown column.
        """
        i = self._index(column)
        return [r[i] for r in self.rows]

    def _index(self, column: str) -> int:
        try:
            return self.header.index(column)
        except ValueError:
            raise KeyError(f"no column {column!r} in {self.header}") from None


def _split_row(line: str) -> tuple[str, ...]:
    inner = line.strip()[1:-1]
    cells, cur, i = [], "", 0
    while i < len(inner):
        if inner[i] == "\\" and i + 1 < len(inner) and inner[i + 1] == "|":
            cur, i = cur + "\\|", i + 2
            continue
        if inner[i] == "|":
            cells.append(cur.strip())
            cur = ""
        else:
            cur += inner[i]
        i += 1
    cells.append(cur.strip())
    return tuple(cells)


def parse_tables(markdown: str) -> list[Table]:
    """Every GitHub-flavoured table of ``markdown`` (as :func:`markdown_table` writes
    them), in order; an escaped ``\\|`` stays inside its cell.

    Raises:
        Nothing: text that is no table is skipped.
    """
    lines = markdown.splitlines()
    out: list[Table] = []
    i = 0
    while i + 1 < len(lines):
        if lines[i].startswith("|") and lines[i + 1].startswith("|---"):
            header = _split_row(lines[i])
            j = i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(_split_row(lines[j]))
                j += 1
            out.append(Table(header, tuple(rows)))
            i = j
        else:
            i += 1
    return out


def jsonable(obj: Any) -> Any:
    """``obj`` with dataclasses, tuples and numpy values turned into JSON types."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return obj.item()
    return obj


def anchor(heading: str) -> str:
    """The GitHub anchor of a Markdown heading's text (``#6-dynamic-serving-...``).

    Raises:
        Nothing: any text has an anchor.
    """
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    return "#" + slug
