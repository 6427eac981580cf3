"""The control plane: the cluster-wide prefix index, routing policies, and (to come) request
orchestration, the pool controller and the front doors. Torch-free: imports `core` only."""

from router.decision import RoutingDecision
from router.index_store import make_store
from router.routing import NoWorkerError, Router, RouterConfig

__all__ = ["NoWorkerError", "Router", "RouterConfig", "RoutingDecision", "make_store"]
