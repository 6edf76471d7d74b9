"""Generation throughput on CPU: pykvpool's continuous batching (``pykvpool.hf.ContinuousBatcher``)
against transformers' own continuous batching (``model.generate_batch``, its
``PagedAttentionCache`` with paged sdpa: the former ``"sdpa_paged"``) and against per-prompt
``model.generate`` with ``DynamicCache`` (sdpa), same model (a small Llama from a config,
random weights, nothing downloaded), same prompts, greedy.

Each round runs the three engines back to back, in an order rotated every round, after a
``gc.collect()``; a round's ratios are pykvpool's generated tokens/s over each peer's, and
the table gives the median of the per-round ratios with their IQR. ``generate_batch`` ends
every call with ``gc.collect()`` (in its manager's ``stop``): its tokens/s are given for the
whole call and without those collections (timed by a wrapper around ``gc.collect`` that
still runs it). Tokens of the first round are compared across engines. The figure plots
tokens/s against the number of prompts.

Run: ``python -m benches.bench_hf_serving [--quick] [--figure hf_serving.png]`` (needs the
``hf`` extra and matplotlib). Threads: ``--torch-threads`` (all engines, default 1) and
``--kv-threads`` (pykvpool's kernels, default 1).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIG = dict(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, head_dim=32, max_position_embeddings=1024, pad_token_id=0, bos_token_id=1,
              eos_token_id=None)
ENGINES = ("pykvpool", "generate_batch", "sequential")


class _TimedGC:
    """Stands for the ``gc`` module inside transformers' continuous batching: ``collect``
    still collects, and adds its time to ``seconds``."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def collect(self, *args: Any) -> int:
        t = time.perf_counter()
        n = gc.collect(*args)
        self.seconds += time.perf_counter() - t
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


def build(impl: str) -> Any:
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model("llama", **CONFIG)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()


def make_prompts(n: int, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, CONFIG["vocab_size"], size=int(rng.integers(16, 97))).tolist() for _ in range(n)]


