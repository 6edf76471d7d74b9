"""Hypothesis state machine of a prefix-caching BlockPool against :class:`prefix_spec.Spec`,
a model written from the documented rules and the eviction specification (see
``tests/reference/prefix_spec.py``), not from the implementation's code paths, on a pool
without groups and on one to four layer groups (full, sliding windows with and without
sinks, chunked), with every eviction policy.

Prompts come as token ids from a few families that share prefixes (a "system prompt"
then a branch), with and without an extra key, and as block keys (Mooncake ``hash_ids``)
from key families with any prompt length, so partly filled last blocks and fills that
disagree with an earlier admission of the same key occur. Sequences grow by token ids
or plainly, fork and truncate; pins (hard and soft, by tokens or keys, with expiry),
caller-driven clock steps, resets, event drains and a small pool create eviction under
pressure. After every step:

- ``check_invariants()`` passes;
- the pool agrees with the model: the cached tokens and copy-on-write pairs of every
  admission, exhaustion, free counts, cache occupancy, every statistic (collisions where
  every group is full: a windowed group's count depends on which blocks the search asks),
  the clock, pins, every table's refcounts, ``cached_prefix_len`` probes, and the exact
  KV events (kind, group, key, parent key, tokens, clock) on every drain, which pin down
  what each eviction picked; with the full 128-bit hash and with a 3-bit one (collisions
  everywhere: the model verifies as documented);
- every reused token's slot holds the KV of exactly that prefix (a simulated KV store
  records what was computed or copied into each slot);
- a failed call changes nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from reference.prefix_spec import Spec

import pykvpool as kv

BS = 4
NUM_BLOCKS = 12
FAMILIES = 3
SW = kv.SlidingWindow
MIXES = [None, [kv.FullAttention()], [SW(6)], [kv.FullAttention(), SW(5, sink_tokens=2)],
         [SW(4), kv.ChunkedAttention(8), kv.FullAttention()],
         [kv.FullAttention(), SW(5), kv.ChunkedAttention(8), SW(7, sink_tokens=4)]]


def family_prompt(family: int, shared: int, branch: int, tail: int, head: int = 0) -> list[int]:
    """``shared`` tokens of the family's system prompt, then ``tail`` tokens of a branch.
    ``head`` varies the first block only: prompts that differ there share every later
    block's ids (and, when their first keys collide, every later key)."""
    system = [1000 * family + i + (100 * head if i < BS else 0) for i in range(shared)]
    return system + [50_000 + 100 * branch + i for i in range(tail)]


