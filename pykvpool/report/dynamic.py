"""The capacity report's dynamic section: the report's budget put under real traffic with
the serving simulator.

The Azure conversation trace (19,366 requests, one hour) is replayed at multiples of its
own rate through continuous batching on Llama-3-8B / A100 (roofline step times). The pool
is what the report's one budget leaves for KV after the weights
(:func:`pykvpool.simulate.kv_blocks_for_memory`, the number ``pykvpool simulate`` uses),
under three allocations: ``paged`` (vLLM defaults: 256 running, 8,192 batched tokens,
chunked prefill, recompute preemption of the newest), ``reserve`` (Orca: every request
reserves the model's context at admission; a request longer than that is rejected) and
``oracle`` (each request reserves its own final length: it knows output lengths, the most
favourable reservation). Every allocation goes through ``pykvpool.BlockPool``; times are
logical (the roofline's), so the section is reproducible bit for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from pykvpool.simulate import plots as sim_plots, traces as sim_traces
from pykvpool.planning.ledger import Budget
from pykvpool.report.figures import save_figure
from pykvpool.report.tables import Table, fmt_ms, fmt_pct, fmt_s
from pykvpool.simulate.sweep import at_rate, sweep
from pykvpool.simulate import (
    Roofline,
    SchedulerConfig,
    SimConfig,
    SimulationResult,
    kv_blocks_for_memory,
    roofline,
    run,
)
from pykvpool.planning.workloads import azure_trace_path

__all__ = ["BLOCK_SIZE", "RATE_FACTORS", "RATE_HEADER", "dynamic_section", "policies", "pool_blocks",
           "rate_table"]

#: Multiples of the trace's own mean arrival rate that the section replays.
RATE_FACTORS = (0.5, 1.0, 1.5, 2.0)
#: Tokens per block of the section's pool (vLLM's default block size).
BLOCK_SIZE = 16
MODEL, HARDWARE = "llama-3-8b", "a100-80gb-sxm"


def policies(context_tokens: int) -> dict[str, SchedulerConfig]:
    """The section's allocations; ``reserve`` holds ``context_tokens`` per request (the
    model's context window, tokens)."""
    return {
        "paged": SchedulerConfig(allocation="paged"),
        "reserve": SchedulerConfig(allocation="reserve", reserve_tokens=context_tokens),
        "oracle": SchedulerConfig(allocation="oracle"),
    }


def pool_blocks(roof: Roofline, budget: Budget) -> int:
    """Device blocks of :data:`BLOCK_SIZE` tokens that ``budget`` leaves for KV after the
    weights of ``roof.model`` (what ``pykvpool simulate`` uses for the same model and
    hardware).

    Raises:
        BudgetError: (an InvalidArgumentError) the weights plus the reserve leave no room
            for one block of KV.
    """
    return kv_blocks_for_memory(roof.model, roof.hardware, BLOCK_SIZE, budget=budget)


def _max_rel_gap(a: np.ndarray, b: np.ndarray) -> float:
    scale = np.maximum(np.abs(a), np.abs(b))
    return float(np.max(np.abs(a - b) / np.where(scale > 0, scale, 1.0), initial=0.0))


