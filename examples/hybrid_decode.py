"""Decode with a Gemma-like model: global and sliding-window layers in one pool and one cache.

The model interleaves global layers (full attention) and local layers (a sliding window of
``WINDOW`` tokens), like Gemma 2/3. A :class:`pykvpool.BlockPool` keeps one block table per
layer group; with tensor sharing one :class:`pykvpool.KvCache` of ``LAYERS_PER_GROUP`` layers
serves both groups: model layer ``l`` of group ``g`` lives in cache layer ``l // 2`` at the
blocks of group ``g``'s table. Sequences decode far past the window: the local group releases
what no query sees any more, so its memory stays flat while the global group's grows.

Each step writes every layer's new K/V through its group's slots, then runs decode attention
per group: the global layers over padded block tables, the local layers over the group's
FlashInfer tables (only the stored pages, ``kv_page_start`` placing them) with
``window_left = WINDOW - 1``; both are checked against numpy over the K/V the example wrote.

Run: ``python examples/hybrid_decode.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import pykvpool as kv

BLOCK_SIZE = 16
WINDOW = 64
LAYERS_PER_GROUP = 2  # model layers 0, 2 global; 1, 3 local
KV_HEADS, Q_HEADS, HEAD_DIM = 2, 4, 32
NUM_BLOCKS = 256
PROMPTS = {1: 20, 2: 70, 3: 5}
STEPS = 4 * WINDOW
SCALE = HEAD_DIM ** -0.5


@dataclass
class Result:
    steps: int
    max_error: float
    held: list[list[int]] = field(default_factory=list)  # per step: blocks per group
    pool: kv.BlockPool | None = None


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, first: int) -> np.ndarray:
    """Attention of one query [Hq, D] over keys ``first..`` of k/v [n, Hkv, D], in float64."""
    k, v = k[first:].astype(np.float64), v[first:].astype(np.float64)
    out = np.empty(q.shape)
    for h in range(q.shape[0]):
        s = SCALE * (k[:, h * KV_HEADS // Q_HEADS] @ q[h])
        w = np.exp(s - s.max())
        out[h] = (w / w.sum()) @ v[:, h * KV_HEADS // Q_HEADS]
    return out


def local_attention(pool: kv.BlockPool, cache: kv.KvCache, j: int, q: np.ndarray, ids: list[int]) -> np.ndarray:
    """Decode attention of the local layers in cache layer ``j``: the sliding-window group's
    stored pages in FlashInfer's layout, the window given to the kernel."""
    kind = pool.groups[1]
    indptr, indices, last, start = pool.flashinfer_tables(ids, group=1)
    return kv.decode_attention_paged(cache, j, q, indptr, indices, last, scale=SCALE, window_left=kind.window_left,
                                     sink_tokens=kind.sink_tokens, kv_page_start=start)


def run(steps: int = STEPS, seed: int = 0) -> Result:
    groups = [kv.FullAttention(), kv.SlidingWindow(WINDOW)]
    pool = kv.BlockPool(NUM_BLOCKS, BLOCK_SIZE, groups)
    cache = kv.KvCache(LAYERS_PER_GROUP, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    rng = np.random.default_rng(seed)
    layers = [(layer % 2, layer // 2) for layer in range(2 * LAYERS_PER_GROUP)]  # (group, cache layer)
    history: dict[tuple[int, int], list[np.ndarray]] = {}  # (layer, seq) -> [k list, v list]

    def write(slots: np.ndarray, seqs: list[int]) -> None:
        for layer, (g, j) in enumerate(layers):
            k = rng.standard_normal((len(seqs), KV_HEADS, HEAD_DIM)).astype(np.float32)
            v = rng.standard_normal((len(seqs), KV_HEADS, HEAD_DIM)).astype(np.float32)
            cache.write(j, k, v, slots[g])
            for t, s in enumerate(seqs):
                history.setdefault((layer, s), [[], []])
                history[(layer, s)][0].append(k[t])
                history[(layer, s)][1].append(v[t])

    for seq, n in PROMPTS.items():
        write(pool.add_sequence(seq, n), [seq] * n)
    ids = list(PROMPTS)
    result = Result(steps, 0.0, pool=pool)
    for _ in range(steps):
        slots, cow, lens = pool.step(ids)
        cache.copy_blocks(cow)  # none here (no fork), but this is where copies go
        write(slots, ids)
        q = rng.standard_normal((len(ids), Q_HEADS, HEAD_DIM)).astype(np.float32)
        for layer, (g, j) in enumerate(layers):
            if g == 0:
                got = kv.decode_attention(cache, j, q, pool.block_tables(ids, group=0), lens, scale=SCALE)
            else:
                got = local_attention(pool, cache, j, q, ids)
            for r, s in enumerate(ids):
                k, v = (np.stack(x) for x in history[(layer, s)])
                first = 0 if g == 0 else max(0, int(lens[r]) - WINDOW)
                err = float(np.abs(got[r] - reference(q[r], k, v, first)).max())
                result.max_error = max(result.max_error, err)
        result.held.append(pool.stats().group_blocks)
    return result


def main() -> None:
    res = run()
    assert res.pool is not None
    lens = [res.pool.seq_len(s) for s in PROMPTS]
    print(f"{len(PROMPTS)} sequences decoded {res.steps} steps to lengths {lens} (window {WINDOW} tokens)")
    for label, at in (("start", 0), ("middle", len(res.held) // 2), ("end", -1)):
        full, local = res.held[at]
        print(f"  {label:6s}: global group {full:3d} blocks, local group {local:3d} blocks")
    print(f"max |error| of decode attention vs numpy, both groups: {res.max_error:.2e}")
    res.pool.free_batch(list(PROMPTS))
    print(f"{res.pool.num_used_blocks} blocks still used")


if __name__ == "__main__":
    main()
