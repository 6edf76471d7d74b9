"""A reference model of a prefix-caching BlockPool, written from the documentation (not a
test module): the rules of ``BlockPool``'s docstrings in ``pykvpool/_native.pyi``, the
README's prefix-caching section and the eviction specification in ``rust/prefix_cache/eviction.rs``
(what *uses* a block, in which order, and what each policy evicts first).

Keys come from an independent implementation of the documented encoding (the ``xxhash``
package's XXH3-128, see :func:`token_keys`), so the model predicts the exact KV events.
Physical block ids are the pool's own business: the model tracks blocks as objects and
events are compared without them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import xxhash

SEED = int.from_bytes(b"pkvpool1", "little")
EVENT_STORED, EVENT_REMOVED, EVENT_ALL_CLEARED = 0, 1, 2
Event = tuple[int, int, "int | None", int, int]  # kind, key, parent key, tokens, clock


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


@dataclass(eq=False)
class Block:
    """A physical block held by at least one sequence, or idle in the cache."""

    refs: int = 1
    cached: bool = False
    key: int = 0
    parent: Block | None = None
    extra: int | None = None
    tokens: tuple[int, ...] | None = None  # token ids, for verification
    fill: int = 0
    children: int = 0
    last_use: int = 0
    stored: int = 0
    hits: int = 0
    hard: int = 0
    soft: dict[int, int] = field(default_factory=dict)


@dataclass
class Seq:
    table: list[Block]
    ntokens: int
    tokens: list[int] | None  # None when admitted by keys or grown without ids
    extra: int | None


@dataclass
class Pin:
    blocks: list[Block]
    priority: int | None
    expires_at: int | None


class Spec:
    """The documented behaviour. Each mutating method returns None where the pool must
    raise, having changed nothing."""

    def __init__(self, bs: int, num_blocks: int, policy: str, cow: bool, hash_bits: int = 128) -> None:
        self.bs, self.policy, self.cow, self.bits = bs, policy, cow, hash_bits
        self.verify = True
        self.free_blocks = num_blocks  # never-cached (or reset) blocks with no holder
        self.cache: dict[tuple[int, int], Block] = {}  # (key, fill): the fill is part of a block's identity
        self.seqs: dict[int, Seq] = {}
        self.pins: dict[int, Pin] = {}
        self.next_pin = 0
        self.uses = 0
        self.clock = 0
        self.manual_clock = False
        self.events: list[Event] = []
        self.stats = dict(queries=0, query_blocks=0, hit_blocks=0, query_tokens=0, hit_tokens=0,
                          stored_blocks=0, evictions=0, collisions=0, cow_hits=0)

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

    def take(self, n: int) -> list[Block]:
        """Allocate ``n`` blocks: never-cached ones first, then evict idle unpinned leaves."""
        out = []
        for _ in range(n):
            if self.free_blocks:
                self.free_blocks -= 1
            else:
                leaves = [b for b in self.idle() if b.hard == 0 and b.children == 0]
                victim = min(leaves, key=self.order)
                self.uncache(victim, record=True)
                self.stats["evictions"] += 1
            out.append(Block())
        return out

    def uncache(self, b: Block, record: bool) -> None:
        del self.cache[(b.key, b.fill)]
        b.cached, b.soft = False, {}
        if b.parent is not None:
            b.parent.children -= 1
        if record:
            self.emit(EVENT_REMOVED, b)

    def release(self, b: Block) -> None:
        b.refs -= 1
        if b.refs == 0:
            if b.cached:
                self.use(b)  # rule 3: it becomes idle
            else:
                self.free_blocks += 1

    def emit(self, kind: int, b: Block | None) -> None:
        if b is None:
            self.events.append((kind, 0, None, 0, self.clock))
        else:
            parent = b.parent.key if b.parent is not None else None
            self.events.append((kind, b.key, parent, b.fill, self.clock))

    def store(self, b: Block, key: int, parent: Block | None, extra: int | None,
              tokens: tuple[int, ...] | None, fill: int) -> None:
        b.cached, b.key, b.parent, b.extra, b.tokens, b.fill = True, key, parent, extra, tokens, fill
        b.children, b.hits, b.soft = 0, 0, {}
        self.use(b)  # rule 1
        b.stored = self.uses
        if parent is not None:
            parent.children += 1
        self.cache[(key, fill)] = b
        self.stats["stored_blocks"] += 1
        self.emit(EVENT_STORED, b)

    def end_op(self) -> None:
        if not self.manual_clock:
            self.clock += 1
        self.expire()

    def expire(self) -> None:
        for pid in [p for p, pin in self.pins.items() if pin.expires_at is not None and pin.expires_at <= self.clock]:
            self.unpin(pid)

    # ------------------------------------------------------------------ lookups
    def lookup(self, keys: list[int], fills: list[int], tokens: list[int] | None,
               extra: int | None) -> tuple[list[Block], bool]:
        """Longest chain whose every block matches key, parent, extra key, fill and (when
        verifying and the prompt has token ids) token ids; whether a found key failed."""
        chain: list[Block] = []
        for i, key in enumerate(keys):
            b = self.cache.get((key, fills[i]))
            if b is None:
                return chain, False
            ok = b.parent is (chain[-1] if chain else None) and b.extra == extra and b.fill == fills[i]
            if ok and self.verify and tokens is not None:
                ok = b.tokens == tuple(tokens[i * self.bs : i * self.bs + fills[i]])
            if not ok:
                return chain, True
            chain.append(b)
        return chain, False

    def keys(self, tokens: list[int], extra: int | None) -> list[int]:
        return token_keys(tokens, self.bs, extra, self.bits)

    def cached_prefix_len(self, tokens: list[int], extra: int | None = None) -> int:
        keys = self.keys(tokens, extra)
        return len(self.lookup(keys, [self.bs] * len(keys), tokens, extra)[0]) * self.bs

    # ------------------------------------------------------------------ admissions
    def admit_tokens(self, seq: int, tokens: list[int], extra: int | None) -> tuple[int, bool] | None:
        keys = self.keys(tokens, extra)
        return self._admit(seq, len(tokens), keys, [self.bs] * len(keys), tokens, extra)

    def admit_keys(self, seq: int, keys: list[int], n: int) -> tuple[int, bool] | None:
        fills = [min(self.bs, n - i * self.bs) for i in range(len(keys))]
        return self._admit(seq, n, keys, fills, None, None)

    def _admit(self, seq: int, n: int, keys: list[int], fills: list[int], tokens: list[int] | None,
               extra: int | None) -> tuple[int, bool] | None:
        bs = self.bs
        chain, collision = self.lookup(keys, fills, tokens, extra)
        h = len(chain)
        used = min(h, max(n - 1, 0) // bs)  # at least one prompt token is computed
        cow = self.cow and tokens is not None and h > used and n - 1 > used * bs
        cached = n - 1 if cow else used * bs
        need = -(-n // bs) - used
        held = chain[:used] + chain[used:used + 1] * cow
        if need > self.num_free() - sum(1 for b in held if b.refs == 0 and b.hard == 0):
            return None
        for b in chain:  # rule 2, root first
            b.hits += 1
            self.use(b)
        for b in held:
            b.refs += 1
        table = chain[:used] + self.take(need)
        if cow:
            self.release(chain[used])
        for i in range(used, len(keys)):
            ok = i == 0 or (table[i - 1].cached and table[i - 1].key == keys[i - 1])
            if not ok or (keys[i], fills[i]) in self.cache:
                break
            tok = tuple(tokens[i * bs : i * bs + fills[i]]) if tokens is not None else None
            self.store(table[i], keys[i], table[i - 1] if i else None, extra, tok, fills[i])
        s = self.stats
        s["queries"] += 1
        s["query_blocks"] += len(keys)
        s["hit_blocks"] += h
        s["query_tokens"] += n
        s["hit_tokens"] += cached
        s["collisions"] += collision
        s["cow_hits"] += cow
        self.seqs[seq] = Seq(table, n, list(tokens) if tokens is not None else None, extra)
        self.end_op()
        return cached, cow

    def add_plain(self, seq: int, n: int) -> bool:
        need = -(-n // self.bs)
        if need > self.num_free():
            return False
        self.seqs[seq] = Seq(self.take(need), n, None, None)
        self.end_op()
        return True

    # ------------------------------------------------------------------ growth
    def append(self, seq: int, new_tokens: list[int] | None, n: int) -> int | None:
        """Append ``n`` tokens (``new_tokens`` their ids, or None); returns the number of
        copy-on-write pairs, None when the pool must refuse."""
        s, bs = self.seqs[seq], self.bs
        off = s.ntokens % bs
        copy = n > 0 and off != 0 and (s.table[-1].refs > 1 or s.table[-1].cached)
        need = -(-(s.ntokens + n) // bs) - len(s.table) + copy
        if need > self.num_free():
            return None
        if copy:  # the copy first: take its block, release the original
            old = s.table[-1]
            s.table[-1] = self.take(1)[0]
            self.release(old)
        s.table += self.take(need - copy)
        old_full = s.ntokens // bs
        s.ntokens += n
        if new_tokens is None:
            if n:
                s.tokens = None
        elif s.tokens is not None:
            s.tokens += new_tokens
            keys = self.keys(s.tokens, s.extra)
            for i in range(old_full, s.ntokens // bs):
                b = s.table[i]
                parent_ok = i == 0 or (s.table[i - 1].cached and s.table[i - 1].key == keys[i - 1])
                if not parent_ok or b.cached or (keys[i], self.bs) in self.cache:
                    break
                self.store(b, keys[i], s.table[i - 1] if i else None, s.extra,
                           tuple(s.tokens[i * bs : (i + 1) * bs]), bs)
        self.end_op()
        return int(copy)

    # ------------------------------------------------------------------ release
    def free(self, seq: int) -> None:
        for b in self.seqs.pop(seq).table:  # head first
            self.release(b)
        self.end_op()

    def fork(self, parent: int, child: int) -> None:
        p = self.seqs[parent]
        for b in p.table:
            b.refs += 1
        self.seqs[child] = Seq(list(p.table), p.ntokens, None if p.tokens is None else list(p.tokens), p.extra)
        self.end_op()

    def truncate(self, seq: int, n: int) -> None:
        s = self.seqs[seq]
        s.ntokens -= n
        keep = -(-s.ntokens // self.bs)
        while len(s.table) > keep:  # tail first
            self.release(s.table.pop())
        if s.tokens is not None:
            del s.tokens[s.ntokens:]
        self.end_op()

    # ------------------------------------------------------------------ pins, clock, reset
    def pin(self, keys: list[int], tokens: list[int] | None, extra: int | None, priority: int | None,
            expires_at: int | None) -> int | None:
        chain, _ = self.lookup(keys, [self.bs] * len(keys), tokens, extra)
        if not keys or len(chain) < len(keys) or (expires_at is not None and expires_at <= self.clock):
            return None
        self.next_pin += 1
        self.pins[self.next_pin] = Pin(chain, priority, expires_at)
        for b in chain:
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
