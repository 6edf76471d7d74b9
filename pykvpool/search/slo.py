"""Service-level objectives, the rate ladder a search climbs, and the objective it ranks by.

Units: latencies in seconds, throughputs in output tokens/s, rates in requests/s, prices
in dollars per device-hour.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from pykvpool.checks import check_count, check_positive, invalid
from pykvpool.planning.hardware import hardware_preset
from pykvpool.simulate.stop import StopWhen

__all__ = ["COST_UNITS", "DEFAULT_ATTAINMENT", "DEFAULT_PRICES", "OBJECTIVES", "PRICES_SOURCE", "SLO", "SLO_ATTAINMENT", "SLO_BOUNDS", "Objective",
           "RateLadder", "stop_rule"]

#: On-demand dollars per device-hour: the middle of the "specialty provider" range of
#: :data:`PRICES_SOURCE` (A100 80GB $1.10-1.50, H100 SXM5 $2.50-3.50, H200 SXM5 $3.50-4.50).
DEFAULT_PRICES: dict[str, float] = {"a100-80gb-sxm": 1.30, "h100-sxm": 3.00, "h200": 4.00}
#: Where :data:`DEFAULT_PRICES` come from, and when.
PRICES_SOURCE = ("Mercatus, 'Cloud GPU pricing' (mercatus-ai.com/blog/cloud-gpu-pricing), on-demand "
                 "$/GPU-hour of specialty providers, May 2026; read 2026-12-01")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


def _bound(v: Optional[float], name: str) -> Optional[float]:
    return None if v is None else check_positive(v, name)


#: The SLO's bounds on a run's statistics (seconds; ``min_throughput``: output tokens/s).
SLO_BOUNDS = ("ttft_p99", "tpot_p50", "tpot_p99", "min_throughput")
#: The SLO's per-request bounds (seconds) and the share of requests that must meet them.
SLO_ATTAINMENT = ("ttft", "tpot", "attainment")
#: The attainment an SLO with per-request bounds asks for when it names none (DistServe's).
DEFAULT_ATTAINMENT = 0.9


@dataclass(frozen=True)
class SLO:
    """Targets a run must meet: bounds on statistics over its finished requests, and
    (DistServe's goodput condition) per-request bounds a share of the requests must meet.

    A run meets the SLO when each given bound holds; with a statistic bound (or none at
    all) every request must have finished (none rejected or left unfinished); with
    per-request bounds at least ``attainment`` of the workload's requests must each have
    finished with a TTFT of at most ``ttft`` and a TPOT of at most ``tpot`` (a one-token
    output has no TPOT and meets that bound; a rejected request misses). A sustained rate
    under per-request bounds alone is DistServe's goodput.

    Attributes:
        name: a label (letters, digits, ``_``, ``-``; at most 32), a column prefix.
        ttft_p99: 99th-percentile time to first token, seconds.
        tpot_p50, tpot_p99: median and 99th-percentile time per output token, seconds.
        min_throughput: output tokens/s the run must reach.
        ttft, tpot: per-request bounds, seconds.
        attainment: the share of requests that must meet ``ttft`` and ``tpot``, in (0, 1]
            (default :data:`DEFAULT_ATTAINMENT` when either is given).

    Raises:
        InvalidArgumentError: a bad name, a bound that is not a finite number > 0, an
            attainment outside (0, 1] or without a per-request bound (naming it).
    """

    name: str = "slo"
    ttft_p99: Optional[float] = None
    tpot_p50: Optional[float] = None
    tpot_p99: Optional[float] = None
    min_throughput: Optional[float] = None
    ttft: Optional[float] = None
    tpot: Optional[float] = None
    attainment: Optional[float] = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise invalid(f"name must be 1-32 letters, digits, '_' or '-', got {self.name!r}")
        for f in (*SLO_BOUNDS, "ttft", "tpot"):
            object.__setattr__(self, f, _bound(getattr(self, f), f"{self.name}.{f}"))
        if self.attainment is not None:
            object.__setattr__(self, "attainment", check_positive(self.attainment, f"{self.name}.attainment",
                                                                  most=1.0))
            if self.ttft is None and self.tpot is None:
                raise invalid(f"{self.name}.attainment needs a per-request bound: ttft or tpot (seconds)")
        elif self.ttft is not None or self.tpot is not None:
            object.__setattr__(self, "attainment", DEFAULT_ATTAINMENT)

    @property
    def needs_all_finished(self) -> bool:
        """Whether a run must finish every request: it has a statistic bound, or no
        per-request bound.

        Raises:
            Nothing: reads the fields.
        """
        return self.attainment is None or any(getattr(self, f) is not None for f in SLO_BOUNDS)

    @property
    def attained_key(self) -> str:
        """The summary key under which :meth:`meets` reads :meth:`attained`'s count.

        Raises:
            Nothing: string formatting.
        """
        return f"attained_{self.name}"

    def attained(self, requests: Mapping[str, Any]) -> int:
        """Requests of a run (:attr:`pykvpool.simulate.SimulationResult.requests`) that
        finished within the per-request bounds (all finished ones without bounds).

        Raises:
            KeyError: columns without ``outcome``, ``ttft`` or ``tpot``.
        """
        ok = np.asarray(requests["outcome"]) == 0
        if self.ttft is not None:
            ok &= np.asarray(requests["ttft"]) <= self.ttft
        if self.tpot is not None:
            ok &= ~(np.asarray(requests["tpot"]) > self.tpot)  # NaN (one output token) meets it
        return int(ok.sum())

    def meets(self, summary: Mapping[str, Any], num_requests: int) -> bool:
        """Whether a run's summary (:attr:`pykvpool.simulate.SimulationResult.summary`) of a
        workload of ``num_requests`` requests meets every bound (a missing statistic fails;
        a run stopped early by :func:`stop_rule`'s targets fails: it could not meet them).
        With per-request bounds the summary must hold :meth:`attained`'s count under
        :attr:`attained_key` (the search adds it).

        Raises:
            TypeError: a statistic that is not a number.
        """
        if summary.get("stopped") is not None:
            return False
        if self.needs_all_finished and summary.get("finished") != num_requests:
            return False
        for key, bound in (("ttft_p99", self.ttft_p99), ("tpot_p50", self.tpot_p50), ("tpot_p99", self.tpot_p99)):
            if bound is not None and (summary.get(key) is None or summary[key] > bound):
                return False
        thr = summary.get("output_throughput")
        if self.min_throughput is not None and (thr is None or thr < self.min_throughput):
            return False
        if self.attainment is None:
            return True
        got = summary.get(self.attained_key)
        return got is not None and got >= self.attainment * num_requests


@dataclass(frozen=True)
class RateLadder:
    """The arrival rates tried: ``steps`` rates from ``lo`` to ``hi`` requests/s, evenly
    spaced in log scale (``steps`` = 1: ``lo`` only). A configuration's sustained rate is
    the highest rung below its first failure.

    Raises:
        InvalidArgumentError: ``lo`` or ``hi`` not finite and > 0, ``hi`` < ``lo``, ``steps``
            not an int in 1..=1000 (each named).
    """

    lo: float = 0.5
    hi: float = 64.0
    steps: int = 22

    def __post_init__(self) -> None:
        check_positive(self.lo, "lo")
        check_positive(self.hi, "hi")
        if self.hi < self.lo:
            raise invalid(f"hi ({self.hi}) must be >= lo ({self.lo}) requests/s")
        if check_count(self.steps, "steps", 1) > 1000:
            raise invalid(f"steps must be <= 1000, got {self.steps}")

    def rates(self) -> tuple[float, ...]:
        """The rungs, requests/s, increasing.

        Raises:
            Nothing: the fields were checked at construction.
        """
        if self.steps == 1:
            return (float(self.lo),)
        r = math.log(self.hi / self.lo) / (self.steps - 1)
        return tuple(float(self.lo * math.exp(r * i)) for i in range(self.steps))


#: What a search may maximize: requests/s per device, requests per dollar, or requests/s
#: per kilowatt of the devices' maximum board power.
OBJECTIVES = ("per_device", "per_dollar", "per_watt")


@dataclass(frozen=True)
class Objective:
    """What a search maximizes: ``per_device`` (sustained requests/s per device),
    ``per_dollar`` (requests served per dollar: sustained rate x 3600 / the deployment's
    $/hour, from ``prices``: dollars per device-hour by hardware preset) or ``per_watt``
    (sustained requests/s per kilowatt of the devices' maximum board power,
    :attr:`pykvpool.planning.hardware.Hardware.power_watts`: Splitwise's iso-power basis).

    Raises:
        InvalidArgumentError: an unknown kind, or a price that is not finite and > 0
            (naming the preset).
    """

    kind: str = "per_device"
    prices: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_PRICES))

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise invalid(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.kind!r}")
        clean = {}
        for k, v in dict(self.prices).items():
            if not isinstance(k, str):
                raise TypeError(f"prices keys must be preset names, got {type(k).__name__}")
            clean[k.strip().lower()] = check_positive(v, f"prices[{k!r}]")
        object.__setattr__(self, "prices", clean)

    def cost(self, hardware: str, devices: int) -> float:
        """The cost a point's objective divides by: devices (``per_device``), dollars per
        hour (``per_dollar``) or kilowatts (``per_watt``).

        Raises:
            InvalidArgumentError: ``per_dollar`` and no price for ``hardware``; ``per_watt``
                and a preset without a power figure.
            UnknownPresetError: ``per_watt`` and an unknown preset.
        """
        if self.kind == "per_device":
            return float(devices)
        if self.kind == "per_watt":
            watts = hardware_preset(hardware).power_watts
            if not watts > 0:
                raise invalid(f"hardware {hardware!r} has no power figure for the per_watt objective")
            return devices * watts / 1000.0
        if hardware not in self.prices:
            raise invalid(f"prices: no price for hardware {hardware!r} (have {', '.join(sorted(self.prices))})")
        return devices * self.prices[hardware]

    def value(self, rate: float, cost: float) -> float:
        """The objective of a sustained ``rate`` (requests/s) at ``cost``.

        Raises:
            ZeroDivisionError: ``cost`` 0 (:meth:`cost` never returns it).
        """
        return rate * 3600.0 / cost if self.kind == "per_dollar" else rate / cost

    @property
    def unit(self) -> str:
        """The objective's unit, for tables and axes.

        Raises:
            Nothing: one of three strings.
        """
        return {"per_device": "req/s per device", "per_dollar": "requests per $", "per_watt": "req/s per kW"}[self.kind]

    @property
    def cost_unit(self) -> str:
        """What :meth:`cost` counts: ``devices``, ``$ per hour`` or ``kW``.

        Raises:
            Nothing: one of three strings.
        """
        return COST_UNITS[self.kind]


#: What an objective's cost counts, by kind.
COST_UNITS = {"per_device": "devices", "per_dollar": "$ per hour", "per_watt": "kW"}


def stop_rule(slos: Sequence[SLO]) -> StopWhen:
    """The simulator's early stop for a search under ``slos``: a run stopped by it meets
    none of them, so runs can be shared by all. Each bound is the loosest of the SLOs'
    (None when one SLO leaves it free); the attainment target is the loosest per-request
    bounds with the smallest share (None when one SLO has none); a rejected request stops
    the run when every SLO needs every request finished, and is a miss otherwise.

    Raises:
        Nothing: the SLOs' bounds were checked at construction.
    """
    def loosest(name: str, pick: Any) -> Optional[float]:
        vals = [getattr(s, name) for s in slos]
        return None if not vals or any(v is None for v in vals) else pick(vals)

    share = loosest("attainment", min)
    ttft, tpot = (loosest("ttft", max), loosest("tpot", max)) if share is not None else (None, None)
    if ttft is None and tpot is None:
        share = None
    return StopWhen(ttft_p99=loosest("ttft_p99", max), tpot_p50=loosest("tpot_p50", max),
                    tpot_p99=loosest("tpot_p99", max), min_output_throughput=loosest("min_throughput", min),
                    attain_ttft=ttft, attain_tpot=tpot, attain_share=share,
                    tolerate_rejections=not all(s.needs_all_finished for s in slos))
