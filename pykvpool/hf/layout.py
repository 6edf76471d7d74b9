"""A transformers model's attention layers as the groups of one :class:`BlockPool`.

Layers of one attention kind share a group (full attention, or a sliding window of ``W``
positions; Llama-4's chunked attention is refused: the kernels lack its mask); the
layers of all groups share one :class:`KvCache` the way
vLLM's hybrid allocator shares its tensors: model layer ``l``, the ``j``-th layer of its
group, lives in cache layer ``j``, at the blocks of its group's table (blocks of different
groups never overlap), so the cache has as many layers as the largest group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pykvpool._native import FullAttention, SlidingWindow
from pykvpool.checks import invalid

__all__ = ["ModelLayout", "model_layout"]


@dataclass(frozen=True)
class ModelLayout:
    """Where each model layer's K/V lives.

    Attributes:
        groups: the pool's groups, one per attention kind, in first-use order.
        group_of: per model layer, its group index.
        cache_layer: per model layer, its :class:`KvCache` layer (rank in its group).
        window: per model layer, its sliding window in positions (tokens) including the
            query's own, or None.
        num_kv_heads: KV heads per layer.
        head_dim: elements per head.
    """

    groups: tuple[Any, ...]
    group_of: tuple[int, ...]
    cache_layer: tuple[int, ...]
    window: tuple[int | None, ...]
    num_kv_heads: int
    head_dim: int

    @property
    def num_layers(self) -> int:
        """Model layers.

        Raises:
            Nothing.
        """
        return len(self.group_of)

    @property
    def cache_layers(self) -> int:
        """Layers of the shared :class:`KvCache` (the largest group's layer count).

        Raises:
            Nothing.
        """
        return max(self.cache_layer) + 1


def _kinds(config: Any) -> list[tuple[str, int | None]]:
    """``(kind, size)`` per layer, by transformers' own reading of the config."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, kwargs = get_layer_types_and_kwargs(config)
    out: list[tuple[str, int | None]] = []
    for i, (t, kw) in enumerate(zip(types, kwargs)):
        if t == "full_attention":
            out.append(("full", None))
        elif t == "sliding_attention":
            out.append(("window", int(kw["sliding_window"])))
        else:
            raise invalid(f"config: layer {i} has attention kind {t!r}, which pykvpool.hf does not store")
    return out


def model_layout(config: Any) -> ModelLayout:
    """The layout of ``config``'s decoder (a transformers ``PretrainedConfig``).

    Raises:
        InvalidArgumentError: a layer kind other than full or sliding-window attention
            (chunked or linear attention, KV sharing), or a window below 1 token.
    """
    config = config.get_text_config(decoder=True)
    kinds = _kinds(config)
    keys: list[tuple[str, int | None]] = []
    group_of: list[int] = []
    cache_layer: list[int] = []
    seen: dict[tuple[str, int | None], list[int]] = {}  # kind -> [its group, its layers so far]
    for kind in kinds:
        if kind not in seen:
            seen[kind] = [len(keys), 0]
            keys.append(kind)
        g, rank = seen[kind]
        cache_layer.append(rank)
        seen[kind][1] += 1
        group_of.append(g)
    groups = []
    for name, size in keys:
        if size is not None and size < 1:
            raise invalid(f"config: a {name} of {size} tokens (must be >= 1)")
        groups.append(FullAttention() if size is None else SlidingWindow(size))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return ModelLayout(
        groups=tuple(groups),
        group_of=tuple(group_of),
        cache_layer=tuple(cache_layer),
        window=tuple(s for _, s in kinds),
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
    )
