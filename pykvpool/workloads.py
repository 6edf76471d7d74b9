"""Request-length workloads for the static capacity sweeps.

- :func:`article_uniform` and :func:`article_heavy_tail`: the article's synthetic workloads,
  drawn exactly as it draws them (numpy ``default_rng(11)``, 4,000 requests), so the lengths
  are identical element by element.
- :func:`azure_trace`: the Azure LLM inference traces 2023 (code, conversation), shipped in
  ``pykvpool/data/azure_llm_2023`` (CC-BY 4.0, Patel et al., ISCA 2024).
- :func:`read_trace`: an Azure-format CSV or a file of one length per line.
- :meth:`Workload.from_lengths`: any array of lengths.

A request's length is its final KV length in tokens: prompt + generated tokens.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pykvpool._native import InvalidArgumentError
from pykvpool.errors import TraceFormatError, UnknownPresetError

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
_AZURE_FILES = {"code": "AzureLLMInferenceTrace_code.csv", "conv": "AzureLLMInferenceTrace_conv.csv"}


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
    """Path of the shipped Azure trace ``kind`` (``"code"`` or ``"conv"``); falls back to
    ``../shared/data/azure_llm_2023`` beside a source checkout when the package data is
    missing.

    Raises:
        UnknownPresetError: another kind.
        FileNotFoundError: neither copy exists.
    """
    if kind not in _AZURE_FILES:
        raise UnknownPresetError("Azure trace", kind, sorted(_AZURE_FILES))
    fname = _AZURE_FILES[kind]
    packaged = Path(str(resources.files("pykvpool") / "data" / "azure_llm_2023" / fname))
    if packaged.is_file():
        return packaged
    repo_root = Path(__file__).resolve().parent.parent
    shared = repo_root.parent / "shared" / "data" / "azure_llm_2023" / fname
    if shared.is_file():
        return shared
    raise FileNotFoundError(f"{fname} is neither in the package data nor in ../shared/data")


def azure_trace(kind: str) -> Workload:
    """The Azure LLM inference trace 2023, ``"code"`` (8,819 requests) or ``"conv"``
    (19,366 requests): length = ContextTokens + GeneratedTokens.

    Raises:
        UnknownPresetError, FileNotFoundError, TraceFormatError.
    """
    wl = read_trace(azure_trace_path(kind))
    return Workload(f"Azure {kind} trace", wl.lengths, wl.prompt_lengths, AZURE_ATTRIBUTION)


def _parse_int(text: str, path: str, line: int, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise TraceFormatError(path, line, f"{what} {text.strip()!r} is not an integer") from None
    if value < 0:
        raise TraceFormatError(path, line, f"{what} {value} is negative")
    return value


def read_trace(path: str | os.PathLike[str]) -> Workload:
    """Read a trace file.

    Two formats: a CSV whose header names ``ContextTokens`` and ``GeneratedTokens`` (the
    Azure format; other columns are ignored), or a plain file of one positive integer
    length per line (blank lines and ``#`` comments are skipped).

    Raises:
        TraceFormatError: the file is empty, or a line has a missing or non-integer field,
            a negative count or a zero total length; ``line`` is 1-based.
        FileNotFoundError / OSError: the file cannot be read.
    """
    p = str(path)
    with open(p, encoding="utf-8-sig") as f:
        lines = f.read().splitlines()
    first = next((i for i, t in enumerate(lines) if t.strip() and not t.lstrip().startswith("#")), None)
    if first is None:
        raise TraceFormatError(p, 0, "the file holds no request")
    header = [c.strip() for c in lines[first].split(",")]
    if "ContextTokens" in header or "GeneratedTokens" in header:
        return _read_csv(p, lines, first, header)
    lengths: list[int] = []
    for i in range(first, len(lines)):
        text = lines[i].split("#", 1)[0]
        if not text.strip():
            continue
        value = _parse_int(text, p, i + 1, "length")
        if value == 0:
            raise TraceFormatError(p, i + 1, "length 0: every request holds at least one token")
        lengths.append(value)
    return Workload(Path(p).name, np.asarray(lengths, dtype=np.int64), None, p)


def _read_csv(p: str, lines: Sequence[str], first: int, header: list[str]) -> Workload:
    for col in ("ContextTokens", "GeneratedTokens"):
        if col not in header:
            raise TraceFormatError(p, first + 1, f"header has no {col!r} column")
    ci, gi = header.index("ContextTokens"), header.index("GeneratedTokens")
    width = len(header)
    prompts: list[int] = []
    outputs: list[int] = []
    for i in range(first + 1, len(lines)):
        if not lines[i].strip():
            continue
        cells = lines[i].split(",")
        if len(cells) != width:
            raise TraceFormatError(p, i + 1, f"expected {width} fields, found {len(cells)}")
        c = _parse_int(cells[ci], p, i + 1, "ContextTokens")
        g = _parse_int(cells[gi], p, i + 1, "GeneratedTokens")
        if c + g == 0:
            raise TraceFormatError(p, i + 1, "a request with 0 tokens")
        prompts.append(c)
        outputs.append(g)
    if not prompts:
        raise TraceFormatError(p, 0, "the file holds a header but no request")
    pr = np.asarray(prompts, dtype=np.int64)
    return Workload(Path(p).name, pr + np.asarray(outputs, dtype=np.int64), pr, p)


