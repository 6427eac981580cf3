"""Tool calling through the HTTP front door with the official `openai` client and the real
tiny engine (random weights): forced calls ("required", a named function) are enforced by the
grammar, so they parse every time; streamed calls equal whole ones; a conversation with
calls and tool results goes through the template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from core.config import EngineConfig
from router.frontdoor.http.app import create_app
from tests.frontdoor.conftest import API_KEY
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

CHAT = [{"role": "user", "content": "What is the weather in Oslo?"}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["utc", "cet"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"{name}.", "parameters": s}}
    for name, s in SCHEMAS.items()
]
NUM_REQUESTS = 20


@pytest.fixture(scope="module")
def tool_server(model_dir: Path) -> Iterator[HTTPServerThread]:
    """The shared server's 256-token context is too small for two tools' JSON in the tiny
    tokenizer (about 1.3 characters a token)."""
    config = EngineConfig(num_kv_blocks=256, max_model_len=1024, max_num_seqs=8, num_threads=1)
    backend = LocalBackend(model_dir, config)
    s = HTTPServerThread(create_app(backend, None, api_key=API_KEY, admin_token="t")).start()
    yield s
    s.stop()
    backend.close()


@pytest.fixture()
def server(tool_server: HTTPServerThread) -> HTTPServerThread:
    return tool_server


@pytest.fixture()
def client(tool_server: HTTPServerThread) -> openai.OpenAI:
    url = f"{tool_server.url}/v1"
    return openai.OpenAI(base_url=url, api_key=API_KEY, timeout=60, max_retries=0)


def create(client: openai.OpenAI, **kwargs: Any) -> Any:
    args: dict[str, Any] = {"model": "tiny-llama", "messages": CHAT, "tools": TOOLS,
                            "max_tokens": 160, **kwargs}  # fmt: skip
    return client.chat.completions.create(**args)


def check_calls(message: Any, names: set[str]) -> None:
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("parallel", [False, True])
def test_required_calls_parse_every_time(client: openai.OpenAI, parallel: bool) -> None:
    for seed in range(NUM_REQUESTS // 2):
        r = create(client, tool_choice="required", seed=seed, parallel_tool_calls=parallel)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        check_calls(choice.message, set(SCHEMAS))
        if not parallel:
            assert len(choice.message.tool_calls) == 1


def test_named_calls_parse_every_time(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(NUM_REQUESTS):
        r = create(client, tool_choice=named, seed=seed)
        assert r.choices[0].finish_reason == "tool_calls"
        check_calls(r.choices[0].message, {"get_time"})
        assert len(r.choices[0].message.tool_calls) == 1


def test_streamed_calls_equal_the_whole_reply(client: openai.OpenAI) -> None:
    whole = create(client, tool_choice="required", seed=3, n=2)
    stream = create(client, tool_choice="required", seed=3, n=2, stream=True)
    calls: dict[int, dict[int, dict[str, str]]] = {0: {}, 1: {}}
    reasons = {}
    for chunk in stream:
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                call = calls[c.index].setdefault(d.index, {"name": "", "arguments": ""})
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    assert reasons == {0: "tool_calls", 1: "tool_calls"}
    for choice in whole.choices:
        expected = [(t.function.name, t.function.arguments) for t in choice.message.tool_calls]
        got = [(c["name"], c["arguments"]) for _, c in sorted(calls[choice.index].items())]
        assert got == expected


def test_auto_and_none_reply_with_content(client: openai.OpenAI) -> None:
    for choice in ("auto", "none"):
        r = create(client, tool_choice=choice, max_tokens=12, seed=1)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert isinstance(r.choices[0].message.content, str)


def test_tool_results_round_trip(client: openai.OpenAI) -> None:
    first = create(client, tool_choice="required", seed=5, parallel_tool_calls=False)
    message = first.choices[0].message
    (call,) = message.tool_calls
    history = [
        *CHAT,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 7}'},
    ]
    r = create(client, messages=history, max_tokens=8, seed=1)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}},
         "tool_choice"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
         "tools.0.function.name"),
    ],
)  # fmt: skip
def test_bad_tool_requests_are_400(server: HTTPServerThread, body: dict, param: str) -> None:
    full = {"model": "tiny-llama", "messages": CHAT, "tools": TOOLS, **body}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=full, timeout=60,
                   headers={"Authorization": f"Bearer {API_KEY}"})  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
