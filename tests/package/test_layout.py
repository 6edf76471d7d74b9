"""The package's import graph: no cycle of any length, and imports only go down the layers
core -> planning -> simulate / prefix -> report -> cli (the facade ``pykvpool/__init__``
re-exports and is imported by no module of the package). The benchmarks' graph
(``benches/``): no cycle, siblings imported at module level only (never inside a function
to dodge a cycle); benches import pykvpool, neither the package nor ``tests/`` import
benches. The tests' own graph (their helpers included): no cycle."""

from __future__ import annotations

import ast
from pathlib import Path
from graphcheck import cycles

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pykvpool"
BENCHES = ROOT / "benches"

#: Layer of each top-level part of the package; a module may import its own layer or lower.
LAYERS = {"_native": 0, "errors": 0, "progress": 0, "checks": 0, "plotting": 0, "tracefile": 0, "toy_decoder": 0, "_dlpack": 0,
          "planning": 1, "video": 1, "hf": 1, "simulate": 2, "prefix": 2, "search": 3, "report": 3, "cli": 4}


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file for every ``.py`` module under ``root`` (packages by __init__)."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    if root.name == "pykvpool":
        out.setdefault("pykvpool._native", root / "_native.pyi")
    return out


def imports(name: str, path: Path, known: set[str], nodes: list[ast.AST] | None = None) -> set[str]:
    """The modules of ``known`` that ``name`` imports anywhere in its file (function-level
    too), or in ``nodes`` only. An absolute import of a sibling by its bare name (a script
    run with its folder on ``sys.path``) counts as the sibling."""
    is_pkg = path.name == "__init__.py"
    top = name.split(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree) if nodes is None else nodes:
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
            # `from pkg import sub` imports the submodule; `from mod import name`, the module.
            targets = [t for t in targets if t in known] or [base]
            if any(f"{base}.{a.name}" in known for a in node.names):
                targets = [t for t in targets if t != base]
        else:
            continue
        for t in targets:
            if t not in known and f"{top}.{t}" in known and not node.__dict__.get("level"):
                t = f"{top}.{t}"
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def function_level_imports(path: Path) -> list[ast.AST]:
    """The import statements inside the functions of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [n for f in funcs for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]


def top_names(path: Path) -> set[str]:
    """The top-level package of every absolute import in ``path`` (function-level too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    mods = modules(root)
    return {m: imports(m, p, set(mods)) for m, p in mods.items() if p.suffix == ".py"}


def layer(module: str) -> int | None:
    parts = module.split(".")
    return None if len(parts) < 2 else LAYERS[parts[1]]


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_imports_go_down_the_layers() -> None:
    bad = []
    for mod, deps in graph().items():
        for dep in deps:
            if dep == "pykvpool":
                if mod != "pykvpool":
                    bad.append(f"{mod} imports the facade pykvpool")
                continue
            if mod == "pykvpool":
                continue
            if layer(dep) > layer(mod):  # type: ignore[operator]
                bad.append(f"{mod} (layer {layer(mod)}) imports {dep} (layer {layer(dep)})")
    assert bad == []


def test_every_part_has_a_layer() -> None:
    assert {m.split(".")[1] for m in modules() if "." in m} <= set(LAYERS)


def test_the_checker_finds_cycles_and_function_level_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pykvpool"
    (pkg / "report").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "report" / "__init__.py").write_text("")
    (pkg / "report" / "a.py").write_text("from pykvpool.report.b import x\n")
    (pkg / "report" / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "report" / "c.py").write_text("import pykvpool.report.a as a\n")
    assert cycles(graph(pkg)) == [["pykvpool.report.a", "pykvpool.report.b", "pykvpool.report.c"]]


def bench_modules() -> dict[str, Path]:
    """The benchmark modules: ``benches/`` without its tests (leaves that import benches)."""
    return {m: p for m, p in modules(BENCHES).items() if not m.startswith("benches.tests")}


#: Benchmarks that still import from ``tests/``: bench_hf_memory reuses test_hf's tiny
#: transformers models and its generation loop.
IMPORTS_TESTS = {"bench_hf_memory.py"}


def test_no_import_cycle_in_benches() -> None:
    mods = bench_modules()
    assert cycles({m: imports(m, p, set(mods)) for m, p in mods.items()}) == []


def test_benches_import_each_other_at_module_level() -> None:
    """A function-level import of a sibling is how a cycle hides: shared code goes into
    ``benches/common.py`` (or the module both use) instead."""
    mods = bench_modules()
    hidden = {m: deps for m, p in mods.items() if (deps := imports(m, p, set(mods), function_level_imports(p)))}
    assert hidden == {}


def test_no_import_cycle_in_tests() -> None:
    """The tests' helpers (``tests/reference/``, ``isolation``, ``graphcheck``) and the tests
    that use them form no cycle either."""
    mods = modules(ROOT / "tests")
    graph_ = {m: imports(m, p, set(mods)) for m, p in mods.items()}
    assert any(deps for deps in graph_.values())  # the helpers' imports are seen
    assert cycles(graph_) == []


def test_benches_import_pykvpool_never_the_reverse() -> None:
    """Benchmarks import the package; the package and its tests import no benchmark."""
    assert any("pykvpool" in top_names(p) for p in BENCHES.glob("*.py"))
    bad = [str(p.relative_to(ROOT)) for folder in (PACKAGE, ROOT / "tests") for p in sorted(folder.rglob("*.py"))
           if "benches" in top_names(p)]
    assert bad == []
    assert {p.name for p in BENCHES.glob("*.py") if "tests" in top_names(p)} == IMPORTS_TESTS


def test_the_benches_checker_finds_bare_and_hidden_sibling_imports(tmp_path: Path) -> None:
    benches = tmp_path / "benches"
    benches.mkdir()
    (benches / "__init__.py").write_text("")
    (benches / "a.py").write_text("import b\n")
    (benches / "b.py").write_text("def f():\n    from benches import a\n")
    assert cycles(graph(benches)) == [["benches.a", "benches.b"]]
    b = benches / "b.py"
    assert imports("benches.b", b, set(modules(benches)), function_level_imports(b)) == {"benches.a"}
