"""docs/architecture.md's module map names every product file, as the code describes it."""

from __future__ import annotations

from tests.architecture.module_map import DOC, current, module_map


def test_the_module_map_is_the_code_s() -> None:
    assert current(DOC.read_text(encoding="utf-8")) == module_map(), (
        "docs/architecture.md's module map is out of date: "
        "python -m tests.architecture.module_map --write"
    )
