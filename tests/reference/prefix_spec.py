"""A reference model of a prefix-caching BlockPool on one or more layer groups, written from
the documentation (not a test module): the rules of ``BlockPool``'s docstrings in
``pykvpool/_native.pyi``, the module doc of ``rust/pool/prefix.rs``, the README's
prefix-caching section and the eviction specification in ``rust/prefix_cache/eviction.rs``
(what *uses* a block, in which order, and what each policy evicts first); the layer-group
rules (which blocks a query needs, which a growth releases) come from
``reference/hybrid_model.py``.

Keys come from an independent implementation of the documented encoding (the ``xxhash``
package's XXH3-128, see :func:`token_keys`), so the model predicts the exact KV events.
Physical block ids are the pool's own business: the model tracks blocks as objects and
events are compared without them.

Verification, as documented: a cached block serves logical block ``i`` of a prompt of
token ids only when its KV was computed from exactly that prompt through ``i`` (ids and
extra key), in every group kind; a prompt of block keys trusts them (a full group's block
under the same keys through ``i``, a windowed group's under its own key). A windowed block
of token ids is cached only while the token records of every such block's prefix keep one
record per key (the lineage, ``32 * num_blocks * bs`` ids at most).
"""

from __future__ import annotations

import copy
import struct
from dataclasses import dataclass, field
from typing import Any

import xxhash
from reference.hybrid_model import needed_blocks, releasable

import pykvpool as kv

SEED = int.from_bytes(b"pkvpool1", "little")
EVENT_STORED, EVENT_REMOVED, EVENT_ALL_CLEARED = 0, 1, 2
LINEAGE_TOKENS_PER_TOKEN = 32
Event = tuple[int, int, int, "int | None", int, int]  # kind, group, key, parent key, tokens, clock


