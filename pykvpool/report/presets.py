"""The report's presets table: every model preset on every accelerator preset, like for like.

Every row of one model stores its weights in the same precision, so two devices differ only
in the KV cache their memory leaves room for: the highest precision of
:data:`WEIGHT_PRECISIONS` (from the preset's own storage down) whose weights fit the most of
the table's devices. A 70B model is in fp8 on the A100, the H100 and the H200 alike, never bf16
on the one device where bf16 would fit. A device the chosen weights do not fit gets no row, and
a model no device holds even at the lowest precision is named under the table; every number,
fitting or not, stays in the returned data (the report's ``report.json``).

One row per model and device holds both KV dtypes side by side (``bf16 / fp8``): KV tokens,
the largest batch of :data:`PRESET_LENGTH`-token sequences and the decode-step bound at batch 1.
A windowed model (sliding or chunked layers) keeps fewer tokens per layer the longer its
sequences, so its capacity is stated at :data:`PRESET_LENGTH` (``N @ 8192``).

Units: bytes (GiB = 2**30), tokens, seconds (milliseconds in the table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pykvpool.checks import check_positive
from pykvpool.errors import BudgetError
from pykvpool.planning.hardware import HARDWARE, Hardware
from pykvpool.planning.ledger import GIB, Budget, MemoryLedger, default_budget
from pykvpool.planning.models import MODELS, ModelConfig, compute_precision, storage_dtype
from pykvpool.report.tables import markdown_table

__all__ = ["PRESET_LENGTH", "TABLE_KV_DTYPES", "WEIGHT_PRECISIONS", "preset_ledger", "presets_table",
           "table_weight_bytes"]

PRESET_LENGTH = 8192
"""Context length (tokens) at which the presets table states a windowed model's capacity,
the largest batch and the decode bound."""

TABLE_KV_DTYPES = ("bf16", "fp8")
"""The KV dtypes of the table, side by side in each row."""

WEIGHT_PRECISIONS: tuple[tuple[str, float], ...] = (("bf16", 2.0), ("fp8", 1.0), ("4-bit", 0.5))
"""Weight storages the table may choose, highest first: (name, bytes per parameter)."""


def _precision(bytes_per_param: float) -> str:
    """``"fp8"`` for 1 byte per parameter (:data:`WEIGHT_PRECISIONS`), else ``"3 B/param"``."""
    return next((n for n, b in WEIGHT_PRECISIONS if b == bytes_per_param), f"{bytes_per_param:g} B/param")


def _weights_label(bytes_per_param: float) -> str:
    """``"fp8, 1 B/param"``."""
    name, unit = _precision(bytes_per_param), f"{bytes_per_param:g} B/param"
    return unit if name == unit else f"{name}, {unit}"


def _stored(model: ModelConfig, bytes_per_param: float) -> ModelConfig:
    if bytes_per_param == model.weight_bytes_per_param:
        return model
    return replace(model, weight_bytes_per_param=bytes_per_param,
                   name=f"{model.name} ({_precision(bytes_per_param)} weights)")


def preset_ledger(model: ModelConfig, budget: Budget, kv_dtype: str,
                  weight_bytes: float | None = None) -> tuple[MemoryLedger, str]:
    """The ledger of ``model`` under ``budget`` with KV in ``kv_dtype``, and how its weights
    are stored. With ``weight_bytes`` (bytes per parameter) the weights are stored so; without
    it, as the preset says, or in fp8 (1 byte per parameter) when those leave no room for KV
    (a 70B model on an 80 GB device).

    Raises:
        BudgetError: the weights (even fp8 ones, when ``weight_bytes`` is None) plus the
            reserve fill the budget.
        InvalidArgumentError: ``weight_bytes`` not a finite number > 0; a malformed dtype.
        UnknownPresetError: an unknown KV dtype.
    """
    dt = storage_dtype(kv_dtype)
    if weight_bytes is not None:
        b = check_positive(weight_bytes, "weight_bytes")
        return MemoryLedger(_stored(model, b), budget, dt), _weights_label(b)
    native = f"{model.weight_bytes_per_param:g} B/param"
    try:
        return MemoryLedger(model, budget, dt), native
    except BudgetError:
        if model.weight_bytes_per_param <= 1.0:
            raise
    return MemoryLedger(_stored(model, 1.0), budget, dt), f"fp8, 1 B/param ({native} exceeds the budget)"


def _fits(model: ModelConfig, bytes_per_param: float, budget: Budget) -> bool:
    try:
        MemoryLedger(_stored(model, bytes_per_param), budget)
    except BudgetError:
        return False
    return True


def _rungs(model: ModelConfig) -> list[float]:
    """The preset's own storage, then every lower one of :data:`WEIGHT_PRECISIONS`."""
    own = model.weight_bytes_per_param
    return [own] + [b for _, b in WEIGHT_PRECISIONS if b < own]


