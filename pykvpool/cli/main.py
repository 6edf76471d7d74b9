"""The ``pykvpool`` command line: ``ledger``, ``sweep``, ``report``, ``replay`` (prefix-cache
hit rates of a block-id trace, see :mod:`pykvpool.prefix.replay`) and ``simulate`` (the
serving simulator, see :mod:`pykvpool.simulate.sweep`).

Every subcommand takes ``--out DIR`` (it writes its tables there as Markdown and JSON) and
draws progress bars on stderr for the steps that can take more than a second
(``--quiet`` silences them). ``ledger``, ``sweep`` and ``simulate`` share one memory
budget, :func:`pykvpool.planning.ledger.default_budget` unless ``--memory-gib`` / ``--fraction`` /
``--reserve-gib`` say otherwise, and print it.

Exit status (:func:`main`): 0 on success; 1 when the report does not reproduce every
number; 2 on bad input of any kind -- an unknown preset, a value out of range, a budget
below the weights, a file that cannot be read, is not UTF-8 text or is malformed -- with
one line ``pykvpool: error: <file>:<line>: <what>`` (or ``pykvpool: error: <what>``) on
stderr and never a traceback; 70 (``EX_SOFTWARE``) when pykvpool itself fails (an
``InvariantError`` or any unexpected exception: a bug, please report it; set
``PYKVPOOL_TRACEBACK=1`` to see the traceback); 130 on Ctrl-C; 141 (as if killed by
SIGPIPE) when stdout is closed early, e.g. ``pykvpool ledger | head -1``, quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pykvpool._native import InvalidArgumentError, InvariantError, KvPoolError
from pykvpool.cli.argtypes import (
    MAX_BLOCK_SIZE,
    CliParser,
    add_budget_args,
    budget_from_args,
    count,
    count_list,
    number,
    trace_columns,
)
from pykvpool.errors import TraceFormatError
from pykvpool.planning.hardware import HARDWARE, Hardware, hardware_preset, measure_this_machine
from pykvpool.planning.ledger import GIB, MIB, MemoryLedger
from pykvpool.planning.models import DTYPES, MODELS, ModelConfig, model_preset, storage_dtype
from pykvpool.progress import ProgressBar
from pykvpool.cli import replay as replay_cmd, simulate as simulate_cmd
from pykvpool.planning.sweeps import (
    BLOCK_SIZES,
    block_size_sweep,
    contiguous,
    paged,
    paged_shared_prefix,
    waste_decomposition,
)
from pykvpool.tracefile import read_text
from pykvpool.planning.workloads import (
    ARTICLE_MAX_LEN,
    Workload,
    article_heavy_tail,
    article_uniform,
    azure_trace,
    read_trace,
)

__all__ = ["EX_BUG", "EX_PIPE", "EX_USAGE", "main"]

WORKLOADS = ("uniform", "heavy", "azure-code", "azure-conv")
DEFAULT_HARDWARE = "a100-80gb-sxm"

EX_USAGE = 2
"""Exit status of every user error."""
EX_BUG = 70
"""Exit status when pykvpool itself fails (``EX_SOFTWARE`` of sysexits.h)."""
EX_PIPE = 141
"""Exit status when stdout is closed early (128 + SIGPIPE, as a killed C tool)."""
EX_INTERRUPTED = 130


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and budget")
    g.add_argument("--model", default="llama-3-8b",
                   help=f"model preset: {', '.join(MODELS)} (default llama-3-8b)")
    g.add_argument("--hf-config", metavar="FILE",
                   help="a Hugging Face config.json instead of a preset (dense decoders with "
                        "full attention; others are refused)")
    g.add_argument("--dtype", default="bf16",
                   help=f"KV storage dtype: {', '.join(DTYPES)}; 8-bit ones take :head (default), "
                        ":gN or :tensor scale granularity")
    g.add_argument("--weight-bytes", type=number(0.0, 64.0), metavar="BYTES",
                   help="bytes per weight parameter (default 2 = bf16; 1 = fp8/int8, 0.5 = int4)")
    g.add_argument("--hardware", help=f"device preset for memory and bandwidth: {', '.join(HARDWARE)}, or 'this' "
                        "(measure this machine with the kernel's probes); default the A100")
    add_budget_args(g)
    p.add_argument("--out", metavar="DIR", help="also write the results into DIR (Markdown + JSON)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _hf_config(path: str) -> ModelConfig:
    text = read_text(path)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(path, e.lineno, f"not valid JSON ({e.msg})") from None
    except (ValueError, RecursionError) as e:
        raise TraceFormatError(path, 0, f"not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise TraceFormatError(path, 0, "expected a JSON object")
    try:
        return ModelConfig.from_hf_config(cfg, name=Path(path).stem)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{path}: {e}") from None


def _model(args: argparse.Namespace) -> ModelConfig:
    model = _hf_config(args.hf_config) if args.hf_config else model_preset(args.model)
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
    hw = _hardware(args) or hardware_preset(DEFAULT_HARDWARE)
    return MemoryLedger(_model(args), budget_from_args(args, hw), storage_dtype(args.dtype))


def _budget_lines(led: MemoryLedger) -> list[str]:
    return [f"budget           {led.budget.describe()}",
            f"KV budget        {led.budget.available_bytes / GIB:.2f} GiB - {led.weight_bytes / GIB:.2f} GiB "
            f"weights = {led.kv_budget_bytes / GIB:.2f} GiB = {led.token_capacity:,} tokens "
            f"x {led.bytes_per_token} B"]


def _budget_data(led: MemoryLedger) -> dict[str, Any]:
    b = led.budget
    return {"device_bytes": b.device_bytes, "fraction": b.fraction, "reserve_bytes": b.reserve_bytes,
            "text": b.describe()}


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
    if args.seq_len > m.max_context:
        print(f"pykvpool: warning: --seq-len {args.seq_len:,} exceeds {m.name}'s context window "
              f"(max_position_embeddings = {m.max_context:,})", file=sys.stderr)
    s, bsz = args.seq_len, args.batch
    lines = [
        f"model            {m.name}: L={m.num_layers}, n_q={m.num_q_heads}, "
        f"n_kv={m.num_kv_heads}, d={m.head_dim}, {m.num_params / 1e9:.2f}e9 params",
        f"KV dtype         {led.dtype.name} (scales: {led.dtype.granularity})",
        f"KV per token     {led.bytes_per_token} B ({led.bytes_per_token / 1024:.2f} KiB)",
        f"KV per sequence  {led.kv_bytes(seq_len=s) / GIB:.2f} GiB at {s} tokens",
        f"weights          {led.weight_bytes / GIB:.2f} GiB",
        *_budget_lines(led),
        f"KV capacity      {led.token_capacity:,} tokens",
        f"max batch        {led.max_batch(seq_len=s)} at {s} tokens",
        f"max length       {led.max_seq_len(batch=bsz):,} tokens at batch {bsz}",
    ]
    row = led.row(batch=bsz, seq_len=s)
    lines.append(f"batch {bsz} x {s}: KV {row.kv_bytes / GIB:.2f} GiB = "
                 f"{row.kv_over_weights:.2f}x weights; weights + KV {row.weights_plus_kv_bytes / GIB:.2f} GiB"
                 + ("" if row.kv_bytes <= led.kv_budget_bytes else " -- EXCEEDS the KV budget"))
    data: dict[str, Any] = {"model": m.name, "dtype": led.dtype.name,
                            "bytes_per_token": led.bytes_per_token, "budget": _budget_data(led),
                            "weight_bytes": led.weight_bytes, "kv_budget_bytes": led.kv_budget_bytes,
                            "token_capacity": led.token_capacity,
                            "max_batch": led.max_batch(seq_len=s),
                            "max_seq_len": led.max_seq_len(batch=bsz)}
    hw = _hardware(args) or hardware_preset(DEFAULT_HARDWARE)
    cd = led.dtype.name.split(":")[0] if args.hardware != "this" else "fp32"
    b = led.decode_bound(hw, seq_len=s, batch=bsz, compute_dtype=cd)
    lines.append(f"decode on {hw.name}: step >= {b.step_time * 1e3:.2f} ms "
                 f"({'memory' if b.memory_bound else 'compute'} bound), "
                 f"<= {b.tokens_per_s:.0f} tokens/s at batch {bsz}")
    data["decode"] = {"hardware": hw.name, "step_s": b.step_time,
                      "tokens_per_s": b.tokens_per_s, "bytes": b.bytes_moved, "flops": b.flops}
    text = "\n".join(lines)
    print(text)
    _write(args.out, "ledger", "```\n" + text + "\n```\n", data)
    return 0


def _workload(args: argparse.Namespace) -> Workload:
    if args.trace:
        return read_trace(args.trace, args.columns)
    loaders: dict[str, Callable[[], Workload]] = {
        "uniform": article_uniform, "heavy": article_heavy_tail,
        "azure-code": lambda: azure_trace("code"), "azure-conv": lambda: azure_trace("conv")}
    return loaders[args.workload]()


def _check_sweep(args: argparse.Namespace, wl: Workload, cap: int, max_len: int) -> None:
    """Refuse before any progress bar what the sweeps would refuse half-way."""
    shortest = int(wl.lengths.min())
    if args.prefix is not None and args.prefix > shortest:
        raise InvalidArgumentError(f"--prefix {args.prefix} exceeds the shortest request ({shortest} tokens)")
    if max_len > MAX_BLOCK_SIZE:
        raise InvalidArgumentError(
            f"the contiguous policy reserves --max-len = {max_len:,} tokens as one block, above the "
            f"pool's largest block ({MAX_BLOCK_SIZE:,} tokens): give a smaller --max-len")
    for name, size in [("--max-len", max_len), ("--block-size", args.block_size),
                       *(("--block-sizes", b) for b in args.block_sizes)]:
        if size > cap:
            raise InvalidArgumentError(f"{name} {size:,} exceeds the KV capacity of {cap:,} tokens")


def _cmd_sweep(args: argparse.Namespace) -> int:
    led = _ledger(args)
    wl = _workload(args)
    max_len = args.max_len or (ARTICLE_MAX_LEN if args.workload in ("uniform", "heavy")
                               and not args.trace else led.model.max_context)
    if int(wl.lengths.min()) > max_len:
        raise InvalidArgumentError(f"every request of {wl.name} is longer than --max-len {max_len:,} tokens")
    wl = wl.clipped(max_len)
    cap, bpt = led.token_capacity, led.bytes_per_token
    _check_sweep(args, wl, cap, max_len)
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
    lines = [*_budget_lines(led),
             f"workload {wl.name}: {len(wl)} requests (mean {wl.mean_length:.1f} tokens, "
             f"{wl.dropped} longer than {max_len} dropped)",
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
            "budget": _budget_data(led), "capacity_tokens": cap, "bytes_per_token": bpt,
            "policies": [{**r.__dict__, "utilization": r.utilization} for r in results],
            "waste": waste.__dict__, "block_sizes": [b.__dict__ for b in rows]}
    _write(args.out, "sweep", text + "\n", data)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from pykvpool.report.build import build_report

    res = build_report(args.out, measure=not args.no_measure, progress=not args.quiet)
    print(f"wrote {res.markdown} ({len(res.figures)} figures) in {res.seconds:.1f} s; "
          f"{res.matched}/{res.reproduced} article numbers reproduced exactly")
    return 0 if res.matched == res.reproduced else 1


def _add_ledger(sub: Any) -> None:
    pl = sub.add_parser("ledger", help="memory ledger of one model on one budget",
                        description="KV bytes per token, weights, the budget, KV capacity, largest "
                                    "batch, longest length and the decode-step bound.")
    _add_common(pl)
    pl.add_argument("--seq-len", type=count(), default=8192, help="tokens per sequence")
    pl.add_argument("--batch", type=count(), default=1, help="sequences")
    pl.set_defaults(func=_cmd_ledger)


def _add_sweep(sub: Any) -> None:
    ps = sub.add_parser("sweep", help="static capacity: contiguous vs paged through BlockPool",
                        description="Greedy admission of a workload into the KV budget under "
                                    "each policy, the waste decomposition and a block-size sweep.")
    _add_common(ps)
    ps.add_argument("--workload", choices=WORKLOADS, default="uniform",
                    help="built-in workload (default: the article's uniform one)")
    ps.add_argument("--trace", metavar="FILE",
                    help="a trace file instead: a CSV (Azure columns ContextTokens, GeneratedTokens "
                         "by default), a JSONL file (Mooncake columns by default) or one length "
                         "per line")
    ps.add_argument("--columns", type=trace_columns, metavar="prompt=NAME,output=NAME",
                    help="the CSV/JSONL fields holding prompt and output tokens")
    ps.add_argument("--max-len", type=count(),
                    help="contiguous reservation per request, tokens (default 4096 for the "
                         "article's workloads, else the model's context window); longer "
                         "requests are dropped")
    ps.add_argument("--block-size", type=count(1, MAX_BLOCK_SIZE), default=16, help="paged block size, tokens")
    ps.add_argument("--block-sizes", type=count_list(1, MAX_BLOCK_SIZE), default=list(BLOCK_SIZES),
                    help="comma-separated block sizes to sweep (default 1,2,4,...,256)")
    ps.add_argument("--prefix", type=count(0), default=None,
                    help="also run paged with a shared prefix of this many tokens")
    ps.set_defaults(func=_cmd_sweep)


def _add_report(sub: Any) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = CliParser(
        prog="pykvpool",
        description="KV-cache capacity planning: memory ledger, static capacity sweeps "
                    "through pykvpool's block pool, the serving simulator, prefix-cache "
                    "replay and the full report.")
    sub = p.add_subparsers(dest="command", required=True,
                           metavar="{ledger,sweep,report,replay,simulate}")
    _add_ledger(sub)
    _add_sweep(sub)
    _add_report(sub)
    replay_cmd.add_subcommand(sub)
    simulate_cmd.add_subcommand(sub)
    return p


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    if isinstance(e, UnicodeError):
        return f"not UTF-8 text ({e})"
    if isinstance(e, MemoryError) and not str(e):
        return "out of memory"
    return str(e) or type(e).__name__


def _report_error(e: Exception) -> int:
    """Print one line for ``e`` on stderr; returns the exit status."""
    if isinstance(e, InvariantError) or not isinstance(e, (KvPoolError, OSError, UnicodeError, MemoryError)):
        if os.environ.get("PYKVPOOL_TRACEBACK"):
            raise e
        print(f"pykvpool: internal error: {type(e).__name__}: {_message(e)}\n"
              "This is a bug in pykvpool: please report it with the command line that triggered it "
              "(PYKVPOOL_TRACEBACK=1 shows the traceback).", file=sys.stderr)
        return EX_BUG
    print(f"pykvpool: error: {_message(e)}", file=sys.stderr)
    return EX_USAGE


def _quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pykvpool`` command. Returns the exit status (see the module
    docstring): 0 on success, 2 on bad input (one ``pykvpool: error: ...`` line on stderr),
    70 on a pykvpool bug, 1 when the report does not reproduce every number.

    Args:
        argv: the arguments after the program name (None: ``sys.argv[1:]``).

    Raises:
        SystemExit: from argparse, for ``--help`` (status 0) or a usage error such as an
            unknown option or a malformed number (status 2, one error line on stderr).
    """
    try:
        args = build_parser().parse_args(argv)
        status: int = args.func(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EX_PIPE
    except KeyboardInterrupt:
        print("pykvpool: interrupted", file=sys.stderr)
        return EX_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - the one place every error becomes a status
        return _report_error(e)


if __name__ == "__main__":
    sys.exit(main())
