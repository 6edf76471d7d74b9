"""Prefix-cache benchmark.

1. **Admission of a 2,176-token prompt** (136 blocks of 16: hash + lookup + allocate +
   register), called from Python with a numpy int32 array, on a 31,232-block pool:
   *cold* (a prompt never seen: 136 keys computed, every lookup a miss, 136 free blocks
   taken and registered), *cold and evicting* (the same on a pool full of idle cached
   blocks: each admission also evicts 136 of them) and *warm* (the same prompt again: 135
   blocks reused, the last one recomputed). Same calls on the pure-Python baseline
   (:class:`benches.py_prefix_pool.PyPrefixPool`) in the same process.
2. **The core scheduler loop with caching on** (:mod:`pykvpool.simulate.reference`,
   10,000 requests, prompts 256..4096, outputs 128..384, block 16, 31,232 blocks, <= 256
   running), where every prompt starts with one of 32 shared 1,024-token prefixes
   (request ``i`` uses prefix ``i % 32``; a prompt shorter than 1,024 tokens is a prefix
   of it) followed by token ids unique to the request. Admission calls
   ``add_sequence_tokens`` (a refusal is a ``PoolExhaustedError``, no state change);
   decode stays ``pool.step(running, 1)``. Both engines must give identical counts,
   identical cache hits and evictions and (``--check-slots``) identical slot mappings.
   Allocator time is each call's minimum over ``--repeats`` runs (the loop is
   deterministic), as in ``benches/bench_scheduler.py``.

Targets: cold admission <= 10 us (the evicting and warm cases are reported against the same
limit); allocator time of the loop >= 20x below the baseline.

Usage, from the repository root::

    python -m benches.bench_prefix_cache --check-slots   # 10,000 requests, 3 runs per engine
    python -m benches.bench_prefix_cache --quick         # 1,000 requests, 1 run

Writes ``benches/out/prefix_cache.json`` (``prefix_cache_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import datetime
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import pykvpool
from benches.common import fmt, machine, no_gc, out_path, verdict, write_json
from benches.py_prefix_pool import PyPrefixPool
from benches.scheduler_loop import loop_figures, per_call_min
from pykvpool.simulate.reference import LoopResult, LoopWorkload, Observer, Pool, SchedulerLoop, make_workload

NUM_PREFIXES = 32
PREFIX_TOKENS = 1024
VOCAB = 32_000
ADMIT_TOKENS = 2176
TARGET_ADMIT_US = 10.0
TARGET_RATIO = 20.0


def cached_pool(num_blocks: int, block_size: int) -> Any:
    return pykvpool.BlockPool(num_blocks, block_size, prefix_caching=True)


ENGINES: dict[str, Callable[[int, int], Any]] = {"pykvpool": cached_pool, "python": PyPrefixPool}


def request_tokens(wl: LoopWorkload, seed: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """Token ids of every request (prompt then generated tokens), flattened, and each
    request's offset. Prefix ids are drawn from ``default_rng(seed + 1)`` in
    ``0..32,000``; every other token id is unique (``32,000 +`` its flat position)."""
    prefixes = np.random.default_rng(seed + 1).integers(0, VOCAB, size=(NUM_PREFIXES, PREFIX_TOKENS), dtype=np.int32)
    total = wl.prompt_lens + wl.output_lens
    offsets = np.concatenate([[0], np.cumsum(total)]).astype(np.int64)
    flat = (VOCAB + np.arange(int(offsets[-1]), dtype=np.int64)).astype(np.int32)
    for rid, p in enumerate(wl.prompt_lens.tolist()):
        k = min(p, PREFIX_TOKENS)
        flat[offsets[rid] : offsets[rid] + k] = prefixes[rid % NUM_PREFIXES, :k]
    return flat, offsets


class PrefixLoop(SchedulerLoop):
    """The core loop, admitting by token ids (prompt plus, after a preemption, the tokens
    generated so far)."""

    def __init__(self, pool: Pool, workload: LoopWorkload, tokens: npt.NDArray[np.int32],
                 offsets: npt.NDArray[np.int64], observer: Observer | None = None) -> None:
        super().__init__(pool, workload, observer)
        self.tokens = tokens
        self.offsets = offsets.tolist()

    def admit(self, rid: int, num_tokens: int) -> Any:
        off = self.offsets[rid]
        return self.pool.add_sequence_tokens(rid, self.tokens[off : off + num_tokens])  # type: ignore[attr-defined]


def cache_counts(pool: Any) -> dict[str, int]:
    keys = ("queries", "query_blocks", "hit_blocks", "query_tokens", "hit_tokens", "stored_blocks", "evictions")
    if isinstance(pool, PyPrefixPool):
        return {k: pool.stats[k] for k in keys}
    s = pool.cache_stats()
    return {k: int(getattr(s, k)) for k in keys}


def run_engine(name: str, wl: LoopWorkload, tokens: Any, offsets: Any,
               observer: Observer | None = None) -> tuple[LoopResult, dict[str, int]]:
    pool = ENGINES[name](wl.num_blocks, wl.block_size)
    with no_gc():
        res = PrefixLoop(pool, wl, tokens, offsets, observer).run()
    assert pool.num_free_blocks == wl.num_blocks, f"{name}: blocks still held after the loop"
    pool.check_invariants()
    return res, cache_counts(pool)


def slot_digest(name: str, wl: LoopWorkload, tokens: Any, offsets: Any) -> tuple[int, int]:
    acc = [0, 0]
    mod = (1 << 61) - 1

    def observe(kind: str, step: int, ids: Any, slots: Any, lens: Any) -> None:
        if slots is None:
            return
        if kind == "admit":
            slots = slots[1]  # (cached, slots to compute, cow)
        s = [int(x) for x in slots]
        acc[0] = (acc[0] * 1_000_003 + hash(tuple(s))) % mod
        acc[1] += len(s)

    run_engine(name, wl, tokens, offsets, observe)
    return acc[0], acc[1]


def micro(name: str, reps: int) -> dict[str, float]:
    """Admissions of a 2,176-token prompt, cold, cold and evicting, warm (us), GC off."""
    with no_gc():
        return _micro(name, reps)


def _micro(name: str, reps: int) -> dict[str, float]:
    make = ENGINES[name]
    clock = time.perf_counter_ns
    # Cold: a prompt never seen, on a pool with free blocks (a fresh pool every 200
    # admissions, untimed): 136 keys, 136 misses, 136 blocks taken and registered.
    prompts = [(VOCAB + i * ADMIT_TOKENS + np.arange(ADMIT_TOKENS)).astype(np.int32) for i in range(reps)]
    cold = []
    for i, p in enumerate(prompts):
        if i % 200 == 0:
            pool = make(31_232, 16)
        t0 = clock()
        pool.add_sequence_tokens(0, p)
        cold.append(clock() - t0)
        pool.free(0)
    # Cold and evicting: the pool is full of idle cached blocks (230 prompts admitted
    # and freed first), so each admission also evicts 136 blocks, tail first.
    pool = make(31_232, 16)
    for i in range(230):
        pool.add_sequence_tokens(0, (VOCAB + (reps + i) * ADMIT_TOKENS + np.arange(ADMIT_TOKENS)).astype(np.int32))
        pool.free(0)
    evicting = []
    for p in prompts:
        t0 = clock()
        pool.add_sequence_tokens(0, p)
        evicting.append(clock() - t0)
        pool.free(0)
    # Warm: the same prompt again and again (135 of 136 blocks reused).
    warm = []
    p = prompts[-1]
    for _ in range(reps):
        t0 = clock()
        pool.add_sequence_tokens(0, p)
        warm.append(clock() - t0)
        pool.free(0)
    pool.check_invariants()
    return {
        "admit_cold_us_median": statistics.median(cold) / 1e3,
        "admit_cold_us_min": min(cold) / 1e3,
        "admit_cold_evicting_us_median": statistics.median(evicting) / 1e3,
        "admit_cold_evicting_us_min": min(evicting) / 1e3,
        "admit_warm_us_median": statistics.median(warm) / 1e3,
        "admit_warm_us_min": min(warm) / 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="1,000 requests, 1 repeat (smoke run)")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None, help="loop runs per engine (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--micro-reps", type=int, default=None, help="admissions per micro case (default 2000)")
    ap.add_argument("--check-slots", action="store_true", help="also compare every slot mapping")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    n_req = args.requests if args.requests is not None else (1_000 if args.quick else 10_000)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    micro_reps = args.micro_reps if args.micro_reps is not None else (300 if args.quick else 2000)
    wl = make_workload(n_req, args.seed)
    tokens, offsets = request_tokens(wl, args.seed)

    runs: dict[str, list[LoopResult]] = {name: [] for name in ENGINES}
    cache: dict[str, dict[str, int]] = {}
    for _ in range(repeats):
        for name in ENGINES:
            r, c = run_engine(name, wl, tokens, offsets)
            runs[name].append(r)
            if cache.setdefault(name, c) != c:
                raise AssertionError(f"{name}: cache counts differ between runs")
    ref = runs["pykvpool"][0]
    for name, rs in runs.items():
        for r in rs:
            if r.counts() != ref.counts() or r.generated != ref.generated:
                raise AssertionError(f"engines disagree: {r.counts()} vs {ref.counts()}")
    if cache["python"] != cache["pykvpool"]:
        raise AssertionError(f"engines disagree on cache hits: {cache}")
    slots_checked = False
    if args.check_slots:
        if slot_digest("pykvpool", wl, tokens, offsets) != slot_digest("python", wl, tokens, offsets):
            raise AssertionError("engines disagree on slot mappings")
        slots_checked = True

    figs = {name: loop_figures(per_call_min(rs)) for name, rs in runs.items()}
    micros = {name: micro(name, micro_reps) for name in ENGINES}
    fast, slow = figs["pykvpool"], figs["python"]
    ratios = {
        "allocator_total": slow["allocator_ms"] / fast["allocator_ms"],
        "admit": slow["admit_us_per_call"] / fast["admit_us_per_call"],
        "decode": slow["allocator_ms_by_kind"]["decode"] / fast["allocator_ms_by_kind"]["decode"],
        "free": slow["free_us_per_call"] / fast["free_us_per_call"],
        "admit_cold_micro": micros["python"]["admit_cold_us_median"] / micros["pykvpool"]["admit_cold_us_median"],
        "admit_warm_micro": micros["python"]["admit_warm_us_median"] / micros["pykvpool"]["admit_warm_us_median"],
    }
    c = cache["pykvpool"]
    targets = {
        "admit_2176_cold_us": (micros["pykvpool"]["admit_cold_us_median"], TARGET_ADMIT_US, False),
        "admit_2176_cold_evicting_us": (micros["pykvpool"]["admit_cold_evicting_us_median"], TARGET_ADMIT_US, False),
        "admit_2176_warm_us": (micros["pykvpool"]["admit_warm_us_median"], TARGET_ADMIT_US, False),
        "loop_allocator_ratio": (ratios["allocator_total"], TARGET_RATIO, True),
    }
    report: dict[str, Any] = {
        "benchmark": "prefix_cache",
        "command": "python -m benches.bench_prefix_cache" + (" --quick" if args.quick else ""),
        "argv": sys.argv[1:] if argv is None else argv,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "workload": {"requests": n_req, "seed": args.seed, "block_size": wl.block_size,
                     "num_blocks": wl.num_blocks, "max_running": wl.max_running,
                     "shared_prefixes": NUM_PREFIXES, "prefix_tokens": PREFIX_TOKENS},
        "repeats": repeats,
        "counts": ref.counts(),
        "cache": c,
        "token_hit_rate": c["hit_tokens"] / c["query_tokens"],
        "slots_checked": slots_checked,
        "loop": figs,
        "micro": micros,
        "ratios_python_over_pykvpool": ratios,
        "targets": {k: {"value": v, "limit": lim, "result": verdict(v, lim, hib)} for k, (v, lim, hib) in targets.items()},
    }
    out = write_json(report, out_path(args.out, "prefix_cache_quick.json" if args.quick else "prefix_cache.json"))
    print_table(report)
    print(f"\nwrote {out}")
    return 0


def print_table(rep: dict[str, Any]) -> None:
    c, w, k = rep["counts"], rep["workload"], rep["cache"]
    print(f"prefix-cache scheduler loop: {w['requests']} requests, {w['shared_prefixes']} shared "
          f"{w['prefix_tokens']}-token prefixes, {w['num_blocks']} blocks x {w['block_size']}, "
          f"<= {w['max_running']} running; per-call minimum over {rep['repeats']} runs")
    print(f"steps {c['steps']}, preemptions {c['preemptions']}, admissions {c['admissions']}; "
          f"cache: {k['hit_tokens']:,} of {k['query_tokens']:,} prompt tokens reused "
          f"({rep['token_hit_rate']:.3f}), {k['evictions']:,} evictions (identical on both engines"
          + (", slot mappings too)" if rep["slots_checked"] else ")"))
    names = list(rep["loop"])
    loop = [rep["loop"][n] for n in names]
    mic = [rep["micro"][n] for n in names]
    rows: list[tuple[str, list[Any]]] = [
        ("allocator time, whole loop (ms)", [f["allocator_ms"] for f in loop]),
        ("loop CPU time (ms)", [f["cpu_ms"] for f in loop]),
        ("admission, mean (us)", [f["admit_us_per_call"] for f in loop]),
        ("decode, per token (us)", [f["decode_us_per_token"] for f in loop]),
        ("free (us)", [f["free_us_per_call"] for f in loop]),
        ("micro: 2,176-token admission, cold (us)", [m["admit_cold_us_median"] for m in mic]),
        ("micro: same, cold and evicting (us)", [m["admit_cold_evicting_us_median"] for m in mic]),
        ("micro: 2,176-token admission, warm (us)", [m["admit_warm_us_median"] for m in mic]),
    ]
    print(f"\n{'figure':<42}" + "".join(f"{n:>12}" for n in names) + f"{'x python':>12}")
    for label, vals in rows:
        ratio = vals[1] / vals[0] if vals[0] else None
        print(f"{label:<42}" + "".join(f"{fmt(v):>12}" for v in vals) + f"{fmt(ratio, 1):>12}")
    print(f"\n{'target':<32}{'value':>10}{'limit':>8}  result")
    for name, t in rep["targets"].items():
        op = ">=" if name.endswith("ratio") else "<="
        print(f"{name:<32}{fmt(t['value']):>10}{op:>4}{t['limit']:>5}  {t['result']}")


if __name__ == "__main__":
    raise SystemExit(main())
