"""The toy video transformer through VideoCache (pool pages, the batched prefill kernel)
against recompute: the same frames within 1e-5 of their scale with unbounded history and
with sinks + a window, a LongLive prompt switch, and FLOPs equal to the formula."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from pykvpool.video import VideoCache, exact
from pykvpool.video import toy as tv
from pykvpool.video.toy_cached import generate_cached

# Small enough to run in-process in about a second: 3 layers, 3 steps, 4 x 4 frames.
TINY = tv.VideoToyConfig(n_layer=3, grid=(4, 4), sigmas=(1.0, 0.6, 0.3), seed=5)
TINY_WIN = tv.Window(sink_frames=1, window_frames=2)
TINY_SPECS = [tv.StreamSpec(prompt=1, seed=1, frames=10, switch=(3, 9)),
              tv.StreamSpec(prompt=2, seed=2, frames=6, start=1)]


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    """Both scenarios of the proof, in a child process (a hang fails the test) with one BLAS
    thread (small matrices on a shared machine)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "pykvpool.video.exact", "--json", "--repeats", "1"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r["scenario"]: r for r in json.loads(proc.stdout)}


@pytest.mark.parametrize("scenario", ["unbounded", "window"])
def test_cached_frames_equal_recompute(results: dict[str, dict[str, Any]], scenario: str) -> None:
    r = results[scenario]
    assert r["agrees"] and r["max_abs_diff"] <= 1e-5 * r["scale"]
    assert r["scale"] > 1.0  # frames of unit-scale latents, not zeros
    assert min(r["frames"]) >= 8 and max(r["frames"]) >= 12 and r["streams"] >= 2
    assert r["blocks_used_after"] == 0  # every released stream gave its pages back


def test_the_window_run_evicts_and_keeps_a_bounded_cache(results: dict[str, dict[str, Any]]) -> None:
    win, specs = exact.SCENARIOS["window"]
    cfg = tv.VideoToyConfig()
    assert win.window_frames is not None
    bound = (win.sink_frames + win.window_frames + cfg.frames_per_chunk) * cfg.tokens_per_frame
    stored = results["window"]["max_stored_tokens"]
    for spec, held in zip(specs, stored):
        assert held <= bound + cfg.tokens_per_frame  # a page may straddle two frames
        if spec.frames * cfg.tokens_per_frame > bound:
            assert held < spec.frames * cfg.tokens_per_frame  # frames were evicted
    unbounded = results["unbounded"]
    assert unbounded["max_stored_tokens"] == [f * cfg.tokens_per_frame for f in unbounded["frames"]]


def test_counted_flops_equal_the_formula(results: dict[str, dict[str, Any]]) -> None:
    for r in results.values():
        assert r["flops_recompute"] == r["formula_recompute"]
        assert r["flops_cached"] == r["formula_cached"]
        assert r["flops_ratio"] == pytest.approx(r["flops_recompute"] / r["flops_cached"])
        assert r["flops_ratio"] > 1.0 and r["seconds_cached"] > 0 and r["seconds_recompute"] > 0
    # The window caps the cached side only: a long windowed video gains far more.
    cfg = tv.VideoToyConfig()
    assert exact.formula_ratio(cfg, tv.Window(1, 4), 64) > 2 * exact.formula_ratio(cfg, tv.Window(), 64)


def test_formula_matches_counts_on_another_configuration() -> None:
    model = tv.make_model(TINY)
    fc_r, fc_c = tv.FlopCounter(), tv.FlopCounter()
    ref = [tv.generate_recompute(model, s, TINY_WIN, fc_r) for s in TINY_SPECS]
    got = generate_cached(model, TINY_SPECS, TINY_WIN, fc_c)
    assert fc_r.total == exact.flops_recompute(TINY, TINY_WIN, TINY_SPECS)
    assert fc_c.total == exact.flops_cached(TINY, TINY_WIN, TINY_SPECS)
    scale = max(float(np.abs(r).max()) for r in ref)
    for a, b in zip(got.frames, ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale)


def test_formula_grows_as_derived() -> None:
    # Unbounded: a longer video adds recompute work quadratically, cached work linearly.
    cfg, win = tv.VideoToyConfig(), tv.Window()
    one = [tv.StreamSpec(prompt=0, seed=0, frames=2)]
    # Chunk 0 sees no history: the cached side adds only the clean pass (no output head).
    per_pass = exact.flops_recompute(cfg, win, one) // len(cfg.sigmas)
    head = 4 * cfg.d_model ** 2 + 2 * cfg.chunk_tokens * cfg.d_model * cfg.channels
    assert exact.flops_cached(cfg, win, one) - exact.flops_recompute(cfg, win, one) == per_pass - head
    ratios = [exact.flops_recompute(cfg, win, [tv.StreamSpec(0, 0, f)]) /
              exact.flops_cached(cfg, win, [tv.StreamSpec(0, 0, f)]) for f in (8, 16, 32)]
    assert ratios[0] < ratios[1] < ratios[2]
    windowed = tv.Window(sink_frames=1, window_frames=4)
    per_chunk = [exact.flops_cached(cfg, windowed, [tv.StreamSpec(0, 0, f + 2)]) -
                 exact.flops_cached(cfg, windowed, [tv.StreamSpec(0, 0, f)]) for f in (12, 20, 40)]
    assert per_chunk[0] == per_chunk[1] == per_chunk[2]  # the window caps the cached cost


