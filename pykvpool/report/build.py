"""``pykvpool report``: the capacity-planning report, one folder with ``report.md``, its
PNG figures, ``report.html`` (the same report in one self-contained page) and
``report.json`` (every number of every table).

Sections: the memory ledger (figure 1, presets on each accelerator), the roofline with this
machine measured (figure 2), static capacity through the pool (figure 3), video (figure 4),
block size and real traces (figure 5), the simulator under the same budget (figures 6-8),
windows, sinks and hybrid layers through the hybrid pool (figure 9), video generation
serving (figure 10), a deployment search (figures 11-13: a small one the report runs, or a
finished one given by ``search``), and a closing table of the article's value beside pykvpool's for every reproduced number.

One budget (:func:`pykvpool.planning.ledger.default_budget`: the device's memory, a 4 GiB reserve)
serves every section, and the report prints it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pykvpool._native import __version__
from pykvpool.report.article import ARTICLE, ArticleRun, article_ledgers, reproduce
from pykvpool import _native
from pykvpool.report.figures import (
    fig_block_size_and_traces,
    fig_memory_ledger,
    fig_paging,
    fig_roofline,
    fig_video,
    paging_demo,
)
from pykvpool.planning.hardware import HARDWARE, Hardware, hardware_preset, measure_this_machine
from pykvpool.planning.ledger import GIB, MIB, Budget, MemoryLedger, default_budget
from pykvpool.planning.models import MODELS
from pykvpool.progress import ProgressBar
from pykvpool.report.dynamic import dynamic_section
from pykvpool.report.html import write_html
from pykvpool.report.presets import PRESET_LENGTH, preset_ledger, presets_table
from pykvpool.report.search_section import search_section
from pykvpool.search.folder import read_search
from pykvpool.report.video_serving import video_serving_section
from pykvpool.report.windows import windows_section
from pykvpool.report.summary import summary_section
from pykvpool.report.tables import anchor, fmt_gib, fmt_pct, fmt_x, jsonable, markdown_table
from pykvpool.planning.roofline import (
    PREFILL_SHAPES,
    KernelPoint,
    PrefillPoint,
    SettleRule,
    Spread,
    decode_intensity,
    measure_decode_kernel,
    measure_prefill_kernel,
    prefill_intensity,
)
from pykvpool.planning.sweeps import (
    BlockSizeRow,
    SweepResult,
    block_size_sweep,
    contiguous,
    paged,
    paged_shared_prefix,
    waste_decomposition,
)
from pykvpool.planning.video import VideoSpec, article_videos
from pykvpool.planning.workloads import ARTICLE_MAX_LEN, AZURE_ATTRIBUTION, Workload, azure_trace

__all__ = ["ReportResult", "build_report"]

ARTICLE_BLOCK_SIZES = (1, 4, 8, 16, 32, 64, 128, 256)
SHARED_PREFIX = 256
"""Tokens of the shared system prompt in the shared-prefix policy (the heavy-tail minimum)."""
TRACE_MAX_LEN = MODELS["llama-3-8b"].max_context
"""Contiguous reservation for the traces: Llama-3-8B's context window, tokens."""
REPORT_HARDWARE = "a100-80gb-sxm"
"""The article's accelerator: its :func:`default_budget` is the report's budget."""
ROOF_RULE = SettleRule(k=3, rel_tol=0.10, max_rounds=30, max_seconds=10.0)
"""When the roof's probes have settled: per kernel point, (call, probe) rounds until the best
3 probes agree within 10%, at most 30 rounds or 10 s."""


@dataclass(frozen=True)
class ReportResult:
    """What :func:`build_report` wrote and computed."""

    out_dir: Path
    markdown: Path
    figures: dict[str, Path]
    reproduced: int
    matched: int
    seconds: float
    data: dict[str, Any]


def _sweep_row(r: SweepResult, base: SweepResult) -> list[object]:
    return [r.workload, r.policy, r.block_size, r.admitted, fmt_gib(r.reserved_bytes),
            fmt_gib(r.used_bytes), fmt_pct(r.utilization), fmt_x(r.gain_over(base)),
            f"{r.table_entries / max(r.admitted, 1):.1f}"]


