"""``pykvpool.hf`` with tiers below the pool (``host_blocks=``, ``disk_dir=``): a multi-turn
conversation whose earlier turns were evicted from the pool loads them back from host
memory or disk instead of computing them, and its greedy tokens stay those of a pool large
enough to keep everything (random weights from a small config, nothing downloaded)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import pykvpool  # noqa: E402
import pykvpool.hf as phf  # noqa: E402
from tiny import build  # noqa: E402

BS = 4
NEW = 3


def conversations(n: int, turns: int, turn_len: int) -> list[list[list[int]]]:
    """``n`` conversations of ``turns`` user messages of ``turn_len`` random tokens."""
    g = torch.Generator().manual_seed(5)
    return [[torch.randint(2, 97, (turn_len,), generator=g).tolist() for _ in range(turns)] for _ in range(n)]


def chat(b: phf.ContinuousBatcher, convs: list[list[list[int]]]) -> tuple[list[list[int]], int]:
    """Every conversation's turns, round robin (turn ``t`` of every conversation, then
    ``t + 1``): a turn's prompt is the history (earlier messages and replies) and its
    message. Returns the replies in order and the prompt tokens served from the caches."""
    history: list[list[int]] = [[] for _ in convs]
    replies, cached = [], 0
    for t in range(len(convs[0])):
        for c, conv in enumerate(convs):
            history[c] = history[c] + conv[t]
            out = b.run([history[c]], NEW)[0]
            cached += b.stats.cached_tokens
            history[c] = history[c] + out
            replies.append(out)
    return replies, cached


@pytest.fixture(scope="module")
def model() -> Any:
    torch.set_num_threads(1)
    return build("llama", phf.ATTN_IMPLEMENTATION)


@pytest.fixture(scope="module")
def ample(model: Any) -> list[list[int]]:
    """The replies with a pool that never evicts."""
    b = phf.ContinuousBatcher(model, num_blocks=256, block_size=BS, prefix_caching=True)
    return chat(b, conversations(3, 3, 20))[0]


def test_earlier_turns_come_back_from_the_host_tier(model: Any, ample: list[list[int]]) -> None:
    # 24 blocks hold about one conversation's history: the others' turns are evicted.
    plain = phf.ContinuousBatcher(model, num_blocks=24, block_size=BS, prefix_caching=True)
    tiered = phf.ContinuousBatcher(model, num_blocks=24, block_size=BS, prefix_caching=True, host_blocks=64)
    replies_plain, cached_plain = chat(plain, conversations(3, 3, 20))
    replies, cached = chat(tiered, conversations(3, 3, 20))
    assert replies == ample and replies_plain == ample
    s = tiered.cache.pool.tier_transfer_stats()
    assert s is not None and s["host_loads"] > 0
    assert cached > cached_plain + 20, (cached, cached_plain)


def test_write_through_copies_turns_as_computed_and_reloads_them(model: Any, ample: list[list[int]]) -> None:
    """With write-through, every computed block goes to the host tier once computed (so
    evicting it moves nothing), and the replies stay those of the ample pool."""
    tiered = phf.ContinuousBatcher(model, num_blocks=24, block_size=BS, prefix_caching=True, host_blocks=64,
                                   write_through=True)
    replies, _ = chat(tiered, conversations(3, 3, 20))
    assert replies == ample
    host = tiered.cache.pool.tier_stats()[0]
    s = tiered.cache.pool.tier_transfer_stats()
    assert s is not None and s["host_loads"] > 0 and host["hits"] > 0
    assert s["host_stores"] == host["stored"]


def test_write_through_needs_a_host_tier_and_a_bool(model: Any) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match="write_through"):
        phf.PagedKvCache(model.config, num_blocks=8, block_size=BS, prefix_caching=True, write_through=True)
    with pytest.raises(TypeError, match="write_through"):
        phf.PagedKvCache(model.config, num_blocks=8, block_size=BS, prefix_caching=True, host_blocks=8,
                         write_through=1)


def test_and_from_disk(model: Any, ample: list[list[int]], tmp_path: Path) -> None:
    tiered = phf.ContinuousBatcher(model, num_blocks=24, block_size=BS, prefix_caching=True, host_blocks=4,
                                   disk_dir=tmp_path / "kv", disk_blocks=64)
    replies, _ = chat(tiered, conversations(3, 3, 20))
    assert replies == ample
    s = tiered.cache.pool.tier_transfer_stats()
    assert s is not None and s["disk_loads"] > 0 and s["disk_lost"] == 0


def test_lost_disk_blocks_are_computed_again(model: Any, ample: list[list[int]], tmp_path: Path) -> None:
    """Every disk block is damaged before each admission: each load fails its checksum,
    the pool forgets its cache and the batcher computes the blocks; tokens unchanged."""
    tiered = phf.ContinuousBatcher(model, num_blocks=24, block_size=BS, prefix_caching=True, host_blocks=4,
                                   disk_dir=tmp_path / "kv", disk_blocks=64)
    real = tiered.cache.pool

    class Damaging:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def add_sequence_hit(self, seq_id: int, token_ids: Any) -> int:
            real.wait_tiers()  # the disk writes queued are done: damage them all
            for f in (tmp_path / "kv").rglob("*.blk"):
                data = bytearray(f.read_bytes())
                data[-1] ^= 0xFF
                f.write_bytes(bytes(data))
            return int(real.add_sequence_hit(seq_id, token_ids))

    tiered.cache.pool = Damaging()  # type: ignore[assignment]
    replies, _ = chat(tiered, conversations(3, 3, 20))
    assert replies == ample
    s = real.tier_transfer_stats()
    assert s is not None and s["disk_lost"] > 0


@pytest.mark.parametrize(("recompute_ns", "loads"), [(0, False), (10**9, True)])
def test_probed_costs_choose_between_loading_and_computing(model: Any, ample: list[list[int]], recompute_ns: int,
                                                           loads: bool) -> None:
    tiered = phf.ContinuousBatcher(model, num_blocks=24, block_size=BS, prefix_caching=True, host_blocks=64,
                                   recompute_ns_per_token=recompute_ns)
    replies, _ = chat(tiered, conversations(3, 3, 20))
    assert replies == ample
    s = tiered.cache.pool.tier_transfer_stats()
    assert s is not None and (s["host_loads"] > 0) == loads
    host = tiered.cache.pool.tier_stats()[0]
    assert (host["loads_won"] > 0, host["recompute_won"] > 0) == (loads, not loads)


def test_tiers_need_prefix_caching_and_full_attention(tmp_path: Path) -> None:
    llama = build("llama", phf.ATTN_IMPLEMENTATION)
    with pytest.raises(pykvpool.InvalidArgumentError):
        phf.ContinuousBatcher(llama, num_blocks=16, host_blocks=8)
    with pytest.raises(pykvpool.InvalidArgumentError, match="host_blocks"):
        phf.PagedKvCache(llama.config, num_blocks=16, prefix_caching=True, disk_dir=tmp_path)
    with pytest.raises(pykvpool.InvalidArgumentError, match="recompute_ns_per_token"):
        phf.PagedKvCache(llama.config, num_blocks=16, prefix_caching=True, recompute_ns_per_token=5)
    with pytest.raises(pykvpool.InvalidArgumentError, match="disk_blocks"):
        phf.PagedKvCache(llama.config, num_blocks=16, prefix_caching=True, host_blocks=4, disk_blocks=8)
    mistral = build("mistral", phf.ATTN_IMPLEMENTATION)
    with pytest.raises(pykvpool.InvalidArgumentError, match="window"):
        phf.PagedKvCache(mistral.config, num_blocks=16, prefix_caching=True, host_blocks=8)
