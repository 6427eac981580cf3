"""The limits group: overload and abuse limits of the HTTP and gRPC APIs, counted together
(router/frontdoor/limits.py's DoorLimits), all off unless given; and how tenants share the
cluster (core/fair_share.py's FairShareConfig: priority and the fair share, on by default)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from core.fair_share import FairShareConfig, parse_weights
from router.cli.config.knob import default_of, knob
from router.frontdoor.limits import DoorLimits


def _weights(value: str) -> tuple[tuple[str, float], ...]:
    try:
        return parse_weights(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@dataclass(frozen=True)
class LimitOptions:
    TITLE: ClassVar[str] = "limits"
    ABOUT: ClassVar[str] = (
        "HTTP and gRPC APIs, counted together; off unless set. Tenants' fair share of the "
        "prefill gates and the engines' queues"
    )

    rate_limit: float | None = knob(
        default_of(DoorLimits, "rate_per_s"),
        "requests per second per API key (bearer token; no token: one shared key); beyond it "
        "429 with Retry-After",
        metavar="RPS",
        default_doc="off",
    )
    rate_burst: int | None = knob(
        default_of(DoorLimits, "burst"),
        "requests a key may send at once after idling",
        default_doc="one second's worth",
        metavar="N",
    )
    max_concurrent_per_key: int | None = knob(
        default_of(DoorLimits, "max_concurrent_per_key"),
        "requests in flight per API key; beyond it 429",
        default_doc="off",
        metavar="N",
    )
    max_concurrent_requests: int | None = knob(
        default_of(DoorLimits, "max_concurrent"),
        "requests in flight on this front door; more wait in the admission queue",
        default_doc="off",
        metavar="N",
    )
    max_queued_requests: int = knob(
        default_of(DoorLimits, "max_queued"),
        "requests that may wait for a slot (with --max-concurrent-requests); beyond it 503 at once",
        metavar="N",
    )
    queue_timeout: float = knob(
        default_of(DoorLimits, "queue_timeout_s"),
        "seconds a queued request waits for a slot before a 503",
        metavar="S",
    )
    max_body_bytes: int | None = knob(
        default_of(DoorLimits, "max_body_bytes"),
        "largest request body accepted (HTTP: 413; gRPC: the largest request message)",
        default_doc="off",
        metavar="BYTES",
    )

    fair_share: bool = knob(
        default_of(FairShareConfig, "enabled"),
        "serve waiting tenants by a token-weighted fair share (the least served first; "
        "priority still comes first); off: first in, first out within a priority",
    )
    tenant_header: str | None = knob(
        None,
        "HTTP header (gRPC metadata key) naming a request's tenant, e.g. one a gateway sets",
        default_doc="the API key's hash",
        metavar="NAME",
    )
    tenant_weights: tuple[tuple[str, float], ...] = knob(
        default_of(FairShareConfig, "weights"),
        "tenants' shares when several wait, as NAME=W,...; a tenant not named has weight 1",
        default_doc="all 1",
        metavar="NAME=W,...",
        parse=_weights,
    )
    prompt_token_weight: float = knob(
        default_of(FairShareConfig, "prompt_token_weight"),
        "what a prompt token counts toward its tenant's served share",
        metavar="W",
        minimum=0,
    )
    output_token_weight: float = knob(
        default_of(FairShareConfig, "output_token_weight"),
        "what an output token counts toward its tenant's served share",
        metavar="W",
        minimum=0,
    )

    def fair_share_config(self) -> FairShareConfig:
        return FairShareConfig(
            enabled=self.fair_share,
            weights=self.tenant_weights,
            prompt_token_weight=self.prompt_token_weight,
            output_token_weight=self.output_token_weight,
        )

    def door_limits(self) -> DoorLimits:
        return DoorLimits(
            rate_per_s=self.rate_limit,
            burst=self.rate_burst,
            max_concurrent_per_key=self.max_concurrent_per_key,
            max_concurrent=self.max_concurrent_requests,
            max_queued=self.max_queued_requests,
            queue_timeout_s=self.queue_timeout,
            max_body_bytes=self.max_body_bytes,
        )
