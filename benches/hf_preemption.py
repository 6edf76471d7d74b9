"""Preemption on a tight pool: what ``pykvpool.hf.ContinuousBatcher`` feeds the model when the
pool barely holds the longest sequence.

A SmolLM-135M-shaped Llama (hidden 576, 30 layers, 9 query heads, 3 KV heads, MLP 1536,
vocabulary 49152, tied embeddings) from its config, random weights from a fixed seed,
nothing downloaded; 8 prompts of 19 to 312 random tokens, 48 new tokens each, greedy;
chunks of 64 prompt tokens. The tight run has 26 blocks of 16 tokens: 1.13x the 23 blocks
the longest sequence stores (312 prompt tokens and 47 generated ones: the last is never
fed), 1.08x 24; the ample run has a block for every token of every sequence (no
preemption). Printed: preemptions, tokens fed to the model (recomputed ones included),
tokens generated, forward passes, peak blocks used, and whether the tight run's tokens equal
the ample run's. Counts, not timings: they are a function of the policy and the model's
greedy tokens.

Run: ``python -m benches.hf_preemption [--threads 2] [--json out.json]`` (needs the ``hf``
extra; a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: SmolLM-135M's shape (the architecture of HuggingFaceTB/SmolLM-135M), random weights.
SMOLLM_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                   num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=2048,
                   tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=10000.0, pad_token_id=None,
                   bos_token_id=1, eos_token_id=None)
PROMPT_LENS = (141, 19, 312, 57, 96, 230, 38, 175)
NEW = 48
BLOCK = 16
CHUNK = 64
TIGHT_BLOCKS = 26


def build() -> Any:
    import torch
    import transformers

    import pykvpool.hf as phf

    cfg = transformers.LlamaConfig(**SMOLLM_135M)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=phf.ATTN_IMPLEMENTATION).eval()


def make_prompts(seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, SMOLLM_135M["vocab_size"], size=n).tolist() for n in PROMPT_LENS]


def serve(model: Any, prompts: list[list[int]], num_blocks: int) -> dict[str, Any]:
    import pykvpool.hf as phf

    b = phf.ContinuousBatcher(model, num_blocks=num_blocks, block_size=BLOCK, chunk_size=CHUNK)
    t = time.perf_counter()
    out = b.run(prompts, NEW)
    st = b.stats
    digest = hashlib.sha256(json.dumps(out).encode()).hexdigest()[:16]
    return dict(num_blocks=num_blocks, preemptions=st.preemptions, forward_tokens=st.forward_tokens,
                generated_tokens=st.generated_tokens, steps=st.steps, peak_used_blocks=st.peak_used_blocks,
                seconds=round(time.perf_counter() - t, 1), tokens_sha256=digest, outputs=out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--json", help="write both runs (outputs included) to this file")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model, prompts = build(), make_prompts()
    ample = sum(-(-(n + NEW) // BLOCK) for n in PROMPT_LENS)
    longest = -(-(max(PROMPT_LENS) + NEW - 1) // BLOCK)
    runs = {"tight": serve(model, prompts, TIGHT_BLOCKS), "ample": serve(model, prompts, ample)}
    print(f"prompts {list(PROMPT_LENS)}, {NEW} new tokens each, blocks of {BLOCK}, chunks of {CHUNK}; "
          f"longest sequence {longest} blocks, tight pool {TIGHT_BLOCKS / longest:.2f}x that")
    print(f"{'run':6} {'blocks':>6} {'preempt':>7} {'fed':>7} {'generated':>9} {'steps':>5} {'peak':>4} "
          f"{'s':>6}  tokens")
    for name, r in runs.items():
        print(f"{name:6} {r['num_blocks']:6} {r['preemptions']:7} {r['forward_tokens']:7} "
              f"{r['generated_tokens']:9} {r['steps']:5} {r['peak_used_blocks']:4} {r['seconds']:6}  "
              f"{r['tokens_sha256']}")
    same = runs["tight"]["outputs"] == runs["ample"]["outputs"]
    print(f"tight tokens == ample tokens: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f)


if __name__ == "__main__":
    main()
