"""``report.html``: the report's Markdown as one self-contained page.

:func:`write_html` renders ``report.md`` with markdown-it (CommonMark and tables, raw HTML
off, so every character of the Markdown is escaped) into ``report.html`` beside it: the
PNG figures of the folder inlined as ``data:`` URIs, a table of contents from the headings,
tables sorted by a click on a header (a small inline script: numbers by value, text in
natural order), and a Content-Security-Policy that forbids the page any request.
"""

from __future__ import annotations

import base64
import html
import os
import tempfile
from pathlib import Path
from urllib.parse import unquote

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict

from pykvpool.checks import invalid
from pykvpool.report.tables import anchor

__all__ = ["MAX_FIGURES_BYTES", "MAX_MARKDOWN_BYTES", "write_html"]

MAX_MARKDOWN_BYTES = 16 << 20
"""Largest ``report.md`` :func:`write_html` reads, bytes."""
MAX_FIGURES_BYTES = 256 << 20
"""Most PNG bytes :func:`write_html` inlines in one page, all figures together (a figure
shown twice counts twice); a figure beyond it is left out."""

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_TOC_LEVELS = ("h2", "h3")
_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; base-uri 'none'; form-action 'none'")

_CSS = """
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: #1d1f23; background: #fff; }
nav.toc { position: fixed; top: 0; left: 0; bottom: 0; width: 230px; overflow-y: auto;
          padding: 16px 12px; background: #f4f5f7; border-right: 1px solid #dde0e4;
          font-size: 13px; box-sizing: border-box; }
nav.toc ol { list-style: none; margin: 0; padding: 0; }
nav.toc li.h3 { padding-left: 1em; }
nav.toc a { color: #24518f; text-decoration: none; display: block; padding: 2px 0; }
nav.toc a:hover { text-decoration: underline; }
main { margin-left: 230px; padding: 8px 32px 48px; }
main p, main ul, main ol { max-width: 1000px; }
header.summary { border-bottom: 2px solid #dde0e4; margin-bottom: 16px; }
h1 { font-size: 26px; } h2 { font-size: 21px; margin-top: 2em; border-bottom: 1px solid #dde0e4; }
img { max-width: 100%; height: auto; display: block; margin: 12px 0; }
code { background: #f0f1f3; padding: 0 3px; border-radius: 3px; font-size: 90%; }
pre code { display: block; padding: 8px; overflow-x: auto; }
.table { overflow-x: auto; margin: 12px 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d5d8dc; padding: 3px 8px; vertical-align: top; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
thead th { background: #eceef1; cursor: pointer; user-select: none; white-space: nowrap; }
thead th::after { content: " \\2195"; color: #9aa0a8; }
thead th[aria-sort=ascending]::after { content: " \\2191"; color: #1d1f23; }
thead th[aria-sort=descending]::after { content: " \\2193"; color: #1d1f23; }
tbody tr:nth-child(even) { background: #f8f9fa; }
.missing { color: #a33; font-style: italic; }
@media (max-width: 800px) { nav.toc { position: static; width: auto; }
                            main { margin-left: 0; padding: 8px 12px; } }
"""

# Sorts a table by the clicked header: cells that start with a number (after an optional
# <=, >= or ~, thousands commas ignored) by value, text in natural order, text below the
# numbers in either direction; rows that compare equal keep their order.
# A cell that is only a number (with an optional % or x) is aligned right.
_SCRIPT = r"""
(function () {
  var NUM = /^(?:[<>]=?|~)?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)/i;
  var ONLY = /^(?:[<>]=?|~)?\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?\s*[%x]?$/i;
  var text = new Intl.Collator(undefined, {numeric: true, sensitivity: "base"});
  function key(cell) {
    var t = cell ? cell.textContent.trim() : "";
    var m = NUM.exec(t.replace(/,/g, ""));
    return m ? {n: parseFloat(m[1]), t: t} : {n: null, t: t};
  }
  function compare(a, b, sign) {
    if (a.n !== null && b.n !== null) return sign * (a.n - b.n);
    if (a.n !== null || b.n !== null) return a.n !== null ? -1 : 1;
    return sign * text.compare(a.t, b.t);
  }
  function sortBy(table, th) {
    var col = th.cellIndex, desc = th.getAttribute("aria-sort") === "ascending";
    var body = table.tBodies[0];
    var rows = Array.prototype.map.call(body.rows, function (r, i) {
      return {row: r, i: i, k: key(r.cells[col])};
    });
    rows.sort(function (a, b) { return compare(a.k, b.k, desc ? -1 : 1) || a.i - b.i; });
    rows.forEach(function (r) { body.appendChild(r.row); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) { c.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", desc ? "descending" : "ascending");
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    if (!table.tHead || !table.tBodies.length) return;
    Array.prototype.forEach.call(table.tBodies[0].querySelectorAll("td"), function (td) {
      if (ONLY.test(td.textContent.trim().replace(/,/g, ""))) td.classList.add("num");
    });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
      th.tabIndex = 0;
      th.title = "sort by this column";
      th.addEventListener("click", function () { sortBy(table, th); });
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(table, th); }
      });
    });
  });
})();
"""


