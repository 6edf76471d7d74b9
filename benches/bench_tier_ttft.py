"""Time to first token of a multi-turn chat whose earlier turns no longer fit the pool:
computed again, loaded from the host tier, or loaded from the disk tier
(``pykvpool.hf.ContinuousBatcher(host_blocks=, disk_dir=)``).

A Llama-style model from its config, random weights from a fixed seed, nothing downloaded:
4 layers, hidden 512, 8 query heads over 4 KV heads of 64, MLP 1376, vocabulary 32000,
f32. Three conversations take turns (turn 1 of each, then turn 2 of each, ...); a turn's
prompt is the conversation's history and a new 2,048-token user message; each turn
generates one token (the TTFT). The pool (G1) holds one history of the last turn and a
little more, so by a conversation's next turn its earlier turns were evicted by the
others'. Four batchers in one process, each turn run by each in turn (so they share the
machine's noise):

- ``recompute``: G1 only (prefix caching on): an evicted history is computed again;
- ``host``: G1 and a host tier G2 = 4 x G1;
- ``through``: the same, with write-through (each block copied to G2 once computed);
- ``disk``: G1, a host tier of 64 blocks and a disk tier G3 = 16 x G1 in a temporary
  folder (each block file fsynced, as by default).

Printed per run and turn: the median TTFT over the conversations and the median (min-max)
of the per-conversation ratios ``recompute`` TTFT / the run's (the same turn of the same
conversation, run back to back), and whether every run's tokens equal ``recompute``'s.
Turn 1 has nothing to reload (the three do the same work: its ratio is the noise and the
cost of storing evicted blocks); turn 2 finds most of a history still in G1.

Run: ``python -m benches.bench_tier_ttft [--threads 2] [--turns 3] [--out F.json]`` (needs
the ``hf`` extra; about fifteen minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from benches.common import machine, out_path, write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIG = dict(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=16384,
              rms_norm_eps=1e-5, rope_theta=10000.0, pad_token_id=None, bos_token_id=1, eos_token_id=None)
TURN = 2048
CONVERSATIONS = 3
BLOCK = 16


def build() -> Any:
    import torch
    import transformers

    import pykvpool.hf as phf

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**CONFIG)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=phf.ATTN_IMPLEMENTATION).eval()


def chat(batchers: dict[str, Any], messages: list[list[list[int]]]) -> dict[str, Any]:
    """Every turn of every conversation, round robin, each run by every batcher in turn
    (so they share the machine's noise); per batcher the TTFT seconds per turn and
    conversation, and the tokens generated. The history follows the first batcher's
    tokens."""
    history: list[list[int]] = [[] for _ in messages]
    runs: dict[str, Any] = {name: {"ttft_s": [[] for _ in messages[0]], "tokens": []} for name in batchers}
    for t in range(len(messages[0])):
        for c, conv in enumerate(messages):
            history[c] = history[c] + conv[t]
            outs = []
            for name, b in batchers.items():
                start = time.perf_counter()
                out = b.run([history[c]], 1)[0]
                runs[name]["ttft_s"][t].append(time.perf_counter() - start)
                runs[name]["tokens"] += out
                outs.append(out)
            history[c] = history[c] + outs[0]
    return runs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--turns", type=int, default=3, help="turns per conversation (default 3)")
    ap.add_argument("--out", help="JSON path (default benches/out/tier_ttft.json)")
    args = ap.parse_args(argv)
    import torch

    import pykvpool.hf as phf

    torch.set_num_threads(args.threads)
    model = build()
    rng = np.random.default_rng(1)
    messages = [[rng.integers(2, CONFIG["vocab_size"], TURN).tolist() for _ in range(args.turns)]
                for _ in range(CONVERSATIONS)]
    longest = args.turns * (TURN + 1)
    g1 = -(-longest // BLOCK) + 32
    with tempfile.TemporaryDirectory(prefix="pykvpool-ttft-") as tmp:
        configs = {
            "recompute": {},
            "host": {"host_blocks": 4 * g1},
            "through": {"host_blocks": 4 * g1, "write_through": True},
            "disk": {"host_blocks": 64, "disk_dir": os.path.join(tmp, "kv"), "disk_blocks": 16 * g1},
        }
        with torch.inference_mode():
            batchers = {name: phf.ContinuousBatcher(model, num_blocks=g1, block_size=BLOCK, prefix_caching=True,
                                                    max_batched_tokens=512, chunk_size=512, **tiers)
                        for name, tiers in configs.items()}
            runs = chat(batchers, messages)
            for name, b in batchers.items():
                runs[name]["transfers"] = b.cache.pool.tier_transfer_stats()
    base = runs["recompute"]
    print(f"G1 {g1} blocks of {BLOCK} tokens; {CONVERSATIONS} conversations x {args.turns} turns of {TURN} "
          f"tokens; torch threads {args.threads}; per turn: median TTFT, median [min-max] of the per-conversation "
          "ratios recompute / run")
    print(f"{'run':10} " + " ".join(f"{'turn ' + str(t + 1):>28}" for t in range(args.turns)) + "  tokens")
    for name, r in runs.items():
        cells = []
        for t in range(args.turns):
            ratios = [b / x for b, x in zip(base["ttft_s"][t], r["ttft_s"][t])]
            r.setdefault("ratios", []).append(ratios)
            cells.append(f"{statistics.median(r['ttft_s'][t]):6.3f} s {statistics.median(ratios):5.2f}x "
                         f"[{min(ratios):.2f}-{max(ratios):.2f}]")
        print(f"{name:10} " + " ".join(f"{c:>28}" for c in cells) + f"  {r['tokens'] == base['tokens']}")
    for name, r in runs.items():
        if r["transfers"]:
            print(f"{name}: {r['transfers']}")
    result = {"machine": machine(), "g1_blocks": g1, "turn_tokens": TURN, "conversations": CONVERSATIONS,
              "threads": args.threads, "runs": {k: {**v, "tokens": None, "same_tokens": v["tokens"] == base["tokens"]}
                                                 for k, v in runs.items()}}
    write_json(result, out_path(args.out, "tier_ttft.json"))


if __name__ == "__main__":
    main()
