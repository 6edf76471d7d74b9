"""Read a Hugging Face ``config.json`` dict into the fields of a
:class:`pykvpool.planning.models.ModelConfig` (``ModelConfig.from_hf_config`` is the
public entry).

Modelled: dense and mixture-of-experts decoders (``n_routed_experts`` /
``num_local_experts`` / ``num_experts``, ``moe_intermediate_size``, ``n_shared_experts``,
``shared_expert_intermediate_size``, ``num_experts_per_tok``, ``first_k_dense_replace``);
multi-head latent attention (``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``,
``v_head_dim``, ``q_lora_rank``); per-layer attention kinds from ``layer_types``
(``full_attention``, ``sliding_attention``, ``chunked_attention``), from
``sliding_window_pattern`` (every Nth layer global, Gemma 3), from ``model_type`` ``gemma2``
(alternating, sliding first), from ``no_rope_layers`` with ``attention_chunk_size`` (Llama 4:
the RoPE layers are chunked, the NoPE ones global), from ``max_window_layers`` (Qwen2: layers
from that index on are windowed when ``use_sliding_window`` is true), or every layer sliding
when only ``sliding_window`` is set (Mistral); a window at least as long as
``max_position_embeddings`` is full attention. A nested ``text_config`` (Gemma 3) is read
when the top level has no ``num_hidden_layers``.

Still refused, naming the key: layer kinds other than those three (linear attention, state
space layers: ``layer_types``, ``layers_block_type``, ``attn_layer_period``,
``hybrid_override_pattern``), ``attention_chunk_size`` without any statement of which layers
are chunked, and, when the parameter count is estimated, experts on only some layers
(``decoder_sparse_step`` other than 1, a non-empty ``mlp_only_layers``).

Bounded work whatever the config holds: the layers of each kind are counted, never listed,
so a rule (a pattern, the alternation, ``max_window_layers``, one kind for all) costs the same
for 2**31 - 1 layers as for 32; ``layer_types`` and ``no_rope_layers`` are read once (a list
per layer in the file itself). Every count is an integer in ``0 .. 2**31 - 1`` (never a
float or a bool), every switch a bool, every name a string; a refusal shows at most 60
characters of the value, however long or deeply nested it is.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Mapping
from typing import Any

from pykvpool._native import InvalidArgumentError
from pykvpool.planning.layers import LayerGroup

__all__ = ["parse_hf_config"]

MAX_CONFIG_INT = 2**31 - 1
_EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
_HYBRID_KEYS = ("layers_block_type", "attn_layer_period", "hybrid_override_pattern")
_KINDS = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}


class _Short(reprlib.Repr):
    """A repr of bounded length and depth, whatever the value holds."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxlist, self.maxdict, self.maxstring, self.maxother = 3, 6, 4, 40, 40

    def repr_int(self, x: int, level: int) -> str:
        # A huge int's full repr is refused by Python's digit limit (and is long anyway).
        return super().repr_int(x, level) if x.bit_length() <= 128 else f"<{x.bit_length():,}-bit int>"


def _show(value: Any) -> str:
    text = _Short().repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse(config: Mapping[str, Any], key: str, what: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"config.json {key!r} = {_show(config[key])}: {what} is not modelled yet; "
                                "the KV or weight size would be wrong")


