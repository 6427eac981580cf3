"""Tool calls read from model text (the three parser formats), streamed and whole; the forced
call's schema; tools and calls written into a template that does not know them."""

from __future__ import annotations

import json

import pytest

from engine.chat_template import compile_template, render
from engine.tiny_model import CHAT_TEMPLATE
from router.frontdoor.tools.calls import ToolRequest, ToolSpec
from router.frontdoor.tools.constraint import forced_call_schema, read_forced_calls
from router.frontdoor.tools.parsers import get_parser
from router.frontdoor.tools.prompt import template_messages
from router.frontdoor.tools.reader import ToolCallReader

WEATHER = ToolSpec("get_weather", "Weather.", {"type": "object", "properties": {}})
AUTO = ToolRequest((WEATHER,), "auto")

REPLIES = {
    "hermes": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    '\n</tool_call>\n<tool_call>{"name": "get_weather", "arguments": {"city": "Bergen"}}',
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
    '{"name": "get_weather", "parameters": {"city": "Bergen"}}',
    "mistral": 'Let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}},'
    ' {"name": "get_weather", "arguments": "{\\"city\\": \\"Bergen\\"}"}]',
}
CONTENT = {"hermes": "Let me check.", "llama3_json": None, "mistral": "Let me check."}


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_parsers_read_two_calls(name: str) -> None:
    content, calls = get_parser(name).parse(REPLIES[name])
    assert content == CONTENT[name]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_weather", {"city": "Bergen"}),
    ]
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_streamed_reply_shows_only_content_then_the_calls(name: str) -> None:
    text = REPLIES[name]
    whole = ToolCallReader(AUTO, get_parser(name)).content_of(text)
    reader = ToolCallReader(AUTO, get_parser(name))
    shown = "".join(reader.feed(text[i : i + 2]) for i in range(0, len(text), 2))
    rest, calls = reader.finish()
    assert (shown + rest).strip() == (whole[0] or "")
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole[1]]


@pytest.mark.parametrize(
    ("name", "text"),
    [("hermes", "<tool_call>{not json}</tool_call>"), ("hermes", "plain <b>text</b>"),
     ("llama3_json", '{"city": "Oslo"}'), ("mistral", "[TOOL_CALLS] oops")],
)  # fmt: skip
def test_unparsable_calls_are_content(name: str, text: str) -> None:
    content, calls = ToolCallReader(AUTO, get_parser(name)).content_of(text)
    assert content == text and calls == []


def test_a_marker_being_written_is_held_back() -> None:
    reader = ToolCallReader(AUTO, get_parser("hermes"))
    assert reader.feed("Hi <tool_") == "Hi "
    assert reader.feed("tip>") == "<tool_tip>"


def test_no_parallel_calls_keeps_the_first() -> None:
    one = ToolRequest((WEATHER,), "auto", parallel=False)
    _, calls = ToolCallReader(one, get_parser("hermes")).content_of(REPLIES["hermes"])
    assert len(calls) == 1


def test_forced_schemas_and_replies() -> None:
    time_tool = ToolSpec("get_time", None, {"type": "object", "properties": {"z": {"enum": ["a"]}}})
    required = ToolRequest((WEATHER, time_tool), "required", parallel=False)
    schema = forced_call_schema(required)
    assert schema is not None and schema["maxItems"] == 1
    assert [i["properties"]["name"]["enum"] for i in schema["items"]["anyOf"]] == [
        ["get_weather"],
        ["get_time"],
    ]
    calls = read_forced_calls(required, '[{"name":"get_time","parameters":{"z":"a"}}]')
    assert calls is not None and [(c.name, c.arguments) for c in calls] == [
        ("get_time", '{"z": "a"}')
    ]
    named = ToolRequest((WEATHER, time_tool), "named", "get_time")
    assert forced_call_schema(named) == time_tool.parameters
    assert read_forced_calls(named, '{"z":') is None  # cut off by max_tokens
    assert forced_call_schema(AUTO) is None


def test_template_without_tool_support_gets_them_as_text() -> None:
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "7 degrees"},
    ]  # fmt: skip
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    out, tools = template_messages(messages, [WEATHER], plain)
    assert tools is None
    assert out[0]["role"] == "system" and '"name": "get_weather"' in out[0]["content"]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}' in out[2]["content"]
    text = render(compile_template(plain), out, add_generation_prompt=False, tools=None,
                  documents=None, variables={})  # fmt: skip
    assert "tool: 7 degrees" in text and "<tools>" in text
    # The tiny model's template shows tools itself: they are passed as tools; its calls are
    # written as text (it never mentions tool_calls), arguments as a dict for real templates.
    out, tools = template_messages(messages, [WEATHER], CHAT_TEMPLATE)
    assert tools == [WEATHER.as_openai()] and out[0]["role"] == "user"
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}


def test_parser_by_model_family_and_the_serve_flags() -> None:
    from router.cli.main import build_parser
    from router.frontdoor.tools.parsers import parser_for_model_type

    assert parser_for_model_type("qwen3") == "hermes"
    assert parser_for_model_type("llama") == "llama3_json"
    assert parser_for_model_type("mixtral") == "mistral"
    assert parser_for_model_type(None) == "hermes"
    args = build_parser().parse_args(
        ["serve", "--tool-call-parser", "mistral", "--reasoning-parser", "qwen3"]
    )
    assert (args.tool_call_parser, args.reasoning_parser) == ("mistral", "qwen3")
    assert build_parser().parse_args(["serve"]).tool_call_parser is None
