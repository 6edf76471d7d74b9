"""The video ledger: how many tokens, and how much KV, one generated video holds.

A video of ``duration_s`` seconds at ``fps`` frames/s is encoded by a VAE that compresses
time by ``temporal_compression`` and each spatial side by ``spatial_compression``; an
optional ``patch`` x ``patch`` patchification merges latent positions into one token. With
every latent position one token and the whole history cached, the KV cache holds
``latent_frames x tokens_per_latent_frame`` tokens of ``B_tok`` bytes each.

:func:`block_causal_mask` draws the attention pattern of chunked autoregressive video
models: bidirectional inside a chunk (a latent frame or a group of them), causal across
chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pykvpool._native import InvalidArgumentError

__all__ = ["VideoSpec", "article_videos", "block_causal_mask"]


@dataclass(frozen=True)
class VideoSpec:
    """One video's geometry and its VAE / patch compression.

    Attributes:
        name: display name.
        duration_s: seconds.
        fps: frames per second.
        width, height: pixels.
        temporal_compression: frames per latent frame.
        spatial_compression: pixels per latent position along each side.
        patch: latent positions per token along each side (1 = no patchification).
        causal_first_frame: the causal-VAE convention (first frame alone, then groups of
            ``temporal_compression``): ``1 + (frames - 1) // t`` latent frames instead of
            ``frames // t``.

    Raises:
        InvalidArgumentError: a size < 1 or a side not divisible by its compression.
    """

    name: str
    duration_s: float
    fps: int
    width: int
    height: int
    temporal_compression: int = 4
    spatial_compression: int = 8
    patch: int = 1
    causal_first_frame: bool = False

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise InvalidArgumentError(f"duration must be > 0 s, got {self.duration_s}")
        for f in ("fps", "width", "height", "temporal_compression", "spatial_compression", "patch"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"{f} must be an integer >= 1, got {v!r}")
        step = self.spatial_compression * self.patch
        if self.width % step or self.height % step:
            raise InvalidArgumentError(
                f"{self.width}x{self.height} is not divisible by spatial compression x patch = {step}"
            )
        if self.frames < 1:
            raise InvalidArgumentError("the video has no frame")

    @property
    def frames(self) -> int:
        """Pixel frames: ``round(duration_s x fps)``."""
        return int(round(self.duration_s * self.fps))

    @property
    def latent_frames(self) -> int:
        """Latent frames after temporal compression."""
        t = self.temporal_compression
        return 1 + (self.frames - 1) // t if self.causal_first_frame else self.frames // t

    @property
    def tokens_per_latent_frame(self) -> int:
        """Tokens per latent frame: ``(W / s / patch) x (H / s / patch)``."""
        step = self.spatial_compression * self.patch
        return (self.width // step) * (self.height // step)

    @property
    def tokens(self) -> int:
        """Tokens of the whole video."""
        return self.latent_frames * self.tokens_per_latent_frame

    def kv_bytes(self, bytes_per_token: int) -> float:
        """KV bytes of the whole video with ``bytes_per_token`` bytes per token."""
        return float(self.tokens) * bytes_per_token


def article_videos() -> list[VideoSpec]:
    """The article's 720p, 24 fps, 4x temporal, 8x8 spatial videos of 5, 10 and 30 s."""
    return [VideoSpec(f"{s} s 720p", s, 24, 1280, 720) for s in (5, 10, 30)]


def block_causal_mask(num_chunks: int, tokens_per_chunk: int) -> npt.NDArray[np.bool_]:
    """Boolean ``[n, n]`` mask (``n = num_chunks x tokens_per_chunk``), True where query
    row i may attend to key column j: j's chunk is i's chunk or an earlier one.

    Raises:
        InvalidArgumentError: a size < 1.
    """
    if num_chunks < 1 or tokens_per_chunk < 1:
        raise InvalidArgumentError("num_chunks and tokens_per_chunk must be >= 1")
    chunk = np.arange(num_chunks * tokens_per_chunk) // tokens_per_chunk
    return chunk[None, :] <= chunk[:, None]