def dynamic_section(
    out_dir: Path, budget: Budget, progress: bool = True
) -> tuple[str, dict[str, Any], dict[str, Path]]:
    """Run the section's simulations under ``budget``, draw ``fig6_sim_utilization.png``,
    ``fig7_sim_throughput.png`` and ``fig8_sim_ttft_cdf.png`` into ``out_dir``, and return
    the Markdown, the data (with ``collisions``: figure name -> what the drawn figure hides,
    see :func:`pykvpool.report.figures.save_figure`) and the figures.

    Raises:
        FileNotFoundError: the packaged Azure trace is missing.
        InvalidArgumentError: the budget leaves no room for KV.
    """
    w = sim_traces.load_azure(azure_trace_path("conv"))
    roof = roofline(MODEL, HARDWARE, BLOCK_SIZE)
    num_blocks = pool_blocks(roof, budget)
    context = roof.model.max_context
    native = (len(w) - 1) / float(w.arrival[-1])
    rates = [round(native * f, 3) for f in RATE_FACTORS]
    pols = policies(context)
    rows = sweep(w, rates, pols, [BLOCK_SIZE], num_blocks * BLOCK_SIZE, roof,
                 progress=sys.stderr if progress else None)
    # The figures' runs are the table's runs at the trace's own rate: the same re-timed
    # workload (the rate as printed), so the text, the table and figures 6 and 8 agree.
    own_rate = rates[RATE_FACTORS.index(1.0)]
    own = at_rate(w, own_rate)
    at_native: dict[str, SimulationResult] = {
        name: run(own, SimConfig(num_blocks=num_blocks, block_size=BLOCK_SIZE, scheduler=pol), roof)
        for name, pol in pols.items()
    }
    figs = {k: out_dir / f"{k}.png" for k in ("fig6_sim_utilization", "fig7_sim_throughput", "fig8_sim_ttft_cdf")}
    util_title = f"paged, {own_rate} req/s (the trace's own rate)"
    util = sim_plots.utilization_over_time(at_native["paged"], num_blocks=num_blocks, block_size=BLOCK_SIZE)
    thr = sim_plots.throughput_vs_rate(rows)
    cdf_title = f"TTFT CDF at {own_rate} req/s (the trace's own rate)"
    cdf = sim_plots.latency_cdf(at_native, "ttft")
    drawn = {"fig6_sim_utilization": sim_plots.plot_utilization(util, num_blocks=num_blocks, title=util_title),
             "fig7_sim_throughput": sim_plots.plot_throughput_vs_rate(thr),
             "fig8_sim_ttft_cdf": sim_plots.plot_latency_cdf(cdf, "ttft", title=cdf_title)}
    hidden = {k: save_figure(fig, figs[k])["collisions"] for k, fig in drawn.items()}
    gap = max(_max_rel_gap(thr["oracle"][k], thr["paged"][k]) for k in ("output_throughput", "ttft_p99"))
    table = rate_table(rows)
    md = _markdown(w, roof, budget, num_blocks, native, rates, table, at_native, util, gap, figs)
    data = {"collisions": hidden, "budget": budget.describe(), "num_blocks": num_blocks, "block_size": BLOCK_SIZE,
            "reserve_tokens": context, "rates": rates, "rows": rows, "throughput_vs_rate": thr,
            "rejected": {k: int(r.summary["rejected"]) for k, r in at_native.items()},
            "peak_blocks_held": int(np.max(util["blocks_used"] + util["blocks_reserved"])),
            "oracle_vs_paged_max_rel_gap": gap,
            "styles": {k: sim_plots.line_style(k) for k in pols},
            "ttft_cdf_p50": {k: float(np.median(v[0])) for k, v in cdf.items()},
            "table": {"header": list(table.header), "rows": [list(r) for r in table.rows]}}
    return md, data, figs


#: Columns of the section's table (the summary page quotes its cells by these names).
RATE_HEADER = ("rate (req/s)", "policy", "output tok/s", "req/s", "TTFT p50 (s)", "TTFT p99 (s)",
               "TPOT p50 (ms)", "preemptions", "rejected", "peak running",
               "mean utilization (tokens / held slots)")


def rate_table(rows: list[dict[str, Any]]) -> Table:
    """The section's table: one row per (rate, policy) of the sweep, each number formatted
    once (the text quotes these cells).

    Raises:
        KeyError: a row lacks a field of :func:`pykvpool.simulate.sweep.sweep`'s rows.
    """
    return Table.of(RATE_HEADER, [
        [r["rate"], r["label"], f"{r['output_throughput']:.0f}", f"{r['request_throughput']:.2f}",
         fmt_s(r["ttft_p50"]), fmt_s(r["ttft_p99"]), fmt_ms(r["tpot_p50"]), r["preemptions"],
         r["rejected"], r["peak_running"], fmt_pct(r["mean_utilization"])] for r in rows])


def _binding(paged: dict[str, float], peak_blocks: int, num_blocks: int, occupancy: str) -> str:
    cap = SchedulerConfig().max_running
    if paged["peak_running"] >= cap and peak_blocks < num_blocks:
        return (f"With this budget the {cap}-request cap, not memory, limits paging: the queue "
                f"builds while the pool is at most {occupancy} occupied.")
    return "With this budget memory limits paging: the pool fills before the request cap."


