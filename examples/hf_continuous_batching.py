"""Serve many prompts on a Hugging Face transformers model with continuous batching on pykvpool.

A small Mistral-style model (a sliding window of 8 tokens; random weights from a config:
nothing is downloaded) answers 10 prompts of different lengths with
`pykvpool.hf.ContinuousBatcher`: every forward pass packs the new tokens of all running
sequences into one row (prompt chunks of at most 8 tokens beside one token per decoding
sequence), and the pool is kept so small (20 blocks of 4 tokens) that only some prompts run
at once: a prompt is admitted only while the running sequences' footprints and its own fit
(in a window group a footprint is the window's blocks, however long the sequence grows), so
the batcher never has to preempt here. The greedy tokens must equal per-prompt `generate`
with transformers' `DynamicCache`.

Run: `python examples/hf_continuous_batching.py` (needs `pip install 'pykvpool[hf]'`).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import pykvpool.hf as phf  # noqa: E402

CONFIG = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, sliding_window=8, max_position_embeddings=512,
              pad_token_id=0, bos_token_id=1, eos_token_id=None)
PROMPT_LENS = (3, 19, 7, 26, 12, 5, 31, 9, 16, 2)
NEW_TOKENS = 24
#: The batcher's limits: a pool too small for every sequence at once, chunks of 8 tokens.
LIMITS = dict(num_blocks=20, block_size=4, max_running=8, max_batched_tokens=32, chunk_size=8)


def build(impl: str) -> torch.nn.Module:
    """The model with fixed random weights and the given attention implementation."""
    cfg = transformers.AutoConfig.for_model("mistral", **CONFIG)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()


def prompts() -> list[list[int]]:
    """Random prompts (token ids 2..96) of PROMPT_LENS tokens."""
    g = torch.Generator().manual_seed(1)
    return [torch.randint(2, 97, (n,), generator=g).tolist() for n in PROMPT_LENS]


def run() -> dict[str, object]:
    """Serve the prompts; return the batcher's and the reference's tokens and the batcher."""
    ps = prompts()
    batcher = phf.ContinuousBatcher(build(phf.ATTN_IMPLEMENTATION), **LIMITS)
    served = batcher.run(ps, NEW_TOKENS)
    ref_model = build("sdpa")
    reference = []
    with torch.no_grad():
        for p in ps:
            seq = ref_model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                     do_sample=False)
            reference.append(seq[0, len(p):].tolist())
    return {"served": served, "reference": reference, "batcher": batcher}


if __name__ == "__main__":
    torch.set_num_threads(1)  # a tiny model: more threads only spin against pykvpool's on a small machine
    out = run()
    b: phf.ContinuousBatcher = out["batcher"]  # type: ignore[assignment]
    st = b.stats
    print(f"{len(PROMPT_LENS)} prompts, {NEW_TOKENS} new tokens each: identical tokens: "
          f"{out['served'] == out['reference']}")
    print(f"{st.steps} forward passes, {st.forward_tokens} tokens fed, {st.prefill_chunks} prompt chunks, "
          f"{st.mixed_steps} passes mixing prefill and decode, {st.preemptions} preemptions, "
          f"at most {st.max_running} sequences and {st.peak_used_blocks} of {b.cache.pool.num_blocks} blocks")
    print(f"{b.cache.pool.num_used_blocks} blocks still used")
