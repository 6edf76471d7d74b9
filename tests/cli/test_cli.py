"""The ``pykvpool`` command line, run as a subprocess, bad input included."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True,
                          text=True, check=False, cwd=cwd, timeout=300, env=env)


@pytest.mark.parametrize("sub", [[], ["ledger"], ["sweep"], ["report"], ["video"]])
def test_help(sub: list[str]) -> None:
    r = run(*sub, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage: pykvpool" in r.stdout
    if sub:
        assert "--out" in r.stdout


def test_ledger(tmp_path: Path) -> None:
    r = run("ledger", "--batch", "32", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "131072 B" in r.stdout and "14.96 GiB" in r.stdout
    assert "2.14x weights" in r.stdout
    data = json.loads((tmp_path / "ledger.json").read_text())
    assert data["token_capacity"] == 500063 and data["max_batch"] == 61
    one = run("ledger")
    assert "step >= 8.40 ms" in one.stdout and "<= 119 tokens/s" in one.stdout


def test_ledger_hf_config_and_fp8(tmp_path: Path) -> None:
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    r = run("ledger", "--hf-config", str(f), "--dtype", "fp8", "--hardware", "h100-sxm")
    assert r.returncode == 0, r.stderr
    assert "67584 B" in r.stdout and "H100 SXM" in r.stdout


def test_video(tmp_path: Path) -> None:
    r = run("video", "--models", "longlive", "--hardware", "h100-sxm", "--seconds", "30",
            "--quiet", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    # LongLive keeps 3 sinks + 6 frames + the 3-frame chunk: 12 x 1,560 x 184,320 B = 3.21 GiB;
    # 30 s of full history = 120 latent frames = 32.14 GiB (8-bit, fp8_e4m3 as the video cache
    # stores it: 2 x 30 x 12 x 128 B/token, its scales per layer).
    assert "| longlive | 3 sinks + 6 frames + chunk 3 | 184,320 / 92,160 | 3.21 | 1.61 |" in r.stdout
    assert "| longlive | full history | 184,320 / 92,160 | 32.14 | 16.07 |" in r.stdout
    data = json.loads((tmp_path / "video.json").read_text())
    assert data["kv"][1]["bytes"] == {"bf16": 12 * 1560 * 184_320, "fp8_e4m3": 12 * 1560 * 92_160}
    caps = {row["cache"]: row["capacity"] for row in data["streams"]}
    assert caps["3 sinks + 6 frames + chunk 3"]["streams"] == 3  # tests/video/test_video_report.py
    r = run("video", "--models", "longlive", "--hardware", "h100-sxm", "--window", "0",
            "--sinks", "0", "--quiet")
    assert "| longlive | 0 sinks + 0 frames + chunk 3 |" in r.stdout


def test_sweep(tmp_path: Path) -> None:
    r = run("sweep", "--workload", "heavy", "--prefix", "256", "--block-sizes", "8,16,32",
            "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "| contiguous | 4096 | 122 |" in r.stdout
    assert "| paged | 16 | 405 |" in r.stdout and "3.32x" in r.stdout
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["admitted"] for p in data["policies"]][:2] == [122, 405]
    assert [b["block_size"] for b in data["block_sizes"]] == [8, 16, 32]
    assert "sweep" in r.stderr  # the progress bar


def test_sweep_trace_file(tmp_path: Path) -> None:
    f = tmp_path / "lens.txt"
    f.write_text("\n".join(str(n) for n in range(100, 2100, 100)))
    r = run("sweep", "--trace", str(f), "--max-len", "2048", "--memory-gib", "20", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "20 requests" in r.stdout


def test_report(tmp_path: Path) -> None:
    """The README's main job, as a user runs it (measurement included)."""
    from pykvpool import _native

    out = tmp_path / "rep"
    r = run("report", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "reproduced exactly" in r.stdout
    assert "figures" in r.stderr  # progress bars
    md = (out / "report.md").read_text()
    for i in range(1, 6):
        pngs = list(out.glob(f"fig{i}_*.png"))
        assert len(pngs) == 1
        assert f"]({pngs[0].name})" in md
    assert "| **NO** |" not in md
    # The deployment search the report runs itself (section 9), its tables in search/.
    assert "## 9. Deployment search" in md and "A small search run by the report" in md
    assert "Prefill/decode disaggregation (`--pd`)" in md and "| split / colocated |" in md
    for name in ("fig11_search_frontier", "fig12_search_latency", "fig13_search_rates"):
        assert f"]({name}.png)" in md and (out / f"{name}.png").stat().st_size > 0
    assert (out / "search" / "frontier_latency.csv").is_file() and (out / "search" / "points.json").is_file()
    assert "deployment search" in r.stderr
    # The command the section prints is that very search: rerun into its folder, it resumes with nothing to do.
    from pykvpool.report.search_section import SMALL_SEARCH

    again = run("search", *shlex.split(SMALL_SEARCH), "--quiet", "--no-figures", "--out", str(out / "search"))
    assert again.returncode == 0, again.stderr
    assert "80 configurations" in again.stdout and " 0 evaluated" in again.stdout and "0 simulated" in again.stdout
    assert "| 16 | 7.5 | 7.5 | 99.677% |" in md
    assert "| uniform: admitted, paged b=16 | 214 | 214 | yes |" in md
    assert "| heavy: gain paged / contiguous | 3.32x | 3.32x | yes |" in md
    data = json.loads((out / "report.json").read_text())
    assert all(row["article"] == row["pykvpool"] for row in data["reproduced"])
    assert data["fig3"]["admitted"] == [[s["admitted"] for s in comp] for comp in data["sweeps"]]
    if hasattr(_native, "decode_attention"):
        assert data["machine"]["bandwidth"] > 0 and data["machine"]["peak_flops"]["fp32"] > 0
        assert [k["group_size"] for k in data["kernel"]] == [1, 4, 8]
        assert [k["group_size"] for k in data["fig2"]["kernel"]] == [1, 4, 8]
        assert "pykvpool's decode kernel" in md
    if hasattr(_native, "prefill_attention"):
        names = ["text prefill", "video chunk"]
        assert [p["shape"]["name"] for p in data["prefill_kernel"]] == names
        assert [p["name"] for p in data["fig2"]["prefill"]] == names
        ridge = data["machine"]["peak_flops"]["fp32"] / data["machine"]["bandwidth"]
        assert all(p["intensity"] > ridge and p["compute_bound"] for p in data["fig2"]["prefill"])
        assert "pykvpool's multi-query kernel" in md and "| video chunk | 1 | 1560 over 6240 |" in md
    else:
        assert "This machine was not measured" in md


def test_report_without_measurement(tmp_path: Path) -> None:
    from pykvpool.report.build import build_report

    res = build_report(tmp_path, measure=False, progress=False)
    assert res.matched == res.reproduced >= 30
    assert res.data["machine"] is None and res.data["fig2"]["machine"] is None
    assert res.data["fig2"]["prefill"] == [] and res.data["prefill_kernel"] == []
    assert "This machine was not measured" in res.markdown.read_text()
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(
        f"{name}.png" for name in res.figures)


@pytest.mark.parametrize(
    ("args", "message"),
    [(["ledger", "--model", "gpt-9"], "unknown model 'gpt-9'"),
     (["ledger", "--hardware", "tpu-v9"], "unknown hardware"),
     (["ledger", "--dtype", "fp4"], "unknown dtype"),
     (["ledger", "--seq-len", "0"], "must be >= 1"),
     (["ledger", "--batch", "-3"], "must be >= 1"),
     (["ledger", "--memory-gib", "-80"], "must be > 0"),
     (["ledger", "--reserve-gib", "-1"], "--reserve-gib: must be >= 0, got -1"),
     (["ledger", "--fraction", "1.5"], "fraction"),
     (["ledger", "--memory-gib", "12"], "exceed the usable"),
     (["ledger", "--model", "llama-3-70b", "--hardware", "a100-80gb-sxm"], "exceed the usable"),
     (["sweep", "--block-size", "0"], "must be >= 1"),
     (["sweep", "--prefix", "9999"], "--prefix 9999 exceeds the shortest request (512 tokens)"),
     (["sweep", "--workload", "nope"], "invalid choice"),
     (["sweep", "--trace", "/nonexistent/trace.csv"], "No such file")],
)
def test_bad_input(args: list[str], message: str) -> None:
    r = run(*args)
    assert r.returncode == 2
    assert r.stderr.startswith("pykvpool: error: ")
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_malformed_trace_reports_line(tmp_path: Path) -> None:
    f = tmp_path / "trace.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nt,100,5\nt,200,5\nt,3x0,5\n")
    r = run("sweep", "--trace", str(f))
    assert r.returncode == 2
    assert f"{f}:4: ContextTokens '3x0' is not an integer" in r.stderr


