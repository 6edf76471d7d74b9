"""A small block-causal video transformer in numpy (float32), the model of the exactness proof.

The model (the shape of Wan2.1 / Self-Forcing, scaled down): latent frames of ``h x w``
tokens with ``channels`` values each, generated in chunks of ``frames_per_chunk`` frames;
``n_layer`` blocks of grouped-query self-attention (``n_q_head`` query heads, ``n_kv_head``
KV heads of dimension ``d_head``) and a GELU MLP, each conditioned adaLN-style (shift,
scale and gate from the condition: an MLP of the sinusoidal embedding of the noise level
plus the prompt's text vector); 3D RoPE on ``(t, h, w)``: the head dimension split into
three rotary sections as Wan does (``d - 4 (d // 6)`` for ``t``, ``2 (d // 6)`` each for
``h`` and ``w``). Weights are seeded Gaussians.

Sampling (flow matching, deterministic): a chunk starts from noise seeded by (model seed,
stream seed, chunk index) at ``sigma = 1``; at each noise level ``sigma_k`` of ``sigmas`` the
model predicts the velocity ``v`` and the Euler step ``x += (sigma_{k+1} - sigma_k) v``
moves it on (``sigma`` after the last level is 0: the clean chunk). Self-Forcing's
convention follows: one more pass at ``sigma = 0`` over the clean chunk writes its K/V, which
later chunks attend to.

Visibility (the block-causal mask with sinks and a window, in frames): a query of chunk
``c`` (frames ``cF .. (c+1)F``) sees its own chunk, the sink frames ``f < sink_frames`` and
the ``window_frames`` frames before ``cF`` (all earlier frames when the window is None).

This module holds the model, the forward shared by both routes (attention is a callback),
the dense masked attention and the **recompute** route; :mod:`pykvpool.video.toy_cached`
holds the cached route and :mod:`pykvpool.video.exact` the comparison and FLOP formulas.
Every matrix product goes through :class:`FlopCounter` (2 FLOPs per multiply-add, counted
from the operands' shapes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]

#: ``attend(layer, q [N, Hq, d], k [N, Hkv, d], v [N, Hkv, d]) -> [N, Hq, d]``.
Attend = Callable[[int, F32, F32, F32], F32]


@dataclass(frozen=True)
class VideoToyConfig:
    """Model and sampler sizes (tokens, frames, heads, elements)."""

    n_layer: int = 2
    n_q_head: int = 4
    n_kv_head: int = 2
    d_head: int = 16
    ffn_mult: int = 2
    channels: int = 16
    freq_dim: int = 32
    grid: tuple[int, int] = (8, 8)
    frames_per_chunk: int = 2
    sigmas: tuple[float, ...] = (1.0, 0.75, 0.5, 0.25)
    seed: int = 0

    @property
    def d_model(self) -> int:
        """Model width D = query heads x head dimension (elements).

        Raises:
            Nothing.
        """
        return self.n_q_head * self.d_head

    @property
    def d_kv(self) -> int:
        """K (or V) width = KV heads x head dimension (elements).

        Raises:
            Nothing.
        """
        return self.n_kv_head * self.d_head

    @property
    def d_ffn(self) -> int:
        """MLP width = ``ffn_mult`` x D (elements).

        Raises:
            Nothing.
        """
        return self.ffn_mult * self.d_model

    @property
    def tokens_per_frame(self) -> int:
        """Tokens of one latent frame, ``h * w``.

        Raises:
            Nothing.
        """
        return self.grid[0] * self.grid[1]

    @property
    def chunk_tokens(self) -> int:
        """Tokens of one chunk, ``frames_per_chunk * tokens_per_frame``.

        Raises:
            Nothing.
        """
        return self.frames_per_chunk * self.tokens_per_frame

    @property
    def rope_sections(self) -> tuple[int, int, int]:
        """Rotary dimensions of ``t``, ``h`` and ``w`` (Wan's split of the head dimension).

        Raises:
            Nothing.
        """
        s = self.d_head // 6
        return self.d_head - 4 * s, 2 * s, 2 * s


@dataclass(frozen=True)
class Window:
    """Which history a chunk sees: ``sink_frames`` first frames and ``window_frames`` frames
    before the chunk (None: every earlier frame; then the sinks do not matter)."""

    sink_frames: int = 0
    window_frames: int | None = None


@dataclass(frozen=True)
class Block:
    """One block's float32 weights: ``wq``/``wo`` ``[D, D]``, ``wk``/``wv`` ``[D, Dk]``, the MLP
    ``w1`` ``[D, Ff]`` / ``w2`` ``[Ff, D]`` and the adaLN modulation ``wmod`` ``[D, 6D]``
    with bias ``bmod`` ``[6D]`` (shift, scale, gate of attention, then of the MLP)."""

    wq: F32
    wk: F32
    wv: F32
    wo: F32
    w1: F32
    w2: F32
    wmod: F32
    bmod: F32


@dataclass(frozen=True)
class VideoModel:
    """The toy video transformer: config, blocks, patch embedding ``w_in`` ``[C, D]``, output
    ``w_out`` ``[D, C]`` with its modulation ``w_fmod`` ``[D, 2D]``, and the timestep MLP
    ``w_t1`` ``[E, D]``, ``w_t2`` ``[D, D]`` (float32)."""

    cfg: VideoToyConfig
    blocks: list[Block]
    w_in: F32
    w_out: F32
    w_fmod: F32
    w_t1: F32
    w_t2: F32


def make_model(cfg: VideoToyConfig) -> VideoModel:
    """Seeded Gaussian weights, standard deviation ``1/sqrt(fan_in)`` (the modulation a
    quarter of that, its gate bias 1, so every block contributes).

    Raises:
        ValueError: a negative size or seed in ``cfg`` (numpy).
    """
    rng = np.random.default_rng(cfg.seed)
    d, dk, ff, c, e = cfg.d_model, cfg.d_kv, cfg.d_ffn, cfg.channels, cfg.freq_dim

    def w(fan_in: int, fan_out: int, gain: float = 1.0) -> F32:
        x: F32 = (rng.standard_normal((fan_in, fan_out)) * (gain / np.sqrt(fan_in))).astype(np.float32)
        return x

    def bmod() -> F32:
        b = np.zeros(6 * d, np.float32)
        b[2 * d:3 * d] = 1.0
        b[5 * d:] = 1.0
        return b

    blocks = [Block(w(d, d), w(d, dk), w(d, dk), w(d, d), w(d, ff), w(ff, d), w(d, 6 * d, 0.25), bmod())
              for _ in range(cfg.n_layer)]
    return VideoModel(cfg, blocks, w(c, d), w(d, c), w(d, 2 * d, 0.25), w(e, d), w(d, d))


@dataclass
class FlopCounter:
    """Counts matmul FLOPs (2 per multiply-add) from the operands' shapes, as computed."""

    total: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, flops: int) -> None:
        """Add ``flops`` under ``kind`` (e.g. ``"proj"``, ``"attn"``).

        Raises:
            Nothing.
        """
        self.total += flops
        self.by_kind[kind] = self.by_kind.get(kind, 0) + flops

    def mm(self, a: F32, b: F32, kind: str = "proj") -> F32:
        """``a @ b`` for ``a`` ``[..., k]`` and ``b`` ``[k, n]``, counted.

        Raises:
            ValueError: shapes that do not multiply (numpy).
        """
        out: F32 = a @ b
        self.add(kind, 2 * int(np.prod(a.shape[:-1])) * a.shape[-1] * b.shape[-1])
        return out


