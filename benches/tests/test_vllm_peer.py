"""The vllm engine of the scheduler-loop benchmarks (no timing).

The adapter (``benches/vllm_peer.py``) runs in CI on a fake manager that checks vLLM's
calling contract (slots allocated once per computed token, a request's computed tokens
never ahead of its tokens, nothing freed twice), and must reproduce pykvpool's loop
exactly; with vLLM importable, the real ``KVCacheManager`` does the same, with prefix
caching on too. vLLM is not installed by ``tests/run.sh``: those tests are skipped then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pykvpool
from pykvpool.simulate.reference import LoopWorkload, make_workload, run_loop
from benches.vllm_bench import check_used_blocks
from benches.vllm_peer import INSTALL, Tokens, VllmApi, VllmLoop, VllmPool, try_load_api

WAITING, RUNNING, PREEMPTED = "waiting", "running", "preempted"


class FakeRequest:
    def __init__(self, rid: int, prompt: list[int]) -> None:
        self.request_id = str(rid)
        self.all_token_ids = list(prompt)
        self.num_computed_tokens = 0
        self.status = WAITING

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_output_token_ids(self, token: int) -> None:
        self.all_token_ids.append(token)


class FakeBlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.free = num_blocks

    def get_num_free_blocks(self) -> int:
        return self.free


class FakeManager:
    """vLLM's manager contract with caching off: blocks per request = ceil(slots / size)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_pool = FakeBlockPool(num_blocks)
        self.block_size = block_size
        self.slots: dict[str, int] = {}
        self.calls = {"get_computed_blocks": 0, "allocate_slots": 0, "free": 0}

    def get_computed_blocks(self, req: FakeRequest, max_hit: int | None = None) -> tuple[tuple[()], int, int]:
        self.calls["get_computed_blocks"] += 1
        assert req.status in (WAITING, PREEMPTED) and req.num_computed_tokens == 0
        assert max_hit is None or 0 <= max_hit < req.num_tokens
        return (), 0, 0

    def allocate_slots(self, req: FakeRequest, num_new: int, num_hit: int = 0, blocks: Any = None) -> Any:
        self.calls["allocate_slots"] += 1
        assert num_new > 0 and num_hit == 0
        held = self.slots.get(req.request_id, 0)
        # Slots are allocated once per computed token: never twice for the same token.
        assert held == req.num_computed_tokens, (req.request_id, held, req.num_computed_tokens)
        assert held + num_new <= req.num_tokens, "slots for a token the request does not have"
        bs = self.block_size
        need = -(-(held + num_new) // bs) - -(-held // bs)
        if need > self.block_pool.free:
            return None
        self.block_pool.free -= need
        self.slots[req.request_id] = held + num_new
        return [need]

    def free(self, req: FakeRequest) -> None:
        self.calls["free"] += 1
        held = self.slots.pop(req.request_id)
        self.block_pool.free += -(-held // self.block_size)


def fake_api(managers: list[FakeManager]) -> VllmApi:
    def make_manager(num_blocks: int, block_size: int, hash_name: str | None) -> FakeManager:
        assert hash_name is None
        managers.append(FakeManager(num_blocks, block_size))
        return managers[-1]

    return VllmApi("fake", make_manager, lambda rid, prompt, h: FakeRequest(rid, prompt), RUNNING, PREEMPTED)


def small(num_requests: int, num_blocks: int, max_running: int, seed: int) -> LoopWorkload:
    return make_workload(num_requests, seed, prompt_range=(5, 200), output_range=(1, 60), block_size=8,
                         num_blocks=num_blocks, max_running=max_running)


def lengths_observer(log: list[tuple[str, int, list[int]]]) -> Any:
    def observe(kind: str, step: int, ids: Any, slots: Any, lens: Any) -> None:
        log.append((kind, step, [int(x) for x in ids]))
    return observe


@pytest.mark.parametrize("seed", range(4))
def test_adapter_on_a_fake_manager_reproduces_pykvpool_loop(seed: int) -> None:
    """Under memory pressure (preemptions, steps that fail midway and resume), the adapter
    takes the same steps, preempts the same requests and frees everything."""
    wl = small(40, 60, 6, seed)
    ref_log: list[Any] = []
    ref = run_loop(pykvpool.BlockPool(wl.num_blocks, wl.block_size), wl, lengths_observer(ref_log))
    managers: list[FakeManager] = []
    pool = VllmPool(fake_api(managers), wl.num_blocks, wl.block_size)
    log: list[Any] = []
    res = VllmLoop(pool, wl, lengths_observer(log)).run()
    assert ref.preemptions > 0
    assert res.counts() == ref.counts()
    assert res.generated == ref.generated
    assert log == ref_log
    pool.check_invariants()
    (mgr,) = managers
    assert mgr.slots == {}
    # One allocate_slots per decode token, per admission and per refused decode or admission.
    assert mgr.calls["allocate_slots"] == (res.decode_tokens + res.admissions + res.admissions_refused
                                           + res.decode_refused.calls)
    assert mgr.calls["free"] == res.free.calls == wl.num_requests + res.preemptions
    assert pool.request_init.calls == wl.num_requests
    # Blocks in use equal pykvpool's after every admission, decode and finish.
    assert check_used_blocks(fake_api([]), wl) == sum(1 for e in log if e[0] != "preempt")


class LeakyManager(FakeManager):
    """Keeps one block of the 5th request admitted after that request is freed."""

    def free(self, req: FakeRequest) -> None:
        super().free(req)
        if req.request_id == "4" and not getattr(self, "leaked", False):
            self.leaked = True
            self.block_pool.free -= 1


def test_used_blocks_check_sees_a_manager_holding_one_block_too_many() -> None:
    wl = small(40, 60, 6, 0)
    base = fake_api([])
    leaky = VllmApi("leaky", lambda nb, bs, h: LeakyManager(nb, bs), base.make_request, RUNNING, PREEMPTED)
    with pytest.raises(AssertionError, match="blocks in use differ"):
        check_used_blocks(leaky, wl)


def test_adapter_step_resumes_after_a_failure_without_reallocating() -> None:
    """A decode that fails at request i keeps requests 0..i-1's slot (vLLM cannot undo it);
    after the newest request is freed the retry allocates only from request i on."""
    managers: list[FakeManager] = []
    pool = VllmPool(fake_api(managers), 4, 4)
    for rid, n in enumerate((3, 4, 8)):  # 1, 1 and 2 blocks: the pool is full
        pool.prepare(rid, n)
        assert pool.add_sequence(rid, n) is not None
        pool.settle("admit", [rid])
    assert pool.num_free_blocks == 0
    with pytest.raises(pykvpool.PoolExhaustedError):
        pool.step([0, 1, 2], 1)  # request 0 fits its block, request 1 needs a new one
    assert managers[0].slots == {"0": 4, "1": 4, "2": 8}
    pool.free(2)
    pool.settle("preempt", [2])
    out, _, _ = pool.step([0, 1], 1)  # request 0 is not allocated again (the fake asserts it)
    assert len(out) == 1 and pool.num_free_blocks == 1
    pool.settle("decode", [0, 1])
    assert [pool.requests[r].num_computed_tokens for r in (0, 1, 2)] == [4, 5, 0]
    assert pool.requests[2].status == PREEMPTED and pool.requests[2].num_tokens == 9
    with pytest.raises(ValueError):
        pool.step([0], 2)


def test_tokens_pad_past_a_request_end() -> None:
    t = Tokens(np.arange(10, dtype=np.int32), [0, 4, 10])
    assert t.ids(0, 2, 6) == [2, 3, 0, 0]
    assert t.ids(1, 0, 3) == [4, 5, 6]
    assert Tokens().ids(5, 3, 6) == [0, 0, 0]


def test_scheduler_bench_without_vllm_says_how_to_install(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benches import bench_scheduler

    out = tmp_path / "s.json"
    assert bench_scheduler.main(["--requests", "40", "--repeats", "1", "--micro-reps", "5", "--no-vllm",
                                 "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["vllm"] == {"skipped": "--no-vllm given"}
    assert "vllm" not in rep["loop"]
    assert "vllm engine skipped" in capsys.readouterr().err
    assert "pip install --no-deps vllm" in INSTALL


def sim_run(wl: LoopWorkload) -> Any:
    """The simulator's vllm-convention run of ``wl`` (the configuration bench_simulator uses)."""
    from pykvpool import simulate as sim

    n = wl.num_requests
    w = sim.Workload(arrival=np.zeros(n), prompt_len=wl.prompt_lens, output_len=wl.output_lens)
    sched = sim.SchedulerConfig(max_running=wl.max_running, max_batched_tokens=None, chunked_prefill=False)
    return sim.run(w, sim.SimConfig(num_blocks=wl.num_blocks, block_size=wl.block_size, scheduler=sched))


@pytest.mark.parametrize("seed", range(3))
def test_vllm_convention_loop_on_a_fake_manager_schedules_as_the_simulator(seed: int) -> None:
    """benches/vllm_sim.py's loop, on the fake manager: the simulator's schedule step by step
    (batch, preemptions, prefill and decode tokens, blocks used), under preemptions."""
    from benches import vllm_sim

    wl = small(40, 60, 6, seed)
    managers: list[FakeManager] = []
    res = vllm_sim.run(fake_api(managers), wl)
    r = sim_run(wl)
    assert res.preemptions == r.summary["preemptions"] > 0
    assert res.steps == r.summary["steps"]
    assert vllm_sim.same_schedule(r.steps, res)
    # Every step that completes a prefill samples a token, recomputes included.
    assert sum(res.columns["decode_tokens"]) + res.admissions == int(wl.output_lens.sum())
    assert managers[0].slots == {}
    # A schedule that differs by one step is seen.
    res.columns["blocks_used"][len(res.columns["blocks_used"]) // 2] += 1
    assert not vllm_sim.same_schedule(r.steps, res)


def test_simulator_bench_without_vllm_skips_the_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benches import bench_simulator

    out = tmp_path / "sim.json"
    assert bench_simulator.main(["--requests", "50", "--repeats", "1", "--no-traces", "--no-vllm",
                                 "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["vllm"] == "--no-vllm given"
    assert not any("KVCacheManager" in r["case"] for r in rep["rows"])
    assert "vLLM manager loop skipped" in capsys.readouterr().err


@pytest.fixture(scope="module")
def vllm_api() -> VllmApi:
    api, why = try_load_api()
    if api is None:
        pytest.skip(why)
    return api


def test_vllm_manager_reproduces_pykvpool_loop(vllm_api: VllmApi) -> None:
    from benches.vllm_bench import run_vllm

    for seed in range(2):
        wl = small(40, 60, 6, seed)
        ref = run_loop(pykvpool.BlockPool(wl.num_blocks, wl.block_size), wl)
        res, pool = run_vllm(vllm_api, wl)
        assert ref.preemptions > 0
        assert res.counts() == ref.counts() and res.generated == ref.generated
        assert pool.num_free_blocks == wl.num_blocks


def test_scheduler_bench_vllm_engine_tiny_run(vllm_api: VllmApi, tmp_path: Path) -> None:
    """The bench end to end with the vllm engine: counts asserted equal inside, and with
    prefix caching on the hit tokens equal pykvpool's (asserted inside too)."""
    import math

    from benches import bench_scheduler

    out = tmp_path / "s.json"
    argv = ["--requests", "60", "--repeats", "2", "--vllm-repeats", "2", "--micro-reps", "5", "--check-slots",
            "--prefix-requests", "40", "--vllm-hashes", "sha256,xxhash", "--out", str(out)]
    assert bench_scheduler.main(argv) == 0
    rep = json.loads(out.read_text())
    v = rep["vllm"]
    assert v["version"] == vllm_api.version and v["runs"] == 2
    assert set(rep["loop"]) == {"pykvpool", "python", "python+np", "vllm"}
    for s in v["ratio_over_pykvpool"].values():
        assert s["runs"] == 2 and all(math.isfinite(s[k]) and s[k] > 0 for k in ("q1", "median", "q3"))
    pre = v["prefix"]
    assert pre["hit_tokens"] > 0
    assert v["blocks_in_use_checked_events"] > 0
    assert set(pre["blocks_in_use_checked_events"]) == {"sha256", "xxhash"}
    assert set(pre["ratio_over_pykvpool"]) == {"vllm+sha256", "vllm+xxhash"}


def test_vllm_convention_loop_on_vllm_schedules_as_the_simulator(vllm_api: VllmApi, tmp_path: Path) -> None:
    from benches import bench_simulator, vllm_sim

    wl = small(40, 60, 6, 0)
    res = vllm_sim.run(vllm_api, wl)
    assert res.preemptions > 0 and vllm_sim.same_schedule(sim_run(wl).steps, res)
    out = tmp_path / "sim.json"
    argv = ["--requests", "60", "--repeats", "1", "--no-traces", "--vllm-rounds", "2", "--out", str(out)]
    assert bench_simulator.main(argv) == 0
    (row,) = [r for r in json.loads(out.read_text())["rows"] if "KVCacheManager" in r["case"]]
    assert row["rounds"] == 2 and row["ratio_vs_engine_vllm"] > 0
