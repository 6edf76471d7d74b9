"""The report's deployment-search section: the scaling model the search assumes and the
configurations it flags superlinear (:mod:`pykvpool.search.scaling`), the best
configuration per SLO with its simulated metrics, the cost vs goodput frontier and the
cost vs latency frontiers, with their figures (rates at the ladder's top as ``>= x``).

By default the report runs a small search itself (:data:`SMALL_SEARCH`: 80
configurations on the first 1,000 requests of the shipped Azure conversation trace,
seconds on a process pool) into ``<report>/search/``, the folder ``pykvpool search`` would
write, so the report stays quick and self-contained; ``pykvpool report --search DIR``
shows a finished search instead (:func:`pykvpool.search.folder.read_search` refuses a
folder that is not one before the report does any work). Either way the section is
rendered from the folder's files, and its figures are redrawn into the report folder.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from pykvpool.planning.models import model_preset
from pykvpool.report.tables import markdown_table
from pykvpool.search import SLO, Backend, SearchSpace, search
from pykvpool.search.figures import draw_figures, draw_latency_figure
from pykvpool.search.folder import SearchFolder, read_search
from pykvpool.search.latency import candidates, latency_frontier, reference_latency
from pykvpool.search.output import frontier
from pykvpool.search.scaling import SCALING_MODEL, SCALING_TOLERANCE, rate_text
from pykvpool.search.space import COLOCATED
from pykvpool.simulate import traces
from pykvpool.tracefile import named_trace_path

__all__ = ["FIGURES", "SMALL_SEARCH", "run_small_search", "search_section"]

#: The report's own search, as ``pykvpool search`` options (the command in the section).
SMALL_SEARCH = ("--trace azure-conv --limit 1000 --model llama-3-8b --slo chat:ttft_p99=1,tpot_p99=0.05 "
                "--slo batch:ttft_p99=20 --hardware a100-80gb-sxm,h100-sxm --devices 1,2,4 --kv-dtypes bf16,fp8 "
                "--max-running 16,256 --pd colocated,1:1,3:1")
_SLOS = (SLO("chat", ttft_p99=1.0, tpot_p99=0.05), SLO("batch", ttft_p99=20.0))
_SPACE = SearchSpace(hardware=("a100-80gb-sxm", "h100-sxm"), devices=(1, 2, 4), kv_dtypes=("bf16", "fp8"),
                     max_running=(16, 256), disaggregation=(COLOCATED, "1:1", "3:1"))
#: Figure names in the report folder.
FIGURES = ("fig11_search_frontier", "fig12_search_latency", "fig13_search_rates")
#: Files of a search the report rewrites in its own ``search/`` folder.
_SEARCH_FILES = ("search.json", "points.jsonl", "latency.jsonl", "points.json", "best.json", "latency.json")
_ROWS_SHOWN = 12


def run_small_search(directory: Path, progress: bool) -> float:
    """Run :data:`SMALL_SEARCH` (and its reference-rate latency) on a process pool into
    ``directory``, from scratch (a previous run's files there are replaced, so a report
    never shows results of an older pykvpool); returns the wall time, seconds.

    Raises:
        FileNotFoundError: the packaged Azure trace is missing.
        OSError: ``directory`` cannot be written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for name in _SEARCH_FILES:
        (directory / name).unlink(missing_ok=True)
    t0 = time.perf_counter()
    w = traces.load_file(named_trace_path("azure-conv"), limit=1000)
    stream = sys.stderr if progress else None
    res = search(w, model_preset("llama-3-8b"), _SPACE, _SLOS, backend=Backend("process"), out=str(directory),
                 progress=stream)
    reference_latency(res, backend=Backend("process"), out=directory, progress=stream)
    return time.perf_counter() - t0


