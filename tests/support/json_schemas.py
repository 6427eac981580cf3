"""Random JSON Schemas from a seeded generator, for structured-output tests: nested
objects, arrays, enums, integers and numbers with bounds, bounded strings, booleans and
required fields. Every string and array is bounded and every number has a range, so a
random-weight model held to the schema (without optional whitespace) ends in few tokens."""

from __future__ import annotations

import random
from typing import Any

_NAMES = ("id", "name", "size", "tags", "ok", "kind", "items", "score", "meta", "level")
_WORDS = ("red", "green", "blue", "baton", "relay", "x")


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object schema (the root of every generated schema is an object)."""
    names = rng.sample(_NAMES, rng.randint(1, 4))
    properties = {name: _value(rng, depth + 1) for name in names}
    required = [n for n in names if rng.random() < 0.6]
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _value(rng: random.Random, depth: int) -> dict[str, Any]:
    kinds = ["string", "integer", "number", "boolean", "enum", "null"]
    if depth < 3:
        kinds += ["object", "array"]
    kind = rng.choice(kinds)
    if kind == "object":
        return random_schema(rng, depth)
    if kind == "array":
        low = rng.randint(0, 2)
        return {
            "type": "array",
            "items": _value(rng, depth + 1),
            "minItems": low,
            "maxItems": low + rng.randint(0, 2),
        }
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 6)}
    if kind == "integer":
        low = rng.randint(-100, 100)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 1000)}
    if kind == "number":
        return {"type": "number", "minimum": -10, "maximum": rng.randint(0, 100)}
    if kind == "enum":
        values: list[Any] = rng.sample(_WORDS, rng.randint(1, 3))
        if rng.random() < 0.5:
            values.append(rng.randint(0, 9))
        return {"enum": values}
    return {"type": kind}
