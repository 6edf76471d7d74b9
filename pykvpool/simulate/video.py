"""Video serving: generation streams on one GPU, admitted through a real ``BlockPool``.

A request asks for ``duration_s`` seconds of video from a :class:`VideoModel`; once admitted
it is a stream producing chunks one after the other. Each chunk takes
``model.passes_per_chunk`` forward passes (the denoising steps and the clean pass). The GPU
runs passes back to back, each *batched* over every running stream: one pass advances every
running stream by one pass of its current chunk (streams at different steps or noise levels
share a pass, as a DiT batches timesteps). A pass's time comes from :class:`VideoRoofline`.

Memory is the pool's: one group, ``FullAttention()`` for full history or
``SlidingWindow(window_frames x tpf + 1, sink_tokens=sink_frames x tpf)`` for sinks + window
(as in ``VideoCache``); each chunk is allocated by one atomic ``BlockPool.step`` over the
streams that begin a chunk, which first releases the pages whose frames left the window. A
stream is admitted (first come, first served) when the pool's free blocks, minus the blocks
the running streams may still take before their own peaks, hold its peak
(:meth:`VideoModel.peak_blocks`: sinks + window + chunk, or its whole history), so no step
ever runs out of pages. Everything is deterministic: the same inputs give the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from pykvpool import _native
from pykvpool.checks import check_count, check_positive
from pykvpool.errors import BudgetError
from pykvpool.planning.hardware import Hardware
from pykvpool.planning.ledger import Budget
from pykvpool.planning.models import storage_dtype
from pykvpool.planning.video import VideoModel

__all__ = ["RealTimeCapacity", "StreamRecord", "VideoRequest", "VideoRoofline", "VideoSimResult",
           "kv_pool_blocks", "simulate_video", "streams_at_real_time", "video_requests"]

MAX_STREAMS = 100_000
"""Most requests one simulation takes."""
MAX_PASSES = 10_000_000
"""Most batched passes one simulation runs (a guard against a run that never ends)."""


@dataclass(frozen=True)
class VideoRoofline:
    """Time of one batched forward pass: ``max(FLOPs / (peak x flops_efficiency), bytes /
    (bandwidth x bandwidth_efficiency)) + overhead``, seconds.

    Per stream in the pass, with ``C`` chunk tokens and ``h`` visible history tokens: FLOPs =
    ``2 x params x C`` (the linear layers) ``+ 4 x layers x q_width x C x (h + C)`` (the chunk
    attention over the history and the chunk itself, bidirectional within the chunk) ``+ 4 x
    layers x q_width x C x text_tokens`` (cross-attention); bytes = the weights once per pass
    plus each stream's visible K/V (``(h + C) x kv_bytes_per_token``). The max, not the sum:
    with thousands of tokens per chunk every weight and every cached key is reused by the
    whole chunk (far right of the ridge), so the reads hide under the compute.

    Attributes:
        model: the generator; hardware: the device (its peak for ``compute_dtype``).
        kv_dtype: KV storage dtype (``"bf16"``, ``"fp8_e4m3"``...): the bytes per token; any
            spelling :func:`pykvpool.planning.models.storage_dtype` reads, kept as its one
            spelling (``"fp16"`` becomes ``"f16"``).
        flops_efficiency, bandwidth_efficiency: fractions of the roofs reached (the
            simulator's :class:`pykvpool.planning.roofline.Roofline` defaults).
        overhead: seconds per pass (launches, scheduling).

    Raises:
        InvalidArgumentError: an efficiency outside (0, 1], a negative or non-finite
            ``overhead``, a malformed ``kv_dtype``.
        UnknownPresetError: an unknown ``kv_dtype``, or no peak for ``compute_dtype`` on the
            device.
    """

    model: VideoModel
    hardware: Hardware
    kv_dtype: str = "bf16"
    compute_dtype: str = "bf16"
    flops_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    overhead: float = 2e-3

    def __post_init__(self) -> None:
        check_positive(self.flops_efficiency, "flops_efficiency", most=1.0)
        check_positive(self.bandwidth_efficiency, "bandwidth_efficiency", most=1.0)
        check_positive(self.overhead, "overhead", zero=True)
        object.__setattr__(self, "kv_dtype", storage_dtype(self.kv_dtype).name)
        self.model.kv_bytes_per_token(self.kv_dtype)
        self.hardware.flops(self.compute_dtype)

    @cached_property
    def _terms(self) -> tuple[float, float, float, float, float, float]:
        """FLOPs per stream, FLOPs per history token, weight bytes, KV bytes per token, chunk
        tokens, and the two reachable roofs (FLOP/s, bytes/s) folded in as reciprocals."""
        m = self.model
        c, qw = m.chunk_tokens, m.num_q_heads * m.head_dim
        per = 2.0 * m.num_params * c + 4.0 * m.num_layers * qw * c * (c + m.text_tokens)
        return (per, 4.0 * m.num_layers * qw * c, m.weight_bytes,
                float(m.kv_bytes_per_token(self.kv_dtype)),
                1.0 / (self.hardware.flops(self.compute_dtype) * self.flops_efficiency),
                1.0 / (self.hardware.bandwidth * self.bandwidth_efficiency))

    def pass_flops(self, history_tokens: Sequence[int]) -> float:
        """FLOPs of one pass over streams with these visible history tokens (chunk excluded)."""
        per, per_hist = self._terms[:2]
        return len(history_tokens) * per + per_hist * float(sum(history_tokens))

    def pass_bytes(self, history_tokens: Sequence[int]) -> float:
        """Bytes one pass reads: the weights once, each stream's visible K/V (chunk included)."""
        weights, kv = self._terms[2:4]
        tokens = float(sum(history_tokens)) + len(history_tokens) * self.model.chunk_tokens
        return weights + kv * tokens

    def pass_time(self, history_tokens: Sequence[int]) -> float:
        """Seconds of one pass batched over streams with these visible history tokens."""
        inv_flops, inv_bw = self._terms[4:]
        return max(self.pass_flops(history_tokens) * inv_flops,
                   self.pass_bytes(history_tokens) * inv_bw) + self.overhead


@dataclass(frozen=True)
class VideoRequest:
    """One generation request: ``arrival`` (s) and ``duration_s`` (seconds of video)."""

    arrival: float
    duration_s: float


def video_requests(num: int, durations: float | tuple[float, float], rate: float | None = None,
                   seed: int = 0) -> list[VideoRequest]:
    """``num`` requests: Poisson arrivals at ``rate`` requests/s (None: all at t = 0), each of
    ``durations`` seconds of video (a number, or ``(lo, hi)`` drawn uniformly). Seeded.

    Raises:
        InvalidArgumentError: ``num`` not in ``1..=MAX_STREAMS``, a duration or rate not
            finite and > 0, ``lo > hi``, a negative seed.
    """
    n = check_count(num, "num", 1)
    if n > MAX_STREAMS:
        raise _native.InvalidArgumentError(f"num must be <= {MAX_STREAMS:,}, got {n}")
    rng = np.random.default_rng(check_count(seed, "seed", 0))
    if isinstance(durations, tuple):
        lo, hi = (check_positive(d, "durations") for d in durations)
        if lo > hi:
            raise _native.InvalidArgumentError(f"durations (lo, hi) must have lo <= hi, got {durations}")
        lengths = rng.uniform(lo, hi, n)
    else:
        lengths = np.full(n, check_positive(durations, "durations"))
    if rate is None:
        arrivals = np.zeros(n)
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / check_positive(rate, "rate"), n))
        arrivals -= arrivals[0]
    return [VideoRequest(float(a), float(d)) for a, d in zip(arrivals, lengths)]


