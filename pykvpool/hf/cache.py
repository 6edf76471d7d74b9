"""``PagedKvCache``: a transformers ``Cache`` whose K/V live in pykvpool's pages.

One :class:`BlockPool` (one group per attention kind of the model) holds every row of the
batch as a sequence, and one :class:`KvCache` holds every layer's K/V. transformers calls
``update`` before each layer's attention; the K/V are written, and read back, by the
``"pykvpool"`` attention function (:mod:`pykvpool.hf.attention`), which knows from the
padding mask which tokens are real: left padding is never stored, so a row's positions in
the pool are its real tokens' (0, 1, ...), while ``get_seq_length`` keeps transformers'
padded count.

Besides those rows (one batch per cache, as ``generate`` uses it), the cache serves a
*ragged* batch whose sequences join and leave at any step (:meth:`PagedKvCache.schedule`,
:meth:`PagedKvCache.free_sequence`): the continuous-batching driver
(:mod:`pykvpool.hf.serve`) packs every scheduled sequence's new tokens into one row
``[1, total]`` and the attention function reads the per-sequence query offsets, slots,
positions and tables of the scheduled step.
"""

from __future__ import annotations

import os

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from pykvpool._native import BlockPool, KvCache, UnknownSequenceError
from pykvpool.checks import check_int, invalid
from pykvpool.hf.layout import ModelLayout, model_layout

__all__ = ["PagedKvCache"]

#: The cache and layer whose ``update`` ran last on this thread: the attention function
#: that follows reads its K/V from there (transformers hands it no cache).
_ACTIVE = threading.local()


def active(layer_idx: int) -> PagedKvCache | None:
    """The cache that has just been updated for ``layer_idx`` on this thread, if any."""
    entry = getattr(_ACTIVE, "entry", None)
    if entry is None or entry[1] != layer_idx:
        return None
    cache: PagedKvCache = entry[0]
    return cache


class _Step:
    """One forward pass's bookkeeping, shared by all layers: slots of the ``[B, T]`` grid
    per group (-1 for padding), query positions, lengths, block tables per group."""

    def __init__(self, slots: npt.NDArray[np.int64], positions: npt.NDArray[np.int64],
                 seq_lens: npt.NDArray[np.int64], tables: list[npt.NDArray[np.int32]], tokens: int,
                 decode: bool, qo_indptr: npt.NDArray[np.int64] | None = None) -> None:
        self.slots, self.positions, self.seq_lens, self.tables = slots, positions, seq_lens, tables
        self.tokens, self.decode = tokens, decode
        rows = len(seq_lens)
        self.qo_indptr = (np.arange(0, rows * tokens + 1, tokens, dtype=np.int64) if qo_indptr is None
                          else qo_indptr)


