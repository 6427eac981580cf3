"""`BATON_*` environment variables are read in one place, core/env.py: no other module the
wheel installs reads one from `os.environ` (or `os.getenv`), so the registry is the whole
list."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

from tests.architecture.imports import ROOT, is_generated

REGISTRY = ROOT / "core" / "env.py"
PREFIX = "BATON_"
_READS = {"get", "pop", "setdefault", "getenv", "__getitem__"}


def _is_environ(node: ast.AST) -> bool:
    """`os.environ` or a bare `environ`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id == "environ"


def _baton_name(node: ast.AST, constants: dict[str, str]) -> str | None:
    """The BATON_* name `node` spells, directly or through a module-level constant."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        value = node.value
    elif isinstance(node, ast.Name):
        value = constants.get(node.id, "")
    else:
        return None
    return value if value.startswith(PREFIX) else None


def installed_files() -> Iterator[Path]:
    """Every module of the packages pyproject.toml ships (`core*`, `router*`, ...)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = sorted({pattern.rstrip("*").split(".")[0] for pattern in patterns})
    assert "core" in tops and "router" in tops, tops
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if not is_generated(path):
                yield path


def baton_reads(path: Path) -> Iterator[tuple[str, int]]:
    """(variable, line) of every BATON_* variable `path` reads from the environment."""
    tree = ast.parse(path.read_text(), str(path))
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }  # fmt: skip
    for node in ast.walk(tree):
        key: ast.AST | None = None
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = node.slice  # os.environ["BATON_X"]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _READS:
                if _is_environ(func.value) or func.attr == "getenv":
                    key = node.args[0]  # os.environ.get("BATON_X"), os.getenv("BATON_X")
            elif isinstance(func, ast.Name) and func.id == "getenv":
                key = node.args[0]
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            key = node.left  # "BATON_X" in os.environ
        name = None if key is None else _baton_name(key, constants)
        if name is not None:
            yield name, node.lineno


def test_only_the_registry_reads_baton_variables() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} reads {name}"
        for path in installed_files()
        if path != REGISTRY
        for name, line in baton_reads(path)
    ]
    assert not found, "read BATON_* switches through core/env.py:\n" + "\n".join(found)


def test_the_check_sees_each_way_of_reading(tmp_path: Path) -> None:
    source = tmp_path / "reads.py"
    source.write_text(
        "import os\nfrom os import environ, getenv\nNAME = 'BATON_E'\n"
        "os.environ.get('BATON_A')\nos.environ['BATON_B']\nos.getenv('BATON_C')\n"
        "'BATON_D' in os.environ\nenviron.get(NAME)\ngetenv('BATON_F')\n"
        "os.environ.get('HOME')\nprint('BATON_G')\n"
    )
    names = [name for name, _ in sorted(baton_reads(source), key=lambda read: read[1])]
    assert names == ["BATON_A", "BATON_B", "BATON_C", "BATON_D", "BATON_E", "BATON_F"]


def test_the_registry_names_each_switch_once() -> None:
    from core import env

    names = [switch.name for switch in env.SWITCHES]
    assert len(names) == len(set(names))
    assert all(name.startswith(PREFIX) for name in names)
    defined = {v.name for v in vars(env).values() if isinstance(v, env.EnvFlag | env.EnvText)}
    assert defined == set(names), "every switch the module defines is in SWITCHES"
