"""A pure-Python prefix-caching block pool: the in-run baseline of the prefix-cache benchmark.

Same semantics as :class:`pykvpool.BlockPool` with ``prefix_caching=True`` (LRU eviction,
token verification on, no copy-on-write hits) for the calls the benchmark makes
(``add_sequence_tokens``, ``step``, ``free``, ``num_free_blocks``), and the same choices of
physical blocks, so both engines give identical hits, evictions and slot mappings:

- a full block's key chains its parent's key and its token ids; a hit must also match the
  recorded parent block and the stored token bytes (a collision is a miss);
- admission reuses the longest cached chain of full blocks, leaves at least one prompt
  token to compute, allocates the rest and registers the new full blocks;
- a block whose refcount drops to 0 stays cached and *idle*; free blocks are taken
  before idle ones are evicted; only idle leaves (no cached child) are evicted, least
  recently touched first, where a touch is a hit, a registration or a release, counted
  in one logical counter exactly as the Rust cache counts them;
- cached blocks are immutable: writing into a partly filled cached block copies it.

It is written the way a careful engineer writes it in Python (compare vLLM's
``BlockPool``): the prompt arrives as a numpy int32 array whose bytes are sliced per block
(no per-token Python objects), keys are the builtin ``hash`` of ``(parent, bytes)``, a dict
maps keys to blocks, and the eviction order is a heap with lazy deletion. It returns Python
lists, which flatters it.
"""

from __future__ import annotations

import heapq
from typing import Any

from benches.py_allocator import PyBlockPool
from pykvpool import DuplicateSequenceError, InvariantError, PoolExhaustedError

NO_PARENT = -1


