"""A plain pure-Python KV-cache block pool: the in-run baseline of the scheduler benchmark.

It has the semantics of :class:`pykvpool.BlockPool` for the calls the scheduler loop makes
(``add_sequence``, ``step``, ``append``, ``fork``, ``free``, ``num_free_blocks``,
``num_blocks``, ``block_size``, ``num_seqs``, ``seq_len``, ``block_table``,
``check_invariants``) and it hands out *the same physical blocks in the same order*, so
both engines produce identical slot mappings for the same program:

- the free list is a LIFO stack initialised so that block 0 is taken first;
- a new sequence takes its blocks in table order;
- ``free`` releases a table head to tail, so its last block, on top of the stack, is
  reused first;
- a batched ``step`` grows sequences in batch order; a sequence whose last block is
  partly filled and shared first takes a private copy of it (copy-on-write), and the plan
  counts how many holders of one shared block copy away in the same batch, exactly as
  the Rust core does.

It is written the way a careful engineer writes a Python allocator (compare vLLM's
``BlockPool``/``KVCacheManager``): dicts of lists, a refcount list, C-level list
operations where they exist (slicing, ``list.extend(range(...))``), a fast path for
the common one-token decode append, validation of every argument before any change so
that a failed call changes nothing. It is not slowed down on purpose, and it returns
Python lists (no numpy conversion), which flatters it: an engine would still have to
build tensors from them.

Errors are pykvpool's own classes, so callers catch the same exceptions from both
engines. Units: lengths and counts in tokens, sizes in blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from pykvpool import (
    DuplicateSequenceError,
    InvalidArgumentError,
    InvariantError,
    PoolExhaustedError,
    UnknownSequenceError,
)

MAX_BLOCK_SIZE = 1 << 16
MAX_BLOCKS = 1 << 30


def _check_count(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise InvalidArgumentError(f"{name} must be >= 0, got {value}")
    return value


class PyBlockPool:
    """``num_blocks`` blocks of ``block_size`` token slots; a refcount per block.

    Raises:
        InvalidArgumentError: sizes out of range (same limits as the Rust core).
    """

    __slots__ = ("_bs", "_free", "_ref", "_tables", "_lens", "_cow_copies")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        _check_count(num_blocks, "num_blocks")
        _check_count(block_size, "block_size")
        if not 1 <= num_blocks <= MAX_BLOCKS:
            raise InvalidArgumentError(f"num_blocks must be in 1..={MAX_BLOCKS}, got {num_blocks}")
        if not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise InvalidArgumentError(f"block_size must be in 1..={MAX_BLOCK_SIZE}, got {block_size}")
        self._bs = block_size
        # A stack: pop() from the end takes block 0 first on a fresh pool.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._ref: list[int] = [0] * num_blocks
        self._tables: dict[int, list[int]] = {}
        self._lens: dict[int, int] = {}
        self._cow_copies = 0

    # -- sizes ------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self._ref)

    @property
    def block_size(self) -> int:
        return self._bs

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self._ref) - len(self._free)

    @property
    def num_seqs(self) -> int:
        return len(self._tables)

    @property
    def cow_copies(self) -> int:
        return self._cow_copies

    def __len__(self) -> int:
        return len(self._tables)

    def __contains__(self, seq: object) -> bool:
        return seq in self._tables

    def seq_len(self, seq_id: int) -> int:
        """Length of ``seq_id`` in tokens. Raises UnknownSequenceError."""
        try:
            return self._lens[seq_id]
        except KeyError:
            raise UnknownSequenceError(seq_id) from None

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the block table of ``seq_id``. Raises UnknownSequenceError."""
        try:
            return list(self._tables[seq_id])
        except KeyError:
            raise UnknownSequenceError(seq_id) from None

    def refcount(self, block_id: int) -> int:
        if not 0 <= block_id < len(self._ref):
            raise InvalidArgumentError(f"block_id {block_id} is out of range")
        return self._ref[block_id]

    def _exhausted(self, requested: int) -> PoolExhaustedError:
        free = len(self._free)
        err = PoolExhaustedError(f"pool exhausted: requested {requested} blocks, {free} free")
        err.requested = requested
        err.free = free
        return err

    # -- allocation -------------------------------------------------------------------
    def _take(self, nb: int) -> list[int]:
        """``nb`` free blocks in the order ``nb`` pops would give; caller checked."""
        free = self._free
        if nb == 0:
            return []
        blocks = free[-nb:]
        del free[-nb:]
        blocks.reverse()
        ref = self._ref
        for b in blocks:
            ref[b] = 1
        return blocks

    def _slots(self, table: list[int], start: int, n: int, out: list[int]) -> None:
        """Append the slots of token positions ``start .. start + n`` to ``out``."""
        bs = self._bs
        pos, end = start, start + n
        while pos < end:
            bi, off = divmod(pos, bs)
            run = min(bs - off, end - pos)
            first = table[bi] * bs + off
            out.extend(range(first, first + run))
            pos += run

    def add_sequence(self, seq_id: int, prompt_len: int = 0) -> list[int]:
        """Add ``seq_id`` holding ``prompt_len`` tokens; return their slots.

        Raises:
            DuplicateSequenceError, PoolExhaustedError, InvalidArgumentError.
        """
        _check_count(seq_id, "seq_id")
        _check_count(prompt_len, "prompt_len")
        if seq_id in self._tables:
            raise DuplicateSequenceError(f"sequence {seq_id} already exists")
        bs = self._bs
        nb = (prompt_len + bs - 1) // bs
        if nb > len(self._free):
            raise self._exhausted(nb)
        table = self._take(nb)
        slots: list[int] = []
        for b in table:
            first = b * bs
            slots.extend(range(first, first + bs))
        del slots[prompt_len:]
        self._tables[seq_id] = table
        self._lens[seq_id] = prompt_len
        return slots

    def _plan(self, ids: list[int], counts: list[int]) -> int:
        """Validate a batch and count the blocks it takes, copy-on-write included."""
        tables, lens, ref, bs = self._tables, self._lens, self._ref, self._bs
        seen: set[int] = set()
        copied: dict[int, int] = {}
        need = 0
        for sid, n in zip(ids, counts):
            table = tables.get(sid)
            if table is None:
                raise UnknownSequenceError(sid)
            if sid in seen:
                raise InvalidArgumentError(f"sequence id {sid} appears twice in one step")
            seen.add(sid)
            if n < 0:
                raise InvalidArgumentError(f"num_tokens must be >= 0, got {n}")
            if n == 0:
                continue
            length = lens[sid]
            need += (length + n + bs - 1) // bs - len(table)
            if length % bs:
                last = table[-1]
                done = copied.get(last, 0)
                if ref[last] - done > 1:
                    need += 1
                    copied[last] = done + 1
        return need

    def _grow(self, sid: int, n: int, slots: list[int], cow: list[tuple[int, int]]) -> int:
        """Append ``n`` tokens to ``sid`` (blocks reserved by the caller); new length."""
        bs, ref, free = self._bs, self._ref, self._free
        table = self._tables[sid]
        length = self._lens[sid]
        off = length % bs
        if off and ref[table[-1]] > 1:
            src = table[-1]
            dst = free.pop()
            ref[dst] = 1
            ref[src] -= 1
            table[-1] = dst
            cow.append((src, dst))
            self._cow_copies += 1
        if n == 1:
            # Decode fast path: one token, a new block only at a block boundary.
            if off == 0:
                b = free.pop()
                ref[b] = 1
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

    def step(
        self, seq_ids: Iterable[int], num_tokens: Iterable[int] | int | None = None
    ) -> tuple[list[int], list[tuple[int, int]], list[int]]:
        """Append ``num_tokens[i]`` tokens to ``seq_ids[i]`` for all i, atomically.

        Returns:
            ``(slot_mapping, cow_pairs, seq_lens)`` as lists.

        Raises:
            PoolExhaustedError (nothing changed), UnknownSequenceError,
            InvalidArgumentError.
        """
        ids = list(seq_ids)
        if num_tokens is None:
            counts = [1] * len(ids)
        elif isinstance(num_tokens, int):
            counts = [_check_count(num_tokens, "num_tokens")] * len(ids)
        else:
            counts = list(num_tokens)
            if len(counts) != len(ids):
                raise InvalidArgumentError(f"{len(ids)} sequence ids but {len(counts)} token counts")
        need = self._plan(ids, counts)
        if need > len(self._free):
            raise self._exhausted(need)
        slots: list[int] = []
        cow: list[tuple[int, int]] = []
        seq_lens: list[int] = []
        lens = self._lens
        for sid, n in zip(ids, counts):
            seq_lens.append(self._grow(sid, n, slots, cow) if n else lens[sid])
        return slots, cow, seq_lens

    def append(self, seq_id: int, num_tokens: int = 1) -> tuple[list[int], list[tuple[int, int]]]:
        """Append ``num_tokens`` to one sequence; ``(slots, cow_pairs)``."""
        slots, cow, _ = self.step([seq_id], [_check_count(num_tokens, "num_tokens")])
        return slots, cow

    def fork(self, parent: int, child: int) -> None:
        """``child`` shares every block of ``parent``.

        Raises:
            UnknownSequenceError, DuplicateSequenceError.
        """
        _check_count(child, "child")
        if child in self._tables:
            raise DuplicateSequenceError(f"sequence {child} already exists")
        table = self._tables.get(parent)
        if table is None:
            raise UnknownSequenceError(parent)
        ref = self._ref
        for b in table:
            ref[b] += 1
        self._tables[child] = list(table)
        self._lens[child] = self._lens[parent]

    def free(self, seq_id: int) -> None:
        """Remove ``seq_id``; blocks reaching refcount 0 return to the free list in
        table order (the tail ends on top). Raises UnknownSequenceError."""
        table = self._tables.pop(seq_id, None)
        if table is None:
            raise UnknownSequenceError(seq_id)
        del self._lens[seq_id]
        ref, free = self._ref, self._free
        for b in table:
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                free.append(b)

    def check_invariants(self) -> None:
        """Refcounts equal table references; the free list holds exactly the
        unreferenced blocks once; tables hold ``ceil(len / block_size)`` entries."""
        n, bs = len(self._ref), self._bs
        expected = [0] * n
        for sid, table in self._tables.items():
            want = (self._lens[sid] + bs - 1) // bs
            if len(table) != want:
                raise InvariantError(f"sequence {sid} has {len(table)} blocks, expected {want}")
            for b in table:
                expected[b] += 1
        if expected != self._ref:
            bad = next(i for i in range(n) if expected[i] != self._ref[i])
            raise InvariantError(f"block {bad} has refcount {self._ref[bad]} but {expected[bad]} references")
        if len(set(self._free)) != len(self._free):
            raise InvariantError("a block is on the free list twice")
        if any(expected[b] for b in self._free):
            raise InvariantError("a referenced block is on the free list")
        if sum(1 for c in expected if c) + len(self._free) != n:
            raise InvariantError("used + free != total (a block leaked)")


class PyBlockPoolNumpy(PyBlockPool):
    """The baseline with pykvpool's output types: the slot mapping as an int64 array, the
    copy-on-write pairs as an int64 ``[k, 2]`` array and the lengths as int32, converted
    from its lists with ``numpy.array`` (what an engine does before handing them to a
    kernel). Same semantics and errors as :class:`PyBlockPool`."""

    __slots__ = ()

    def add_sequence(self, seq_id: int, prompt_len: int = 0) -> Any:
        return np.array(super().add_sequence(seq_id, prompt_len), dtype=np.int64)

    def step(self, seq_ids: Iterable[int], num_tokens: Iterable[int] | int | None = None) -> Any:
        slots, cow, lens = super().step(seq_ids, num_tokens)
        return (
            np.array(slots, dtype=np.int64),
            np.array(cow, dtype=np.int64).reshape(len(cow), 2),
            np.array(lens, dtype=np.int32),
        )
