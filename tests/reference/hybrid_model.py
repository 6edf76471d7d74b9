"""A pure-Python model of :class:`pykvpool.BlockPool`, written from the layer-group
contract (not from the implementation); shared by the hybrid tests (not a test module).

A sequence has a logical length ``L`` and a frontier; per group, a table of logical blocks
``0..ceil(L / bs)``, each stored (an abstract block id of the model) or a hole. Physical
block ids are the pool's choice: :class:`Model` learns them from the pool's tables and
checks the learned mapping stays one-to-one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pykvpool as kv

Kind = Any  # kv.FullAttention | kv.SlidingWindow | kv.ChunkedAttention


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


@dataclass
class Seq:
    length: int
    frontier: int
    tables: list[dict[int, int]]  # per group: logical block -> model block id


@dataclass
class Model:
    groups: list[Kind]
    bs: int
    num_blocks: int
    seqs: dict[int, Seq] = field(default_factory=dict)
    phys: dict[int, int] = field(default_factory=dict)  # model block id -> physical block
    fresh: itertools.count = field(default_factory=itertools.count)  # type: ignore[type-arg]

    def refs(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for s in self.seqs.values():
            for t in s.tables:
                for m in t.values():
                    out[m] = out.get(m, 0) + 1
        return out

    def used(self) -> int:
        return len(self.refs())

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

    # -- operations (the caller checks their preconditions and compares with the pool)

    def grow(self, plan: list[tuple[int, int]]) -> tuple[bool, list[tuple[int, int]]]:
        """Apply a step ``[(seq, n)]`` (distinct live ids): per sequence growing by ``n > 0``
        tokens, release, copy-on-write, allocate (a count of 0 is no growth). Returns whether
        it fits and the copy-on-write pairs as (old, new) model ids; a step that does not fit
        changes nothing."""
        saved = {k: Seq(s.length, s.frontier, [dict(t) for t in s.tables]) for k, s in self.seqs.items()}
        refs = self.refs()
        cow: list[tuple[int, int]] = []
        for seq, n in plan:
            s = self.seqs[seq]
            length = s.length
            if n == 0:
                continue  # no token, no growth: nothing released, the frontier stays
            for g, kind in enumerate(self.groups):
                t = s.tables[g]
                for i in [i for i in t if releasable(kind, i, self.bs, length)]:
                    refs[t[i]] -= 1
                    del t[i]
                last = length // self.bs
                if length % self.bs:
                    if last not in t:  # a hole at the write position: a fresh block
                        t[last] = next(self.fresh)
                        refs[t[last]] = 1
                    elif refs[t[last]] > 1:
                        new = next(self.fresh)
                        refs[t[last]] -= 1
                        cow.append((t[last], new))
                        t[last] = new
                        refs[new] = 1
                for i in range(-(-length // self.bs), -(-(length + n) // self.bs)):
                    t[i] = next(self.fresh)
                    refs[t[i]] = 1
            s.frontier = length
            s.length = length + n
        if sum(1 for c in refs.values() if c > 0) > self.num_blocks:
            self.seqs = saved
            return False, []
        return True, cow

    def add(self, seq: int, n: int) -> bool:
        self.seqs[seq] = Seq(0, 0, [{} for _ in self.groups])
        ok, _ = self.grow([(seq, n)])
        if not ok:
            del self.seqs[seq]
        return ok

    def fork(self, parent: int, child: int) -> None:
        p = self.seqs[parent]
        self.seqs[child] = Seq(p.length, p.frontier, [dict(t) for t in p.tables])

    def can_truncate(self, seq: int, n: int) -> bool:
        s = self.seqs[seq]
        if n > s.length:
            return False
        l2 = s.length - n
        return all(needed_blocks(kind, l2, self.bs) <= set(s.tables[g]) for g, kind in enumerate(self.groups))

    def truncate(self, seq: int, n: int) -> None:
        s = self.seqs[seq]
        l2 = s.length - n
        keep = -(-l2 // self.bs)
        s.tables = [{i: m for i, m in t.items() if i < keep} for t in s.tables]
        s.length, s.frontier = l2, min(s.frontier, l2)

    def free(self, seq: int) -> None:
        del self.seqs[seq]

    def mark_computed(self, ids: list[int]) -> None:
        """Every query up to each length computed (live ids): the frontier becomes the length
        and the release rule runs for a next query at the length."""
        for seq in ids:
            s = self.seqs[seq]
            for g, kind in enumerate(self.groups):
                t = s.tables[g]
                for i in [i for i in t if releasable(kind, i, self.bs, s.length)]:
                    del t[i]
            s.frontier = s.length

    # -- learning physical ids

    def learn(self, pool: kv.BlockPool) -> None:
        """Map each model block to the physical block the pool's tables show; every model
        block maps to one physical block and no two live model blocks to the same one."""
        live = self.refs()
        self.phys = {m: b for m, b in self.phys.items() if m in live}
        for seq, s in self.seqs.items():
            for g, t in enumerate(s.tables):
                row = pool.block_table(seq, group=g).tolist()
                for i, m in t.items():
                    b = row[i]
                    assert b >= 0, f"seq {seq} group {g} block {i}: a hole where the model stores"
                    assert self.phys.setdefault(m, b) == b, f"seq {seq} group {g} block {i}: {b} != {self.phys[m]}"
        assert len(set(self.phys.values())) == len(self.phys), "two model blocks share a physical block"


def check_against(model: Model, pool: kv.BlockPool) -> None:
    """Everything observable about ``pool`` equals the model."""
    bs, groups = model.bs, range(len(model.groups))
    ids = sorted(model.seqs)
    assert pool.seq_ids().tolist() == ids
    assert pool.num_seqs == len(ids) == len(pool)
    for seq in ids:
        s = model.seqs[seq]
        assert (pool.seq_len(seq), pool.frontier(seq)) == (s.length, s.frontier), seq
        for g in groups:
            assert pool.block_table(seq, group=g).tolist() == model.table(seq, g), (seq, g)
            assert pool.stored_ranges(seq, group=g) == model.stored_ranges(seq, g), (seq, g)
    refs = model.refs()
    by_phys = {model.phys[m]: c for m, c in refs.items()}
    assert [pool.refcount(b) for b in range(model.num_blocks)] == [by_phys.get(b, 0) for b in range(model.num_blocks)]
    assert pool.num_used_blocks == len(refs)
    assert pool.num_free_blocks == model.num_blocks - len(refs)
    st = pool.stats()
    assert st.logical_tokens == sum(s.length for s in model.seqs.values())
    assert st.used_blocks == len(refs) and st.num_seqs == len(ids)
    for g in groups:
        blocks = {m for s in model.seqs.values() for m in s.tables[g].values()}
        assert st.group_blocks[g] == len(blocks), g
        holes = sum(-(-s.length // bs) - len(s.tables[g]) for s in model.seqs.values())
        assert st.group_holes[g] == holes, g
    if ids:
        for g in groups:
            width = max(-(-model.seqs[s].length // bs) for s in ids)
            want = [[-9 if b == -1 else b for b in model.table(s, g)] + [-9] * (width - len(model.table(s, g)))
                     for s in ids]
            assert pool.block_tables(ids, pad=-9, group=g).tolist() == want
            check_flashinfer(model, pool, ids, g)
    pool.check_invariants()


def check_flashinfer(model: Model, pool: kv.BlockPool, ids: list[int], g: int) -> None:
    """The FlashInfer export of group ``g``, rebuilt page by page from the spec's formula."""
    bs, kind = model.bs, model.groups[g]
    indptr, indices, last, start = (a.tolist() for a in pool.flashinfer_tables(ids, group=g))
    assert indptr[0] == 0 and len(indptr) == len(ids) + 1
    for r, seq in enumerate(ids):
        table = model.table(seq, g)
        pages = indices[indptr[r]:indptr[r + 1]]
        stored = [b for b in table if b != -1]
        assert pages == stored, (seq, g)  # stored pages in logical order
        sink_pages = min(-(-kind.sink_tokens // bs), start[r])
        logical = [j if j < sink_pages else start[r] + (j - sink_pages) for j in range(len(pages))]
        assert [table[i] for i in logical] == pages, (seq, g, start[r])
        length = model.seqs[seq].length
        # FlashInfer's last page length: the tokens of the last page. That page is the last
        # logical block except when a table ends in holes (a window of one token or a chunk
        # boundary, after a truncation).
        assert last[r] == (0 if not pages else min(bs, length - logical[-1] * bs)), (seq, g)
        if isinstance(kind, kv.FullAttention):
            assert start[r] == 0
