"""Errors in OpenAI's shape with the right status; health, API keys and metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from core.errors import OverloadedError
from core.request import RequestOutput
from router.frontdoor.backend import GenerateRequest
from router.frontdoor.http.app import create_app
from tests.frontdoor.conftest import API_KEY, MAX_MODEL_LEN, engine_usage, wait_until_idle
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def post(server: HTTPServerThread, path: str, **kwargs: object) -> httpx.Response:
    headers = {**AUTH, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return httpx.post(f"{server.url}{path}", headers=headers, timeout=30, **kwargs)  # type: ignore[arg-type]


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    return error


def test_malformed_json_is_400(server: HTTPServerThread) -> None:
    r = post(
        server,
        "/v1/chat/completions",
        content=b'{"model": ',
        headers={"Content-Type": "application/json"},
    )
    assert "JSON" in assert_error(r, 400)["message"]


def test_unknown_model_is_404(server: HTTPServerThread) -> None:
    r = post(server, "/v1/completions", json={"model": "nope", "prompt": "hi"})
    assert assert_error(r, 404, "model_not_found")["param"] == "model"


def test_prompt_longer_than_context_is_400(server: HTTPServerThread, backend: LocalBackend) -> None:
    long_prompt = list(range(5, 5 + MAX_MODEL_LEN))
    r = post(server, "/v1/completions", json={"model": backend.model_name, "prompt": long_prompt})
    assert "context" in assert_error(r, 400)["message"]
    r = post(
        server,
        "/v1/completions",
        json={"model": backend.model_name, "prompt": "hi", "max_tokens": MAX_MODEL_LEN},
    )
    assert "max_tokens" in assert_error(r, 400)["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1),
        ("top_p", 0),
        ("n", 0),
        ("max_tokens", 0),
        ("top_k", -5),
        ("presence_penalty", 3),
        ("logprobs", 50),
        ("stop", [""]),
    ],
)
def test_bad_values_are_400(
    server: HTTPServerThread, backend: LocalBackend, field: str, value: object
) -> None:
    r = post(
        server, "/v1/completions", json={"model": backend.model_name, "prompt": "hi", field: value}
    )
    error = assert_error(r, 400)
    assert field in error["message"] or error["param"] == field


def test_token_outside_vocab_and_bad_messages(
    server: HTTPServerThread, backend: LocalBackend
) -> None:
    r = post(server, "/v1/completions", json={"model": backend.model_name, "prompt": [10**6]})
    assert "vocabulary" in assert_error(r, 400)["message"]
    r = post(server, "/v1/chat/completions", json={"model": backend.model_name, "messages": []})
    assert_error(r, 400)
    r = post(
        server,
        "/v1/chat/completions",
        json={
            "model": backend.model_name,
            "messages": [{"role": "user", "content": "x"}],
            "top_logprobs": 2,
        },
    )
    assert_error(r, 400)


def test_api_key_is_required(server: HTTPServerThread, backend: LocalBackend) -> None:
    body = {"model": backend.model_name, "prompt": "hi"}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=10)
    assert_error(r, 401, "invalid_api_key")
    r = httpx.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer wrong"})
    assert_error(r, 401)


def test_deadline_is_504_and_frees_blocks(server: HTTPServerThread, backend: LocalBackend) -> None:
    r = post(
        server,
        "/v1/completions",
        json={
            "model": backend.model_name,
            "prompt": "hi",
            "max_tokens": 200,
            "ignore_eos": True,
            "timeout": 0.01,
        },
    )
    assert_error(r, 504, "deadline_exceeded")
    used = backend.engine.submit(lambda e: (len(e.requests), e.kv.pool.num_used_blocks))
    assert used.result(10) == (0, 0)


class _Overloaded:
    """A cluster with no capacity left (the tiny engine never refuses work itself)."""

    model_name = "busy"
    max_model_len = 64

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer
        self.ready = True

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        raise OverloadedError("all decode workers are full", retry_after_s=2.5)
        yield  # pragma: no cover - makes this an async generator

    async def abort(self, request_id: str) -> None:
        return None

    def is_ready(self) -> bool:
        return self.ready


@pytest.fixture()
def busy_server(backend: LocalBackend) -> Iterator[tuple[HTTPServerThread, _Overloaded]]:
    busy = _Overloaded(backend.tokenizer)
    s = HTTPServerThread(create_app(busy, None, admin_token="x")).start()
    yield s, busy
    s.stop()


def test_overloaded_is_429_with_retry_after(
    busy_server: tuple[HTTPServerThread, _Overloaded],
) -> None:
    s, busy = busy_server
    for stream in (False, True):
        r = httpx.post(
            f"{s.url}/v1/completions",
            timeout=10,
            json={"model": "busy", "prompt": "hi", "stream": stream},
        )
        assert_error(r, 429, "overloaded")
        assert r.headers["Retry-After"] == "3"
    assert httpx.get(f"{s.url}/health").status_code == 200
    busy.ready = False
    assert httpx.get(f"{s.url}/health").status_code == 503


def test_metrics_after_requests(server: HTTPServerThread, backend: LocalBackend) -> None:
    post(
        server,
        "/v1/completions",
        json={"model": backend.model_name, "prompt": "hi", "max_tokens": 4},
    ).raise_for_status()
    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        "baton:time_to_first_token_seconds_bucket",
        "baton:time_per_output_token_seconds_count",
        "baton:e2e_request_latency_seconds_sum",
        "baton:request_queue_time_seconds_count",
        'baton:requests_total{outcome="success"}',
        'baton:pool_size{pool="decode"}',
        'baton:num_requests_running{worker="prefill-0"}',
        "baton:kv_cache_usage_perc",
        "baton:prefix_cache_hit_rate",
    ):
        assert name in text, name
    success = next(
        line
        for line in text.splitlines()
        if line.startswith('baton:requests_total{outcome="success"}')
    )
    assert float(success.split()[-1]) >= 1


def test_client_disconnect_mid_stream_frees_blocks(
    server: HTTPServerThread, backend: LocalBackend
) -> None:
    body = {
        "model": backend.model_name,
        "prompt": "go",
        "max_tokens": 200,
        "n": 2,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=30
    ) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        events = [line for line in (next(lines) for _ in range(8)) if line]
        assert all(e.startswith("data: {") for e in events)
        live, used = engine_usage(backend)
        assert live == 2 and used > 0
    assert wait_until_idle(backend) == (0, 0)
