"""Creating one worker actor: what it asks Ray for, and what it is told to be.

The controller decides when a worker starts and what happens if it never comes up; this
module only turns (cluster spec, pool, worker id) into a Ray actor. A worker of `tp > 1`
gets a placement group first (its ranks are actors packed on one node, ray_ranks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import ray

from core.roles import WorkerRole
from router.cluster.spec import ClusterSpec


@dataclass(frozen=True)
class Launched:
    handle: Any
    placement: Any
    """The worker's placement group when tp > 1 (the controller removes it with the worker)."""
    asked: str
    """What the actor needs from a node, said when it is never placed."""


async def launch_worker(spec: ClusterSpec, pool: str, worker_id: str, actor_name: str) -> Launched:
    """Create the worker's actor (it loads its model in the background; `info()` answers
    once it is up). Raises when Ray refuses the actor or its placement group."""
    from decode_worker.worker import DecodeWorker
    from prefill_worker.worker import PrefillWorker
    from worker.base import WorkerSpec

    cls = PrefillWorker if pool == WorkerRole.PREFILL else DecodeWorker
    options: dict[str, Any] = {
        "name": actor_name,
        "resources": {pool: 1},
        "max_restarts": 0,
        "max_concurrency": 1000,
    }
    tp = spec.tp_of(pool)
    placement = None
    if tp > 1:  # ranks are actors in one placement group on one node (ray_ranks.py)
        from worker.ray_ranks import create_tp_placement

        placement, pg_options = await create_tp_placement(
            pool, tp, spec.device, spec.worker_start_timeout_s
        )
        options.update(pg_options)
    elif spec.device == "cuda":
        options["num_gpus"] = spec.gpus_per_worker
        options["num_cpus"] = 1
    else:
        options["num_cpus"] = 1
    wspec = WorkerSpec(
        worker_id=worker_id,
        role=WorkerRole.parse(pool),
        model_dir=spec.model_dir,
        engine=replace(
            spec.engine_of(pool),
            device=spec.device,
            gpu_fraction=spec.gpus_per_worker if spec.device == "cuda" else 1.0,
            landing_layout=landing_layout(spec, pool),
        ),
        transport=spec.transport,
        num_threads=spec.num_threads,
        engine_nice=spec.engine_nice,
        cpu_bind=spec.cpu_bind,
        tp=tp,
        local_cluster=spec.local,
        tracing=spec.tracing,
    )
    try:
        handle = ray.remote(cls).options(**options).remote(wspec, placement)
    except Exception:
        if placement is not None:
            from worker.ray_ranks import remove_tp_placement

            remove_tp_placement(placement)
        raise
    asked = (
        f"a node with {options.get('resources')} and {options.get('num_cpus', 0)} CPU, "
        f"{options.get('num_gpus', 0):g} GPU free"
    )
    return Launched(handle, placement, asked)


def landing_layout(spec: ClusterSpec, pool: str) -> tuple[int, int, str] | None:
    """A decode worker's EngineConfig.landing_layout: the prefill pool's (TP size, block
    size, KV cache dtype) where it differs from the decode pool's, whose KV then lands in
    areas of that layout (worker/landing.py); else None."""
    if spec.mode != "disaggregated" or WorkerRole.parse(pool) != WorkerRole.DECODE:
        return None
    layouts = {
        role: (spec.tp_of(role), spec.engine_of(role).block_size,
               spec.engine_of(role).kv_cache_dtype)
        for role in (WorkerRole.PREFILL, WorkerRole.DECODE)
    }  # fmt: skip
    same = layouts[WorkerRole.PREFILL] == layouts[WorkerRole.DECODE]
    return None if same else layouts[WorkerRole.PREFILL]
