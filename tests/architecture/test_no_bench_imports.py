"""The lab stays outside the product: no product module imports `bench` (or `tests`), the
wheel ships neither, and the commands it installs come from product packages."""

from __future__ import annotations

import tomllib

from tests.architecture.imports import PRODUCT, ROOT, imported_names, product_files

LAB = ("bench", "tests")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_no_product_module_imports_the_lab() -> None:
    found = [
        f"{name} imports {dotted} (line {line})"
        for name, path in product_files()
        for dotted, line in imported_names(name, path)
        if dotted.split(".")[0] in LAB
    ]
    assert not found, "\n".join(found)


def test_the_import_check_sees_every_product_package() -> None:
    tops = {name.split(".")[0] for name, _ in product_files()}
    assert tops == set(PRODUCT), set(PRODUCT) - tops
    assert {"loadgen", "planner"} <= tops


def test_the_wheel_ships_no_lab() -> None:
    include = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = {pattern.rstrip("*").rstrip(".") for pattern in include}
    assert not shipped & set(LAB), shipped & set(LAB)
    assert shipped == set(PRODUCT), shipped ^ set(PRODUCT)


def test_every_command_comes_from_a_product_package() -> None:
    project = _pyproject()["project"]
    targets = [*project["scripts"].values(), *project["entry-points"]["baton.commands"].values()]
    outside = [t for t in targets if t.split(":")[0].split(".")[0] not in PRODUCT]
    assert not outside, outside
    assert set(project["entry-points"]["baton.commands"]) >= {"bench", "plan", "profile"}
