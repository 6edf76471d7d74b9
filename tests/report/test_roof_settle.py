"""The measured roof is repeated until its best probes agree, or reported with its spread:
the stopping rule, driven by deterministic fake measurements and a fake clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pykvpool.errors import InvalidArgumentError
from pykvpool.planning.roofline import SettleRule, Spread, repeat_until_stable


def _fake(values: list[float]) -> tuple[list[float], object]:
    seen: list[float] = []
    it: Iterator[float] = iter(values)

    def measure() -> float:
        v = next(it)
        seen.append(v)
        return v

    return seen, measure


def test_stops_as_soon_as_the_best_k_agree() -> None:
    seen, measure = _fake([5.0, 10.0, 6.0, 9.5, 9.8, 1.0, 1.0])
    s = repeat_until_stable(measure, SettleRule(k=3, rel_tol=0.10, max_rounds=20))
    # after 9.8 the best three are 10.0, 9.8, 9.5: within 5% of the best
    assert seen == [5.0, 10.0, 6.0, 9.5, 9.8]
    assert s.stable and s.samples == (5.0, 10.0, 6.0, 9.5, 9.8)
    assert s.best == (10.0, 9.8, 9.5) and s.value == 9.8
    assert (s.low, s.high) == (5.0, 10.0)
    assert s.agreement == pytest.approx(0.05)


def test_min_rounds_are_taken_even_when_the_first_agree() -> None:
    seen, measure = _fake([8.0] * 10)
    s = repeat_until_stable(measure, SettleRule(k=3, rel_tol=0.10, max_rounds=20), min_rounds=5)
    assert len(seen) == 5 and s.stable and s.value == 8.0


def test_bounded_by_rounds_and_reported_unsettled() -> None:
    values = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]
    seen, measure = _fake(values)
    s = repeat_until_stable(measure, SettleRule(k=3, rel_tol=0.10, max_rounds=6))
    assert len(seen) == 6 and not s.stable
    assert s.best == (32.0, 16.0, 8.0) and s.value == 16.0 and (s.low, s.high) == (1.0, 32.0)


def test_bounded_by_time() -> None:
    """Each fake sample takes one second of the fake clock: no sample starts after 4.5 s
    once k are taken."""
    now = [0.0]

    def measure() -> float:
        now[0] += 1.0
        return now[0]  # rising: never settles at 1%

    rule = SettleRule(k=3, rel_tol=0.01, max_rounds=50, max_seconds=4.5)
    s = repeat_until_stable(measure, rule, clock=lambda: now[0])
    assert not s.stable and s.samples == (1.0, 2.0, 3.0, 4.0, 5.0)


def test_pooled_spread_ranks_every_sample() -> None:
    a = Spread((10.0, 9.7, 9.9), k=3, rel_tol=0.1)
    b = Spread((4.0, 5.0, 12.0), k=3, rel_tol=0.1)
    p = Spread.pooled([a, b])
    assert p.samples == a.samples + b.samples and p.best == (12.0, 10.0, 9.9)
    assert p.value == 10.0 and not p.stable and (p.low, p.high) == (4.0, 12.0)  # 12 vs 9.9: 17.5%


@pytest.mark.parametrize("kw", [{"k": 0}, {"rel_tol": 0.0}, {"max_rounds": 2, "k": 3},
                                {"max_seconds": -1.0}, {"k": True}])
def test_rule_refuses_bad_values(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        SettleRule(**kw)  # type: ignore[arg-type]


def test_decode_kernel_roof_settles_on_its_own_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a rule, each point keeps probing its cache (a kernel call before each probe)
    until its best probes agree; its roof is their median and its spread is kept."""
    import numpy as np

    from pykvpool import _native
    from pykvpool.planning.roofline import measure_decode_kernel

    probes = iter([3e9, 7e9, 5e9, 6.9e9, 7.1e9, 2e9, 4e9, 4.1e9, 4.05e9])
    calls: list[str] = []

    class Cache:
        def __init__(self, *a: object, **kw: object) -> None:
            pass

        def write(self, *a: object) -> None:
            pass

    def decode(cache: object, layer: int, q: np.ndarray, *a: object) -> np.ndarray:
        calls.append("kernel")
        return q

    def read_bandwidth(*, cache: object = None, passes: object = None) -> float:
        calls.append("probe")
        return next(probes)

    monkeypatch.setattr(_native, "KvCache", Cache, raising=False)
    monkeypatch.setattr(_native, "decode_attention", decode, raising=False)
    monkeypatch.setattr(_native, "read_bandwidth", read_bandwidth, raising=False)
    pts = measure_decode_kernel(groups=(1, 4), batch=2, seq_len=40, num_kv_heads=2, head_dim=8,
                                repeats=3, settle=SettleRule(k=3, rel_tol=0.1, max_rounds=10))
    assert [p.roof.samples for p in pts] == [(3e9, 7e9, 5e9, 6.9e9, 7.1e9), (2e9, 4e9, 4.1e9, 4.05e9)]
    assert [p.roof_bandwidth for p in pts] == [7e9, 4.05e9]
    assert calls == (["kernel"] + ["kernel", "probe"] * 5) + (["kernel"] + ["kernel", "probe"] * 4)
