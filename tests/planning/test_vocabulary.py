"""One vocabulary: the eviction policies and KV dtypes are the native module's lists, and
every Python module that offers a choice of them reads those lists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pykvpool as kv
from pykvpool.cli.main import build_parser
from pykvpool.planning.models import DTYPES, storage_dtype
from pykvpool.prefix.replay import POLICIES
from pykvpool.search.space import EVICTIONS

PACKAGE = Path(kv.__file__).parent


def test_every_listed_eviction_policy_is_accepted_and_nothing_else() -> None:
    assert kv.EVICTION_POLICIES == ("lru", "fifo", "lfu", "priority")
    assert kv.TIER_EVICTION_POLICIES == ("lru", "fifo", "lfu", "s3fifo")
    for p in kv.EVICTION_POLICIES:
        kv.BlockPool(8, 4, prefix_caching=True, eviction=p)
    with pytest.raises(kv.InvalidArgumentError, match="one of lru, fifo, lfu, priority"):
        kv.BlockPool(8, 4, prefix_caching=True, eviction="mru")


def test_every_listed_kv_dtype_makes_a_cache_and_nothing_else() -> None:
    for d in kv.KV_DTYPES:
        assert kv.KvCache(1, 1, 1, 1, 8, d).dtype == d
    with pytest.raises(kv.InvalidArgumentError, match="one of 'f32', 'f16', 'bf16', 'int8'"):
        kv.KvCache(1, 1, 1, 1, 8, "f64")


def test_the_python_side_reads_the_native_lists() -> None:
    assert POLICIES is kv.EVICTION_POLICIES and EVICTIONS is kv.EVICTION_POLICIES
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    simulate = sub.choices["simulate"]
    eviction = next(a for a in simulate._actions if a.dest == "eviction")
    assert tuple(eviction.choices) == kv.EVICTION_POLICIES
    # Planning's dtypes are KvCache's, in its order and spelling, then the planning-only fp8.
    assert DTYPES[:-1] == kv.KV_DTYPES and DTYPES[-1] == "fp8"
    for d in kv.KV_DTYPES:
        assert storage_dtype(d).native == storage_dtype(d).name == d
    search = sub.choices["search"]
    kv_dtypes = next(a for a in search._actions if a.dest == "kv_dtypes")
    assert kv_dtypes.type("fp16,int8") == ["f16", "int8"]


def test_no_module_spells_out_the_eviction_policies() -> None:
    listed = re.compile(r"""["']lru["']\s*,\s*["']fifo["']""")
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if listed.search(p.read_text())]
    assert offenders == []
