"""Tiers below the device (``BlockPool(host_blocks=, disk_blocks=, tier_eviction=,
reuse_gate=)``): evicted blocks go down and come back on a hit, through the Python API, the
trace replay and the ``replay`` CLI. The decisions themselves are model-tested in Rust
(``tests/rust/tier_model.rs``)."""

from __future__ import annotations

import numpy as np
import pytest

from pykvpool import BlockPool, FullAttention, InvalidArgumentError, SlidingWindow
from pykvpool.prefix.replay import load_mooncake_trace, replay, unbounded_capacity

BS = 4


def prompt(p: int, blocks: int) -> np.ndarray:
    """``blocks`` full blocks of ids unique to ``p``, and one more token."""
    return np.arange(p * 1000, p * 1000 + blocks * BS + 1, dtype=np.uint32)


def visit(pool: BlockPool, seq: int, tokens: np.ndarray) -> int:
    cached, _, _ = pool.add_sequence_tokens(seq, tokens)
    pool.free(seq)
    return int(cached)


def test_an_evicted_prompt_comes_back_from_the_host_tier() -> None:
    pool = BlockPool(5, BS, prefix_caching=True, host_blocks=8)
    a, b = prompt(1, 4), prompt(2, 4)
    assert visit(pool, 1, a) == 0
    assert visit(pool, 2, b) == 0  # evicts a's four cached blocks
    host = pool.tier_stats()[0]
    assert (host["tier"], host["stored"], host["held"]) == ("host", 4, 4)
    cached, slots, _ = pool.add_sequence_tokens(3, a)
    assert cached == 4 * BS
    assert slots.shape == (1,)  # only the last token is computed
    assert pool.tier_stats()[0]["hits"] == 4
    assert pool.cache_stats().hit_tokens == 4 * BS
    pool.free(3)
    # Now cached in the device again: the next visit hits there, the tier is not asked.
    assert visit(pool, 4, a) == 4 * BS
    assert pool.tier_stats()[0]["hits"] == 4


def test_victims_of_the_host_tier_go_to_disk() -> None:
    pool = BlockPool(5, BS, prefix_caching=True, host_blocks=2, disk_blocks=8)
    visit(pool, 1, prompt(1, 4))
    visit(pool, 2, prompt(2, 4))
    host, disk = pool.tier_stats()
    assert (host["held"], disk["held"], disk["tier"]) == (2, 2, "disk")
    assert visit(pool, 3, prompt(1, 4)) == 4 * BS
    host, disk = pool.tier_stats()
    assert host["hits"] + disk["hits"] == 4 and disk["hits"] > 0


def test_the_reuse_gate_keeps_blocks_seen_once_out() -> None:
    pool = BlockPool(5, BS, prefix_caching=True, host_blocks=8, reuse_gate=2)
    visit(pool, 1, prompt(1, 4))  # stored once: seen once
    visit(pool, 2, prompt(2, 4))
    host = pool.tier_stats()[0]
    assert (host["stored"], host["gated"]) == (0, 4)
    assert visit(pool, 3, prompt(1, 4)) == 0


def test_write_through_copies_blocks_once_computed_and_evicts_without_copying() -> None:
    pool = BlockPool(5, BS, prefix_caching=True, host_blocks=8, write_through=True)
    a = prompt(1, 4)
    pool.add_sequence_tokens(1, a)
    assert pool.tier_stats()[0]["stored"] == 0  # cached, not computed yet
    pool.mark_computed([1])
    assert pool.tier_stats()[0]["stored"] == 4  # computed: copied, and still in the pool
    assert pool.cached_prefix_len(a) == 4 * BS
    pool.free(1)
    visit(pool, 2, prompt(2, 4))  # evicts a's blocks: no copy; b's are copied at its free
    host = pool.tier_stats()[0]
    assert (host["stored"], host["held"]) == (8, 8)
    assert visit(pool, 3, a) == 4 * BS
    assert pool.tier_stats()[0]["hits"] == 4


def test_write_through_keeps_the_host_tier_inclusive_of_the_pool() -> None:
    """A host tier of 4 blocks under write-through holds copies of the pool's blocks: a
    victim the pool still holds is dropped from the host tier, never moved to disk."""
    pool = BlockPool(12, BS, prefix_caching=True, host_blocks=4, disk_blocks=8, write_through=True)
    visit(pool, 1, prompt(1, 4))
    visit(pool, 2, prompt(2, 4))  # a's copies make room for b's: the pool still has a
    host, disk = pool.tier_stats()
    assert (host["stored"], host["evicted"], host["held"]) == (8, 4, 4)
    assert (disk["stored"], disk["held"]) == (0, 0)