_SWEEP_HEADER = ["workload", "policy", "block (tokens)", "admitted", "reserved GiB",
                 "used GiB", "utilization (admitted)", "gain", "table entries / request (admitted)"]
_ALL_UTIL = "utilization (all requests)"
_ALL_ENTRIES = "table entries / request (all requests)"
"""The block-size sweeps' utilization: every request of the workload in a pool that holds
them all, not the requests the budget admits (a different set, so a different number)."""


@dataclass(frozen=True)
class Measured:
    """This machine as the report measured it.

    Attributes:
        machine: the roof of figure 2: ``bandwidth`` is ``roof.value`` (bytes/s);
            ``peak_flops["fp32"]`` the best of two FMA probes (FLOP/s).
        roof: every read-bandwidth probe of the decode kernel's own cache, taken back to
            back with the kernel calls until they settled (:data:`ROOF_RULE`), bytes/s.
        kernel: the decode kernel's points.
        prefill: the multi-query (prefill) kernel's points, one per shape of
            :data:`pykvpool.planning.roofline.REPORT_PREFILL_SHAPES`.
        fresh_bandwidth: a fresh 256 MiB buffer's read bandwidth in the same run (bytes/s),
            for comparison only.
    """

    machine: Hardware
    kernel: list[KernelPoint]
    prefill: list[PrefillPoint]
    fresh_bandwidth: float
    roof: Spread


def _measure(progress_on: bool) -> Measured:
    with ProgressBar("measuring this machine", 4, enabled=progress_on) as bar:
        fresh = measure_this_machine()
        bar(1)
        kernel = measure_decode_kernel(progress=None, settle=ROOF_RULE)
        bar(2)
        prefill = measure_prefill_kernel()
        bar(3)
        flops = max(fresh.flops("fp32"), float(_native.peak_flops()))
        bar(4)
    roof = Spread.pooled([k.roof for k in kernel if k.roof is not None])
    machine = replace(
        fresh, bandwidth=roof.value, peak_flops={"fp32": flops},
        source="roof: read_bandwidth of the kernel's own cache, back to back with it, "
               f"median of the best {roof.k} of {len(roof.samples)} probes")
    return Measured(machine, kernel, prefill, fresh.bandwidth, roof)


def _article_sweeps(run: ArticleRun, cap: int, bpt: int,
                    progress: bool) -> tuple[list[list[SweepResult]], list[BlockSizeRow]]:
    """Contiguous, paged and shared-prefix results of each article workload, and the
    block-size sweep of the uniform one (capacity ``cap`` tokens of ``bpt`` bytes)."""
    with ProgressBar("sweeps (article workloads)", 2, enabled=progress) as bar:
        comparisons = []
        for j, wl in enumerate(run.workloads.values()):
            c, p = run.sweeps[list(run.workloads)[j]]
            s = paged_shared_prefix(wl, cap, SHARED_PREFIX, 16, bpt)
            comparisons.append([c, p, s])
            bar(j + 1)
        bsz_rows = block_size_sweep(run.workloads["uniform"], ARTICLE_BLOCK_SIZES, cap)
    return comparisons, bsz_rows


def _trace_sweeps(cap: int, bpt: int, progress: bool) -> tuple[
        list[Workload], list[list[SweepResult]], dict[str, list[BlockSizeRow]]]:
    """The Azure traces (clipped to the model's context), their contiguous and paged
    results and their block-size sweeps."""
    with ProgressBar("sweeps (Azure traces)", 2, enabled=progress) as bar:
        traces: list[Workload] = []
        trace_results = []
        for j, kind in enumerate(("code", "conv")):
            wl = azure_trace(kind).clipped(TRACE_MAX_LEN)
            traces.append(wl)
            c = contiguous(wl, cap, TRACE_MAX_LEN, bpt)
            trace_results.append([c, paged(wl, cap, 16, bpt)])
            bar(j + 1)
        trace_bsz = {wl.name: block_size_sweep(wl, (8, 16, 32, 64, 128), cap) for wl in traces}
    return traces, trace_results, trace_bsz


