"""The Rust crate's module graph has no cycle.

A module is a file (``rust/x.rs``) or a folder (``rust/x/mod.rs``). Module A depends on
module B when A names B or an item of B: ``use crate::...`` / ``use super::...`` /
``use self::...`` / ``use child::...`` (brace trees expanded), a path in code such as
``crate::a::b(...)``, ``super::x::f`` or ``child::f(...)`` (``child`` a module A declares),
and ``$crate::`` in macros; a ``#[macro_export]`` macro named as ``crate::m`` belongs to the
file that defines it. ``mod x;`` alone is structure, not an import: a parent may declare
its children, but a parent that uses its child's items while the child uses the parent's
is a cycle. Comments, strings and inline ``mod tests { ... }`` blocks are read like the
rest of their file (their ``super`` is the file's own module).
"""

from __future__ import annotations

import re
from pathlib import Path
import graphcheck

RUST = Path(__file__).resolve().parents[2] / "rust"

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
PATH_IN_CODE = re.compile(rf"(?<![A-Za-z0-9_:])(\$?crate|super|self|{IDENT})((?:\s*::\s*{IDENT})+)")
USE = re.compile(r"\buse\s+([^;]*);")
MOD_DECL = re.compile(rf"\bmod\s+({IDENT})\s*([;{{])")
MACRO_EXPORT = re.compile(rf"#\[macro_export\]\s*macro_rules!\s*({IDENT})")


