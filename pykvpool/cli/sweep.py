"""The ``pykvpool sweep`` subcommand: static capacity of a workload, contiguous vs paged
through the pool, the waste decomposition and a block-size sweep."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pykvpool._native import InvalidArgumentError
from pykvpool.cli.argtypes import MAX_BLOCK_SIZE, count, count_list, trace_columns
from pykvpool.cli._common import add_common, budget_data, budget_lines, ledger_from_args, write_outputs
from pykvpool.planning.ledger import GIB, MIB
from pykvpool.planning.sweeps import (
    BLOCK_SIZES,
    block_size_sweep,
    contiguous,
    paged,
    paged_shared_prefix,
    waste_decomposition,
)
from pykvpool.planning.workloads import (
    ARTICLE_MAX_LEN,
    Workload,
    article_heavy_tail,
    article_uniform,
    azure_trace,
    read_trace,
)
from pykvpool.progress import ProgressBar

__all__ = ["WORKLOADS", "add_subcommand", "main_sweep"]

WORKLOADS = ("uniform", "heavy", "azure-code", "azure-conv")
"""The built-in workloads ``--workload`` names (the article's two, the two Azure traces)."""


def _workload(args: argparse.Namespace) -> Workload:
    if args.trace:
        return read_trace(args.trace, args.columns)
    loaders: dict[str, Callable[[], Workload]] = {
        "uniform": article_uniform, "heavy": article_heavy_tail,
        "azure-code": lambda: azure_trace("code"), "azure-conv": lambda: azure_trace("conv")}
    return loaders[args.workload]()


def _check_sweep(args: argparse.Namespace, wl: Workload, cap: int, max_len: int) -> None:
    """Refuse before any progress bar what the sweeps would refuse half-way."""
    shortest = int(wl.lengths.min())
    if args.prefix is not None and args.prefix > shortest:
        raise InvalidArgumentError(f"--prefix {args.prefix} exceeds the shortest request ({shortest} tokens)")
    if max_len > MAX_BLOCK_SIZE:
        raise InvalidArgumentError(
            f"the contiguous policy reserves --max-len = {max_len:,} tokens as one block, above the "
            f"pool's largest block ({MAX_BLOCK_SIZE:,} tokens): give a smaller --max-len")
    for name, size in [("--max-len", max_len), ("--block-size", args.block_size),
                       *(("--block-sizes", b) for b in args.block_sizes)]:
        if size > cap:
            raise InvalidArgumentError(f"{name} {size:,} exceeds the KV capacity of {cap:,} tokens")


def main_sweep(args: argparse.Namespace) -> int:
    """Run ``pykvpool sweep``: print the policies, the waste and the block-size sweep (and
    write them under ``--out``). Returns 0.

    Raises:
        UnknownPresetError: an unknown model, hardware or dtype preset.
        InvalidArgumentError: a size above the KV capacity or the pool's largest block, a
            ``--prefix`` longer than the shortest request, no request within ``--max-len``,
            a budget the weights fill (BudgetError), a malformed trace (TraceFormatError).
        OSError: a trace cannot be read or ``--out`` cannot be written.
    """
    led = ledger_from_args(args)
    wl = _workload(args)
    max_len = args.max_len or (ARTICLE_MAX_LEN if args.workload in ("uniform", "heavy")
                               and not args.trace else led.model.max_context)
    if int(wl.lengths.min()) > max_len:
        raise InvalidArgumentError(f"every request of {wl.name} is longer than --max-len {max_len:,} tokens")
    wl = wl.clipped(max_len)
    cap, bpt = led.token_capacity, led.bytes_per_token
    _check_sweep(args, wl, cap, max_len)
    with ProgressBar("sweep", 3 + len(args.block_sizes), enabled=not args.quiet) as bar:
        results = [contiguous(wl, cap, max_len, bpt), paged(wl, cap, args.block_size, bpt)]
        bar(1)
        if args.prefix is not None:
            results.append(paged_shared_prefix(wl, cap, args.prefix, args.block_size, bpt))
        bar(2)
        waste = waste_decomposition(wl, max_len, args.block_size, bpt)
        bar(3)
        rows = block_size_sweep(wl, args.block_sizes, cap,
                                progress=lambda d, t: bar(3 + d, 3 + t))
    lines = [*budget_lines(led),
             f"workload {wl.name}: {len(wl)} requests (mean {wl.mean_length:.1f} tokens, "
             f"{wl.dropped} longer than {max_len} dropped)",
             "", "| policy | block | admitted | reserved GiB | used GiB | utilization | gain |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.policy} | {r.block_size} | {r.admitted} | {r.reserved_bytes / GIB:.2f} | "
                     f"{r.used_bytes / GIB:.2f} | {r.utilization:.2%} | {r.gain_over(results[0]):.2f}x |")
    lines += ["", f"waste per request: reservation {waste.reservation_waste_bytes / MIB:.2f} MiB, "
              f"last block {waste.last_block_waste_bytes / MIB:.2f} MiB ({waste.ratio:.0f}x)", "",
              "| block | empty slots / request | utilization | table entries / request | admitted |",
              "|---|---|---|---|---|"]
    for b in rows:
        lines.append(f"| {b.block_size} | {b.empty_slots_per_request:.1f} | {b.utilization:.3%} | "
                     f"{b.table_entries_per_request:.1f} | {b.admitted} |")
    text = "\n".join(lines)
    print(text)
    data = {"workload": wl.name, "requests": len(wl), "dropped": wl.dropped,
            "budget": budget_data(led), "capacity_tokens": cap, "bytes_per_token": bpt,
            "policies": [{**r.__dict__, "utilization": r.utilization} for r in results],
            "waste": waste.__dict__, "block_sizes": [b.__dict__ for b in rows]}
    write_outputs(args.out, "sweep", text + "\n", data)
    return 0


def add_subcommand(sub: Any) -> None:
    """Add the ``sweep`` subcommand to a ``pykvpool`` CLI's subparsers; it calls
    :func:`main_sweep`.

    Raises:
        argparse.ArgumentError: ``subparsers`` already has a command of that name (Python
            3.11 and later).
    """
    ps = sub.add_parser("sweep", help="static capacity: contiguous vs paged through BlockPool",
                        description="Greedy admission of a workload into the KV budget under "
                                    "each policy, the waste decomposition and a block-size sweep.")
    add_common(ps)
    ps.add_argument("--workload", choices=WORKLOADS, default="uniform",
                    help="built-in workload (default: the article's uniform one)")
    ps.add_argument("--trace", metavar="FILE",
                    help="a trace file instead: a CSV (Azure columns ContextTokens, GeneratedTokens "
                         "by default), a JSONL file (Mooncake columns by default) or one length "
                         "per line")
    ps.add_argument("--columns", type=trace_columns, metavar="prompt=NAME,output=NAME",
                    help="the CSV/JSONL fields holding prompt and output tokens")
    ps.add_argument("--max-len", type=count(),
                    help="contiguous reservation per request, tokens (default 4096 for the "
                         "article's workloads, else the model's context window); longer "
                         "requests are dropped")
    ps.add_argument("--block-size", type=count(1, MAX_BLOCK_SIZE), default=16, help="paged block size, tokens")
    ps.add_argument("--block-sizes", type=count_list(1, MAX_BLOCK_SIZE), default=list(BLOCK_SIZES),
                    help="comma-separated block sizes to sweep (default 1,2,4,...,256)")
    ps.add_argument("--prefix", type=count(0), default=None,
                    help="also run paged with a shared prefix of this many tokens")
    ps.set_defaults(func=main_sweep)
