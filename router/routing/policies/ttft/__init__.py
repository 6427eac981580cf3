"""The `ttft` prefill policy: the estimated time to first token plus the reuse a placement
destroys, in seconds, within a bounded load (policy.py; one concern a file)."""

from router.routing.policies.ttft.policy import TtftPrefill

__all__ = ["TtftPrefill"]
