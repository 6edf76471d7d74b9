"""Figures: valid PNG files, and the data each figure returns matches what it was given."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from pykvpool.article import article_ledgers
from pykvpool.figures import (
    fig_block_size_and_traces,
    fig_memory_ledger,
    fig_paging,
    fig_roofline,
    fig_video,
    paging_demo,
)
from pykvpool.hardware import Hardware, hardware_preset
from pykvpool.ledger import GIB
from pykvpool.roofline import KernelPoint, decode_intensity
from pykvpool.sweeps import block_size_sweep, contiguous, paged, paged_shared_prefix
from pykvpool.video import article_videos
from pykvpool.workloads import Workload, article_heavy_tail, article_uniform

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CAP, BPT = 500063, 131072


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 400
    assert float(np.asarray(img).std()) > 0.01  # not a blank canvas


def test_memory_ledger_figure(tmp_path: Path) -> None:
    gqa, mha = article_ledgers()
    p = tmp_path / "f1.png"
    d = fig_memory_ledger(p, gqa, mha)
    assert_png(p)
    assert d["kv_gib"][d["batches"].index(32)] == 32.0
    assert f"{d['weights_gib']:.2f}" == "14.96"
    assert d["budget_gib"] == 80.0 and f"{d['kv_budget_gib']:.2f}" == "61.04"
    i = d["seq_lens"].index(8192)
    assert d["curves_gib"]["MHA batch 8"][i] == 4 * d["curves_gib"]["GQA batch 8"][i] == 32.0


def test_roofline_figure_with_synthetic_measurements(tmp_path: Path) -> None:
    machine = Hardware("this machine (CPU)", 16 * GIB, 20e9, {"fp32": 400e9}, "measured (synthetic)")
    kernel = [KernelPoint(g, 8, 2048, 2, 128, 4.0 * 2 * g * 128 * 2048 * 8,
                          2.0 * 2 * 128 * 2048 * 8 * 4, 1e-3) for g in (1, 4, 8)]
    ideal = [("decode g=1", decode_intensity(1, 2)), ("decode g=4", decode_intensity(4, 2)),
             ("prefill", 3973.9)]
    p = tmp_path / "f2.png"
    d = fig_roofline(p, hardware_preset("a100-80gb-sxm"), ideal, machine, kernel)
    assert_png(p)
    assert d["machine"]["bandwidth"] == 20e9 and d["machine"]["peak_flops"] == 400e9
    local = {pt["label"]: pt for pt in d["machine"]["points"]}
    assert local["decode g=4"]["intensity"] == 2.0  # fp32 halves the bf16 intensity
    assert local["decode g=4"]["bound_flops"] == 2.0 * 20e9
    assert local["prefill"]["bound_flops"] == 400e9
    assert [k["group_size"] for k in d["kernel"]] == [1, 4, 8]
    for k, kp in zip(d["kernel"], kernel):
        assert k["intensity"] == kp.intensity == pytest.approx(kp.group_size / 2, rel=1e-3)
        assert k["flops_per_s"] == kp.flops / 1e-3
    acc = {pt["label"]: pt for pt in d["accelerator_points"]}
    assert acc["decode g=1"]["bound_flops"] == 2.039e12
    assert acc["prefill"]["bound_flops"] == 312e12


def test_roofline_figure_without_machine(tmp_path: Path) -> None:
    p = tmp_path / "f2b.png"
    d = fig_roofline(p, hardware_preset("h100-sxm"), [("decode g=4", 4.0)], None, None, "no kernel")
    assert_png(p)
    assert d["machine"] is None and d["kernel"] == []


def test_paging_demo_is_a_live_pool_state() -> None:
    pic = paging_demo((37, 21, 45), 16)
    assert pic.seq_lens == [37, 21, 45, 42]
    assert [len(t) for t in pic.tables] == [3, 2, 3, 3]
    parent, child = pic.tables[0], pic.tables[3]
    assert parent[:2] == child[:2] and parent[2] != child[2]  # full blocks shared, last copied
    assert pic.shared_blocks == 2
    assert all(pic.refcounts[b] == 2 for b in parent[:2])
    assert sorted(parent[:2]) != list(range(parent[0], parent[0] + 2))  # interleaved in the pool
    assert sum(1 for r in pic.refcounts if r == 0) >= 3


def test_paging_figure_matches_sweeps(tmp_path: Path) -> None:
    comps = []
    for wl in (article_uniform(), article_heavy_tail()):
        comps.append([contiguous(wl, CAP, 4096, BPT), paged(wl, CAP, 16, BPT),
                      paged_shared_prefix(wl, CAP, 256, 16, BPT)])
    p = tmp_path / "f3.png"
    d = fig_paging(p, paging_demo(), comps)
    assert_png(p)
    assert d["admitted"] == [[c.admitted for c in comp] for comp in comps]
    assert d["admitted"][0][:2] == [122, 214] and d["admitted"][1][:2] == [122, 405]
    assert d["utilization"][1][0] == comps[1][0].utilization


def test_video_figure(tmp_path: Path) -> None:
    p = tmp_path / "f4.png"
    d = fig_video(p, article_videos(), BPT, 80.0, 61.04)
    assert_png(p)
    assert [f"{v:.2f}" for v in d["kv_gib"]] == ["52.73", "105.47", "316.41"]
    assert d["mask"].shape == (60, 60) and not d["mask"][0, -1] and d["mask"][-1, 0]


def test_block_size_and_trace_figure(tmp_path: Path) -> None:
    wl = article_uniform()
    rows = block_size_sweep(wl, (1, 16, 256), CAP)
    small = Workload.from_lengths(np.arange(1, 400), "ramp")
    traces = [[contiguous(small, 4096, 512), paged(small, 4096, 16)]]
    p = tmp_path / "f5.png"
    d = fig_block_size_and_traces(p, rows, wl.name, traces, [("ramp", small.lengths)])
    assert_png(p)
    assert d["block_sizes"] == [1, 16, 256]
    assert d["empty_slots_per_request"] == [r.empty_slots_per_request for r in rows]
    assert d["table_entries_per_request"] == [r.table_entries_per_request for r in rows]
    assert d["admitted"] == [[traces[0][0].admitted, traces[0][1].admitted]]


class _FakeCache:
    """Test double of ``pykvpool.KvCache`` that checks the contract's shapes and dtypes."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: str = "f32") -> None:
        assert dtype == "f32"
        self.k = np.zeros((num_layers, num_blocks * block_size, num_kv_heads, head_dim), np.float32)
        self.v = np.zeros_like(self.k)
        self.block_size = block_size

    def write(self, layer: int, k: np.ndarray, v: np.ndarray, slot_mapping: np.ndarray) -> None:
        assert k.dtype == v.dtype == np.float32 and k.shape == v.shape
        assert k.shape[1:] == self.k.shape[2:] and slot_mapping.shape == (k.shape[0],)
        self.k[layer, slot_mapping] = k
        self.v[layer, slot_mapping] = v


