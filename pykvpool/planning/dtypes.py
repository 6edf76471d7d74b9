"""KV storage dtypes: how one cached K or V element is stored, and the compute precision
attention over it runs at (:mod:`pykvpool.planning.models` re-exports every name).

A :class:`StorageDtype` is how one cached K or V element is stored. Its name is the KV
dtype's one spelling, the same everywhere in the package (ledger, CLI, search points,
simulator, report): :class:`pykvpool.KvCache`'s names (:data:`pykvpool.KV_DTYPES`: ``f32``,
``f16``, ``bf16``, ``int8``, ``fp8_e4m3``, ``fp8_e5m2``), whose bytes come from the storage
itself (:meth:`pykvpool.KvCache.bytes_per_token`: ``int8`` keeps one fp32 scale per token and
KV head, ``fp8_e4m3`` / ``fp8_e5m2`` one per layer and KV head, no per-token cost), and the
planning-only ``fp8`` (vLLM's per-token-head fp8: 1 byte plus one fp32 scale per (token,
layer, K or V, KV head) vector of ``head_dim`` elements), which KvCache does not store.
:func:`storage_dtype` also reads the aliases KvCache accepts (``float32``, ``half``,
``e4m3``, ...) and planning's former ``fp32`` / ``fp16`` (:data:`DTYPE_ALIASES`), each as its
one spelling.

``fp8`` and ``int8`` count their scale overhead at a stated granularity: by default one
scale per vector (``"fp8"`` = ``"fp8:head"``); ``"int8:g32"`` is one scale per 32 elements;
``"fp8:tensor"`` is one scale per tensor, which costs nothing per token (a suffixed
``int8`` is a planning format, counted from its fields).

A KV dtype is not a compute precision: the hardware tables name their tensor-core
precisions as the datasheets do (``fp32``, ``fp16``, ``bf16``, ``fp8``, ``int8``), and
:func:`compute_precision` maps a KV dtype to the one its attention runs at.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from pykvpool._native import KV_DTYPES, InvalidArgumentError, KvCache
from pykvpool.errors import UnknownPresetError

__all__ = ["DTYPES", "DTYPE_ALIASES", "StorageDtype", "compute_precision", "storage_dtype"]


@dataclass(frozen=True)
class StorageDtype:
    """Storage format of cached K/V elements.

    Attributes:
        name: the spelling that :func:`storage_dtype` accepts back, e.g. ``"int8:g32"``.
        element_bytes: bytes per element (4, 2 or 1).
        scale_bytes: bytes per quantization scale (0 for unscaled formats).
        scale_group: elements covered by one scale along ``head_dim``; ``None`` means one
            scale per whole vector of ``head_dim`` elements; ignored when ``scale_bytes`` is 0.
        granularity: a human-readable statement of the scale granularity.
        native: the :class:`pykvpool.KvCache` dtype this format is stored as, whose
            :meth:`pykvpool.KvCache.bytes_per_token` gives :meth:`vector_bytes`; ``None``
            for a planning-only format (counted from the fields above).
    """

    name: str
    element_bytes: int
    scale_bytes: int = 0
    scale_group: int | None = None
    granularity: str = "none (no scales)"
    native: str | None = None

    def vector_bytes(self, head_dim: int) -> int:
        """Bytes to store one K (or V) vector of ``head_dim`` elements, scales included
        (per-token ones; the storage's own count for a :attr:`native` format).

        Raises:
            InvalidArgumentError: ``head_dim`` < 1 (or beyond 65536 for a native format).
        """
        if head_dim < 1:
            raise InvalidArgumentError(f"head_dim must be >= 1, got {head_dim}")
        if self.native is not None:
            return KvCache.bytes_per_token(1, head_dim, self.native) // 2
        scales = 0
        if self.scale_bytes:
            group = head_dim if self.scale_group is None else self.scale_group
            scales = math.ceil(head_dim / group) * self.scale_bytes
        return head_dim * self.element_bytes + scales


_PER_TOKEN = "one fp32 scale per (token, layer, K/V, kv head)"


def _native_dtype(name: str) -> StorageDtype:
    """KvCache's format ``name``, its element and per-token scale bytes read from the storage."""
    one, two = (KvCache.bytes_per_token(1, d, name) // 2 for d in (1, 2))
    element, scale = two - one, 2 * one - two
    if scale:
        granularity = _PER_TOKEN
    elif element == 1:  # 8-bit codes without per-token scales: KvCache's per-layer ones
        granularity = "one fp32 scale per (layer, K/V, kv head): none per token"
    else:
        granularity = "none (no scales)"
    return StorageDtype(name, element, scale, None, granularity, native=name)


_BASE_DTYPES: dict[str, StorageDtype] = {
    **{name: _native_dtype(name) for name in KV_DTYPES},
    "fp8": StorageDtype("fp8", 1, 4, None, _PER_TOKEN),
}
DTYPES: tuple[str, ...] = tuple(_BASE_DTYPES)
"""Base dtype names, each the one spelling of its KV dtype: KvCache's
(:data:`pykvpool.KV_DTYPES`), then the planning-only ``fp8``; ``fp8`` and ``int8`` accept a
``:head``, ``:gN`` or ``:tensor`` suffix."""

DTYPE_ALIASES: Mapping[str, str] = {"fp32": "f32", "fp16": "f16"}
"""Planning's former names of two native formats, still read (files, saved searches and
scripts may hold them) as their one spelling; :func:`storage_dtype` reads KvCache's own
aliases (``float32``, ``half``, ``e4m3``, ...) through KvCache."""

_COMPUTE_PRECISIONS: Mapping[str, str] = {"f32": "fp32", "f16": "fp16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}


def _one_spelling(base: str) -> str | None:
    """The one spelling of a lower-case base name, or None when no format has it."""
    if base in _BASE_DTYPES:
        return base
    if base in DTYPE_ALIASES:
        return DTYPE_ALIASES[base]
    try:
        return KvCache(1, 1, 1, 1, 1, base).dtype  # KvCache's own aliases, read by KvCache
    except InvalidArgumentError:
        return None


def storage_dtype(name: str) -> StorageDtype:
    """Parse a KV dtype spelling (case-insensitive) into its format, named by its one
    spelling (:data:`DTYPES`): ``f32``, ``f16``, ``bf16``, ``int8``, ``fp8_e4m3``,
    ``fp8_e5m2``, ``fp8``, or an alias (:data:`DTYPE_ALIASES`: ``fp32``, ``fp16``; KvCache's:
    ``float32``, ``half``, ``e4m3``, ...); for ``fp8`` / ``int8`` a granularity suffix
    ``:head`` (default), ``:gN`` (one scale per N elements) or ``:tensor`` (per-tensor
    scale, no per-token cost); a suffixed ``int8`` is a planning format, counted from its
    fields, not KvCache's.

    Raises:
        UnknownPresetError: unknown base name.
        InvalidArgumentError: a suffix on a 16/32-bit or an ``fp8_e4m3``/``fp8_e5m2`` dtype,
            or a malformed or non-positive group size.
    """
    spelled, _, suffix = name.strip().lower().partition(":")
    base = _one_spelling(spelled)
    if base is None:
        raise UnknownPresetError("dtype", name, list(DTYPES))
    dt = _BASE_DTYPES[base]
    if not suffix or suffix == "head":
        return dt
    if dt.scale_bytes == 0:
        raise InvalidArgumentError(f"dtype {base} has no per-token scales; {name!r} is not valid")
    if suffix == "tensor":
        return replace(dt, name=f"{base}:tensor", scale_bytes=0, native=None,
                       granularity="one scale per tensor (no per-token cost)")
    digits = suffix[1:]
    if suffix.startswith("g") and digits.isascii() and digits.isdigit() and len(digits) <= 9 and int(digits) > 0:
        group = int(suffix[1:])
        return replace(dt, name=f"{base}:g{group}", scale_group=group, native=None,
                       granularity=f"one fp32 scale per {group} elements")
    raise InvalidArgumentError(
        f"bad dtype granularity in {name!r}: use :head, :tensor or :gN with N >= 1"
    )


def compute_precision(dtype: StorageDtype | str) -> str:
    """The compute precision (a key of :attr:`pykvpool.planning.hardware.Hardware.peak_flops`,
    named as the datasheets name them) that attention over KV in ``dtype`` runs at: ``f32``
    -> ``fp32``, ``f16`` -> ``fp16``, ``fp8_e4m3`` / ``fp8_e5m2`` / ``fp8`` -> ``fp8``,
    ``bf16`` and ``int8`` as they are; a granularity suffix does not change it.

    Raises:
        UnknownPresetError: an unknown dtype name.
        InvalidArgumentError: a malformed granularity suffix.
    """
    dt = storage_dtype(dtype) if isinstance(dtype, str) else dtype
    base = dt.name.split(":")[0]
    return _COMPUTE_PRECISIONS.get(base, base)
