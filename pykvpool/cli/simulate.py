"""The ``pykvpool simulate`` subcommand: one simulator run, or a sweep over rates, policies
and block sizes (:func:`pykvpool.simulate.sweep.sweep`), with tables and figures."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional

from pykvpool.simulate import plots as sim_plots
from pykvpool._native import EVICTION_POLICIES, InvalidArgumentError
from pykvpool.cli.argtypes import (
    MAX_BLOCK_SIZE,
    add_budget_args,
    add_quiet,
    budget_from_args,
    choice_list,
    count,
    count_list,
    number,
    number_list,
    trace_columns,
)
from pykvpool.planning.ledger import GIB, MemoryLedger
from pykvpool.planning.models import storage_dtype
from pykvpool.planning.pool_groups import pool_layout
from pykvpool.planning.roofline import Roofline, roofline
from pykvpool.simulate.engine import (
    SchedulerConfig,
    SimConfig,
    Workload,
    kv_blocks_for_memory,
    run,
    synthetic_workload,
)
from pykvpool.simulate.metrics import summary_lines
from pykvpool.simulate.sweep import at_rate, sweep
from pykvpool.simulate.workload import check_prefix_caching

__all__ = ["ALLOCATIONS", "MAX_SYNTHETIC_REQUESTS", "add_subcommand", "main_simulate"]

#: Allocation policies of the simulator: blocks on demand, Orca-style reservation of the
#: maximum length (``--reserve-tokens``, default the model's context), each request's
#: own final length (an oracle that knows output lengths).
ALLOCATIONS = ("paged", "reserve", "oracle")
#: Largest pool, blocks (``BlockPool`` refuses larger ones).
MAX_BLOCKS = 1 << 30
#: Largest synthetic workload ``--requests`` accepts (memory: ~200 bytes per request).
MAX_SYNTHETIC_REQUESTS = 1_000_000


def _load(args: argparse.Namespace) -> tuple[Workload, bool]:
    """The workload of the options, and whether its arrival times are a trace's own."""
    from pykvpool.simulate import traces as sim_traces
    from pykvpool.tracefile import NAMED_TRACES, named_trace_path, read_table

    rate = args.rate or 10.0
    lo_hi = {"prompt": args.prompt, "output": args.output}
    for name, (lo, hi) in lo_hi.items():
        if lo > hi:
            raise InvalidArgumentError(f"--{name} LO HI: LO ({lo}) must be <= HI ({hi})")
    if args.trace is None:
        if args.columns is not None or args.limit is not None:
            raise InvalidArgumentError("--columns and --limit need --trace")
        return synthetic_workload(
            args.requests or 2000, arrivals="poisson", rate=rate, seed=args.seed,
            prompt=("uniform", list(args.prompt)), output=("uniform", list(args.output)),
        ), False
    if args.requests is not None:
        raise InvalidArgumentError("--requests sizes the synthetic workload; with --trace use --limit")
    path = named_trace_path(args.trace) if args.trace in NAMED_TRACES else args.trace
    if not os.path.exists(path):
        raise InvalidArgumentError(f"{path}: no such file, nor a trace shipped with pykvpool "
                                   f"({', '.join(sorted(NAMED_TRACES))})")
    table = read_table(path, args.columns, limit=args.limit)
    w = sim_traces.from_table(table, rate=rate, seed=args.seed, output=(args.output[0], args.output[1]))
    return w, table.time is not None


def _workload(args: argparse.Namespace) -> tuple[Workload, str]:
    """The workload the options describe, at the rate they ask for, and the line that says
    where its arrival times come from."""
    if args.rate is not None and args.sweep_rates:
        raise InvalidArgumentError("--rate and --sweep-rates both set the arrival rate: give one")
    if args.rate_scale is not None:
        if args.rate is not None or args.sweep_rates:
            raise InvalidArgumentError("--rate-scale multiplies the trace's own rate, --rate and --sweep-rates "
                                       "set a rate: give one")
        if args.trace is None:
            raise InvalidArgumentError("--rate-scale re-times a trace; a synthetic workload's rate is --rate")
    w, timed = _load(args)
    if args.prefix_caching:
        check_prefix_caching(w, "--prefix-caching")
    if args.rate is not None and args.trace is not None:
        w = at_rate(w, args.rate)
    if not timed:
        source = "synthetic" if args.trace is None else "a trace without times"
        how = f"{source}: Poisson at {args.rate or 10.0:g} req/s"
    elif args.rate is not None:
        how = f"the trace's times re-timed to a mean of {args.rate:g} req/s (--rate)"
    else:
        how = "the trace's own times"
    if args.rate_scale is not None:
        w = w.rate_scaled(args.rate_scale)
        how += f", divided by {args.rate_scale:g} (--rate-scale)"
    if args.sweep_rates:
        how += "; the sweep re-times it to each of --sweep-rates"
    span = float(w.arrival.max() - w.arrival.min()) if len(w) > 1 else 0.0
    mean = f", {(len(w) - 1) / span:.3g} req/s mean" if span > 0 else ""
    return w, f"arrivals         {len(w):,} requests over {span:,.1f} s{mean} ({how})"


