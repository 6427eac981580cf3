"""The HTTP surface around the completions: /tokenize, /detokenize, /version, X-Request-Id,
CORS, and a non-streaming completion cancelled when its client hangs up."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from core.config import EngineConfig
from router.frontdoor.http.app import create_app
from router.frontdoor.metrics import Metrics
from tests import oracle
from tests.frontdoor.conftest import API_KEY, MAX_MODEL_LEN, engine_usage, wait_until_idle
from tests.frontdoor.test_http_errors import AUTH, assert_error, post
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

ORIGIN = "https://app.example.com"


def test_tokenize_a_prompt_and_detokenize_it_back(server: HTTPServerThread, backend) -> None:  # type: ignore[no-untyped-def]
    text = "Hello, tokenizer! ünïcödé"
    r = post(server, "/tokenize", json={"prompt": text, "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == backend.tokenizer.encode(text)
    assert body["count"] == len(body["tokens"])
    assert body["max_model_len"] == MAX_MODEL_LEN
    assert len(body["token_strs"]) == body["count"]
    plain = post(server, "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert plain["token_strs"] is None
    assert plain["tokens"] == backend.tokenizer.encode(text, add_special_tokens=False)
    back = post(server, "/detokenize", json={"tokens": plain["tokens"]})
    assert back.status_code == 200, back.text
    assert back.json() == {"prompt": text}


def test_tokenize_messages_counts_what_a_chat_completion_is_charged(
    server: HTTPServerThread,
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    count = post(server, "/tokenize", json={"messages": messages}).json()["count"]
    chat = post(
        server,
        "/v1/chat/completions",
        json={"model": _model(server), "messages": messages, "max_tokens": 1},
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["prompt_tokens"] == count


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, None),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, None),
        ("/tokenize", {"prompt": "a", "tools": []}, "tools"),
        ("/tokenize", {"prompt": "a", "model": "other"}, "model"),
        ("/detokenize", {"tokens": [10**6]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens.0"),
        ("/detokenize", {}, "tokens"),
    ],
)
def test_bad_token_requests_are_4xx_naming_the_field(
    server: HTTPServerThread, path: str, body: dict, param: str | None
) -> None:
    r = post(server, path, json=body)
    error = assert_error(r, 404 if param == "model" else 400)
    assert error["param"] == param


def test_token_routes_need_the_api_key_and_version_does_not(server: HTTPServerThread) -> None:
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": "a"}, timeout=10)
    assert_error(r, 401)
    v = httpx.get(f"{server.url}/version", timeout=10)
    assert v.status_code == 200
    assert v.json()["version"]


def test_x_request_id_is_echoed_and_names_the_completion(
    server: HTTPServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"model": _model(server), "prompt": "Hi", "max_tokens": 2}
    r = post(server, "/v1/completions", json=body, headers={"X-Request-Id": "client-42"})
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "client-42"
    assert r.json()["id"] == "cmpl-client-42"
    # Two requests with one id at once must not collide on the workers; both complete.
    with caplog.at_level(logging.DEBUG, logger="router.frontdoor.tracking"):
        for _ in range(2):
            again = post(server, "/v1/completions", json=body, headers={"X-Request-Id": "dup"})
            assert again.status_code == 200
    assert sum("request cmpl-dup." in m for m in caplog.messages) == 2
    generated = post(server, "/v1/completions", json=body)
    assert len(generated.headers["x-request-id"]) == 32
    errors = post(server, "/v1/completions", json={}, headers={"X-Request-Id": "e-1"})
    assert errors.status_code == 400
    assert errors.headers["x-request-id"] == "e-1"


def test_a_bad_x_request_id_is_400_naming_the_header(server: HTTPServerThread) -> None:
    for bad in ("has space", "x" * 129):
        r = httpx.get(f"{server.url}/v1/models", headers={**AUTH, "X-Request-Id": bad})
        assert assert_error(r, 400)["param"] == "X-Request-Id"


def test_cors_allows_only_the_listed_origins(backend: LocalBackend) -> None:
    app = create_app(backend, api_key=API_KEY, admin_token="t", cors_origins=(ORIGIN,))
    closed = create_app(backend, api_key=API_KEY, admin_token="t")
    with HTTPServerThread(app).start() as s, HTTPServerThread(closed).start() as c:
        ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers":
               "authorization,content-type"}  # fmt: skip
        ok = httpx.options(f"{s.url}/v1/chat/completions", headers={"Origin": ORIGIN, **ask})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == ORIGIN
        other = httpx.options(
            f"{s.url}/v1/chat/completions", headers={"Origin": "https://evil.example", **ask}
        )
        assert "access-control-allow-origin" not in other.headers
        models = httpx.get(f"{s.url}/v1/models", headers={"Origin": ORIGIN, **AUTH})
        assert models.headers["access-control-allow-origin"] == ORIGIN
        assert "X-Request-Id" in models.headers["access-control-expose-headers"]
        none = httpx.get(f"{c.url}/v1/models", headers={"Origin": ORIGIN, **AUTH})
        assert "access-control-allow-origin" not in none.headers


@pytest.fixture(scope="module")
def long_backend(model_dir: Path) -> Iterator[LocalBackend]:
    """Room for a reply of thousands of tokens: one that cannot end before its client
    hangs up."""
    config = EngineConfig(num_kv_blocks=300, max_model_len=4096, max_num_seqs=4, num_threads=1)
    b = LocalBackend(model_dir, config)
    yield b
    b.close()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_non_streaming_request_stops_when_its_client_hangs_up(
    long_backend: LocalBackend, path: str
) -> None:
    metrics = Metrics()
    app = create_app(long_backend, admin_token="t", metrics=metrics)
    body = {"model": long_backend.model_name, "max_tokens": 4000, "ignore_eos": True}
    body |= {"prompt": "Hi"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
    with HTTPServerThread(app).start() as s:
        request = httpx.Request("POST", f"{s.url}{path}", json=body)
        raw = b"".join(
            [f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode()]
            + [f"{k}: {v}\r\n".encode() for k, v in request.headers.items() if k != "host"]
            + [b"\r\n", request.read()]
        )
        with socket.create_connection((s.host, s.port), timeout=10) as sock:
            sock.sendall(raw)
            deadline = time.monotonic() + 10
            while engine_usage(long_backend)[1] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert engine_usage(long_backend)[0] == 1, "the request never started"
        assert wait_until_idle(long_backend) == (0, 0)
        deadline = time.monotonic() + 10
        while _count(metrics, "cancelled") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _count(metrics, "cancelled") == 1
        assert _count(metrics, "success") == 0


def _count(metrics: Metrics, outcome: str) -> float:
    return metrics.requests.labels(outcome=outcome)._value.get()  # type: ignore[attr-defined]


def _model(server: HTTPServerThread) -> str:
    r = httpx.get(f"{server.url}/v1/models", headers=AUTH, timeout=10)
    return str(r.json()["data"][0]["id"])


def test_prompt_logprobs_in_vllm_shape(server: HTTPServerThread, model_dir: Path) -> None:
    prompt = [5 + 3 * i for i in range(12)]
    body = {"model": _model(server), "prompt": prompt, "max_tokens": 2, "n": 2,
            "prompt_logprobs": 2, "temperature": 0}  # fmt: skip
    r = post(server, "/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert choices[0]["prompt_logprobs"] == choices[1]["prompt_logprobs"]
    got = choices[0]["prompt_logprobs"]
    assert len(got) == len(prompt) and got[0] is None
    expected = oracle.hf_prompt_logprobs(str(model_dir), tuple(prompt))
    for position, entry in enumerate(got[1:], start=1):
        token = entry[str(prompt[position])]
        assert token["logprob"] == pytest.approx(expected[position - 1, prompt[position]].item(),
                                                 abs=1e-4)  # fmt: skip
        assert token["rank"] >= 1 and isinstance(token["decoded_token"], str)
        ranks = sorted(e["rank"] for t, e in entry.items() if t != str(prompt[position]))
        assert ranks in ([1, 2], [1], [2], [])  # the prompt token may be one of the top 2
    chat = {"model": _model(server), "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1, "prompt_logprobs": 0}  # fmt: skip
    reply = post(server, "/v1/chat/completions", json=chat).json()
    assert reply["prompt_logprobs"][0] is None
    assert all(len(e) == 1 for e in reply["prompt_logprobs"][1:])


@pytest.mark.parametrize("extra", [{"stream": True}, {"prompt_logprobs": 21}])
def test_bad_prompt_logprobs_are_400(server: HTTPServerThread, extra: dict) -> None:
    body = {"model": _model(server), "prompt": "Hi", "prompt_logprobs": 1} | extra
    assert assert_error(post(server, "/v1/completions", json=body), 400)["param"] == (
        "prompt_logprobs"
    )


def test_latency_buckets_name_a_request_by_its_x_request_id(server: HTTPServerThread) -> None:
    body = {"model": _model(server), "prompt": "Hi", "max_tokens": 3}
    r = post(server, "/v1/completions", json=body, headers={"X-Request-Id": "exemplar-7"})
    assert r.status_code == 200
    openmetrics = httpx.get(f"{server.url}/metrics", timeout=10,
                            headers={"Accept": "application/openmetrics-text"})  # fmt: skip
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    ttft = next(
        f for f in text_string_to_metric_families(openmetrics.text)
        if f.name == "baton:time_to_first_token_seconds"
    )  # fmt: skip
    ids = [s.exemplar.labels["request_id"] for s in ttft.samples if s.exemplar]
    assert any(i.startswith("cmpl-exemplar-7.") for i in ids)
    classic = httpx.get(f"{server.url}/metrics", timeout=10)
    assert classic.headers["content-type"].startswith("text/plain")
    assert "exemplar-7" not in classic.text
