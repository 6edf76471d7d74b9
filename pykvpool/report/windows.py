"""Section 7 of the report, "Windows, sinks and hybrid layers": how many
sequences the A100 budget holds at 8k / 32k / 128k tokens of context for models whose
sliding-window layers keep only their window (Gemma-2-9B, Gemma-3-12B) against the same
models with every layer global, and for attention sinks plus a window (Llama-3-8B with 4
sinks and a 4,096-token window, StreamingLLM-style) against full history: the ledger's
count beside the count admitted through a real :class:`pykvpool.BlockPool`
(:func:`pykvpool.planning.sweeps.hybrid_concurrency`), and figure 9.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pykvpool.planning.layers import LayerGroup
from pykvpool.planning.ledger import Budget, MemoryLedger
from pykvpool.planning.models import ModelConfig, model_preset
from pykvpool.planning.pool_groups import pool_layout
from pykvpool.planning.sweeps import Concurrency, hybrid_concurrency
from pykvpool.plotting import Collision, new_figure
from pykvpool.progress import ProgressBar
from pykvpool.report.figures import save_figure
from pykvpool.report.tables import markdown_table

__all__ = ["BLOCK_SIZE", "CHUNK_TOKENS", "FIGURE_LENGTHS", "LENGTHS", "Row", "sinks_variant",
           "windows_section"]

LENGTHS = (8192, 32768, 131072)
"""Context lengths of the section's table and pool sweeps, tokens."""
FIGURE_LENGTHS = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
"""Context lengths of figure 9's ledger lines, tokens."""
BLOCK_SIZE = 16
"""Tokens per block of every pool of the section."""
CHUNK_TOKENS = 2048
"""Prefill chunk of the pool sweeps, tokens."""
SINKS, WINDOW = 4, 4096
"""StreamingLLM-style variant of Llama-3-8B: sink tokens and window, tokens."""


def sinks_variant(model: ModelConfig, sinks: int = SINKS, window: int = WINDOW) -> ModelConfig:
    """``model`` with every layer a sliding window of ``window`` tokens plus ``sinks``
    first tokens (StreamingLLM).

    Raises:
        InvalidArgumentError: ``window`` < 1 or ``sinks`` < 0.
    """
    group = LayerGroup("sliding", model.num_layers, window, sinks)
    return replace(model, layer_groups=(group,),
                   name=f"{model.name}, {sinks} sinks + {window:,} window")


@dataclass(frozen=True)
class Row:
    """One model variant at one context length.

    Attributes:
        pair: the comparison it belongs to (the windowed model's preset name).
        windowed: True for the windowed variant, False for its full-history twin.
        model: the variant's name.
        layers: its layer groups (``"21 sliding (4,096) + 21 full"``).
        pool: its hybrid pool (:meth:`pykvpool.planning.pool_groups.PoolLayout.describe`).
        ledger: ``MemoryLedger.max_batch(seq_len, block_size=16)``, sequences.
        sweep: the pool sweep at the length.
    """

    pair: str
    windowed: bool
    model: str
    layers: str
    pool: str
    ledger: int
    sweep: Concurrency


def _variants() -> list[tuple[str, ModelConfig, ModelConfig]]:
    g2, g3, llama = (model_preset(k) for k in ("gemma-2-9b", "gemma-3-12b", "llama-3-8b"))
    return [("gemma-2-9b", g2, g2.all_global()), ("gemma-3-12b", g3, g3.all_global()),
            ("llama-3-8b", sinks_variant(llama), llama)]


def _rows(budget: Budget, progress: bool) -> tuple[list[Row], dict[str, dict[str, list[int]]]]:
    """The table's rows (pool sweeps at :data:`LENGTHS`) and the figure's ledger curves."""
    rows: list[Row] = []
    curves: dict[str, dict[str, list[int]]] = {}
    variants = _variants()
    with ProgressBar("windows (hybrid pool sweeps)", 2 * len(variants), enabled=progress) as bar:
        for i, (pair, win, full) in enumerate(variants):
            for j, (m, windowed) in enumerate(((win, True), (full, False))):
                led = MemoryLedger(m, budget)
                lay = pool_layout(m, led.dtype, BLOCK_SIZE)
                blocks = lay.num_blocks(led.kv_budget_bytes)
                layers = " + ".join(g.describe() for g in m.groups)
                curves.setdefault(pair, {})["windowed" if windowed else "full"] = [
                    led.max_batch(seq_len=n, block_size=BLOCK_SIZE) for n in FIGURE_LENGTHS]
                for n in LENGTHS:
                    rows.append(Row(pair, windowed, m.name, layers, lay.describe(),
                                    led.max_batch(seq_len=n, block_size=BLOCK_SIZE),
                                    hybrid_concurrency(lay, blocks, n, CHUNK_TOKENS)))
                bar(2 * i + j + 1)
    return rows, curves


