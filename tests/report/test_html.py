"""report.html: one self-contained file (figures inlined, nothing fetched), Markdown escaped,
no file outside the report's folder read, and the page as Debian's headless chromium shows
it: the summary and the figures on screen (the screenshot's pixels at the first figure's
place are that figure), every image decoded, tables sorted by a click on a header.

Without chromium the browser tests skip, with the command that installs it; on CI
(``CI=true``) they fail instead, unless ``PYKVPOOL_SKIP_BROWSER=1`` skips them knowingly.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import signal
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from figcheck import PNG_MAGIC
from needs import missing
from pykvpool import InvalidArgumentError
from pykvpool.report import html as report_html
from pykvpool.report.html import write_html

WIDTH, HEIGHT = 1280, 4000
DATA_PNG = "data:image/png;base64,"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pykvpool.report.build import build_report

    out = tmp_path_factory.mktemp("report")
    build_report(out, measure=False, progress=False, run_search=False)
    write_html(out)
    return out


class _Tags(HTMLParser):
    """Every start tag with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def _tags(page: str) -> list[tuple[str, dict[str, str]]]:
    parser = _Tags()
    parser.feed(page)
    return parser.tags


def test_page_is_one_self_contained_file(report: Path) -> None:
    page = (report / "report.html").read_text(encoding="utf-8")
    tags = _tags(page)
    imgs = [a["src"] for t, a in tags if t == "img"]
    figures = sorted(report.glob("fig*.png"))
    assert len(figures) >= 10 and len(imgs) == len(figures)
    assert all(src.startswith(DATA_PNG) for src in imgs)
    embedded = sorted(base64.b64decode(src[len(DATA_PNG):]) for src in imgs)
    assert embedded == sorted(f.read_bytes() for f in figures)  # each figure exactly once
    # Nothing to fetch: no link, no script or style from elsewhere, only in-page anchors.
    assert not [t for t, a in tags if t in ("link", "iframe", "object", "embed", "base")]
    assert not [a for t, a in tags if t == "script" and "src" in a]
    ids = {a["id"] for _, a in tags if "id" in a}
    hrefs = [a["href"] for _, a in tags if "href" in a]
    assert hrefs and all(h.startswith("#") and h[1:] in ids for h in hrefs)
    assert not re.search(r"https?://|url\(", page)
    csp = [a["content"] for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0] and "img-src data:" in csp[0]
    # One sortable table per Markdown table; the contents list every section.
    md = (report / "report.md").read_text(encoding="utf-8")
    assert page.count('<table class="sortable">') == len(re.findall(r"^\|(?:-+\|)+$", md, re.M)) > 10
    sections = re.findall(r"^## (.+)$", md, re.M)
    toc = re.search(r'<nav class="toc".*?</nav>', page, re.S)
    assert toc and len(sections) >= 9
    assert all(f">{s}</a>" in toc.group(0).replace("&#x27;", "'") for s in sections)


def _png(path: Path, color: tuple[int, int, int]) -> bytes:
    Image.new("RGB", (40, 30), color).save(path)
    return path.read_bytes()


def test_markdown_is_escaped_and_no_file_outside_the_folder_is_read(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    secret = _png(tmp_path / "secret.png", (255, 0, 0))
    inside = _png(out / "sub" / "fig.png", (0, 255, 0))
    (out / "fake.png").write_bytes(b"not a png")
    (out / "link.png").symlink_to(tmp_path / "secret.png")
    (out / "report.md").write_text(
        "# T <b>x</b>\n\n<script>alert(1)</script>\n\n"
        "![in](sub/fig.png) ![up](../secret.png) ![abs](/etc/passwd) ![fake](fake.png) "
        "![link](link.png) ![gone](nope.png) ![url](http://example.com/a.png)\n\n"
        "| a | b |\n|---|---|\n| <i>1</i> | 2 |\n", encoding="utf-8")
    page = write_html(out).read_text(encoding="utf-8")
    tags = _tags(page)
    assert [t for t, _ in tags].count("script") == 1  # the page's own
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;i&gt;1&lt;/i&gt;" in page
    assert "<title>T &lt;b&gt;x&lt;/b&gt;</title>" in page
    srcs = [a["src"] for t, a in tags if t == "img"]
    assert srcs == [DATA_PNG + base64.b64encode(inside).decode()]
    assert base64.b64encode(secret).decode() not in page
    assert page.count('class="missing"') == 6  # up, abs, fake, link, gone, url
    assert "example.com" not in page


def test_figures_beyond_the_pages_byte_budget_are_left_out(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fig = _png(tmp_path / "fig.png", (0, 0, 255))
    monkeypatch.setattr(report_html, "MAX_FIGURES_BYTES", 2 * len(fig) + 1)
    (tmp_path / "report.md").write_text("# t\n\n" + "![f](fig.png)\n\n" * 5, encoding="utf-8")
    page = write_html(tmp_path).read_text(encoding="utf-8")
    assert page.count(base64.b64encode(fig).decode()) == 2
    assert page.count("would exceed MAX_FIGURES_BYTES") == 3


def test_headings_get_githubs_anchors_so_the_markdowns_links_hold(tmp_path: Path) -> None:
    (tmp_path / "report.md").write_text(
        "# T\n\nSee [closing](#closing-note-the-articles-values-beside-pykvpools), "
        "[the second](#1-a-b-1) and [code](#the-kv_cache-pool).\n\n"
        "## 1. A, b\n\n## 1. A, b\n\n## The `kv_cache` pool\n\n"
        "## Closing note: the article's values beside pykvpool's\n", encoding="utf-8")
    tags = _tags(write_html(tmp_path).read_text(encoding="utf-8"))
    ids = [a["id"] for t, a in tags if t == "h2"]
    assert ids == ["1-a-b", "1-a-b-1", "the-kv_cache-pool", "closing-note-the-articles-values-beside-pykvpools"]
    hrefs = [a["href"] for t, a in tags if t == "a"]
    assert len(hrefs) == 3 + 4 and {h[1:] for h in hrefs} == set(ids)  # the links and the contents


def test_bad_input_raises_and_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="out_dir"):
        write_html(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="out_dir"):
        write_html(tmp_path)
    (tmp_path / "report.html").write_text("before")
    (tmp_path / "report.md").write_bytes(b"# \xff\xfe\n")
    with pytest.raises(InvalidArgumentError, match="UTF-8"):
        write_html(tmp_path)
    (tmp_path / "report.md").write_text("# ok\n" + "x" * 100)
    monkeypatch.setattr(report_html, "MAX_MARKDOWN_BYTES", 50)
    with pytest.raises(InvalidArgumentError, match="at most 50 bytes"):
        write_html(tmp_path)
    assert (tmp_path / "report.html").read_text() == "before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.md"]