def build_report(out_dir: str | os.PathLike[str], measure: bool = True,
                 progress: bool = True, search: str | os.PathLike[str] | None = None,
                 run_search: bool = True) -> ReportResult:
    """Compute everything and write ``report.md``, ``fig*.png``, ``report.html`` and
    ``report.json`` into ``out_dir`` (created if needed).

    Args:
        measure: measure this machine and the decode and prefill kernels (needs the
            kernel module);
            False skips it and says so in the report.
        progress: draw progress bars on stderr.
        search: the folder of a finished ``pykvpool search`` to show in the search
            section (read before anything else is computed).
        run_search: without ``search``, run the report's own small search into
            ``out_dir/search`` (:mod:`pykvpool.report.search_section`); False leaves the
            section out.

    Raises:
        InvalidArgumentError: ``search`` is not the folder of a finished search.
        OSError: ``out_dir`` cannot be created or written.
    """
    t0 = time.perf_counter()
    folder = read_search(search) if search is not None else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs: dict[str, Path] = {name: out / f"{name}.png" for name in
                             ("fig1_memory_ledger", "fig2_roofline", "fig3_paging",
                              "fig4_video", "fig5_block_size_traces")}
    data: dict[str, Any] = {}
    with ProgressBar("reproducing the article", 3, enabled=progress) as bar:
        run: ArticleRun = reproduce(progress=bar)
    gqa, mha = article_ledgers()
    cap, bpt = gqa.token_capacity, gqa.bytes_per_token
    a100 = hardware_preset(REPORT_HARDWARE)
    budget = default_budget(a100)
    if gqa.budget != budget:  # the article's budget is the A100's default one
        raise AssertionError(f"article budget {gqa.budget} != default budget {budget}")

    comparisons, bsz_rows = _article_sweeps(run, cap, bpt, progress)
    traces, trace_results, trace_bsz = _trace_sweeps(cap, bpt, progress)

    measured: Measured | None = None
    reason = "measurement skipped (--no-measure)"
    if measure:
        measured, reason = _measure(progress), ""
    machine = measured.machine if measured is not None else None
    kernel = measured.kernel if measured is not None else []
    prefill = measured.prefill if measured is not None else []

    with ProgressBar("figures", 5, enabled=progress) as bar:
        data["fig1"] = fig_memory_ledger(figs["fig1_memory_ledger"], gqa, mha)
        bar(1)
        ideal = [("decode g=1", decode_intensity(1, 2)), ("decode g=4", decode_intensity(4, 2)),
                 ("decode g=8", decode_intensity(8, 2)),
                 ("prefill S=8192", prefill_intensity(gqa.model, 8192))]
        data["fig2"] = fig_roofline(figs["fig2_roofline"], a100, ideal, machine, kernel, reason,
                                    prefill=prefill)
        bar(2)
        picture = paging_demo()
        data["fig3"] = fig_paging(figs["fig3_paging"], picture, comparisons)
        bar(3)
        videos = article_videos()
        data["fig4"] = fig_video(figs["fig4_video"], videos, bpt, gqa.budget.usable_bytes / GIB,
                                 gqa.kv_budget_bytes / GIB)
        bar(4)
        data["fig5"] = fig_block_size_and_traces(
            figs["fig5_block_size_traces"], bsz_rows, run.workloads["uniform"].name,
            trace_results, [(wl.name, wl.lengths) for wl in traces])
        bar(5)

    dynamic_md, data["dynamic"], dynamic_figs = dynamic_section(out, budget, progress)
    figs.update(dynamic_figs)
    windows_md, data["windows"], windows_figs = windows_section(out, budget, progress)
    figs.update(windows_figs)
    video_md, data["video_serving"], video_figs = video_serving_section(out, progress)
    figs.update(video_figs)
    search_md = ""
    if folder is not None or run_search:
        search_md, data["search"], search_figs = search_section(out, folder, progress)
        figs.update(search_figs)
    extra = [dynamic_md, windows_md, video_md] + ([search_md] if search_md else [])
    md = _markdown(run, gqa, comparisons, bsz_rows, traces, trace_results, trace_bsz, measured,
                   data["fig2"], reason, videos, figs, extra, data)
    seconds = time.perf_counter() - t0
    md = md.replace("@@SECONDS@@", f"{seconds:.1f}")
    path = out / "report.md"
    path.write_text(md, encoding="utf-8")
    data["reproduced"] = run.rows
    data["sweeps"] = comparisons
    data["block_size"] = bsz_rows
    data["traces"] = trace_results
    data["budget"] = budget.describe()
    data["presets"] = presets_table()[1]
    data["machine"] = machine
    data["kernel"] = kernel
    data["prefill_kernel"] = prefill
    data["fresh_bandwidth"] = measured.fresh_bandwidth if measured is not None else None
    data["roof"] = None if measured is None else {
        "samples": measured.roof.samples, "k": measured.roof.k, "value": measured.roof.value,
        "low": measured.roof.low, "high": measured.roof.high, "stable": measured.roof.stable,
        "agreement": measured.roof.agreement, "rule": ROOF_RULE}
    (out / "report.json").write_text(json.dumps(jsonable(data), indent=1, default=str),
                                     encoding="utf-8")
    write_html(out)
    matched = sum(r.match for r in run.rows)
    return ReportResult(out, path, figs, len(run.rows), matched, seconds, data)


