"""Bad input to the serving simulator: every out-of-range argument of
``synthesize_workload`` / ``run_simulation`` and of ``pykvpool.simulate``'s public
functions raises ``InvalidArgumentError`` naming the argument (``TypeError`` only for a
value of a wholly different type where a flag or a name is meant), never
``OverflowError``, a Rust panic, a raw numpy error or ``InvariantError``. The reproducers
that used to abort the process run in a subprocess with a timeout."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from typing import Any, Callable

import numpy as np
import pytest

import pykvpool
from pykvpool import _native
from pykvpool import simulate as sim

MAX_REQ = sim.MAX_REQUESTS
MAX_TOK = sim.MAX_REQUEST_TOKENS
NAN, INF = math.nan, math.inf


def raises_naming(fn: Callable[[], object], name: str, type_error_ok: bool = False) -> None:
    """``fn()`` raises InvalidArgumentError (or TypeError when allowed) naming ``name``."""
    allowed: tuple[type[BaseException], ...] = (pykvpool.InvalidArgumentError,)
    if type_error_ok:
        allowed += (TypeError,)
    try:
        fn()
    except allowed as e:
        if isinstance(e, pykvpool.InvalidArgumentError):
            assert name in str(e), f"{name!r} not named in: {e}"
        return
    except BaseException as e:  # noqa: BLE001 - the point is to see which one it is
        pytest.fail(f"raised {type(e).__name__}: {e}")
    pytest.fail("did not raise")


# ---- synthesize_workload / synthetic_workload -------------------------------------------

SYNTH: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("seed -1", (5,), dict(seed=-1), "seed"),
    ("seed 2**64", (5,), dict(seed=2**64), "seed"),
    ("seed bool", (5,), dict(seed=True), "seed"),
    ("seed float", (5,), dict(seed=1.5), "seed"),
    ("num_requests -1", (-1,), {}, "num_requests"),
    ("num_requests bool", (True,), {}, "num_requests"),
    ("num_requests float", (3.0,), {}, "num_requests"),
    ("num_requests 2**64", (2**64,), {}, "num_requests"),
    ("num_requests over the limit", (MAX_REQ + 1,), {}, "num_requests"),
    ("num_requests 2**62", (2**62,), {}, "num_requests"),
    ("rate 0", (5,), dict(rate=0.0), "rate"),
    ("rate -1", (5,), dict(rate=-1.0), "rate"),
    ("rate nan", (5,), dict(rate=NAN), "rate"),
    ("rate inf", (5,), dict(rate=INF), "rate"),
    ("rate bool", (5,), dict(rate=True), "rate"),
    ("rate string", (5,), dict(rate="fast"), "rate"),
    ("rate 10**400", (5,), dict(rate=10**400), "rate"),
    ("rate tiny", (1000,), dict(rate=1e-320), "rate"),
    ("cv nan", (5,), dict(arrivals="gamma", cv=NAN), "cv"),
    ("cv 0", (5,), dict(arrivals="gamma", cv=0.0), "cv"),
    ("arrivals", (5,), dict(arrivals="zipf"), "arrivals"),
    ("prompt kind", (5,), dict(prompt=("zipf", [1.0])), "prompt"),
    ("prompt too few", (5,), dict(prompt=("uniform", [1])), "prompt"),
    ("prompt too many", (5,), dict(prompt=("fixed", [1, 2])), "prompt"),
    ("prompt empty range", (5,), dict(prompt=("uniform", [5, 1])), "prompt"),
    ("prompt negative", (5,), dict(prompt=("fixed", [-1])), "prompt"),
    ("prompt nan", (5,), dict(prompt=("fixed", [NAN])), "prompt"),
    ("prompt 2**40", (5,), dict(prompt=("fixed", [2**40])), "prompt"),
    ("prompt bool", (5,), dict(prompt=("uniform", [True, 5])), "prompt"),
    ("prompt ragged", (5,), dict(prompt=("uniform", [[1], [2]])), "prompt"),
    ("prompt string", (5,), dict(prompt="uniform"), "prompt"),
    ("prompt lognormal median 0", (5,), dict(prompt=("lognormal", [0, 1])), "prompt"),
    ("prompt lognormal sigma nan", (5,), dict(prompt=("lognormal", [100, NAN])), "prompt"),
    ("prompt lognormal sigma < 0", (5,), dict(prompt=("lognormal", [100, -1])), "prompt"),
    ("prompt pareto shape 0", (5,), dict(prompt=("pareto", [10, 0])), "prompt"),
    ("prompt empirical empty", (5,), dict(prompt=("empirical", [])), "prompt"),
    ("output kind", (5,), dict(output=("zipf", [1.0])), "output"),
    ("output inf", (5,), dict(output=("pareto", [INF, 1.0])), "output"),
    ("prompt_clamp min 0", (5,), dict(prompt_clamp=(0, 10)), "prompt_clamp"),
    ("prompt_clamp min > max", (5,), dict(prompt_clamp=(10, 5)), "prompt_clamp"),
    ("prompt_clamp above the limit", (5,), dict(prompt_clamp=(1, MAX_TOK + 1)), "prompt_clamp"),
    ("prompt_clamp 2**64", (5,), dict(prompt_clamp=(1, 2**64)), "prompt_clamp"),
    ("prompt_clamp -1", (5,), dict(prompt_clamp=(-1, 5)), "prompt_clamp"),
    ("prompt_clamp bool", (5,), dict(prompt_clamp=(True, 5)), "prompt_clamp"),
    ("prompt_clamp 3 items", (5,), dict(prompt_clamp=(1, 2, 3)), "prompt_clamp"),
    ("output_clamp 2**40", (5,), dict(output_clamp=(1, 2**40)), "output_clamp"),
    ("priority_levels -1", (5,), dict(priority_levels=-1), "priority_levels"),
    ("priority_levels 2**32", (5,), dict(priority_levels=2**32), "priority_levels"),
    ("priority_levels bool", (5,), dict(priority_levels=True), "priority_levels"),
    ("shared_prefixes 0 prefixes", (5,), dict(shared_prefixes=(0, 10, 10)), "shared_prefixes"),
    ("shared_prefixes vocab 0", (5,), dict(shared_prefixes=(2, 10, 0)), "shared_prefixes"),
    ("shared_prefixes -1", (5,), dict(shared_prefixes=(-1, 1, 1)), "shared_prefixes"),
    ("shared_prefixes 2**40", (5,), dict(shared_prefixes=(2**40, 1, 1)), "shared_prefixes"),
    ("shared_prefixes too many ids", (5,), dict(shared_prefixes=(2**20, 2**24, 10)), "shared_prefixes"),
    ("shared_prefixes 2 items", (5,), dict(shared_prefixes=(2, 10)), "shared_prefixes"),
    ("shared_prefixes string", (5,), dict(shared_prefixes="abc"), "shared_prefixes"),
]


@pytest.mark.parametrize("args,kw,name", [c[1:] for c in SYNTH], ids=[c[0] for c in SYNTH])
def test_synthesize_workload_names_the_bad_argument(args: tuple[Any, ...], kw: dict[str, Any], name: str) -> None:
    raises_naming(lambda: _native.synthesize_workload(*args, **kw), name)
    raises_naming(lambda: sim.synthetic_workload(*args, **kw), name)


# ---- run_simulation / run ---------------------------------------------------------------

Z3 = np.zeros(3)
L3 = np.array([5, 6, 7])


def cols(**kw: Any) -> dict[str, Any]:
    """Workload columns: three small requests, with ``kw`` replacing some."""
    return {"arrival": Z3, "prompt_len": L3, "output_len": L3, **kw}


WORKLOADS: list[tuple[str, dict[str, Any], str]] = [
    ("arrival 2-D", cols(arrival=np.zeros((3, 1))), "arrival"),
    ("arrival ragged", cols(arrival=[[0.0], [1.0, 2.0], [3.0]]), "arrival"),
    ("arrival nan", cols(arrival=np.array([0.0, NAN, 1.0])), "arrival"),
    ("arrival inf", cols(arrival=np.array([0.0, INF, 1.0])), "arrival"),
    ("arrival negative", cols(arrival=np.array([0.0, -1.0, 1.0])), "arrival"),
    ("arrival string", cols(arrival="abc"), "arrival"),
    ("arrival bool dtype", cols(arrival=np.zeros(3, dtype=bool)), "arrival"),
    ("arrival bools", cols(arrival=[False, True, True]), "arrival"),
    ("prompt_len 2-D", cols(prompt_len=np.ones((3, 1), dtype=np.int64)), "prompt_len"),
    ("prompt_len ragged", cols(prompt_len=[[5], [6, 7], [8]]), "prompt_len"),
    ("prompt_len float dtype", cols(prompt_len=np.array([1.5, 2.0, 3.0])), "prompt_len"),
    ("prompt_len bool dtype", cols(prompt_len=np.ones(3, dtype=bool)), "prompt_len"),
    ("prompt_len bools", cols(prompt_len=[True, True, True]), "prompt_len"),
    ("prompt_len 0", cols(prompt_len=np.array([5, 0, 7])), "prompt_len"),
    ("prompt_len -1", cols(prompt_len=np.array([5, -1, 7])), "prompt_len"),
    ("prompt_len 2**32 - 1", cols(prompt_len=np.array([5, 2**32 - 1, 7])), "prompt_len"),
    ("prompt_len above the limit", cols(prompt_len=np.array([5, MAX_TOK + 1, 7])), "prompt_len"),
    ("prompt_len 2**64", cols(prompt_len=[5, 2**64, 7]), "prompt_len"),
    ("output_len 2**32 - 1", cols(output_len=np.array([5, 2**32 - 1, 7])), "output_len"),
    ("output_len 0", cols(output_len=np.array([0, 1, 1])), "output_len"),
    ("output_len uint64 max", cols(output_len=np.array([1, 2**64 - 1, 1], dtype=np.uint64)), "output_len"),
    ("mismatched lengths", cols(prompt_len=L3[:2]), "prompt_len"),
    ("priority 2**31", cols(priority=np.array([0, 2**31, 0])), "priority"),
    ("priority 2-D", cols(priority=np.zeros((3, 2), dtype=np.int64)), "priority"),
    ("token_ids without offsets", cols(token_ids=np.arange(18)), "token_ids"),
    ("token_ids -1", cols(token_ids=np.full(18, -1), token_offsets=np.array([0, 5, 11, 18])), "token_ids"),
    ("token_offsets wrong", cols(token_ids=np.arange(18), token_offsets=np.array([0, 5, 10, 18])), "token_offsets"),
    ("token_offsets short", cols(token_ids=np.arange(18), token_offsets=np.array([0, 18])), "token_offsets"),
    ("token_offsets decreasing", cols(token_ids=np.arange(18), token_offsets=np.array([0, 12, 11, 18])), "token_offsets"),
    ("token_offsets -1", cols(token_ids=np.arange(18), token_offsets=np.array([0, -1, 11, 18])), "token_offsets"),
    ("key_offsets wrong", cols(block_keys=np.arange(3), key_offsets=np.array([0, 1, 3]), tokens_per_key=16), "key_offsets"),
    ("key_offsets miscounted", cols(block_keys=np.arange(3), key_offsets=np.array([0, 1, 2, 3]), tokens_per_key=2),
     "key_offsets"),
    ("tokens_per_key 0", cols(block_keys=np.arange(3), key_offsets=np.array([0, 1, 2, 3])), "tokens_per_key"),
    ("tokens_per_key -1", cols(block_keys=np.arange(3), key_offsets=np.array([0, 1, 2, 3]), tokens_per_key=-1),
     "tokens_per_key"),
    # One rule for block keys, the pool's: a negative key is refused, never wrapped to u64.
    ("block_keys -1", cols(block_keys=np.array([0, -1, 2]), key_offsets=np.array([0, 1, 2, 3]), tokens_per_key=8),
     "block_keys"),
    ("ids and keys mixed", cols(token_ids=np.arange(18), key_offsets=np.array([0, 1, 2, 3])), "token_ids"),
    # Zero-stride views: the limit is checked before anything is copied.
    ("too many requests", cols(arrival=np.broadcast_to(0.0, (MAX_REQ + 1,)),
                               prompt_len=np.broadcast_to(1, (MAX_REQ + 1,)),
                               output_len=np.broadcast_to(1, (MAX_REQ + 1,))), "arrival"),
]


@pytest.mark.parametrize("columns,name", [c[1:] for c in WORKLOADS], ids=[c[0] for c in WORKLOADS])
def test_run_simulation_names_the_bad_column(columns: dict[str, Any], name: str) -> None:
    raises_naming(lambda: _native.run_simulation(dict(columns), {"num_blocks": 100, "block_size": 16}), name)
    raises_naming(lambda: sim.run(sim.Workload(**columns), sim.SimConfig(num_blocks=100)), name)


def sched(**kw: Any) -> dict[str, Any]:
    return {"scheduler": sim.SchedulerConfig(**kw)}


def never_seconds(*shape: int) -> Any:
    return "soon"


CONFIGS: list[tuple[str, dict[str, Any], Any, str]] = [
    ("num_blocks 0", dict(num_blocks=0), 0.0, "num_blocks"),
    ("num_blocks -1", dict(num_blocks=-1), 0.0, "num_blocks"),
    ("num_blocks 2**64", dict(num_blocks=2**64), 0.0, "num_blocks"),
    ("num_blocks over the pool limit", dict(num_blocks=2**31), 0.0, "num_blocks"),
    ("num_blocks bool", dict(num_blocks=True), 0.0, "num_blocks"),
    ("num_blocks float", dict(num_blocks=100.0), 0.0, "num_blocks"),
    ("block_size 0", dict(block_size=0), 0.0, "block_size"),
    ("block_size 2**17", dict(block_size=2**17), 0.0, "block_size"),
    ("block_size bool", dict(block_size=True), 0.0, "block_size"),
    ("max_running 0", sched(max_running=0), 0.0, "max_running"),
    ("max_running -1", sched(max_running=-1), 0.0, "max_running"),
    ("max_running bool", sched(max_running=True), 0.0, "max_running"),
    ("max_batched_tokens 0", sched(max_batched_tokens=0), 0.0, "max_batched_tokens"),
    ("max_batched_tokens over the limit", sched(max_batched_tokens=sim.MAX_STEP_TOKENS + 1), 0.0, "max_batched_tokens"),
    ("max_batched_tokens 2**64", sched(max_batched_tokens=2**64), 0.0, "max_batched_tokens"),
    ("watermark nan", sched(watermark=NAN), 0.0, "watermark"),
    ("watermark 1", sched(watermark=1.0), 0.0, "watermark"),
    ("watermark negative", sched(watermark=-0.1), 0.0, "watermark"),
    ("watermark bool", sched(watermark=True), 0.0, "watermark"),
    ("queue", sched(queue="lifo"), 0.0, "queue"),
    ("allocation", sched(allocation="contiguous"), 0.0, "allocation"),
    ("reserve without reserve_tokens", sched(allocation="reserve"), 0.0, "reserve_tokens"),
    ("reserve_tokens 0", sched(allocation="reserve", reserve_tokens=0), 0.0, "reserve_tokens"),
    ("reserve_tokens -1", sched(allocation="reserve", reserve_tokens=-1), 0.0, "reserve_tokens"),
    ("reserve_tokens 2**32", sched(allocation="reserve", reserve_tokens=2**32), 0.0, "reserve_tokens"),
    ("reserve_tokens bool", sched(allocation="reserve", reserve_tokens=True), 0.0, "reserve_tokens"),
    ("preemption", sched(preemption="drop"), 0.0, "preemption"),
    ("host_blocks -1", sched(preemption="swap", host_blocks=-1), 0.0, "host_blocks"),
    ("host_blocks over the pool limit", sched(preemption="swap", host_blocks=2**31), 0.0, "host_blocks"),
    ("victim", sched(victim="oldest"), 0.0, "victim"),
    ("convention", sched(convention="sglang"), 0.0, "convention"),
    ("eviction", dict(prefix_caching=True, eviction="mru"), 0.0, "eviction"),
    ("max_steps -1", dict(max_steps=-1), 0.0, "max_steps"),
    ("max_steps bool", dict(max_steps=True), 0.0, "max_steps"),
    ("time_model -1", {}, -1.0, "time_model"),
    ("time_model nan", {}, NAN, "time_model"),
    ("time_model inf", {}, INF, "time_model"),
    ("time_model bool", {}, True, "time_model"),
    ("time_model 10**400", {}, 10**400, "time_model"),
    ("time_model 3 figures", {}, [1.0, 2.0, 3.0], "time_model"),
    ("time_model bad figure", {}, [1.0] * 5 + [0.0] + [1.0] * 5, "time_model"),
    ("time_model string", {}, "fast", "time_model"),
    ("time_model returns a string", {}, never_seconds, "time_model"),
    ("time_model returns nan", {}, lambda *s: NAN, "time_model"),
    ("time_model clock overflow", {}, lambda *s: 1e308, "time_model"),
    ("roofline flops_efficiency 0", {}, dataclasses.replace(sim.roofline("llama-3-8b", "a100-80gb-sxm"),
                                                            flops_efficiency=0.0), "flops_efficiency"),
    ("roofline host_link_bandwidth nan", {}, dataclasses.replace(sim.roofline("llama-3-8b", "a100-80gb-sxm"),
                                                                 host_link_bandwidth=NAN), "host_link_bandwidth"),
]


@pytest.mark.parametrize("change,time_model,name", [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_run_names_the_bad_setting(change: dict[str, Any], time_model: Any, name: str) -> None:
    # prompts as token ids, so that prefix caching is not refused for the workload first
    w = sim.Workload(arrival=np.array([0.0, 0.5, 1.0]), prompt_len=L3, output_len=L3,
                     token_ids=np.arange(int(L3.sum())), token_offsets=np.concatenate([[0], np.cumsum(L3)]))
    cfg = sim.SimConfig(**{"num_blocks": 100, **change})
    raises_naming(lambda: sim.run(w, cfg, time_model), name)


@pytest.mark.parametrize("change", [dict(chunked_prefill="yes"), dict(queue=5), dict(prefix_caching=1)])
def test_a_wrong_type_for_a_flag_or_a_name_is_a_type_error_at_worst(change: dict[str, Any]) -> None:
    w = sim.Workload(arrival=Z3, prompt_len=L3, output_len=L3)
    cfg = {"num_blocks": 100, "block_size": 16, **change}
    raises_naming(lambda: _native.run_simulation(cols(arrival=w.arrival), cfg), next(iter(change)), type_error_ok=True)


GROUPS: list[tuple[str, Any, str]] = [
    ("groups empty", [], "groups"),
    ("groups int", 3, "groups"),
    ("groups kind", [("global",)], "groups[0]"),
    ("groups window 0", [("full",), ("sliding", 0)], "groups[1] window"),
    ("groups window -1", [("sliding", -1)], "groups[0] window"),
    ("groups window bool", [("sliding", True)], "groups[0] window"),
    ("groups window 2**31", [("sliding", 2**31)], "groups[0] window"),
    ("groups sinks -1", [("sliding", 8, -1)], "groups[0] sink_tokens"),
    ("groups chunk 0", [("chunked", 0)], "groups[0] chunk_size"),
    ("groups 65", [("full",)] * 65, "groups"),
]


@pytest.mark.parametrize("groups,name", [g[1:] for g in GROUPS], ids=[g[0] for g in GROUPS])
def test_run_simulation_names_the_bad_group(groups: Any, name: str) -> None:
    raises_naming(lambda: _native.run_simulation(cols(), {"num_blocks": 100, "block_size": 16, "groups": groups}), name)
    raises_naming(lambda: sim.SimConfig(num_blocks=100, groups=groups), name.split(" ")[0])


@pytest.mark.parametrize("workload,config,name", [
    (cols(arival=Z3), {"num_blocks": 100, "block_size": 16}, "arival"),
    (cols(), {"num_blocks": 100, "block_size": 16, "max_runing": 4}, "max_runing"),
    (cols(), {"block_size": 16}, "num_blocks"),
    ({"prompt_len": L3, "output_len": L3}, {"num_blocks": 100, "block_size": 16}, "arrival"),
])
def test_run_simulation_refuses_unknown_and_missing_keys(workload: dict[str, Any], config: dict[str, Any],
                                                          name: str) -> None:
    raises_naming(lambda: _native.run_simulation(workload, config), name)


# ---- the other public functions of pykvpool.simulate -----------------------------------

W = sim.Workload(arrival=Z3, prompt_len=L3, output_len=L3)
A100 = sim.roofline("llama-3-8b", "a100-80gb-sxm")
OTHERS: list[tuple[str, Callable[[], object], str]] = [
    ("scaled time -1", lambda: W.scaled(time=-1.0), "time"),
    ("scaled time nan", lambda: W.scaled(time=NAN), "time"),
    ("scaled prompt bool", lambda: W.scaled(prompt=True), "prompt"),
    ("scaled output inf", lambda: W.scaled(output=INF), "output"),
    ("scaled past the limit", lambda: W.scaled(prompt=2.0**30), "prompt_len"),
    ("scaled keyed prompts", lambda: dataclasses.replace(W, block_keys=np.arange(3), key_offsets=np.arange(4),
                                                         tokens_per_key=8).scaled(prompt=2.0), "prompt"),
    ("scaled ragged column", lambda: dataclasses.replace(W, output_len=[[1], [2, 3]]).scaled(output=2.0), "output_len"),
    ("head -1", lambda: W.head(-1), "n"),
    ("head bool", lambda: W.head(True), "n"),
    ("head float", lambda: W.head(1.5), "n"),
    ("roofline block_size 0", lambda: sim.roofline("llama-3-8b", "a100-80gb-sxm", block_size=0), "block_size"),
    ("roofline overhead nan", lambda: sim.roofline("llama-3-8b", "a100-80gb-sxm", overhead=NAN), "overhead"),
    ("figures bandwidth_efficiency 2", lambda: dataclasses.replace(A100, bandwidth_efficiency=2.0).figures(),
     "bandwidth_efficiency"),
]


@pytest.mark.parametrize("fn,name", [c[1:] for c in OTHERS], ids=[c[0] for c in OTHERS])
def test_simulate_helpers_name_the_bad_argument(fn: Callable[[], object], name: str) -> None:
    raises_naming(fn, name)


def test_the_limits_are_exact() -> None:
    """The largest accepted values run; one more is refused."""
    assert (sim.MAX_REQUESTS, sim.MAX_REQUEST_TOKENS, sim.MAX_STEP_TOKENS) == (2**24, 2**24, 2**24)
    w = sim.Workload(arrival=np.zeros(1), prompt_len=np.array([MAX_TOK]), output_len=np.array([MAX_TOK]))
    r = sim.run(w, sim.SimConfig(num_blocks=10, scheduler=sim.SchedulerConfig(max_batched_tokens=sim.MAX_STEP_TOKENS)))
    assert r.requests["outcome"].tolist() == [1]
    assert len(sim.synthetic_workload(3, prompt_clamp=(1, MAX_TOK), prompt=("fixed", [2**30]))) == 3
    assert sim.synthetic_workload(3, prompt_clamp=(1, MAX_TOK), prompt=("fixed", [2**30])).prompt_len.max() == MAX_TOK
    assert len(sim.synthetic_workload(3, seed=2**64 - 1)) == 3


def test_empty_columns_of_any_kind_are_an_empty_workload() -> None:
    for empty in ([], np.array([]), np.zeros(0, dtype=np.int32)):
        d = _native.run_simulation({"arrival": empty, "prompt_len": empty, "output_len": empty},
                                   {"num_blocks": 10, "block_size": 16})
        assert d["summary"]["num_requests"] == 0 and d["summary"]["ttft_p50"] is None
        assert all(v.size == 0 for v in d["requests"].values())


# ---- reproducers that used to abort the process -----------------------------------------

CRASHES = [
    ("synthetic_workload 10**10", "sim.synthetic_workload(10**10)", "num_requests"),
    ("synthetic_workload 2**62", "sim.synthetic_workload(2**62)", "num_requests"),
    ("token ids beyond the limit",
     "sim.synthetic_workload(2**20, prompt=('fixed', [2**24]), shared_prefixes=(1, 16, 100))", "shared_prefixes"),
    ("prompt_len 2**32 - 1",
     "sim.run(sim.Workload(arrival=np.zeros(1), prompt_len=np.array([2**32 - 1]), output_len=np.array([2])), "
     "sim.SimConfig(num_blocks=100))", "prompt_len"),
    ("output_len 2**32 - 1",
     "sim.run(sim.Workload(arrival=np.zeros(1), prompt_len=np.array([2]), output_len=np.array([2**32 - 1])), "
     "sim.SimConfig(num_blocks=100))", "output_len"),
]


@pytest.mark.parametrize("expr,name", [c[1:] for c in CRASHES], ids=[c[0] for c in CRASHES])
def test_reproducers_fail_cleanly_in_a_subprocess(expr: str, name: str) -> None:
    code = (
        "import numpy as np\nimport pykvpool\nfrom pykvpool import simulate as sim\n"
        f"try:\n    {expr}\nexcept pykvpool.InvalidArgumentError as e:\n    print('InvalidArgumentError:', e)\n"
        "else:\n    print('no error')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("InvalidArgumentError:") and name in proc.stdout, proc.stdout
