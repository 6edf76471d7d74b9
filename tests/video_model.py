"""The video cache's contract written out (issue 14's shared spec), for the video tests (not
a test module): which tokens a chunk sees, their (t, h, w), the pages the release rule
keeps, a float64 attention reference built from positions and the K/V a test wrote, and
the poisoning of every page no stream holds.

Nothing here asks the cache what to expect: the reference takes logical token indices and
the test's own record of K/V; only :func:`poison_free_pages` reads the pool (to find the
pages nobody holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import pykvpool as kv


@dataclass(frozen=True)
class Geometry:
    tpf: int  # tokens per frame
    grid_w: int
    frames_per_chunk: int
    sink_frames: int
    window_frames: int | None
    block_size: int

    @property
    def chunk_tokens(self) -> int:
        return self.frames_per_chunk * self.tpf

    def visible_frames(self, frames: int) -> list[int]:
        """Frames a chunk starting after ``frames`` committed frames sees before itself: the
        sinks and the ``window_frames`` frames just before it (every earlier frame without
        a window)."""
        if self.window_frames is None:
            return list(range(frames))
        sinks = range(min(self.sink_frames, frames))
        window = range(max(self.sink_frames, frames - self.window_frames), frames)
        return [*sinks, *window]

    def visible_tokens(self, frames: int) -> np.ndarray:
        """Logical token indices of the visible history (frames in order)."""
        f = np.asarray(self.visible_frames(frames), np.int64)
        return (f[:, None] * self.tpf + np.arange(self.tpf)[None, :]).reshape(-1)

    def positions(self, tokens: np.ndarray) -> np.ndarray:
        """(t, h, w) of logical token indices, from the spec's definition."""
        tokens = np.asarray(tokens, np.int64)
        j = tokens % self.tpf
        return np.stack([tokens // self.tpf, j // self.grid_w, j % self.grid_w], -1)

    def held_blocks(self, committed: int, length: int) -> int:
        """Pages a stream of ``length`` tokens whose first ``committed`` tokens are history
        holds: the release rule keeps a page when it meets the sinks, or when some token of
        it is at or after ``committed - window_frames * tpf`` (the first token a query at
        ``committed`` needs)."""
        bs = self.block_size
        n = -(-length // bs)
        if self.window_frames is None:
            return n
        sinks = self.sink_frames * self.tpf
        first = committed - self.window_frames * self.tpf
        return sum(1 for i in range(n) if i * bs < sinks or (i + 1) * bs > first)

    def chunk_sees(self, chunk: int) -> np.ndarray:
        """Key token indices the queries of chunk ``chunk`` see: the visible history before it
        and the whole chunk."""
        start = chunk * self.chunk_tokens
        own = np.arange(start, start + self.chunk_tokens, dtype=np.int64)
        return np.concatenate([self.visible_tokens(chunk * self.frames_per_chunk), own])


def reference_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float | None = None) -> np.ndarray:
    """float64 softmax attention of ``q`` ``[n, Hq, d]`` over ``keys``/``values``
    ``[m, Hkv, d]`` (all visible), grouped query heads."""
    q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, keys, values))
    hq, hkv, d = q64.shape[1], k64.shape[1], q64.shape[2]
    scale = 1 / np.sqrt(d) if scale is None else scale
    g = hq // hkv
    k_rep, v_rep = np.repeat(k64, g, axis=1), np.repeat(v64, g, axis=1)
    logits = np.einsum("qhd,khd->hqk", q64, k_rep) * scale
    logits -= logits.max(-1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v_rep)


def held_pages(pool: kv.HybridPool) -> set[int]:
    """Every page some stream's table holds."""
    held: set[int] = set()
    for s in pool.seq_ids().tolist():
        held |= {b for b in pool.block_table(s, 0).tolist() if b >= 0}
    return held


def poison_free_pages(cache: kv.KvCache, pool: kv.HybridPool) -> int:
    """Write NaN into K and V of every layer of every page no stream holds (through the
    cache's views); returns how many pages."""
    free = sorted(set(range(pool.num_blocks)) - held_pages(pool))
    if free:
        for layer in range(cache.num_layers):
            cache.key(layer)[free] = np.nan
            cache.value(layer)[free] = np.nan
    return len(free)