def token_thw(frames: I64, cfg: VideoToyConfig) -> I64:
    """``(t, h, w)`` int64 ``[len(frames) * tpf, 3]`` of every token of the given frames.

    Raises:
        Nothing.
    """
    j = np.arange(cfg.tokens_per_frame, dtype=np.int64)
    t = np.repeat(np.asarray(frames, np.int64), cfg.tokens_per_frame)
    jj = np.tile(j, len(frames))
    return np.stack([t, jj // cfg.grid[1], jj % cfg.grid[1]], axis=1)


def rope_tables(cfg: VideoToyConfig, pos: I64) -> tuple[F32, F32]:
    """cos and sin ``[N, 1, d/2]`` of the 3D rotary angles of positions ``pos`` ``[N, 3]``.

    Raises:
        IndexError: ``pos`` not ``[N, 3]``.
    """
    parts = []
    for axis, dim in enumerate(cfg.rope_sections):
        inv = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        parts.append(pos[:, axis:axis + 1].astype(np.float64) * inv[None, :])
    ang = np.concatenate(parts, axis=1)[:, None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _rope(x: F32, cos: F32, sin: F32) -> F32:
    out = np.empty_like(x)
    xe, xo = x[..., 0::2], x[..., 1::2]
    out[..., 0::2] = xe * cos - xo * sin
    out[..., 1::2] = xe * sin + xo * cos
    return out


def _rms(x: F32) -> F32:
    out: F32 = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-6))
    return out


def _gelu(x: F32) -> F32:
    c = np.float32(np.sqrt(2 / np.pi))
    y = np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))
    out: F32 = y.astype(np.float32, copy=False)
    return out


