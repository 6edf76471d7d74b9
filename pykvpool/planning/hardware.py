"""Accelerator presets with their public figures, and "this machine" measured.

Units: bytes, bytes/s, FLOP/s. Public figures are the vendors' datasheet numbers (dense,
no sparsity), not measurements: peak HBM bandwidth and peak tensor throughput per dtype.
Memory is the total that ``nvidia-smi`` reports for the device (A100 80GB: 81,920 MiB;
H100 SXM: 81,559 MiB; H200: 143,771 MiB), which is what a budget fraction applies to. ``measure_this_machine`` measures the host CPU with the compiled probes of the
kernel module (``pykvpool.read_bandwidth`` and ``pykvpool.peak_flops``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from pykvpool import _native
from pykvpool.errors import UnknownPresetError

__all__ = [
    "HARDWARE",
    "HARDWARE_ALIASES",
    "Hardware",
    "NETWORK_MESSAGE_LATENCY",
    "NVLINK_STEP_LATENCY",
    "hardware_name",
    "hardware_preset",
    "measure_this_machine",
]


@dataclass(frozen=True)
class Hardware:
    """One device's memory, bandwidth and compute roofs.

    Attributes:
        name: display name.
        memory_bytes: device memory, in bytes.
        bandwidth: peak memory bandwidth, bytes/s.
        peak_flops: peak dense throughput per compute dtype (``"bf16"``, ``"fp32"``, ...),
            FLOP/s.
        source: where the figures come from ("datasheet" or "measured ...").
        link_bandwidth: bytes/s one device sends to its peers (and receives) over the
            device interconnect, one direction; 0 when it has none (one device only).
        link_latency: seconds per step of a ring all-reduce over that link.
        power_watts: the device's maximum board power (its datasheet TDP), watts; 0 when
            unknown.
        network_bandwidth: bytes/s one device sends (and receives) to another server over
            its network adapter, one direction; 0 when it has none. Prefill/decode
            disaggregation moves KV over it.
        network_latency: seconds one message over that network costs beyond its bytes.
    """

    name: str
    memory_bytes: float
    bandwidth: float
    peak_flops: dict[str, float] = field(default_factory=dict)
    source: str = "datasheet"
    link_bandwidth: float = 0.0
    link_latency: float = 0.0
    power_watts: float = 0.0
    network_bandwidth: float = 0.0
    network_latency: float = 0.0

    def flops(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; fp16 falls back to bf16 and fp8/int8 to the 16-bit
        figure when the device lists none.

        Raises:
            UnknownPresetError: no figure for ``dtype`` or its fallbacks.
        """
        for key in (dtype, {"fp16": "bf16", "fp8": "bf16", "int8": "bf16"}.get(dtype, dtype), "fp32"):
            if key in self.peak_flops:
                return self.peak_flops[key]
        raise UnknownPresetError("compute dtype", dtype, sorted(self.peak_flops))

    def ridge_point(self, dtype: str) -> float:
        """Arithmetic intensity (FLOP/byte) where the compute roof meets the memory roof.

        Raises:
            UnknownPresetError: no peak for ``dtype`` or its fallbacks (see :meth:`flops`).
        """
        return self.flops(dtype) / self.bandwidth


_MIB = float(1 << 20)

#: Seconds per step of a ring all-reduce over NVLink: NCCL's own cost model (src/graph/tuning.cc,
#: ``hwLat``, NVLink, ring, LL128 protocol: 1.9 us per step).
NVLINK_STEP_LATENCY = 1.9e-6
#: Seconds one message between servers costs beyond its bytes: NCCL's own cost model
#: (src/graph/tuning.cc, ring, Simple protocol, the one large transfers use: 8.4 us base
#: plus 9.6 us for a network hop).
NETWORK_MESSAGE_LATENCY = 18e-6