def run_pykvpool(model: Any, prompts: list[list[int]], new: int, max_tokens: int) -> list[list[int]]:
    import pykvpool.hf as phf

    blocks = sum(-(-(len(p) + new) // 16) for p in prompts) + 8
    b = phf.ContinuousBatcher(model, num_blocks=blocks, block_size=16, max_running=len(prompts),
                              max_batched_tokens=max_tokens, chunk_size=max_tokens)
    return b.run(prompts, new)


def run_generate_batch(model: Any, prompts: list[list[int]], new: int, max_tokens: int) -> list[list[int]]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    blocks = sum(-(-(len(p) + new) // 16) for p in prompts) + 8
    gc_cfg = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    cb = ContinuousBatchingConfig(page_size=16, num_blocks=blocks, max_batch_tokens=max_tokens,
                                  max_requests_per_batch=len(prompts), use_cuda_graph=False)
    res = model.generate_batch(prompts, generation_config=gc_cfg, continuous_batching_config=cb, warmup=False)
    return [list(res[f"req_{i}"].generated_tokens) for i in range(len(prompts))]


def run_sequential(model: Any, prompts: list[list[int]], new: int, max_tokens: int) -> list[list[int]]:
    import torch

    out = []
    with torch.no_grad():
        for p in prompts:
            seq = model.generate(torch.tensor([p]), max_new_tokens=new, min_new_tokens=new, do_sample=False)
            out.append(seq[0, len(p):].tolist())
    return out


def measure(models: dict[str, Any], prompts: list[list[int]], new: int, max_tokens: int, rounds: int,
            timed_gc: _TimedGC) -> dict[str, Any]:
    """Rounds of the three engines; tokens/s per engine per round, and the first round's tokens."""
    runners = {"pykvpool": run_pykvpool, "generate_batch": run_generate_batch, "sequential": run_sequential}
    tps: dict[str, list[float]] = {e: [] for e in (*ENGINES, "generate_batch_no_gc")}
    tokens: dict[str, list[list[int]]] = {}
    for r in range(rounds + 1):  # round 0 warms every engine up, untimed
        order = ENGINES[r % 3:] + ENGINES[:r % 3]
        for e in order:
            gc.collect()
            timed_gc.seconds = 0.0
            t = time.perf_counter()
            out = runners[e](models[e], prompts, new, max_tokens)
            dt = time.perf_counter() - t
            n = sum(map(len, out))
            if r == 0:
                tokens[e] = out
                continue
            tps[e].append(n / dt)
            if e == "generate_batch":
                tps["generate_batch_no_gc"].append(n / (dt - timed_gc.seconds))
    return {"tps": tps, "tokens": tokens}


def ratio_summary(a: list[float], b: list[float]) -> tuple[float, float, float]:
    r = np.array(a) / np.array(b)
    return float(np.median(r)), float(np.quantile(r, 0.25)), float(np.quantile(r, 0.75))


def plot(rows: list[dict[str, Any]], path: str) -> None:
    from pykvpool.plotting import new_figure, save

    fig = new_figure((6.4, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    xs = [row["prompts"] for row in rows]
    labels = {"pykvpool": "pykvpool ContinuousBatcher", "generate_batch": "transformers generate_batch",
              "generate_batch_no_gc": "generate_batch without its gc.collect()",
              "sequential": "generate per prompt (DynamicCache)"}
    for e, style in (("pykvpool", "o-"), ("generate_batch", "s-"), ("generate_batch_no_gc", "s--"),
                     ("sequential", "^-")):
        ax.plot(xs, [float(np.median(row["tps"][e])) for row in rows], style, label=labels[e])
    ax.set_xlabel("prompts served together")
    ax.set_ylabel("generated tokens / s (median of rounds)")
    ax.set_title(f"CPU greedy generation, Llama {CONFIG['num_hidden_layers']}x{CONFIG['hidden_size']}")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; print the table, write the figure (and JSON with ``--json``).

    Raises:
        ImportError: torch, transformers or matplotlib missing.
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--max-batched-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--kv-threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 and 4 prompts, 8 new tokens, 2 rounds")
    ap.add_argument("--figure", default="hf_serving.png")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.new_tokens, args.rounds = [2, 4], 8, 2

    import torch
    import transformers.generation.continuous_batching.continuous_api as capi

    import pykvpool
    import pykvpool.hf as phf

    torch.set_num_threads(args.torch_threads)
    pykvpool.set_num_threads(args.kv_threads)
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    timed_gc = _TimedGC()
    capi.gc = timed_gc  # type: ignore[attr-defined]
    models = {"pykvpool": build(phf.ATTN_IMPLEMENTATION), "generate_batch": build("sdpa"), "sequential": build("sdpa")}
    rows = []
    print(f"threads: torch {args.torch_threads}, pykvpool {args.kv_threads}; {args.new_tokens} new tokens per prompt, "
          f"prompts of 16..96 tokens, {args.rounds} rounds")
    print("| prompts | pykvpool tok/s | generate_batch tok/s (no gc) | sequential tok/s | "
          "vs generate_batch [IQR] | vs generate_batch no gc [IQR] | vs sequential [IQR] | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.prompts:
        res = measure(models, make_prompts(n), args.new_tokens, args.max_batched_tokens, args.rounds, timed_gc)
        tps, tok = res["tps"], res["tokens"]
        same = {e: sum(a == b for a, b in zip(tok["pykvpool"], tok[e])) for e in ENGINES[1:]}
        row = {"prompts": n, "tps": tps, "same_tokens": same,
               "ratios": {e: ratio_summary(tps["pykvpool"], tps[e]) for e in tps if e != "pykvpool"}}
        rows.append(row)
        med = {e: float(np.median(v)) for e, v in tps.items()}
        rs = row["ratios"]
        cell = {e: f"{rs[e][0]:.2f}x [{rs[e][1]:.2f}-{rs[e][2]:.2f}]" for e in rs}
        print(f"| {n} | {med['pykvpool']:.0f} | {med['generate_batch']:.0f} ({med['generate_batch_no_gc']:.0f}) | "
              f"{med['sequential']:.0f} | {cell['generate_batch']} | {cell['generate_batch_no_gc']} | "
              f"{cell['sequential']} | {same['generate_batch']}/{n}, {same['sequential']}/{n} |")
    plot(rows, args.figure)
    print(f"figure: {args.figure}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": CONFIG, "args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
