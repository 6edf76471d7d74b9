"""Generate two videos chunk by chunk on one VideoCache: 1 sink frame and a 4-frame window.

A small block-causal video transformer (:mod:`pykvpool.video.toy`: 3D RoPE, a timestep
condition, a flow-matching sampler) generates frames of 4 x 4 latent tokens in chunks of 2
frames. The loop below is the whole cache lifecycle: ``begin_chunk`` allocates both streams'
chunks once and gives their slots and ``(t, h, w)`` positions; each denoising step writes
the chunks' K/V at those same slots and runs one attention call per layer for both streams
(the history comes from the pool's pages); a clean pass at ``sigma = 0`` writes the clean
K/V, and ``commit_chunk`` makes it history and frees the frames that left the window, so
the pages held stay flat. The frames are checked against recomputing the whole history at
every step.

Run: ``python examples/video_stream.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pykvpool.video import ChunkBatch, VideoCache
from pykvpool.video import toy

CFG = toy.VideoToyConfig(grid=(4, 4))
WIN = toy.Window(sink_frames=1, window_frames=4)
STREAMS = [toy.StreamSpec(prompt=1, seed=1, frames=12), toy.StreamSpec(prompt=2, seed=2, frames=12)]
SCALE = CFG.d_head ** -0.5


@dataclass
class Result:
    frames: list[toy.F32]
    max_error: float  # largest |cached - recompute| over every frame
    scale: float  # largest |value| of the recomputed frames
    blocks_held: list[int]  # after each commit
    blocks_after: int  # once both streams are released


def chunk_attention(vc: VideoCache, batch: ChunkBatch) -> toy.Attend:
    """Each layer: store the chunks' K/V, then attend over sinks + window + chunk."""
    def attend(layer: int, q: toy.F32, k: toy.F32, v: toy.F32) -> toy.F32:
        vc.write(layer, k, v, batch)
        return vc.attention(layer, q, batch, scale=SCALE)
    return attend


def generate(model: toy.VideoModel) -> tuple[list[toy.F32], list[int], int]:
    vc = VideoCache(num_layers=CFG.n_layer, num_kv_heads=CFG.n_kv_head, head_dim=CFG.d_head,
                    tokens_per_frame=CFG.tokens_per_frame, grid=CFG.grid, frames_per_chunk=CFG.frames_per_chunk,
                    sink_frames=WIN.sink_frames, window_frames=WIN.window_frames, num_blocks=64, block_size=16,
                    dtype="f32")
    ids = list(range(len(STREAMS)))
    for sid in ids:
        vc.add_stream(sid)
    n, fc, held = CFG.chunk_tokens, toy.FlopCounter(), []
    frames = [np.zeros((s.frames, CFG.tokens_per_frame, CFG.channels), np.float32) for s in STREAMS]
    cid = np.repeat(np.arange(len(ids), dtype=np.int64), n)
    sig = list(CFG.sigmas) + [0.0]
    for _ in range(STREAMS[0].frames // CFG.frames_per_chunk):
        batch = vc.begin_chunk(ids)
        chunks = batch.chunks.tolist()
        pos, attend = batch.positions.reshape(-1, 3), chunk_attention(vc, batch)
        prompts = [STREAMS[s].prompt for s in ids]
        x = np.concatenate([toy.chunk_noise(CFG, STREAMS[s], c) for s, c in zip(ids, chunks)])
        for i in range(len(CFG.sigmas)):
            cond = toy.conditions(model, [sig[i]] * len(ids), prompts, fc)
            vel = toy.forward(model, x, cond, cid, pos, attend, fc, slice(0, len(x)))
            assert vel is not None
            x = x + np.float32(sig[i + 1] - sig[i]) * vel
        toy.forward(model, x, toy.conditions(model, [0.0] * len(ids), prompts, fc), cid, pos, attend, fc, None)
        vc.commit_chunk(ids)
        held.append(vc.stats()["blocks_used"])
        for j, (s, c) in enumerate(zip(ids, chunks)):
            f = slice(c * CFG.frames_per_chunk, (c + 1) * CFG.frames_per_chunk)
            frames[s][f] = x[j * n:(j + 1) * n].reshape(CFG.frames_per_chunk, CFG.tokens_per_frame, CFG.channels)
    for sid in ids:
        vc.release(sid)
    return frames, held, vc.pool.num_used_blocks


def run() -> Result:
    model = toy.make_model(CFG)
    frames, held, after = generate(model)
    ref = [toy.generate_recompute(model, s, WIN, toy.FlopCounter()) for s in STREAMS]
    err = max(float(np.abs(a - b).max()) for a, b in zip(frames, ref))
    return Result(frames, err, max(float(np.abs(r).max()) for r in ref), held, after)


if __name__ == "__main__":
    res = run()
    print(f"{len(STREAMS)} videos of {STREAMS[0].frames} frames generated "
          f"({WIN.sink_frames} sink frame, {WIN.window_frames}-frame window)")
    print(f"frames vs recompute: max |diff| {res.max_error:.2e} (scale {res.scale:.3f})")
    print(f"blocks held after each chunk: {res.blocks_held}")
    print(f"{res.blocks_after} blocks still used")
    raise SystemExit(0 if res.max_error <= 1e-5 * res.scale else 1)