class _PagedLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """One model layer's face of the cache: every call goes to the owning cache."""

    is_croppable = True

    def __init__(self, owner: PagedKvCache, layer_idx: int, sliding: bool) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.owner, self.layer_idx, self.is_sliding = owner, layer_idx, sliding

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the pool and the cache exist from the start."""
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Hand this layer's new K/V to the cache (see :meth:`PagedKvCache.update`)."""
        self.is_initialized = True
        return self.owner.stage(self.layer_idx, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` in transformers' padded positions."""
        return self.owner.seen + query_length, 0

    def get_seq_length(self) -> int:
        """Padded tokens seen by the batch (transformers' convention)."""
        return self.owner.seen

    def get_max_length(self) -> int:
        """No maximum but the pool's blocks: -1."""
        return -1

    def reset(self) -> None:
        """Done once by :meth:`PagedKvCache.reset`."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Done once by :meth:`PagedKvCache.reorder_cache`."""


class PagedKvCache(Cache):
    """A transformers ``Cache`` backed by one pykvpool pool and one paged KV cache, for
    models run with ``attn_implementation="pykvpool"`` (:func:`pykvpool.hf.register`).

    Use: ``model.generate(input_ids, attention_mask=mask, cache=PagedKvCache(model.config,
    num_blocks=...), ...)``. Rows of the batch are sequences of the pool (ids from
    ``first_seq_id``); padding tokens (zeros of the attention mask, on the left of the
    prompt) are not stored. Windowed layers (Mistral, Gemma-2/3 local layers) free the
    blocks their window left behind as the rows grow. ``reorder_cache`` (beam search),
    ``batch_repeat_interleave`` and ``batch_select_indices`` fork and free sequences:
    rows that share a history share its blocks (copy-on-write); ``crop`` truncates. One
    batch per cache: a new batch of prompts needs :meth:`reset` (or a new cache). The
    ragged batch of continuous batching (:meth:`schedule`, :meth:`free_sequence`) is the
    other use, not mixed with rows: sequences join and leave at any step.

    Args:
        config: the model's transformers config (its decoder's layer kinds, KV heads,
            head_dim).
        num_blocks: blocks of the pool (shared by all groups and rows), >= 1.
        block_size: tokens per block (default 16), 1..=65536.
        dtype: the K/V storage: ``"f32"`` (default, exact), ``"f16"`` or ``"bf16"``.
        first_seq_id: the pool id of row 0 (default 0); later rows and forks count up.
        prefix_caching: cache computed blocks by their token ids so that a later sequence
            of the ragged batch sharing a prefix reuses their K/V (:meth:`join`, then the
            ids through ``pool.store_tokens`` once computed); default False.
        eviction: with ``prefix_caching``, which idle cached block an allocation reclaims
            first: a name of :data:`pykvpool.EVICTION_POLICIES` (default ``"lru"``).
        host_blocks: with ``prefix_caching``, a host-memory tier of this many blocks
            (default None: none): cached blocks the pool evicts are copied there, and a
            later prompt sharing their prefix (a chat's next turn) loads them back instead
            of computing them (:meth:`pykvpool.BlockPool.attach_tier_storage`). Models with
            full-attention layers only.
        disk_dir: with ``host_blocks``, a folder for a disk tier below the host tier
            (default None: none), holding ``disk_blocks`` blocks.
        disk_blocks: the disk tier's blocks (default ``4 * host_blocks``), with
            ``disk_dir`` only.
        recompute_ns_per_token: with ``host_blocks``, nanoseconds the model takes to
            compute one prompt token's K/V here (its roofline, or a measured prefill):
            each tier's load cost is then probed
            (:meth:`pykvpool.BlockPool.probe_tier_loads`) and a hit loads only the blocks
            faster to load than to compute (default None: every block found is loaded).
        write_through: with ``host_blocks``, also copy each cached block to the host tier
            once computed, not only when evicted (default False; see
            :class:`pykvpool.BlockPool`).

    Raises:
        InvalidArgumentError: a bad count (a bool, or out of range) or dtype, a layer kind
            the pool does not store, an unknown eviction policy; tiers without
            ``prefix_caching``, with a windowed layer, or ``disk_dir`` without
            ``host_blocks``; a disk folder of another model or layout.
        PermissionError: the disk folder may not be created, read or written.
        TypeError: a count that is no integer (ints, numpy integers and 0-d integer
            tensors are), ``write_through`` not a bool.
    """

    def __init__(self, config: Any, *, num_blocks: int, block_size: int = 16, dtype: str = "f32",
                 first_seq_id: int = 0, prefix_caching: bool = False, eviction: str = "lru",
                 host_blocks: int | None = None, disk_dir: str | os.PathLike[str] | None = None,
                 disk_blocks: int | None = None, recompute_ns_per_token: int | None = None,
                 write_through: bool = False) -> None:
        num_blocks = check_int(num_blocks, "num_blocks", 1)
        block_size = check_int(block_size, "block_size", 1)
        self.layout: ModelLayout = model_layout(config)
        lay = self.layout
        if disk_dir is not None and host_blocks is None:
            raise invalid("disk_dir: a disk tier sits below a host tier; give host_blocks too")
        if disk_blocks is not None and disk_dir is None:
            raise invalid("disk_blocks: given without disk_dir")
        if not isinstance(write_through, bool):
            raise TypeError(f"write_through must be a bool, got {type(write_through).__name__}")
        if write_through and host_blocks is None:
            raise invalid("write_through: given without host_blocks")
        if recompute_ns_per_token is not None:
            if host_blocks is None:
                raise invalid("recompute_ns_per_token: given without host_blocks")
            recompute_ns_per_token = check_int(recompute_ns_per_token, "recompute_ns_per_token")
        if disk_dir is not None and disk_blocks is None:
            disk_blocks = 4 * check_int(host_blocks, "host_blocks", 1)
        self.pool = BlockPool(num_blocks, block_size, list(lay.groups), prefix_caching=bool(prefix_caching),
                              eviction=eviction if prefix_caching else None, host_blocks=host_blocks,
                              disk_blocks=disk_blocks, write_through=write_through or None)
        self.kv = KvCache(lay.cache_layers, num_blocks, block_size, lay.num_kv_heads, lay.head_dim, dtype)
        self._tiers = host_blocks is not None
        if host_blocks is not None:
            model_id = str(getattr(config, "_name_or_path", "") or getattr(config, "model_type", "model"))
            self.pool.attach_tier_storage(self.kv, disk_dir=disk_dir,
                                          model_id=model_id if disk_dir is not None else None)
            if recompute_ns_per_token is not None:
                probe = min(16, num_blocks)
                self.pool.set_tier_costs(self.pool.probe_tier_loads(probe), recompute_ns_per_token)
        layers: list[Any] = [_PagedLayer(self, i, lay.window[i] is not None) for i in range(lay.num_layers)]
        super().__init__(layers=layers)
        self.seqs: list[int] = []
        self.seen = 0
        self._next_id = check_int(first_seq_id, "first_seq_id")
        self._new_forward = False
        #: Tokens of the pass layer 0 started: counted in ``seen`` once their slots exist.
        self._pending = 0
        self._step: _Step | None = None
        #: Sequences of the ragged batch (:meth:`schedule`), and its scheduled step.
        self.ragged: set[int] = set()
        self._scheduled: _Step | None = None

    # -- transformers' Cache interface ------------------------------------------------

    def stage(self, layer_idx: int, key_states: torch.Tensor,
              value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Called by each layer's ``update``: marks the layer as the one the next attention
        call reads (layer 0 starts a forward pass, whose tokens :meth:`begin_forward` counts
        once it has their slots); returns the new K/V unchanged (the attention function
        writes them to the pages).

        Raises:
            Nothing.
        """
        if layer_idx == 0:
            self._new_forward = True
            self._pending = int(key_states.shape[-2])
        _ACTIVE.entry = (self, layer_idx)
        return key_states, value_states

    def reset(self) -> None:
        """Free every row's sequence; the cache is empty again.

        Raises:
            Nothing (the rows are live sequences of the pool).
        """
        for s in [*self.seqs, *sorted(self.ragged)]:
            self.pool.free(s)
        self.seqs, self.seen, self._pending, self._step = [], 0, 0, None
        self.ragged, self._scheduled = set(), None

    def _parents(self, indices: Any, name: str) -> list[int]:
        """``indices`` (a tensor, array or list) as row numbers, all checked before any is used."""
        rows = [check_int(i, name) for i in (indices.tolist() if hasattr(indices, "tolist") else indices)]
        bad = [i for i in rows if i >= len(self.seqs)]
        if bad:
            raise invalid(f"{name}: row {bad[0]} is outside the cache's {len(self.seqs)} rows")
        return rows

    def _rebuild(self, parents: list[int]) -> None:
        """New rows: row ``i`` continues ``self.seqs[parents[i]]`` (forks share blocks);
        ``parents`` are rows (checked)."""
        new = []
        for p in parents:
            child = self._next_id
            self._next_id += 1
            self.pool.fork(self.seqs[p], child)
            new.append(child)
        for s in self.seqs:
            self.pool.free(s)
        self.seqs = new

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row ``i`` becomes old row ``beam_idx[i]`` (beam search), by forks: no K/V copied.

        Raises:
            InvalidArgumentError: an index outside the rows (nothing changed).
            TypeError: an index that is no integer (nothing changed).
        """
        if self.seqs:
            self._rebuild(self._parents(beam_idx, "beam_idx"))

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row ``repeats`` times in a row (shared blocks).

        Raises:
            InvalidArgumentError: ``repeats`` below 1 or a bool (nothing changed).
            TypeError: ``repeats`` is no integer (nothing changed).
        """
        repeats = check_int(repeats, "repeats", 1)
        if self.seqs:
            self._rebuild([i for i in range(len(self.seqs)) for _ in range(repeats)])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (in that order).

        Raises:
            InvalidArgumentError: an index outside the rows (nothing changed).
            TypeError: an index that is no integer (nothing changed).
        """
        if self.seqs:
            self._rebuild(self._parents(indices, "indices"))

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` tokens of every row (a negative count, as
        transformers passes it; a positive one is the length to keep), through
        :meth:`BlockPool.truncate`.

        Raises:
            InvalidArgumentError: a row would lose a token the window already released
                (nothing changed in that row and after), a length beyond the rows', or a
                bool (nothing changed).
            TypeError: ``tokens_to_remove`` is no integer (nothing changed).
        """
        tokens_to_remove = check_int(tokens_to_remove, "tokens_to_remove", None)
        n = -tokens_to_remove if tokens_to_remove <= 0 else self.seen - tokens_to_remove
        if n < 0 or n > self.seen:
            raise invalid(f"tokens_to_remove: {tokens_to_remove} is outside the cache's {self.seen} tokens")
        if n == 0:
            return
        for s in self.seqs:
            self.pool.truncate(s, min(n, self.pool.seq_len(s)))
        self.seen -= n

    # -- the attention side -----------------------------------------------------------

    def begin_forward(self, mask: torch.Tensor | None, rows: int, tokens: int,
                      key: torch.Tensor | None = None) -> _Step:
        """The step of the forward pass that layer 0's update started: allocate the slots of
        its real tokens (a prompt: the mask's ones, after left padding; later passes: every
        token), copy shared blocks first, and build the block tables once for all layers.
        On a prompt, a row whose padding and first-layer keys ``key`` (``[B, Hkv, T, D]``)
        equal an earlier row's (``num_return_sequences`` repeats each prompt) is a fork of
        it: the rows share the prompt's blocks until they diverge (copy-on-write).

        Raises:
            InvalidArgumentError: a mask that is not a 2-D padding mask, padding other than
                on the left of a prompt, or a later pass that does not add the same tokens to
                every row without padding (a new batch needs :meth:`reset` or a new cache);
                with scheduled sequences, a pass other than the one :meth:`schedule` set.
            PoolExhaustedError: the pool lacks the blocks (nothing allocated).

        On any error the cache is as it was before the pass: no slot allocated and the
        pass's tokens not counted in :meth:`get_seq_length`.
        """
        if not self._new_forward and self._step is not None:
            return self._step
        step = self._take_scheduled(rows, tokens) if self.ragged else self._allocate_rows(mask, rows, tokens, key)
        self.seen += self._pending
        self._pending = 0
        return step

    def _allocate_rows(self, mask: torch.Tensor | None, rows: int, tokens: int, key: torch.Tensor | None) -> _Step:
        """:meth:`begin_forward` for the rows of a ``generate`` batch."""
        if mask is not None and (mask.ndim != 2 or mask.shape[0] != rows or mask.shape[1] < tokens):
            raise invalid(f"attention_mask: a [batch, tokens] padding mask is needed, got shape {tuple(mask.shape)}")
        valid = np.ones((rows, tokens), dtype=bool) if mask is None else mask[:, -tokens:].cpu().numpy().astype(bool)
        counts = valid.sum(axis=1)
        pads = tokens - counts
        if any(not valid[i, pads[i]:].all() for i in range(rows)):
            raise invalid("attention_mask: only left padding is supported (zeros before a row's tokens)")
        groups = self.pool.num_groups
        if not self.seqs:
            real = self._add_rows(counts, self._twins(valid, key))
            before = np.zeros(rows, dtype=np.int64)
        else:
            if len(self.seqs) != rows or (pads != 0).any():
                raise invalid("attention_mask: a later pass must add a token to every row, without padding")
            before = np.array([self.pool.seq_len(s) for s in self.seqs], dtype=np.int64)
            real, cow, _ = self.pool.step(self.seqs, [tokens] * rows)
            self.kv.copy_blocks(cow)
        slots = np.full((groups, rows * tokens), -1, dtype=np.int64)
        flat = valid.reshape(-1)
        slots[:, flat] = real
        t = np.arange(tokens, dtype=np.int64)[None, :]
        positions = np.maximum(before[:, None] + t - pads[:, None], 0).reshape(-1)
        seq_lens = before + counts
        tables = [self.pool.block_tables(self.seqs, group=g) for g in range(groups)]
        self._step = _Step(slots, positions, seq_lens, tables, tokens, decode=tokens == 1 and bool(valid.all()))
        self._new_forward = False
        return self._step

    @staticmethod
    def _twins(valid: npt.NDArray[np.bool_], key: torch.Tensor | None) -> list[int]:
        """Per row, the first row with the same padding and bitwise-equal keys (itself if none)."""
        if key is None:
            return list(range(len(valid)))
        first: dict[bytes, int] = {}
        k = key.detach().float().cpu().numpy()
        return [first.setdefault(valid[i].tobytes() + k[i].tobytes(), i) for i in range(len(valid))]

    def _add_rows(self, counts: npt.NDArray[np.int64], twins: list[int]) -> npt.NDArray[np.int64]:
        """Add one sequence per row holding its prompt's real tokens (a fork of its twin when
        it has one: same slots); all rows or none."""
        ids = list(range(self._next_id, self._next_id + len(counts)))
        new: list[npt.NDArray[np.int64]] = []
        try:
            for i, (s, c) in enumerate(zip(ids, counts)):
                if twins[i] == i:
                    new.append(self.pool.add_sequence(s, int(c)))
                else:
                    self.pool.fork(ids[twins[i]], s)
                    new.append(new[twins[i]])
        except BaseException:
            self.pool.free_batch(ids[: len(new)])
            raise
        self.seqs, self._next_id = ids, self._next_id + len(counts)
        return np.concatenate(new, axis=1) if new else np.empty((self.pool.num_groups, 0), dtype=np.int64)

    # -- the ragged batch (continuous batching) -----------------------------------------

    def join(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Add ``seq_id`` to the ragged batch holding the longest cached prefix of its prompt
        ``token_ids`` (:meth:`BlockPool.add_sequence_hit`): its next :meth:`schedule` feeds
        the tokens after the returned count, at their positions. Needs ``prefix_caching``.

        Returns:
            The cached tokens (a multiple of the block size, below ``len(token_ids)``).

        Raises:
            InvalidArgumentError: prefix caching off, the cache holds rows of a ``generate``
                batch, a negative id or token id, an empty prompt (nothing changed).
            DuplicateSequenceError: ``seq_id`` is live.
            TypeError: an id that is no integer.
        """
        if self.seqs:
            raise invalid("seq_id: the cache holds a generate() batch; reset() it before scheduling sequences")
        seq_id = check_int(seq_id, "seq_id")
        if not self.pool.prefix_caching:
            raise invalid("join(): the cache was built without prefix_caching")
        if len(token_ids) == 0:
            raise invalid("token_ids: the prompt is empty")
        cached = self.pool.add_sequence_hit(seq_id, token_ids)
        if self._tiers:
            try:
                self.pool.wait_tiers(disk_writes=False)
            except OSError:
                # Blocks lost on disk: the pool forgot its cache; computed again instead.
                self.pool.free(seq_id)
                cached = self.pool.add_sequence_hit(seq_id, token_ids)
        self.ragged.add(seq_id)
        self._scheduled = None
        return cached

    def schedule(self, seq_ids: list[int], num_tokens: list[int]) -> None:
        """Allocate the next forward pass of the ragged batch: ``num_tokens[i]`` new tokens
        (a prompt chunk, or 1 to decode) for sequence ``seq_ids[i]``, which joins the batch
        (an empty sequence of the pool) if it is not in it. The next forward pass must be one
        row holding these tokens packed in this order (``input_ids`` ``[1, sum(num_tokens)]``,
        ``position_ids`` their positions, :meth:`positions`); its attention reads the
        sequences' pages, the earlier tokens and the new ones (causal, windows per layer).

        Atomic: on any error no sequence joined and none grew.

        Args:
            seq_ids: distinct non-negative sequence ids.
            num_tokens: tokens per sequence, each >= 1.

        Raises:
            InvalidArgumentError: lengths differ, a count below 1, a duplicate or negative id,
                a bool, or the cache holds rows of a ``generate`` batch (:meth:`reset` first).
            TypeError: an id or count that is no integer.
            PoolExhaustedError: the pool lacks the blocks (nothing allocated).
        """
        if self.seqs:
            raise invalid("seq_ids: the cache holds a generate() batch; reset() it before scheduling sequences")
        if len(seq_ids) != len(num_tokens) or not seq_ids:
            raise invalid(f"num_tokens: {len(num_tokens)} counts for {len(seq_ids)} sequences (and at least one)")
        counts = np.array([check_int(n, "num_tokens", 1) for n in num_tokens], dtype=np.int64)
        ids = [check_int(s, "seq_ids") for s in seq_ids]
        if len(set(ids)) != len(ids):
            raise invalid("seq_ids: an id appears twice")
        joining = [s for s in ids if s not in self.ragged]
        for k, s in enumerate(joining):
            try:
                self.pool.add_sequence(s, 0)
            except BaseException:
                self.pool.free_batch(joining[:k])
                raise
        try:
            before = np.array([self.pool.seq_len(s) for s in ids], dtype=np.int64)
            slots, cow, _ = self.pool.step(ids, counts)
        except BaseException:
            self.pool.free_batch(joining)
            raise
        self.kv.copy_blocks(cow)
        self.ragged.update(joining)
        self._scheduled = self._ragged_step(ids, before, counts, slots)

    def _ragged_step(self, ids: list[int], before: npt.NDArray[np.int64], counts: npt.NDArray[np.int64],
                     slots: npt.NDArray[np.int64]) -> _Step:
        """The packed step: query offsets, per-token positions, lengths and tables."""
        indptr = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        total = int(indptr[-1])
        positions = np.arange(total, dtype=np.int64) - np.repeat(indptr[:-1] - before, counts)
        tables = [self.pool.block_tables(ids, group=g) for g in range(self.pool.num_groups)]
        return _Step(slots, positions, before + counts, tables, total, decode=bool((counts == 1).all()),
                     qo_indptr=indptr)

    def positions(self) -> torch.Tensor:
        """The ``position_ids`` (``[1, tokens]``, int64) of the scheduled pass: each new
        token's logical position in its sequence.

        Raises:
            InvalidArgumentError: nothing is scheduled.
        """
        if self._scheduled is None:
            raise invalid("schedule(): no forward pass is scheduled")
        return torch.from_numpy(self._scheduled.positions.copy()).unsqueeze(0)

    def _take_scheduled(self, rows: int, tokens: int) -> _Step:
        """The scheduled ragged step, for a forward pass of one row of its tokens (used once)."""
        step = self._scheduled
        if step is None:
            raise invalid("schedule(): the cache serves scheduled sequences; schedule a pass before running one")
        if rows != 1 or tokens != step.tokens:
            raise invalid(f"input_ids: the scheduled pass packs {step.tokens} tokens in one row, "
                          f"the model got [{rows}, {tokens}]")
        self._step, self._scheduled, self._new_forward = step, None, False
        return step

    def free_sequence(self, seq_id: int) -> None:
        """Remove ``seq_id`` from the ragged batch and free its blocks (a finished or
        preempted sequence). A scheduled pass not run yet is dropped.

        Raises:
            UnknownSequenceError: ``seq_id`` is not in the ragged batch.
            InvalidArgumentError: ``seq_id`` is negative or a bool.
            TypeError: ``seq_id`` is no integer.
        """
        seq_id = check_int(seq_id, "seq_id")
        if seq_id not in self.ragged:
            raise UnknownSequenceError(f"seq_id: {seq_id} is not a scheduled sequence of this cache")
        self.pool.free(seq_id)
        self.ragged.discard(seq_id)
        self._scheduled = None

    def nbytes_held(self) -> int:
        """Bytes of K/V storage the rows hold now: used blocks x the bytes of one block id in
        the :class:`KvCache` (K and V of every cache layer; a block serves one group, whose
        layers use it).

        Raises:
            Nothing.
        """
        return self.pool.num_used_blocks * (self.kv.nbytes // self.kv.num_blocks)