@dataclass
class StreamRecord:
    """What happened to one request (times in seconds from t = 0).

    Attributes:
        arrival, duration_s: the request. chunks: chunks it needs.
        peak_blocks: its reservation (blocks of the pool).
        admitted: when it became a stream (None: never; ``rejected``: its peak exceeds the
            whole pool).
        chunk_times: when each chunk's last pass ended.
        memory: ``(time, blocks held)`` at every change.
    """

    arrival: float
    duration_s: float
    chunks: int
    peak_blocks: int
    admitted: float | None = None
    rejected: bool = False
    chunk_times: list[float] = field(default_factory=list)
    memory: list[tuple[float, int]] = field(default_factory=list)

    @property
    def time_to_first_chunk(self) -> float:
        """Seconds from arrival to the end of the first chunk (NaN if it never ran)."""
        return self.chunk_times[0] - self.arrival if self.chunk_times else math.nan

    def chunk_intervals(self) -> npt.NDArray[np.float64]:
        """Seconds each chunk took: from admission (first chunk) or the previous chunk."""
        if self.admitted is None:
            return np.zeros(0)
        return np.diff(np.array([self.admitted, *self.chunk_times]))


@dataclass(frozen=True)
class VideoSimResult:
    """A simulation's outcome.

    Attributes:
        model: the generator (its cache policy); streams: one record per request, in order.
        block_size: tokens per block; bytes_per_block: KV bytes of one block.
        times: start of every batched pass (s); used_blocks: pool blocks held during it;
            running: streams in it.
        passes: batched passes run; end_time: when the last pass ended (s).
    """

    model: VideoModel
    streams: list[StreamRecord]
    block_size: int
    bytes_per_block: int
    times: npt.NDArray[np.float64]
    used_blocks: npt.NDArray[np.int64]
    running: npt.NDArray[np.int64]
    passes: int
    end_time: float

    def real_time(self, stream: StreamRecord) -> bool:
        """True when every chunk of ``stream`` was generated within the video time it holds
        (generated fps >= video fps chunk by chunk, the first chunk from admission)."""
        iv = stream.chunk_intervals()
        done = len(stream.chunk_times) == stream.chunks
        return done and bool(np.all(iv <= self.model.chunk_seconds * (1 + 1e-9)))

    def min_fps(self, stream: StreamRecord) -> float:
        """The stream's slowest chunk as video frames per second (0 if it never ran)."""
        iv = stream.chunk_intervals()
        m = self.model
        return m.frames_per_chunk * m.temporal_compression / float(iv.max()) if iv.size else 0.0


