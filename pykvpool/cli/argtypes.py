"""Argument types and shared options of the ``pykvpool`` command line.

Every type refuses what makes no sense before anything runs: non-numbers, NaN and
infinities, values out of range (counts are integers in ``1 ..`` :data:`MAX_COUNT` unless
an option says otherwise). argparse turns the refusal into ``pykvpool: error: argument
--x: ...`` and exit status 2 (see :class:`CliParser`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, NoReturn, Optional

from pykvpool._native import InvalidArgumentError
from pykvpool.planning.hardware import Hardware, hardware_name
from pykvpool.planning.ledger import DEFAULT_FRACTION, DEFAULT_RESERVE_BYTES, GIB, Budget, default_budget
from pykvpool.planning.models import storage_dtype
from pykvpool.tracefile import TraceColumns, parse_columns

__all__ = [
    "MAX_BLOCK_SIZE",
    "MAX_COUNT",
    "CliParser",
    "add_budget_args",
    "add_quiet",
    "choice_list",
    "budget_from_args",
    "count",
    "count_list",
    "kv_dtype_list",
    "number",
    "number_list",
    "trace_columns",
]

MAX_COUNT = 2**31 - 1
"""Largest count (tokens, blocks, requests, ...) an option accepts unless it says less."""
MAX_BLOCK_SIZE = 1 << 16
"""Largest block, tokens (``BlockPool`` refuses larger ones)."""
MAX_GIB = float(2**30)
"""Largest memory size an option accepts, GiB (one EiB: past any device)."""


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors read ``pykvpool: error: <what>`` (then a hint to
    ``--help``) on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``pykvpool: error: <message>`` and a hint to ``--help`` on stderr, then
        exit (argparse calls it for every usage error, including a type's refusal).

        Raises:
            SystemExit: always, with status 2.
        """
        self.exit(2, f"pykvpool: error: {message}\n(see '{self.prog} --help')\n")


def _show(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def count(lo: int = 1, hi: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse type: an integer in ``lo .. hi``.

    Returns:
        The parser argparse calls on the option's text; making it checks nothing.

    Raises:
        argparse.ArgumentTypeError: (from the returned parser) the text is not an
            integer, or the integer is outside ``lo .. hi``.
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_show(text)} is not an integer") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        if value > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi:,}, got {_show(text)}")
        return value

    parse.__name__ = "count"
    return parse


def number(lo: float = 0.0, hi: float = math.inf, *, lo_open: bool = True,
           hi_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in ``(lo, hi]`` (``lo_open`` / ``hi_open`` pick
    which ends are excluded).

    Returns:
        The parser argparse calls on the option's text; making it checks nothing.

    Raises:
        argparse.ArgumentTypeError: (from the returned parser) the text is not a number,
            is NaN or infinite, or is outside the range.
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_show(text)} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {_show(text)}")
        if not (value > lo if lo_open else value >= lo):
            raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {_num(lo)}, got {_num(value)}")
        if not (value < hi if hi_open else value <= hi):
            raise argparse.ArgumentTypeError(f"must be {'<' if hi_open else '<='} {_num(hi)}, got {_num(value)}")
        return value

    parse.__name__ = "number"
    return parse


def _num(v: float) -> str:
    return f"{v:,.0f}" if math.isfinite(v) and v.is_integer() and abs(v) < 1e15 else f"{v:g}"


def _list(item: Callable[[str], Any], what: str) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        parts = [t.strip() for t in text.split(",")]
        if not any(parts):
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {_show(text)}")
        out = []
        for t in parts:
            if not t:
                raise argparse.ArgumentTypeError(f"an empty item in {_show(text)}")
            try:
                out.append(item(t))
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(f"item {_show(t)}: {e}") from None
        return out

    parse.__name__ = "list"
    return parse


def count_list(lo: int = 1, hi: int = MAX_COUNT) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers, each in ``lo .. hi``.

    Returns:
        The parser argparse calls on the option's text; making it checks nothing.

    Raises:
        argparse.ArgumentTypeError: (from the returned parser) no item, an empty item, or
            an item :func:`count` refuses (the message names the item).
    """
    return _list(count(lo, hi), "integers")


def number_list(lo: float = 0.0, hi: float = math.inf) -> Callable[[str], list[float]]:
    """An argparse type: comma-separated finite numbers, each in ``(lo, hi]``.

    Returns:
        The parser argparse calls on the option's text; making it checks nothing.

    Raises:
        argparse.ArgumentTypeError: (from the returned parser) no item, an empty item, or
            an item :func:`number` refuses (the message names the item).
    """
    return _list(number(lo, hi), "numbers")


def choice_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names, each one of ``choices``, no repeats.

    Returns:
        The parser argparse calls on the option's text; making it checks nothing.

    Raises:
        argparse.ArgumentTypeError: (from the returned parser) no item, an empty item, a
            name not in ``choices`` or a name given twice.
    """

    def item(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(choices)}")
        return text

    return _unique(_list(item, "names"))


