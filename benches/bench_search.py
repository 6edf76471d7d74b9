"""Deployment search at scale: 1,000 configurations on the Azure conversation
trace, each evaluated at the rate it sustains within the SLO, on the process pool (1 and 2
workers) and on a local Ray (2 CPUs); Ray's overhead over the process pool; Ray's task
rate and the object-store sizes the on-paper scaling to a cluster needs.

The space (1,500 points, cut to the first ``max_running`` values that hold ``--configs``
of them: 1,200 for 1,000; chains of 3: one device, two as two replicas or as one
tensor-parallel group): A100-80GB and H100 SXM x those 3
splits x KV bf16 or fp8 x block sizes 8..128 x ``max_running`` 32..512 x
``max_batched_tokens`` 1,024..16,384. SLO: p99 TTFT 2 s, p99 TPOT 0.1 s; rates 0.5..64
req/s in 22 log-spaced rungs; the pruned strategy (bisection per point, hints along
devices). ``--limit`` requests of the trace (default 1000: the first 1,000 of 19,366; 0:
the whole trace, which costs about 15x more per simulation, measured by ``sim_seconds``
below).

Load-independent figures beside the times: simulations per configuration, and CPU
seconds per simulation (the pool's workers' CPU time over the simulations they ran).
``--levers N`` measures each lever of the search on the first N configurations (process
pool, 2 workers): neither, the neighbour hints alone, the early stop alone, both.

Each search runs end to end (``pykvpool.search.search``: pool or Ray start included, Ray's
``init`` also timed alone). The overhead ratio is measured in ``--rounds`` extra rounds
of a ``--ratio-configs`` slice, process pool (2 workers) and Ray (2 CPUs) back to back in
alternating order: the median of the per-round ratios and their IQR.

``--pd``: only a disaggregated search (:data:`PD_SPACE`: 1,200 points for 1,000, every one
a prefill/decode split), process pool, 2 workers.

Run: ``python benches/bench_search.py [--configs 1000] [--limit 1000] [--rounds 3] [--levers 200]``, or
``--ratios-only --warm [--ratio-configs 400]`` for the overhead rounds alone on a Ray
started before the timer (its start timed apart); writes ``benches/out/bench_search.json``
(``bench_search_warm.json``) and prints the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from pykvpool import search as ds
from pykvpool.planning.models import model_preset
from pykvpool.search.backends import run_chains
from pykvpool.search.evaluate import SearchSpec, evaluate_batch, families_of
from pykvpool.search.strategies import chains_of
from pykvpool.simulate import run, traces
from pykvpool.simulate.sweep import at_rate
from pykvpool.tracefile import named_trace_path

SPACE = ds.SearchSpace(hardware=("a100-80gb-sxm", "h100-sxm"), devices=(1, 2), kv_dtypes=("bf16", "fp8"),
                       block_sizes=(8, 16, 32, 64, 128), max_running=(32, 64, 128, 256, 512),
                       max_batched_tokens=(1024, 2048, 4096, 8192, 16384))
#: ``--pd``: the same axes on 2 or 4 devices split into prefill and decode instances
#: (1:1 or 3:1 of one-device or two-device replicas where the split divides them: 4
#: points per configuration), a disaggregated search.
PD_SPACE = dataclasses.replace(SPACE, devices=(2, 4), tensor_parallel=(1, 2), disaggregation=("1:1", "3:1"))
SLOS = (ds.SLO("chat", ttft_p99=2.0, tpot_p99=0.1),)
LADDER = ds.RateLadder(0.5, 64.0, 22)


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed_search(w: Any, space: ds.SearchSpace, backend: ds.Backend) -> tuple[float, ds.SearchResult]:
    t = time.perf_counter()
    res = ds.search(w, model_preset("llama-3-8b"), space, SLOS, ladder=LADDER, backend=backend, progress=None)
    return time.perf_counter() - t, res


def levers(w: Any, space: ds.SearchSpace) -> dict[str, Any]:
    """Each lever alone and both (process pool, 2 workers): wall s, simulations per
    configuration, worker CPU s per simulation; the rates equal in every variant."""
    model = model_preset("llama-3-8b")
    fams = families_of(chains_of(space.points(model, False)))
    out: dict[str, Any] = {}
    rates = {}
    for name, stop, hints in (("neither", False, False), ("hints", False, True), ("stop", True, False),
                              ("both", True, True)):
        spec = SearchSpec(w, model, SLOS, LADDER, ds.Objective(), early_stop=stop, neighbour_hints=hints)
        rows: list[dict[str, Any]] = []
        c0, t0 = children_cpu(), time.perf_counter()
        run_chains(spec, fams, ds.Backend("process", 2), rows.extend)
        wall, cpu = time.perf_counter() - t0, children_cpu() - c0
        sims = sum(r["sims"] for r in rows)
        rates[name] = sorted((r["key"], r["chat_rate"]) for r in rows)
        out[name] = {"wall_s": wall, "sims_per_config": sims / len(rows), "cpu_s_per_sim": cpu / sims,
                     "cpu_s_per_config": cpu / len(rows)}
        print(f"lever {name}: {wall:.1f} s, {sims / len(rows):.2f} sims/config, {cpu / sims:.3f} CPU s/sim", flush=True)
    out["same_rates"] = all(r == rates["neither"] for r in rates.values())
    return out


def sliced(n: int, base: ds.SearchSpace = SPACE) -> ds.SearchSpace:
    """The first points of ``base``: the bench's space cut to ``n`` points (whole chains)."""
    per = len(base.points(model_preset("llama-3-8b"), False)) // len(base.max_running)  # points per max_running
    mr = base.max_running[: max(1, min(len(base.max_running), -(-n // per)))]
    return dataclasses.replace(base, max_running=mr)


def ray_task_rate(n: int) -> dict[str, float]:
    """Tasks/s a local Ray (2 CPUs) sustains on empty tasks, and its init time."""
    import ray

    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    init = time.perf_counter() - t
    noop = ray.remote(num_cpus=1)(lambda x: x)
    ray.get([noop.remote(i) for i in range(50)])
    t = time.perf_counter()
    ray.get([noop.remote(i) for i in range(n)])
    rate = n / (time.perf_counter() - t)
    ray.shutdown()
    return {"init_s": init, "noop_tasks_per_s": rate, "noop_tasks": n}


def sizes(w: Any, full: Any) -> dict[str, float]:
    """Bytes crossing to workers: the pickled spec (limited and full trace), a row."""
    model = model_preset("llama-3-8b")
    spec = SearchSpec(w, model, SLOS, LADDER, ds.Objective())
    full_spec = SearchSpec(full, model, SLOS, LADDER, ds.Objective())
    chain = chains_of(SPACE.points(model, False))[0]
    rows = evaluate_batch(spec, [[chain]])
    return {"spec_bytes": len(pickle.dumps(spec)), "full_trace_spec_bytes": len(pickle.dumps(full_spec)),
            "row_bytes": len(pickle.dumps(rows)) / len(rows), "point_bytes": len(pickle.dumps(chain)) / len(chain)}


def sim_seconds(w: Any, full: Any, reps: int = 3) -> dict[str, float]:
    """Median seconds of one simulation (default point, 8 req/s) on the limited and full trace."""
    cfg, tm = ds.deploy(SPACE.points(model_preset("llama-3-8b"), False)[0], model_preset("llama-3-8b"))
    out = {}
    for name, wl in (("limited", w), ("full", full)):
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            run(at_rate(wl, 8.0), cfg, tm)
            ts.append(time.perf_counter() - t)
        out[f"sim_s_{name}"] = statistics.median(ts)
    return out


def replay(rows_file: str) -> dict[str, float]:
    """Simulations per configuration of other hint rules, without simulating: the
    search replayed on the sustained rungs of a finished run (``bench_search_rows.json``),
    meeting the SLO being ``rung <= sustained`` (the monotonicity the search assumes).
    Family rules (fields a family may vary in) x where a second device count's guess
    comes from (the neighbour chain's same devices, or the same chain's fewer devices)."""
    from pykvpool.search import evaluate as ev

    rows = {r["key"]: r for r in json.loads(Path(rows_file).read_text())}
    rates = LADDER.rates()
    sustained = {k: rates.index(r["chat_rate"]) if r["chat_rate"] else -1 for k, r in rows.items()
                 if r["chat_state"] in ("ok", "none")}
    chains = chains_of([p for p in SPACE.points(model_preset("llama-3-8b"), False) if p.key() in rows])
    saved = ev.FAMILY_FREE

    def per_config(free: tuple[str, ...], neighbour_first: bool, hints: bool) -> float:
        ev.FAMILY_FREE = free
        total = n = 0
        for fam in ev.families_of(chains):
            h = ev._Hints()
            for chain in fam:
                mine, prev, best = h.start(chain), None, 0.0
                for p in chain:
                    n += 1
                    if best >= rates[-1] / p.devices:
                        continue  # dominated
                    k, calls = sustained[p.key()], set()
                    near = h.neighbour((p.devices, p.tensor_parallel), "chat") if hints else None
                    guess = prev if near is None or (not neighbour_first and prev is not None) else near
                    ev.sustained_rung(lambda i: calls.add(i) or i <= k, len(rates), "pruned", guess, hints)
                    total += len(calls | ({k} if k >= 0 else set()))
                    prev = mine[((p.devices, p.tensor_parallel), "chat")] = k
                    best = max(best, (rates[k] if k >= 0 else 0.0) / p.devices)
        return total / n

    out = {"previous search": per_config(saved, True, False)}
    for free in (("max_batched_tokens",), saved, ("block_size", *saved), ("kv_dtype", "block_size", *saved)):
        for first in (True, False):
            out[f"{'+'.join(free)} / {'neighbour' if first else 'fewer devices'} first"] = per_config(free, first, True)
    ev.FAMILY_FREE = saved
    return out


def main_runs(w: Any, full: Any, space: ds.SearchSpace, out: dict[str, Any]) -> None:
    """The search on the process pool (1, 2 workers) and a local Ray (2 CPUs), end to end."""
    out.update(sim_seconds(w, full))
    out.update(sizes(w, full))
    out.update(ray_task_rate(2000))
    runs = {}
    for name, b in (("process2", ds.Backend("process", 2)), ("ray2", ds.Backend("ray", 2)),
                    ("process1", ds.Backend("process", 1))):
        c0 = children_cpu()
        secs, res = timed_search(w, space, b)
        runs[name] = res.rows
        out[f"{name}_s"] = secs
        out["simulations"] = sims = sum(r["sims"] for r in res.rows)
        out["sims_per_config"] = sims / len(res.rows)
        if name.startswith("process"):
            out[f"{name}_cpu_s_per_sim"] = (children_cpu() - c0) / sims
        print(f"{name}: {secs:.1f} s ({sims / len(res.rows):.2f} sims/config), load {os.getloadavg()}", flush=True)
        print(json.dumps(out), flush=True)  # what is measured so far
    out["identical_rows"] = runs["process1"] == runs["process2"] == runs["ray2"]
    Path("benches/out").mkdir(parents=True, exist_ok=True)
    Path("benches/out/bench_search_rows.json").write_text(json.dumps(
        [{k: r[k] for k in ("key", "chat_state", "chat_rate", "sims")} for r in runs["process2"]]))
    out["speedup_2_workers"] = out["process1_s"] / out["process2_s"]
    out["ray_over_process_1000"] = out["ray2_s"] / out["process2_s"]


def pd_search(w: Any, space: ds.SearchSpace) -> None:
    """The disaggregated search, end to end on the process pool (2 workers); writes
    ``benches/out/bench_search_pd.json``."""
    c0 = children_cpu()
    secs, res = timed_search(w, space, ds.Backend("process", 2))
    sims = sum(r["sims"] for r in res.rows)
    split = sum(r["disaggregation"] != "colocated" for r in res.rows)
    out = {"requests": len(w), "points": len(res.rows), "disaggregated_points": split, "process2_s": secs,
           "simulations": sims, "sims_per_config": sims / len(res.rows),
           "cpu_s_per_sim": (children_cpu() - c0) / sims, "load": list(os.getloadavg())}
    Path("benches/out").mkdir(parents=True, exist_ok=True)
    Path("benches/out/bench_search_pd.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


def overhead_rounds(w: Any, space: ds.SearchSpace, rounds: int, warm: bool) -> dict[str, Any]:
    """Per round: process pool (2 workers) and Ray (2 CPUs) back to back, alternating which
    goes first; the ratio of their times. ``warm``: Ray is started before the rounds."""
    import ray

    init = None
    if warm:
        t0 = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        init = time.perf_counter() - t0
    ratios = []
    order = [("p", ds.Backend("process", 2)), ("r", ds.Backend("ray", 2))]
    for i in range(rounds):
        t = {k: timed_search(w, space, b)[0] for k, b in (order if i % 2 == 0 else order[::-1])}
        ratios.append(t["r"] / t["p"])
        print(f"round {i}: process {t['p']:.1f} s, ray {t['r']:.1f} s", flush=True)
    if warm:
        ray.shutdown()
    q1, q3 = np.percentile(ratios, [25, 75]) if ratios else (float("nan"), float("nan"))
    return {"ratio_points": len(space.points(model_preset("llama-3-8b"), False)), "warm": warm, "warm_init_s": init,
            "ray_over_process_ratios": ratios, "ray_over_process_median": statistics.median(ratios),
            "ray_over_process_iqr": [float(q1), float(q3)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", type=int, default=1000)
    ap.add_argument("--limit", type=int, default=1000, help="requests of the trace (0: all)")
    ap.add_argument("--levers", type=int, default=0, help="configurations of the levers' comparison (0: none)")
    ap.add_argument("--no-main", action="store_true", help="skip the 1,000-configuration runs")
    ap.add_argument("--replay", metavar="ROWS_JSON", help="only replay other hint rules on a run's rows")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ratio-configs", type=int, default=200)
    ap.add_argument("--ratios-only", action="store_true", help="only the overhead rounds")
    ap.add_argument("--pd", action="store_true",
                    help="only a disaggregated search of --configs configurations (PD_SPACE), process pool, 2 workers")
    ap.add_argument("--warm", action="store_true",
                    help="overhead rounds on a Ray started before the timer (its init timed apart)")
    args = ap.parse_args()
    if args.replay:
        print(json.dumps(replay(args.replay), indent=1))
        return
    full = traces.load_file(named_trace_path("azure-conv"))
    w = full.head(args.limit) if args.limit > 0 else full
    if args.pd:
        pd_search(w, sliced(args.configs, PD_SPACE))
        return
    space = sliced(args.configs)
    out: dict[str, Any] = {"requests": len(w), "points": len(space.points(model_preset("llama-3-8b"), False))}
    out["load_before"] = list(os.getloadavg())
    if args.levers:
        out["levers"] = levers(w, sliced(args.levers))
    if not args.ratios_only and not args.no_main:
        main_runs(w, full, space, out)
    if args.rounds:
        out.update(overhead_rounds(w, sliced(args.ratio_configs), args.rounds, args.warm))
    Path("benches/out").mkdir(parents=True, exist_ok=True)
    out["load_after"] = list(os.getloadavg())
    name = "bench_search_warm.json" if args.warm else "bench_search.json"
    Path("benches/out", name).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
