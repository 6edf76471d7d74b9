"""A tiny stderr progress bar for the command line (no dependency).

On a terminal the bar redraws in place; otherwise it writes one line when a task starts
and one when it ends, so logs stay readable. ``enabled=False`` silences it.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """``with ProgressBar("sweep", total=9) as bar: bar(3, 9)`` draws ``done / total``.

    The bar is also a ``(done, total) -> None`` callable, the progress hook that
    :mod:`pykvpool.planning.sweeps` and :mod:`pykvpool.planning.roofline` accept.
    """

    WIDTH = 28

    def __init__(self, label: str, total: int = 1, stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.label = label
        self.total = max(total, 1)
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()

    def __enter__(self) -> ProgressBar:
        self.start = time.perf_counter()
        if self.enabled and not self.tty:
            self.stream.write(f"{self.label} ...\n")
            self.stream.flush()
        self._draw()
        return self

    def __call__(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = max(total, 1)
        self.done = min(done, self.total)
        self._draw()

    def _draw(self, final: bool = False) -> None:
        if not self.enabled or not (self.tty or final):
            return
        frac = self.done / self.total
        filled = int(frac * self.WIDTH)
        elapsed = time.perf_counter() - self.start
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        line = f"{self.label:<28} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s"
        self.stream.write(("\r" if self.tty else "") + line + ("\n" if final else ""))
        self.stream.flush()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.done = self.total
        self._draw(final=True)
