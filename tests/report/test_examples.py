"""The examples run and do what they say."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import pykvpool as kv

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_serving_loop_finishes_every_request_and_matches_numpy() -> None:
    ex = _load("serving_loop")
    reqs = ex.make_requests()
    res = ex.serve(reqs)
    assert res.generated == {r.rid: r.output for r in reqs}
    assert res.preemptions >= 1  # the pool is too small for every request at once
    assert res.pool.num_seqs == 0 and res.pool.num_used_blocks == 0
    assert res.pool.num_free_blocks == ex.NUM_BLOCKS
    res.pool.check_invariants()
    assert res.max_error < 1e-4
    # A step can only decode what is running: at least the longest output, at most all.
    assert max(r.output for r in reqs) <= res.steps <= sum(r.output for r in reqs)


def test_serving_loop_detects_a_wrong_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy check can fail: prompt K written in reverse order is caught."""
    ex = _load("serving_loop")

    def bad_admit(pool: Any, cache: Any, req: Any) -> None:
        slots = pool.add_sequence(req.rid, req.length)
        cache.write(0, req.k[: req.length][::-1].copy(), req.v[: req.length], slots)

    monkeypatch.setattr(ex, "admit", bad_admit)
    assert ex.serve(ex.make_requests()).max_error > 1e-3


def test_serving_loop_runs_as_a_script() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "serving_loop.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "6 requests finished" in proc.stdout and "0 blocks still used" in proc.stdout


def test_hybrid_decode_matches_numpy_and_keeps_the_local_group_flat() -> None:
    ex = _load("hybrid_decode")
    res = ex.run(steps=3 * ex.WINDOW)
    assert res.max_error < 1e-4
    full = [h[0] for h in res.held]
    local = [h[1] for h in res.held]
    # The global group grows with the sequences; the local one stops at the window's
    # blocks (sinks none; ceil((WINDOW - 1) / BLOCK_SIZE) + 1 per sequence, +1 while growing).
    bound = len(ex.PROMPTS) * (-(-(ex.WINDOW - 1) // ex.BLOCK_SIZE) + 2)
    assert full[-1] > 2 * full[0] and max(local) <= bound
    assert max(local[len(local) // 2:]) == max(local[: len(local) // 2 + 1])
    res.pool.check_invariants()


def test_hybrid_decode_detects_a_wrong_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy check can fail: local layers that miss the window's oldest key are caught."""
    ex = _load("hybrid_decode")

    def short_window(pool: Any, cache: Any, j: int, q: Any, ids: list[int]) -> Any:
        indptr, indices, last, start = pool.flashinfer_tables(ids, group=1)
        return kv.decode_attention_paged(cache, j, q, indptr, indices, last, scale=ex.SCALE,
                                         window_left=ex.WINDOW - 2, kv_page_start=start)

    monkeypatch.setattr(ex, "local_attention", short_window)
    assert ex.run(steps=4).max_error > 1e-3


def test_hybrid_decode_runs_as_a_script() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "hybrid_decode.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "3 sequences decoded" in proc.stdout and "0 blocks still used" in proc.stdout


def test_video_stream_matches_recompute_and_keeps_the_window_flat() -> None:
    ex = _load("video_stream")
    res = ex.run()
    assert res.max_error <= 1e-5 * res.scale and res.scale > 1.0
    # A frame is a page here (16 tokens): after each commit a stream keeps its sink and
    # window frames, so the pages held stop growing once the window is full.
    per_stream = ex.WIN.sink_frames + ex.WIN.window_frames
    assert max(res.blocks_held) == res.blocks_held[-1] == len(ex.STREAMS) * per_stream
    assert res.blocks_held[0] < res.blocks_held[-1] and res.blocks_after == 0


def test_video_stream_detects_a_short_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recompute check can fail: attention that misses the window's oldest frame is caught."""
    ex = _load("video_stream")

    def short_window(vc: Any, batch: Any) -> Any:
        def attend(layer: int, q: Any, k: Any, v: Any) -> Any:
            vc.write(layer, k, v, batch)
            return kv.prefill_attention_paged(
                vc.kv, layer, q, batch.qo_indptr, batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len,
                q_positions=batch.q_positions, window_left=batch.window_left - ex.CFG.tokens_per_frame,
                sink_tokens=batch.sink_tokens, scale=ex.SCALE, kv_page_start=batch.kv_page_start)
        return attend

    monkeypatch.setattr(ex, "chunk_attention", short_window)
    res = ex.run()
    assert res.max_error > 1e-3 * res.scale


def test_video_stream_runs_as_a_script() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "video_stream.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2 videos of 12 frames generated" in proc.stdout and "0 blocks still used" in proc.stdout


def test_hf_generate_matches_dynamic_cache_and_frees_the_window() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch

    ex = _load("hf_generate")
    out = ex.run()
    assert torch.equal(out["reference"], out["paged"])
    cache = out["cache"]
    bs = 4
    held = dict(zip((type(g).__name__ for g in cache.pool.groups), cache.pool.stats().group_blocks))
    # The global layers keep every cached token of every row (prompt + new tokens - 1, the
    # last token is never fed back); the window layers at most the window's blocks plus one.
    lens = [len(p) + ex.NEW_TOKENS - 1 for p in ex.PROMPTS]
    assert held["FullAttention"] == sum(-(-n // bs) for n in lens)
    window = ex.CONFIG["sliding_window"]
    assert held["SlidingWindow"] <= len(lens) * (-(-(window - 1) // bs) + 2)


def test_hf_continuous_batching_matches_generate_on_a_small_pool() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch

    ex = _load("hf_continuous_batching")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model gains nothing from more; OpenMP spinning on a loaded machine costs
    try:
        out = ex.run()
    finally:
        torch.set_num_threads(threads)
    assert out["served"] == out["reference"]
    b = out["batcher"]
    st = b.stats
    # The pool holds 20 blocks: too few for all 10 sequences at once, so admission held some
    # back; a window bounds each footprint, so none had to be preempted.
    assert st.max_running < len(ex.PROMPT_LENS) and st.peak_used_blocks <= ex.LIMITS["num_blocks"]
    assert st.preemptions == 0 and st.recomputed_tokens == 0
    assert st.prefill_chunks >= 1 and st.mixed_steps >= 1 and st.max_running <= ex.LIMITS["max_running"]
    assert st.generated_tokens == len(ex.PROMPT_LENS) * ex.NEW_TOKENS
    assert b.cache.pool.num_used_blocks == 0 and b.cache.pool.num_seqs == 0
