"""The ``pykvpool`` command line (``pykvpool --help``; ``python -m pykvpool.cli``): the
parser and error handling in :mod:`pykvpool.cli.main`, argument types in
:mod:`pykvpool.cli.argtypes`, one module per subcommand for ``simulate`` and ``replay``."""

from pykvpool.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
