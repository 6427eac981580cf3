"""The gRPC front door's newer optional fields: a structured-output constraint, tools with a
forced call (unary and streamed), min_tokens and logit_bias; requests without them are the
old ones (`test_grpc.py`) and behave as before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import jsonschema
import pytest

from core.config import EngineConfig
from proto.baton.v1 import generate_pb2
from router.frontdoor.grpc.client import BatonClient, build_request
from tests.frontdoor.conftest import ADMIN_TOKEN
from tests.support.grpc_server import GRPCServerThread
from tests.support.local_backend import LocalBackend

SCHEMA = {
    "type": "object",
    "properties": {
        "zone": {"enum": ["utc", "cet"]},
        "hour": {"type": "integer", "minimum": 0, "maximum": 23},
    },
    "required": ["zone", "hour"],
    "additionalProperties": False,
}
CHAT = [{"role": "user", "content": "What time is it?"}]


@pytest.fixture(scope="module")
def backend(model_dir: Path) -> Iterator[LocalBackend]:
    """Two tools' JSON outgrows the shared backend's 256-token context (tiny tokenizer)."""
    config = EngineConfig(num_kv_blocks=256, max_model_len=1024, max_num_seqs=8, num_threads=1)
    b = LocalBackend(model_dir, config)
    yield b
    b.close()


@pytest.fixture(scope="module")
def tool_grpc_server(backend: LocalBackend) -> Iterator[GRPCServerThread]:
    s = GRPCServerThread(backend, None, admin_token=ADMIN_TOKEN).start()
    yield s
    s.stop()


@pytest.fixture()
def client(tool_grpc_server: GRPCServerThread) -> BatonClient:
    c = BatonClient(tool_grpc_server.target, admin_token=ADMIN_TOKEN)
    yield c
    c.close()


def tool_chat(choice: str, function: str = "") -> generate_pb2.GenerateRequest:
    msg = build_request(CHAT, max_tokens=120, seed=3)
    msg.chat.tools.add(name="get_time", description="The time.", parameters_json=json.dumps(SCHEMA))
    msg.chat.tools.add(name="get_date")
    msg.chat.tool_choice = choice
    msg.chat.tool_choice_function = function
    return msg


def test_structured_output_constrains_the_text(client: BatonClient) -> None:
    msg = build_request("Time as JSON:", max_tokens=100, seed=1)
    msg.sampling.structured_output.json_schema = json.dumps(SCHEMA)
    msg.sampling.structured_output.disable_any_whitespace = True
    reply = client._generate.GenerateUnary(msg, timeout=60)
    assert reply.finish_reason == generate_pb2.FINISH_REASON_STOP
    jsonschema.validate(json.loads(reply.text), SCHEMA)
    assert not reply.tool_calls and not reply.HasField("content")


def test_named_call_unary_and_required_streamed(client: BatonClient) -> None:
    for seed in range(5):
        msg = tool_chat("function", "get_time")
        msg.sampling.seed = seed
        reply = client._generate.GenerateUnary(msg, timeout=60)
        (call,) = reply.tool_calls
        assert call.name == "get_time" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), SCHEMA)
        assert reply.content == ""
    chunks = list(client._generate.Generate(tool_chat("required"), timeout=60))
    assert not any(c.tool_calls for c in chunks[:-1])
    calls = chunks[-1].tool_calls
    assert calls and all(c.name in ("get_time", "get_date") for c in calls)
    assert "".join(c.text for c in chunks).startswith("[")  # the raw text stays as it was


def test_tool_history_renders(client: BatonClient) -> None:
    msg = tool_chat("auto")
    msg.chat.messages.add(role="assistant", content="").tool_calls.add(
        id="call_1", name="get_time", arguments='{"zone": "utc", "hour": 3}'
    )
    msg.chat.messages.add(role="tool", content="03:00", tool_call_id="call_1")
    reply = client._generate.GenerateUnary(msg, timeout=60)
    assert reply.finished and reply.HasField("content")


def test_min_tokens_and_logit_bias(client: BatonClient, backend) -> None:  # type: ignore[no-untyped-def]
    forced = backend.tokenizer.encode(" relay", add_special_tokens=False)[0]
    msg = build_request("Batons are", max_tokens=5, temperature=0.0, min_tokens=5)
    msg.sampling.logit_bias[forced] = 100.0
    reply = client._generate.GenerateUnary(msg, timeout=60)
    assert list(reply.token_ids) == [forced] * 5


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda m: setattr(m.chat, "tool_choice", "sometimes"), "tool_choice"),
        (lambda m: setattr(m.chat, "tool_choice_function", "nope"), "tool_choice_function"),
        (lambda m: setattr(m.sampling.structured_output, "regex", "a+"), "structured_output"),
    ],
)
def test_bad_tool_requests_are_invalid_argument(client: BatonClient, edit, words: str) -> None:  # type: ignore[no-untyped-def]
    msg = tool_chat("function", "get_time")
    edit(msg)
    with pytest.raises(grpc.RpcError) as e:
        client._generate.GenerateUnary(msg, timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in e.value.details()
