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
from router.routing.router import RouterConfig

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
                spec, router_config, controller_name=name or f"ctl-{os.urandom(3).hex()}"
            ),
            timeout=300,
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