# ----------------------------------------------------------------------------- the browser


def _chromium() -> str:
    if os.environ.get("PYKVPOOL_SKIP_BROWSER") == "1":
        pytest.skip("!!! PYKVPOOL_SKIP_BROWSER=1: report.html was NOT checked in a browser !!!")
    path = shutil.which("chromium")
    if path is None:
        missing("chromium not found; install Debian's chromium: sudo apt-get install chromium "
                "(or set PYKVPOOL_SKIP_BROWSER=1)")
    assert path is not None
    return path


def _browse(page: Path, tmp: Path, *args: str) -> str:
    """Run headless chromium on ``page`` at WIDTH x HEIGHT; its stdout."""
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-extensions", "--disable-background-networking", "--disable-sync",
           "--hide-scrollbars", "--force-device-scale-factor=1", f"--user-data-dir={tmp / 'profile'}",
           f"--window-size={WIDTH},{HEIGHT}", *args, page.resolve().as_uri()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "HOME": str(tmp)})
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"chromium did not finish within 120 s: {' '.join(cmd)}")
    assert proc.returncode == 0, f"chromium exit {proc.returncode}\n{err[-2000:]}"
    return out


# Run in the page after its own script: what the page shows, then two clicks on a header.
PROBE = """<script>
window.addEventListener("error", function (e) {
  document.documentElement.setAttribute("data-probe", JSON.stringify({error: String(e.message)}));
});
window.addEventListener("load", function () {
  function box(e) { var b = e.getBoundingClientRect(); return [b.left, b.top, b.width, b.height]; }
  function column(t, c) { return Array.from(t.tBodies[0].rows, function (r) { return r.cells[c].textContent.trim(); }); }
  var th = Array.from(document.querySelectorAll("table.sortable th")).find(function (c) {
    return c.textContent.trim() === HEADER; });
  var t = th.closest("table"), r = {}, COLUMN = th.cellIndex;
  r.images = Array.from(document.images, function (i) { return [i.complete, i.naturalWidth, i.naturalHeight]; });
  r.summary = box(document.querySelector("header.summary"));
  r.summary_text = document.querySelector("header.summary").textContent;
  r.figure = document.images.length ? box(document.images[0]) : null;
  th.click(); r.ascending = column(t, COLUMN); r.sort_ascending = th.getAttribute("aria-sort");
  th.click(); r.descending = column(t, COLUMN); r.sort_descending = th.getAttribute("aria-sort");
  r.right_aligned = Array.from(t.tBodies[0].rows, function (row) { return row.cells[COLUMN]; })
    .filter(function (c) { return c.classList.contains("num"); }).map(function (c) { return c.textContent.trim(); });
  document.documentElement.setAttribute("data-probe", JSON.stringify(r));
});
</script>"""


