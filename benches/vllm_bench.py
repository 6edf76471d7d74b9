"""The vLLM engine's runs for ``benches/bench_scheduler.py`` (the adapter is
``benches/vllm_peer.py``): the loop with caching off, the loop with prefix caching on (each
of vLLM's block hashes against pykvpool's prefix-caching pool on the prefix-cache
benchmark's token ids), the microbenchmarks, and per-run ratios by kind of call.

Ratios are per run: run ``i`` of vLLM over run ``i`` of pykvpool (same repeat, back to
back), summarized by their median and quartiles (:func:`benches.common.spread`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

import pykvpool
from benches import bench_prefix_cache
from benches.common import no_gc, spread
from benches.vllm_peer import Tokens, VllmApi, VllmLoop, VllmPool
from pykvpool.simulate.reference import CallTimes, LoopResult, LoopWorkload, SchedulerLoop, make_workload

#: Kinds of call compared per run: what the loop's figure divides by.
KINDS = ("decode", "admit", "free")


def run_vllm(api: VllmApi, wl: LoopWorkload, hash_name: str | None = None,
             tokens: Tokens | None = None) -> tuple[LoopResult, VllmPool]:
    """One loop over a fresh manager (cyclic GC off, as for the other engines); the pool is
    returned for its hit counts and bookkeeping times.

    Raises:
        AssertionError: blocks or requests are left after the loop.
    """
    pool = VllmPool(api, wl.num_blocks, wl.block_size, hash_name, tokens)
    with no_gc():
        res = VllmLoop(pool, wl).run()
    pool.check_invariants()
    return res, pool


def per_unit_ns(r: LoopResult, kind: str) -> float:
    """Nanoseconds per decode token, per admission or per free of one run."""
    t: CallTimes = getattr(r, kind)
    return t.ns / (r.decode_tokens if kind == "decode" else t.calls)


def kind_ratios(slow: list[LoopResult], fast: list[LoopResult]) -> dict[str, dict[str, float]]:
    """Per-run ratio ``slow[i] / fast[i]`` per decode token, per admission and per free."""
    return {k: spread([per_unit_ns(s, k) / per_unit_ns(f, k) for s, f in zip(slow, fast)]) for k in KINDS}


def bookkeeping(pools: list[VllmPool]) -> dict[str, float]:
    """The untimed request bookkeeping (median over runs): building a request, and the
    updates after an event (decode: per step, all running requests)."""
    return {
        "request_build_us": statistics.median(p.request_init.us_per_call for p in pools),
        "settle_us_per_event": statistics.median(p.bookkeeping.us_per_call for p in pools),
    }


def prefix_section(api: VllmApi, n_req: int, seed: int, repeats: int, hashes: tuple[str, ...],
                   check_blocks: bool = False) -> dict[str, Any]:
    """The loop with prefix caching on: ``benches/bench_prefix_cache.py``'s token ids (32
    shared 1,024-token prefixes) on pykvpool's caching pool and on vLLM's manager with each
    hash in ``hashes``, alternating per repeat; with ``check_blocks``, an untimed run per
    hash checks the blocks in use after every event (:func:`check_used_blocks`).

    Raises:
        AssertionError: an engine's counts, prefix hit tokens or blocks in use differ from
            pykvpool's.
    """
    wl = make_workload(n_req, seed)
    flat, offsets = bench_prefix_cache.request_tokens(wl, seed)
    tokens = Tokens(flat, offsets.tolist())
    fast: list[LoopResult] = []
    slow: dict[str, list[LoopResult]] = {h: [] for h in hashes}
    pools: dict[str, list[VllmPool]] = {h: [] for h in hashes}
    hits = 0
    for _ in range(repeats):
        res, cache = bench_prefix_cache.run_engine("pykvpool", wl, flat, offsets)
        fast.append(res)
        hits = cache["hit_tokens"]
        for h in hashes:
            r, pool = run_vllm(api, wl, h, tokens)
            if r.counts() != res.counts() or r.generated != res.generated:
                raise AssertionError(f"vllm+{h} disagrees with pykvpool: {r.counts()} vs {res.counts()}")
            if pool.hit_tokens != hits:
                raise AssertionError(f"vllm+{h} hit {pool.hit_tokens} tokens, pykvpool {hits}")
            slow[h].append(r)
            pools[h].append(pool)
    checked = {h: check_used_blocks(api, wl, tokens, h) for h in hashes} if check_blocks else {}
    return {
        "requests": n_req,
        "repeats": repeats,
        "blocks_in_use_checked_events": checked,
        "counts": fast[0].counts(),
        "hit_tokens": hits,
        "prefill_tokens": fast[0].prefill_tokens,
        "us_per_unit": {
            "pykvpool": {k: statistics.median(per_unit_ns(r, k) for r in fast) / 1e3 for k in KINDS},
            **{f"vllm+{h}": {k: statistics.median(per_unit_ns(r, k) for r in rs) / 1e3 for k in KINDS}
               for h, rs in slow.items()},
        },
        "ratio_over_pykvpool": {f"vllm+{h}": kind_ratios(rs, fast) for h, rs in slow.items()},
        "bookkeeping": {f"vllm+{h}": bookkeeping(ps) for h, ps in pools.items()},
    }


def micro(api: VllmApi, reps: int) -> dict[str, float]:
    """bench_scheduler's microbenchmarks on vLLM's manager (caching off): admission of a
    2,000-token prompt and its free on an empty pool; a 256-request decode step."""
    with no_gc():
        return _micro(api, reps)


def _micro(api: VllmApi, reps: int) -> dict[str, float]:
    clock = time.perf_counter_ns
    pool = VllmPool(api, 31_232, 16)
    admit_ns, free_ns = [], []
    for i in range(reps):
        pool.prepare(i, 2000)
        t0 = clock()
        pool.add_sequence(i, 2000)
        t1 = clock()
        pool.free(i)
        t2 = clock()
        admit_ns.append(t1 - t0)
        free_ns.append(t2 - t1)
        del pool.requests[i]
    ids = list(range(256))
    for i in ids:
        pool.prepare(i, 1000 + i)
        pool.add_sequence(i, 1000 + i)
        pool.settle("admit", [i])
    step_ns = []
    for _ in range(min(reps, 480)):
        t0 = clock()
        pool.step(ids, 1)
        step_ns.append(clock() - t0)
        pool.settle("decode", ids)
    for i in ids:
        pool.free(i)
    pool.settle("finish", ids)
    pool.check_invariants()
    timer = []
    for _ in range(reps):
        t0 = clock()
        timer.append(clock() - t0)
    return {
        "admit_2000_us_median": statistics.median(admit_ns) / 1e3,
        "admit_2000_us_min": min(admit_ns) / 1e3,
        "free_125_blocks_us_median": statistics.median(free_ns) / 1e3,
        "decode_step_256_us_median": statistics.median(step_ns) / 1e3,
        "decode_step_256_us_min": min(step_ns) / 1e3,
        "timer_overhead_us_median": statistics.median(timer) / 1e3,
    }


def fmt_ratio(s: dict[str, float]) -> str:
    return f"{s['median']:.1f}x (IQR {s['q1']:.1f}-{s['q3']:.1f}, {s['runs']} runs)"


def print_vllm(rep: dict[str, Any]) -> None:
    """The vLLM part of bench_scheduler's table."""
    v = rep["vllm"]
    if not v.get("version"):
        print(f"\nvllm engine skipped: {v['skipped']}")
        return
    print(f"\nvLLM {v['version']} KVCacheManager, same loop, counts identical to pykvpool's; "
          "per-run ratio vllm / pykvpool (median, IQR)")
    for k, s in v["ratio_over_pykvpool"].items():
        print(f"  {'per ' + k + (' token' if k == 'decode' else ''):<24} {fmt_ratio(s)}")
    b = v["bookkeeping"]
    print(f"  untimed request bookkeeping: build {b['request_build_us']:.1f} us/request, "
          f"updates {b['settle_us_per_event']:.1f} us/event")
    pre = v.get("prefix")
    if pre:
        print(f"\nprefix caching on ({pre['requests']} requests, 32 shared 1,024-token prefixes, "
              f"{pre['hit_tokens']} hit tokens on every engine)")
        print(f"  {'engine':<20}{'decode/token us':>16}{'admission us':>14}{'free us':>10}")
        for name, u in pre["us_per_unit"].items():
            print(f"  {name:<20}{u['decode']:>16.3f}{u['admit']:>14.2f}{u['free']:>10.2f}")
        for name, ks in pre["ratio_over_pykvpool"].items():
            print(f"  {name} / pykvpool: " + ", ".join(f"{k} {fmt_ratio(s)}" for k, s in ks.items()))


