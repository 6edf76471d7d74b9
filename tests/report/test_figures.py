"""Figures: valid PNG files, readable (no overlapping labels), and the data each figure
returns matches what it was given; the report's one budget and its simulator section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from figcheck import assert_png
from pykvpool.report.article import article_ledgers
from pykvpool.report.figures import (
    fig_block_size_and_traces,
    fig_memory_ledger,
    fig_paging,
    fig_roofline,
    fig_video,
    paging_demo,
)
from pykvpool.planning.hardware import Hardware, hardware_preset
from pykvpool.planning.ledger import GIB, default_budget
from pykvpool.planning.roofline import (
    PREFILL_SHAPES,
    REPORT_PREFILL_SHAPES,
    KernelPoint,
    PrefillPoint,
    PrefillShape,
    decode_intensity,
)
from pykvpool.planning.sweeps import block_size_sweep, contiguous, paged, paged_shared_prefix
from pykvpool.planning.video import article_videos
from pykvpool.planning.workloads import Workload, article_heavy_tail, article_uniform

CAP, BPT = 500063, 131072


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
    # The label on top of a bar is the bar's whole height: weights + KV + reserve.
    assert d["bar_label_gib"] == [d["weights_gib"] + k + d["reserve_gib"] for k in d["kv_gib"]]
    assert f"{d['bar_label_gib'][d['batches'].index(64)]:.1f}" == "83.0"
    assert d["overlapping_labels"] == [] and d["collisions"] == []


def _kernel(g: int, seconds: float, roof: float = float("nan")) -> KernelPoint:
    return KernelPoint(g, 8, 2048, 2, 128, 4.0 * 2 * g * 128 * 2048 * 8,
                       2.0 * 2 * 128 * 2048 * 8 * 4, seconds, roof)


def test_roofline_figure_with_synthetic_measurements(tmp_path: Path) -> None:
    machine = Hardware("this machine (CPU)", 16 * GIB, 20e9, {"fp32": 400e9}, "measured (synthetic)")
    kernel = [_kernel(g, 5e-3) for g in (1, 4, 8)]
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
        assert k["flops_per_s"] == kp.flops / 5e-3
        assert k["roof_flops"] == min(400e9, kp.intensity * 20e9)
        assert k["share_of_roof"] == pytest.approx(kp.bytes_per_s / 20e9)
        assert k["above_roof"] is False  # 6.7 GB/s under a 20 GB/s roof
    acc = {pt["label"]: pt for pt in d["accelerator_points"]}
    assert acc["decode g=1"]["bound_flops"] == 2.039e12
    assert acc["prefill"]["bound_flops"] == 312e12
    # Each title states the unit of its own axis.
    assert "GFLOP/s" in d["titles"][0] and "GFLOP/s" in d["ylabels"][0]
    assert "TFLOP/s" not in d["titles"][0]
    assert "TFLOP/s" in d["titles"][1] and "TFLOP/s" in d["ylabels"][1]
    assert d["overlapping_labels"] == [] and d["collisions"] == []


def test_roofline_flags_a_kernel_above_its_measured_roof(tmp_path: Path) -> None:
    machine = Hardware("this machine (CPU)", 16 * GIB, 20e9, {"fp32": 400e9}, "measured (synthetic)")
    # 33.5 MB per call in 1 ms: 33.5 GB/s, above a 20 GB/s roof; in 4 ms: 8.4 GB/s, below.
    d = fig_roofline(tmp_path / "f.png", hardware_preset("a100-80gb-sxm"), [("decode g=1", 1.0)],
                     machine, [_kernel(1, 1e-3), _kernel(4, 4e-3)])
    assert [k["above_roof"] for k in d["kernel"]] == [True, False]
    assert d["kernel"][0]["share_of_roof"] == pytest.approx(33.55e6 / 1e-3 / 20e9, rel=1e-2)
    assert d["overlapping_labels"] == [] and d["collisions"] == []


def test_roofline_figure_without_machine(tmp_path: Path) -> None:
    p = tmp_path / "f2b.png"
    d = fig_roofline(p, hardware_preset("h100-sxm"), [("decode g=4", 4.0)], None, None, "no kernel")
    assert_png(p)
    assert d["machine"] is None and d["kernel"] == []


def test_overlap_detector_sees_overlapping_labels() -> None:
    from pykvpool.plotting import new_figure
    from pykvpool.report.figures import overlapping_labels

    fig = new_figure((4, 3))
    ax = fig.subplots()
    ax.text(0.5, 0.5, "first label", transform=ax.transAxes)
    ax.text(0.52, 0.5, "second label", transform=ax.transAxes)
    ax.text(0.1, 0.1, "far away", transform=ax.transAxes)
    assert overlapping_labels(fig) == [("first label", "second label")]


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
    assert d["overlapping_labels"] == [] and d["collisions"] == []  # block labels, seq labels and pool indices are apart


def test_video_figure(tmp_path: Path) -> None:
    p = tmp_path / "f4.png"
    d = fig_video(p, article_videos(), BPT, 80.0, 61.04)
    assert_png(p)
    assert [f"{v:.2f}" for v in d["kv_gib"]] == ["52.73", "105.47", "316.41"]
    assert d["mask"].shape == (60, 60) and not d["mask"][0, -1] and d["mask"][-1, 0]
    assert d["overlapping_labels"] == [] and d["collisions"] == []


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
    assert d["overlapping_labels"] == [] and d["collisions"] == []


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
    from pykvpool.planning.roofline import measure_decode_kernel

    calls: list[tuple[str, object]] = []
    probes = iter([3e9, 7e9, 5e9, 2e9, 4e9, 6e9])

    def decode(cache: _FakeCache, *args: object) -> np.ndarray:
        calls.append(("kernel", cache))
        return _fake_decode(cache, *args)  # type: ignore[arg-type]

    def read_bandwidth(nbytes: object = None, threads: object = None, *, cache: object = None,
                       passes: object = None) -> float:
        calls.append(("probe", cache))
        assert nbytes is None and passes == 2
        return next(probes)

    monkeypatch.setattr(_native, "KvCache", _FakeCache, raising=False)
    monkeypatch.setattr(_native, "decode_attention", decode, raising=False)
    monkeypatch.setattr(_native, "read_bandwidth", read_bandwidth, raising=False)
    monkeypatch.setattr(_native, "peak_flops", lambda threads=None: 1e10, raising=False)
    pts = measure_decode_kernel(groups=(1, 4), batch=2, seq_len=40, num_kv_heads=2,
                                head_dim=8, block_size=16, repeats=3)
    assert [p.group_size for p in pts] == [1, 4]
    # The roof of each point is its own cache's bandwidth, probed right after each timed
    # call (a warm-up call first), best of the probes.
    cache = calls[0][1]
    assert isinstance(cache, _FakeCache) and all(c is cache for _, c in calls)
    per_g = ["kernel"] + ["kernel", "probe"] * 3
    assert [kind for kind, _ in calls] == per_g * 2
    assert [p.roof_bandwidth for p in pts] == [7e9, 6e9]
    for p in pts:
        assert p.flops == 4.0 * p.group_size * 2 * 8 * 40 * 2
        kv_bytes = 2.0 * 2 * 8 * 40 * 2 * 4  # K and V, f32, read once
        q_and_out = 2.0 * 2 * (2 * p.group_size) * 8 * 4
        assert p.bytes_moved == kv_bytes + q_and_out
        assert p.intensity == p.flops / (kv_bytes + q_and_out)
        assert p.seconds > 0 and p.bytes_per_s > 0
        assert p.fraction_of_roof == p.bytes_per_s / p.roof_bandwidth


def test_measure_decode_kernel_names_a_bad_size() -> None:
    from pykvpool import InvalidArgumentError
    from pykvpool.planning.roofline import measure_decode_kernel

    with pytest.raises(InvalidArgumentError, match="bandwidth_passes"):
        measure_decode_kernel(bandwidth_passes=0)
    with pytest.raises(InvalidArgumentError, match="groups"):
        measure_decode_kernel(groups=())


def _mask_pairs(sh: PrefillShape) -> int:
    """Visible (query, key) pairs of one sequence and head, from the explicit mask."""
    pos = np.arange(sh.cached_tokens, sh.seq_len)[:, None]
    keys = np.arange(sh.seq_len)[None, :]
    c = sh.chunk_size
    visible = keys <= pos if c is None else keys // c <= pos // c
    return int(visible.sum())


@pytest.mark.parametrize("sh", [
    PrefillShape("causal", 2, 37, 11, 4, 2, 8),
    PrefillShape("no cache", 1, 0, 9, 2, 2, 8),
    PrefillShape("chunks", 1, 30, 20, 3, 1, 8, chunk_size=7),
    PrefillShape("frame", 1, 12, 6, 2, 2, 8, chunk_size=6),
])
def test_prefill_shape_counts_the_mask_exactly(sh: PrefillShape) -> None:
    assert sh.visible_pairs() == _mask_pairs(sh)
    assert sh.flops() == 4.0 * sh.head_dim * _mask_pairs(sh) * sh.num_q_heads * sh.batch
    kv = 2.0 * sh.num_kv_heads * sh.head_dim * sh.seq_len * sh.batch * 4
    q_and_out = 2.0 * sh.batch * sh.new_tokens * sh.num_q_heads * sh.head_dim * 4
    assert sh.bytes_moved() == kv + q_and_out
    assert sh.intensity() == sh.flops() / (kv + q_and_out)


def test_prefill_shapes_sit_right_of_every_ridge() -> None:
    from pykvpool.planning.hardware import HARDWARE

    # The prefill shapes at full size: the same intensity in the report's smaller runs.
    text, video = PREFILL_SHAPES
    assert (text.batch, text.cached_tokens, text.new_tokens, text.num_q_heads) == (8, 4096, 512, 32)
    assert (video.cached_tokens, video.new_tokens, video.chunk_size) == (6240, 1560, 1560)
    assert text.visible_pairs() == 512 * 4096 + 512 * 513 // 2
    assert video.visible_pairs() == 1560 * 7800  # the frame sees every key
    for full, small in zip(PREFILL_SHAPES, REPORT_PREFILL_SHAPES):
        assert small.flops() < full.flops()
        assert small.intensity() == pytest.approx(full.intensity(), rel=1e-12)
        assert (small.seq_len, small.chunk_size) == (full.seq_len, full.chunk_size)
        ridges = [hw.ridge_point(d) for hw in HARDWARE.values() for d in ("fp32", "bf16")]
        assert full.intensity() > 2 * max(ridges)  # compute-bound on every preset roof


def test_measure_prefill_kernel_against_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    from pykvpool import _native
    from pykvpool.planning.roofline import measure_prefill_kernel

    real = _native.prefill_attention
    calls: list[tuple[object, dict[str, object]]] = []
    outs: list[np.ndarray] = []

    def prefill(cache: object, *args: object, **kw: object) -> np.ndarray:
        calls.append((cache, kw))
        out = real(cache, *args, **kw)  # type: ignore[arg-type]
        outs.append(np.asarray(out))
        return out  # type: ignore[no-any-return]

    monkeypatch.setattr(_native, "prefill_attention", prefill)
    shapes = [PrefillShape("tiny text", 2, 21, 5, 4, 2, 8),
              PrefillShape("tiny video", 1, 12, 6, 2, 2, 8, chunk_size=6)]
    seen: list[tuple[int, int]] = []
    pts = measure_prefill_kernel(shapes, block_size=4, repeats=3, progress=lambda i, n: seen.append((i, n)))
    assert seen == [(1, 2), (2, 2)]
    assert [p.shape for p in pts] == shapes
    # One warm-up call and 3 timed calls per shape, each shape on its own cache, its mask.
    assert len(calls) == 8
    assert calls[0][0] is calls[3][0] and calls[4][0] is calls[7][0] and calls[0][0] is not calls[4][0]
    assert [kw["chunk_size"] for _, kw in calls] == [None] * 4 + [6] * 4
    assert all(kw["causal"] is True for _, kw in calls)
    assert outs[0].shape == (10, 4, 8) and outs[4].shape == (6, 2, 8)
    assert all(np.isfinite(o).all() and np.abs(o).max() > 0 for o in outs)
    for p, sh in zip(pts, shapes):
        assert p.flops == 4.0 * sh.head_dim * _mask_pairs(sh) * sh.num_q_heads * sh.batch
        assert p.bytes_moved == sh.bytes_moved()
        assert p.intensity == p.flops / p.bytes_moved
        assert p.seconds > 0 and p.flops_per_s == p.flops / p.seconds


def test_measure_prefill_kernel_names_a_bad_size() -> None:
    from pykvpool import InvalidArgumentError
    from pykvpool.planning.roofline import measure_prefill_kernel

    with pytest.raises(InvalidArgumentError, match="repeats"):
        measure_prefill_kernel(repeats=0)
    with pytest.raises(InvalidArgumentError, match="shapes"):
        measure_prefill_kernel(shapes=())
    with pytest.raises(InvalidArgumentError, match="new_tokens"):
        measure_prefill_kernel(shapes=[PrefillShape("x", 1, 4, 0, 2, 2, 8)])
    with pytest.raises(InvalidArgumentError, match="chunk_size"):
        PrefillShape("x", 1, 4, 2, 2, 2, 8, chunk_size=0).flops()
    with pytest.raises(InvalidArgumentError, match="num_q_heads"):
        PrefillShape("x", 1, 4, 2, 3, 2, 8).intensity()


def test_roofline_figure_plots_prefill_points(tmp_path: Path) -> None:
    machine = Hardware("this machine (CPU)", 16 * GIB, 20e9, {"fp32": 400e9}, "measured (synthetic)")
    text, video = PREFILL_SHAPES
    pre = [PrefillPoint(text, text.flops(), text.bytes_moved(), text.flops() / 200e9),
           PrefillPoint(video, video.flops(), video.bytes_moved(), video.flops() / 500e9)]
    p = tmp_path / "f2p.png"
    d = fig_roofline(p, hardware_preset("a100-80gb-sxm"), [("decode g=1", 1.0)], machine,
                     [_kernel(1, 5e-3)], prefill=pre)
    assert_png(p)
    assert [pt["name"] for pt in d["prefill"]] == ["text prefill", "video chunk"]
    for pt, pp in zip(d["prefill"], pre):
        assert pt["intensity"] == pp.intensity > 400e9 / 20e9  # right of the ridge
        assert pt["compute_bound"] is True and pt["roof_flops"] == 400e9
        assert pt["flops_per_s"] == pytest.approx(pp.flops_per_s)
    assert d["prefill"][0]["share_of_roof"] == pytest.approx(0.5)
    assert [pt["above_roof"] for pt in d["prefill"]] == [False, True]  # 500 over a 400 roof
    assert d["overlapping_labels"] == [] and d["collisions"] == []
    # Without a machine there is no roof to put them on: no points.
    d = fig_roofline(tmp_path / "n.png", hardware_preset("h100-sxm"), [("decode g=4", 4.0)],
                     None, None, "no kernel", prefill=pre)
    assert d["prefill"] == []


# ---- simulator figures ------------------------------------------------------------------


def _sim_runs() -> dict[str, Any]:
    from pykvpool import simulate as sim

    w = sim.synthetic_workload(300, rate=40.0, prompt=("uniform", [100, 900]),
                               output=("uniform", [20, 200]), seed=4)
    roof = sim.roofline("llama-3-8b", "a100-80gb-sxm")
    pols = {"paged": sim.SchedulerConfig(allocation="paged", max_running=16),
            "reserve": sim.SchedulerConfig(allocation="reserve", reserve_tokens=1200, max_running=16),
            "oracle": sim.SchedulerConfig(allocation="oracle", max_running=16)}
    return {k: sim.run(w, sim.SimConfig(num_blocks=3000, scheduler=v), roof) for k, v in pols.items()}


def test_utilization_figure_shows_occupancy_and_token_utilization(tmp_path: Path) -> None:
    from pykvpool.simulate import plots as sim_plots

    r = _sim_runs()["paged"]
    p = tmp_path / "f6.png"
    d = sim_plots.utilization_over_time(r, p, num_blocks=3000, block_size=16)
    assert_png(p)
    held = r.steps["blocks_used"] + r.steps["blocks_reserved"]
    np.testing.assert_allclose(d["occupancy"], held / 3000)
    used = r.steps["blocks_used"] > 0
    np.testing.assert_allclose(d["token_utilization"][used],
                               r.steps["kv_tokens"][used] / (16.0 * r.steps["blocks_used"][used]))
    assert 0 < d["occupancy"].max() < 1 and d["token_utilization"].min() > 0.5
    fig = sim_plots.plot_utilization(d, num_blocks=3000)
    _, labels = fig.axes[0].get_legend_handles_labels()
    assert labels[0].startswith("blocks holding KV") and f"peak {int(held.max()):,}" in labels[0]
    assert labels[1].startswith("tokens stored, in blocks' worth")
    assert labels[2] == f"pool: 3,000 blocks (peak held {held.max() / 3000:.1%})"


def test_oracle_stays_visible_over_paged(tmp_path: Path) -> None:
    from pykvpool.simulate import plots as sim_plots

    runs = _sim_runs()
    rows = [{"rate": rate, "label": k, **r.summary} for rate in (1.0, 2.0) for k, r in runs.items()]
    data = sim_plots.throughput_vs_rate(rows, tmp_path / "f7.png")
    assert_png(tmp_path / "f7.png")
    fig = sim_plots.plot_throughput_vs_rate(data)
    for ax in fig.axes:
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        paged, oracle = lines["paged"], lines["oracle"]
        assert (paged.get_linestyle(), paged.get_marker()) != (oracle.get_linestyle(), oracle.get_marker())
        assert oracle.get_zorder() > paged.get_zorder()  # drawn on top when the curves coincide
        assert oracle.get_markerfacecolor() == "none"  # hollow: paged's marker shows through
    styles = {(ln.get_linestyle(), ln.get_marker()) for ln in fig.axes[0].get_lines()}
    assert len(styles) == 3


def test_ttft_cdf_names_its_rate_and_uses_a_log_axis(tmp_path: Path) -> None:
    from pykvpool.simulate import plots as sim_plots

    runs = _sim_runs()
    title = "TTFT CDF at 40.00 req/s"
    data = sim_plots.latency_cdf(runs, "ttft", tmp_path / "f8.png", title=title)
    assert_png(tmp_path / "f8.png")
    fig = sim_plots.plot_latency_cdf(data, "ttft", title=title)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_title() == title
    assert [ln.get_label() for ln in ax.get_lines()] == list(runs)


def test_plotting_never_selects_a_backend_nor_imports_pyplot(tmp_path: Path) -> None:
    code = f"""
