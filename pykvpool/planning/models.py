"""Model configurations and KV storage dtypes: the inputs of every memory ledger.

A :class:`ModelConfig` holds what the KV cache and the weights depend on: layers, query and
KV heads, head dimension (elements) and parameter count. Presets carry published
configurations; :meth:`ModelConfig.from_hf_config` builds one from a Hugging Face
``config.json`` dict.

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
from typing import Any

from pykvpool._native import KV_DTYPES, InvalidArgumentError, KvCache
from pykvpool.errors import UnknownPresetError, lookup_preset
from pykvpool.planning.hf_config import parse_hf_config
from pykvpool.planning.layers import LayerGroup

__all__ = [
    "DTYPES",
    "DTYPE_ALIASES",
    "MODELS",
    "LayerGroup",
    "ModelConfig",
    "StorageDtype",
    "compute_precision",
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


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder as far as KV memory and weights are concerned.

    Attributes:
        name: display name.
        num_layers: decoder layers (L).
        num_q_heads: query heads (n_q).
        num_kv_heads: key/value heads (n_kv); ``n_q / n_kv`` is the GQA group size g. 1 for
            multi-head latent attention (one latent shared by every head).
        head_dim: elements per head (d); for MLA the query-key width (nope + rope).
        num_params: parameters (count, not bytes); all experts of a MoE model.
        weight_bytes_per_param: bytes per stored weight (2 for bf16).
        max_context: the model's context window, in tokens.
        layer_groups: the layers by attention kind (:class:`LayerGroup`); empty means every
            layer is full attention.
        kv_latent_dim: MLA: elements cached per token per layer, ``kv_lora_rank +
            qk_rope_head_dim``, one vector shared by K and V; 0 for K/V heads.
        active_params: parameters one token uses (MoE: the routed experts it visits plus
            the shared ones); ``None`` for a dense model (all of ``num_params``).

    Raises:
        InvalidArgumentError: any size < 1, ``num_q_heads`` not a multiple of
            ``num_kv_heads``, layer groups whose layers do not add up to ``num_layers``, a
            negative latent width, or active parameters above the total.
    """

    name: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: float
    weight_bytes_per_param: float = 2.0
    max_context: int = 8192
    layer_groups: tuple[LayerGroup, ...] = ()
    kv_latent_dim: int = 0
    active_params: float | None = None

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
        self._check_extensions()

    def _check_extensions(self) -> None:
        if not isinstance(self.layer_groups, tuple) or not all(
                isinstance(g, LayerGroup) for g in self.layer_groups):
            raise InvalidArgumentError(f"layer_groups must be a tuple of LayerGroup, got {self.layer_groups!r}")
        if self.layer_groups and sum(g.layers for g in self.layer_groups) != self.num_layers:
            raise InvalidArgumentError(
                f"layer_groups have {sum(g.layers for g in self.layer_groups)} layers, "
                f"num_layers is {self.num_layers}")
        if isinstance(self.kv_latent_dim, bool) or not isinstance(self.kv_latent_dim, int) \
                or self.kv_latent_dim < 0:
            raise InvalidArgumentError(f"kv_latent_dim must be an integer >= 0, got {self.kv_latent_dim!r}")
        a = self.active_params
        if a is not None and not (math.isfinite(a) and 0 < a <= self.num_params):
            raise InvalidArgumentError(f"active_params must be in (0, num_params], got {a!r}")

    @property
    def group_size(self) -> int:
        """GQA group size g = n_q / n_kv (1 for MHA)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def groups(self) -> tuple[LayerGroup, ...]:
        """:attr:`layer_groups`, or one full group of every layer when it is empty."""
        return self.layer_groups or (LayerGroup("full", self.num_layers),)

    @property
    def windowed(self) -> bool:
        """True when some layer keeps fewer than all tokens (a sliding or chunked group)."""
        return any(g.kind != "full" for g in self.groups)

    @property
    def active_num_params(self) -> float:
        """Parameters one token uses: :attr:`active_params`, or all of them when dense."""
        return self.num_params if self.active_params is None else self.active_params

    def kv_layer_bytes(self, dtype: StorageDtype | str = "bf16") -> int:
        """KV bytes one layer caches per token: ``2 (K,V) x n_kv x (bytes of one d-element
        vector)``, or for MLA one latent vector of ``kv_latent_dim`` elements; scales included.

        Raises:
            UnknownPresetError: an unknown dtype name.
            InvalidArgumentError: a malformed granularity suffix.
        """
        dt = storage_dtype(dtype) if isinstance(dtype, str) else dtype
        if self.kv_latent_dim:
            return dt.vector_bytes(self.kv_latent_dim)
        return 2 * self.num_kv_heads * dt.vector_bytes(self.head_dim)

    def kv_bytes_per_token(self, dtype: StorageDtype | str = "bf16") -> int:
        """KV bytes per token when every layer keeps every token: ``L x``
        :meth:`kv_layer_bytes` (``2 x L x n_kv x d x p`` + scales; MLA: ``L x (kv_lora_rank +
        rope) x p``). For a windowed model (:attr:`windowed`) this is the full-history
        figure, an upper bound: use :meth:`kv_bytes` for the bytes of a sequence.

        Args:
            dtype: a :class:`StorageDtype` or a spelling :func:`storage_dtype` accepts.

        Raises:
            UnknownPresetError: an unknown dtype name.
            InvalidArgumentError: a malformed granularity suffix.
        """
        return self.num_layers * self.kv_layer_bytes(dtype)

    def kv_bytes(self, seq_len: int, dtype: StorageDtype | str = "bf16", block_size: int = 1) -> int:
        """KV bytes of one sequence of ``seq_len`` tokens: over the layer groups,
        ``layers x tokens held x`` :meth:`kv_layer_bytes`, the tokens a group holds
        (:meth:`LayerGroup.tokens_held`: a window caps them) rounded up to whole blocks of
        ``block_size`` tokens. Equals ``seq_len x`` :meth:`kv_bytes_per_token` for a model
        without windows and ``block_size`` 1.

        Raises:
            InvalidArgumentError: ``seq_len`` < 0 or ``block_size`` < 1 (or not integers);
                a malformed dtype granularity.
            UnknownPresetError: an unknown dtype name.
        """
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise InvalidArgumentError(f"block_size must be an integer >= 1, got {block_size!r}")
        per_layer = self.kv_layer_bytes(dtype)
        total = 0
        for g in self.groups:
            held = -(-g.tokens_held(seq_len) // block_size) * block_size
            total += g.layers * held
        return total * per_layer

    def attended_tokens(self, seq_len: int) -> int:
        """Sum over layers of the tokens a query at position ``seq_len`` attends to
        (``L x seq_len`` without windows), for attention FLOPs.

        Raises:
            InvalidArgumentError: ``seq_len`` not an integer >= 0.
        """
        return sum(g.layers * g.tokens_held(seq_len) for g in self.groups)

    @property
    def weight_bytes(self) -> float:
        """Weights in bytes: ``num_params x weight_bytes_per_param`` (all experts)."""
        return self.num_params * self.weight_bytes_per_param

    def with_kv_heads(self, num_kv_heads: int, name: str | None = None) -> ModelConfig:
        """The same model with another KV head count (e.g. the MHA variant).

        Raises:
            InvalidArgumentError: ``num_kv_heads`` < 1 or not dividing the query heads.
        """
        return replace(self, num_kv_heads=num_kv_heads,
                       name=name or f"{self.name} (n_kv={num_kv_heads})")

    def all_global(self, name: str | None = None) -> ModelConfig:
        """The same model with every layer full attention (windows removed).

        Raises:
            InvalidArgumentError: ``name`` is not a string (the model itself is valid).
        """
        if name is not None and not isinstance(name, str):
            raise InvalidArgumentError(f"name must be a string, got {name!r}")
        return replace(self, layer_groups=(), name=name or f"{self.name} (all global)")

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
        ``hidden_size / num_attention_heads``) and ``max_position_embeddings``; the layer
        kinds (``layer_types``, ``sliding_window`` and ``use_sliding_window``,
        ``sliding_window_pattern``, Gemma 2's alternation, ``attention_chunk_size`` with
        ``no_rope_layers``, ``max_window_layers``); multi-head latent attention
        (``kv_lora_rank`` + ``qk_rope_head_dim`` cached per token per layer); a nested
        ``text_config``. When ``num_params`` is not given it is estimated (attention
        projections, MLA's low-rank ones, gated MLP or experts with their router and shared
        experts, norms, embeddings), with the active count of a mixture of experts
        (``num_experts_per_tok`` routed plus the shared ones; ``first_k_dense_replace``
        dense layers). See :mod:`pykvpool.planning.hf_config` for the exact rules.

        What is still not modelled is refused rather than given a wrong size: layer kinds
        other than full, sliding and chunked attention (``layer_types``,
        ``layers_block_type``, ``attn_layer_period``, ``hybrid_override_pattern``),
        ``attention_chunk_size`` without ``layer_types`` or ``no_rope_layers``, and when the
        parameters are estimated, experts on only some layers (``decoder_sparse_step``,
        ``mlp_only_layers``).

        The work is bounded whatever the dict holds: layers are counted by kind, never
        listed, so ``num_hidden_layers`` up to 2**31 - 1 costs what 32 cost.

        Raises:
            TypeError: ``config`` is not a mapping.
            InvalidArgumentError: a missing key, a count that is no integer (floats and
                bools are refused) or lies outside ``0 .. 2**31 - 1``, a switch that is no
                bool, a name that is no string, inconsistent sizes, or one of the unmodelled
                features above (the message names the key).
        """
        fields = parse_hf_config(config, num_params)
        default_name = fields.pop("_name")
        return cls(name=name or default_name, weight_bytes_per_param=weight_bytes_per_param, **fields)