def search_section(out_dir: Path, folder: Optional[SearchFolder], progress: bool = True
                   ) -> tuple[str, dict[str, Any], dict[str, Path]]:
    """The section's Markdown, data and figures (:data:`FIGURES`, drawn into ``out_dir``):
    ``folder`` (a finished search), or the report's own small search run into
    ``out_dir/search`` when None.

    Raises:
        FileNotFoundError: the packaged Azure trace is missing.
        InvalidArgumentError: the small search's folder cannot be read back (a bug).
        OSError: ``out_dir`` cannot be written.
    """
    seconds = None
    if folder is None:
        seconds = run_small_search(out_dir / "search", progress)
        folder = read_search(out_dir / "search")
    figs = {name: out_dir / f"{name}.png" for name in FIGURES}
    names = [s.name for s in folder.slos]
    draw_figures(out_dir, folder.rows, names, folder.cost_unit, (figs[FIGURES[0]].name, figs[FIGURES[2]].name))
    rates = (folder.latency or {}).get("reference_rates", {})
    draw_latency_figure(out_dir, folder.rows, folder.entries, folder.slos, rates, folder.requests,
                        folder.cost_unit, figs[FIGURES[1]].name)
    md, data = _markdown(folder, seconds, rates, figs)
    return md, data, figs


def _bounds(s: SLO) -> str:
    parts = [f"{label} <= {v:g} s" for label, v in (("p99 TTFT", s.ttft_p99), ("p50 TPOT", s.tpot_p50),
                                                     ("p99 TPOT", s.tpot_p99)) if v is not None]
    if s.min_throughput is not None:
        parts.append(f">= {s.min_throughput:g} output tok/s")
    return ", ".join(parts) or "every request finished"


