"""The bounded KV event queue: ``record_events=True`` without
draining keeps at most ``max_events`` events, the newest, and counts the dropped ones.

The workload is fully predictable: a pool of 64 one-token blocks admits chains of 64
fresh keys one after another, freeing each; from the second on every admission evicts
the previous chain tail first (64 removals) and stores its own (64 stores).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import pykvpool as kv

N = 64  # blocks in the pool, keys per admission


def run_chains(pool: kv.BlockPool, chains: int) -> None:
    for j in range(chains):
        pool.add_sequence_block_keys(j, np.arange(j * N + 1, (j + 1) * N + 1, dtype=np.uint64), N)
        pool.free(j)


def expected_events(chains: int) -> list[tuple[int, int, int | None]]:
    """``(kind, key, parent key)`` of every event the workload records, in order."""
    out: list[tuple[int, int, int | None]] = []
    for j in range(chains):
        keys = list(range(j * N + 1, (j + 1) * N + 1))
        if j > 0:
            prev = [k - N for k in keys]
            out += [(kv.EVENT_REMOVED, k, k - 1 if i else None) for i, k in reversed(list(enumerate(prev)))]
        out += [(kv.EVENT_STORED, k, k - 1 if i else None) for i, k in enumerate(keys)]
    return out


def as_tuples(ev: dict[str, Any]) -> list[tuple[int, int, int | None]]:
    keys = [(int(h) << 64) | int(lo) for h, lo in ev["key"].tolist()]
    parents = [(int(h) << 64) | int(lo) for h, lo in ev["parent_key"].tolist()]
    return [(int(k), key, p if has else None)
            for k, key, p, has in zip(ev["kind"].tolist(), keys, parents, ev["has_parent"].tolist())]


def test_a_full_queue_keeps_the_newest_events_and_counts_the_dropped() -> None:
    pool = kv.BlockPool(N, 1, prefix_caching=True, verify_tokens=False, record_events=True, max_events=1000)
    run_chains(pool, 20)
    want = expected_events(20)
    s = pool.cache_stats()
    assert len(want) == s.stored_blocks + s.evictions == 20 * N + 19 * N
    assert (s.pending_events, s.dropped_events) == (1000, len(want) - 1000)
    ev = pool.drain_events()
    assert as_tuples(ev) == want[-1000:]
    assert (ev["tokens"] == 1).all() and ev["tokens"].dtype == np.uint32
    s = pool.cache_stats()
    assert (s.pending_events, s.dropped_events) == (0, len(want) - 1000)
    # Drained in time, nothing more is dropped.
    run_chains_from = 20
    pool.add_sequence_block_keys(run_chains_from, np.arange(20 * N + 1, 21 * N + 1, dtype=np.uint64), N)
    assert as_tuples(pool.drain_events()) == expected_events(21)[len(want):]
    assert pool.cache_stats().dropped_events == len(want) - 1000
    pool.check_invariants()


def test_two_million_undrained_events_stay_within_the_default_cap() -> None:
    """Run in a subprocess so its peak memory is this workload's alone."""
    code = textwrap.dedent(f"""
        import resource, numpy as np, pykvpool as kv
        N = {N}
        pool = kv.BlockPool(N, 1, prefix_caching=True, verify_tokens=False, record_events=True)
        def rss():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        base = rss()
        j = 0
        while True:
            s = pool.cache_stats()
            if s.stored_blocks + s.evictions >= 2_000_000:
                break
            pool.add_sequence_block_keys(j, np.arange(j * N + 1, (j + 1) * N + 1, dtype=np.uint64), N)
            pool.free(j)
            j += 1
        s = pool.cache_stats()
        print(s.stored_blocks + s.evictions, s.pending_events, s.dropped_events, rss() - base)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    total, pending, dropped, grew = map(int, res.stdout.split())
    assert total >= 2_000_000
    assert (pending, dropped) == (100_000, total - 100_000)
    # 100,000 events are about 8 MB; the unbounded queue grew by 80 bytes x 2 million.
    assert grew < 48 << 20, f"peak memory grew by {grew / 2**20:.0f} MiB"


def test_partial_blocks_report_their_tokens() -> None:
    pool = kv.BlockPool(8, 4, prefix_caching=True, verify_tokens=False, record_events=True)
    pool.add_sequence_block_keys(0, [1, 2], 6)
    assert pool.drain_events()["tokens"].tolist() == [4, 2]
    pool.free(0)
    assert pool.reset_prefix_cache() == 2
    ev = pool.drain_events()
    assert ev["kind"].tolist() == [kv.EVENT_ALL_CLEARED] and ev["tokens"].tolist() == [0]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(record_events=True, max_events=0), "max_events must be in 1..=16777216 events, got 0"),
        (dict(record_events=True, max_events=-5), "max_events must be in 1..=16777216 events, got -5"),
        (dict(record_events=True, max_events=2**24 + 1), "max_events must be in 1..=16777216"),
        (dict(record_events=True, max_events=True), "max_events must be an int, got bool"),
        (dict(record_events=True, max_events=1.5), "max_events must be an int, got float"),
        (dict(max_events=10), "max_events needs record_events=True"),
        (dict(record_events=False, max_events=10), "max_events needs record_events=True"),
    ],
)
def test_bad_max_events_is_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(kv.InvalidArgumentError, match=match):
        kv.BlockPool(8, 4, prefix_caching=True, **kw)


def test_max_events_needs_prefix_caching() -> None:
    with pytest.raises(kv.InvalidArgumentError, match="prefix_caching=True"):
        kv.BlockPool(8, 4, max_events=10)