_LLAMA3_8B = ModelConfig("Llama-3-8B", 32, 32, 8, 128, 8.03e9, 2.0, 8192)

# The presets below carry the values of each model's published Hugging Face config.json,
# written from knowledge of those public files (they were not downloaded here); parameter
# counts are the ones the authors publish. Weights are counted at 2 bytes per parameter
# (bf16) for every preset; pass --weight-bytes for another storage.

# mistralai/Mistral-7B-v0.1: num_hidden_layers 32, num_attention_heads 32,
# num_key_value_heads 8, hidden_size 4096 (head_dim 128), sliding_window 4096 on every
# layer, max_position_embeddings 32768; 7.24e9 parameters.
_MISTRAL_7B = ModelConfig("Mistral-7B-v0.1", 32, 32, 8, 128, 7.24e9, 2.0, 32768,
                          layer_groups=(LayerGroup("sliding", 32, 4096),))

# google/gemma-2-9b: model_type gemma2, num_hidden_layers 42, num_attention_heads 16,
# num_key_value_heads 8, head_dim 256, sliding_window 4096 on the even layers (local and
# global alternate, local first), max_position_embeddings 8192; 9.24e9 parameters.
_GEMMA2_9B = ModelConfig("Gemma-2-9B", 42, 16, 8, 256, 9.24e9, 2.0, 8192,
                         layer_groups=(LayerGroup("sliding", 21, 4096), LayerGroup("full", 21)))