def hardware_list() -> Callable[[str], list[str]]:
    """An argparse type: comma-separated hardware presets, by name or alias (``h100``),
    each returned as its preset name, no preset twice.

    Returns:
        The parser argparse calls on the option's text; making it checks nothing.

    Raises:
        argparse.ArgumentTypeError: (from the returned parser) no item, an empty item, a
            name that is no preset nor alias, or one preset given twice (in any spellings).
    """

    def item(text: str) -> str:
        try:
            return hardware_name(text)
        except InvalidArgumentError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return _unique(_list(item, "presets"))


def kv_dtype_list() -> Callable[[str], list[str]]:
    """An argparse type: comma-separated KV dtypes, any spelling
    :func:`pykvpool.planning.models.storage_dtype` reads (aliases such as ``fp16`` and
    granularity suffixes included), each returned as its one spelling, no dtype twice.

    Returns:
        The parser argparse calls on the option's text; making it checks nothing.

    Raises:
        argparse.ArgumentTypeError: (from the returned parser) no item, an empty item, a
            name that is no KV dtype or one dtype given twice (in any spellings).
    """

    def item(text: str) -> str:
        try:
            return storage_dtype(text).name
        except InvalidArgumentError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return _unique(_list(item, "dtypes"))


def _unique(parse: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    def unique(text: str) -> list[str]:
        out: list[str] = parse(text)
        if len(set(out)) != len(out):
            raise argparse.ArgumentTypeError(f"a name given twice in {_show(text)}")
        return out

    unique.__name__ = "list"
    return unique


def add_budget_args(p: argparse.ArgumentParser | Any) -> None:
    """The budget options: ``--memory-gib``, ``--fraction``, ``--reserve-gib``. Left
    out, each takes :func:`pykvpool.planning.ledger.default_budget`'s value for the device.
    Sizes are GiB (2**30 bytes) on the command line; :func:`budget_from_args` turns them
    into a budget in bytes.

    Raises:
        argparse.ArgumentError: ``p`` already has one of these options (argparse's
            default ``conflict_handler="error"``).
    """
    p.add_argument("--memory-gib", type=number(0.0, MAX_GIB), metavar="GIB",
                   help="device memory, GiB (default: the --hardware's, 80 for the A100)")
    p.add_argument("--fraction", type=number(0.0, 1.0), metavar="F",
                   help="usable share of device memory, in (0, 1] (default 1.0)")
    p.add_argument("--reserve-gib", type=number(0.0, MAX_GIB, lo_open=False), metavar="GIB",
                   help="reserve for activations and framework, GiB (default 4, the article's)")


def add_quiet(p: argparse.ArgumentParser | Any) -> None:
    """``--quiet``, which every subcommand takes: no progress bars on stderr (``args.quiet``).

    Raises:
        argparse.ArgumentError: ``p`` already has the option (argparse's default
            ``conflict_handler="error"``).
    """
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def budget_from_args(args: argparse.Namespace, hardware: Hardware) -> Budget:
    """:func:`pykvpool.planning.ledger.default_budget` of ``hardware`` with the options given.

    Raises:
        InvalidArgumentError: a budget :class:`~pykvpool.planning.ledger.Budget` refuses (e.g.
            the memory of a machine that could not be read, without ``--memory-gib``).
    """
    memory: Optional[float] = args.memory_gib
    fraction: Optional[float] = args.fraction
    reserve: Optional[float] = args.reserve_gib
    if memory is None and fraction is None and reserve is None:
        return default_budget(hardware)
    return Budget(hardware.memory_bytes if memory is None else memory * GIB,
                  DEFAULT_FRACTION if fraction is None else fraction,
                  DEFAULT_RESERVE_BYTES if reserve is None else reserve * GIB)


def trace_columns(text: str) -> TraceColumns:
    """An argparse type: ``prompt=NAME,output=NAME[,time=NAME][,priority=NAME][,keys=NAME][,unit=s|ms|us]``
    (see :func:`pykvpool.tracefile.parse_columns`).

    Raises:
        argparse.ArgumentTypeError: a part that is not ``ROLE=NAME``, an unknown role or
            unit, a role given twice, or no ``prompt`` or ``output`` name (what
            ``parse_columns`` refuses).
    """
    try:
        return parse_columns(text)
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("columns: ")) from None
