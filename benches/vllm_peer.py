"""vLLM's own v1 KV-cache manager as a peer engine of the scheduler-loop benchmarks.

The ``vllm`` package is not installed by ``tests/run.sh`` (it is large and needs none of
its GPU runtime here); :data:`INSTALL` says how to install it without that runtime. Nothing
of vLLM is vendored: it is imported at run time only, by :func:`load_api`, and every bench
skips the engine with :data:`INSTALL` as its message when the import fails. No shim is
needed: with the pure-Python packages of :data:`INSTALL`, ``vllm.v1.core.kv_cache_manager``
imports on a CPU-only machine (vLLM 0.33.0, the newest on PyPI when this was written).

What is driven, and how (:class:`VllmPool`, :class:`VllmLoop`):

- one ``KVCacheManager`` (``vllm/v1/core/kv_cache_manager.py``) with its ``BlockPool``, one
  full-attention group, ``num_blocks + 1`` blocks (vLLM keeps block 0 as its null block, so
  both engines have ``num_blocks`` usable ones), watermark 0, prefix caching off or on
  with one of vLLM's block-hash functions (``sha256``, ``sha256_cbor``, ``xxhash``,
  ``xxhash_cbor``);
- **admission**: ``get_computed_blocks(request, num_tokens - 1)`` then
  ``allocate_slots(request, num_tokens - hit, hit, blocks)``, as vLLM's scheduler does
  for a waiting request (``None`` = does not fit, nothing changed). The scheduler's
  ``full_sequence_must_fit`` gate is left off: without chunked prefill the allocation is
  already the whole sequence;
- **decode**: one ``allocate_slots(request, 1)`` per running request, in running order,
  as vLLM's scheduler loops over ``self.running``. vLLM cannot undo the allocations made
  before a failure, and neither does this adapter: when request ``i`` does not fit,
  :meth:`VllmPool.step` raises ``PoolExhaustedError`` keeping requests ``0..i-1``'s new
  slots, the loop preempts the newest request and retries, and the adapter resumes at
  request ``i``: vLLM's own preempt-and-retry, which preempts the same requests as an
  atomic step (the loop's rule, shown in the module doc of :mod:`pykvpool.simulate.reference`);
- **free**: ``free(request)`` on a finish or a preemption.

Conventions. The loop's (``decode_first``): a sequence of ``L`` tokens holds
``ceil(L / block_size)`` blocks, and each decode call adds one token's slot. A vLLM
request carries one token more than it has computed (the sampled token the next decode
computes), so here ``request.num_computed_tokens == L`` and ``request.num_tokens == L + 1``
between calls, and an admission of ``t`` tokens allocates exactly ``t`` slots.

What is timed. The loop's timers cover the manager calls above and this adapter's loop
over the batch (vLLM's scheduler runs the same Python loop). The rest is bookkeeping a
vLLM engine does outside its manager, run by :meth:`VllmLoop.before_admit` and
:meth:`VllmLoop.settle` outside the timers and timed apart in :attr:`VllmPool.bookkeeping`:
building the ``Request`` at its first admission (vLLM builds it on arrival; with caching on
this hashes the prompt's full blocks), ``num_computed_tokens`` and ``status`` updates, and
``append_output_token_ids`` after each decode (hashing each block that fills).
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pykvpool.simulate.reference import CallTimes, LoopWorkload, Observer, SchedulerLoop
from pykvpool import PoolExhaustedError

#: vLLM's version this adapter was written against; newer ones are tried as they come.
TESTED_VERSION = "0.33.0"
#: Pure-Python packages that ``vllm.v1.core.kv_cache_manager``'s import chain needs
#: (torch, transformers and numpy come from the ``torch``/``hf`` extras).
VLLM_DEPS = (
    "psutil pyzmq urllib3 msgspec cbor2 aiohttp requests openai openai-harmony pybase64 "
    "cachetools cloudpickle uvloop py-cpuinfo prometheus_client xgrammar fastapi "
    "partial_json_parser llguidance xxhash"
)
INSTALL = (
    f"vLLM is not importable here; to add the `vllm` engine: pip install --no-deps vllm=={TESTED_VERSION} "
    f"&& pip install {VLLM_DEPS}"
)
HASHES = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


class VllmUnavailable(RuntimeError):
    """vLLM (or a package its manager imports) is missing; the message says how to install it."""


@dataclass(frozen=True)
class VllmApi:
    """What the adapter needs from vLLM, so that a test can hand it a fake.

    ``make_manager(num_blocks, block_size, hash_name)`` returns a fresh manager with
    ``num_blocks`` usable blocks (``hash_name`` None: caching off);
    ``make_request(rid, prompt_ids, hash_name)`` returns a request in vLLM's ``WAITING``.
    """

    version: str
    make_manager: Callable[[int, int, str | None], Any]
    make_request: Callable[[int, list[int], str | None], Any]
    running: Any
    preempted: Any


def load_api(max_model_len: int = 1 << 20) -> VllmApi:
    """Import vLLM's manager, request and hashing (slow: torch comes with them).

    Raises:
        VllmUnavailable: an import failed (the message carries :data:`INSTALL`).
    """
    try:
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.request import Request, RequestStatus
    except ImportError as e:
        raise VllmUnavailable(f"{INSTALL} ({e})") from e

    hashers: dict[str, Any] = {}
    params = SamplingParams(max_tokens=1)

    def make_manager(num_blocks: int, block_size: int, hash_name: str | None) -> Any:
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
        cfg = KVCacheConfig(num_blocks=num_blocks + 1, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
        if hash_name is not None:
            fn = get_hash_fn_by_name(hash_name)
            kv_cache_utils.init_none_hash(fn)
            hashers[hash_name] = kv_cache_utils.get_request_block_hasher(block_size, fn)
        return KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=block_size,
                              hash_block_size=block_size, enable_caching=hash_name is not None)

    def make_request(rid: int, prompt: list[int], hash_name: str | None) -> Any:
        hasher = None if hash_name is None else hashers[hash_name]
        return Request(str(rid), prompt, params, None, arrival_time=0.0, block_hasher=hasher)

    return VllmApi(importlib.metadata.version("vllm"), make_manager, make_request,
                   RequestStatus.RUNNING, RequestStatus.PREEMPTED)


def try_load_api() -> tuple[VllmApi | None, str]:
    """:func:`load_api`, or ``(None, reason)`` when vLLM cannot be imported."""
    try:
        api = load_api()
    except VllmUnavailable as e:
        return None, str(e)
    return api, f"vllm {api.version}"


@dataclass
class Tokens:
    """Token ids of every request, flattened (``flat[offsets[i]:offsets[i+1]]`` is request
    ``i``'s prompt then its generated tokens), or None for all-zero ids (caching off: ids
    are never read)."""

    flat: npt.NDArray[np.int32] | None = None
    offsets: list[int] = field(default_factory=list)

    def ids(self, rid: int, start: int, stop: int) -> list[int]:
        if self.flat is None:
            return [0] * (stop - start)
        off = self.offsets[rid]
        end = min(off + stop, self.offsets[rid + 1])
        head: list[int] = self.flat[off + start : end].tolist()
        return head + [0] * (off + stop - end)


class VllmPool:
    """The loop's pool interface (``add_sequence``, ``step``, ``free``, ``num_free_blocks``)
    over a vLLM ``KVCacheManager``; see the module doc for the calls and conventions.

    Counts: :attr:`hit_tokens`, the prefix-cache hits summed over successful admissions
    (pykvpool's ``cache_stats().hit_tokens``), :attr:`admit_queries` the admission attempts
    that reached the manager.
    """

    def __init__(self, api: VllmApi, num_blocks: int, block_size: int, hash_name: str | None = None,
                 tokens: Tokens | None = None) -> None:
        self.api = api
        self.manager = api.make_manager(num_blocks, block_size, hash_name)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_name = hash_name
        self.tokens = tokens or Tokens()
        self.requests: dict[int, Any] = {}
        self._get_free = self.manager.block_pool.get_num_free_blocks
        self._resume = 0  # requests of the current batch already given their slot
        self._admitting: tuple[int, int] = (-1, 0)
        self.hit_tokens = 0
        self.admit_queries = 0
        self.bookkeeping = CallTimes()
        self.request_init = CallTimes()

    @property
    def num_free_blocks(self) -> int:
        return int(self._get_free())

    # ---- timed by the loop: the manager's calls -------------------------------------
    def add_sequence(self, seq_id: int, prompt_len: int = 0) -> Any:
        """Admit request ``seq_id`` with ``prompt_len`` tokens computed now (its prompt plus,
        after a preemption, its generated tokens); the new blocks, or None when they do
        not fit."""
        rid, num_tokens = seq_id, prompt_len
        req = self.requests[rid]
        mgr = self.manager
        self.admit_queries += 1
        blocks, hit, _ = mgr.get_computed_blocks(req, num_tokens - 1)
        new = mgr.allocate_slots(req, num_tokens - hit, hit, blocks)
        if new is None:
            return None
        self.hit_tokens += hit
        self._admitting = (rid, num_tokens)
        return new

    def step(self, seq_ids: Sequence[int], num_tokens: int = 1) -> tuple[list[Any], None, None]:
        """One decode token per request, ``allocate_slots(request, 1)`` in batch order.

        Raises:
            PoolExhaustedError: a request does not fit; the requests before it keep their
                slot and the next call (on the batch without its newest requests) resumes
                at that request.
            ValueError: ``num_tokens`` is not 1.
        """
        if num_tokens != 1:
            raise ValueError(f"num_tokens must be 1 (a decode step), got {num_tokens}")
        reqs, alloc = self.requests, self.manager.allocate_slots
        out = []
        i = self._resume
        n = len(seq_ids)
        while i < n:
            blocks = alloc(reqs[seq_ids[i]], 1)
            if blocks is None:
                self._resume = i
                raise PoolExhaustedError(f"request {seq_ids[i]} does not fit")
            out.append(blocks)
            i += 1
        self._resume = 0
        return out, None, None

    def free(self, rid: int) -> None:
        self.manager.free(self.requests[rid])

    # ---- untimed bookkeeping (a vLLM engine does it outside its manager) --------------
    def prepare(self, rid: int, num_tokens: int) -> None:
        """Build ``rid``'s request at its first admission attempt (hashes its prompt with
        caching on)."""
        if rid in self.requests:
            return
        t0 = time.perf_counter_ns()
        self.requests[rid] = self.api.make_request(rid, self.tokens.ids(rid, 0, num_tokens), self.hash_name)
        self.request_init.add(time.perf_counter_ns() - t0)

    def settle(self, kind: str, seq_ids: Sequence[int]) -> None:
        """Update the requests after an event, as vLLM's scheduler and engine do."""
        t0 = time.perf_counter_ns()
        reqs, ids = self.requests, self.tokens.ids
        if kind == "decode":
            for rid in seq_ids:
                req = reqs[rid]
                req.num_computed_tokens += 1
                n = req.num_tokens
                req.append_output_token_ids(ids(rid, n, n + 1)[0])
        elif kind == "admit":
            (rid,) = seq_ids
            req = reqs[rid]
            assert self._admitting[0] == rid
            t = self._admitting[1]
            req.status = self.api.running
            req.num_computed_tokens = t
            if req.num_tokens == t:  # a first admission: the token its prefill samples
                req.append_output_token_ids(ids(rid, t, t + 1)[0])
        elif kind == "preempt":
            (rid,) = seq_ids
            reqs[rid].status = self.api.preempted
            reqs[rid].num_computed_tokens = 0
        elif kind == "finish":
            for rid in seq_ids:
                del reqs[rid]
        self.bookkeeping.add(time.perf_counter_ns() - t0)

    def check_invariants(self) -> None:
        """Every block back in the pool and no request left (after a whole loop)."""
        if self.num_free_blocks != self.num_blocks or self.requests:
            raise AssertionError(f"vllm: {self.num_free_blocks} of {self.num_blocks} blocks free, "
                                 f"{len(self.requests)} requests left")


class VllmLoop(SchedulerLoop):
    """The benchmark loop over a :class:`VllmPool`: admission is the manager's (its own fit
    check), the request bookkeeping runs outside the timers."""

    bookkeeping = True

    def __init__(self, pool: VllmPool, workload: LoopWorkload, observer: Observer | None = None) -> None:
        super().__init__(pool, workload, observer)
        self.vpool = pool

    def admit(self, rid: int, num_tokens: int) -> Any:
        return self.vpool.add_sequence(rid, num_tokens)

    def before_admit(self, rid: int, num_tokens: int) -> None:
        self.vpool.prepare(rid, num_tokens)

    def settle(self, kind: str, seq_ids: Sequence[int]) -> None:
        self.vpool.settle(kind, seq_ids)
