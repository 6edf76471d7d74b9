"""Argument checks shared by the planner and the simulator: each returns the checked value
or raises :class:`pykvpool.InvalidArgumentError` naming the argument."""

from __future__ import annotations

import math
import numbers
import operator
from typing import SupportsIndex, cast

from pykvpool._native import InvalidArgumentError

__all__ = ["check_count", "check_int", "check_positive", "integer_value", "invalid"]


def invalid(msg: str) -> InvalidArgumentError:
    """An InvalidArgumentError with ``msg`` (raise it)."""
    return InvalidArgumentError(msg)


def _is_bool(v: object) -> bool:
    """A bool, a numpy bool, or an array or tensor of a bool dtype."""
    return isinstance(v, bool) or "bool" in str(getattr(v, "dtype", ""))


def integer_value(v: object) -> int | None:
    """``v``'s value when it is an integer: an ``int``, a numpy integer, or a 0-d numpy array
    or tensor of an integer dtype; None for anything else (a bool included).

    Raises:
        Nothing.
    """
    if _is_bool(v):
        return None
    if isinstance(v, numbers.Integral):
        return int(v)
    if getattr(v, "ndim", None) != 0 or not hasattr(type(v), "__index__"):
        return None
    try:
        return operator.index(cast(SupportsIndex, v))
    except TypeError:  # a 0-d float array or tensor
        return None


def _checked_int(v: object, name: str, lo: int | None, not_int: type[Exception]) -> int:
    """``v`` as an int >= ``lo`` (None: no bound); ``not_int`` for a value that is no integer."""
    n = integer_value(v)
    if n is None:
        if _is_bool(v):
            raise invalid(f"{name} must be an int, got bool")
        raise not_int(f"{name} must be an int, got {type(v).__name__}")
    if lo is not None and n < lo:
        raise invalid(f"{name} must be >= {lo}, got {n}")
    return n


def check_count(v: object, name: str, lo: int = 0) -> int:
    """``v`` as an int (see :func:`integer_value` for what is one).

    Raises:
        InvalidArgumentError: ``v`` is not an int (a bool is not) or is < ``lo`` (the
            message names ``name``).
    """
    return _checked_int(v, name, lo, InvalidArgumentError)


def check_int(v: object, name: str, lo: int | None = 0) -> int:
    """``v`` as an int (see :func:`integer_value`), >= ``lo`` unless ``lo`` is None; as
    :func:`check_count`, but a value of a type that holds no integer is a TypeError.

    Raises:
        TypeError: ``v`` is no integer (a float, a string, an array of more than one
            value...); the message names ``name``.
        InvalidArgumentError: ``v`` is a bool, or is < ``lo`` (the message names ``name``).
    """
    return _checked_int(v, name, lo, TypeError)


def check_positive(v: object, name: str, *, zero: bool = False, most: float = math.inf) -> float:
    """A finite real number > 0 (>= 0 with ``zero``) and <= ``most``, else
    InvalidArgumentError naming ``name``.

    Raises:
        InvalidArgumentError: ``v`` is not a real number, not finite or out of range.
    """
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise invalid(f"{name} must be a number, got {type(v).__name__}")
    try:
        f = float(v)
    except OverflowError:  # an int past any float
        raise invalid(f"{name} must be finite, got an integer too large for a float") from None
    if not (math.isfinite(f) and (f >= 0 if zero else f > 0) and f <= most):
        bound = ">= 0" if zero else "> 0"
        top = "" if most == math.inf else f" and <= {most:g}"
        raise invalid(f"{name} must be finite and {bound}{top}, got {v}")
    return f
