"""One chunk of several streams, opened together: :class:`ChunkBatch`, and the (t, h, w)
positions of stream tokens.

A stream token's index ``n`` is logical (it counts every token the stream ever generated,
never the stored count): frame ``t = n // tokens_per_frame``, and token ``j = n %
tokens_per_frame`` of its frame sits at ``(j // w, j % w)`` on the frame's ``(h, w)`` grid
(row-major).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["ChunkBatch", "token_positions"]

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]


def token_positions(tokens: I64, tokens_per_frame: int, grid_w: int) -> I64:
    """The ``(t, h, w)`` of logical stream token indices ``tokens`` (any shape): int64
    ``[*tokens.shape, 3]``. ``t`` counts frames from the stream's first frame, whatever
    was evicted since.

    Raises:
        Nothing for integer input (no checks: the cache's own helper).
    """
    j = tokens % tokens_per_frame
    return np.stack([tokens // tokens_per_frame, j // grid_w, j % grid_w], axis=-1).astype(np.int64)


_A = TypeVar("_A", bound=np.generic)


def _frozen(a: npt.NDArray[_A]) -> npt.NDArray[_A]:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class ChunkBatch:
    """The open chunks of ``n`` streams, made by :meth:`VideoCache.begin_chunk`: where the
    chunk's K/V go (the same slots at every denoising step) and everything the one batched
    attention call needs. Arrays are read-only. A batch is valid until one of its streams
    commits, aborts or releases its chunk; :meth:`VideoCache.write` and
    :meth:`VideoCache.attention` refuse it afterwards.

    Attributes:
        stream_ids: int64 ``[n]``, in the order given to ``begin_chunk``.
        chunks: int64 ``[n]``: the chunk index of each stream's open chunk (its frames are
            ``chunk * frames_per_chunk ..``).
        slots: int64 ``[n, chunk_tokens]``: the KV-cache slot of each chunk token.
        positions: int64 ``[n, chunk_tokens, 3]``: the ``(t, h, w)`` of each chunk token.
        qo_indptr: int64 ``[n + 1]``: stream ``i`` owns query rows
            ``qo_indptr[i]:qo_indptr[i + 1]`` (``chunk_tokens`` each).
        q_positions: int64 ``[n * chunk_tokens]``: every query row of a chunk at the
            chunk's last logical position (block-causal: the whole chunk is visible to each
            of its queries).
        kv_indptr, kv_indices, kv_last_page_len, kv_page_start: int32: the pool's
            FlashInfer tables of the streams after the chunk was allocated.
        window_left: tokens a key may lie behind a query's position and stay visible
            (``(window_frames + frames_per_chunk) * tokens_per_frame - 1``), or None
            (unbounded history).
        sink_tokens: tokens of the sink frames (always visible), 0 without sinks.
    """

    stream_ids: I64
    chunks: I64
    slots: I64
    positions: I64
    qo_indptr: I64
    q_positions: I64
    kv_indptr: I32
    kv_indices: I32
    kv_last_page_len: I32
    kv_page_start: I32
    window_left: int | None
    sink_tokens: int
    _owner: object
    _serial: int

    @classmethod
    def build(cls, *, owner: object, serial: int, stream_ids: list[int], chunks: list[int], slots: I64,
              tokens_per_frame: int, grid_w: int, tables: tuple[I32, I32, I32, I32],
              window_left: int | None, sink_tokens: int) -> ChunkBatch:
        """A batch from the pool's step outputs (an internal constructor: no checks).

        Raises:
            Nothing for the pool's own outputs (no checks: the cache's own constructor).
        """
        n, per = slots.shape
        first = np.asarray(chunks, np.int64) * per
        tokens = first[:, None] + np.arange(per, dtype=np.int64)[None, :]
        q_pos = np.repeat(first + per - 1, per)
        indptr, indices, last, start = tables
        return cls(
            stream_ids=_frozen(np.asarray(stream_ids, np.int64)), chunks=_frozen(np.asarray(chunks, np.int64)),
            slots=_frozen(slots.astype(np.int64)), positions=_frozen(token_positions(tokens, tokens_per_frame, grid_w)),
            qo_indptr=_frozen(np.arange(n + 1, dtype=np.int64) * per), q_positions=_frozen(q_pos),
            kv_indptr=_frozen(indptr), kv_indices=_frozen(indices), kv_last_page_len=_frozen(last),
            kv_page_start=_frozen(start), window_left=window_left, sink_tokens=sink_tokens,
            _owner=owner, _serial=serial)

    @property
    def num_streams(self) -> int:
        """Streams in the batch.

        Raises:
            Nothing.
        """
        return int(self.stream_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Chunk tokens of all streams together (the rows of ``q``, ``k`` and ``v``).

        Raises:
            Nothing.
        """
        return int(self.slots.size)

    def __repr__(self) -> str:
        return f"ChunkBatch(stream_ids={self.stream_ids.tolist()}, chunks={self.chunks.tolist()}, " \
               f"tokens={self.num_tokens})"
