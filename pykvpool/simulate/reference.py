"""The reference scheduler loop: a serving engine's loop driving a KV-cache block pool from
Python, written out rule by rule.

This module is the executable definition of the simulator's ``convention="decode_first"``
(:class:`pykvpool.simulate.SchedulerConfig`): the engine must reproduce its steps and
preemptions exactly, and ``tests/simulate/test_simulator.py`` checks it does. The allocator
benchmarks (``benches/bench_scheduler.py``, ``benches/bench_prefix_cache.py``, the vLLM
peer ``benches/vllm_peer.py``) run this same loop and time the pool calls inside it, so
every rule is spelled out here and the code follows it literally.

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
:class:`SchedulerLoop` refuses such a workload up front; a decode that fails with a single
running request raises ``RuntimeError``.

Engines and timers
------------------
The loop only calls ``add_sequence``, ``step``, ``free`` and reads ``num_free_blocks``,
``num_blocks`` and ``block_size`` (:class:`Pool`), so it runs unchanged on
:class:`pykvpool.BlockPool` and on a pure-Python allocator. Every allocator call is timed
with ``time.perf_counter_ns`` (the timer's own ~0.05 us per call is included, which only
penalises the faster engine); the scheduler's own bookkeeping is outside those timers,
and so is the release of each call's result (a list of slots would otherwise be freed
inside the next timed call). An admission's time covers :meth:`SchedulerLoop.admit`, i.e.
the fit check and ``add_sequence``. To change what admission does (a prefix cache),
subclass and override :meth:`SchedulerLoop.admit`. An engine whose requests carry state
outside the allocator (vLLM's ``Request``: tokens, block hashes, computed-token counts)
keeps it up to date in :meth:`SchedulerLoop.before_admit` and :meth:`SchedulerLoop.settle`,
which run outside the timers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from pykvpool._native import PoolExhaustedError
from pykvpool.checks import check_count, check_int, invalid
from pykvpool.simulate.workload import MAX_REQUEST_TOKENS, MAX_REQUESTS

__all__ = ["BLOCK_SIZE", "MAX_RUNNING", "NUM_BLOCKS", "NUM_REQUESTS", "OUTPUT_RANGE", "PROMPT_RANGE", "SEED",
           "CallTimes", "LoopResult", "LoopWorkload", "Observer", "Pool", "SchedulerLoop", "make_workload",
           "run_loop"]

#: Requests of the default workload.
NUM_REQUESTS = 10_000
#: Closed range of prompt lengths of the default workload, tokens.
PROMPT_RANGE = (256, 4096)
#: Closed range of output lengths of the default workload, tokens.
OUTPUT_RANGE = (128, 384)
#: Tokens per block of the default pool.
BLOCK_SIZE = 16
#: Blocks of the default pool.
NUM_BLOCKS = 31_232
#: Most running requests of the default scheduler.
MAX_RUNNING = 256
#: Seed of the default workload.
SEED = 0


class Pool(Protocol):
    """What the loop needs from an allocator (:class:`pykvpool.BlockPool` or a baseline)."""

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool.

        Raises:
            Nothing: a fixed fact of the pool.
        """

    @property
    def block_size(self) -> int:
        """Tokens per block.

        Raises:
            Nothing: a fixed fact of the pool.
        """

    @property
    def num_free_blocks(self) -> int:
        """Blocks free now.

        Raises:
            Nothing: a count the pool keeps.
        """

    def add_sequence(self, seq_id: int, prompt_len: int = 0) -> Any:
        """Admit ``seq_id`` holding ``prompt_len`` tokens; returns its slots.

        Raises:
            PoolExhaustedError: the blocks do not fit (the pool is unchanged).
        """

    def step(self, seq_ids: Any, num_tokens: Any = None) -> Any:
        """Append ``num_tokens`` tokens to every sequence of ``seq_ids``, atomically.

        Raises:
            PoolExhaustedError: the new blocks do not fit (the pool is unchanged).
        """

    def free(self, seq_id: int) -> None:
        """Release every block of ``seq_id``.

        Raises:
            UnknownSequenceError: ``seq_id`` is not in the pool.
        """


