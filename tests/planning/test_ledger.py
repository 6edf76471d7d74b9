"""Memory ledger, model/dtype/hardware presets and the video ledger: the article's numbers
exactly, plus the errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pykvpool
from pykvpool import _native
from pykvpool.report.article import article_ledgers, reproduce
from pykvpool.errors import BudgetError, UnknownPresetError
from pykvpool.planning.hardware import HARDWARE, hardware_preset, measure_this_machine
from pykvpool.planning.ledger import GIB, Budget, MemoryLedger, article_budget
from pykvpool.planning.models import MODELS, ModelConfig, model_preset, storage_dtype
from pykvpool.planning.video import VideoSpec, article_videos, block_causal_mask

LLAMA3_8B_HF: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "tie_word_embeddings": False,
    "vocab_size": 128256,
}


def test_llama3_8b_bytes_per_token_and_sequence() -> None:
    gqa, _ = article_ledgers()
    assert gqa.bytes_per_token == 131072 == 2 * 32 * 8 * 128 * 2
    assert gqa.kv_bytes(seq_len=8192) == 1 * GIB
    assert f"{gqa.kv_bytes(seq_len=8192) / GIB:.2f}" == "1.00"


def test_weights_batch32_batch64() -> None:
    gqa, _ = article_ledgers()
    assert gqa.weight_bytes == 8.03e9 * 2
    assert f"{gqa.weight_bytes / GIB:.2f}" == "14.96"
    r32 = gqa.row(batch=32, seq_len=8192)
    assert r32.kv_bytes == 32 * GIB
    assert f"{r32.kv_over_weights:.2f}" == "2.14"
    r64 = gqa.row(batch=64, seq_len=8192)
    assert f"{r64.weights_plus_kv_bytes / GIB:.2f}" == "78.96"
    assert r64.total_bytes == r64.weights_plus_kv_bytes + 4 * GIB
    assert r64.total_bytes > gqa.budget.usable_bytes  # the article: batch 64 exceeds 80 GiB


def test_mha_variant() -> None:
    _, mha = article_ledgers()
    assert mha.bytes_per_token == 512 * 1024
    assert mha.kv_bytes(seq_len=8192, batch=32) == 128 * GIB


def test_videos() -> None:
    gqa, _ = article_ledgers()
    vids = article_videos()
    assert [v.tokens_per_latent_frame for v in vids] == [14400] * 3
    assert [v.tokens for v in vids] == [432000, 864000, 2592000]
    assert [f"{v.kv_bytes(gqa.bytes_per_token) / GIB:.2f}" for v in vids] == [
        "52.73", "105.47", "316.41"]


def test_video_variants_and_errors() -> None:
    patched = VideoSpec("p", 5, 24, 1280, 720, patch=2)
    assert patched.tokens_per_latent_frame == 3600
    assert VideoSpec("c", 9, 1, 64, 64, causal_first_frame=True).latent_frames == 3
    assert VideoSpec("n", 9, 1, 64, 64).latent_frames == 2
    with pytest.raises(pykvpool.InvalidArgumentError):
        VideoSpec("bad", 5, 24, 1280, 721)
    with pytest.raises(pykvpool.InvalidArgumentError):
        VideoSpec("bad", 0, 24, 1280, 720)


def test_block_causal_mask() -> None:
    m = block_causal_mask(3, 2)
    expected = np.array([[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                         [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(m, expected)
    with pytest.raises(pykvpool.InvalidArgumentError):
        block_causal_mask(0, 4)


def test_decode_bound_a100() -> None:
    gqa, _ = article_ledgers()
    b = gqa.decode_bound(hardware_preset("a100-80gb-sxm"), seq_len=8192, batch=1)
    assert b.memory_bound
    assert f"{b.step_time * 1e3:.1f}" == "8.4"
    assert round(b.tokens_per_s) == 119
    assert b.bytes_moved == 8.03e9 * 2 + GIB
    big = gqa.decode_bound(hardware_preset("a100-80gb-sxm"), seq_len=8192, batch=32)
    assert big.tokens_per_s > b.tokens_per_s  # the batch shares the weight reads


def test_capacity_batch_and_length() -> None:
    gqa, _ = article_ledgers()
    assert gqa.token_capacity == 500063
    assert gqa.max_batch(seq_len=8192) == 61
    assert gqa.max_batch(seq_len=4096, block_size=4096) == 122
    assert gqa.max_seq_len(batch=32) == 500063 // 32
    assert gqa.max_seq_len(batch=32, block_size=16) % 16 == 0
    assert gqa.max_seq_len(batch=32, block_size=16) * 32 <= gqa.token_capacity
    with pytest.raises(pykvpool.InvalidArgumentError):
        gqa.max_batch(seq_len=0)
    with pytest.raises(pykvpool.InvalidArgumentError):
        gqa.row(batch=-1, seq_len=8192)


def test_weights_exceed_budget() -> None:
    with pytest.raises(BudgetError) as e:
        MemoryLedger(model_preset("llama-3-70b"), Budget(80 * GIB))
    assert isinstance(e.value, pykvpool.InvalidArgumentError)
    assert isinstance(e.value, ValueError)
    assert e.value.needed_bytes > e.value.available_bytes
    with pytest.raises(pykvpool.InvalidArgumentError):
        Budget(80 * GIB, fraction=1.5)
    with pytest.raises(pykvpool.InvalidArgumentError):
        Budget(0)
    with pytest.raises(pykvpool.InvalidArgumentError):
        Budget(80 * GIB, reserve_bytes=-1)


def test_dtypes_and_scale_overhead() -> None:
    m = model_preset("llama-3-8b")
    assert m.kv_bytes_per_token("f32") == 2 * 131072
    assert m.kv_bytes_per_token("f16") == m.kv_bytes_per_token("bf16") == 131072
    # one fp32 scale per (token, layer, K/V, kv head): 128 + 4 bytes per vector
    assert m.kv_bytes_per_token("fp8") == 2 * 32 * 8 * 132 == 67584
    assert m.kv_bytes_per_token("int8:g32") == 2 * 32 * 8 * (128 + 4 * 4)
    assert m.kv_bytes_per_token("fp8:tensor") == 65536
    assert storage_dtype("int8:g48").vector_bytes(128) == 128 + 3 * 4  # ceil(128 / 48) scales
    with pytest.raises(UnknownPresetError):
        storage_dtype("fp4")
    for bad in ("bf16:g32", "int8:g0", "int8:gx", "int8:block"):
        with pytest.raises(pykvpool.InvalidArgumentError):
            storage_dtype(bad)


def test_presets_and_unknown_names() -> None:
    assert {"llama-3-8b", "llama-3-70b", "mistral-7b", "qwen2.5-7b", "llama-3-8b-mha"} <= set(MODELS)
    assert model_preset("Llama-3-70B").num_layers == 80
    assert model_preset("qwen2.5-7b").group_size == 7
    assert model_preset("llama-2-7b").group_size == 1
    with pytest.raises(UnknownPresetError) as e:
        model_preset("gpt-5")
    assert "llama-3-8b" in str(e.value)
    assert set(HARDWARE) == {"a100-80gb-sxm", "h100-sxm", "h200"}
    assert hardware_preset("a100-80gb-sxm").ridge_point("bf16") == pytest.approx(153.0, abs=0.1)
    assert hardware_preset("h100-sxm").flops("fp8") == 1979e12
    with pytest.raises(UnknownPresetError):
        hardware_preset("tpu")


def test_from_hf_config() -> None:
    m = ModelConfig.from_hf_config(LLAMA3_8B_HF, name="llama3")
    assert m.kv_bytes_per_token() == 131072
    assert m.head_dim == 128 and m.max_context == 8192
    assert m.num_params == pytest.approx(8.03e9, rel=0.001)  # estimated from the shapes
    qwen = {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
            "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
            "max_position_embeddings": 32768}
    assert ModelConfig.from_hf_config(qwen).num_params == pytest.approx(7.62e9, rel=0.01)
    no_kv = {k: v for k, v in LLAMA3_8B_HF.items() if k != "num_key_value_heads"}
    assert ModelConfig.from_hf_config(no_kv, num_params=8e9).num_kv_heads == 32  # MHA default
    explicit = ModelConfig.from_hf_config({**LLAMA3_8B_HF, "head_dim": 64}, num_params=8e9)
    assert explicit.head_dim == 64
    with pytest.raises(pykvpool.InvalidArgumentError):
        ModelConfig.from_hf_config({"hidden_size": 4096})
    with pytest.raises(pykvpool.InvalidArgumentError):
        ModelConfig.from_hf_config({**LLAMA3_8B_HF, "num_hidden_layers": "32"})
    with pytest.raises(pykvpool.InvalidArgumentError):
        ModelConfig("bad", 32, 30, 8, 128, 1e9)


def test_every_article_number_reproduced() -> None:
    run = reproduce()
    mismatches = [(r.what, r.article, r.pykvpool) for r in run.rows if not r.match]
    assert mismatches == []
    assert len(run.rows) >= 30


def test_measure_this_machine_uses_the_kernel_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    def read_bandwidth(nbytes: int | None = None, threads: int | None = None, clock: str = "wall") -> float:
        calls.append(("bw", (nbytes, threads, clock)))
        return 12.5e9

    def peak_flops(threads: int | None = None, clock: str = "wall") -> float:
        calls.append(("flops", (threads, clock)))
        return 3.0e11

    monkeypatch.setattr(_native, "read_bandwidth", read_bandwidth, raising=False)
    monkeypatch.setattr(_native, "peak_flops", peak_flops, raising=False)
    monkeypatch.setattr(_native, "KvCache", object, raising=False)
    monkeypatch.setattr(_native, "decode_attention", print, raising=False)
    hw = measure_this_machine(nbytes=1 << 20, threads=2)
    assert hw.bandwidth == 12.5e9 and hw.flops("fp32") == 3.0e11
    assert hw.ridge_point("fp32") == 24.0
    assert calls == [("bw", (1 << 20, 2, "wall")), ("flops", (2, "wall"))]
    assert hw.memory_bytes > 0
    calls.clear()
    hw = measure_this_machine(threads=1, clock="cpu")
    assert calls == [("bw", (None, 1, "cpu")), ("flops", (1, "cpu"))]
    assert "clock='cpu'" in hw.source


def test_measure_this_machine_refuses_an_unknown_clock_before_measuring() -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match="clock"):
        measure_this_machine(nbytes=1 << 20, threads=1, clock="steal")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clock"):
        measure_this_machine(nbytes=1 << 20, threads=1, clock=1)  # type: ignore[arg-type]


def test_article_budget() -> None:
    b = article_budget()
    assert b.usable_bytes == 80 * GIB and b.reserve_bytes == 4 * GIB
