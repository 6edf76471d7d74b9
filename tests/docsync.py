#!/usr/bin/env python3
"""Keep the run-time docstrings of ``pykvpool._native`` in step with its stub.

``pykvpool/_native.pyi`` is the one source of the compiled module's docstrings: IDEs read
them there, and this script copies each one, as ``///`` doc comment lines, above the Rust
item PyO3 builds the Python object from, so that ``help()`` and ``__doc__`` show the same
text at run time::

    python tests/docsync.py --check   # exit 1 and list every difference
    python tests/docsync.py --write   # rewrite the /// blocks, then rebuild the extension

Where each stub item lives in ``rust/bindings/**/*.rs``:

- a class: the struct (or enum) under ``#[pyclass(name = "X")]`` (or named ``X``);
- a method or property: ``fn name`` (``#[pyo3(name = "...")]``, ``#[getter(name)]`` and
  PyO3's ``get_`` prefix rule are honoured) in a ``#[pymethods] impl`` of that struct; a
  getter of a snapshot class (``stats_class! { #[pymethods] impl X { fields { ... } ... } }``,
  one generated per field) lives on the ``field: type,`` line of its ``fields { }`` list;
- a function: ``fn name`` under ``#[pyfunction]``;
- an exception class: its ``Name,`` line in the ``exception_docs!`` table
  (``rust/bindings/exception_docs.rs``): the classes are built with ``type(name, bases,
  ns)``, which takes the doc as a string, so the table turns the ``///`` lines into it.

Not synced, on purpose: module constants and ``__version__`` (an ``int`` or ``str`` has no
docstring of its own; the stub documents them for IDEs with a string below the name),
dunder methods (CPython gives slot wrappers such as ``__len__`` their own doc; the class
docstring documents the constructor), and the module docstring.

Only lines that are ``///`` doc comments are ever added, changed or removed: a write
that would touch anything else is refused. Running ``--write`` twice changes nothing the
second time. A stub item with no Rust counterpart is reported (exit 1), never fatal; the
rest is still written.

After merging branches that touched ``rust/bindings/**/*.rs``: resolve a conflict whose one
side is only ``///`` lines by keeping the code side, then run ``--write`` (the stub
decides every doc line), rebuild, and run ``--check``.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "pykvpool" / "_native.pyi"
BINDINGS = ROOT / "rust" / "bindings"
EXCEPTION_TABLE = "exception_docs"

# --------------------------------------------------------------------------- the stub


@dataclass
class Item:
    """One documented object of the compiled module, as the stub declares it."""

    qualname: str  # "BlockPool.step", "decode_attention", "KvPoolError"
    kind: str  # "class", "exception", "method", "getter", "function"
    doc: str | None  # cleaned docstring (None: the stub has none)
    line: int  # line in the stub

    @property
    def owner(self) -> str | None:
        return self.qualname.split(".")[0] if "." in self.qualname else None

    @property
    def name(self) -> str:
        return self.qualname.split(".")[-1]


def _decorators(node: ast.FunctionDef) -> set[str]:
    return {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in node.decorator_list}


def _merge_overloads(items: list[Item], problems: list[str]) -> list[Item]:
    """One item per name: overloads share the first docstring; two different ones are an error."""
    merged: dict[str, Item] = {}
    for it in items:
        prev = merged.get(it.qualname)
        if prev is None:
            merged[it.qualname] = it
        elif it.doc is not None and prev.doc is not None and it.doc != prev.doc:
            problems.append(f"{it.qualname}: overloads with different docstrings (line {it.line})")
        elif prev.doc is None:
            merged[it.qualname] = Item(it.qualname, it.kind, it.doc, it.line)
    return list(merged.values())


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def stub_items(path: Path = STUB) -> tuple[list[Item], list[str], list[str]]:
    """The stub's documented items, notes on what is skipped, and problems found."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    items: list[Item] = []
    notes: list[str] = ["module docstring: IDE only (not synced)"]
    problems: list[str] = []
    exceptions = {"BaseException", "Exception"}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
            is_exc = bool(bases & exceptions)
            if is_exc:
                exceptions.add(node.name)
            items.append(Item(node.name, "exception" if is_exc else "class", ast.get_docstring(node), node.lineno))
            members: list[Item] = []
            for sub in node.body:
                if not isinstance(sub, ast.FunctionDef):
                    continue
                qual = f"{node.name}.{sub.name}"
                decos = _decorators(sub)
                if _is_dunder(sub.name):
                    notes.append(f"{qual}: dunder, CPython's slot doc or the class doc")
                elif "setter" in decos or "deleter" in decos:
                    notes.append(f"{qual}: setter, documented by its getter")
                else:
                    kind = "getter" if "property" in decos else "method"
                    members.append(Item(qual, kind, ast.get_docstring(sub), sub.lineno))
            items += _merge_overloads(members, problems)
        elif isinstance(node, ast.FunctionDef):
            items.append(Item(node.name, "function", ast.get_docstring(node), node.lineno))
        elif isinstance(node, (ast.AnnAssign, ast.Assign)):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            for t in targets:
                if isinstance(t, ast.Name) and not t.id.startswith("_") and not _is_alias(node):
                    notes.append(f"{t.id}: constant, IDE only (an int or str has no docstring)")
    items = _merge_overloads(items, problems)
    for it in items:
        problems += [f"{_rel(path)}:{it.line}: {it.qualname}: {p}" for p in doc_problems(it.doc)]
    return items, notes, problems