def _probe(page: Path, tmp: Path, header: str) -> dict[str, Any]:
    """What :data:`PROBE` saw in a copy of ``page`` (beside it, so its figures resolve alike),
    clicking the column ``header`` of the first table that has one."""
    copy = page.with_name("probe.html")
    text = page.read_text(encoding="utf-8")
    copy.write_text(text.replace("</body>", PROBE.replace("HEADER", json.dumps(header)) + "</body>"),
                    encoding="utf-8")
    dom = _browse(copy, tmp, "--virtual-time-budget=10000", "--dump-dom")
    found = re.search(r'data-probe="([^"]*)"', dom)
    assert found, f"the probe did not run: {dom[:500]}"
    probe = dict(json.loads(html.unescape(found.group(1))))
    assert "error" not in probe, probe
    return probe


def _rgb(img: Image.Image) -> np.ndarray:
    """``img`` as float RGB in [0, 1], transparency over white."""
    back = Image.new("RGBA", img.size, (255, 255, 255, 255))
    return np.asarray(Image.alpha_composite(back, img.convert("RGBA")).convert("RGB"), dtype=float) / 255


def _crop(shot: Image.Image, box: list[float]) -> Image.Image:
    x, y, w, h = (round(v) for v in box)
    return shot.crop((x, y, x + w, y + h))


def _difference(shown: Image.Image, figure: Path) -> float:
    """Mean absolute difference between ``shown`` and ``figure`` scaled to its size."""
    with Image.open(figure) as f:
        want = _rgb(f.resize(shown.size, Image.Resampling.LANCZOS))
    return float(np.abs(_rgb(shown) - want).mean())


def test_browser_shows_the_summary_and_the_figures(report: Path, tmp_path: Path) -> None:
    page = report / "report.html"
    probe = _probe(page, tmp_path, "batch (x 8192 tokens)")
    figures = sorted(report.glob("fig*.png"))
    assert probe["images"] == [[True, *_size(f)] for f in _shown_order(page, figures)]
    assert _words(_intro(report / "report.md")) <= _words(probe["summary_text"])
    shot_path = tmp_path / "shot.png"
    _browse(page, tmp_path, f"--screenshot={shot_path}")
    assert shot_path.read_bytes()[:8] == PNG_MAGIC
    with Image.open(shot_path) as img:
        shot = img.convert("RGB")
    assert shot.size == (WIDTH, HEIGHT)
    assert float(_rgb(shot).std()) > 0.1  # not blank
    # The title and summary, then the first figure, whole on the screenshot: everything
    # above that figure is on it. The summary holds text (dark pixels).
    summary, figure = probe["summary"], probe["figure"]
    assert 0 <= summary[1] and summary[1] + summary[3] <= figure[1] and figure[1] + figure[3] <= HEIGHT
    assert figure[2] > 600 and figure[3] > 200
    above = [summary[0], summary[1], summary[2], figure[1] - summary[1]]
    assert (_rgb(_crop(shot, above)).mean(axis=2) < 0.5).mean() > 0.01
    # The pixels where the first figure sits are fig1, and clearly not another figure.
    shown = _crop(shot, figure)
    first = report / "fig1_memory_ledger.png"
    assert _difference(shown, first) < 0.03
    assert min(_difference(shown, f) for f in figures if f != first) > 2 * _difference(shown, first)
    # The ledger table, by its batches, clicked twice.
    assert probe["ascending"] == ["1", "8", "16", "32", "64", "128"] and probe["sort_ascending"] == "ascending"
    assert probe["descending"] == probe["ascending"][::-1] and probe["sort_descending"] == "descending"


def _intro(markdown: Path) -> str:
    """The report's title and the text below it, up to its first section, links dropped."""
    text = markdown.read_text(encoding="utf-8").split("\n## ")[0]
    assert text.startswith("# ") and len(text) > 200
    return re.sub(r"\]\([^)]*\)", "]", text)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z]{4,}", text))


def _size(figure: Path) -> tuple[int, int]:
    with Image.open(figure) as img:
        return img.size


def _shown_order(page: Path, figures: list[Path]) -> list[Path]:
    """``figures`` in the order the page shows them."""
    text = page.read_text(encoding="utf-8")
    return sorted(figures, key=lambda f: text.index(base64.b64encode(f.read_bytes()).decode()))


def test_browser_sorts_numbers_by_value_and_text_below(tmp_path: Path) -> None:
    cells = ["1,024,000 @ 8192", "999", "-", "10", "abc", "2.5%", "<= 3", "fp8, 1 B/param", "2x", "x10"]
    rows = "".join(f"| {c} | {i} |\n" for i, c in enumerate(cells))
    (tmp_path / "report.md").write_text(f"# t\n\n| value | row |\n|---|---|\n{rows}", encoding="utf-8")
    probe = _probe(write_html(tmp_path), tmp_path, "value")
    assert probe["ascending"] == ["2x", "2.5%", "<= 3", "10", "999", "1,024,000 @ 8192",
                                  "-", "abc", "fp8, 1 B/param", "x10"]
    assert probe["descending"] == ["1,024,000 @ 8192", "999", "10", "<= 3", "2.5%", "2x",
                                   "x10", "fp8, 1 B/param", "abc", "-"]
    assert sorted(probe["right_aligned"]) == sorted(["999", "10", "2.5%", "<= 3", "2x"])
