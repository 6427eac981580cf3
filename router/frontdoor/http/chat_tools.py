"""A chat request's `tools`, `tool_choice` and `parallel_tool_calls` checked and read into a
`ToolRequest`, and the prompt and constraint they make (`router.frontdoor.tools`)."""

from __future__ import annotations

from typing import Any

from core.structured import StructuredOutput
from router.frontdoor.http.errors import APIError
from router.frontdoor.http.protocol import ChatCompletionRequest, ChatMessage
from router.frontdoor.http.tool_models import NamedToolChoice
from router.frontdoor.requests import TokenizerLike
from router.frontdoor.tools.calls import ToolRequest, ToolSpec
from router.frontdoor.tools.constraint import forced_call_constraint
from router.frontdoor.tools.prompt import template_messages, template_source


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", "invalid_value", param)


def tool_request(body: ChatCompletionRequest) -> ToolRequest | None:
    """None: the request has no tools (and asks for no call)."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise _bad("tool_choice", "a tool choice needs tools")
        return None
    specs = tuple(
        ToolSpec(t.function.name, t.function.description, t.function.parameters) for t in body.tools
    )
    names = [t.name for t in specs]
    if len(set(names)) != len(names):
        raise _bad("tools", "function names must be unique")
    parallel = body.parallel_tool_calls is not False
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise _bad("tool_choice", f"no tool is named {choice.function.name!r}")
        return ToolRequest(specs, "named", choice.function.name, parallel)
    return ToolRequest(specs, choice or "auto", None, parallel)


def tool_constraint(
    body: ChatCompletionRequest, tools: ToolRequest | None
) -> StructuredOutput | None:
    """The forced call's constraint; a request that also asks for another constraint
    (response_format, guided_*) is refused: the reply cannot be both."""
    constraint = forced_call_constraint(tools) if tools is not None else None
    if constraint is not None and body.structured_output() is not None:
        raise _bad("tool_choice", "a forced tool call cannot be combined with response_format "
                   "or another structured-output constraint")  # fmt: skip
    return constraint


def chat_inputs(
    chat: list[ChatMessage], tools: ToolRequest | None, tokenizer: TokenizerLike
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the chat template."""
    messages = [
        {"role": m.role, "content": m.text()}
        | ({"name": m.name} if m.name is not None else {})
        | ({"tool_call_id": m.tool_call_id} if m.tool_call_id is not None else {})
        | ({"reasoning_content": m.reasoning_content} if m.reasoning_content is not None else {})
        | ({"tool_calls": [c.model_dump() for c in m.tool_calls]} if m.tool_calls else {})
        for m in chat
    ]
    shown = list(tools.tools) if tools is not None and tools.renders_tools else None
    return template_messages(messages, shown, template_source(tokenizer, shown is not None))
