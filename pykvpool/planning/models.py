"""Model configurations and KV storage dtypes: the inputs of every memory ledger.

A :class:`ModelConfig` holds what the KV cache and the weights depend on: layers, query and
KV heads, head dimension (elements) and parameter count. Presets carry published
configurations; :meth:`ModelConfig.from_hf_config` builds one from a Hugging Face
``config.json`` dict.

A :class:`StorageDtype` is how one cached K or V element is stored: ``fp32`` (4 bytes),
``bf16`` / ``fp16`` (2 bytes), ``fp8`` / ``int8`` (1 byte plus scales). The 8-bit formats
count their scale overhead at a stated granularity: by default one fp32 scale per
(token, layer, K or V, KV head) vector of ``head_dim`` elements (``"fp8"`` = ``"fp8:head"``);
``"int8:g32"`` is one scale per 32 elements; ``"fp8:tensor"`` is one scale per tensor, which
costs nothing per token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pykvpool._native import InvalidArgumentError
from pykvpool.errors import UnknownPresetError, lookup_preset

__all__ = [
    "DTYPES",
    "MODELS",
    "ModelConfig",
    "StorageDtype",
    "model_preset",
    "storage_dtype",
]


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
    """

    name: str
    element_bytes: int
    scale_bytes: int = 0
    scale_group: int | None = None
    granularity: str = "none (no scales)"

    def vector_bytes(self, head_dim: int) -> int:
        """Bytes to store one K (or V) vector of ``head_dim`` elements, scales included.

        Raises:
            InvalidArgumentError: ``head_dim`` < 1.
        """
        if head_dim < 1:
            raise InvalidArgumentError(f"head_dim must be >= 1, got {head_dim}")
        scales = 0
        if self.scale_bytes:
            group = head_dim if self.scale_group is None else self.scale_group
            scales = math.ceil(head_dim / group) * self.scale_bytes
        return head_dim * self.element_bytes + scales


_BASE_DTYPES: dict[str, StorageDtype] = {
    "fp32": StorageDtype("fp32", 4),
    "bf16": StorageDtype("bf16", 2),
    "fp16": StorageDtype("fp16", 2),
    "fp8": StorageDtype("fp8", 1, 4, None, "one fp32 scale per (token, layer, K/V, kv head)"),
    "int8": StorageDtype("int8", 1, 4, None, "one fp32 scale per (token, layer, K/V, kv head)"),
}
DTYPES: tuple[str, ...] = tuple(_BASE_DTYPES)
"""Base dtype names; 8-bit ones accept a ``:head``, ``:gN`` or ``:tensor`` suffix."""


