"""The simulator's exact early stop: targets a run must still be able to meet.

A run under ``SimConfig(stop_when=StopWhen(...))`` ends as soon as its complete version
would certainly miss the targets, and its summary's ``stopped`` says which one (None: it
ran to the end, and is then the complete run, bit for bit). The triggers (the engine's
``rust/sim/stop.rs`` proves each):

- ``rejected``: a request can never run, so not every request finishes.
- ``ttft_p99``: ``n - floor(0.99 (n - 1))`` of the ``n`` requests have a time to first
  token above the bound (a request still waiting for its first token longer than the
  bound counts: its TTFT can only be larger); the p99 over ``n`` values, as the summary
  interpolates it (numpy's linear method), is then above the bound.
- ``tpot_p50`` / ``tpot_p99``: the same count over finished requests of two or more
  output tokens (``n``: the workload's requests with ``output_len > 1``).
- ``throughput``: with requests unfinished at time ``t``, the makespan is at least ``t`` -
  first arrival, so the output throughput is at most the workload's output tokens over
  that.
- ``attainment`` (DistServe's goodput condition): at least ``attain_share`` of the
  workload's requests must each have a TTFT of at most ``attain_ttft`` and a TPOT of at
  most ``attain_tpot`` (a one-token output has no TPOT and meets that bound); a request
  misses once its TTFT is above the bound (or it has waited longer than the bound), its
  TPOT is above the bound, or it is rejected, and the run stops once fewer than the share
  can still meet them.

``tolerate_rejections``: a rejection alone does not stop the run (an attainment target
counts it as a miss); the throughput trigger is then off once a request was rejected.

A stopped run's statistics cover only what happened before the stop; the requests it
did not finish get outcome 2 (unfinished).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Optional

from pykvpool.checks import check_positive, invalid

__all__ = ["StopWhen"]


@dataclass(frozen=True)
class StopWhen:
    """Targets: every request finished (unless ``tolerate_rejections``), and each bound
    given (None: not checked).

    Attributes:
        ttft_p99: 99th-percentile time to first token, seconds.
        tpot_p50, tpot_p99: median and 99th-percentile time per output token, seconds.
        min_output_throughput: output tokens/s the run must reach.
        attain_ttft, attain_tpot, attain_share: at least ``attain_share`` (a share in
            (0, 1]) of the requests each finish with a TTFT of at most ``attain_ttft`` and
            a TPOT of at most ``attain_tpot`` seconds (either bound may be None, not both).
        tolerate_rejections: a rejected request alone does not stop the run.

    Raises:
        TypeError: a bound that is not a number (a string, say), a flag that is not a bool.
        InvalidArgumentError: a bound that is a bool, not finite or not > 0, a share
            above 1, a share without a per-request bound or a bound without a share
            (naming it).
    """

    ttft_p99: Optional[float] = None
    tpot_p50: Optional[float] = None
    tpot_p99: Optional[float] = None
    min_output_throughput: Optional[float] = None
    attain_ttft: Optional[float] = None
    attain_tpot: Optional[float] = None
    attain_share: Optional[float] = None
    tolerate_rejections: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.tolerate_rejections, bool):
            raise TypeError(f"stop_when.tolerate_rejections must be a bool, got {type(self.tolerate_rejections).__name__}")
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or f.name == "tolerate_rejections":
                continue
            if not isinstance(v, (numbers.Real, bool)):
                raise TypeError(f"stop_when.{f.name} must be a number of seconds (tokens/s) or None, "
                                f"got {type(v).__name__}")
            object.__setattr__(self, f.name, check_positive(v, f"stop_when.{f.name}",
                                                            most=1.0 if f.name == "attain_share" else math.inf))
        per_request = self.attain_ttft is not None or self.attain_tpot is not None
        if per_request != (self.attain_share is not None):
            raise invalid("stop_when: attain_share goes with attain_ttft or attain_tpot (seconds), and they with it")

    def as_dict(self) -> dict[str, Optional[float] | bool]:
        """The bounds by name (the ``stop_when`` dict of ``run_simulation``).

        Raises:
            Nothing: the fields were checked at construction.
        """
        return {f.name: getattr(self, f.name) for f in fields(self)}
