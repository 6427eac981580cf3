"""Chat messages and tools as a chat template takes them (transformers' conventions, which
HF templates are written against):

- `tools` is the list of `{"type": "function", "function": {...}}` (`ToolSpec.as_openai`);
- an assistant's `tool_calls[i].function.arguments` is a dict, not JSON text (vLLM does the
  same conversion: Qwen's and Llama's templates apply `tojson` to it);
- a tool message keeps `tool_call_id` (and `name`).

A template that never mentions `tools` would silently drop them, so the tools are then
written into a system message in the Hermes format (the default parser's); one that never
mentions `tool_calls` gets an assistant's calls written into its content in the same format,
so a conversation's history still shows the calls its tool messages answer.
"""

from __future__ import annotations

import json
from typing import Any

from router.frontdoor.tools.calls import ToolSpec

_FALLBACK_INTRO = (
    "You may call one or more functions to answer. Their signatures, one JSON object a line:\n"
    "<tools>\n{tools}\n</tools>\n"
    'To call one, reply with <tool_call>{{"name": <name>, "arguments": <object>}}</tool_call>.'
)


def template_source(tokenizer: Any, has_tools: bool) -> str:
    """The template text the tokenizer will render (empty if it has none)."""
    templates = getattr(tokenizer, "chat_template", None)
    if isinstance(templates, dict):
        key = "tool_use" if has_tools and "tool_use" in templates else "default"
        return str(templates.get(key, ""))
    return templates or ""


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # the template shows it as it came


def _call_text(call: dict[str, Any]) -> str:
    function = call["function"]
    body = {"name": function["name"], "arguments": function["arguments"]}
    return f"<tool_call>{json.dumps(body, ensure_ascii=False)}</tool_call>"


def template_messages(
    messages: list[dict[str, Any]], tools: list[ToolSpec] | None, source: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the template; `messages` are OpenAI-shaped dicts with
    `tool_calls[i].function.arguments` as JSON text."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": _arguments(c["function"]["arguments"]),
                    },
                }
                for c in calls
            ]
            message = {**message, "tool_calls": calls}
            if "tool_calls" not in source:
                text = "".join(_call_text(c) for c in calls)
                message["content"] = (message.get("content") or "") + text
        out.append(message)
    if not tools:
        return out, None
    openai_tools = [t.as_openai() for t in tools]
    if "tools" in source:
        return out, openai_tools
    lines = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in openai_tools)
    intro = _FALLBACK_INTRO.format(tools=lines)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{intro}".lstrip()}
    else:
        out.insert(0, {"role": "system", "content": intro})
    return out, None