def add_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``simulate`` on an argparse subparsers object; returns its parser.

    Raises:
        argparse.ArgumentError: ``subparsers`` already has a command of that name (Python
            3.11 and later).
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="replay a trace or a synthetic workload through the serving simulator",
        description="Step-level serving simulation over the pykvpool BlockPool (logical time). "
        "The pool is the KV budget of the model on the device (the budget `pykvpool ledger` "
        "prints) unless --num-blocks says otherwise.",
    )
    w = p.add_argument_group("workload")
    w.add_argument("--trace", metavar="NAME|FILE",
                   help="azure-conv, azure-code, mooncake (shipped with pykvpool), or a CSV, JSONL or "
                        "one-length-per-line file (default: a synthetic workload)")
    w.add_argument("--columns", type=trace_columns, metavar="SPEC",
                   help="CSV/JSONL fields, e.g. prompt=ContextTokens,output=GeneratedTokens,time=TIMESTAMP"
                        "[,priority=P][,keys=K][,unit=s|ms|us] (default: Azure or Mooncake names; "
                        "a trace without times arrives at --rate)")
    w.add_argument("--limit", type=count(), help="first N requests of the trace")
    w.add_argument("--requests", type=count(1, MAX_SYNTHETIC_REQUESTS),
                   help=f"synthetic: number of requests, at most {MAX_SYNTHETIC_REQUESTS:,} (default 2000)")
    w.add_argument("--rate", type=number(), metavar="R",
                   help="arrival rate, req/s. Synthetic: Poisson at R (default 10); a trace with times "
                        "replays them (default) or, with --rate, is re-timed to a mean rate of R; a trace "
                        "without times (a lengths file) arrives as Poisson at R (default 10)")
    w.add_argument("--rate-scale", type=number(), metavar="X",
                   help="a trace at X times its own rate: every arrival time divided by X (2: twice "
                        "the rate, 0.5: half); not with --rate or --sweep-rates, which set the rate")
    w.add_argument("--prompt", type=count(), nargs=2, default=(256, 4096), metavar=("LO", "HI"),
                   help="synthetic prompt tokens, uniform in [LO, HI]")
    w.add_argument("--output", type=count(), nargs=2, default=(128, 384), metavar=("LO", "HI"),
                   help="output tokens, uniform in [LO, HI] (synthetic; split of a lengths file)")
    w.add_argument("--seed", type=count(0, 2**63 - 1), default=0)
    m = p.add_argument_group("model, device and pool")
    m.add_argument("--model", default="llama-3-8b", help="model preset (default llama-3-8b)")
    m.add_argument("--hardware", default="a100-80gb-sxm", help="device preset (default a100-80gb-sxm)")
    add_budget_args(m)
    m.add_argument("--num-blocks", type=count(1, MAX_BLOCKS),
                   help=f"device blocks, at most {MAX_BLOCKS:,} (default: the budget's KV in blocks)")
    m.add_argument("--block-size", type=count(1, MAX_BLOCK_SIZE), default=16, help="tokens per block")
    m.add_argument("--layer-groups", action="store_true",
                   help="one BlockPool group per attention kind of the model (vLLM's hybrid layout: "
                        "windowed layers keep only their window), blocks of one group's layers")
    s = p.add_argument_group("scheduler")
    s.add_argument("--max-running", type=count(), default=256)
    s.add_argument("--max-batched-tokens", type=count(), default=8192)
    s.add_argument("--no-chunked-prefill", action="store_true")
    s.add_argument("--allocation", choices=ALLOCATIONS, default="paged",
                   help="paged (on demand), reserve (the maximum length at admission) or oracle "
                        "(each request's own final length)")
    s.add_argument("--reserve-tokens", type=count(),
                   help="tokens `reserve` holds per request (default: the model's context window)")
    s.add_argument("--preemption", choices=["recompute", "swap"], default="recompute")
    s.add_argument("--host-blocks", type=count(0, MAX_BLOCKS), default=0, help="swap: host pool, blocks")
    s.add_argument("--queue", choices=["fcfs", "priority"], default="fcfs")
    s.add_argument("--prefix-caching", action="store_true",
                   help="cache prompts given as token ids or block keys (mooncake); "
                        "refused for a workload of lengths only")
    s.add_argument("--eviction", choices=EVICTION_POLICIES, default="lru")
    g = p.add_argument_group("sweep")
    g.add_argument("--sweep-rates", type=number_list(), metavar="R,...",
                   help="comma-separated rates: sweep rates x allocations x block sizes")
    g.add_argument("--sweep-block-sizes", type=count_list(1, MAX_BLOCK_SIZE), default=[16], metavar="B,...",
                   help="comma-separated block sizes for --sweep-rates (default 16)")
    g.add_argument("--sweep-allocations", type=choice_list(ALLOCATIONS), default=list(ALLOCATIONS),
                   metavar="A,...", help="allocations for --sweep-rates (default paged,reserve,oracle)")
    g.add_argument("--workers", type=count(1, 1024), help="sweep threads (default: every core)")
    p.add_argument("--out", help="folder for CSVs and figures")
    add_quiet(p)
    p.set_defaults(func=main_simulate)
    return p


