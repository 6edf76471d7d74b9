"""The groups of one hybrid pool for a model: how vLLM's hybrid KV-cache manager lays a
model's attention layers onto one block space.

A :class:`pykvpool.BlockPool` has one block size and one physical block space shared by
all its groups; every group has the same number of layers, so a block has the same bytes
whichever group holds it: ``block_size x layers_per_group x`` (K+V bytes of one token in
one layer, MLA: the latent). The model's layers of one attention kind (same kind, window
and sinks) are split into groups of ``layers_per_group`` layers; each group gets its own
block table per sequence.

The group size, vLLM's rule (``_get_kv_cache_groups_uniform_page_size`` in
``vllm/v1/core/kv_cache_utils.py``):

1. count the layers of each attention kind: ``n_1 .. n_k``;
2. ``layers_per_group = min(n)``, the "1" of the n:1 patterns of today's hybrid models
   (Gemma 3 5:1, Llama 4 3:1); but when ``max(n) < 1.25 x min(n)`` it is ``max(n)`` (nearly
   equal counts: pad the smaller kind once instead of splitting the larger one);
3. kind ``i`` gets ``k = ceil(n_i / layers_per_group)`` groups, its layers dealt
   round-robin (group ``j`` takes layers ``j, j + k, ...``); the ``layers_per_group x k -
   n_i`` slots left are padding, which costs memory (every block has the bytes of
   ``layers_per_group`` layers) and holds nothing.

So Gemma-3-12B (40 sliding + 8 full): 5 sliding + 1 full groups of 8 layers; Gemma-2-9B
(21 + 21) and gpt-oss-20b (12 + 12): 1 + 1; Mistral-7B (32 sliding) and every full-attention
model: one group of all layers, whose block is ``block_size x`` the ledger's bytes per token.
Counts that share no useful divisor are padded as vLLM pads them, and the padding is
reported: 5 + 7 layers give ``layers_per_group`` 5 and 1 + 2 groups (the 7 dealt as 4 + 3)
with 3 padding slots (12 of 15 slots used); 5 + 6 give 6 (one padding slot). A split by ``gcd(n)`` (12 groups of
one layer) would waste nothing but is not what vLLM runs; we follow vLLM so the capacity is
the one it serves, and :attr:`PoolLayout.padding_layers` states the cost.

A layout is the groups of one :class:`pykvpool.BlockPool`, which holds at most
:data:`MAX_POOL_GROUPS` (64) groups: counts whose grouping needs more (e.g. 65 sliding
layers beside one full one, 65 groups of one layer) are refused, before any group is built.

Units: layers, tokens, blocks, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from pykvpool._native import ChunkedAttention, FullAttention, InvalidArgumentError, SlidingWindow
from pykvpool.planning.layers import LayerGroup
from pykvpool.planning.models import ModelConfig, StorageDtype, storage_dtype

__all__ = ["MAX_POOL_GROUPS", "NEAR_EQUAL_RATIO", "PoolGroup", "PoolLayout", "layers_per_group", "pool_layout"]

NEAR_EQUAL_RATIO = 1.25
"""vLLM's threshold: when the largest layer count is below this times the smallest, the
group size is the largest count (pad) instead of the smallest (split)."""
MAX_POOL_GROUPS = 64
"""The most groups one :class:`pykvpool.BlockPool` holds (its ``groups`` argument takes 1
to 64), so the most groups a :class:`PoolLayout` has."""


@dataclass(frozen=True)
class PoolGroup:
    """One group of a hybrid pool: ``layers`` model layers of one attention kind, padded to
    the pool's ``layers_per_group`` with ``padding`` empty slots.

    Attributes:
        kind: ``"full"``, ``"sliding"`` or ``"chunked"``.
        layers: model layers in the group.
        padding: empty layer slots (``layers_per_group - layers``).
        window: window (sliding) or chunk (chunked) in tokens; ``None`` for full.
        sink_tokens: sink tokens of a sliding group (0 otherwise).
    """

    kind: str
    layers: int
    padding: int
    window: int | None = None
    sink_tokens: int = 0

    def tokens_held(self, seq_len: int) -> int:
        """Tokens each layer of the group holds for a sequence of ``seq_len`` tokens (the
        ledger's count, :meth:`pykvpool.planning.layers.LayerGroup.tokens_held`).

        Raises:
            InvalidArgumentError: ``seq_len`` not an integer >= 0.
        """
        return LayerGroup(self.kind, self.layers, self.window, self.sink_tokens).tokens_held(seq_len)

    def blocks_held(self, seq_len: int, block_size: int) -> int:
        """``ceil(tokens_held(seq_len) / block_size)``: the group's blocks for one sequence
        in the ledger's count (the pool may hold one more at a window's unaligned start and
        the blocks of the last growth, see :mod:`pykvpool.planning.sweeps`).

        Raises:
            InvalidArgumentError: ``seq_len`` < 0 or ``block_size`` < 1.
        """
        _positive("block_size", block_size)
        return -(-self.tokens_held(seq_len) // block_size)

    def spec(self) -> FullAttention | SlidingWindow | ChunkedAttention:
        """The attention kind of the group for :class:`pykvpool.BlockPool`:
        ``FullAttention()``, ``SlidingWindow(window, sink_tokens)`` or
        ``ChunkedAttention(window)``.

        Raises:
            InvalidArgumentError: a window above what the pool accepts (``2**31 - 1`` tokens).
        """
        if self.window is None:
            return FullAttention()
        if self.kind == "sliding":
            return SlidingWindow(self.window, self.sink_tokens)
        return ChunkedAttention(self.window)

    def describe(self) -> str:
        """``"8 sliding (1,024)"``, ``"2 sliding (5,000) + 3 padding"``."""
        text = LayerGroup(self.kind, self.layers, self.window, self.sink_tokens).describe()
        return text + (f" + {self.padding} padding" if self.padding else "")


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def layers_per_group(counts: list[int]) -> int:
    """vLLM's group size for layer counts ``counts`` (one per attention kind): ``min``,
    or ``max`` when ``max < 1.25 x min``.

    Raises:
        InvalidArgumentError: an empty list or a count < 1.
    """
    if not counts:
        raise InvalidArgumentError("counts must hold at least one layer count")
    for n in counts:
        _positive("counts", n)
    lo, hi = min(counts), max(counts)
    return hi if hi < NEAR_EQUAL_RATIO * lo else lo


@dataclass(frozen=True)
class PoolLayout:
    """The hybrid pool of one model at one block size and KV dtype.

    Attributes:
        model: the model's name.
        block_size: tokens per block.
        layers_per_group: layer slots of every group (and of every block).
        layer_bytes: K+V bytes of one token in one layer (MLA: the latent), scales included.
        groups: the groups, in the order of the model's layer groups.
    """

    model: str
    block_size: int
    layers_per_group: int
    layer_bytes: int
    groups: tuple[PoolGroup, ...]

    @property
    def block_bytes(self) -> int:
        """Bytes of one block: ``block_size x layers_per_group x layer_bytes``."""
        return self.block_size * self.layers_per_group * self.layer_bytes

    @property
    def padding_layers(self) -> int:
        """Empty layer slots over all groups (0 when the counts divide evenly)."""
        return sum(g.padding for g in self.groups)

    def num_blocks(self, kv_budget_bytes: float) -> int:
        """Blocks of :attr:`block_bytes` in ``kv_budget_bytes`` (0 when negative):
        ``floor(floor(kv_budget / (layers_per_group x layer_bytes)) / block_size)``, which
        for a model of one kind is ``MemoryLedger.token_capacity // block_size``.

        Raises:
            InvalidArgumentError: ``kv_budget_bytes`` not a finite number.
        """
        if not isinstance(kv_budget_bytes, (int, float)) or kv_budget_bytes != kv_budget_bytes \
                or kv_budget_bytes in (float("inf"), float("-inf")):
            raise InvalidArgumentError(f"kv_budget_bytes must be a finite number, got {kv_budget_bytes!r}")
        if kv_budget_bytes <= 0:
            return 0
        return int(kv_budget_bytes // (self.layers_per_group * self.layer_bytes)) // self.block_size

    def blocks_per_sequence(self, seq_len: int) -> int:
        """Blocks one sequence of ``seq_len`` tokens holds over all groups in the ledger's
        count: ``sum of ceil(tokens_held / block_size)``.

        Raises:
            InvalidArgumentError: ``seq_len`` not an integer >= 0.
        """
        return sum(g.blocks_held(seq_len, self.block_size) for g in self.groups)

    def max_sequences(self, seq_len: int, num_blocks: int) -> int:
        """``num_blocks // blocks_per_sequence(seq_len)``: the ledger's count of sequences
        of ``seq_len`` tokens a pool of ``num_blocks`` blocks holds.

        Raises:
            InvalidArgumentError: ``seq_len`` < 1 or ``num_blocks`` < 0.
        """
        _positive("seq_len", seq_len)
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise InvalidArgumentError(f"num_blocks must be an integer >= 0, got {num_blocks!r}")
        return num_blocks // self.blocks_per_sequence(seq_len)

    def specs(self) -> list[FullAttention | SlidingWindow | ChunkedAttention]:
        """The attention kinds of the groups, in order (see :meth:`PoolGroup.spec`): the
        ``groups`` argument of ``BlockPool(num_blocks, block_size, groups)``.

        Raises:
            InvalidArgumentError: a window the pool refuses.
        """
        return [g.spec() for g in self.groups]

    def describe(self) -> str:
        """``"6 groups of 8 layers: 5 x 8 sliding (1,024) + 1 x 8 full; block 16 tokens =
        1.00 MiB"``."""
        parts = [f"{len(list(run))} x {g.describe()}" for g, run in groupby(self.groups)]
        return (f"{len(self.groups)} group{'s' * (len(self.groups) != 1)} of "
                f"{self.layers_per_group} layers: " + " + ".join(parts)
                + f"; block {self.block_size} tokens = {self.block_bytes / 2**20:.2f} MiB"
                + (f"; {self.padding_layers} padding layer slots" if self.padding_layers else ""))


