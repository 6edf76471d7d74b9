"""The simulator's request stream: :class:`Workload` (requests in columns) and the seeded
:func:`synthetic_workload`; :mod:`pykvpool.simulate.engine` runs it (and re-exports both).

Units: arrival times in seconds, lengths in tokens.

Limits: a workload holds at most :data:`MAX_REQUESTS` requests, each prompt and each
output at most :data:`MAX_REQUEST_TOKENS` tokens (the engine's own limits).

Errors: :class:`pykvpool.InvalidArgumentError` (a ValueError) naming the argument for a
rejected value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Optional

import numpy as np
import numpy.typing as npt

from pykvpool import _native
from pykvpool.checks import check_count as _count, check_positive as _positive, invalid as _invalid

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
IntArray = npt.NDArray[np.integer[Any]]

#: Most requests in one workload (16 Mi); split larger traces into several runs.
MAX_REQUESTS: int = _native.SIM_MAX_REQUESTS
#: Most tokens in one prompt, and in one output (16 Mi each).
MAX_REQUEST_TOKENS: int = _native.SIM_MAX_REQUEST_TOKENS

__all__ = ["MAX_REQUESTS", "MAX_REQUEST_TOKENS", "Workload", "check_prefix_caching", "synthetic_workload"]


@dataclass(frozen=True)
class Workload:
    """Requests in columns. ``arrival`` in seconds; lengths in tokens (>= 1 each).

    A prompt may also be given as token ids (``token_ids`` concatenated, request ``i``
    owning ``token_ids[token_offsets[i]:token_offsets[i+1]]``) or as block keys such as
    Mooncake ``hash_ids`` (``block_keys`` / ``key_offsets``, one key per
    ``tokens_per_key`` prompt tokens). Keys and ids enable prefix caching.
    """

    arrival: F64
    prompt_len: I64
    output_len: I64
    priority: Optional[I64] = None
    token_ids: Optional[IntArray] = None
    token_offsets: Optional[I64] = None
    block_keys: Optional[I64] = None
    key_offsets: Optional[I64] = None
    tokens_per_key: int = 0

    def __len__(self) -> int:
        return len(self.arrival)

    @property
    def has_prompt_ids(self) -> bool:
        """True when prompts are given as token ids or block keys: what prefix caching
        looks blocks up by (a workload of lengths only gives it nothing to match).

        Raises:
            Nothing.
        """
        return self.token_ids is not None or self.block_keys is not None

    def rate_scaled(self, rate_scale: float) -> Workload:
        """A copy arriving ``rate_scale`` times as fast: every arrival time divided by
        ``rate_scale`` (2.0: twice the rate, every gap between two arrivals halved; 1.0:
        the same times; 0.5: half the rate). Lengths, priorities, ids and keys are shared
        with this workload. A trace's times start at 0, so its first request still
        arrives at 0.

        Raises:
            InvalidArgumentError: ``rate_scale`` is not a finite number > 0 (a bool is not
                one), naming ``rate_scale``.
        """
        f = _positive(rate_scale, "rate_scale")
        return dataclasses.replace(self, arrival=_column(self.arrival, "arrival", np.float64) / f)

    def scaled(self, time: float = 1.0, prompt: float = 1.0, output: float = 1.0) -> Workload:
        """A copy with arrival times multiplied by ``time`` (2.0 halves the rate) and
        lengths by ``prompt`` / ``output`` (rounded, at least 1 token).

        Raises:
            InvalidArgumentError: ``prompt`` != 1.0 for prompts given as token ids or block
                keys (they cannot be length-scaled); a factor that is not a finite number
                > 0, or a scaled length above :data:`MAX_REQUEST_TOKENS` (each named).
        """
        time = _positive(time, "time")
        prompt = _positive(prompt, "prompt")
        output = _positive(output, "output")
        if prompt != 1.0 and (self.token_ids is not None or self.block_keys is not None):
            raise _invalid("prompt: prompts given as token ids or block keys cannot be length-scaled")
        return dataclasses.replace(
            self,
            arrival=_column(self.arrival, "arrival", np.float64) * time,
            prompt_len=_scale(self.prompt_len, prompt, "prompt_len"),
            output_len=_scale(self.output_len, output, "output_len"),
        )

    def head(self, n: int) -> Workload:
        """The first ``n`` requests (in column order); all of them when ``n >= len(self)``.

        Raises:
            IndexError: ``token_offsets`` or ``key_offsets`` has fewer than ``n + 1``
                entries (an inconsistent workload, which :func:`run` would reject).
            InvalidArgumentError: ``n`` is not an int >= 0.
        """
        n = min(_count(n, "n"), len(self))
        tok = key = None
        if self.token_ids is not None and self.token_offsets is not None:
            tok = (self.token_ids[: self.token_offsets[n]], self.token_offsets[: n + 1])
        if self.block_keys is not None and self.key_offsets is not None:
            key = (self.block_keys[: self.key_offsets[n]], self.key_offsets[: n + 1])
        return Workload(
            arrival=self.arrival[:n],
            prompt_len=self.prompt_len[:n],
            output_len=self.output_len[:n],
            priority=None if self.priority is None else self.priority[:n],
            token_ids=None if tok is None else tok[0],
            token_offsets=None if tok is None else tok[1],
            block_keys=None if key is None else key[0],
            key_offsets=None if key is None else key[1],
            tokens_per_key=self.tokens_per_key,
        )


def check_prefix_caching(workload: Workload, name: str = "prefix_caching") -> None:
    """Refuse prefix caching on ``workload`` when its prompts are lengths only (no token ids,
    no block keys): the cache would look up nothing and change nothing. ``name`` is the
    argument as the caller spells it (``prefix_caching``, ``--prefix-caching``).

    Raises:
        InvalidArgumentError: ``workload`` has neither token ids nor block keys; the one-line
            message starts with ``name``.
    """
    if not workload.has_prompt_ids:
        raise _invalid(f"{name} needs prompts given as token ids or block keys (a trace with hash_ids "
                       "such as mooncake, or synthetic_workload(shared_prefixes=...)); this workload "
                       "has neither, so nothing would be cached")


def _column(v: object, name: str, dtype: type[np.generic]) -> Any:
    """``v`` as a 1-D array of ``dtype``, or InvalidArgumentError naming ``name``."""
    try:
        a = np.asarray(v)
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iuf"):
            raise ValueError(f"shape {a.shape}, dtype {a.dtype}")
        return a.astype(dtype, copy=False)
    except (ValueError, TypeError) as e:
        raise _invalid(f"{name} must be a 1-D numeric column: {e}") from None


def _scale(v: I64, f: float, name: str) -> I64:
    scaled = np.maximum(1.0, np.rint(_column(v, name, np.float64) * f))
    if scaled.size and scaled.max() > MAX_REQUEST_TOKENS:
        i = int(np.argmax(scaled > MAX_REQUEST_TOKENS))
        raise _invalid(f"{name}[{i}] scaled by {f} exceeds {MAX_REQUEST_TOKENS} tokens")
    out: I64 = scaled.astype(np.int64)
    return out


LengthDist = tuple[str, list[float]]


def synthetic_workload(
    num_requests: int,
    *,
    arrivals: Literal["poisson", "gamma", "burst"] = "poisson",
    rate: float = 1.0,
    cv: float = 1.0,
    prompt: LengthDist = ("uniform", [256, 4096]),
    output: LengthDist = ("uniform", [128, 384]),
    prompt_clamp: tuple[int, int] = (1, MAX_REQUEST_TOKENS),
    output_clamp: tuple[int, int] = (1, MAX_REQUEST_TOKENS),
    priority_levels: int = 1,
    shared_prefixes: Optional[tuple[int, int, int]] = None,
    seed: int = 0,
) -> Workload:
    """A seeded synthetic workload (same arguments: identical arrays, bit for bit).

    Args:
        num_requests: requests, 0 to :data:`MAX_REQUESTS` (0 gives an empty workload).
        arrivals: ``poisson`` (exponential gaps at ``rate`` requests/s), ``gamma`` (mean gap
            ``1/rate`` s, coefficient of variation ``cv``: > 1 is bursty) or ``burst`` (all
            at 0). ``rate`` and ``cv`` must be finite and > 0.
        prompt, output: ``(kind, params)`` in tokens, with kind ``fixed [n]``, ``uniform
            [lo, hi]`` (inclusive), ``lognormal [median, sigma]``, ``pareto [scale, shape]``
            (heavy tail) or ``empirical [values...]`` (resampled, e.g. a trace column);
            draws are rounded and clamped to ``*_clamp``.
        prompt_clamp, output_clamp: ``(min, max)`` tokens, ``1 <= min <= max <=``
            :data:`MAX_REQUEST_TOKENS`.
        priority_levels: priorities drawn uniformly from ``0..priority_levels``.
        shared_prefixes: ``(num_prefixes, prefix_len, vocab_size)``: prompts become token
            ids starting with one of ``num_prefixes`` random prefixes of ``prefix_len``
            tokens (at most 2**28 prefix tokens, and 2**28 prompt tokens in all).
        seed: any int in ``0..2**64``.

    Raises:
        InvalidArgumentError: any argument out of range (named): a count above its limit
            or negative, a bool where a count or number is meant, a NaN or infinite rate,
            an unknown or malformed distribution, a bad clamp, a negative seed.
    """
    d = _native.synthesize_workload(
        num_requests,
        arrivals=arrivals,
        rate=rate,
        cv=cv,
        prompt=prompt,
        output=output,
        prompt_clamp=prompt_clamp,
        output_clamp=output_clamp,
        priority_levels=priority_levels,
        shared_prefixes=shared_prefixes,
        seed=seed,
    )
    return Workload(
        arrival=d["arrival"],
        prompt_len=d["prompt_len"],
        output_len=d["output_len"],
        priority=d["priority"] if priority_levels > 1 else None,
        token_ids=d.get("token_ids"),
        token_offsets=d.get("token_offsets"),
    )
