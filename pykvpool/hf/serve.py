"""Continuous batching of a transformers causal LM on pykvpool.

:class:`ContinuousBatcher` serves a list of prompts the way a serving engine does, on one
:class:`PagedKvCache`: every step packs the new tokens of all running sequences into one
forward pass (``input_ids`` ``[1, total]``, a position per token, no padding): a prompt
chunk of each sequence still in prefill (chunked prefill) beside one token of each
sequence decoding. A sequence that ends (EOS or ``max_new_tokens``) frees its blocks at
once.

The scheduling policy, in each pass (as vLLM's scheduler does, plus a headroom rule):

- Running sequences first, in admission order. When the pool lacks their blocks, the most
  recently admitted one is preempted by recompute (its blocks freed, its prompt and
  generated tokens queued again at the front of the waiting queue), until the rest fit.
- A pass that preempted admits nothing.
- Otherwise waiting requests are admitted in queue order while the pass has room (running
  slots, tokens) and the pool has headroom, stopping at the first that does not fit: the
  *footprints* of every running sequence and the new one, the blocks each may hold (all
  the tokens it knows, its prompt or recomputed history and its sampled tokens, at most a
  window's worth in a window group, and one more block per group to grow), must add up
  to at most the pool. With nothing running, the head of the queue is admitted regardless.

Footprints only grow as sequences learn tokens, and the running sequences that ran short
had footprints exceeding the pool; so a preempted sequence is not readmitted before another
one finishes, and a prompt is admitted only with room for all of its chunks. After an
admission every running sequence can store a block of tokens past what it knows; when
``max_new_tokens - 1 <= block_size`` that is all any sequence will store, and nothing is
ever preempted (every sequence fitting the pool alone). :attr:`ContinuousBatcher.stats`
counts the preemptions and the tokens they made the model feed again.

Attention runs on pykvpool's kernels through ``attn_implementation="pykvpool"``
(``prefill_attention`` on the ragged pass, ``decode_attention`` when every sequence
decodes), windows per layer group (Mistral, Gemma-2/3).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from pykvpool._native import PoolExhaustedError
from pykvpool.checks import check_int, check_positive, invalid
from pykvpool.hf.attention import ATTN_IMPLEMENTATION
from pykvpool.hf.cache import PagedKvCache

__all__ = ["BatcherStats", "ContinuousBatcher", "generate_continuous"]


@dataclass
class BatcherStats:
    """What a :meth:`ContinuousBatcher.run` did.

    Attributes:
        steps: forward passes.
        forward_tokens: tokens fed to the model over all passes (recomputed ones included).
        generated_tokens: tokens sampled (the outputs' total length).
        prefill_chunks: prompt chunks fed that did not reach the end of their prompt (each a
            split of a prompt by ``chunk_size`` or ``max_batched_tokens``).
        mixed_steps: passes holding both prompt tokens and decode tokens.
        preemptions: sequences preempted by recompute (blocks freed, requeued).
        recomputed_tokens: tokens whose K/V a preemption dropped, to be fed again.
        cached_tokens: tokens an admission found in the prefix cache and did not feed
            (``prefix_caching``; a readmitted preempted sequence may find its own blocks).
            Every token a run feeds is a prompt token, a generated token or a recomputed
            one, less the cached: ``forward_tokens`` is the prompts' lengths, plus the
            generated tokens but each sequence's last, plus ``recomputed_tokens``, minus
            ``cached_tokens``.
        max_running: most sequences in one pass.
        peak_used_blocks: most pool blocks in use after a pass was allocated.
    """

    steps: int = 0
    forward_tokens: int = 0
    generated_tokens: int = 0
    prefill_chunks: int = 0
    mixed_steps: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0
    cached_tokens: int = 0
    max_running: int = 0
    peak_used_blocks: int = 0


@dataclass
class _Request:
    """One prompt's state: its tokens so far (prompt + generated) and how many are cached."""

    index: int
    tokens: list[int]
    prompt_len: int
    computed: int = 0
    out: list[int] = field(default_factory=list)

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.computed


def _checked(prompt: Sequence[int], i: int, vocab: int) -> list[int]:
    """Prompt ``i``'s token ids as ints in ``0..vocab``."""
    ids = [check_int(t, f"prompts: a token id of prompt {i}") for t in prompt]
    if not ids:
        raise invalid(f"prompts: prompt {i} is empty")
    for t in ids:
        if t >= vocab:
            raise invalid(f"prompts: prompt {i} holds {t}, not a token id in 0..{vocab}")
    return ids


def _eos_ids(eos_token_id: object) -> set[int]:
    """The token ids of ``eos_token_id``: None, one integer, or an iterable of them."""
    if eos_token_id is None:
        return set()
    one = (getattr(eos_token_id, "ndim", None) == 0 or not isinstance(eos_token_id, Iterable)
           or isinstance(eos_token_id, (str, bytes)))
    return {check_int(t, "eos_token_id") for t in ([eos_token_id] if one else cast(Iterable[object], eos_token_id))}


def _group_caps(cache: PagedKvCache, pass_tokens: int) -> list[int]:
    """Per group of ``cache``, the most blocks one sequence holds there: unbounded (the
    pool's size) for full attention; for a window of ``w`` tokens, the blocks spanning the
    ``w - 1`` keys before a pass and its ``pass_tokens`` new ones, as the pool releases
    the rest at the start of each growth."""
    bs, total = cache.pool.block_size, cache.pool.num_blocks
    return [total if g.window is None else -(-(g.window - 1 + pass_tokens) // bs) + 1 for g in cache.pool.groups]


class ContinuousBatcher:
    """Serves prompts on ``model`` (a transformers causal LM built or loaded with
    ``attn_implementation="pykvpool"``) with continuous batching over one
    :class:`PagedKvCache` (``num_blocks`` blocks of ``block_size`` tokens).

    Args:
        model: the causal LM (its forward takes ``input_ids``, ``position_ids``, ``cache``
            and ``logits_to_keep``, as transformers' decoder models do).
        num_blocks: blocks of the pool, >= 1.
        block_size: tokens per block, >= 1 (default 16).
        max_running: sequences in one pass at most (default 64), >= 1.
        max_batched_tokens: tokens in one pass at most (default 512), >= 1.
        chunk_size: prompt tokens of one sequence in one pass at most (default 256), >= 1.
        kv_dtype: the cache's storage, ``"f32"``, ``"f16"`` or ``"bf16"``; default ``"bf16"``
            for a bf16 model, else ``"f32"``.
        prefix_caching: reuse the K/V of computed blocks across prompts sharing a prefix
            (default False): an admission joins at its longest cached prefix (its last
            token always computed) and feeds the rest; blocks are cached by token ids once
            their K/V is computed, prompts and generated tokens alike, and stay cached when
            their sequences end (and across runs), until evicted. Sequences that compute
            the same blocks in one pass keep one copy: the later ones take the cached
            block in place of their own.
        eviction: with ``prefix_caching``, which idle cached block an allocation reclaims
            first, a name of :data:`pykvpool.EVICTION_POLICIES` (default ``"lru"``).
        host_blocks: with ``prefix_caching``, a host-memory tier of this many blocks below
            the pool (default None): evicted cached blocks go there and come back on a hit
            (a conversation's earlier turns, evicted from the pool, are loaded instead of
            computed); see :class:`PagedKvCache`.
        disk_dir: a disk tier's folder below the host tier (default None).
        disk_blocks: the disk tier's blocks (default ``4 * host_blocks``).
        recompute_ns_per_token: with ``host_blocks``, what computing a prompt token's K/V
            costs here, in nanoseconds: loads slower than that are computed instead
            (:class:`PagedKvCache`).
        write_through: with ``host_blocks``, copy cached blocks to the host tier once
            computed, not only when evicted (default False; :class:`PagedKvCache`).

    Attributes:
        stats: the last :meth:`run`'s :class:`BatcherStats`: passes, tokens fed
            (``forward_tokens``), preemptions and the tokens they made it feed again
            (``recomputed_tokens``), ...

    The scheduling policy (admission with headroom, preemption by recompute, no admission
    in a pass that preempted) is the module's (:mod:`pykvpool.hf.serve`).

    Raises:
        InvalidArgumentError: a bad count (a bool, or out of range), a model not run with
            ``attn_implementation="pykvpool"``, a layer kind the pool does not store, an
            unknown eviction policy, tiers the cache refuses (:class:`PagedKvCache`).
        PermissionError: the disk folder may not be created, read or written.
        TypeError: a count that is no integer (ints, numpy integers and 0-d integer
            tensors are), ``write_through`` not a bool.
    """

    def __init__(self, model: Any, *, num_blocks: int, block_size: int = 16, max_running: int = 64,
                 max_batched_tokens: int = 512, chunk_size: int = 256, kv_dtype: str | None = None,
                 prefix_caching: bool = False, eviction: str = "lru", host_blocks: int | None = None,
                 disk_dir: str | os.PathLike[str] | None = None, disk_blocks: int | None = None,
                 recompute_ns_per_token: int | None = None, write_through: bool = False) -> None:
        impl = getattr(model.config, "_attn_implementation", None)
        if impl != ATTN_IMPLEMENTATION:
            raise invalid(f'model: built with attn_implementation={impl!r}, the batcher needs "{ATTN_IMPLEMENTATION}"')
        self.max_running = check_int(max_running, "max_running", 1)
        self.max_batched_tokens = check_int(max_batched_tokens, "max_batched_tokens", 1)
        self.chunk_size = check_int(chunk_size, "chunk_size", 1)
        if kv_dtype is None:
            kv_dtype = "bf16" if model.dtype == torch.bfloat16 else "f32"
        self.model = model
        self.cache = PagedKvCache(model.config, num_blocks=num_blocks, block_size=block_size, dtype=kv_dtype,
                                  prefix_caching=prefix_caching, eviction=eviction, host_blocks=host_blocks,
                                  disk_dir=disk_dir, disk_blocks=disk_blocks,
                                  recompute_ns_per_token=recompute_ns_per_token, write_through=write_through)
        self.prefix_caching = bool(prefix_caching)
        self._caps = _group_caps(self.cache, min(self.chunk_size, self.max_batched_tokens))
        self.stats = BatcherStats()

    def run(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
            eos_token_id: int | Sequence[int] | None = None, temperature: float = 0.0,
            generator: torch.Generator | None = None) -> list[list[int]]:
        """Generate up to ``max_new_tokens`` tokens for every prompt.

        Args:
            prompts: token ids per prompt, each at least 1 token.
            max_new_tokens: tokens to generate per prompt, >= 1.
            eos_token_id: the token that ends a sequence (kept in its output), or an
                iterable of them (a list, a 1-D array or tensor); None: none.
            temperature: 0 (default) for greedy decoding, else sampling from
                ``softmax(logits / temperature)`` with ``generator``.
            generator: the torch generator of the samples (sampling only).

        Returns:
            The generated tokens of each prompt, in prompt order. :attr:`stats` holds what
            this run did.

        Raises:
            InvalidArgumentError: an empty prompt, a token id outside ``0..vocab_size`` or a
                bool, a bad count, temperature or ``eos_token_id`` (negative or a bool)
                (nothing ran).
            TypeError: a token id, ``max_new_tokens`` or ``eos_token_id`` that is no integer
                (ints, numpy integers and 0-d integer tensors are; nothing ran).
            PoolExhaustedError: one sequence alone needs more blocks than the pool has (the
                cache keeps the sequences of the run until the next run resets it).
        """
        max_new = check_int(max_new_tokens, "max_new_tokens", 1)
        temp = check_positive(temperature, "temperature", zero=True)
        eos = _eos_ids(eos_token_id)
        vocab = int(self.model.config.get_text_config(decoder=True).vocab_size)
        checked = [_checked(p, i, vocab) for i, p in enumerate(prompts)]
        waiting = deque(_Request(i, ids, len(ids)) for i, ids in enumerate(checked))
        self.cache.reset()
        self.stats = BatcherStats()
        running: list[_Request] = []
        outputs: list[list[int]] = [[] for _ in waiting]
        with torch.inference_mode():
            while waiting or running:
                plan = self._plan(running, waiting)
                logits = self._forward(plan)
                for r in self._advance(plan, running, logits, temp, generator):
                    if r.out[-1] in eos or len(r.out) >= max_new:
                        outputs[r.index] = r.out
                        running.remove(r)
                        self.cache.free_sequence(r.index)
        return outputs

    def _plan(self, running: list[_Request], waiting: deque[_Request]) -> list[tuple[_Request, int]]:
        """This pass's ``(request, tokens)``: running sequences first (in admission order),
        then admissions (:meth:`_admit`); allocated in the cache, preempting the latest
        admitted when the pool is short, and then admitting nothing in this pass."""
        preempted = False
        while True:
            budget = self.max_batched_tokens
            plan: list[tuple[_Request, int]] = []
            for r in running:
                n = min(r.pending, self.chunk_size, budget)
                if n:
                    plan.append((r, n))
                    budget -= n
            admitted = 0 if preempted else self._admit(plan, budget, running, waiting)
            scheduled = self._allocate(plan, running, waiting, admitted)
            if scheduled is not None:
                return scheduled
            preempted = True

    def _admit(self, plan: list[tuple[_Request, int]], budget: int, running: list[_Request],
               waiting: deque[_Request]) -> int:
        """Append to ``plan`` the waiting requests this pass admits, in queue order, stopping
        at the first that does not fit; returns how many. One fits when the footprints
        (:meth:`_footprint`) of the running sequences, the ones admitted before it and its
        own add up to at most the pool's blocks; the head of the queue is admitted without
        that check when nothing runs."""
        reserved = sum(self._footprint(r) for r in running)
        admitted = 0
        while admitted < len(waiting) and budget and len(running) + admitted < self.max_running:
            w = waiting[admitted]
            reserved += self._footprint(w)
            if (running or admitted) and reserved > self.cache.pool.num_blocks:
                break
            n = min(w.pending, self.chunk_size, budget)
            plan.append((w, n))
            budget -= n
            admitted += 1
        return admitted

    def _footprint(self, r: _Request) -> int:
        """Blocks ``r`` may hold until it has stored every token it knows (its prompt, or its
        whole history when preempted, and its sampled tokens) and one block more in each
        group: per group, the blocks of those tokens, at most a window group's bound (its
        window and one pass of ``min(chunk_size, max_batched_tokens)`` tokens), plus one."""
        blocks = -(-len(r.tokens) // self.cache.pool.block_size)
        return sum(min(blocks, cap) + 1 for cap in self._caps)

    def _allocate(self, plan: list[tuple[_Request, int]], running: list[_Request], waiting: deque[_Request],
                  admitted: int) -> list[tuple[_Request, int]] | None:
        """Schedule ``plan`` (its last ``admitted`` entries new requests) in the cache; on a
        short pool drop admissions from the end, then preempt the latest running sequence
        and report None (plan again). With prefix caching each admission first joins at its
        cached prefix and feeds only the rest. Returns the plan scheduled."""
        while True:
            plan = self._join(plan, admitted)
            try:
                self.cache.schedule([r.index for r, _ in plan], [n for _, n in plan])
                break
            except PoolExhaustedError:
                self._unjoin(plan, admitted)
                if admitted and len(plan) > 1:
                    plan, admitted = plan[:-1], admitted - 1
                    continue
                if len(running) > 1:
                    self._preempt(running, waiting)
                    return None
                raise
        self.stats.cached_tokens += sum(r.computed for r, _ in plan[len(plan) - admitted:])
        for _ in range(admitted):
            running.append(waiting.popleft())
        return plan

    def _join(self, plan: list[tuple[_Request, int]], admitted: int) -> list[tuple[_Request, int]]:
        """With prefix caching, join the plan's last ``admitted`` requests at their cached
        prefixes (:meth:`PagedKvCache.join`); their entries then feed only the rest."""
        if not self.prefix_caching or not admitted:
            return plan
        out = plan[:len(plan) - admitted]
        for r, n in plan[len(plan) - admitted:]:
            r.computed = self.cache.join(r.index, r.tokens)
            out.append((r, min(n, r.pending)))
        return out

    def _unjoin(self, plan: list[tuple[_Request, int]], admitted: int) -> None:
        """Undo :meth:`_join` after a failed schedule: the joined requests wait again."""
        if not self.prefix_caching:
            return
        for r, _ in plan[len(plan) - admitted:]:
            self.cache.free_sequence(r.index)
            r.computed = 0

    def _preempt(self, running: list[_Request], waiting: deque[_Request]) -> None:
        """Preempt by recompute the latest admitted running sequence: free its blocks and queue
        it first, its prompt and generated tokens to be prefilled again."""
        victim = running.pop()
        self.cache.free_sequence(victim.index)
        self.stats.recomputed_tokens += victim.computed
        victim.computed = 0
        waiting.appendleft(victim)
        self.stats.preemptions += 1

    def _forward(self, plan: list[tuple[_Request, int]]) -> torch.Tensor:
        """Run the model on the plan's packed tokens; the logits of each sequence whose pass
        reaches its last known token, ``[k, vocab]`` float32, in plan order."""
        ids: list[int] = []
        last: list[int] = []
        for r, n in plan:
            ids += r.tokens[r.computed:r.computed + n]
            if r.computed + n == len(r.tokens):
                last.append(len(ids) - 1)
        st = self.stats
        st.steps += 1
        st.forward_tokens += len(ids)
        st.max_running = max(st.max_running, len(plan))
        st.peak_used_blocks = max(st.peak_used_blocks, self.cache.pool.num_used_blocks)
        prompt = [r.computed < r.prompt_len or r.pending > 1 for r, _ in plan]
        st.mixed_steps += int(any(prompt) and not all(prompt))
        st.prefill_chunks += sum(r.computed + n < len(r.tokens) for r, n in plan)
        out = self.model(input_ids=torch.tensor([ids], dtype=torch.long), position_ids=self.cache.positions(),
                         cache=self.cache, use_cache=True, logits_to_keep=torch.tensor(last, dtype=torch.long))
        if self.prefix_caching:
            # Their K/V exists now: the blocks these tokens fill are cached, before the
            # window rule releases any of them.
            for r, n in plan:
                self.cache.pool.store_tokens(r.index, r.tokens[r.computed:r.computed + n])
        self.cache.pool.mark_computed([r.index for r, _ in plan])
        logits: torch.Tensor = out.logits[0].float()
        return logits

    def _advance(self, plan: list[tuple[_Request, int]], running: list[_Request], logits: torch.Tensor,
                 temp: float, generator: torch.Generator | None) -> list[_Request]:
        """Count the pass's tokens as cached; sample the next token of each sequence the pass
        completed. Returns those sequences."""
        done = []
        for r, n in plan:
            r.computed += n
            if r.computed == len(r.tokens):
                done.append(r)
        if temp == 0.0:
            new = logits.argmax(dim=-1).tolist()
        else:
            probs = torch.softmax(logits / temp, dim=-1)
            new = torch.multinomial(probs, 1, generator=generator)[:, 0].tolist()
        for r, t in zip(done, new):
            r.tokens.append(int(t))
            r.out.append(int(t))
        self.stats.generated_tokens += len(done)
        return done


def generate_continuous(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, num_blocks: int,
                        block_size: int = 16, max_running: int = 64, max_batched_tokens: int = 512,
                        chunk_size: int = 256, eos_token_id: int | Sequence[int] | None = None,
                        kv_dtype: str | None = None, prefix_caching: bool = False,
                        eviction: str = "lru") -> tuple[list[list[int]], BatcherStats]:
    """Greedy generation of ``max_new_tokens`` tokens (fewer at ``eos_token_id``) for each
    prompt with a :class:`ContinuousBatcher` (see it for the arguments).

    Returns:
        ``(outputs, stats)``: the generated tokens per prompt, in prompt order, and the
        run's :class:`BatcherStats`.

    Raises:
        InvalidArgumentError: as :class:`ContinuousBatcher` and :meth:`ContinuousBatcher.run`.
        TypeError: as :class:`ContinuousBatcher` and :meth:`ContinuousBatcher.run`.
        PoolExhaustedError: one sequence alone needs more blocks than the pool has.
    """
    batcher = ContinuousBatcher(model, num_blocks=num_blocks, block_size=block_size, max_running=max_running,
                                max_batched_tokens=max_batched_tokens, chunk_size=chunk_size, kv_dtype=kv_dtype,
                                prefix_caching=prefix_caching, eviction=eviction)
    outputs = batcher.run(prompts, max_new_tokens, eos_token_id=eos_token_id)
    return outputs, batcher.stats
