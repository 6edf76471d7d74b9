"""The search space of a deployment search: one :class:`Point` per serving configuration.

A point is a deployment of one model: a hardware preset, a device count and how the
devices are split (``devices / tensor_parallel`` data-parallel replicas behind a
shortest-queue router, each a tensor-parallel group of ``tensor_parallel`` devices whose
memory, bandwidth and FLOP/s add up, the memory reserve per device), the KV storage dtype, the pool's block size (tokens), the
scheduler's limits (``max_running`` requests, ``max_batched_tokens`` tokens per step,
chunked prefill), its preemption (recompute, or swap to a host pool as large as the
device pool), prefix caching and its eviction policy, layer groups (one
``BlockPool`` group per attention kind of a windowed model), and whether the replicas
serve both phases (``colocated``) or split ``P:D`` into prefill and decode instances
(prefill/decode disaggregation, the KV moved over the devices' network).

:meth:`SearchSpace.points` enumerates the product of the axes in a fixed order and drops
the combinations that add nothing or that the simulator refuses (each rule in its
docstring), so every point is a distinct, runnable configuration.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from pykvpool import _native
from pykvpool.checks import invalid
from pykvpool.planning.hardware import hardware_name, hardware_preset
from pykvpool.planning.models import ModelConfig, storage_dtype
from pykvpool.simulate.engine import MAX_STEP_TOKENS

__all__ = ["COLOCATED", "canonical_split", "MAX_DEVICES", "MAX_POINTS", "PREEMPTIONS", "EVICTIONS", "TENSOR_PARALLEL", "Point", "SearchSpace",
           "parse_split"]

#: Most devices one point may use.
MAX_DEVICES = 4096
#: Most points one space may enumerate (before its rules drop any).
MAX_POINTS = 10_000_000
#: The default tensor-parallel degrees: the divisors of 8, the devices one NVLink domain
#: of the presets' servers holds (a point uses those that divide its device count).
TENSOR_PARALLEL = (1, 2, 4, 8)
#: Preemption policies of the simulator.
PREEMPTIONS = ("recompute", "swap")
#: Eviction policies of the prefix cache.
EVICTIONS: tuple[str, ...] = _native.EVICTION_POLICIES
_MAX_BLOCK_SIZE = 1 << 16
#: The :attr:`Point.disaggregation` of replicas that serve both phases.
COLOCATED = "colocated"


def parse_split(value: str) -> tuple[int, int, str | None] | None:
    """``(P, D, decode hardware)`` of a prefill:decode split ``"P:D"`` or ``"P:D@hardware"``
    (whole numbers >= 1 without a common factor, at most :data:`MAX_DEVICES` each; the
    decode instances on another hardware preset, its one name; None: the point's own);
    None for :data:`COLOCATED`.

    Raises:
        InvalidArgumentError: anything else (naming the value); UnknownPresetError: an
            unknown hardware name.
    """
    if value == COLOCATED:
        return None
    ratio, at, hw = value.partition("@") if isinstance(value, str) else ("", "", "")
    parts = ratio.split(":")
    if len(parts) == 2 and all(p.isdigit() for p in parts) and (not at or hw):
        p, d = int(parts[0]), int(parts[1])
        if 1 <= p <= MAX_DEVICES and 1 <= d <= MAX_DEVICES and math.gcd(p, d) == 1:
            return p, d, hardware_name(hw) if at else None
        if 1 <= p and 1 <= d and math.gcd(p, d) > 1:
            g = math.gcd(p, d)
            raise invalid(f"disaggregation: write {ratio!r} as '{p // g}:{d // g}' (a split is a ratio)")
    raise invalid(f"disaggregation must hold '{COLOCATED}' or prefill:decode ratios 'P:D' (1 to {MAX_DEVICES} "
                  f"each), optionally '@hardware' for the decode instances, got {value!r}")


def canonical_split(value: str) -> str:
    """``value`` in its one spelling (the decode hardware's preset name).

    Raises:
        As :func:`parse_split`.
    """
    split = parse_split(value)
    if split is None:
        return COLOCATED
    p, d, hw = split
    return f"{p}:{d}" + (f"@{hw}" if hw else "")


@dataclass(frozen=True)
class Point:
    """One serving configuration (see the module docstring for each field's meaning).

    Attributes:
        hardware: a hardware preset name; devices: devices of the deployment;
        tensor_parallel: devices per replica (a divisor of ``devices``; the deployment
            has ``devices / tensor_parallel`` replicas, :attr:`replicas`).
        kv_dtype: KV storage dtype, its one spelling (a
            :class:`pykvpool.planning.models.StorageDtype`'s name); block_size: tokens per block.
        max_running: requests in flight at most; max_batched_tokens: tokens per step.
        chunked_prefill, preemption, prefix_caching, eviction, layer_groups: the policies.
        disaggregation: :data:`COLOCATED` (every replica serves both phases), or ``"P:D"``:
            of every ``P + D`` replicas, ``P`` are prefill and ``D`` decode instances
            (:attr:`prefill_replicas`, :attr:`decode_replicas`); ``"P:D@hardware"``: the
            decode instances on that preset (:attr:`decode_hardware`), as many devices each.
    """

    hardware: str
    devices: int
    tensor_parallel: int
    kv_dtype: str
    block_size: int
    max_running: int
    max_batched_tokens: int
    chunked_prefill: bool
    preemption: str
    prefix_caching: bool
    eviction: str
    layer_groups: bool
    disaggregation: str = COLOCATED

    @property
    def split(self) -> tuple[int, int] | None:
        """``(P, D)`` of :attr:`disaggregation`, None when colocated.

        Raises:
            InvalidArgumentError: a value :func:`parse_split` refuses.
        """
        split = parse_split(self.disaggregation)
        return None if split is None else split[:2]

    @property
    def decode_hardware(self) -> str:
        """The decode instances' hardware preset: the split's ``@hardware``, else
        :attr:`hardware`.

        Raises:
            InvalidArgumentError: a value :func:`parse_split` refuses.
        """
        split = parse_split(self.disaggregation)
        return self.hardware if split is None or split[2] is None else split[2]

    @property
    def prefill_replicas(self) -> int:
        """Replicas that take the arrivals: all of them when colocated, else the
        prefill instances, ``replicas x P / (P + D)``.

        Raises:
            InvalidArgumentError: as :attr:`split`.
        """
        pd = self.split
        return self.replicas if pd is None else self.replicas * pd[0] // (pd[0] + pd[1])

    @property
    def decode_replicas(self) -> int:
        """Decode instances: 0 when colocated, else ``replicas x D / (P + D)``.

        Raises:
            InvalidArgumentError: as :attr:`split`.
        """
        return self.replicas - self.prefill_replicas

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: ``devices / tensor_parallel``.

        Raises:
            Nothing: arithmetic on a checked point.
        """
        return self.devices // self.tensor_parallel

    def _devices_field(self) -> str:
        return f"x{self.devices}:tp{self.tensor_parallel}"

    def key(self) -> str:
        """A stable, readable identity, e.g.
        ``a100-80gb-sxm|x4:tp2|bf16|b16|r256|t8192|chunked|recompute|-|flat`` (4 devices
        as 2 replicas of 2-way tensor parallelism); a disaggregated point ends in
        ``|pd1:1``.

        Raises:
            Nothing: string formatting.
        """
        cache = f"cache-{self.eviction}" if self.prefix_caching else "-"
        return "|".join([self.hardware, self._devices_field(), self.kv_dtype, f"b{self.block_size}",
                         f"r{self.max_running}", f"t{self.max_batched_tokens}",
                         "chunked" if self.chunked_prefill else "whole", self.preemption, cache,
                         "groups" if self.layer_groups else "flat"]
                        + ([] if self.disaggregation == COLOCATED else [f"pd{self.disaggregation}"]))

    def chain_key(self) -> str:
        """The key without the devices and their split: points differing only in those form
        one chain.

        Raises:
            Nothing: string formatting.
        """
        return self.key().replace(f"|{self._devices_field()}|", "|", 1)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (column name -> value).

        Raises:
            Nothing: a copy of the fields.
        """
        return asdict(self)


def _axis(values: Any, name: str, check: Any) -> tuple[Any, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (tuple, list)) or not values:
        raise invalid(f"{name} must be a non-empty list, got {values!r}")
    out = tuple(check(v, name) for v in values)
    if len(set(out)) != len(out):
        raise invalid(f"{name} holds a value twice: {list(values)!r}")
    return out


def _int_in(lo: int, hi: int) -> Any:
    def check(v: object, name: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise invalid(f"{name} must hold integers in {lo}..={hi}, got {v!r}")
        return v
    return check


def _flag(v: object, name: str) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must hold bools, got {type(v).__name__}")
    return v


def _choice(choices: tuple[str, ...]) -> Any:
    def check(v: object, name: str) -> str:
        if not isinstance(v, str) or v not in choices:
            raise invalid(f"{name} must hold values of {', '.join(choices)}, got {v!r}")
        return v
    return check


def _hardware(v: object, name: str) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{name} must hold preset names, got {type(v).__name__}")
    return hardware_name(v)


def _dtype(v: object, name: str) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{name} must hold dtype names, got {type(v).__name__}")
    return storage_dtype(v).name


@dataclass(frozen=True)
class SearchSpace:
    """The axes of a search; each a non-empty list without repeats (defaults: one value).

    Attributes:
        hardware: hardware presets (:data:`pykvpool.planning.hardware.HARDWARE`).
        devices: devices of a deployment, 1 to :data:`MAX_DEVICES`.
        tensor_parallel: devices per replica (default :data:`TENSOR_PARALLEL`); a point
            takes each that divides its devices (so 4 devices are 4 replicas of one device,
            2 of 2 or one of 4), and a device count no value divides has no point.
        kv_dtypes: KV storage dtypes (``bf16``, ``fp8``, ``int8``, ...), any spelling
            :func:`pykvpool.planning.models.storage_dtype` reads, kept as its one spelling
            (``fp16`` becomes ``f16``).
        block_sizes: tokens per block, 1 to 65,536.
        max_running: requests in flight at most, >= 1.
        max_batched_tokens: tokens per step, 1 to :data:`pykvpool.simulate.MAX_STEP_TOKENS`.
        chunked_prefill, prefix_caching, layer_groups: lists of bools.
        preemption: ``recompute`` / ``swap``; eviction: ``lru``, ``fifo``, ``lfu``, ``priority``.
        disaggregation: :data:`COLOCATED` and prefill:decode ratios ``"P:D"`` (lowest
            terms), each optionally ``@hardware`` (the decode instances' preset, kept as its
            one name); a ratio applies where ``P + D`` divides a point's replicas.

    Raises:
        InvalidArgumentError: an empty axis, a repeated value (two spellings of one dtype
            included), a value out of range or an unknown name (naming the axis); TypeError: a non-bool in a bool axis, a
            non-string name.
    """

    hardware: tuple[str, ...] = ("a100-80gb-sxm",)
    devices: tuple[int, ...] = (1,)
    tensor_parallel: tuple[int, ...] = TENSOR_PARALLEL
    kv_dtypes: tuple[str, ...] = ("bf16",)
    block_sizes: tuple[int, ...] = (16,)
    max_running: tuple[int, ...] = (256,)
    max_batched_tokens: tuple[int, ...] = (8192,)
    chunked_prefill: tuple[bool, ...] = (True,)
    preemption: tuple[str, ...] = ("recompute",)
    prefix_caching: tuple[bool, ...] = (False,)
    eviction: tuple[str, ...] = ("lru",)
    layer_groups: tuple[bool, ...] = (False,)
    disaggregation: tuple[str, ...] = (COLOCATED,)

    def __post_init__(self) -> None:
        checks = {"hardware": _hardware, "devices": _int_in(1, MAX_DEVICES),
                  "tensor_parallel": _int_in(1, MAX_DEVICES), "kv_dtypes": _dtype,
                  "block_sizes": _int_in(1, _MAX_BLOCK_SIZE), "max_running": _int_in(1, 2**31 - 1),
                  "max_batched_tokens": _int_in(1, MAX_STEP_TOKENS), "chunked_prefill": _flag,
                  "preemption": _choice(PREEMPTIONS), "prefix_caching": _flag, "eviction": _choice(EVICTIONS),
                  "layer_groups": _flag, "disaggregation": _split}
        for f in fields(self):
            object.__setattr__(self, f.name, _axis(getattr(self, f.name), f.name, checks[f.name]))
        if self.size() > MAX_POINTS:
            raise invalid(f"the space holds {self.size():,} points, more than {MAX_POINTS:,}")

    def size(self) -> int:
        """Points of the full product, before the rules of :meth:`points` drop any.

        Raises:
            Nothing: arithmetic on checked axes.
        """
        return math.prod(len(getattr(self, f.name)) for f in fields(self))

    def points(self, model: ModelConfig, prefix_workload: bool) -> list[Point]:
        """Every distinct runnable point, in axis order (devices, then their split, vary
        fastest within a chain).

        Rules: a tensor-parallel degree only where it divides the devices; a prefill:decode
        split ``P:D`` only where ``P + D`` divides the replicas, on hardware with a network
        (:attr:`pykvpool.planning.hardware.Hardware.network_bandwidth`); prefix caching only for a ``prefix_workload`` (prompts given as token ids or
        block keys: otherwise it caches nothing); the eviction policy varies only with
        prefix caching (``eviction[0]`` otherwise); layer groups only for a windowed model
        (``model.windowed``: otherwise one group, the same pool), with every preemption
        and with or without prefix caching.

        Raises:
            Nothing: the axes were checked at construction.
        """
        out: list[Point] = []
        for hw in self.hardware:
            for dt in self.kv_dtypes:
                for bs in self.block_sizes:
                    for mr in self.max_running:
                        for mbt in self.max_batched_tokens:
                            for ch in self.chunked_prefill:
                                out += self._tail(model, prefix_workload, (hw, dt, bs, mr, mbt, ch))
        return out

    def _tail(self, model: ModelConfig, prefix_workload: bool, head: tuple[Any, ...]) -> list[Point]:
        hw, dt, bs, mr, mbt, ch = head
        out: list[Point] = []
        for pre in self.preemption:
            for pc in self.prefix_caching:
                if pc and not prefix_workload:
                    continue
                for ev in self.eviction if pc else self.eviction[:1]:
                    for lg in self.layer_groups:
                        if lg and not model.windowed:
                            continue
                        for pd in self.disaggregation:
                            out += [Point(hw, n, tp, dt, bs, mr, mbt, ch, pre, pc, ev, lg, pd)
                                    for n in self.devices for tp in self.tensor_parallel
                                    if n % tp == 0 and _splits(pd, n // tp, hw)]
        return out


def _splits(pd: str, replicas: int, hardware: str) -> bool:
    """Whether ``replicas`` replicas on ``hardware`` can take the split ``pd`` (its decode
    instances on their own hardware, when it names one: both sides need a network)."""
    split = parse_split(pd)
    if split is None:
        return True
    sides = (hardware, split[2] or hardware)
    return replicas % (split[0] + split[1]) == 0 and all(hardware_preset(h).network_bandwidth > 0 for h in sides)


def _split(v: object, name: str) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{name} must hold '{COLOCATED}' or 'P:D' strings, got {type(v).__name__}")
    return canonical_split(v)
