"""Every file a search writes, damaged key by key: ``report --search DIR`` and a resumed
``search`` refuse it with exit 2 and one ``pykvpool: error:`` line naming the file, before
any work (no report step, no simulation, no file written), and never a traceback.

Each JSON file of a real small search (``test_search_report``'s fixture) is walked: every
key of every object and the first element of every list; each key is deleted, and each
value replaced with every JSON type it is not (string, list, object, null, bool), with an
integer too large for a float, and with a list nested 10,000 deep. A null where the search
itself may write one (a latency statistic, an SLO bound, a best point, a reference rate)
must be read back instead."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from pykvpool import InvalidArgumentError
from pykvpool.cli.main import main
from pykvpool.search.evaluate import METRICS
from pykvpool.search.folder import read_search
from test_search_report import SEARCH, folders  # noqa: F401 - the module's fixture, reused

Path_ = tuple[Any, ...]
DEEP = "[" * 10_000 + "]" * 10_000
_MARK = "@@deep@@"
WRONG: dict[str, Any] = {"string": "x", "list": [], "object": {}, "null": None, "bool": True,
                         "huge int": 10**400, "nested 10,000 deep": _MARK}
#: Keys whose value the search may write as null (see the module docstring).
NULLABLE = (*METRICS, "finished", "attained")
#: Row columns ``<slo>_<name>`` the search may write as null.
NULLABLE_PER_SLO = (*METRICS, "attained")
#: A run's ``stopped``: the target that stopped it (a string), null, or left out.
OPTIONAL = "stopped"
#: Keys a folder written before they existed lacks: a copy without one reads back (a point's
#: ``disaggregation`` as colocated).
DELETABLE = (OPTIONAL, "disaggregation")
SLO_BOUNDS = ("ttft_p99", "tpot_p50", "tpot_p99", "min_throughput", "ttft", "tpot", "attainment")


def _json_type(v: Any) -> str:
    for name, t in (("null", type(None)), ("bool", bool), ("number", (int, float)), ("string", str),
                    ("list", list), ("object", dict)):
        if isinstance(v, t):  # type: ignore[arg-type]
            return name
    raise AssertionError(v)


def _walk(doc: Any, prefix: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every key of every object and the first element of every list, depth first."""
    items = list(doc.items()) if isinstance(doc, dict) else list(enumerate(doc))[:1] if isinstance(doc, list) else []
    for k, v in items:
        yield (*prefix, k), v
        yield from _walk(v, (*prefix, k))


def _nullable(file: str, path: Path_) -> bool:
    last = path[-1]
    if isinstance(last, str) and (last in NULLABLE or last.endswith(tuple(f"_{m}" for m in NULLABLE_PER_SLO))):
        return True
    if file == "best.json" and (len(path) == 2 and path[0] == "best" or path[0] == "slos" and last in SLO_BOUNDS):
        return True
    return file == "latency.json" and len(path) == 2 and path[0] == "reference_rates"


def _set(doc: Any, path: Path_, value: Any, delete: bool = False) -> Any:
    doc = json.loads(json.dumps(doc))
    if not path:
        return value
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def mutations(file: str, doc: Any, root: bool = False) -> Iterator[tuple[str, str, bool]]:
    """``(what, text, refused)``: each damaged copy of ``doc`` as JSON text, and whether it
    must be refused (False: a null the search may write itself, to be read back)."""
    paths = [((), doc)] if root else []
    for path, orig in [*paths, *_walk(doc)]:
        optional = bool(path) and path[-1] == OPTIONAL
        if path and isinstance(path[-1], str):
            yield f"{list(path)} deleted", json.dumps(_set(doc, path, None, delete=True)), path[-1] not in DELETABLE
        for kind, value in WRONG.items():
            if kind not in ("huge int", "nested 10,000 deep") and _json_type(value) == _json_type(orig):
                continue  # not a wrong type
            text = json.dumps(_set(doc, path, value)).replace(f'"{_MARK}"', DEEP)
            allowed = value is None and bool(path) and _nullable(file, path) or optional and kind == "string"
            yield f"{list(path)} = {kind}", text, not allowed


FILES = ("search.json", "best.json", "points.json", "latency.json")


