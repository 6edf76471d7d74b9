"""Model configurations: the inputs of every memory ledger.

A :class:`ModelConfig` holds what the KV cache and the weights depend on: layers, query and
KV heads, head dimension (elements), the layer groups of windowed models, MLA's latent
width and parameter count. :data:`MODELS` carries published configurations, each naming
the ``config.json`` it was read from (:attr:`ModelConfig.source`);
:meth:`ModelConfig.from_hf_config` builds one from a Hugging Face ``config.json`` dict.

The KV storage dtypes (:class:`StorageDtype`, :func:`storage_dtype`,
:func:`compute_precision`, :data:`DTYPES`, :data:`DTYPE_ALIASES`) live in
:mod:`pykvpool.planning.dtypes` and are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pykvpool._native import InvalidArgumentError
from pykvpool.errors import lookup_preset
from pykvpool.planning.dtypes import DTYPE_ALIASES, DTYPES, StorageDtype, compute_precision, storage_dtype
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
        source: where the numbers come from, e.g. ``"meta-llama/Llama-3.1-8B config.json"``
            for a preset; empty when not stated.

    Raises:
        InvalidArgumentError: any size < 1, ``num_q_heads`` not a multiple of
            ``num_kv_heads``, layer groups whose layers do not add up to ``num_layers``, a
            negative latent width, or active parameters above the total.
        TypeError: ``source`` is not a string.
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
    source: str = ""

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
        if not isinstance(self.source, str):
            raise TypeError(f"source must be a string, got {type(self.source).__name__}")

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

    def kv_replicas(self, devices: int) -> float:
        """Copies of each token's KV a tensor-parallel replica of ``devices`` devices
        stores: the K/V heads are divided over the devices, and when there are more
        devices than heads each head is kept on ``devices / num_kv_heads`` of them (vLLM's
        rule); MLA's latent (``num_kv_heads`` 1) is kept whole on every device.

        Raises:
            InvalidArgumentError: ``devices`` not an integer >= 1.
        """
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise InvalidArgumentError(f"devices must be an integer >= 1, got {devices!r}")
        return max(1.0, devices / self.num_kv_heads)

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



# Each preset carries the values of its model's published Hugging Face config.json (the
# file its `source` names; tests/planning checks each against ModelConfig.from_hf_config
# of those values) and the parameter count its authors publish (all experts of a mixture
# of experts: every expert is resident). Weights are counted at 2 bytes per parameter
# (bf16) for every preset, whatever the release stores (DeepSeek-V3 ships fp8 weights,
# gpt-oss MXFP4 experts); pass --weight-bytes for another storage.


def _full(name: str, layers: int, q: int, kv: int, d: int, params: float, context: int, source: str,
          active: float | None = None) -> ModelConfig:
    """A preset whose every layer is full attention."""
    return ModelConfig(name, layers, q, kv, d, params, 2.0, context, active_params=active, source=source)


def _hf(repo: str) -> str:
    return f"{repo} config.json"


_LLAMA3_8B = _full("Llama-3-8B", 32, 32, 8, 128, 8.03e9, 8192, _hf("meta-llama/Meta-Llama-3-8B"))
# Llama 3.1 and 3.3: the Llama 3 shapes with rope_scaling llama3 (factor 8) and
# max_position_embeddings 131072; Llama-3.3-70B has Llama-3.1-70B's architecture.
_LLAMA31_70B_SHAPE = (80, 64, 8, 128, 70.6e9, 131072)

# Sliding windows (LayerGroup, tokens): mistralai/Mistral-7B-v0.1 windows every layer
# (sliding_window 4096); Gemma 2 alternates local (4096) and global, local first; Gemma 3
# has sliding_window_pattern 6 (5 local of 1024 : 1 global): 48 layers = 40 + 8, 62 = 52 +
# 10; gpt-oss alternates sliding (128) and full, sliding first (its learned attention sinks
# are per-head logits, not cached tokens: no KV).
_MISTRAL_7B = ModelConfig("Mistral-7B-v0.1", 32, 32, 8, 128, 7.24e9, 2.0, 32768, (LayerGroup("sliding", 32, 4096),),
                          source=_hf("mistralai/Mistral-7B-v0.1"))
_GEMMA2_9B = ModelConfig("Gemma-2-9B", 42, 16, 8, 256, 9.24e9, 2.0, 8192,
                         (LayerGroup("sliding", 21, 4096), LayerGroup("full", 21)), source=_hf("google/gemma-2-9b"))
_GEMMA3_12B = ModelConfig("Gemma-3-12B", 48, 16, 8, 256, 12.2e9, 2.0, 131072,  # vision tower included
                          (LayerGroup("sliding", 40, 1024), LayerGroup("full", 8)),
                          source=_hf("google/gemma-3-12b-it") + " (text_config)")
_GEMMA3_27B = ModelConfig("Gemma-3-27B", 62, 32, 16, 128, 27.4e9, 2.0, 131072,  # vision tower included
                          (LayerGroup("sliding", 52, 1024), LayerGroup("full", 10)),
                          source=_hf("google/gemma-3-27b-it") + " (text_config)")
_GPT_OSS_20B = ModelConfig("gpt-oss-20b", 24, 64, 8, 64, 20.9e9, 2.0, 131072,
                           (LayerGroup("sliding", 12, 128), LayerGroup("full", 12)), active_params=3.6e9,
                           source=_hf("openai/gpt-oss-20b"))
_GPT_OSS_120B = ModelConfig("gpt-oss-120b", 36, 64, 8, 64, 116.8e9, 2.0, 131072,
                            (LayerGroup("sliding", 18, 128), LayerGroup("full", 18)), active_params=5.1e9,
                            source=_hf("openai/gpt-oss-120b"))

# Multi-head latent attention: one latent of kv_lora_rank 512 + qk_rope_head_dim 64 elements
# per token per layer, shared by K, V and every head (head_dim: qk_nope_head_dim 128 + rope).
# DeepSeek-V2-Lite: 27 layers (31,104 B/token in bf16); DeepSeek-V3: 61 layers (70,272).
_DEEPSEEK_V2_LITE = ModelConfig("DeepSeek-V2-Lite", 27, 16, 1, 192, 15.7e9, 2.0, 163840, kv_latent_dim=576,
                                active_params=2.4e9, source=_hf("deepseek-ai/DeepSeek-V2-Lite"))
_DEEPSEEK_V3 = ModelConfig("DeepSeek-V3", 61, 128, 1, 192, 671e9, 2.0, 163840, kv_latent_dim=576,
                           active_params=37e9, source=_hf("deepseek-ai/DeepSeek-V3"))

MODELS: dict[str, ModelConfig] = {
    "llama-3-8b": _LLAMA3_8B,
    "llama-3-70b": _full("Llama-3-70B", 80, 64, 8, 128, 70.6e9, 8192, _hf("meta-llama/Meta-Llama-3-70B")),
    "llama-3.1-8b": _full("Llama-3.1-8B", 32, 32, 8, 128, 8.03e9, 131072, _hf("meta-llama/Llama-3.1-8B")),
    "llama-3.1-70b": _full("Llama-3.1-70B", *_LLAMA31_70B_SHAPE, _hf("meta-llama/Llama-3.1-70B")),
    "llama-3.3-70b": _full("Llama-3.3-70B", *_LLAMA31_70B_SHAPE, _hf("meta-llama/Llama-3.3-70B-Instruct")),
    # The article's MHA variant: Llama-3-8B with one KV head per query head.
    "llama-3-8b-mha": replace(_LLAMA3_8B.with_kv_heads(32, "Llama-3-8B MHA variant (n_kv=32)"),
                              source=_LLAMA3_8B.source + " with num_key_value_heads 32 (MHA)"),
    # A real MHA model, for comparison.
    "llama-2-7b": _full("Llama-2-7B (MHA)", 32, 32, 32, 128, 6.74e9, 4096, _hf("meta-llama/Llama-2-7b-hf")),
    "mistral-7b": _MISTRAL_7B,
    "mistral-small-24b": _full("Mistral-Small-24B", 40, 32, 8, 128, 23.6e9, 32768,
                               _hf("mistralai/Mistral-Small-24B-Instruct-2501")),
    "qwen2.5-7b": _full("Qwen2.5-7B", 28, 28, 4, 128, 7.62e9, 131072, _hf("Qwen/Qwen2.5-7B")),
    # Qwen3: use_sliding_window false; max_position_embeddings 40960 (131072 with YaRN).
    "qwen3-8b": _full("Qwen3-8B", 36, 32, 8, 128, 8.19e9, 40960, _hf("Qwen/Qwen3-8B")),
    "qwen3-32b": _full("Qwen3-32B", 64, 64, 8, 128, 32.8e9, 40960, _hf("Qwen/Qwen3-32B")),
    "qwen3-30b-a3b": _full("Qwen3-30B-A3B", 48, 32, 4, 128, 30.5e9, 40960, _hf("Qwen/Qwen3-30B-A3B"), 3.3e9),
    "qwen3-235b-a22b": _full("Qwen3-235B-A22B", 94, 64, 4, 128, 235e9, 40960, _hf("Qwen/Qwen3-235B-A22B"), 22e9),
    "gemma-2-9b": _GEMMA2_9B,
    "gemma-3-12b": _GEMMA3_12B,
    "gemma-3-27b": _GEMMA3_27B,
    "deepseek-v2-lite": _DEEPSEEK_V2_LITE,
    "deepseek-v3": _DEEPSEEK_V3,
    "gpt-oss-20b": _GPT_OSS_20B,
    "gpt-oss-120b": _GPT_OSS_120B,
}
"""Model presets by lower-case name (published configurations, each naming its source in
:attr:`ModelConfig.source`); see :func:`model_preset`."""


def model_preset(name: str) -> ModelConfig:
    """Look up a preset by name (case-insensitive), e.g. ``"llama-3.1-8b"``.

    Raises:
        UnknownPresetError: not one of :data:`MODELS`.
    """
    return lookup_preset("model", MODELS, name)
