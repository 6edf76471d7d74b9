"""K/V bytes held after a greedy generation: pykvpool.hf.PagedKvCache against transformers'
DynamicCache, same model (small configs, random weights, from tests/hf/test_hf.py), same
batch (4 left-padded prompts of 3..17 tokens, 64 new tokens).

Run: ``python -m benches.bench_hf_memory [--out FILE]`` (needs the ``hf`` extra; JSON in
``benches/out/bench_hf_memory.json``). DynamicCache stores
every row at the padded width (and its sliding layers exactly ``window - 1`` tokens);
the pool stores real tokens only, in whole blocks, windows released block by block.
"""

from __future__ import annotations

import argparse
import sys

from benches.common import out_path, write_json


def main(argv: list[str] | None = None) -> int:
    """Print one line per model and block size, and write them as JSON.

    Raises:
        ImportError: torch or transformers missing.
    """
    from transformers import DynamicCache

    import pykvpool.hf as phf
    from tests.hf import test_hf as t

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON output path (default benches/out/bench_hf_memory.json)")
    args = ap.parse_args(argv)
    rows = []
    for mt in ("llama", "mistral", "gemma2"):
        ref = t.build(mt, t.REFERENCE.get(mt, "sdpa"))
        dc = DynamicCache(config=ref.config)
        t.generate(ref, dc)
        dyn = sum(layer.keys.nbytes + layer.values.nbytes for layer in dc.layers)
        model = t.build(mt, phf.ATTN_IMPLEMENTATION)
        for bs in (4, 16):
            pc = phf.PagedKvCache(model.config, num_blocks=512, block_size=bs)
            t.generate(model, pc)
            held = pc.nbytes_held()
            rows.append(dict(model=mt, block_size=bs, dynamic_cache_bytes=dyn, pykvpool_bytes=held,
                             blocks=pc.pool.num_used_blocks))
            print(f"{mt:8s} block_size={bs:2d}: DynamicCache {dyn:7d} B, pykvpool {held:7d} B "
                  f"({held / dyn:.2f}x), {pc.pool.num_used_blocks} blocks")
    write_json(rows, out_path(args.out, "bench_hf_memory.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
