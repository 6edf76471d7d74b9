"""Threads: no pattern of concurrent calls may deadlock the process.

Each reproducer (a pattern of concurrent calls that once deadlocked) runs in a subprocess
for a bounded time (``SECONDS`` per thread, a switch interval of 1 us so the GIL changes
hands as often as possible) and must exit 0 well within ``TIMEOUT``; a deadlock hangs the
child and fails the test by timeout instead of freezing the run.

The deadlocks these guard against: a thread holding a Rust lock (the pool mutex, the
cache's read lock) while it builds a Python exception, allocates a Python object or
takes the GIL back, while another thread holds the GIL and waits for that lock.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SECONDS = 1.5
TIMEOUT = 60

PRELUDE = f"""
import sys, threading, time
import numpy as np
import pykvpool as kv

sys.setswitchinterval(1e-6)
STOP = time.monotonic() + {SECONDS}
errors = []

def loop(f, *catch):
    def run():
        try:
            while time.monotonic() < STOP:
                try:
                    f()
                except catch:
                    pass
        except BaseException as e:  # reported by the parent through the exit code
            errors.append(repr(e))
    return threading.Thread(target=run)

def run_all(threads):
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    print("ok")
"""


def run_pattern(body: str) -> None:
    code = PRELUDE + textwrap.dedent(body)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"deadlock: the pattern did not finish within {TIMEOUT} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ok"


# Calls that raise UnknownSequenceError (a KeyError) for the never-added id 7.
UNKNOWN_ID_CALLS = {
    "free": "pool.free(7)",
    "seq_len": "pool.seq_len(7)",
    "block_table": "pool.block_table(7)",
    "blocks_needed": "pool.blocks_needed(7, 1)",
    "sync": "buf.sync(pool, [7])",
}


@pytest.mark.parametrize("call", sorted(UNKNOWN_ID_CALLS))
def test_pool_error_path_against_a_getter(call: str) -> None:
    """Thread A raises for an unknown id in a loop; B reads ``num_free_blocks``."""
    run_pattern(f"""
        pool = kv.BlockPool(64, 16)
        pool.add_sequence(1, 40)
        buf = kv.BlockTableBuffer(4, 8)
        a = loop(lambda: {UNKNOWN_ID_CALLS[call]}, KeyError)
        b = loop(lambda: pool.num_free_blocks)
        c = loop(lambda: pool.seq_len(1))
        run_all([a, b, c])
    """)


def test_prefix_cache_error_paths_against_a_getter() -> None:
    """Prefix-cache calls that raise (a bad pin id, a clock going back) against getters."""
    run_pattern("""
        pool = kv.BlockPool(64, 16, prefix_caching=True)
        pool.set_clock(10)
        a = loop(lambda: pool.unpin(12345), ValueError)
        b = loop(lambda: pool.set_clock(1), ValueError)
        c = loop(lambda: (pool.num_free_blocks, pool.cache_stats(), pool.drain_events()))
        run_all([a, b, c])
    """)


KV_WRITERS = {
    "copy_blocks": "cache.copy_blocks([[1, 2]])",
    "write": "cache.write(0, kw, kw, [3, 4])",
    "num_blocks": "cache.num_blocks",
    "key": "cache.key(0)",
}


@pytest.mark.parametrize("third", sorted(KV_WRITERS))
def test_decode_attention_against_writers_and_getters(third: str) -> None:
    """Two threads run ``decode_attention``; a third writes the cache or reads it."""
    run_pattern(f"""
        cache = kv.KvCache(1, 8, 16, 2, 64)
        rng = np.random.default_rng(0)
        kw = rng.standard_normal((2, 2, 64)).astype(np.float32)
        cache.write(0, rng.standard_normal((128, 2, 64)).astype(np.float32),
                    rng.standard_normal((128, 2, 64)).astype(np.float32), np.arange(128))
        q = rng.standard_normal((4, 4, 64)).astype(np.float32)
        tables = np.array([[0, 1, 2, 3], [4, 5, 6, 7], [0, 2, 4, 6], [1, 3, 5, 7]])
        lens = [64, 50, 33, 1]
        attend = lambda: kv.decode_attention(cache, 0, q, tables, lens)
        run_all([loop(attend), loop(attend), loop(lambda: {KV_WRITERS[third]})])
    """)


@pytest.mark.parametrize("threads", [1, 2])
def test_attention_calls_from_many_threads_give_the_results_of_one(threads: int) -> None:
    """With a one-thread pool a decode or prefill call runs on its caller's thread (no
    hand-over to the pool); with two, on the pool. Either way, three Python threads
    calling decode (one sequence: one work item, also run on the caller) and prefill at
    once get exactly the results of one thread calling alone."""
    run_pattern(f"""
        kv.set_num_threads({threads})
        cache = kv.KvCache(1, 8, 16, 2, 64, "int8")
        rng = np.random.default_rng(1)
        cache.write(0, rng.standard_normal((128, 2, 64)).astype(np.float32),
                    rng.standard_normal((128, 2, 64)).astype(np.float32), np.arange(128))
        q = rng.standard_normal((4, 4, 64)).astype(np.float32)
        tables = np.array([[0, 1, 2, 3], [4, 5, 6, 7], [0, 2, 4, 6], [1, 3, 5, 7]])
        lens = np.array([64, 50, 33, 1])
        qp = rng.standard_normal((10, 4, 64)).astype(np.float32)
        indptr = np.array([0, 4, 10])
        calls = [
            lambda: kv.decode_attention(cache, 0, q, tables, lens),
            lambda: kv.decode_attention(cache, 0, q[:1], tables[:1], lens[:1]),
            lambda: kv.prefill_attention(cache, 0, qp, indptr, tables[:2], lens[:2]),
        ]
        want = [c() for c in calls]

        def check(i):
            def f():
                got = calls[i]()
                if not np.array_equal(got, want[i]):
                    errors.append(f"call {{i}} differs")
            return f
        run_all([loop(check(i)) for i in range(3)])
    """)


def test_decode_attention_errors_against_a_writer() -> None:
    """Calls that fail after the tables are checked, against a writer thread."""
    run_pattern("""
        cache = kv.KvCache(1, 8, 16, 2, 64)
        q = np.zeros((1, 4, 64), np.float32)
        bad = lambda: kv.decode_attention(cache, 0, q, [[0, 9]], [20])
        run_all([loop(bad, ValueError), loop(bad, ValueError), loop(lambda: cache.copy_blocks([[1, 2]]))])
    """)


HYBRID_CALLS = {
    # Each raises in a loop (an exception built after the pool lock is dropped) or, for the
    # big step, releases the GIL (more than 4,096 tokens x groups of work).
    "unknown": "pool.block_table(7, group=1)",
    "group": "pool.stored_ranges(1, group=9)",
    "exhausted": "pool.add_sequence(5, 10_000)",
    "truncate": "pool.truncate(1, 40)",
    "big_step": "(pool.add_sequence(6, 5000), pool.free(6))",
}


@pytest.mark.parametrize("call", sorted(HYBRID_CALLS))
def test_hybrid_pool_error_paths_and_big_calls_against_stepping_and_getters(call: str) -> None:
    """Thread A runs a BlockPool call that raises or detaches; B decodes and frees
    sequences of a Gemma-like pool; C reads getters, tables and statistics."""
    run_pattern(f"""
        pool = kv.BlockPool(4096, 4, [kv.FullAttention(), kv.SlidingWindow(8, sink_tokens=2)])
        pool.add_sequence(1, 40)
        pool.append(1, 2)
        def decode():
            pool.add_sequence(2, 9)
            pool.fork(1, 3)
            for _ in range(20):
                pool.step([3, 2])
            pool.truncate(3, 1)
            pool.free_batch([2, 3])
        a = loop(lambda: {HYBRID_CALLS[call]}, KeyError, ValueError, MemoryError)
        b = loop(decode)
        c = loop(lambda: (pool.num_free_blocks, pool.block_tables([1], group=1), pool.flashinfer_tables([1], group=1),
                          pool.stats(), len(pool), 1 in pool))
        run_all([a, b, c])
        pool.check_invariants()
    """)


@pytest.mark.parametrize("disk", [False, True])
def test_tier_copies_against_cache_readers_and_writers(disk: bool, tmp_path: object) -> None:
    """A pool with tier storage: thread A admits and frees prompts that evict one another
    (moves and loads after every call, the cache's write lock taken for each batch);
    B reads the cache (views, dequantized copies, wait_tiers); C writes it. The pool
    lock, the storage lock and the cache lock are taken in one order; the readers wait
    for the fence under the cache lock."""
    disk_args = "disk_blocks=64" if disk else "disk_blocks=None"
    attach = f"disk_dir={str(tmp_path)!r} + '/tier', model_id='m', fsync=False" if disk else ""
    run_pattern(f"""
        pool = kv.BlockPool(32, 4, prefix_caching=True, host_blocks=8, {disk_args})
        cache = kv.KvCache(2, 32, 4, 2, 8)
        pool.attach_tier_storage(cache, {attach})
        lock = threading.Lock()
        state = {{"i": 0}}
        def churn():
            with lock:
                i = state["i"] = state["i"] + 1
            p = np.arange(i % 7 * 100, i % 7 * 100 + 4 * 4 + 1, dtype=np.uint32)
            pool.add_sequence_tokens(10_000 + i, p)
            pool.free(10_000 + i)
        x = np.ones((4, 2, 8), np.float32)
        threads = [
            loop(churn, kv.PoolExhaustedError, kv.DuplicateSequenceError),
            loop(lambda: (np.asarray(cache.key(0, writable=False)).sum(), pool.wait_tiers(disk_writes=False))),
            loop(lambda: cache.write(1, x, x, np.arange(4))),
            loop(lambda: pool.tier_transfer_stats()),
        ]
        run_all(threads)
    """)