def token_keys(tokens: list[int], bs: int, extra: int | None, bits: int = 128) -> list[int]:
    """Chained keys of the full blocks: XXH3-128 (seed ``pkvpool1``) of parent key (16
    bytes LE), ``0x00`` or ``0x01`` + extra key (8 bytes LE), token ids (4 bytes LE), cut
    to the low ``bits`` bits (``hash_bits``)."""
    parent, out = 0, []
    for i in range(len(tokens) // bs):
        data = parent.to_bytes(16, "little")
        data += b"\x00" if extra is None else b"\x01" + struct.pack("<Q", extra)
        data += struct.pack(f"<{bs}I", *tokens[i * bs : (i + 1) * bs])
        parent = xxhash.xxh3_128_intdigest(data, seed=SEED) & ((1 << bits) - 1)
        out.append(parent)
    return out


def windowed(kind: Any) -> bool:
    return not isinstance(kind, kv.FullAttention)


@dataclass(eq=False)
class Block:
    """A physical block held by at least one sequence, or idle in the cache."""

    refs: int = 1
    cached: bool = False
    group: int = 0
    key: int = 0
    parent: Block | None = None
    extra: int | None = None
    keys: tuple[int, ...] = ()  # the prompt's keys through this block
    prefix: tuple[int, ...] | None = None  # its token ids through this block (None: keyed)
    fill: int = 0
    children: int = 0
    last_use: int = 0
    stored: int = 0
    hits: int = 0
    hard: int = 0
    soft: dict[int, int] = field(default_factory=dict)


@dataclass
class Seq:
    tables: list[list[Block | None]]  # per group: logical block -> block, or a hole
    ntokens: int
    tokens: list[int] | None  # None when admitted by keys or grown without ids
    extra: int | None


@dataclass
class Pin:
    blocks: list[Block]
    priority: int | None
    expires_at: int | None


@dataclass
class Query:
    """A prompt looked up: token ids (``keys`` of its full blocks) or trusted block keys."""

    keys: list[int]
    tokens: list[int] | None
    extra: int | None
    n: int

    def fill(self, i: int, bs: int) -> int:
        return min(bs, self.n - i * bs)


class Spec:
    """The documented behaviour. Each mutating method returns None (or False) where the
    pool must raise, having changed nothing."""

    def __init__(self, bs: int, num_blocks: int, policy: str, cow: bool, hash_bits: int = 128,
                 groups: list[Any] | None = None) -> None:
        self.bs, self.policy, self.cow, self.bits = bs, policy, cow, hash_bits
        self.groups = groups or [kv.FullAttention()]
        self.num_blocks = num_blocks
        self.free_blocks = num_blocks  # never-cached (or reset) blocks with no holder
        self.cache: dict[tuple[int, int, int], Block] = {}  # (group, key, fill)
        self.seqs: dict[int, Seq] = {}
        self.pins: dict[int, Pin] = {}
        self.next_pin = 0
        self.uses = 0
        self.clock = 0
        self.manual_clock = False
        self.events: list[Event] = []
        self.stats = dict(queries=0, query_blocks=0, hit_blocks=0, query_tokens=0, hit_tokens=0,
                          stored_blocks=0, evictions=0, collisions=0, cow_hits=0)
        self.group_hits = [0] * len(self.groups)
        self.takes = 0  # blocks taken so far (a growth's capacity rule counts them)

    # ------------------------------------------------------------------ counts
    def idle(self) -> list[Block]:
        return [b for b in self.cache.values() if b.refs == 0]

    def evictable(self) -> int:
        return sum(1 for b in self.idle() if b.hard == 0)

    def num_free(self) -> int:
        return self.free_blocks + self.evictable()

    def pinned(self) -> int:
        return sum(1 for b in self.cache.values() if b.hard > 0)

    # ------------------------------------------------------------------ uses and eviction
    def use(self, b: Block) -> None:
        self.uses += 1
        b.last_use = self.uses

    def order(self, b: Block) -> tuple[int, ...]:
        """The eviction order of the policy's specification: smallest first."""
        if self.policy == "lru":
            return (b.last_use,)
        if self.policy == "fifo":
            return (b.stored,)
        if self.policy == "lfu":
            return (b.hits, b.last_use)
        return (max(b.soft.values(), default=0), b.last_use)

    def take(self) -> Block:
        """A block for an allocation: a never-cached one first, else evict an idle unpinned
        leaf; :class:`Exhausted` when there is neither."""
        self.takes += 1
        if self.free_blocks:
            self.free_blocks -= 1
        else:
            leaves = [b for b in self.idle() if b.hard == 0 and b.children == 0]
            if not leaves:
                raise Exhausted
            self.uncache(min(leaves, key=self.order), record=True)
            self.stats["evictions"] += 1
        return Block()

    def uncache(self, b: Block, record: bool) -> None:
        if record:
            self.emit(EVENT_REMOVED, b)
        del self.cache[(b.group, b.key, b.fill)]
        b.cached, b.soft = False, {}
        if b.parent is not None:
            b.parent.children -= 1

    def release(self, b: Block) -> None:
        b.refs -= 1
        if b.refs == 0:
            if b.cached:
                self.use(b)  # rule 3: it becomes idle
            else:
                self.free_blocks += 1

    def emit(self, kind: int, b: Block | None) -> None:
        if b is None:
            self.events.append((kind, 0, 0, None, 0, self.clock))
        else:
            parent = b.parent.key if b.parent is not None else None
            self.events.append((kind, b.group, b.key, parent, b.fill, self.clock))

    def end_op(self) -> None:
        if not self.manual_clock:
            self.clock += 1
        self.expire()

    def expire(self) -> None:
        for pid in [p for p, pin in self.pins.items() if pin.expires_at is not None and pin.expires_at <= self.clock]:
            self.unpin(pid)

    # ------------------------------------------------------------------ lookups
    def keys(self, tokens: list[int], extra: int | None) -> list[int]:
        return token_keys(tokens, self.bs, extra, self.bits)

    def needed(self, g: int, p: int) -> list[int]:
        """Logical blocks group ``g`` needs before token position ``p``."""
        return sorted(needed_blocks(self.groups[g], p, self.bs))

    def valid(self, g: int, q: Query, i: int) -> Block | None:
        """The block of group ``g`` serving logical block ``i`` of ``q``, if cached."""
        b = self.cache.get((g, q.keys[i], q.fill(i, self.bs)))
        if b is None:
            return None
        if q.tokens is not None:
            ok = b.extra == q.extra and b.prefix == tuple(q.tokens[: (i + 1) * self.bs])
        else:
            ok = b.extra is None and (windowed(self.groups[g]) or b.keys == tuple(q.keys[: i + 1]))
        return b if ok else None

    def longest(self, q: Query, most: int) -> int:
        """The longest prefix of at most ``most`` blocks cached validly for every group."""
        for h in range(most, 0, -1):
            if all(self.valid(g, q, i) is not None for g in range(len(self.groups)) for i in self.needed(g, h * self.bs)):
                return h
        return 0

    def collided(self, q: Query) -> bool:
        """Whether a full group's chain walk met a cached key that failed verification."""
        for g, kind in enumerate(self.groups):
            if windowed(kind):
                continue
            for i, key in enumerate(q.keys):
                b = self.cache.get((g, key, q.fill(i, self.bs)))
                if b is None:
                    break
                if self.valid(g, q, i) is None:
                    return True
        return False

    def cached_prefix_len(self, tokens: list[int], extra: int | None = None) -> int:
        keys = self.keys(tokens, extra)
        return self.longest(Query(keys, tokens, extra, len(tokens)), len(keys)) * self.bs

    def lineage_admits(self, keys: tuple[int, ...], prefix: tuple[int, ...], extra: int | None) -> bool:
        """Whether a windowed block standing on this prefix keeps one record per key."""
        bs = self.bs
        records: dict[int, Any] = {}
        standing = [(b.keys, b.prefix, b.extra) for b in self.cache.values()
                    if b.prefix is not None and windowed(self.groups[b.group])]
        for ks, ts, e in [*standing, (keys, prefix, extra)]:
            for j, k in enumerate(ks):
                rec = (ks[j - 1] if j else None, e, ts[j * bs : (j + 1) * bs])
                if records.setdefault(k, rec) != rec:
                    return False
        return len(records) * bs <= LINEAGE_TOKENS_PER_TOKEN * self.num_blocks * bs

    # ------------------------------------------------------------------ stores
    def register(self, tables: list[list[Block | None]], q: Query, start: int) -> None:
        """Store blocks ``start..`` of ``tables`` under ``q.keys``: in a full group as a chain
        (a block after the cached block before it; a broken chain or a taken key stops the
        group), in a windowed group each block whose key it lacks (and the lineage admits)."""
        bs = self.bs
        for g, t in enumerate(tables):
            win = windowed(self.groups[g])
            for i in range(start, len(q.keys)):
                b = t[i] if i < len(t) else None
                if b is None:
                    continue
                key, fill = q.keys[i], q.fill(i, bs)
                if b.cached and (b.group, b.key, b.fill) == (g, key, fill):
                    continue
                parent = None
                if not win and i > 0:
                    p = t[i - 1]
                    if p is None or not p.cached or (p.group, p.key, p.fill) != (g, q.keys[i - 1], bs):
                        break
                    parent = p
                prefix = tuple(q.tokens[: (i + 1) * bs]) if q.tokens is not None else None
                taken = b.cached or (g, key, fill) in self.cache
                admits = not win or prefix is None or self.lineage_admits(tuple(q.keys[: i + 1]), prefix, q.extra)
                if taken or not admits:
                    if win:
                        continue
                    break
                b.cached, b.group, b.key, b.parent, b.extra, b.fill = True, g, key, parent, q.extra, fill
                b.keys, b.prefix, b.children, b.hits, b.soft = tuple(q.keys[: i + 1]), prefix, 0, 0, {}
                self.use(b)  # rule 1
                b.stored = self.uses
                if parent is not None:
                    parent.children += 1
                self.cache[(g, key, fill)] = b
                self.stats["stored_blocks"] += 1
                self.emit(EVENT_STORED, b)

    # ------------------------------------------------------------------ admissions
    def admit_tokens(self, seq: int, tokens: list[int], extra: int | None) -> tuple[int, int] | None:
        return self._admit(seq, Query(self.keys(tokens, extra), tokens, extra, len(tokens)))

    def admit_keys(self, seq: int, keys: list[int], n: int) -> tuple[int, int] | None:
        return self._admit(seq, Query(keys, None, None, n))

    def _admit(self, seq: int, q: Query) -> tuple[int, int] | None:
        """``(cached tokens, copy-on-write pairs)``, or None when the pool is exhausted."""
        bs, n, full, ng = self.bs, q.n, len(q.keys), len(self.groups)
        collision = self.collided(q)
        found = self.longest(q, full)
        cap = min(max(n - 1, 0) // bs, full)
        hb = found if found <= cap else self.longest(q, cap)
        last = max(n - 1, 0)
        copies: list[tuple[int, Block]] | None = None
        if self.cow and q.tokens is not None and last > hb * bs and last // bs == hb and hb < full:
            copies = self.copies(q, hb, last)
        p = last if copies is not None else hb * bs
        held = [(g, i, self.valid(g, q, i)) for g in range(ng) for i in self.needed(g, p) if i < hb]
        copies = copies or []
        revived = {id(b): b for _, _, b in held} | {id(b): b for _, b in copies}
        need = ng * (-(-n // bs) - hb)
        if need > self.num_free() - sum(1 for b in revived.values() if b.refs == 0 and b.hard == 0):
            return None
        tables: list[list[Block | None]] = [[None] * hb for _ in range(ng)]
        for g, i, b in held:
            self.hold(b)
            tables[g][i] = b
            self.group_hits[g] += 1
        for _, b in copies:
            self.hold(b)
        for g in range(ng):  # a full group's chain past the hit is a use too
            if windowed(self.groups[g]):
                continue
            prev = None
            for i in range(full):
                b = self.valid(g, q, i)
                if b is None or b.parent is not prev:
                    break
                prev = b
                if i >= hb and not any(c is b for _, c in copies):
                    b.hits += 1
                    self.use(b)
        for t in tables:
            self.grow_table(t, hb * bs, n - hb * bs)
        for _, b in copies:
            self.release(b)
        cached = n - 1 if copies else hb * bs
        self.register(tables, q, hb)
        s = self.stats
        s["queries"] += 1
        s["query_blocks"] += full
        s["hit_blocks"] += found
        s["query_tokens"] += n
        s["hit_tokens"] += cached
        s["collisions"] += collision
        s["cow_hits"] += bool(copies)
        self.seqs[seq] = Seq(tables, n, list(q.tokens) if q.tokens is not None else None, q.extra)
        self.end_op()
        return cached, len(copies)

    def copies(self, q: Query, hb: int, p: int) -> list[tuple[int, Block]] | None:
        """A partial hit's copy sources (block ``hb`` of every group that needs it), or None
        unless every block the query at ``p`` needs is cached validly in every group."""
        out = []
        for g in range(len(self.groups)):
            for i in self.needed(g, p):
                b = self.valid(g, q, i)
                if b is None:
                    return None
                if i == hb:
                    out.append((g, b))
        return out

    def hold(self, b: Block) -> None:
        b.refs += 1
        b.hits += 1
        self.use(b)

    def add_plain(self, seq: int, n: int) -> bool:
        self.seqs[seq] = Seq([[] for _ in self.groups], 0, None, None)
        if self.append(seq, None, n) is None:
            del self.seqs[seq]
            return False
        return True

    # ------------------------------------------------------------------ growth
    def grow_table(self, t: list[Block | None], length: int, n: int) -> int:
        """Grow one table by ``n`` tokens from ``length``: copy a shared or cached partly
        filled last block (the copy first), fill a trailing hole, then new blocks. Returns
        the copies."""
        bs, copies, w = self.bs, 0, 0
        if length % bs and n:
            last = t[-1]
            if last is None:
                t[-1] = self.take()
            elif last.refs > 1 or last.cached:
                t[-1] = self.take()
                self.release(last)
                copies = 1
            w = min(bs - length % bs, n)
        while w < n:
            t.append(self.take())
            w += min(bs, n - w)
        return copies

    def append(self, seq: int, new_tokens: list[int] | None, n: int) -> int | None:
        """Append ``n`` tokens (``new_tokens`` their ids, or None): the window rule's
        releases, then growth in every group. Returns the copy-on-write pairs; None (nothing
        changed) when the blocks it takes exceed the free and evictable ones plus those its
        releases free (a copy's source released after its copy does not count)."""
        saved = self.save()
        s, bs = self.seqs[seq], self.bs
        copies = 0
        try:
            if n:
                budget = self.num_free()
                for g, kind in enumerate(self.groups):
                    for i, b in enumerate(s.tables[g]):
                        if b is not None and releasable(kind, i, bs, s.ntokens):
                            self.release(b)
                            budget += b.refs == 0 and b.hard == 0
                            s.tables[g][i] = None
                takes = self.takes
                for g in range(len(self.groups)):
                    copies += self.grow_table(s.tables[g], s.ntokens, n)
                if self.takes - takes > budget:
                    raise Exhausted
        except Exhausted:
            self.restore(saved)
            return None
        old_full = s.ntokens // bs
        s.ntokens += n
        if new_tokens is None:
            if n:
                s.tokens = None
        elif s.tokens is not None:
            s.tokens += new_tokens
            keys = self.keys(s.tokens, s.extra)
            self.register(s.tables, Query(keys, s.tokens, s.extra, len(s.tokens)), old_full)
        self.end_op()
        return copies

    # ------------------------------------------------------------------ release
    def free(self, seq: int) -> None:
        s = self.seqs.pop(seq)
        for i in reversed(range(max((len(t) for t in s.tables), default=0))):  # tail first
            for t in s.tables:
                if i < len(t) and t[i] is not None:
                    self.release(t[i])
        self.end_op()

    def fork(self, parent: int, child: int) -> None:
        p = self.seqs[parent]
        for t in p.tables:
            for b in t:
                if b is not None:
                    b.refs += 1
        self.seqs[child] = Seq([list(t) for t in p.tables], p.ntokens,
                               None if p.tokens is None else list(p.tokens), p.extra)
        self.end_op()

    def truncate(self, seq: int, n: int) -> bool:
        """Drop the last ``n`` tokens; False (nothing changed) when a block the query at the
        new length needs was released."""
        s = self.seqs[seq]
        keep_len = s.ntokens - n
        if any(s.tables[g][i] is None for g in range(len(self.groups)) for i in self.needed(g, keep_len)):
            return False
        keep = -(-keep_len // self.bs)
        for t in s.tables:
            while len(t) > keep:  # tail first
                b = t.pop()
                if b is not None:
                    self.release(b)
        s.ntokens = keep_len
        if s.tokens is not None:
            del s.tokens[keep_len:]
        self.end_op()
        return True

    # ------------------------------------------------------------------ pins, clock, reset
    def pin(self, keys: list[int], tokens: list[int] | None, extra: int | None, priority: int | None,
            expires_at: int | None) -> int | None:
        q = Query(keys, tokens, extra, len(tokens) if tokens is not None else len(keys) * self.bs)
        blocks = [self.valid(g, q, i) for g in range(len(self.groups)) for i in self.needed(g, len(keys) * self.bs)]
        if not keys or any(b is None for b in blocks) or (expires_at is not None and expires_at <= self.clock):
            return None
        self.next_pin += 1
        self.pins[self.next_pin] = Pin(blocks, priority, expires_at)  # type: ignore[arg-type]
        for b in blocks:
            assert b is not None
            if priority is None:
                b.hard += 1
            else:
                b.soft[self.next_pin] = priority
        return self.next_pin

    def unpin(self, pid: int) -> bool:
        p = self.pins.pop(pid, None)
        if p is None:
            return False
        for b in p.blocks:
            if p.priority is None:
                b.hard -= 1
            else:
                b.soft.pop(pid, None)
        return True

    def set_clock(self, t: int) -> bool:
        if t < self.clock:
            return False
        self.manual_clock, self.clock = True, t
        self.expire()
        return True

    def reset(self) -> int | None:
        if self.pins:
            return None
        n = len(self.cache)
        for b in list(self.cache.values()):
            self.uncache(b, record=False)
            if b.refs == 0:
                self.free_blocks += 1
        self.emit(EVENT_ALL_CLEARED, None)
        return n

    def drain(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    # ------------------------------------------------------------------ atomic growth
    def save(self) -> dict[str, Any]:
        """Everything but the (immutable) group kinds, deep-copied."""
        state = {k: v for k, v in self.__dict__.items() if k != "groups"}
        return copy.deepcopy(state)

    def restore(self, saved: dict[str, Any]) -> None:
        self.__dict__.update(saved)


class Exhausted(Exception):
    """An allocation found neither a free nor an evictable block."""
