"""The ``pykvpool report`` subcommand: the whole capacity-planning report in one folder."""

from __future__ import annotations

import argparse
from typing import Any

from pykvpool.cli.argtypes import add_quiet

__all__ = ["add_subcommand", "main_report"]


def main_report(args: argparse.Namespace) -> int:
    """Run ``pykvpool report`` (:func:`pykvpool.report.build.build_report`). Returns 0 when
    every article number is reproduced, else 1.

    Raises:
        InvalidArgumentError: ``--search`` is not the folder of a finished search, or is
            given with ``--no-search``.
        OSError: ``--out`` cannot be written.
        BudgetError: a preset model's weights fill its budget (a bug in the presets).
    """
    from pykvpool._native import InvalidArgumentError
    from pykvpool.report.build import build_report

    if args.search is not None and args.no_search:
        raise InvalidArgumentError("--search and --no-search exclude each other")
    res = build_report(args.out, measure=not args.no_measure, progress=not args.quiet, search=args.search,
                       run_search=not args.no_search)
    print(f"wrote {res.markdown} and report.html ({len(res.figures)} figures) in {res.seconds:.1f} s; "
          f"{res.matched}/{res.reproduced} article numbers reproduced exactly")
    return 0 if res.matched == res.reproduced else 1


def add_subcommand(sub: Any) -> None:
    """Add the ``report`` subcommand to a ``pykvpool`` CLI's subparsers; it calls
    :func:`main_report`.

    Raises:
        argparse.ArgumentError: ``subparsers`` already has a command of that name (Python
            3.11 and later).
    """
    pr = sub.add_parser("report", help="the full capacity-planning report (Markdown, HTML, figures)",
                        description="Reproduce every number of the article through pykvpool, "
                                    "measure this machine, draw the figures and write one "
                                    "folder with report.md, PNG figures, report.html (one self-contained "
                                    "page) and report.json.")
    pr.add_argument("--out", metavar="DIR", default="pykvpool-report",
                    help="output folder (default pykvpool-report)")
    pr.add_argument("--no-measure", action="store_true",
                    help="skip measuring this machine and the decode kernel")
    pr.add_argument("--search", metavar="DIR",
                    help="show the finished `pykvpool search` in DIR in the deployment-search section "
                         "(default: the report runs a small search of its own, a few seconds)")
    pr.add_argument("--no-search", action="store_true", help="leave the deployment-search section out")
    add_quiet(pr)
    pr.set_defaults(func=main_report)