def test_without_tiers_the_list_is_empty_and_reset_empties_them() -> None:
    assert BlockPool(8, BS, prefix_caching=True).tier_stats() == []
    pool = BlockPool(5, BS, prefix_caching=True, host_blocks=8)
    visit(pool, 1, prompt(1, 4))
    visit(pool, 2, prompt(2, 4))
    pool.reset_prefix_cache()
    assert pool.tier_stats()[0]["held"] == 0
    assert visit(pool, 3, prompt(1, 4)) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"host_blocks": 4},  # no prefix caching
        {"prefix_caching": True, "host_blocks": 0},
        {"prefix_caching": True, "host_blocks": 2**32},
        {"prefix_caching": True, "disk_blocks": 4},
        {"prefix_caching": True, "reuse_gate": 2},
        {"prefix_caching": True, "host_blocks": 4, "tier_eviction": "priority"},
        {"prefix_caching": True, "host_blocks": 4, "tier_eviction": "mru"},
        {"prefix_caching": True, "host_blocks": 4, "reuse_gate": 0},
        {"prefix_caching": True, "host_blocks": 4, "reuse_gate": 256},
        {"prefix_caching": True, "host_blocks": True},
        {"prefix_caching": True, "write_through": True},
    ],
)
def test_bad_tier_arguments_are_refused(kwargs: dict) -> None:
    with pytest.raises(InvalidArgumentError):
        BlockPool(8, BS, **kwargs)


def test_a_windowed_pool_refuses_tiers() -> None:
    with pytest.raises(InvalidArgumentError, match="sliding-window or chunked"):
        BlockPool(16, BS, [FullAttention(), SlidingWindow(8)], prefix_caching=True, host_blocks=4)


@pytest.mark.parametrize(("order", "kept"), [("lru", False), ("s3fifo", True)])
def test_s3fifo_keeps_a_reused_prefix_through_a_scan(order: str, kept: bool) -> None:
    """A prefix hit in the pool, then evicted, then a scan of 12 prompts used once: a
    host tier of 10 blocks in s3fifo order still holds the prefix (its blocks had hits,
    the scan's none), in lru order the scan pushed it out."""
    pool = BlockPool(5, BS, prefix_caching=True, host_blocks=10, tier_eviction=order)
    hot = prompt(1, 4)
    visit(pool, 1, hot)
    assert visit(pool, 2, hot) == 4 * BS  # a hit in the pool: its blocks count one
    for i in range(12):
        visit(pool, 10 + i, prompt(10 + i, 4))
    assert (visit(pool, 3, hot) == 4 * BS) == kept


def test_tier_eviction_of_the_wrong_type() -> None:
    with pytest.raises(TypeError):
        BlockPool(8, BS, prefix_caching=True, host_blocks=4, tier_eviction=1)
    with pytest.raises(TypeError):
        BlockPool(8, BS, prefix_caching=True, host_blocks=4, write_through=1)


def test_mooncake_through_the_tiers_loses_nothing() -> None:
    """The device plus a host tier of 4x its blocks hits what one device of 5x does, to
    within a percentage point; a disk tier of 16x more reaches the unbounded ideal."""
    trace = load_mooncake_trace()[:1500]
    g = unbounded_capacity(trace) // 20  # the device: 5% of what the trace ever holds
    single = replay(trace, 5 * g, policy="lru")
    tiered = replay(trace, g, policy="lru", host_blocks=4 * g)
    assert abs(tiered.token_hit_rate - single.token_hit_rate) < 0.01
    assert tiered.tiers[0]["hits"] > 0
    ideal = replay(trace, None, policy="lru")
    deep = replay(trace, g, policy="lru", host_blocks=4 * g, disk_blocks=16 * g)
    assert deep.token_hit_rate == pytest.approx(ideal.token_hit_rate, abs=0.005)
    assert deep.token_hit_rate > tiered.token_hit_rate + 0.05
    gated = replay(trace, g, policy="lru", host_blocks=4 * g, reuse_gate=2)
    assert gated.tiers[0]["stored"] < tiered.tiers[0]["stored"]
    # Write-through's host tier also holds copies of the device's blocks: it stores at
    # least as much and, holding fewer evicted blocks, hits less.
    through = replay(trace, g, policy="lru", host_blocks=4 * g, write_through=True)
    assert through.tiers[0]["stored"] >= tiered.tiers[0]["stored"]
    assert single.token_hit_rate - 0.1 < through.token_hit_rate < tiered.token_hit_rate


