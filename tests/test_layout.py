"""The package's import graph: no cycle of any length, and imports only go down the layers
core -> planning -> simulate / prefix -> report -> cli (the facade ``pykvpool/__init__``
re-exports and is imported by no module of the package)."""

from __future__ import annotations

import ast
from pathlib import Path
from graphcheck import cycles

PACKAGE = Path(__file__).resolve().parents[1] / "pykvpool"

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
    out.setdefault("pykvpool._native", root / "_native.pyi")
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports anywhere in its file (function-level too)."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


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
