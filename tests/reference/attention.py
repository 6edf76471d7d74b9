"""The attention kernels' contract written out (not a test module): one float64 attention
reference over a paged batch, the masks on logical positions, and the query roundings
that define the opt-in precisions.

Nothing here calls a kernel: the reference reads the values every kernel attends over
(:meth:`pykvpool.KvCache.dequantized`) through the batch's own block tables, so f16/bf16
rounding and 8-bit quantization of K/V are the data, never error.

- :func:`bf16_round` is ``q_dtype="bf16"``: each element rounded to bf16, nearest even.
- :func:`int8_query` is ``q_dtype="int8"``: per (sequence, query head), ``s_q = max|q| /
  127`` (f32), codes ``round_half_even(q / s_q)`` clamped to +-127, times ``s_q``.
- :func:`reference` is ``softmax(scale * q K^T + mask) V`` and its log-sum-exp per (query
  row, query head), with the per-row data the documented error bounds are functions of.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

import pykvpool as kv

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def bf16_round(x: F32) -> F32:
    """f32 rounded to bf16 (nearest, ties to even), as f32 (finite inputs)."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def int8_codes(x: F32) -> tuple[npt.NDArray[np.int8], F32]:
    """Per row (last axis): ``s = max|x| / 127`` in f32 and the codes ``rint(x / s)`` (half
    to even) clamped to +-127; an all-zero row has ``s = 0`` and zero codes. The rule of
    the int8 cache's writes and of ``q_dtype="int8"``'s query."""
    x = np.asarray(x, np.float32)
    s = (np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    safe = np.where(s == 0, np.float32(1), s)
    codes = np.where(s == 0, 0, np.clip(np.rint(x / safe), -127, 127)).astype(np.int8)
    return codes, s[..., 0]


def int8_query(q: F32) -> F64:
    """``q`` quantized per (row, head) by :func:`int8_codes` and dequantized, in float64."""
    codes, s = int8_codes(q)
    return codes.astype(np.float64) * s[..., None].astype(np.float64)


def padded(tables: list[list[int]]) -> npt.NDArray[np.int32]:
    """Block tables as ``[n, max_blocks]`` int32 rows, pads ``-1``."""
    width = max((len(t) for t in tables), default=0)
    out = np.full((len(tables), width), -1, np.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


@dataclass(frozen=True)
class Mask:
    """The attention mask of a call on logical positions, and the score options: key ``k``
    is visible from a query at ``p`` when the order rule allows it (``k <= p``; block-causal
    ``k // chunk <= p // chunk``; any ``k`` without ``causal``) and ``p - k <= window_left``
    or ``k < sinks``. Decode's query sits at ``len - 1``, so its order rule always holds."""

    causal: bool = True
    chunk_size: int | None = None
    window_left: int | None = None
    sinks: int = 0
    cap: float | None = None  # logits_soft_cap
    scale: float | None = None  # None: 1 / sqrt(head_dim)

    def visible(self, p: I64, k: I64) -> npt.NDArray[np.bool_]:
        if self.chunk_size is not None:
            ordered = k // self.chunk_size <= p // self.chunk_size
        elif self.causal:
            ordered = k <= p
        else:
            ordered = np.ones(np.broadcast(p, k).shape, bool)
        near = (p - k <= self.window_left) if self.window_left is not None else True
        return ordered & (near | (k < self.sinks))  # type: ignore[no-any-return]


@dataclass
class Batch:
    """A paged batch: sequence ``i`` holds ``lens[i]`` keys through ``tables[i]`` (block ids,
    logical block ``b`` at index ``b``) and owns query rows ``qo[i]:qo[i + 1]`` at logical
    ``positions`` (decode: one row at ``lens[i] - 1``). ``explicit`` says whether a prefill
    call passes the positions as ``q_positions``."""

    cache: kv.KvCache
    tables: list[list[int]]
    lens: list[int]
    qo: list[int]
    positions: I64
    explicit: bool = False

    def padded(self) -> npt.NDArray[np.int32]:
        """The tables as ``[n, max_blocks]``, pads ``-1``."""
        return padded(self.tables)

    def pages(self, mask: Mask) -> tuple[list[int], list[int], list[int], list[int]]:
        """FlashInfer's layout ``(kv_indptr, kv_indices, kv_last_page_len, kv_page_start)``.
        Without a window every page, from 0; with one, the sink pages and the run from the
        first block holding a key the window lets some row see (never past the last block,
        which fixes the logical length), so the pages a window left behind are not listed."""
        bs = self.cache.block_size
        indptr, indices, last, starts = [0], [], [], []
        for i, (t, n) in enumerate(zip(self.tables, self.lens)):
            nblk = -(-n // bs)
            start = 0
            if mask.window_left is not None and nblk:
                rows = self.positions[self.qo[i]:self.qo[i + 1]]
                low = int(rows.min()) - mask.window_left if len(rows) else n
                start = min(max(0, low) // bs, nblk - 1)
            sink_pages = min(-(-mask.sinks // bs), start)
            pages = [*t[:sink_pages], *t[start:nblk]] if start > sink_pages else list(t[:nblk])
            indices += pages
            indptr.append(len(indices))
            last.append(n - (nblk - 1) * bs if nblk else 0)
            starts.append(start if start > sink_pages else 0)
        return indptr, indices, last, starts


@dataclass
class Ref:
    """The reference's answer for one query (``[rows, Hq, d]`` / ``[rows, Hq]``) and, per
    (row, query head) over the keys the row sees, what the bounds are functions of."""

    out: F64
    lse: F64  # -inf where the row sees no key
    lmax: float  # largest |scale q.K| over visible keys (before the soft cap, which shrinks its error)
    vmax: F64  # max |V(t, i)|
    qk1: F64  # max_t sum_i |q_i K(t, i)| (of the q given)
    k1: F64  # max_t sum_i |K(t, i)|

    @property
    def seen(self) -> npt.NDArray[np.bool_]:
        return np.isfinite(self.lse)  # type: ignore[no-any-return]


def _bmm(a: F64, b: F64) -> F64:
    """``a @ b`` over a leading batch axis: numpy's einsum loop for a few rows (where BLAS
    calls cost more than they save), BLAS for many."""
    return np.einsum("hqd,hdt->hqt", a, b) if a.shape[1] <= 16 else a @ b  # type: ignore[no-any-return]


def reference(b: Batch, q: npt.NDArray[np.floating], mask: Mask) -> Ref:
    """float64 grouped attention (query head ``h`` reads KV head ``h // g``) over the
    dequantized K/V: each row over exactly the keys its mask shows (a key no row sees
    never enters, whatever it holds)."""
    kd, vd = b.cache.dequantized(0)  # [nb, bs, hkv, d]
    rows, hq, d = q.shape
    bs, hkv = kd.shape[1], kd.shape[2]
    kd, vd = kd.reshape(-1, hkv, d), vd.reshape(-1, hkv, d)  # by slot
    g = hq // hkv
    scale = 1 / np.sqrt(d) if mask.scale is None else float(np.float32(mask.scale))
    out, lse = np.zeros((rows, hq, d)), np.full((rows, hq), -np.inf)
    vmax, qk1, k1 = np.zeros((rows, hq)), np.zeros((rows, hq)), np.zeros((rows, hq))
    lmax = 0.0
    for i, (t, n) in enumerate(zip(b.tables, b.lens)):
        a, e = b.qo[i], b.qo[i + 1]
        if a == e or n == 0:
            continue
        keys = np.arange(n)
        vis = mask.visible(b.positions[a:e, None], keys[None, :])  # [nq, n]
        seen = vis.any(axis=0)
        slots = np.asarray(t, np.int64)[keys // bs] * bs + keys % bs
        k = np.where(seen[:, None, None], kd[slots].astype(np.float64), 0.0).transpose(1, 0, 2)  # [hkv, n, d] float64
        v = np.where(seen[:, None, None], vd[slots].astype(np.float64), 0.0).transpose(1, 0, 2)
        nq = e - a
        qh = np.asarray(q[a:e], np.float64).reshape(nq, hkv, g, d).transpose(1, 0, 2, 3).reshape(hkv, nq * g, d)
        logits = _bmm(qh, k.transpose(0, 2, 1)).reshape(hkv, nq, g, n) * scale
        v4 = vis[None, :, None, :]
        lmax = max(lmax, float(np.abs(np.where(v4, logits, 0.0)).max(initial=0.0)))
        if mask.cap is not None:
            cap = float(np.float32(mask.cap))
            logits = cap * np.tanh(logits / cap)
        masked = np.where(v4, logits, -np.inf)
        m = masked.max(axis=-1, keepdims=True)
        row_seen = np.isfinite(m)
        p = np.where(v4, np.exp(masked - np.where(row_seen, m, 0.0)), 0.0)
        z = p.sum(axis=-1, keepdims=True)
        o = _bmm((p / np.where(z > 0, z, 1.0)).reshape(hkv, nq * g, n), v)  # [hkv, nq * g, d]
        heads = (nq, hq)  # [hkv, nq, g, ...] -> [nq, hq, ...]
        out[a:e] = o.reshape(hkv, nq, g, d).transpose(1, 0, 2, 3).reshape(nq, hq, d)
        lse[a:e] = np.where(row_seen, m + np.log(np.where(z > 0, z, 1.0)), -np.inf)[..., 0].transpose(1, 0, 2).reshape(heads)
        qa = _bmm(np.abs(qh), np.abs(k).transpose(0, 2, 1)).reshape(hkv, nq, g, n)
        qk1[a:e] = np.where(v4, qa, 0.0).max(axis=-1).transpose(1, 0, 2).reshape(heads)
        ka = np.abs(k).sum(axis=-1)[:, None, None, :]  # [hkv, 1, 1, n]
        k1[a:e] = np.where(v4, ka, 0.0).max(axis=-1).repeat(g, axis=2).transpose(1, 0, 2).reshape(heads)
        va = np.abs(v).max(axis=-1)[:, None, None, :]
        vmax[a:e] = np.where(v4, va, 0.0).max(axis=-1).repeat(g, axis=2).transpose(1, 0, 2).reshape(heads)
    return Ref(out, lse, lmax, vmax, qk1, k1)
