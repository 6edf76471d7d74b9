"""Prefix reuse through a BlockPool laid out for a model's layer kinds
(pykvpool.prefix.groups_replay, `pykvpool replay --model`)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from pykvpool import InvalidArgumentError
from pykvpool.planning.layers import LayerGroup
from pykvpool.planning.models import model_preset
from pykvpool.prefix.groups_replay import compare_layouts, replay_groups
from pykvpool.prefix.replay import TraceRequest, pool_block_keys


def _trace() -> list[TraceRequest]:
    """Prompts sharing chained prefixes: a tree of ids, random lengths (seeded)."""
    rng = np.random.default_rng(7)
    out: list[TraceRequest] = []
    roots = [[int(x) for x in rng.integers(1, 10**9, size=int(rng.integers(2, 12)))] for _ in range(6)]
    for i in range(60):
        base = roots[int(rng.integers(len(roots)))]
        keep = int(rng.integers(1, len(base) + 1))
        ids = base[:keep] + [10**9 + 100 * i + j for j in range(int(rng.integers(0, 4)))]
        n = (len(ids) - 1) * 512 + int(rng.integers(1, 513))
        out.append(TraceRequest(timestamp_ms=i, input_length=n, output_length=1, hash_ids=tuple(ids)))
    return out


def _seen_rule_hits(trace: list[TraceRequest], bs: int) -> int:
    """Tokens an unbounded cache reuses, by the definition: the longest block-aligned
    prefix (in pool blocks of `bs` tokens, full blocks only) whose keys an earlier request
    held, at most `input_length - 1`."""
    seen: set[tuple[int, int]] = set()
    hits = 0
    for r in trace:
        keys = [tuple(int(x) for x in k) for k in pool_block_keys(r, bs)]
        full = r.input_length // bs
        h = 0
        while h < full and keys[h] in seen:
            h += 1
        hits += min(h * bs, (r.input_length - 1) // bs * bs)
        seen.update(keys[:full])
    return hits


@pytest.mark.parametrize("bs", [16, 512])
def test_an_unbounded_pool_reuses_every_seen_prefix_in_both_layouts(bs: int) -> None:
    trace = _trace()
    model = model_preset("gemma-2-9b")
    huge = 2 * sum(r.input_length for r in trace) * model.all_global().kv_bytes_per_token()
    hybrid, full = compare_layouts(trace, model, [huge], bs)[0]
    want = _seen_rule_hits(trace, bs)
    assert hybrid.hit_tokens == full.hit_tokens == want > 0
    assert hybrid.evictions == full.evictions == 0
    assert hybrid.query_tokens == sum(r.input_length for r in trace)


def test_a_window_longer_than_every_prompt_behaves_as_global_layers() -> None:
    """One window never releasing: the same hits as global layers (whose layout merges
    both groups into one of 42 layers, so each of its evictions is two group blocks')."""
    trace = _trace()
    g2 = model_preset("gemma-2-9b")
    wide = tuple(dataclasses.replace(g, window=10**6) if g.kind == "sliding" else g for g in g2.layer_groups)
    as_window = dataclasses.replace(g2, layer_groups=wide)
    as_full = dataclasses.replace(g2, layer_groups=(LayerGroup("full", 42),))
    cap = 40 * 512 * g2.all_global().kv_bytes_per_token()  # tight: evictions happen
    a, b = replay_groups(trace, as_window, cap, 512), replay_groups(trace, as_full, cap, 512)
    assert a.num_blocks == 2 * b.num_blocks and b.evictions > 0
    assert (a.hit_tokens, a.evictions) == (b.hit_tokens, 2 * b.evictions)


def test_windows_keep_reuse_that_global_layers_lose_at_equal_bytes() -> None:
    """A window group's hit needs only the window before the hit point, and a hit refreshes
    only what it needs: the early window blocks age and go first, the prefix survives.

    Gemma-3-12B at 512-token blocks: 1 full + 5 sliding (1,024 = 2 blocks) groups of 8
    layers; 16 whole-model blocks of bytes = 96 group blocks, or 16 all-global blocks.
    A: 10 blocks. C: A + 100 tokens (hits 10 blocks = 5,120 tokens in both layouts; the
    hybrid revives the full group's 10 blocks and the window groups' blocks 8, 9 only);
    C's partly filled last block stays cached in every group (the chain's leaf in a full
    group). F1, F2: 5 fresh blocks each. B: A + 100 other tokens.
    All-global: 11 cached + F1's 5 fill the pool; F2 evicts C's partial block, then 4 of
    A's blocks, tail first (blocks 9..6): B hits 6 blocks.
    Hybrid: 66 cached + F1's 30 fill the pool; F2 evicts 30 of the 40 window-group blocks
    of A's logical blocks 0..7, which no hit refreshed: B hits all 10 blocks. B's own new
    blocks then evict 5 more (all-global: 11 - 6) and 6 more (hybrid: its last block in
    each group; logical blocks 0..7 of its window groups are holes, never allocated).
    """
    ids = list(range(1, 11))
    t = [TraceRequest(0, 10 * 512, 1, tuple(ids)),
         TraceRequest(1, 10 * 512 + 100, 1, tuple(ids + [11])),
         TraceRequest(2, 5 * 512, 1, tuple(range(100, 105))),
         TraceRequest(3, 5 * 512, 1, tuple(range(200, 205))),
         TraceRequest(4, 10 * 512 + 100, 1, tuple(ids + [12]))]
    model = model_preset("gemma-3-12b")
    cap = 16 * 512 * model.all_global().kv_bytes_per_token()
    hybrid, full = compare_layouts(t, model, [cap], 512)[0]
    assert (hybrid.num_blocks, full.num_blocks) == (96, 16)
    assert (hybrid.hit_tokens, full.hit_tokens) == (2 * 5120, 5120 + 6 * 512)
    assert (hybrid.evictions, full.evictions) == (30 + 6, 1 + 4 + 5)


def test_keys_and_refusals() -> None:
    r = TraceRequest(timestamp_ms=0, input_length=1030, output_length=1, hash_ids=(5, 6, 7))
    k = pool_block_keys(r, 256)
    assert k.dtype == np.uint64 and k.shape == (5, 2)
    assert k[:, 0].tolist() == [6, 6, 7, 7, 8] and k[:, 1].tolist() == [256, 512, 256, 512, 6]
    assert pool_block_keys(r, 1024)[:, 0].tolist() == [7, 8]
    with pytest.raises(InvalidArgumentError, match="block_size"):
        pool_block_keys(r, 48)
    with pytest.raises(InvalidArgumentError, match="capacity_bytes"):
        replay_groups([r], model_preset("gemma-2-9b"), 1, 16)


def test_cli_compares_the_layouts(tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": r.timestamp_ms, "input_length": r.input_length,
                                         "output_length": 1, "hash_ids": list(r.hash_ids)}) + "\n"
                             for r in _trace()))
    run = [sys.executable, "-m", "pykvpool.cli", "replay", "--trace", str(trace), "--model", "gemma-2-9b"]
    p = subprocess.run(run + ["--capacities", "20000", "--json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = json.loads((tmp_path / "r.json").read_text())
    assert len(rows) == 2 and rows[0]["layout"].startswith("2 groups") and rows[1]["layout"].startswith("1 group")
    assert rows[0]["capacity_bytes"] <= 20000 * model_preset("gemma-2-9b").all_global().kv_bytes_per_token()
    p = subprocess.run(run + ["--sweep"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.startswith("pykvpool: error: --model takes") and "Traceback" not in p.stderr


def test_policy_reaches_the_pool_and_the_cli(tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": r.timestamp_ms, "input_length": r.input_length,
                                         "output_length": 1, "hash_ids": list(r.hash_ids)}) + "\n"
                             for r in _trace()))
    model = model_preset("gemma-2-9b")
    cap = 20000 * model.all_global().kv_bytes_per_token()
    default = replay_groups(_trace(), model, cap, 16)
    assert default.policy == "lru" and replay_groups(_trace(), model, cap, 16, "lru") == default
    fifo = replay_groups(_trace(), model, cap, 16, "fifo")
    assert fifo.policy == "fifo" and fifo.query_tokens == default.query_tokens
    # Without pins the priority policy orders like lru; soft pins on reused prefixes change
    # which blocks survive.
    prio = replay_groups(_trace(), model, cap, 16, "priority")
    assert (prio.policy, prio.hit_tokens, prio.evictions) == ("priority", default.hit_tokens, default.evictions)
    kept = replay_groups(_trace(), model, cap, 16, "priority", retain_hits_for=50)
    assert kept.query_tokens == default.query_tokens and kept.policy == "priority"
    with pytest.raises(InvalidArgumentError, match="retain_hits_for needs policy='priority'"):
        replay_groups(_trace(), model, cap, 16, "lru", retain_hits_for=5)
    run = [sys.executable, "-m", "pykvpool.cli", "replay", "--trace", str(trace), "--model", "gemma-2-9b",
           "--capacities", "20000", "--policy", "lfu", "--json", str(tmp_path / "r.json")]
    p = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert [r["policy"] for r in json.loads((tmp_path / "r.json").read_text())] == ["lfu", "lfu"]
    assert "| lfu |" in p.stdout
