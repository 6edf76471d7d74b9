"""Stateful property test of ``pykvpool.BlockPool`` against a pure-Python model.

A hypothesis ``RuleBasedStateMachine`` runs random programs over the operation alphabet
(add, append, step, fork, truncate, free, free_batch), failing operations included:
exhaustion, unknown, duplicate and freed ids, over-truncation, and malformed arrays (float
and bool dtypes, 2-D, negative counts, mismatched lengths, duplicates in a step, uint64
ids past int64, ids given as floats or bools).

After every step it checks ``check_invariants()``; agreement with the model on tables,
lengths, refcounts, statistics and the padded export; that every live token reads back
its own value through the slot mapping from a simulated KV store the test writes through
the returned slots and copy-on-write pairs; and that two live tokens share a slot only
when a fork shares their block (same position, same token). A failed operation must
raise the exact error class and leave the pool identical. Teardown frees everything and
checks every block is free.

Which free block the pool hands out is its choice: the model learns ids from the
returned slots and copy-on-write pairs, and checks the block was free.

Profiles (``tests/conftest.py``): ``ci`` (default, 200 examples x up to 50 steps, about
8,500 steps in 10-20 s) and ``long`` (30,000 examples, over 1,000,000 steps):
``HYPOTHESIS_PROFILE=long python -m pytest tests/pool/test_pool_state_machine.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

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

import pykvpool as kv
from reference.poolcheck import snapshot

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


class Expected(Exception):
    """The model's verdict that an operation must fail with ``cls`` (and these numbers)."""

    def __init__(self, cls: type[Exception], **attrs: int) -> None:
        super().__init__(cls.__name__)
        self.cls = cls
        self.attrs = attrs


