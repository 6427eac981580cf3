"""Routing: which workers serve a request, decided from the prefix index and the load.

Pure decisions (Dynamo's rule: the router decides, it never sends): no Ray, no HTTP, no
asyncio. Imports `core` only, so it runs and is tested without torch.
"""

from router.routing.decision import RoutingDecision
from router.routing.route import NoWorkerError, Router, RouterConfig

__all__ = ["NoWorkerError", "Router", "RouterConfig", "RoutingDecision"]
