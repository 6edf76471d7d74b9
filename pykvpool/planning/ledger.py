"""The memory ledger: per-token KV bytes, weights, a budget, and what fits in it.

Units: bytes (``GiB`` = 2**30), tokens, requests, seconds. The KV cache of a batch is
``B_tok x S x batch`` with ``B_tok = 2 (K,V) x L x n_kv x d x p`` (p includes the scales of
8-bit formats, see :mod:`pykvpool.planning.models`) for a model whose every layer is full
attention; a windowed model (sliding or chunked layer groups) caps the tokens its windowed
layers hold, so its KV is :meth:`pykvpool.planning.models.ModelConfig.kv_bytes` of the
length, per sequence, and its capacity is stated in sequences at a length. A :class:`Budget` is device memory times a
usable fraction minus a reserve for activations and the framework; what remains after the
weights holds the KV cache.

The decode-step bound follows the roofline: a step reads the weights once (shared by the
batch) and every sequence's whole KV, so ``T >= max(bytes / bandwidth, FLOPs / peak)`` and
tokens/s <= batch / T.

One budget everywhere: :func:`default_budget` (the device's memory, all of it usable,
4 GiB reserved: the article's budget) is what ``pykvpool ledger``, ``sweep``,
``simulate`` (:func:`pykvpool.simulate.kv_blocks_for_memory`) and the report use unless
told otherwise, and each prints :meth:`Budget.describe`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pykvpool._native import InvalidArgumentError
from pykvpool.errors import BudgetError
from pykvpool.planning.hardware import Hardware, hardware_preset
from pykvpool.planning.models import ModelConfig, StorageDtype, storage_dtype

__all__ = [
    "DEFAULT_FRACTION",
    "DEFAULT_RESERVE_BYTES",
    "GIB",
    "MAX_SEQ_LEN",
    "MIB",
    "Budget",
    "DecodeBound",
    "LedgerRow",
    "MemoryLedger",
    "article_budget",
    "default_budget",
]

GIB = float(1 << 30)
"""Bytes per GiB."""
MIB = float(1 << 20)
"""Bytes per MiB."""


MAX_SEQ_LEN = 2**31 - 1
"""Longest length :meth:`MemoryLedger.max_seq_len` reports, tokens."""

DEFAULT_FRACTION = 1.0
"""Share of device memory a budget uses unless told otherwise."""
DEFAULT_RESERVE_BYTES = 4 * GIB
"""Bytes a budget keeps for activations, workspace and the framework unless told
otherwise (the article's 4 GiB)."""


@dataclass(frozen=True)
class Budget:
    """Device memory available to one model replica.

    Attributes:
        device_bytes: device memory, bytes.
        fraction: the share of it the engine may use (vLLM's ``gpu_memory_utilization``).
        reserve_bytes: bytes kept for activations, workspace and the framework.

    Raises:
        InvalidArgumentError: ``device_bytes`` not a finite number > 0, ``fraction`` not
            in (0, 1], or a reserve that is negative or not finite.
    """

    device_bytes: float
    fraction: float = 1.0
    reserve_bytes: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.device_bytes) and self.device_bytes > 0):
            raise InvalidArgumentError(f"device memory must be a finite number > 0 bytes, got {self.device_bytes}")
        if not 0 < self.fraction <= 1:
            raise InvalidArgumentError(f"fraction must be in (0, 1], got {self.fraction}")
        if not (math.isfinite(self.reserve_bytes) and self.reserve_bytes >= 0):
            raise InvalidArgumentError(f"reserve must be a finite number >= 0 bytes, got {self.reserve_bytes}")

    @property
    def usable_bytes(self) -> float:
        """``device_bytes x fraction``, bytes."""
        return self.device_bytes * self.fraction

    @property
    def available_bytes(self) -> float:
        """``usable_bytes - reserve_bytes``: what weights and KV share, bytes (negative
        when the reserve exceeds the usable memory)."""
        return self.usable_bytes - self.reserve_bytes

    def describe(self) -> str:
        """One line, in GiB: ``"80.00 GiB x 1.00 - 4.00 GiB reserve = 76.00 GiB"``."""
        return (f"{self.device_bytes / GIB:.2f} GiB x {self.fraction:.2f} - "
                f"{self.reserve_bytes / GIB:.2f} GiB reserve = {self.available_bytes / GIB:.2f} GiB")