class _Reader:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.c = config

    def int(self, key: str, default: int | None = None, lo: int = 0) -> int:
        value = self.c.get(key)
        value = default if value is None else value
        if value is None:
            raise InvalidArgumentError(f"config.json has no {key!r}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(f"config.json {key!r} must be an integer, got {_show(value)}")
        if not lo <= value <= MAX_CONFIG_INT:
            raise InvalidArgumentError(f"config.json {key!r} must be in {lo} .. {MAX_CONFIG_INT}, "
                                       f"got {_show(value)}")
        return value

    def flag(self, key: str) -> bool | None:
        """A switch: true, false or absent (None)."""
        value = self.c.get(key)
        if value is not None and not isinstance(value, bool):
            raise InvalidArgumentError(f"config.json {key!r} must be true or false, got {_show(value)}")
        return value

    def text(self, key: str) -> str | None:
        """A string, or None when absent."""
        value = self.c.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidArgumentError(f"config.json {key!r} must be a string, got {_show(value)}")
        return value


_Kinds = dict[str, tuple[int, int]]
"""Attention kind -> (its first layer, its number of layers); kinds of no layer are absent."""


def _kinds(*runs: tuple[str, int, int]) -> _Kinds:
    """The kinds of ``(kind, first layer, layers)`` runs that have layers."""
    return {kind: (first, n) for kind, first, n in runs if n > 0}


def _listed(kinds: Iterable[str]) -> _Kinds:
    """The kinds of a per-layer list (one read of a list the config itself holds)."""
    out: _Kinds = {}
    for i, kind in enumerate(kinds):
        first, n = out.get(kind, (i, 0))
        out[kind] = (first, n + 1)
    return out


def _no_rope_kinds(c: Mapping[str, Any], layers: int) -> _Kinds:
    nope = c.get("no_rope_layers")
    if not (isinstance(nope, list) and len(nope) == layers):
        raise _refuse(c, "attention_chunk_size", "chunked attention without layer_types or "
                      "no_rope_layers (which layers are chunked)")
    if any(not isinstance(flag, int) or flag not in (0, 1) for flag in nope):
        raise InvalidArgumentError(f"config.json 'no_rope_layers' must hold 0 or 1 (or false or true) "
                                   f"per layer, got {_show(nope)}")
    return _listed("chunked" if flag else "full" for flag in nope)


def _layer_kinds(c: Mapping[str, Any], r: _Reader, layers: int) -> _Kinds:
    for key in _HYBRID_KEYS:
        if c.get(key) is not None:
            raise _refuse(c, key, "layers other than attention (state space, linear attention)")
    types = c.get("layer_types")
    if types is not None:
        if (not isinstance(types, list) or len(types) != layers
                or any(not isinstance(t, str) or t not in _KINDS for t in types)):
            raise _refuse(c, "layer_types", f"a layer kind other than {', '.join(_KINDS)} "
                          f"(or not one per layer, {layers})")
        return _listed(_KINDS[t] for t in types)
    if c.get("attention_chunk_size") is not None:
        return _no_rope_kinds(c, layers)
    if c.get("sliding_window") is None or r.flag("use_sliding_window") is False:
        return _kinds(("full", 0, layers))
    if c.get("sliding_window_pattern") is not None:  # layer i is global when (i + 1) % n == 0
        n = r.int("sliding_window_pattern", lo=1)
        return _kinds(("sliding", 0, layers - layers // n), ("full", n - 1, layers // n))
    if r.text("model_type") == "gemma2":  # even layers sliding, odd ones global
        return _kinds(("sliding", 0, (layers + 1) // 2), ("full", 1, layers // 2))
    if r.flag("use_sliding_window") is True and c.get("max_window_layers") is not None:
        first = r.int("max_window_layers")  # layers from this one on are windowed
        return _kinds(("full", 0, min(first, layers)), ("sliding", first, layers - min(first, layers)))
    return _kinds(("sliding", 0, layers))


def layer_groups(c: Mapping[str, Any], r: _Reader, layers: int, context: int) -> tuple[LayerGroup, ...]:
    """The layer groups of a config, in order of first appearance; () when all are full (a
    window as long as the ``context`` is full attention)."""
    kinds = _layer_kinds(c, r, layers)
    if "sliding" in kinds and r.int("sliding_window", lo=1) >= context:
        (s_first, s_n), (f_first, f_n) = kinds.pop("sliding"), kinds.get("full", (layers, 0))
        kinds["full"] = (min(s_first, f_first), s_n + f_n)
    if set(kinds) == {"full"}:
        return ()
    sizes: dict[str, int | None] = {"full": None, "sliding": None, "chunked": None}
    if "sliding" in kinds:
        sizes["sliding"] = r.int("sliding_window", lo=1)
    if "chunked" in kinds:
        sizes["chunked"] = r.int("attention_chunk_size", lo=1)
    order = sorted(kinds, key=lambda k: kinds[k][0])
    return tuple(LayerGroup(k, kinds[k][1], sizes[k]) for k in order)


def _attention_params(c: Mapping[str, Any], r: _Reader, hidden: int, n_q: int, n_kv: int,
                      head_dim: int) -> int:
    if c.get("kv_lora_rank") is None:
        return hidden * n_q * head_dim * 2 + hidden * n_kv * head_dim * 2
    rank, rope = r.int("kv_lora_rank", lo=1), r.int("qk_rope_head_dim")
    nope = r.int("qk_nope_head_dim", head_dim - rope)
    v = r.int("v_head_dim", nope)
    qk = nope + rope
    q_rank = c.get("q_lora_rank")
    q = hidden * n_q * qk if q_rank is None else (hidden + n_q * qk + 1) * r.int("q_lora_rank", lo=1)
    return q + hidden * (rank + rope) + rank + rank * n_q * (nope + v) + n_q * v * hidden


def _mlp_params(c: Mapping[str, Any], r: _Reader, hidden: int, layers: int) -> tuple[int, int]:
    """(total, active) MLP parameters over all layers."""
    inter = r.int("intermediate_size")
    dense = 3 * hidden * inter
    n_exp = 0
    for key in _EXPERT_KEYS:
        if c.get(key) is not None:
            n_exp = r.int(key)
            break
    if n_exp <= 1:
        return layers * dense, layers * dense
    if c.get("decoder_sparse_step") is not None and r.int("decoder_sparse_step", lo=1) != 1:
        raise _refuse(c, "decoder_sparse_step", "experts on only some layers")
    if c.get("mlp_only_layers"):
        raise _refuse(c, "mlp_only_layers", "experts on only some layers")
    expert = 3 * hidden * r.int("moe_intermediate_size", inter, lo=1)
    k_key = ("experts_per_token" if c.get("num_experts_per_tok") is None
             and c.get("experts_per_token") is not None else "num_experts_per_tok")
    k = r.int(k_key, lo=1)
    shared = r.int("n_shared_experts", 0) * expert
    if c.get("shared_expert_intermediate_size") is not None:
        shared += 3 * hidden * r.int("shared_expert_intermediate_size") + hidden  # + its gate
    router = hidden * n_exp
    first_dense = min(r.int("first_k_dense_replace", 0), layers)
    moe_layers = layers - first_dense
    total = first_dense * dense + moe_layers * (n_exp * expert + shared + router)
    active = first_dense * dense + moe_layers * (min(k, n_exp) * expert + shared + router)
    return total, active


def parse_hf_config(config: Mapping[str, Any], num_params: float | None) -> dict[str, Any]:
    """The ``ModelConfig`` fields (all but ``name`` and ``weight_bytes_per_param``) of a
    ``config.json`` dict; parameters estimated when ``num_params`` is None.

    Raises:
        TypeError: ``config`` is not a mapping.
        InvalidArgumentError: a missing key, a count that is no integer (a float, a bool) or
            lies outside ``0 .. 2**31 - 1``, a switch that is no bool, a name that is no
            string, or a feature that is not modelled (the message names the key).
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping (a config.json object), got {type(config).__name__}")
    c = config
    text = c.get("text_config")
    if isinstance(text, Mapping) and c.get("num_hidden_layers") is None:
        c = {**text}
    r = _Reader(c)
    layers = r.int("num_hidden_layers", lo=1)
    n_q = r.int("num_attention_heads", lo=1)
    n_kv = r.int("num_key_value_heads", n_q, lo=1)
    hidden = r.int("hidden_size")
    head_dim = r.int("head_dim", hidden // n_q)
    latent = 0
    if c.get("kv_lora_rank") is not None:
        rope = r.int("qk_rope_head_dim")
        latent = r.int("kv_lora_rank", lo=1) + rope
        head_dim = r.int("qk_nope_head_dim", max(head_dim - rope, 0)) + rope
        n_kv = 1
    context = r.int("max_position_embeddings", 8192, lo=1)
    groups = layer_groups(c, r, layers, context)
    active = None
    if num_params is None:
        attn = _attention_params(c, r, hidden, n_q, n_kv, head_dim)
        mlp_total, mlp_active = _mlp_params(c, r, hidden, layers)
        vocab = r.int("vocab_size")
        embed = vocab * hidden * (1 if r.flag("tie_word_embeddings") else 2)
        common = layers * (attn + 2 * hidden) + hidden + embed
        num_params = float(common + mlp_total)
        active = float(common + mlp_active) if mlp_active != mlp_total else None
    return {"num_layers": layers, "num_q_heads": n_q, "num_kv_heads": n_kv, "head_dim": head_dim,
            "num_params": num_params, "max_context": context,
            "layer_groups": groups, "kv_latent_dim": latent, "active_params": active,
            "_name": _name(r, _Reader(config))}


def _name(r: _Reader, top: _Reader) -> str:
    """The display name: the first non-empty of the (text) config's ``_name_or_path`` and
    ``model_type``, else ``"custom"``."""
    names = (r.text("_name_or_path"), top.text("_name_or_path"), r.text("model_type"), top.text("model_type"))
    return next((n for n in names if n), "custom")