def _markdown(w: Any, roof: Roofline, budget: Budget, num_blocks: int, native: float,
              rates: list[float], table: Table, at_native: dict[str, SimulationResult],
              util: dict[str, np.ndarray], gap: float, figs: dict[str, Path]) -> str:
    rate = str(rates[RATE_FACTORS.index(1.0)])

    def cell(policy: str, column: str) -> str:
        return table.cell(column, {RATE_HEADER[0]: rate, "policy": policy})

    p = at_native["paged"].summary
    context = roof.model.max_context
    busy = util["blocks_used"] > 0
    held = util["blocks_used"] + util["blocks_reserved"]
    peak = fmt_pct(held.max() / num_blocks, 1)
    rejected = int(at_native["reserve"].summary["rejected"])
    coincide = (f"The `oracle` curves coincide with `paged` (largest relative gap {gap:.2%}): "
                "they are drawn dashed with hollow squares on top of the solid paged line."
                if gap < 0.01 else f"`oracle` and `paged` differ by up to {gap:.1%}.")
    return "\n".join([
        "## 6. Dynamic serving: the budget under traffic (simulator)\n",
        f"The Azure conversation trace ({len(w):,} requests over {w.arrival[-1] / 60:.0f} min, "
        f"{native:.2f} req/s) replayed through continuous batching on {roof.model.name} / "
        f"{roof.hardware.name} (roofline step times). The pool is what the report's budget "
        f"({budget.describe()}) leaves for KV after the weights: **{num_blocks:,} blocks of "
        f"{BLOCK_SIZE} tokens**, the number `pykvpool simulate --model llama-3-8b --hardware "
        "a100-80gb-sxm` uses. `paged`: vLLM v1 defaults (256 running, 8,192 batched tokens, "
        "chunked prefill, recompute preemption of the newest). `reserve`: Orca, every request "
        f"reserves the model's context ({context:,} tokens) at admission; {rejected:,} "
        f"request{'s' if rejected != 1 else ''} longer than that {'are' if rejected != 1 else 'is'} "
        "rejected. `oracle`: each request reserves exactly its own final length (it knows "
        "output lengths, the most favourable reservation). Logical time; same inputs, same "
        "numbers. Reproduce with `pykvpool simulate --trace azure-conv --sweep-rates "
        + ",".join(str(r) for r in rates) + "`.\n",
        f"![utilization over time]({figs['fig6_sim_utilization'].name})\n",
        f"At the trace's own rate ({rate} req/s) under paging, the pool is at most "
        f"{int(held.max()):,} of {num_blocks:,} blocks full (peak occupancy "
        f"{peak}, mean {fmt_pct(np.mean(held[busy]) / num_blocks, 1)} while busy), "
        f"while the blocks held are {cell('paged', RATE_HEADER[10])} full of tokens on average "
        "(token utilization: only the last block of a request is partly empty); up to "
        f"{cell('paged', 'peak running')} requests run and up to {int(util['waiting'].max())} wait. "
        f"p99 TTFT {cell('paged', 'TTFT p99 (s)')} s, p50 TPOT {cell('paged', 'TPOT p50 (ms)')} ms. "
        f"Orca's reservation holds at most {cell('reserve', 'peak running')} requests in the same "
        f"memory (p99 TTFT {cell('reserve', 'TTFT p99 (s)')} s); the oracle peaks at "
        f"{cell('oracle', 'peak running')}. " + _binding(p, int(held.max()), num_blocks, peak) + "\n",
        f"![throughput vs rate]({figs['fig7_sim_throughput'].name})\n",
        coincide + "\n",
        table.markdown() + "\n",
        f"![TTFT CDF]({figs['fig8_sim_ttft_cdf'].name})\n",
        f"TTFT of the finished requests at {rate} req/s (the trace's own rate), log time "
        f"axis: median {cell('paged', 'TTFT p50 (s)')} s paged, {cell('reserve', 'TTFT p50 (s)')} s "
        f"reserve, {cell('oracle', 'TTFT p50 (s)')} s oracle.\n",
    ])
