"""Static capacity sweeps through BlockPool, the article's workloads and the traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pykvpool
from pykvpool.report.article import article_ledgers
from pykvpool.errors import TraceFormatError, UnknownPresetError
from pykvpool.planning.ledger import GIB, MIB
from pykvpool.planning.sweeps import (
    block_size_sweep,
    contiguous,
    paged,
    paged_shared_prefix,
    waste_decomposition,
)
from pykvpool.planning.workloads import (
    Workload,
    article_heavy_tail,
    article_uniform,
    azure_trace,
    azure_trace_path,
    read_trace,
)

CAP = 500063
BPT = 131072


def test_article_workloads_are_the_articles() -> None:
    u, h = article_uniform(), article_heavy_tail()
    assert len(u) == len(h) == 4000
    assert u.lengths[:5].tolist() == [991, 972, 3369, 2301, 2627]
    assert h.lengths[:5].tolist() == [975, 882, 994, 340, 829]
    assert int(u.lengths.sum()) == 9239561
    assert u.lengths.min() >= 512 and u.lengths.max() <= 4096
    assert int((h.lengths >= 3072).sum()) == 800
    assert article_ledgers()[0].token_capacity == CAP


@pytest.mark.parametrize(
    ("make", "cont", "pag", "gain", "uc", "up", "cont_gib", "pag_gib"),
    [(article_uniform, 122, 214, "1.75", "56.59%", "99.70%", ("61.00", "34.52"), ("60.85", "60.67")),
     (article_heavy_tail, 122, 405, "3.32", "30.11%", "99.40%", ("61.00", "18.37"), ("60.79", "60.42"))],
)
def test_contiguous_vs_paged_exact(make, cont, pag, gain, uc, up, cont_gib, pag_gib) -> None:  # type: ignore[no-untyped-def]
    wl = make()
    c = contiguous(wl, CAP, 4096, BPT)
    p = paged(wl, CAP, 16, BPT)
    assert (c.admitted, p.admitted) == (cont, pag)
    assert f"{p.gain_over(c):.2f}" == gain
    assert (f"{c.utilization:.2%}", f"{p.utilization:.2%}") == (uc, up)
    assert (f"{c.reserved_bytes / GIB:.2f}", f"{c.used_bytes / GIB:.2f}") == cont_gib
    assert (f"{p.reserved_bytes / GIB:.2f}", f"{p.used_bytes / GIB:.2f}") == pag_gib
    # the pool's greedy admission equals the closed form: the longest prefix that fits
    blocks = np.cumsum((wl.lengths + 15) // 16)
    assert p.admitted == int(np.searchsorted(blocks, CAP // 16, side="right"))
    assert p.stored_tokens == p.logical_tokens == int(wl.lengths[: p.admitted].sum())
    assert p.table_entries == int(blocks[p.admitted - 1])
    assert c.table_entries == c.admitted


def test_waste_decomposition_exact() -> None:
    w = waste_decomposition(article_uniform(), 4096, 16, BPT)
    assert f"{w.reservation_waste_bytes / MIB:.2f}" == "223.26"
    assert f"{w.last_block_waste_bytes / MIB:.2f}" == "0.93"
    assert f"{w.ratio:.0f}" == "239"
    lens = article_uniform().lengths
    assert w.reservation_waste_tokens == float((4096 - lens).mean())
    assert w.last_block_waste_tokens == float(((lens + 15) // 16 * 16 - lens).mean())


# The article's block-size table (paged_alloc.py section C) as it prints it:
# block size, empty slots per request (.1f), utilization (.3%), table entries (.1f).
ARTICLE_BLOCK_TABLE = [
    (1, "0.0", "100.000%", "2309.9"), (4, "1.5", "99.936%", "577.8"),
    (8, "3.5", "99.850%", "289.2"), (16, "7.5", "99.677%", "144.8"),
    (32, "15.5", "99.335%", "72.7"), (64, "31.3", "98.664%", "36.6"),
    (128, "63.5", "97.326%", "18.5"), (256, "127.7", "94.762%", "9.5"),
]


def test_block_size_table_exact() -> None:
    wl = article_uniform()
    rows = block_size_sweep(wl, [b for b, *_ in ARTICLE_BLOCK_TABLE], CAP)
    got = [(r.block_size, f"{r.empty_slots_per_request:.1f}", f"{r.utilization:.3%}",
            f"{r.table_entries_per_request:.1f}") for r in rows]
    assert got == ARTICLE_BLOCK_TABLE
    # the article's definition, evaluated directly on the lengths (no pool)
    lens = wl.lengths
    for b, empty, util, entries in ARTICLE_BLOCK_TABLE:
        frag = ((-(-lens // b)) * b - lens).mean()
        assert f"{frag:.1f}" == empty
        assert f"{lens.mean() / (lens.mean() + frag):.3%}" == util
        assert f"{(-(-lens // b)).mean():.1f}" == entries
    by = {r.block_size: r for r in rows}
    assert (f"{by[16].empty_over_length:.2%}", f"{by[32].empty_over_length:.2%}") == ("0.32%", "0.67%")
    assert by[16].admitted == 214
    assert [r.admitted for r in rows] == sorted((r.admitted for r in rows), reverse=True)
    for r in rows:  # (b-1)/2 expectation, uniform remainders
        assert abs(r.empty_slots_per_request - (r.block_size - 1) / 2) < 0.6


def test_shared_prefix_aligned() -> None:
    wl = article_heavy_tail()
    p = paged(wl, CAP, 16, BPT)
    s = paged_shared_prefix(wl, CAP, 256, 16, BPT)
    assert s.admitted > p.admitted
    assert s.shared_blocks == 16  # the 256-token prefix: 16 full blocks shared by all
    k = s.admitted
    assert s.stored_tokens == 256 + int((wl.lengths[:k] - 256).sum())
    assert s.logical_tokens == int(wl.lengths[:k].sum())
    assert s.logical_per_reserved > 1.0


def test_shared_prefix_unaligned_copies_last_block() -> None:
    wl = Workload.from_lengths([300, 280, 260, 400])
    s = paged_shared_prefix(wl, 10_000, 250, 16)
    # each child copies the 10 filled slots of the shared partial block (copy-on-write)
    assert s.admitted == 4
    assert s.stored_tokens == 250 + int((wl.lengths - 250).sum()) + 4 * (250 % 16)


def test_sweep_errors() -> None:
    wl = Workload.from_lengths([10, 5000])
    with pytest.raises(pykvpool.InvalidArgumentError, match="exceeds max_len"):
        contiguous(wl, CAP, 4096)
    assert contiguous(wl.clipped(4096), CAP, 4096).admitted == 1
    assert wl.clipped(4096).dropped == 1
    with pytest.raises(pykvpool.InvalidArgumentError):
        paged(wl, 8, 16)
    with pytest.raises(pykvpool.InvalidArgumentError):
        paged(wl, CAP, 0)
    with pytest.raises(pykvpool.InvalidArgumentError):
        paged_shared_prefix(wl, CAP, 11)
    with pytest.raises(pykvpool.InvalidArgumentError):
        block_size_sweep(wl, [])
    with pytest.raises(pykvpool.InvalidArgumentError):
        waste_decomposition(wl, 4096)
    with pytest.raises(pykvpool.InvalidArgumentError):
        Workload.from_lengths([])
    with pytest.raises(pykvpool.InvalidArgumentError):
        Workload.from_lengths([3, 0])
    with pytest.raises(pykvpool.InvalidArgumentError):
        Workload.from_lengths([1.5])
    with pytest.raises(pykvpool.InvalidArgumentError):
        Workload.from_lengths([[1, 2]])
    with pytest.raises(pykvpool.InvalidArgumentError):
        wl.clipped(5)


def test_nothing_admitted_when_first_request_too_long() -> None:
    wl = Workload.from_lengths([100, 1])
    assert paged(wl, 64, 16).admitted == 0  # greedy in order: stops at the first miss


def test_azure_traces_shipped_in_package() -> None:
    code = azure_trace_path("code")
    assert Path(pykvpool.__file__).parent in code.parents
    assert (code.parent / "LICENSE").is_file() and (code.parent / "README.md").is_file()
    c, v = azure_trace("code"), azure_trace("conv")
    assert (len(c), len(v)) == (8819, 19366)
    assert c.prompt_lengths is not None
    assert round(float(c.prompt_lengths.mean())) == 2048
    assert int(c.lengths.max()) == 7841
    assert v.clipped(8192).dropped == 1
    assert "Splitwise" in c.source
    with pytest.raises(UnknownPresetError):
        azure_trace("chat")
    r = paged(v.clipped(8192), CAP, 16, BPT)
    assert r.admitted > contiguous(v.clipped(8192), CAP, 8192, BPT).admitted


@pytest.mark.parametrize(
    ("text", "line", "msg"),
    [("TIMESTAMP,ContextTokens,GeneratedTokens\nt,10,5\nt,abc,5\n", 3, "not an integer"),
     ("TIMESTAMP,ContextTokens,GeneratedTokens\nt,10,5\nt,10\n", 3, "expected 3 fields"),
     ("TIMESTAMP,ContextTokens,GeneratedTokens\nt,-1,5\n", 2, "negative"),
     ("TIMESTAMP,ContextTokens,GeneratedTokens\nt,0,0\n", 2, "0 tokens"),
     ("TIMESTAMP,ContextTokens\nt,10\n", 1, "GeneratedTokens"),
     ("TIMESTAMP,ContextTokens,GeneratedTokens\n", 0, "no request"),
     ("", 0, "no request"),
     ("# lengths\n12\n\n7x\n", 4, "not an integer"),
     ("12\n0\n", 2, "length 0")],
)
def test_malformed_traces(tmp_path: Path, text: str, line: int, msg: str) -> None:
    f = tmp_path / "t.csv"
    f.write_text(text)
    with pytest.raises(TraceFormatError, match=msg) as e:
        read_trace(f)
    assert e.value.line == line
    assert isinstance(e.value, ValueError)
    if line:
        assert f"t.csv:{line}:" in str(e.value)


def test_plain_lengths_file(tmp_path: Path) -> None:
    f = tmp_path / "lens.txt"
    f.write_text("# one per line\n100\n  200  # comment\n\n300\n")
    wl = read_trace(f)
    assert wl.lengths.tolist() == [100, 200, 300]
    assert paged(wl, 1024, 16).admitted == 3
