"""Rooflines: the arithmetic intensity of decode and prefill, pykvpool's decode kernel
measured on this machine, and :class:`Roofline`, the simulator's step-time model (a preset
model on a preset device).

Units: FLOP, bytes, FLOP/byte, FLOP/s, bytes/s, seconds.

- Ideal fused decode attention (one query per sequence, each KV head read once for its g
  query heads): ``I = 4 n_q d S / (2 n_kv d S p) = 2 g / p``; S cancels.
- Prefill of S tokens (the article's coarse model): attention ``L x 2 x 2 n_q d S(S+1)/2``
  plus projections ``2 N S`` FLOPs over weights plus ``L x 10 S D p`` activation bytes.
- :func:`measure_decode_kernel` times ``pykvpool.decode_attention`` on a paged f32 cache for
  several g and reports the FLOP/s and bytes/s it reached, with the read bandwidth of that
  cache's own pages measured back to back with the kernel: the roof the kernel is compared
  with. With a :class:`SettleRule` the probes repeat until their best ``k`` agree
  (:func:`repeat_until_stable`), and each point keeps the :class:`Spread` of its probes.
- :func:`measure_prefill_kernel` times ``pykvpool.prefill_attention`` on the shapes of
  :data:`PREFILL_SHAPES` (text prefill, video chunk): FLOPs ``4 d Hq x visible (query,
  key) pairs``, counted exactly from the mask; bytes: K and V read once plus q and output.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pykvpool import _native
from pykvpool._native import BlockPool, InvalidArgumentError
from pykvpool.checks import check_count as _count, check_positive as _positive
from pykvpool.planning.hardware import Hardware, hardware_preset
from pykvpool.planning.models import ModelConfig, model_preset, storage_dtype

#: Bytes per activation element a tensor-parallel all-reduce moves (bf16).
ACTIVATION_BYTES = 2.0

__all__ = [
    "ACTIVATION_BYTES",
    "KernelPoint",
    "PREFILL_SHAPES",
    "PrefillPoint",
    "PrefillShape",
    "REPORT_PREFILL_SHAPES",
    "Roofline",
    "SettleRule",
    "Spread",
    "decode_intensity",
    "measure_decode_kernel",
    "measure_prefill_kernel",
    "prefill_intensity",
    "repeat_until_stable",
    "roofline",
]


@dataclass(frozen=True)
class SettleRule:
    """When a repeated measurement of a rate (higher is better: bytes/s, FLOP/s) has
    settled: its ``k`` best samples lie within ``rel_tol`` of the best one. A shared
    machine only ever slows a probe down, so the best samples are the machine's rate and
    their agreement says the load let it show ``k`` times.

    Attributes:
        k: best samples that must agree (>= 1).
        rel_tol: largest relative gap between the best and the k-th best sample (> 0).
        max_rounds: samples taken at most (>= k).
        max_seconds: wall time after which no new sample starts once ``k`` are taken (> 0).

    Raises:
        InvalidArgumentError: a field out of its range (the message names it).
    """

    k: int = 3
    rel_tol: float = 0.10
    max_rounds: int = 30
    max_seconds: float = 20.0

    def __post_init__(self) -> None:
        _count(self.k, "k", 1)
        _positive(self.rel_tol, "rel_tol")
        _count(self.max_rounds, "max_rounds", self.k)
        _positive(self.max_seconds, "max_seconds")


@dataclass(frozen=True)
class Spread:
    """Samples of one rate and how well their best ones agree.

    Attributes:
        samples: every sample, in the order taken.
        k: how many best samples :attr:`value` and :attr:`stable` consider.
        rel_tol: the agreement :attr:`stable` asks of them.
    """

    samples: tuple[float, ...]
    k: int
    rel_tol: float

    @property
    def best(self) -> tuple[float, ...]:
        """The ``k`` largest samples, largest first (fewer while fewer were taken)."""
        return tuple(sorted(self.samples, reverse=True)[: self.k])

    @property
    def value(self) -> float:
        """The median of :attr:`best`: the rate reported (NaN without samples)."""
        return float(np.median(self.best)) if self.samples else math.nan

    @property
    def agreement(self) -> float:
        """Relative gap between the best and the k-th best sample (NaN under ``k``)."""
        b = self.best
        return (b[0] - b[-1]) / b[0] if len(b) == self.k and b[0] > 0 else math.nan

    @property
    def stable(self) -> bool:
        """The best ``k`` samples agree within ``rel_tol``."""
        return bool(self.agreement <= self.rel_tol)

    @property
    def low(self) -> float:
        """The smallest sample.

        Raises:
            ValueError: no samples.
        """
        return min(self.samples)

    @property
    def high(self) -> float:
        """The largest sample.

        Raises:
            ValueError: no samples.
        """
        return max(self.samples)

    @classmethod
    def pooled(cls, spreads: Sequence[Spread]) -> Spread:
        """Every sample of ``spreads`` as one spread (the first one's ``k`` and ``rel_tol``).

        Raises:
            InvalidArgumentError: ``spreads`` is empty.
        """
        if not spreads:
            raise InvalidArgumentError("spreads must not be empty")
        return cls(tuple(v for s in spreads for v in s.samples), spreads[0].k, spreads[0].rel_tol)


def repeat_until_stable(measure: Callable[[], float], rule: SettleRule = SettleRule(),
                        min_rounds: int = 1,
                        clock: Callable[[], float] = time.monotonic) -> Spread:
    """Call ``measure`` (one sample of a rate) until ``rule`` says the samples settled:
    at least ``max(min_rounds, rule.k)`` samples, then stop as soon as the best ``k``
    agree within ``rule.rel_tol``, or after ``rule.max_rounds`` samples, or once
    ``rule.max_seconds`` of ``clock`` (seconds) have passed. An unsettled result says so
    (:attr:`Spread.stable` False) instead of waiting longer.

    Raises:
        InvalidArgumentError: ``min_rounds`` < 1 or > ``rule.max_rounds``.
    """
    _count(min_rounds, "min_rounds", 1)
    if min_rounds > rule.max_rounds:
        raise InvalidArgumentError(f"min_rounds must be <= max_rounds ({rule.max_rounds}), got {min_rounds}")
    floor = max(min_rounds, rule.k)
    t0 = clock()
    samples: list[float] = []
    while True:
        samples.append(float(measure()))
        s = Spread(tuple(samples), rule.k, rule.rel_tol)
        if len(samples) >= floor and (s.stable or clock() - t0 >= rule.max_seconds):
            return s
        if len(samples) >= rule.max_rounds:
            return s


def decode_intensity(group_size: float, element_bytes: float) -> float:
    """``2 g / p`` FLOP/byte of ideal fused decode attention.

    Raises:
        InvalidArgumentError: a non-positive argument.
    """
    if group_size <= 0 or element_bytes <= 0:
        raise InvalidArgumentError("group_size and element_bytes must be > 0")
    return 2.0 * group_size / element_bytes


def prefill_intensity(model: ModelConfig, seq_len: int, element_bytes: float = 2.0) -> float:
    """The article's coarse prefill intensity for ``seq_len`` tokens, FLOP/byte:
    (causal attention + ``2 N S`` projection FLOPs) / (weights + ``L x 10 S D p`` bytes),
    with ``D = n_q x d``.

    Raises:
        InvalidArgumentError: seq_len < 1.
    """
    if seq_len < 1:
        raise InvalidArgumentError(f"seq_len must be >= 1, got {seq_len}")
    m = model
    hidden = m.num_q_heads * m.head_dim
    attn = m.num_layers * 2 * (2 * m.num_q_heads * m.head_dim * seq_len * (seq_len + 1) / 2)
    proj = 2 * m.num_params * seq_len
    moved = m.num_params * element_bytes + m.num_layers * 10 * seq_len * hidden * element_bytes
    return (attn + proj) / moved


@dataclass(frozen=True)
class KernelPoint:
    """One measured decode-attention configuration.

    Attributes:
        group_size: g = query heads per KV head.
        batch: sequences per call.
        seq_len: cached tokens per sequence.
        flops: FLOPs of one call (``4 x n_q x d x S x batch``).
        bytes_moved: K and V read once plus q and output, bytes.
        seconds: best time of one call.
        roof_bandwidth: read bandwidth of the kernel's own cache pages
            (``pykvpool.read_bandwidth(cache=...)``), measured back to back with the
            kernel calls, bytes/s: the best of the same repeats, or with a
            :class:`SettleRule` the median of the best ``k`` (:attr:`Spread.value`); NaN
            when not measured.
        roof: every probe of that bandwidth (bytes/s) when measured under a
            :class:`SettleRule`, else None.
    """

    group_size: int
    batch: int
    seq_len: int
    num_kv_heads: int
    head_dim: int
    flops: float
    bytes_moved: float
    seconds: float
    roof_bandwidth: float = math.nan
    roof: Spread | None = None

    @property
    def intensity(self) -> float:
        """FLOP/byte of the call."""
        return self.flops / self.bytes_moved

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s."""
        return self.flops / self.seconds

    @property
    def bytes_per_s(self) -> float:
        """Achieved bytes/s."""
        return self.bytes_moved / self.seconds

    @property
    def fraction_of_roof(self) -> float:
        """Achieved bytes/s over :attr:`roof_bandwidth` (NaN when not measured; above 1
        means the kernel read faster than the probe did)."""
        return self.bytes_per_s / self.roof_bandwidth


def measure_decode_kernel(
    groups: Sequence[int] = (1, 4, 8),
    batch: int = 8,
    seq_len: int = 4096,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 16,
    repeats: int = 5,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    bandwidth_passes: int = 2,
    settle: SettleRule | None = None,
) -> list[KernelPoint]:
    """Time ``pykvpool.decode_attention`` (f32 paged cache) for each g in ``groups``.

    The cache is filled through a real :class:`BlockPool` (slot mapping, block tables); the
    best of ``repeats`` calls is kept, after one warm-up call. The defaults read 256 MiB of
    K and V per call, 8x a 32 MiB last-level cache, so the figure is a DRAM figure.

    Each timed call is followed by ``pykvpool.read_bandwidth(cache=the same cache,
    passes=bandwidth_passes)``: the bandwidth of the very pages the kernel reads, taken
    back to back with it (the best of the ``repeats`` probes is the point's
    ``roof_bandwidth``). A roof measured on other memory, or at another moment of a
    shared machine, is not the kernel's ceiling. With ``settle``, the (kernel call, probe)
    rounds go on past ``repeats`` until the best probes agree (:func:`repeat_until_stable`):
    the point's ``roof`` keeps every probe and ``roof_bandwidth`` is their settled value.

    Raises:
        InvalidArgumentError: a size < 1 (the message names it), or ``groups`` empty.
    """
    sizes = {"batch": batch, "seq_len": seq_len, "num_kv_heads": num_kv_heads,
             "head_dim": head_dim, "block_size": block_size, "repeats": repeats,
             "bandwidth_passes": bandwidth_passes}
    for name, value in sizes.items():
        if value < 1:
            raise InvalidArgumentError(f"{name} must be >= 1, got {value}")
    if not groups:
        raise InvalidArgumentError("groups must not be empty")
    rng = np.random.default_rng(seed)
    blocks_per_seq = -(-seq_len // block_size)
    num_blocks = batch * blocks_per_seq
    pool = BlockPool(num_blocks, block_size)
    cache = _native.KvCache(1, num_blocks, block_size, num_kv_heads, head_dim, dtype="f32")
    # Values do not change the timing: one K and one V for every sequence.
    k = rng.standard_normal((seq_len, num_kv_heads, head_dim), dtype=np.float32)
    v = rng.standard_normal((seq_len, num_kv_heads, head_dim), dtype=np.float32)
    for i in range(batch):
        slots = pool.add_sequence(i, seq_len)
        cache.write(0, k, v, slots)
    ids = np.arange(batch)
    tables = pool.block_tables(ids)
    lens = np.full(batch, seq_len, dtype=np.int32)
    points = []
    for j, g in enumerate(groups):
        n_q = g * num_kv_heads
        q = rng.standard_normal((batch, n_q, head_dim), dtype=np.float32)
        _native.decode_attention(cache, 0, q, tables, lens)
        times: list[float] = []

        def call_then_probe() -> float:
            t0 = time.perf_counter()
            _native.decode_attention(cache, 0, q, tables, lens)  # noqa: B023 (called in this loop)
            times.append(time.perf_counter() - t0)
            return float(_native.read_bandwidth(cache=cache, passes=bandwidth_passes))

        if settle is None:
            spread = None
            roof = max(call_then_probe() for _ in range(repeats))
        else:
            spread = repeat_until_stable(call_then_probe, settle, min_rounds=min(repeats, settle.max_rounds))
            roof = spread.value
        flops = 4.0 * n_q * head_dim * seq_len * batch
        moved = 2.0 * num_kv_heads * head_dim * seq_len * batch * 4 + 2.0 * q.nbytes
        points.append(KernelPoint(g, batch, seq_len, num_kv_heads, head_dim, flops, moved,
                                  max(min(times), 1e-9), roof, spread))
        if progress is not None:
            progress(j + 1, len(groups))
    return points


@dataclass(frozen=True)
class PrefillShape:
    """One multi-query attention shape: ``batch`` sequences, each with ``new_tokens`` query
    rows at the last positions of ``cached_tokens + new_tokens`` keys (tokens), f32.

    Attributes:
        name: the label of the figure and the table.
        batch: sequences per call.
        cached_tokens: keys before the new ones, tokens per sequence.
        new_tokens: query rows (and their keys) per sequence, tokens.
        num_q_heads, num_kv_heads, head_dim: the attention heads and their width.
        chunk_size: tokens per chunk of the block-causal mask; None: token-causal.
    """

    name: str
    batch: int
    cached_tokens: int
    new_tokens: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    chunk_size: int | None = None

    @property
    def seq_len(self) -> int:
        """Keys per sequence, tokens (cached plus new)."""
        return self.cached_tokens + self.new_tokens

    def visible_pairs(self) -> int:
        """Visible (query, key) pairs of one sequence and one query head under the mask:
        ``sum(p + 1)`` causal, ``sum(min((p // c + 1) c, seq_len))`` block-causal, over
        the query positions ``p``.

        Raises:
            InvalidArgumentError: a size < 1 or a chunk_size < 1 (named).
        """
        self._check()
        pos = np.arange(self.cached_tokens, self.seq_len, dtype=np.int64)
        if self.chunk_size is None:
            return int((pos + 1).sum())
        c = self.chunk_size
        return int(np.minimum((pos // c + 1) * c, self.seq_len).sum())

    def flops(self) -> float:
        """FLOPs of one call: ``4 x head_dim x visible pairs x num_q_heads x batch``
        (``Q K^T`` and ``P V``, 2 per multiply-add).

        Raises:
            InvalidArgumentError: as :meth:`visible_pairs`.
        """
        return 4.0 * self.head_dim * self.visible_pairs() * self.num_q_heads * self.batch

    def bytes_moved(self) -> float:
        """Bytes of one call: f32 K and V read once, plus q read and the output written.

        Raises:
            InvalidArgumentError: as :meth:`visible_pairs`.
        """
        self._check()
        kv = 2.0 * self.num_kv_heads * self.head_dim * self.seq_len * self.batch * 4
        return kv + 2.0 * self.batch * self.new_tokens * self.num_q_heads * self.head_dim * 4

    def intensity(self) -> float:
        """FLOP/byte of the shape: :meth:`flops` / :meth:`bytes_moved` (independent of
        ``batch``, and of the head counts when their ratio is kept).

        Raises:
            InvalidArgumentError: as :meth:`visible_pairs`.
        """
        return self.flops() / self.bytes_moved()

    def _check(self) -> None:
        if self.cached_tokens < 0:
            raise InvalidArgumentError(f"cached_tokens must be >= 0, got {self.cached_tokens}")
        sizes = {"batch": self.batch, "new_tokens": self.new_tokens,
                 "num_q_heads": self.num_q_heads, "num_kv_heads": self.num_kv_heads,
                 "head_dim": self.head_dim,
                 "chunk_size": 1 if self.chunk_size is None else self.chunk_size}
        for name, value in sizes.items():
            if value < 1:
                raise InvalidArgumentError(f"{name} must be >= 1, got {value}")
        if self.num_q_heads % self.num_kv_heads:
            raise InvalidArgumentError(f"num_q_heads ({self.num_q_heads}) must be a multiple of "
                                       f"num_kv_heads ({self.num_kv_heads})")


#: The prefill shapes the report measures, at full size: (a) text prefill, 8 x 512 new
#: tokens over 4,096 cached, 32/8 heads, causal; (b) video chunk, a 1,560-token frame over
#: 6,240 cached, 12/12 heads, block-causal with chunk 1,560. The report runs them smaller
#: (:data:`REPORT_PREFILL_SHAPES`).
PREFILL_SHAPES: tuple[PrefillShape, ...] = (
    PrefillShape("text prefill", 8, 4096, 512, 32, 8, 128),
    PrefillShape("video chunk", 1, 6240, 1560, 12, 12, 128, chunk_size=1560),
)

#: The report's sizes: the same sequence lengths, masks, head_dim and head ratios (so the
#: same FLOP/byte), with 1 sequence instead of 8 for (a) and 4/4 heads instead of 12/12
#: for (b): about 0.3-0.5 s per call on 2 cores instead of 3.6 s and 0.9 s.
REPORT_PREFILL_SHAPES: tuple[PrefillShape, ...] = (
    replace(PREFILL_SHAPES[0], batch=1),
    replace(PREFILL_SHAPES[1], num_q_heads=4, num_kv_heads=4),
)


@dataclass(frozen=True)
class PrefillPoint:
    """One measured multi-query attention call.

    Attributes:
        shape: what was run.
        flops: FLOPs of one call (:meth:`PrefillShape.flops`).
        bytes_moved: K and V read once plus q and output, bytes.
        seconds: best time of one call.
    """

    shape: PrefillShape
    flops: float
    bytes_moved: float
    seconds: float

    @property
    def intensity(self) -> float:
        """FLOP/byte of the call."""
        return self.flops / self.bytes_moved

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s."""
        return self.flops / self.seconds

    @property
    def bytes_per_s(self) -> float:
        """Achieved bytes/s."""
        return self.bytes_moved / self.seconds


def measure_prefill_kernel(
    shapes: Sequence[PrefillShape] = REPORT_PREFILL_SHAPES,
    block_size: int = 16,
    repeats: int = 3,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> list[PrefillPoint]:
    """Time ``pykvpool.prefill_attention`` (f32 paged cache) on each shape: the cache is
    filled through a real :class:`BlockPool` and ``KvCache.write``, one warm-up call, then
    the best of ``repeats`` calls. The defaults take about 3 s on 2 cores.

    Raises:
        InvalidArgumentError: a size < 1 (the message names it), ``shapes`` empty, or
            ``num_q_heads`` not a multiple of ``num_kv_heads``.
    """
    for name, value in {"block_size": block_size, "repeats": repeats}.items():
        if value < 1:
            raise InvalidArgumentError(f"{name} must be >= 1, got {value}")
    if not shapes:
        raise InvalidArgumentError("shapes must not be empty")
    for sh in shapes:
        sh._check()
    rng = np.random.default_rng(seed)
    points = []
    for j, sh in enumerate(shapes):
        n, length = sh.batch, sh.seq_len
        num_blocks = n * -(-length // block_size)
        pool = BlockPool(num_blocks, block_size)
        cache = _native.KvCache(1, num_blocks, block_size, sh.num_kv_heads, sh.head_dim, dtype="f32")
        k = rng.standard_normal((length, sh.num_kv_heads, sh.head_dim), dtype=np.float32)
        for i in range(n):  # one K (and V) for every sequence: values do not change timing
            cache.write(0, k, k, pool.add_sequence(i, length))
        tables = pool.block_tables(np.arange(n))
        q = rng.standard_normal((n * sh.new_tokens, sh.num_q_heads, sh.head_dim), dtype=np.float32)
        indptr, lens = np.arange(n + 1) * sh.new_tokens, np.full(n, length)
        best = float("inf")
        for r in range(repeats + 1):  # the first call warms up
            t0 = time.perf_counter()
            _native.prefill_attention(cache, 0, q, indptr, tables, lens, causal=True,
                                      chunk_size=sh.chunk_size)
            best = best if r == 0 else min(best, time.perf_counter() - t0)
        points.append(PrefillPoint(sh, sh.flops(), sh.bytes_moved(), max(best, 1e-9)))
        if progress is not None:
            progress(j + 1, len(shapes))
    return points


@dataclass(frozen=True)
class Roofline:
    """Step time = max(FLOPs / reachable FLOP/s, bytes / reachable bandwidth) + overhead,
    with FLOPs = 2 x params x tokens + 4 x layers x q width x attention pairs and bytes =
    weights + KV bytes of every attended token; swapped blocks add their transfer time
    over the host link. Models and devices are the capacity planner's
    (:data:`pykvpool.planning.models.MODELS`, :data:`pykvpool.planning.hardware.HARDWARE`).

    A replica of ``devices`` > 1 devices is tensor parallel: ``hardware`` is the
    replica's (its memory, bandwidth and FLOP/s those of all its devices), and every step
    that computes tokens adds two ring all-reduces per layer of the tokens' activations
    (q width x :data:`ACTIVATION_BYTES` each), not overlapped with compute: each takes
    ``2 (N-1)`` steps of ``link_latency`` and moves ``2 (N-1) / N`` of its bytes over one
    device's ``link_bandwidth`` (the hardware's link figures are per device). Its KV
    bytes per token count every copy the replica keeps
    (:meth:`pykvpool.planning.models.ModelConfig.kv_replicas`).

    Attributes:
        compute_dtype: the compute precision of the FLOP roof (a key of the device's
            ``peak_flops``); kv_dtype: the KV storage dtype, any spelling
            :func:`pykvpool.planning.models.storage_dtype` reads, kept as its one spelling
            (``"fp16"`` becomes ``"f16"``).
        flops_efficiency, bandwidth_efficiency: fractions of the roofs an engine reaches.
        host_link_bandwidth: host <-> device bytes/s for swapping (PCIe 4 x16 by default).
        overhead: fixed seconds per step (launches, scheduling, sampling).
        devices: devices of the tensor-parallel replica (1: one device, no all-reduce).

    Raises:
        UnknownPresetError: ``kv_dtype`` is not a storage dtype.
        InvalidArgumentError: a malformed ``kv_dtype`` granularity (the other fields are
            checked by :meth:`figures`).
    """

    model: ModelConfig
    hardware: Hardware
    block_size: int = 16
    overhead: float = 2e-3
    compute_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    flops_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    host_link_bandwidth: float = 25e9
    devices: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.kv_dtype, str):
            object.__setattr__(self, "kv_dtype", storage_dtype(self.kv_dtype).name)

    def figures(self) -> list[float]:
        """The 11 numbers :func:`pykvpool._native.run_simulation` takes: params, bytes per
        param, layers, query width, KV bytes per token, reachable FLOP/s, reachable
        bytes/s, overhead (s), swap time per block (s), and the all-reduces' seconds per
        step and per computed token (both 0 on one device).

        Raises:
            UnknownPresetError: ``compute_dtype`` has no peak on the device, or
                ``kv_dtype`` is not a storage dtype.
            InvalidArgumentError: a malformed ``kv_dtype`` granularity; an efficiency
                outside (0, 1], a host link bandwidth that is not finite and > 0, a
                ``block_size`` that is not an int >= 1, an ``overhead`` that is not finite
                and >= 0, ``devices`` not an int >= 1, or > 1 on hardware without a
                device link (each named).
        """
        _count(self.block_size, "block_size", 1)
        _positive(self.overhead, "overhead", zero=True)
        _positive(self.flops_efficiency, "flops_efficiency", most=1.0)
        _positive(self.bandwidth_efficiency, "bandwidth_efficiency", most=1.0)
        _positive(self.host_link_bandwidth, "host_link_bandwidth")
        m, h = self.model, self.hardware
        kv = float(m.kv_bytes_per_token(self.kv_dtype)) * m.kv_replicas(_count(self.devices, "devices", 1))
        return [
            m.num_params,
            m.weight_bytes_per_param,
            float(m.num_layers),
            float(m.num_q_heads * m.head_dim),
            kv,
            h.flops(self.compute_dtype) * self.flops_efficiency,
            h.bandwidth * self.bandwidth_efficiency,
            self.overhead,
            self.block_size * kv / self.host_link_bandwidth,
            *self.all_reduce_times(),
        ]

    def all_reduce_times(self) -> tuple[float, float]:
        """Tensor parallelism's all-reduce time in a step: ``(seconds per step, seconds
        per computed token)``, ``(0.0, 0.0)`` on one device (see the class docstring).

        Raises:
            InvalidArgumentError: ``devices`` not an int >= 1, or > 1 on hardware whose
                ``link_bandwidth`` is not > 0 or ``link_latency`` not >= 0.
        """
        n = _count(self.devices, "devices", 1)
        if n == 1:
            return 0.0, 0.0
        h = self.hardware
        _positive(h.link_bandwidth, "link_bandwidth")
        _positive(h.link_latency, "link_latency", zero=True)
        per_layer = 2.0 * self.model.num_layers
        width = float(self.model.num_q_heads * self.model.head_dim) * ACTIVATION_BYTES
        steps = 2.0 * (n - 1)
        return per_layer * steps * h.link_latency, per_layer * steps / n * width / h.link_bandwidth


def roofline(model: str, hardware: str, block_size: int = 16, overhead: float = 2e-3) -> Roofline:
    """The roofline of a preset model on a preset device, e.g. ``roofline("llama-3-8b",
    "a100-80gb-sxm")``, with ``block_size`` tokens per block and ``overhead`` seconds
    per step.

    Raises:
        UnknownPresetError: an unknown model or hardware name.
        InvalidArgumentError: a ``block_size`` that is not an int >= 1, an ``overhead``
            that is not a finite number >= 0.
    """
    return Roofline(model_preset(model), hardware_preset(hardware), _count(block_size, "block_size", 1),
                    _positive(overhead, "overhead", zero=True))
