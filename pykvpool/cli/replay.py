"""The ``pykvpool replay`` subcommand: replay a Mooncake trace through the prefix cache
(:mod:`pykvpool.prefix.replay`) and print, save or plot the hit rates."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

from pykvpool._native import TIER_EVICTION_POLICIES, InvalidArgumentError
from pykvpool.cli.argtypes import MAX_BLOCK_SIZE, add_quiet, count, count_list
from pykvpool.planning.models import MODELS, model_preset
from pykvpool.prefix.groups_replay import GroupReplayResult, compare_layouts
from pykvpool.prefix.replay import (
    POLICIES,
    TRACE_BLOCK_SIZE,
    ReplayResult,
    load_mooncake_trace,
    plot_sweep,
    replay,
    seen_prefix_hits,
    sweep,
)

__all__ = ["add_subcommand", "main_replay"]


def _table(results: Sequence[ReplayResult]) -> str:
    lines = ["| block size | policy | capacity (blocks) | capacity (tokens) | block hit rate | token hit rate | evictions |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        cap = f"{r.capacity_blocks} (unbounded)" if r.unbounded else str(r.capacity_blocks)
        lines.append(
            f"| {r.block_size} | {r.policy} | {cap} | {r.capacity_tokens:,} | {r.block_hit_rate:.4f} "
            f"| {r.token_hit_rate:.4f} | {r.evictions:,} |"
        )
    for r in results:
        for t in r.tiers:
            lines.append(f"\n{r.policy}, {t['tier']} tier: {t['stored']:,} blocks stored, {t['hits']:,} hits, "
                         f"{t['evicted']:,} evicted, {t['gated']:,} kept out by the reuse gate")
    return "\n".join(lines)


def add_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``replay`` subcommand to a ``pykvpool`` CLI's subparsers; it calls
    :func:`main_replay`.

    Raises:
        argparse.ArgumentError: ``subparsers`` already has a command of that name (Python
            3.11 and later).
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="prefix-cache hit rates of a block-id trace (Mooncake format)",
        description="Replay a trace of chained block ids through a prefix-caching pool and "
        "print hit rates; --sweep covers capacities x policies x block sizes and can plot "
        "hit rate vs capacity.",
    )
    p.add_argument("--trace", metavar="FILE",
                   help="Mooncake JSONL trace, or 'mooncake' (default: the shipped FAST'25 synthetic trace)")
    p.add_argument("--policy", choices=(*POLICIES, "all"),
                   help="eviction policy (default all; with --model one of lru, fifo, lfu, default lru)")
    p.add_argument("--capacity", type=count(), metavar="BLOCKS", help="pool capacity in blocks (default: unbounded)")
    p.add_argument("--block-size", type=count(1, MAX_BLOCK_SIZE),
                   help="tokens per block, a divisor or a multiple of 512 (default 512; with --model 16)")
    p.add_argument("--sweep", action="store_true", help="sweep capacities x policies x block sizes")
    p.add_argument("--capacities", type=count_list(), metavar="TOKENS,...", help="sweep capacities in tokens")
    p.add_argument("--block-sizes", type=count_list(1, MAX_BLOCK_SIZE), metavar="TOKENS,...", help="sweep block sizes (default 512)")
    p.add_argument("--plot", metavar="FILE", help="with --sweep: write the hit-rate-vs-capacity figure")
    p.add_argument("--retain-hits-for", type=count(), metavar="OPS",
                   help="priority policy: soft-pin each reused prefix for OPS pool operations")
    p.add_argument("--model", choices=MODELS, metavar="MODEL",
                   help="replay through a BlockPool laid out for MODEL's layer kinds (windows reuse only "
                   "the window before a hit) against the same model with every layer global, at equal "
                   "bytes; --capacities in whole-model tokens (default 1,000,000 and 3,000,000)")
    p.add_argument("--host-blocks", type=count(1), metavar="BLOCKS",
                   help="a host tier below the pool: evicted blocks go there and come back on a hit")
    p.add_argument("--disk-blocks", type=count(1), metavar="BLOCKS",
                   help="a disk tier below the host tier (needs --host-blocks)")
    p.add_argument("--reuse-gate", type=count(1, 255), metavar="N",
                   help="store a block below the pool only once its key was seen N times")
    p.add_argument("--write-through", action="store_true", default=None,
                   help="copy each cached block to the host tier once computed, not only when evicted")
    p.add_argument("--tier-eviction", choices=TIER_EVICTION_POLICIES,
                   help="the tiers' order (default: --policy's); s3fifo resists scans")
    p.add_argument("--tiers", action="store_true",
                   help="with --capacity: a host tier of 4x and a disk tier of 16x the pool's blocks "
                   "(unless --host-blocks / --disk-blocks say otherwise)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--out", metavar="DIR",
                   help="write replay.md and replay.json there (and replay.png with --sweep)")
    add_quiet(p)
    p.set_defaults(func=main_replay)
    return p


def _groups_table(pairs: Sequence[tuple[GroupReplayResult, GroupReplayResult]]) -> str:
    lines = ["| capacity (GiB) | layout | policy | blocks | token hit rate | evictions |",
             "|---:|---|---|---:|---:|---:|"]
    for pair in pairs:
        for r in pair:
            lines.append(f"| {r.capacity_bytes / 2**30:.2f} | {r.layout} | {r.policy} | {r.num_blocks:,} | "
                         f"{r.token_hit_rate:.4f} | {r.evictions:,} |")
    return "\n".join(lines)


def _main_groups(args: argparse.Namespace, trace: Sequence[Any]) -> int:
    """``replay --model``: the model's hybrid layout against all-global layers."""
    if args.sweep or args.capacity is not None or args.block_sizes:
        raise InvalidArgumentError("--model takes --capacities (whole-model tokens), --block-size, --policy and "
                                   "--retain-hits-for only")
    if args.policy == "all":
        raise InvalidArgumentError("--model replays one eviction policy, got all")
    model = model_preset(args.model)
    per_token = model.all_global().kv_bytes_per_token()
    tokens = args.capacities or [1_000_000, 3_000_000]
    policy = args.policy or "lru"
    pairs = compare_layouts(trace, model, [t * per_token for t in tokens], args.block_size or 16, policy,
                            args.retain_hits_for)
    table = _groups_table(pairs)
    print(f"{len(trace)} requests; {model.name} (windows) vs every layer global, equal bytes")
    print(table)
    data = [r.as_dict() for pair in pairs for r in pair]
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        md = os.path.join(args.out, "replay.md")
        with open(md, "w", encoding="utf-8") as f:
            f.write(f"# Prefix reuse with layer groups\n\n{len(trace)} requests\n\n{table}\n")
        print(f"wrote {md}")
    for path in ([args.json] if args.json else []) + ([os.path.join(args.out, "replay.json")] if args.out else []):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        print(f"wrote {path}")
    return 0


