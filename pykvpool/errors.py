"""Errors raised by the pure-Python planning modules (ledger, workloads, sweeps, CLI).

They extend the compiled core's hierarchy, so ``except pykvpool.KvPoolError`` (or the
builtin ``ValueError``) catches them together with the pool's own errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pykvpool._native import InvalidArgumentError, KvPoolError

_T = TypeVar("_T")

__all__ = [
    "BudgetError",
    "TraceFormatError",
    "UnknownPresetError",
    "lookup_preset",
]


class UnknownPresetError(InvalidArgumentError):
    """A model, hardware, dtype or workload name that is not a known preset.

    ``name`` is the rejected name, ``choices`` the known ones.
    """

    def __init__(self, kind: str, name: str, choices: list[str]) -> None:
        self.name = name
        self.choices = choices
        super().__init__(f"unknown {kind} {name!r}; choose one of: {', '.join(choices)}")


def lookup_preset(kind: str, table: Mapping[str, _T], name: str) -> _T:
    """``table[name]`` with the name stripped and lower-cased.

    Raises:
        UnknownPresetError: no such ``kind`` preset; the message lists the known names.
    """
    key = name.strip().lower()
    if key not in table:
        raise UnknownPresetError(kind, name, sorted(table))
    return table[key]


class BudgetError(InvalidArgumentError):
    """The memory budget cannot hold what was asked: the weights (plus the reserve) alone
    exceed it, or not even one request fits.

    ``needed_bytes`` and ``available_bytes`` give the numbers, in bytes.
    """

    def __init__(self, message: str, needed_bytes: float, available_bytes: float) -> None:
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        super().__init__(message)


class TraceFormatError(InvalidArgumentError):
    """A trace or lengths file that cannot be parsed; ``path`` and the 1-based ``line``
    point at the first bad line (``line`` is 0 when the file as a whole is bad, e.g. empty).
    """

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        where = f"{path}:{line}" if line > 0 else path
        super().__init__(f"{where}: {reason}")
