"""Reading a model folder's JSON files (config, generation config, tokenizer config, the
safetensors index), with errors that name the file. Torch-free: the tokenizer uses it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_object(
    path: Path, error: type[ValueError], raw: bytes | None = None
) -> dict[str, Any]:
    """The JSON object in `path` (`raw`: its bytes, when the caller has read them already).
    Raises `error` naming the file if it is not valid JSON or not an object at the top."""
    try:
        data = json.loads(path.read_bytes() if raw is None else raw)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object at the top level")
    return data


def read_optional_json_object(path: Path, error: type[ValueError]) -> dict[str, Any]:
    """As `read_json_object`, but {} when the folder has no such file."""
    return read_json_object(path, error) if path.is_file() else {}