import sys, matplotlib
from pykvpool.simulate import plots as sim_plots
from pykvpool.report.article import article_ledgers
from pykvpool.report.figures import fig_memory_ledger
fig_memory_ledger({str(tmp_path / "f.png")!r}, *article_ledgers())
sim_plots.plot_throughput_vs_rate({{}}).savefig({str(tmp_path / "g.png")!r})
from pykvpool.prefix import replay as pr
trace = pr.load_mooncake_trace()[:20]
pr.plot_sweep(pr.sweep(trace, [pr.unbounded_capacity(trace) * pr.TRACE_BLOCK_SIZE], ("lru",)),
              {str(tmp_path / "h.png")!r})
assert "matplotlib.pyplot" not in sys.modules, "pyplot imported"
print(matplotlib.rcParams._get_backend_or_none())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"  # no backend chosen


# ---- the report: one budget ---------------------------------------------------------------


def test_presets_store_70b_weights_in_fp8_only_where_bf16_does_not_fit() -> None:
    from pykvpool.planning.models import model_preset
    from pykvpool.report.build import preset_ledger

    m = model_preset("llama-3-70b")
    a100 = default_budget(hardware_preset("a100-80gb-sxm"))
    led, weights = preset_ledger(m, a100, "bf16")
    assert "fp8" in weights and led.weight_bytes == m.num_params * 1.0
    assert led.token_capacity == int((a100.usable_bytes - m.num_params - a100.reserve_bytes)
                                     // m.kv_bytes_per_token("bf16"))
    led, weights = preset_ledger(m, default_budget(hardware_preset("h200")), "bf16")
    assert "fp8" not in weights and led.weight_bytes == m.weight_bytes
    led, weights = preset_ledger(model_preset("llama-3-8b"), a100, "bf16")
    assert "fp8" not in weights and f"{led.weight_bytes / GIB:.2f}" == "14.96"


def test_report_uses_one_budget_everywhere(tmp_path: Path) -> None:
    from pykvpool import simulate as sim
    from pykvpool.report.build import build_report

    res = build_report(tmp_path / "r", measure=False, progress=False)
    md = res.markdown.read_text()
    assert all(res.data[f"fig{i}"]["collisions"] == [] for i in range(1, 6))  # hide nothing
    a100 = hardware_preset("a100-80gb-sxm")
    budget = default_budget(a100)
    gqa, _ = article_ledgers()
    assert gqa.budget == budget
    assert md.count(budget.describe()) >= 2  # the header and section 6
    assert "90%" not in md and "weights exceed budget" not in md
    assert res.matched == res.reproduced == 35
    dyn = res.data["dynamic"]
    blocks = sim.kv_blocks_for_memory(model_preset_8b(), a100, 16, budget=budget)
    assert dyn["num_blocks"] == blocks == gqa.token_capacity // 16
    assert f"**{blocks:,} blocks of 16 tokens**" in md
    assert all(r["num_blocks"] == blocks for r in dyn["rows"])
    # Orca holds the model's context; the trace's one longer request is rejected (and said).
    assert dyn["reserve_tokens"] == 8192
    assert dyn["rejected"] == {"paged": 0, "reserve": 1, "oracle": 0}
    assert "1 request longer than that is rejected" in md
    assert dyn["peak_blocks_held"] < blocks
    assert dyn["oracle_vs_paged_max_rel_gap"] < 0.01 and "coincide with `paged`" in md
    assert "measurement skipped" in md
    assert res.data["windows"]["budget"] == budget.describe() and "## 7. Windows, sinks" in md
    assert "## 8. Video generation" in md and md.index("## 8.") < md.index("## Closing note")
    assert res.data["video_serving"]["budgets"]["a100-80gb-sxm"] == budget.describe()
    for name, f in res.figures.items():
        assert_png(f)


def model_preset_8b() -> Any:
    from pykvpool.planning.models import model_preset

    return model_preset("llama-3-8b")
