"""Arrays crossing into the native module are read as numpy means them, and arrays it
hands out or writes are never trusted blindly.

- Inputs of any layout (Fortran order, slices, negative steps) give the results of their
  C-ordered copies: bit-exact for ``KvCache.write``, equal for ``decode_attention``.
- ``out`` must be a C-contiguous, writeable float32 array that shares no memory with ``q``
  or a cache; anything else is refused before a value is written.
- ``BlockTableBuffer.sync`` refuses an ``array`` whose dtype, shape, strides or memory were
  changed from Python (the issue's reproducer wrote 256 kB into a 64 kB buffer).
- ``KvCache.key/value``: writable views by default, read-only ones on request; a bf16 view
  is ``ml_dtypes.bfloat16`` or an ImportError, never raw ``uint16``.
- Empty inputs are no-ops with empty results.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from typing import Any, Callable

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import pykvpool as kv
from reference.poolcheck import checksum, snapshot


def run_child(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------------------------ input layouts


def layouts(x: np.ndarray) -> dict[str, np.ndarray]:
    """``x`` (C order) in other memory layouts with the same logical values."""
    doubled = np.repeat(x, 2, axis=-1)
    flipped = np.ascontiguousarray(x[::-1])
    return {
        "fortran": np.asfortranarray(x),
        "sliced": doubled[..., ::2],
        "negative": flipped[::-1],
        "transposed": np.ascontiguousarray(np.swapaxes(x, 0, -1)).swapaxes(0, -1),
    }


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_write_reads_any_layout_as_its_c_copy(dtype: str) -> None:
    rng = np.random.default_rng(3)
    k = rng.standard_normal((6, 3, 8)).astype(np.float32)
    v = rng.standard_normal((6, 3, 8)).astype(np.float32)
    slots = np.array([0, 5, 9, 13, 2, 15])
    want = kv.KvCache(1, 4, 4, 3, 8, dtype)
    want.write(0, k, v, slots)
    for name, (ki, vi) in {n: (a, b) for (n, a), b in zip(layouts(k).items(), layouts(v).values())}.items():
        assert not ki.flags.c_contiguous, name
        got = kv.KvCache(1, 4, 4, 3, 8, dtype)
        got.write(0, ki, vi, slots[::-1][::-1])
        assert checksum(got) == checksum(want), name
        # The 2-D form [tokens, heads * dim] too.
        flat = kv.KvCache(1, 4, 4, 3, 8, dtype)
        flat.write(0, np.asfortranarray(k.reshape(6, 24)), np.asfortranarray(v.reshape(6, 24)), slots)
        assert checksum(flat) == checksum(want)


def attention_case() -> tuple[kv.KvCache, np.ndarray, np.ndarray, list[int]]:
    rng = np.random.default_rng(4)
    cache = kv.KvCache(1, 8, 4, 2, 16)
    n = 8 * 4
    cache.write(0, rng.standard_normal((n, 2, 16)).astype(np.float32),
                rng.standard_normal((n, 2, 16)).astype(np.float32), np.arange(n))
    q = rng.standard_normal((3, 4, 16)).astype(np.float32)
    tables = np.array([[0, 1, 2, 3], [7, 6, 5, 4], [2, 4, 6, 0]], np.int64)
    return cache, q, tables, [13, 16, 5]


def test_decode_attention_reads_any_q_layout_as_its_c_copy() -> None:
    cache, q, tables, lens = attention_case()
    want, want_lse = kv.decode_attention(cache, 0, q, tables, lens, return_lse=True)
    for name, qi in layouts(q).items():
        got, lse = kv.decode_attention(cache, 0, qi, tables, lens, return_lse=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-6, err_msg=name)
    # Tables and lengths in odd layouts too.
    got = kv.decode_attention(cache, 0, q, np.asfortranarray(tables), np.array(lens)[::-1][::-1])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_out_of_any_other_layout_is_refused_untouched() -> None:
    cache, q, tables, lens = attention_case()
    before = checksum(cache)
    bad: dict[str, np.ndarray] = {
        "fortran": np.asfortranarray(np.full((3, 4, 16), 7, np.float32)),
        "sliced": np.full((3, 4, 32), 7, np.float32)[..., ::2],
        "negative": np.full((3, 4, 16), 7, np.float32)[::-1],
    }
    for name, out in bad.items():
        with pytest.raises(kv.InvalidArgumentError, match="out must be C-contiguous"):
            kv.decode_attention(cache, 0, q, tables, lens, out=out)
        assert (out == 7).all(), name
    assert checksum(cache) == before


# ---------------------------------------------------------------------------- aliasing


def test_out_sharing_memory_with_the_cache_or_q_is_refused() -> None:
    # One KV head: a block of the V view, [block_size, 1, head_dim], is C-contiguous.
    cache = kv.KvCache(1, 4, 4, 1, 8)
    cache.write(0, np.ones((16, 1, 8), np.float32), np.arange(128, dtype=np.float32).reshape(16, 1, 8),
                np.arange(16))
    other = kv.KvCache(1, 4, 4, 1, 8)
    q = np.ones((4, 1, 8), np.float32)
    tables, lens = [[1], [2], [3], [1]], [4, 4, 4, 2]
    window = cache.value(0)[0]
    assert window.shape == (4, 1, 8) and window.flags.c_contiguous and window.flags.writeable
    before = (checksum(cache), checksum(other), q.copy())
    cases: dict[str, Callable[[], Any]] = {
        "cache window": lambda: kv.decode_attention(cache, 0, q, tables, lens, out=window),
        "another block": lambda: kv.decode_attention(cache, 0, q, tables, lens, out=cache.value(0)[3]),
        # Its base is not the cache: only the address check sees the overlap.
        "as_strided": lambda: kv.decode_attention(cache, 0, q, tables, lens, out=as_strided(window)),
        "other cache": lambda: kv.decode_attention(cache, 0, q, tables, lens, out=other.value(0)[0]),
        "q itself": lambda: kv.decode_attention(cache, 0, q, tables, lens, out=q),
        "paged, cache": lambda: kv.decode_attention_paged(cache, 0, q, [0, 1, 2, 3, 4], [1, 2, 3, 1],
                                                          [4, 4, 4, 2], out=window),
    }
    for name, call in cases.items():
        with pytest.raises(kv.InvalidArgumentError, match="out must not") as info:
            call()
        assert "out" in str(info.value), name
    assert (checksum(cache), checksum(other)) == before[:2]
    np.testing.assert_array_equal(q, before[2])
    # A separate buffer of the same shape is fine.
    assert kv.decode_attention(cache, 0, q, tables, lens, out=np.empty((4, 1, 8), np.float32)).shape == (4, 1, 8)


def test_read_only_out_is_refused() -> None:
    cache, q, tables, lens = attention_case()
    out = np.zeros((3, 4, 16), np.float32)
    out.flags.writeable = False
    with pytest.raises(kv.InvalidArgumentError, match="out"):
        kv.decode_attention(cache, 0, q, tables, lens, out=out)
    assert not out.any()


# ------------------------------------------------------------------------------- views


def test_views_are_writable_by_default_and_read_only_on_request() -> None:
    c = kv.KvCache(1, 2, 4, 1, 8, "f16")
    k, v = c.key(0), c.value(0)
    assert k.flags.writeable and v.flags.writeable
    k[1, 2, 0, 3] = 5.0
    ro_k, ro_v = c.key(0, writable=False), c.value(0, writable=False)
    assert not ro_k.flags.writeable and not ro_v.flags.writeable
    assert ro_k[1, 2, 0, 3] == 5.0 and np.shares_memory(ro_k, k)
    with pytest.raises(ValueError, match="read-only"):
        ro_k[0, 0, 0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        ro_v[...] = 1.0
    # Still zero-copy: later writes show through the read-only view.
    c.write(0, np.full((1, 1, 8), 2, np.float32), np.full((1, 1, 8), 3, np.float32), [0])
    assert (ro_k[0, 0] == 2).all() and (ro_v[0, 0] == 3).all()
    assert c.key(0, writable=True).flags.writeable


def test_bf16_view_is_bfloat16() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")  # a runtime dependency: installed with pykvpool
    c = kv.KvCache(1, 2, 4, 1, 8, "bf16")
    c.write(0, np.full((1, 1, 8), 1.5, np.float32), np.zeros((1, 1, 8), np.float32), [0])
    k = c.key(0)
    assert k.dtype == ml_dtypes.bfloat16 and k[0, 0, 0, 0] == 1.5
    assert c.value(0, writable=False).dtype == ml_dtypes.bfloat16


def test_bf16_view_without_ml_dtypes_raises_instead_of_uint16() -> None:
    proc = run_child("""
        import sys
        sys.modules["ml_dtypes"] = None  # makes `import ml_dtypes` fail
        import numpy as np, pykvpool as kv
        c = kv.KvCache(1, 2, 4, 1, 8, "bf16")
        try:
            v = c.key(0)
        except ImportError as e:
            print("ImportError:", e)
        else:
            print("handed out", v.dtype)
        assert kv.KvCache(1, 2, 4, 1, 8, "f16").key(0).dtype == np.float16
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ImportError:") and "ml_dtypes" in proc.stdout, proc.stdout


