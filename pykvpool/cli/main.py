"""The ``pykvpool`` command line: ``ledger``, ``sweep``, ``report``, ``replay`` (prefix-cache
hit rates of a block-id trace, see :mod:`pykvpool.prefix.replay`) and ``simulate`` (the
serving simulator, see :mod:`pykvpool.simulate.sweep`) and ``video`` (video generation streams,
see :mod:`pykvpool.simulate.video`) and ``search`` (the best deployment for a workload and
its SLOs, see :mod:`pykvpool.search`).

Every subcommand takes ``--out DIR`` (it writes its tables there as Markdown and JSON) and
``--quiet`` (:func:`pykvpool.cli.argtypes.add_quiet`): it draws progress bars on stderr for
the steps that can take more than a second, and ``--quiet`` silences them. ``ledger``, ``sweep`` and ``simulate`` share one memory
budget, :func:`pykvpool.planning.ledger.default_budget` unless ``--memory-gib`` / ``--fraction`` /
``--reserve-gib`` say otherwise, and print it.

Exit status (:func:`main`): 0 on success; 1 when the report does not reproduce every
number; 2 on bad input of any kind -- an unknown preset, a value out of range, a budget
below the weights, a file that cannot be read, is not UTF-8 text or is malformed -- with
one line ``pykvpool: error: <file>:<line>: <what>`` (or ``pykvpool: error: <what>``) on
stderr and never a traceback; 70 (``EX_SOFTWARE``) when pykvpool itself fails (an
``InvariantError`` or any unexpected exception: a bug, please report it; set
``PYKVPOOL_TRACEBACK=1`` to see the traceback); 130 on Ctrl-C; 141 (as if killed by
SIGPIPE) when stdout is closed early, e.g. ``pykvpool ledger | head -1``, quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pykvpool._native import InvariantError, KvPoolError
from pykvpool._native import __version__ as pykvpool_version
from pykvpool.cli import (
    ledger as ledger_cmd,
    replay as replay_cmd,
    report as report_cmd,
    search as search_cmd,
    simulate as simulate_cmd,
    sweep as sweep_cmd,
    video as video_cmd,
)
from pykvpool.cli.argtypes import CliParser

__all__ = ["EX_BUG", "EX_PIPE", "EX_USAGE", "main"]

EX_USAGE = 2
"""Exit status of every user error."""
EX_BUG = 70
"""Exit status when pykvpool itself fails (``EX_SOFTWARE`` of sysexits.h)."""
EX_PIPE = 141
"""Exit status when stdout is closed early (128 + SIGPIPE, as a killed C tool)."""
EX_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = CliParser(
        prog="pykvpool",
        description="KV-cache capacity planning: memory ledger, static capacity sweeps "
                    "through pykvpool's block pool, the serving simulator, prefix-cache "
                    "replay and the full report.")
    p.add_argument("--version", action="version", version=f"%(prog)s {pykvpool_version}")
    sub = p.add_subparsers(dest="command", required=True,
                           metavar="{ledger,sweep,report,replay,simulate,video,search}")
    for command in (ledger_cmd, sweep_cmd, report_cmd, replay_cmd, simulate_cmd, video_cmd, search_cmd):
        command.add_subcommand(sub)
    return p


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    if isinstance(e, UnicodeError):
        return f"not UTF-8 text ({e})"
    if isinstance(e, MemoryError) and not str(e):
        return "out of memory"
    return str(e) or type(e).__name__


def _report_error(e: Exception) -> int:
    """Print one line for ``e`` on stderr; returns the exit status."""
    if isinstance(e, InvariantError) or not isinstance(e, (KvPoolError, OSError, UnicodeError, MemoryError)):
        if os.environ.get("PYKVPOOL_TRACEBACK"):
            raise e
        print(f"pykvpool: internal error: {type(e).__name__}: {_message(e)}\n"
              "This is a bug in pykvpool: please report it with the command line that triggered it "
              "(PYKVPOOL_TRACEBACK=1 shows the traceback).", file=sys.stderr)
        return EX_BUG
    print(f"pykvpool: error: {_message(e)}", file=sys.stderr)
    return EX_USAGE


def _quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pykvpool`` command. Returns the exit status (see the module
    docstring): 0 on success, 2 on bad input (one ``pykvpool: error: ...`` line on stderr),
    70 on a pykvpool bug, 1 when the report does not reproduce every number.

    Args:
        argv: the arguments after the program name (None: ``sys.argv[1:]``).

    Raises:
        SystemExit: from argparse, for ``--help`` or ``--version`` (status 0) or a usage error such as an
            unknown option or a malformed number (status 2, one error line on stderr).
    """
    try:
        args = build_parser().parse_args(argv)
        status: int = args.func(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EX_PIPE
    except KeyboardInterrupt:
        print("pykvpool: interrupted", file=sys.stderr)
        return EX_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - the one place every error becomes a status
        return _report_error(e)


if __name__ == "__main__":
    sys.exit(main())