def _markdown(run: ArticleRun, gqa: MemoryLedger, comparisons: list[list[SweepResult]],
              bsz_rows: Sequence[Any], traces: list[Workload],
              trace_results: list[list[SweepResult]], trace_bsz: dict[str, list[Any]],
              measured: Measured | None, fig2: dict[str, Any], reason: str,
              videos: list[VideoSpec], figs: dict[str, Path], extra: list[str],
              data: dict[str, Any]) -> str:
    """The report's Markdown: title and introduction, the summary page (quoting the
    sections' tables), the sections, the closing note and the appendix."""
    body = _ledger_section(gqa, figs) + _roofline_section(gqa, measured, fig2, reason, figs)
    body += _static_section(run, gqa, comparisons, figs) + _video_section(gqa, videos, figs)
    body += _traces_section(bsz_rows, traces, trace_results, trace_bsz, figs) + extra
    rest = "\n".join(body + _closing(run) + _appendix(run, data))
    roof = roof_sentence(measured.roof) if measured is not None else None
    summary = summary_section(rest, gqa.budget, data, roof)
    return "\n".join(_intro(run, gqa) + [summary, rest])


def _intro(run: ArticleRun, gqa: MemoryLedger) -> list[str]:
    matched = sum(r.match for r in run.rows)
    return ["# pykvpool capacity-planning report\n",
            f"This report recomputes, with pykvpool's own code, the numbers of the article "
            f"{ARTICLE}. **{matched} of {len(run.rows)} come out exactly as the article prints "
            "them** (closing note). The report then goes where the article stops: real traces, "
            "a serving simulator, windowed "
            "and hybrid models, video serving and a deployment search. Every capacity number "
            "comes from admitting requests into a real `pykvpool.BlockPool` or "
            "`pykvpool.BlockPool` until it raises `PoolExhaustedError`. Generated by "
            f"`pykvpool report` (pykvpool {__version__}, Python {platform.python_version()}, "
            f"{platform.machine()}) in @@SECONDS@@ s; every number of every table is also in "
            "`report.json`.\n"]


def _appendix(run: ArticleRun, data: dict[str, Any]) -> list[str]:
    """The tables a planner looks up rather than reads: every preset on every accelerator,
    every article number beside pykvpool's, every video preset on every GPU."""
    table, _ = presets_table()
    s = ["## Appendix: every preset model on every accelerator\n",
         "Budget: `default_budget` of each device: "
         + "; ".join(f"{hw.name} {default_budget(hw).describe()}" for hw in HARDWARE.values())
         + ". KV B/token is the full history (every layer keeps every token). A model "
         "with sliding or chunked layers (Mistral, Gemma, gpt-oss) needs less per token the "
         "longer its sequences, so its capacity is stated at a length: `N @ 8192` is the "
         f"tokens served as sequences of {PRESET_LENGTH} (max batch x {PRESET_LENGTH}; "
         "section 7 gives 8k / 32k / 128k). KV fp8 counts one fp32 scale per token, "
         "layer, K/V and KV head; the decode bound reads the weights and the whole KV once "
         "per step. Each model stores its weights in one precision on every device (bf16, else "
         "fp8 or 4-bit where bf16 does not fit the 80 GB devices; the lines under the table say "
         "which and why), so a model's rows differ only in the KV each device holds; each row "
         "gives bf16 / fp8 KV side by side.\n",
         table + "\n",
         "## Appendix: the article's values beside pykvpool's\n",
         "pykvpool's value is printed with the article's precision; `match` means the "
         "two printed values are identical.\n",
         markdown_table(["number", "article", "pykvpool", "match"],
                        [[r.what, r.article, r.pykvpool, "yes" if r.match else "**NO**"]
                         for r in run.rows]) + "\n"]
    serve = data.get("video_serving", {}).get("full_history_table")
    if serve:
        s += ["## Appendix: video presets with full history\n",
              "Section 8's streams per GPU at real time, for the presets' full-history caches:\n",
              markdown_table(serve["header"], serve["rows"]) + "\n"]
    return s