def default_budget(hardware: Hardware) -> Budget:
    """The budget every pykvpool output uses unless told otherwise: all of
    ``hardware``'s memory (fraction :data:`DEFAULT_FRACTION`) minus
    :data:`DEFAULT_RESERVE_BYTES`. On the A100-80GB: 80 GiB - 4 GiB, the article's budget
    (Llama-3-8B BF16: 80 - 14.96 - 4 GiB = 500,063 KV tokens).

    Raises:
        InvalidArgumentError: the device's memory is not a finite number > 0 (e.g. a
            machine whose memory could not be read).
    """
    return Budget(hardware.memory_bytes, DEFAULT_FRACTION, DEFAULT_RESERVE_BYTES)


def article_budget() -> Budget:
    """The article's budget: :func:`default_budget` of the A100-80GB (80 GiB total,
    4 GiB for activations, framework and slack)."""
    return default_budget(hardware_preset("a100-80gb-sxm"))


@dataclass(frozen=True)
class LedgerRow:
    """Memory of one (batch, sequence length) point, bytes."""

    batch: int
    seq_len: int
    weight_bytes: float
    kv_bytes: float
    reserve_bytes: float

    @property
    def weights_plus_kv_bytes(self) -> float:
        """Weights + KV (the article's "total"), bytes."""
        return self.weight_bytes + self.kv_bytes

    @property
    def total_bytes(self) -> float:
        """Weights + KV + reserve, bytes."""
        return self.weight_bytes + self.kv_bytes + self.reserve_bytes

    @property
    def kv_over_weights(self) -> float:
        """KV bytes / weight bytes."""
        return self.kv_bytes / self.weight_bytes


@dataclass(frozen=True)
class DecodeBound:
    """Lower bound of one decode step and the throughput bound it implies.

    Attributes:
        bytes_moved: weights (all experts of a MoE model: an upper bound) + all cached KV
            read once, bytes.
        flops: ``2 x active params x batch`` (projections, MLP) + ``4 x n_q x d x S x L x
            batch`` (attention; a windowed layer attends to its window only), FLOP.
        memory_time: ``bytes_moved / bandwidth``, seconds.
        compute_time: ``flops / peak``, seconds.
    """

    batch: int
    seq_len: int
    bytes_moved: float
    flops: float
    memory_time: float
    compute_time: float

    @property
    def step_time(self) -> float:
        """The larger of the two bounds, seconds."""
        return max(self.memory_time, self.compute_time)

    @property
    def tokens_per_s(self) -> float:
        """Upper bound on generated tokens/s for the whole batch."""
        return self.batch / self.step_time

    @property
    def memory_bound(self) -> bool:
        """True when bandwidth, not compute, sets the bound."""
        return self.memory_time >= self.compute_time


