"""One home per concept, checked from the source (ast): calls into a worker's ranks name a
method, never a string; the performance model's formulas are written once (core/perf)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.architecture.imports import ROOT, product_files

RANK_CALLS = {"all", "first", "each", "call_all", "call_first", "call_each", "call"}
"""Methods that run something on a worker's ranks (worker.group.RankGroup, engine.tp)."""
RANK_PACKAGES = ("worker", "prefill_worker", "decode_worker", "engine")
MODEL_FUNCTIONS = {
    "least_squares", "prefill_terms", "decode_terms", "attention_pairs", "attention_area",
    "num_prefill_steps", "fit_prefill", "fit_decode", "_compute_s", "transfer_terms",
    "fit_transfer",
}  # fmt: skip
"""The performance model's formulas and fit: defined in core/perf and nowhere else."""


def _trees(paths: Iterator[Path]) -> Iterator[tuple[Path, ast.AST]]:
    for path in paths:
        yield path, ast.parse(path.read_text(), str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


def test_no_rank_method_is_called_by_a_name_in_a_string() -> None:
    found = []
    for path, tree in _trees(p for _, p in product_files()):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            first = node.args[0] if node.args else None
            named = isinstance(first, ast.JoinedStr) or (
                isinstance(first, ast.Constant) and isinstance(first.value, str)
            )
            if node.func.attr in RANK_CALLS and named:
                found.append(f"{_where(path, node)} {node.func.attr}({ast.unparse(first)})")
    assert not found, "call the rank method (RankGroup.all(WorkerRank.x)):\n" + "\n".join(found)


def test_no_rank_falls_through_to_its_engine() -> None:
    """A rank's methods are its own: no class hands any name on to its engine (a module's
    lazy imports, PEP 562, are not this)."""
    found = []
    for path, tree in _trees(
        p for name, p in product_files() if name.split(".")[0] in RANK_PACKAGES
    ):
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef):
                methods = [f for f in cls.body if isinstance(f, ast.FunctionDef)]
                found += [_where(path, f) for f in methods if f.name == "__getattr__"]
    assert not found, found


def test_the_performance_model_is_written_once() -> None:
    perf = ROOT / "core" / "perf"
    others = [p for _, p in product_files() if perf not in p.parents]
    others += sorted((ROOT / "bench").rglob("*.py"))
    found = []
    for path, tree in _trees(iter(others)):
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in MODEL_FUNCTIONS:
                found.append(f"{_where(path, node)} {node.name}")
    assert not found, "import it from core.perf instead:\n" + "\n".join(found)
