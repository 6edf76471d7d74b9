"""What the cost vs latency frontier costs on top of a deployment search: the
runs at each SLO's reference rate (:func:`pykvpool.search.reference_latency`) against the
search's own simulations, on ``benches/bench_search.py``'s space (1,000 configurations,
its SLO and rate ladder) and the first ``--limit`` requests of the Azure conversation
trace, on the process pool; at the default reference rate (the best point's sustained
rate) or at ``--latency-rate``.

Counts do not depend on the machine's load (simulations made, points run at the
reference rate, reused from the rows or skipped as failing); wall times do, so the
load average is printed beside them, and the phase's share is the ratio of the two wall
times taken back to back in each of ``--rounds`` rounds (median and IQR).

Run (from the checkout): ``python -m benches.bench_search_latency [--configs 1000] [--limit 1000]
[--workers 2] [--rounds 3] [--latency-rate R]``;
writes ``benches/out/bench_search_latency.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benches.bench_search import LADDER, SLOS, sliced
from pykvpool import search as ds
from pykvpool.planning.models import model_preset
from pykvpool.search.latency import plan_runs, reference_rates
from pykvpool.simulate import traces
from pykvpool.tracefile import named_trace_path


def one_round(w: object, space: ds.SearchSpace, backend: ds.Backend, rate: float | None) -> dict[str, float]:
    t = time.perf_counter()
    res = ds.search(w, model_preset("llama-3-8b"), space, SLOS, ladder=LADDER, backend=backend,  # type: ignore[arg-type]
                    progress=None)
    t_search = time.perf_counter() - t
    t = time.perf_counter()
    lat = ds.reference_latency(res, rate=rate, backend=backend, progress=None)
    t_lat = time.perf_counter() - t
    rates = reference_rates(res.best, rate)
    reused, todo = plan_runs(res.rows, rates, LADDER.rates(), len(res.spec.workload))
    return {"configs": len(res.rows), "search_sims": sum(r["sims"] for r in res.rows), "search_s": t_search,
            "reference_runs": lat.evaluated, "reused": len(reused), "run": len(todo),
            "skipped": len(res.rows) * len(rates) - len(reused) - len(todo), "latency_s": t_lat,
            "reference_rate": rates[SLOS[0].name] or 0.0,
            "frontier_points": len([f for f in lat.frontier if f["basis"] == "reference"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", type=int, default=1000)
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-rate", type=float, help="one reference rate, req/s (default: the best point's)")
    args = ap.parse_args()
    w = traces.load_file(named_trace_path("azure-conv"), limit=args.limit)
    backend = ds.Backend("process", args.workers)
    rounds = []
    for i in range(args.rounds):
        load = os.getloadavg()[0]
        r = one_round(w, sliced(args.configs), backend, args.latency_rate)
        r["load_1min"] = load
        rounds.append(r)
        print(f"round {i + 1}: {r['configs']} configurations, {r['search_sims']} search simulations in "
              f"{r['search_s']:.1f} s; {r['reference_runs']} runs at {r['reference_rate']:.3g} req/s in "
              f"{r['latency_s']:.1f} s ({r['reused']} reused, {r['skipped']} skipped); load {load:.1f}")
    ratios = sorted(r["latency_s"] / r["search_s"] for r in rounds)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    r0 = rounds[0]
    summary = {"command": "python -m benches.bench_search_latency " + " ".join(sys.argv[1:]), "rounds": rounds, "sims_ratio": r0["reference_runs"] / r0["search_sims"],
               "time_ratio_median": statistics.median(ratios), "time_ratio_iqr": [q[0], q[2]]}
    print(f"reference-rate runs / search simulations: {summary['sims_ratio']:.1%}; latency phase / search "
          f"wall time: median {summary['time_ratio_median']:.1%} (IQR {q[0]:.1%}-{q[2]:.1%})")
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    name = "bench_search_latency" + ("" if args.latency_rate is None else f"_at_{args.latency_rate:g}")
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
