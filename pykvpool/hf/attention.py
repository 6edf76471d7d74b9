"""The ``"pykvpool"`` attention implementation for transformers: K/V written to and read
from pykvpool's pages by its kernels (``prefill_attention`` for prompts and multi-token
passes, ``decode_attention`` for one token per row, Gemma-2's logit soft cap included)."""

from __future__ import annotations

from typing import Any

import torch

from pykvpool._native import decode_attention, prefill_attention
from pykvpool.checks import invalid
from pykvpool.hf.cache import PagedKvCache, active

__all__ = ["ATTN_IMPLEMENTATION", "paged_attention", "padding_mask", "register"]

#: The name models take as ``attn_implementation`` once :func:`register` ran.
ATTN_IMPLEMENTATION = "pykvpool"


def padding_mask(*, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    """The mask function of ``"pykvpool"``: the 2-D padding mask as given (``[batch,
    tokens]``, True for real tokens) or None; causality and windows are the kernels'.

    Raises:
        Nothing.
    """
    return attention_mask


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    sliding_window: int | None = None, softcap: float | None = None,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention call on a :class:`PagedKvCache`: writes this layer's new
    K/V (``key``/``value`` ``[B, Hkv, T, D]``) to their slots and attends ``query`` ``[B,
    Hq, T, D]`` over the pages. A scheduled ragged pass (:meth:`PagedKvCache.schedule`)
    has ``B = 1`` and its sequences' tokens packed along ``T``: one kernel call covers them
    all (``decode_attention`` when each has one token, else ``prefill_attention``).

    Returns:
        ``(out, None)``: ``out`` ``[B, T, Hq, D]`` in ``query``'s dtype (rows of padding
        tokens are zeros or attend the row's first token; their outputs are never used).

    Raises:
        InvalidArgumentError: no :class:`PagedKvCache` was updated for this layer (the
            model must get one as ``cache``), a window differing from the cache's layout,
            dropout during training, padding other than on the left of a prompt, a
            pass of a ragged batch other than the scheduled one.
    """
    layer = int(getattr(module, "layer_idx", -1))
    cache = active(layer)
    if cache is None:
        raise invalid(f'attn_implementation="{ATTN_IMPLEMENTATION}" needs a pykvpool.hf.PagedKvCache as cache '
                      f"(layer {layer} was not updated in one)")
    if dropout:
        raise invalid("dropout: the pykvpool kernels run inference only (dropout must be 0)")
    lay = cache.layout
    if sliding_window != lay.window[layer]:
        raise invalid(f"sliding_window: layer {layer} passes {sliding_window}, its cache group has {lay.window[layer]}")
    rows, hq, tokens, dim = query.shape
    step = cache.begin_forward(attention_mask, rows, tokens, key)
    g, j = lay.group_of[layer], lay.cache_layer[layer]
    hkv = key.shape[1]
    k = key.detach().transpose(1, 2).reshape(rows * tokens, hkv, dim).float()
    v = value.detach().transpose(1, 2).reshape(rows * tokens, hkv, dim).float()
    cache.kv.write(j, k, v, step.slots[g])
    q = query.detach().transpose(1, 2).reshape(rows * tokens, hq, dim).float().contiguous()
    out = torch.empty_like(q)
    window_left = None if sliding_window is None else sliding_window - 1
    if step.decode:
        decode_attention(cache.kv, j, q, step.tables[g], step.seq_lens, scale=scaling, out=out,
                         window_left=window_left, logits_soft_cap=softcap)
    else:
        prefill_attention(cache.kv, j, q, step.qo_indptr, step.tables[g], step.seq_lens,
                          q_positions=step.positions, window_left=window_left, scale=scaling,
                          logits_soft_cap=softcap, out=out)
    return out.view(rows, tokens, hq, dim).to(query.dtype), None


def register() -> None:
    """Register ``"pykvpool"`` with transformers' ``AttentionInterface`` (the attention
    function) and ``AttentionMaskInterface`` (the padding mask); idempotent.

    Raises:
        Nothing.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, padding_mask)
