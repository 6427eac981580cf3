"""GET /admin/api/slow-requests: the door's slowest recent requests with their door-side
spans, kept with no collector configured; the admin token guards it; off, it says so."""

from __future__ import annotations

import httpx

from core.tracing import SpanName
from router.frontdoor.slow_requests import SlowRequests
from tests.frontdoor.conftest import ADMIN_TOKEN, API_KEY
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def complete(url: str, model: str, max_tokens: int, stream: bool = False) -> None:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}],
              "max_tokens": max_tokens, "ignore_eos": True, "stream": stream},
    )  # fmt: skip
    r.raise_for_status()


def test_the_slowest_requests_with_their_spans(
    slow_server: tuple[HTTPServerThread, SlowRequests], backend: LocalBackend
) -> None:
    server, _ = slow_server
    for max_tokens in (2, 24, 6):
        complete(server.url, backend.model_name, max_tokens, stream=max_tokens > 10)
    assert httpx.get(f"{server.url}/admin/api/slow-requests").status_code == 401
    r = httpx.get(f"{server.url}/admin/api/slow-requests", headers=ADMIN)
    assert r.status_code == 200
    report = r.json()
    assert report["enabled"] and report["capacity"] == 5 and report["window_s"] == 600.0
    by_e2e = report["e2e"]
    assert len(by_e2e) >= 3
    e2e = [q["e2e_s"] for q in by_e2e]
    assert e2e == sorted(e2e, reverse=True)
    slowest = by_e2e[0]
    assert slowest["status"] == "ok"  # (the tokens are the request path's to count)
    assert slowest["trace_id"] == "" and slowest["route"] == "/v1/chat/completions"
    spans = {s["name"]: s for s in slowest["spans"]}
    assert {SpanName.REQUEST, SpanName.PARSE, SpanName.CHAT_TEMPLATE, SpanName.TOKENIZE} <= set(
        spans
    )
    root = spans[SpanName.REQUEST]
    assert root["start_s"] == 0.0 and root["duration_s"] == slowest["e2e_s"] > 0
    for span in slowest["spans"][1:]:
        assert span["depth"] == 1
        assert span["start_s"] >= 0 and span["start_s"] + span["duration_s"] <= root["duration_s"]


def test_off_it_says_so(server: HTTPServerThread) -> None:
    r = httpx.get(f"{server.url}/admin/api/slow-requests", headers=ADMIN)
    assert r.status_code == 200 and r.json() == {"enabled": False, "ttft": [], "e2e": []}
