"""The cluster group: the pools, their tensor-parallel size, and which Ray cluster they run
on (router/cluster/spec.py's ClusterSpec)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from typing import ClassVar

from core import env
from core.config import EngineConfig
from router.cli.config.knob import default_of, knob
from router.cluster.spec import ClusterSpec


@dataclass(frozen=True)
class PoolLayout:
    """A pool's own KV layout where it differs from the other pool's: a decode worker lands
    an unlike prefill worker's KV and rewrites it in its own (worker/landing.py)."""

    tp: int | None = None
    block_size: int | None = None
    kv_cache_dtype: str | None = None

    def engine(self, engine: EngineConfig) -> EngineConfig | None:
        """The pool's engine settings (None: the cluster's own)."""
        changes = {k: v for k in ("block_size", "kv_cache_dtype") if (v := getattr(self, k))}
        return replace(engine, **changes) if changes else None


def parse_layout(text: str) -> PoolLayout:
    """'tp=2,block-size=32,kv-cache-dtype=int8' (any of them) -> PoolLayout."""
    names = {f.name.replace("_", "-"): f.name for f in fields(PoolLayout)}
    values: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if key not in names or not value:
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected KEY=VALUE with KEY one of {', '.join(names)}"
            )
        if key == "kv-cache-dtype":
            values[names[key]] = value
        elif not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"{key} must be a positive integer, got {value!r}")
        else:
            values[names[key]] = int(value)
    layout = PoolLayout(**values)  # type: ignore[arg-type]
    try:  # EngineConfig names what it refuses (a block size not a power of two, a dtype)
        layout.engine(EngineConfig())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return layout


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
    gpus_per_worker: float = knob(
        default_of(ClusterSpec, "gpus_per_worker"),
        "the part of a GPU each worker takes (Ray's fractional GPUs; CUDA, TP 1): 0.5 puts a "
        "prefill and a decode worker on one GPU, each filling half of --gpu-memory-utilization",
        metavar="F",
    )
    worker_start_timeout: float = knob(
        default_of(ClusterSpec, "worker_start_timeout_s"),
        "seconds a new worker has to come up (load its model, size its KV cache, compile its "
        "kernels and capture its graphs) before it counts as failed",
        minimum=1,
        metavar="S",
    )
    prefill_layout: PoolLayout | None = knob(
        None,
        "the prefill pool's own TP size, block size and KV cache dtype where they differ from "
        "the decode pool's, as tp=N,block-size=N,kv-cache-dtype=auto|int8|fp8: decode workers "
        "land its KV and rewrite it in their layout",
        metavar="K=V,...",
        parse=parse_layout,
        default_doc="--tp, --kv-cache-dtype and a block of 16 tokens",
    )
    decode_layout: PoolLayout | None = knob(
        None,
        "the decode pool's own TP size, block size and KV cache dtype (as --prefill-layout)",
        metavar="K=V,...",
        parse=parse_layout,
        default_doc="--tp, --kv-cache-dtype and a block of 16 tokens",
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