def _kinds(model: ModelConfig) -> list[tuple[tuple[str, int | None, int], int]]:
    """(kind, window, sinks) -> layer count, in order of first appearance (vLLM groups
    layers by equal spec)."""
    counts: dict[tuple[str, int | None, int], int] = {}
    for g in model.groups:
        key = (g.kind, g.window, g.sink_tokens)
        counts[key] = counts.get(key, 0) + g.layers
    return list(counts.items())


def pool_layout(model: ModelConfig, dtype: StorageDtype | str = "bf16",
                block_size: int = 16) -> PoolLayout:
    """The groups of one hybrid pool for ``model`` (vLLM's rule, see the module doc), the
    layers per group and the bytes of one block.

    Args:
        model: the model; its layer groups of equal kind, window and sinks are merged.
        dtype: the KV storage dtype (a :class:`StorageDtype` or its spelling).
        block_size: tokens per block.

    Raises:
        InvalidArgumentError: ``model`` is not a :class:`ModelConfig`, ``block_size`` < 1,
            a malformed dtype granularity, or layer counts whose grouping needs more than
            :data:`MAX_POOL_GROUPS` groups.
        UnknownPresetError: an unknown dtype name.
    """
    if not isinstance(model, ModelConfig):
        raise InvalidArgumentError(f"model must be a ModelConfig, got {type(model).__name__}")
    _positive("block_size", block_size)
    dt = storage_dtype(dtype) if isinstance(dtype, str) else dtype
    kinds = _kinds(model)
    size = layers_per_group([n for _, n in kinds])
    total = sum(-(-n // size) for _, n in kinds)
    if total > MAX_POOL_GROUPS:
        counts = " + ".join(f"{n:,} {kind}" for (kind, _, _), n in kinds)
        raise InvalidArgumentError(
            f"{model.name}: {counts} layers make {total:,} groups of {size:,} layer{'s' * (size != 1)} "
            f"(vLLM's grouping); a BlockPool holds at most {MAX_POOL_GROUPS}")
    groups: list[PoolGroup] = []
    for (kind, window, sinks), n in kinds:
        k = -(-n // size)  # vLLM deals the layers round-robin: group i gets layers[i::k]
        for i in range(k):
            layers = len(range(i, n, k))
            groups.append(PoolGroup(kind, layers, size - layers, window, sinks))
    return PoolLayout(model.name, block_size, size, model.kv_layer_bytes(dt), tuple(groups))
