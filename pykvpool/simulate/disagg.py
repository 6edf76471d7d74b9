"""Prefill/decode disaggregation in the simulator (Splitwise, DistServe, Mooncake).

:class:`Disaggregation` makes a :class:`pykvpool.simulate.SimConfig`'s ``replicas`` prefill
instances and adds decode instances behind them; each request's KV moves from its prefill
instance to a decode instance over a link of finite bandwidth. The engine's rules (in
Rust, ``rust/sim/disagg.rs``):

- A prefill instance schedules prompts as any engine does; the step that completes a
  prompt samples the first output token (the time to first token ends there). A request
  of one output token finishes there; any other leaves the batch, its blocks held until
  its KV has moved.
- At that step's end the router's policy over the decode instances picks one (a request
  counts 1 pending token until it finishes), and the transfer of ``prompt_len x
  bytes_per_token`` bytes queues first come first served on the sender's and the
  receiver's link (``bandwidth`` bytes/s each). With ``layers > 1`` it streams the last
  prefill step's layers as they are computed; it arrives ``latency`` seconds after its
  last byte left.
- A decode instance admits it at its first step that starts once the KV has arrived and
  fits (as a swapped request is resumed, after its own swapped and preempted requests);
  until then the KV waits outside its pool. A prefill instance whose pool is full of KV
  held for transfers waits for the first of them to be done.
- A mixed pool (``mixed_tokens``): an arrival that finds every prefill instance with that
  many tokens pending goes to a decode instance, which serves it whole.

The result gains the request columns ``decode_replica`` (-1: none), ``kv_ready`` and
``decode_start`` (seconds; NaN: none) and the summary ``kv_transfers``,
``kv_transfer_bytes``, ``kv_transfer_*`` (first token to KV arrived) and ``decode_wait_*``
(KV arrived to admission).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from pykvpool import _native
from pykvpool.checks import check_count as _count, check_positive as _positive, invalid as _invalid

#: Most layers a transfer is pipelined over (:attr:`Disaggregation.layers`).
MAX_LINK_LAYERS = 1 << 16

__all__ = ["Disaggregation", "MAX_LINK_LAYERS"]


@dataclass(frozen=True)
class Disaggregation:
    """Decode instances behind a deployment's prefill instances, and the KV link.

    Attributes:
        decode_replicas: decode instances, 1 to :data:`pykvpool.simulate.MAX_REPLICAS`.
        bandwidth: bytes/s one instance sends or receives KV at (all its devices
            together; finite, > 0).
        bytes_per_token: KV bytes one prompt token moves (every layer's keys and values
            as the decode instances store them; finite, > 0), e.g.
            ``ModelConfig.kv_bytes_per_token()``.
        latency: seconds from a transfer's last byte leaving to its KV being usable
            (default 0.0).
        layers: parts the transfer is pipelined over, layer by layer with the last
            prefill step (default 1: sent after it), 1 to :data:`MAX_LINK_LAYERS`.
        decode_num_blocks: blocks of each decode instance's pool (default None: the
            configuration's ``num_blocks``); decode instances do not cache prefixes.
        decode_time_model: the decode instances' step time when their hardware or
            parallelism differs from the prefill instances' (a
            :data:`pykvpool.simulate.TimeModel`; default None: the run's ``time_model``);
            :func:`pykvpool.simulate.run`'s ``decode_time_model`` overrides it.
        mixed_tokens: a mixed pool (Splitwise's): an arrival that finds every prefill
            instance with at least this many tokens pending (prompts not yet at their
            first token, as the router counts them) goes to a decode instance, which
            serves it whole without a transfer (default None: never; 0: always).

    Raises:
        InvalidArgumentError: a count out of range or a bool as one, a bandwidth, size or
            latency that is not a finite number in range; each names the attribute.
    """

    decode_replicas: int
    bandwidth: float
    bytes_per_token: float
    latency: float = 0.0
    layers: int = 1
    decode_num_blocks: Optional[int] = None
    mixed_tokens: Optional[int] = None
    decode_time_model: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        limit = _native.SIM_MAX_REPLICAS
        if _count(self.decode_replicas, "disaggregation.decode_replicas", 1) > limit:
            raise _invalid(f"disaggregation.decode_replicas must be in 1..={limit}, got {self.decode_replicas}")
        _positive(self.bandwidth, "disaggregation.bandwidth")
        _positive(self.bytes_per_token, "disaggregation.bytes_per_token")
        _positive(self.latency, "disaggregation.latency", zero=True)
        if _count(self.layers, "disaggregation.layers", 1) > MAX_LINK_LAYERS:
            raise _invalid(f"disaggregation.layers must be in 1..={MAX_LINK_LAYERS}, got {self.layers}")
        if self.decode_num_blocks is not None:
            _count(self.decode_num_blocks, "disaggregation.decode_num_blocks", 1)
        if self.mixed_tokens is not None and _count(self.mixed_tokens, "disaggregation.mixed_tokens") >= 2**63:
            raise _invalid(f"disaggregation.mixed_tokens must be below 2**63, got {self.mixed_tokens}")

    def as_dict(self) -> dict[str, object]:
        """The ``disaggregation`` dict of :func:`pykvpool._native.run_simulation`.

        Raises:
            Nothing.
        """
        return {"decode_replicas": self.decode_replicas, "decode_num_blocks": self.decode_num_blocks,
                "bandwidth": self.bandwidth, "latency": self.latency,
                "bytes_per_token": self.bytes_per_token, "layers": self.layers, "mixed_tokens": self.mixed_tokens}
