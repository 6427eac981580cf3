"""Front-door fixtures: a real tiny engine in-process (`LocalBackend`), an in-process
cluster admin, and the HTTP app served by uvicorn on a free 127.0.0.1 port."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from core.config import EngineConfig
from core.tracing import Tracing, TracingConfig
from engine.tiny_model import make_tiny_model
from router.frontdoor.http.app import create_app
from router.frontdoor.metrics import Metrics
from router.frontdoor.slow_requests import SlowRequests
from tests.support.grpc_server import GRPCServerThread
from tests.support.http_server import HTTPServerThread
from tests.support.in_process_admin import InProcessAdmin
from tests.support.local_backend import LocalBackend

torch.set_num_threads(1)

API_KEY = "test-api-key"
ADMIN_TOKEN = "test-admin-token"
MAX_MODEL_LEN = 256
ENGINE_CONFIG = EngineConfig(
    num_kv_blocks=64, max_model_len=MAX_MODEL_LEN, max_num_seqs=16, num_threads=1, seed=0
)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("frontdoor") / "tiny-llama", arch="llama")


@pytest.fixture(scope="session")
def backend(model_dir: Path) -> Iterator[LocalBackend]:
    b = LocalBackend(model_dir, ENGINE_CONFIG)
    yield b
    b.close()


@pytest.fixture(scope="session")
def admin(model_dir: Path) -> Iterator[InProcessAdmin]:
    """Both disaggregated pools, each worker a small real engine (no traffic reaches them:
    the in-process admin does not route; it is what the dashboard and gRPC Admin drive)."""
    small = EngineConfig(num_kv_blocks=8, max_model_len=64, max_num_seqs=2, num_threads=1)
    a = InProcessAdmin(
        lambda pool, wid: LocalBackend(model_dir, small), {"prefill": 1, "decode": 1}
    )
    yield a
    a.close()


@pytest.fixture(scope="session")
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture(scope="session")
def server(
    backend: LocalBackend, admin: InProcessAdmin, metrics: Metrics
) -> Iterator[HTTPServerThread]:
    app = create_app(backend, admin, api_key=API_KEY, admin_token=ADMIN_TOKEN, metrics=metrics)
    s = HTTPServerThread(app).start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def slow_server(
    backend: LocalBackend, admin: InProcessAdmin
) -> Iterator[tuple[HTTPServerThread, SlowRequests]]:
    """The app with its door keeping its slowest requests, no collector: what `baton serve`
    runs by default (--slow-requests 20)."""
    keeper = SlowRequests(capacity=5)
    tracing = Tracing(TracingConfig(), "baton-router", keeper)
    app = create_app(
        backend, admin, api_key=API_KEY, admin_token=ADMIN_TOKEN, metrics=Metrics(),
        tracing=tracing, slow_requests=keeper,
    )  # fmt: skip
    s = HTTPServerThread(app).start()
    yield s, keeper
    s.stop()
    tracing.shutdown()


@pytest.fixture(scope="session")
def grpc_server(
    backend: LocalBackend, admin: InProcessAdmin, metrics: Metrics
) -> Iterator[GRPCServerThread]:
    s = GRPCServerThread(backend, admin, admin_token=ADMIN_TOKEN, metrics=metrics).start()
    yield s
    s.stop()


def engine_usage(backend: LocalBackend) -> tuple[int, int]:
    """(live requests, used KV blocks) read on the engine thread."""
    return backend.engine.submit(lambda e: (len(e.requests), e.kv.pool.num_used_blocks)).result(10)


def wait_until_idle(backend: LocalBackend, timeout_s: float = 10.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while (usage := engine_usage(backend)) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    return usage
