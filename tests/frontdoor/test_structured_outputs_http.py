"""Structured outputs through the HTTP front door (real tiny engine, real xgrammar):
OpenAI's `response_format` with the official client, vLLM's `structured_outputs` and the
older `guided_*` fields, with `n`, seeds and streaming; a constraint that cannot compile,
or a malformed or doubled one, is a 400 naming the field."""

from __future__ import annotations

import json
import random
import re

import httpx
import jsonschema
import openai
import pytest

from tests.frontdoor.conftest import API_KEY
from tests.support.http_server import HTTPServerThread
from tests.support.json_schemas import random_schema

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = [{"role": "user", "content": "Describe a relay runner as JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "leg": {"type": "integer", "minimum": 1, "maximum": 4},
        "fast": {"type": "boolean"},
    },
    "required": ["name", "leg"],
}
COMPACT = {"structured_outputs": {"disable_any_whitespace": True}}


@pytest.fixture()
def client(server: HTTPServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=60, max_retries=0)


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "runner", "schema": schema}}


def post(server: HTTPServerThread, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", headers=AUTH, json=body, timeout=60)


def test_chat_json_schema_with_n_and_a_seed(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=CHAT,  # type: ignore[arg-type]
        response_format=response_format(SCHEMA),  # type: ignore[arg-type]
        n=4,
        seed=5,
        max_tokens=150,
        extra_body=COMPACT,
    )
    assert len(r.choices) == 4
    texts = set()
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
        texts.add(choice.message.content)
    assert len(texts) > 1, "each choice draws its own seed"


def test_random_schemas_over_completions(client: openai.OpenAI) -> None:
    rng = random.Random(7)
    model = client.models.list().data[0].id
    for i in range(6):
        schema = random_schema(rng)
        r = client.completions.create(
            model=model,
            prompt="JSON:",
            max_tokens=180,
            seed=i,
            extra_body={"response_format": response_format(schema), **COMPACT},
        )
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].text), schema)


def test_free_whitespace_outputs_validate_when_they_end(client: openai.OpenAI) -> None:
    """vLLM's default (any whitespace between tokens): a random-weight model may pile up
    whitespace to max_tokens, but what ends is valid."""
    r = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=CHAT,  # type: ignore[arg-type]
        response_format=response_format(SCHEMA),  # type: ignore[arg-type]
        n=6,
        seed=0,
        max_tokens=150,
    )
    ended = [c for c in r.choices if c.finish_reason == "stop"]
    for choice in ended:
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
    assert ended


def test_streamed_json_equals_the_whole_reply(client: openai.OpenAI) -> None:
    kwargs = dict(
        model=client.models.list().data[0].id,
        messages=CHAT,
        response_format=response_format(SCHEMA),
        seed=3,
        max_tokens=150,
        extra_body=COMPACT,
    )
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(stream=True, **kwargs)  # type: ignore[call-overload]
        if chunk.choices
    )
    assert streamed == whole.choices[0].message.content
    jsonschema.validate(json.loads(streamed), SCHEMA)


def test_json_object(server: HTTPServerThread) -> None:
    body = {
        "model": "tiny-llama",
        "prompt": "{",
        "max_tokens": 200,
        "n": 8,
        "seed": 1,
        "response_format": {"type": "json_object"},
        **COMPACT,
    }
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    ended = [c for c in choices if c["finish_reason"] == "stop"]
    assert ended
    for c in ended:
        assert isinstance(json.loads(c["text"]), dict)


@pytest.mark.parametrize(
    ("fields", "check"),
    [
        ({"structured_outputs": {"regex": r"[a-z]{3}-\d{3}"}}, r"[a-z]{3}-\d{3}"),
        ({"guided_regex": r"(yes|no)\."}, r"(yes|no)\."),
        ({"structured_outputs": {"choice": ["left", "right"]}}, r"left|right"),
        ({"guided_choice": ["up", "down"]}, r"up|down"),
        ({"structured_outputs": {"grammar": 'root ::= "x" [0-9] [0-9]?'}}, r"x[0-9]{1,2}"),
        ({"guided_grammar": 'root ::= ("ab"){1,3} "!"'}, r"(ab){1,3}!"),
        ({"guided_json": {"enum": ["on", "off"]}}, r'"on"|"off"'),
        ({"structured_outputs": {"json": '{"type": "boolean"}'}}, r"true|false"),
        ({"response_format": {"type": "text"}, "guided_regex": "z+"}, r"z+"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_vllm_fields(server: HTTPServerThread, path: str, fields: dict, check: str) -> None:
    body = {"model": "tiny-llama", "max_tokens": 40, "n": 3, "seed": 2, **fields}
    body.update({"prompt": "Go:"} if path == "/v1/completions" else {"messages": CHAT})
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    for c in r.json()["choices"]:
        text = c["text"] if "text" in c else c["message"]["content"]
        assert c["finish_reason"] == "stop" and re.fullmatch(check, text), text


@pytest.mark.parametrize(
    ("fields", "named", "reason"),
    [
        ({"response_format": response_format({"type": "strin"})},
         "response_format.json_schema.schema", "strin"),
        ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex", "parenthesis"),
        ({"guided_grammar": "root ::= "}, "guided_grammar", "EBNF"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format.json_schema.schema", "required"),
        ({"guided_regex": "a", "structured_outputs": {"choice": ["b"]}},
         "structured_outputs.choice, guided_regex", "one structured-output constraint"),
        ({"response_format": {"type": "json_object"}, "guided_json": {}},
         "response_format, guided_json", "one structured-output constraint"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "choices"),
        ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object",
         "must be true"),
        ({"structured_outputs": {"disable_any_whitespace": True}}, "structured_outputs",
         "set one of"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag",
         "not supported"),
        ({"response_format": {"type": "structural_tag"}}, "response_format", "not supported"),
        ({"structured_outputs": {"regx": "a"}}, "Unrecognized request argument supplied",
         "structured_outputs.regx"),
        ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "not supported"),
    ],
)  # fmt: skip
def test_bad_constraints_are_400_naming_the_field(
    server: HTTPServerThread, fields: dict, named: str, reason: str
) -> None:
    body = {"model": "tiny-llama", "messages": CHAT, "max_tokens": 8, **fields}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith(named) and reason in message, message
