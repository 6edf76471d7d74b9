"""``pykvpool simulate`` and the one trace reader: what ``sweep`` reads, ``simulate`` reads
(lengths files, Azure CSV, Mooncake JSONL, any CSV/JSONL with named columns), and the
allocations ``paged``, ``reserve`` (max-length reservation) and ``oracle``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pykvpool
from pykvpool.simulate import traces as sim_traces
from pykvpool import simulate as sim
from pykvpool.tracefile import (
    AZURE_COLUMNS,
    MAX_TOKENS,
    TraceColumns,
    named_trace_path,
    parse_columns,
    read_table,
)
from pykvpool.planning.workloads import azure_trace, read_trace

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True,
                          check=False, timeout=300, env=env, cwd=cwd)


def summary(stdout: str) -> dict[str, float | None]:
    """The summary printed by ``simulate`` in the summary's own units (seconds, fractions):
    ``key  value  unit`` lines and the latency table; a statistic over no request prints -."""
    def num(text: str, scale: float = 1.0) -> float | None:
        return None if text == "-" else float(text.replace(",", "")) / scale

    out = {m.group(1): num(m.group(2), 100.0 if m.group(3).startswith("%") else 1.0)
           for m in re.finditer(r"^  (\w+) +(-|[\d,.]+) (\S.*)$", stdout, re.M)}
    for m in re.finditer(r"^  (ttft|tpot|e2e|queueing) \((m?s)\) +(.*)$", stdout, re.M):
        for stat, text in zip(("mean", "p50", "p90", "p99", "max"), m.group(3).split()):
            out[f"{m.group(1)}_{stat}"] = num(text, 1e3 if m.group(2) == "ms" else 1.0)
    return out


# ---- one reader for sweep and simulate --------------------------------------------------


def test_azure_trace_reads_the_same_for_sweep_and_simulate() -> None:
    path = named_trace_path("azure-conv")
    sweep_wl = azure_trace("conv")
    sim_wl = sim_traces.load_azure(path)
    table = read_table(path)
    assert len(sweep_wl) == len(sim_wl) == len(table) == 19_366
    assert sweep_wl.prompt_lengths is not None
    np.testing.assert_array_equal(sweep_wl.lengths, table.lengths)
    # The simulator sorts by arrival (stable); the trace is already in time order.
    assert table.time is not None and np.all(np.diff(table.time) >= 0)
    np.testing.assert_array_equal(sim_wl.prompt_len, sweep_wl.prompt_lengths)
    np.testing.assert_array_equal(sim_wl.output_len, np.maximum(sweep_wl.lengths - sweep_wl.prompt_lengths, 1))


def test_named_traces_resolve_inside_the_package() -> None:
    pkg = Path(pykvpool.__file__).resolve().parent
    for name in ("azure-conv", "azure-code", "mooncake"):
        assert pkg / "data" in named_trace_path(name).resolve().parents
    with pytest.raises(pykvpool.UnknownPresetError):
        named_trace_path("azure-chat")


def test_lengths_file_splits_into_prompt_and_output(tmp_path: Path) -> None:
    f = tmp_path / "lens.txt"
    lengths = [1, 2, 100, 5000, 300, 129]
    f.write_text("# lengths\n" + "\n".join(map(str, lengths)) + "\n")
    w = sim_traces.load_file(f, rate=4.0, seed=3, output=(128, 384))
    assert len(w) == len(lengths)
    total = w.prompt_len + w.output_len
    # No times in the file: Poisson arrivals in file order, so the columns keep the order.
    assert w.arrival[0] == 0 and np.all(np.diff(w.arrival) > 0)
    np.testing.assert_array_equal(total[2:], lengths[2:])
    assert total[0] == 2 and total[1] == 2  # a length of 1 becomes prompt 1 + output 1
    assert np.all(w.prompt_len >= 1) and np.all(w.output_len >= 1)
    assert 128 <= w.output_len[3] <= 384 and w.output_len[2] == 99
    again = sim_traces.load_file(f, rate=4.0, seed=3, output=(128, 384))
    np.testing.assert_array_equal(again.output_len, w.output_len)


def test_columns_spec() -> None:
    c = parse_columns("prompt=ContextTokens,output=GeneratedTokens,time=TIMESTAMP")
    assert c == AZURE_COLUMNS
    c = parse_columns("prompt=in, output=out, time=t, priority=p, keys=ids, unit=ms")
    assert c == TraceColumns("in", "out", "t", "p", "ids", 1e-3)
    for bad, msg in [("prompt=a", "must name output"), ("prompt=a,output=b,unit=h", "unit"),
                     ("prompt=a,prompt=b,output=c", "twice"), ("prompt=a,output", "ROLE=NAME"),
                     ("prompt=a,output=b,size=c", "unknown role")]:
        with pytest.raises(pykvpool.InvalidArgumentError, match=msg):
            parse_columns(bad)


def test_csv_columns_and_times(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text('t_ms,"in",out,p\n2000,10,3,1\n0,20,1,0\n1000,30,2,2\n')
    t = read_table(f, parse_columns("prompt=in,output=out,time=t_ms,priority=p,unit=ms"))
    assert t.kind == "csv" and t.lines.tolist() == [2, 3, 4]
    np.testing.assert_allclose(t.time, [2.0, 0.0, 1.0])
    w = sim_traces.from_table(t)
    assert w.prompt_len.tolist() == [20, 30, 10] and w.priority is not None and w.priority.tolist() == [0, 2, 1]
    # The same file through the sweep's reader: lengths only, times ignored.
    assert read_trace(f, parse_columns("prompt=in,output=out")).lengths.tolist() == [13, 21, 32]
    # Without a time column a trace arrives at the given rate.
    w = sim_traces.load_file(f, parse_columns("prompt=in,output=out"), rate=100.0, seed=1)
    assert w.arrival[0] == 0 and w.arrival[-1] < 1.0 and w.prompt_len.tolist() == [10, 20, 30]


def test_limits_and_limit(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text(f"5\n{MAX_TOKENS}\n7\n")
    assert read_table(f, limit=2).lengths.tolist() == [5, MAX_TOKENS]
    f.write_text(f"5\n{MAX_TOKENS + 1}\n")
    with pytest.raises(pykvpool.TraceFormatError, match="t.txt:2: length") as e:
        read_table(f)
    assert e.value.line == 2
    with pytest.raises(pykvpool.InvalidArgumentError, match="limit"):
        read_table(f, limit=0)


# ---- the subcommand ---------------------------------------------------------------------


def test_simulate_reads_what_sweep_reads(tmp_path: Path) -> None:
    f = tmp_path / "lens.txt"
    f.write_text("\n".join(str(n) for n in range(100, 2100, 100)))
    s = cli("sweep", "--trace", str(f), "--quiet", "--block-sizes", "16")
    assert s.returncode == 0 and "20 requests" in s.stdout, s.stderr
    r = cli("simulate", "--trace", str(f), "--rate", "2")
    assert r.returncode == 0, r.stderr
    assert "20 requests" in r.stdout and summary(r.stdout)["finished"] == 20
    g = tmp_path / "my.csv"
    g.write_text("when,ctx,gen\n2024-01-01T00:00:00,100,5\n2024-01-01T00:00:02,200,7\n")
    spec = "prompt=ctx,output=gen,time=when"
    s = cli("sweep", "--trace", str(g), "--columns", "prompt=ctx,output=gen", "--quiet", "--block-sizes", "16")
    assert s.returncode == 0 and "2 requests" in s.stdout, s.stderr
    r = cli("simulate", "--trace", str(g), "--columns", spec)
    assert r.returncode == 0, r.stderr
    got = summary(r.stdout)
    assert got["finished"] == 2 and got["prompt_tokens"] == 300 and got["output_tokens"] == 12


def test_simulate_mooncake_from_another_folder_with_prefix_caching(tmp_path: Path) -> None:
    r = cli("simulate", "--trace", "mooncake", "--limit", "300", "--prefix-caching", "--block-size", "512",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = summary(r.stdout)
    assert got["finished"] == 300 and got["cached_tokens"] > 0


def test_reserve_holds_the_models_context_or_reserve_tokens() -> None:
    """A pool of 16,384 tokens: reserving 8,192 (Llama-3-8B's context) per request admits
    two at a time, 4,096 four; paging admits more."""
    base = ["simulate", "--requests", "60", "--prompt", "100", "200", "--output", "20", "40",
            "--num-blocks", "1024", "--rate", "1000"]
    peaks = {}
    for name, extra in {"reserve": ["--allocation", "reserve"],
                        "reserve4096": ["--allocation", "reserve", "--reserve-tokens", "4096"],
                        "paged": []}.items():
        r = cli(*base, *extra)
        assert r.returncode == 0, r.stderr
        got = summary(r.stdout)
        assert got["finished"] == 60
        peaks[name] = got["peak_running"]
    assert peaks["reserve"] == 2 and peaks["reserve4096"] == 4 and peaks["paged"] > 4


def test_sweep_over_allocations_and_block_sizes() -> None:
    r = cli("simulate", "--requests", "80", "--num-blocks", "3000", "--sweep-rates", "1,4",
            "--sweep-block-sizes", "16,32", "--sweep-allocations", "paged,reserve", "--workers", "2")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if re.match(r"^\s+\d+\.\d\d\s+(paged|reserve)", line)]
    assert [(row[0], row[1], row[2]) for row in rows] == [
        (rate, a, bs) for rate in ("1.00", "4.00") for a in ("paged", "reserve") for bs in ("16", "32")]
    assert {int(row[3]) for row in rows if row[2] == "32"} == {3000 * 16 // 32}
    assert "pool             3,000 blocks of 16 tokens (--num-blocks)" in r.stdout


def test_oracle_allocation_and_the_default_sweep() -> None:
    base = ["simulate", "--requests", "60", "--prompt", "100", "200", "--output", "20", "40",
            "--num-blocks", "1024", "--rate", "1000"]
    r = cli(*base, "--allocation", "oracle")
    assert r.returncode == 0, r.stderr
    assert summary(r.stdout)["peak_running"] > 4  # own lengths (< 241 tokens), not the context
    r = cli("simulate", "--requests", "50", "--num-blocks", "3000", "--sweep-rates", "2")
    assert r.returncode == 0, r.stderr
    labels = [line.split()[1] for line in r.stdout.splitlines() if re.match(r"^\s+2\.00\s", line)]
    assert labels == ["paged", "reserve", "oracle"]


def test_no_request_finished_is_said(tmp_path: Path) -> None:
    f = tmp_path / "long.txt"
    f.write_text("100000\n")
    r = cli("simulate", "--trace", str(f), "--num-blocks", "10")
    assert r.returncode == 0, r.stderr
    assert summary(r.stdout)["rejected"] == 1
    assert r.stderr.startswith("pykvpool: warning: no request finished (1 of 1 rejected")


def test_help_lists_the_allocations_and_limits() -> None:
    r = cli("simulate", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for needle in ("paged (on demand)", "--reserve-tokens", "at most 1,000,000", "--columns",
                   "--sweep-allocations", "--memory-gib", "azure-conv, azure-code, mooncake"):
        assert needle in text, needle
    assert "--data-dir" not in text


def test_json_trace_without_keys_runs(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    # A JSON string may hold U+2028 unescaped: it is not a line break of the file.
    f.write_text("\n".join(json.dumps({"timestamp": i * 100, "input_length": 50 + i, "output_length": 3,
                                       "note": "a\u2028b"}, ensure_ascii=False) for i in range(5)),
                 encoding="utf-8")
    w = sim_traces.load_file(f)
    assert w.block_keys is None and w.prompt_len.tolist() == [50, 51, 52, 53, 54]
    np.testing.assert_allclose(w.arrival, [0.0, 0.1, 0.2, 0.3, 0.4])


def test_read_text_refuses_what_is_not_utf8_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pykvpool import tracefile

    f = tmp_path / "t.txt"
    f.write_bytes(b"1\n2\n3\x00\n")
    with pytest.raises(pykvpool.TraceFormatError, match="t.txt:3: not text") as e:
        tracefile.read_text(f)
    assert e.value.line == 3
    f.write_bytes(b"\xef\xbb\xbf12\n")  # a UTF-8 byte-order mark is fine
    assert tracefile.read_text(f) == "12\n"
    f.write_bytes(b"1\n" * 600_000)
    monkeypatch.setattr(tracefile, "MAX_FILE_BYTES", 1_000_000)
    with pytest.raises(pykvpool.TraceFormatError, match="larger than"):
        tracefile.read_text(f)


def test_layer_groups_hold_only_the_window_and_serve_more() -> None:
    """Gemma-3-12B (5 sliding groups of 1,024 + 1 full, 8 layers each) on the A100 default
    budget: --layer-groups simulates the hybrid pool (six times the blocks, each a sixth of
    the bytes); a windowed group's peak stays within its window per running request while
    the full group grows, and more requests run at once than with full history."""
    args = ["simulate", "--model", "gemma-3-12b", "--requests", "60", "--prompt", "4000", "12000", "--seed", "3"]
    full, hybrid = cli(*args), cli(*args, "--layer-groups")
    assert full.returncode == 0 and hybrid.returncode == 0, full.stderr + hybrid.stderr
    f, h = summary(full.stdout), summary(hybrid.stdout)
    blocks = int(re.search(r"(\d[\d,]*) group blocks", hybrid.stdout).group(1).replace(",", ""))
    assert blocks == 6 * 9092 + 2  # 53.28 GiB // 1 MiB, against 9,092 six-MiB blocks
    window = [h[f"peak_blocks_used_g{j}"] for j in range(5)]
    assert h["peak_blocks_used_g5"] > max(window)
    # a request holds at most 1,024 / 16 + 1 window blocks plus its prefill chunk (8,192 tokens)
    assert max(window) <= h["peak_running"] * (64 + 1 + 8192 // 16 + 1)
    assert h["peak_running"] > f["peak_running"] and h["finished"] == f["finished"] == 60


def test_layer_groups_with_prefix_caching_and_swap_run_from_the_cli() -> None:
    """A windowed model's hybrid pool with prefix caching on a keyed trace, and with swap
    preemption: both run to the end and report what they did."""
    base = ["simulate", "--model", "gemma-2-9b", "--layer-groups", "--trace", "mooncake", "--limit", "200"]
    cached = cli(*base, "--prefix-caching", "--eviction", "lfu")
    assert cached.returncode == 0, cached.stderr
    c = summary(cached.stdout)
    assert c["finished"] == 200 and c["leaked_blocks"] == 0 and c["cached_tokens"] > 0
    swapped = cli(*base, "--preemption", "swap")
    assert swapped.returncode == 0, swapped.stderr
    assert summary(swapped.stdout)["finished"] == 200


def test_quiet_silences_the_sweep_progress_bar() -> None:
    args = ["simulate", "--requests", "30", "--num-blocks", "3000", "--sweep-rates", "2", "--sweep-allocations", "paged"]
    loud, quiet = cli(*args), cli(*args, "--quiet")
    assert loud.returncode == quiet.returncode == 0, loud.stderr + quiet.stderr
    assert "simulation sweep" in loud.stderr and quiet.stderr == ""
    assert loud.stdout.splitlines()[-1] == quiet.stdout.splitlines()[-1]


def test_prefix_caching_on_a_workload_without_ids_is_refused() -> None:
    # The Azure traces give lengths only: caching them would silently change nothing.
    r = subprocess.run([sys.executable, "-m", "pykvpool.cli", "simulate", "--trace", "azure-conv",
                        "--prefix-caching", "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pykvpool: error: --prefix-caching needs"), r.stderr


# ---- --rate and --rate-scale ------------------------------------------------------------


def test_rate_help_says_what_a_trace_does() -> None:
    r = cli("simulate", "--help")
    text = " ".join(r.stdout.split())
    assert "a trace with times replays them" in text and "--rate-scale" in text


def test_rate_scale_replays_a_trace_at_a_multiple_of_its_own_rate(tmp_path: Path) -> None:
    """--rate-scale 2 divides every arrival time by 2 (the trace's own times otherwise)."""
    args = ["simulate", "--trace", "azure-conv", "--limit", "200", "--num-blocks", "31253"]
    own, fast = tmp_path / "own", tmp_path / "fast"
    a, b = cli(*args, "--out", str(own)), cli(*args, "--rate-scale", "2", "--out", str(fast))
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    t_own, t_fast = (np.genfromtxt(d / "requests.csv", delimiter=",", names=True)["arrival"] for d in (own, fast))
    trace = sim_traces.load_azure(named_trace_path("azure-conv"), limit=200)
    np.testing.assert_array_equal(t_own, trace.arrival)
    np.testing.assert_array_equal(t_fast, trace.arrival / 2)
    assert "(the trace's own times, divided by 2 (--rate-scale))" in b.stdout


@pytest.mark.parametrize("extra,expected", [
    (["--rate-scale", "0"], "argument --rate-scale: must be > 0"),
    (["--rate-scale", "-2"], "argument --rate-scale: must be > 0"),
    (["--rate-scale", "nan"], "argument --rate-scale: must be a finite number"),
    (["--rate-scale", "inf"], "argument --rate-scale: must be a finite number"),
    (["--rate-scale", "true"], "argument --rate-scale: 'true' is not a number"),
    (["--rate-scale", "2", "--rate", "5"], "--rate-scale multiplies"),
    (["--rate-scale", "2", "--sweep-rates", "1,2"], "--rate-scale multiplies"),
])
def test_rate_scale_refuses_bad_values_in_one_line(extra: list[str], expected: str) -> None:
    r = cli("simulate", "--trace", "azure-conv", "--limit", "5", "--quiet", *extra)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[0].startswith("pykvpool: error: "), r.stderr
    assert expected in lines[0] and lines[1:] in ([], ["(see 'pykvpool simulate --help')"]), r.stderr


def test_rate_scale_needs_a_trace() -> None:
    r = cli("simulate", "--requests", "10", "--rate-scale", "2")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--rate-scale re-times a trace" in lines[0], r.stderr


def test_every_printed_metric_has_its_unit_and_matches_summary_csv(tmp_path: Path) -> None:
    r = cli("simulate", "--trace", "azure-conv", "--limit", "300", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "summary.csv").read_text().splitlines()[1:]
    csv = {k: v for k, v in (row.split(",", 1) for row in rows)}
    printed = summary(r.stdout)
    # A colocated run prints no transfer figures (all 0 or None).
    moved = ("kv_transfers", "kv_transfer_bytes")
    assert csv["kv_transfers"] == "0" and all(csv[k] == "" for k in csv if re.match(r"(kv_transfer|decode_wait)_", k)
                                                and k not in moved)
    assert set(printed) == {k for k in csv if not re.match(r"(kv_transfer|decode_wait)", k)}
    for key, text in ((k, v) for k, v in csv.items() if k in printed):
        want = None if text == "" else float(text)
        got = printed[key]
        assert (got is None) == (want is None), key
        if want is not None:  # printed to 3 decimals (s), 0.1 ms, 0.1 % or whole counts
            assert got == pytest.approx(want, rel=2e-3, abs=6e-4), key
    for group in ("requests", "throughput", "tokens", "memory", "preemption"):
        assert f"\n{group}\n" in r.stdout
    assert re.search(r"^  ttft_p99|^  tpot_p50", r.stdout, re.M) is None  # in the latency table
    assert re.search(r"^  output_throughput +[\d,.]+ tokens/s", r.stdout, re.M)
    assert re.search(r"^  peak_blocks_used +[\d,]+ blocks = [\d.]+ GiB$", r.stdout, re.M)


def test_rate_with_sweep_rates_is_refused_not_ignored() -> None:
    # The sweep re-times the workload to each of its rates, so --rate would do nothing.
    r = cli("simulate", "--requests", "10", "--rate", "3", "--sweep-rates", "1,2", "--quiet")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == "pykvpool: error: --rate and --sweep-rates both set the arrival rate: give one"
