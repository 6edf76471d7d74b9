"""Request-length workloads for the static capacity sweeps.

- :func:`article_uniform` and :func:`article_heavy_tail`: the article's synthetic workloads,
  drawn exactly as it draws them (numpy ``default_rng(11)``, 4,000 requests), so the lengths
  are identical element by element.
- :func:`azure_trace`: the Azure LLM inference traces 2023 (code, conversation), shipped in
  ``pykvpool/data/azure_llm_2023`` (CC-BY 4.0, Patel et al., ISCA 2024).
- :func:`read_trace`: a CSV or JSONL trace (Azure or Mooncake columns, or named ones) or a
  file of one length per line.
- :meth:`Workload.from_lengths`: any array of lengths.

A request's length is its final KV length in tokens: prompt + generated tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pykvpool._native import InvalidArgumentError
from pykvpool.errors import TraceFormatError, UnknownPresetError
from pykvpool.tracefile import TraceColumns, named_trace_path, read_table

__all__ = [
    "ARTICLE_MAX_LEN",
    "AZURE_ATTRIBUTION",
    "Workload",
    "article_heavy_tail",
    "article_uniform",
    "azure_trace",
    "azure_trace_path",
    "read_trace",
]

ARTICLE_MAX_LEN = 4096
"""The article's maximum request length, tokens."""
ARTICLE_SEED = 11
ARTICLE_REQUESTS = 4000

AZURE_ATTRIBUTION = (
    "Azure LLM inference trace 2023 (Azure Public Dataset, CC-BY 4.0); "
    'Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", '
    "ISCA 2024"
)
"""The citation to print with any result computed from the Azure traces."""
_AZURE_KINDS = ("code", "conv")