HARDWARE: dict[str, Hardware] = {
    # NVIDIA A100 80GB SXM datasheet: 80 GB HBM2e (81,920 MiB), 2,039 GB/s, 312 TFLOP/s BF16 dense,
    # 19.5 TFLOP/s FP32 (the article's A100 roof and decode bound use these figures); NVLink 3:
    # 600 GB/s per GPU, both directions together; max TDP 400 W. DGX A100 datasheet: one
    # 200 Gb/s HDR InfiniBand adapter per GPU (25 GB/s each way).
    "a100-80gb-sxm": Hardware("A100-80GB SXM", 81920 * _MIB, 2.039e12,
                              {"bf16": 312e12, "fp16": 312e12, "int8": 624e12, "fp32": 19.5e12},
                              link_bandwidth=300e9, link_latency=NVLINK_STEP_LATENCY, power_watts=400.0,
                              network_bandwidth=25e9, network_latency=NETWORK_MESSAGE_LATENCY),
    # NVIDIA H100 SXM5 datasheet: 80 GB HBM3 (81,559 MiB usable), 3.35 TB/s, 989 TFLOP/s BF16 dense,
    # 1,979 TFLOP/s FP8 dense, 67 TFLOP/s FP32; NVLink 4: 900 GB/s per GPU, both directions;
    # max TDP up to 700 W. DGX H100 datasheet: one 400 Gb/s ConnectX-7 adapter per GPU
    # (50 GB/s each way).
    "h100-sxm": Hardware("H100 SXM", 81559 * _MIB, 3.35e12,
                         {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "int8": 1979e12,
                          "fp32": 67e12}, link_bandwidth=450e9, link_latency=NVLINK_STEP_LATENCY,
                         power_watts=700.0, network_bandwidth=50e9, network_latency=NETWORK_MESSAGE_LATENCY),
    # NVIDIA H200 SXM datasheet: 141 GB HBM3e (143,771 MiB), 4.8 TB/s, same tensor cores and NVLink
    # (900 GB/s) as H100 SXM; max TDP up to 700 W. DGX H200 datasheet: one 400 Gb/s
    # ConnectX-7 adapter per GPU, as the DGX H100.
    "h200": Hardware("H200 SXM", 143771 * _MIB, 4.8e12,
                     {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "int8": 1979e12,
                      "fp32": 67e12}, link_bandwidth=450e9, link_latency=NVLINK_STEP_LATENCY,
                     power_watts=700.0, network_bandwidth=50e9, network_latency=NETWORK_MESSAGE_LATENCY),
}
"""Device presets by lower-case name (datasheet figures); see :func:`hardware_preset`."""

HARDWARE_ALIASES: dict[str, str] = {"a100": "a100-80gb-sxm", "a100-80gb": "a100-80gb-sxm", "h100": "h100-sxm",
                                    "h200-sxm": "h200"}
"""Short names users type for a preset, each read as that preset's one name."""


def hardware_name(name: str) -> str:
    """The preset name ``name`` stands for: a name of :data:`HARDWARE` or an alias of
    :data:`HARDWARE_ALIASES` (case-insensitive, spaces stripped).

    Raises:
        UnknownPresetError: neither; the message lists the names and the aliases.
    """
    key = name.strip().lower()
    key = HARDWARE_ALIASES.get(key, key)
    if key not in HARDWARE:
        raise UnknownPresetError("hardware", name, sorted(HARDWARE) + sorted(HARDWARE_ALIASES))
    return key


def hardware_preset(name: str) -> Hardware:
    """Look up a preset by name (case-insensitive), e.g. ``"a100-80gb-sxm"``, or by an alias
    such as ``"h100"`` (:data:`HARDWARE_ALIASES`).

    Raises:
        UnknownPresetError: not a name of :data:`HARDWARE` nor an alias.
    """
    return HARDWARE[hardware_name(name)]


def _physical_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return float("nan")


def measure_this_machine(nbytes: int | None = None, threads: int | None = None,
                         clock: Literal["wall", "cpu"] = "wall") -> Hardware:
    """Measure this machine: streaming read bandwidth (bytes/s) and peak fp32 FLOP/s with
    the compiled probes, physical memory from the OS.

    Args:
        nbytes: bytes the bandwidth probe streams (None: the probe's default).
        threads: threads the probes use (None: all cores).
        clock: ``"wall"`` (default), or ``"cpu"``: the probes' busiest thread's CPU time,
            which leaves out the time a shared virtual machine's CPUs were taken away
            (steal): the machine's rates while it runs, not what a caller waited.

    Raises:
        TypeError: ``clock`` not a str.
        InvalidArgumentError: ``nbytes`` or ``threads`` out of the probes' range, or
            ``clock`` neither ``"wall"`` nor ``"cpu"``.
    """
    bandwidth = float(_native.read_bandwidth(nbytes=nbytes, threads=threads, clock=clock))
    flops = float(_native.peak_flops(threads=threads, clock=clock))
    by = "" if clock == "wall" else f", clock={clock!r}"
    return Hardware(
        name="this machine (CPU)",
        memory_bytes=_physical_memory_bytes(),
        bandwidth=bandwidth,
        peak_flops={"fp32": flops},
        source=f"measured (pykvpool.read_bandwidth, pykvpool.peak_flops{by})",
    )
