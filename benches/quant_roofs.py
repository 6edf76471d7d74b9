"""Instruction-mix compute roofs of the AVX-512 decode paths for ``bench_quant.py``,
from ``cargo bench --bench dot_rates`` (``benches/dot_rates.rs``).

``dot_rates`` times, per decode path and g (query heads per KV head, 1 and 4), the
minimal instruction sequence the path issues per cached code (the widening of the codes
and the g dot products, K and V, from an L1-resident tile: no memory traffic, no
softmax) at 1 and 2 threads at once, by thread CPU time, and prints one JSON line. A
row's instruction-mix roof (sequences per second of a decode call, the unit of the
bench's tokens/s) is that path's codes/s at the shape's g and the row's thread count
over the codes per sequence (K and V, all KV heads, head_dim, every cached token). Thread
CPU time leaves out the time other processes hold the core, so on a loaded machine this
roof stays the core's capability while the wall-clock figures (decode, bandwidth probe,
``peak_flops``) drop; the table prints both FMA rates so the load shows.

The FMA-only roof counts only the dot-product instructions; the instruction-mix roof is at
most that at the same clock (checked per row, within ``SANITY_TOL`` for timing noise)
and lower by what the conversions and loads cost in issue slots. The softmax's ``exp2``
(12 instructions per 16 scores in the kernel) is reported apart as a fraction of the
instruction-mix time (per KV head and token, g scores against 2 d codes), not folded
into the roof: the roof is the irreducible per-code work.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

#: An instruction-mix roof may exceed the FMA-only roof by this fraction (two timings).
SANITY_TOL = 0.03
#: The 8-bit decode targets: memory-bound rows >= 1.8x bf16 and >= 75% of the bandwidth
#: probe; compute-bound rows >= 80% of the compute roof.
X_BF16, PCT_BW, PCT_COMPUTE = 1.8, 0.75, 0.80


def load_dot_rates(path: str | None, quick: bool, out_dir: Path) -> dict[str, Any] | None:
    """The JSON line of a ``dot_rates`` run: read from ``path`` (a saved output, or the
    line itself), else run ``cargo bench --bench dot_rates`` (``-- --quick`` if
    ``quick``) in the repository and keep its output in ``out_dir/dot_rates.txt``.
    ``None`` (with a note) when cargo or the bench fails."""
    if path is not None:
        text = Path(path).read_text()
    else:
        ran = _cargo_dot_rates(["--quick"] if quick else [])
        if ran is None:
            print("note: instruction-mix roofs left out")
            return None
        text = ran
        out_dir.mkdir(exist_ok=True)
        (out_dir / "dot_rates.txt").write_text(text)
    res = _json_line(text)
    if res is not None:
        return res
    print("note: no dot_rates JSON line (a CPU without AVX-512?): instruction-mix roofs left out")
    return None


def run_dot_rates(threads: int, out_dir: Path) -> dict[str, Any] | None:
    """One ``dot_rates --quick`` run at ``threads`` only (a second of measuring per thread
    count), its JSON line parsed; ``None`` (with a note) when it cannot run."""
    text = _cargo_dot_rates(["--quick", "--threads", str(threads)])
    return None if text is None else _json_line(text)


def _cargo_dot_rates(args: list[str]) -> str | None:
    """The output of ``cargo bench --bench dot_rates -- ARGS`` in the repository, or
    ``None`` (with a note) when it cannot run or fails."""
    cmd = ["cargo", "bench", "--locked", "--bench", "dot_rates", "--", *args]
    try:
        run = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                             check=False)
    except OSError as e:
        print(f"note: `{' '.join(cmd)}` could not run ({e})")
        return None
    if run.returncode != 0:
        print(f"note: `{' '.join(cmd)}` failed ({run.stderr.strip()[-300:]})")
        return None
    return run.stdout


def merge_rates(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two ``dot_rates`` results as one: per (path, g, threads) and per FMA and exp2 rate the
    best of the two (contention on a shared machine only slows a loop down, so the best of
    runs spread over a benchmark is the core's capability; one run's 200 ms read 0.6-1.0 of
    it here), ``codes_per_fma`` recomputed from the best rates, and every run's K+V rate
    kept in the entry's ``kv_runs`` (the spread). ``a`` may be ``None`` (then ``b``)."""
    if b is None:
        return a
    if a is None:
        return _with_runs(b)
    out: dict[str, Any] = json.loads(json.dumps(a))
    for key, field in (("fma", "instr_per_s"), ("exp2", "scores_per_s")):
        for x in b[key]:
            mine = next((y for y in out[key] if y["threads"] == x["threads"]), None)
            if mine is None:
                out[key].append(dict(x))
            else:
                mine[field] = max(mine[field], x[field])
    for x in _with_runs(b)["rates"]:
        mine = next((y for y in out["rates"] if (y["path"], y["g"], y["threads"]) == (x["path"], x["g"], x["threads"])),
                    None)
        if mine is None:
            out["rates"].append(x)
            continue
        mine["kv_runs"] = mine.get("kv_runs", [mine["kv"]]) + x["kv_runs"]
        for part in ("k", "v", "kv"):
            mine[part] = max(mine[part], x[part])
    for x in out["rates"]:
        fma = next((f["instr_per_s"] for f in out["fma"] if f["threads"] == x["threads"]), None)
        if fma:
            x["codes_per_fma"] = x["kv"] / fma
    out["runs"] = a.get("runs", 1) + b.get("runs", 1)
    return out