def _is_alias(node: ast.AnnAssign | ast.Assign) -> bool:
    ann = getattr(node, "annotation", None)
    return isinstance(ann, ast.Name) and ann.id == "TypeAlias"


def doc_problems(doc: str | None) -> list[str]:
    """What keeps a docstring from being a clean ``///`` block and a clean ``__doc__``."""
    if not doc or not doc.strip():
        return ["no docstring in the stub"]
    out = []
    lines = doc.splitlines()
    if any(line != line.rstrip() for line in lines):
        out.append("trailing whitespace in the docstring")
    if "\t" in doc:
        out.append("tab in the docstring")
    for prev, line in zip([""] + lines, lines):
        # rustdoc reads a line indented by 4+ after a blank line as a Rust code block
        # (and `cargo test --doc` would compile it).
        if not prev.strip() and line.startswith("    "):
            out.append(f"line {line.strip()[:30]!r} would be a rustdoc code block (indented after a blank line)")
    return out


# ------------------------------------------------------------------------- Rust source


def sanitize(text: str) -> str:
    """``text`` with comments, strings and char literals blanked (same length, newlines
    kept), so that brackets can be counted."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif (m := re.compile(r'r(#*)"').match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            blank(m.end(), j - 1 - len(m.group(1)))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
        elif c == "'" and (m := re.compile(r"'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'").match(text, i)):
            blank(i + 1, m.end() - 1)
            i = m.end()
        else:
            i += 1
    return "".join(out)


OPEN, CLOSE = "([{", ")]}"


def net_brackets(s: str) -> int:
    return sum(ch in OPEN for ch in s) - sum(ch in CLOSE for ch in s)


def is_doc(line: str) -> bool:
    s = line.lstrip()
    return s.startswith("///") and not s.startswith("////")


@dataclass
class Anchor:
    """Where one Python object is defined in Rust: the line of the item itself."""

    file: "RustFile"
    line: int


@dataclass
class RustFile:
    path: Path
    lines: list[str]  # with line endings
    clean: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.clean = sanitize("".join(self.lines)).splitlines(keepends=True)

    def match_close(self, line: int, col: int) -> int:
        """The line of the bracket closing the one at ``(line, col)`` of the clean text."""
        depth = 0
        for j in range(line, len(self.clean)):
            s = self.clean[j]
            for ch in s[col:] if j == line else s:
                if ch in OPEN:
                    depth += 1
                elif ch in CLOSE:
                    depth -= 1
                    if depth == 0:
                        return j
        return len(self.clean) - 1

    def header(self, anchor: int) -> tuple[int, list[int], int]:
        """Scan the attributes, comments and docs above line ``anchor``.

        Returns (first line of the header, the ``///`` lines in it, the first attribute
        line or ``anchor`` when there is none).
        """
        j, docs, first_attr = anchor - 1, [], anchor
        while j >= 0:
            orig, code = self.lines[j].strip(), self.clean[j].strip()
            if is_doc(orig):
                docs.append(j)
            elif orig.startswith("//"):
                pass
            elif code.startswith("#[") and net_brackets(code) == 0:
                first_attr = j
            elif code.endswith("]") and net_brackets(code) < 0:
                # The last line of a multi-line attribute: climb to its `#[`.
                depth = -net_brackets(code)
                while depth > 0 and j > 0:
                    j -= 1
                    depth -= net_brackets(self.clean[j])
                if not self.clean[j].strip().startswith("#["):
                    raise ValueError(f"{self.path.name}:{anchor + 1}: cannot parse the attributes above")
                first_attr = j
            else:
                break
            j -= 1
        return j + 1, sorted(docs), first_attr


def load_bindings(folder: Path = BINDINGS) -> list[RustFile]:
    return [RustFile(p, p.read_text(encoding="utf-8").splitlines(keepends=True)) for p in sorted(folder.rglob("*.rs"))]


ATTR_NAME = re.compile(r'\bname\s*=\s*"([^"]+)"')
FN = re.compile(r"\bfn\s+(\$?\w+)\s*[<(]")
ITEM = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:struct|enum)\s+(\w+)")


def _next_code_line(f: RustFile, start: int, pattern: re.Pattern[str]) -> tuple[int, re.Match[str]] | None:
    for j in range(start, len(f.clean)):
        m = pattern.search(f.clean[j])
        if m:
            return j, m
        code = f.clean[j].strip()
        if code and not code.startswith("#") and net_brackets(code) >= 0 and not code.endswith((",", "(", "]")):
            return None
    return None


def _attr_text(f: RustFile, top: int, anchor: int) -> str:
    return "".join(line for line in f.lines[top:anchor] if not line.lstrip().startswith("//"))


@dataclass
class RustIndex:
    classes: dict[str, Anchor] = field(default_factory=dict)  # python name -> struct
    struct_of: dict[str, str] = field(default_factory=dict)  # python name -> Rust name
    members: dict[tuple[str, str, str], Anchor] = field(default_factory=dict)  # (struct, kind, py name)
    functions: dict[str, Anchor] = field(default_factory=dict)
    exceptions: dict[str, Anchor] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _invocation_fields(files: list[RustFile], macro: str, pattern: str) -> dict[str, Anchor]:
    """Lines ``name<pattern>`` directly inside every invocation ``macro!(...)``."""
    out: dict[str, Anchor] = {}
    for f in files:
        for i, line in enumerate(f.clean):
            m = re.search(rf"\b{macro}!\s*([({{\[])", line)
            if not m or "macro_rules" in line:
                continue
            end = f.match_close(i, m.start(1))
            for j in range(i + 1, end + 1):
                fm = re.match(rf"^\s*(\w+){pattern}", f.clean[j])
                if fm:
                    out[fm.group(1)] = Anchor(f, j)
    return out


def _braces(s: str) -> int:
    return s.count("{") - s.count("}")


def _explicit_name(attrs: str) -> str | None:
    """``name = "..."`` of ``#[pyo3(...)]``, ``#[pyclass(...)]`` or ``#[pyfunction(...)]``,
    not a parameter default inside ``signature = (...)``."""
    clean = sanitize(attrs)
    for m in reversed(list(re.finditer(r"\bsignature\s*=\s*\(", clean))):
        depth, end = 0, len(clean)
        for k in range(m.end() - 1, len(clean)):
            depth += (clean[k] == "(") - (clean[k] == ")")
            if depth == 0:
                end = k + 1
                break
        attrs, clean = attrs[: m.start()] + attrs[end:], clean[: m.start()] + clean[end:]
    found = ATTR_NAME.search(attrs)
    return found.group(1) if found else None


def _scan_impl(f: RustFile, idx: RustIndex, start: int, end: int, struct: str) -> None:
    depth_at = 0  # braces open before the line, counted from the `impl` line
    in_fields = False  # inside the `fields { }` list of a `stats_class!` impl
    for j in range(start, end + 1):
        line = f.clean[j]
        if depth_at == 1 and re.match(r"^\s*fields\s*\{", line):
            in_fields = True
        elif in_fields and depth_at == 1:
            in_fields = False
        if in_fields and depth_at == 2 and (fm := re.match(r"^\s*(\w+)\s*:", line)):
            # A getter generated per field: its doc goes on the field's line.
            idx.members[(struct, "getter", fm.group(1))] = Anchor(f, j)
        for m in FN.finditer(line):
            if depth_at + _braces(line[: m.start()]) != 1:
                continue  # not a method of the impl (a nested fn)
            name = m.group(1)
            top, _, _ = f.header(j)
            attrs = _attr_text(f, top, j) + f.lines[j][: m.start()]
            if re.search(r"#\[(new|setter|classattr)\b", attrs):
                continue
            getter = re.search(r"#\[getter(?:\((\w+)\))?\]", attrs)
            explicit = _explicit_name(attrs)
            if getter:
                py = getter.group(1) or explicit or name.removeprefix("get_")
                idx.members[(struct, "getter", py)] = Anchor(f, j)
            else:
                idx.members[(struct, "method", explicit or name)] = Anchor(f, j)
        depth_at += _braces(line)


def index_bindings(files: list[RustFile]) -> RustIndex:
    idx = RustIndex()
    for f in files:
        for i, line in enumerate(f.clean):
            code = line.strip()
            if code.startswith("#[pyclass"):
                found = _next_code_line(f, i, ITEM)
                if found is None:
                    idx.problems.append(f"{f.path.name}:{i + 1}: #[pyclass] without a struct")
                    continue
                j, m = found
                py = _explicit_name(_attr_text(f, i, j)) or m.group(1)
                idx.classes[py] = Anchor(f, j)
                idx.struct_of[py] = m.group(1)
            elif code.startswith("#[pymethods"):
                found = _next_code_line(f, i + 1, re.compile(r"\bimpl\b(?:\s*<[^>]*>)?\s+(\w+)[^{]*\{"))
                if found is None:
                    idx.problems.append(f"{f.path.name}:{i + 1}: #[pymethods] without an impl")
                    continue
                j, m = found
                end = f.match_close(j, m.end() - 1)
                _scan_impl(f, idx, j, end, m.group(1))
            elif code.startswith("#[pyfunction"):
                found = _next_code_line(f, i, FN)
                if found is None:
                    idx.problems.append(f"{f.path.name}:{i + 1}: #[pyfunction] without a fn")
                    continue
                j, m = found
                top, _, _ = f.header(j)
                idx.functions[_explicit_name(_attr_text(f, top, j)) or m.group(1)] = Anchor(f, j)
    idx.exceptions = _invocation_fields(files, EXCEPTION_TABLE, r"\s*,\s*$")
    return idx


def locate(item: Item, idx: RustIndex) -> Anchor | None:
    if item.kind == "class":
        return idx.classes.get(item.qualname)
    if item.kind == "exception":
        return idx.exceptions.get(item.qualname)
    if item.kind == "function":
        return idx.functions.get(item.qualname)
    struct = idx.struct_of.get(item.owner or "")
    return None if struct is None else idx.members.get((struct, item.kind, item.name))


# ------------------------------------------------------------------------------- sync


def render(doc: str, indent: str) -> list[str]:
    return [f"{indent}///{' ' + line if line else ''}\n" for line in doc.splitlines()]


def current_doc(f: RustFile, docs: list[int]) -> list[str]:
    out = []
    for j in docs:
        text = f.lines[j].lstrip()[3:].rstrip("\r\n")
        out.append(text[1:] if text.startswith(" ") else text)
    return out


@dataclass
class Edit:
    file: RustFile
    remove: list[int]
    at: int
    new: list[str]
    what: str


def plan(items: list[Item], idx: RustIndex, stub: Path = STUB) -> tuple[list[Edit], list[str]]:
    edits, problems = [], []
    claimed: dict[tuple[Path, int], str] = {}
    for it in items:
        if not it.doc:
            continue  # reported by stub_items
        anchor = locate(it, idx)
        if anchor is None:
            problems.append(f"{_rel(stub)}:{it.line}: {it.qualname} ({it.kind}): no Rust counterpart found")
            continue
        f = anchor.file
        other = claimed.setdefault((f.path, anchor.line), it.qualname)
        if other != it.qualname:
            problems.append(f"{_rel(f.path)}:{anchor.line + 1}: both {other} and {it.qualname} map here")
            continue
        try:
            _, docs, first_attr = f.header(anchor.line)
        except ValueError as e:
            problems.append(f"{it.qualname}: {e}")
            continue
        if any(re.match(r"\s*#\[doc\b", f.clean[j]) for j in range(first_attr, anchor.line)):
            problems.append(f"{f.path.name}:{anchor.line + 1}: {it.qualname}: a #[doc] attribute; use /// lines")
            continue
        if current_doc(f, docs) == it.doc.splitlines():
            continue
        at = docs[0] if docs else first_attr
        indent = f.lines[at][: len(f.lines[at]) - len(f.lines[at].lstrip())]
        where = f"{_rel(f.path)}:{anchor.line + 1}"
        edits.append(Edit(f, docs, at, render(it.doc, indent), f"{where}: {it.qualname}: docs differ from the stub"))
    return edits, problems


def apply(edits: list[Edit]) -> list[Path]:
    by_file: dict[Path, list[Edit]] = {}
    for e in edits:
        by_file.setdefault(e.file.path, []).append(e)
    written = []
    for path, file_edits in by_file.items():
        old = file_edits[0].file.lines
        new = list(old)
        for e in sorted(file_edits, key=lambda e: e.at, reverse=True):
            for j in sorted(e.remove, reverse=True):
                del new[j]
            new[e.at : e.at] = e.new
        if [x for x in old if not is_doc(x)] != [x for x in new if not is_doc(x)]:
            raise SystemExit(f"docsync: refusing to write {path}: a line other than /// would change")
        path.write_text("".join(new), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="report differences, exit 1 if any")
    mode.add_argument("--write", action="store_true", help="rewrite the /// blocks from the stub")
    ap.add_argument("-v", "--verbose", action="store_true", help="also list what is skipped and why")
    ap.add_argument("--stub", type=Path, default=STUB, help=argparse.SUPPRESS)
    ap.add_argument("--bindings", type=Path, default=BINDINGS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    files = load_bindings(args.bindings)
    conflicted = [f.path.name for f in files if any(x.startswith(("<<<<<<<", ">>>>>>>")) for x in f.lines)]
    if conflicted:
        print(f"docsync: merge conflict markers in {', '.join(conflicted)}; resolve them first", file=sys.stderr)
        return 2
    items, notes, problems = stub_items(args.stub)
    idx = index_bindings(files)
    edits, missing = plan(items, idx, args.stub)
    problems += idx.problems + missing
    if args.verbose:
        for n in notes:
            print(f"skipped: {n}")
    if args.write:
        for path in apply(edits):
            print(f"docsync: wrote {_rel(path)}")
    else:
        problems += [e.what for e in edits]
    for p in problems:
        print(p)
    placed = len([it for it in items if it.doc]) - len(missing)
    verb = f"{len(edits)} rewritten" if args.write else f"{len(edits)} out of date"
    print(f"docsync: {placed} docstrings placed in Rust, {verb}; {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
