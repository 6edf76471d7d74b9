"""Layer groups: which tokens each kind of attention layer keeps in its KV cache.

A decoder's layers fall into groups of one attention kind each (vLLM's hybrid KV manager
keeps one block table per group):

- ``"full"``: the layer attends to the whole history and caches every token.
- ``"sliding"``: a window of the last ``window`` tokens (Mistral, Gemma 2/3, gpt-oss),
  plus ``sink_tokens`` first tokens kept for good (StreamingLLM); it caches at most
  ``window + sink_tokens`` tokens.
- ``"chunked"``: Llama-4-style chunked local attention: a token attends to the tokens of
  its own ``window``-token chunk, so the layer caches at most one chunk.

Units: tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from pykvpool._native import InvalidArgumentError

__all__ = ["KINDS", "LayerGroup"]

KINDS = ("full", "sliding", "chunked")
"""The attention kinds a :class:`LayerGroup` may have."""


def _int(name: str, value: object, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise InvalidArgumentError(f"{name} must be an integer >= {lo}, got {value!r}")
    return value


@dataclass(frozen=True)
class LayerGroup:
    """``layers`` decoder layers of one attention kind.

    Attributes:
        kind: ``"full"``, ``"sliding"`` or ``"chunked"``.
        layers: how many layers the group has.
        window: tokens of the window (``"sliding"``) or of a chunk (``"chunked"``); ``None``
            for ``"full"``.
        sink_tokens: first tokens a sliding layer keeps besides its window (0 for the
            others).

    Raises:
        InvalidArgumentError: an unknown kind, ``layers`` < 1, a window < 1 on a windowed
            kind or one given on a full group, negative sinks or sinks on a non-sliding group.
    """

    kind: str
    layers: int
    window: int | None = None
    sink_tokens: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        _int("layers", self.layers, 1)
        _int("sink_tokens", self.sink_tokens, 0)
        if self.kind == "full":
            if self.window is not None or self.sink_tokens:
                raise InvalidArgumentError("window and sink_tokens must be unset on a full group")
        else:
            _int("window", self.window, 1)
            if self.kind == "chunked" and self.sink_tokens:
                raise InvalidArgumentError("sink_tokens must be 0 on a chunked group")

    def tokens_held(self, seq_len: int) -> int:
        """Tokens one layer of the group caches for a sequence of ``seq_len`` tokens: all of
        them (full), ``min(seq_len, window + sink_tokens)`` (sliding), or at most one chunk,
        ``min(seq_len, window)`` (chunked: the peak over the sequence's life, reached at the
        end of each full chunk).

        Raises:
            InvalidArgumentError: ``seq_len`` not an integer >= 0.
        """
        _int("seq_len", seq_len, 0)
        if self.window is None:
            return seq_len
        return min(seq_len, self.window + self.sink_tokens)

    def describe(self) -> str:
        """``"21 sliding (4,096)"``, ``"21 full"``, ``"2 sliding (1,024 + 4 sinks)"``."""
        if self.window is None:
            return f"{self.layers} {self.kind}"
        sinks = f" + {self.sink_tokens} sinks" if self.sink_tokens else ""
        return f"{self.layers} {self.kind} ({self.window:,}{sinks})"