def _ledger_section(gqa: MemoryLedger, figs: dict[str, Path]) -> list[str]:
    s: list[str] = []
    cap, bpt = gqa.token_capacity, gqa.bytes_per_token
    s.append("## 1. Memory ledger\n")
    s.append(f"The article's baseline: {gqa.model.name} ({gqa.model.num_layers} layers, "
             f"{gqa.model.num_kv_heads} KV heads, d={gqa.model.head_dim}), KV in "
             f"{gqa.dtype.name} = {bpt} B/token; budget {gqa.budget.describe()}, minus weights "
             f"{fmt_gib(gqa.weight_bytes)} GiB = {fmt_gib(gqa.kv_budget_bytes)} GiB of KV = "
             f"{cap:,} KV tokens. The same budget (`pykvpool.planning.ledger.default_budget`, "
             "also used by `pykvpool ledger` and `pykvpool simulate`) serves every section.\n")
    s.append(f"![memory ledger]({figs['fig1_memory_ledger'].name})\n")
    rows: list[list[object]] = []
    for b in (1, 8, 16, 32, 64, 128):
        r = gqa.row(batch=b, seq_len=8192)
        fits = "yes" if r.total_bytes <= gqa.budget.usable_bytes else "**no**"
        rows.append([b, f"{r.kv_bytes / GIB:.2f}", f"{r.kv_over_weights:.2f}x",
                     f"{r.weights_plus_kv_bytes / GIB:.2f}", f"{r.total_bytes / GIB:.2f}", fits])
    s.append(markdown_table(["batch (x 8192 tokens)", "KV GiB", "KV / weights",
                             "weights + KV GiB", "+ reserve GiB",
                             f"fits {gqa.budget.usable_bytes / GIB:.0f} GiB"], rows) + "\n")
    s.append(f"Largest batch at 8192 tokens: {gqa.max_batch(seq_len=8192)}; longest length at batch "
             f"32: {gqa.max_seq_len(batch=32):,} tokens (at block size 16: {gqa.max_seq_len(batch=32, block_size=16):,}).\n")
    s.append("Every preset model on every accelerator (capacity, largest batch, decode "
             "bound): the appendix.\n")
    return s


def _roofline_section(gqa: MemoryLedger, measured: Measured | None, fig2: dict[str, Any], reason: str,
                      figs: dict[str, Path]) -> list[str]:
    s: list[str] = []
    s.append("## 2. Roofline\n")
    s.append(f"![roofline]({figs['fig2_roofline'].name})\n")
    if measured is None:
        s.append(f"**This machine was not measured**: {reason}. The right panel (datasheet) "
                 "and the ideal points are complete.\n")
    else:
        s += _roofline_text(gqa, measured, fig2)
    return s


