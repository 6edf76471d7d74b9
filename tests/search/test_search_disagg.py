"""Prefill/decode disaggregation as a search axis: ``SearchSpace(disaggregation=...)``,
``Point.disaggregation``, its deployment, its rows and the ``--pd`` flag.

The engine's rules are tested in ``tests/rust/sim_disagg.rs`` and
``tests/simulate/test_sim_disagg.py``; here what the search adds: which points a split
makes, what a point deploys, and that rows written before the field existed read back
as colocated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pykvpool
from pykvpool.planning.hardware import HARDWARE
from pykvpool import simulate as sim
from pykvpool.planning.models import model_preset
from pykvpool.search import SearchSpace, read_search
from pykvpool.search.evaluate import deploy
from pykvpool.search.folder import row_checker
from pykvpool.search.space import COLOCATED, Point, canonical_split, parse_split
from tests.search.test_search_cli import run as cli

LLAMA = model_preset("llama-3-8b")


@pytest.mark.parametrize("text,want", [("colocated", None), ("1:1", (1, 1, None)), ("1:3", (1, 3, None)),
                                       ("5:2", (5, 2, None)), ("1:2@h100", (1, 2, "h100-sxm")),
                                       ("3:1@A100", (3, 1, "a100-80gb-sxm"))])
def test_a_split_reads_as_its_ratio_and_decode_hardware(text: str, want: Any) -> None:
    assert parse_split(text) == want
    assert canonical_split(text) == ("colocated" if want is None else
                                     f"{want[0]}:{want[1]}" + (f"@{want[2]}" if want[2] else ""))


@pytest.mark.parametrize("text,match", [("2:2", "write '2:2' as '1:1'"), ("0:1", "prefill:decode ratios"),
                                        ("1:", "prefill:decode ratios"), ("a:b", "prefill:decode ratios"),
                                        ("1:2:3", "prefill:decode ratios"), ("", "prefill:decode ratios"),
                                        ("1:5000", "prefill:decode ratios"), ("-1:2", "prefill:decode ratios"),
                                        ("1:1@", "prefill:decode ratios"), ("1:1@tpu", "unknown hardware")])
def test_a_bad_split_is_refused_by_name(text: str, match: str) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match=match):
        SearchSpace(disaggregation=(text,))


def test_the_axis_checks_types_and_repeats() -> None:
    with pytest.raises(TypeError, match="disaggregation"):
        SearchSpace(disaggregation=(1,))  # type: ignore[arg-type]
    with pytest.raises(pykvpool.InvalidArgumentError, match="twice"):
        SearchSpace(disaggregation=("1:1", "1:1"))
    with pytest.raises(pykvpool.InvalidArgumentError, match="twice"):
        SearchSpace(disaggregation=("1:1@h100", "1:1@h100-sxm"))
    assert SearchSpace(disaggregation=("1:1@h100",)).disaggregation == ("1:1@h100-sxm",)


def test_a_split_applies_where_its_parts_divide_the_replicas() -> None:
    space = SearchSpace(devices=(1, 2, 3, 4, 6), tensor_parallel=(1, 2), disaggregation=(COLOCATED, "1:1", "1:2"))
    pts = space.points(LLAMA, prefix_workload=False)
    split = {(p.devices, p.tensor_parallel, p.disaggregation): (p.prefill_replicas, p.decode_replicas)
             for p in pts if p.disaggregation != COLOCATED}
    assert split == {(2, 1, "1:1"): (1, 1), (4, 1, "1:1"): (2, 2), (4, 2, "1:1"): (1, 1), (6, 1, "1:1"): (3, 3),
                     (6, 2, "1:2"): (1, 2), (3, 1, "1:2"): (1, 2), (6, 1, "1:2"): (2, 4)}
    colocated = [p for p in pts if p.disaggregation == COLOCATED]
    assert len(colocated) == 8 and all(p.decode_replicas == 0 and p.prefill_replicas == p.replicas for p in colocated)
    # A colocated key is the key it always was; a split one ends in its ratio, in its own chain.
    p = next(p for p in pts if (p.devices, p.disaggregation) == (4, "1:1") and p.tensor_parallel == 1)
    assert p.key() == "a100-80gb-sxm|x4:tp1|bf16|b16|r256|t8192|chunked|recompute|-|flat|pd1:1"
    assert p.chain_key().endswith("|flat|pd1:1")
    assert colocated[0].key() == "a100-80gb-sxm|x1:tp1|bf16|b16|r256|t8192|chunked|recompute|-|flat"


@pytest.mark.parametrize("hardware", sorted(HARDWARE))
def test_a_split_point_deploys_prefill_and_decode_instances_over_the_network(hardware: str) -> None:
    point = Point(hardware, 8, 2, "fp8", 16, 256, 8192, True, "recompute", False, "lru", False, "1:3")
    cfg, tm = deploy(point, LLAMA)
    d = cfg.disaggregation
    hw = HARDWARE[hardware]
    assert d is not None and (cfg.replicas, d.decode_replicas) == (1, 3)
    assert d.bandwidth == 2 * hw.network_bandwidth > 0 and d.latency == hw.network_latency > 0
    assert d.bytes_per_token == LLAMA.kv_bytes_per_token("fp8") and d.layers == LLAMA.num_layers
    assert d.decode_num_blocks == cfg.num_blocks
    colocated, _ = deploy(Point(hardware, 8, 2, "fp8", 16, 256, 8192, True, "recompute", False, "lru", False), LLAMA)
    assert colocated.disaggregation is None and colocated.replicas == 4 and colocated.num_blocks == cfg.num_blocks


def test_decode_instances_on_other_hardware_have_their_own_pool_roofline_and_cost() -> None:
    from pykvpool.search import Objective
    from pykvpool.search.evaluate import point_cost

    point = Point("h100-sxm", 4, 1, "bf16", 16, 256, 8192, True, "recompute", False, "lru", False, "1:3@a100")
    assert point.decode_hardware == "a100-80gb-sxm" and (point.prefill_replicas, point.decode_replicas) == (1, 3)
    cfg, tm = deploy(point, LLAMA)
    d = cfg.disaggregation
    assert d is not None and d.decode_time_model is not None
    assert d.decode_time_model.hardware.name == "A100-80GB SXM" and tm.hardware.name == "H100 SXM"
    a100, _ = deploy(Point("a100-80gb-sxm", 1, 1, "bf16", 16, 256, 8192, True, "recompute", False, "lru", False), LLAMA)
    assert d.decode_num_blocks == a100.num_blocks != cfg.num_blocks
    assert d.bandwidth == 25e9  # the slower side's adapter
    watts = Objective("per_watt")
    assert point_cost(watts, point) == pytest.approx(1 * 0.7 + 3 * 0.4)
    assert point_cost(Objective(), point) == 4
    # The run's decode steps are timed by the A100's roofline: faster H100 decode would differ.
    w = sim.synthetic_workload(40, rate=8.0, seed=1)
    own = sim.run(w, cfg, tm)
    same = sim.run(w, cfg, tm, decode_time_model=tm)
    assert own.summary["tpot_p50"] > same.summary["tpot_p50"]


def _search(tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "s"
    r = cli("search", "--trace", "azure-conv", "--limit", "200", "--devices", "2,4", "--tp", "1",
            "--slo", "goodput:ttft=2,tpot=0.2", "--rates", "1,64,7", "--inline", "--out", str(out), *extra)
    assert r.returncode == 0, r.stderr
    return out


def test_the_cli_searches_splits_and_rows_read_back(tmp_path: Path) -> None:
    out = _search(tmp_path, "--pd", "colocated,1:1,1:3")
    rows = read_search(out).rows
    got = sorted((r["devices"], r["disaggregation"]) for r in rows)
    assert got == [(2, "1:1"), (2, COLOCATED), (4, "1:1"), (4, "1:3"), (4, COLOCATED)]
    for r in rows:
        assert r["status"] == "ok" and r["goodput_state"] in ("ok", "none"), r
    # A row written before the field existed reads back as colocated.
    check = row_checker(["goodput"])
    old = {k: v for k, v in next(r for r in rows if r["disaggregation"] == COLOCATED).items() if k != "disaggregation"}
    assert check(json.loads(json.dumps(old)))["disaggregation"] == COLOCATED
    split = next(r for r in rows if r["disaggregation"] == "1:1")
    with pytest.raises(pykvpool.InvalidArgumentError, match="key"):
        check({**split, "disaggregation": COLOCATED})


@pytest.mark.parametrize("value,match", [("1:1,1:1", "given twice"), ("2:4", "as '1:2'"), ("half", "P:D")])
def test_a_bad_pd_flag_is_one_line(value: str, match: str) -> None:
    r = cli("search", "--trace", "azure-conv", "--limit", "20", "--slo", "s:ttft_p99=1", "--pd", value)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[0].startswith("pykvpool: error: ") and match in lines[0], r.stderr


def test_the_reports_split_table_ranks_only_ranked_rows_and_skips_lower_bounds() -> None:
    from types import SimpleNamespace

    from pykvpool.report.search_section import _splits
    from pykvpool.search import SLO

    def row(devices: int, pd: str, rate: float, top: bool = False, flagged: bool = False) -> dict[str, Any]:
        return {"key": f"k{devices}{pd}{rate}", "devices": devices, "disaggregation": pd, "cost": devices,
                "s_state": "ok", "s_rate": rate, "s_rate_is_lower_bound": top, "s_superlinear": flagged}

    rows = [row(2, COLOCATED, 8.0), row(2, "1:1", 10.0), row(2, "1:1", 40.0, flagged=True),
            row(4, COLOCATED, 64.0, top=True), row(4, "3:1", 32.0), row(1, COLOCATED, 4.0)]
    text = _splits(SimpleNamespace(rows=rows, slos=(SLO("s", ttft_p99=1.0),)))  # type: ignore[arg-type]
    lines = [ln for ln in text.splitlines() if ln.startswith("| s |")]
    assert len(lines) == 2  # 1 device has no split
    assert lines[0].endswith("| 10 | 1.25 |") and "k21:140.0" not in lines[0]  # the flagged one is not ranked
    assert lines[1].endswith("| 32 | - |")  # the colocated rate is only a lower bound
    assert _splits(SimpleNamespace(rows=[row(1, COLOCATED, 4.0)], slos=())) == ""  # type: ignore[arg-type]