def test_one_attention_call_per_layer_and_pass_for_all_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = VideoCache.attention

    def counted(self: VideoCache, layer: int, q: Any, batch: Any, **kw: Any) -> Any:
        calls.append(batch.num_streams)
        return real(self, layer, q, batch, **kw)

    monkeypatch.setattr(VideoCache, "attention", counted)
    run = generate_cached(tv.make_model(TINY), TINY_SPECS, TINY_WIN, tv.FlopCounter())
    passes = len(TINY.sigmas) + 1  # denoising steps and the clean pass
    assert len(calls) == run.rounds * passes * TINY.n_layer
    # Both streams share the calls of every round where both are active.
    both = min(s.start + s.frames // TINY.frames_per_chunk for s in TINY_SPECS) - max(s.start for s in TINY_SPECS)
    assert calls.count(2) == both * passes * TINY.n_layer


def test_bf16_storage_changes_the_numbers_not_the_mechanics() -> None:
    model = tv.make_model(TINY)
    f32 = generate_cached(model, TINY_SPECS, TINY_WIN, tv.FlopCounter()).frames
    bf16 = generate_cached(model, TINY_SPECS, TINY_WIN, tv.FlopCounter(), dtype="bf16").frames
    scale = max(float(np.abs(a).max()) for a in f32)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(f32, bf16))
    assert 1e-6 * scale < diff < 1e-2 * scale


def test_a_stale_window_after_a_prompt_switch_is_caught() -> None:
    """Without rewrite_window the history keeps the old prompt's K/V: the check fails."""
    model = tv.make_model(TINY)
    spec = TINY_SPECS[0]
    ref = tv.generate_recompute(model, spec, TINY_WIN, tv.FlopCounter())
    stale = generate_cached(model, [spec], TINY_WIN, tv.FlopCounter(), rewrite=False).frames[0]
    fpc = TINY.frames_per_chunk
    assert spec.switch is not None
    before = slice(0, spec.switch[0] * fpc)
    assert np.abs(stale[before] - ref[before]).max() <= 1e-5 * np.abs(ref).max()
    assert np.abs(stale - ref).max() > 1e-2 * np.abs(ref).max()


def test_the_switch_changes_the_video() -> None:
    model = tv.make_model(TINY)
    switched, plain = TINY_SPECS[0], tv.StreamSpec(prompt=1, seed=1, frames=10)
    a = generate_cached(model, [switched], TINY_WIN, tv.FlopCounter()).frames[0]
    b = generate_cached(model, [plain], TINY_WIN, tv.FlopCounter()).frames[0]
    k = 3 * TINY.frames_per_chunk
    np.testing.assert_array_equal(a[:k], b[:k])
    assert np.abs(a[k:] - b[k:]).max() > 1e-2 * np.abs(b).max()


def test_recompute_over_only_the_visible_frames_is_not_the_cache() -> None:
    """With a window, a frame's cached K/V come from when it saw its own window: a recompute
    that keeps only the frames the chunk sees gives other frames once eviction started."""
    model = tv.make_model(TINY)
    spec = tv.StreamSpec(prompt=1, seed=1, frames=10)
    ref = generate_cached(model, [spec], TINY_WIN, tv.FlopCounter()).frames[0]
    short = tv.generate_recompute(model, spec, TINY_WIN, tv.FlopCounter(), only_visible=True)
    assert TINY_WIN.window_frames is not None
    first_evicting = (TINY_WIN.sink_frames + TINY_WIN.window_frames) // TINY.frames_per_chunk + 1
    k = first_evicting * TINY.frames_per_chunk
    assert np.abs(short[:k] - ref[:k]).max() <= 1e-5 * np.abs(ref).max()
    assert np.abs(short - ref).max() > 1e-3 * np.abs(ref).max()


def test_bad_frame_counts_are_refused() -> None:
    model = tv.make_model(TINY)
    with pytest.raises(ValueError, match="frames"):
        tv.generate_recompute(model, tv.StreamSpec(0, 0, 3), TINY_WIN, tv.FlopCounter())
    with pytest.raises(ValueError, match="frames"):
        generate_cached(model, [tv.StreamSpec(0, 0, 5)], TINY_WIN, tv.FlopCounter())
