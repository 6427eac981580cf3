"""The cluster group: the pools, their tensor-parallel size, and which Ray cluster they run
on (router/cluster/spec.py's ClusterSpec)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from core import env
from router.cli.config.knob import default_of, knob
from router.cluster.spec import ClusterSpec


@dataclass(frozen=True)
class ClusterOptions:
    TITLE: ClassVar[str] = "cluster"
    ABOUT: ClassVar[str] = "the worker pools and the Ray cluster they run on"

    mode: str = knob(
        default_of(ClusterSpec, "mode"),
        "disaggregated: a prefill pool and a decode pool; unified: every worker runs both "
        "phases (the colocated baseline)",
        choices=("disaggregated", "unified"),
    )
    prefill: int = knob(
        default_of(ClusterSpec, "num_prefill"),
        "prefill workers (disaggregated mode; unified mode adds them to its one pool)",
        minimum=0,
        metavar="N",
    )
    decode: int = knob(
        default_of(ClusterSpec, "num_decode"),
        "decode workers (disaggregated mode; unified mode adds them to its one pool)",
        minimum=0,
        metavar="N",
    )
    tp: int = knob(
        default_of(ClusterSpec, "tp"),
        "tensor-parallel size of every worker (one GPU a rank; the ranks of a worker share a node)",
        minimum=1,
        metavar="N",
    )
    address: str | None = knob(
        None,
        "join an existing Ray cluster ('auto' or host:port)",
        default_doc="start a local single-node Ray on 127.0.0.1",
        metavar="ADDRESS",
    )
    attach: bool = knob(
        False,
        "a front-door replica: serve the running Baton cluster at --address, start no workers "
        "(the cluster's settings come from its controller)",
    )
    redis: str | None = knob(
        default_of(ClusterSpec, "redis_url"),
        "share the prefix index and controller state through Redis",
        metavar="URL",
        env=env.REDIS_URL,
        default_doc="unset (the in-process index)",
    )
