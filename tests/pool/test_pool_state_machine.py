"""Stateful property test of ``pykvpool.BlockPool`` (without prefix caching) against the spec
model of ``tests/reference/hybrid_model.py`` (the documented contract, not the implementation).

Each example draws a pool: 1 to 64 blocks of 1 to 16 tokens, built without ``groups`` (one
full-attention group, results without a group axis; about a third of the examples) or with
one to three groups of full, sliding-window-with-sinks and chunked attention. A hypothesis
``RuleBasedStateMachine`` runs random programs of add, append, step (decode and counted,
ids and counts in every integer dtype, strided, as lists or one scalar), fork, a fork then
a step of parent and child (the parent maybe rolled back first), truncate, free, free_batch
and mark_computed, failing calls included: exhaustion, unknown, duplicate and freed ids, truncation past the length or back
into released KV, and malformed arguments (``reference/badargs.py``: float and bool dtypes,
2-D, negative counts, mismatched lengths, duplicates in a step, uint64 ids past int64, ids
given as floats, bools or strings, bad scalars to every call, bad or missing ``group=``).

After every rule the pool must equal the model: per sequence the length and frontier, per
group the table (hole pattern included), stored ranges, the padded and FlashInfer exports;
refcounts, block counts, every :class:`pykvpool.PoolStats` field, ``blocks_needed`` before
an append, and ``check_invariants()``. A growth's slots must be the slots of its positions in each group's
table and its copy-on-write pairs the model's; which free block the pool hands out is its
choice (the model learns ids from the slots and checks each block was free, or freed by
the growth's own releases). Through a simulated KV store (``reference/kvstore.py``) written
through the returned slots and copy-on-write pairs, every position whose KV a group holds
reads back its own value, and two live tokens share a slot only when a fork shares their
block. A failed call must raise the model's exact error class, with its attributes (the
id; the requested and free blocks of an exhaustion), and leave the pool identical
(``reference/poolcheck.py``'s snapshot). Teardown frees everything and checks every block
is free.

Profiles (``tests/conftest.py``): ``ci`` (default, 200 examples x up to 50 steps, about
8,500 steps) and ``long`` (30,000 examples, over 1,000,000 steps):
``HYPOTHESIS_PROFILE=long python -m pytest tests/pool/test_pool_state_machine.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from reference.badargs import BAD_SCALARS, STEP_KINDS, bad_scalar_calls, bad_step_args
from reference.hybrid_model import Expected, Growth, Kind, Model
from reference.kvstore import KvStore
from reference.poolcheck import check_against, snapshot

import pykvpool as kv

ID_RANGE = 8
MAX_TOKENS = 40
INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]

# A sequence id is picked as ("live", i): the i-th live one, ("new", _): the smallest id
# not live, or ("any", id): any id at all (unknown or duplicate ones included). Picks are
# resolved when the rule runs, so that programs stay meaningful as hypothesis shrinks them.
Pick = tuple[str, int]
_live = st.tuples(st.just("live"), st.integers(0, 63))
_new = st.tuples(st.just("new"), st.just(0))
_any = st.tuples(st.just("any"), st.integers(0, ID_RANGE - 1))
live_pick = st.one_of(_live, _live, _live, _any)
fresh_pick = st.one_of(_new, _new, _any, _live)
# Token counts: mostly a few tokens, sometimes none, sometimes more than a small pool holds.
counts = st.one_of(st.integers(1, 6), st.just(0), st.integers(0, MAX_TOKENS))
# Windows and chunks of 1 to 9 tokens, often under 4 (they release more), sinks often none.
spans = st.one_of(st.integers(1, 3), st.integers(1, 9))
kinds = st.one_of(
    st.just(kv.FullAttention()),
    st.builds(kv.SlidingWindow, spans, st.one_of(st.just(0), st.integers(0, 5))),
    st.builds(kv.ChunkedAttention, spans),
)
# None (a pool built without groups; what failures shrink to) in about a third of the
# examples, one to three groups otherwise (two or three in half of those).
layouts = st.one_of(st.none(), st.lists(kinds, min_size=1, max_size=3), st.lists(kinds, min_size=2, max_size=3))


class PoolMachine(RuleBasedStateMachine):
    pool: kv.BlockPool
    model: Model
    store: KvStore

    @initialize(
        num_blocks=st.one_of(st.integers(8, 64), st.integers(1, 8)),
        bs=st.sampled_from([4, 3, 1, 2, 5, 16]),
        layout=layouts,
        prompts=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    )
    def create(self, num_blocks: int, bs: int, layout: list[Kind] | None, prompts: list[int]) -> None:
        self.pool = kv.BlockPool(num_blocks, bs) if layout is None else kv.BlockPool(num_blocks, bs, layout)
        self.model = Model(layout, bs, num_blocks)
        self.store = KvStore(bs)
        assert self.pool.groups == tuple(self.model.groups) and self.pool.num_groups == len(self.model.groups)
        # Start with a few sequences (through the checked path), so that programs do
        # not spend their first steps on an empty pool.
        for n in prompts:
            self._add(("new", 0), n)

    # ------------------------------------------------------------------ helpers

    def resolve(self, pick: Pick) -> int:
        kind, i = pick
        ids = sorted(self.model.seqs)
        if kind == "live" and ids:
            return ids[i % len(ids)]
        if kind == "new":
            return min(set(range(len(ids) + 1)) - set(ids))
        return i % ID_RANGE

    def run(self, predict: Callable[[], Any], call: Callable[[], Any], apply: Callable[[Any, Any], None]) -> None:
        """The model's ``predict`` either applies the operation to the model (then the call
        must succeed, and ``apply`` checks its result against what ``predict`` returned) or
        raises ``Expected`` and changes nothing (then the call must fail exactly that way
        and change nothing)."""
        try:
            outcome = predict()
        except Expected as e:
            self.fails([call], e)
            return
        try:
            result = call()
        except kv.KvPoolError as err:
            raise AssertionError(f"the model expected success; the pool raised {err!r}") from err
        apply(outcome, result)

    def fails(self, calls: list[Callable[[], Any]], e: Expected) -> None:
        """Each call raises exactly ``e.cls`` with ``e.attrs`` (in its message too), and
        together they leave the pool unchanged."""
        before = snapshot(self.pool)
        for call in calls:
            with pytest.raises(e.cls) as info:
                call()
            assert type(info.value) is e.cls, f"{type(info.value).__name__}: {info.value}"
            for name, value in e.attrs.items():
                assert getattr(info.value, name) == value, (name, info.value)
                assert str(value) in str(info.value), info.value
        assert snapshot(self.pool) == before, f"failed {e.cls.__name__} changed the pool"

    def grew(self, growth: Growth, slots: Any, cow: Any) -> None:
        """Check a growth's slots and copy-on-write pairs, learn its blocks, write the KV."""
        groups, total = len(self.model.groups), sum(n for _, n in growth.plan)
        assert slots.dtype == np.int64 and slots.shape == ((groups, total) if self.model.grouped else (total,))
        assert cow.dtype == np.int64 and cow.ndim == 2 and cow.shape[1] == 2
        rows, pairs = slots.reshape(groups, total).tolist(), [(a, b) for a, b in cow.tolist()]
        self.model.learn(growth, rows, pairs)
        self.store.grow(growth.plan, rows, pairs)

    # -------------------------------------------------------------------- rules

    @rule(pick=fresh_pick, n=counts)
    def add(self, pick: Pick, n: int) -> None:
        self._add(pick, n)

    @rule(pick=fresh_pick, n=st.integers(0, 12))
    def add_short(self, pick: Pick, n: int) -> None:
        # A second adding rule: rules are drawn uniformly, and without it frees and
        # failures would keep the pool nearly empty.
        self._add(pick, n)

    def _add(self, pick: Pick, n: int) -> None:
        seq = self.resolve(pick)
        no_cow = np.zeros((0, 2), np.int64)
        self.run(lambda: self.model.add(seq, n), lambda: self.pool.add_sequence(seq, n),
                 lambda growth, slots: self.grew(growth, slots, no_cow))

    @rule(pick=live_pick, n=counts)
    def append(self, pick: Pick, n: int) -> None:
        seq = self.resolve(pick)

        def predict() -> Growth:
            if seq in self.model.seqs:
                assert self.pool.blocks_needed(seq, n) == self.model.blocks_needed(seq, n), (seq, n)
            return self.model.grow([(seq, n)])

        self.run(predict, lambda: self.pool.append(seq, n), lambda growth, out: self.grew(growth, *out))

    @rule(
        batch=st.lists(st.tuples(live_pick, counts), max_size=6),
        ids_form=st.sampled_from(["list", "strided", *INT_DTYPES]),
        counts_form=st.sampled_from(["list", "scalar", "default", "none", *INT_DTYPES]),
    )
    def step(self, batch: list[tuple[Pick, int]], ids_form: Any, counts_form: Any) -> None:
        self._step([self.resolve(p) for p, _ in batch], [n for _, n in batch], ids_form, counts_form)

    def _step(self, seqs: list[int], ns: list[int], ids_form: Any, counts_form: Any) -> None:
        if counts_form in ("scalar", "default", "none") and seqs:
            ns = [ns[0] if counts_form == "scalar" else 1] * len(ns)
        ids_arg: Any = seqs
        if ids_form == "strided":
            ids_arg = np.repeat(np.array(seqs, dtype=np.int64), 2)[::2]
        elif ids_form != "list":
            ids_arg = np.array(seqs, dtype=ids_form)
        counts_arg: Any = {"list": ns, "scalar": ns[0] if ns else 3, "none": None}.get(counts_form)
        if not isinstance(counts_form, str):
            counts_arg = np.array(ns, dtype=counts_form)

        def call() -> Any:
            return self.pool.step(ids_arg) if counts_form == "default" else self.pool.step(ids_arg, counts_arg)

        def apply(growth: Growth, out: Any) -> None:
            slots, cow, lens = out
            assert lens.dtype == np.int32 and lens.tolist() == [self.model.seqs[s].length for s in seqs]
            self.grew(growth, slots, cow)

        self.run(lambda: self.model.grow(list(zip(seqs, ns))), call, apply)

    @rule(parent=live_pick, child=fresh_pick)
    def fork(self, parent: Pick, child: Pick) -> None:
        self._fork(self.resolve(parent), self.resolve(child))

    @rule(parent=live_pick, n=st.integers(1, 3), order=st.booleans(), back=st.integers(0, 5))
    def fork_then_step(self, parent: Pick, n: int, order: bool, back: int) -> None:
        """Parallel sampling: fork a new child, roll the parent back ``back`` tokens (a
        rejected draft), then one step appending ``n`` tokens to parent and child. The
        first to append copies a shared partial last block, unless the other's window
        releases that block in the same step: releases come first."""
        p = self.resolve(parent)
        c = self.resolve(("new", 0))
        self._fork(p, c)
        if back and p in self.model.seqs:
            self._truncate(p, min(back, self.model.seqs[p].length))
        self._step([p, c] if order else [c, p], [n, n], "list", "list")

    def _fork(self, p: int, c: int) -> None:
        def apply(_: None, result: Any) -> None:
            assert result is None
            self.store.fork(p, c)

        self.run(lambda: self.model.fork(p, c), lambda: self.pool.fork(p, c), apply)

    @rule(pick=live_pick, n=counts)
    def truncate(self, pick: Pick, n: int) -> None:
        self._truncate(self.resolve(pick), n)

    def _truncate(self, seq: int, n: int) -> None:
        self.run(lambda: self.model.truncate(seq, n), lambda: self.pool.truncate(seq, n),
                 lambda _, __: self.store.truncate(seq, self.model.seqs[seq].length))

    @rule(picks=st.one_of(st.tuples(live_pick), st.lists(live_pick, max_size=4)), as_array=st.booleans())
    def free(self, picks: tuple[Pick] | list[Pick], as_array: bool) -> None:
        """``free`` for a 1-tuple, ``free_batch`` (atomic) for a list."""
        seqs = [self.resolve(p) for p in picks]

        def call() -> None:
            if isinstance(picks, tuple):
                return self.pool.free(seqs[0])
            return self.pool.free_batch(np.array(seqs, dtype=np.int64) if as_array else seqs)

        def apply(_: None, __: None) -> None:
            for s in seqs:
                self.store.free(s)

        self.run(lambda: self.model.free(seqs), call, apply)

    @rule(picks=st.lists(live_pick, max_size=3))
    def mark_computed(self, picks: list[Pick]) -> None:
        seqs = [self.resolve(p) for p in picks]
        self.run(lambda: self.model.mark_computed(seqs), lambda: self.pool.mark_computed(seqs), lambda _, __: None)

    @rule(pick=live_pick, kind=st.sampled_from(STEP_KINDS))
    def bad_step(self, pick: Pick, kind: str) -> None:
        """Malformed step arguments: InvalidArgumentError and no change, even when the
        ids are live and the pool has room."""
        ids, ns = bad_step_args(kind, self.resolve(pick))
        self.fails([lambda: self.pool.step(ids, ns)], Expected(kv.InvalidArgumentError))

    @rule(pick=live_pick, bad=st.sampled_from(BAD_SCALARS))
    def bad_scalar(self, pick: Pick, bad: Any) -> None:
        """Bad scalar arguments to every single-sequence call, a step and a group query."""
        calls = bad_scalar_calls(self.pool, self.model.grouped, self.resolve(pick), bad)
        self.fails(calls, Expected(kv.InvalidArgumentError))

    # --------------------------------------------------------------- invariants

    @invariant()
    def matches_model(self) -> None:
        tables = check_against(self.model, self.pool)
        self.store.check_reads(self.model, tables)
        self.store.check_shared_slots(self.pool, tables)

    def teardown(self) -> None:
        if not hasattr(self, "pool"):
            return
        pool = self.pool
        pool.free_batch(pool.seq_ids())
        pool.check_invariants()
        st_ = pool.stats()
        assert pool.num_free_blocks == pool.num_blocks == st_.free_blocks
        assert st_.used_blocks == 0 and st_.num_seqs == 0 and st_.stored_tokens == 0
        assert all(pool.refcount(b) == 0 for b in range(pool.num_blocks))


def test_pool_state_machine() -> None:
    # The active hypothesis profile (tests/conftest.py) sets examples and steps.
    run_state_machine_as_test(PoolMachine, settings=settings())


def test_profile_sizes() -> None:
    """The CI profile runs at least 200 examples x 50 steps; ``long`` over 1,000,000 steps
    even at hypothesis' average of about 42 steps per example."""
    ci, long = settings.get_profile("ci"), settings.get_profile("long")
    assert ci.max_examples >= 200 and ci.stateful_step_count >= 50
    assert long.max_examples * min(long.stateful_step_count, 40) >= 1_000_000