class PyPrefixPool(PyBlockPool):
    """``num_blocks`` blocks of ``block_size`` token slots with automatic prefix caching."""

    __slots__ = (
        "_map", "_key", "_tok", "_parent", "_children", "_last", "_queued", "_heap",
        "_touch", "_idle", "_evictable", "stats",
    )

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._map: dict[int, int] = {}
        self._key: list[int | None] = [None] * num_blocks
        self._tok: list[bytes] = [b""] * num_blocks
        self._parent = [NO_PARENT] * num_blocks
        self._children = [0] * num_blocks
        self._last = [0] * num_blocks
        #: Touch value a block is queued under, -1 when not queued (heap entries whose
        #: value differs are stale).
        self._queued = [-1] * num_blocks
        self._heap: list[tuple[int, int]] = []
        self._touch = 0
        self._idle = 0
        self._evictable = 0
        self.stats = {"queries": 0, "query_blocks": 0, "hit_blocks": 0, "query_tokens": 0,
                      "hit_tokens": 0, "stored_blocks": 0, "evictions": 0}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self._evictable

    # -- cache primitives (each mirrors the Rust function of the same role) -------------
    def _enqueue(self, b: int) -> None:
        t = self._last[b]
        self._queued[b] = t
        heapq.heappush(self._heap, (t, b))

    def _on_idle(self, b: int) -> None:
        self._touch += 1
        self._last[b] = self._touch
        self._idle += 1
        self._evictable += 1
        if self._children[b] == 0:
            self._enqueue(b)

    def _release(self, b: int) -> None:
        ref = self._ref
        ref[b] -= 1
        if ref[b] == 0:
            if self._key[b] is not None:
                self._on_idle(b)
            else:
                self._free.append(b)

    def _evict(self) -> int:
        heap, queued = self._heap, self._queued
        while True:
            t, b = heapq.heappop(heap)
            if queued[b] == t:
                break
        queued[b] = -1
        del self._map[self._key[b]]  # type: ignore[arg-type]
        self._key[b] = None
        self._idle -= 1
        self._evictable -= 1
        p = self._parent[b]
        if p != NO_PARENT:
            self._children[p] -= 1
            if self._children[p] == 0 and self._ref[p] == 0 and self._key[p] is not None and queued[p] < 0:
                self._enqueue(p)
        self._ref[b] = 1
        self.stats["evictions"] += 1
        return b

    def _take_one(self) -> int:
        if self._free:
            b = self._free.pop()
            self._ref[b] = 1
            return b
        return self._evict()

    def _take(self, nb: int) -> list[int]:
        return [self._take_one() for _ in range(nb)]

    # -- admission ------------------------------------------------------------------------
    def add_sequence_tokens(self, seq_id: int, tokens: Any) -> tuple[int, list[int], list[tuple[int, int]]]:
        """Admit ``seq_id`` with prompt ``tokens`` (a numpy int32 array).

        Returns:
            ``(cached_tokens, slots of the tokens to compute, cow pairs)``.

        Raises:
            DuplicateSequenceError, PoolExhaustedError (nothing changed).
        """
        if seq_id in self._tables:
            raise DuplicateSequenceError(f"sequence {seq_id} already exists")
        bs = self._bs
        n = len(tokens)
        nfull = n // bs
        data = tokens.tobytes()
        step = len(data) // n if n else 4
        width = bs * step
        keys: list[int] = []
        parent_key = 0
        for i in range(nfull):
            parent_key = hash((parent_key, data[i * width : (i + 1) * width]))
            keys.append(parent_key)
        cmap, ctok, cpar = self._map, self._tok, self._parent
        chain: list[int] = []
        prev = NO_PARENT
        for i, k in enumerate(keys):
            b = cmap.get(k)
            if b is None or cpar[b] != prev or ctok[b] != data[i * width : (i + 1) * width]:
                break
            chain.append(b)
            prev = b
        h = len(chain)
        used = min(h, max(n - 1, 0) // bs)
        need = -(-n // bs) - used
        ref = self._ref
        reserved = sum(1 for b in chain[:used] if ref[b] == 0)
        if need > len(self._free) + self._evictable - reserved:
            err = PoolExhaustedError(f"pool exhausted: requested {need} blocks")
            err.requested, err.free = need, self.num_free_blocks - reserved
            raise err
        last = self._last
        for b in chain[:used]:
            self._touch += 1
            last[b] = self._touch
            if ref[b] == 0:
                self._queued[b] = -1
                self._idle -= 1
                self._evictable -= 1
                ref[b] = 1
            else:
                ref[b] += 1
        for b in chain[used:]:
            self._touch += 1
            last[b] = self._touch
            if self._queued[b] >= 0:
                self._enqueue(b)
        table = chain[:used]
        table.extend(self._take(need))
        slots: list[int] = []
        for b in table[used:]:
            first = b * bs
            slots.extend(range(first, first + bs))
        del slots[n - used * bs :]
        for i in range(used, nfull):
            k = keys[i]
            if k in cmap:
                break
            b = table[i]
            cmap[k] = b
            self._key[b] = k
            ctok[b] = data[i * width : (i + 1) * width]
            p = table[i - 1] if i else NO_PARENT
            cpar[b] = p
            if p != NO_PARENT:
                self._children[p] += 1
            self._touch += 1
            last[b] = self._touch
            self.stats["stored_blocks"] += 1
        s = self.stats
        s["queries"] += 1
        s["query_blocks"] += nfull
        s["hit_blocks"] += h
        s["query_tokens"] += n
        s["hit_tokens"] += used * bs
        self._tables[seq_id] = table
        self._lens[seq_id] = n
        return used * bs, slots, []

    # -- decode and free --------------------------------------------------------------------
    def _plan(self, ids: list[int], counts: list[int]) -> int:
        # The base plan counts shared partial blocks; a cached partial block is copied too,
        # but the benchmark never writes into one (prompt tails are never cached).
        need = super()._plan(ids, counts)
        bs, tables, lens, key, ref = self._bs, self._tables, self._lens, self._key, self._ref
        for sid, c in zip(ids, counts):
            if c and lens[sid] % bs and key[tables[sid][-1]] is not None and ref[tables[sid][-1]] == 1:
                need += 1
        return need

    def _grow(self, sid: int, n: int, slots: list[int], cow: list[tuple[int, int]]) -> int:
        bs, ref = self._bs, self._ref
        table = self._tables[sid]
        length = self._lens[sid]
        off = length % bs
        if off and (ref[table[-1]] > 1 or self._key[table[-1]] is not None):
            src = table[-1]
            dst = self._take_one()
            self._release(src)
            table[-1] = dst
            cow.append((src, dst))
            self._cow_copies += 1
        if n == 1:
            if off == 0:
                b = self._take_one()
                table.append(b)
                slots.append(b * bs)
            else:
                slots.append(table[-1] * bs + off)
        else:
            end = length + n
            extra = (end + bs - 1) // bs - len(table)
            if extra:
                table.extend(self._take(extra))
            self._slots(table, length, n, slots)
        length += n
        self._lens[sid] = length
        return length

    def free(self, seq_id: int) -> None:
        table = self._tables.pop(seq_id)
        del self._lens[seq_id]
        for b in table:
            self._release(b)

    def check_invariants(self) -> None:
        """Refcounts match tables; free + idle + used = total; keys map back."""
        n = len(self._ref)
        expected = [0] * n
        for table in self._tables.values():
            for b in table:
                expected[b] += 1
        if expected != self._ref:
            raise InvariantError("refcounts differ from table references")
        idle = sum(1 for b in range(n) if self._ref[b] == 0 and self._key[b] is not None)
        used = sum(1 for c in expected if c)
        if idle != self._idle or used + idle + len(self._free) != n:
            raise InvariantError("free + idle + used != total")
        if any(self._key[b] != k for k, b in self._map.items()):
            raise InvariantError("a key does not map back")