def test_the_replay_command_prints_each_tier(capsys: pytest.CaptureFixture[str]) -> None:
    from pykvpool.cli.main import main

    assert main(["replay", "--policy", "lru", "--capacity", "2000", "--host-blocks", "8000",
                 "--disk-blocks", "32000"]) == 0
    out = capsys.readouterr().out
    assert "lru, host tier: " in out and "lru, disk tier: " in out
    assert main(["replay", "--policy", "lru", "--capacity", "2000", "--host-blocks", "8000",
                 "--tier-eviction", "s3fifo"]) == 0
    assert "lru, host tier: " in capsys.readouterr().out
    # --tiers: host 4x and disk 16x the pool, the standard set-up.
    assert main(["replay", "--policy", "lru", "--capacity", "500", "--tiers"]) == 0
    out = capsys.readouterr().out
    assert "lru, host tier: " in out and "lru, disk tier: " in out
    assert main(["replay", "--policy", "lru", "--tiers"]) == 2
    assert "pykvpool: error: --tiers sizes the tiers from --capacity" in capsys.readouterr().err


def test_every_tier_reports_its_stores_and_removals_as_events() -> None:
    pool = BlockPool(5, BS, prefix_caching=True, host_blocks=2, disk_blocks=8, record_events=True)
    visit(pool, 1, prompt(1, 4))
    visit(pool, 2, prompt(2, 4))
    ev = pool.drain_events()
    below = ev["medium"] > 0
    assert (ev["block"][below] == -1).all()
    stored = lambda m: int(((ev["medium"] == m) & (ev["kind"] == 0)).sum())  # noqa: E731
    removed = lambda m: int(((ev["medium"] == m) & (ev["kind"] == 1)).sum())  # noqa: E731
    # Four blocks went to the host tier; two of them on to disk.
    assert (stored(1), removed(1), stored(2), removed(2)) == (4, 2, 2, 0)
    visit(pool, 3, prompt(1, 4))
    ev = pool.drain_events()
    assert int(((ev["medium"] > 0) & (ev["kind"] == 1)).sum()) >= 4  # the hit took them out
    host, disk = pool.tier_stats()
    assert host["held"] + disk["held"] <= 10


def test_blocks_faster_to_compute_than_to_load_are_computed() -> None:
    """Host loads cheap, disk loads dearer than computing a block: a hit takes its host
    blocks and computes the ones on disk; with disk cheap too, it loads them all."""

    def run(disk_ns: int) -> tuple[int, dict]:
        pool = BlockPool(5, BS, prefix_caching=True, host_blocks=2, disk_blocks=8)
        pool.set_tier_costs([10, disk_ns], 100)  # a block's 4 tokens: 400 ns to compute
        visit(pool, 1, prompt(1, 4))
        visit(pool, 2, prompt(2, 4))
        return visit(pool, 3, prompt(1, 4)), pool.tier_stats()[0]

    # The device evicted the chain tail first, so its head stayed in the host tier and
    # its tail went on to disk: the head is loaded, the tail computed.
    cached, host = run(1_000)
    assert cached == 2 * BS and (host["loads_won"], host["recompute_won"]) == (1, 1)
    cached, host = run(50)
    assert cached == 4 * BS and (host["loads_won"], host["recompute_won"]) == (1, 0)


@pytest.mark.parametrize("args", [([1], 10), ([1, 2, 3], 10), ([-1, 2], 10), ([1, 2], -5)])
def test_bad_tier_costs_are_refused(args: tuple) -> None:
    pool = BlockPool(5, BS, prefix_caching=True, host_blocks=2, disk_blocks=8)
    with pytest.raises(InvalidArgumentError):
        pool.set_tier_costs(*args)
    with pytest.raises(InvalidArgumentError):
        BlockPool(5, BS, prefix_caching=True).set_tier_costs([1], 1)
    with pytest.raises(InvalidArgumentError, match="must be an int"):
        pool.set_tier_costs([1, 2], "fast")