# -------------------------------------------------------------- BlockTableBuffer.array


def test_retyped_table_buffer_array_is_refused_not_overrun() -> None:
    """The issue's reproducer, in a child process: sync used to write 64 kB into the
    16 kB left after the resize (malloc then aborted the process)."""
    proc = run_child("""
        import numpy as np, pykvpool as kv
        pool = kv.BlockPool(128 * 128, 1)
        for i in range(128):
            pool.add_sequence(i, 128)
        b = kv.BlockTableBuffer(128, 128)
        b.array.dtype = np.int8
        b.array.resize((128, 128), refcheck=False)  # 16 kB left of the 64 kB
        try:
            b.sync(pool, range(128))
        except kv.InvalidArgumentError as e:
            print("refused:", e)
        junk = [np.zeros(1000) for _ in range(1000)]  # a corrupted heap aborts here
        fresh = kv.BlockTableBuffer(128, 128)
        assert fresh.sync(pool, range(128)) == 128 * 128
        assert (fresh.array == pool.block_tables(range(128))).all()
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("refused:") and "int8" in proc.stdout, proc.stdout


def tamper_shape(a: np.ndarray) -> None:
    a.shape = (a.size,)


def tamper_strides(a: np.ndarray) -> None:
    a.strides = (4, 4 * a.shape[0])


def tamper_byte_order(a: np.ndarray) -> None:
    a.dtype = a.dtype.newbyteorder()


def tamper_read_only(a: np.ndarray) -> None:
    a.flags.writeable = False


@pytest.mark.parametrize("tamper", [tamper_shape, tamper_strides, tamper_byte_order, tamper_read_only])
def test_tampered_table_buffer_array_is_refused(tamper: Callable[[np.ndarray], None]) -> None:
    pool = kv.BlockPool(64, 2)
    pool.add_sequence(1, 9)
    b = kv.BlockTableBuffer(8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # setting shape/strides in place
        try:
            tamper(b.array)
        except AttributeError as e:  # a numpy that no longer allows it in place
            pytest.skip(f"numpy refuses this tampering itself: {e}")
    before, held = snapshot(pool), b.array.copy()
    with pytest.raises(kv.InvalidArgumentError, match="BlockTableBuffer.array|not writable"):
        b.sync(pool, [1])
    assert snapshot(pool) == before
    np.testing.assert_array_equal(b.array, held)


def test_moved_table_buffer_memory_is_refused_or_still_exact() -> None:
    pool = kv.BlockPool(64, 2)
    pool.add_sequence(1, 9)
    b = kv.BlockTableBuffer(8, 8)
    a = b.array
    start = a.__array_interface__["data"][0]
    a.resize((8 * 8 * 64,), refcheck=False)  # grow: the data usually moves
    a.resize((8, 8), refcheck=False)
    if a.__array_interface__["data"][0] != start:
        with pytest.raises(kv.InvalidArgumentError, match="no longer holds the memory"):
            b.sync(pool, [1])
    else:  # reallocated in place: still exactly the buffer that was allocated
        assert b.sync(pool, [1]) == 8
        np.testing.assert_array_equal(b.array[0], pool.block_tables([1], 8)[0])


# ------------------------------------------------------------------------ empty inputs


def test_empty_inputs_are_no_ops() -> None:
    cache, q, tables, lens = attention_case()
    before = checksum(cache)
    for pairs in ([], (), np.empty((0, 2)), np.zeros((0, 2), np.int32), np.empty(0)):
        assert cache.copy_blocks(pairs) is None
    cache.write(0, np.zeros((0, 2, 16), np.float32), np.zeros((0, 32), np.float32), [])
    cache.write(0, np.zeros((0, 2, 16), np.float32), np.zeros((0, 2, 16), np.float32), np.array([]))
    q0 = np.zeros((0, 4, 16), np.float32)
    for t, n in (([], []), (np.empty((0, 0)), np.array([])), (np.zeros((0, 4), np.int32), np.zeros(0, np.int64))):
        out, lse = kv.decode_attention(cache, 0, q0, t, n, return_lse=True)
        assert out.shape == (0, 4, 16) and out.dtype == np.float32 and lse.shape == (0, 4)
    assert kv.decode_attention_paged(cache, 0, q0, [0], [], []).shape == (0, 4, 16)
    out = np.empty((0, 4, 16), np.float32)
    assert kv.decode_attention(cache, 0, q0, [], [], out=out) is out
    assert checksum(cache) == before


# ------------------------------------------------------------------- blocks_for_tokens


def test_blocks_for_tokens_is_what_admission_takes() -> None:
    pool = kv.BlockPool(4096, 16)
    assert [pool.blocks_for_tokens(n) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]
    assert pool.blocks_for_tokens(np.int64(2**63 - 1)) == (2**63 - 1 + 15) // 16
    for seq, n in enumerate((0, 1, 16, 17, 100, 1000)):
        free = pool.num_free_blocks
        pool.add_sequence(seq, n)
        assert free - pool.num_free_blocks == pool.blocks_for_tokens(n)
    for bad in (-1, 1.5, True, "3", None, 2**64):
        with pytest.raises(kv.InvalidArgumentError, match="num_tokens"):
            pool.blocks_for_tokens(bad)  # type: ignore[arg-type]