def _count(name: str, value: int, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise InvalidArgumentError(f"{name} must be an integer >= {lo}, got {value!r}")
    return value


@dataclass(frozen=True)
class MemoryLedger:
    """A model, a KV storage dtype and a budget: the KV capacity and what fits in it.

    Raises (on construction):
        BudgetError: the weights plus the reserve leave no room for a single token of KV.
    """

    model: ModelConfig
    budget: Budget
    dtype: StorageDtype = storage_dtype("bf16")

    def __post_init__(self) -> None:
        if self.kv_budget_bytes < self.bytes_per_token:
            raise BudgetError(
                f"{self.model.name}: weights {self.weight_bytes / GIB:.2f} GiB + reserve "
                f"{self.budget.reserve_bytes / GIB:.2f} GiB exceed the usable "
                f"{self.budget.usable_bytes / GIB:.2f} GiB (no room for KV)",
                needed_bytes=self.weight_bytes + self.budget.reserve_bytes + self.bytes_per_token,
                available_bytes=self.budget.usable_bytes,
            )

    @property
    def bytes_per_token(self) -> int:
        """KV bytes per token over all layers (``2 x L x n_kv x d x p`` + scales; MLA: the
        latent). For a windowed model, the full-history figure (every layer keeping every
        token): an upper bound, see :meth:`kv_bytes`."""
        return self.model.kv_bytes_per_token(self.dtype)

    @property
    def weight_bytes(self) -> float:
        """Weight bytes."""
        return self.model.weight_bytes

    @property
    def kv_budget_bytes(self) -> float:
        """Usable memory minus weights and reserve, bytes (may be negative before the
        constructor's check)."""
        return self.budget.usable_bytes - self.weight_bytes - self.budget.reserve_bytes

    @property
    def token_capacity(self) -> int:
        """Whole tokens of full-history KV (:attr:`bytes_per_token` each) that fit in the KV
        budget. For a windowed model this is not how many tokens can be served: use
        :meth:`max_batch` or :meth:`tokens_at`, which depend on the length."""
        return int(self.kv_budget_bytes // self.bytes_per_token)

    def tokens_at(self, *, seq_len: int, block_size: int = 1) -> int:
        """Logical tokens the budget serves as sequences of ``seq_len`` tokens:
        ``max_batch(seq_len) x seq_len`` (for a windowed model it grows with the length).

        Raises:
            InvalidArgumentError: seq_len or block_size < 1.
        """
        return self.max_batch(seq_len=seq_len, block_size=block_size) * seq_len

    def kv_bytes(self, *, seq_len: int, batch: int = 1) -> float:
        """KV bytes of ``batch`` sequences of ``seq_len`` tokens (keyword-only, so the two
        counts cannot be swapped); a window caps the tokens its layers hold.

        Raises:
            InvalidArgumentError: seq_len or batch not an integer >= 0.
        """
        _count("seq_len", seq_len, 0)
        _count("batch", batch, 0)
        return float(self.model.kv_bytes(seq_len, self.dtype)) * batch

    def row(self, *, batch: int, seq_len: int) -> LedgerRow:
        """Weights, KV and reserve at (batch, seq_len), bytes (keyword-only).

        Raises:
            InvalidArgumentError: batch or seq_len < 1.
        """
        _count("batch", batch)
        _count("seq_len", seq_len)
        return LedgerRow(batch, seq_len, self.weight_bytes,
                         self.kv_bytes(seq_len=seq_len, batch=batch), self.budget.reserve_bytes)

    def max_batch(self, *, seq_len: int, block_size: int = 1) -> int:
        """Largest batch of ``seq_len``-token sequences whose KV fits, each rounded up to
        whole blocks of ``block_size`` tokens (per layer group for a windowed model).

        Raises:
            InvalidArgumentError: seq_len or block_size < 1.
        """
        _count("seq_len", seq_len)
        _count("block_size", block_size)
        if self.model.windowed:
            return int(self.kv_budget_bytes // self.model.kv_bytes(seq_len, self.dtype, block_size))
        blocks = -(-seq_len // block_size)
        return (self.token_capacity // block_size) // blocks

    def max_seq_len(self, *, batch: int, block_size: int = 1) -> int:
        """Longest length (tokens, a multiple of ``block_size``) that ``batch`` sequences can
        each reach with their KV in the budget; 0 if not even one block each fits. A model
        whose every layer is windowed needs no more memory past its windows: the answer is
        then capped at :data:`MAX_SEQ_LEN`.

        Raises:
            InvalidArgumentError: batch or block_size < 1.
        """
        _count("batch", batch)
        _count("block_size", block_size)
        if not self.model.windowed:
            return (self.token_capacity // block_size // batch) * block_size
        lo, hi = 0, MAX_SEQ_LEN // block_size  # lo blocks fit; find the largest
        if self._fits(hi * block_size, batch, block_size):
            return hi * block_size
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self._fits(mid * block_size, batch, block_size) else (lo, mid)
        return lo * block_size

    def _fits(self, seq_len: int, batch: int, block_size: int) -> bool:
        return self.model.kv_bytes(seq_len, self.dtype, block_size) * batch <= self.kv_budget_bytes

    def decode_bound(self, hardware: Hardware, *, seq_len: int, batch: int = 1,
                     compute_dtype: str = "bf16") -> DecodeBound:
        """Lower bound of one decode step at ``batch`` sequences of ``seq_len`` cached
        tokens on ``hardware``, and the tokens/s upper bound.

        Raises:
            InvalidArgumentError: batch or seq_len < 1.
            UnknownPresetError: ``hardware`` has no peak for ``compute_dtype``.
        """
        _count("batch", batch)
        _count("seq_len", seq_len)
        m = self.model
        moved = self.weight_bytes + self.kv_bytes(seq_len=seq_len, batch=batch)
        flops = (2.0 * m.active_num_params * batch
                 + 4.0 * m.num_q_heads * m.head_dim * m.attended_tokens(seq_len) * batch)
        return DecodeBound(batch, seq_len, moved, flops, moved / hardware.bandwidth,
                           flops / hardware.flops(compute_dtype))
