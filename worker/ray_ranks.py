"""Tensor-parallel ranks as Ray actors in one placement group packed on one node.

Placement (built by the controller, `create_tp_placement`): `tp` bundles of {CPU: 1} (or
{GPU: 1}) with strategy STRICT_PACK; the pool's custom resource (`prefill` / `decode` /
`unified`, one unit per worker, as at tp=1) sits on the first bundle only. STRICT_PACK
puts every bundle on the node that has it, so one unit is enough to pin the whole group to
a node type, and a node offering N pool units still hosts N workers whatever their TP.

    bundle 0: {CPU: 1, decode: 1}   <- worker actor (0 CPU, the pool unit) + rank 0 (1 CPU)
    bundle 1: {CPU: 1}              <- rank 1
    ...

The worker actor starts its rank actors (`start_ray_ranks`): they are owned by it and die
with it; removing the placement group (the controller does, when it kills the worker)
kills them too. Each rank is driven through `engine.tp.RankHandle`, so `TPEngine` runs the
lockstep exactly as it does over local processes.

GPUs: Ray would narrow each rank's CUDA_VISIBLE_DEVICES to its own GPU, and NCCL, seeing
no peer device, could fall back from P2P / NVLink to copies through the host. So the ranks
start with Ray's RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES (as vLLM's do on Ray): each
sees every GPU of the node and selects the one Ray assigned it (`visible_device_index`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from engine.tp.ranks import (
    RankStart,
    Reply,
    build_rank,
    free_port,
    portable_error,
    serve_call,
    visible_device_index,
)

NOSET_VISIBLE_DEVICES = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
"""A GPU rank's env_vars: Ray leaves CUDA_VISIBLE_DEVICES as the node has it."""


async def create_tp_placement(
    pool: str, tp: int, device: str, timeout_s: float
) -> tuple[Any, dict[str, Any]]:
    """Reserve one node's resources for a worker with `tp` ranks; returns the placement
    group and the worker actor's options (bundle 0, the pool unit, no CPU of its own)."""
    unit = "GPU" if device == "cuda" else "CPU"
    bundles = [{unit: 1.0, pool: 1.0}] + [{unit: 1.0} for _ in range(tp - 1)]
    pg = placement_group(bundles, strategy="STRICT_PACK")
    try:
        await asyncio.wait_for(pg.ready(), timeout_s)
    except Exception as e:
        remove_placement_group(pg)
        raise RuntimeError(
            f"no node could host a {pool} worker with tp={tp} ({tp} x {unit} and one "
            f"{pool!r} unit on one node) within {timeout_s} s"
        ) from e
    options = {
        "num_cpus": 0,
        "num_gpus": 0,
        "resources": {pool: 1},
        "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
    }
    return pg, options


def remove_tp_placement(pg: Any) -> None:
    with contextlib.suppress(Exception):  # already gone
        remove_placement_group(pg)


class RankActor:
    """The body of a rank actor: build the target, then serve the driver's calls in order
    (a sync actor runs one call at a time, in submission order)."""

    def __init__(self) -> None:
        self.target: Any = None

    def start(self, start: RankStart) -> Reply:
        try:
            device_index = None
            if start.backend == "nccl":
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                device_index = visible_device_index(ray.get_gpu_ids(), visible)
            self.target = build_rank(start, device_index)
            return ("ok", None)
        except BaseException as e:  # report why this rank never came up
            return ("error", portable_error(e))

    def call(self, name: str, args: tuple, kwargs: dict, want_result: bool) -> Reply:
        return serve_call(self.target, name, args, kwargs, want_result)

    def stop(self) -> None:
        if self.target is not None and hasattr(self.target, "close"):
            self.target.close()
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RayRank:
    """`engine.tp.RankHandle` over a rank actor: one call in flight at a time."""

    def __init__(self, actor: Any, start: RankStart) -> None:
        self.actor = actor
        self.rank = start.rank
        self._ref: Any = actor.start.remote(start)

    def submit(self, name: str, args: tuple, kwargs: dict, want_result: bool) -> None:
        self._ref = self.actor.call.remote(name, args, kwargs, want_result)

    def reply(self, timeout_s: float) -> Reply:
        try:
            return ray.get(self._ref, timeout=timeout_s)
        except GetTimeoutError:
            raise TimeoutError(
                f"tensor-parallel rank {self.rank} gave no reply in {timeout_s} s"
            ) from None
        except RayError as e:  # the actor died (or its node did)
            raise RuntimeError(f"tensor-parallel rank {self.rank} died: {e}") from None

    def close(self, timeout_s: float) -> None:
        with contextlib.suppress(Exception):
            ray.get(self.actor.stop.remote(), timeout=timeout_s)
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


def start_ray_ranks(
    size: int,
    device: str,
    factory: Callable[..., Any],
    placement: Any = None,
    timeout_s: float = 300.0,
) -> list[RayRank]:
    """Start `size` rank actors (in bundles 0..size-1 of `placement`, if given) that join
    one process group on this node. Call from the worker actor: the ranks are its own."""
    host = ray.util.get_node_ip_address()
    init_method = f"tcp://{host}:{free_port(host)}"
    backend = "nccl" if device == "cuda" else "gloo"
    actor_class = ray.remote(RankActor)
    ranks = []
    for rank in range(size):
        options: dict[str, Any] = {"max_restarts": 0}
        if backend == "nccl":
            options.update(num_gpus=1, num_cpus=0, runtime_env={"env_vars": NOSET_VISIBLE_DEVICES})
        else:
            options.update(num_cpus=1)
        if placement is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement, placement_group_bundle_index=rank
            )
        actor = actor_class.options(**options).remote()
        ranks.append(
            RayRank(actor, RankStart(rank, size, init_method, backend, timeout_s, factory))
        )
    return ranks
