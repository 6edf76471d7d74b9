"""The ``pykvpool`` command line: ``ledger``, ``sweep``, ``report`` and ``replay`` (prefix-cache
hit rates of a block-id trace, see :mod:`pykvpool.prefix_replay`).

Every subcommand takes ``--out DIR`` (it writes its tables there as Markdown and JSON) and
draws progress bars on stderr for the steps that can take more than a second
(``--quiet`` silences them). Bad input (unknown preset, a non-positive size, a budget below
the weights, an empty workload, a malformed trace file) prints ``pykvpool: error: ...``
on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pykvpool._native import KvPoolError
from pykvpool.hardware import HARDWARE, Hardware, hardware_preset, measure_this_machine
from pykvpool.ledger import GIB, MIB, Budget, MemoryLedger
from pykvpool.models import DTYPES, MODELS, ModelConfig, model_preset, storage_dtype
from pykvpool import prefix_replay
from pykvpool.progress import ProgressBar
from pykvpool.sim_sweep import add_subcommand as add_simulate
from pykvpool.sweeps import (
    BLOCK_SIZES,
    block_size_sweep,
    contiguous,
    paged,
    paged_shared_prefix,
    waste_decomposition,
)
from pykvpool.workloads import (
    ARTICLE_MAX_LEN,
    Workload,
    article_heavy_tail,
    article_uniform,
    azure_trace,
    read_trace,
)

__all__ = ["main"]

WORKLOADS = ("uniform", "heavy", "azure-code", "azure-conv")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _nonneg_float(text: str) -> float:
    value = float(text) if text.replace(".", "", 1).isdigit() else -1.0
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def _int_list(text: str) -> list[int]:
    return [_positive_int(t) for t in text.split(",") if t.strip()]


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and budget")
    g.add_argument("--model", default="llama-3-8b",
                   help=f"model preset: {', '.join(MODELS)} (default llama-3-8b)")
    g.add_argument("--hf-config", metavar="FILE",
                   help="a Hugging Face config.json instead of a preset")
    g.add_argument("--dtype", default="bf16",
                   help=f"KV storage dtype: {', '.join(DTYPES)}; 8-bit ones take :head (default), "
                        ":gN or :tensor scale granularity")
    g.add_argument("--weight-bytes", type=_positive_float, metavar="BYTES",
                   help="bytes per weight parameter (default 2 = bf16; 1 = fp8/int8, 0.5 = int4)")
    g.add_argument("--hardware", help=f"device preset for memory and bandwidth: {', '.join(HARDWARE)}, or 'this' "
                        "(measure this machine with the kernel's probes)")
    g.add_argument("--memory-gib", type=_positive_float,
                   help="device memory in GiB (default 80, the article's; or the --hardware's)")
    g.add_argument("--fraction", type=_positive_float, default=1.0,
                   help="usable share of device memory, in (0, 1] (default 1.0)")
    g.add_argument("--reserve-gib", type=_nonneg_float, default=4.0,
                   help="reserve for activations and framework, GiB (default 4, the article's)")
    p.add_argument("--out", metavar="DIR", help="also write the results into DIR (Markdown + JSON)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _model(args: argparse.Namespace) -> ModelConfig:
    if args.hf_config:
        try:
            cfg = json.loads(Path(args.hf_config).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise KvPoolError(f"{args.hf_config}:{e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(cfg, dict):
            raise KvPoolError(f"{args.hf_config}: expected a JSON object")
        model = ModelConfig.from_hf_config(cfg, name=Path(args.hf_config).stem)
    else:
        model = model_preset(args.model)
    if args.weight_bytes:
        model = replace(model, weight_bytes_per_param=args.weight_bytes)
    return model


def _hardware(args: argparse.Namespace) -> Hardware | None:
    if not args.hardware:
        return None
    if args.hardware == "this":
        if getattr(args, "_measured", None) is None:
            with ProgressBar("measuring this machine", 1, enabled=not args.quiet):
                args._measured = measure_this_machine()
        hw: Hardware = args._measured
        return hw
    return hardware_preset(args.hardware)


def _ledger(args: argparse.Namespace) -> MemoryLedger:
    hw = _hardware(args)
    memory = args.memory_gib * GIB if args.memory_gib else (hw.memory_bytes if hw else 80 * GIB)
    if args.fraction > 1:
        raise KvPoolError(f"--fraction must be in (0, 1], got {args.fraction}")
    budget = Budget(memory, args.fraction, args.reserve_gib * GIB)
    return MemoryLedger(_model(args), budget, storage_dtype(args.dtype))


def _write(out: str | None, stem: str, markdown: str, data: Any) -> None:
    if not out:
        return
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{stem}.md").write_text(markdown, encoding="utf-8")
    (d / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    print(f"wrote {d / (stem + '.md')} and {d / (stem + '.json')}")


def _cmd_ledger(args: argparse.Namespace) -> int:
    led = _ledger(args)
    m = led.model
    lines = [
        f"model            {m.name}: L={m.num_layers}, n_q={m.num_q_heads}, "
        f"n_kv={m.num_kv_heads}, d={m.head_dim}, {m.num_params / 1e9:.2f}e9 params",
        f"KV dtype         {led.dtype.name} (scales: {led.dtype.granularity})",
        f"KV per token     {led.bytes_per_token} B ({led.bytes_per_token / 1024:.2f} KiB)",
        f"KV per sequence  {led.kv_bytes(args.seq_len) / GIB:.2f} GiB at {args.seq_len} tokens",
        f"weights          {led.weight_bytes / GIB:.2f} GiB",
        f"budget           {led.budget.usable_bytes / GIB:.2f} GiB usable - weights - "
        f"{led.budget.reserve_bytes / GIB:.2f} GiB reserve = {led.kv_budget_bytes / GIB:.2f} GiB KV",
        f"KV capacity      {led.token_capacity:,} tokens",
        f"max batch        {led.max_batch(args.seq_len)} at {args.seq_len} tokens",
        f"max length       {led.max_seq_len(args.batch):,} tokens at batch {args.batch}",
    ]
    row = led.row(args.batch, args.seq_len)
    lines.append(f"batch {args.batch} x {args.seq_len}: KV {row.kv_bytes / GIB:.2f} GiB = "
                 f"{row.kv_over_weights:.2f}x weights; weights + KV {row.weights_plus_kv_bytes / GIB:.2f} GiB"
                 + ("" if row.kv_bytes <= led.kv_budget_bytes else " -- EXCEEDS the KV budget"))
    data: dict[str, Any] = {"model": m.name, "dtype": led.dtype.name,
                            "bytes_per_token": led.bytes_per_token,
                            "weight_bytes": led.weight_bytes, "kv_budget_bytes": led.kv_budget_bytes,
                            "token_capacity": led.token_capacity,
                            "max_batch": led.max_batch(args.seq_len),
                            "max_seq_len": led.max_seq_len(args.batch)}
    for hw in [_hardware(args) or hardware_preset("a100-80gb-sxm")]:
        cd = led.dtype.name.split(":")[0] if args.hardware != "this" else "fp32"
        b = led.decode_bound(hw, args.seq_len, args.batch, compute_dtype=cd)
        lines.append(f"decode on {hw.name}: step >= {b.step_time * 1e3:.2f} ms "
                     f"({'memory' if b.memory_bound else 'compute'} bound), "
                     f"<= {b.tokens_per_s:.0f} tokens/s at batch {args.batch}")
        data["decode"] = {"hardware": hw.name, "step_s": b.step_time,
                          "tokens_per_s": b.tokens_per_s, "bytes": b.bytes_moved, "flops": b.flops}
    text = "\n".join(lines)
    print(text)
    _write(args.out, "ledger", "```\n" + text + "\n```\n", data)
    return 0


def _workload(args: argparse.Namespace) -> Workload:
    if args.trace:
        return read_trace(args.trace)
    loaders: dict[str, Callable[[], Workload]] = {
        "uniform": article_uniform, "heavy": article_heavy_tail,
        "azure-code": lambda: azure_trace("code"), "azure-conv": lambda: azure_trace("conv")}
    return loaders[args.workload]()


def _cmd_sweep(args: argparse.Namespace) -> int:
    led = _ledger(args)
    wl = _workload(args)
    max_len = args.max_len or (ARTICLE_MAX_LEN if args.workload in ("uniform", "heavy")
                               and not args.trace else led.model.max_context)
    wl = wl.clipped(max_len)
    cap, bpt = led.token_capacity, led.bytes_per_token
    with ProgressBar("sweep", 3 + len(args.block_sizes), enabled=not args.quiet) as bar:
        results = [contiguous(wl, cap, max_len, bpt), paged(wl, cap, args.block_size, bpt)]
        bar(1)
        if args.prefix is not None:
            results.append(paged_shared_prefix(wl, cap, args.prefix, args.block_size, bpt))
        bar(2)
        waste = waste_decomposition(wl, max_len, args.block_size, bpt)
        bar(3)
        rows = block_size_sweep(wl, args.block_sizes, cap,
                                progress=lambda d, t: bar(3 + d, 3 + t))
    lines = [f"workload {wl.name}: {len(wl)} requests (mean {wl.mean_length:.1f} tokens, "
             f"{wl.dropped} longer than {max_len} dropped); KV capacity {cap:,} tokens "
             f"x {bpt} B",
             "", "| policy | block | admitted | reserved GiB | used GiB | utilization | gain |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.policy} | {r.block_size} | {r.admitted} | {r.reserved_bytes / GIB:.2f} | "
                     f"{r.used_bytes / GIB:.2f} | {r.utilization:.2%} | {r.gain_over(results[0]):.2f}x |")
    lines += ["", f"waste per request: reservation {waste.reservation_waste_bytes / MIB:.2f} MiB, "
              f"last block {waste.last_block_waste_bytes / MIB:.2f} MiB ({waste.ratio:.0f}x)", "",
              "| block | empty slots / request | utilization | table entries / request | admitted |",
              "|---|---|---|---|---|"]
    for b in rows:
        lines.append(f"| {b.block_size} | {b.empty_slots_per_request:.1f} | {b.utilization:.3%} | "
                     f"{b.table_entries_per_request:.1f} | {b.admitted} |")
    text = "\n".join(lines)
    print(text)
    data = {"workload": wl.name, "requests": len(wl), "dropped": wl.dropped,
            "capacity_tokens": cap, "bytes_per_token": bpt,
            "policies": [{**r.__dict__, "utilization": r.utilization} for r in results],
            "waste": waste.__dict__, "block_sizes": [b.__dict__ for b in rows]}
    _write(args.out, "sweep", text + "\n", data)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from pykvpool.report import build_report

    res = build_report(args.out, measure=not args.no_measure, progress=not args.quiet)
    print(f"wrote {res.markdown} ({len(res.figures)} figures) in {res.seconds:.1f} s; "
          f"{res.matched}/{res.reproduced} article numbers reproduced exactly")
    return 0 if res.matched == res.reproduced else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = argparse.ArgumentParser(
        prog="pykvpool",
        description="KV-cache capacity planning: memory ledger, static capacity sweeps "
                    "through pykvpool's block pool, and the full report.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{ledger,sweep,report,replay,simulate}")
    pl = sub.add_parser("ledger", help="memory ledger of one model on one budget",
                        description="KV bytes per token, weights, KV capacity, largest batch, "
                                    "longest length and the decode-step bound.")
    _add_common(pl)
    pl.add_argument("--seq-len", type=_positive_int, default=8192, help="tokens per sequence")
    pl.add_argument("--batch", type=_positive_int, default=1, help="sequences")
    pl.set_defaults(func=_cmd_ledger)
    ps = sub.add_parser("sweep", help="static capacity: contiguous vs paged through BlockPool",
                        description="Greedy admission of a workload into the KV budget under "
                                    "each policy, the waste decomposition and a block-size sweep.")
    _add_common(ps)
    ps.add_argument("--workload", choices=WORKLOADS, default="uniform",
                    help="built-in workload (default: the article's uniform one)")
    ps.add_argument("--trace", metavar="FILE",
                    help="a trace file instead: Azure CSV (ContextTokens, GeneratedTokens) or "
                         "one length per line")
    ps.add_argument("--max-len", type=_positive_int,
                    help="contiguous reservation per request, tokens (default 4096 for the "
                         "article's workloads, else the model's context window); longer "
                         "requests are dropped")
    ps.add_argument("--block-size", type=_positive_int, default=16, help="paged block size, tokens")
    ps.add_argument("--block-sizes", type=_int_list, default=list(BLOCK_SIZES),
                    help="comma-separated block sizes to sweep (default 1,2,4,...,256)")
    ps.add_argument("--prefix", type=int, default=None,
                    help="also run paged with a shared prefix of this many tokens")
    ps.set_defaults(func=_cmd_sweep)
    pr = sub.add_parser("report", help="the full capacity-planning report (Markdown + figures)",
                        description="Reproduce every number of the article through pykvpool, "
                                    "measure this machine, draw the figures and write one "
                                    "folder with report.md, PNG figures and report.json.")
    pr.add_argument("--out", metavar="DIR", default="pykvpool-report",
                    help="output folder (default pykvpool-report)")
    pr.add_argument("--no-measure", action="store_true",
                    help="skip measuring this machine and the decode kernel")
    pr.add_argument("--quiet", action="store_true", help="no progress bars")
    pr.set_defaults(func=_cmd_report)
    prefix_replay.add_subcommand(sub)
    add_simulate(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pykvpool`` command. Returns the exit status: 0 on success, 2 on
    bad input (message on stderr), 1 when the report does not reproduce every number.

    Args:
        argv: the arguments after the program name (None: ``sys.argv[1:]``).

    Raises:
        SystemExit: from argparse, for ``--help`` (status 0) or a usage error such as an
            unknown option or a malformed number (status 2, usage on stderr).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except (KvPoolError, OSError) as e:
        msg = str(e) if not isinstance(e, OSError) or not e.filename else f"{e.filename}: {e.strerror}"
        print(f"pykvpool: error: {msg}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
