"""`baton.v1` chat tools and structured-output constraints into the front doors' own types
(`router.frontdoor.tools`, `core.structured`), and parsed calls back into messages. The same
rules as the HTTP door's (`http/chat_tools.py`), with InvalidRequestError for bad input."""

from __future__ import annotations

import json
from typing import Any

from core.errors import InvalidRequestError
from core.structured import StructuredKind, StructuredOutput
from proto.baton.v1 import generate_pb2
from router.frontdoor.tools.calls import ParsedCall, ToolRequest, ToolSpec

_CHOICES = ("", "none", "auto", "required", "function")


def structured_output(msg: generate_pb2.StructuredOutput) -> StructuredOutput | None:
    kind = msg.WhichOneof("kind")
    compact = msg.disable_any_whitespace
    field = f"sampling.structured_output.{kind}"
    try:
        if kind is None:
            return None
        if kind == "json_schema":
            return StructuredOutput.json_schema(msg.json_schema, field, compact)
        if kind == "json_object":
            if not msg.json_object:
                raise ValueError(f"{field}: must be true if set")
            return StructuredOutput(StructuredKind.JSON_OBJECT, "", (), compact, field)
        if kind == "choice":
            return StructuredOutput(StructuredKind.CHOICE, choices=tuple(msg.choice.choices),
                                    field=field)  # fmt: skip
        spec = msg.regex if kind == "regex" else msg.grammar
        return StructuredOutput(StructuredKind(kind), spec, field=field)
    except ValueError as e:
        raise InvalidRequestError(str(e)) from e


def _parameters(tool: generate_pb2.Tool, i: int) -> dict[str, Any] | None:
    if not tool.parameters_json:
        return None  # no parameters
    try:
        schema = json.loads(tool.parameters_json)
    except ValueError as e:
        raise InvalidRequestError(f"chat.tools[{i}].parameters_json: not JSON ({e})") from e
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"chat.tools[{i}].parameters_json: must be a JSON object")
    return schema


def tool_request(chat: generate_pb2.Chat) -> ToolRequest | None:
    choice = chat.tool_choice
    if choice not in _CHOICES:
        raise InvalidRequestError(f"chat.tool_choice: one of {', '.join(_CHOICES[1:])}")
    if not chat.tools:
        if choice not in ("", "none"):
            raise InvalidRequestError("chat.tool_choice: a tool choice needs tools")
        return None
    specs = tuple(
        ToolSpec(t.name, t.description or None, _parameters(t, i)) for i, t in enumerate(chat.tools)
    )
    names = [t.name for t in specs]
    if not all(names) or len(set(names)) != len(names):
        raise InvalidRequestError("chat.tools: every tool needs a name, and names are unique")
    parallel = chat.parallel_tool_calls if chat.HasField("parallel_tool_calls") else True
    if choice == "function":
        if chat.tool_choice_function not in names:
            raise InvalidRequestError(
                f"chat.tool_choice_function: no tool is named {chat.tool_choice_function!r}"
            )
        return ToolRequest(specs, "named", chat.tool_choice_function, parallel)
    return ToolRequest(specs, choice or "auto", None, parallel)


def chat_messages(chat: generate_pb2.Chat) -> list[dict[str, Any]]:
    """OpenAI-shaped message dicts (`router.frontdoor.tools.prompt` takes these)."""
    out = []
    for m in chat.messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.name:
            message["name"] = m.name
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ]  # fmt: skip
        out.append(message)
    return out


def tool_calls(calls: list[ParsedCall]) -> list[generate_pb2.ToolCall]:
    return [generate_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls]
