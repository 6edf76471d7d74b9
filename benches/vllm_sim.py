"""vLLM's scheduling of the allocator benchmark's workload, in Python over vLLM's own
``KVCacheManager``: the peer of the simulator's ``vllm`` convention in
``benches/bench_simulator.py``.

The loop makes the decisions vLLM v1's ``Scheduler.schedule`` makes with unlimited token
budget, no chunked prefill, FCFS and recompute preemption (the simulator's configuration
for this workload), calling the manager as it does:

1. **running** requests in order: ``allocate_slots(request, num_tokens - num_computed)``
   (one token for a decode); when it returns None, the newest running request is preempted
   (``free``, ``num_computed_tokens = 0``, front of the waiting queue) and the call retried,
   until it fits or the request preempted itself;
2. **waiting** requests, only if nobody was preempted in this step, while fewer than
   ``max_running`` run: ``get_computed_blocks`` then ``allocate_slots`` for the request's
   prompt plus the tokens it generated before a preemption; the first that does not fit
   stops admission;
3. after the step every scheduled request has computed its tokens; one that reached its
   ``num_tokens`` samples a token (``append_output_token_ids``), and one that reached its
   output length finishes and is freed.

Per step it records what the simulator records (``batch``, ``preemptions``,
``prefill_tokens``, ``decode_tokens``, ``blocks_used`` after scheduling), so the two
schedules are compared step by step. The whole loop is timed: the Python scheduler is
part of what a vLLM step costs, as the Rust scheduler is part of the simulator's.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from benches.common import no_gc, spread
from benches.vllm_peer import VllmApi
from pykvpool.simulate.reference import LoopWorkload

COLUMNS = ("batch", "preemptions", "prefill_tokens", "decode_tokens", "blocks_used")


@dataclass
class SimLoopResult:
    steps: int = 0
    preemptions: int = 0
    admissions: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0
    columns: dict[str, list[int]] = field(default_factory=lambda: {c: [] for c in COLUMNS})


def run(api: VllmApi, wl: LoopWorkload) -> SimLoopResult:
    """One run of the module doc's loop on a fresh manager (cyclic GC off).

    Raises:
        RuntimeError: a request cannot run even alone.
        AssertionError: blocks are left after the loop.
    """
    mgr = api.make_manager(wl.num_blocks, wl.block_size, None)
    with no_gc():
        c0, t0 = time.thread_time(), time.perf_counter()
        res = _loop(api, mgr, wl)
        res.seconds = time.perf_counter() - t0
        res.cpu_s = time.thread_time() - c0
    if mgr.block_pool.get_num_free_blocks() != wl.num_blocks:
        raise AssertionError("vllm: blocks still used after the loop")
    return res


def _loop(api: VllmApi, mgr: Any, wl: LoopWorkload) -> SimLoopResult:
    prompts = [int(x) for x in wl.prompt_lens]
    outputs = [int(x) for x in wl.output_lens]
    alloc, free, lookup = mgr.allocate_slots, mgr.free, mgr.get_computed_blocks
    num_free = mgr.block_pool.get_num_free_blocks
    running_status, preempted_status = api.running, api.preempted
    reqs: dict[int, Any] = {}
    waiting: deque[int] = deque(range(len(prompts)))
    running: list[int] = []
    generated = [0] * len(prompts)
    res = SimLoopResult()
    cols = res.columns
    while waiting or running:
        scheduled: list[tuple[int, int]] = []
        preempted = 0
        i = 0
        while i < len(running):
            rid = running[i]
            req = reqs[rid]
            n = req.num_tokens - req.num_computed_tokens
            while alloc(req, n) is None:
                if len(running) == 1:
                    raise RuntimeError(f"request {rid} cannot run even alone")
                victim = running.pop()
                v = reqs[victim]
                free(v)
                v.status = preempted_status
                v.num_computed_tokens = 0
                waiting.appendleft(victim)
                preempted += 1
                if victim == rid:
                    break
            else:
                scheduled.append((rid, n))
                i += 1
                continue
            break
        if not preempted:
            while waiting and len(running) < wl.max_running:
                rid = waiting[0]
                req = reqs.get(rid)
                if req is None:
                    req = reqs[rid] = api.make_request(rid, [0] * prompts[rid], None)
                blocks, hit, _ = lookup(req)
                n = req.num_tokens - hit
                if alloc(req, n, hit, blocks) is None:
                    break
                waiting.popleft()
                req.status = running_status
                running.append(rid)
                scheduled.append((rid, n))
                res.admissions += 1
        decode = sum(1 for rid, n in scheduled if n == 1 and generated[rid] > 0)
        prefill = sum(n for _, n in scheduled) - decode
        for c, v in zip(COLUMNS, (len(scheduled), preempted, prefill, decode, wl.num_blocks - num_free())):
            cols[c].append(v)
        res.preemptions += preempted
        finished = False
        for rid, n in scheduled:
            req = reqs[rid]
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens:
                generated[rid] += 1
                if generated[rid] == outputs[rid]:
                    free(req)
                    del reqs[rid]
                    finished = True
                else:
                    req.append_output_token_ids(0)
        if finished:
            running = [rid for rid in running if rid in reqs]
        res.steps += 1
    return res


def same_schedule(sim_steps: Any, res: SimLoopResult) -> bool:
    """Whether the simulator's per-step columns equal the loop's, step for step."""
    return all(list(map(int, sim_steps[c])) == res.columns[c] for c in COLUMNS)


def compare(api: VllmApi, wl: LoopWorkload, run_sim: Any, rounds: int) -> dict[str, Any]:
    """``rounds`` rounds of (the simulator's vllm-convention run, this loop) back to back:
    the per-round time ratio loop / simulator (wall and CPU, median and quartiles) and the
    schedules, asserted equal step by step.

    Raises:
        AssertionError: the schedules differ.
    """
    wall, cpu = [], []
    res = None
    for _ in range(rounds):
        gc.collect()
        c0, t0 = time.thread_time(), time.perf_counter()
        r = run_sim()
        t_sim, c_sim = time.perf_counter() - t0, time.thread_time() - c0
        res = run(api, wl)
        if not same_schedule(r.steps, res):
            raise AssertionError(f"vllm loop and simulator disagree: {res.steps} vs {r.summary['steps']} steps")
        wall.append(res.seconds / t_sim)
        cpu.append(res.cpu_s / c_sim)
    assert res is not None
    return {
        "case": f"loop workload, {wl.num_requests} req, vLLM {api.version} KVCacheManager loop (vllm convention)",
        "seconds": res.seconds, "cpu_s": res.cpu_s, "steps": res.steps, "preemptions": res.preemptions,
        "ratio_vs_engine_vllm": spread(wall)["median"], "ratio_iqr": [spread(wall)["q1"], spread(wall)["q3"]],
        "cpu_ratio_vs_engine_vllm": spread(cpu)["median"], "cpu_ratio_iqr": [spread(cpu)["q1"], spread(cpu)["q3"]],
        "rounds": rounds,
    }