def _with_runs(r: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``r`` with each entry's ``kv_runs`` (its own K+V rate when it has none)."""
    out: dict[str, Any] = json.loads(json.dumps(r))
    for x in out["rates"]:
        x.setdefault("kv_runs", [x["kv"]])
    return out


def _json_line(text: str) -> dict[str, Any] | None:
    """The ``{"dot_rates"`` line of a run's output, parsed."""
    for line in text.splitlines():
        if line.startswith('{"dot_rates"'):
            res: dict[str, Any] = json.loads(line)
            return res
    return None


def _entry(rates: dict[str, Any], name: str, g: int, threads: int) -> dict[str, Any] | None:
    for r in rates["rates"]:
        if r["path"] == name and r["g"] == g and r["threads"] == threads:
            return dict(r)
    return None


def instr_roof(rates: dict[str, Any] | None, name: str, g: int, threads: int, codes_per_seq: float
               ) -> dict[str, Any] | None:
    """The instruction-mix roof of row ``name`` at ``g`` and ``threads``: ``roof``
    (sequences/s: the dot_rates codes/s over ``codes_per_seq``; the best of the runs merged
    by ``merge_rates``, each run's roof in ``runs``), ``fma_roof_same_clock``
    (the FMA-only roof at dot_rates' own FMA rate, for the sanity check), ``codes_per_s``,
    ``codes_per_fma`` and ``nominal_codes_per_fma`` (the FMA-only count's), the FMA rate
    and ``exp2_frac`` (the softmax exp2's time over the per-code time, per KV head and
    token: g scores against 2 d codes). ``None`` if the run has no such entry."""
    if rates is None:
        return None
    e = _entry(rates, name, g, threads)
    fma = next((f["instr_per_s"] for f in rates["fma"] if f["threads"] == threads), None)
    exp = next((x["scores_per_s"] for x in rates["exp2"] if x["threads"] == threads), None)
    if e is None or fma is None or exp is None:
        return None
    d = rates["d"]
    return dict(roof=e["kv"] / codes_per_seq, fma_roof_same_clock=fma * e["nominal_codes_per_fma"] / codes_per_seq,
                runs=[x / codes_per_seq for x in e.get("kv_runs", [e["kv"]])],
                codes_per_s=e["kv"], codes_per_fma=e["codes_per_fma"],
                nominal_codes_per_fma=e["nominal_codes_per_fma"], fma_instr_per_s=fma,
                exp2_frac=(g / exp) / (2 * d / e["kv"]))


def sane(row: dict[str, Any]) -> bool:
    """The row's instruction-mix roof is at most its FMA-only roof, both at dot_rates'
    clock (within ``SANITY_TOL``)."""
    m = row["mix"]
    return m is None or bool(m["roof"] <= m["fma_roof_same_clock"] * (1 + SANITY_TOL))


def verdict(row: dict[str, Any], bf16_tps: float, bf16_roof: float) -> str:
    """Whether the 8-bit targets for this row are within the roofs of the instructions
    it uses. Memory-bound target (MHA rows, g = 1, and any row the bandwidth roof binds):
    >= 75% of the bandwidth probe needs an instruction-mix roof of at least 75% of the
    bandwidth roof, and >= 1.8x bf16 a min roof of at least 1.8x bf16's measured tokens/s
    (also shown: the min roof over bf16's min roof, the ratio were both at their roofs).
    Compute-bound target (the instruction-mix roof binds): 80% of that roof, with the
    row's share of it now."""
    if row["dtype"].startswith("bf16"):
        return "- (baseline)"
    if row["mix"] is None:
        return "? (no dot_rates)"
    mix, bw = row["mix"]["roof"], row["bw_roof"]
    out = []
    if row["g"] == 1 or row["binds"] == "bw":
        x_max = row["roof"] / bf16_tps
        bw_ok, x_ok = mix >= PCT_BW * bw, x_max >= X_BF16
        out.append(("memory target reachable" if bw_ok and x_ok else "memory target OUT OF REACH")
                   + f" (75% bw: {'yes' if bw_ok else 'no'}, instr roof {100 * mix / bw:.0f}% of bw; "
                   f"1.8x bf16: {'yes' if x_ok else 'no'}, roof {x_max:.2f}x bf16's tokens/s, "
                   f"{row['roof'] / bf16_roof:.2f}x its roof)")
    if row["binds"] == "instr":
        out.append(f"compute-bound: 80% of instr roof needed, {100 * row['pct_roof']:.0f}% now")
    return "; ".join(out)


def print_roofs(rows: list[dict[str, Any]], rates: dict[str, Any] | None) -> None:
    """The roofs table (one line per shape, threads and dtype) and the sanity check."""
    if rates is not None:
        src = "dot_rates --quick" if rates.get("quick") else "dot_rates"
        load = ", ".join(f"{t} thr: dot_rates {f['instr_per_s'] / 1e9:.2f}, this run's peak_flops / 32 "
                         f"{next(r['peak_gflops'] for r in rows if r['threads'] == t) / 32:.2f}"
                         for f in rates["fma"] for t in [f["threads"]] if any(r["threads"] == t for r in rows))
        print(f"\nInstruction-mix roofs from `cargo bench --bench {src}` (thread CPU time). FMA rates, G instr/s "
              f"({load}): where this run's is lower, the machine was busier during its probe. exp2: "
              f"{rates['exp2_instr_per_16_scores']} instructions per 16 scores, not in the roof.")
    print("\n| shape | g | thr | dtype | bw roof | FMA-only roof | instr-mix roof (lowest run, runs) | codes per FMA time "
          "(FMA-only count) | binds | % min roof | exp2 / mix time | target |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = next(x for x in rows if x["shape"] == r["shape"] and x["threads"] == r["threads"]
                    and x["dtype"] == "bf16")
        m = r["mix"]
        mix = "-" if m is None else f"{m['roof']:,.0f}" + (
            f" ({min(m['runs']):,.0f}, {len(m['runs'])})" if len(m["runs"]) > 1 else "")
        cpf = "-" if m is None else f"{m['codes_per_fma']:.2f} ({m['nominal_codes_per_fma']:.2f})"
        exp = "-" if m is None else f"{100 * m['exp2_frac']:.1f}%"
        print(f"| {r['shape']} | {r['g']} | {r['threads']} | {r['dtype']} | {r['bw_roof']:,.0f} | "
              f"{r['fma_roof']:,.0f} | {mix} | {cpf} | {r['binds']} | {100 * r['pct_roof']:.0f}% | {exp} | "
              f"{verdict(r, base['tokens_per_s'], base['roof'])} |")
    print("bw roof, FMA-only roof, instr-mix roof: tokens/s (sequences per second) if the call ran at that roof "
          "(instr-mix: the best of the dot_rates runs, the lowest run's and the number of runs beside it); "
          "binds: the lower of bw and instr-mix; codes per FMA time: the path's codes/s over the FMA's instr/s "
          "(dot_rates); exp2 / mix time: the softmax exp2 per score against the per-code work (not in the roof)")
    bad = [f"{r['shape']}/{r['threads']}/{r['dtype']}" for r in rows if not sane(r)]
    print("sanity: " + ("every instruction-mix roof <= its FMA-only roof at the same clock (within "
                        f"{100 * SANITY_TOL:.0f}%)" if not bad else "FAILED, instruction-mix roof above the "
                        "FMA-only roof: " + ", ".join(bad)))
