"""No import cycles between the project's modules (grimp's graph, strongly connected components)."""

from __future__ import annotations

from collections.abc import Mapping, Set

import grimp

ROOTS = ["core", "routing", "planner", "sim", "kvpool", "workers", "gateway", "admin_ui", "cli", "bench", "testing"]


def strongly_connected(edges: Mapping[str, Set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, or one that imports itself; each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def test_strongly_connected_on_literal_graphs() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"a"}, "b": {"c"}, "c": {"b"}}) == [["a"], ["b", "c"]]


def test_no_import_cycles() -> None:
    graph = grimp.build_graph(
        *ROOTS, include_external_packages=False, exclude_type_checking_imports=True, cache_dir=None
    )
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    cycles = strongly_connected(edges)
    assert cycles == [], "import cycles (each line: modules that import each other in a loop):\n" + "\n".join(
        ", ".join(c) for c in cycles
    )
