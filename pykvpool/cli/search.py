"""The ``pykvpool search`` subcommand: a deployment search (:mod:`pykvpool.search`) over
hardware, device counts, KV dtypes, block sizes, scheduler limits and policies, for a
trace or a synthetic workload under latency SLOs, on a process pool or Ray; then the cost
vs latency frontiers at a reference rate (:mod:`pykvpool.search.latency`)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any, Optional

from pykvpool._native import InvalidArgumentError
from pykvpool.cli.argtypes import (
    MAX_BLOCK_SIZE,
    add_quiet,
    choice_list,
    hardware_list,
    count,
    count_list,
    kv_dtype_list,
    number,
    trace_columns,
)
from pykvpool.planning.hardware import HARDWARE
from pykvpool.planning.models import DTYPES, model_preset
from pykvpool.search import (
    DEFAULT_PRICES,
    PRICES_SOURCE,
    SLO,
    Backend,
    Objective,
    RateLadder,
    SearchSpace,
    search,
)
from pykvpool.search.backends import session
from pykvpool.search.slo import SLO_ATTAINMENT, SLO_BOUNDS
from pykvpool.search.latency import LatencyResult, reference_latency
from pykvpool.search.scaling import SCALING_MODEL, rate_text, scaling_note
from pykvpool.search.space import EVICTIONS, MAX_DEVICES, PREEMPTIONS, TENSOR_PARALLEL, canonical_split
from pykvpool.simulate.engine import MAX_STEP_TOKENS
from pykvpool.simulate.workload import Workload, synthetic_workload

__all__ = ["add_subcommand", "main_search"]

_SLO_KEYS = (*SLO_BOUNDS, *SLO_ATTAINMENT)


def _onoff(text: str) -> list[bool]:
    vals = choice_list(("on", "off"))(text)
    return [v == "on" for v in vals]


def _splits(text: str) -> list[str]:
    """``colocated`` and ``P:D`` ratios, comma-separated, no repeats."""
    try:
        items = [canonical_split(item) for item in text.split(",")]
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"a split is given twice in {text!r}")
    return items


def _slo(text: str) -> SLO:
    """``NAME:key=value,...`` with keys ttft_p99, tpot_p50, tpot_p99 (s), min_throughput (tok/s),
    ttft, tpot (per-request bounds, s) and attainment (their share, default 0.9)."""
    name, sep, rest = text.partition(":")
    if not sep or not rest:
        raise argparse.ArgumentTypeError(f"expected NAME:key=value,..., got {text!r}")
    bounds: dict[str, float] = {}
    for part in rest.split(","):
        key, eq, val = part.partition("=")
        if not eq or key.strip() not in _SLO_KEYS:
            raise argparse.ArgumentTypeError(f"{part!r}: keys are {', '.join(_SLO_KEYS)}")
        bounds[key.strip()] = number()(val.strip())
    try:
        return SLO(name.strip(), **bounds)
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _ladder(text: str) -> RateLadder:
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected LO,HI,STEPS, got {text!r}")
    try:
        return RateLadder(number()(parts[0]), number()(parts[1]), count(1, 1000)(parts[2]))
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``search`` on an argparse subparsers object; returns its parser.

    Raises:
        argparse.ArgumentError: ``subparsers`` already has a command of that name (Python
            3.11 and later).
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "search", help="find the best serving configuration for a workload and its SLOs",
        description="Simulate every configuration of a search space at a ladder of arrival rates, find "
                    "the rate each sustains within the SLOs, and rank them by goodput per device, per "
                    "dollar or per kW; then run every configuration at one reference rate per SLO for the cost vs "
                    "latency frontier. Results are appended to OUT/points.jsonl and OUT/latency.jsonl as "
                    "they finish; rerunning the same search into OUT skips what is done. " + SCALING_MODEL
                    + " A configuration whose rate per device is above what fewer devices in smaller "
                    "tensor-parallel groups give (beyond the KV its sharded weights free) is flagged superlinear "
                    "and not ranked; a rate at the ladder's top is a lower bound, printed '>= HI'.")
    w = p.add_argument_group("workload (re-timed to each rate)")
    w.add_argument("--trace", metavar="NAME|FILE", help="azure-conv, azure-code, mooncake (shipped), or a CSV, "
                   "JSONL or lengths file (default: synthetic)")
    w.add_argument("--columns", type=trace_columns, metavar="SPEC", help="CSV/JSONL fields (as `simulate`)")
    w.add_argument("--limit", type=count(), help="first N requests of the trace")
    w.add_argument("--requests", type=count(1, 1_000_000), help="synthetic: requests (default 1000)")
    w.add_argument("--prompt", type=count(), nargs=2, default=(256, 4096), metavar=("LO", "HI"))
    w.add_argument("--output", type=count(), nargs=2, default=(128, 384), metavar=("LO", "HI"))
    w.add_argument("--seed", type=count(0, 2**63 - 1), default=0)
    w.add_argument("--model", default="llama-3-8b", help="model preset (default llama-3-8b)")
    s = p.add_argument_group("SLOs (seconds; at least one bound)")
    s.add_argument("--ttft-p99", type=number(), metavar="S")
    s.add_argument("--tpot-p50", type=number(), metavar="S")
    s.add_argument("--tpot-p99", type=number(), metavar="S")
    s.add_argument("--min-throughput", type=number(), metavar="TOK/S", help="output tokens/s")
    s.add_argument("--slo", type=_slo, action="append", metavar="NAME:K=V,...",
                   help="a named SLO, repeatable: bounds on statistics, e.g. chat:ttft_p99=1,tpot_p99=0.05, or "
                        "DistServe's goodput: per-request bounds a share of requests meets, e.g. "
                        "goodput:ttft=1,tpot=0.05,attainment=0.9 (keys: " + ", ".join(_SLO_KEYS) + ")")
    g = p.add_argument_group("search space (comma-separated lists; a flag given overrides --space's axis)")
    g.add_argument("--space", metavar="FILE", help="a JSON object of axes, each a list, by SearchSpace's field "
                   "names: " + ", ".join(_AXES.values()) + ' (e.g. {"devices": [1, 2, 4], "tensor_parallel": [1, 4]})')
    g.add_argument("--hardware", type=hardware_list(), metavar="H,...",
                   help=f"hardware presets: {', '.join(HARDWARE)} (or h100, a100, ...; default a100-80gb-sxm)")
    g.add_argument("--devices", type=count_list(1, MAX_DEVICES), metavar="N,...",
                   help="devices of a deployment, split into replicas of --tp devices each (default 1)")
    g.add_argument("--tp", type=count_list(1, MAX_DEVICES), metavar="T,...",
                   help="tensor-parallel degrees: devices per replica, each a group whose steps add ring "
                        "all-reduces over the device link; a deployment of N devices takes each T that divides "
                        f"N, as N/T replicas behind a shortest-queue router (default {','.join(map(str, TENSOR_PARALLEL))})")
    g.add_argument("--kv-dtypes", type=kv_dtype_list(), metavar="D,...",
                   help=f"KV storage dtypes: {', '.join(DTYPES)} (aliases such as fp16 read as their "
                        "one spelling, f16; fp8 and int8 take :head, :gN or :tensor; default bf16)")
    g.add_argument("--block-sizes", type=count_list(1, MAX_BLOCK_SIZE), help="tokens per block (default 16)")
    g.add_argument("--max-running", type=count_list(), help="requests in flight at most (default 256)")
    g.add_argument("--max-batched-tokens", type=count_list(1, MAX_STEP_TOKENS), help="tokens per step (default 8192)")
    g.add_argument("--chunked-prefill", type=_onoff, metavar="on,off", help="(default on)")
    g.add_argument("--preemption", type=choice_list(PREEMPTIONS), help="(default recompute)")
    g.add_argument("--prefix-caching", type=_onoff, metavar="on,off", help="(default off)")
    g.add_argument("--eviction", type=choice_list(EVICTIONS), help="(default lru)")
    g.add_argument("--layer-groups", type=_onoff, metavar="on,off", help="(default off)")
    g.add_argument("--pd", type=_splits, metavar="SPLIT,...",
                   help="prefill/decode disaggregation: 'colocated' (every replica serves both phases) or "
                        "prefill:decode ratios such as 1:1 or 1:3, each where P+D divides the replicas, the KV "
                        "moved over the devices' network; 1:1@h100 puts the decode instances on another preset "
                        "(default colocated)")
    r = p.add_argument_group("strategy, objective and backend")
    r.add_argument("--rates", type=_ladder, default=RateLadder(), metavar="LO,HI,STEPS",
                   help="arrival rates tried, req/s, log-spaced (default 0.5,64,22)")
    r.add_argument("--strategy", choices=("pruned", "grid"), default="pruned")
    r.add_argument("--objective", choices=("per-device", "per-dollar", "per-watt"), default="per-device",
                   help="rank by req/s per device, requests per dollar (--prices) or req/s per kW of the "
                        "devices' maximum board power (the presets' datasheet TDP)")
    r.add_argument("--prices", metavar="FILE", help="JSON {hardware: dollars per device-hour} (default: "
                   f"{', '.join(f'{k} ${v:.2f}' for k, v in DEFAULT_PRICES.items())}; {PRICES_SOURCE})")
    r.add_argument("--workers", type=count(1, 4096), help="processes, or local Ray CPUs (default: every core)")
    r.add_argument("--inline", action="store_true", help="run in this process (no pool)")
    r.add_argument("--ray", action="store_true", help="start a local Ray for the search")
    r.add_argument("--ray-address", metavar="ADDR", help="join the Ray cluster at ADDR")
    r.add_argument("--latency-rate", type=number(), metavar="REQ/S",
                   help="the reference rate of the cost vs latency frontier: every configuration's p99 TTFT "
                        "and TPOT at this arrival rate (default: each SLO's best point's sustained rate)")
    r.add_argument("--no-latency", action="store_true",
                   help="skip the runs at the reference rate (no frontier_latency.csv / .png)")
    p.add_argument("--out", required=True, metavar="DIR", help="results folder (resumable)")
    p.add_argument("--no-figures", action="store_true")
    add_quiet(p)
    p.set_defaults(func=main_search)
    return p


def _workload(args: argparse.Namespace) -> Workload:
    from pykvpool.simulate import traces
    from pykvpool.tracefile import NAMED_TRACES, named_trace_path

    for name, (lo, hi) in {"prompt": args.prompt, "output": args.output}.items():
        if lo > hi:
            raise InvalidArgumentError(f"--{name} LO HI: LO ({lo}) must be <= HI ({hi})")
    if args.trace is None:
        if args.columns is not None or args.limit is not None:
            raise InvalidArgumentError("--columns and --limit need --trace")
        return synthetic_workload(args.requests or 1000, rate=1.0, seed=args.seed,
                                  prompt=("uniform", list(args.prompt)), output=("uniform", list(args.output)))
    if args.requests is not None:
        raise InvalidArgumentError("--requests sizes the synthetic workload; with --trace use --limit")
    path = named_trace_path(args.trace) if args.trace in NAMED_TRACES else args.trace
    if not os.path.exists(path):
        raise InvalidArgumentError(f"{path}: no such file, nor a trace shipped with pykvpool "
                                   f"({', '.join(sorted(NAMED_TRACES))})")
    return traces.load_file(path, args.columns, limit=args.limit, seed=args.seed,
                            output=(args.output[0], args.output[1]))


def _slos(args: argparse.Namespace) -> list[SLO]:
    flat = {k: getattr(args, k) for k in SLO_BOUNDS if getattr(args, k) is not None}
    slos = list(args.slo or [])
    if flat:
        slos.insert(0, SLO("slo", **flat))
    if not slos:
        raise InvalidArgumentError("give at least one SLO bound (--ttft-p99, --tpot-p50, --tpot-p99, "
                                   "--min-throughput or --slo)")
    if len({s.name for s in slos}) != len(slos):
        raise InvalidArgumentError("--slo: two SLOs of one name")
    return slos


#: The space's axes: option destination -> SearchSpace field (the --space file's keys).
_AXES = {"hardware": "hardware", "devices": "devices", "tp": "tensor_parallel", "kv_dtypes": "kv_dtypes",
         "block_sizes": "block_sizes", "max_running": "max_running", "max_batched_tokens": "max_batched_tokens",
         "chunked_prefill": "chunked_prefill", "preemption": "preemption", "prefix_caching": "prefix_caching",
         "eviction": "eviction", "layer_groups": "layer_groups", "pd": "disaggregation"}
#: Most bytes a --space file may hold.
_SPACE_BYTES = 1 << 20


def _space(args: argparse.Namespace) -> SearchSpace:
    """The search space: each axis from its flag, else from ``--space``'s file, else
    SearchSpace's default."""
    from pykvpool.tracefile import read_json

    doc: dict[str, Any] = {}
    if args.space is not None:
        loaded = read_json(args.space, _SPACE_BYTES)
        if not isinstance(loaded, dict):
            raise InvalidArgumentError(f"--space {args.space}: expected a JSON object of axes, got "
                                       f"{type(loaded).__name__}")
        unknown = [k for k in loaded if k not in _AXES.values()]
        if unknown:
            raise InvalidArgumentError(f"--space {args.space}: unknown axis {unknown[0]!r} (axes: "
                                       f"{', '.join(_AXES.values())})")
        doc = loaded
    axes = {field: tuple(v) if isinstance(v := getattr(args, dest), list) else v
            for dest, field in _AXES.items()}
    for field, value in doc.items():
        if axes[field] is None:
            axes[field] = tuple(value) if isinstance(value, list) else value
    try:
        return SearchSpace(**{k: v for k, v in axes.items() if v is not None})
    except (TypeError, InvalidArgumentError) as e:
        if args.space is None:
            raise
        raise InvalidArgumentError(f"--space {args.space}: {e}") from None