@pytest.fixture()
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly (exit 70) if the report or a search starts any work."""
    def work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("work started before the folder was checked")

    def chains(spec: Any, todo: list[Any], *args: Any) -> None:
        if todo:
            work()

    monkeypatch.setattr("pykvpool.report.build.reproduce", work)
    monkeypatch.setattr("pykvpool.search.strategies.run_chains", chains)
    monkeypatch.setattr("pykvpool.search.latency.run_tasks", work)


def _one_error_line(status: int, err: str, file: str) -> str:
    if status != 2 or not err.startswith("pykvpool: error: ") or err.count("\n") != 1 or "Traceback" in err:
        return f"exit {status}: {err[-300:]!r}"
    return "" if file in err else f"the message does not name {file}: {err!r}"


@pytest.mark.parametrize("file", FILES)
def test_report_refuses_every_damaged_file_before_any_work(folders: dict[str, Path], tmp_path: Path,  # noqa: F811
                                                           capsys: pytest.CaptureFixture[str], no_work: None,
                                                           file: str) -> None:
    d = tmp_path / "s"
    d.mkdir()
    for name in FILES:
        shutil.copy(folders["full"] / name, d / name)
    original = (d / file).read_text()
    out = tmp_path / "rep"
    failures, refused = [], 0
    for what, text, must_refuse in mutations(file, json.loads(original), root=True):
        (d / file).write_text(text)
        if not must_refuse:
            try:
                read_search(d)
            except InvalidArgumentError as e:
                failures.append(f"{what}: refused ({e})")
            continue
        status = main(["report", "--no-measure", "--quiet", "--search", str(d), "--out", str(out)])
        bad = _one_error_line(status, capsys.readouterr().err, file)
        if bad or out.exists():
            failures.append(f"{what}: {bad or 'the report folder was created'}")
        shutil.rmtree(out, ignore_errors=True)
        refused += 1
    (d / file).write_text(original)
    assert read_search(d).rows  # the undamaged copy reads back
    assert not failures, f"{len(failures)} of {refused} damaged copies:\n" + "\n".join(failures[:40])
    assert refused >= 20


@pytest.mark.parametrize("log", ["points.jsonl", "latency.jsonl"])
def test_resuming_refuses_every_damaged_log_row_before_any_work(folders: dict[str, Path], tmp_path: Path,  # noqa: F811
                                                                capsys: pytest.CaptureFixture[str], no_work: None,
                                                                log: str) -> None:
    d = tmp_path / "s"
    d.mkdir()
    for name in ("search.json", "points.jsonl", "latency.jsonl"):
        shutil.copy(folders["full"] / name, d / name)
    lines = (d / log).read_text().splitlines(keepends=True)
    failures, refused = [], 0
    for what, text, must_refuse in mutations(log, json.loads(lines[0]), root=True):
        damaged = text + "\n" + "".join(lines[1:])
        (d / log).write_text(damaged)
        status = main([*SEARCH, "--no-figures", "--out", str(d)])
        err = capsys.readouterr().err
        if must_refuse:
            bad = _one_error_line(status, err, f"{log}:1: ")
            if bad or (d / log).read_text() != damaged or (d / "points.json").exists():
                failures.append(f"{what}: {bad or 'the folder changed'}")
            refused += 1
        elif status != 0:
            failures.append(f"{what}: refused ({err!r})")
        (d / "points.json").unlink(missing_ok=True)
    assert not failures, f"{len(failures)} of {refused} damaged rows:\n" + "\n".join(failures[:40])
    assert refused >= 20


def test_a_folder_of_another_pykvpool_version_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pykvpool import search as ds
    from pykvpool.planning.models import model_preset
    from pykvpool.simulate import traces
    from pykvpool.tracefile import named_trace_path

    w = traces.load_file(named_trace_path("azure-conv"), limit=40)
    args = (w, model_preset("llama-3-8b"), ds.SearchSpace(devices=(1, 2)), [ds.SLO("s", ttft_p99=5.0)])
    kw: dict[str, Any] = {"ladder": ds.RateLadder(0.5, 4.0, 3), "backend": ds.Backend("inline"), "out": str(tmp_path),
                          "progress": None}
    assert ds.search(*args, **kw).evaluated == 3  # x1, x2 as 2 x 1, x2 as 1 x 2
    assert ds.search(*args, **kw).evaluated == 0  # the same version resumes
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr("pykvpool.search.output.__version__", "0.0.0+another")
    with pytest.raises(InvalidArgumentError, match="another search .*pykvpool's version"):
        ds.search(*args, **kw)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_every_null_a_search_may_write_reads_back_and_renders(folders: dict[str, Path],  # noqa: F811
                                                               tmp_path: Path) -> None:
    """A folder with a null in every place the search may write one is read back, and the
    report's section is drawn from it."""
    from pykvpool.report.search_section import search_section

    d = tmp_path / "s"
    d.mkdir()
    nulled = 0
    for name in FILES:
        doc = json.loads((folders["full"] / name).read_text())
        for path, value in list(_walk(doc)):
            if value is not None and _nullable(name, path) and not (name == "best.json" and len(path) == 2):
                doc = _set(doc, path, None)
                nulled += 1
        (d / name).write_text(json.dumps(doc))
    assert nulled >= 10
    folder = read_search(d)
    md, _, figs = search_section(tmp_path / "rep", folder, progress=False)
    assert md.startswith("## 9. Deployment search") and all(p.is_file() for p in figs.values())