def _static_section(run: ArticleRun, gqa: MemoryLedger, comparisons: list[list[SweepResult]],
                    figs: dict[str, Path]) -> list[str]:
    bpt = gqa.bytes_per_token
    s: list[str] = []
    s.append("## 3. Static capacity: contiguous reservation vs paging, through the pool\n")
    s.append(f"![paging]({figs['fig3_paging'].name})\n")
    rows = [_sweep_row(r, comp[0]) for comp in comparisons for r in comp]
    s.append(markdown_table(_SWEEP_HEADER, rows) + "\n")
    s.append(f"`paged+prefix`: every request starts with the same {SHARED_PREFIX}-token system "
             "prompt, stored once and shared by `BlockPool.fork` (beyond the article). Its "
             "utilization counts distinct stored tokens; the logical tokens served per reserved "
             "slot are " + ", ".join(f"{comp[2].logical_per_reserved:.2f}" for comp in comparisons)
             + ".\n")
    w = waste_decomposition(run.workloads["uniform"], ARTICLE_MAX_LEN, 16, bpt)
    s.append("Waste per request over all 4,000 uniform requests (pools holding the whole "
             "workload):\n")
    s.append(markdown_table(["source", "tokens / request", "MiB / request"], [
        [f"reservation at {ARTICLE_MAX_LEN} (contiguous)", f"{w.reservation_waste_tokens:.2f}",
         f"{w.reservation_waste_bytes / MIB:.2f}"],
        ["partly filled last block (paged, b=16)", f"{w.last_block_waste_tokens:.2f}",
         f"{w.last_block_waste_bytes / MIB:.2f}"],
        ["ratio", "", f"{w.ratio:.1f}x"]]) + "\n")
    return s


def _video_section(gqa: MemoryLedger, videos: list[VideoSpec], figs: dict[str, Path]) -> list[str]:
    bpt = gqa.bytes_per_token
    s: list[str] = []
    s.append("## 4. Video\n")
    s.append(f"![video]({figs['fig4_video'].name})\n")
    variants = videos + [VideoSpec("5 s 720p, 2x2 patch", 5, 24, 1280, 720, patch=2),
                         VideoSpec("5 s 720p, causal VAE", 5, 24, 1280, 720,
                                   causal_first_frame=True)]
    s.append(markdown_table(
        ["video", "latent frames", "tokens / latent frame", "tokens", "KV GiB", "fits KV budget"],
        [[v.name, v.latent_frames, f"{v.tokens_per_latent_frame:,}", f"{v.tokens:,}",
          f"{v.kv_bytes(bpt) / GIB:.2f}", "yes" if v.kv_bytes(bpt) <= gqa.kv_budget_bytes else "no"]
         for v in variants]) + "\n")
    return s


def _traces_section(bsz_rows: Sequence[Any], traces: list[Workload], trace_results: list[list[SweepResult]],
                    trace_bsz: dict[str, list[Any]], figs: dict[str, Path]) -> list[str]:
    s: list[str] = []
    s.append("## 5. Block size and real traces (beyond the article)\n")
    s.append(f"![block size and traces]({figs['fig5_block_size_traces'].name})\n")
    s.append("Block-size sweep on the uniform workload. The `(all requests)` columns count "
             "all 4,000 requests in a pool sized to hold them; the `(admitted)` ones of "
             "sections 3 and 5 count only the requests the KV budget admits, another set of "
             "requests and so a slightly different number; `admitted` is under the KV budget. "
             "The article's expectation for the empty slots is (b-1)/2 when remainders are "
             "uniform:\n")
    s.append(markdown_table(
        ["block size", "empty slots / request", "(b-1)/2", _ALL_UTIL,
         "empty / mean length", _ALL_ENTRIES, "admitted"],
        [[r.block_size, f"{r.empty_slots_per_request:.1f}", f"{(r.block_size - 1) / 2:.1f}",
          fmt_pct(r.utilization, 3), f"{r.empty_over_length:.2%}",
          f"{r.table_entries_per_request:.1f}", r.admitted] for r in bsz_rows]) + "\n")
    s.append(f"Azure LLM inference traces 2023 ({AZURE_ATTRIBUTION}), length = prompt + "
             f"output, requests longer than {TRACE_MAX_LEN} tokens dropped ("
             + ", ".join(f"{wl.name}: {wl.dropped}" for wl in traces) + "), same KV budget:\n")
    rows = [_sweep_row(r, tr[0]) for tr in trace_results for r in tr]
    s.append(markdown_table(_SWEEP_HEADER, rows) + "\n")
    s.append(markdown_table(
        ["trace", "requests", "mean length", "p50", "p99", "max"],
        [[wl.name, len(wl), f"{wl.mean_length:.0f}", int(np.percentile(wl.lengths, 50)),
          int(np.percentile(wl.lengths, 99)), int(wl.lengths.max())] for wl in traces]) + "\n")
    s.append(markdown_table(
        ["trace", "block size", "empty slots / request", _ALL_UTIL, _ALL_ENTRIES,
         "admitted"],
        [[name, r.block_size, f"{r.empty_slots_per_request:.1f}", fmt_pct(r.utilization, 3),
          f"{r.table_entries_per_request:.1f}", r.admitted]
         for name, rs in trace_bsz.items() for r in rs]) + "\n")
    return s


