"""Schemathesis against a Baton server's own OpenAPI document, shared by the fuzz tests of
the in-process engine (tests/frontdoor) and of the real cluster (tests/cluster): never a 5xx,
never a hang, errors in OpenAI's shape, and the server serves afterwards."""

from __future__ import annotations

import zlib
from typing import Any

import httpx
from hypothesis import HealthCheck, settings

REQUEST_TIMEOUT_S = 20.0  # a hang fails the test instead of stalling the suite

fuzz_settings = settings(
    max_examples=70,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)


def check_case(case: Any, url: str, model: str, statuses: list[int]) -> None:
    """Send one generated request (most name the served model, so they reach the backend
    instead of a 404) and check the answer."""
    if isinstance(case.body, dict):
        if zlib.crc32(repr(case.body).encode()) % 4:
            case.body["model"] = model
        # A client-chosen deadline rightly ends in 504; that path has its own test.
        case.body.pop("timeout", None)
    response = case.call(base_url=url, timeout=REQUEST_TIMEOUT_S)
    statuses.append(response.status_code)
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400 and "json" in response.headers.get("content-type", [""])[0]:
        error = response.json()["error"]
        assert {"message", "type", "param", "code"} <= set(error)


def check_serves_after(url: str, model: str, statuses: list[int]) -> None:
    assert len(statuses) >= 200 and statuses.count(200) >= 50, statuses
    r = httpx.post(
        f"{url}/v1/completions",
        timeout=30,
        json={"model": model, "prompt": "hi", "max_tokens": 3},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(f"{url}/health").status_code == 200