def storage_dtype(name: str) -> StorageDtype:
    """Parse a dtype spelling: ``fp32``, ``bf16``, ``fp16``, ``fp8``, ``int8``, and for the
    8-bit ones a granularity suffix ``:head`` (default), ``:gN`` (one scale per N elements)
    or ``:tensor`` (per-tensor scale, no per-token cost).

    Raises:
        UnknownPresetError: unknown base name.
        InvalidArgumentError: a suffix on a 16/32-bit dtype, or a malformed or non-positive
            group size.
    """
    base, _, suffix = name.strip().lower().partition(":")
    if base not in _BASE_DTYPES:
        raise UnknownPresetError("dtype", name, list(DTYPES))
    dt = _BASE_DTYPES[base]
    if not suffix or suffix == "head":
        return dt
    if dt.scale_bytes == 0:
        raise InvalidArgumentError(f"dtype {base} has no scales; {name!r} is not valid")
    if suffix == "tensor":
        return replace(dt, name=f"{base}:tensor", scale_bytes=0,
                       granularity="one scale per tensor (no per-token cost)")
    if suffix.startswith("g") and suffix[1:].isdigit() and int(suffix[1:]) > 0:
        group = int(suffix[1:])
        return replace(dt, name=f"{base}:g{group}", scale_group=group,
                       granularity=f"one fp32 scale per {group} elements")
    raise InvalidArgumentError(
        f"bad dtype granularity in {name!r}: use :head, :tensor or :gN with N >= 1"
    )


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder as far as KV memory and weights are concerned.

    Attributes:
        name: display name.
        num_layers: decoder layers (L).
        num_q_heads: query heads (n_q).
        num_kv_heads: key/value heads (n_kv); ``n_q / n_kv`` is the GQA group size g.
        head_dim: elements per head (d).
        num_params: parameters (count, not bytes).
        weight_bytes_per_param: bytes per stored weight (2 for bf16).
        max_context: the model's context window, in tokens.

    Raises:
        InvalidArgumentError: any size < 1, or ``num_q_heads`` not a multiple of
            ``num_kv_heads``.
    """

    name: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: float
    weight_bytes_per_param: float = 2.0
    max_context: int = 8192

    def __post_init__(self) -> None:
        for field in ("num_layers", "num_q_heads", "num_kv_heads", "head_dim", "max_context"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{field} must be an integer >= 1, got {value!r}")
        if not (math.isfinite(self.num_params) and self.num_params > 0
                and math.isfinite(self.weight_bytes_per_param) and self.weight_bytes_per_param > 0):
            raise InvalidArgumentError("num_params and weight_bytes_per_param must be finite numbers > 0, "
                                       f"got {self.num_params!r} and {self.weight_bytes_per_param!r}")
        if self.num_q_heads % self.num_kv_heads:
            raise InvalidArgumentError(
                f"num_q_heads ({self.num_q_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def group_size(self) -> int:
        """GQA group size g = n_q / n_kv (1 for MHA)."""
        return self.num_q_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype: StorageDtype | str = "bf16") -> int:
        """KV bytes per token: ``2 (K,V) x L x n_kv x (bytes of one d-element vector)``,
        scales included.

        Args:
            dtype: a :class:`StorageDtype` or a spelling :func:`storage_dtype` accepts.

        Raises:
            UnknownPresetError: an unknown dtype name.
            InvalidArgumentError: a malformed granularity suffix.
        """
        dt = storage_dtype(dtype) if isinstance(dtype, str) else dtype
        return 2 * self.num_layers * self.num_kv_heads * dt.vector_bytes(self.head_dim)

    @property
    def weight_bytes(self) -> float:
        """Weights in bytes: ``num_params x weight_bytes_per_param``."""
        return self.num_params * self.weight_bytes_per_param

    def with_kv_heads(self, num_kv_heads: int, name: str | None = None) -> ModelConfig:
        """The same model with another KV head count (e.g. the MHA variant).

        Raises:
            InvalidArgumentError: ``num_kv_heads`` < 1 or not dividing the query heads.
        """
        return replace(self, num_kv_heads=num_kv_heads,
                       name=name or f"{self.name} (n_kv={num_kv_heads})")

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any],
        name: str | None = None,
        num_params: float | None = None,
        weight_bytes_per_param: float = 2.0,
    ) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` dict.

        Reads ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``
        (default: the attention heads, i.e. MHA), ``head_dim`` (default
        ``hidden_size / num_attention_heads``) and ``max_position_embeddings``. When
        ``num_params`` is not given it is estimated for a Llama-style decoder from
        ``vocab_size``, ``hidden_size``, ``intermediate_size`` and
        ``tie_word_embeddings`` (attention projections, gated MLP, norms, embeddings).

        Only dense decoders whose every layer attends to the whole context are modelled:
        a config with a sliding window (``sliding_window`` set, unless
        ``use_sliding_window`` is false or the window covers ``max_position_embeddings``),
        per-layer attention kinds (``layer_types`` other than all ``"full_attention"``),
        multi-head latent attention (``kv_lora_rank``) or experts (``n_routed_experts``,
        ``num_local_experts``, ``num_experts`` above 1, when ``num_params`` is estimated)
        is refused rather than given a wrong KV or weight size.

        Raises:
            InvalidArgumentError: a missing or non-integer key, a size above 2**31 - 1,
                inconsistent sizes, or one of the unmodelled features above (the message
                names the key).
        """
        _refuse_unmodelled(config, estimate_params=num_params is None)

        def get_int(key: str, default: int | None = None) -> int:
            value = config.get(key)
            value = default if value is None else value
            if value is None:
                raise InvalidArgumentError(f"config.json has no {key!r}")
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"config.json {key!r} must be an integer, got {value!r}")
            if not 0 <= value <= _MAX_CONFIG_INT:
                raise InvalidArgumentError(f"config.json {key!r} must be in 0 .. {_MAX_CONFIG_INT}, got {value}")
            return value

        layers = get_int("num_hidden_layers")
        n_q = get_int("num_attention_heads")
        n_kv = get_int("num_key_value_heads", n_q)
        hidden = get_int("hidden_size")
        head_dim = get_int("head_dim", hidden // n_q if n_q else 0)
        if num_params is None:
            vocab = get_int("vocab_size")
            inter = get_int("intermediate_size")
            attn = hidden * n_q * head_dim * 2 + hidden * n_kv * head_dim * 2
            mlp = 3 * hidden * inter
            embed = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
            num_params = float(layers * (attn + mlp + 2 * hidden) + hidden + embed)
        return cls(
            name=name or str(config.get("_name_or_path") or config.get("model_type") or "custom"),
            num_layers=layers,
            num_q_heads=n_q,
            num_kv_heads=n_kv,
            head_dim=head_dim,
            num_params=num_params,
            weight_bytes_per_param=weight_bytes_per_param,
            max_context=get_int("max_position_embeddings", 8192),
        )


_MAX_CONFIG_INT = 2**31 - 1
_EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")


def _refuse_unmodelled(config: Mapping[str, Any], estimate_params: bool) -> None:
    """InvalidArgumentError naming the first key of a feature the ledger does not model."""

    def refuse(key: str, what: str) -> None:
        shown = repr(config[key])
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise InvalidArgumentError(
            f"config.json {key!r} = {shown}: {what} is not modelled yet; "
            "the KV or weight size would be wrong")

    window = config.get("sliding_window")
    ctx = config.get("max_position_embeddings")
    covers = isinstance(window, int) and isinstance(ctx, int) and window >= ctx
    if window is not None and config.get("use_sliding_window") is not False and not covers:
        refuse("sliding_window", "sliding-window attention")
    types = config.get("layer_types")
    if types is not None and (not isinstance(types, list)
                              or any(t != "full_attention" for t in types)):
        refuse("layer_types", "attention that differs by layer")
    if config.get("kv_lora_rank") is not None:
        refuse("kv_lora_rank", "multi-head latent attention (MLA)")
    for key in _EXPERT_KEYS if estimate_params else ():
        n = config.get(key)
        if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and n <= 1):
            refuse(key, "a mixture of experts (its weights)")


