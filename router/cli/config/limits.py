"""The limits group: overload and abuse limits of the HTTP and gRPC APIs, counted together
(router/frontdoor/limits.py's DoorLimits); all off unless given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from router.cli.config.knob import default_of, knob
from router.frontdoor.limits import DoorLimits


@dataclass(frozen=True)
class LimitOptions:
    TITLE: ClassVar[str] = "limits"
    ABOUT: ClassVar[str] = "HTTP and gRPC APIs, counted together; off unless set"

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
