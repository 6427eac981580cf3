"""Schemathesis against the server's own OpenAPI document: a few hundred generated
requests (valid and invalid), never a 5xx, never a hang, and the server serves afterwards.

A dedicated engine with a 48-token context keeps every generated request short.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis

# Imported here, at collection, not by `from_url` inside a fixture: CPython 3.11.7 can fail
# to compile a module that deep in the stack (SystemError "AST constructor recursion depth
# mismatch", seen once when this module had no .pyc yet).
import schemathesis.specs.openapi.schemas

from core.config import EngineConfig
from router.frontdoor.http.app import create_app
from tests.frontdoor.conftest import wait_until_idle
from tests.support.fuzz import check_case, check_serves_after, fuzz_settings
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

CONTEXT = 48
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
@fuzz_settings
def test_no_server_errors(case, fuzz_server: HTTPServerThread, fuzz_backend: LocalBackend) -> None:  # type: ignore[no-untyped-def]
    check_case(case, fuzz_server.url, fuzz_backend.model_name, statuses)


def test_server_still_serves_after_fuzzing(
    fuzz_server: HTTPServerThread, fuzz_backend: LocalBackend
) -> None:
    check_serves_after(fuzz_server.url, fuzz_backend.model_name, statuses)
    assert wait_until_idle(fuzz_backend) == (0, 0)