@dataclass(frozen=True)
class LoopWorkload:
    """Requests (index = request id = sequence id; lengths in tokens) and the pool and
    scheduler limits. Checked by :class:`SchedulerLoop`, not here."""

    prompt_lens: npt.NDArray[np.int64]
    output_lens: npt.NDArray[np.int64]
    block_size: int = BLOCK_SIZE
    num_blocks: int = NUM_BLOCKS
    max_running: int = MAX_RUNNING

    @property
    def num_requests(self) -> int:
        """Number of requests.

        Raises:
            Nothing: the length of an array.
        """
        return len(self.prompt_lens)


def _closed_range(r: object, name: str) -> tuple[int, int]:
    """``r`` as a closed range ``(lo, hi)`` of token counts, ``1 <= lo <= hi``."""
    if not isinstance(r, tuple) or len(r) != 2:
        raise TypeError(f"{name} must be a tuple (lo, hi), got {type(r).__name__}")
    lo, hi = (check_int(v, name, 1) for v in r)
    if hi < lo or hi > MAX_REQUEST_TOKENS:
        raise invalid(f"{name} must satisfy 1 <= lo <= hi <= {MAX_REQUEST_TOKENS}, got {r}")
    return lo, hi


def make_workload(
    num_requests: int = NUM_REQUESTS,
    seed: int = SEED,
    *,
    prompt_range: tuple[int, int] = PROMPT_RANGE,
    output_range: tuple[int, int] = OUTPUT_RANGE,
    block_size: int = BLOCK_SIZE,
    num_blocks: int = NUM_BLOCKS,
    max_running: int = MAX_RUNNING,
) -> LoopWorkload:
    """The loop's workload (see the module doc); ranges are closed intervals in tokens.

    Raises:
        TypeError: a count that is no integer, a range that is not a pair.
        InvalidArgumentError: ``num_requests`` below 0 or above ``MAX_REQUESTS``, a range
            not within ``1 <= lo <= hi <= MAX_REQUEST_TOKENS``, a negative ``seed``, or a
            ``block_size``, ``num_blocks`` or ``max_running`` below 1 (naming it).
    """
    n = check_int(num_requests, "num_requests", 0)
    if n > MAX_REQUESTS:
        raise invalid(f"num_requests must be <= {MAX_REQUESTS}, got {n}")
    p_lo, p_hi = _closed_range(prompt_range, "prompt_range")
    o_lo, o_hi = _closed_range(output_range, "output_range")
    rng = np.random.default_rng(check_int(seed, "seed", 0))
    prompts = rng.integers(p_lo, p_hi, size=n, endpoint=True)
    outputs = rng.integers(o_lo, o_hi, size=n, endpoint=True)
    return LoopWorkload(
        prompt_lens=prompts.astype(np.int64),
        output_lens=outputs.astype(np.int64),
        block_size=check_int(block_size, "block_size", 1),
        num_blocks=check_int(num_blocks, "num_blocks", 1),
        max_running=check_int(max_running, "max_running", 1),
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
        """Count one call that took ``ns`` nanoseconds.

        Raises:
            Nothing: bookkeeping on plain numbers.
        """
        self.calls += 1
        self.ns += ns
        self.samples.append(ns)

    @property
    def us_per_call(self) -> float:
        """Mean microseconds per call (NaN with no call).

        Raises:
            Nothing: arithmetic on counts.
        """
        return self.ns / self.calls / 1e3 if self.calls else float("nan")


_KINDS = ("decode", "decode_refused", "admit", "admit_refused", "free")


@dataclass
class LoopResult:
    """Counts (see the module doc), per-request outcome and allocator timings of one run."""

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
        """Nanoseconds spent inside allocator calls over the whole loop.

        Raises:
            Nothing: a sum of counters.
        """
        return sum(getattr(self, k).ns for k in _KINDS)

    def counts(self) -> dict[str, int]:
        """The engine-independent outcome: equal for every correct engine.

        Raises:
            Nothing: the counters as a dict.
        """
        keys = ("steps", "decode_steps", "preemptions", "admissions", "admissions_refused", "decode_tokens",
                "prefill_tokens", "recomputed_tokens", "peak_running")
        return {k: getattr(self, k) for k in keys}


#: ``observer(kind, step, seq_ids, slots, seq_lens)`` with ``kind`` one of ``"admit"``,
#: ``"decode"``, ``"preempt"``, ``"finish"``; ``slots``/``seq_lens`` are the pool's return
#: values (``None`` for preempt/finish). Called outside the timers, for tests and checks.
Observer = Callable[[str, int, Sequence[int], Any, Any], None]


@dataclass
class _State:
    """One run's queues and per-request progress. A running request takes part in every
    successful decode call, so its progress is ``decode_steps + base[rid]``; it finishes
    when that reaches its output length. ``due[k]`` lists ``(rid, epoch)`` finishing at
    decode count ``k``; the epoch (bumped at each admission) discards entries of a request
    preempted since."""

    res: LoopResult
    waiting: deque[int]
    running: list[int]
    base: list[int]
    epoch: list[int]
    due: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    decode_steps: int = 0


class SchedulerLoop:
    """One run of the loop of the module doc over ``pool`` (fresh, empty) and ``workload``;
    ``observer`` sees every event (:data:`Observer`).

    Raises:
        InvalidArgumentError: the pool's geometry differs from the workload's, the workload's
            arrays differ in length, hold a prompt below 0 tokens or an output below 1, its
            ``max_running`` is below 1, or a request cannot fit the whole pool.
    """

    #: Set by a subclass that overrides :meth:`before_admit` and :meth:`settle`; the
    #: loop calls them only then (nothing extra runs for a plain pool).
    bookkeeping = False

    def __init__(self, pool: Pool, workload: LoopWorkload, observer: Observer | None = None) -> None:
        if pool.block_size != workload.block_size or pool.num_blocks != workload.num_blocks:
            raise invalid(
                f"pool is {pool.num_blocks} x {pool.block_size} but the workload wants "
                f"{workload.num_blocks} x {workload.block_size}"
            )
        prompts, outputs = np.asarray(workload.prompt_lens), np.asarray(workload.output_lens)
        if prompts.shape != outputs.shape or prompts.ndim != 1:
            raise invalid(f"workload: prompt_lens {prompts.shape} and output_lens {outputs.shape} differ")
        if prompts.size and (prompts.min() < 0 or outputs.min() < 1):
            raise invalid("workload: prompts must be >= 0 tokens and outputs >= 1")
        check_count(workload.max_running, "workload.max_running", 1)
        longest = int((prompts + outputs).max(initial=0))
        if -(-longest // workload.block_size) > workload.num_blocks:
            raise invalid(f"workload: a request of {longest} tokens cannot fit {workload.num_blocks} blocks")
        self.pool = pool
        self.workload = workload
        self.observer = observer

    def admit(self, rid: int, num_tokens: int) -> Any:
        """Prefill ``num_tokens`` tokens for request ``rid`` and return the pool's slots,
        or ``None`` when they do not fit (the pool is then unchanged). Override to change
        admission (e.g. a prefix-cache lookup).

        Raises:
            PoolExhaustedError: an override's way to say "does not fit" too.
        """
        pool = self.pool
        if -(-num_tokens // pool.block_size) > pool.num_free_blocks:
            return None
        return pool.add_sequence(rid, num_tokens)

    def before_admit(self, rid: int, num_tokens: int) -> None:
        """Untimed, before each admission attempt of ``rid`` with ``num_tokens`` tokens
        (only with :attr:`bookkeeping`).

        Raises:
            Nothing: the base class does nothing.
        """

    def settle(self, kind: str, seq_ids: Sequence[int]) -> None:
        """Untimed, after each event (``kind`` as for :data:`Observer`) and before the
        observer (only with :attr:`bookkeeping`).

        Raises:
            Nothing: the base class does nothing.
        """

    def _event(self, kind: str, step: int, ids: Sequence[int], slots: Any = None, lens: Any = None) -> None:
        if self.bookkeeping:
            self.settle(kind, ids)
        if self.observer is not None:
            self.observer(kind, step, ids, slots, lens)

    def run(self) -> LoopResult:
        """Run the loop to the end and return its counts and timings.

        Raises:
            RuntimeError: a decode fails with a single request running.
        """
        n = self.workload.num_requests
        st = _State(res=LoopResult(generated=[0] * n), waiting=deque(range(n)), running=[],
                    base=[0] * n, epoch=[0] * n)
        prompts = [int(x) for x in self.workload.prompt_lens]
        outputs = [int(x) for x in self.workload.output_lens]
        res = st.res
        wall0, cpu0 = time.perf_counter_ns(), time.process_time_ns()
        while st.waiting or st.running:
            if not self._decode(st, outputs):
                self._admit_all(st, prompts, outputs)
            res.steps += 1
        res.wall_ns = time.perf_counter_ns() - wall0
        res.cpu_ns = time.process_time_ns() - cpu0
        res.decode_steps = st.decode_steps
        return res

    def _decode(self, st: _State, outputs: list[int]) -> bool:
        """Rule 1: one successful decode call, preempting the newest until it fits; the
        finished then leave. True when a request was preempted."""
        pool, res, clock, step = self.pool, st.res, time.perf_counter_ns, st.res.steps
        preempted = False
        while st.running:
            t0 = clock()
            try:
                out = pool.step(st.running, 1)
            except PoolExhaustedError:
                res.decode_refused.add(clock() - t0)
                if len(st.running) == 1:
                    raise RuntimeError(f"request {st.running[0]} cannot decode even alone in the pool") from None
                victim = st.running.pop()
                t0 = clock()
                pool.free(victim)
                res.free.add(clock() - t0)
                res.generated[victim] = st.decode_steps + st.base[victim]
                st.waiting.appendleft(victim)
                res.preemptions += 1
                preempted = True
                self._event("preempt", step, [victim])
                continue
            dt = clock() - t0
            res.decode.add(dt)
            batch = len(st.running)
            if batch == self.workload.max_running:
                res.full_batch_decode_ns.append(dt)
            st.decode_steps += 1
            res.decode_tokens += batch
            self._event("decode", step, st.running, out[0], out[2])
            out = None
            self._finish(st, outputs)
            break
        return preempted

    def _finish(self, st: _State, outputs: list[int]) -> None:
        """Free the requests that produced their last token, in running (admission) order."""
        done = st.due.pop(st.decode_steps, None)
        gone = {rid for rid, ep in done or () if st.epoch[rid] == ep}
        if not gone:
            return
        pool, res, clock = self.pool, st.res, time.perf_counter_ns
        for rid in [rid for rid in st.running if rid in gone]:
            t0 = clock()
            pool.free(rid)
            res.free.add(clock() - t0)
            res.generated[rid] = outputs[rid]
            st.epoch[rid] += 1
            self._event("finish", res.steps, [rid])
        st.running = [rid for rid in st.running if rid not in gone]

    def _admit_all(self, st: _State, prompts: list[int], outputs: list[int]) -> None:
        """Rule 2: admit from the head of ``waiting`` while requests fit."""
        res, clock, max_running = st.res, time.perf_counter_ns, self.workload.max_running
        while st.waiting and len(st.running) < max_running:
            rid = st.waiting[0]
            tokens = prompts[rid] + res.generated[rid]
            if self.bookkeeping:
                self.before_admit(rid, tokens)
            t0 = clock()
            try:
                slots = self.admit(rid, tokens)
            except PoolExhaustedError:
                slots = None
            if slots is None:
                res.admit_refused.add(clock() - t0)
                res.admissions_refused += 1
                break
            res.admit.add(clock() - t0)
            st.waiting.popleft()
            st.running.append(rid)
            res.admissions += 1
            res.prefill_tokens += tokens
            if st.epoch[rid]:
                res.recomputed_tokens += tokens
            st.base[rid] = res.generated[rid] - st.decode_steps
            st.epoch[rid] += 1
            end = st.decode_steps + outputs[rid] - res.generated[rid]
            st.due.setdefault(end, []).append((rid, st.epoch[rid]))
            self._event("admit", res.steps, [rid], slots)
            # Drop the result here, not at the next timed assignment: freeing a
            # baseline's list of 2,000 ints would be billed to the next call.
            slots = None
        res.peak_running = max(res.peak_running, len(st.running))


def run_loop(pool: Pool, workload: LoopWorkload, observer: Observer | None = None) -> LoopResult:
    """Run the loop once on a fresh ``pool``; see the module doc.

    Raises:
        InvalidArgumentError: as :class:`SchedulerLoop`.
        RuntimeError: a decode fails with a single request running.
    """
    return SchedulerLoop(pool, workload, observer).run()
