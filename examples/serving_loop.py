"""A small serving loop on pykvpool: BlockPool hands out KV slots, KvCache stores K/V at
those slots, decode_attention reads them back through the block tables.

Requests carry random (seeded) K/V and query vectors instead of a model, so the run is
deterministic. The pool is deliberately small: when a decode step needs a block and none
is free, the newest running request is preempted (its blocks freed) and re-admitted later
by recompute (its prompt and the tokens it had generated are written again). Every step's
attention output is checked against a plain numpy softmax over the same K/V.

Run: ``python examples/serving_loop.py``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from pykvpool import BlockPool, KvCache, PoolExhaustedError, decode_attention

KV_HEADS, Q_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 2, 4, 16, 4, 14


@dataclass
class Request:
    """A request: ``prompt`` tokens, then ``output`` decoded tokens. ``k``/``v`` hold the
    K/V of every position it will ever have, ``q`` the query of each decode step."""

    rid: int
    prompt: int
    output: int
    k: np.ndarray = field(repr=False)
    v: np.ndarray = field(repr=False)
    q: np.ndarray = field(repr=False)
    generated: int = 0

    @property
    def length(self) -> int:
        """Tokens in the cache now: the prompt plus the tokens generated so far."""
        return self.prompt + self.generated


def make_requests(n: int = 6, seed: int = 0) -> list[Request]:
    """``n`` requests with random lengths and vectors (float32)."""
    rng = np.random.default_rng(seed)
    reqs = []
    for rid in range(n):
        prompt, output = int(rng.integers(5, 13)), int(rng.integers(6, 15))
        total = prompt + output
        k, v = (rng.standard_normal((total, KV_HEADS, HEAD_DIM), dtype=np.float32) for _ in "kv")
        q = rng.standard_normal((output, Q_HEADS, HEAD_DIM), dtype=np.float32)
        reqs.append(Request(rid, prompt, output, k, v, q))
    return reqs


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Grouped attention of one query ``[Hq, d]`` over ``k``/``v`` ``[S, Hkv, d]``."""
    kh = np.repeat(k, Q_HEADS // KV_HEADS, axis=1)  # [S, Hq, d]
    logits = np.einsum("hd,shd->hs", q, kh) / np.sqrt(HEAD_DIM)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return np.einsum("hs,shd->hd", p, np.repeat(v, Q_HEADS // KV_HEADS, axis=1))


@dataclass
class Result:
    """What a run did: tokens generated per request, preemptions, steps, and the largest
    difference between the kernel and the numpy reference."""

    generated: dict[int, int]
    preemptions: int
    steps: int
    max_error: float
    pool: BlockPool


def admit(pool: BlockPool, cache: KvCache, req: Request) -> None:
    """Allocate the request's current tokens and write their K/V (prefill, or recompute
    after a preemption). Raises PoolExhaustedError, changing nothing, when it does not fit."""
    slots = pool.add_sequence(req.rid, req.length)
    cache.write(0, req.k[: req.length], req.v[: req.length], slots)


def decode_step(pool: BlockPool, cache: KvCache, running: list[Request]) -> float:
    """One decode token for every running request; returns the largest error against numpy."""
    ids = [r.rid for r in running]
    slots, _cow, seq_lens = pool.step(ids)  # one new slot each; no fork, so no copy-on-write
    pos = [r.length for r in running]
    cache.write(0, np.stack([r.k[p] for r, p in zip(running, pos)]),
                np.stack([r.v[p] for r, p in zip(running, pos)]), slots)
    q = np.stack([r.q[r.generated] for r in running])
    out = decode_attention(cache, 0, q, pool.block_tables(ids), seq_lens)
    err = max(float(np.abs(out[i] - reference_attention(q[i], r.k[: p + 1], r.v[: p + 1])).max())
              for i, (r, p) in enumerate(zip(running, pos)))
    for r in running:
        r.generated += 1
    return err


def serve(requests: list[Request]) -> Result:
    """Serve every request to completion (FCFS admission, newest-first preemption)."""
    pool = BlockPool(NUM_BLOCKS, BLOCK_SIZE)
    cache = KvCache(1, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    waiting, running = deque(requests), []
    preemptions = steps = 0
    max_error = 0.0
    while waiting or running:
        while waiting:
            try:
                admit(pool, cache, waiting[0])
            except PoolExhaustedError:
                break
            running.append(waiting.popleft())
        while running:
            try:
                max_error = max(max_error, decode_step(pool, cache, running))
                break
            except PoolExhaustedError:  # the step changed nothing: make room and retry
                victim = running.pop()
                pool.free(victim.rid)
                waiting.appendleft(victim)
                preemptions += 1
        steps += 1
        for r in [r for r in running if r.generated == r.output]:
            pool.free(r.rid)
            running.remove(r)
    return Result({r.rid: r.generated for r in requests}, preemptions, steps, max_error, pool)


if __name__ == "__main__":
    res = serve(make_requests())
    print(f"{len(res.generated)} requests finished in {res.steps} steps, "
          f"{res.preemptions} preemptions, {res.pool.num_used_blocks} blocks still used, "
          f"max |kernel - numpy| = {res.max_error:.2e}")
