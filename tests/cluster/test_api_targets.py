"""The API's promises where they are hardest to keep: through the real cluster, prefill and
decode on different workers, with the official `openai` client and gRPC. 50 random JSON
schemas from a random-weight model (garbage unless the grammar holds) all validate; forced
tool calls always parse; prompt logprobs computed on the prefill worker equal the oracle's;
a non-streaming client that hangs up frees its KV on both workers; X-Request-Id names it."""

from __future__ import annotations

import json
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest

from proto.baton.v1 import generate_pb2
from router.frontdoor.grpc.client import BatonClient, build_request
from tests import oracle
from tests.cluster.helpers import worker_loads
from tests.frontdoor.test_tool_calls_http import CHAT, SCHEMAS, TOOLS
from tests.support.json_schemas import random_schema

pytestmark = pytest.mark.slow
NUM_SCHEMAS = 50
CONCURRENCY = 8


def _schemas() -> list[dict[str, Any]]:
    rng = random.Random(50)
    return [random_schema(rng) for _ in range(NUM_SCHEMAS)]


def test_fifty_random_schemas_validate_over_http_and_grpc(served) -> None:  # type: ignore[no-untyped-def]
    from openai import OpenAI

    cluster, http, grpc, _ = served
    client = OpenAI(base_url=f"{http.url}/v1", api_key="unused", timeout=120, max_retries=0)
    schemas = _schemas()

    def over_http(i: int) -> tuple[str | None, str]:
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schemas[i],
                                                     "strict": True}}  # fmt: skip
        r = client.chat.completions.create(
            model=cluster.backend.model_name,
            messages=[{"role": "user", "content": f"Record {i} as JSON."}],
            response_format=fmt,  # type: ignore[arg-type]
            max_tokens=400,
            temperature=1.0,
            seed=i,
            extra_body={"structured_outputs": {"disable_any_whitespace": True}},
        )
        return r.choices[0].finish_reason, r.choices[0].message.content or ""

    def over_grpc(i: int) -> tuple[int, str]:
        msg = build_request(f"Record {i} as JSON:", max_tokens=400, temperature=1.0, seed=i)
        msg.sampling.structured_output.json_schema = json.dumps(schemas[i])
        msg.sampling.structured_output.disable_any_whitespace = True
        with BatonClient(grpc.target) as c:
            reply = c._generate.GenerateUnary(msg, timeout=120)
        return reply.finish_reason, reply.text

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        http_replies = list(pool.map(over_http, range(NUM_SCHEMAS)))
        grpc_replies = list(pool.map(over_grpc, range(NUM_SCHEMAS)))
    for schema, (reason, text) in zip(schemas, http_replies, strict=True):
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), schema)
    for schema, (reason, text) in zip(schemas, grpc_replies, strict=True):
        assert reason == generate_pb2.FINISH_REASON_STOP, text
        jsonschema.validate(json.loads(text), schema)
    assert cluster.backend.transfers.num_transfers >= 2 * NUM_SCHEMAS


def test_required_tool_calls_parse_every_time_over_http_and_grpc(served) -> None:  # type: ignore[no-untyped-def]
    from openai import OpenAI

    cluster, http, grpc, _ = served
    client = OpenAI(base_url=f"{http.url}/v1", api_key="unused", timeout=120, max_retries=0)

    def check(name: str, arguments: str) -> None:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])

    for seed in range(10):
        r = client.chat.completions.create(
            model=cluster.backend.model_name, messages=CHAT, tools=TOOLS,  # type: ignore[arg-type]
            tool_choice="required", seed=seed, max_tokens=160,
        )  # fmt: skip
        assert r.choices[0].finish_reason == "tool_calls"
        for call in r.choices[0].message.tool_calls or []:
            check(call.function.name, call.function.arguments)
        assert r.choices[0].message.tool_calls
    with BatonClient(grpc.target) as c:
        for seed in range(10):
            msg = build_request(CHAT, max_tokens=160, seed=seed)
            for name, schema in SCHEMAS.items():
                msg.chat.tools.add(name=name, parameters_json=json.dumps(schema))
            msg.chat.tool_choice = "required"
            reply = c._generate.GenerateUnary(msg, timeout=120)
            assert reply.tool_calls
            for call in reply.tool_calls:
                check(call.name, call.arguments)


def test_prompt_logprobs_come_from_the_prefill_worker(served) -> None:  # type: ignore[no-untyped-def]
    cluster, http, _, model_dir = served
    prompt = random.Random(3).sample(range(3, 1000), 40)
    before = cluster.backend.transfers.num_transfers
    body = {"model": cluster.backend.model_name, "prompt": prompt, "max_tokens": 2,
            "temperature": 0, "prompt_logprobs": 1}  # fmt: skip
    r = httpx.post(f"{http.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert cluster.backend.transfers.num_transfers == before + 1  # prefilled on P
    got = r.json()["choices"][0]["prompt_logprobs"]
    expected = oracle.hf_prompt_logprobs(str(model_dir), tuple(prompt))
    assert got[0] is None and len(got) == len(prompt)
    for position, entry in enumerate(got[1:], start=1):
        value = entry[str(prompt[position])]["logprob"]
        assert value == pytest.approx(expected[position - 1, prompt[position]].item(), abs=1e-4)


def _loads(cluster) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """role -> load (one worker per role here)."""
    return {cluster.membership.workers[w].role: load for w, load in worker_loads(cluster).items()}


def test_a_hung_up_non_streaming_request_frees_kv_on_both_workers(served) -> None:  # type: ignore[no-untyped-def]
    cluster, http, _, _ = served
    before = {role: load.num_free_blocks for role, load in _loads(cluster).items()}
    body = json.dumps({"model": cluster.backend.model_name, "prompt": "Hi", "max_tokens": 3000,
                       "ignore_eos": True}).encode()  # fmt: skip
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"X-Request-Id: hangs-up\r\nContent-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection((http.host, http.port), timeout=10) as sock:
        sock.sendall(head + body)
        deadline = time.monotonic() + 60
        while _loads(cluster)["decode"].num_running == 0:
            assert time.monotonic() < deadline, "the request never reached the decode worker"
            time.sleep(0.05)
    deadline = time.monotonic() + 30
    while (loads := _loads(cluster)) and any(
        load.num_running or load.num_free_blocks != before[role] for role, load in loads.items()
    ):
        assert time.monotonic() < deadline, f"KV still held after the client left: {loads}"
        time.sleep(0.05)
    # The front door records the outcome once the aborted stream has closed.
    deadline = time.monotonic() + 15
    while 'baton:requests_total{outcome="cancelled"} 1.0' not in (
        metrics := httpx.get(f"{http.url}/metrics", timeout=10).text
    ):
        outcomes = [line for line in metrics.splitlines() if "requests_total{" in line]
        assert time.monotonic() < deadline, outcomes
        time.sleep(0.05)


def test_x_request_id_reaches_the_cluster_and_duplicates_do_not_collide(served) -> None:  # type: ignore[no-untyped-def]
    cluster, http, _, _ = served
    body = {"model": cluster.backend.model_name, "prompt": "Hi", "max_tokens": 20,
            "ignore_eos": True}  # fmt: skip

    def send(_: int) -> httpx.Response:
        headers = {"X-Request-Id": "same-id"}
        return httpx.post(f"{http.url}/v1/completions", json=body, headers=headers, timeout=60)

    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(send, range(4)))
    for r in replies:
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "same-id" and r.json()["id"] == "cmpl-same-id"
        assert r.json()["usage"]["completion_tokens"] == 20