def main_replay(args: argparse.Namespace) -> int:
    """Run the ``replay`` subcommand; prints a Markdown table. Returns 0.

    Raises:
        InvalidArgumentError: ``--plot`` without ``--sweep``; a ``--capacity`` (blocks)
            below the trace's largest request or above the pool's limit (2**30 blocks); a
            block size (tokens) that neither divides 512 nor is a multiple of it; ``--model``
            with a sweep option or ``--policy all``; a tier option with ``--sweep``,
            ``--model`` or ``--policy priority``, or one the pool refuses; ``--tiers``
            without ``--capacity``. (A sweep skips the capacities below the
            largest request and always replays the unbounded pool.)
        TraceFormatError: (an InvalidArgumentError) a malformed trace, named by file and
            line (see :func:`load_mooncake_trace`).
        OSError: the trace cannot be read, or ``--out``, ``--json`` or ``--plot`` cannot
            be written.
        ValueError: matplotlib cannot write the format of a ``--plot`` file's suffix.
    """
    if args.plot and not args.sweep:
        raise InvalidArgumentError("--plot needs --sweep")
    if args.tiers:
        if args.capacity is None:
            raise InvalidArgumentError("--tiers sizes the tiers from --capacity; give it")
        args.host_blocks = args.host_blocks or 4 * args.capacity
        args.disk_blocks = args.disk_blocks or 16 * args.capacity
    tiers = {"host_blocks": args.host_blocks, "disk_blocks": args.disk_blocks, "reuse_gate": args.reuse_gate,
             "tier_eviction": args.tier_eviction, "write_through": args.write_through}
    if any(v is not None for v in tiers.values()) and (args.sweep or args.model or args.policy == "priority"):
        raise InvalidArgumentError("--host-blocks, --disk-blocks, --reuse-gate, --tier-eviction and "
                                   "--write-through replay the policies lru, fifo and lfu, without --sweep or --model")
    trace = load_mooncake_trace(None if args.trace in (None, "mooncake") else args.trace)
    if args.model:
        return _main_groups(args, trace)
    args.block_size = args.block_size or TRACE_BLOCK_SIZE
    policies = POLICIES if args.policy in (None, "all") else (args.policy,)
    if args.sweep:
        results = sweep(trace, args.capacities, policies, args.block_sizes or (args.block_size,),
                        retain_hits_for=args.retain_hits_for)
    else:
        if tiers["host_blocks"] is not None:
            policies = tuple(p for p in policies if p != "priority")
        results = [replay(trace, args.capacity, policy=p, block_size=args.block_size,
                          retain_hits_for=args.retain_hits_for if p == "priority" else None, **tiers)
                   for p in policies]
    hits, total = seen_prefix_hits(trace)
    print(f"{len(trace)} requests, {total:,} blocks of {TRACE_BLOCK_SIZE} tokens; "
          f"longest previously seen prefix: {hits:,} blocks = {hits / max(total, 1):.4f}")
    print(_table(results))
    if args.plot:
        plot_sweep(results, args.plot)
        print(f"wrote {args.plot}")
    json_paths = [args.json] if args.json else []
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        md = os.path.join(args.out, "replay.md")
        with open(md, "w", encoding="utf-8") as f:
            f.write(f"# Prefix-cache replay\n\n{len(trace)} requests; unbounded rule: {hits:,} of "
                    f"{total:,} blocks ({hits / max(total, 1):.4f})\n\n{_table(results)}\n")
        json_paths.append(os.path.join(args.out, "replay.json"))
        print(f"wrote {md}")
        if args.sweep:
            png = os.path.join(args.out, "replay.png")
            plot_sweep(results, png)
            print(f"wrote {png}")
    for path in json_paths:
        with open(path, "w", encoding="utf-8") as f:
            json.dump([r.as_dict() for r in results], f, indent=1)
        print(f"wrote {path}")
    return 0
