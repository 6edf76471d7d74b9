"""KvCache storage (views, rounding on write, block copies), decode's arguments and errors,
the kernel paths, the thread count and the bandwidth/FLOP probes.

Decode against the float64 reference, per path, cache dtype and precision, is the
conformance grid's (tests/attention/test_conformance.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from reference.attention import Batch, Mask, reference
from test_conformance import Case, run_case

import pykvpool as kv

PATHS = kv.kernel_paths()


def test_empty_batch_and_empty_sequence() -> None:
    c = kv.KvCache(1, 4, 16, 2, 64)
    q = np.zeros((0, 4, 64), np.float32)
    out, lse = kv.decode_attention(c, 0, q, np.zeros((0, 3), np.int32), np.zeros(0, np.int32), return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4)
    q1 = np.ones((1, 4, 64), np.float32)
    out, lse = kv.decode_attention(c, 0, q1, np.full((1, 2), -1, np.int32), [0], return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_out_is_written_in_place_and_scale_is_used() -> None:
    rng = np.random.default_rng(0)
    c = kv.KvCache(1, 5, 8, 2, 64)
    c.write(0, rng.standard_normal((40, 2, 64)).astype(np.float32), rng.standard_normal((40, 2, 64)).astype(np.float32),
            np.arange(40))
    tables = [[3, 0, 4, 1, 2]]
    q = rng.standard_normal((1, 2, 64)).astype(np.float32)
    out = np.empty((1, 2, 64), np.float32)
    res = kv.decode_attention(c, 0, q, np.array(tables), [40], scale=0.3, out=out)
    assert res is out
    want = reference(Batch(c, tables, [40], [0, 1], np.array([39])), q, Mask(scale=0.3)).out
    assert np.abs(out - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(kv.decode_attention(c, 0, q, np.array(tables), [40]) - want).max() > 1e-3  # the default scale differs


def test_views_are_zero_copy_logical_and_writable() -> None:
    c = kv.KvCache(2, 3, 4, 2, 8, "f16")
    k = c.key(1)
    assert k.shape == (3, 4, 2, 8) and k.dtype == np.float16
    assert np.shares_memory(k, c.key(1)) and not np.shares_memory(k, c.key(0))
    x = np.arange(2 * 2 * 8, dtype=np.float32).reshape(2, 2, 8)
    c.write(1, x, -x, np.array([5, -1]))  # slot 5 = block 1, offset 1; -1 skipped
    np.testing.assert_array_equal(k[1, 1], x[0].astype(np.float16))
    np.testing.assert_array_equal(c.value(1)[1, 1], -x[0].astype(np.float16))
    assert np.count_nonzero(k) == np.count_nonzero(x[0])
    k[0, 0, 0, 0] = 3.0  # the view writes the cache itself
    assert c.key(1)[0, 0, 0, 0] == 3.0


def test_write_rounds_to_nearest_even() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 1, 16)).astype(np.float32) * 1e3
    # Exact halfway cases for bf16 (low 16 bits 0x8000) on odd and even mantissas.
    x.view(np.uint32)[0, 0, :4] = [0x3F808000, 0x3F818000, 0xBF808000, 0x7F7F8000]
    c = kv.KvCache(1, 4, 16, 1, 16, "bf16")
    c.write(0, x, x, np.arange(64))
    bits = c.key(0).reshape(64, 1, 16).view(np.uint16) if c.key(0).dtype != np.uint16 else c.key(0).reshape(64, 1, 16)
    u = x.view(np.uint32)
    rne = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(bits, rne)
    c16 = kv.KvCache(1, 4, 16, 1, 16, "f16")
    c16.write(0, x, x, np.arange(64))
    with np.errstate(over="ignore"):  # 3.4e38 -> inf, as in the cache
        np.testing.assert_array_equal(c16.value(0).reshape(64, 1, 16), x.astype(np.float16))


@pytest.mark.parametrize("dtype", kv.KV_DTYPES)
def test_exported_blocks_come_back_bit_identical_into_other_blocks(dtype: str) -> None:
    rng = np.random.default_rng(3)
    c = kv.KvCache(2, 6, 4, 2, 8, dtype)
    for layer in range(2):
        x = rng.standard_normal((8, 2, 8)).astype(np.float32)
        c.write(layer, x, -x, np.arange(8, 16))  # blocks 2 and 3
    data = c.export_blocks([2, 3])
    row = 2 * 4 * kv.KvCache.bytes_per_token(2, 8, dtype)
    assert data.shape == (2, row) and data.dtype == np.uint8
    other = kv.KvCache(2, 6, 4, 2, 8, dtype)
    if dtype.startswith("fp8"):  # fp8 scales belong to no block: the same ones
        for layer in range(2):
            other.set_fp8_scales(layer, c.key_scales(layer).copy(), c.value_scales(layer).copy())
    other.import_blocks([5, 0], data)
    for layer in range(2):
        k, v = c.dequantized(layer)
        k2, v2 = other.dequantized(layer)
        np.testing.assert_array_equal(k2[[5, 0]], k[[2, 3]])
        np.testing.assert_array_equal(v2[[5, 0]], v[[2, 3]])
    np.testing.assert_array_equal(other.export_blocks([5, 0]), data)
    assert c.export_blocks([]).shape == (0, row)


def test_import_blocks_reads_a_view_of_the_cache_itself_safely() -> None:
    c = kv.KvCache(1, 4, 2, 1, 4)
    x = np.arange(8, dtype=np.float32).reshape(2, 1, 4)
    c.write(0, x, x + 1, [0, 1])  # block 0
    keys = c.key(0).reshape(-1).view(np.uint8)  # the cache's own bytes
    row = c.export_blocks([0]).shape[1]
    c.import_blocks([1], c.export_blocks([0]))
    np.testing.assert_array_equal(c.key(0)[1], c.key(0)[0])
    # A row that aliases the cache is copied before the cache is written.
    c.import_blocks([2], keys[:row].reshape(1, row))
    assert c.export_blocks([2]).shape == (1, row)


def test_copy_blocks_copies_every_layer() -> None:
    c = kv.KvCache(2, 4, 2, 1, 4)
    x = np.arange(8, dtype=np.float32).reshape(2, 1, 4)
    for layer in range(2):
        c.write(layer, x, x + 1, [2, 3])  # block 1
    c.copy_blocks(np.array([[1, 3]]))
    for layer in range(2):
        np.testing.assert_array_equal(c.key(layer)[3], c.key(layer)[1])
        np.testing.assert_array_equal(c.value(layer)[3], c.value(layer)[1])
    c.copy_blocks(np.zeros((0, 2), np.int64))
    with pytest.raises(kv.InvalidArgumentError):
        c.copy_blocks([[0, 4]])
    with pytest.raises(kv.InvalidArgumentError):
        c.copy_blocks([[0, 1, 2]])


def test_invalid_arguments_raise_and_change_nothing() -> None:
    c = kv.KvCache(1, 4, 4, 2, 8)
    q = np.zeros((1, 4, 8), np.float32)
    t = np.array([[0, 1]], np.int32)
    bad_calls = [
        lambda: kv.decode_attention(c, 0, q, np.array([[0, 4]]), [5]),  # block outside pool
        lambda: kv.decode_attention(c, 0, q, np.array([[0, -1]]), [5]),  # padding within length
        lambda: kv.decode_attention(c, 0, q, t, [9]),  # beyond table capacity
        lambda: kv.decode_attention(c, 0, q, t, [-1]),
        lambda: kv.decode_attention(c, 0, np.zeros((1, 3, 8), np.float32), t, [5]),  # heads
        lambda: kv.decode_attention(c, 0, np.zeros((1, 4, 16), np.float32), t, [5]),  # dim
        lambda: kv.decode_attention(c, 0, q.astype(np.float64), t, [5]),  # dtype
        lambda: kv.decode_attention(c, 0, q[0], t, [5]),  # ndim
        lambda: kv.decode_attention(c, 0, q, t, [5, 5]),  # rows vs lens
        lambda: kv.decode_attention(c, 1, q, t, [5]),  # layer
        lambda: kv.decode_attention(c, 0, q, t, [5], out=np.zeros((1, 4, 7), np.float32)),
        lambda: kv.decode_attention(c, 0, q, t, [5], out=np.zeros((1, 4, 16), np.float32)[..., ::2]),
        lambda: kv.decode_attention(c, 0, q, t, [5], tuning=kv.KernelTuning(isa="neon") if "neon" not in PATHS else "avx2"),
        lambda: kv.decode_attention(c, 0, q, t, [5], tuning=kv.KernelTuning(isa="sve")),  # type: ignore[arg-type]  # unknown
        lambda: kv.decode_attention(c, 0, q, t, [5], tuning=kv.KernelTuning(kv_heads_per_item=3)),
        lambda: kv.decode_attention(c, 0, q, t, [5], scale=float("inf")),
        lambda: kv.decode_attention_paged(c, 0, q, [0, 2], [0, 1], [5]),  # last page > block
        lambda: kv.decode_attention_paged(c, 0, q, [0, 3], [0, 1], [1]),  # indptr past indices
        lambda: kv.decode_attention_paged(c, 0, q, [0, 1], [7], [1]),
        lambda: c.write(0, np.zeros((1, 2, 8), np.float32), np.zeros((1, 2, 8), np.float32), [16]),
        lambda: c.write(0, np.zeros((1, 2, 8), np.float64), np.zeros((1, 2, 8), np.float32), [0]),
        lambda: c.write(0, np.zeros((2, 2, 8), np.float32), np.zeros((2, 2, 8), np.float32), [0]),
        lambda: c.key(1),
        lambda: kv.KvCache(1, 4, 4, 2, 8, "int4"),
        lambda: kv.KvCache(1, 0, 4, 2, 8),
        lambda: kv.set_num_threads(0),
    ]
    for call in bad_calls:
        with pytest.raises(kv.InvalidArgumentError):
            call()
    assert not c.key(0).any() and not c.value(0).any()


def test_every_supported_path_is_listed_and_scalar_always() -> None:
    assert PATHS[0] == "scalar"
    feats = kv.cpu_features()
    assert ("avx512" in PATHS) == all(f in feats for f in ("avx512f", "avx512bw", "avx512vl"))
    assert ("avx2" in PATHS) == all(f in feats for f in ("avx2", "fma", "f16c"))
    assert ("neon" in PATHS) == ("neon" in feats)
    assert not ("neon" in PATHS and "avx2" in PATHS)


def test_forcing_a_path_this_cpu_lacks_names_it() -> None:
    c = kv.KvCache(1, 4, 4, 2, 8)
    q = np.zeros((1, 4, 8), np.float32)
    t = np.array([[0, 1]], np.int32)
    lacking = [p for p in ("neon", "avx2", "avx512") if p not in PATHS]
    assert lacking  # no CPU has both the x86 and the aarch64 paths
    for path in lacking:
        with pytest.raises(kv.InvalidArgumentError, match=f"kernel path {path} is not supported by this CPU"):
            kv.decode_attention(c, 0, q, t, [5], tuning=kv.KernelTuning(isa=path))  # type: ignore[arg-type]
    with pytest.raises(kv.InvalidArgumentError, match='unknown kernel path "sve"; known: scalar, neon, avx2, avx512'):
        kv.decode_attention(c, 0, q, t, [5], tuning=kv.KernelTuning(isa="sve"))  # type: ignore[arg-type]


def test_thread_count_is_settable_and_read_from_env() -> None:
    before = kv.get_num_threads()
    try:
        kv.set_num_threads(1)
        assert kv.get_num_threads() == 1
        run_case(Case("decode", PATHS[-1], "f32", ("f32", "f32"), 64, 16, 2, 2, "none", None, None, None, "edges",
                      "normal", False))
    finally:
        kv.set_num_threads(before)
    env = dict(os.environ, PYKVPOOL_NUM_THREADS="3")
    code = "import pykvpool; print(pykvpool.get_num_threads())"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "3"


def test_probes_report_positive_rates() -> None:
    assert kv.read_bandwidth(8 << 20, threads=1) > 1e8
    assert kv.peak_flops(threads=1) > 1e8
    with pytest.raises(kv.InvalidArgumentError):
        kv.read_bandwidth(1000)
    with pytest.raises(kv.InvalidArgumentError):
        kv.read_bandwidth(8 << 20, passes=0)


def test_cpu_clock_leaves_out_the_time_the_cpu_ran_something_else() -> None:
    """Probe and a busy loop pinned to one CPU share it: the wall clock sees about half the
    machine's rate, the probe thread's CPU time all of it (a clock that ignored ``clock``
    would read the two alike)."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs sched_setaffinity")
    code = textwrap.dedent("""
        import os, subprocess, sys
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            import pykvpool as kv
            f = [kv.peak_flops(1, clock=c) for c in ("wall", "cpu")]
            b = [kv.read_bandwidth(256 << 20, 1, passes=2, clock=c) for c in ("wall", "cpu")]
        finally:
            hog.kill()
        print(f[1] / f[0], b[1] / b[0])
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    flops, bandwidth = map(float, res.stdout.split())
    assert flops > 1.4, res.stdout
    assert bandwidth > 1.4, res.stdout


def test_probe_reads_a_caches_own_memory_and_leaves_it_unchanged() -> None:
    # 2 layers x 64 blocks x 16 tokens x 4 heads x 64 dims x 2 (K, V) x 2 bytes = 2 MiB.
    c = kv.KvCache(2, 64, 16, 4, 64, "bf16")
    assert c.nbytes == 2 << 20
    c.key(1)[3, 5] = 7
    before = [c.key(1).copy(), c.value(0).copy()]
    assert kv.read_bandwidth(cache=c, threads=2, passes=2) > 1e8
    assert np.array_equal(c.key(1), before[0]) and np.array_equal(c.value(0), before[1])
    with pytest.raises(kv.InvalidArgumentError, match="not both"):
        kv.read_bandwidth(8 << 20, cache=c)
    small = kv.KvCache(1, 4, 16, 1, 64, "f32")
    with pytest.raises(kv.InvalidArgumentError, match="1 MiB"):
        kv.read_bandwidth(cache=small)


def test_probe_of_a_block_table_reads_the_calls_blocks_and_refuses_bad_tables() -> None:
    """With tables, the probe reads what decode reads: a table naming a block outside the
    cache is refused, as decode refuses it, and a table reading under 1 MiB too."""
    c = kv.KvCache(2, 80, 16, 8, 128, "int8")  # an int8 block of 8 heads: 32 KiB + 1 KiB scales
    table = np.random.default_rng(0).permutation(80).reshape(2, 40)
    lens = np.array([640, 500])
    for threads in (1, 2):
        assert kv.read_bandwidth(cache=c, threads=threads, passes=2, block_tables=table, seq_lens=lens, layer=1) > 1e8
    with pytest.raises(kv.InvalidArgumentError, match="block_tables"):
        kv.read_bandwidth(cache=c, block_tables=np.where(table == 7, 80, table), seq_lens=lens)
    # Entries past a sequence's blocks are never read, as in decode.
    short = table.copy()
    short[1, 32:] = 99  # the second sequence's 500 tokens fill 32 blocks
    assert kv.read_bandwidth(cache=c, passes=1, block_tables=short, seq_lens=lens) > 1e8
    with pytest.raises(kv.InvalidArgumentError, match="1 MiB"):
        kv.read_bandwidth(cache=c, block_tables=table, seq_lens=[16, 16])
    with pytest.raises(kv.InvalidArgumentError, match="together"):
        kv.read_bandwidth(cache=c, block_tables=table)
    with pytest.raises(kv.InvalidArgumentError, match="need a cache"):
        kv.read_bandwidth(8 << 20, block_tables=table, seq_lens=lens)
    with pytest.raises(kv.InvalidArgumentError, match="layer"):
        kv.read_bandwidth(cache=c, layer=1)
    with pytest.raises(kv.InvalidArgumentError, match="layer"):
        kv.read_bandwidth(cache=c, block_tables=table, seq_lens=lens, layer=2)
