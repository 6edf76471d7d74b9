"""The video ledger: how many tokens, and how much KV, one generated video holds.

A video of ``duration_s`` seconds at ``fps`` frames/s is encoded by a VAE that compresses
time by ``temporal_compression`` and each spatial side by ``spatial_compression``; an
optional ``patch`` x ``patch`` patchification merges latent positions into one token. With
every latent position one token and the whole history cached, the KV cache holds
``latent_frames x tokens_per_latent_frame`` tokens of ``B_tok`` bytes each.

:func:`block_causal_mask` draws the attention pattern of chunked autoregressive video
models: bidirectional inside a chunk (a latent frame or a group of them), causal across
chunks.

:class:`VideoModel` is an autoregressive video generator as its KV cache sees it (layers, KV
heads, tokens per latent frame, chunks, denoising passes, sink and window frames);
:data:`VIDEO_MODELS` holds the video presets (the article's 720p example, Self-Forcing
and LongLive on Wan2.1-T2V-1.3B, a MAGI-1-like 24B model) and :meth:`VideoModel.kv_stream_bytes`
the KV one stream holds, full history or sinks + window, for a video length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from pykvpool._native import InvalidArgumentError
from pykvpool.checks import check_count, check_positive
from pykvpool.errors import lookup_preset
from pykvpool.planning.models import storage_dtype

__all__ = ["VIDEO_KV_8BIT", "VIDEO_MODELS", "VideoModel", "VideoSpec", "article_videos", "block_causal_mask",
           "video_model_preset"]

VIDEO_KV_8BIT = "fp8_e4m3"
"""The 8-bit KV dtype of the video plans (``pykvpool video``, the report's section 8): the
fp8 a :class:`pykvpool.video.VideoCache` stores, :class:`pykvpool.KvCache`'s ``fp8_e4m3``
(one fp32 scale per layer, K/V and KV head: none per token), so the plans count the bytes
the cache holds."""


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


@dataclass(frozen=True)
class VideoModel:
    """An autoregressive (chunk by chunk) video generator as its KV cache sees it.

    A stream generates latent frames of ``grid[0] x grid[1]`` tokens, ``frames_per_chunk`` at
    a time; each chunk takes ``denoising_steps`` passes plus one clean pass (``clean_pass``)
    that writes the chunk's final K/V. A query of chunk ``c`` sees its own chunk, the first
    ``sink_frames`` frames and the ``window_frames`` frames just before the chunk
    (``window_frames=None``: every earlier frame, full history). One latent frame is
    ``temporal_compression`` video frames at ``fps`` frames/s.

    Attributes:
        name: display name.
        num_layers, num_q_heads, num_kv_heads, head_dim: the attention shape (head_dim in
            elements).
        num_params: parameters of the generator (the DiT; text encoder and VAE excluded).
        grid: ``(h, w)`` tokens of one latent frame.
        fps: video frames per second.
        frames_per_chunk: latent frames generated together.
        denoising_steps: denoising passes per chunk.
        sink_frames, window_frames: the cache policy (see above), latent frames.
        clean_pass: one more pass per chunk writes the clean K/V (Self-Forcing's t=0 pass).
        temporal_compression: video frames per latent frame.
        weight_bytes_per_param: bytes per weight (2: bf16).
        text_tokens: cross-attention context (text encoder tokens) each query attends to.
        source: where the numbers come from.
        derived: names of the fields that are derived or unverified rather than read from a
            published config.

    Raises:
        InvalidArgumentError: a count < 1 (``sink_frames`` and ``text_tokens`` < 0, a
            ``window_frames`` that is neither None nor >= 0), or ``num_q_heads`` not a
            multiple of ``num_kv_heads``.
    """

    name: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: float
    grid: tuple[int, int]
    fps: int
    frames_per_chunk: int
    denoising_steps: int
    sink_frames: int = 0
    window_frames: int | None = None
    clean_pass: bool = True
    temporal_compression: int = 4
    weight_bytes_per_param: float = 2.0
    text_tokens: int = 0
    source: str = ""
    derived: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in ("num_layers", "num_q_heads", "num_kv_heads", "head_dim", "fps",
                  "frames_per_chunk", "denoising_steps", "temporal_compression"):
            check_count(getattr(self, f), f, 1)
        check_count(self.sink_frames, "sink_frames", 0)
        check_count(self.text_tokens, "text_tokens", 0)
        if self.window_frames is not None:
            check_count(self.window_frames, "window_frames", 0)
        check_count(self.grid[0], "grid[0]", 1)
        check_count(self.grid[1], "grid[1]", 1)
        check_positive(self.num_params, "num_params")
        check_positive(self.weight_bytes_per_param, "weight_bytes_per_param")
        if self.num_q_heads % self.num_kv_heads:
            raise InvalidArgumentError(
                f"num_q_heads ({self.num_q_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})")

    @property
    def tokens_per_frame(self) -> int:
        """Tokens of one latent frame: ``grid[0] x grid[1]``."""
        return self.grid[0] * self.grid[1]

    @property
    def chunk_tokens(self) -> int:
        """Tokens of one chunk: ``frames_per_chunk x tokens_per_frame``."""
        return self.frames_per_chunk * self.tokens_per_frame

    @property
    def passes_per_chunk(self) -> int:
        """Forward passes per chunk: the denoising steps, plus one clean pass."""
        return self.denoising_steps + int(self.clean_pass)

    @property
    def chunk_seconds(self) -> float:
        """Seconds of video one chunk holds: ``frames_per_chunk x temporal_compression / fps``
        (a causal VAE's first chunk holds 3 video frames fewer; ignored)."""
        return self.frames_per_chunk * self.temporal_compression / self.fps

    @property
    def windowed(self) -> bool:
        """True when the cache keeps sinks + a window, False for full history."""
        return self.window_frames is not None

    @property
    def weight_bytes(self) -> float:
        """Bytes of the weights: ``num_params x weight_bytes_per_param``."""
        return self.num_params * self.weight_bytes_per_param

    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        """KV bytes of one token over all layers: ``2 x layers x kv_heads x vector``, a vector
        of ``head_dim`` elements taking what :meth:`pykvpool.planning.models.StorageDtype.vector_bytes`
        says: for KvCache's formats the storage's own count (``head_dim x 2`` bytes in bf16,
        ``head_dim x 1`` in ``"fp8_e4m3"``, whose scales are per layer, ``head_dim x 1 + 4`` in
        ``"int8"``, one fp32 scale per token, layer, K/V and KV head), for the planning-only
        ``"fp8"`` ``head_dim x 1 + 4`` (vLLM's per-token scales).

        Raises:
            UnknownPresetError: ``dtype`` is not a storage dtype
                (:func:`pykvpool.planning.models.storage_dtype`).
            InvalidArgumentError: a malformed 8-bit granularity suffix.
        """
        return 2 * self.num_layers * self.num_kv_heads * storage_dtype(dtype).vector_bytes(self.head_dim)

    def variant(self, windowed: bool) -> VideoModel:
        """This preset with its sinks + window (``windowed``) or with full history (sinks and
        window dropped)."""
        if windowed:
            return self
        return replace(self, sink_frames=0, window_frames=None, name=f"{self.name}, full history")

    def with_window(self, window_frames: int | None, sink_frames: int | None = None) -> VideoModel:
        """This model with another window (latent frames before the chunk; None: full
        history) and, if given, other sinks.

        Raises:
            InvalidArgumentError: a negative or non-int ``window_frames`` or ``sink_frames``.
        """
        sinks = self.sink_frames if sink_frames is None else sink_frames
        return replace(self, window_frames=window_frames, sink_frames=sinks)

    def num_chunks(self, duration_s: float) -> int:
        """Chunks a video of ``duration_s`` seconds takes: ``ceil(round(duration_s x fps) /
        temporal_compression / frames_per_chunk)``.

        Raises:
            InvalidArgumentError: ``duration_s`` not a finite number > 0.
        """
        frames = round(check_positive(duration_s, "duration_s") * self.fps)
        return max(1, math.ceil(frames / (self.temporal_compression * self.frames_per_chunk)))

    def visible_frames(self, chunk: int) -> int:
        """Latent frames a query of chunk ``chunk`` (0-based) sees, its own chunk included:
        ``F + min(c F, sinks + window)`` (``F + c F`` with full history).

        Raises:
            InvalidArgumentError: ``chunk`` negative or not an int.
        """
        before = check_count(chunk, "chunk", 0) * self.frames_per_chunk
        if self.window_frames is not None:
            before = min(before, self.sink_frames + self.window_frames)
        return self.frames_per_chunk + before

    def stream_blocks(self, chunk: int, block_size: int) -> int:
        """Blocks of ``block_size`` tokens one stream holds while chunk ``chunk`` is generated,
        under the hybrid pool's release rule (a block is released when all its tokens lie
        after the sinks and before the window): the sink blocks plus the blocks from the
        window's first token to the chunk's end.

        Raises:
            InvalidArgumentError: ``chunk`` < 0 or ``block_size`` < 1.
        """
        bs = check_count(block_size, "block_size", 1)
        start = check_count(chunk, "chunk", 0) * self.chunk_tokens
        end_blocks = -(-(start + self.chunk_tokens) // bs)
        if self.window_frames is None:
            return end_blocks
        sink_blocks = -(-self.sink_frames * self.tokens_per_frame // bs)
        first = max(0, start - self.window_frames * self.tokens_per_frame) // bs
        return sink_blocks + max(0, end_blocks - max(first, sink_blocks))

    def peak_blocks(self, duration_s: float, block_size: int) -> int:
        """The most blocks one stream of ``duration_s`` seconds holds during any chunk.

        Full history: the last chunk. Sinks + window: pages shared by two frames make the
        count vary with the chunk's offset in its page, so the maximum is taken over every
        chunk up to one period of offsets (``block_size / gcd(chunk_tokens, block_size)``
        chunks) past the first chunk whose window lies wholly after the sink pages.

        Raises:
            InvalidArgumentError: ``duration_s`` not a finite number > 0, ``block_size`` < 1.
        """
        bs = check_count(block_size, "block_size", 1)
        n = self.num_chunks(duration_s)
        if self.window_frames is None:
            return self.stream_blocks(n - 1, bs)
        settled = -(-((self.sink_frames + self.window_frames) * self.tokens_per_frame + bs)
                    // self.chunk_tokens)
        last = min(n, settled + bs // math.gcd(self.chunk_tokens, bs) + 1)
        return max(self.stream_blocks(c, bs) for c in range(last))

    def kv_stream_bytes(self, duration_s: float, dtype: str = "bf16") -> float:
        """KV bytes one stream of ``duration_s`` seconds holds at its peak (its last chunk),
        unpaged: ``visible_frames(last chunk) x tokens_per_frame x kv_bytes_per_token``.

        Raises:
            InvalidArgumentError: ``duration_s`` not a finite number > 0; a malformed dtype.
            UnknownPresetError: an unknown dtype.
        """
        frames = self.visible_frames(self.num_chunks(duration_s) - 1)
        return float(frames * self.tokens_per_frame * self.kv_bytes_per_token(dtype))


def _wan(name: str, sink_frames: int, window_frames: int, source: str) -> VideoModel:
    """Wan2.1-T2V-1.3B: 30 layers, 12 heads x 128, 832x480 -> 52 x 30 tokens per latent
    frame, 16 fps, chunks of 3, 4 steps + a clean pass, 512 text tokens; "1.3B" is nominal."""
    return VideoModel(name, 30, 12, 12, 128, 1.3e9, (30, 52), 16, 3, 4,
                      sink_frames=sink_frames, window_frames=window_frames, text_tokens=512,
                      source=source, derived=("num_params",))


VIDEO_MODELS: dict[str, VideoModel] = {
    # The article's 720p example: Llama-3-8B's KV shape (32 layers, 8 KV heads x 128, 131,072
    # B/token bf16) on 1280x720 at 24 fps, 4x temporal and 8x8 spatial compression (160 x 90 =
    # 14,400 tokens per latent frame): 30 latent frames per 5 s, 52.73 GiB. The article builds
    # no generator: chunks, steps, sinks and window are assumptions (Self-Forcing's).
    "article-720p": VideoModel(
        "article 720p (Llama-3-8B KV)", 32, 32, 8, 128, 8.03e9, (90, 160), 24, 3, 4,
        sink_frames=3, window_frames=18, source="the article's ledger example",
        derived=("frames_per_chunk", "denoising_steps", "sink_frames", "window_frames")),
    # Self-Forcing (guandeh17/Self-Forcing, pipeline/causal_inference.py): Wan2.1-T2V-1.3B,
    # 832x480 -> 52 x 30 tokens, chunks of 3, 4 steps [1000, 750, 500, 250] + a clean pass,
    # a 32,760-token (21-frame) cache that rolls: the chunk plus 18 frames before it.
    "self-forcing": _wan("Self-Forcing (Wan2.1-1.3B)", 0, 18, "guandeh17/Self-Forcing @33593df"),
    # LongLive 1.0 (NVlabs/LongLive @a4a0c87, configs/longlive_inference.yaml: local_attn_size
    # 12, sink_size 3): the 12-frame attention span holds the 3 sinks, the chunk's 3 frames
    # and 6 frames before the chunk (wan/modules/causal_model.py: 12 x 1,560 tokens in all).
    "longlive": _wan("LongLive (Wan2.1-1.3B)", 3, 6, "NVlabs/LongLive @a4a0c87"),
    # MAGI-1 24B (SandAI-org/MAGI-1 @6ff822e, example/24B/24B_distill_config.json): 48 layers,
    # 48 query heads, 8 KV groups x 128, 720x1280, 24 fps, chunks of 6 latent frames, 16
    # steps (distilled). Tokens per frame assume an 8x VAE and 2x2 patches (45 x 80);
    # window = 5 chunks (noise2clean_kvrange's largest range); a clean pass per chunk.
    "magi-1-like": VideoModel(
        "MAGI-1-like 24B", 48, 48, 8, 128, 24e9, (45, 80), 24, 6, 16,
        sink_frames=0, window_frames=30, text_tokens=800,
        source="SandAI-org/MAGI-1 @6ff822e",
        derived=("grid", "window_frames", "clean_pass", "num_params")),
}
"""Video generator presets by lower-case name; see :func:`video_model_preset`."""


def video_model_preset(name: str) -> VideoModel:
    """Look up a video preset by name (case-insensitive), e.g. ``"longlive"``.

    Raises:
        UnknownPresetError: not one of :data:`VIDEO_MODELS`.
    """
    return lookup_preset("video model", VIDEO_MODELS, name)
