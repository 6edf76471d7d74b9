"""What the ``ledger`` and ``sweep`` subcommands share: the model and budget arguments, the
ledger they build, the budget lines they print and the files ``--out`` writes."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pykvpool._native import InvalidArgumentError
from pykvpool.cli.argtypes import add_budget_args, add_quiet, budget_from_args, number
from pykvpool.errors import TraceFormatError
from pykvpool.planning.hardware import HARDWARE, Hardware, hardware_preset, measure_this_machine
from pykvpool.planning.ledger import GIB, MemoryLedger
from pykvpool.planning.models import DTYPES, MODELS, ModelConfig, model_preset, storage_dtype
from pykvpool.progress import ProgressBar
from pykvpool.tracefile import read_json

__all__ = ["DEFAULT_HARDWARE", "add_common", "budget_data", "budget_lines", "hardware_from_args",
           "ledger_from_args", "write_outputs"]

DEFAULT_HARDWARE = "a100-80gb-sxm"


def add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and budget")
    g.add_argument("--model", default="llama-3-8b",
                   help=f"model preset: {', '.join(MODELS)} (default llama-3-8b)")
    g.add_argument("--hf-config", metavar="FILE",
                   help="a Hugging Face config.json instead of a preset (full, sliding-window and "
                        "chunked attention, MLA, experts; other layer kinds are refused)")
    g.add_argument("--dtype", default="bf16",
                   help=f"KV storage dtype: {', '.join(DTYPES)} (aliases such as fp32 and fp16 read "
                        "as their one spelling, f32 and f16); fp8 and int8 take :head (default), "
                        ":gN or :tensor scale granularity")
    g.add_argument("--weight-bytes", type=number(0.0, 64.0), metavar="BYTES",
                   help="bytes per weight parameter (default 2 = bf16; 1 = fp8/int8, 0.5 = int4)")
    g.add_argument("--hardware", help=f"device preset for memory and bandwidth: {', '.join(HARDWARE)}, or 'this' "
                        "(measure this machine with the kernel's probes); default the A100")
    add_budget_args(g)
    p.add_argument("--out", metavar="DIR", help="also write the results into DIR (Markdown + JSON)")
    add_quiet(p)


#: Largest ``config.json`` read, bytes: real ones are a few KiB (a config's layer lists
#: included); a parse of a 1 GiB document would take tens of GiB of Python objects.
MAX_CONFIG_BYTES = 16 << 20


def hf_config(path: str) -> ModelConfig:
    cfg = read_json(path, MAX_CONFIG_BYTES)
    if not isinstance(cfg, dict):
        raise TraceFormatError(path, 0, "expected a JSON object")
    try:
        return ModelConfig.from_hf_config(cfg, name=Path(path).stem)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{path}: {e}") from None


def model_from_args(args: argparse.Namespace) -> ModelConfig:
    model = hf_config(args.hf_config) if args.hf_config else model_preset(args.model)
    if args.weight_bytes:
        model = replace(model, weight_bytes_per_param=args.weight_bytes)
    return model


def hardware_from_args(args: argparse.Namespace) -> Hardware | None:
    if not args.hardware:
        return None
    if args.hardware == "this":
        if getattr(args, "_measured", None) is None:
            with ProgressBar("measuring this machine", 1, enabled=not args.quiet):
                args._measured = measure_this_machine()
        hw: Hardware = args._measured
        return hw
    return hardware_preset(args.hardware)


def ledger_from_args(args: argparse.Namespace) -> MemoryLedger:
    hw = hardware_from_args(args) or hardware_preset(DEFAULT_HARDWARE)
    return MemoryLedger(model_from_args(args), budget_from_args(args, hw), storage_dtype(args.dtype))


def budget_lines(led: MemoryLedger) -> list[str]:
    return [f"budget           {led.budget.describe()}",
            f"KV budget        {led.budget.available_bytes / GIB:.2f} GiB - {led.weight_bytes / GIB:.2f} GiB "
            f"weights = {led.kv_budget_bytes / GIB:.2f} GiB = {led.token_capacity:,} tokens "
            f"x {led.bytes_per_token} B"]


def budget_data(led: MemoryLedger) -> dict[str, Any]:
    b = led.budget
    return {"device_bytes": b.device_bytes, "fraction": b.fraction, "reserve_bytes": b.reserve_bytes,
            "text": b.describe()}


def write_outputs(out: str | None, stem: str, markdown: str, data: Any) -> None:
    if not out:
        return
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{stem}.md").write_text(markdown, encoding="utf-8")
    (d / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    print(f"wrote {d / (stem + '.md')} and {d / (stem + '.json')}")
