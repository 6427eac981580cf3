"""A forced tool call ("required" or a named function) as a structured-output constraint,
and the constrained reply read back as calls. vLLM's scheme, which needs no tag support in
the grammar engine: the reply is plain JSON, never the model's own call format.

    tool_choice    the reply is (JSON Schema)                            calls
    named f        f's parameters object                                 one call to f
    "required"     [{"name": <one of the tools>, "parameters": {...}}, ...]  one per item
                   (at least one item; at most one with parallel_tool_calls=false)

The JSON is compact (no optional whitespace): arguments are read by programs, and free
whitespace is where a weak model can loop until max_tokens.
"""

from __future__ import annotations

import json
from typing import Any

from core.structured import StructuredOutput
from router.frontdoor.tools.calls import ParsedCall, ToolRequest, ToolSpec

_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
"""OpenAI: "omitting parameters defines a function with an empty parameter list"."""


def _parameters(tool: ToolSpec) -> dict[str, Any]:
    return tool.parameters if tool.parameters is not None else _NO_PARAMETERS


def forced_call_schema(request: ToolRequest) -> dict[str, Any] | None:
    """The JSON Schema a forced call's reply must match; None when no call is forced."""
    if not request.is_forced:
        return None
    if request.choice == "named":
        (tool,) = [t for t in request.tools if t.name == request.function]
        return _parameters(tool)
    items = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.name]},
                "parameters": _parameters(t),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in request.tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not request.parallel:
        schema["maxItems"] = 1
    return schema


def forced_call_constraint(request: ToolRequest) -> StructuredOutput | None:
    schema = forced_call_schema(request)
    if schema is None:
        return None
    return StructuredOutput.json_schema(schema, "tools", disable_any_whitespace=True)


def read_forced_calls(request: ToolRequest, text: str) -> list[ParsedCall] | None:
    """The calls in a forced call's reply; None if it is not complete JSON (cut off by
    max_tokens)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if request.choice == "named":
        return [ParsedCall(str(request.function), json.dumps(value, ensure_ascii=False))]
    if not isinstance(value, list):
        return None
    return [
        ParsedCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False))
        for item in value
        if isinstance(item, dict) and "name" in item and "parameters" in item
    ]
