"""Bringing a cluster up: Ray, the controller, and this front door's router, membership and
request path.

Used by `baton serve` and by the end-to-end tests, so both start the same thing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core import env
from core.errors import DeadlineExceededError
from core.roles import WorkerRole
from core.tracing import Tracing
from router.cluster.deadlines import CONTROL_CALL_S, bounded
from router.cluster.membership import Membership
from router.cluster.spec import ClusterSpec
from router.frontdoor.metrics import Metrics
from router.frontdoor.slow_requests import SlowRequests
from router.routing.index import make_store
from router.routing.route import Router, RouterConfig

if TYPE_CHECKING:  # it imports ray, which must not happen before init_ray sets its env
    from router.cluster.request_path import RequestPath

logger = logging.getLogger(__name__)

NAMESPACE = "baton"

# Settings that keep a single-node Ray on loopback and quiet. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
# counts only if it is in the environment before Ray is first imported (measured on Ray 2.60).
_RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "UCX_NET_DEVICES": "lo",
    "TOKENIZERS_PARALLELISM": "false",
}


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join `address`, or start a local single-node Ray on 127.0.0.1 with logical
    resources for every pool.

    Joining, this process attaches to its host's Ray node; `BATON_NODE_IP` names the address
    that node registered with where Ray cannot tell (a host with several addresses, hosts
    sharing a filesystem); without it Ray picks. Its workers call back to that address."""
    if not address:  # single-node only: never on a real cluster. Before Ray is imported
        for key, value in _RAY_ENV.items():  # (it reads some of these only at import)
            os.environ.setdefault(key, value)
    import ray

    if ray.is_initialized():
        return
    if address:
        node_ip = env.NODE_IP.get()
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=True, _node_ip_address=node_ip)
        return
    # Logical CPUs, not cores: workers pin their own threads; this only bounds how many
    # actors fit on the node.
    cpus = num_cpus or max(16, os.cpu_count() or 1)
    ray.init(
        namespace=NAMESPACE,
        num_cpus=cpus,
        resources={role.value: 64 for role in WorkerRole},
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=True,
        logging_level=logging.WARNING,
    )


@dataclass
class Cluster:
    controller: Any
    membership: Membership
    backend: RequestPath
    """What the front doors serve through (router.frontdoor.backend.Backend)."""
    router: Router
    spec: ClusterSpec

    def use_metrics(self, metrics: Metrics) -> None:
        """Record routing decisions, their accuracy, KV transfers and index resyncs into
        the front doors' metrics."""
        self.backend.metrics = metrics
        metrics.tenants.queued_source = self.backend.gate.tenants_waiting
        self.membership.on_resync.append(metrics.record_index_resync)
        self.router.on_reuse = lambda r, _resynced: metrics.accuracy.record(
            r.worker_id, r.predicted, r.reused
        )

    @property
    def tracing(self) -> Tracing:
        """This front door's tracer, for the doors to share with the request path."""
        return self.backend.tracing

    @property
    def slow_requests(self) -> SlowRequests | None:
        """This front door's slowest recent requests (`--slow-requests`; None when 0)."""
        return self.backend.slow_requests

    async def close(self, kill_workers: bool = True) -> None:
        """Stop this front door's part of the cluster and, with `kill_workers`, the controller
        and its workers. Every wait is bounded: a controller that does not answer is killed
        anyway (Ray then ends the workers it owned)."""
        self.backend.tracing.shutdown()  # sends what is left
        try:
            await bounded(self.membership.close(), CONTROL_CALL_S, "the membership poll")
        except DeadlineExceededError as e:
            logger.warning("closing: %s", e)
        self.router.close()
        if kill_workers:
            import ray

            try:
                await bounded(self.controller.shutdown.remote(), CONTROL_CALL_S, "the controller")
            except Exception as e:  # gone or stuck: killed below either way
                logger.warning("closing: the controller's shutdown failed: %s", e)
            ray.kill(self.controller, no_restart=True)


READY_TIMEOUT_S = 300.0
"""How long a cluster's pools have to come up, at least."""


async def start_cluster(
    spec: ClusterSpec | None,
    router_config: RouterConfig | None = None,
    ready_timeout_s: float | None = None,
    controller_name: str | None = None,
    attach: bool = False,
) -> Cluster:
    """Start the controller (or find the running one), wait until every pool is up, and
    build the router, membership and request path of this front-door process.

    `ready_timeout_s`: how long the pools have to come up; by default 300 s, or a minute
    more than a worker's own start may take where that is longer.

    `attach`: a front-door replica. It starts nothing; it finds the cluster's controller
    (an error if there is none) and takes the cluster's spec from it (`spec` may be None);
    the model folder must be at the same path here, for the tokenizer. Ray must be
    initialised."""
    import ray

    from engine.tokenizer import Tokenizer
    from router.cluster.controller import CONTROLLER_NAME, Controller
    from router.cluster.request_path import RequestPath

    name = controller_name or CONTROLLER_NAME
    if attach:
        try:
            controller = ray.get_actor(name)
        except ValueError:
            raise RuntimeError(
                f"no Baton controller {name!r} in this Ray cluster to attach to: start one "
                "front door without --attach first"
            ) from None
        spec = await controller.get_spec.remote()
    elif spec is None:
        raise ValueError("a cluster spec is needed unless attaching to a running cluster")
    else:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On this front door's node (the head, as deployed): losing the host of a worker
        # must not take the controller with it. Hard: Ray 2.60 places a soft-affine actor
        # elsewhere even when this node is free (measured); it needs no resources here.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        controller = (
            ray.remote(Controller)
            .options(
                name=name, get_if_exists=True, num_cpus=0, max_concurrency=1000,
                scheduling_strategy=here,
                max_restarts=-1,  # a dead controller comes back and restarts the pools
            )
            .remote(spec)
        )  # fmt: skip
    if ready_timeout_s is None:
        ready_timeout_s = max(READY_TIMEOUT_S, spec.worker_start_timeout_s + 60.0)
    await controller.start.remote()
    not_ready = await controller.wait_ready.remote(ready_timeout_s)
    if not_ready is not None:
        raise RuntimeError(not_ready)
    store = make_store("redis", url=spec.redis_url) if spec.redis_url else make_store("memory")
    router = Router(router_config, store=store)
    membership = Membership(controller, router)
    slow_requests = SlowRequests(spec.tracing.slow_requests) if spec.tracing.slow_requests else None
    backend = RequestPath(
        membership,
        router,
        Tokenizer.from_dir(spec.model_dir),
        os.path.basename(spec.model_dir.rstrip("/")),
        prefill_queue_tokens=2 * spec.engine.max_num_batched_tokens,
        tracing=Tracing(spec.tracing, "baton-router", slow_requests),
        fair_share=spec.engine.fair_share,
    )
    backend.slow_requests = slow_requests
    if spec.autoscale is not None:
        from router.cluster.autoscale.signals import door_report

        door_id = f"door-{os.getpid()}-{os.urandom(2).hex()}"
        membership.door_report = lambda: door_report(
            door_id, backend.metrics.slo if backend.metrics else None, backend.waits
        )
        membership.door_report_every_s = spec.autoscale.interval_s
    await membership.start()
    return Cluster(controller, membership, backend, router, spec)
