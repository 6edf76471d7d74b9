"""A tensor-parallel replica's step time: the roofline of N devices adds two ring
all-reduces per layer to every step that computes tokens, from the device link's figures;
one device pays none. The expected values are written from the model's statement (the
``Roofline`` docstring), not from its code."""

from __future__ import annotations

import numpy as np
import pytest

from pykvpool import InvalidArgumentError
from pykvpool import simulate as sim
from pykvpool.planning.hardware import HARDWARE, Hardware, hardware_preset
from pykvpool.planning.models import model_preset
from pykvpool.planning.roofline import Roofline
from pykvpool.search.evaluate import deploy, replica_hardware
from pykvpool.search.space import SearchSpace

LLAMA70 = model_preset("llama-3-70b")  # 80 layers, 64 query heads of 128
H100 = hardware_preset("h100-sxm")


def replica(devices: int, hw: Hardware = H100) -> Roofline:
    return Roofline(LLAMA70, replica_hardware(hw, devices), devices=devices)


def test_one_device_pays_no_all_reduce() -> None:
    figs = Roofline(LLAMA70, H100).figures()
    assert len(figs) == 11 and figs[9:] == [0.0, 0.0]
    assert replica(1).figures() == figs


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_a_replica_pays_two_ring_all_reduces_per_layer(devices: int) -> None:
    per_step, per_token = replica(devices).figures()[9:]
    ring_steps = 2 * (devices - 1)
    all_reduces = 2 * 80
    assert per_step == pytest.approx(all_reduces * ring_steps * 1.9e-6, rel=1e-12)
    token_bytes = 64 * 128 * 2  # one token's activations, bf16
    assert per_token == pytest.approx(all_reduces * ring_steps / devices * token_bytes / 450e9, rel=1e-12)


def test_every_preset_has_a_link() -> None:
    for name, hw in HARDWARE.items():
        assert hw.link_bandwidth > 0 and hw.link_latency > 0, name
        assert replica(2, hw).figures()[9] > 0


def test_more_devices_never_decode_faster_than_their_roofs_allow() -> None:
    """The same decode-heavy workload: two devices finish each token in more than half the
    time one takes (the all-reduces), and in less than one takes (the roofs doubled)."""
    n = 16
    w = sim.Workload(arrival=np.zeros(n), prompt_len=np.full(n, 512), output_len=np.full(n, 64))
    cfg = sim.SimConfig(num_blocks=4096, block_size=16)
    tpot = {d: float(sim.run(w, cfg, replica(d)).summary["tpot_mean"]) for d in (1, 2)}
    assert tpot[1] / 2 < tpot[2] < tpot[1], tpot


@pytest.mark.parametrize("devices,err", [(0, InvalidArgumentError), (True, InvalidArgumentError),
                                         (2.0, InvalidArgumentError)])
def test_a_bad_device_count_is_named(devices: object, err: type[Exception]) -> None:
    with pytest.raises(err, match="devices"):
        Roofline(LLAMA70, H100, devices=devices).figures()  # type: ignore[arg-type]


def test_a_replica_without_a_link_is_refused() -> None:
    bare = Hardware("no link", H100.memory_bytes, H100.bandwidth, dict(H100.peak_flops))
    assert Roofline(LLAMA70, bare).figures()[9:] == [0.0, 0.0]
    with pytest.raises(InvalidArgumentError, match="link_bandwidth"):
        Roofline(LLAMA70, replica_hardware(bare, 2), devices=2).figures()


@pytest.mark.parametrize("devices,copies", [(1, 1.0), (4, 1.0), (8, 1.0), (16, 2.0), (32, 4.0)])
def test_kv_heads_are_divided_then_replicated(devices: int, copies: float) -> None:
    assert LLAMA70.kv_replicas(devices) == copies  # 8 K/V heads


def test_a_latent_is_kept_whole_on_every_device() -> None:
    mla = model_preset("deepseek-v3")
    assert mla.kv_latent_dim and mla.num_kv_heads == 1
    assert [mla.kv_replicas(n) for n in (1, 2, 8)] == [1.0, 2.0, 8.0]


@pytest.mark.parametrize("devices", [0, -1, True, 2.0])
def test_kv_replicas_names_a_bad_count(devices: object) -> None:
    with pytest.raises(InvalidArgumentError, match="devices"):
        LLAMA70.kv_replicas(devices)  # type: ignore[arg-type]


def test_deploy_counts_every_copy_of_the_kv() -> None:
    """A latent model on 1 and 2 devices: twice the memory, the weights once, and a pool
    of two copies: fewer than twice one device's blocks; the roofline reads both copies."""
    mla = model_preset("deepseek-v2-lite")
    space = SearchSpace(hardware=("h100-sxm",), devices=(1, 2), tensor_parallel=(1, 2), kv_dtypes=("bf16",),
                        block_sizes=(16,))
    points = [p for p in space.points(mla, prefix_workload=False) if p.replicas == 1]
    (one, r1), (two, r2) = (deploy(p, mla) for p in points)
    assert two.num_blocks < 2 * one.num_blocks
    assert r2.figures()[4] == 2 * r1.figures()[4]