def _silu(x: F32) -> F32:
    out: F32 = (x / (np.float32(1) + np.exp(-x))).astype(np.float32, copy=False)
    return out


def prompt_vector(model: VideoModel, prompt: int) -> F32:
    """The text condition of prompt id ``prompt``: a seeded Gaussian ``[D]``.

    Raises:
        ValueError: a negative prompt id (numpy seeding).
    """
    rng = np.random.default_rng([model.cfg.seed, 1, prompt])
    out: F32 = rng.standard_normal(model.cfg.d_model).astype(np.float32)
    return out


def conditions(model: VideoModel, sigmas: list[float], prompts: list[int], fc: FlopCounter) -> F32:
    """Condition vectors ``[K, D]``: the timestep MLP of the sinusoidal embedding of
    ``1000 sigma`` plus the prompt vector, for each ``(sigmas[i], prompts[i])``.

    Raises:
        ValueError: ``sigmas`` and ``prompts`` of different lengths, or a negative prompt id.
    """
    half = model.cfg.freq_dim // 2
    freqs = np.exp(-np.log(10000.0) * np.arange(half) / half)
    arg = 1000.0 * np.asarray(sigmas, np.float64)[:, None] * freqs[None, :]
    emb = np.concatenate([np.cos(arg), np.sin(arg)], axis=1).astype(np.float32)
    t = fc.mm(_silu(fc.mm(emb, model.w_t1)), model.w_t2)
    out: F32 = t + np.stack([prompt_vector(model, p) for p in prompts])
    return out


def forward(model: VideoModel, lat: F32, cond: F32, cid: I64, pos: I64, attend: Attend, fc: FlopCounter,
            head_rows: slice | None) -> F32 | None:
    """The transformer over ``N`` tokens: latents ``lat`` ``[N, C]``, token ``i`` conditioned
    by ``cond[cid[i]]`` and rotated by ``pos[i]`` ``(t, h, w)``; ``attend`` does each layer's
    attention. Returns the velocity ``[rows, C]`` of ``head_rows`` (None: no output head,
    the clean K/V pass).

    Raises:
        ValueError: arrays whose shapes do not match the model (numpy); and whatever ``attend`` raises.
    """
    cfg = model.cfg
    n = lat.shape[0]
    cos, sin = rope_tables(cfg, pos)
    cs = _silu(cond)
    x = fc.mm(lat, model.w_in)
    for layer, b in enumerate(model.blocks):
        sh1, sc1, g1, sh2, sc2, g2 = np.split((fc.mm(cs, b.wmod) + b.bmod)[cid], 6, axis=1)
        h = _rms(x) * (np.float32(1) + sc1) + sh1
        q = _rope(fc.mm(h, b.wq).reshape(n, cfg.n_q_head, cfg.d_head), cos, sin)
        k = _rope(fc.mm(h, b.wk).reshape(n, cfg.n_kv_head, cfg.d_head), cos, sin)
        v = fc.mm(h, b.wv).reshape(n, cfg.n_kv_head, cfg.d_head)
        o = attend(layer, q, k, v)
        x = x + g1 * fc.mm(o.reshape(n, cfg.d_model), b.wo)
        h = _rms(x) * (np.float32(1) + sc2) + sh2
        x = x + g2 * fc.mm(_gelu(fc.mm(h, b.w1)), b.w2)
    if head_rows is None:
        return None
    sh, sc = np.split(fc.mm(cs, model.w_fmod)[cid[head_rows]], 2, axis=1)
    out: F32 = fc.mm(_rms(x[head_rows]) * (np.float32(1) + sc) + sh, model.w_out)
    return out


