"""Schemathesis against the server's own OpenAPI document: a few hundred generated
requests (valid and invalid), never a 5xx, never a hang, and the server serves afterwards.

A dedicated engine with a 48-token context keeps every generated request short.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from core.config import EngineConfig
from router.frontdoor.http.app import create_app
from tests.frontdoor.conftest import wait_until_idle
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

CONTEXT = 48
REQUEST_TIMEOUT_S = 20.0  # a hang fails the test instead of stalling the suite
statuses: list[int] = []


@pytest.fixture(scope="module")
def fuzz_backend(model_dir: Path) -> Iterator[LocalBackend]:
    config = EngineConfig(num_kv_blocks=64, max_model_len=CONTEXT, max_num_seqs=32, num_threads=1)
    b = LocalBackend(model_dir, config)
    yield b
    b.close()


@pytest.fixture(scope="module")
def fuzz_server(fuzz_backend: LocalBackend) -> Iterator[HTTPServerThread]:
    s = HTTPServerThread(create_app(fuzz_backend, None, admin_token="t")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server: HTTPServerThread):  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=70,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)
def test_no_server_errors(case, fuzz_server: HTTPServerThread, fuzz_backend: LocalBackend) -> None:  # type: ignore[no-untyped-def]
    # Most requests name the served model, so they reach the engine instead of a 404.
    if isinstance(case.body, dict):
        if zlib.crc32(repr(case.body).encode()) % 4:
            case.body["model"] = fuzz_backend.model_name
        # A client-chosen deadline rightly ends in 504; that path has its own test.
        case.body.pop("timeout", None)
    response = case.call(base_url=fuzz_server.url, timeout=REQUEST_TIMEOUT_S)
    statuses.append(response.status_code)
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400 and "json" in response.headers.get("content-type", [""])[0]:
        error = response.json()["error"]
        assert {"message", "type", "param", "code"} <= set(error)


def test_server_still_serves_after_fuzzing(
    fuzz_server: HTTPServerThread, fuzz_backend: LocalBackend
) -> None:
    assert len(statuses) >= 200 and statuses.count(200) >= 50, statuses
    r = httpx.post(
        f"{fuzz_server.url}/v1/completions",
        timeout=30,
        json={"model": fuzz_backend.model_name, "prompt": "hi", "max_tokens": 3},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(f"{fuzz_server.url}/health").status_code == 200
    assert wait_until_idle(fuzz_backend) == (0, 0)