def _closing(run: ArticleRun) -> list[str]:
    matched = sum(r.match for r in run.rows)
    head = "Appendix: the article's values beside pykvpool's"
    return ["## Closing note: the article's values beside pykvpool's\n",
            f"{matched} of {len(run.rows)} of the article's numbers come out of pykvpool's own "
            "code printed exactly as the article prints them "
            f"([every one beside the article's]({anchor(head)})). Not reproduced here on "
            "purpose: the article's own machine measurements (71.89 GB/s, 1201.61 GFLOP/s) "
            "and its toy-decoder timings depend on its machine; section 2 measures this one "
            "instead.\n"]


def roof_sentence(roof: Spread) -> str:
    """The measured roof with its spread, as the report states it (section 2 and the
    summary quote this one string)."""
    gb = [v / 1e9 for v in (roof.value, roof.low, roof.high)]
    return (f"{gb[0]:.1f} GB/s (median of the best {roof.k} of {len(roof.samples)} probes; all "
            f"probes {gb[1]:.1f}-{gb[2]:.1f} GB/s)")


def _roofline_text(gqa: MemoryLedger, measured: Measured, fig2: dict[str, Any]) -> list[str]:
    machine, kernel, roof = measured.machine, measured.kernel, measured.roof
    rule = ROOF_RULE
    settled = (f"the best {roof.k} agree within {roof.agreement:.1%}" if roof.stable else
               f"**the best {roof.k} did not settle within {rule.rel_tol:.0%}** (they span "
               f"{roof.agreement:.0%}: the machine was loaded; the roof is that uncertain)")
    s = [f"This machine: roof {roof_sentence(roof)}: the read bandwidth of the decode kernel's "
         "own cache pages (`pykvpool.read_bandwidth(cache=...)`), probed right after each timed "
         "kernel call, on the memory the kernel reads, and repeated until the best "
         f"{rule.k} probes of a kernel point agree within {rule.rel_tol:.0%} (at most "
         f"{rule.max_rounds} rounds or {rule.max_seconds:g} s per point); over all points "
         f"{settled}. A single probe on a shared machine can be several times too low; the "
         f"spread says how much this run's varied. A fresh 256 MiB buffer read at "
         f"{measured.fresh_bandwidth / 1e9:.2f} GB/s in the same run (one probe). "
         f"{machine.flops('fp32') / 1e9:.2f} GFLOP/s fp32 (`pykvpool.peak_flops`, best of two), "
         f"ridge {machine.ridge_point('fp32'):.1f} FLOP/byte. The article's machine: 71.89 GB/s, "
         "1201.61 GFLOP/s (a different machine: not a reproduced number).\n"]
    local = gqa.decode_bound(machine, seq_len=8192, batch=1, compute_dtype="fp32")
    s.append(f"{gqa.model.name} decode on this machine (same ledger, fp32 peak): step >= "
             f"{local.step_time * 1e3:.1f} ms at batch 1 and 8192 cached tokens, <= "
             f"{local.tokens_per_s:.2f} tokens/s "
             f"({'memory' if local.memory_bound else 'compute'} bound).\n")
    pts = fig2["kernel"]
    krows = [[k.group_size, k.batch, k.seq_len, f"{k.intensity:.2f}", f"{k.seconds * 1e3:.3f}",
              f"{k.flops_per_s / 1e9:.2f}", f"{k.bytes_per_s / 1e9:.2f}",
              f"{k.roof_bandwidth / 1e9:.2f}", f"{pt['share_of_roof']:.0%}"]
             for k, pt in zip(kernel, pts)]
    k0 = kernel[0]
    kv_mib = 2 * k0.num_kv_heads * k0.head_dim * k0.seq_len * k0.batch * 4 / 2**20
    s.append(f"pykvpool's decode kernel (`pykvpool.decode_attention`, f32 paged cache "
             f"filled through a `BlockPool`, {k0.num_kv_heads} KV heads, d={k0.head_dim}, "
             f"block 16, {kv_mib:.0f} MiB of K and V read per call, best call of the rounds "
             f"above after a warm-up, each followed by a read of the same cache; "
             f"{os.cpu_count()} CPUs visible, timings vary with machine load; `its cache read`: "
             "the point's settled probe, median of its best 3):\n")
    s.append(markdown_table(["g", "batch", "cached tokens", "FLOP/byte", "ms / call", "GFLOP/s",
                             "GB/s", "its cache read (GB/s)", "of the roof"], krows) + "\n")
    above = [pt for pt in pts if pt["above_roof"]]
    if above:
        s.append("**Above the measured roof**: " + ", ".join(
            f"g={pt['group_size']} at {pt['share_of_roof']:.0%}" for pt in above)
            + ". The kernel read its cache faster than the best bandwidth probe of the same "
            "pages did: the probe undershoots on this machine (load, timing), so the roof "
            "here is a lower bound.\n")
    else:
        s.append("Every kernel point lies at or below the roof measured on its own cache.\n")
    return s + _prefill_text(measured, fig2)


