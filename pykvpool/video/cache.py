"""The video stream cache: many autoregressive video streams in one pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pykvpool._native import (
    FullAttention,
    BlockPool,
    InvariantError,
    KvCache,
    SlidingWindow,
    UnknownSequenceError,
    prefill_attention_paged,
)
from pykvpool.checks import check_count, invalid
from pykvpool.video._args import check_f32, check_grid, check_id, check_ids, check_layer
from pykvpool.video.batch import ChunkBatch, token_positions
from pykvpool.video.spill import PageSpill

__all__ = ["VideoCache"]

#: Most new tokens one pool call takes (the bindings' limit).
MAX_CALL_TOKENS = 2**27
#: Longest stream, in tokens (the pool's logical-length limit).
MAX_STREAM_TOKENS = 2**31 - 1

#: Largest finite value of each fp8 storage format (where :class:`KvCache` saturates).
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


@dataclass
class _Stream:
    frames: int = 0  # committed frames (logical)
    open: int | None = None  # serial of the batch that opened its chunk


class VideoCache:
    """KV cache of autoregressive video streams: block-causal chunks of frames over a paged
    pool, with sink frames and a sliding window of frames (Self-Forcing, CausVid,
    LongLive), many streams in one pool.

    A stream generates frames of ``tokens_per_frame`` tokens on an ``(h, w)`` grid, in
    chunks of ``frames_per_chunk`` frames. A chunk's queries see the whole chunk, the
    ``sink_frames`` first frames and the ``window_frames`` frames just before the chunk
    (``window_frames=None``: every earlier frame), nothing later. Lifecycle of a chunk:
    :meth:`begin_chunk` allocates its pages once (a batch of streams in one atomic pool
    step) and gives its slots and ``(t, h, w)`` positions; each denoising step
    :meth:`write`\\ s the chunk's K/V at the same slots and runs :meth:`attention` (one
    kernel call for every stream of the batch); :meth:`commit_chunk` makes the chunk
    history and frees at once the pages of frames that left the window (never the sinks),
    or :meth:`abort_chunk` drops it. Positions are logical: ``t`` keeps counting after
    eviction. On a prompt switch (LongLive), :meth:`rewrite_window` gives the slots and
    positions of the visible history to recompute and write back in place. A stream may
    go back to an earlier frame (:meth:`rewind`: regenerate from there); with
    ``spill_blocks`` the pages its window released wait in host memory (MAGI-1 keeps its
    evicted KV on the host) and a rewind copies them back instead of leaving their K/V to
    be computed again.

    Built on one :class:`BlockPool` with one group (``FullAttention()`` without a window,
    else ``SlidingWindow(window_frames * tokens_per_frame + 1, sink_tokens=sink_frames *
    tokens_per_frame)``; stream ids are its sequence ids) and one :class:`KvCache` of
    ``num_layers`` layers. Use them read-only (``pool``, ``kv``): a stream changed behind
    the cache's back breaks its bookkeeping.

    Pages vs frames (measured by ``benches/bench_video.py``, table in
    ``benches/RESULTS.md``): a page holds ``block_size`` tokens whatever the frames. When
    ``block_size`` does not divide ``tokens_per_frame``, a page may hold the end of one
    frame and the start of the next, and it stays until both leave the window. The waste
    per stream at steady state is then at most ``block_size - 1`` tokens at the end of the
    sinks (kept for ever), ``block_size - 1`` at the window's start and ``block_size - 1``
    unused slots after the last chunk. With Wan2.1's 1,560-token frames, 3-frame chunks and
    the default 16-token pages (1,560 % 16 = 8, 4,680 % 16 = 8), a LongLive stream (3 sink
    + 12 window frames, 23,400 visible tokens) wastes 8 to 24 tokens after a commit and 16
    with a chunk open: at most 24 tokens, 4.2 MiB at Wan2.1-1.3B's 184,320 bytes per bf16
    token (30 layers), 0.10% of the stream's 4.0 GiB. A block size dividing
    ``tokens_per_frame`` and the chunk (8, 24, 40, 120 for 1,560) wastes nothing; 32 and 64
    waste up to 56 and 152 tokens. The chunk attention reads the same keys either way
    (bit-identical outputs); larger pages were somewhat faster (120-token pages 1.10x and
    1.30x of 16-token ones in two runs, 24 and 40 within noise of 1.0x, 8 0.97-0.98x; not
    profiled, probably fewer page boundaries per packed key tile). The default stays 16, the contract's page and the
    pool's usual one, because its cost is at most 0.1% of a stream; for Wan-like 1,560-token
    frames pass ``block_size=120`` (frame-aligned: no waste, and the faster attention).

    Args:
        num_layers: model layers (one cache layer each).
        num_kv_heads: KV heads per layer.
        head_dim: elements per head.
        tokens_per_frame: tokens of one latent frame (``h * w``).
        grid: ``(h, w)``, the frame's token grid.
        frames_per_chunk: frames generated together (>= 1).
        sink_frames: first frames always visible (frames; needs a window to matter).
        window_frames: frames before a chunk that its queries see (>= 0), or None for the
            whole history.
        num_blocks: pages of the pool (blocks), shared by every stream.
        block_size: tokens per page.
        dtype: KV storage dtype, any of :class:`KvCache`'s: ``"bf16"`` (default),
            ``"f16"``, ``"f32"``, or 8-bit ``"int8"``, ``"fp8_e4m3"``, ``"fp8_e5m2"``.
        spill_blocks: with a window, host memory for this many pages (``bytes_per_block``
            each) holding copies of the pages :meth:`commit_chunk` releases, copied by the
            commit right after the release, before anything may take them (a cache is
            driven from one thread at a time), for :meth:`rewind` (default None: none);
            when full, a page stored drops the one stored earliest.

    8-bit storage (what :class:`KvCache` documents): ``"int8"`` keeps one f32 scale per
    (token, KV head) for K and for V, computed by every write (so each denoising step's
    write and the prompt-switch rewrite requantize their own tokens), stored with the
    page. fp8 keeps one scale per (layer, KV head) for K and for V, shared by every stream
    and page: set them with :meth:`set_fp8_scales` before the first chunk (e.g. a
    model's calibrated ``k_scale``/``v_scale``, or the largest ``|K|``, ``|V|`` of a
    calibration run over ``FP8_MAX[dtype]``); a scale still unset is calibrated by the
    first write to its layer (the first chunk's first denoising step), and later values
    beyond that range saturate. The chunk attention reads every dtype (values = code x
    scale, f32 arithmetic); its error against the same attention on unquantized K/V is
    bounded as :func:`pykvpool.decode_attention` documents, for values within the fp8
    scales' range. Writes of non-finite values are refused on 8-bit caches.

    Bytes: :attr:`bytes_per_block` is ``num_layers x block_size x``
    :meth:`KvCache.bytes_per_token` (K and V codes, and int8's per-token scales: ``2 x
    num_kv_heads x (head_dim + 4)`` bytes per token and layer; ``head_dim`` in 8-bit,
    ``2 head_dim`` in f16/bf16, ``4 head_dim`` in f32); fp8's per-layer scales (``8 x
    num_kv_heads`` bytes per layer) and each layer's alignment padding are not in any
    page (``kv.nbytes`` counts everything).

    Raises:
        TypeError: ``grid`` not a tuple or list, ``dtype`` not a str (a bool included).
        InvalidArgumentError: naming the argument: a count that is not an int or out of
            range, a grid whose product is not ``tokens_per_frame``, a chunk beyond
            ``2**27`` tokens, a window or sinks beyond ``2**31`` tokens, a bad
            ``block_size`` or ``num_blocks``, ``num_kv_heads`` or ``head_dim`` above
            65536, an unknown ``dtype``, a cache beyond memory; ``spill_blocks`` below 1,
            without a window, or beyond memory. A refused argument builds
            nothing (a cache beyond memory is found as it is allocated; the pool built
            just before is dropped).
    """

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, tokens_per_frame: int,
                 grid: tuple[int, int], frames_per_chunk: int, sink_frames: int = 0,
                 window_frames: int | None = None, num_blocks: int, block_size: int = 16,
                 dtype: str = "bf16", spill_blocks: int | None = None) -> None:
        self.num_layers = check_count(num_layers, "num_layers", 1)
        self.num_kv_heads = check_count(num_kv_heads, "num_kv_heads", 1)
        self.head_dim = check_count(head_dim, "head_dim", 1)
        self.tokens_per_frame = tpf = check_count(tokens_per_frame, "tokens_per_frame", 1)
        self.grid = check_grid(grid, tpf)
        self.frames_per_chunk = check_count(frames_per_chunk, "frames_per_chunk", 1)
        self.sink_frames = check_count(sink_frames, "sink_frames")
        self.window_frames = None if window_frames is None else check_count(window_frames, "window_frames")
        if not isinstance(dtype, str):
            raise TypeError(f"dtype must be a str, got {type(dtype).__name__}")
        if spill_blocks is not None:
            spill_blocks = check_count(spill_blocks, "spill_blocks", 1)
            if self.window_frames is None:
                raise invalid("spill_blocks: without window_frames no page is ever released to spill")
        per_token = KvCache.bytes_per_token(self.num_kv_heads, self.head_dim, dtype)  # checks dtype
        self.chunk_tokens = self.frames_per_chunk * tpf
        if self.chunk_tokens > MAX_CALL_TOKENS:
            raise invalid(f"frames_per_chunk: a chunk of {self.chunk_tokens} tokens exceeds {MAX_CALL_TOKENS}")
        self.sink_tokens = self.sink_frames * tpf if self.window_frames is not None else 0
        if self.sink_frames * tpf > MAX_STREAM_TOKENS:
            raise invalid(f"sink_frames: {self.sink_frames} frames of {tpf} tokens exceed {MAX_STREAM_TOKENS} tokens")
        if self.window_frames is None:
            group: Any = FullAttention()
            self.window_left: int | None = None
        else:
            w = self.window_frames * tpf + 1
            if w + self.chunk_tokens > MAX_STREAM_TOKENS:
                raise invalid(f"window_frames: {self.window_frames} frames of {tpf} tokens exceed the stream limit")
            group = SlidingWindow(w, sink_tokens=self.sink_tokens)
            self.window_left = (self.window_frames + self.frames_per_chunk) * tpf - 1
        self._pool = BlockPool(num_blocks, block_size, [group])
        self.block_size = self._pool.block_size
        self._kv = KvCache(self.num_layers, self._pool.num_blocks, self.block_size, self.num_kv_heads,
                           self.head_dim, dtype)
        self.dtype = self._kv.dtype
        #: Bytes of one page: K and V of ``block_size`` tokens in every layer (int8's
        #: per-token scales included).
        self.bytes_per_block = self.num_layers * self.block_size * per_token
        self._spill = None if spill_blocks is None else PageSpill(self._kv, spill_blocks)
        self._streams: dict[int, _Stream] = {}
        self._serial = 0
        self._token = object()

    @property
    def pool(self) -> BlockPool:
        """The pool (one group; stream ids are its sequence ids). Read it, never change it.

        Raises:
            Nothing.
        """
        return self._pool

    @property
    def kv(self) -> KvCache:
        """The KV storage (``num_layers`` layers, the pool's blocks).

        Raises:
            Nothing.
        """
        return self._kv

    def set_fp8_scales(self, layer: int, k_scales: npt.NDArray[np.float32], v_scales: npt.NDArray[np.float32]) -> None:
        """Set layer ``layer``'s fp8 scales, one per KV head for K and for V (value = code
        x scale; values beyond ``FP8_MAX[dtype] x scale`` saturate), while no stream holds
        a page: stored codes are never reinterpreted. A scale of 0 is calibrated by the
        layer's next write (:class:`KvCache`'s rule).

        Args:
            layer: ``0..num_layers``.
            k_scales: float32 ``[num_kv_heads]``, finite and >= 0.
            v_scales: float32 ``[num_kv_heads]``, finite and >= 0.

        Raises:
            InvalidArgumentError: not an fp8 cache (``dtype``), a bad ``layer``, a scale
                array that is not float32 ``[num_kv_heads]`` or holds a negative or
                non-finite scale (naming ``k_scales`` or ``v_scales``), or a stream holds
                pages (set the scales before the first chunk). Nothing is set on error.
        """
        if self.dtype not in FP8_MAX:
            raise invalid(f"dtype: set_fp8_scales needs an fp8 cache, this one is {self.dtype}")
        layer = check_layer(layer, self.num_layers)
        held = self._pool.num_used_blocks
        if held:
            raise invalid(f"k_scales, v_scales: streams hold {held} pages of K/V stored with the current "
                          "scales; set fp8 scales before the first chunk (or once every stream is released)")
        self._kv.set_fp8_scales(layer, k_scales, v_scales)

    # -- streams

    def _stream(self, v: object, name: str = "stream_id") -> tuple[int, _Stream]:
        s = check_id(v, name)
        st = self._streams.get(s)
        if st is None:
            raise UnknownSequenceError(f"{name}: stream {s} is not live")
        return s, st

    def _open_streams(self, v: object) -> list[int]:
        """Distinct live stream ids, each with an open chunk."""
        ids = check_ids(v, "stream_ids")
        for s in ids:
            st = self._stream(s, "stream_ids")[1]
            if st.open is None:
                raise invalid(f"stream_ids: stream {s} has no open chunk")
        return ids

    def add_stream(self, stream_id: int) -> None:
        """Start stream ``stream_id`` (no frames, no pages yet).

        Raises:
            DuplicateSequenceError: the stream is live.
            InvalidArgumentError: not an int in ``0..2**63``.
        """
        s = check_id(stream_id, "stream_id")
        self._pool.add_sequence(s, 0)
        self._streams[s] = _Stream()

    def release(self, stream_id: int) -> None:
        """End stream ``stream_id``: every page it holds (open chunk included) goes back to
        the pool; an open batch of it becomes invalid.

        Raises:
            UnknownSequenceError: the stream is not live.
            InvalidArgumentError: not an int in ``0..2**63``.
        """
        s, _ = self._stream(stream_id)
        self._pool.free(s)
        del self._streams[s]
        if self._spill is not None:
            self._spill.forget(s)

    def stream_frames(self, stream_id: int) -> int:
        """Committed frames of the stream (logical: evicted frames count), in frames.

        Raises:
            UnknownSequenceError: the stream is not live.
            InvalidArgumentError: not an int in ``0..2**63``.
        """
        return self._stream(stream_id)[1].frames

    def stream_ids(self) -> list[int]:
        """Live stream ids, ascending.

        Raises:
            Nothing.
        """
        return sorted(self._streams)

    def has_open_chunk(self, stream_id: int) -> bool:
        """Whether the stream has a chunk begun and neither committed nor aborted.

        Raises:
            UnknownSequenceError: the stream is not live.
            InvalidArgumentError: not an int in ``0..2**63``.
        """
        return self._stream(stream_id)[1].open is not None

    # -- chunks

    def begin_chunk(self, stream_ids: Any) -> ChunkBatch:
        """Allocate the next chunk (``frames_per_chunk * tokens_per_frame`` tokens) of each
        stream, in one atomic pool step (which first releases what left the window).

        Args:
            stream_ids: distinct live streams without an open chunk (a list, tuple or 1-D
                int array).

        Returns:
            The :class:`ChunkBatch`: slots, ``(t, h, w)`` positions and the attention
            arguments of the chunks, streams in the given order.

        Raises:
            PoolExhaustedError: not enough free pages for every chunk (nothing changed).
            UnknownSequenceError: a stream is not live.
            TypeError: ``stream_ids`` is not a list, tuple or array.
            InvalidArgumentError: naming ``stream_ids``: empty, an id listed twice or not
                an int, a stream with an open chunk, a stream that would exceed ``2**31 -
                1`` tokens, more than ``2**27`` tokens in the batch.
        """
        ids = check_ids(stream_ids, "stream_ids")
        for s in ids:
            st = self._stream(s, "stream_ids")[1]
            if st.open is not None:
                raise invalid(f"stream_ids: stream {s} already has an open chunk; commit or abort it first")
            if (st.frames + self.frames_per_chunk) * self.tokens_per_frame > MAX_STREAM_TOKENS:
                raise invalid(f"stream_ids: stream {s} would exceed {MAX_STREAM_TOKENS} tokens")
        if len(ids) * self.chunk_tokens > MAX_CALL_TOKENS:
            raise invalid(f"stream_ids: {len(ids)} chunks of {self.chunk_tokens} tokens exceed {MAX_CALL_TOKENS}")
        slots, _cow, _lens = self._pool.step(ids, self.chunk_tokens)
        self._serial += 1
        chunks = [self._streams[s].frames // self.frames_per_chunk for s in ids]
        for s in ids:
            self._streams[s].open = self._serial
        indptr, indices, last, start = self._pool.flashinfer_tables(ids, group=0)
        return ChunkBatch.build(
            owner=self._token, serial=self._serial, stream_ids=ids, chunks=chunks,
            slots=slots[0].reshape(len(ids), self.chunk_tokens), tokens_per_frame=self.tokens_per_frame,
            grid_w=self.grid[1], tables=(indptr, indices, last, start),
            window_left=self.window_left, sink_tokens=self.sink_tokens)

    def _check_batch(self, batch: object) -> ChunkBatch:
        if not isinstance(batch, ChunkBatch):
            raise TypeError(f"batch must be a ChunkBatch, got {type(batch).__name__}")
        if batch._owner is not self._token:
            raise invalid("batch: made by another VideoCache")
        for s in batch.stream_ids.tolist():
            st = self._streams.get(s)
            if st is None or st.open != batch._serial:
                raise invalid(f"batch: stream {s}'s chunk was committed, aborted or released (a stale batch)")
        return batch

    def write(self, layer: int, k: npt.NDArray[np.float32], v: npt.NDArray[np.float32], batch: ChunkBatch) -> None:
        """Store the chunk's K/V of layer ``layer`` at the batch's slots (rounded to the
        storage dtype; 8-bit dtypes quantize, int8 with a new scale per token and KV
        head). Every denoising step overwrites the same slots: nothing is allocated.

        Args:
            layer: ``0..num_layers``.
            k: float32 ``[batch.num_tokens, num_kv_heads, head_dim]``, streams in batch
                order, each stream's chunk tokens in order (any strides).
            v: float32, the shape of ``k``.
            batch: an open :class:`ChunkBatch` of this cache.

        Raises:
            TypeError: ``k`` or ``v`` not a numpy array, ``batch`` not a ChunkBatch.
            InvalidArgumentError: naming the argument: a bad layer, dtype or shape, a batch
                of another cache or no longer open, a non-finite value in an 8-bit cache.
                Nothing is written on error.
        """
        batch = self._check_batch(batch)
        layer = check_layer(layer, self.num_layers)
        k = check_f32(k, "k", batch.num_tokens, self.num_kv_heads, self.head_dim)
        v = check_f32(v, "v", batch.num_tokens, self.num_kv_heads, self.head_dim)
        self._kv.write(layer, k, v, batch.slots.reshape(-1))

    def attention(self, layer: int, q: npt.NDArray[np.float32], batch: ChunkBatch, *, scale: float | None = None,
                  out: npt.NDArray[np.float32] | None = None) -> npt.NDArray[np.float32]:
        """Attention of the chunks' queries of layer ``layer`` over what each sees (its
        chunk, its sinks, its window), for every stream of the batch in one
        :func:`prefill_attention_paged` call (block-causal: every query at its chunk's last
        position, the window in tokens; released pages are never read).

        Args:
            layer: ``0..num_layers``.
            q: float32 ``[batch.num_tokens, Hq, head_dim]``, ``Hq`` a multiple of
                ``num_kv_heads``.
            batch: an open :class:`ChunkBatch` of this cache (its K/V written).
            scale: softmax scale (default ``1 / sqrt(head_dim)``).
            out: C-contiguous float32 of ``q``'s shape to write (default: a new array).

        Returns:
            float32 ``[batch.num_tokens, Hq, head_dim]``.

        Raises:
            TypeError: ``q`` not a numpy array, ``batch`` not a ChunkBatch.
            InvalidArgumentError: naming the argument: a bad layer, dtype or shape, a head
                count that is not a multiple of ``num_kv_heads``, a bad ``scale`` or
                ``out``, a batch of another cache or no longer open.
        """
        batch = self._check_batch(batch)
        layer = check_layer(layer, self.num_layers)
        q = check_f32(q, "q", batch.num_tokens, None, self.head_dim)
        if q.shape[1] % self.num_kv_heads:
            raise invalid(f"q: {q.shape[1]} heads are not a multiple of {self.num_kv_heads} KV heads")
        return prefill_attention_paged(
            self._kv, layer, q, batch.qo_indptr, batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len,
            q_positions=batch.q_positions, causal=True, window_left=batch.window_left,
            sink_tokens=batch.sink_tokens or None, scale=scale, out=out, kv_page_start=batch.kv_page_start)

    def commit_chunk(self, stream_ids: Any) -> None:
        """The streams' open chunks become history (call it after the clean re-cache pass,
        if the model has one): the pool marks them computed, which frees at once the pages
        whose frames left the window (never the sinks; a page shared with a visible frame
        stays). Atomic.

        Args:
            stream_ids: distinct live streams, each with an open chunk.

        Raises:
            UnknownSequenceError: a stream is not live (nothing changed).
            TypeError: ``stream_ids`` is not a list, tuple or array.
            InvalidArgumentError: naming ``stream_ids``: empty, an id listed twice or not
                an int, a stream without an open chunk (nothing changed).
        """
        ids = self._open_streams(stream_ids)
        before = [self._pool.block_table(s, group=0) for s in ids] if self._spill is not None else []
        self._pool.mark_computed(ids)
        # The released pages still hold their K/V: nothing is allocated before the copy.
        for s, table in zip(ids, before):
            pages = np.flatnonzero((table >= 0) & (self._pool.block_table(s, group=0) < 0))
            self._spill.store(s, pages, table[pages].astype(np.int64))  # type: ignore[union-attr]
        for s in ids:
            st = self._streams[s]
            st.frames += self.frames_per_chunk
            st.open = None

    def abort_chunk(self, stream_ids: Any) -> None:
        """Drop the streams' open chunks (their pages go back; history is untouched).

        Args:
            stream_ids: distinct live streams, each with an open chunk.

        Raises:
            UnknownSequenceError: a stream is not live (nothing changed).
            TypeError: ``stream_ids`` is not a list, tuple or array.
            InvalidArgumentError: naming ``stream_ids``: empty, an id listed twice or not
                an int, a stream without an open chunk (nothing changed).
        """
        ids = self._open_streams(stream_ids)
        for s in ids:
            # The step that opened the chunk released only what no query at its start
            # needs, so this rollback is always allowed.
            self._pool.truncate(s, self.chunk_tokens)
            self._streams[s].open = None

    # -- history

    def _visible(self, stream_id: object) -> npt.NDArray[np.int64]:
        """Logical token indices of the cached tokens the stream's next (or open) chunk sees."""
        _, st = self._stream(stream_id)
        end = st.frames * self.tokens_per_frame
        if self.window_frames is None:
            return np.arange(end, dtype=np.int64)
        start = max(self.sink_tokens, end - self.window_frames * self.tokens_per_frame)
        sinks = np.arange(min(self.sink_tokens, end), dtype=np.int64)
        return np.concatenate([sinks, np.arange(start, end, dtype=np.int64)])

    def visible_positions(self, stream_id: int) -> npt.NDArray[np.int64]:
        """The ``(t, h, w)`` of every cached token the stream's next chunk (or its open one)
        sees: the sink frames, then the window (all committed frames without a window), in
        order. ``t`` is logical: it keeps counting after eviction.

        Returns:
            int64 ``[n_visible, 3]`` (``n_visible`` tokens).

        Raises:
            UnknownSequenceError: the stream is not live.
            InvalidArgumentError: not an int in ``0..2**63``.
        """
        return token_positions(self._visible(stream_id), self.tokens_per_frame, self.grid[1])

    def visible_slots(self, stream_id: int) -> npt.NDArray[np.int64]:
        """The KV-cache slots of :meth:`visible_positions`' tokens, same order.

        Returns:
            int64 ``[n_visible]``.

        Raises:
            UnknownSequenceError: the stream is not live.
            InvalidArgumentError: not an int in ``0..2**63``.
            InvariantError: a visible token's page was released (a bug).
        """
        tokens = self._visible(stream_id)
        s = check_id(stream_id, "stream_id")
        bs = self.block_size
        table = self._pool.block_table(s, group=0).astype(np.int64)
        blocks = table[tokens // bs]
        if (blocks < 0).any():
            raise InvariantError(f"stream {s}: a visible token's page was released")
        return blocks * bs + tokens % bs

    def rewrite_window(self, stream_id: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """A prompt switch (LongLive): the visible cached tokens (sinks and window) whose K/V
        the caller recomputes under the new prompt and writes back in place with
        ``kv.write(layer, k, v, slots)``; the next chunk's attention reads them there.

        Returns:
            ``(slots, positions)``: int64 ``[n_visible]`` and ``[n_visible, 3]``, as
            :meth:`visible_slots` and :meth:`visible_positions`.

        Raises:
            UnknownSequenceError: the stream is not live.
            InvalidArgumentError: not an int in ``0..2**63``.
        """
        return self.visible_slots(stream_id), self.visible_positions(stream_id)

    def rewind(self, stream_id: int, frames: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Take the stream back to ``frames`` committed frames, to generate again from there
        (a user going back in an interactive stream, a chunk regenerated): its later frames
        are dropped, and the pages its next chunk sees (sinks and window before
        ``frames``) are held again. Pages the window had released are allocated afresh
        (:meth:`BlockPool.rewind`); the spill copies (``spill_blocks``) of those that have
        one are copied back. The K/V of the other visible tokens is the caller's to
        compute and write at the returned slots (as after :meth:`rewrite_window`) before
        the next chunk; with every page held or spilled there is none. Each restored
        page holds its K/V as last written (a prompt switch's rewrite included).

        Args:
            stream_id: a live stream without an open chunk.
            frames: ``0 ..`` :meth:`stream_frames`, a multiple of ``frames_per_chunk``.

        Returns:
            ``(slots, positions)`` of the visible tokens to recompute: int64 ``[n]`` and
            ``[n, 3]`` (``(t, h, w)``, logical), in visible order; ``n`` is 0 when every
            visible page was held or spilled.

        Raises:
            UnknownSequenceError: the stream is not live.
            PoolExhaustedError: too few free pages for the released ones (nothing changed).
            InvalidArgumentError: naming the argument: a bad id, an open chunk, ``frames``
                not an int, beyond the committed frames or off the chunk grid.
        """
        s, st = self._stream(stream_id)
        frames = check_count(frames, "frames")
        if st.open is not None:
            raise invalid(f"stream_id: stream {s} has an open chunk; commit or abort it first")
        if frames > st.frames or frames % self.frames_per_chunk:
            raise invalid(f"frames: {frames} is not a chunk boundary within the stream's {st.frames} frames "
                          f"(chunks of {self.frames_per_chunk})")
        end = frames * self.tokens_per_frame
        fresh = self._pool.rewind(s, end)[0]
        st.frames = frames
        table = self._pool.block_table(s, group=0).astype(np.int64)
        missing = fresh
        if self._spill is not None:
            found = self._spill.restore(s, fresh, table[fresh])
            missing = fresh[~found]
            # Pages holding anything past the new end are stale: later frames differ now.
            self._spill.forget(s, end // self.block_size)
        tokens = self._visible(s)
        tokens = tokens[np.isin(tokens // self.block_size, missing)]
        slots = table[tokens // self.block_size] * self.block_size + tokens % self.block_size
        return slots, token_positions(tokens, self.tokens_per_frame, self.grid[1])

    def stats(self) -> dict[str, Any]:
        """Occupancy of the cache.

        Returns:
            ``num_blocks``, ``block_size`` (tokens), ``blocks_used``, ``blocks_free``,
            ``bytes_per_block`` (of the dtype, int8's scales included: see the class
            doc), ``bytes_used`` (pages held x bytes per page), and
            ``streams``: per stream id a dict of ``frames`` (committed, logical),
            ``open_chunk`` (bool), ``blocks`` (pages held), ``bytes``, ``stored_tokens``
            (tokens of the stored pages' filled slots), ``visible_tokens`` (cached tokens
            the next chunk sees), ``chunk_tokens`` (of the open chunk, else 0) and
            ``waste_tokens`` (slots held beyond the visible and open-chunk tokens);
            with ``spill_blocks``, ``spill``: ``blocks`` (capacity), ``held``,
            ``spilled`` (pages copied out since built), ``restored`` (copied back by
            rewinds), ``dropped`` (stored over when full) and ``bytes`` (capacity).

        Raises:
            Nothing.
        """
        streams = {}
        for s, st in sorted(self._streams.items()):
            blocks = int((self._pool.block_table(s, group=0) >= 0).sum())
            stored = sum(b - a for a, b in self._pool.stored_ranges(s, group=0))
            visible = int(self._visible(s).size)
            chunk = self.chunk_tokens if st.open is not None else 0
            streams[s] = {"frames": st.frames, "open_chunk": st.open is not None, "blocks": blocks,
                          "bytes": blocks * self.bytes_per_block, "stored_tokens": stored,
                          "visible_tokens": visible, "chunk_tokens": chunk,
                          "waste_tokens": blocks * self.block_size - visible - chunk}
        used = self._pool.num_used_blocks
        out = {"num_blocks": self._pool.num_blocks, "block_size": self.block_size, "blocks_used": used,
               "blocks_free": self._pool.num_free_blocks, "bytes_per_block": self.bytes_per_block,
               "bytes_used": used * self.bytes_per_block, "streams": streams}
        if (sp := self._spill) is not None:
            out["spill"] = {"blocks": sp.capacity, "held": sp.held(), "spilled": sp.spilled, "restored": sp.restored,
                            "dropped": sp.dropped, "bytes": sp.capacity * sp.page_bytes}
        return out
