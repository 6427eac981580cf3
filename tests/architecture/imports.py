"""The product's import graph, read from the source (ast): which module imports which,
function-level imports included (a lazy import is still an arrow)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("core", "engine", "kv_transfer", "worker", "prefill_worker", "decode_worker",
           "router", "proto", "loadgen", "planner")  # fmt: skip


def is_generated(path: Path) -> bool:
    return "_pb2" in path.name


def product_files() -> Iterator[tuple[str, Path]]:
    """(dotted module name, path) of every product module, generated stubs left out."""
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            if is_generated(path):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


def imported_names(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(absolute dotted name, line) of everything `path` imports, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                yield f"{module}.{alias.name}", node.lineno


def module_graph() -> dict[str, dict[str, int]]:
    """module -> {imported product module: first line}; a name imported from a module
    (`from a.b import c`) counts as an arrow to the module that defines it."""
    files = dict(product_files())

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in files:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        edges: dict[str, int] = {}
        for dotted, line in imported_names(name, path):
            target = resolve(dotted)
            if target is not None and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def third_party(name: str, path: Path) -> set[str]:
    """Top-level names of what `path` imports from outside the product."""
    tops = {dotted.split(".")[0] for dotted, _ in imported_names(name, path)}
    return {t for t in tops if t and t not in PRODUCT}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, {}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found