def table_weight_bytes(model: ModelConfig, budgets: Sequence[Budget]) -> float | None:
    """The bytes per parameter every row of ``model`` stores its weights in: the highest of
    the preset's own storage and the lower :data:`WEIGHT_PRECISIONS` on which the weights fit
    the most of ``budgets`` (all of them when one does); None when they fit none.

    Raises:
        InvalidArgumentError: a budget that is not a :class:`Budget` (its ledger refuses it).
    """
    best, most = None, 0
    for b in _rungs(model):
        n = sum(_fits(model, b, budget) for budget in budgets)
        if n > most:
            best, most = b, n
    return best


def _row_data(key: str, hw_key: str, model: ModelConfig, hw: Hardware, budget: Budget,
              weight_bytes: float, dt: str) -> dict[str, Any]:
    base = {"hardware": hw_key, "model": key, "dtype": dt, "weights": _weights_label(weight_bytes),
            "weight_bytes_per_param": weight_bytes, "source": model.source, "budget": budget.describe()}
    try:
        led, _ = preset_ledger(model, budget, dt, weight_bytes)
    except BudgetError as e:
        return {**base, "weight_bytes": model.num_params * weight_bytes, "fits": False, "error": str(e)}
    b = led.decode_bound(hw, seq_len=PRESET_LENGTH, batch=1, compute_dtype=compute_precision(dt))
    win = model.windowed
    return {**base, "fits": True, "weight_bytes": led.weight_bytes, "bytes_per_token": led.bytes_per_token,
            "windowed": win, "token_capacity": None if win else led.token_capacity,
            "full_history_token_capacity": led.token_capacity,
            f"tokens_at_{PRESET_LENGTH}": led.tokens_at(seq_len=PRESET_LENGTH),
            f"max_batch_{PRESET_LENGTH}": led.max_batch(seq_len=PRESET_LENGTH),
            "decode_step_s": b.step_time, "tokens_per_s": b.tokens_per_s}


def _pair(d: Sequence[dict[str, Any]], field: str, fmt: str = ",") -> str:
    return " / ".join(format(x[field], fmt) for x in d)


def _row(label: str, hw: Hardware, d: Sequence[dict[str, Any]], windowed: bool) -> list[object]:
    tokens = _pair(d, f"tokens_at_{PRESET_LENGTH}" if windowed else "full_history_token_capacity")
    steps = " / ".join(f"{x['decode_step_s'] * 1e3:.2f}" for x in d)
    return [label, f"{_precision(d[0]['weight_bytes_per_param'])}, {d[0]['weight_bytes'] / GIB:.2f} GiB",
            _pair(d, "bytes_per_token"), hw.name,
            tokens + (f" @ {PRESET_LENGTH}" if windowed else ""),
            _pair(d, f"max_batch_{PRESET_LENGTH}"), steps]


_HEADER = ["model", "weights (every device)", "KV B/token bf16 / fp8", "hardware", "KV tokens bf16 / fp8",
           f"max batch @ {PRESET_LENGTH} bf16 / fp8", f"decode step >= ms bf16 / fp8 (batch 1, {PRESET_LENGTH})"]


def _rows_key(model: ModelConfig) -> ModelConfig:
    """What a model's rows depend on: all but its name, source and context window (the table
    states every length at :data:`PRESET_LENGTH` or below it)."""
    return replace(model, name="", source="", max_context=1)


def _share_rows(models: Mapping[str, ModelConfig]) -> dict[str, list[str]]:
    """The presets by first key of each group whose rows are the same, in table order."""
    groups: dict[ModelConfig, list[str]] = {}
    for key, model in models.items():
        groups.setdefault(_rows_key(model), []).append(key)
    return {keys[0]: keys for keys in groups.values()}


