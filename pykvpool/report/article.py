"""The article's published numbers beside pykvpool's own, computed by pykvpool.

Every pykvpool value here comes from :mod:`pykvpool.planning.ledger`, :mod:`pykvpool.planning.video` and the
pool-backed :mod:`pykvpool.planning.sweeps`; it is formatted with the precision the article prints,
so "match" means the two printed values are identical.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pykvpool.planning.hardware import hardware_preset
from pykvpool.planning.ledger import GIB, MIB, MemoryLedger, article_budget
from pykvpool.planning.models import model_preset
from pykvpool.planning.roofline import decode_intensity, prefill_intensity
from pykvpool.planning.sweeps import SweepResult, block_size_sweep, contiguous, paged, waste_decomposition
from pykvpool.planning.video import article_videos
from pykvpool.planning.workloads import ARTICLE_MAX_LEN, Workload, article_heavy_tail, article_uniform

__all__ = ["ARTICLE", "ArticleRun", "Reproduced", "article_ledgers", "reproduce"]

ARTICLE = ("\"KV Cache 与自回归视频生成\" (\"KV cache and autoregressive video generation\"), a "
           "Chinese-language tutorial of an inference-acceleration series (level: advanced); the "
           "copy pykvpool reproduces names no author, site or publication date, and describes "
           "transformers' cache code as of 2026-10")
"""The article the report reproduces, as the report names it where it first mentions it."""


@dataclass(frozen=True)
class Reproduced:
    """One article number: what it is, the article's printed value, pykvpool's value
    printed the same way, and the unrounded pykvpool value."""

    what: str
    article: str
    pykvpool: str
    value: float

    @property
    def match(self) -> bool:
        """The printed values are identical."""
        return self.article == self.pykvpool


@dataclass(frozen=True)
class ArticleRun:
    """The computed pieces, kept for the report's tables and figures."""

    rows: list[Reproduced]
    sweeps: dict[str, tuple[SweepResult, SweepResult]]
    workloads: dict[str, Workload]


def article_ledgers() -> tuple[MemoryLedger, MemoryLedger]:
    """Llama-3-8B BF16 and its MHA variant under the article's budget (80 GiB - 4 GiB)."""
    budget = article_budget()
    return (MemoryLedger(model_preset("llama-3-8b"), budget),
            MemoryLedger(model_preset("llama-3-8b-mha"), budget))


def reproduce(progress: Callable[[int, int], None] | None = None) -> ArticleRun:
    """Compute every reproduced number (ledger, video, decode bound, static capacity,
    waste, block size). Takes well under a second.

    Args:
        progress: called as ``progress(done, total)`` after each stage (None: silent).

    Raises:
        Exception: whatever ``progress`` raises, unchanged (the inputs are fixed: nothing
            else can fail).
    """
    gqa, mha = article_ledgers()
    a100 = hardware_preset("a100-80gb-sxm")
    rows: list[Reproduced] = []

    def add(what: str, article: str, fmt: str, value: float) -> None:
        rows.append(Reproduced(what, article, fmt.format(value), float(value)))

    add("Llama-3-8B BF16 KV bytes per token", "131072", "{:.0f}", gqa.bytes_per_token)
    add("one 8192-token sequence (GiB)", "1.00", "{:.2f}", gqa.kv_bytes(seq_len=8192) / GIB)
    add("weights, 8.03e9 params BF16 (GiB)", "14.96", "{:.2f}", gqa.weight_bytes / GIB)
    add("batch 32 x 8192 KV (GiB)", "32.00", "{:.2f}", gqa.row(batch=32, seq_len=8192).kv_bytes / GIB)
    add("KV / weights at batch 32", "2.14x", "{:.2f}x", gqa.row(batch=32, seq_len=8192).kv_over_weights)
    add("weights + KV at batch 64 (GiB)", "78.96", "{:.2f}",
        gqa.row(batch=64, seq_len=8192).weights_plus_kv_bytes / GIB)
    add("MHA (n_kv=32) KV per token (KiB)", "512", "{:.0f}", mha.bytes_per_token / 1024)
    add("MHA batch 32 x 8192 KV (GiB)", "128", "{:.0f}", mha.kv_bytes(seq_len=8192, batch=32) / GIB)
    for video, article in zip(article_videos(), ("52.73", "105.47", "316.41")):
        add(f"video {video.name} KV (GiB), {video.tokens} tokens", article, "{:.2f}",
            video.kv_bytes(gqa.bytes_per_token) / GIB)
    bound = gqa.decode_bound(a100, seq_len=8192, batch=1)
    add("decode step lower bound, batch 1, 8192 tok, A100 (ms)", "8.4", "{:.1f}",
        bound.step_time * 1e3)
    add("single-stream upper bound (tokens/s)", "119", "{:.0f}", bound.tokens_per_s)
    add("KV token capacity of the 80 - 14.96 - 4 GiB budget", "500063", "{:.0f}",
        gqa.token_capacity)
    for g in (1, 4, 32):
        add(f"ideal decode intensity 2g/p, g={g}, BF16 (FLOP/byte)", str(g), "{:.0f}",
            decode_intensity(g, 2))
    add("A100 BF16 ridge point (FLOP/byte)", "153", "{:.0f}", a100.ridge_point("bf16"))
    add("prefill intensity, S=8192 (FLOP/byte)", "3973.9", "{:.1f}",
        prefill_intensity(gqa.model, 8192))

    cap, bpt = gqa.token_capacity, gqa.bytes_per_token
    workloads = {"uniform": article_uniform(), "heavy": article_heavy_tail()}
    published = {"uniform": ("122", "214", "1.75x", "56.59%", "99.70%"),
                 "heavy": ("122", "405", "3.32x", "30.11%", "99.40%")}
    sweeps: dict[str, tuple[SweepResult, SweepResult]] = {}
    for j, (key, wl) in enumerate(workloads.items()):
        c = contiguous(wl, cap, ARTICLE_MAX_LEN, bpt)
        p = paged(wl, cap, 16, bpt)
        sweeps[key] = (c, p)
        pub = published[key]
        add(f"{key}: admitted, contiguous at 4096", pub[0], "{:.0f}", c.admitted)
        add(f"{key}: admitted, paged b=16", pub[1], "{:.0f}", p.admitted)
        add(f"{key}: gain paged / contiguous", pub[2], "{:.2f}x", p.gain_over(c))
        add(f"{key}: utilization, contiguous", pub[3], "{:.2%}", c.utilization)
        add(f"{key}: utilization, paged b=16", pub[4], "{:.2%}", p.utilization)
        if progress is not None:
            progress(j + 1, 3)
    w = waste_decomposition(workloads["uniform"], ARTICLE_MAX_LEN, 16, bpt)
    add("uniform: reservation waste per request (MiB)", "223.26", "{:.2f}",
        w.reservation_waste_bytes / MIB)
    add("uniform: last-block waste per request (MiB)", "0.93", "{:.2f}",
        w.last_block_waste_bytes / MIB)
    add("ratio of the two wastes", "239x", "{:.0f}x", w.ratio)
    add("uniform: mean request length (tokens)", "2310", "{:.0f}", w.mean_length)
    rows_b = {r.block_size: r for r in block_size_sweep(workloads["uniform"], (16, 32))}
    add("empty slots / mean length at b=16", "0.32%", "{:.2%}", rows_b[16].empty_over_length)
    add("empty slots / mean length at b=32", "0.67%", "{:.2%}", rows_b[32].empty_over_length)
    if progress is not None:
        progress(3, 3)
    return ArticleRun(rows, sweeps, workloads)
