"""The article's toy decoder through pykvpool (BlockPool.step -> KvCache.write ->
decode_attention) against full recompute: same tokens, matching logits, exact FLOPs."""

from __future__ import annotations

import numpy as np

from pykvpool import toy_decoder as td


def test_flop_counts_reproduce_the_article_exactly() -> None:
    cfg = td.ToyConfig()
    assert td.flops_recompute(cfg) == 130_047_672_320
    assert td.flops_cached(cfg) == 1_231_355_904
    assert f"{td.flops_recompute(cfg):.4e}" == "1.3005e+11"
    assert f"{td.flops_cached(cfg):.4e}" == "1.2314e+09"
    assert round(td.flops_recompute(cfg) / td.flops_cached(cfg), 2) == 105.61


def test_step_count_matches_formula_terms() -> None:
    # A decode step at context S costs the projections once plus 4 Hq d S per layer;
    # a full forward over one token is the same as a step at S = 1.
    cfg = td.ToyConfig()
    assert td.flops_full(cfg, 1) == td.flops_step(cfg, 1)
    diff = td.flops_step(cfg, 101) - td.flops_step(cfg, 100)
    assert diff == cfg.n_layer * 4 * cfg.n_q_head * cfg.d_head


def test_cached_route_generates_the_same_tokens_and_logits() -> None:
    r = td.run()
    assert r.same_tokens == r.gen == 192
    assert r.max_abs_diff <= 1e-5 * max(r.logit_scale, 1.0)
    assert r.flops_ratio > 105.6
    assert r.seconds_cached > 0 and r.seconds_recompute > 0


def test_cached_route_matches_recompute_in_bf16_storage_on_a_short_run() -> None:
    # bf16 K/V changes the numbers (storage rounding), not the mechanics: the cache
    # route must still be a faithful decoder, so compare with an f32-cache run.
    cfg = td.ToyConfig(gen=24)
    model = td.make_model(cfg)
    prompt = list(range(cfg.prompt))
    toks32, logits32 = td.generate_cached(model, prompt)
    toks_ref, logits_ref = td.generate_recompute(model, prompt)
    assert toks32 == toks_ref
    np.testing.assert_allclose(logits32, logits_ref, atol=1e-5 * max(float(np.abs(logits_ref).max()), 1.0))
    _, logits16 = td.generate_cached(model, prompt, dtype="bf16")
    assert np.abs(logits16 - logits32).max() < 0.05 * np.abs(logits32).max()


def test_main_exits_zero() -> None:
    assert td.main(["--json", "--repeats", "1"]) == 0


def test_decode_options_reach_every_decode_call() -> None:
    # q_dtype="int8" moves the logits (the query quantized to int8) on every path, within its
    # bound of the exact int8 run. A key decode_attention does not take is a TypeError, an
    # option the dtype refuses an InvalidArgumentError, both before any token.
    import pytest

    import pykvpool as kv

    cfg = td.ToyConfig(d_head=64, gen=24)
    model = td.make_model(cfg)
    prompt = list(range(cfg.prompt))
    toks, _ = td.generate_cached(model, prompt, "int8")
    exact = td.cached_logits(model, prompt, toks, "int8")
    fast = td.cached_logits(model, prompt, toks, "int8", decode_options={"q_dtype": "int8"})
    moved = float(np.abs(fast - exact).max())
    assert 0 < moved < 0.05 * float(np.abs(exact).max())
    with pytest.raises(TypeError):
        td.generate_cached(model, prompt, "int8", decode_options={"int8_fast": True})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(kv.InvalidArgumentError, match="q_dtype=int8 with pv_dtype=f32 is not a decode precision for bf16 caches"):
        td.generate_cached(model, prompt, "bf16", decode_options={"q_dtype": "int8"})
