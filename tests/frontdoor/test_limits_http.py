"""Overload and abuse limits at the HTTP door (router/frontdoor/limits.py, guard.py):
per-key rate limits and concurrent quotas (429), the bounded admission queue (503), the
body size limit (413). Refused requests never reach the engine; quotas come back when a
streaming client goes away."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from router.cli.serve_args import add_serve_arguments, door_limits
from router.frontdoor.http.app import create_app
from router.frontdoor.http.guard import DoorGuard
from router.frontdoor.limits import DoorControls, DoorLimits
from tests.frontdoor.conftest import wait_until_idle
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend


class CountingBackend:
    """The real engine's backend, counting the requests that reach it; its streams go at
    most one delta per `delay_s`, so a test can hold one open."""

    def __init__(self, inner: LocalBackend, delay_s: float = 0.02) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.num_requests = 0
        self.controls: DoorControls | None = None
        """The door's live limits (the fixture's door)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, request: Any) -> AsyncIterator[Any]:
        self.num_requests += 1
        async for out in self.inner.generate(request):
            await asyncio.sleep(self.delay_s)
            yield out


@pytest.fixture
def door(backend: LocalBackend) -> Iterator[Callable[..., tuple[HTTPServerThread, Any]]]:
    servers: list[HTTPServerThread] = []

    def start(**limits: Any) -> tuple[HTTPServerThread, CountingBackend]:
        counting = CountingBackend(backend)
        counting.controls = DoorControls(DoorLimits(**limits))
        app = create_app(counting, None, admin_token="x", limits=counting.controls)  # type: ignore[arg-type]
        servers.append(HTTPServerThread(app).start())
        return servers[-1], counting

    yield start
    for s in servers:
        s.stop()
    assert wait_until_idle(backend) == (0, 0)


def body(backend: LocalBackend, **extra: Any) -> dict:
    return {"model": backend.model_name, "prompt": "hi", "max_tokens": 1, **extra}


def post(server: HTTPServerThread, json: Any, key: str | None = None, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.url}/v1/completions", json=json, headers=headers, timeout=30, **kw)


def assert_refused(r: httpx.Response, status: int, code: str, kind: str) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["type"] == kind
    return error


LONG = {"max_tokens": 200, "ignore_eos": True, "stream": True}


class HeldStream:
    """A streaming request kept open until the block ends (then the client goes away)."""

    def __init__(self, server: HTTPServerThread, json: dict, key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._cm = httpx.stream(
            "POST", f"{server.url}/v1/completions", json=json, headers=headers, timeout=30
        )

    def __enter__(self) -> HeldStream:
        response = self._cm.__enter__()
        assert response.status_code == 200
        self._lines = response.iter_lines()  # kept: dropping it would close the response
        assert next(self._lines).startswith("data: {")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)


def test_rate_limit_per_key_is_429_with_retry_after(door, backend) -> None:
    server, counting = door(rate_per_s=0.2, burst=2)
    assert post(server, body(backend), "alice").status_code == 200
    assert post(server, body(backend), "alice").status_code == 200
    r = post(server, body(backend), "alice")
    error = assert_refused(r, 429, "rate_limit_exceeded", "rate_limit_error")
    assert "0.2 requests/s" in error["message"]
    assert 1 <= int(r.headers["Retry-After"]) <= 5
    assert counting.num_requests == 2  # the refused one did no engine work
    assert post(server, body(backend), "bob").status_code == 200  # a bucket per key
    assert post(server, body(backend)).status_code == 200  # anonymous: one more bucket


def test_concurrent_quota_comes_back_when_a_streaming_client_leaves(door, backend) -> None:
    server, counting = door(max_concurrent_per_key=1)
    with HeldStream(server, body(backend, **LONG), "alice"):
        r = post(server, body(backend), "alice")
        error = assert_refused(r, 429, "rate_limit_exceeded", "rate_limit_error")
        assert "concurrent" in error["message"] and r.headers["Retry-After"] == "1"
        assert post(server, body(backend), "bob").status_code == 200
    assert counting.num_requests == 2
    deadline = time.monotonic() + 10
    while (r := post(server, body(backend), "alice")).status_code == 429:
        assert time.monotonic() < deadline, "the quota was not given back"
        time.sleep(0.05)
    assert r.status_code == 200


def test_a_queued_request_runs_when_a_slot_frees(door, backend) -> None:
    server, _ = door(max_concurrent=1, max_queued=1, queue_timeout_s=20)
    result: list[httpx.Response] = []
    with HeldStream(server, body(backend, **LONG)):
        waiter = threading.Thread(target=lambda: result.append(post(server, body(backend))))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive(), "the second request did not wait for the slot"
    waiter.join(20)
    assert result and result[0].status_code == 200


def test_the_admission_queue_is_bounded_in_size_and_time(door, backend) -> None:
    # The held stream's 200 deltas take 4 s: longer than the queue's wait.
    server, counting = door(max_concurrent=1, max_queued=1, queue_timeout_s=1.0)
    admission = counting.controls.admission
    result: list[httpx.Response] = []
    with HeldStream(server, body(backend, **LONG)):
        start = time.monotonic()
        waiter = threading.Thread(target=lambda: result.append(post(server, body(backend))))
        waiter.start()
        while admission.num_waiting == 0 and waiter.is_alive():
            assert time.monotonic() - start < 10, "the second request never queued"
            time.sleep(0.01)
        r = post(server, body(backend))  # the queue (1) is taken: refused at once
        error = assert_refused(r, 503, "server_overloaded", "service_unavailable")
        assert "1 waiting" in error["message"] and int(r.headers["Retry-After"]) >= 1
        waiter.join(10)
        waited_s = time.monotonic() - start
    error = assert_refused(result[0], 503, "server_overloaded", "service_unavailable")
    assert "within 1 s" in error["message"]
    assert 1.0 <= waited_s < 10
    assert counting.num_requests == 1


def test_body_over_the_limit_is_413_naming_it(door, backend) -> None:
    server, counting = door(max_body_bytes=300)
    r = post(server, body(backend, prompt="x" * 400))
    error = assert_refused(r, 413, "request_too_large", "invalid_request_error")
    assert "300 bytes" in error["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"model": "m", "prompt": "'
        for _ in range(10):
            yield b"y" * 50
        yield b'"}'

    r = httpx.post(f"{server.url}/v1/completions", content=chunks(), timeout=30)
    assert_refused(r, 413, "request_too_large", "invalid_request_error")
    assert counting.num_requests == 0
    assert post(server, body(backend)).status_code == 200


def test_limits_are_off_by_default(backend) -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    limits = door_limits(parser.parse_args([]))
    assert not limits.enabled()
    app = create_app(backend, None, admin_token="x", limits=limits)
    assert all(m.cls is not DoorGuard for m in app.user_middleware)
    flags = ["--rate-limit", "5", "--max-concurrent-requests", "8", "--max-body-bytes", "1000"]
    limits = door_limits(parser.parse_args(flags))
    assert limits.enabled() and limits.rate_per_s == 5 and limits.max_concurrent == 8
