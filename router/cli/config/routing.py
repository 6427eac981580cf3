"""The routing group: how the router picks a prefill and a decode worker for each request
(router/routing/route.py's RouterConfig). The knobs marked with a policy belong to that
prefill policy alone; they reach it as keyword arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from router.cli.config.knob import default_of, knob, settings
from router.routing.route import RouterConfig

TTFT = "ttft"


@dataclass(frozen=True)
class RoutingOptions:
    TITLE: ClassVar[str] = "routing"
    ABOUT: ClassVar[str] = "how each request's prefill and decode workers are chosen"

    policy: str = knob(
        default_of(RouterConfig, "prefill_policy"),
        "prefill routing policy: cache_aware, ttft, least_loaded, round_robin, random",
        metavar="NAME",
    )
    decode_policy: str = knob(
        default_of(RouterConfig, "decode_policy"), "decode routing policy", metavar="NAME"
    )
    disagg_min_uncached_tokens: int = knob(
        default_of(RouterConfig, "disagg_min_uncached_tokens"),
        "a prompt whose part the decode worker does not cache is shorter than this is "
        "prefilled by the decode worker itself (conditional disaggregation; 0: every prompt "
        "goes through the prefill pool)",
        metavar="N",
        minimum=0,
    )
    prefill_overflow_s: float = knob(
        default_of(RouterConfig, "prefill_overflow_s"),
        "a decode worker prefills a long prompt itself when the prefill pool's shortest queue "
        "is predicted to take S seconds or more and the decode worker would start it sooner: "
        "it takes a burst while the prefill pool grows, and its running streams' inter-token "
        "latency pays for it (router/routing/overflow.py; 0: never)",
        metavar="S",
        minimum=0,
    )
    prefix_promise_s: float = knob(
        default_of(RouterConfig, "pending_ttl_s"),
        "a routed prefill's prompt blocks count as its worker's (for the requests routed after "
        "it, by every front door) until the worker reports them, or at most S seconds (0: only "
        "reported blocks count)",
        metavar="S",
        minimum=0,
    )
    late_binding: bool = knob(
        default_of(RouterConfig, "late_binding"),
        "route a request when a prefill worker has room for it, not when it arrives: the "
        "decision sees the caches as they are when its prefill can start",
    )
    gate_max_skips: int = knob(
        default_of(RouterConfig, "gate_max_skips"),
        "a prefill worker's queue at the front door lets a request whose prefix the worker "
        "caches longer than the head's go first; one passed over N times goes next (0: first "
        "in, first out)",
        metavar="N",
        minimum=0,
    )
    prefix_pull_gbps: float = knob(
        0.0,
        "the KV transfer rate between prefill workers; when set, a prefill worker may copy a "
        "prompt prefix a busy peer caches instead of computing it (prefix migration)",
        metavar="GB/S",
        policy=TTFT,
        policy_arg="transfer_gbps",
        default_doc="0 (never)",
    )
    balance_slack: float | None = knob(
        None,
        "how far over the pool's mean share of placed prefill work a worker may go and still "
        "be chosen: tighter spreads long prompts more evenly, looser keeps more cache reuse in "
        "bursts",
        metavar="S",
        minimum=0,
        policy=TTFT,
        policy_arg="balance_slack",
        default_doc="the policy's own",
    )
    balance_measured: bool = knob(
        False,
        "hold the same bound on the engine time the workers report as well (for long-prompt "
        "traffic, where placed work and measured time part)",
        policy=TTFT,
        policy_arg="balance_measured",
    )
    balance_room: bool | None = knob(
        None,
        "a worker a request would take over that bound comes after those it fits, least "
        "loaded first; --no-balance-room checks the bound before the request only",
        policy=TTFT,
        policy_arg="balance_room",
        default_doc="the policy's own",
    )

    def policy_args(self) -> dict[str, Any]:
        """The prefill policy's keyword arguments: the knobs of that policy that are set
        (ServeConfig.check refuses them with any other policy)."""
        return {
            s.knob.policy_arg: getattr(self, s.name)
            for s in settings(type(self))
            if s.knob.policy == self.policy
            and s.knob.policy_arg is not None
            and getattr(self, s.name) != s.default
        }

    def router_config(self) -> RouterConfig:
        return RouterConfig(
            prefill_policy=self.policy,
            decode_policy=self.decode_policy,
            prefill_policy_args=self.policy_args(),
            disagg_min_uncached_tokens=self.disagg_min_uncached_tokens,
            prefill_overflow_s=self.prefill_overflow_s,
            pending_ttl_s=self.prefix_promise_s,
            late_binding=self.late_binding,
            gate_max_skips=self.gate_max_skips,
        )
