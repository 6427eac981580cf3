"""Routing policies: an interface, a per-pool registry, the pieces a policy is configured
from (filters, scorers, pickers) and the named configurations."""

from router.routing.policies import configurations  # noqa: F401  (register)
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
from router.routing.policies.pipeline import Configuration, Pipeline, Use
from router.routing.policies.plugin import Candidates, Cost, Filter, Picker, Scorer, plugin

__all__ = [
    "POOLS",
    "Candidates",
    "Choice",
    "Configuration",
    "Cost",
    "Filter",
    "Picker",
    "Pipeline",
    "Policy",
    "RouteContext",
    "Scorer",
    "Use",
    "make_policy",
    "plugin",
    "policy_names",
    "pool_load",
    "register",
]
