"""Tenants at the doors: the header an operator names, else the API key's hash, else one
anonymous tenant (router/frontdoor/tenants.py); each request's priority and tenant reach the
backend from HTTP and gRPC; per-tenant series in /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx
import pytest

from core.errors import InvalidRequestError
from core.request import OutputDelta
from proto.baton.v1 import generate_pb2, generate_pb2_grpc
from router.frontdoor.backend import GenerateRequest
from router.frontdoor.http.app import create_app
from router.frontdoor.metrics import Metrics
from router.frontdoor.tenants import MAX_TENANT_CHARS, of_api_key, tenant_of
from tests.support.grpc_server import GRPCServerThread
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend


def test_the_named_header_wins_then_the_key_then_nobody() -> None:
    auth = ("Authorization", "Bearer k1")
    assert tenant_of([("X-Team", "search"), auth], "x-team") == "search"
    assert tenant_of([auth], "x-team") == of_api_key("k1") != ""
    assert tenant_of([auth], None) == of_api_key("k1")
    assert tenant_of([("x-team", "search")], None) == ""
    assert tenant_of([], "x-team") == ""


def test_an_overlong_tenant_name_is_refused_naming_the_header() -> None:
    with pytest.raises(InvalidRequestError, match="X-Team"):
        tenant_of([("x-team", "t" * (MAX_TENANT_CHARS + 1))], "X-Team")


class Recording:
    """A backend that records each request, then answers through a real engine."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.seen: list[GenerateRequest] = []
        self.model_name, self.max_model_len = inner.model_name, inner.max_model_len
        self.tokenizer = inner.tokenizer

    def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        self.seen.append(request)
        return self.inner.generate(request)

    def is_ready(self) -> bool:
        return True


@pytest.fixture(scope="module")
def doors(backend: LocalBackend) -> Iterator[tuple[Recording, Metrics, str, int]]:
    recording, metrics = Recording(backend), Metrics()
    app = create_app(recording, None, metrics=metrics, tenant_header="X-Team")
    http = HTTPServerThread(app).start()
    grpc_server = GRPCServerThread(
        recording, None, admin_token="a", metrics=metrics, tenant_header="X-Team"
    ).start()
    yield recording, metrics, http.url, grpc_server.port
    grpc_server.stop()
    http.stop()


def chat(url: str, headers: dict[str, str], **body: Any) -> httpx.Response:
    payload = {"model": "tiny-llama", "prompt": "Batons are", "max_tokens": 4, **body}
    return httpx.post(f"{url}/v1/completions", json=payload, headers=headers, timeout=60)


def test_priority_and_tenant_reach_the_backend_from_both_doors(doors) -> None:
    recording, metrics, url, grpc_port = doors
    assert chat(url, {"X-Team": "search"}, priority=-2).status_code == 200
    assert chat(url, {"Authorization": "Bearer k9"}).status_code == 200
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = generate_pb2_grpc.GenerateServiceStub(channel)
        msg = generate_pb2.GenerateRequest(
            text="Batons are", sampling=generate_pb2.SamplingParams(max_tokens=4), priority=3
        )
        list(stub.Generate(msg, metadata=[("x-team", "ads")], timeout=60))
    seen = [(r.priority, r.tenant) for r in recording.seen[-3:]]
    assert seen == [(-2, "search"), (0, of_api_key("k9")), (3, "ads")]
    body = metrics.exposition()[0].decode()
    for tenant in ("search", of_api_key("k9"), "ads"):
        assert f'baton:tenant_tokens_total{{kind="output",tenant="{tenant}"}} 4.0' in body
        assert f'baton:tenant_time_to_first_token_seconds_count{{tenant="{tenant}"}} 1.0' in body