def _config(args: argparse.Namespace, allocation: str, reserve_tokens: int) -> SchedulerConfig:
    return SchedulerConfig(
        max_running=args.max_running,
        max_batched_tokens=args.max_batched_tokens,
        chunked_prefill=not args.no_chunked_prefill,
        allocation=allocation,  # type: ignore[arg-type]
        reserve_tokens=reserve_tokens if allocation == "reserve" else None,
        preemption=args.preemption,
        host_blocks=args.host_blocks,
        queue=args.queue,
    )


def _pool(args: argparse.Namespace, tm: Roofline) -> tuple[int, list[str]]:
    """KV capacity in tokens and the lines that say where it comes from."""
    bs = args.block_size
    if args.num_blocks is not None:
        return args.num_blocks * bs, [f"pool             {args.num_blocks:,} blocks of {bs} tokens (--num-blocks)"]
    budget = budget_from_args(args, tm.hardware)
    blocks = kv_blocks_for_memory(tm.model, tm.hardware, bs, budget=budget, kv_dtype=tm.kv_dtype)
    led = MemoryLedger(tm.model, budget, storage_dtype(tm.kv_dtype))
    return led.token_capacity, [
        f"budget           {budget.describe()} on {tm.hardware.name}",
        f"KV budget        {budget.available_bytes / GIB:.2f} GiB - {led.weight_bytes / GIB:.2f} GiB weights "
        f"({tm.model.name}) = {led.kv_budget_bytes / GIB:.2f} GiB = {led.token_capacity:,} tokens "
        f"= {led.token_capacity // bs:,} blocks of {bs} tokens",
        *([] if blocks == led.token_capacity // bs else [
            f"                 (without --layer-groups the simulator's pool keeps every layer's full "
            f"history; {tm.model.name}'s hybrid pool has {blocks:,} blocks of {bs} tokens x "
            f"{pool_layout(tm.model, led.dtype, bs).layers_per_group} layers)"]),
    ]


def _reserve_tokens(args: argparse.Namespace, tm: Roofline) -> int:
    uses = args.allocation == "reserve" if not args.sweep_rates else "reserve" in args.sweep_allocations
    if args.reserve_tokens is not None and not uses:
        raise InvalidArgumentError("--reserve-tokens applies to the reserve allocation only")
    rt: int = args.reserve_tokens or tm.model.max_context
    return rt


def _cell(value: Optional[float], width: int, digits: int) -> str:
    """``value`` right-aligned in ``width`` characters; a statistic over no request (None)
    prints as ``-``."""
    return f"{'-':>{width}}" if value is None else f"{value:{width}.{digits}f}"