def _fig(path: str | os.PathLike[str], rows: list[Row], curves: dict[str, dict[str, list[int]]]
         ) -> list[Collision]:
    """Figure 9, written to ``path``; returns what it hides (empty for a readable figure)."""
    fig = new_figure((15.5, 5.4))
    axes = fig.subplots(1, len(curves))
    colors = {True: "#1565c0", False: "#e65100"}
    for ax, (pair, cur) in zip(axes, curves.items()):
        names = {w: next(r.model for r in rows if r.pair == pair and r.windowed == w) for w in (True, False)}
        for windowed, key in ((True, "windowed"), (False, "full")):
            name = names[windowed]
            ax.plot(FIGURE_LENGTHS, cur[key], "-" if windowed else "--", color=colors[windowed],
                    label=f"{name}: ledger")
            pts = [r for r in rows if r.pair == pair and r.windowed == windowed]
            ax.plot([r.sweep.seq_len for r in pts], [max(r.sweep.admitted, 0.8) for r in pts],
                    "o" if windowed else "s", color=colors[windowed], mfc="none", ms=9,
                    label=f"{name}: BlockPool sweep")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(FIGURE_LENGTHS, [f"{n // 1024}k" for n in FIGURE_LENGTHS])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("sequences in the KV budget")
        ax.set_title(f"{names[True]} vs {names[False]}", fontsize=9)
        ax.grid(alpha=0.25, which="both")
        # under the panel: inside it, a legend covers some curve or sweep point at some size
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    hidden: list[Collision] = save_figure(fig, path)["collisions"]
    return hidden


def windows_section(out_dir: Path, budget: Budget, progress: bool = True
                    ) -> tuple[str, dict[str, Any], dict[str, Path]]:
    """Run the section's ledgers and pool sweeps under ``budget``, draw
    ``fig9_windows.png`` into ``out_dir``, and return the Markdown, the data (with
    ``collisions``: figure name -> what the drawn figure hides, see
    :func:`pykvpool.report.figures.save_figure`) and the figure.

    Raises:
        BudgetError: (an InvalidArgumentError) the budget leaves no room for KV.
        OSError: the figure cannot be written.
    """
    rows, curves = _rows(budget, progress)
    figs = {"fig9_windows": out_dir / "fig9_windows.png"}
    hidden = _fig(figs["fig9_windows"], rows, curves)
    data = {"collisions": {"fig9_windows": hidden}, "budget": budget.describe(), "block_size": BLOCK_SIZE, "chunk_tokens": CHUNK_TOKENS,
            "lengths": list(LENGTHS), "figure_lengths": list(FIGURE_LENGTHS), "ledger_curves": curves,
            "rows": [{"pair": r.pair, "windowed": r.windowed, "model": r.model, "layers": r.layers,
                      "pool": r.pool, "ledger": r.ledger, "sweep": r.sweep} for r in rows]}
    return _markdown(rows, budget, figs), data, figs


def _markdown(rows: list[Row], budget: Budget, figs: dict[str, Path]) -> str:
    full = {(r.pair, r.sweep.seq_len): r for r in rows if not r.windowed}
    table = []
    for r in rows:
        s = r.sweep
        base = full[(r.pair, s.seq_len)].sweep.admitted
        gain = f"{s.admitted / base:.1f}x" if r.windowed and base else ("-" if r.windowed else "1x")
        table.append([r.model, r.layers, f"{s.seq_len:,}", r.ledger, s.admitted,
                      f"{s.blocks_per_sequence:,} / {s.held_per_sequence:,} / {s.peak_per_sequence:,}",
                      f"{s.num_blocks:,}", gain])
    pools = {r.model: r.pool for r in rows}
    return "\n".join([
        "## 7. Windows, sinks and hybrid layers\n",
        f"Sequences of one context length that the report's budget ({budget.describe()}, KV in "
        f"bf16, blocks of {BLOCK_SIZE} tokens) holds when sliding-window layers keep only their "
        "window: Gemma-2-9B and Gemma-3-12B beside the same models with every layer global, and "
        f"Llama-3-8B with {SINKS} attention sinks and a {WINDOW:,}-token window (StreamingLLM) "
        "beside its full history. `ledger`: `MemoryLedger.max_batch(seq_len, block_size=16)` "
        "(per layer group, the tokens it keeps rounded up to whole blocks). `pool`: sequences "
        "admitted one after the other into a real `pykvpool.BlockPool` of the model's groups "
        "(vLLM's grouping: `pykvpool.planning.pool_groups.pool_layout`) and the budget's blocks, "
        f"each prefilled in chunks of {CHUNK_TOKENS:,} tokens to the length minus one and given "
        "one decode token, until the pool raises `PoolExhaustedError` "
        "(`pykvpool.planning.sweeps.hybrid_concurrency`). Each growth first releases the blocks "
        "its window no longer needs, so a sequence holds its window's blocks once decoding, but "
        "about one chunk more per windowed group while it is prefilled: the pool admits the "
        "ledger's count, or fewer when that transient does not fit beside the others. Blocks "
        "per sequence: ledger / pool at the length / pool peak during prefill. Lengths beyond a "
        "model's `max_position_embeddings` (8,192 for Gemma-2-9B and Llama-3-8B) are memory "
        "arithmetic only.\n",
        "Pools: " + "; ".join(f"{name}: {desc}" for name, desc in pools.items()) + ".\n",
        markdown_table(["model", "layers", "context (tokens)", "sequences (ledger)",
                        "sequences (pool)", "blocks / sequence", "pool blocks",
                        "pool vs full history"], table) + "\n",
        f"![windows]({figs['fig9_windows'].name})\n",
    ])