def _folder(out_dir: object) -> Path:
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir must be a str or path, got {type(out_dir).__name__}")
    folder = Path(out_dir)
    if not (folder / "report.md").is_file():
        raise invalid(f"out_dir must be a folder holding report.md, got {str(folder)!r}")
    return folder


def _read_limited(path: Path, limit: int) -> bytes | None:
    """``path``'s bytes, or None when it holds more than ``limit`` bytes."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def _figure(folder: Path, src: str, budget: int) -> tuple[bytes | None, str]:
    """The bytes of the figure ``src`` names, or None and why it is left out: only a PNG
    file inside ``folder`` (links followed) of at most ``budget`` bytes."""
    name = unquote(src)
    if not name or ":" in name or name.startswith(("/", "\\")) or "?" in name or "#" in name:
        return None, "not a file of the report's folder"
    root = folder.resolve()
    path = (root / name).resolve()
    if root not in path.parents or path.suffix.lower() != ".png":
        return None, "not a PNG file of the report's folder"
    if not path.is_file():
        return None, "file not found"
    data = _read_limited(path, budget)
    if data is None:
        return None, "the page's figures would exceed MAX_FIGURES_BYTES"
    return (data, "") if data.startswith(_PNG_MAGIC) else (None, "not a PNG file")


def _inline_figures(tokens: list[Token], folder: Path) -> None:
    """Point every image at its inlined data, or mark it left out (``meta["missing"]``)."""
    budget = MAX_FIGURES_BYTES
    for tok in tokens:
        for child in tok.children or ():
            if child.type != "image":
                continue
            data, why = _figure(folder, str(child.attrGet("src") or ""), budget)
            if data is None:
                child.meta["missing"] = why
                continue
            budget -= len(data)
            child.attrSet("src", "data:image/png;base64," + base64.b64encode(data).decode("ascii"))


def _slug(text: str, taken: set[str]) -> str:
    """GitHub's anchor of a heading, so the Markdown's ``(#...)`` links hold in the page:
    lower case, punctuation dropped, spaces as hyphens; a repeat gets ``-1``, ``-2``..."""
    base = anchor(text)[1:] or "section"
    slug, n = base, 1
    while slug in taken:
        slug, n = f"{base}-{n}", n + 1
    taken.add(slug)
    return slug


def _heading_text(inline: Token) -> str:
    return "".join(c.content for c in inline.children or () if c.type in ("text", "code_inline"))


def _anchor_headings(tokens: list[Token]) -> list[tuple[str, str, str]]:
    """Give every heading an ``id``; returns ``(tag, id, text)`` of the contents' headings."""
    toc: list[tuple[str, str, str]] = []
    taken: set[str] = set()
    for i, tok in enumerate(tokens):
        if tok.type != "heading_open":
            continue
        text = _heading_text(tokens[i + 1])
        slug = _slug(text, taken)
        tok.attrSet("id", slug)
        if tok.tag in _TOC_LEVELS:
            toc.append((tok.tag, slug, text))
    return toc


def _render_image(self: RendererHTML, tokens: list[Token], idx: int,
                  options: OptionsDict, env: EnvType) -> str:
    tok = tokens[idx]
    alt = self.renderInlineAsText(tok.children or [], options, env)
    why = tok.meta.get("missing")
    if why is not None:
        return (f'<span class="missing">[figure "{html.escape(alt)}" not shown: '
                f'{html.escape(str(why))}]</span>')
    return f'<img src="{html.escape(str(tok.attrGet("src")))}" alt="{html.escape(alt)}">'


def _render_table_open(self: RendererHTML, tokens: list[Token], idx: int,
                       options: OptionsDict, env: EnvType) -> str:
    tokens[idx].attrSet("class", "sortable")
    return '<div class="table">' + self.renderToken(tokens, idx, options, env)


def _render_table_close(self: RendererHTML, tokens: list[Token], idx: int,
                        options: OptionsDict, env: EnvType) -> str:
    return self.renderToken(tokens, idx, options, env) + "</div>\n"


def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.add_render_rule("image", _render_image)
    md.add_render_rule("table_open", _render_table_open)
    md.add_render_rule("table_close", _render_table_close)
    return md


def _split_summary(tokens: list[Token]) -> tuple[list[Token], list[Token]]:
    """The tokens before the first section heading (title and summary), and the rest."""
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.tag != "h1":
            return tokens[:i], tokens[i:]
    return tokens, []


def _toc_html(toc: list[tuple[str, str, str]]) -> str:
    items = "".join(f'<li class="{tag}"><a href="#{slug}">{html.escape(text)}</a></li>'
                    for tag, slug, text in toc)
    return f'<nav class="toc" aria-label="Contents"><strong>Contents</strong><ol>{items}</ol></nav>'


def _page(markdown: str, folder: Path) -> str:
    md = _markdown()
    tokens = md.parse(markdown)
    toc = _anchor_headings(tokens)
    _inline_figures(tokens, folder)
    head, rest = _split_summary(tokens)
    titles = [_heading_text(tokens[i + 1]) for i, t in enumerate(tokens)
              if t.type == "heading_open" and t.tag == "h1"]
    title = html.escape(titles[0] if titles else "pykvpool report")
    render = md.renderer.render
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{title}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            f"{_toc_html(toc)}\n<main>\n"
            f'<header class="summary">\n{render(head, md.options, {})}</header>\n'
            f"{render(rest, md.options, {})}</main>\n<script>{_SCRIPT}</script>\n</body>\n</html>\n")


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_html(out_dir: str | os.PathLike[str]) -> Path:
    """Render ``out_dir/report.md`` into one self-contained ``out_dir/report.html`` and
    return its path.

    The page needs nothing else: each figure the Markdown shows is inlined as a
    ``data:image/png`` URI when it is a PNG file inside ``out_dir`` and the page's figures
    stay within :data:`MAX_FIGURES_BYTES` bytes (any other image is shown as a note saying
    why; a path leading out of the folder is never read); the contents list the ``##`` and
    ``###`` headings; a click on a table's header sorts its rows (numbers by value). Raw
    HTML in the Markdown is shown as text, and the page's Content-Security-Policy forbids
    any network request. The file is replaced at once: an error leaves any earlier
    ``report.html`` as it was.

    Args:
        out_dir: the folder of a report (:func:`pykvpool.report.build.build_report`'s
            ``out_dir``), holding ``report.md`` of at most :data:`MAX_MARKDOWN_BYTES` bytes
            (UTF-8).

    Raises:
        TypeError: ``out_dir`` is not a str or path.
        InvalidArgumentError: ``out_dir`` holds no ``report.md``, or one larger than
            :data:`MAX_MARKDOWN_BYTES` or not UTF-8.
        OSError: a file cannot be read, or ``report.html`` cannot be written.
    """
    folder = _folder(out_dir)
    data = _read_limited(folder / "report.md", MAX_MARKDOWN_BYTES)
    if data is None:
        raise invalid(f"out_dir's report.md must be at most {MAX_MARKDOWN_BYTES} bytes")
    try:
        markdown = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid(f"out_dir's report.md must be UTF-8: {e}") from None
    out = folder / "report.html"
    _write_atomic(out, _page(markdown, folder))
    return out
