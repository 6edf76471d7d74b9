"""Stateful property test of ``pykvpool.BlockPool`` against the spec model of
``tests/reference/hybrid_model.py`` (the layer-group contract, not the implementation).

Each example draws a pool (block size, 8 to 40 blocks, one to three groups of full,
sliding-window-with-sinks and chunked attention) and runs random programs of add, append,
step (decode and counted), fork, truncate, free, free_batch and mark_computed, failing calls
included: exhaustion, unknown and duplicate ids, truncation past the length or past the
window, malformed counts. After every rule the pool must equal the model: per sequence the logical
length and frontier, per group the stored logical blocks (the tables' hole pattern, the
padded and FlashInfer exports, stored ranges), refcounts, block counts, statistics, and
``check_invariants()``. A successful growth's slots must be the slots of its positions in
each group's table and its copy-on-write pairs the model's; a failed call must raise the
model's error class and change nothing.

Profiles as for the other state machines (``tests/conftest.py``):
``HYPOTHESIS_PROFILE=long python -m pytest tests/pool/test_hybrid_state_machine.py``.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np
from reference.hybrid_model import Model, Seq, check_against
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from reference.poolcheck import hybrid_snapshot

import pykvpool as kv

ID_RANGE = 6
kinds = st.one_of(
    st.just(kv.FullAttention()),
    st.builds(kv.SlidingWindow, st.integers(1, 9), st.integers(0, 5)),
    st.builds(kv.ChunkedAttention, st.integers(1, 9)),
)
counts = st.one_of(st.integers(1, 4), st.just(0), st.integers(0, 24))
# ("live", i): the i-th live id; ("any", id): any id, unknown or live.
picks = st.one_of(st.tuples(st.just("live"), st.integers(0, 31)), st.tuples(st.just("any"), st.integers(0, ID_RANGE - 1)))


class HybridMachine(RuleBasedStateMachine):
    pool: kv.BlockPool
    model: Model

    @initialize(bs=st.sampled_from([1, 2, 4]), num_blocks=st.integers(8, 40),
                groups=st.lists(kinds, min_size=1, max_size=3))
    def setup(self, bs: int, num_blocks: int, groups: list[Any]) -> None:
        self.pool = kv.BlockPool(num_blocks, bs, groups)
        self.model = Model(groups, bs, num_blocks)

    def pick(self, p: tuple[str, int]) -> int:
        live = sorted(self.model.seqs)
        if p[0] == "live" and live:
            return live[p[1] % len(live)]
        return p[1] % ID_RANGE

    def fresh(self) -> int:
        return next(i for i in itertools.count() if i not in self.model.seqs)

    def fails(self, cls: type[Exception] | tuple[type[Exception], ...], call: Callable[[], Any]) -> None:
        before = hybrid_snapshot(self.pool)
        try:
            call()
        except cls:
            assert hybrid_snapshot(self.pool) == before
            return
        raise AssertionError(f"expected {cls}")

    def grew(self, plan: list[tuple[int, int]], slots: np.ndarray, cow: np.ndarray, cow_model: list[tuple[int, int]],
             old_phys: dict[int, int]) -> None:
        """Check a successful growth's outputs against the model (already applied)."""
        self.model.learn(self.pool)
        bs, total = self.model.bs, sum(n for _, n in plan)
        assert slots.shape == (len(self.model.groups), total) and slots.dtype == np.int64
        for g in range(len(self.model.groups)):
            want = []
            for seq, n in plan:
                table, end = self.model.table(seq, g), self.model.seqs[seq].length
                want += [table[p // bs] * bs + p % bs for p in range(end - n, end)]
            assert slots[g].tolist() == want, g
        pairs = sorted((old_phys[a], self.model.phys[b]) for a, b in cow_model)
        assert sorted(map(tuple, cow.tolist())) == pairs

    def grow(self, plan: list[tuple[int, int]], call: Callable[[], tuple[np.ndarray, np.ndarray]]) -> bool:
        """Run a growth the model predicts; whether it fitted."""
        old_phys = dict(self.model.phys)
        before = {s: (m.length, m.frontier, [dict(t) for t in m.tables]) for s, m in self.model.seqs.items()}
        ok, cow_model = self.model.grow(plan)
        if not ok:
            self.fails(kv.PoolExhaustedError, call)
            return False
        try:
            slots, cow = call()
        except kv.PoolExhaustedError:
            raise AssertionError(f"the model fits {plan} (state {before})") from None
        self.grew(plan, slots, cow, cow_model, old_phys)
        return True

    @rule(p=picks, n=counts)
    def add(self, p: tuple[str, int], n: int) -> None:
        seq = self.pick(p) if p[0] == "any" else self.fresh()
        if seq in self.model.seqs:
            self.fails(kv.DuplicateSequenceError, lambda: self.pool.add_sequence(seq, n))
            return
        self.model.seqs[seq] = Seq(0, 0, [{} for _ in self.model.groups])
        if not self.grow([(seq, n)], lambda: (self.pool.add_sequence(seq, n), np.zeros((0, 2), np.int64))):
            del self.model.seqs[seq]

    @rule(p=picks, n=counts)
    def append(self, p: tuple[str, int], n: int) -> None:
        seq = self.pick(p)
        if seq not in self.model.seqs:
            self.fails(kv.UnknownSequenceError, lambda: self.pool.append(seq, n))
            return
        self.grow([(seq, n)], lambda: self.pool.append(seq, n))

    @rule(ps=st.lists(picks, max_size=4), n=st.one_of(st.none(), counts, st.lists(counts, min_size=4, max_size=4)))
    def step(self, ps: list[tuple[str, int]], n: None | int | list[int]) -> None:
        ids = [self.pick(p) for p in ps]
        arg: Any = n[: len(ids)] if isinstance(n, list) else n
        per = [1] * len(ids) if n is None else [n] * len(ids) if isinstance(n, int) else n[: len(ids)]
        unknown = any(s not in self.model.seqs for s in ids)
        dup = len(set(ids)) < len(ids)
        if unknown or dup:
            cls = (kv.UnknownSequenceError, kv.InvalidArgumentError) if unknown and dup else \
                kv.UnknownSequenceError if unknown else kv.InvalidArgumentError
            self.fails(cls, lambda: self.pool.step(ids, arg))
            return
        lens_out: list[Any] = []

        def call() -> tuple[np.ndarray, np.ndarray]:
            slots, cow, lens = self.pool.step(ids, arg)
            lens_out.append(lens)
            return slots, cow

        self.grow(list(zip(ids, per)), call)
        if lens_out:
            assert lens_out[0].dtype == np.int32
            assert lens_out[0].tolist() == [self.model.seqs[s].length for s in ids]

    @rule(p=picks, c=picks)
    def fork(self, p: tuple[str, int], c: tuple[str, int]) -> None:
        parent = self.pick(p)
        child = self.pick(c) if c[0] == "any" else self.fresh()
        if parent not in self.model.seqs or child in self.model.seqs:
            cls: Any = (kv.UnknownSequenceError, kv.DuplicateSequenceError)
            if parent in self.model.seqs:
                cls = kv.DuplicateSequenceError
            elif child not in self.model.seqs:
                cls = kv.UnknownSequenceError
            self.fails(cls, lambda: self.pool.fork(parent, child))
            return
        self.pool.fork(parent, child)
        self.model.fork(parent, child)

    @rule(p=picks, n=st.integers(0, 30))
    def truncate(self, p: tuple[str, int], n: int) -> None:
        seq = self.pick(p)
        if seq not in self.model.seqs:
            self.fails(kv.UnknownSequenceError, lambda: self.pool.truncate(seq, n))
        elif not self.model.can_truncate(seq, n):
            self.fails(kv.InvalidArgumentError, lambda: self.pool.truncate(seq, n))
        else:
            self.pool.truncate(seq, n)
            self.model.truncate(seq, n)

    @rule(p=picks)
    def free(self, p: tuple[str, int]) -> None:
        seq = self.pick(p)
        if seq not in self.model.seqs:
            self.fails(kv.UnknownSequenceError, lambda: self.pool.free(seq))
            return
        self.pool.free(seq)
        self.model.free(seq)

    @rule(ps=st.lists(picks, max_size=3))
    def free_batch(self, ps: list[tuple[str, int]]) -> None:
        ids = [self.pick(p) for p in ps]
        if len(set(ids)) < len(ids):
            self.fails(kv.InvalidArgumentError, lambda: self.pool.free_batch(ids))
        elif any(s not in self.model.seqs for s in ids):
            self.fails(kv.UnknownSequenceError, lambda: self.pool.free_batch(ids))
        else:
            self.pool.free_batch(ids)
            for s in ids:
                self.model.free(s)

    @rule(ps=st.lists(picks, max_size=3))
    def mark_computed(self, ps: list[tuple[str, int]]) -> None:
        ids = [self.pick(p) for p in ps]
        if any(s not in self.model.seqs for s in ids):
            self.fails(kv.UnknownSequenceError, lambda: self.pool.mark_computed(ids))
            return
        self.pool.mark_computed(ids)
        self.model.mark_computed(ids)

    @rule(p=picks, bad=st.sampled_from([True, -1, 1.5, np.array([1.0]), "2", 2**70]))
    def malformed(self, p: tuple[str, int], bad: Any) -> None:
        seq = self.pick(p)
        for call in (lambda: self.pool.append(seq, bad), lambda: self.pool.step([seq], bad),
                     lambda: self.pool.truncate(seq, bad), lambda: self.pool.block_tables([seq], group=bad)):
            self.fails(kv.InvalidArgumentError, call)

    @invariant()
    def agrees_with_the_model(self) -> None:
        if hasattr(self, "model"):
            check_against(self.model, self.pool)

    def teardown(self) -> None:
        if hasattr(self, "model"):
            self.pool.free_batch(sorted(self.model.seqs))
            assert self.pool.num_free_blocks == self.pool.num_blocks
            self.pool.check_invariants()


def test_hybrid_state_machine() -> None:
    run_state_machine_as_test(HybridMachine, settings=settings())
