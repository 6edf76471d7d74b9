"""Sweeps over arrival rates x scheduler policies x block sizes, and the ``pykvpool
simulate`` subcommand.

Runs execute on a thread pool: the engine releases the GIL for the whole run, so every
core works (a Python step-time callable re-takes the GIL per step and serializes). A
progress bar goes to stderr. Results come back in a deterministic order whatever the
completion order.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional, Sequence, TextIO, Union

from pykvpool.progress import ProgressBar
from pykvpool.simulate import (
    Roofline,
    SchedulerConfig,
    SimConfig,
    TimeModel,
    Workload,
    kv_blocks_for_memory,
    roofline,
    run,
    synthetic_workload,
)

__all__ = ["add_subcommand", "main_simulate", "sweep"]

#: A fixed workload (re-timed to each rate) or a function building one for a rate.
WorkloadSource = Union[Workload, Callable[[float], Workload]]


def _at_rate(source: WorkloadSource, rate: float) -> Workload:
    if callable(source):
        return source(rate)
    span = float(source.arrival.max() - source.arrival.min()) if len(source) > 1 else 0.0
    if span <= 0:
        return source
    base = (len(source) - 1) / span
    return source.scaled(time=base / rate)


def sweep(
    workload: WorkloadSource,
    rates: Sequence[float],
    policies: Mapping[str, Union[SchedulerConfig, SimConfig]],
    block_sizes: Sequence[int],
    capacity_tokens: int,
    time_model: TimeModel,
    workers: Optional[int] = None,
    progress: Optional[TextIO] = sys.stderr,
) -> list[dict[str, Any]]:
    """Run every (rate, policy, block size) and return one row per run: ``rate`` (req/s),
    ``label`` (policy name), ``block_size``, ``num_blocks`` (= ``capacity_tokens //
    block_size``, the same memory for every block size) and the run's summary. A policy
    is a :class:`SchedulerConfig`, or a whole :class:`SimConfig` (prefix caching and its
    eviction policy, ...) whose pool shape the sweep overrides.

    ``workload`` is re-timed to each rate when it is a :class:`Workload` (its mean rate is
    scaled), or called with the rate. ``workers`` defaults to every core; ``progress`` is
    the stream of the progress bar (None: no bar).

    Raises:
        InvalidArgumentError: a configuration the engine rejects (the first one met).
        Exception: whatever a callable ``workload`` or ``time_model`` raises.
    """
    jobs = [(r, name, bs) for r in rates for name in policies for bs in block_sizes]
    loads = {r: _at_rate(workload, r) for r in rates}

    def one(job: tuple[float, str, int]) -> dict[str, Any]:
        rate, name, bs = job
        pol = policies[name]
        base = pol if isinstance(pol, SimConfig) else SimConfig(num_blocks=1, scheduler=pol)
        cfg = dataclasses.replace(base, num_blocks=capacity_tokens // bs, block_size=bs)
        # A roofline's swap cost is per block: it follows the block size.
        tm = dataclasses.replace(time_model, block_size=bs) if isinstance(time_model, Roofline) else time_model
        res = run(loads[rate], cfg, tm)
        return {"rate": rate, "label": name, "block_size": bs, "num_blocks": cfg.num_blocks, **res.summary}

    rows: list[dict[str, Any]] = []
    with ProgressBar("simulation sweep", len(jobs), stream=progress, enabled=progress is not None) as bar, \
            ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as ex:
        futures = [ex.submit(one, j) for j in jobs]
        for f in futures:
            rows.append(f.result())
            bar(len(rows))
    return rows


# ---- CLI -------------------------------------------------------------------------------

_MOONCAKE = ("mooncake_fast25", "synthetic_trace.jsonl")


def _load(args: argparse.Namespace) -> Workload:
    from pykvpool import sim_traces
    from pykvpool.workloads import azure_trace_path

    if args.trace is None:
        return synthetic_workload(
            args.requests, arrivals="poisson", rate=args.rate or 10.0, seed=args.seed,
            prompt=("uniform", [args.prompt[0], args.prompt[1]]), output=("uniform", [args.output[0], args.output[1]]),
        )
    if args.trace in ("azure-conv", "azure-code"):
        path = str(azure_trace_path(args.trace.split("-")[1]))
    elif args.trace == "mooncake":
        path = os.path.join(args.data_dir, *_MOONCAKE)
    else:
        path = args.trace
    w = sim_traces.load_mooncake(path, args.limit) if path.endswith(".jsonl") else sim_traces.load_azure(path, args.limit)
    return w


def add_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``simulate`` on an argparse subparsers object; returns its parser.

    Raises:
        argparse.ArgumentError: ``subparsers`` already has a command of that name (Python
            3.11 and later).
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="replay a trace or a synthetic workload through the serving simulator",
        description="Step-level serving simulation over the pykvpool BlockPool (logical time).",
    )
    p.add_argument("--trace", help="azure-conv, azure-code, mooncake, or a CSV/JSONL path (default: synthetic)")
    p.add_argument("--data-dir", default=os.path.join("..", "shared", "data"),
                   help="folder holding mooncake_fast25/ (the Azure traces ship with the package)")
    p.add_argument("--limit", type=int, help="first N requests of the trace")
    p.add_argument("--requests", type=int, default=2000, help="synthetic: number of requests")
    p.add_argument("--rate", type=float, help="arrival rate, req/s (re-times a trace)")
    p.add_argument("--prompt", type=int, nargs=2, default=(256, 4096), metavar=("LO", "HI"))
    p.add_argument("--output", type=int, nargs=2, default=(128, 384), metavar=("LO", "HI"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--hardware", default="a100-80gb-sxm")
    p.add_argument("--num-blocks", type=int, help="device blocks (default: from model and hardware memory)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--max-batched-tokens", type=int, default=8192)
    p.add_argument("--no-chunked-prefill", action="store_true")
    p.add_argument("--allocation", choices=["paged", "reserve"], default="paged")
    p.add_argument("--preemption", choices=["recompute", "swap"], default="recompute")
    p.add_argument("--host-blocks", type=int, default=0)
    p.add_argument("--queue", choices=["fcfs", "priority"], default="fcfs")
    p.add_argument("--prefix-caching", action="store_true", help="cache prompts given as block keys (mooncake)")
    p.add_argument("--eviction", choices=["lru", "fifo", "lfu", "priority"], default="lru")
    p.add_argument("--out", help="folder for CSVs and figures")
    p.add_argument("--sweep-rates", help="comma-separated rates: sweep rates x allocations x block sizes")
    p.add_argument("--sweep-block-sizes", default="16", help="comma-separated block sizes for --sweep-rates")
    p.add_argument("--workers", type=int, help="sweep threads (default: every core)")
    p.set_defaults(func=main_simulate)
    return p


def _config(args: argparse.Namespace, allocation: str) -> SchedulerConfig:
    return SchedulerConfig(
        max_running=args.max_running,
        max_batched_tokens=args.max_batched_tokens,
        chunked_prefill=not args.no_chunked_prefill,
        allocation=allocation,  # type: ignore[arg-type]
        preemption=args.preemption,
        host_blocks=args.host_blocks,
        queue=args.queue,
    )


def main_simulate(args: argparse.Namespace) -> int:
    """Run ``pykvpool simulate``: print the summary (or the sweep table), and write CSVs and
    figures into ``--out`` when given. Returns the exit code.

    Raises:
        InvalidArgumentError: a configuration the engine rejects, or weights that leave no
            memory for KV; :class:`UnknownPresetError` for an unknown model or hardware.
        ValueError: a malformed trace row or ``--sweep-*`` list.
        KeyError: a trace without the expected columns.
        OSError: a trace cannot be read or an output cannot be written.
    """
    from pykvpool import sim_plots

    w = _load(args)
    if args.rate and args.trace is not None:
        w = _at_rate(w, args.rate)
    tm = roofline(args.model, args.hardware, args.block_size)
    num_blocks = args.num_blocks or kv_blocks_for_memory(tm.model, tm.hardware, args.block_size)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    if args.sweep_rates:
        rates = [float(x) for x in args.sweep_rates.split(",")]
        sizes = [int(x) for x in args.sweep_block_sizes.split(",")]
        policies = {
            a: SimConfig(num_blocks=1, scheduler=_config(args, a), prefix_caching=args.prefix_caching,
                         eviction=args.eviction)
            for a in ("paged", "reserve")
        }
        t0 = time.perf_counter()
        rows = sweep(w, rates, policies, sizes, num_blocks * args.block_size, tm, workers=args.workers)
        print(f"{len(rows)} runs in {time.perf_counter() - t0:.2f} s wall")
        print(f"{'rate':>8} {'policy':>8} {'bs':>4} {'tok/s':>10} {'req/s':>8} {'ttft p99':>9} {'preempt':>8}")
        for r in rows:
            print(
                f"{r['rate']:8.2f} {r['label']:>8} {r['block_size']:4d} {r['output_throughput']:10.1f} "
                f"{r['request_throughput']:8.2f} {r['ttft_p99']:9.3f} {r['preemptions']:8d}"
            )
        if args.out:
            sim_plots.throughput_vs_rate(rows, os.path.join(args.out, "throughput_vs_rate.png"))
        return 0
    cfg = SimConfig(
        num_blocks=num_blocks,
        block_size=args.block_size,
        scheduler=_config(args, args.allocation),
        prefix_caching=args.prefix_caching,
        eviction=args.eviction,
    )
    t0 = time.perf_counter()
    res = run(w, cfg, tm)
    wall = time.perf_counter() - t0
    print(f"{len(w)} requests, {num_blocks} blocks of {args.block_size} tokens, simulated in {wall:.3f} s wall")
    for k in sorted(res.summary):
        v = res.summary[k]
        print(f"  {k:<22} {v:.4g}" if isinstance(v, float) else f"  {k:<22} {v}")
    if args.out:
        res.to_csv(args.out)
        sim_plots.utilization_over_time(res, os.path.join(args.out, "utilization.png"))
        sim_plots.latency_cdf({"run": res}, "ttft", os.path.join(args.out, "ttft_cdf.png"))
    return 0