def used_blocks_trace(loop: SchedulerLoop) -> list[int]:
    """Blocks in use (``num_blocks - num_free_blocks``) after every admission, decode step
    and finish of one untimed run of ``loop`` (its observer is replaced). Not after a
    preemption: there vLLM still holds the slots its failed step gave the requests before
    the one that did not fit (it cannot undo them; the retry then skips them), where an
    atomic step holds none yet."""
    pool = loop.pool
    trace: list[int] = []

    def observe(kind: str, step: int, ids: Any, slots: Any, lens: Any) -> None:
        if kind != "preempt":
            trace.append(pool.num_blocks - pool.num_free_blocks)

    loop.observer = observe
    loop.run()
    return trace


def check_used_blocks(api: VllmApi, wl: LoopWorkload, tokens: Tokens | None = None, hash_name: str | None = None) -> int:
    """Assert that vLLM's manager holds as many blocks as pykvpool's pool after every event
    of the loop (caching off, or on with ``tokens`` and ``hash_name``); the events compared.

    Raises:
        AssertionError: the traces differ.
    """
    if tokens is None:
        ref = used_blocks_trace(SchedulerLoop(pykvpool.BlockPool(wl.num_blocks, wl.block_size), wl))
    else:
        assert tokens.flat is not None
        offsets = np.asarray(tokens.offsets, dtype=np.int64)
        pool = bench_prefix_cache.cached_pool(wl.num_blocks, wl.block_size)
        ref = used_blocks_trace(bench_prefix_cache.PrefixLoop(pool, wl, tokens.flat, offsets))
    got = used_blocks_trace(VllmLoop(VllmPool(api, wl.num_blocks, wl.block_size, hash_name, tokens), wl))
    if got != ref:
        at = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
        raise AssertionError(f"blocks in use differ at event {at}: vllm {got[at:at + 1]}, pykvpool {ref[at:at + 1]}")
    return len(ref)
