"""Deployment search: the best serving configuration for a workload and its SLOs.

Every point of a :class:`SearchSpace` (hardware and device count, KV dtype, block size,
scheduler limits and policies, prefix caching, layer groups) is simulated by
:mod:`pykvpool.simulate` at the arrival rates of a :class:`RateLadder` to find the rate it
sustains within each :class:`SLO`; points are ranked by an :class:`Objective` (sustained
requests/s per device, or requests per dollar). Strategies, backends (in-process, process
pool, Ray) and files: :mod:`pykvpool.search.strategies`, :mod:`pykvpool.search.backends`,
:mod:`pykvpool.search.output`; the multi-device scaling model every output states, the
superlinear configurations it flags (never ranked) and the rates read as lower bounds:
:mod:`pykvpool.search.scaling` (:data:`SCALING_MODEL`); the cost vs latency frontiers at a reference rate:
:func:`reference_latency` (:mod:`pykvpool.search.latency`); a finished search read back
from its folder: :func:`read_search`; figures: :mod:`pykvpool.search.figures`; the command
line: ``pykvpool search``.

Typical use::

    from pykvpool import search as ds, simulate as sim
    from pykvpool.planning.models import model_preset
    w = sim.synthetic_workload(500, rate=5.0, seed=1)
    space = ds.SearchSpace(hardware=("a100-80gb-sxm", "h100-sxm"), max_running=(64, 256))
    res = ds.search(w, model_preset("llama-3-8b"), space, [ds.SLO("chat", ttft_p99=2.0, tpot_p99=0.1)])
    print(res.best["chat"])
    lat = ds.reference_latency(res)     # every point at the best point's sustained rate
    print(lat.frontier)                 # cost vs p99 TTFT / TPOT, per SLO

Units: latencies in seconds, rates in requests/s, throughput in output tokens/s, memory
in blocks of ``block_size`` tokens, prices in dollars per device-hour.
"""

from pykvpool.search.backends import BACKENDS, Backend
from pykvpool.search.evaluate import METRICS, STRATEGIES, SearchSpec, deploy
from pykvpool.search.folder import SearchFolder, read_search
from pykvpool.search.latency import LatencyResult, reference_latency
from pykvpool.search.scaling import SCALING_MODEL
from pykvpool.search.slo import DEFAULT_PRICES, PRICES_SOURCE, SLO, Objective, RateLadder
from pykvpool.search.space import Point, SearchSpace
from pykvpool.search.strategies import SearchResult, search

__all__ = [
    "BACKENDS",
    "DEFAULT_PRICES",
    "METRICS",
    "PRICES_SOURCE",
    "SCALING_MODEL",
    "STRATEGIES",
    "SLO",
    "Backend",
    "LatencyResult",
    "Objective",
    "Point",
    "RateLadder",
    "SearchFolder",
    "SearchResult",
    "SearchSpace",
    "SearchSpec",
    "deploy",
    "read_search",
    "reference_latency",
    "search",
]
