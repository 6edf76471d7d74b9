"""Autoregressive video generation on the pool: :class:`VideoCache`, the KV cache
of many video streams generated chunk by chunk (block-causal attention over sink frames, a
window of frames and the chunk; denoising steps overwrite the chunk's slots; committed
chunks free the frames that leave the window), and :class:`ChunkBatch`, one chunk of
several streams.

Layer 1 (next to ``planning``): it uses the compiled pool, cache and kernel
(``pykvpool._native``) and the argument checks, nothing above. The video *ledger*
(tokens and bytes per video, the mask picture) stays in :mod:`pykvpool.planning.video`.
"""

from pykvpool.video.batch import ChunkBatch, token_positions
from pykvpool.video.cache import VideoCache

__all__ = ["ChunkBatch", "VideoCache", "token_positions"]