def main_simulate(args: argparse.Namespace) -> int:
    """Run ``pykvpool simulate``: print the budget, the summary (or the sweep table), and
    write CSVs and figures into ``--out`` when given. Returns the exit code.

    Raises:
        InvalidArgumentError and its subclasses (bad options, trace or budget), OSError.
    """
    if args.layer_groups and args.sweep_rates:
        raise InvalidArgumentError("--layer-groups does not combine with --sweep-rates")
    tm = roofline(args.model, args.hardware, args.block_size)
    rt = _reserve_tokens(args, tm)
    capacity, lines = _pool(args, tm)
    w, arrivals = _workload(args)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    print("\n".join([*lines, arrivals]))
    if args.sweep_rates:
        return _run_sweep(args, w, tm, capacity, rt)
    groups = None
    num_blocks = capacity // args.block_size
    if args.layer_groups:
        layout = pool_layout(tm.model, tm.kv_dtype, args.block_size)
        groups = tuple(layout.specs())
        if args.num_blocks is None:
            num_blocks = kv_blocks_for_memory(tm.model, tm.hardware, args.block_size,
                                              budget=budget_from_args(args, tm.hardware), kv_dtype=tm.kv_dtype)
        print(f"layer groups     {layout.describe()}: {num_blocks:,} group blocks")
    cfg = SimConfig(
        num_blocks=num_blocks,
        block_size=args.block_size,
        scheduler=_config(args, args.allocation, rt),
        prefix_caching=args.prefix_caching,
        eviction=args.eviction,
        groups=groups,
    )
    if cfg.num_blocks < 1:
        raise InvalidArgumentError(f"--block-size {args.block_size} exceeds the pool of {capacity} tokens")
    t0 = time.perf_counter()
    res = run(w, cfg, tm)
    wall = time.perf_counter() - t0
    print(f"{len(w)} requests, {cfg.num_blocks} blocks of {args.block_size} tokens, {args.allocation} "
          f"allocation, simulated in {wall:.3f} s wall")
    block_bytes = (pool_layout(tm.model, tm.kv_dtype, args.block_size).block_bytes if groups
                   else args.block_size * tm.model.kv_bytes_per_token(storage_dtype(tm.kv_dtype)))
    print("\n".join(summary_lines(res.summary, block_bytes)))
    if not res.summary.get("finished"):
        print(f"pykvpool: warning: no request finished ({res.summary.get('rejected', 0)} of {len(w)} "
              "rejected: never admissible with this pool and scheduler); latencies are n/a", file=sys.stderr)
    if args.out:
        res.to_csv(args.out)
        sim_plots.utilization_over_time(res, os.path.join(args.out, "utilization.png"),
                                        num_blocks=cfg.num_blocks, block_size=args.block_size)
        sim_plots.latency_cdf({"run": res}, "ttft", os.path.join(args.out, "ttft_cdf.png"))
    return 0


def _run_sweep(args: argparse.Namespace, w: Workload, tm: Roofline, capacity: int, rt: int) -> int:
    policies = {
        a: SimConfig(num_blocks=1, scheduler=_config(args, a, rt), prefix_caching=args.prefix_caching,
                     eviction=args.eviction)
        for a in args.sweep_allocations
    }
    t0 = time.perf_counter()
    rows = sweep(w, args.sweep_rates, policies, args.sweep_block_sizes, capacity, tm, workers=args.workers,
                 progress=None if args.quiet else sys.stderr)
    print(f"{len(rows)} runs in {time.perf_counter() - t0:.2f} s wall")
    # units: rate and completed requests req/s, block size tokens, output tokens/s, p99 TTFT s
    print(f"{'rate req/s':>10} {'policy':>8} {'block':>5} {'blocks':>8} {'out tok/s':>10} {'done req/s':>10} "
          f"{'p99 TTFT s':>10} {'preempts':>8}")
    for r in rows:
        print(
            f"{r['rate']:10.2f} {r['label']:>8} {r['block_size']:5d} {r['num_blocks']:8d} "
            f"{_cell(r['output_throughput'], 10, 1)} {_cell(r['request_throughput'], 10, 2)} "
            f"{_cell(r['ttft_p99'], 10, 3)} {r['preemptions']:8d}"
        )
    if args.out:
        sim_plots.throughput_vs_rate(rows, os.path.join(args.out, "throughput_vs_rate.png"))
    return 0
