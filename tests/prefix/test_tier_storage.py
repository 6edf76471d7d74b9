"""The tiers' bytes (``BlockPool.attach_tier_storage``): a block evicted from the pool goes
to host memory (and disk) and comes back into its new block of the ``KvCache`` with its
K/V bytes, which every later access to the cache waits for. The byte layer itself is
model-tested in Rust (``tests/rust/offload_store.rs``)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pykvpool import BlockPool, InvalidArgumentError, KvCache

BS, LAYERS, HEADS, DIM = 4, 2, 2, 8


def prompt(p: int, blocks: int, shared: bool = True) -> np.ndarray:
    """Block 0 shared by every prompt (unless not ``shared``), then blocks unique to ``p``,
    ``blocks`` full ones in all, and one more token."""
    ids = np.arange(p * 1000, p * 1000 + blocks * BS + 1, dtype=np.uint32)
    if shared:
        ids[:BS] = 7
    return ids


def kv_of(tokens: np.ndarray, layer: int) -> np.ndarray:
    """K rows ``[n, HEADS, DIM]`` for ``tokens``: each a function of the ids up to it."""
    h = np.cumsum(tokens.astype(np.int64) * 2654435761 % 1000003)
    e = np.arange(HEADS * DIM).reshape(1, HEADS, DIM)
    return (((h[:, None, None] + e * 7 + layer * 131) % 1000) / 100.0 - 5.0).astype(np.float32)


class Rig:
    def __init__(self, num_blocks: int, host: int, disk: int | None = None, disk_dir: Path | None = None,
                 write_through: bool = False) -> None:
        self.pool = BlockPool(num_blocks, BS, prefix_caching=True, host_blocks=host, disk_blocks=disk,
                              write_through=write_through)
        self.cache = KvCache(LAYERS, num_blocks, BS, HEADS, DIM)
        if disk_dir is None:
            self.pool.attach_tier_storage(self.cache)
        else:
            self.pool.attach_tier_storage(self.cache, disk_dir=disk_dir, model_id="m", fsync=False)

    def admit(self, seq: int, tokens: np.ndarray) -> int:
        """Admit, check every cached block's K and V, write the computed tokens."""
        cached, slots, _ = self.pool.add_sequence_tokens(seq, tokens)
        table = self.pool.block_table(seq)
        for layer in range(LAYERS):
            want = kv_of(tokens, layer)
            k = np.asarray(self.cache.key(layer, writable=False))
            v = np.asarray(self.cache.value(layer, writable=False))
            for t in range(cached):
                b = table[t // BS]
                np.testing.assert_array_equal(k[b, t % BS], want[t], err_msg=f"seq {seq} token {t}")
                np.testing.assert_array_equal(v[b, t % BS], -want[t])
            new = want[cached:]
            self.cache.write(layer, new, -new, slots)
        return int(cached)

    def visit(self, seq: int, tokens: np.ndarray) -> int:
        """``admit``, then free the sequence; wait for the tiers' copies (disk writes too)."""
        cached = self.admit(seq, tokens)
        self.pool.free(seq)
        self.pool.wait_tiers()
        return cached

    def push_down(self, a: np.ndarray, shared: bool = True) -> None:
        """Visit ``a`` (4 blocks), then a 9-block prompt that evicts a's blocks below."""
        self.visit(1, a)
        self.visit(2, prompt(2, 9, shared))


def test_an_evicted_prompt_comes_back_with_its_bytes_from_the_host() -> None:
    r = Rig(10, host=8)
    a = prompt(1, 4)
    assert r.admit(1, a) == 0
    r.pool.free(1)
    assert r.admit(2, prompt(2, 9)) == BS  # evicts a's three other full blocks
    r.pool.free(2)
    # The key views are read by `admit` only after a write (which waits for the copies).
    r.pool.wait_tiers()
    assert r.admit(3, a) == 4 * BS
    s = r.pool.tier_transfer_stats()
    assert s is not None and s["host_stores"] >= 3 and s["host_loads"] == 3
    assert s["slot_bytes"] == LAYERS * 2 * HEADS * BS * DIM * 4


@pytest.mark.parametrize("disk", [False, True])
def test_write_through_copies_the_computed_bytes(tmp_path: Path, disk: bool) -> None:
    """Blocks are copied while the pool still holds them, after their K/V was written
    (at the free): evicted later, they come back from the host tier (and disk) with those
    bytes."""
    r = Rig(10, host=2 if disk else 16, disk=8 if disk else None, disk_dir=tmp_path / "tier" if disk else None,
            write_through=True)
    a = prompt(1, 4)
    r.push_down(a)
    assert r.admit(3, a) == 4 * BS  # bytes checked by admit
    s = r.pool.tier_transfer_stats()
    assert s is not None and s["host_loads"] + s["disk_loads"] == 3
    assert s["host_stores"] == r.pool.tier_stats()[0]["stored"]


def test_blocks_come_back_from_disk(tmp_path: Path) -> None:
    r = Rig(10, host=1, disk=8, disk_dir=tmp_path / "tier")
    a = prompt(1, 4)
    r.push_down(a)
    assert r.admit(3, a) == 4 * BS
    s = r.pool.tier_transfer_stats()
    assert s is not None and s["disk_writes"] >= 2 and s["disk_loads"] == 2
    assert r.pool.tier_stats()[1]["hits"] == 2


def test_a_restart_serves_the_disk_blocks_again(tmp_path: Path) -> None:
    """Blocks that reached the disk tier come back after the pool, its cache and its
    process state are gone: a new pool on the same folder restores them into its disk
    tier, and a prompt hits them with the bytes computed before."""
    r = Rig(10, host=1, disk=32, disk_dir=tmp_path / "tier")
    a = prompt(1, 4, shared=False)
    r.admit(1, a)
    r.pool.free(1)
    for i, p in enumerate((2, 3)):  # push all of a's blocks through the host tier to disk
        r.admit(10 + i, prompt(p, 9, shared=False))
        r.pool.free(10 + i)
    r.pool.wait_tiers()
    held = r.pool.tier_stats()[1]["held"]
    assert held >= 12
    del r
    gc.collect()  # the folder's lock goes with the pool
    again = Rig(10, host=1, disk=32, disk_dir=tmp_path / "tier")
    assert again.pool.tier_stats()[1]["held"] == held
    assert again.admit(4, a) == 4 * BS  # bytes checked by admit
    s = again.pool.tier_transfer_stats()
    assert s is not None and s["disk_loads"] == 4


def test_a_restart_with_fewer_disk_blocks_keeps_what_fits(tmp_path: Path) -> None:
    r = Rig(10, host=1, disk=32, disk_dir=tmp_path / "tier")
    for i, p in enumerate((1, 2, 3)):
        r.admit(i, prompt(p, 9, shared=False))
        r.pool.free(i)
    r.pool.wait_tiers()
    assert r.pool.tier_stats()[1]["held"] > 4
    del r
    gc.collect()
    small = Rig(10, host=1, disk=4, disk_dir=tmp_path / "tier")
    assert small.pool.tier_stats()[1]["held"] == 4
    assert len(list((tmp_path / "tier").rglob("*.blk"))) == 4


def test_a_damaged_disk_block_is_reported_never_served(tmp_path: Path) -> None:
    r = Rig(10, host=1, disk=8, disk_dir=tmp_path / "tier")
    a = prompt(1, 4)
    r.push_down(a)
    for f in (tmp_path / "tier").rglob("*.blk"):
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    r.pool.add_sequence_tokens(3, a)
    with pytest.raises(OSError, match="failed their checks"):
        r.pool.wait_tiers()
    s = r.pool.tier_transfer_stats()
    assert s is not None and s["disk_lost"] == 2 and s["disk_loads"] == 0
    r.pool.wait_tiers()  # reported once
    # The pool forgot its cache (the stale blocks with it): admitted again, a computes.
    assert r.pool.tier_stats()[1]["held"] == 0
    r.pool.free(3)
    assert r.admit(4, a) == 0
    assert not list((tmp_path / "tier").rglob("*.blk"))


def test_a_folder_of_another_model_is_refused(tmp_path: Path) -> None:
    Rig(10, host=1, disk=8, disk_dir=tmp_path / "tier")
    pool = BlockPool(10, BS, prefix_caching=True, host_blocks=1, disk_blocks=8)
    cache = KvCache(LAYERS, 10, BS, HEADS, DIM)
    with pytest.raises(InvalidArgumentError):
        pool.attach_tier_storage(cache, disk_dir=tmp_path / "tier", model_id="another")
    other = KvCache(LAYERS, 10, BS, HEADS, DIM, "f16")
    with pytest.raises(InvalidArgumentError):
        pool.attach_tier_storage(other, disk_dir=tmp_path / "tier", model_id="m")
    assert pool.tier_transfer_stats() is None


def test_a_folder_without_permission_is_a_permission_error(tmp_path: Path) -> None:
    """Run as an unprivileged user (root reads any folder: the child drops to uid 65534
    then, once everything is imported)."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code = textwrap.dedent(f"""
        import os
        import pykvpool as kv
        if os.geteuid() == 0:
            os.setgid(65534)
            os.setuid(65534)
        pool = kv.BlockPool(10, {BS}, prefix_caching=True, host_blocks=1, disk_blocks=8)
        try:
            pool.attach_tier_storage(kv.KvCache(2, 10, {BS}, 2, 8), disk_dir={str(locked / "tier")!r}, model_id="m")
        except PermissionError:
            print("PermissionError")
        print(pool.tier_transfer_stats())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["PermissionError", "None"], out.stdout + out.stderr


@pytest.mark.parametrize(
    ("pool_kwargs", "cache_blocks", "attach", "match"),
    [
        ({}, 10, {}, "no tiers"),
        ({"host_blocks": 4}, 12, {}, "differ"),
        ({"host_blocks": 4}, 10, {"disk_dir": "x", "model_id": "m"}, "no disk tier"),
        ({"host_blocks": 4, "disk_blocks": 4}, 10, {}, "give its folder"),
        ({"host_blocks": 4, "disk_blocks": 4}, 10, {"disk_dir": "x"}, "model_id"),
        ({"host_blocks": 4}, 10, {"model_id": "m"}, "model_id"),
        ({"host_blocks": 4}, 10, {"transfer_threads": 0}, "threads"),
        ({"host_blocks": 4}, 10, {"transfer_threads": 65}, "threads"),
    ],
)
def test_bad_attachments_are_refused_and_change_nothing(pool_kwargs: dict, cache_blocks: int, attach: dict,
                                                        match: str, tmp_path: Path) -> None:
    if "disk_dir" in attach:
        attach = {**attach, "disk_dir": tmp_path / attach["disk_dir"]}
    pool = BlockPool(10, BS, prefix_caching=True, **pool_kwargs)
    with pytest.raises(InvalidArgumentError, match=match):
        pool.attach_tier_storage(KvCache(LAYERS, cache_blocks, BS, HEADS, DIM), **attach)
    assert pool.tier_transfer_stats() is None


def test_attaching_twice_or_after_an_eviction_is_refused() -> None:
    r = Rig(10, host=8)
    with pytest.raises(InvalidArgumentError, match="already attached"):
        r.pool.attach_tier_storage(r.cache)
    pool = BlockPool(10, BS, prefix_caching=True, host_blocks=8)
    pool.add_sequence_tokens(1, prompt(1, 4))
    pool.free(1)
    pool.add_sequence_tokens(2, prompt(2, 9))
    with pytest.raises(InvalidArgumentError, match="without bytes"):
        pool.attach_tier_storage(KvCache(LAYERS, 10, BS, HEADS, DIM))



def test_probed_costs_decide_what_is_loaded(tmp_path: Path) -> None:
    """The probe measures each tier on this machine; with those costs a hit whose
    recompute is free loads nothing, and one whose recompute is dear loads everything."""
    for recompute_ns, loaded in ((0, 0), (10**9, 4 * BS)):
        r = Rig(10, host=1, disk=8, disk_dir=tmp_path / f"tier{recompute_ns}")
        costs = r.pool.probe_tier_loads(4)
        assert len(costs) == 2 and all(c > 0 for c in costs)
        r.pool.set_tier_costs(costs, recompute_ns)
        a = prompt(1, 4, shared=False)
        r.push_down(a, shared=False)
        assert r.admit(3, a) == loaded
        assert not [f for f in (tmp_path / f"tier{recompute_ns}").rglob("*.blk") if f.name.startswith("ffffffff")]


def test_a_probe_needs_storage_and_a_block_count_in_range() -> None:
    pool = BlockPool(10, BS, prefix_caching=True, host_blocks=4)
    with pytest.raises(InvalidArgumentError, match="attach_tier_storage"):
        pool.probe_tier_loads()
    pool.attach_tier_storage(KvCache(LAYERS, 10, BS, HEADS, DIM))
    assert len(pool.probe_tier_loads(10)) == 1
    for bad in (0, 11, 257):
        with pytest.raises(InvalidArgumentError, match="blocks"):
            pool.probe_tier_loads(bad)