def _key(row: dict[str, Any]) -> str:
    """A point's key as a code span in a table cell (its ``|`` escaped for the table)."""
    return "`" + str(row["key"]).replace("|", "\\|") + "`"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _tok(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _s(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}"


def _best_table(folder: SearchFolder) -> str:
    rows = []
    for s in folder.slos:
        b, n = folder.best.get(s.name), s.name
        if b is None:
            rows.append([n, _bounds(s), "none sustains the lowest rate", "-", "-", "-", "-", "-", "-"])
            continue
        rows.append([n, _bounds(s), _key(b), _rate(b, n), f"{b[n + '_objective']:.4g}",
                     _s(b.get(n + "_ttft_p99")), _ms(b.get(n + "_tpot_p50")), _ms(b.get(n + "_tpot_p99")),
                     _tok(b.get(n + "_output_throughput"))])
    return markdown_table(["SLO", "bounds", "best configuration", "sustained (req/s)", folder.unit,
                           "p99 TTFT (s)", "p50 TPOT (ms)", "p99 TPOT (ms)", "output tok/s"], rows)


def _rate(row: dict[str, Any], slo: str) -> str:
    """A row's sustained rate for ``slo``, ``>= top`` when it is the ladder's top rung."""
    return rate_text(row[f"{slo}_rate"], row.get(f"{slo}_rate_is_lower_bound"))


def _superlinear(folder: SearchFolder) -> dict[str, list[dict[str, Any]]]:
    return {s.name: [r for r in folder.rows if r.get(f"{s.name}_superlinear")] for s in folder.slos}


def _scaling(folder: SearchFolder) -> tuple[str, str]:
    """The scaling model's paragraph, and the table of the points it flagged."""
    flagged = _superlinear(folder)
    count = len({r["key"] for rows in flagged.values() for r in rows})
    text = (f"{SCALING_MODEL} Replicas are simulated as they are (each its own engine behind the router), so "
            "what several gain over one, their arrivals' bursts split among them, is the simulation's result. "
            "A tensor-parallel group's compute and memory work still divide perfectly over its devices, so a "
            "larger group may look better than it is: a configuration whose sustained rate per device is above "
            "that of the same configuration on fewer devices in smaller groups by more than its larger KV pool "
            f"per device explains (plus {SCALING_TOLERANCE:.0%}) is flagged superlinear and is neither a best "
            "point nor on a frontier. A rate written `>= x` is the ladder's top rung: the configuration "
            "sustains at least that.\n")
    if not count:
        return text, "No configuration of this search is flagged superlinear.\n"
    rows: list[list[object]] = []
    for s in folder.slos:
        rows += [[s.name, _key(r), _rate(r, s.name), f"{r[s.name + '_rate'] / r['devices']:.3g}"]
                 for r in flagged[s.name]]
    return text, (f"{count} configuration{'s' * (count != 1)} flagged superlinear under an SLO (not ranked for "
                  "it):\n\n" + markdown_table(["SLO", "configuration", "sustained (req/s)", "req/s per device"],
                             _clip(rows, 4, "points.csv")) + "\n")


def _clip(rows: list[list[object]], ncols: int, file: str) -> list[list[object]]:
    if len(rows) <= _ROWS_SHOWN:
        return rows
    more = len(rows) - _ROWS_SHOWN
    tail: list[object] = [f"... {more} more in `{file}`", *[""] * (ncols - 1)]
    return rows[:_ROWS_SHOWN] + [tail]


def _goodput_table(folder: SearchFolder) -> str:
    rows: list[list[object]] = []
    for s in folder.slos:
        rows += [[s.name, f"{r['cost']:g}", _key(r), _rate(r, s.name),
                  f"{r[s.name + '_objective']:.4g}"] for r in frontier(folder.rows, s.name)]
    return markdown_table(["SLO", folder.cost_unit, "configuration", "sustained (req/s)", folder.unit],
                          _clip(rows, 5, "frontier.csv"))


def _splits(folder: SearchFolder) -> str:
    """Colocated vs disaggregated: per SLO and device count, the best configuration of each
    kind (a ranked one: sustaining a rate, not flagged); empty without split points."""
    if all(r.get("disaggregation", COLOCATED) == COLOCATED for r in folder.rows):
        return ""
    out: list[list[object]] = []
    for s in folder.slos:
        n = s.name
        ranked = [r for r in folder.rows if r.get(f"{n}_state") == "ok" and not r.get(f"{n}_superlinear")]
        for devices in sorted({r["devices"] for r in ranked}):
            best: dict[str, Optional[dict[str, Any]]] = {}
            for kind in ("colocated", "split"):
                mine = [r for r in ranked if r["devices"] == devices
                        and (r.get("disaggregation", COLOCATED) == COLOCATED) == (kind == "colocated")]
                best[kind] = max(mine, key=lambda r: (r[f"{n}_rate"], -r["cost"]), default=None)
            c, d = best["colocated"], best["split"]
            if d is None:
                continue
            ratio = "-"
            if c is not None and not c.get(f"{n}_rate_is_lower_bound") and not d.get(f"{n}_rate_is_lower_bound"):
                ratio = f"{d[f'{n}_rate'] / c[f'{n}_rate']:.2f}"
            out.append([n, devices, _key(c) if c else "-", _rate(c, n) if c else "-", _key(d), _rate(d, n),
                        ratio])
    head = ("Prefill/decode disaggregation (`--pd`): per SLO and device count, the best colocated configuration "
            "and the best split into prefill and decode instances, the KV moved over the devices' network "
            "(Splitwise, DistServe); the ratio is the split's sustained rate over the colocated one's (- when either "
            "is only a lower bound).\n\n")
    return head + markdown_table(["SLO", "devices", "best colocated", "sustained (req/s)", "best split",
                                  "sustained (req/s)", "split / colocated"], _clip(out, 7, "points.csv")) + "\n"


def _latency_table(folder: SearchFolder, rates: dict[str, Optional[float]]) -> str:
    rows: list[list[object]] = []
    for s in folder.slos:
        cands = candidates(folder.rows, folder.entries, s, "reference", rates.get(s.name), folder.requests)
        for metric in ("ttft_p99", "tpot_p99"):
            rows += [[s.name, f"{rates[s.name]:.3g}", metric.replace("_p99", "").upper(), f"{c['cost']:g}",
                      _key(c), _s(c["ttft_p99"]), _ms(c["tpot_p99"])]
                     for c in latency_frontier(cands, metric)]
    return markdown_table(["SLO", "reference rate (req/s)", "frontier of", folder.cost_unit, "configuration",
                           "p99 TTFT (s)", "p99 TPOT (ms)"], _clip(rows, 7, "frontier_latency.csv"))


def _intro(folder: SearchFolder, seconds: Optional[float]) -> str:
    sims = sum(int(r.get("sims") or 0) for r in folder.rows)
    extra = sum(int(e.get("sims") or 0) for e in folder.entries.values())
    what = (f"{len(folder.rows)} configurations of {folder.model} on {folder.requests:,} requests, "
            f"{folder.strategy} strategy, {len(folder.rates)} arrival rates from {folder.rates[0]:g} to "
            f"{folder.rates[-1]:g} req/s, ranked by {folder.unit}; {sims:,} simulations, and {extra:,} more at "
            "the reference rate")
    if seconds is None:
        return f"The finished search in `{folder.path.name}` (`pykvpool report --search`): {what}.\n"
    return (f"A small search run by the report in {seconds:.1f} s into `search/` (all its tables are there): "
            f"{what}. The same search from the command line: `pykvpool search {SMALL_SEARCH} --out search-out`; "
            "`pykvpool report --search DIR` shows a larger one instead.\n")


def _markdown(folder: SearchFolder, seconds: Optional[float], rates: dict[str, Optional[float]],
              figs: dict[str, Path]) -> tuple[str, dict[str, Any]]:
    source = (folder.latency or {}).get("source")
    why = ("each SLO's best point's sustained rate: the load the recommended configuration is sized for, so "
           "the frontier starts at the best point and shows what paying more buys at the same traffic"
           if source == "best point" else "the rate given to `pykvpool search --latency-rate`")
    lat = (f"Cost vs latency: every configuration run at one reference rate per SLO ({why}); the candidates "
           "are the configurations that meet the SLO there, and a frontier point is one that no other candidate "
           "beats on both cost and latency. The dashed line is the same frontier at each point's own sustained "
           "rate, where a point that sustains little looks fast: it is not a choice at a given traffic.\n"
           if folder.latency is not None else
           "This search ran without its reference-rate runs (`--no-latency`): only the frontier at each point's "
           "own sustained rate is drawn. Run the same `pykvpool search` into the folder again without "
           "`--no-latency` to add them (only those runs are made).\n")
    scaling = _scaling(folder)
    parts = [
        "## 9. Deployment search: the best configuration per SLO\n",
        _intro(folder, seconds),
        scaling[0],
        _best_table(folder) + "\n",
        f"![cost vs sustained rate]({figs[FIGURES[0]].name})\n",
        "Cost vs goodput frontier (no cheaper configuration sustains as much):\n",
        _goodput_table(folder) + "\n",
        _splits(folder),
        scaling[1],
        f"![cost vs latency]({figs[FIGURES[1]].name})\n",
        lat,
    ]
    if folder.latency is not None:
        parts.append(_latency_table(folder, rates) + "\n")
    parts.append(f"![sustained rate per configuration]({figs[FIGURES[2]].name})\n")
    data = {"folder": str(folder.path), "model": folder.model, "requests": folder.requests,
            "configurations": len(folder.rows), "strategy": folder.strategy, "objective": folder.objective,
            "seconds": seconds, "best": folder.best, "reference_rates": rates, "latency_source": source,
            "frontier": {s: [r["key"] for r in frontier(folder.rows, s)] for s in _names(folder.slos)},
            "scaling_model": SCALING_MODEL,
            "superlinear": {s: [r["key"] for r in rows] for s, rows in _superlinear(folder).items()},
            "latency_frontier": (folder.latency or {}).get("frontier", [])}
    return "\n".join(parts), data


def _names(slos: Sequence[SLO]) -> list[str]:
    return [s.name for s in slos]
