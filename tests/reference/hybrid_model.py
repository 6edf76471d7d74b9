"""A pure-Python model of :class:`pykvpool.BlockPool` without prefix caching, written from its
documented contract (``pykvpool/_native.pyi``: the layer groups and release rule of the class
docstring, each method's errors, :class:`pykvpool.PoolStats`), not from the implementation;
shared by the pool tests (not a test module).

A sequence has a logical length ``L`` and a frontier; per group, a table of logical blocks
``0..ceil(L / bs)``, each stored (an abstract block id of the model) or a hole. A pool built
without ``groups`` is one full-attention group whose results have no group axis. An operation
the contract refuses raises :class:`Expected` (the error class and its attributes) and changes
nothing. Which free block the pool hands out is its choice: :meth:`Model.learn` learns the
physical id of each new block from the slots a growth returned, checks it was free, and
checks the copy-on-write pairs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Union

import pykvpool as kv

Kind = Any  # kv.FullAttention | kv.SlidingWindow | kv.ChunkedAttention
Stats = dict[str, Union[int, float, list[int]]]


def first_needed(kind: Kind, p: int) -> int:
    """The first non-sink key position a query at ``p`` sees."""
    if isinstance(kind, kv.SlidingWindow):
        return max(0, p + 1 - kind.window)
    if isinstance(kind, kv.ChunkedAttention):
        return p - p % kind.chunk_size
    return 0


def sees(kind: Kind, p: int, k: int) -> bool:
    """Whether a query at ``p`` sees the key at ``k``."""
    return k <= p and (k < kind.sink_tokens or k >= first_needed(kind, p))


def releasable(kind: Kind, i: int, bs: int, p: int) -> bool:
    """The release rule: block ``i`` goes at the start of a growth from length ``p``."""
    windowed = not isinstance(kind, kv.FullAttention)
    return windowed and i * bs >= kind.sink_tokens and (i + 1) * bs <= first_needed(kind, p)


def needed_blocks(kind: Kind, p: int, bs: int) -> set[int]:
    """Logical blocks holding a key the query at ``p`` sees, before ``p``."""
    return {k // bs for k in range(p) if sees(kind, p, k)}


class Expected(Exception):
    """The contract's verdict that an operation must fail with ``cls`` (and these attributes)."""

    def __init__(self, cls: type[Exception], **attrs: int) -> None:
        super().__init__(cls.__name__)
        self.cls = cls
        self.attrs = attrs


@dataclass
class Seq:
    length: int
    frontier: int
    tables: list[dict[int, int]]  # per group: logical block -> model block id

    def copy(self) -> Seq:
        return Seq(self.length, self.frontier, [dict(t) for t in self.tables])


@dataclass
class Growth:
    """A growth the model accepted: ``(seq, n)`` per sequence in batch order, per group the model
    block of each new token in that order, and the copy-on-write pairs as (old, new) model ids."""

    plan: list[tuple[int, int]]
    blocks: list[list[int]]
    cow: list[tuple[int, int]]


