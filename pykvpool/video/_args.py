"""Argument checks of the video cache: each returns the checked value or raises ``TypeError``
(a wrong kind of object) or :class:`pykvpool.InvalidArgumentError` naming the argument."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pykvpool.checks import check_count, invalid

__all__ = ["check_f32", "check_grid", "check_id", "check_ids", "check_layer"]

#: Largest stream id (the pool's ids are non-negative int64).
MAX_ID = 2**63 - 1


def check_id(v: object, name: str) -> int:
    """A stream id: an int in ``0..2**63``.

    Raises:
        InvalidArgumentError: not an int, a bool, negative or too large.
    """
    s = check_count(v, name)
    if s > MAX_ID:
        raise invalid(f"{name} must be below 2**63, got {s}")
    return s


def check_ids(v: object, name: str) -> list[int]:
    """Distinct stream ids, at least one: a list, tuple or 1-D integer array.

    Raises:
        TypeError: not a list, tuple or numpy array.
        InvalidArgumentError: empty, a bad id, an id listed twice, a non-integer or
            non-1-D array.
    """
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype.kind not in "iu":
            raise invalid(f"{name} must be a 1-D integer array, got {v.dtype} of shape {v.shape}")
        items: list[Any] = v.tolist()
    elif isinstance(v, (list, tuple)):
        items = list(v)
    else:
        raise TypeError(f"{name} must be a list of stream ids, got {type(v).__name__}")
    if not items:
        raise invalid(f"{name} must list at least one stream")
    ids = [check_id(x, f"{name}[{i}]") for i, x in enumerate(items)]
    if len(set(ids)) != len(ids):
        dup = next(s for s in ids if ids.count(s) > 1)
        raise invalid(f"{name}: stream {dup} is listed twice")
    return ids


def check_grid(v: object, tokens_per_frame: int) -> tuple[int, int]:
    """The ``(h, w)`` grid of a frame, ``h * w == tokens_per_frame``.

    Raises:
        TypeError: not a tuple or list.
        InvalidArgumentError: not two ints >= 1, or a product other than
            ``tokens_per_frame``.
    """
    if not isinstance(v, (tuple, list)):
        raise TypeError(f"grid must be a (h, w) tuple, got {type(v).__name__}")
    if len(v) != 2:
        raise invalid(f"grid must be two ints (h, w), got {len(v)} values")
    h, w = check_count(v[0], "grid[0]", 1), check_count(v[1], "grid[1]", 1)
    if h * w != tokens_per_frame:
        raise invalid(f"grid: {h} x {w} = {h * w} tokens, but tokens_per_frame is {tokens_per_frame}")
    return h, w


def check_layer(v: object, num_layers: int) -> int:
    """A layer index in ``0..num_layers``.

    Raises:
        InvalidArgumentError: not an int or out of range.
    """
    layer = check_count(v, "layer")
    if layer >= num_layers:
        raise invalid(f"layer must be in 0..{num_layers}, got {layer}")
    return layer


def check_f32(v: object, name: str, rows: int, heads: int | None, head_dim: int) -> npt.NDArray[np.float32]:
    """A float32 array ``[rows, heads, head_dim]`` (``heads`` None: any positive number).

    Raises:
        TypeError: not a numpy array.
        InvalidArgumentError: another dtype or shape.
    """
    if not isinstance(v, np.ndarray):
        raise TypeError(f"{name} must be a numpy float32 array, got {type(v).__name__}")
    if v.dtype != np.float32:
        raise invalid(f"{name} must be float32, got {v.dtype}")
    want = f"[{rows}, {'H' if heads is None else heads}, {head_dim}]"
    ok = v.ndim == 3 and v.shape[0] == rows and v.shape[2] == head_dim and v.shape[1] >= 1
    if not ok or (heads is not None and v.shape[1] != heads):
        raise invalid(f"{name} must have shape {want}, got {list(v.shape)}")
    return v

