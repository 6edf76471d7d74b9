"""The scheduler loop of a serving engine, driving a KV-cache block pool from Python.

This module is the reference definition of the core benchmark workload. The simulator
(``pykvpool.simulate``) must reproduce its steps and preemptions exactly and the
prefix-cache benchmark (``benches.bench_prefix_cache``) reuses it with caching on, so every rule is spelled out
here and the code follows it literally.

Workload (:func:`make_workload`)
--------------------------------
``rng = numpy.random.default_rng(seed)`` (default ``seed=0``), then, in this order:

- ``prompt_lens = rng.integers(256, 4096, size=num_requests, endpoint=True)``
- ``output_lens = rng.integers(128, 384, size=num_requests, endpoint=True)``

both int64, uniform on the closed ranges. Request ``i`` (``0 <= i < num_requests``)
has ``prompt_lens[i]`` prompt tokens and generates ``output_lens[i]`` tokens; its
sequence id in the pool is ``i``. All requests arrive at time 0 (there is no clock).
Defaults: 10,000 requests, block size 16 tokens, 31,232 blocks, at most 256 running.

The loop (:class:`SchedulerLoop`)
---------------------------------
State: ``waiting``, a FIFO of request ids (initially ``0, 1, ..., n - 1``); ``running``,
a list of request ids in admission order (the last one is the newest); ``generated[i]``,
output tokens request ``i`` has produced so far (initially 0).

One **step** is one iteration of the following, repeated while ``waiting`` or
``running`` is non-empty (the first step, with nothing running, only admits):

1. **Decode.** If ``running`` is non-empty, call ``pool.step(running, 1)``: one batched,
   atomic call appending one token to every running sequence. If it raises
   ``PoolExhaustedError`` (the pool is unchanged), **preempt** the newest running
   request: remove it from the end of ``running``, ``pool.free`` it, and push it to the
   *front* of ``waiting``; then retry the call with the shorter ``running``. Repeat until
   the call succeeds. (Preempting several requests in one step therefore leaves them at
   the front of ``waiting`` in their original admission order.) A preempted request keeps
   its ``generated`` count: the tokens it produced are not lost, only their KV cache.
   When the call succeeds, every request in ``running`` has produced one more token
   (``generated += 1``); each request whose ``generated`` now equals its output length
   **finishes**: it is ``pool.free``-d (in ``running`` order) and leaves ``running``.
2. **Admit.** Only if no request was preempted in this step: while ``waiting`` is
   non-empty and ``len(running) < max_running``, take the head ``i`` of ``waiting`` and
   let ``t = prompt_lens[i] + generated[i]`` (a first admission prefills the prompt; a
   preempted request re-prefills its prompt plus the tokens it had generated: *recompute*
   preemption). If ``ceil(t / block_size) <= pool.num_free_blocks`` the request is admitted
   with ``pool.add_sequence(i, t)`` and appended to ``running``; otherwise admission stops
   for this step: first come, first served, no skipping ahead. (The check is the
   scheduler's, like vLLM's ``can_allocate``; an overridden :meth:`SchedulerLoop.admit`
   may instead return ``None`` or raise ``PoolExhaustedError``, which count as a failed
   check.) Skipping admission after a preemption, as vLLM v1 does, keeps a victim from
   being re-admitted in the very step that evicted it. An admitted request produces its
   first token in the decode phase of the *next* step, so over its life a request is in
   exactly ``output_lens[i]`` successful decode calls and, when it finishes, its sequence
   holds ``prompt_lens[i] + output_lens[i]`` tokens.

Block accounting, for an engine that re-implements the loop without a pool: a sequence of
``L`` tokens holds ``ceil(L / block_size)`` blocks; there are no forks, so no
copy-on-write; a decode call needs one new block per running sequence whose length is a
multiple of ``block_size`` and fails iff that number exceeds the free blocks; ``free``
returns all of a sequence's blocks.

Counted quantities (:class:`LoopResult`): ``steps`` (iterations above),
``decode_steps`` (successful ``pool.step`` calls), ``preemptions`` (requests freed by
rule 1; every failed ``pool.step`` call causes exactly one), ``admissions`` (successful
``add_sequence`` calls, first admissions and re-admissions), ``decode_tokens`` (sum of
batch sizes of successful decode calls = sum of output lengths), ``admissions_refused``
(admission attempts stopped by the fit check), ``prefill_tokens``
(tokens added by ``add_sequence``), ``recomputed_tokens`` (the part of them added by
re-admissions of preempted requests, prompt included) and ``peak_running`` (largest
``len(running)`` after an admission phase).

A request whose prompt plus output does not fit the whole pool would stall the loop, so
:class:`SchedulerLoop` refuses such a workload up front (``ValueError``); a decode that
fails with a single running request raises ``RuntimeError``.

Engines
-------
The loop only calls ``add_sequence``, ``step``, ``free`` and reads ``num_free_blocks``,
``num_blocks`` and ``block_size``, so it runs unchanged on :class:`pykvpool.BlockPool` and on the pure-Python
baseline :class:`benches.py_allocator.PyBlockPool`. Every allocator call is timed with
``time.perf_counter_ns`` (the timer's own ~0.05 µs per call is included, which only
penalises the faster engine); the scheduler's own bookkeeping is outside those timers,
and so is the release of each call's result (a baseline's list of slots would otherwise
be freed inside the next timed call). An admission's time covers
:meth:`SchedulerLoop.admit`, i.e. the fit check and ``add_sequence``.
To change what admission does (a prefix cache), subclass and override
:meth:`SchedulerLoop.admit`. An engine whose requests carry state outside the allocator
(vLLM's ``Request``: tokens, block hashes, computed-token counts) keeps it up to date in
:meth:`SchedulerLoop.before_admit` and :meth:`SchedulerLoop.settle`, which run outside
the timers: that work is the engine's, done in vLLM by the engine core and
``update_from_output``, not by its KV-cache manager (``benches/vllm_peer.py`` times it
apart).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from pykvpool import PoolExhaustedError

NUM_REQUESTS = 10_000
PROMPT_RANGE = (256, 4096)
OUTPUT_RANGE = (128, 384)
BLOCK_SIZE = 16
NUM_BLOCKS = 31_232
MAX_RUNNING = 256
SEED = 0


class Pool(Protocol):
    """What the loop needs from an allocator (pykvpool.BlockPool or the baseline)."""

    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    def add_sequence(self, seq_id: int, prompt_len: int = 0) -> Any: ...
    def step(self, seq_ids: Any, num_tokens: Any = None) -> Any: ...
    def free(self, seq_id: int) -> None: ...


@dataclass(frozen=True)
class Workload:
    """Requests (index = request id = sequence id) and the pool/scheduler limits."""

    prompt_lens: npt.NDArray[np.int64]
    output_lens: npt.NDArray[np.int64]
    block_size: int = BLOCK_SIZE
    num_blocks: int = NUM_BLOCKS
    max_running: int = MAX_RUNNING

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lens)


def make_workload(
    num_requests: int = NUM_REQUESTS,
    seed: int = SEED,
    *,
    prompt_range: tuple[int, int] = PROMPT_RANGE,
    output_range: tuple[int, int] = OUTPUT_RANGE,
    block_size: int = BLOCK_SIZE,
    num_blocks: int = NUM_BLOCKS,
    max_running: int = MAX_RUNNING,
) -> Workload:
    """The benchmark workload; ranges are closed intervals in tokens (see module doc)."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(prompt_range[0], prompt_range[1], size=num_requests, endpoint=True)
    outputs = rng.integers(output_range[0], output_range[1], size=num_requests, endpoint=True)
    return Workload(
        prompt_lens=prompts.astype(np.int64),
        output_lens=outputs.astype(np.int64),
        block_size=block_size,
        num_blocks=num_blocks,
        max_running=max_running,
    )