def _fake_decode(cache: _FakeCache, layer: int, q: np.ndarray, block_tables: np.ndarray,
                 seq_lens: np.ndarray) -> np.ndarray:
    assert q.dtype == np.float32 and q.ndim == 3
    assert block_tables.dtype == np.int32 and seq_lens.dtype == np.int32
    n, hq, d = q.shape
    hkv = cache.k.shape[2]
    out = np.empty_like(q)
    for i in range(n):
        t = np.arange(int(seq_lens[i]))
        slots = block_tables[i, t // cache.block_size] * cache.block_size + t % cache.block_size
        k, v = cache.k[layer, slots], cache.v[layer, slots]
        for h in range(hq):
            s = k[:, h // (hq // hkv)] @ q[i, h] / np.sqrt(d)
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[:, h // (hq // hkv)]
    return out


def test_measure_decode_kernel_against_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    from pykvpool import _native
    from pykvpool.roofline import measure_decode_kernel

    monkeypatch.setattr(_native, "KvCache", _FakeCache, raising=False)
    monkeypatch.setattr(_native, "decode_attention", _fake_decode, raising=False)
    monkeypatch.setattr(_native, "read_bandwidth", lambda nbytes=None, threads=None: 1e9,
                        raising=False)
    monkeypatch.setattr(_native, "peak_flops", lambda threads=None: 1e10, raising=False)
    pts = measure_decode_kernel(groups=(1, 4), batch=2, seq_len=40, num_kv_heads=2,
                                head_dim=8, block_size=16, repeats=1)
    assert [p.group_size for p in pts] == [1, 4]
    for p in pts:
        assert p.flops == 4.0 * p.group_size * 2 * 8 * 40 * 2
        kv_bytes = 2.0 * 2 * 8 * 40 * 2 * 4  # K and V, f32, read once
        q_and_out = 2.0 * 2 * (2 * p.group_size) * 8 * 4
        assert p.bytes_moved == kv_bytes + q_and_out
        assert p.intensity == p.flops / (kv_bytes + q_and_out)
        assert p.seconds > 0 and p.bytes_per_s > 0
