"""The KV store a caller of :class:`pykvpool.BlockPool` keeps, simulated for the pool state
machine (not a test module).

Each token gets a fresh value; a growth first copies every copy-on-write pair's source
block to its target (whole blocks, as a caller does), then writes each new token's value,
tagged with its group, at the token's slot in every group. The checks: every position whose
KV a group holds (``Model.held``) reads back its own value through the model's tables, and
two live tokens share a slot only when a fork shares their block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference.hybrid_model import Model
from reference.poolcheck import Tables

import pykvpool as kv


@dataclass
class KvStore:
    bs: int
    slots: dict[int, tuple[int, int]] = field(default_factory=dict)  # slot -> (group, value)
    contents: dict[int, list[int]] = field(default_factory=dict)  # seq -> value of each token
    next_value: int = 0

    def grow(self, plan: list[tuple[int, int]], rows: list[list[int]], cow: list[tuple[int, int]]) -> None:
        """Write a growth: ``(seq, n)`` in batch order, per group the new tokens' slots."""
        for src, dst in cow:
            for off in range(self.bs):
                value = self.slots.get(src * self.bs + off)
                if value is None:
                    self.slots.pop(dst * self.bs + off, None)
                else:
                    self.slots[dst * self.bs + off] = value
        values: list[int] = []
        for seq, n in plan:
            new = list(range(self.next_value, self.next_value + n))
            self.contents.setdefault(seq, []).extend(new)
            values += new
            self.next_value += n
        for g, row in enumerate(rows):
            for slot, v in zip(row, values):
                self.slots[slot] = (g, v)

    def fork(self, parent: int, child: int) -> None:
        self.contents[child] = list(self.contents[parent])

    def truncate(self, seq: int, length: int) -> None:
        del self.contents[seq][length:]

    def free(self, seq: int) -> None:
        del self.contents[seq]

    def check_reads(self, model: Model, tables: Tables) -> None:
        """Every position whose KV a group holds reads back its own value, in that group,
        through ``tables`` (the model's, by ``(seq, group)``)."""
        bs = self.bs
        for seq in model.seqs:
            assert len(self.contents[seq]) == model.seqs[seq].length, seq
            for g in range(len(model.groups)):
                table = tables[seq, g]
                for k in model.held(seq, g):
                    want = (g, self.contents[seq][k])
                    got = self.slots.get(table[k // bs] * bs + k % bs)
                    assert got == want, f"seq {seq} group {g} position {k} reads {got}, wrote {want}"

    def check_shared_slots(self, pool: kv.BlockPool, tables: Tables) -> None:
        """From the pool's own tables: a slot two live tokens hold is, in one group, the same
        position in a block the pool counts as shared, and the same token (a fork's)."""
        bs = self.bs
        owners: dict[int, list[tuple[int, int, int]]] = {}
        for (seq, g), table in tables.items():
            for pos in range(len(self.contents[seq])):
                if table[pos // bs] >= 0:
                    owners.setdefault(table[pos // bs] * bs + pos % bs, []).append((g, seq, pos))
        for slot, toks in owners.items():
            if len(toks) > 1:
                assert len({(g, pos) for g, _, pos in toks}) == 1, (slot, toks)
                assert pool.refcount(slot // bs) >= len(toks), (slot, toks)
                assert len({self.contents[seq][pos] for _, seq, pos in toks}) == 1, (slot, toks)