@dataclass(frozen=True)
class Workload:
    """A list of requests in arrival order.

    Attributes:
        name: display name.
        lengths: int64 final KV length of each request (prompt + output), tokens.
        prompt_lengths: int64 prompt lengths, tokens, when known.
        source: where the lengths come from (generator or file, attribution).

    Raises:
        InvalidArgumentError: ``lengths`` is empty, not 1-D, or holds a length < 1.
    """

    name: str
    lengths: npt.NDArray[np.int64]
    prompt_lengths: npt.NDArray[np.int64] | None = None
    source: str = ""
    dropped: int = field(default=0)
    """Requests removed by :meth:`clipped` (longer than its ``max_len``)."""

    def __post_init__(self) -> None:
        if self.lengths.ndim != 1 or self.lengths.size == 0:
            raise InvalidArgumentError(f"workload {self.name!r} is empty")
        if int(self.lengths.min()) < 1:
            raise InvalidArgumentError(f"workload {self.name!r} has a length < 1 token")

    @classmethod
    def from_lengths(cls, lengths: npt.ArrayLike, name: str = "user lengths",
                     source: str = "user array") -> Workload:
        """Build from any 1-D array-like of positive integer lengths (tokens).

        Raises:
            InvalidArgumentError: empty, not 1-D, non-integer, or a length < 1.
        """
        arr = np.asarray(lengths)
        if arr.ndim != 1:
            raise InvalidArgumentError(f"lengths must be 1-D, got shape {arr.shape}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            if not np.issubdtype(arr.dtype, np.floating) or not np.all(np.mod(arr, 1) == 0):
                raise InvalidArgumentError("lengths must be integers (tokens)")
        return cls(name, arr.astype(np.int64), None, source)

    def __len__(self) -> int:
        return int(self.lengths.size)

    @property
    def mean_length(self) -> float:
        """Mean length, tokens."""
        return float(self.lengths.mean())

    def clipped(self, max_len: int) -> Workload:
        """This workload without the requests longer than ``max_len`` tokens (a server with
        ``max_model_len = max_len`` rejects them); :attr:`dropped` counts them.

        Raises:
            InvalidArgumentError: max_len < 1 or no request left.
        """
        if max_len < 1:
            raise InvalidArgumentError(f"max_len must be >= 1, got {max_len}")
        keep = self.lengths <= max_len
        prompts = None if self.prompt_lengths is None else self.prompt_lengths[keep]
        return Workload(self.name, self.lengths[keep], prompts, self.source,
                        self.dropped + int((~keep).sum()))


def article_uniform(n: int = ARTICLE_REQUESTS, seed: int = ARTICLE_SEED) -> Workload:
    """The article's batch workload: ``n`` lengths uniform on 512..4096 tokens
    (inclusive), drawn with ``default_rng(seed)``.

    Raises:
        InvalidArgumentError: ``n`` is 0.
        ValueError: a negative ``n`` or ``seed`` (numpy).
    """
    rng = np.random.default_rng(seed)
    lens = rng.integers(512, ARTICLE_MAX_LEN + 1, n)
    return Workload("uniform 512..4096", lens.astype(np.int64), None,
                    f"article generator, default_rng({seed}), {n} requests")


def article_heavy_tail(n: int = ARTICLE_REQUESTS, seed: int = ARTICLE_SEED) -> Workload:
    """The article's chat workload: 80% uniform on 256..1024, 20% on 3072..4096 tokens,
    shuffled with the same generator (``n`` requests, ``default_rng(seed)``).

    Raises:
        InvalidArgumentError: ``n`` is 0.
        ValueError: a negative ``n`` or ``seed`` (numpy).
    """
    rng = np.random.default_rng(seed)
    n_short = int(n * 0.8)
    short = rng.integers(256, 1025, n_short)
    long_ = rng.integers(3072, ARTICLE_MAX_LEN + 1, n - n_short)
    lens = np.concatenate([short, long_])
    rng.shuffle(lens)
    return Workload("heavy tail 80% 256..1024 / 20% 3072..4096", lens.astype(np.int64), None,
                    f"article generator, default_rng({seed}), {n} requests")


def azure_trace_path(kind: str) -> Path:
    """Path of the Azure trace ``kind`` (``"code"`` or ``"conv"``) shipped in the package.

    Raises:
        UnknownPresetError: another kind.
        FileNotFoundError: the package was installed without its data files.
    """
    if kind not in _AZURE_KINDS:
        raise UnknownPresetError("Azure trace", kind, sorted(_AZURE_KINDS))
    return named_trace_path(f"azure-{kind}")


def azure_trace(kind: str) -> Workload:
    """The Azure LLM inference trace 2023, ``"code"`` (8,819 requests) or ``"conv"``
    (19,366 requests): length = ContextTokens + GeneratedTokens.

    Raises:
        UnknownPresetError, FileNotFoundError, TraceFormatError.
    """
    wl = read_trace(azure_trace_path(kind))
    return Workload(f"Azure {kind} trace", wl.lengths, wl.prompt_lengths, AZURE_ATTRIBUTION)


def read_trace(path: str | os.PathLike[str], columns: TraceColumns | None = None) -> Workload:
    """Read a trace file with :func:`pykvpool.tracefile.read_table` (the same reader as
    the simulator's): a CSV with a header (by default the Azure columns
    ``ContextTokens`` and ``GeneratedTokens``; other columns are ignored), a JSONL file
    (by default Mooncake's ``input_length`` and ``output_length``), or a plain file of one
    positive integer length per line (blank lines and ``#`` comments are skipped). A
    request's length is prompt + output tokens.

    Args:
        columns: the prompt and output fields of a CSV/JSONL trace (times are ignored).

    Raises:
        TraceFormatError: not UTF-8 text, the file is empty, or a line has a missing or
            non-integer field, a negative count, a count above ``tracefile.MAX_TOKENS``
            or a zero total length; ``line`` is 1-based.
        FileNotFoundError / OSError: the file cannot be read.
    """
    p = os.fspath(path)
    t = read_table(p, columns, want_time=False)
    zero = np.flatnonzero(t.lengths == 0)
    if zero.size:
        raise TraceFormatError(p, int(t.lines[zero[0]]), "a request with 0 tokens")
    return Workload(Path(p).name, t.lengths, t.prompt, p)