def visible_mask(cfg: VideoToyConfig, win: Window, q_frames: I64, k_frames: I64) -> npt.NDArray[np.bool_]:
    """``[Nq, Nk]``: query frame ``q`` sees key frame ``k`` (same chunk or earlier; within the
    window before the query's chunk, or a sink).

    Raises:
        Nothing.
    """
    start = (q_frames // cfg.frames_per_chunk * cfg.frames_per_chunk)[:, None]
    kf = k_frames[None, :]
    seen = kf < start + cfg.frames_per_chunk
    if win.window_frames is not None:
        seen &= (kf >= start - win.window_frames) | (kf < win.sink_frames)
    out: npt.NDArray[np.bool_] = seen
    return out


def mask_bias(mask: npt.NDArray[np.bool_]) -> F32:
    """The additive form of a visibility mask: 0 where visible, ``-inf`` elsewhere.

    Raises:
        Nothing.
    """
    out: F32 = np.where(mask, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    return out


def dense_attention(cfg: VideoToyConfig, q: F32, k: F32, v: F32, bias: F32, fc: FlopCounter) -> F32:
    """Masked grouped attention, dense (the full ``Nq x Nk`` products, then the mask as the
    additive ``bias`` of :func:`mask_bias`): q ``[Nq, Hq, d]``, k/v ``[Nk, Hkv, d]`` ->
    ``[Nq, Hq, d]``; counts ``4 Hq d Nq Nk``. Every query must see a key.

    Raises:
        ValueError: arrays whose shapes do not match ``cfg`` (numpy).
    """
    nq, nk, g = q.shape[0], k.shape[0], cfg.n_q_head // cfg.n_kv_head
    fc.add("attn", 4 * cfg.n_q_head * cfg.d_head * nq * nk)
    hk, d = cfg.n_kv_head, cfg.d_head
    qg = np.ascontiguousarray(q.reshape(nq, hk, g, d).transpose(1, 2, 0, 3)).reshape(hk, g * nq, d)
    logits = (qg @ np.ascontiguousarray(k.transpose(1, 2, 0))).reshape(hk, g, nq, nk)
    logits *= np.float32(1 / np.sqrt(d))
    logits += bias
    logits -= logits.max(axis=-1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=-1, keepdims=True)
    o = logits.reshape(hk, g * nq, nk) @ np.ascontiguousarray(v.transpose(1, 0, 2))
    out: F32 = o.reshape(hk, g, nq, d).transpose(2, 0, 1, 3).reshape(nq, cfg.n_q_head, d)
    return out


@dataclass(frozen=True)
class StreamSpec:
    """One video: ``prompt`` id, noise ``seed``, ``frames`` to generate (a multiple of the
    chunk), the round at which it joins a batch (``start``, cached route only), and an
    optional prompt switch ``(chunk, new_prompt)`` (LongLive) before that chunk."""

    prompt: int
    seed: int
    frames: int
    start: int = 0
    switch: tuple[int, int] | None = None


def chunk_noise(cfg: VideoToyConfig, spec: StreamSpec, chunk: int) -> F32:
    """The chunk's starting noise ``[chunk_tokens, C]``, seeded by (model, stream, chunk).

    Raises:
        ValueError: a negative seed or chunk (numpy seeding).
    """
    rng = np.random.default_rng([cfg.seed, 2, spec.seed, chunk])
    out: F32 = rng.standard_normal((cfg.chunk_tokens, cfg.channels)).astype(np.float32)
    return out


def prompt_at(spec: StreamSpec, chunk: int) -> int:
    """The prompt in force for ``chunk``.

    Raises:
        Nothing.
    """
    return spec.switch[1] if spec.switch is not None and chunk >= spec.switch[0] else spec.prompt


def present_frames(cfg: VideoToyConfig, win: Window, spec: StreamSpec, chunk: int) -> list[int]:
    """The clean frames the recompute route runs before ``chunk``: every earlier frame; after
    a prompt switch at chunk ``s``, only those the cache keeps from then on (the sinks and
    the window visible at ``s``, then every frame since: the dependency chain of the cached
    route restarts at the rewritten window).

    Raises:
        Nothing.
    """
    end = chunk * cfg.frames_per_chunk
    if spec.switch is None or chunk < spec.switch[0] or win.window_frames is None:
        return list(range(end))
    base = max(0, spec.switch[0] * cfg.frames_per_chunk - win.window_frames)
    return sorted(set(range(min(win.sink_frames, base))) | set(range(base, end)))


def visible_frames(cfg: VideoToyConfig, win: Window, chunk: int) -> list[int]:
    """The earlier frames ``chunk``'s queries see: the sinks and the window (all without one).

    Raises:
        Nothing.
    """
    end = chunk * cfg.frames_per_chunk
    if win.window_frames is None:
        return list(range(end))
    return sorted(set(range(min(win.sink_frames, end))) | set(range(max(0, end - win.window_frames), end)))


def generate_recompute(model: VideoModel, spec: StreamSpec, win: Window, fc: FlopCounter, *,
                       only_visible: bool = False) -> F32:
    """The recompute route for one stream: at every denoising step, the whole sequence of
    :func:`present_frames` (clean latents at ``sigma = 0``) plus the noisy chunk runs
    through the model with the block-causal mask of :func:`visible_mask`; no cache.
    Returns the clean frames ``[frames, tpf, C]``. ``only_visible=True`` keeps only the
    frames the chunk sees (:func:`visible_frames`): not what the cache computes once a
    window evicted frames (the window frames lose their own history), for the tests.

    Raises:
        ValueError: ``spec.frames`` not a multiple of ``frames_per_chunk``.
    """
    cfg = model.cfg
    fpc, tpf, n = cfg.frames_per_chunk, cfg.tokens_per_frame, cfg.chunk_tokens
    if spec.frames % fpc:
        raise ValueError(f"frames must be a multiple of {fpc}, got {spec.frames}")
    clean = np.zeros((spec.frames, tpf, cfg.channels), np.float32)
    sig = list(cfg.sigmas) + [0.0]
    for c in range(spec.frames // fpc):
        hist = np.asarray(visible_frames(cfg, win, c) if only_visible else present_frames(cfg, win, spec, c),
                          np.int64)
        frames = np.concatenate([hist, np.arange(c * fpc, (c + 1) * fpc)]).astype(np.int64)
        kf = np.repeat(frames, tpf)
        bias = mask_bias(visible_mask(cfg, win, kf, kf))
        pos = token_thw(frames, cfg)
        h_tok = len(hist) * tpf
        prompt = prompt_at(spec, c)

        def attend(layer: int, q: F32, k: F32, v: F32) -> F32:
            return dense_attention(cfg, q, k, v, bias, fc)

        x = chunk_noise(cfg, spec, c)
        for i in range(len(cfg.sigmas)):
            sigmas, cid = ([sig[i]], np.zeros(n, np.int64)) if h_tok == 0 else \
                ([0.0, sig[i]], np.repeat(np.arange(2, dtype=np.int64), [h_tok, n]))
            cond = conditions(model, sigmas, [prompt] * len(sigmas), fc)
            lat = np.concatenate([clean[hist].reshape(h_tok, cfg.channels), x])
            vel = forward(model, lat, cond, cid, pos, attend, fc, slice(h_tok, h_tok + n))
            assert vel is not None
            x = x + np.float32(sig[i + 1] - sig[i]) * vel
        clean[c * fpc:(c + 1) * fpc] = x.reshape(fpc, tpf, cfg.channels)
    return clean