def strip(src: str) -> str:
    """Source with comments, string and char literals blanked (newlines kept)."""
    out: list[str] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif m := re.match(r'b?r(#*)"', src[i:]):
            end = src.find('"' + m.group(1), i + m.end())
            out.append(" " * 0 + '""')
            i = n if end < 0 else end + 1 + len(m.group(1))
        elif c == '"' or src.startswith('b"', i):
            i += 1 if c == '"' else 2
            while i < n and src[i] != '"':
                i += 2 if src[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'" and (m := re.match(r"'(\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'", src[i:])):
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_files(root: Path = RUST) -> dict[tuple[str, ...], Path]:
    """Module path (``("pool", "allocator")``; the crate root is ``()``) -> its file."""
    mods: dict[tuple[str, ...], Path] = {}
    for p in sorted(root.rglob("*.rs")):
        parts = p.relative_to(root).with_suffix("").parts
        if parts == ("lib",):
            parts = ()
        elif parts[-1] == "mod":
            parts = parts[:-1]
        mods[tuple(parts)] = p
    return mods


def expand_use(tree: str) -> list[str]:
    """``a::{b, c::{d, e}}`` -> ``["a::b", "a::c::d", "a::c::e"]`` (``as`` renames dropped)."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+" + IDENT, "", tree))
    brace = tree.find("{")
    if brace < 0:
        return [tree] if tree else []
    prefix, body = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    items, depth, start = [], 0, 0
    for k, ch in enumerate(body):
        depth += (ch == "{") - (ch == "}")
        if ch == "," and depth == 0:
            items.append(body[start:k])
            start = k + 1
    items.append(body[start:])
    return [prefix + sub for item in items if item for sub in expand_use(item)]


class Resolver:
    def __init__(self, mods: dict[tuple[str, ...], Path], macros: dict[str, tuple[str, ...]]):
        self.mods, self.macros = mods, macros

    def resolve(self, here: tuple[str, ...], segments: list[str], children: set[str]) -> tuple[str, ...] | None:
        """The module a path names (longest known prefix), or None for another crate."""
        head, rest = segments[0], segments[1:]
        if head in ("crate", "$crate"):
            base: tuple[str, ...] = ()
            if len(rest) == 1 and rest[0] in self.macros:
                return self.macros[rest[0]]
        elif head == "self":
            base = here
        elif head == "super":
            base = here[:-1]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        elif head in children:
            base, rest = here, segments
        else:
            return None
        best = base if base in self.mods else None
        for k in range(1, len(rest) + 1):
            if base + tuple(rest[:k]) in self.mods:
                best = base + tuple(rest[:k])
        return best


def inline_mods(code: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of every ``mod name { ... }`` block of a file."""
    out = []
    for m in MOD_DECL.finditer(code):
        if m.group(2) != "{":
            continue
        depth, k = 0, m.end() - 1
        while k < len(code):
            depth += (code[k] == "{") - (code[k] == "}")
            if depth == 0:
                break
            k += 1
        out.append((m.end(), k, m.group(1)))
    return out


def file_deps(here: tuple[str, ...], path: Path, res: Resolver) -> set[tuple[str, ...]]:
    code = strip(path.read_text(encoding="utf-8"))
    children = {m.group(1) for m in MOD_DECL.finditer(code) if here + (m.group(1),) in res.mods}
    blocks = inline_mods(code)
    paths: list[tuple[int, list[str]]] = []
    for m in USE.finditer(code):
        paths += [(m.start(), p.split("::")) for p in expand_use(m.group(1)) if p]
    no_use = USE.sub(lambda m: " " * len(m.group(0)), code)
    for m in PATH_IN_CODE.finditer(no_use):
        paths.append((m.start(), [m.group(1)] + [s.strip() for s in m.group(2).split("::") if s.strip()]))
    deps = set()
    for pos, segments in paths:
        # `use super::*` names the module itself; a path ending in `*` names its prefix.
        segments = [s for s in segments if s != "*"]
        inner = tuple(name for start, end, name in blocks if start <= pos < end)
        where = here + inner
        target = res.resolve(where, segments, children if not inner else set()) if segments else None
        if target is not None and target != here:
            deps.add(target)
    return deps


def graph(root: Path = RUST) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    mods = module_files(root)
    macros = {}
    for mod, p in mods.items():
        for m in MACRO_EXPORT.finditer(strip(p.read_text(encoding="utf-8"))):
            macros[m.group(1)] = mod
    res = Resolver(mods, macros)
    return {mod: file_deps(mod, p, res) for mod, p in mods.items()}


def cycles(g: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[list[str]]:
    """Module cycles of ``g``, each as its sorted ``crate::...`` paths."""
    return graphcheck.cycles(g, lambda c: "::".join(("crate",) + c))


def test_no_module_cycles():
    g = graph()
    found = cycles(g)
    detail = []
    for comp in found:
        members = {tuple(c.split("::")[1:]) for c in comp}
        edges = sorted(f"{'::'.join(('crate',) + a)} -> {'::'.join(('crate',) + b)}"
                       for a in members for b in g[a] if b in members)
        detail.append("cycle: " + ", ".join(comp) + "\n    " + "\n    ".join(edges))
    assert not found, "\n".join(detail)


def test_checker_sees_each_kind_of_dependency(tmp_path):
    """The checker itself: each way of naming a module is an edge, `mod x;` is not."""
    (tmp_path / "a").mkdir()
    (tmp_path / "lib.rs").write_text("mod a;\nmod b;\nmod c;\n#[macro_export]\nmacro_rules! m { () => {} }\n")
    (tmp_path / "a" / "mod.rs").write_text("mod x;\nmod y;\npub fn f() { x::g() }\n// crate::c::h\n")
    (tmp_path / "a" / "x.rs").write_text("use super::f;\npub fn g() {}\n")
    (tmp_path / "a" / "y.rs").write_text("use super::{x::g, super::b as bee};\n"
                                         "#[cfg(test)]\nmod tests { use super::*; }\n")
    (tmp_path / "b.rs").write_text("fn k() { let s = \"crate::c::h\"; crate::m!(); }\n")
    (tmp_path / "c.rs").write_text("fn h() { crate::a::f(); let _ = '\"'; }\n")
    g = graph(tmp_path)
    assert g[("a",)] == {("a", "x")}
    assert g[("a", "x")] == {("a",)}
    assert g[("a", "y")] == {("a", "x"), ("b",)}
    assert g[("b",)] == {()}
    assert g[("c",)] == {("a",)}
    assert g[()] == set()
    assert cycles(g) == [["crate::a", "crate::a::x"]]
