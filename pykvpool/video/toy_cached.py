"""The cached route of the toy video transformer (:mod:`pykvpool.video.toy`) on a
:class:`pykvpool.video.VideoCache`.

Several streams share one cache and run in rounds: each round opens the next chunk of every
active stream in one :meth:`VideoCache.begin_chunk` (slots and ``(t, h, w)`` positions come
from the cache), runs the denoising steps over the chunks only -- per layer one
:meth:`VideoCache.write` of the chunks' K/V (the same slots at every step) and one
:meth:`VideoCache.attention` call for all streams (the paged prefill kernel reads the
history from the pool) --, then the clean pass at ``sigma = 0`` writes the clean chunks'
K/V and :meth:`VideoCache.commit_chunk` makes them history (frames leaving the window are
released). A stream joins at its ``start`` round and is released after its last chunk.

A prompt switch (LongLive) before chunk ``s``: :meth:`VideoCache.rewrite_window` gives the
slots and positions of the visible history (sinks and window); the caller runs the model
over those clean frames under the new prompt (dense attention among them, the block-causal
mask from the positions the cache returned, never inferred from stored counts) and writes
each layer's K/V back in place with :meth:`KvCache.write`.

Any :class:`VideoCache` dtype runs; an fp8 cache takes its per-(layer, KV head) scales from
``fp8_scales`` (e.g. :func:`calibrated_fp8_scales` of an f32 run's :attr:`CachedRun.kv_absmax`),
else each layer calibrates on its first write (the first chunk's first denoising step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pykvpool.video.cache import FP8_MAX, VideoCache
from pykvpool.video.toy import (
    F32,
    FlopCounter,
    StreamSpec,
    VideoModel,
    Window,
    chunk_noise,
    conditions,
    dense_attention,
    forward,
    mask_bias,
    prompt_at,
    visible_mask,
)

__all__ = ["CachedRun", "calibrated_fp8_scales", "generate_cached"]


@dataclass
class CachedRun:
    """What the cached route produced: clean frames ``[frames, tpf, C]`` per stream, the most
    tokens each stream held stored after a commit (frames that left the window are gone),
    the pool's blocks in use at the end (0: every page came back), the number of rounds
    (batched chunk steps) and the largest ``|K|`` and ``|V|`` written per layer and KV head,
    float32 ``[n_layer, 2, n_kv_head]`` (K, then V)."""

    frames: list[F32]
    max_stored_tokens: list[int]
    blocks_used_after: int
    rounds: int
    kv_absmax: F32


def calibrated_fp8_scales(kv_absmax: F32, dtype: str, headroom: float = 2.0) -> F32:
    """fp8 scales ``[n_layer, 2, n_kv_head]`` covering ``headroom`` times the largest values
    of a calibration run (:attr:`CachedRun.kv_absmax`): ``kv_absmax x headroom /
    FP8_MAX[dtype]``. The headroom keeps a run whose values drift above the calibration
    run's (an 8-bit run's, say) from saturating.

    Raises:
        KeyError: ``dtype`` is not an fp8 dtype.
    """
    return (np.asarray(kv_absmax, np.float32) * np.float32(headroom / FP8_MAX[dtype])).astype(np.float32)


def _note(absmax: F32, layer: int, k: F32, v: F32) -> None:
    """Keep the largest ``|K|``, ``|V|`` per KV head of ``layer`` written so far."""
    np.maximum(absmax[layer], np.stack([np.abs(k).max(axis=(0, 2)), np.abs(v).max(axis=(0, 2))]),
               out=absmax[layer])


def _cache_for(model: VideoModel, specs: list[StreamSpec], win: Window, dtype: str, block_size: int) -> VideoCache:
    cfg = model.cfg
    tokens = sum(s.frames for s in specs) * cfg.tokens_per_frame
    blocks = -(-tokens // block_size) + 2 * len(specs)
    return VideoCache(num_layers=cfg.n_layer, num_kv_heads=cfg.n_kv_head, head_dim=cfg.d_head,
                      tokens_per_frame=cfg.tokens_per_frame, grid=cfg.grid, frames_per_chunk=cfg.frames_per_chunk,
                      sink_frames=win.sink_frames, window_frames=win.window_frames, num_blocks=blocks,
                      block_size=block_size, dtype=dtype)


def rewrite_prompt(model: VideoModel, vc: VideoCache, sid: int, clean: F32, prompt: int, win: Window,
                   fc: FlopCounter, absmax: F32 | None = None) -> None:
    """Recompute stream ``sid``'s visible history K/V under ``prompt`` and write it in place
    (``absmax``: :attr:`CachedRun.kv_absmax` to update).

    Raises:
        UnknownSequenceError: ``sid`` is not a stream of ``vc``.
    """
    cfg = model.cfg
    slots, pos = vc.rewrite_window(sid)
    if slots.size == 0:
        return
    frames = pos[:, 0]
    lat = clean[frames, pos[:, 1] * cfg.grid[1] + pos[:, 2]]
    bias = mask_bias(visible_mask(cfg, win, frames, frames))

    def attend(layer: int, q: F32, k: F32, v: F32) -> F32:
        vc.kv.write(layer, k, v, slots)
        if absmax is not None:
            _note(absmax, layer, k, v)
        return dense_attention(cfg, q, k, v, bias, fc)

    cond = conditions(model, [0.0], [prompt], fc)
    forward(model, lat, cond, np.zeros(len(slots), np.int64), pos, attend, fc, None)


def _round(model: VideoModel, vc: VideoCache, ids: list[int], specs: list[StreamSpec], clean: list[F32],
           fc: FlopCounter, absmax: F32) -> None:
    """One chunk of every stream in ``ids``: denoising steps, the clean pass, the commit."""
    cfg = model.cfg
    n, m = cfg.chunk_tokens, len(ids)
    hist = [len(vc.visible_slots(s)) for s in ids]
    batch = vc.begin_chunk(ids)
    chunks = [int(c) for c in batch.chunks]
    pos = batch.positions.reshape(-1, 3)
    pairs = sum(n * (h + n) for h in hist)
    scale = float(1 / np.sqrt(cfg.d_head))

    def attend(layer: int, q: F32, k: F32, v: F32) -> F32:
        vc.write(layer, k, v, batch)
        _note(absmax, layer, k, v)
        fc.add("attn", 4 * cfg.n_q_head * cfg.d_head * pairs)
        return vc.attention(layer, q, batch, scale=scale)

    prompts = [prompt_at(specs[s], c) for s, c in zip(ids, chunks)]
    cid = np.repeat(np.arange(m, dtype=np.int64), n)
    x = np.concatenate([chunk_noise(cfg, specs[s], c) for s, c in zip(ids, chunks)])
    sig = list(cfg.sigmas) + [0.0]
    for i in range(len(cfg.sigmas)):
        vel = forward(model, x, conditions(model, [sig[i]] * m, prompts, fc), cid, pos, attend, fc, slice(0, m * n))
        assert vel is not None
        x = x + np.float32(sig[i + 1] - sig[i]) * vel
    forward(model, x, conditions(model, [0.0] * m, prompts, fc), cid, pos, attend, fc, None)
    vc.commit_chunk(ids)
    fpc = cfg.frames_per_chunk
    for j, (s, c) in enumerate(zip(ids, chunks)):
        clean[s][c * fpc:(c + 1) * fpc] = x[j * n:(j + 1) * n].reshape(fpc, cfg.tokens_per_frame, cfg.channels)


def generate_cached(model: VideoModel, specs: list[StreamSpec], win: Window, fc: FlopCounter, *,
                    dtype: str = "f32", block_size: int = 16, rewrite: bool = True,
                    fp8_scales: F32 | None = None) -> CachedRun:
    """Generate every stream of ``specs`` (stream id = its index) through one VideoCache, in
    rounds; ``rewrite=False`` skips the prompt switch's K/V rewrite (the history then keeps
    the old prompt's K/V: a wrong cache, for the tests). ``fp8_scales``: float32
    ``[n_layer, 2, n_kv_head]`` (K, then V) set on an fp8 cache before the first chunk
    (None: each layer calibrates on its first write).

    Raises:
        ValueError: a stream's ``frames`` not a multiple of ``frames_per_chunk``.
        InvalidArgumentError: sizes the cache refuses, an unknown ``dtype``, ``fp8_scales``
            on a cache that is not fp8, or scales :meth:`VideoCache.set_fp8_scales` refuses.
    """
    cfg = model.cfg
    fpc = cfg.frames_per_chunk
    for s in specs:
        if s.frames % fpc:
            raise ValueError(f"frames must be a multiple of {fpc}, got {s.frames}")
    vc = _cache_for(model, specs, win, dtype, block_size)
    for layer, (ks, vs) in enumerate([] if fp8_scales is None else fp8_scales):
        vc.set_fp8_scales(layer, ks, vs)
    absmax = np.zeros((cfg.n_layer, 2, cfg.n_kv_head), np.float32)
    clean = [np.zeros((s.frames, cfg.tokens_per_frame, cfg.channels), np.float32) for s in specs]
    peak = [0] * len(specs)
    rounds = max(s.start + s.frames // fpc for s in specs)
    for r in range(rounds):
        ids = [i for i, s in enumerate(specs) if s.start <= r < s.start + s.frames // fpc]
        for i in ids:
            c, s = r - specs[i].start, specs[i]
            if c == 0:
                vc.add_stream(i)
            if rewrite and s.switch is not None and s.switch[0] == c:
                rewrite_prompt(model, vc, i, clean[i], s.switch[1], win, fc, absmax)
        if ids:
            _round(model, vc, ids, specs, clean, fc, absmax)
        st = vc.stats()["streams"]
        for i in ids:
            peak[i] = max(peak[i], st[i]["stored_tokens"])
            if r + 1 == specs[i].start + specs[i].frames // fpc:
                vc.release(i)
    return CachedRun(clean, peak, vc.pool.num_used_blocks, rounds, absmax)
