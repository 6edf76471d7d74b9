"""CPU torch tensors wherever the kernels and KvCache take numpy arrays: read through
DLPack without a copy, the same results and the same errors; the cache's views and the
pools' outputs as tensors without copies; ``import pykvpool`` never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import pykvpool as kv

torch = pytest.importorskip("torch")

HKV, D, BS, NB = 2, 8, 4, 16


def test_import_pykvpool_does_not_import_torch_or_transformers() -> None:
    code = ("import sys, pykvpool, pykvpool.simulate, pykvpool.video, pykvpool.planning\n"
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def filled() -> tuple[kv.BlockPool, kv.KvCache, list[int]]:
    """Three sequences of 5, 9 and 1 tokens of random K/V in a one-layer cache."""
    pool, cache = kv.BlockPool(NB, BS), kv.KvCache(1, NB, BS, HKV, D)
    rng = np.random.default_rng(0)
    for s, n in enumerate([5, 9, 1]):
        slots = pool.add_sequence(s, n)
        cache.write(0, rng.standard_normal((n, HKV, D), np.float32), rng.standard_normal((n, HKV, D), np.float32),
                    slots)
    return pool, cache, [0, 1, 2]


def lens_of(pool: kv.BlockPool, seqs: list[int]) -> Any:
    return np.array([pool.seq_len(s) for s in seqs], dtype=np.int64)


def q_of(rows: int, hq: int = 4) -> Any:
    return np.random.default_rng(1).standard_normal((rows, hq, D), np.float32)


def test_cache_views_are_tensors_without_copies() -> None:
    _, cache, _ = filled()
    view = cache.key(0)
    t = torch.from_numpy(view)
    assert t.data_ptr() == view.ctypes.data and t.stride() == tuple(s // 4 for s in view.strides)
    t[3, 1, 0, 2] = 42.0  # a write through the tensor is seen by numpy and the kernels
    assert view[3, 1, 0, 2] == 42.0
    cache.write(0, np.full((1, HKV, D), 7.0, np.float32), np.zeros((1, HKV, D), np.float32), [3 * BS + 1])
    assert float(t[3, 1, 0, 2]) == 7.0  # and a write through the cache by the tensor


def test_pool_outputs_are_tensors_without_copies() -> None:
    pool = kv.BlockPool(NB, BS)
    slots = pool.add_sequence(0, 6)
    slot_mapping, cow, lens = pool.step([0], [3])
    tables = pool.block_tables([0])
    hyb = kv.BlockPool(NB, BS, [kv.FullAttention(), kv.SlidingWindow(4)])
    hslots = hyb.add_sequence(0, 5)
    happend = hyb.append(0, 2)
    hstep = hyb.step([0], [1])
    outputs = (slots, slot_mapping, cow, lens, tables, *pool.flashinfer_tables([0]), hslots, *happend, *hstep,
               hyb.block_tables([0], group=1), *hyb.flashinfer_tables([0], group=1), hyb.seq_ids())
    for arr in outputs:
        t = torch.from_numpy(arr)  # no warning: the outputs are writable
        assert t.data_ptr() == arr.ctypes.data or arr.size == 0
        assert t.dtype in (torch.int32, torch.int64)
        if arr.size:  # one memory: a write through the tensor is the array's
            t.view(-1)[0] = 12345
            assert arr.reshape(-1)[0] == 12345


def test_decode_kernels_take_tensors() -> None:
    pool, cache, seqs = filled()
    q = q_of(3)
    tables, lens = pool.block_tables(seqs), lens_of(pool, seqs)
    want = kv.decode_attention(cache, 0, q, tables, lens, window_left=3)
    out = torch.empty((3, 4, D))
    got = kv.decode_attention(cache, 0, torch.from_numpy(q), torch.from_numpy(tables), torch.from_numpy(lens),
                              out=out, window_left=3)
    assert got is out and np.array_equal(out.numpy(), want)
    fi = pool.flashinfer_tables(seqs)
    want = kv.decode_attention_paged(cache, 0, q, *fi)
    got = kv.decode_attention_paged(cache, 0, torch.from_numpy(q), *(torch.from_numpy(a) for a in fi))
    assert np.array_equal(got, want)


def test_prefill_kernels_take_tensors() -> None:
    pool, cache, seqs = filled()
    q = q_of(6)
    qo = np.array([0, 2, 5, 6])
    tables, lens = pool.block_tables(seqs), lens_of(pool, seqs)
    want = kv.prefill_attention(cache, 0, q, qo, tables, lens, logits_soft_cap=5.0)
    out = torch.zeros((6, 4, D))
    got = kv.prefill_attention(cache, 0, torch.from_numpy(q), torch.from_numpy(qo), torch.from_numpy(tables),
                               torch.from_numpy(lens), logits_soft_cap=5.0, out=out)
    assert got is out and np.array_equal(out.numpy(), want)
    fi = pool.flashinfer_tables(seqs)
    want = kv.prefill_attention_paged(cache, 0, q, qo, *fi)
    got = kv.prefill_attention_paged(cache, 0, torch.from_numpy(q), torch.from_numpy(qo),
                                     *(torch.from_numpy(a) for a in fi))
    assert np.array_equal(got, want)


def test_write_and_copy_blocks_take_tensors() -> None:
    rng = np.random.default_rng(2)
    k = rng.standard_normal((3, HKV * D), np.float32)
    v = rng.standard_normal((3, HKV, D), np.float32)
    a, b = kv.KvCache(1, NB, BS, HKV, D), kv.KvCache(1, NB, BS, HKV, D)
    a.write(0, k, v, [0, 5, -1])
    a.copy_blocks([[1, 7]])
    # A strided (transposed back) tensor is read in logical order, like a strided array.
    kt = torch.from_numpy(np.ascontiguousarray(k.T)).T
    b.write(0, kt, torch.from_numpy(v), torch.tensor([0, 5, -1]))
    b.copy_blocks(torch.tensor([[1, 7]]))
    assert np.array_equal(a.key(0), b.key(0)) and np.array_equal(a.value(0), b.value(0))


class FakeDevice:
    """A DLPack exporter on another device (a CUDA tensor's face without a GPU)."""

    def __init__(self, t: Any, device: tuple[int, int]) -> None:
        self.t, self.device = t, device

    def __dlpack__(self, **kw: Any) -> Any:
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def bad_tensor_cases() -> list[tuple[str, Any, str]]:
    q = torch.from_numpy(q_of(3))
    cases = [("float64", q.double(), "q must be a float32"), ("bfloat16", q.bfloat16(), "q: a Tensor of dtype"),
             ("shape", q[:, :, :4], "head_dim"), ("requires_grad", q.clone().requires_grad_(), "q: a Tensor"),
             ("cuda", FakeDevice(q, (2, 0)), "q must be in CPU memory")]
    if torch.cuda.is_available():
        cases.append(("real cuda", q.cuda(), "q must be in CPU memory"))
    return cases


@pytest.mark.parametrize("name,q,match", bad_tensor_cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_bad_tensors_raise_like_numpy(name: str, q: Any, match: str) -> None:
    pool, cache, seqs = filled()
    with pytest.raises(kv.InvalidArgumentError, match=match):
        kv.decode_attention(cache, 0, q, pool.block_tables(seqs), lens_of(pool, seqs))


def test_negative_and_conjugate_views_are_refused_not_misread() -> None:
    # DLPack exports the memory, not torch's lazy negative or conjugate bit: read through it,
    # such a tensor would be taken with the opposite sign. Refused like torch's `.numpy()`.
    pool, cache, seqs = filled()
    q = torch.from_numpy(q_of(3))
    z = torch.complex(q, q)
    neg_views = {"_neg_view": torch._neg_view(q), "conj().imag": z.conj().imag}
    tables, lens = pool.block_tables(seqs), lens_of(pool, seqs)
    before = cache.key(0).copy()
    for name, t in neg_views.items():
        assert t.is_neg(), name
        with pytest.raises(kv.InvalidArgumentError, match="q: .*negative bit.*resolve_neg"):
            kv.decode_attention(cache, 0, t, tables, lens)
        # The values torch shows are accepted once resolved.
        assert np.array_equal(kv.decode_attention(cache, 0, t.resolve_neg(), tables, lens),
                              kv.decode_attention(cache, 0, -q.numpy(), tables, lens))
        k = t.reshape(3, -1)[:, : HKV * D]
        with pytest.raises(kv.InvalidArgumentError, match="k: .*negative bit"):
            cache.write(0, k, k.resolve_neg(), [0, 1, 2])
        with pytest.raises(kv.InvalidArgumentError, match="v: .*negative bit"):
            cache.write(0, k.resolve_neg(), k, [0, 1, 2])
    assert np.array_equal(cache.key(0), before)
    out = torch._neg_view(torch.zeros((3, 4, D)))
    with pytest.raises(kv.InvalidArgumentError, match="out: .*negative bit"):
        kv.decode_attention(cache, 0, q, tables, lens, out=out)
    conj = torch.complex(q, q).conj()
    assert conj.is_conj()
    with pytest.raises(kv.InvalidArgumentError, match="q: .*conjugate bit"):
        kv.decode_attention(cache, 0, conj, tables, lens)


def test_bad_int_tensors_and_write_errors() -> None:
    pool, cache, seqs = filled()
    q = torch.from_numpy(q_of(3))
    with pytest.raises(kv.InvalidArgumentError, match="seq_lens must have an integer dtype"):
        kv.decode_attention(cache, 0, q, pool.block_tables(seqs), torch.tensor([1.0, 2.0, 1.0]))
    with pytest.raises(kv.InvalidArgumentError, match="block_tables must be"):
        kv.decode_attention(cache, 0, q, torch.zeros((3, 2, 1), dtype=torch.int32), lens_of(pool, seqs))
    before = cache.key(0).copy()
    with pytest.raises(kv.InvalidArgumentError, match="k must have shape"):
        cache.write(0, torch.zeros((2, HKV, D)), torch.zeros((1, HKV, D)), [0])
    with pytest.raises(kv.InvalidArgumentError, match="slot_mapping must be in CPU memory"):
        cache.write(0, torch.zeros((1, HKV, D)), torch.zeros((1, HKV, D)), FakeDevice(torch.tensor([0]), (2, 0)))
    assert np.array_equal(cache.key(0), before)


def test_out_tensor_aliasing_is_refused() -> None:
    pool, cache, seqs = filled()
    q = torch.from_numpy(q_of(3))
    args = (pool.block_tables(seqs), lens_of(pool, seqs))
    with pytest.raises(kv.InvalidArgumentError, match="share memory with q"):
        kv.decode_attention(cache, 0, q, *args, out=q)
    # A tensor over any cache's memory, reached through no numpy `base`, is refused too.
    other = kv.KvCache(1, NB, BS, HKV, D)
    inside = torch.as_strided(torch.from_numpy(other.value(0)), (3, 4, D), (4 * D, D, 1))
    with pytest.raises(kv.InvalidArgumentError, match="share memory with a KvCache"):
        kv.decode_attention(cache, 0, q, *args, out=inside)
    with pytest.raises(kv.InvalidArgumentError, match="out must be C-contiguous"):
        kv.decode_attention(cache, 0, q, *args, out=torch.empty((3, D, 4)).transpose(1, 2))
    with pytest.raises(kv.InvalidArgumentError, match="out must be a float32"):
        kv.decode_attention(cache, 0, q, *args, out=torch.empty((3, 4, D), dtype=torch.float64))


# --- inputs read in place (no copy for C-contiguous float32), the GIL released -------------

def layouts(a: np.ndarray) -> dict[str, Any]:
    """``a``'s values in other memory layouts, numpy and torch: each must read as ``a``."""
    big = np.zeros((2 * a.shape[0],) + a.shape[1:], np.float32)
    big[::2] = a
    rev = np.ascontiguousarray(a[::-1])[::-1]
    fortran = np.asfortranarray(a)
    return {"numpy": a, "fortran": fortran, "sliced": big[::2], "negative": rev,
            "torch": torch.from_numpy(a), "torch-fortran": torch.from_numpy(fortran),
            "torch-sliced": torch.from_numpy(big)[::2]}


def test_inputs_in_any_layout_read_as_the_contiguous_array() -> None:
    pool, cache, seqs = filled()
    tables, lens = pool.block_tables(seqs), lens_of(pool, seqs)
    q3, q6, qo = q_of(3), q_of(6), np.array([0, 2, 5, 6])
    dec = kv.decode_attention(cache, 0, q3, tables, lens)
    pre = kv.prefill_attention(cache, 0, q6, qo, tables, lens)
    rng = np.random.default_rng(5)
    k, v = (rng.standard_normal((6, HKV, D), np.float32) for _ in range(2))
    slots = np.array([0, 1, 9, 10, 11, -1])
    ref = kv.KvCache(1, NB, BS, HKV, D)
    ref.write(0, k, v, slots)
    for name, q in layouts(q3).items():
        assert np.array_equal(kv.decode_attention(cache, 0, q, tables, lens), dec), name
    for name, q in layouts(q6).items():
        assert np.array_equal(kv.prefill_attention(cache, 0, q, qo, tables, lens), pre), name
    for (name, kk), vv in zip(layouts(k).items(), layouts(v).values()):
        c = kv.KvCache(1, NB, BS, HKV, D)
        c.write(0, kk, vv, torch.from_numpy(slots) if "torch" in name else slots)
        assert np.array_equal(c.key(0), ref.key(0)) and np.array_equal(c.value(0), ref.value(0)), name
    # Zero strides (a broadcast row) read as their contiguous copy.
    row = np.broadcast_to(k[:1], k.shape)
    c, want = kv.KvCache(1, NB, BS, HKV, D), kv.KvCache(1, NB, BS, HKV, D)
    c.write(0, row, torch.from_numpy(v).permute(2, 1, 0).contiguous().permute(2, 1, 0), slots)
    want.write(0, np.ascontiguousarray(row), v, slots)
    assert np.array_equal(c.key(0), want.key(0)) and np.array_equal(c.value(0), want.value(0))


def test_a_huge_broadcast_input_is_refused_before_its_copy() -> None:
    """A zero-stride array of 2**27 rows takes no memory; its copy would take GBs: refused,
    naming the argument, before anything is allocated or written (numpy and torch)."""
    pool, cache, seqs = filled()
    before = cache.key(0).copy()
    huge = np.broadcast_to(np.float32(1), (1 << 27, HKV, D))
    with pytest.raises(kv.InvalidArgumentError, match="k: a broadcast"):
        cache.write(0, huge, huge, [0])
    q = np.broadcast_to(np.float32(1), (3, 1 << 23, D))
    with pytest.raises(kv.InvalidArgumentError, match="q: a broadcast"):
        kv.decode_attention(cache, 0, torch.ones((3, 1, D)).expand(3, 1 << 23, D),
                            pool.block_tables(seqs), lens_of(pool, seqs))
    with pytest.raises(kv.InvalidArgumentError, match="q: a broadcast"):
        kv.prefill_attention(cache, 0, q, [0, 1, 2, 3], pool.block_tables(seqs), lens_of(pool, seqs))
    assert np.array_equal(cache.key(0), before)


def test_an_input_inside_a_cache_is_read_before_the_write() -> None:
    """k/v that are a view of the cache being written (C-contiguous: V rows of one block
    with one KV head) are copied first, so the write equals one from a copy."""
    a, b = kv.KvCache(1, NB, 1, 1, D), kv.KvCache(1, NB, 1, 1, D)
    rng = np.random.default_rng(6)
    k, v = (rng.standard_normal((NB, 1, D), np.float32) for _ in range(2))
    a.write(0, k, v, np.arange(NB))
    b.write(0, k, v, np.arange(NB))
    inside = a.value(0)[3]  # [1, 1, D]: block 3's V, contiguous in the cache's memory
    assert inside.flags.c_contiguous
    b.write(0, inside.copy(), inside.copy(), [3])
    a.write(0, inside, torch.from_numpy(inside), [3])
    assert np.array_equal(a.key(0), b.key(0)) and np.array_equal(a.value(0), b.value(0))


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_out_overlapping_an_input_read_in_place_is_refused(kernel: str) -> None:
    pool, cache, seqs = filled()
    tables, lens = pool.block_tables(seqs), lens_of(pool, seqs)
    buf = np.random.default_rng(7).standard_normal((4, 4, D), np.float32)
    q, out = buf[:3], buf[1:]  # partial overlap: rows 1-2 are both q and out
    for qq, oo in [(q, out), (torch.from_numpy(buf)[:3], torch.from_numpy(buf)[1:]), (q, torch.from_numpy(buf)[1:])]:
        before = buf.copy()
        with pytest.raises(kv.InvalidArgumentError, match="out must not share memory with q"):
            if kernel == "decode":
                kv.decode_attention(cache, 0, qq, tables, lens, out=oo)
            else:
                kv.prefill_attention(cache, 0, qq, [0, 1, 2, 3], tables, lens, out=oo)
        assert np.array_equal(buf, before)


CHILD_RSS = """
import numpy as np, pykvpool as kv, torch
n, h, d = 16384, 8, 128  # 64 MiB each for k and v
cache = kv.KvCache(1, n // 16, 16, h, d)
cache.key(0)[...] = 0  # touch the cache's pages before measuring
cache.value(0)[...] = 0
k = np.ones((n, h, d), np.float32)
v = np.full((n, h, d), 2.0, np.float32)
slots = np.arange(n)
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))
def grown(f):
    with open("/proc/self/clear_refs", "w") as c:
        c.write("5")  # the peak (VmHWM) restarts at the current RSS
    before = status("VmRSS")
    f()
    return (status("VmHWM") - before) / 1024
inplace = grown(lambda: cache.write(0, k, v, slots))
tensors = grown(lambda: cache.write(0, torch.from_numpy(k), torch.from_numpy(v), torch.from_numpy(slots)))
kf, vf = np.asfortranarray(k), np.asfortranarray(v)
copied = grown(lambda: cache.write(0, kf, vf, slots))
print(inplace, tensors, copied)
"""


def test_contiguous_write_inputs_are_not_copied() -> None:
    """Peak memory (RSS, its high-water mark reset before each call through Linux's
    ``/proc/self/clear_refs``) in a fresh process: a write of 2 x 64 MiB C-contiguous inputs
    (numpy, then torch) adds nothing to the peak; Fortran-order inputs (copied in logical
    order) add their 128 MiB, which shows the measurement sees a copy."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    r = subprocess.run([sys.executable, "-c", CHILD_RSS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    inplace, tensors, copied = map(float, r.stdout.split())
    assert inplace < 8 and tensors < 8, r.stdout
    assert copied > 100, r.stdout


CHILD_GIL = """
import sys, threading, time, numpy as np, pykvpool as kv, torch
n, h, d = 16384, 8, 128
cache = kv.KvCache(1, n // 16, 16, h, d)
k, v = torch.ones((n, h, d)), torch.full((n, h, d), 2.0)
slots = torch.arange(n)
ticks, spans, done = [], [], threading.Event()
def count():
    while not done.is_set():
        ticks.append(time.perf_counter())
        time.sleep(0.0002)  # needs the GIL back to continue
t = threading.Thread(target=count)
t.start()
for _ in range(20):
    t0 = time.perf_counter()
    cache.write(0, k, v, slots)
    spans.append((t0, time.perf_counter()))
done.set()
t.join()
per_span = sorted(sum(1 for x in ticks if a < x < b) for a, b in spans)
print(per_span[len(per_span) // 2], len(spans))
"""


def test_a_large_write_releases_the_gil() -> None:
    """Another Python thread runs while a large write of torch tensors (2 x 64 MiB) runs:
    it ticks several times inside a typical write (the median over 20 writes). A call that
    held the GIL would allow at most one tick (a switch between the clock read and the call)."""
    r = subprocess.run([sys.executable, "-c", CHILD_GIL], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    median_ticks, _ = map(int, r.stdout.split())
    assert median_ticks >= 3, r.stdout
