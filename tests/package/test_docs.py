"""Run-time documentation: every public name has a docstring, units and errors included.

- The compiled module: each docstring of ``pykvpool/_native.pyi`` is what ``help()`` shows
  at run time (``tests/docsync.py`` copies it into the Rust bindings as ``///`` lines).
- The Python facade: every public function, class, method and property has a docstring,
  and every one that can raise has a ``Raises:`` section, but for the explicit list below
  of names where nothing can raise.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import pydoc
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import pykvpool
from pykvpool import _native

ROOT = Path(__file__).resolve().parents[2]
STUB = ROOT / "pykvpool" / "_native.pyi"
DOCSYNC = ROOT / "tests" / "docsync.py"
RAISES = re.compile(r"^Raises(?: \(on construction\))?:$", re.M)

# ----------------------------------------------------------------- the compiled module


def _stub_docs() -> dict[str, str | None]:
    """``{qualname: docstring}`` of every public class, function, method and property the
    stub declares (overloads: the first docstring), read with ``ast``."""
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    out: dict[str, str | None] = {}

    def add(name: str, node: ast.ClassDef | ast.FunctionDef) -> None:
        if out.get(name) is None:
            out[name] = ast.get_docstring(node)

    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_"):
            add(node.name, node)
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and not sub.name.startswith("_"):
                    add(f"{node.name}.{sub.name}", sub)
    return out


STUB_DOCS = _stub_docs()


def _runtime(qualname: str) -> Any:
    obj: Any = _native
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def test_stub_declares_every_public_native_name() -> None:
    constants = {n for n in dir(_native) if isinstance(getattr(_native, n), (int, str, tuple))}
    public = {n for n in dir(_native) if not n.startswith("_")} - constants
    assert public <= set(STUB_DOCS), sorted(public - set(STUB_DOCS))
    assert len(STUB_DOCS) > 90  # classes, their methods and properties, functions


@pytest.mark.parametrize("qualname", sorted(STUB_DOCS))
def test_runtime_docstring_is_the_stubs(qualname: str) -> None:
    stub = STUB_DOCS[qualname]
    assert stub, f"{qualname} has no docstring in {STUB.name}"
    # PyO3 puts `name(signature)\n--\n\n` before the doc; CPython moves it to
    # __text_signature__, so __doc__ (and getdoc) hold the docstring alone.
    assert inspect.getdoc(_runtime(qualname)) == inspect.cleandoc(stub)


def test_exception_docstrings_reach_the_package() -> None:
    for name in ("KvPoolError", "PoolExhaustedError", "UnknownSequenceError", "InvalidArgumentError",
                 "DuplicateSequenceError", "InvariantError"):
        cls = getattr(pykvpool, name)
        assert cls.__module__ == "pykvpool"
        assert cls.__doc__ == inspect.cleandoc(STUB_DOCS[name] or "")


def _help(obj: Any) -> str:
    """What ``help(obj)`` prints."""
    return pydoc.plain(pydoc.render_doc(obj, renderer=pydoc.TextDoc()))


def test_help_of_step_shows_units_and_errors() -> None:
    text = _help(pykvpool.BlockPool.step)
    assert "step(self, /, seq_ids, num_tokens=None)" in text
    assert "in tokens" in text and "int64" in text and "Returns:" in text
    assert "Raises:" in text and "PoolExhaustedError" in text and "UnknownSequenceError" in text
    cls = _help(pykvpool.BlockPool)
    assert "block_size: token slots per block" in cls and "InvalidArgumentError" in cls
    assert pykvpool.BlockPool.__doc__ and pykvpool.BlockPool.__text_signature__


def test_decode_attention_documents_arguments_at_run_time() -> None:
    doc = inspect.getdoc(pykvpool.decode_attention) or ""
    for word in ("q: float32", "seq_lens:", "out:", "tuning:", "q_dtype:", "logits_soft_cap:", "Returns:",
                 "Raises:", "InvalidArgumentError"):
        assert word in doc, word


# ------------------------------------------------------------------------ tests/docsync.py


def _docsync(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DOCSYNC), *args], capture_output=True, text=True,
                          check=False, timeout=120, cwd=ROOT)


def test_rust_doc_comments_match_the_stub() -> None:
    r = _docsync("--check")
    assert r.returncode == 0, r.stdout + r.stderr


def _non_doc_lines(folder: Path) -> dict[str, list[str]]:
    return {str(p.relative_to(folder)): [x for x in p.read_text().splitlines() if not x.lstrip().startswith("///")]
            for p in sorted(folder.rglob("*.rs"))}


def test_docsync_writes_only_doc_lines_is_idempotent_and_reports_strays(tmp_path: Path) -> None:
    # A branch adds a method (attributes, a comment, a renamed fn) and a stub entry without
    # Rust counterpart; the sync must place the one, report the other and touch no code.
    bindings = tmp_path / "bindings"
    shutil.copytree(ROOT / "rust" / "bindings", bindings)
    pool = bindings / "pool" / "methods.rs"
    code = pool.read_text()
    anchor = "    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {"
    assert anchor in code
    pool.write_text(code.replace(anchor, (
        "    // a note\n"
        "    #[pyo3(signature = (n, *, tag = \"x)]\"))]\n"
        "    #[pyo3(name = \"renamed\")]\n"
        "    fn added(&self, n: i64, tag: &str) -> i64 {\n        let _ = tag;\n        n\n    }\n\n"
    ) + anchor))
    stub = tmp_path / "stub.pyi"
    text = STUB.read_text()
    anchor_py = "    def check_invariants(self) -> None:"
    assert anchor_py in text
    stub.write_text(text.replace(anchor_py, (
        "    def renamed(self, n: int, *, tag: str = ...) -> int:\n"
        "        \"\"\"Added.\n\n        Raises:\n            InvalidArgumentError: never.\n        \"\"\"\n"
        "    def ghost(self) -> int:\n        \"\"\"Only in the stub.\"\"\"\n"
    ) + anchor_py, 1))  # BlockPool's (BlockPool has one too)
    before = _non_doc_lines(bindings)
    args = ("--stub", str(stub), "--bindings", str(bindings))

    first = _docsync("--write", *args)
    assert first.returncode == 1 and "BlockPool.ghost" in first.stdout, first.stdout + first.stderr
    assert "renamed" not in first.stdout
    assert _non_doc_lines(bindings) == before
    assert "    /// Added.\n    ///\n    /// Raises:\n" in pool.read_text()
    written = {str(p): p.read_text() for p in bindings.rglob("*.rs")}

    check = _docsync("--check", *args)
    assert check.returncode == 1
    assert [line for line in check.stdout.splitlines() if line] == [
        line for line in first.stdout.splitlines() if "ghost" in line]
    again = _docsync("--write", *args)
    assert {str(p): p.read_text() for p in bindings.rglob("*.rs")} == written
    assert "wrote" not in again.stdout


def test_docsync_refuses_conflicted_files(tmp_path: Path) -> None:
    bindings = tmp_path / "bindings"
    shutil.copytree(ROOT / "rust" / "bindings", bindings)
    (bindings / "kv.rs").write_text("<<<<<<< HEAD\n" + (bindings / "kv.rs").read_text())
    r = _docsync("--write", "--bindings", str(bindings))
    assert r.returncode == 2 and "kv.rs" in r.stderr


# ------------------------------------------------------------------------ the Python facade

_FIELDS = "arithmetic on fields that construction validated, or that a validated object computed"
_FIXED = "fixed inputs (presets, constants): nothing a caller passes can make it fail"
_PURE = "pure arithmetic or bookkeeping on plain numbers and lists"
_STORES = "__init__ only stores its arguments (and formats the exception message)"

#: Public callables of the facade where nothing can raise, so no ``Raises:`` section is
#: asked for: every other public function, method, property and constructor that runs
#: code of its own must have one. A wrong *type* raising ``TypeError`` is Python's
#: convention and does not count. Names are relative to the ``pykvpool`` package.
NOTHING_RAISES: dict[str, str] = {
    **dict.fromkeys([
        "report.article.Reproduced.match",
        "planning.ledger.Budget.usable_bytes",
        "planning.ledger.Budget.available_bytes",
        "planning.ledger.Budget.describe",
        "planning.ledger.DecodeBound.step_time",
        "planning.ledger.DecodeBound.tokens_per_s",
        "planning.ledger.DecodeBound.memory_bound",
        "planning.ledger.LedgerRow.weights_plus_kv_bytes",
        "planning.ledger.LedgerRow.total_bytes",
        "planning.ledger.LedgerRow.kv_over_weights",
        "planning.ledger.MemoryLedger.bytes_per_token",
        "planning.ledger.MemoryLedger.weight_bytes",
        "planning.ledger.MemoryLedger.kv_budget_bytes",
        "planning.ledger.MemoryLedger.token_capacity",
        "planning.models.ModelConfig.group_size",
        "planning.models.ModelConfig.weight_bytes",
        "planning.models.ModelConfig.groups",
        "planning.models.ModelConfig.windowed",
        "planning.models.ModelConfig.active_num_params",
        "planning.layers.LayerGroup.describe",
        "planning.pool_groups.PoolGroup.describe",
        "planning.pool_groups.PoolLayout.block_bytes",
        "planning.pool_groups.PoolLayout.padding_layers",
        "planning.pool_groups.PoolLayout.describe",
        "prefix.replay.ReplayResult.capacity_tokens",
        "prefix.replay.ReplayResult.as_dict",
        "prefix.groups_replay.GroupReplayResult.as_dict",
        "planning.roofline.KernelPoint.intensity",
        "planning.roofline.KernelPoint.flops_per_s",
        "planning.roofline.KernelPoint.bytes_per_s",
        "planning.roofline.KernelPoint.fraction_of_roof",
        "planning.roofline.PrefillPoint.intensity",
        "planning.roofline.PrefillPoint.flops_per_s",
        "planning.roofline.PrefillPoint.bytes_per_s",
        "planning.roofline.PrefillShape.seq_len",
        "planning.sweeps.BlockSizeRow.empty_fraction",
        "planning.sweeps.BlockSizeRow.empty_over_length",
        "planning.sweeps.SweepResult.reserved_bytes",
        "planning.sweeps.SweepResult.used_bytes",
        "planning.sweeps.SweepResult.utilization",
        "planning.sweeps.SweepResult.logical_per_reserved",
        "planning.sweeps.WasteDecomposition.reservation_waste_bytes",
        "planning.sweeps.WasteDecomposition.last_block_waste_bytes",
        "planning.sweeps.WasteDecomposition.ratio",
        "toy_decoder.ToyConfig.d_model",
        "toy_decoder.ToyConfig.d_kv",
        "toy_decoder.ToyConfig.d_ffn",
        "planning.video.VideoSpec.frames",
        "planning.video.VideoSpec.latent_frames",
        "planning.video.VideoSpec.tokens_per_latent_frame",
        "planning.video.VideoSpec.tokens",
        "planning.workloads.Workload.mean_length",
        "planning.video.VideoModel.tokens_per_frame",
        "planning.video.VideoModel.chunk_tokens",
        "planning.video.VideoModel.passes_per_chunk",
        "planning.video.VideoModel.chunk_seconds",
        "planning.video.VideoModel.windowed",
        "planning.video.VideoModel.weight_bytes",
        "simulate.video.StreamRecord.time_to_first_chunk",
        "planning.roofline.Spread.best",
        "planning.roofline.Spread.value",
        "planning.roofline.Spread.agreement",
        "planning.roofline.Spread.stable",
    ], _FIELDS),
    **dict.fromkeys([
        "report.article.article_ledgers",
        "planning.ledger.article_budget",
        "prefix.replay.default_capacities_tokens",
        "planning.video.article_videos",
    ], _FIXED),
    **dict.fromkeys([
        "prefix.replay.seen_prefix_hits",
        "report.tables.markdown_table",
        "report.tables.jsonable",
        "checks.invalid",
        "simulate.plots.line_style",
        "report.dynamic.policies",
        "simulate.traces.empirical",
        "toy_decoder.flops_full",
        "toy_decoder.flops_step",
        "toy_decoder.flops_recompute",
        "toy_decoder.flops_cached",
        "tracefile.file_kind",
        "planning.video.VideoSpec.kv_bytes",
        "planning.video.VideoModel.variant",
        "simulate.video.StreamRecord.chunk_intervals",
        "simulate.video.VideoRoofline.pass_flops",
        "simulate.video.VideoRoofline.pass_bytes",
        "simulate.video.VideoRoofline.pass_time",
        "simulate.video.VideoSimResult.real_time",
        "simulate.video.VideoSimResult.min_fps",
    ], _PURE),
    **dict.fromkeys([
        "errors.BudgetError",
        "errors.TraceFormatError",
        "errors.UnknownPresetError",
        "progress.ProgressBar",
    ], _STORES),
}

#: pykvpool.hf imports torch and transformers (an optional extra): checked when they are installed.
_HF_DEPS = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
PYTHON_MODULES = sorted(m.name[len("pykvpool."):] for m in pkgutil.walk_packages(pykvpool.__path__, "pykvpool.")
                         if not any(p.startswith("_") for p in m.name.split(".")[1:])
                         and (_HF_DEPS or not m.name.startswith("pykvpool.hf")))


def _relative(qualname: str) -> str:
    return qualname.removeprefix("pykvpool.")


def _public_names(mod: ModuleType) -> list[str]:
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n, v in vars(mod).items()
                 if not n.startswith("_") and getattr(v, "__module__", None) == mod.__name__]
    return list(names)


def _attribute_docstrings(mod: ModuleType) -> set[str]:
    """Module-level names documented by a string right after the assignment, or a ``#:``
    comment right above it."""
    source = inspect.getsource(mod)
    lines = source.splitlines()
    tree = ast.parse(source)
    out = set()
    for i, node in enumerate(tree.body):
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not names:
            continue
        nxt = tree.body[i + 1] if i + 1 < len(tree.body) else None
        doc_after = (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                     and isinstance(nxt.value.value, str) and nxt.value.value.strip())
        comment_before = node.lineno >= 2 and lines[node.lineno - 2].lstrip().startswith("#:")
        if doc_after or comment_before:
            out.update(names)
    return out


def _own_doc(obj: Any) -> str:
    """The docstring written in the source: not one inherited (``inspect.getdoc`` would
    find a base class's), not a dataclass's generated signature."""
    doc = obj.__doc__
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and doc and doc.startswith(f"{obj.__name__}("):
        return ""
    return inspect.cleandoc(doc or "")


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods, class/static methods and properties defined by ``cls`` itself."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            out.append((name, value.fget))
        elif isinstance(value, (classmethod, staticmethod)):
            out.append((name, value.__func__))
        elif inspect.isfunction(value):
            out.append((name, value))
    return out


def _constructor_can_raise(cls: type) -> bool:
    """A class whose construction runs code of its own: an ``__init__``, ``__new__`` or
    ``__post_init__`` written in its body (a dataclass's generated ``__init__`` only stores
    the fields)."""
    body = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls))).body[0]
    assert isinstance(body, ast.ClassDef)
    return any(isinstance(n, ast.FunctionDef) and n.name in ("__init__", "__new__", "__post_init__")
               for n in body.body)


def _imported_names(mod: Any) -> set[str]:
    """Names ``mod`` imports (re-exports are documented where they are defined)."""
    tree = ast.parse(inspect.getsource(mod))
    return {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}


def _facade_items() -> list[tuple[str, Any, bool]]:
    """``(qualified name, object, must document Raises)`` for every public name."""
    items: list[tuple[str, Any, bool]] = []
    for modname in PYTHON_MODULES:
        mod = importlib.import_module(f"pykvpool.{modname}")
        items.append((mod.__name__, mod, False))
        documented = _attribute_docstrings(mod)
        for name in _public_names(mod):
            obj = getattr(mod, name)
            qual = f"{mod.__name__}.{name}"
            if inspect.isclass(obj):
                if obj.__module__ != mod.__name__:
                    continue  # a re-export: checked where it is defined
                items.append((qual, obj, _constructor_can_raise(obj)))
                items += [(f"{qual}.{m}", f, True) for m, f in _members(obj)]
            elif inspect.isfunction(obj):
                if obj.__module__ == mod.__name__:
                    items.append((qual, obj, True))
            elif not inspect.ismodule(obj) and name not in _imported_names(mod):
                items.append((qual, "attribute docstring" if name in documented else "", False))
    return items


FACADE = _facade_items()


def test_package_exports_are_documented() -> None:
    missing = []
    for name in pykvpool.__all__:
        obj = getattr(pykvpool, name)
        if isinstance(obj, (int, str)):
            continue  # EVENT_* and __version__: documented in the stub, no run-time docstring
        if not _own_doc(obj):
            missing.append(name)
    assert not missing


def test_every_public_python_name_has_a_docstring() -> None:
    missing = [q for q, obj, _ in FACADE if not (obj if isinstance(obj, str) else _own_doc(obj))]
    assert not missing, "no docstring: " + ", ".join(missing)
    assert len(FACADE) > 150


def test_every_public_python_callable_that_can_raise_says_what() -> None:
    missing = [q for q, obj, can_raise in FACADE if can_raise and _relative(q) not in NOTHING_RAISES
               and not RAISES.search(_own_doc(obj))]
    assert not missing, "no Raises: section: " + ", ".join(missing)


def test_exempt_names_exist_and_have_no_raises_section() -> None:
    by_name = {_relative(q): obj for q, obj, _ in FACADE}
    stale = [q for q in NOTHING_RAISES if q not in by_name]
    assert not stale, f"exempt but not public (renamed or removed?): {stale}"
    contradicted = [q for q in NOTHING_RAISES if RAISES.search(_own_doc(by_name[q]))]
    assert not contradicted, f"exempt but documents Raises: {contradicted}"