def _objective(args: argparse.Namespace) -> Objective:
    kind = args.objective.replace("-", "_")
    if args.prices is None:
        return Objective(kind)
    from pykvpool.tracefile import read_json

    prices = read_json(args.prices)
    if not isinstance(prices, dict):
        raise InvalidArgumentError(f"--prices {args.prices}: expected a JSON object {{hardware: $/hour}}")
    try:
        return Objective(kind, prices)
    except TypeError as e:
        raise InvalidArgumentError(f"--prices {args.prices}: {e}") from None


def _backend(args: argparse.Namespace) -> Backend:
    if sum((args.inline, args.ray, args.ray_address is not None)) > 1:
        raise InvalidArgumentError("--inline, --ray and --ray-address exclude each other")
    if args.inline:
        return Backend("inline")
    if args.ray or args.ray_address is not None:
        if importlib.util.find_spec("ray") is None:  # optional (the ray extra), untyped
            raise InvalidArgumentError("--ray needs Ray: pip install 'pykvpool[ray]'")
        return Backend("ray", args.workers, args.ray_address)
    return Backend("process", args.workers)


def _fmt(v: Optional[float], digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def _print_latency(lat: LatencyResult, slos: list[SLO], cost_unit: str) -> None:
    print(f"latency at the reference rate ({lat.source}): {len(lat.entries)} configurations, "
          f"{lat.evaluated} simulated in {lat.seconds:.1f} s")
    for s in slos:
        rate = lat.rates[s.name]
        if rate is None:
            print(f"SLO {s.name}: no reference rate (no configuration sustains any rate)")
            continue
        parts = []
        for m, label in (("ttft_p99", "p99 TTFT"), ("tpot_p99", "p99 TPOT")):
            pts = [f for f in lat.frontier if (f["slo"], f["basis"], f["metric"]) == (s.name, "reference", m)]
            ends = [f"{_fmt(f['latency'])} s at {f['cost']:g} {cost_unit.rstrip('s') if f['cost'] == 1 else cost_unit}"
                    for f in pts[:1] + pts[1:][-1:]]
            parts.append(f"{label} {' down to '.join(ends) or '-'} ({len(pts)} frontier point{'s' * (len(pts) != 1)})")
        print(f"SLO {s.name} at {rate:.3g} req/s: " + "; ".join(parts))


def _attained(row: dict[str, Any], slo: SLO, n: int) -> str:
    """``, 93.2% of requests within ttft 1 s, tpot 0.05 s`` for an SLO of per-request
    bounds whose row holds the count; else nothing."""
    got = row.get(f"{slo.name}_attained")
    if slo.attainment is None or got is None or n <= 0:
        return ""
    bounds = ", ".join(f"{k} {v:g} s" for k, v in (("ttft", slo.ttft), ("tpot", slo.tpot)) if v is not None)
    return f", {got / n:.1%} of requests within {bounds}"


def _print_best(rows: list[dict[str, Any]], best: dict[str, Any], slos: list[SLO], ladder: RateLadder, unit: str,
                front: dict[str, list[dict[str, Any]]], requests: int) -> None:
    """The scaling model in one line, then per SLO its best point (a rate at the ladder's
    top printed as ``>= top``; with per-request bounds, the share of the ``requests``
    that met them) and the superlinear points it did not rank."""
    flagged = {s.name: [r for r in rows if r.get(f"{s.name}_superlinear")] for s in slos}
    print(scaling_note(len({r["key"] for f in flagged.values() for r in f})))
    for s in slos:
        b, n = best[s.name], s.name
        skipped = (f"; {len(flagged[n])} superlinear configuration{'s' * (len(flagged[n]) != 1)} not ranked"
                   if flagged[n] else "")
        if b is None:
            print(f"SLO {n}: no configuration sustains {ladder.lo:g} req/s{skipped}")
            continue
        print(f"SLO {n}: best {b['key']}: {rate_text(b[n + '_rate'], b[n + '_rate_is_lower_bound'])} req/s "
              f"sustained, {b[n + '_objective']:.3g} {unit}; ttft p99 {_fmt(b[n + '_ttft_p99'])} s, "
              f"tpot p50/p99 {_fmt(b[n + '_tpot_p50'])}/{_fmt(b[n + '_tpot_p99'])} s, "
              f"{_fmt(b[n + '_output_throughput'], 4)} tok/s{_attained(b, s, requests)}; frontier: "
              f"{len(front[n])} points{skipped}")
        if b[n + "_rate_is_lower_bound"]:
            print(f"pykvpool: warning: SLO {n}: the best point sustains the top rate, so at least "
                  f"{ladder.hi:g} req/s; raise --rates HI to tell the best ones apart", file=sys.stderr)


def main_search(args: argparse.Namespace) -> int:
    """Run ``pykvpool search``: print the scaling model, the best point per SLO (points
    flagged superlinear are not ranked) and the ends of each cost vs latency frontier,
    and write the tables and figures into ``--out``. Returns 0.

    Raises:
        InvalidArgumentError and its subclasses (bad options, trace, prices or SLOs;
            ``--out`` holding another search), OSError.
    """
    slos, objective, backend = _slos(args), _objective(args), _backend(args)
    model = model_preset(args.model)
    space = _space(args)
    if args.no_latency and args.latency_rate is not None:
        raise InvalidArgumentError("--latency-rate and --no-latency exclude each other")
    w = _workload(args)
    progress = None if args.quiet else sys.stderr
    lat: Optional[LatencyResult] = None
    with session(backend):
        res = search(w, model, space, slos, ladder=args.rates, objective=objective, strategy=args.strategy,
                     backend=backend, out=args.out, progress=progress)
        if not args.no_latency:
            lat = reference_latency(res, rate=args.latency_rate, backend=backend, out=args.out, progress=progress)
    print(f"{len(res.rows)} configurations of {model.name} on {len(w)} requests ({args.strategy}, {backend.kind}): "
          f"{res.evaluated} evaluated in {res.seconds:.1f} s, {sum(r.get('sims', 0) for r in res.rows)} simulations")
    _print_best(res.rows, res.best, slos, args.rates, objective.unit, res.frontier, len(w))
    cost = objective.cost_unit
    if lat is not None:
        _print_latency(lat, slos, cost)
        res.files += lat.files
    if not args.no_figures:
        from pykvpool.search.figures import draw_figures, draw_latency_figure

        res.files += [str(p) for p in draw_figures(args.out, res.rows, [s.name for s in slos], cost)]
        if lat is not None:
            res.files.append(str(draw_latency_figure(args.out, res.rows, lat.entries, slos, lat.rates, len(w), cost)))
    print(f"wrote {', '.join(os.path.basename(f) for f in res.files)} in {args.out}")
    return 0
