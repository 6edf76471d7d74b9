"""Trace replay through a prefix-caching pool, checked against an independent computation
of the unbounded-cache rule on the Mooncake FAST'25 synthetic trace (shipped)."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import pytest

import pykvpool as kv
from pykvpool.cli import main as cli_main
from pykvpool.prefix import replay as pr

SHA256 = "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "mooncake_fast25" / "synthetic_trace.jsonl"


@pytest.fixture(scope="module")
def trace() -> list[pr.TraceRequest]:
    return pr.load_mooncake_trace()


def test_shipped_trace_is_the_published_one(trace: list[pr.TraceRequest]) -> None:
    data = resources.files("pykvpool").joinpath("data/mooncake_fast25/synthetic_trace.jsonl").read_bytes()
    assert hashlib.sha256(data).hexdigest() == SHA256
    assert len(trace) == 3993
    assert resources.files("pykvpool").joinpath("data/mooncake_fast25/LICENSE-APACHE").is_file()
    if SHARED.is_file():  # the shared copy, when present beside the clone, is identical
        assert SHARED.read_bytes() == data


def independent_rule(keys_per_request: list[list[int]]) -> tuple[int, int]:
    """For each request, the longest prefix of its keys seen in any earlier request."""
    seen: set[int] = set()
    hits = total = 0
    for keys in keys_per_request:
        k = 0
        while k < len(keys) and keys[k] in seen:
            k += 1
        hits, total = hits + k, total + len(keys)
        seen.update(keys)
    return hits, total


@pytest.mark.parametrize("policy", pr.POLICIES)
def test_unbounded_pool_equals_the_seen_prefix_rule_exactly(trace: list[pr.TraceRequest], policy: str) -> None:
    hits, total = independent_rule([list(r.hash_ids) for r in trace])
    assert (hits, total) == pr.seen_prefix_hits(trace)
    res = pr.replay(trace, policy=policy)
    assert res.unbounded and res.evictions == 0
    assert (res.hit_blocks, res.query_blocks) == (hits, total)
    assert res.block_hit_rate == hits / total
    assert abs(res.block_hit_rate - 0.640) < 0.001, "the issue's figure (the paper reports 66%)"


def test_merged_block_sizes_follow_the_same_rule(trace: list[pr.TraceRequest]) -> None:
    for bs in (1024, 2048):
        keys = [pr.block_keys_for(r, bs) for r in trace]
        hits, total = independent_rule(keys)
        res = pr.replay(trace, block_size=bs)
        assert (res.hit_blocks, res.query_blocks) == (hits, total)
        assert total == sum(-(-r.input_length // bs) for r in trace)


def test_hit_rate_falls_with_capacity(trace: list[pr.TraceRequest]) -> None:
    unbounded = pr.replay(trace).block_hit_rate
    for policy in ("lru", "lfu"):
        rates = [pr.replay(trace, c, policy=policy).block_hit_rate for c in (384, 1536, 6144, 24576)]
        assert rates == sorted(rates), (policy, rates)
        assert rates[0] < 0.1 and rates[-1] < unbounded
    small = pr.replay(trace, 384)
    assert small.evictions > 0 and small.requests == len(trace)


def test_priority_retention_protects_shared_prefixes() -> None:
    # Rounds of two prompts on a shared 2-block prefix, then two one-off 4-block prompts
    # that push the prefix out of a 7-block LRU cache; retaining reused prefixes (the
    # second prompt of a round hits) keeps it resident for the next round.
    def req(ids: list[int]) -> pr.TraceRequest:
        return pr.TraceRequest(0, 512 * len(ids), 1, tuple(ids))

    trace = []
    for i in range(20):
        trace += [req([1, 2, 1000 + 2 * i]), req([1, 2, 1001 + 2 * i])]
        trace += [req([5000 + 8 * i + j for j in range(4)]), req([5004 + 8 * i + j for j in range(4)])]
    lru = pr.replay(trace, 7, policy="lru")
    plain = pr.replay(trace, 7, policy="priority")
    kept = pr.replay(trace, 7, policy="priority", retain_hits_for=8)
    assert lru.hit_blocks == 2 * 20, "LRU: only the second prompt of each round hits"
    assert kept.hit_blocks == 2 * 20 + 2 * 19, "retention: the first one too, from round 2"
    assert plain.hit_blocks == lru.hit_blocks, "priority without pins orders like LRU"
    assert kept.hit_blocks > lru.hit_blocks
    with pytest.raises(kv.InvalidArgumentError):
        pr.replay(trace, 7, policy="lru", retain_hits_for=8)


def test_replay_rejects_impossible_setups(trace: list[pr.TraceRequest]) -> None:
    with pytest.raises(kv.InvalidArgumentError, match="largest request"):
        pr.replay(trace, 100)
    with pytest.raises(kv.InvalidArgumentError, match="multiple"):
        pr.replay(trace, 1000, block_size=768)
    with pytest.raises(kv.InvalidArgumentError, match="eviction policy"):
        pr.replay(trace, 1000, policy="random")


def test_sweep_and_plot(trace: list[pr.TraceRequest], tmp_path: Path) -> None:
    sub = trace[:400]
    res = pr.sweep(sub, [512 * 400, 512 * 3200], ("lru", "fifo"), (512, 1024))
    assert {(r.block_size, r.policy) for r in res} == {(b, p) for b in (512, 1024) for p in ("lru", "fifo")}
    assert sum(r.unbounded for r in res) == 4
    data = pr.plot_sweep(res, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    lru512 = data["block_size"][512]["policy"]["lru"]
    assert lru512["capacity_tokens"] == [512 * 400, 512 * 3200]
    assert data["block_size"][512]["unbounded"] == next(
        r.block_hit_rate for r in res if r.unbounded and r.block_size == 512 and r.policy == "lru")
    with pytest.raises(kv.InvalidArgumentError):
        pr.sweep(sub, [512], ("lru",), include_unbounded=False)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [json.dumps({"timestamp": i, "input_length": 1000, "output_length": 1, "hash_ids": [0, 1 + i % 2]})
            for i in range(6)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(rows))
    out_json = tmp_path / "r.json"
    assert cli_main(["replay", "--trace", str(path), "--policy", "lru", "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    assert "6 requests" in printed and "| 512 | lru |" in printed
    (res,) = json.loads(out_json.read_text())
    # Requests alternate keys [0,1] and [0,2]: hits 0, 1, 2, 2, 2, 2 blocks.
    assert (res["hit_blocks"], res["query_blocks"]) == (9, 12)
    assert cli_main(["replay", "--trace", str(path), "--sweep", "--capacities", "2048,4096",
                    "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").is_file()
    capsys.readouterr()
    assert cli_main(["replay", "--trace", str(path), "--plot", str(tmp_path / "q.png")]) == 2
    assert capsys.readouterr().err == "pykvpool: error: --plot needs --sweep\n"
    # Wired into the pykvpool command, with its error convention (status 2).
    from pykvpool import cli

    out = tmp_path / "o"
    assert cli.main(["replay", "--trace", str(path), "--sweep", "--capacities", "2048", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"replay.md", "replay.json", "replay.png"}
    assert cli.main(["replay", "--trace", str(path), "--capacity", "1"]) == 2


@pytest.mark.parametrize(
    "row,match",
    [
        ("not json", "bad.jsonl:1: not JSON"),
        ('{"timestamp": 0, "input_length": 10, "hash_ids": [1]}', "bad.jsonl:1: no 'output_length'"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}', "expected ceil"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-1]}', "negative"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [99999999999999999999]}',
         "exceeds the limit"),
    ],
)
def test_malformed_trace_rows(tmp_path: Path, row: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(row + "\n")
    with pytest.raises(kv.InvalidArgumentError, match=match):
        pr.load_mooncake_trace(path)