class _Notes:
    """What the lines under the table say: why a model's weights are not its preset's, which
    devices or models are left out, the sources."""

    def __init__(self) -> None:
        self.lowered: dict[str, list[str]] = {}
        self.missing: list[str] = []
        self.nowhere: list[str] = []
        self.sources: list[str] = []

    def lower(self, model: ModelConfig, label: str, chosen: float, hardware: Mapping[str, Hardware],
              budgets: Mapping[str, Budget]) -> None:
        rungs = _rungs(model)
        if chosen == rungs[0]:
            return
        higher = rungs[rungs.index(chosen) - 1]
        fit = [hardware[k].name for k, b in budgets.items() if _fits(model, higher, b)]
        why = (f"{_precision(higher)} weights fit "
               + (f"the {', '.join(fit)} only" if fit else "no device"))
        self.lowered.setdefault(f"{_precision(chosen)} ({why})", []).append(label)

    def markdown(self) -> str:
        lines = ["Weights: one precision per model on every device, the highest (bf16, fp8, 4-bit) that "
                 "fits the most devices, so a model's rows differ only in the KV each device holds"
                 + "".join(f"; {label} for {', '.join(names)}" for label, names in self.lowered.items())
                 + "; bf16 for the others."]
        if self.missing:
            lines.append("No row where the weights do not fit: " + "; ".join(self.missing) + ".")
        if self.nowhere:
            lines.append("Fit no single device even with 4-bit weights (multi-device deployments, not "
                         "planned here): " + "; ".join(self.nowhere) + ".")
        lines.append("A row named `A = B` serves both presets: the same model but for its name, source or "
                     "context window.")
        lines.append("Sources (Hugging Face config.json): " + "; ".join(self.sources) + ".")
        return "\n\n".join(lines)


def presets_table(models: Mapping[str, ModelConfig] | None = None,
                  hardware: Mapping[str, Hardware] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """The presets table (Markdown, with its notes) and its data: one dict per (device,
    model, KV dtype) with the ledger's numbers (``fits`` False and the ``error`` where the
    weights do not fit), and one per preset whose rows are an earlier one's (the same model
    but for its name, source or context window: ``same_as`` names that preset), which shares
    that preset's rows. Each device's budget is its :func:`default_budget`.

    Args:
        models: presets by key (default :data:`pykvpool.planning.models.MODELS`).
        hardware: devices by key (default :data:`pykvpool.planning.hardware.HARDWARE`).

    Raises:
        InvalidArgumentError: a device whose memory is not a finite number > 0.
    """
    models = MODELS if models is None else models
    hardware = HARDWARE if hardware is None else hardware
    budgets = {k: default_budget(hw) for k, hw in hardware.items()}
    rows: list[list[object]] = []
    data: list[dict[str, Any]] = []
    notes = _Notes()
    for first, keys in _share_rows(models).items():
        label = " = ".join(models[k].name for k in keys)
        rows += _model_rows(first, models[first], label, hardware, budgets, data, notes)
        data += [{"model": k, "same_as": first, "source": models[k].source} for k in keys[1:]]
    notes.sources = [f"{m.name} {m.source.replace(' config.json', '')}" for m in models.values()]
    return markdown_table(_HEADER, rows) + "\n\n" + notes.markdown(), data


def _model_rows(key: str, model: ModelConfig, label: str, hardware: Mapping[str, Hardware],
                budgets: Mapping[str, Budget], data: list[dict[str, Any]], notes: _Notes) -> list[list[object]]:
    """The rows of one model (``label`` names it and the presets sharing its rows); its data
    appended to ``data``, what the notes say about it to ``notes``."""
    chosen = table_weight_bytes(model, list(budgets.values()))
    lowest = min(_rungs(model))
    weights = chosen if chosen is not None else lowest
    rows, left_out = [], []
    for hw_key, hw in hardware.items():
        d = [_row_data(key, hw_key, model, hw, budgets[hw_key], weights, dt) for dt in TABLE_KV_DTYPES]
        data += d
        if d[0]["fits"]:
            rows.append(_row(label, hw, d, model.windowed))
        else:
            left_out.append(hw.name)
    gib = f"{model.num_params * weights / GIB:.1f} GiB"
    bpt = " / ".join(f"{model.kv_bytes_per_token(dt):,}" for dt in TABLE_KV_DTYPES)
    if chosen is None:
        notes.nowhere.append(f"{label} ({_precision(lowest)} weights {gib}; "
                             f"KV {bpt} B/token in bf16 / fp8)")
        return rows
    notes.lower(model, label, chosen, hardware, budgets)
    if left_out:
        notes.missing.append(f"{label}: {_precision(chosen)} weights ({gib}) "
                             f"on the {', '.join(left_out)}")
    return rows
