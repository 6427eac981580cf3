"""A real local Ray cluster for the end-to-end tests (one Ray per session)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from core.config import EngineConfig
from router.cluster.bringup import Cluster, init_ray, start_cluster
from router.cluster.spec import ClusterSpec
from router.routing.route import RouterConfig

MAX_TOKENS = 10


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    init_ray(num_cpus=16)
    yield
    ray.shutdown()


def make_spec(model_dir: Any, **kwargs: Any) -> ClusterSpec:
    kwargs.setdefault("engine", EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512))
    kwargs.setdefault("health_interval_s", 0.5)
    return ClusterSpec(model_dir=str(model_dir), **kwargs)


def always_disaggregate() -> RouterConfig:
    # Every prompt goes through a prefill worker (no prefill-on-decode shortcut).
    return RouterConfig(disagg_min_uncached_tokens=0)


def _factory(loop_thread: Any) -> Iterator[Any]:
    started: list[Cluster] = []

    def start(
        spec: ClusterSpec, router_config: RouterConfig | None = None, name: str = ""
    ) -> Cluster:
        cluster = loop_thread.run(
            start_cluster(
                spec,
                router_config,
                ready_timeout_s=360,
                controller_name=name or f"ctl-{os.urandom(3).hex()}",
            ),
            timeout=390,  # past the controller's own wait, so a failure says which worker hung
        )
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        with contextlib.suppress(Exception):
            loop_thread.run(cluster.close(), timeout=60)


@pytest.fixture
def cluster_factory(ray_session, loop_thread) -> Iterator[Any]:
    """Start clusters (each with its own controller name); all are shut down after the test."""
    yield from _factory(loop_thread)


@pytest.fixture(scope="module")
def cluster_factory_module(ray_session, loop_thread) -> Iterator[Any]:
    """The same, kept for a whole test module."""
    yield from _factory(loop_thread)


ADMIN_TOKEN = "cluster-admin-token"


@pytest.fixture(scope="module")
def served(request):  # type: ignore[no-untyped-def]
    """What `baton serve` runs, in-process: a 1 prefill + 1 decode cluster (every prompt
    moves KV), the HTTP app and the gRPC server over it: (cluster, http, grpc, model_dir)."""
    from router.cluster.admin import ControllerAdmin
    from router.frontdoor.http.app import create_app
    from router.frontdoor.metrics import Metrics
    from tests.support.grpc_server import GRPCServerThread
    from tests.support.http_server import HTTPServerThread

    cluster_factory = request.getfixturevalue("cluster_factory_module")
    model_dir = request.getfixturevalue("tiny_model_dir")("llama")
    cluster = cluster_factory(
        make_spec(model_dir, num_prefill=1, num_decode=1), always_disaggregate()
    )
    metrics = Metrics()
    cluster.use_metrics(metrics)
    admin = ControllerAdmin(cluster.controller, cluster.membership)
    app = create_app(
        cluster.backend, admin, admin_token=ADMIN_TOKEN, metrics=metrics,
        tracing=cluster.tracing, slow_requests=cluster.slow_requests,
    )  # fmt: skip
    http = HTTPServerThread(app).start()
    grpc = GRPCServerThread(
        cluster.backend, admin, admin_token=ADMIN_TOKEN, metrics=metrics, tracing=cluster.tracing
    )
    grpc.start()
    yield cluster, http, grpc, model_dir
    grpc.stop()
    http.stop()