def _group(model: VideoModel) -> _native.FullAttention | _native.SlidingWindow:
    if model.window_frames is None:
        return _native.FullAttention()
    tpf = model.tokens_per_frame
    return _native.SlidingWindow(model.window_frames * tpf + 1, sink_tokens=model.sink_frames * tpf)


def kv_pool_blocks(model: VideoModel, budget: Budget, block_size: int, kv_dtype: str = "bf16") -> int:
    """Blocks of ``block_size`` tokens that ``budget`` leaves for KV after the weights:
    ``floor((available - weights) / (block_size x kv_bytes_per_token))``.

    Raises:
        BudgetError: the weights plus the reserve leave no room for one block.
        InvalidArgumentError: ``block_size`` < 1; a malformed ``kv_dtype``.
    """
    per_block = check_count(block_size, "block_size", 1) * model.kv_bytes_per_token(kv_dtype)
    free = budget.available_bytes - model.weight_bytes
    if free < per_block:
        raise BudgetError(f"{model.name}: weights {model.weight_bytes / 2**30:.2f} GiB leave no "
                          f"room for KV in {budget.describe()}", model.weight_bytes + per_block,
                          budget.available_bytes)
    return int(free // per_block)


class _Run:
    """One simulation's mutable state (see :func:`simulate_video`)."""

    def __init__(self, requests: Sequence[VideoRequest], roof: VideoRoofline, num_blocks: int,
                 block_size: int, max_streams: int | None) -> None:
        self.m, self.roof, self.bs = roof.model, roof, block_size
        self.pool = _native.BlockPool(num_blocks, block_size, [_group(self.m)])
        self.max_streams = max_streams
        self.recs = [StreamRecord(r.arrival, r.duration_s, self.m.num_chunks(r.duration_s),
                                  self.m.peak_blocks(r.duration_s, block_size)) for r in requests]
        self.order = sorted(range(len(self.recs)), key=lambda i: (self.recs[i].arrival, i))
        self.next = 0
        self.running: list[int] = []
        self.chunk = [0] * len(self.recs)
        self.pas = [0] * len(self.recs)
        self.held = [0] * len(self.recs)
        self.hist = [0] * len(self.recs)
        self.t = 0.0
        self.changed = True

    def admit(self) -> None:
        if not self.changed and (self.next >= len(self.order)
                                 or self.recs[self.order[self.next]].arrival > self.t):
            return  # nothing finished and nobody arrived since the last look
        self.changed = False
        outstanding = sum(self.recs[i].peak_blocks - self.held[i] for i in self.running)
        while self.next < len(self.order):
            i = self.order[self.next]
            r = self.recs[i]
            if r.peak_blocks > self.pool.num_blocks:
                r.rejected = True
                self.next += 1
                continue
            if r.arrival > self.t or (self.max_streams is not None and len(self.running) >= self.max_streams):
                return
            if self.pool.num_free_blocks - outstanding < r.peak_blocks:
                return
            self.pool.add_sequence(i, 0)
            r.admitted = self.t
            outstanding += r.peak_blocks
            self.running.append(i)
            self.next += 1

    def begin_chunks(self) -> None:
        starting = [i for i in self.running if self.pas[i] == 0]
        if not starting:
            return
        self.pool.step(starting, self.m.chunk_tokens)
        for i in starting:
            self.held[i] = self.stored_blocks(i)
            self.recs[i].memory.append((self.t, self.held[i]))
            before = self.m.visible_frames(self.chunk[i]) - self.m.frames_per_chunk
            self.hist[i] = before * self.m.tokens_per_frame

    def stored_blocks(self, i: int) -> int:
        """Blocks stream ``i`` holds in the pool now, read in time bounded by its window, not
        by its video (its logical table, holes included, grows with the video): a full
        history stores every logical block (nothing here releases, forks or caches one),
        ``ceil(length / block_size)``; a window stores its sinks and its window, the few
        ranges :meth:`BlockPool.stored_ranges` lists (each starts on a block boundary)."""
        if self.m.window_frames is None:
            return -(-self.pool.seq_len(i) // self.bs)
        return sum(-(-(end - start) // self.bs) for start, end in self.pool.stored_ranges(i, group=0))

    def finish_passes(self, k: int) -> None:
        """Every running stream ran ``k`` more passes, ending at ``self.t``."""
        still = []
        per_chunk = self.m.passes_per_chunk
        for i in self.running:
            self.pas[i] += k
            if self.pas[i] < per_chunk:
                still.append(i)
                continue
            self.pas[i] = 0
            self.chunk[i] += 1
            self.recs[i].chunk_times.append(self.t)
            if self.chunk[i] < self.recs[i].chunks:
                still.append(i)
            else:
                self.pool.free(i)
                self.changed = True
                self.held[i] = 0
                self.recs[i].memory.append((self.t, 0))
        self.running = still

    def next_arrival(self) -> float:
        """The next request's arrival if it lies after now, else infinity."""
        if self.next < len(self.order):
            a = self.recs[self.order[self.next]].arrival
            if a > self.t:
                return a
        return math.inf


def simulate_video(requests: Sequence[VideoRequest], roof: VideoRoofline, num_blocks: int,
                   block_size: int = 16, max_streams: int | None = None) -> VideoSimResult:
    """Serve ``requests`` on one GPU (``roof``) with a pool of ``num_blocks`` blocks of
    ``block_size`` tokens; at most ``max_streams`` streams run at once (None: as many as
    the pool admits). A request whose peak exceeds the whole pool is rejected.

    Raises:
        InvalidArgumentError: no request or more than :data:`MAX_STREAMS`, ``num_blocks`` or
            ``block_size`` out of the pool's range, ``max_streams`` < 1, a run longer than
            :data:`MAX_PASSES` passes.
    """
    if not 1 <= len(requests) <= MAX_STREAMS:
        raise _native.InvalidArgumentError(
            f"requests must hold 1..={MAX_STREAMS:,} requests, got {len(requests)}")
    if max_streams is not None:
        check_count(max_streams, "max_streams", 1)
    run = _Run(requests, roof, check_count(num_blocks, "num_blocks", 1),
               check_count(block_size, "block_size", 1), max_streams)
    times: list[float] = []
    used: list[int] = []
    running: list[int] = []
    while True:
        run.admit()
        if not run.running:
            if run.next >= len(run.order):
                break
            run.t = max(run.t, run.recs[run.order[run.next]].arrival)
            continue
        run.begin_chunks()
        # Until a chunk ends or a request arrives, every pass has the same batch and time.
        dt = roof.pass_time([run.hist[i] for i in run.running])
        k = min(run.m.passes_per_chunk - run.pas[i] for i in run.running)
        arrival, state, done = run.next_arrival(), (run.pool.num_used_blocks, len(run.running)), 0
        while done < k:
            if len(times) >= MAX_PASSES:
                raise _native.InvalidArgumentError(f"the run exceeds {MAX_PASSES:,} passes")
            times.append(run.t)
            used.append(state[0])
            running.append(state[1])
            run.t += dt
            done += 1
            if run.t >= arrival:
                break
        run.finish_passes(done)
    return VideoSimResult(run.m, run.recs, block_size, block_size * run.m.kv_bytes_per_token(roof.kv_dtype),
                          np.array(times), np.array(used, dtype=np.int64),
                          np.array(running, dtype=np.int64), len(times), run.t)


@dataclass(frozen=True)
class RealTimeCapacity:
    """Concurrent streams one GPU keeps at real time.

    Attributes:
        streams: the most streams that, started together, all run at once and keep real
            time for the whole video (0: not even one).
        memory_streams: the most the pool holds at once (peaks reserved).
        limit: ``"memory"`` or ``"compute"``: which bound ``streams`` is.
        single_fps: one stream alone, its slowest chunk in video frames per second.
        num_blocks: the pool's blocks.
    """

    streams: int
    memory_streams: int
    limit: str
    single_fps: float
    num_blocks: int


def streams_at_real_time(roof: VideoRoofline, duration_s: float, num_blocks: int,
                         block_size: int = 16) -> RealTimeCapacity:
    """Search (bisection over simulations of ``n`` streams arriving together) the most
    streams of ``duration_s`` seconds that ``roof``'s GPU with ``num_blocks`` blocks runs at
    once, every chunk within its video time.

    Raises:
        InvalidArgumentError: ``duration_s`` not finite and > 0; ``num_blocks`` or
            ``block_size`` out of range.
    """
    peak = roof.model.peak_blocks(duration_s, block_size)
    mem = check_count(num_blocks, "num_blocks", 1) // peak

    def ok(n: int) -> tuple[bool, float]:
        res = simulate_video(video_requests(n, duration_s), roof, num_blocks, block_size)
        fps = min(res.min_fps(s) for s in res.streams)
        return all(s.admitted == 0.0 and res.real_time(s) for s in res.streams), fps

    if mem == 0:
        return RealTimeCapacity(0, 0, "memory", 0.0, num_blocks)
    good, single = ok(1)
    # Chunk 0 (no history) is the fastest: more streams than its passes fit in one chunk's
    # video time can never keep real time; bisect below that.
    top = 1
    m = roof.model
    while top < mem and m.passes_per_chunk * roof.pass_time([0] * (top + 1)) <= m.chunk_seconds:
        top += 1
    lo, hi = (1, top) if good else (0, 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid)[0] else (lo, mid - 1)
    limit = "memory" if lo == mem else "compute"
    return RealTimeCapacity(lo, mem, limit, single, num_blocks)