def family_keys(family: int, shared: int, branch: int, n: int) -> list[int]:
    """Keys of an ``n``-token keyed prompt: ``shared`` blocks of the family, then a branch.
    They stay apart from every 3-bit token key: keys are trusted content ids (equal keys
    mean equal content), a contract a keyed prompt colliding with a token block breaks."""
    blocks = -(-n // BS)
    return [2**32 + 10_000 * family + (i + 1 if i < shared else 1000 * (branch + 1) + i) for i in range(blocks)]


class PrefixPoolMachine(RuleBasedStateMachine):
    hash_bits = 128

    @initialize(policy=st.sampled_from(["lru", "fifo", "lfu", "priority"]), cow=st.booleans(),
                mix=st.sampled_from(MIXES))
    def setup(self, policy: str, cow: bool, mix: list[Any] | None) -> None:
        self.start(policy, cow, mix)

    def start(self, policy: str, cow: bool, mix: list[Any] | None) -> None:
        self.groups = mix
        self.num_groups = 1 if mix is None else len(mix)
        blocks = NUM_BLOCKS * self.num_groups
        self.pool = kv.BlockPool(blocks, BS, mix, prefix_caching=True, eviction=policy, cow_partial_hit=cow,
                                 hash_bits=self.hash_bits, record_events=True)
        self.model = Spec(BS, blocks, policy, cow, self.hash_bits, mix)
        self.all_full = all(isinstance(g, kv.FullAttention) for g in self.model.groups)
        self.next_seq = 0
        self.plain = 0
        self.kv: dict[int, Any] = {}  # slot -> identity of the KV computed into it
        self.ident: dict[int, tuple[str, Any, Any]] = {}  # seq -> ("tokens", ids, extra) | ("keys", keys, n)
        self.pin_ids: list[int] = []
        self.history: list[tuple[str, Any, Any]] = []  # prompts admitted so far

    # -- helpers
    def table(self, seq: int, g: int) -> list[int]:
        row = self.pool.block_table(seq) if self.groups is None else self.pool.block_table(seq, group=g)
        return [int(b) for b in row.tolist()]

    def rows(self, slots: Any) -> list[list[int]]:
        """A call's slots, one row per group."""
        return [slots.tolist()] if self.groups is None else slots.tolist()

    def snapshot(self) -> Any:
        seqs = [int(s) for s in self.pool.seq_ids()]
        return (self.pool.stats().as_dict(), self.pool.cache_stats().as_dict(),
                [(s, [self.table(s, g) for g in range(self.num_groups)], self.pool.seq_len(s)) for s in seqs])

    def content(self, g: int, seq: int, p: int) -> Any:
        kind, a, b = self.ident[seq]
        if kind == "tokens" and a is not None:
            return ("kv", g, b, *a[: p + 1])
        if kind == "keys" and p < b:
            first = p // BS if not isinstance(self.model.groups[g], kv.FullAttention) else 0
            return ("k", g, *a[first : p // BS + 1], p % BS)
        self.plain += 1
        return ("plain", self.plain)

    def write(self, seq: int, first_pos: int, slots: Any) -> None:
        for g, row in enumerate(self.rows(slots)):
            for j, slot in enumerate(row):
                self.kv[slot] = self.content(g, seq, first_pos + j)

    def copy(self, cow: Any) -> None:
        for src, dst in cow.tolist():
            for j in range(BS):
                if src * BS + j in self.kv:
                    self.kv[dst * BS + j] = self.kv[src * BS + j]

    def check_reused_kv(self, seq: int, cached: int) -> None:
        for g in range(self.num_groups):
            table = self.table(seq, g)
            for p in range(cached):
                if table[p // BS] >= 0:
                    got = self.kv.get(table[p // BS] * BS + p % BS)
                    assert got == self.content(g, seq, p), f"wrong KV reused at token {p} in group {g}"

    def refused(self, before: Any, predicted: object) -> None:
        assert predicted is None or predicted is False, "the model accepted it"
        assert self.snapshot() == before

    def pick(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from(sorted(int(s) for s in self.pool.seq_ids())))

    # -- admissions
    def admit_tokens(self, tokens: list[int], extra: int | None, dtype: Any) -> None:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        self.history.append(("tokens", tokens, extra))
        before = self.snapshot()
        expect = self.model.admit_tokens(seq, tokens, extra)
        try:
            cached, slots, cow = self.pool.add_sequence_tokens(seq, np.array(tokens, dtype=dtype), extra)
        except kv.PoolExhaustedError:
            return self.refused(before, expect)
        assert (cached, len(cow)) == expect, "the model predicted otherwise"
        computed = len(self.rows(slots)[0])
        assert 0 <= cached <= max(len(tokens) - 1, 0) and computed == len(tokens) - cached
        self.ident[seq] = ("tokens", tokens, extra)
        self.copy(cow)
        self.check_reused_kv(seq, cached)
        self.write(seq, cached, slots)

    def admit_block_keys(self, keys: list[int], n: int, wide: bool) -> None:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        self.history.append(("keys", keys, n))
        arr = np.array([[0, k] for k in keys], dtype=np.uint64).reshape(-1, 2) if wide else np.array(keys, np.int64)
        before = self.snapshot()
        expect = self.model.admit_keys(seq, keys, n)
        try:
            cached, slots = self.pool.add_sequence_block_keys(seq, arr, n)
        except kv.PoolExhaustedError:
            return self.refused(before, expect)
        assert (cached, 0) == expect, "the model predicted otherwise"
        assert len(self.rows(slots)[0]) == n - cached
        self.ident[seq] = ("keys", keys, n)
        self.check_reused_kv(seq, cached)
        self.write(seq, cached, slots)

    @rule(family=st.integers(0, FAMILIES - 1), shared=st.sampled_from([0, 4, 7, 8, 12, 14]),
          branch=st.integers(0, 2), tail=st.sampled_from([0, 0, 1, 3, 4, 6]), extra=st.sampled_from([None, None, 7]),
          dtype=st.sampled_from([np.int32, np.int64, np.uint32]), head=st.sampled_from([0, 0, 1, 2]))
    def admit(self, family: int, shared: int, branch: int, tail: int, extra: int | None, dtype: Any,
              head: int) -> None:
        self.admit_tokens(family_prompt(family, shared, branch, tail, head), extra, dtype)

    @rule(family=st.integers(0, FAMILIES - 1), shared=st.integers(0, 4), branch=st.integers(0, 1),
          n=st.sampled_from([0, 3, 4, 6, 8, 10, 12, 15, 16]), wide=st.booleans())
    def admit_keys(self, family: int, shared: int, branch: int, n: int, wide: bool) -> None:
        self.admit_block_keys(family_keys(family, shared, branch, n), n, wide)

    @precondition(lambda self: len(self.history) > 0)
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        """A prompt seen before (hits, copy-on-write hits, other fills under the same key)."""
        kind, a, b = data.draw(st.sampled_from(self.history))
        if kind == "tokens":
            self.admit_tokens(a, b, np.int64)
        else:
            self.admit_block_keys(a, b, False)

    @rule(n=st.integers(1, 12))
    def add_plain(self, n: int) -> None:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        before = self.snapshot()
        ok = self.model.add_plain(seq, n)
        try:
            slots = self.pool.add_sequence(seq, n)
        except kv.PoolExhaustedError:
            return self.refused(before, ok)
        assert ok, "the model predicted exhaustion"
        self.ident[seq] = ("plain", None, None)
        self.write(seq, 0, slots)

    # -- growth and release
    @precondition(lambda self: len(self.pool) > 0)
    @rule(data=st.data(), n=st.integers(0, 6), plain=st.booleans())
    def append(self, data: st.DataObject, n: int, plain: bool) -> None:
        seq = self.pick(data)
        kind, ids, extra = self.ident[seq]
        new = None if plain else [60_000 + seq * 10 + i for i in range(n)]
        before, start = self.snapshot(), self.pool.seq_len(seq)
        expect = self.model.append(seq, new, n)
        try:
            slots, cow = self.pool.append(seq, n) if new is None else self.pool.append_tokens(seq, new)
        except kv.PoolExhaustedError:
            return self.refused(before, expect)
        assert len(cow) == expect, "the model predicted otherwise"
        if kind == "tokens" and ids is not None and n > 0:
            self.ident[seq] = (kind, None if new is None else ids + new, extra)
        self.copy(cow)
        self.write(seq, start, slots)

    @precondition(lambda self: len(self.pool) > 0)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = self.pick(data)
        self.pool.free(seq)
        self.model.free(seq)

    @precondition(lambda self: len(self.pool) > 0)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = self.pick(data)
        child, self.next_seq = self.next_seq, self.next_seq + 1
        self.pool.fork(parent, child)
        kind, a, b = self.ident[parent]
        self.ident[child] = (kind, list(a) if kind == "tokens" and a is not None else a, b)
        self.model.fork(parent, child)

    @precondition(lambda self: len(self.pool) > 0)
    @rule(data=st.data(), n=st.integers(0, 6))
    def truncate(self, data: st.DataObject, n: int) -> None:
        seq = self.pick(data)
        n = min(n, self.pool.seq_len(seq))
        before = self.snapshot()
        ok = self.model.truncate(seq, n)
        try:
            self.pool.truncate(seq, n)
        except kv.InvalidArgumentError:
            return self.refused(before, ok)
        assert ok, "the model refused it"
        kind, a, b = self.ident[seq]
        length = self.pool.seq_len(seq)
        if kind == "tokens" and a is not None:
            self.ident[seq] = (kind, a[:length], b)
        elif kind == "keys":
            self.ident[seq] = (kind, a, min(b, length))

    # -- pins, clock, reset, events
    @rule(family=st.integers(0, FAMILIES - 1), blocks=st.integers(0, 3), soft=st.sampled_from([None, 1, 5]),
          ttl=st.sampled_from([None, 1, 3, 8]), by_keys=st.booleans())
    def pin(self, family: int, blocks: int, soft: int | None, ttl: int | None, by_keys: bool) -> None:
        tokens = family_prompt(family, blocks * BS, 0, 0)
        keys = family_keys(family, blocks, 0, blocks * BS) if by_keys else self.model.keys(tokens, None)
        exp = None if ttl is None else self.pool.cache_stats().clock + ttl
        before = self.snapshot()
        expect = self.model.pin(keys, None if by_keys else tokens, None, soft, exp)
        try:
            if by_keys:
                pid = self.pool.pin_block_keys(keys, priority=soft, expires_at=exp)
            else:
                pid = self.pool.pin_prefix(np.array(tokens, dtype=np.int64), priority=soft, expires_at=exp)
        except kv.InvalidArgumentError:
            return self.refused(before, expect)
        assert pid == expect, "the model predicted otherwise"
        self.pin_ids.append(pid)

    @rule(data=st.data(), action=st.sampled_from(["unpin", "clock", "clock", "reset", "drain", "drain"]))
    def housekeeping(self, data: st.DataObject, action: str) -> None:
        """The rarer calls, in one rule so that admissions and frees dominate programs."""
        if action == "unpin":
            self.unpin(data.draw(st.sampled_from(self.pin_ids + [999_999])))
        elif action == "clock":
            self.set_clock(data.draw(st.integers(-1, 4)))
        elif action == "reset":
            self.reset()
        else:
            self.drain()

    def unpin(self, pid: int) -> None:
        before = self.snapshot()
        ok = self.model.unpin(pid)
        try:
            self.pool.unpin(pid)
        except kv.InvalidArgumentError:
            return self.refused(before, ok)
        assert ok, "the model refused it"

    def set_clock(self, step: int) -> None:
        t = max(self.pool.cache_stats().clock + step, 0)
        before = self.snapshot()
        ok = self.model.set_clock(t)
        try:
            self.pool.set_clock(t)
        except kv.InvalidArgumentError:
            return self.refused(before, ok)
        assert ok, "the model refused it"

    def reset(self) -> None:
        before = self.snapshot()
        expect = self.model.reset()
        try:
            n = self.pool.reset_prefix_cache()
        except kv.InvalidArgumentError:
            return self.refused(before, expect)
        assert n == expect, "the model predicted otherwise"

    def drain(self) -> None:
        ev = self.pool.drain_events()
        key = [(int(h) << 64) | int(lo) for h, lo in ev["key"].tolist()]
        par = [(int(h) << 64) | int(lo) for h, lo in ev["parent_key"].tolist()]
        cols = zip(ev["kind"].tolist(), ev["group"].tolist(), ev["tokens"].tolist(), ev["clock"].tolist())
        got = [(k, g, key[i], par[i] if ev["has_parent"][i] else None, t, c) for i, (k, g, t, c) in enumerate(cols)]
        assert got == self.model.drain()

    # -- checks after every step
    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "pool"):
            return
        self.pool.check_invariants()
        m = self.model
        s = self.pool.cache_stats()
        assert self.pool.num_free_blocks == m.num_free()
        assert (s.cached_blocks, s.idle_blocks, s.evictable_blocks, s.pinned_blocks) == (
            len(m.cache), len(m.idle()), m.evictable(), m.pinned())
        assert (s.clock, s.num_pins, s.pending_events, s.dropped_events) == (m.clock, len(m.pins), len(m.events), 0)
        stats = {k: v for k, v in m.stats.items() if self.all_full or k != "collisions"}
        assert {k: getattr(s, k) for k in stats} == stats
        assert s.group_hit_blocks == m.group_hits
        for seq, sm in m.seqs.items():
            assert self.pool.seq_len(seq) == sm.ntokens
            for g in range(self.num_groups):
                got = [self.pool.refcount(b) if b >= 0 else None for b in self.table(seq, g)]
                assert got == [None if b is None else b.refs for b in sm.tables[g]], (seq, g)
        for f in range(FAMILIES):
            probe = family_prompt(f, 14, 0, 0)
            assert self.pool.cached_prefix_len(probe) == m.cached_prefix_len(probe)


class CollidingPrefixPoolMachine(PrefixPoolMachine):
    """3-bit token keys: nearly every lookup collides; verification must keep KV exact.
    Pools without a full group, where only the cache's record of each windowed block's
    prefix tells a colliding prefix from the query's, are drawn more often."""

    hash_bits = 3

    @initialize(policy=st.sampled_from(["lru", "fifo", "lfu", "priority"]), cow=st.booleans(),
                mix=st.sampled_from(MIXES + [[SW(6)], [SW(5), kv.ChunkedAttention(8)]] * 3))
    def setup(self, policy: str, cow: bool, mix: list[Any] | None) -> None:
        self.start(policy, cow, mix)


TestPrefixPool = PrefixPoolMachine.TestCase
TestCollidingPrefixPool = CollidingPrefixPoolMachine.TestCase
