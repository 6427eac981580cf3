"""Schemathesis against the HTTP API over the real cluster (prefill and decode workers,
KV moving between them): a few hundred generated requests, valid and invalid, never a 5xx,
never a hang; afterwards the server serves and no worker holds a request or a block."""

from __future__ import annotations

import time
from typing import Any

import pytest
import schemathesis

# Imported here, at collection, not by `from_url` inside a fixture: CPython 3.11.7 can fail
# to compile a module that deep in the stack (SystemError "AST constructor recursion depth
# mismatch", seen once when this module had no .pyc yet).
import schemathesis.specs.openapi.schemas

from core.config import EngineConfig
from router.frontdoor.http.app import create_app
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import worker_loads
from tests.support.fuzz import check_case, check_serves_after, fuzz_settings
from tests.support.http_server import HTTPServerThread

pytestmark = pytest.mark.slow
statuses: list[int] = []


@pytest.fixture(scope="module")
def fuzzed(request):  # type: ignore[no-untyped-def]
    """(cluster, server); a 48-token context keeps every generated request short."""
    model_dir = request.getfixturevalue("tiny_model_dir")("llama")
    engine = EngineConfig(num_kv_blocks=64, max_model_len=48, max_num_seqs=32)
    cluster = request.getfixturevalue("cluster_factory_module")(
        make_spec(model_dir, num_prefill=1, num_decode=1, engine=engine), always_disaggregate()
    )
    server = HTTPServerThread(create_app(cluster.backend, None, admin_token="t")).start()
    yield cluster, server
    server.stop()


@pytest.fixture(scope="module")
def api_schema(fuzzed):  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_url(f"{fuzzed[1].url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@fuzz_settings
def test_no_server_errors_through_the_cluster(case, fuzzed) -> None:  # type: ignore[no-untyped-def]
    cluster, server = fuzzed
    check_case(case, server.url, cluster.backend.model_name, statuses)


def test_the_cluster_serves_and_holds_nothing_after_fuzzing(fuzzed) -> None:  # type: ignore[no-untyped-def]
    cluster, server = fuzzed
    check_serves_after(server.url, cluster.backend.model_name, statuses)
    assert cluster.backend.transfers.num_transfers > 0  # requests crossed the workers
    deadline = time.monotonic() + 30

    def busy() -> dict[str, Any]:
        return {w: load for w, load in worker_loads(cluster).items()
                if load.num_running or load.num_waiting}  # fmt: skip

    while held := busy():
        assert time.monotonic() < deadline, f"workers still hold requests: {held}"
        time.sleep(0.05)