@dataclass
class Model:
    """Naive reference: per-sequence block lists and lengths, refcounts, a KV store."""

    num_blocks: int
    bs: int
    tables: dict[int, list[int]] = field(default_factory=dict)
    lens: dict[int, int] = field(default_factory=dict)
    refc: dict[int, int] = field(default_factory=dict)  # referenced blocks only
    cow_copies: int = 0
    store: dict[int, int] = field(default_factory=dict)  # slot -> token value
    contents: dict[int, list[int]] = field(default_factory=dict)  # seq -> token values
    next_value: int = 0

    @property
    def free(self) -> int:
        return self.num_blocks - len(self.refc)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def slot(self, block: int, pos: int) -> int:
        return block * self.bs + pos % self.bs

    def decref(self, b: int) -> None:
        self.refc[b] -= 1
        if self.refc[b] == 0:
            del self.refc[b]

    def plan_need(self, batch: list[tuple[int, int]]) -> int:
        """Blocks a sequence of appends takes: growth, plus a copy for a partly filled
        last block still shared when its turn comes."""
        refc = dict(self.refc)
        need = 0
        for seq, n in batch:
            if n == 0:
                continue
            table, length = self.tables[seq], self.lens[seq]
            need += self.blocks_for(length + n) - len(table)
            if length % self.bs and refc[table[-1]] > 1:
                refc[table[-1]] -= 1
                need += 1
        return need

    def exhausted(self, need: int) -> None:
        if need > self.free:
            raise Expected(kv.PoolExhaustedError, requested=need, free=self.free)

    def apply_append(self, seq: int, n: int, slots: list[int], cow: list[tuple[int, int]]) -> None:
        """Check and apply a successful append; consumes the copy-on-write pairs it made."""
        assert len(slots) == n
        table = self.tables.setdefault(seq, [])
        length = self.lens.setdefault(seq, 0)
        contents = self.contents.setdefault(seq, [])
        if n == 0:
            return
        bs = self.bs
        if length % bs and self.refc[table[-1]] > 1:
            assert cow, f"no copy-on-write pair for shared partial block {table[-1]}"
            src, dst = cow.pop(0)
            assert src == table[-1]
            assert 0 <= dst < self.num_blocks and dst not in self.refc, f"copy target {dst} was not free"
            for off in range(length % bs):  # the caller copies its filled slots
                self.store[self.slot(dst, off)] = self.store[self.slot(src, off)]
            self.decref(src)
            self.refc[dst] = 1
            table[-1] = dst
            self.cow_copies += 1
        for i, slot in enumerate(slots):
            pos = length + i
            assert 0 <= slot < self.num_blocks * bs, f"slot {slot} out of range"
            assert slot % bs == pos % bs, f"slot {slot} has the wrong offset for token {pos}"
            block = slot // bs
            if pos // bs < len(table):
                assert block == table[pos // bs], f"slot {slot} of token {pos} is not in its block"
            else:
                assert pos // bs == len(table) and block not in self.refc, f"new block {block} was not free"
                self.refc[block] = 1
                table.append(block)
            self.store[slot] = self.next_value
            contents.append(self.next_value)
            self.next_value += 1
        self.lens[seq] = length + n

    def truncate(self, seq: int, n: int) -> None:
        keep = self.blocks_for(self.lens[seq] - n)
        for b in reversed(self.tables[seq][keep:]):
            self.decref(b)
        del self.tables[seq][keep:]
        self.lens[seq] -= n
        del self.contents[seq][self.lens[seq] :]

    def free_seq(self, seq: int) -> None:
        for b in self.tables.pop(seq):
            self.decref(b)
        del self.lens[seq]
        del self.contents[seq]

    def stats(self) -> dict[str, Union[int, float, list[int]]]:
        fill: dict[int, int] = {}
        for seq, table in self.tables.items():
            for i, b in enumerate(table):
                fill[b] = max(fill.get(b, 0), min(self.bs, self.lens[seq] - i * self.bs))
        stored = sum(fill.values())
        capacity = len(self.refc) * self.bs
        return {
            "block_size": self.bs,
            "total_blocks": self.num_blocks,
            "free_blocks": self.free,
            "used_blocks": len(self.refc),
            "num_seqs": len(self.tables),
            "logical_tokens": sum(self.lens.values()),
            "stored_tokens": stored,
            "shared_blocks": sum(1 for c in self.refc.values() if c > 1),
            "cow_copies": self.cow_copies,
            "empty_slots": capacity - stored,
            "utilization": stored / capacity if capacity else 1.0,
            "idle_cached_blocks": 0,
            "group_blocks": [len(self.refc)],
            "group_stored_tokens": [stored],
            "group_holes": [0],
        }


class PoolMachine(RuleBasedStateMachine):
    pool: kv.BlockPool
    model: Model

    @initialize(
        num_blocks=st.one_of(st.integers(8, 64), st.integers(1, 8)),
        bs=st.sampled_from([4, 3, 1, 2, 5, 16]),
        prompts=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    )
    def create(self, num_blocks: int, bs: int, prompts: list[int]) -> None:
        self.pool = kv.BlockPool(num_blocks, bs)
        self.model = Model(num_blocks, bs)
        # Start with a few sequences (through the checked path), so that programs do
        # not spend their first steps on an empty pool.
        for n in prompts:
            self._add(("new", 0), n)

    # ------------------------------------------------------------------ helpers

    def resolve(self, pick: Pick) -> int:
        kind, i = pick
        ids = sorted(self.model.tables)
        if kind == "live" and ids:
            return ids[i % len(ids)]
        if kind == "new":
            return min(set(range(len(ids) + 1)) - set(ids))
        return i % ID_RANGE

    def known(self, seq: int) -> None:
        if seq not in self.model.tables:
            raise Expected(kv.UnknownSequenceError, seq_id=seq)

    def run(self, predict: Callable[[], None], call: Callable[[], Any], apply: Callable[[Any], None]) -> None:
        """Run ``call``; the model's ``predict`` either passes (then ``apply`` checks and
        applies the result) or raises ``Expected`` (then the call must fail that way and
        change nothing)."""
        try:
            predict()
        except Expected as e:
            before = snapshot(self.pool)
            with pytest.raises(e.cls) as info:
                call()
            assert type(info.value) is e.cls, f"{type(info.value).__name__}: {info.value}"
            for name, value in e.attrs.items():
                assert getattr(info.value, name) == value, (name, info.value)
                assert str(value) in str(info.value), info.value
            assert snapshot(self.pool) == before, f"failed {e.cls.__name__} changed the pool"
            return
        apply(call())

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

        def predict() -> None:
            if seq in self.model.tables:
                raise Expected(kv.DuplicateSequenceError, seq_id=seq)
            self.model.exhausted(self.model.blocks_for(n))

        def apply(slots: Any) -> None:
            assert slots.dtype == np.int64 and slots.shape == (n,)
            self.model.apply_append(seq, n, slots.tolist(), [])

        self.run(predict, lambda: self.pool.add_sequence(seq, n), apply)

    @rule(pick=live_pick, n=counts)
    def append(self, pick: Pick, n: int) -> None:
        seq = self.resolve(pick)

        def predict() -> None:
            self.known(seq)
            self.model.exhausted(self.model.plan_need([(seq, n)]))

        def apply(out: Any) -> None:
            slots, cow = out
            assert slots.dtype == np.int64 and cow.dtype == np.int64 and cow.shape[1:] == (2,)
            pairs = [tuple(p) for p in cow.tolist()]
            self.model.apply_append(seq, n, slots.tolist(), pairs)
            assert not pairs, f"unexpected copy-on-write pairs {pairs}"

        self.run(predict, lambda: self.pool.append(seq, n), apply)

    @rule(
        batch=st.lists(st.tuples(live_pick, counts), max_size=6),
        ids_form=st.sampled_from(["list", "strided", *INT_DTYPES]),
        counts_form=st.sampled_from(["list", "array", "scalar", "default"]),
    )
    def step(self, batch: list[tuple[Pick, int]], ids_form: Any, counts_form: str) -> None:
        self._step([self.resolve(p) for p, _ in batch], [n for _, n in batch], ids_form, counts_form)

    def _step(self, seqs: list[int], ns: list[int], ids_form: Any, counts_form: str) -> None:
        if counts_form in ("scalar", "default") and seqs:
            ns = [ns[0] if counts_form == "scalar" else 1] * len(ns)
        ids_arg: Any = seqs
        if ids_form == "strided":
            ids_arg = np.repeat(np.array(seqs, dtype=np.int64), 2)[::2]
        elif ids_form != "list":
            ids_arg = np.array(seqs, dtype=ids_form)
        counts_arg: Any = {"list": ns, "array": np.array(ns, dtype=np.int32)}.get(counts_form)
        if counts_form == "scalar":
            counts_arg = ns[0] if ns else 3

        def predict() -> None:
            seen: set[int] = set()
            for s in seqs:
                self.known(s)
                if s in seen:
                    raise Expected(kv.InvalidArgumentError)
                seen.add(s)
            self.model.exhausted(self.model.plan_need(list(zip(seqs, ns))))

        def call() -> Any:
            if counts_form == "default":
                return self.pool.step(ids_arg)
            return self.pool.step(ids_arg, counts_arg)

        def apply(out: Any) -> None:
            slots, cow, lens = out
            assert slots.dtype == np.int64 and cow.dtype == np.int64 and lens.dtype == np.int32
            assert cow.ndim == 2 and cow.shape[1] == 2 and lens.shape == (len(seqs),)
            assert len(slots) == sum(ns)
            pairs = [tuple(p) for p in cow.tolist()]
            at = 0
            for i, (s, n) in enumerate(zip(seqs, ns)):
                self.model.apply_append(s, n, slots[at : at + n].tolist(), pairs)
                at += n
                assert lens[i] == self.model.lens[s]
            assert not pairs, f"unexpected copy-on-write pairs {pairs}"

        self.run(predict, call, apply)

    @rule(parent=live_pick, child=fresh_pick)
    def fork(self, parent: Pick, child: Pick) -> None:
        self._fork(self.resolve(parent), self.resolve(child))

    @rule(parent=live_pick, n=st.integers(1, 3), order=st.booleans())
    def fork_then_step(self, parent: Pick, n: int, order: bool) -> None:
        """Parallel sampling: fork a new child, then one step appending ``n`` tokens to
        parent and child (the first to append copies a shared partial last block)."""
        p = self.resolve(parent)
        c = self.resolve(("new", 0))
        self._fork(p, c)
        self._step([p, c] if order else [c, p], [n, n], "list", "list")

    def _fork(self, p: int, c: int) -> None:

        def predict() -> None:
            if c in self.model.tables:
                raise Expected(kv.DuplicateSequenceError, seq_id=c)
            self.known(p)

        def apply(result: Any) -> None:
            assert result is None
            m = self.model
            m.tables[c] = list(m.tables[p])
            m.lens[c] = m.lens[p]
            m.contents[c] = list(m.contents[p])
            for b in m.tables[c]:
                m.refc[b] += 1

        self.run(predict, lambda: self.pool.fork(p, c), apply)

    @rule(pick=live_pick, n=counts)
    def truncate(self, pick: Pick, n: int) -> None:
        seq = self.resolve(pick)

        def predict() -> None:
            self.known(seq)
            if n > self.model.lens[seq]:
                raise Expected(kv.InvalidArgumentError)

        self.run(predict, lambda: self.pool.truncate(seq, n), lambda _: self.model.truncate(seq, n))

    @rule(picks=st.one_of(st.tuples(live_pick), st.lists(live_pick, max_size=4)))
    def free(self, picks: Union[tuple[Pick], list[Pick]]) -> None:
        """``free`` for a 1-tuple, ``free_batch`` (atomic) for a list."""
        if isinstance(picks, tuple):
            seq = self.resolve(picks[0])
            self.run(lambda: self.known(seq), lambda: self.pool.free(seq), lambda _: self.model.free_seq(seq))
            return
        seqs = [self.resolve(p) for p in picks]

        def predict() -> None:
            if len(set(seqs)) != len(seqs):
                raise Expected(kv.InvalidArgumentError)
            for s in seqs:
                self.known(s)

        def apply(_: Any) -> None:
            for s in seqs:
                self.model.free_seq(s)

        self.run(predict, lambda: self.pool.free_batch(np.array(seqs, dtype=np.int64)), apply)

    @rule(
        pick=live_pick,
        kind=st.sampled_from(
            [
                "float_ids",
                "bool_ids",
                "float_counts",
                "bool_counts",
                "ids_2d",
                "counts_2d",
                "negative_count",
                "negative_id",
                "mismatched",
                "uint64_id",
                "string_ids",
                "float_scalar_count",
            ]
        ),
    )
    def bad_step(self, pick: Pick, kind: str) -> None:
        """Malformed step arguments: InvalidArgumentError and no change, even when the
        ids are live and the pool has room."""
        seq = self.resolve(pick)
        ids: Any = np.array([seq], dtype=np.int64)
        ns: Any = np.array([1], dtype=np.int64)
        if kind == "float_ids":
            ids = ids.astype(np.float64)
        elif kind == "bool_ids":
            ids = np.array([True])
        elif kind == "float_counts":
            ns = ns.astype(np.float32)
        elif kind == "bool_counts":
            ns = [True]
        elif kind == "ids_2d":
            ids = ids.reshape(1, 1)
        elif kind == "counts_2d":
            ns = ns.reshape(1, 1)
        elif kind == "negative_count":
            ns = np.array([-1], dtype=np.int8)
        elif kind == "negative_id":
            ids = [-1 - seq]
        elif kind == "mismatched":
            ns = [1, 1]
        elif kind == "uint64_id":
            ids = np.array([2**63 + seq], dtype=np.uint64)
        elif kind == "string_ids":
            ids = str(seq)
        elif kind == "float_scalar_count":
            ns = 1.0

        def predict() -> None:
            raise Expected(kv.InvalidArgumentError)

        self.run(predict, lambda: self.pool.step(ids, ns), lambda _: None)

    @rule(pick=live_pick, bad=st.sampled_from([-1, 1.0, True, 2**63, "0", None]))
    def bad_scalar(self, pick: Pick, bad: Any) -> None:
        """Bad scalar arguments to every single-sequence call."""
        seq = self.resolve(pick)
        calls: list[Callable[[], Any]] = [
            lambda: self.pool.add_sequence(bad),
            lambda: self.pool.append(seq, bad),
            lambda: self.pool.append(bad),
            lambda: self.pool.fork(seq, bad),
            lambda: self.pool.truncate(seq, bad),
            lambda: self.pool.free(bad),
        ]
        for call in calls:

            def predict() -> None:
                raise Expected(kv.InvalidArgumentError)

            self.run(predict, call, lambda _: None)

    # --------------------------------------------------------------- invariants

    @invariant()
    def matches_model(self) -> None:
        pool, m = self.pool, self.model
        pool.check_invariants()
        ids = sorted(m.tables)
        assert pool.seq_ids().tolist() == ids
        assert len(pool) == len(ids) and pool.num_free_blocks == m.free
        for s in ids:
            assert pool.block_table(s).tolist() == m.tables[s], s
            assert pool.seq_len(s) == m.lens[s], s
            # Every live token reads back its own value through the slot mapping.
            for pos, value in enumerate(m.contents[s]):
                assert m.store[m.slot(m.tables[s][pos // m.bs], pos)] == value, (s, pos)
        assert [pool.refcount(b) for b in range(m.num_blocks)] == [m.refc.get(b, 0) for b in range(m.num_blocks)]
        assert pool.stats().as_dict() == m.stats()
        width = max((len(t) for t in m.tables.values()), default=0)
        want = [t + [-1] * (width - len(t)) for t in (m.tables[s] for s in ids)]
        assert pool.block_tables(ids).tolist() == (want if ids else [])

    @invariant()
    def slots_shared_only_through_forks(self) -> None:
        """From the pool's own tables: a slot held by two live tokens is the same position
        in a block the pool counts as shared, and the same token (inherited by a fork)."""
        pool, bs = self.pool, self.model.bs
        owners: dict[int, list[tuple[int, int]]] = {}
        for s in pool.seq_ids().tolist():
            table = pool.block_table(s)
            for pos in range(pool.seq_len(s)):
                owners.setdefault(int(table[pos // bs]) * bs + pos % bs, []).append((s, pos))
        for slot, toks in owners.items():
            if len(toks) > 1:
                assert len({pos for _, pos in toks}) == 1, (slot, toks)
                assert pool.refcount(slot // bs) >= len(toks), (slot, toks)
                assert len({self.model.contents[s][pos] for s, pos in toks}) == 1, (slot, toks)

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
