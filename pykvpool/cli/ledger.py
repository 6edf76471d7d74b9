"""The ``pykvpool ledger`` subcommand: the memory ledger of one model on one budget."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pykvpool._native import InvalidArgumentError
from pykvpool.cli.argtypes import MAX_BLOCK_SIZE, count
from pykvpool.cli._common import (
    DEFAULT_HARDWARE,
    add_common,
    budget_data,
    budget_lines,
    hardware_from_args,
    ledger_from_args,
    write_outputs,
)
from pykvpool.planning.hardware import hardware_preset
from pykvpool.planning.ledger import GIB, MAX_SEQ_LEN, MemoryLedger
from pykvpool.planning.models import ModelConfig, compute_precision
from pykvpool.planning.pool_groups import MAX_POOL_GROUPS, pool_layout

__all__ = ["add_subcommand", "main_ledger"]


def main_ledger(args: argparse.Namespace) -> int:
    """Run ``pykvpool ledger``: print the ledger (and write it under ``--out``). Returns 0.

    Raises:
        UnknownPresetError: an unknown model, hardware or dtype preset.
        InvalidArgumentError: a malformed ``--hf-config`` or dtype, a budget the weights fill
            (BudgetError), ``--block-size`` without ``--groups``, ``--groups`` for a model
            whose grouping needs more than ``MAX_POOL_GROUPS`` (64) groups.
        OSError: ``--hf-config`` cannot be read or ``--out`` cannot be written.
    """
    if args.block_size is not None and not args.groups:
        raise InvalidArgumentError("--block-size applies to --groups only")
    led = ledger_from_args(args)
    m = led.model
    if args.seq_len > m.max_context:
        print(f"pykvpool: warning: --seq-len {args.seq_len:,} exceeds {m.name}'s context window "
              f"(max_position_embeddings = {m.max_context:,})", file=sys.stderr)
    s, bsz = args.seq_len, args.batch
    win = m.windowed
    lines = [
        f"model            {m.name}: L={m.num_layers}, n_q={m.num_q_heads}, "
        f"n_kv={m.num_kv_heads}, d={m.head_dim}, {m.num_params / 1e9:.2f}e9 params",
        *_shape_lines(m),
        f"KV dtype         {led.dtype.name} (scales: {led.dtype.granularity})",
        f"KV per token     {led.bytes_per_token} B ({led.bytes_per_token / 1024:.2f} KiB)"
        + (" if every layer kept every token (full history)" if win else ""),
        f"KV per sequence  {led.kv_bytes(seq_len=s) / GIB:.2f} GiB at {s} tokens",
        *(_length_table(led, s) if win else []),
        f"weights          {led.weight_bytes / GIB:.2f} GiB",
        *budget_lines(led),
        f"KV capacity      {led.token_capacity:,} tokens"
        + (f" of full history; {led.tokens_at(seq_len=s):,} tokens as sequences of {s}" if win else ""),
        f"max batch        {led.max_batch(seq_len=s)} at {s} tokens",
        f"max length       {led.max_seq_len(batch=bsz):,} tokens at batch {bsz}"
        + (" (the limit of the ledger: every layer is windowed)"
           if win and led.max_seq_len(batch=bsz) == MAX_SEQ_LEN else ""),
    ]
    row = led.row(batch=bsz, seq_len=s)
    lines.append(f"batch {bsz} x {s}: KV {row.kv_bytes / GIB:.2f} GiB = "
                 f"{row.kv_over_weights:.2f}x weights; weights + KV {row.weights_plus_kv_bytes / GIB:.2f} GiB"
                 + ("" if row.kv_bytes <= led.kv_budget_bytes else " -- EXCEEDS the KV budget"))
    data: dict[str, Any] = {"model": m.name, "dtype": led.dtype.name,
                            "bytes_per_token": led.bytes_per_token, "budget": budget_data(led),
                            "weight_bytes": led.weight_bytes, "kv_budget_bytes": led.kv_budget_bytes,
                            "token_capacity": led.token_capacity,
                            "max_batch": led.max_batch(seq_len=s),
                            "max_seq_len": led.max_seq_len(batch=bsz),
                            "layer_groups": [vars(g) for g in m.groups],
                            "kv_latent_dim": m.kv_latent_dim, "num_params": m.num_params,
                            "active_params": m.active_num_params,
                            "kv_bytes_at": {str(n): led.kv_bytes(seq_len=n)
                                            for n in sorted({*TABLE_LENGTHS, s})},
                            "max_batch_at": {str(n): led.max_batch(seq_len=n)
                                             for n in sorted({*TABLE_LENGTHS, s})}}
    hw = hardware_from_args(args) or hardware_preset(DEFAULT_HARDWARE)
    cd = compute_precision(led.dtype) if args.hardware != "this" else "fp32"
    b = led.decode_bound(hw, seq_len=s, batch=bsz, compute_dtype=cd)
    lines.append(f"decode on {hw.name}: step >= {b.step_time * 1e3:.2f} ms "
                 f"({'memory' if b.memory_bound else 'compute'} bound), "
                 f"<= {b.tokens_per_s:.0f} tokens/s at batch {bsz}")
    data["decode"] = {"hardware": hw.name, "step_s": b.step_time,
                      "tokens_per_s": b.tokens_per_s, "bytes": b.bytes_moved, "flops": b.flops}
    if args.groups:
        lines += _group_lines(led, args.block_size or 16, s, data)
    text = "\n".join(lines)
    print(text)
    write_outputs(args.out, "ledger", "```\n" + text + "\n```\n", data)
    return 0


TABLE_LENGTHS = (8192, 32768, 131072)
"""Sequence lengths (tokens) of the per-length table printed for a windowed model."""


def _shape_lines(m: ModelConfig) -> list[str]:
    lines = []
    if m.windowed:
        lines.append("layers           " + " + ".join(g.describe() for g in m.groups))
    if m.kv_latent_dim:
        lines.append(f"attention        MLA: {m.kv_latent_dim} elements per token per layer "
                     "(kv_lora_rank + rope), one latent for K and V")
    if m.active_params is not None:
        lines.append(f"experts          {m.active_params / 1e9:.2f}e9 of {m.num_params / 1e9:.2f}e9 "
                     "params active per token")
    return lines


def _length_table(led: MemoryLedger, seq_len: int) -> list[str]:
    """KV per sequence at each length, per token, against the same model all global."""
    glob = MemoryLedger(led.model.all_global(), led.budget, led.dtype)
    rows = ["  length    KV/sequence   B/token  all-global KV   window saves   max batch"]
    for n in sorted({*TABLE_LENGTHS, seq_len}):
        kv, full = led.kv_bytes(seq_len=n), glob.kv_bytes(seq_len=n)
        rows.append(f"  {n:>7,}  {kv / GIB:>8.3f} GiB  {kv / n:>8,.0f}  {full / GIB:>9.3f} GiB"
                    f"  {full / kv:>12.2f}x  {led.max_batch(seq_len=n):>10,}"
                    + ("  beyond max_position_embeddings" if n > led.model.max_context else ""))
    return rows


def _group_lines(led: MemoryLedger, block_size: int, seq_len: int, data: dict[str, Any]) -> list[str]:
    """The model's hybrid pool (vLLM's grouping), its blocks in the KV budget and the
    sequences it holds at each length; records them in ``data["pool"]``."""
    lay = pool_layout(led.model, led.dtype, block_size)
    blocks = lay.num_blocks(led.kv_budget_bytes)
    lengths = sorted({*TABLE_LENGTHS, seq_len})
    lines = [f"pool groups      {lay.describe()}",
             f"pool blocks      {blocks:,} blocks of {block_size} tokens x {lay.layers_per_group} layers "
             f"in the KV budget",
             "  length   blocks/sequence   sequences"]
    lines += [f"  {n:>7,}  {lay.blocks_per_sequence(n):>16,}  {lay.max_sequences(n, blocks):>10,}"
              for n in lengths]
    data["pool"] = {"block_size": block_size, "layers_per_group": lay.layers_per_group,
                    "block_bytes": lay.block_bytes, "num_blocks": blocks,
                    "padding_layers": lay.padding_layers,
                    "groups": [vars(g) for g in lay.groups],
                    "blocks_per_sequence_at": {str(n): lay.blocks_per_sequence(n) for n in lengths},
                    "sequences_at": {str(n): lay.max_sequences(n, blocks) for n in lengths}}
    return lines


def add_subcommand(sub: Any) -> None:
    """Add the ``ledger`` subcommand to a ``pykvpool`` CLI's subparsers; it calls
    :func:`main_ledger`.

    Raises:
        argparse.ArgumentError: ``subparsers`` already has a command of that name (Python
            3.11 and later).
    """
    pl = sub.add_parser("ledger", help="memory ledger of one model on one budget",
                        description="KV bytes per token, weights, the budget, KV capacity, largest "
                                    "batch, longest length and the decode-step bound.")
    add_common(pl)
    pl.add_argument("--seq-len", type=count(), default=8192, help="tokens per sequence")
    pl.add_argument("--batch", type=count(), default=1, help="sequences")
    pl.add_argument("--groups", action="store_true",
                    help="also print the model's hybrid pool: its layer groups as vLLM's hybrid "
                         "allocator forms them, the bytes of one block, the blocks in the KV "
                         "budget and the sequences they hold at each length (at most "
                         f"{MAX_POOL_GROUPS} groups, a BlockPool's limit: a model whose layer "
                         "counts need more is refused)")
    pl.add_argument("--block-size", type=count(1, MAX_BLOCK_SIZE), metavar="TOKENS",
                    help="tokens per block of --groups' pool (default 16)")
    pl.set_defaults(func=main_ledger)
