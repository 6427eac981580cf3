"""The transfer group: how KV blocks move between workers (kv_transfer/)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from router.cli.config.knob import default_of, knob
from router.cluster.spec import ClusterSpec


@dataclass(frozen=True)
class TransferOptions:
    TITLE: ClassVar[str] = "transfer"
    ABOUT: ClassVar[str] = "how KV blocks move from prefill to decode workers"

    transport: str = knob(
        default_of(ClusterSpec, "transport"),
        "KV transport: nixl, ucx, shm (CPU workers on one host), cuda_ipc (GPU workers on one "
        "host), local, or auto (per peer: shm for a CPU peer on this host, else the first "
        "network backend that works here, nixl before ucx, else cuda_ipc for a GPU peer on "
        "this host)",
        metavar="NAME",
    )
