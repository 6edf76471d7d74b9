"""Concurrency at a context length through a real BlockPool (planning.sweeps.hybrid_concurrency)
and the report's section 7, against counts worked out here by hand from the release rule of
the hybrid pool's contract (a growth from length ``a`` first releases every block ``i`` with
``i*bs >= sinks`` and ``(i+1)*bs <= first_needed(a)``) and from the budget's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

import pykvpool
from pykvpool.planning.layers import LayerGroup
from pykvpool.planning.ledger import GIB, article_budget
from pykvpool.planning.models import ModelConfig, model_preset
from pykvpool.planning.pool_groups import pool_layout
from pykvpool.planning.sweeps import MAX_SWEEP_CALLS, hybrid_concurrency

# (kind, window or chunk, sinks) per group of the pool
Group = tuple[str, int, int]


def first_needed(kind: str, w: int, p: int) -> int:
    if kind == "full":
        return 0
    if kind == "sliding":
        return max(0, p + 1 - w)
    return p - p % w


def held_after(groups: list[Group], bs: int, start: int, end: int) -> int:
    """Blocks one sequence holds over all groups after growing from ``start`` to ``end``
    tokens (releases are cumulative: first_needed only grows)."""
    total = 0
    for kind, w, sinks in groups:
        f = first_needed(kind, w, start)
        released = sum(1 for i in range(-(-end // bs)) if i * bs >= sinks and (i + 1) * bs <= f)
        total += -(-end // bs) - released
    return total


def by_hand(groups: list[Group], bs: int, n_blocks: int, seq_len: int, chunk: int) -> tuple[int, int, int]:
    """(admitted, blocks per sequence at seq_len, peak blocks during its growth): prefill
    to seq_len - 1 in chunks, then one decode token; sequence k fits iff (k-1) x held +
    peak <= n_blocks (blocks a growth releases are available to it)."""
    ends = list(range(min(chunk, seq_len - 1), seq_len - 1, chunk)) + [seq_len - 1, seq_len]
    steps = list(zip([0] + ends[:-1], ends))
    peak = max(held_after(groups, bs, a, b) for a, b in steps)
    held = held_after(groups, bs, seq_len - 1, seq_len)
    return (0 if n_blocks < peak else (n_blocks - peak) // held + 1), held, peak


def tiny(*groups: LayerGroup) -> ModelConfig:
    return ModelConfig("tiny", sum(g.layers for g in groups), 4, 4, 32, 1e6, layer_groups=groups)


@pytest.mark.parametrize(("groups", "seq_len", "chunk", "n_blocks"), [
    ([LayerGroup("sliding", 2, 64), LayerGroup("full", 2)], 256, 32, 200),
    ([LayerGroup("sliding", 2, 64), LayerGroup("full", 2)], 250, 48, 200),  # unaligned
    ([LayerGroup("sliding", 3, 40, 4)], 1000, 64, 90),  # sinks, window not a block multiple
    ([LayerGroup("chunked", 3, 96), LayerGroup("full", 1)], 700, 80, 400),
    ([LayerGroup("full", 2)], 300, 64, 100),
    ([LayerGroup("sliding", 2, 64), LayerGroup("full", 2)], 256, 32, 5),  # not one fits
])
def test_pool_admits_what_the_release_rule_predicts(groups: list[LayerGroup], seq_len: int,
                                                   chunk: int, n_blocks: int) -> None:
    lay = pool_layout(tiny(*groups), block_size=16)
    spec = [(g.kind, g.window or 0, g.sink_tokens) for g in lay.groups]
    c = hybrid_concurrency(lay, n_blocks, seq_len, chunk)
    admitted, held, peak = by_hand(spec, 16, n_blocks, seq_len, chunk)
    assert (c.admitted, c.num_blocks, c.seq_len) == (admitted, n_blocks, seq_len)
    if admitted:
        assert (c.held_per_sequence, c.peak_per_sequence) == (held, peak)
    # the ledger: every group rounds the tokens it keeps to whole blocks
    per_seq = sum(-(-(min(seq_len, w + s) if k == "sliding" else min(seq_len, w) if k == "chunked"
                      else seq_len) // 16) for k, w, s in spec)
    assert c.blocks_per_sequence == per_seq and c.ledger == n_blocks // per_seq


def test_pool_agrees_with_the_ledger_up_to_the_one_chunk_transient() -> None:
    """At block-aligned lengths a decoding sequence holds exactly the ledger's blocks; only
    the last admission's prefill needs more (at most one chunk plus one block per windowed
    group), so ledger - ceil(extra / per_seq) <= pool <= ledger."""
    lay = pool_layout(tiny(LayerGroup("sliding", 5, 128), LayerGroup("full", 1)), block_size=16)
    for seq_len, chunk, n_blocks in ((1024, 256, 3000), (4096, 512, 5000), (2048, 2048, 999)):
        c = hybrid_concurrency(lay, n_blocks, seq_len, chunk)
        per_seq = 5 * 128 // 16 + seq_len // 16
        assert c.ledger == n_blocks // per_seq and c.held_per_sequence == per_seq
        extra = 5 * (chunk // 16 + 1)
        assert c.peak_per_sequence - per_seq <= extra
        assert c.ledger - -(-extra // per_seq) <= c.admitted <= c.ledger


def test_arguments_are_checked() -> None:
    lay = pool_layout(model_preset("gemma-2-9b"))
    for name, kw in (("seq_len", {"seq_len": 0}), ("chunk_tokens", {"chunk_tokens": -1}),
                     ("num_blocks", {"num_blocks": True})):
        args = {"layout": lay, "num_blocks": 100, "seq_len": 64, **kw}
        with pytest.raises(pykvpool.InvalidArgumentError, match=name):
            hybrid_concurrency(**args)  # type: ignore[arg-type]
    with pytest.raises(pykvpool.InvalidArgumentError, match="pool calls"):
        hybrid_concurrency(pool_layout(model_preset("mistral-7b")), 10**7, 10**6, 1)
    assert MAX_SWEEP_CALLS >= 100_000


# ------------------------------------------------------------------ the report's section 7

KV_BUDGET = {  # (80 - 4) GiB minus bf16 weights (2 bytes per published parameter), bytes
    "gemma-2-9b": 76 * GIB - 9.24e9 * 2, "gemma-3-12b": 76 * GIB - 12.2e9 * 2,
    "llama-3-8b": 76 * GIB - 8.03e9 * 2}


def test_section_7_numbers_by_hand(tmp_path: Path) -> None:
    from pykvpool.report.windows import windows_section

    md, data, figs = windows_section(tmp_path, article_budget(), progress=False)
    rows = {(r["model"], r["sweep"].seq_len): r for r in data["rows"]}
    # Gemma-3-12B: 6 groups of 8 layers, 8 x 8,192 B per token in a group's block
    n = int(KV_BUDGET["gemma-3-12b"] // (8 * 8192)) // 16
    assert n == 54_554
    r = rows[("Gemma-3-12B", 32768)]
    per_seq = 5 * 1024 // 16 + 32768 // 16  # 2,368 blocks: five windows and the global group
    # the last prefill chunk (30,720 -> 32,767) still holds blocks from first_needed(30,720)
    # = 29,697: block 1,856 onwards, 192 blocks per window group
    peak = 5 * (2048 - 29697 // 16) + 2048
    assert (peak, r["ledger"], r["sweep"].admitted) == (3008, n // per_seq, (n - peak) // per_seq + 1) == (3008, 23, 22)
    glob = rows[("Gemma-3-12B (all global)", 32768)]
    n_glob = int(KV_BUDGET["gemma-3-12b"] // (48 * 8192)) // 16
    assert glob["sweep"].admitted == glob["ledger"] == n_glob // 2048 == 4
    assert "| Gemma-3-12B | 40 sliding (1,024) + 8 full | 32,768 | 23 | 22 | 2,368 / 2,368 / 3,008 |" in md
    # Gemma-2-9B at 8k: 21 + 21 layers, each block 21 x 8,192 B per token
    n = int(KV_BUDGET["gemma-2-9b"] // (21 * 8192)) // 16
    r = rows[("Gemma-2-9B", 8192)]
    assert r["ledger"] == n // (256 + 512)
    # Llama-3-8B with 4 sinks + 4,096 window: 257 blocks whatever the length once decoding
    n = int(KV_BUDGET["llama-3-8b"] // 131072) // 16
    assert n == 31_253
    for length in (8192, 32768, 131072):
        r = rows[("Llama-3-8B, 4 sinks + 4,096 window", length)]
        # the last prefill chunk (length - 2,048 -> length - 1) keeps the sink block and
        # blocks from first_needed = length - 2,048 + 1 - 4,096: 1 + 384 = 385 blocks
        peak = 1 + (length // 16 - (length - 2048 + 1 - 4096) // 16)
        assert peak == 385 == r["sweep"].peak_per_sequence
        assert r["ledger"] == n // 257 == 121 and r["sweep"].held_per_sequence == 257
        assert r["sweep"].admitted == (n - 385) // 257 + 1 == 121
    full = rows[("Llama-3-8B", 8192)]
    assert full["sweep"].admitted == full["ledger"] == n // 512 == 61
    assert rows[("Llama-3-8B", 131072)]["sweep"].admitted == n // 8192 == 3
    assert figs["fig9_windows"].stat().st_size > 10_000
    assert data["budget"] == article_budget().describe()

