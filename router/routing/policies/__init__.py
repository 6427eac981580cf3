"""Routing policies: an interface, a per-pool registry, and the built-in policies."""

from router.routing.policies import cache_aware, decode, simple, ttft  # noqa: F401  (register)
from router.routing.policies.base import (
    POOLS,
    Choice,
    Policy,
    RouteContext,
    make_policy,
    policy_names,
    pool_load,
    register,
)

__all__ = [
    "POOLS",
    "Choice",
    "Policy",
    "RouteContext",
    "make_policy",
    "policy_names",
    "pool_load",
    "register",
]