_LLAMA3_8B = ModelConfig("Llama-3-8B", 32, 32, 8, 128, 8.03e9, 2.0, 8192)

MODELS: dict[str, ModelConfig] = {
    # Published configurations (Hugging Face config.json of each model card); parameter
    # counts as published by the model authors.
    "llama-3-8b": _LLAMA3_8B,
    "llama-3-70b": ModelConfig("Llama-3-70B", 80, 64, 8, 128, 70.6e9, 2.0, 8192),
    "mistral-7b": ModelConfig("Mistral-7B-v0.1", 32, 32, 8, 128, 7.24e9, 2.0, 32768),
    "qwen2.5-7b": ModelConfig("Qwen2.5-7B", 28, 28, 4, 128, 7.62e9, 2.0, 131072),
    # The article's MHA variant: Llama-3-8B with one KV head per query head.
    "llama-3-8b-mha": _LLAMA3_8B.with_kv_heads(32, "Llama-3-8B MHA variant (n_kv=32)"),
    # A real MHA model, for comparison.
    "llama-2-7b": ModelConfig("Llama-2-7B (MHA)", 32, 32, 32, 128, 6.74e9, 2.0, 4096),
}
"""Model presets by lower-case name (published configurations); see :func:`model_preset`."""


def model_preset(name: str) -> ModelConfig:
    """Look up a preset by name (case-insensitive), e.g. ``"llama-3-8b"``.

    Raises:
        UnknownPresetError: not one of :data:`MODELS`.
    """
    return lookup_preset("model", MODELS, name)
