"""Cycles of an import graph, shared by tests/package/test_layout.py (Python) and
tests/package/test_layout_rust.py (Rust) (not a test module)."""

from __future__ import annotations

from typing import Callable, Hashable, Mapping, TypeVar

N = TypeVar("N", bound=Hashable)


def cycles(g: Mapping[N, set[N]], name: Callable[[N], str] = str) -> list[list[str]]:
    """Strongly connected components of ``g`` with more than one node (Tarjan), each as the
    sorted names of its nodes; components in the order their first node is visited."""
    index: dict[N, int] = {}
    low: dict[N, int] = {}
    stack: list[N] = []
    on: set[N] = set()
    out: list[list[str]] = []

    def visit(v: N) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(name(c) for c in comp))

    for v in sorted(g, key=name):
        if v not in index:
            visit(v)
    return out
