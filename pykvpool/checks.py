"""Argument checks shared by the planner and the simulator: each returns the checked value
or raises :class:`pykvpool.InvalidArgumentError` naming the argument."""

from __future__ import annotations

import math
import numbers

from pykvpool._native import InvalidArgumentError

__all__ = ["check_count", "check_positive", "invalid"]


def invalid(msg: str) -> InvalidArgumentError:
    """An InvalidArgumentError with ``msg`` (raise it)."""
    return InvalidArgumentError(msg)


def check_count(v: object, name: str, lo: int = 0) -> int:
    """``v`` as an int.

    Raises:
        InvalidArgumentError: ``v`` is not an int (a bool is not) or is < ``lo`` (the
            message names ``name``).
    """
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise invalid(f"{name} must be an int, got {type(v).__name__}")
    if v < lo:
        raise invalid(f"{name} must be >= {lo}, got {v}")
    return int(v)


def check_positive(v: object, name: str, *, zero: bool = False, most: float = math.inf) -> float:
    """A finite real number > 0 (>= 0 with ``zero``) and <= ``most``, else
    InvalidArgumentError naming ``name``.

    Raises:
        InvalidArgumentError: ``v`` is not a real number, not finite or out of range.
    """
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise invalid(f"{name} must be a number, got {type(v).__name__}")
    f = float(v)
    if not (math.isfinite(f) and (f >= 0 if zero else f > 0) and f <= most):
        bound = ">= 0" if zero else "> 0"
        top = "" if most == math.inf else f" and <= {most:g}"
        raise invalid(f"{name} must be finite and {bound}{top}, got {v}")
    return f
