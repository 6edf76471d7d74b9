"""The video cache's contract written out (the shared spec), for the video tests (not
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


def held_pages(pool: kv.BlockPool) -> set[int]:
    """Every page some stream's table holds."""
    held: set[int] = set()
    for s in pool.seq_ids().tolist():
        held |= {b for b in pool.block_table(s, group=0).tolist() if b >= 0}
    return held


def poison_free_pages(cache: kv.KvCache, pool: kv.BlockPool) -> int:
    """Write NaN into K and V of every layer of every page no stream holds (through the
    cache's views: the codes, or for int8, whose codes have no NaN, the pages' scales);
    returns how many pages."""
    free = sorted(set(range(pool.num_blocks)) - held_pages(pool))
    views = (cache.key_scales, cache.value_scales) if cache.dtype == "int8" else (cache.key, cache.value)
    if free:
        for layer in range(cache.num_layers):
            for view in views:
                view(layer)[free] = np.nan
    return len(free)


# ---- what each storage dtype keeps of the K/V a test writes (KvCache's documented formats)

#: Per fp8 format: largest finite value, relative rounding of a normal value and half the
#: subnormal step (times the head's scale): ``pykvpool.decode_attention``'s 8-bit bound.
FP8 = {"fp8_e4m3": (448.0, 2.0**-4, 2.0**-10), "fp8_e5m2": (57344.0, 2.0**-3, 2.0**-17)}
QDTYPES = ("int8", "fp8_e4m3", "fp8_e5m2")
DTYPES = ("f32", "f16", "bf16", *QDTYPES)


class Storage:
    """The values a :class:`pykvpool.KvCache` of ``dtype`` holds for the float32 K/V written
    to it, bit for bit, from its documented format: f16/bf16 rounded to nearest even; int8
    per (token, KV head) with ``scale = max|x| / 127`` and ``rint(x / scale)``; fp8 with one
    scale per (layer, K/V, KV head), set, or calibrated by the first write holding a non-zero
    value of that head (``max|x| / largest``), codes saturating at the largest value."""

    def __init__(self, dtype: str, layers: int, num_kv_heads: int) -> None:
        self.dtype = dtype
        self.scales = np.zeros((layers, 2, num_kv_heads), np.float32)  # fp8; 0 = not set yet

    def store(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What the cache holds after ``write(layer, k, v, slots)`` (all slots real)."""
        return self._one(layer, 0, k), self._one(layer, 1, v)

    def _one(self, layer: int, which: int, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if self.dtype == "f32":
            return x.copy()
        if self.dtype == "f16":
            return x.astype(np.float16).astype(np.float32)
        import ml_dtypes

        if self.dtype == "bf16":
            return x.astype(ml_dtypes.bfloat16).astype(np.float32)
        if self.dtype == "int8":
            scale = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)
            safe = np.where(scale == 0, np.float32(1), scale)
            return (np.clip(np.rint(x / safe), -127, 127) * scale).astype(np.float32)
        top = np.float32(FP8[self.dtype][0])
        sc = self.scales[layer, which]
        fresh = (sc == 0) & (len(x) > 0)
        sc[fresh] = (np.abs(x).max(axis=(0, 2)) / top)[fresh] if len(x) else 0
        s = sc[None, :, None]
        codes = np.clip(x / np.where(s == 0, np.float32(1), s), -top, top)
        ml = ml_dtypes.float8_e4m3fn if self.dtype == "fp8_e4m3" else ml_dtypes.float8_e5m2
        return (codes.astype(ml).astype(np.float32) * s).astype(np.float32)

    def element_error(self, layer: int, which: int, x: np.ndarray) -> np.ndarray:
        """The documented largest error of each stored element of ``x`` (8-bit dtypes; no
        value beyond an fp8 scale's range): int8 ``0.5 max|x| / 127`` of its row, fp8
        ``rel |x| + sub * scale``."""
        x = np.abs(np.asarray(x, np.float64))
        if self.dtype == "int8":
            return np.broadcast_to(0.5 * x.max(axis=-1, keepdims=True) / 127, x.shape)
        _, rel, sub = FP8[self.dtype]
        return rel * x + sub * self.scales[layer, which].astype(np.float64)[None, :, None]


def attention_bound(st: Storage, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, v_stored: np.ndarray,
                    scale: float | None = None) -> np.ndarray:
    """``pykvpool.decode_attention``'s bound (which prefill follows row by row) on how far
    attention over the 8-bit values moves from attention over the unquantized ``k``/``v``
    ``[m, Hkv, d]`` (all visible), per query row and head ``[n, Hq]``: each logit by at most
    ``D = scale * max_t sum_i |q_i| e_K(t, i)``, each output by at most ``(exp(2 D) - 1)
    max|V'| + max e_V``."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    scale = 1 / np.sqrt(d) if scale is None else scale
    ek, ev = st.element_error(layer, 0, k), st.element_error(layer, 1, v)
    qa = np.abs(np.asarray(q, np.float64))
    kh = np.arange(hq) // (hq // hkv)
    dmax = scale * np.einsum("nhd,thd->nht", qa, ek[:, kh]).max(axis=-1)
    vmax = np.abs(v_stored.astype(np.float64)).max(axis=(0, 2))[kh]
    return np.expm1(2 * dmax) * vmax[None, :] + ev.max(axis=(0, 2))[kh][None, :]