@dataclass
class CallTimes:
    """Allocator calls of one kind: how many, the nanoseconds spent inside them, and each
    call's nanoseconds in order (the loop is deterministic, so call ``k`` of a kind is the
    same call in every run, which lets a benchmark take a per-call minimum over runs)."""

    calls: int = 0
    ns: int = 0
    samples: list[int] = field(default_factory=list)

    def add(self, ns: int) -> None:
        self.calls += 1
        self.ns += ns
        self.samples.append(ns)

    @property
    def us_per_call(self) -> float:
        return self.ns / self.calls / 1e3 if self.calls else float("nan")


@dataclass
class LoopResult:
    """Counts (see module doc), per-request outcome and allocator timings of one run."""

    steps: int = 0
    decode_steps: int = 0
    preemptions: int = 0
    admissions: int = 0
    admissions_refused: int = 0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    recomputed_tokens: int = 0
    peak_running: int = 0
    #: Output tokens each request produced (equals its output length at the end).
    generated: list[int] = field(default_factory=list)
    #: Successful decode calls, failed (exhausted) decode calls, successful admissions,
    #: refused admissions (the fit check), frees (finishes and preemptions).
    decode: CallTimes = field(default_factory=CallTimes)
    decode_refused: CallTimes = field(default_factory=CallTimes)
    admit: CallTimes = field(default_factory=CallTimes)
    admit_refused: CallTimes = field(default_factory=CallTimes)
    free: CallTimes = field(default_factory=CallTimes)
    #: Nanoseconds of each successful decode call whose batch had ``max_running`` sequences.
    full_batch_decode_ns: list[int] = field(default_factory=list)
    wall_ns: int = 0
    #: CPU time of the process over the loop (``time.process_time_ns``): on a shared
    #: machine, wall time also counts the time other processes held the cores.
    cpu_ns: int = 0

    @property
    def allocator_ns(self) -> int:
        """Time spent inside allocator calls over the whole loop."""
        return sum(t.ns for t in (self.decode, self.decode_refused, self.admit, self.admit_refused, self.free))

    def counts(self) -> dict[str, int]:
        """The engine-independent outcome: equal for every correct engine."""
        return {
            "steps": self.steps,
            "decode_steps": self.decode_steps,
            "preemptions": self.preemptions,
            "admissions": self.admissions,
            "admissions_refused": self.admissions_refused,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens": self.prefill_tokens,
            "recomputed_tokens": self.recomputed_tokens,
            "peak_running": self.peak_running,
        }


