"""Stateful property test of :class:`pykvpool.video.VideoCache` against a model written from
the video cache's contract (``tests/reference/video_model.py``), not from the implementation.

Each example draws a geometry (tokens per frame and grid, frames per chunk, sink frames, a
window of frames or none, page size, a small pool) and runs random stream programs: add,
begin (a batch of streams), denoising steps (write fresh K/V, then the batched attention),
commit, abort, a prompt switch (rewrite the visible window in place), release; failing
calls included (unknown, duplicate or busy streams, a stale batch, exhaustion).

The model keeps, per stream, the committed frames, the open chunk, the slot of every live
token as :meth:`begin_chunk` handed it out, and the K/V the test wrote at each logical
token. From the spec alone it predicts which frames are visible, their (t, h, w), the pages
the release rule keeps (so the pool's used pages and exhaustion), and every error. After
every rule: visible positions and slots equal the model's, no two live tokens share a slot,
the pool's pages equal the model's count, ``check_invariants()`` holds, and every page no
stream holds is poisoned with NaN through the cache's views, so the next attention (checked
against a float64 reference over the visible tokens) proves released pages are never read.

It runs on every storage dtype: the model keeps what the format stores of each write
(``video_model.Storage``, bit for bit: f16/bf16 rounding, int8's per-token scales, fp8's
per-layer scales calibrated by the first write of each layer, saturation), so the reference
is exact on any dtype. f32 runs the profile's examples, every other dtype a quarter of them.

``HYPOTHESIS_PROFILE=long python -m pytest tests/video/test_video_state_machine.py`` runs longer.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from reference.poolcheck import snapshot
from reference.video_model import DTYPES, Geometry, Storage, poison_free_pages, reference_attention

import pykvpool as kv
from pykvpool.video import ChunkBatch, VideoCache

ID_RANGE = 5
HQ, HKV, D = 2, 1, 4
# ("live", i): the i-th live stream; ("open", i): the i-th stream with an open chunk (else
# a live one); ("any", id): any id, unknown or live. Mostly live (or open) ones for the
# calls that act on streams.
live = st.tuples(st.just("live"), st.integers(0, 31))
opened = st.tuples(st.just("open"), st.integers(0, 31))
anyid = st.tuples(st.just("any"), st.integers(0, ID_RANGE - 1))
picks = st.one_of(live, live, live, anyid)
# A list of streams: usually distinct (an id listed twice is an error, drawn 1 time in 10).
lists = st.tuples(st.lists(picks, min_size=1, max_size=3), st.integers(0, 9))
open_lists = st.tuples(st.lists(st.one_of(opened, opened, opened, anyid), min_size=1, max_size=3), st.integers(0, 9))
frames = st.sampled_from([(2, (1, 2)), (3, (3, 1)), (4, (2, 2)), (6, (2, 3))])


class VideoMachine(RuleBasedStateMachine):
    vc: VideoCache
    geo: Geometry
    dtype = "f32"

    @initialize(frame=frames, fpc=st.integers(1, 2), sinks=st.integers(0, 2),
                window=st.one_of(st.none(), st.integers(0, 3), st.integers(0, 3)), bs=st.sampled_from([1, 2, 3, 4, 8]),
                chunks=st.integers(2, 24), extra=st.integers(0, 3), layers=st.integers(1, 2),
                seed=st.integers(0, 2**16), streams=st.integers(1, 3))
    def setup(self, frame: tuple[int, tuple[int, int]], fpc: int, sinks: int, window: int | None, bs: int,
              chunks: int, extra: int, layers: int, seed: int, streams: int) -> None:
        tpf, grid = frame
        blocks = chunks * -(-fpc * tpf // bs) + extra  # room for about `chunks` chunks
        self.vc = VideoCache(num_layers=layers, num_kv_heads=HKV, head_dim=D, tokens_per_frame=tpf, grid=grid,
                             frames_per_chunk=fpc, sink_frames=sinks, window_frames=window, num_blocks=blocks,
                             block_size=bs, dtype=self.dtype)
        self.geo = Geometry(tpf, grid[1], fpc, sinks, window, bs)
        self.st = Storage(self.dtype, layers, HKV)  # what the cache holds of each write
        self.layers, self.rng = layers, np.random.default_rng(seed)
        self.frames: dict[int, int] = {}  # committed frames
        self.open: dict[int, int] = {}  # stream -> index in self.batches of its open chunk's batch
        self.slot: dict[int, dict[int, int]] = {}  # stream -> token -> slot handed out by begin_chunk
        self.kv: dict[int, np.ndarray] = {}  # stream -> [2, layers, tokens, HKV, D] K/V held
        self.batches: list[ChunkBatch] = []
        for s in range(streams):
            self.add(("any", s))

    # -- the model

    def pick(self, p: tuple[str, int]) -> int:
        pool = sorted(self.open) if p[0] == "open" and self.open else sorted(self.frames)
        return pool[p[1] % len(pool)] if p[0] != "any" and pool else p[1] % ID_RANGE

    def pick_list(self, arg: tuple[list[tuple[str, int]], int]) -> list[int]:
        ids = [self.pick(p) for p in arg[0]]
        return ids if arg[1] == 0 else list(dict.fromkeys(ids))

    def length(self, s: int) -> int:
        return self.frames[s] * self.geo.tpf + (self.geo.chunk_tokens if s in self.open else 0)

    def held(self, s: int) -> int:
        return self.geo.held_blocks(self.frames[s] * self.geo.tpf, self.length(s))

    def live_tokens(self, s: int) -> list[int]:
        """Tokens whose K/V some query may still read: the visible history and the open chunk."""
        vis = self.geo.visible_tokens(self.frames[s]).tolist()
        start = self.frames[s] * self.geo.tpf
        return vis + (list(range(start, start + self.geo.chunk_tokens)) if s in self.open else [])

    def ids_error(self, ids: list[int], need_open: bool | None) -> type[Exception] | None:
        """The error of a call on a list of streams: malformed list, unknown, (not) open."""
        if not ids or len(set(ids)) < len(ids):
            return kv.InvalidArgumentError
        for s in ids:
            if s not in self.frames:
                return kv.UnknownSequenceError
            if need_open is not None and (s in self.open) != need_open:
                return kv.InvalidArgumentError
        return None

    def fails(self, cls: type[Exception], call: Callable[[], Any]) -> None:
        before = (snapshot(self.vc.pool), self.vc.stats())
        try:
            call()
        except cls:
            assert (snapshot(self.vc.pool), self.vc.stats()) == before
            return
        raise AssertionError(f"expected {cls.__name__}")

    def record(self, s: int, layer: int, tokens: list[int], k: np.ndarray, v: np.ndarray) -> None:
        arr = self.kv[s]
        if arr.shape[2] <= max(tokens):
            grow = np.zeros((2, self.layers, max(tokens) + 1 - arr.shape[2], HKV, D), np.float32)
            arr = self.kv[s] = np.concatenate([arr, grow], axis=2)
        arr[0, layer, tokens], arr[1, layer, tokens] = k, v

    # -- rules

    @rule(p=picks)
    def add(self, p: tuple[str, int]) -> None:
        s = self.pick(p) if p[0] == "any" else next(i for i in itertools.count() if i not in self.frames)
        if s in self.frames:
            self.fails(kv.DuplicateSequenceError, lambda: self.vc.add_stream(s))
            return
        self.vc.add_stream(s)
        self.frames[s], self.slot[s] = 0, {}
        self.kv[s] = np.zeros((2, self.layers, 0, HKV, D), np.float32)

    @rule(ps=lists)
    def begin(self, ps: tuple[list[tuple[str, int]], int]) -> None:
        self.begin_ids(self.pick_list(ps))

    def begin_ids(self, ids: list[int]) -> bool:
        """begin_chunk on the model and the cache; whether it succeeded."""
        err = self.ids_error(ids, need_open=False)
        if err is not None:
            self.fails(err, lambda: self.vc.begin_chunk(ids))
            return False
        bs, c = self.geo.block_size, self.geo.chunk_tokens
        need = sum(-(-(self.length(s) + c) // bs) - -(-self.length(s) // bs) for s in ids)
        if need > self.vc.pool.num_blocks - sum(self.held(s) for s in self.frames):
            self.fails(kv.PoolExhaustedError, lambda: self.vc.begin_chunk(ids))
            return False
        batch = self.vc.begin_chunk(ids)
        taken = {self.slot[s][t] for s in self.frames for t in self.live_tokens(s)}
        for i, s in enumerate(ids):
            start = self.frames[s] * self.geo.tpf
            tokens = np.arange(start, start + c)
            assert batch.chunks[i] == self.frames[s] // self.geo.frames_per_chunk
            assert batch.positions[i].tolist() == self.geo.positions(tokens).tolist()
            slots = batch.slots[i].tolist()
            assert taken.isdisjoint(slots) and len(set(slots)) == c
            taken |= set(slots)
            self.slot[s].update(zip(tokens.tolist(), slots))
            self.open[s] = len(self.batches)
        self.batches.append(batch)
        # The first denoising step writes every layer (a chunk is never read unwritten).
        for layer in range(self.layers):
            k, v = (self.rng.standard_normal((batch.num_tokens, HKV, D)).astype(np.float32) for _ in range(2))
            self.vc.write(layer, k, v, batch)
            k, v = self.st.store(layer, k, v)
            for i, (s, chunk) in enumerate(zip(ids, batch.chunks.tolist())):
                rows = slice(i * c, (i + 1) * c)
                self.record(s, layer, list(range(chunk * c, (chunk + 1) * c)), k[rows], v[rows])
        return True

    @rule(ps=st.lists(live, min_size=1, max_size=3), layer=st.integers(0, 1), repeat=st.integers(1, 6))
    def chunks(self, ps: list[tuple[str, int]], layer: int, repeat: int) -> None:
        """Whole chunks of the streams without an open one: begin, a step, commit."""
        ids = [s for s in dict.fromkeys(self.pick(p) for p in ps) if s in self.frames and s not in self.open]
        for _ in range(repeat):
            if not ids or not self.begin_ids(ids):
                return
            self.step(0, layer, 1)
            self.vc.commit_chunk(ids)
            self.committed(ids)

    @rule(b=st.integers(0, 3), layer=st.integers(0, 1), steps=st.integers(1, 2))
    def step(self, b: int, layer: int, steps: int) -> None:
        """Denoising steps of the ``b``-th latest batch (stale ones fail)."""
        if not self.batches:
            return
        idx = len(self.batches) - 1 - b % len(self.batches)
        batch, layer = self.batches[idx], layer % self.layers
        n, c = batch.num_tokens, self.geo.chunk_tokens
        ids = batch.stream_ids.tolist()
        k, v = (self.rng.standard_normal((n, HKV, D)).astype(np.float32) for _ in range(2))
        q = self.rng.standard_normal((n, HQ, D)).astype(np.float32)
        if any(self.open.get(s) != idx for s in ids):  # a stale batch
            self.fails(kv.InvalidArgumentError, lambda: self.vc.write(layer, k, v, batch))
            self.fails(kv.InvalidArgumentError, lambda: self.vc.attention(layer, q, batch))
            return
        for _ in range(steps):
            self.vc.write(layer, k, v, batch)
            kh, vh = self.st.store(layer, k, v)
            got = self.vc.attention(layer, q, batch)
            assert np.isfinite(got).all()
            for i, (s, chunk) in enumerate(zip(ids, batch.chunks.tolist())):
                rows = slice(i * c, (i + 1) * c)
                self.record(s, layer, list(range(chunk * c, (chunk + 1) * c)), kh[rows], vh[rows])
                sees = self.geo.chunk_sees(chunk)
                want = reference_attention(q[rows], self.kv[s][0, layer, sees], self.kv[s][1, layer, sees])
                np.testing.assert_allclose(got[rows], want, atol=2e-5, rtol=1e-5)
            k = k * 0.5 + 1.0  # the next denoising step's K/V

    @rule(ps=open_lists)
    def commit(self, ps: tuple[list[tuple[str, int]], int]) -> None:
        ids = self.pick_list(ps)
        err = self.ids_error(ids, need_open=True)
        if err is not None:
            self.fails(err, lambda: self.vc.commit_chunk(ids))
            return
        self.vc.commit_chunk(ids)
        self.committed(ids)

    def committed(self, ids: list[int]) -> None:
        for s in ids:
            del self.open[s]
            self.frames[s] += self.geo.frames_per_chunk

    @rule(ps=open_lists)
    def abort(self, ps: tuple[list[tuple[str, int]], int]) -> None:
        ids = self.pick_list(ps)
        err = self.ids_error(ids, need_open=True)
        if err is not None:
            self.fails(err, lambda: self.vc.abort_chunk(ids))
            return
        self.vc.abort_chunk(ids)
        for s in ids:
            del self.open[s]

    @rule(p=picks)
    def prompt_switch(self, p: tuple[str, int]) -> None:
        s = self.pick(p)
        if s not in self.frames:
            self.fails(kv.UnknownSequenceError, lambda: self.vc.rewrite_window(s))
            return
        slots, pos = self.vc.rewrite_window(s)
        tokens = self.geo.visible_tokens(self.frames[s]).tolist()
        assert pos.tolist() == self.geo.positions(np.asarray(tokens, np.int64)).reshape(-1, 3).tolist()
        assert slots.tolist() == [self.slot[s][t] for t in tokens]
        if tokens:
            for layer in range(self.layers):
                k, v = (self.rng.standard_normal((len(tokens), HKV, D)).astype(np.float32) for _ in range(2))
                self.vc.kv.write(layer, k, v, slots)
                self.record(s, layer, tokens, *self.st.store(layer, k, v))

    @rule(p=picks)
    def release(self, p: tuple[str, int]) -> None:
        s = self.pick(p)
        if s not in self.frames:
            self.fails(kv.UnknownSequenceError, lambda: self.vc.release(s))
            return
        if len(self.frames) <= 2:
            return  # streams accumulate: the last two go at teardown
        self.vc.release(s)
        for d in (self.frames, self.open, self.slot, self.kv):
            d.pop(s, None)

    # -- invariants

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "geo"):
            return
        vc, geo = self.vc, self.geo
        assert vc.stream_ids() == sorted(self.frames)
        seen: set[int] = set()
        per = vc.stats()["streams"]
        for s, f in self.frames.items():
            assert (vc.stream_frames(s), vc.has_open_chunk(s)) == (f, s in self.open)
            tokens = geo.visible_tokens(f)
            assert vc.visible_positions(s).tolist() == geo.positions(tokens).reshape(-1, 3).tolist()
            assert vc.visible_slots(s).tolist() == [self.slot[s][t] for t in tokens.tolist()]
            live = [self.slot[s][t] for t in self.live_tokens(s)]
            assert seen.isdisjoint(live), f"stream {s} shares a slot"
            seen |= set(live)
            assert per[s]["blocks"] == self.held(s), s
        assert vc.pool.num_used_blocks == sum(self.held(s) for s in self.frames)
        vc.pool.check_invariants()
        poison_free_pages(vc.kv, vc.pool)

    def teardown(self) -> None:
        if hasattr(self, "geo"):
            for s in sorted(self.frames):
                self.vc.release(s)
            assert self.vc.pool.num_free_blocks == self.vc.pool.num_blocks


@pytest.mark.parametrize("dtype", DTYPES)
def test_video_state_machine(dtype: str) -> None:
    machine = type(f"VideoMachine_{dtype}", (VideoMachine,), {"dtype": dtype})
    examples = settings().max_examples if dtype == "f32" else max(1, settings().max_examples // 4)
    run_state_machine_as_test(machine, settings=settings(max_examples=examples))