# google/gemma-3-12b (text_config): num_hidden_layers 48, num_attention_heads 16,
# num_key_value_heads 8, head_dim 256, sliding_window 1024, sliding_window_pattern 6
# (5 local : 1 global, so 40 local + 8 global), max_position_embeddings 131072;
# 12.2e9 parameters (vision tower included).
_GEMMA3_12B = ModelConfig("Gemma-3-12B", 48, 16, 8, 256, 12.2e9, 2.0, 131072,
                          layer_groups=(LayerGroup("sliding", 40, 1024), LayerGroup("full", 8)))

# deepseek-ai/DeepSeek-V2-Lite: num_hidden_layers 27, num_attention_heads 16, MLA with
# kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128, q_lora_rank
# null (cached per token per layer: 512 + 64 elements, one latent for K and V, so
# (512 + 64) x 27 x 2 = 31,104 B/token in bf16); n_routed_experts 64, n_shared_experts 2,
# num_experts_per_tok 6, moe_intermediate_size 1408, first_k_dense_replace 1;
# max_position_embeddings 163840; 15.7e9 parameters, 2.4e9 active.
_DEEPSEEK_V2_LITE = ModelConfig("DeepSeek-V2-Lite", 27, 16, 1, 192, 15.7e9, 2.0, 163840,
                                kv_latent_dim=576, active_params=2.4e9)