def _shrunk(points: Sequence[PrefillPoint]) -> str:
    """How each measured shape differs from its full-size one in ``PREFILL_SHAPES``
    (sequences, heads)."""
    full = {sh.name: sh for sh in PREFILL_SHAPES}
    parts = []
    for p in points:
        sh, f = p.shape, full.get(p.shape.name)
        if f is None:
            continue
        diff = []
        if sh.batch != f.batch:
            diff.append(f"{sh.batch} sequence{'s' * (sh.batch != 1)} instead of {f.batch}")
        if (sh.num_q_heads, sh.num_kv_heads) != (f.num_q_heads, f.num_kv_heads):
            diff.append(f"{sh.num_q_heads}/{sh.num_kv_heads} heads instead of "
                        f"{f.num_q_heads}/{f.num_kv_heads}")
        parts.append(f"{sh.name}: " + (", ".join(diff) or "full size"))
    return "; ".join(parts)


def _prefill_text(measured: Measured, fig2: dict[str, Any]) -> list[str]:
    """Section 2's prefill table: the multi-query kernel on the two prefill shapes, beside
    decode (same roof)."""
    peak = measured.machine.flops("fp32")
    rows = []
    for p, pt in zip(measured.prefill, fig2["prefill"]):
        sh = p.shape
        mask = "causal" if sh.chunk_size is None else f"block-causal, chunk {sh.chunk_size}"
        rows.append([sh.name, sh.batch, f"{sh.new_tokens} over {sh.cached_tokens}",
                     f"{sh.num_q_heads}/{sh.num_kv_heads}", mask, f"{p.intensity:.0f}",
                     f"{p.seconds * 1e3:.1f}", f"{p.flops_per_s / 1e9:.1f}",
                     f"{pt['share_of_roof']:.0%}" + (" (above)" if pt["above_roof"] else "")])
    s = ["pykvpool's multi-query kernel (`pykvpool.prefill_attention`, f32 paged cache "
         "filled through a `BlockPool`, d=128, block 16, best of 3 calls after a warm-up) on "
         "the prefill benchmark's shapes (`benches/bench_prefill.py`: text prefill and a video "
         f"chunk), beside decode on the same roof, run smaller ({_shrunk(measured.prefill)}): "
         "sequence lengths, masks and head ratios "
         "are the full shapes', so the FLOP/byte is theirs. "
         "FLOPs count the visible (query, key) pairs of the mask exactly "
         "(`4 x d x pairs x Hq`), bytes are K and V read once plus q and the output. "
         f"Right of the ridge ({measured.machine.ridge_point('fp32'):.1f} FLOP/byte) the roof "
         f"is the compute peak, {peak / 1e9:.2f} GFLOP/s:\n"]
    s.append(markdown_table(["shape", "sequences", "new over cached tokens", "heads q/kv",
                             "mask", "FLOP/byte", "ms / call", "GFLOP/s", "of the roof"],
                            rows) + "\n")
    if any(pt["above_roof"] for pt in fig2["prefill"]):
        s.append("A prefill point above the compute roof means the FMA probe undershot the "
                 "peak during this run (the machine is shared): the roof is a lower bound.\n")
    return s