@dataclass
class Model:
    layout: list[Kind] | None  # None: a pool built without ``groups``
    bs: int
    num_blocks: int
    seqs: dict[int, Seq] = field(default_factory=dict)
    phys: dict[int, int] = field(default_factory=dict)  # model block id -> physical block
    unwritten: dict[int, int] = field(default_factory=dict)  # model block -> offsets below it never written
    cow_copies: int = 0
    fresh: itertools.count = field(default_factory=itertools.count)  # type: ignore[type-arg]
    groups: list[Kind] = field(init=False)  # the attention kind of each group

    def __post_init__(self) -> None:
        self.groups = [kv.FullAttention()] if self.layout is None else list(self.layout)

    @property
    def grouped(self) -> bool:
        """Results have a group axis and per-group queries take ``group=``."""
        return self.layout is not None

    def refs(self) -> dict[int, int]:
        """Live model blocks and how many sequences hold each."""
        return _refs(self.seqs.values())

    def live(self, seq: int) -> Seq:
        if seq not in self.seqs:
            raise Expected(kv.UnknownSequenceError, seq_id=seq)
        return self.seqs[seq]

    def table(self, seq: int, g: int) -> list[int]:
        s = self.seqs[seq]
        t = s.tables[g]
        return [self.phys.get(t[i], -2) if i in t else -1 for i in range(-(-s.length // self.bs))]

    def stored_ranges(self, seq: int, g: int) -> list[tuple[int, int]]:
        s, bs = self.seqs[seq], self.bs
        out: list[tuple[int, int]] = []
        for i in sorted(s.tables[g]):
            a, b = i * bs, min((i + 1) * bs, s.length)
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        return out

    def holds(self, seq: int, g: int, k: int) -> bool:
        """Whether group ``g`` holds the KV of position ``k`` of ``seq``: its block is stored
        and ``k`` was written in that block (a block taken at a hole is written from the
        growth's first position on)."""
        m = self.seqs[seq].tables[g].get(k // self.bs)
        return m is not None and k % self.bs >= self.unwritten.get(m, 0)

    def held(self, seq: int, g: int) -> list[int]:
        """The positions of ``seq`` whose KV group ``g`` holds."""
        return [k for k in range(self.seqs[seq].length) if self.holds(seq, g, k)]

    # -- operations: each raises Expected and changes nothing, or applies its effect

    def grow(self, plan: list[tuple[int, int]]) -> Growth:
        """A step ``[(seq, n)]``: ids checked in order (unknown, then listed twice), then per
        growing sequence (``n > 0``) the release rule at its length in every group, then
        in batch order copy-on-write of a shared partly filled last block and new blocks
        (a count of 0 is no growth: nothing released, the frontier stays)."""
        seen: set[int] = set()
        for seq, _ in plan:
            self.live(seq)
            if seq in seen:
                raise Expected(kv.InvalidArgumentError)
            seen.add(seq)
        seqs, growth, unwritten, free = self._stage(plan)
        if len(unwritten) > free:
            raise Expected(kv.PoolExhaustedError, requested=len(unwritten), free=free)
        self.seqs, self.cow_copies = seqs, self.cow_copies + len(growth.cow)
        self.unwritten.update(unwritten)
        return growth

    def blocks_needed(self, seq: int, n: int) -> int:
        self.live(seq)
        return len(self._stage([(seq, n)])[2])

    def _stage(self, plan: list[tuple[int, int]]) -> tuple[dict[int, Seq], Growth, dict[int, int], int]:
        """The sequences after the growth, the growth, the blocks it allocates (with the
        offsets below which each was never written) and the blocks free for it: those free
        now and those its releases free."""
        bs = self.bs
        seqs = {k: s.copy() for k, s in self.seqs.items()}
        for seq, n in plan:  # windowed groups first release what no query from now on sees
            s = seqs[seq]
            for g, kind in enumerate(self.groups if n else []):
                for i in [i for i in s.tables[g] if releasable(kind, i, bs, s.length)]:
                    del s.tables[g][i]
        refs = _refs(seqs.values())
        free = self.num_blocks - len(refs)
        growth = Growth(plan, [[] for _ in self.groups], [])
        unwritten: dict[int, int] = {}
        for seq, n in plan:
            s = seqs[seq]
            for g, t in enumerate(s.tables):
                for p in range(s.length, s.length + n):
                    i = p // bs
                    if i not in t:  # a new block, or a hole at the write position
                        t[i] = next(self.fresh)
                        refs[t[i]] = 1
                        unwritten[t[i]] = p % bs
                    elif refs[t[i]] > 1:  # a shared partly filled block: copy on write
                        old, t[i] = t[i], next(self.fresh)
                        refs[old] -= 1
                        refs[t[i]] = 1
                        unwritten[t[i]] = self.unwritten.get(old, 0)
                        growth.cow.append((old, t[i]))
                    growth.blocks[g].append(t[i])
            if n:
                s.frontier, s.length = s.length, s.length + n
        return seqs, growth, unwritten, free

    def add(self, seq: int, n: int) -> Growth:
        if seq in self.seqs:
            raise Expected(kv.DuplicateSequenceError, seq_id=seq)
        self.seqs[seq] = Seq(0, 0, [{} for _ in self.groups])
        try:
            return self.grow([(seq, n)])
        except Expected:
            del self.seqs[seq]
            raise

    def fork(self, parent: int, child: int) -> None:
        if child in self.seqs:
            raise Expected(kv.DuplicateSequenceError, seq_id=child)
        self.seqs[child] = self.live(parent).copy()

    def truncate(self, seq: int, n: int) -> None:
        """Refused past the length, or when a query at the new length would see a position
        whose KV a group no longer holds (a truncation may not roll back into what was
        released)."""
        s = self.live(seq)
        if n > s.length:
            raise Expected(kv.InvalidArgumentError)
        l2 = s.length - n
        for g, kind in enumerate(self.groups):
            if any(sees(kind, l2, k) and not self.holds(seq, g, k) for k in range(l2)):
                raise Expected(kv.InvalidArgumentError)
        keep = -(-l2 // self.bs)
        s.tables = [{i: m for i, m in t.items() if i < keep} for t in s.tables]
        s.length, s.frontier = l2, min(s.frontier, l2)

    def free(self, ids: list[int]) -> None:
        """``free`` of one id or ``free_batch``: an id listed twice, then an unknown id."""
        if len(set(ids)) < len(ids):
            raise Expected(kv.InvalidArgumentError)
        for seq in ids:
            self.live(seq)
        for seq in ids:
            del self.seqs[seq]

    def mark_computed(self, ids: list[int]) -> None:
        """Every query up to each length computed: the frontier becomes the length and the
        release rule runs for a next query at the length."""
        for seq in ids:
            self.live(seq)
        for seq in ids:
            s = self.seqs[seq]
            for g, kind in enumerate(self.groups):
                t = s.tables[g]
                for i in [i for i in t if releasable(kind, i, self.bs, s.length)]:
                    del t[i]
            s.frontier = s.length

    # -- learning physical ids

    def learn(self, growth: Growth, slots: list[list[int]], cow: list[tuple[int, int]]) -> None:
        """From a growth's slots (per group, batch order), learn the physical block of each
        block it allocated and check that block was free (no live block maps there) and
        each slot is its position in its block; then the copy-on-write pairs must be the
        model's."""
        bs, live = self.bs, self.refs()
        self.phys = {m: b for m, b in self.phys.items() if m in live}
        self.unwritten = {m: u for m, u in self.unwritten.items() if m in live}
        taken = set(self.phys.values())
        ends = {seq: self.seqs[seq].length for seq, _ in growth.plan}
        positions = [p for seq, n in growth.plan for p in range(ends[seq] - n, ends[seq])]
        for g, (blocks, row) in enumerate(zip(growth.blocks, slots)):
            assert len(row) == len(blocks), (g, row)
            for p, m, slot in zip(positions, blocks, row):
                assert 0 <= slot < self.num_blocks * bs and slot % bs == p % bs, f"group {g}: slot {slot} for {p}"
                if m not in self.phys:
                    assert slot // bs not in taken, f"group {g}: new block {slot // bs} was not free"
                    self.phys[m] = slot // bs
                    taken.add(slot // bs)
                assert self.phys[m] == slot // bs, f"group {g}: slot {slot} of token {p} is not in its block"
        want = sorted((self.phys[a], self.phys[b]) for a, b in growth.cow)
        assert sorted(cow) == want, f"copy-on-write pairs {cow}, expected {want}"

    # -- statistics

    def stats(self) -> Stats:
        """:meth:`pykvpool.PoolStats.as_dict` of the model's pool."""
        bs, refs, n = self.bs, self.refs(), len(self.groups)
        fill: dict[int, int] = {}  # model block -> filled slots (a shared token counts once)
        group_of: dict[int, int] = {}
        holes = [0] * n
        for s in self.seqs.values():
            for g, t in enumerate(s.tables):
                holes[g] += -(-s.length // bs) - len(t)
                for i, m in t.items():
                    fill[m] = max(fill.get(m, 0), min(bs, s.length - i * bs))
                    group_of[m] = g
        stored = sum(fill.values())
        capacity = len(refs) * bs
        return {
            "block_size": bs,
            "total_blocks": self.num_blocks,
            "free_blocks": self.num_blocks - len(refs),
            "used_blocks": len(refs),
            "num_seqs": len(self.seqs),
            "logical_tokens": sum(s.length for s in self.seqs.values()),
            "stored_tokens": stored,
            "shared_blocks": sum(1 for c in refs.values() if c > 1),
            "cow_copies": self.cow_copies,
            "empty_slots": capacity - stored,
            "utilization": stored / capacity if capacity else 1.0,
            "idle_cached_blocks": 0,
            "group_blocks": [sum(1 for m in refs if group_of[m] == g) for g in range(n)],
            "group_stored_tokens": [sum(f for m, f in fill.items() if group_of[m] == g) for g in range(n)],
            "group_holes": holes,
        }


def _refs(seqs: Iterable[Seq]) -> dict[int, int]:
    out: dict[int, int] = {}
    for s in seqs:
        for t in s.tables:
            for m in t.values():
                out[m] = out.get(m, 0) + 1
    return out