# openai/gpt-oss-20b: num_hidden_layers 24, layer_types alternating sliding_attention /
# full_attention (sliding first), sliding_window 128, num_attention_heads 64,
# num_key_value_heads 8, head_dim 64, num_local_experts 32, num_experts_per_tok 4,
# max_position_embeddings 131072; 20.9e9 parameters, 3.6e9 active. (Its learned attention
# sinks are per-head logits, not cached tokens: no KV. The release stores the experts in
# MXFP4; counted here at 2 bytes like the others.)
_GPT_OSS_20B = ModelConfig("gpt-oss-20b", 24, 64, 8, 64, 20.9e9, 2.0, 131072,
                           layer_groups=(LayerGroup("sliding", 12, 128), LayerGroup("full", 12)),
                           active_params=3.6e9)

# Qwen/Qwen3-30B-A3B: num_hidden_layers 48, num_attention_heads 32, num_key_value_heads 4,
# head_dim 128, num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768,
# use_sliding_window false, max_position_embeddings 40960; 30.5e9 parameters, 3.3e9 active.
_QWEN3_30B_A3B = ModelConfig("Qwen3-30B-A3B", 48, 32, 4, 128, 30.5e9, 2.0, 40960,
                             active_params=3.3e9)

MODELS: dict[str, ModelConfig] = {
    # Published configurations (Hugging Face config.json of each model card); parameter
    # counts as published by the model authors.
    "llama-3-8b": _LLAMA3_8B,
    "llama-3-70b": ModelConfig("Llama-3-70B", 80, 64, 8, 128, 70.6e9, 2.0, 8192),
    "mistral-7b": _MISTRAL_7B,
    "qwen2.5-7b": ModelConfig("Qwen2.5-7B", 28, 28, 4, 128, 7.62e9, 2.0, 131072),
    # The article's MHA variant: Llama-3-8B with one KV head per query head.
    "llama-3-8b-mha": _LLAMA3_8B.with_kv_heads(32, "Llama-3-8B MHA variant (n_kv=32)"),
    # A real MHA model, for comparison.
    "llama-2-7b": ModelConfig("Llama-2-7B (MHA)", 32, 32, 32, 128, 6.74e9, 2.0, 4096),
    "gemma-2-9b": _GEMMA2_9B,
    "gemma-3-12b": _GEMMA3_12B,
    "deepseek-v2-lite": _DEEPSEEK_V2_LITE,
    "gpt-oss-20b": _GPT_OSS_20B,
    "qwen3-30b-a3b": _QWEN3_30B_A3B,
}
"""Model presets by lower-case name (published configurations); see :func:`model_preset`."""


def model_preset(name: str) -> ModelConfig:
    """Look up a preset by name (case-insensitive), e.g. ``"llama-3-8b"``.

    Raises:
        UnknownPresetError: not one of :data:`MODELS`.
    """
    return lookup_preset("model", MODELS, name)
