"""The summary's units (:mod:`pykvpool.simulate.metrics`): one table names the unit of every
key a run's summary holds, and the text made from it shows a unit beside every value."""

from __future__ import annotations

import re

import numpy as np
import pytest

import pykvpool
from pykvpool import simulate as sim
from pykvpool.simulate.metrics import LATENCY_STATS, METRIC_GROUPS, metric, summary_lines

ROOF = sim.roofline("llama-3-8b", "a100-80gb-sxm")


def summaries() -> list[dict[str, object]]:
    """Summaries of runs that fill every kind of key: plain, prefix caching, swap, layer
    groups, an early stop, disaggregation, and an empty workload (None statistics)."""
    w = sim.synthetic_workload(60, rate=20.0, seed=2, shared_prefixes=(2, 256, 100))
    runs = [
        sim.SimConfig(num_blocks=2000),
        sim.SimConfig(num_blocks=2000, prefix_caching=True),
        sim.SimConfig(num_blocks=300, scheduler=sim.SchedulerConfig(preemption="swap", host_blocks=200)),
        sim.SimConfig(num_blocks=2000, groups=(("full",), ("sliding", 128))),
        sim.SimConfig(num_blocks=2000, stop_when=sim.StopWhen(ttft_p99=1e-6)),
        sim.SimConfig(num_blocks=2000, disaggregation=sim.Disaggregation(decode_replicas=1, bandwidth=25e9,
                                                                         bytes_per_token=131072)),
    ]
    out = [sim.run(w, cfg, ROOF).summary for cfg in runs]
    empty = sim.Workload(arrival=np.zeros(0), prompt_len=np.zeros(0, np.int64), output_len=np.zeros(0, np.int64))
    return out + [sim.run(empty, sim.SimConfig(num_blocks=10), ROOF).summary]


def test_every_summary_key_has_a_unit_and_a_group() -> None:
    for s in summaries():
        for key in s:
            m = metric(key)
            assert m.unit and m.group in METRIC_GROUPS, key
        assert "other" not in summary_lines(s)


def test_every_printed_value_carries_its_unit() -> None:
    s = summaries()[2]  # swap: preemptions, swaps and recomputes are counted
    lines = summary_lines(s, block_bytes=16 * 131072)
    for key, value in s.items():
        if re.fullmatch(r"(ttft|tpot|e2e|queueing|kv_transfer|decode_wait)_(mean|p\d+|max)", key):
            continue
        if metric(key).group == "transfer":
            assert not any(ln.startswith(f"  {key} ") for ln in lines), "no KV moved: no transfer lines"
            continue
        (line,) = [ln for ln in lines if ln.startswith(f"  {key} ")]
        text, unit = line.split(None, 2)[1:]
        assert unit.strip(), line
        if isinstance(value, int) and not isinstance(value, bool):
            assert int(text.replace(",", "")) == value
    # the latencies: one table, TTFT in seconds, TPOT in milliseconds
    (head,) = [ln for ln in lines if ln.startswith("latency")]
    assert head.split()[-len(LATENCY_STATS):] == list(LATENCY_STATS)
    rows = {ln.split()[0]: ln.split() for ln in lines if re.match(r"  (ttft|tpot|e2e|queueing) \(", ln)}
    assert rows["ttft"][1] == "(s)" and rows["tpot"][1] == "(ms)"
    assert float(rows["ttft"][5]) == pytest.approx(s["ttft_p99"], abs=5e-4)
    assert float(rows["tpot"][5]) == pytest.approx(s["tpot_p99"] * 1e3, abs=0.05)
    peak = next(ln for ln in lines if ln.startswith("  peak_blocks_used "))
    gib = s["peak_blocks_used"] * 16 * 131072 / 2**30
    assert peak.endswith(f"blocks = {gib:,.2f} GiB")
    pct = next(ln for ln in lines if ln.startswith("  mean_utilization "))
    assert f"{s['mean_utilization'] * 100:.1f} %" in pct


def test_a_disaggregated_run_prints_its_transfers() -> None:
    s = summaries()[5]
    lines = summary_lines(s)
    assert "transfer" in lines and any(ln.startswith("  kv_transfers ") for ln in lines)
    gb = next(ln for ln in lines if ln.startswith("  kv_transfer_bytes "))
    assert f"{s['kv_transfer_bytes'] * 1e-9:,.3f} GB moved" in gb
    row = next(ln for ln in lines if ln.startswith("  kv_transfer (s)"))
    assert float(row.split()[-2]) == pytest.approx(s["kv_transfer_p99"], abs=5e-4)
    assert any(ln.startswith("  decode_wait (s)") for ln in lines)
    assert not any(ln.startswith("  kv_transfer (s)") for ln in summary_lines(summaries()[0]))


def test_statistics_over_no_request_print_a_dash() -> None:
    lines = summary_lines(summaries()[-1])
    ttft = next(ln for ln in lines if ln.startswith("  ttft (s)"))
    assert ttft.split()[2:] == ["-"] * len(LATENCY_STATS)


def test_an_unknown_key_is_named() -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match="'warp_factor'"):
        metric("warp_factor")
    assert summary_lines({"warp_factor": 9})[-2:] == ["other", "  warp_factor            9"]
