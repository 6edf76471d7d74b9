"""End-to-end check of the cache path on a small decoder-only transformer (numpy, fp32).

The model (4 layers, 8 query / 2 KV heads of dimension 32, model width 256, ReLU MLP of
width 1024, vocabulary 32, no positional encoding, seeded Gaussian weights) generates 192
tokens greedily after a 16-token prompt, two ways:

- **recompute**: every step runs the full causal forward over the whole prefix and keeps
  the last position's logits (no cache at all);
- **cached**: the prefill writes each layer's prompt K/V into a :class:`pykvpool.KvCache`
  through the slots of :meth:`pykvpool.BlockPool.add_sequence` and attends over it with
  :func:`pykvpool.prefill_attention` (causal; no numpy attention on this route); each
  later step gets its slot and table from :meth:`pykvpool.BlockPool.step`, stores the new
  token's K/V with :meth:`KvCache.write` and attends with :func:`pykvpool.decode_attention`.

Both must give the same tokens, and the cached route's last logits must match a fresh
full forward over the same tokens within ``1e-5 * max(max|logit|, 1)``.

FLOP counting rule (matrix products only, 2 FLOP per multiply-add, as the implementation
actually computes them):

- ``per_layer = 2 * (D*D + D*Dk + D*Dk + D*D + D*F + F*D)`` per token for the
  projections Wq, Wk, Wv, Wo, W1, W2 (``D = n_q * d``, ``Dk = n_kv * d``, ``F = 4 D``);
- a full forward over ``S`` tokens: ``L * S * per_layer + 2 * D * vocab`` (the output
  head only at the last position) ``+ L * 4 * n_q * d * S^2`` (dense ``QK^T`` and
  ``PV``: the causal mask is applied after the full ``S x S`` product, so the upper
  triangle is computed too);
- a decode step at context ``S`` (new token included): ``L * per_layer + 2 * D * vocab
  + L * 4 * n_q * d * S``;
- recompute total: ``sum(full(P + t) for t in 0..G-1)``; cached total:
  ``full(P) + sum(step(P + t) for t in 1..G-1)`` (no decode after the last token).

With P = 16, G = 192 this gives 1.3005e11 vs 1.2314e9 FLOPs, 105.61x.

Run ``python -m pykvpool.toy_decoder`` for the figures and the measured wall-clock speedup.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Callable, Literal, TypedDict, TypeVar

import numpy as np
import numpy.typing as npt

from pykvpool._native import BlockPool, InvalidArgumentError, KvCache, decode_attention, prefill_attention

F32 = npt.NDArray[np.float32]
_T = TypeVar("_T")


@dataclass(frozen=True)
class ToyConfig:
    """Model and run sizes (tokens, heads, dimensions)."""

    n_layer: int = 4
    n_q_head: int = 8
    n_kv_head: int = 2
    d_head: int = 32
    ffn_mult: int = 4
    vocab: int = 32
    prompt: int = 16
    gen: int = 192
    block_size: int = 16
    seed: int = 0

    @property
    def d_model(self) -> int:
        """Model width D = query heads x head dimension (elements)."""
        return self.n_q_head * self.d_head

    @property
    def d_kv(self) -> int:
        """K (or V) width Dk = KV heads x head dimension (elements)."""
        return self.n_kv_head * self.d_head

    @property
    def d_ffn(self) -> int:
        """MLP width F = ``ffn_mult`` x D (elements)."""
        return self.ffn_mult * self.d_model


@dataclass(frozen=True)
class Layer:
    """One decoder layer's float32 weights: the projections ``wq`` ``[D, D]``, ``wk`` and
    ``wv`` ``[D, Dk]``, ``wo`` ``[D, D]``, and the MLP ``w1`` ``[D, F]``, ``w2`` ``[F, D]``."""

    wq: F32
    wk: F32
    wv: F32
    wo: F32
    w1: F32
    w2: F32


@dataclass(frozen=True)
class Model:
    """The toy decoder: its config, layers, token embedding ``[vocab, D]`` and output head
    ``[D, vocab]`` (float32)."""

    cfg: ToyConfig
    layers: list[Layer]
    embed: F32  # [vocab, D]
    head: F32  # [D, vocab]


def make_model(cfg: ToyConfig) -> Model:
    """Seeded Gaussian weights with standard deviation ``1/sqrt(D)``.

    Raises:
        ValueError: a negative size or seed in ``cfg`` (numpy).
    """
    rng = np.random.default_rng(cfg.seed)
    d, dk, f = cfg.d_model, cfg.d_kv, cfg.d_ffn

    def w(*shape: int) -> F32:
        x: F32 = (rng.standard_normal(shape) / np.sqrt(d)).astype(np.float32)
        return x

    layers = [Layer(w(d, d), w(d, dk), w(d, dk), w(d, d), w(d, f), w(f, d)) for _ in range(cfg.n_layer)]
    return Model(cfg, layers, w(cfg.vocab, d), w(d, cfg.vocab))


def _rmsnorm(x: F32) -> F32:
    out: F32 = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-6))
    return out


def _mlp(lay: Layer, x: F32) -> F32:
    out: F32 = x + np.maximum(_rmsnorm(x) @ lay.w1, np.float32(0)) @ lay.w2
    return out


def _causal_attention(cfg: ToyConfig, q: F32, k: F32, v: F32) -> F32:
    """Dense grouped causal attention: q [S, Hq, d], k/v [S, Hkv, d] -> [S, Hq * d]."""
    s, g = q.shape[0], cfg.n_q_head // cfg.n_kv_head
    qg = q.reshape(s, cfg.n_kv_head, g, cfg.d_head)
    logits = np.einsum("ihgd,jhd->hgij", qg, k) * np.float32(1 / np.sqrt(cfg.d_head))
    logits = np.where(np.tril(np.ones((s, s), dtype=bool)), logits, np.float32(-np.inf))
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out: F32 = np.einsum("hgij,jhd->ihgd", p, v).reshape(s, cfg.d_model)
    return out


def forward(model: Model, tokens: list[int], kv_out: list[tuple[F32, F32]] | None = None) -> F32:
    """Full causal forward; returns the last position's logits ``[vocab]``. When
    ``kv_out`` is given, each layer's K and V (``[S, Hkv, d]``) are appended to it.

    Raises:
        IndexError: a token id >= ``vocab``, or no token at all.
    """
    cfg = model.cfg
    x: F32 = model.embed[np.asarray(tokens)]
    s = len(tokens)
    for lay in model.layers:
        h = _rmsnorm(x)
        q = (h @ lay.wq).reshape(s, cfg.n_q_head, cfg.d_head)
        k = (h @ lay.wk).reshape(s, cfg.n_kv_head, cfg.d_head)
        v = (h @ lay.wv).reshape(s, cfg.n_kv_head, cfg.d_head)
        if kv_out is not None:
            kv_out.append((k, v))
        x = _mlp(lay, x + _causal_attention(cfg, q, k, v) @ lay.wo)
    logits: F32 = x[-1] @ model.head
    return logits


def generate_recompute(model: Model, prompt: list[int]) -> tuple[list[int], F32]:
    """Greedy generation re-running the full forward each step: (tokens, last logits).

    Raises:
        IndexError: a prompt token >= ``vocab``, or an empty prompt.
    """
    seq, out = list(prompt), []
    logits = np.zeros(model.cfg.vocab, np.float32)
    for _ in range(model.cfg.gen):
        logits = forward(model, seq)
        out.append(int(np.argmax(logits)))
        seq.append(out[-1])
    return out, logits


class DecodeSwitches(TypedDict, total=False):
    """The precision keywords of :func:`pykvpool.decode_attention` (``"f32"`` by default)."""

    q_dtype: Literal["f32", "bf16", "f16", "int8"]
    pv_dtype: Literal["f32", "bf16", "f16", "int8"]


def generate_cached(model: Model, prompt: list[int], dtype: str = "f32", *,
                    decode_options: DecodeSwitches | None = None) -> tuple[list[int], F32]:
    """Greedy generation through pykvpool: prefill into the cache, then one
    ``step -> write -> decode_attention`` per layer per token, in a ``dtype`` cache
    (any :class:`pykvpool.KvCache` dtype: ``"f32"``, ``"f16"``, ``"bf16"``, ``"int8"``,
    ``"fp8_e4m3"``, ``"fp8_e5m2"``). ``decode_options``: keywords passed to every
    :func:`pykvpool.decode_attention` call, e.g. ``{"q_dtype": "int8"}`` on an int8
    cache (None: the exact path).

    Raises:
        IndexError: a prompt token >= ``vocab``, or an empty prompt.
        InvalidArgumentError: an unknown ``dtype``, sizes the pool or cache refuse, or a
            precision the cache's dtype refuses.
        TypeError: a ``decode_options`` key :func:`pykvpool.decode_attention` does not take.
    """
    out, logits = _run_cached(model, prompt, dtype, None, decode_options or {})
    return out, logits[-1]


def cached_logits(model: Model, prompt: list[int], tokens: list[int], dtype: str = "f32", *,
                  decode_options: DecodeSwitches | None = None) -> F32:
    """Teacher-forced logits through a ``dtype`` cache: the logits after the prompt and
    after each of ``tokens[:-1]`` fed in turn (whatever the model would have chosen), so
    two dtypes (or decode options, as for :func:`generate_cached`) can be compared step by
    step on the same sequence.

    Returns:
        float32 ``[len(tokens), vocab]``.

    Raises:
        IndexError: a token >= ``vocab``, or an empty prompt.
        InvalidArgumentError: an unknown ``dtype``, more than ``cfg.gen`` tokens, sizes
            the pool or cache refuse, or a decode option the cache's dtype refuses.
        TypeError: a ``decode_options`` key :func:`pykvpool.decode_attention` does not take.
    """
    if not 1 <= len(tokens) <= model.cfg.gen:
        raise InvalidArgumentError(f"tokens must hold 1..{model.cfg.gen} tokens, got {len(tokens)}")
    return _run_cached(model, prompt, dtype, tokens, decode_options or {})[1]


def _run_cached(model: Model, prompt: list[int], dtype: str, forced: list[int] | None,
                opts: DecodeSwitches) -> tuple[list[int], F32]:
    """The cached route: greedy, or fed ``forced``; returns the tokens and every step's
    logits ``[steps, vocab]``."""
    cfg = model.cfg
    total = cfg.prompt + cfg.gen
    blocks = -(-total // cfg.block_size)
    pool = BlockPool(blocks, cfg.block_size)
    cache = KvCache(cfg.n_layer, blocks, cfg.block_size, cfg.n_kv_head, cfg.d_head, dtype)
    logits = _prefill_cached(model, prompt, pool, cache)
    steps = [logits]
    n = cfg.gen if forced is None else len(forced)
    out = [int(np.argmax(logits)) if forced is None else forced[0]]
    while len(out) < n:
        slots, cow, seq_lens = pool.step([0])
        cache.copy_blocks(cow)
        tables = pool.block_tables([0])
        x: F32 = model.embed[out[-1]][None, :]
        for layer, lay in enumerate(model.layers):
            h = _rmsnorm(x)
            q = (h @ lay.wq).reshape(1, cfg.n_q_head, cfg.d_head)
            cache.write(layer, (h @ lay.wk).reshape(1, cfg.n_kv_head, cfg.d_head),
                        (h @ lay.wv).reshape(1, cfg.n_kv_head, cfg.d_head), slots)
            o = decode_attention(cache, layer, q, tables, seq_lens, **opts)
            x = _mlp(lay, x + o.reshape(1, cfg.d_model) @ lay.wo)
        logits = x[0] @ model.head
        steps.append(logits)
        out.append(int(np.argmax(logits)) if forced is None else forced[len(out)])
    return out, np.stack(steps)


def _prefill_cached(model: Model, prompt: list[int], pool: BlockPool, cache: KvCache) -> F32:
    """The prompt's forward through the cache: per layer, write its K/V at the slots of a
    new sequence 0, then causal :func:`prefill_attention` over them; returns the last
    position's logits.

    Raises:
        IndexError: a prompt token >= ``vocab``, or an empty prompt.
    """
    cfg = model.cfg
    s = len(prompt)
    x: F32 = model.embed[np.asarray(prompt)]
    if s == 0:
        raise IndexError("empty prompt")
    slots = pool.add_sequence(0, s)
    tables = pool.block_tables([0])
    for layer, lay in enumerate(model.layers):
        h = _rmsnorm(x)
        q = (h @ lay.wq).reshape(s, cfg.n_q_head, cfg.d_head)
        cache.write(layer, (h @ lay.wk).reshape(s, cfg.n_kv_head, cfg.d_head),
                    (h @ lay.wv).reshape(s, cfg.n_kv_head, cfg.d_head), slots)
        o = prefill_attention(cache, layer, q, [0, s], tables, [s])
        x = _mlp(lay, x + o.reshape(s, cfg.d_model) @ lay.wo)
    logits: F32 = x[-1] @ model.head
    return logits


def flops_full(cfg: ToyConfig, s: int) -> int:
    """Matmul FLOPs of a full forward over ``s`` tokens (see the module doc); pure
    integer arithmetic."""
    return cfg.n_layer * s * _per_token(cfg) + 2 * cfg.d_model * cfg.vocab + cfg.n_layer * 4 * cfg.n_q_head * cfg.d_head * s * s


def flops_step(cfg: ToyConfig, s: int) -> int:
    """Matmul FLOPs of one decode step at context ``s`` tokens (new token included)."""
    return cfg.n_layer * _per_token(cfg) + 2 * cfg.d_model * cfg.vocab + cfg.n_layer * 4 * cfg.n_q_head * cfg.d_head * s


def _per_token(cfg: ToyConfig) -> int:
    d, dk, f = cfg.d_model, cfg.d_kv, cfg.d_ffn
    return 2 * (d * d + d * dk + d * dk + d * d + d * f + f * d)


def flops_recompute(cfg: ToyConfig) -> int:
    """Matmul FLOPs of the recompute route: a full forward per generated token."""
    return sum(flops_full(cfg, cfg.prompt + t) for t in range(cfg.gen))


def flops_cached(cfg: ToyConfig) -> int:
    """Matmul FLOPs of the cached route: one prefill forward, then one decode step per
    generated token but the first."""
    return flops_full(cfg, cfg.prompt) + sum(flops_step(cfg, cfg.prompt + t) for t in range(1, cfg.gen))


@dataclass(frozen=True)
class ToyResult:
    """What :func:`run` measured: tokens generated and how many agree, the last logits'
    largest difference and scale, FLOPs of both routes and their ratio, and wall-clock
    seconds of both routes and their ratio (``speedup``)."""

    gen: int
    same_tokens: int
    max_abs_diff: float
    logit_scale: float
    flops_recompute: int
    flops_cached: int
    flops_ratio: float
    seconds_recompute: float
    seconds_cached: float
    speedup: float


def _best_of(repeats: int, fn: Callable[[], _T]) -> tuple[_T, float]:
    best, out = float("inf"), None
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    assert out is not None
    return out, best


def run(cfg: ToyConfig | None = None, repeats: int = 1) -> ToyResult:
    """Both routes on the same seeded model and prompt; each timed as the best of
    ``repeats`` runs (wall clock, seconds; the machine may be shared).

    Raises:
        InvalidArgumentError: sizes in ``cfg`` the pool or cache refuse.
        ValueError: a negative size or seed in ``cfg`` (numpy).
    """
    cfg = cfg or ToyConfig()
    model = make_model(cfg)
    prompt = [int(t) for t in np.random.default_rng(cfg.seed + 1).integers(0, cfg.vocab, cfg.prompt)]
    (toks_c, logits_c), t_cached = _best_of(repeats, lambda: generate_cached(model, prompt))
    (toks_r, _), t_recompute = _best_of(repeats, lambda: generate_recompute(model, prompt))
    # The last logits were produced from every token but the last one generated.
    ref = forward(model, prompt + toks_c[:-1])
    return ToyResult(
        gen=cfg.gen,
        same_tokens=sum(a == b for a, b in zip(toks_c, toks_r)),
        max_abs_diff=float(np.abs(logits_c - ref).max()),
        logit_scale=float(np.abs(ref).max()),
        flops_recompute=flops_recompute(cfg),
        flops_cached=flops_cached(cfg),
        flops_ratio=flops_recompute(cfg) / flops_cached(cfg),
        seconds_recompute=t_recompute,
        seconds_cached=t_cached,
        speedup=t_recompute / t_cached,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m pykvpool.toy_decoder [--json] [--repeats N]``: run both routes and print
    the comparison. Returns 0 when the routes agree (same tokens, logits within tolerance),
    else 1.

    Raises:
        SystemExit: from argparse, for ``--help`` (status 0) or a usage error (status 2).
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--repeats", type=int, default=3, help="time each route as the best of N runs")
    args = ap.parse_args(argv)
    r = run(repeats=args.repeats)
    if args.json:
        print(json.dumps(asdict(r), indent=2))
        return 0
    print(f"tokens identical        : {r.same_tokens} / {r.gen}")
    print(f"last logits max |diff|  : {r.max_abs_diff:.3e} (scale {r.logit_scale:.4f}, "
          f"relative {r.max_abs_diff / max(r.logit_scale, 1e-30):.2e})")
    print(f"matmul FLOPs recompute  : {r.flops_recompute:.4e}")
    print(f"matmul FLOPs cached     : {r.flops_cached:.4e}")
    print(f"FLOP ratio              : {r.flops_ratio:.2f}x")
    print(f"wall clock recompute    : {r.seconds_recompute:.3f} s")
    print(f"wall clock cached       : {r.seconds_cached:.3f} s")
    print(f"measured speedup        : {r.speedup:.2f}x")
    ok = r.same_tokens == r.gen and r.max_abs_diff <= 1e-5 * max(r.logit_scale, 1.0)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