#: ``observer(kind, step, seq_ids, slots, seq_lens)`` with ``kind`` one of ``"admit"``,
#: ``"decode"``, ``"preempt"``, ``"finish"``; ``slots``/``seq_lens`` are the pool's return
#: values (``None`` for preempt/finish). Called outside the timers, for tests and checks.
Observer = Callable[[str, int, Sequence[int], Any, Any], None]


class SchedulerLoop:
    """One run of the loop of the module doc over ``pool`` (fresh, empty) and ``workload``.

    Raises:
        ValueError: the pool's geometry differs from the workload's, the pool is not
            empty, or a request cannot fit the whole pool.
    """

    def __init__(self, pool: Pool, workload: Workload, observer: Observer | None = None) -> None:
        if pool.block_size != workload.block_size or pool.num_blocks != workload.num_blocks:
            raise ValueError(
                f"pool is {pool.num_blocks} x {pool.block_size} but the workload wants "
                f"{workload.num_blocks} x {workload.block_size}"
            )
        bs = workload.block_size
        longest = int((workload.prompt_lens + workload.output_lens).max(initial=0))
        if -(-longest // bs) > workload.num_blocks:
            raise ValueError(f"a request of {longest} tokens cannot fit {workload.num_blocks} blocks")
        self.pool = pool
        self.workload = workload
        self.observer = observer

    def admit(self, rid: int, num_tokens: int) -> Any:
        """Prefill ``num_tokens`` tokens for request ``rid`` and return the pool's slots,
        or ``None`` when they do not fit (the pool is then unchanged). Override to change
        admission (e.g. a prefix-cache lookup); raising PoolExhaustedError also means
        "does not fit"."""
        pool = self.pool
        if -(-num_tokens // pool.block_size) > pool.num_free_blocks:
            return None
        return pool.add_sequence(rid, num_tokens)

    #: Set by a subclass that overrides :meth:`before_admit` and :meth:`settle`; the
    #: loop calls them only then (nothing extra runs for a plain pool).
    bookkeeping = False

    def before_admit(self, rid: int, num_tokens: int) -> None:
        """Untimed, before each admission attempt of ``rid`` with ``num_tokens`` tokens."""

    def settle(self, kind: str, seq_ids: Sequence[int]) -> None:
        """Untimed, after each event (``kind`` as for :data:`Observer`) and before the observer."""

    def run(self) -> LoopResult:
        wl, pool, observe = self.workload, self.pool, self.observer
        settle = self.settle if self.bookkeeping else None
        prompts = [int(x) for x in wl.prompt_lens]
        outputs = [int(x) for x in wl.output_lens]
        n = len(prompts)
        max_running = wl.max_running
        clock = time.perf_counter_ns
        res = LoopResult(generated=[0] * n)
        generated = res.generated
        t_decode, t_decode_refused = res.decode, res.decode_refused
        t_admit, t_admit_refused, t_free = res.admit, res.admit_refused, res.free
        full_batch = res.full_batch_decode_ns

        waiting: deque[int] = deque(range(n))
        running: list[int] = []
        # Every running request takes part in every successful decode call, so its
        # progress is `decode_steps + base[rid]`; it finishes when that reaches its output
        # length. `due[k]` lists (rid, epoch) finishing at decode count k; the epoch
        # (bumped at each admission) discards entries of a request preempted since.
        base = [0] * n
        epoch = [0] * n
        due: dict[int, list[tuple[int, int]]] = {}
        decode_steps = 0

        wall0 = clock()
        cpu0 = time.process_time_ns()
        while waiting or running:
            step_index = res.steps
            preempted = False
            while running:
                t0 = clock()
                try:
                    out = pool.step(running, 1)
                except PoolExhaustedError:
                    t_decode_refused.add(clock() - t0)
                    if len(running) == 1:
                        raise RuntimeError(
                            f"request {running[0]} cannot decode even alone in the pool"
                        ) from None
                    victim = running.pop()
                    t0 = clock()
                    pool.free(victim)
                    t_free.add(clock() - t0)
                    generated[victim] = decode_steps + base[victim]
                    waiting.appendleft(victim)
                    res.preemptions += 1
                    preempted = True
                    if settle is not None:
                        settle("preempt", [victim])
                    if observe is not None:
                        observe("preempt", step_index, [victim], None, None)
                    continue
                dt = clock() - t0
                t_decode.add(dt)
                batch = len(running)
                if batch == max_running:
                    full_batch.append(dt)
                decode_steps += 1
                res.decode_tokens += batch
                if settle is not None:
                    settle("decode", running)
                if observe is not None:
                    observe("decode", step_index, running, out[0], out[2])
                out = None
                done = due.pop(decode_steps, None)
                if done:
                    finished = []
                    for rid, ep in done:
                        if epoch[rid] == ep:
                            finished.append(rid)
                    if finished:
                        # Free in running (admission) order, as the module doc says.
                        gone = set(finished)
                        order = [rid for rid in running if rid in gone]
                        for rid in order:
                            t0 = clock()
                            pool.free(rid)
                            t_free.add(clock() - t0)
                            generated[rid] = outputs[rid]
                            epoch[rid] += 1
                            if settle is not None:
                                settle("finish", [rid])
                            if observe is not None:
                                observe("finish", step_index, [rid], None, None)
                        running = [rid for rid in running if rid not in gone]
                break

            if not preempted:
                while waiting and len(running) < max_running:
                    rid = waiting[0]
                    tokens = prompts[rid] + generated[rid]
                    if settle is not None:
                        self.before_admit(rid, tokens)
                    t0 = clock()
                    try:
                        slots = self.admit(rid, tokens)
                    except PoolExhaustedError:
                        slots = None
                    if slots is None:
                        t_admit_refused.add(clock() - t0)
                        res.admissions_refused += 1
                        break
                    t_admit.add(clock() - t0)
                    waiting.popleft()
                    running.append(rid)
                    res.admissions += 1
                    res.prefill_tokens += tokens
                    if epoch[rid]:
                        res.recomputed_tokens += tokens
                    base[rid] = generated[rid] - decode_steps
                    epoch[rid] += 1
                    due.setdefault(decode_steps + outputs[rid] - generated[rid], []).append((rid, epoch[rid]))
                    if settle is not None:
                        settle("admit", [rid])
                    if observe is not None:
                        observe("admit", step_index, [rid], slots, None)
                    # Drop the result here, not at the next timed assignment: freeing a
                    # baseline's list of 2,000 ints would be billed to the next call.
                    slots = None
                if len(running) > res.peak_running:
                    res.peak_running = len(running)
            res.steps += 1
        res.wall_ns = clock() - wall0
        res.cpu_ns = time.process_time_ns() - cpu0
        res.decode_steps = decode_steps
        return res


def run_loop(pool: Pool, workload: Workload, observer: Observer | None = None) -> LoopResult:
    """Run the benchmark loop once on a fresh ``pool``; see the module doc."""
    return SchedulerLoop(pool, workload, observer).run()