def test_empty_workload(tmp_path: Path) -> None:
    f = tmp_path / "empty.txt"
    f.write_text("# nothing here\n\n")
    r = run("sweep", "--trace", str(f))
    assert r.returncode == 2 and "holds no request" in r.stderr
    g = tmp_path / "long.txt"
    g.write_text("9000\n")
    r = run("sweep", "--trace", str(g), "--max-len", "4096")
    assert r.returncode == 2 and "every request of long.txt is longer than --max-len 4,096 tokens" in r.stderr


def test_bad_hf_config(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_text('{"hidden_size": 4096,\n "num_hidden_layers": }')
    r = run("ledger", "--hf-config", str(f))
    assert r.returncode == 2 and "config.json:2: not valid JSON" in r.stderr


def test_ledger_on_this_machine() -> None:
    from pykvpool import _native

    r = run("ledger", "--hardware", "this", "--memory-gib", "64", "--reserve-gib", "0")
    if hasattr(_native, "read_bandwidth") and hasattr(_native, "decode_attention"):
        assert r.returncode == 0, r.stderr
        assert "decode on this machine (CPU)" in r.stdout
    else:  # the kernel module is not in this build: a clear error, not a traceback
        assert r.returncode == 2
        assert "decode-kernel module" in r.stderr and "Traceback" not in r.stderr


def test_readme_cli_examples_run_from_any_folder(tmp_path: Path) -> None:
    """Every ``pykvpool`` line of the README runs (the report and the machine measurement
    have their own tests), from a folder outside the checkout, and none points outside
    the package."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "../" not in readme
    commands = re.findall(r"^pykvpool (\S.*?)(?:\s+#.*)?$", readme, re.M)
    assert len(commands) >= 9
    (tmp_path / "my_lengths.txt").write_text("\n".join(str(n) for n in range(600, 8600, 400)))
    (tmp_path / "my.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                     "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    (tmp_path / "path" / "to").mkdir(parents=True)
    (tmp_path / "path" / "to" / "config.json").write_text(json.dumps(
        {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
         "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}))
    ran = 0
    for cmd in commands:
        args = shlex.split(cmd)
        if args[0] == "report" or "this" in args:
            continue
        r = run(*args, cwd=tmp_path)
        assert r.returncode == 0, (cmd, r.stderr[-2000:])
        assert "Traceback" not in r.stderr
        ran += 1
    assert ran >= 8
    assert (tmp_path / "sim-out" / "requests.csv").is_file()


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from pykvpool.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_version_prints_the_package_version() -> None:
    import pykvpool

    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"pykvpool {pykvpool.__version__}", r


def test_every_subcommand_takes_quiet() -> None:
    """``--quiet`` is accepted by every subcommand the parser has (a new one included), each
    with its required options given a placeholder."""
    subcommands = _subcommands()
    assert {"ledger", "sweep", "report", "replay", "simulate", "video", "search"} <= set(subcommands)
    for name, p in subcommands.items():
        required = [x for a in p._actions if a.required and a.option_strings for x in (a.option_strings[0], "x")]
        args = p.parse_args([*required, "--quiet"])
        assert args.quiet is True, name
        assert p.parse_args(required).quiet is False, name


def test_video_prints_the_estimated_fps_beside_the_reported_one_and_draws_kv(tmp_path: Path) -> None:
    from pykvpool.planning.hardware import HARDWARE
    from pykvpool.planning.ledger import default_budget
    from pykvpool.planning.video import VIDEO_MODELS
    from pykvpool.simulate.video import VideoRoofline, kv_pool_blocks, streams_at_real_time

    r = run("video", "--models", "longlive", "--hardware", "h100-sxm", "--quiet", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    m, hw = VIDEO_MODELS["longlive"], HARDWARE["h100-sxm"]
    single = streams_at_real_time(VideoRoofline(m, hw), 60.0, kv_pool_blocks(m, default_budget(hw), 16)).single_fps
    assert f"H100 SXM: {single:.1f} fps estimated by this roofline (slowest chunk) vs 20.7 fps reported" in r.stdout
    assert "| reported (fps) |" in r.stdout
    assert f"| longlive | 3 sinks + 6 frames + chunk 3 | H100 SXM | 26,660 | 22 | 3 | compute | {single:.1f} | 20.7 |" \
        in r.stdout
    assert "| longlive | full history | H100 SXM |" in r.stdout and "| 4.2 | - |" in r.stdout
    data = json.loads((tmp_path / "video.json").read_text())
    assert [s["reported_fps"] for s in data["streams"]] == [None, 20.7]
    png = tmp_path / "kv_over_time.png"
    assert f"wrote {png}" in r.stdout and png.read_bytes()[:4] == b"\x89PNG"
    # another GPU: the reported number, and how to compare; another window: not comparable
    a100 = run("video", "--models", "longlive", "--hardware", "a100-80gb-sxm", "--quiet")
    assert "reports 20.7 fps on the H100 SXM (add --hardware h100-sxm to compare)" in a100.stdout
    assert "kv_over_time" not in a100.stdout  # no --out, no figure
    other = run("video", "--models", "longlive", "--hardware", "h100-sxm", "--window", "3", "--quiet")
    assert "reports 20.7 fps for its own window, not the one asked" in other.stdout
    assert "| 20.7 |" not in other.stdout
