"""Router replicas share their ledgers: the prefill work each routed and no report counts yet.

Every replica receives every worker's load reports, but a report says nothing of requests
routed since it was taken; each replica's ledger (router.routing.load) adds only its own.
So N replicas each saw the others' routed work only at the next report, and in a burst all
of them sent the same cheap-looking worker its share of the burst at once (the simulator:
four replicas computed 4.8% more prefill tokens than one router on light_then_burst, 0.7%
with one ledger shared at no delay). Dynamo's router replicas sync their active-block state
(requests in flight per worker) for the same reason.

Each change of a charge's prefill stage goes out through the index store (the Redis
stream, beside the prefix promises) as a `LoadShare`, stamped with the sender's wall clock:

    GATED      routed, waiting at the sender's prefill gate: no report can count it
    ADMITTED   the worker's since `at`: a report taken after `at` counts it
    PREFILLED  done (or will not happen): nothing left to count

A receiving replica counts another's charge in that worker's L_w while it is gated, or
admitted no earlier than the worker's last report was taken (`WorkerLoad.timestamp`, the
worker's wall clock; at the same instant, a simulator's ties, the report came first).
Ordering holds per sender (one publisher thread, one stream), so a charge's stages arrive
in order. A replica that dies leaves its gated charges behind: they expire after `ttl_s`,
as its promises do. A restarted replica starts with no remote charges (the stream is not
replayed for them) and has them again with the next routed requests; after a Redis outage
each replica forgets those it heard, whose ends the outage may have dropped.

Only prefill tokens are shared: they are the load the prefill policies weigh. A decode
worker's running count and free blocks come from reports and this replica's routes. A GATED
share also carries what the sender's prefill policy counted against the worker (`placed_s`),
which each receiver's policy adds to its own count (`Policy.placed_elsewhere`): a policy
that bounds the work it placed (`ttft`) then bounds the pool's, not a quarter of it with
four replicas.
"""

from __future__ import annotations

import enum

import msgspec


class Stage(enum.IntEnum):
    """Where a routed request's prefill charge is (router.routing.load)."""

    GATED = 0
    ADMITTED = 1
    PREFILLED = 2
    CLOSED = 3


class LoadShare(msgspec.Struct, array_like=True, frozen=True):
    """One stage of one routed request's prefill charge, as its replica tells the others."""

    charge: int
    """The charge's number in the sending replica."""
    worker: str
    tokens: int
    stage: Stage
    at: float
    """The sender's wall clock (seconds) when the charge reached `stage`."""
    backlog: tuple[int, int, int] | None = None
    """With PREFILLED: the engine steps between which the worker's reports counted it
    (prefill_worker.connector.PrefillResult.backlog), which every replica's ledger corrects by."""
    placed_s: float = 0.0
    """With GATED: the work the sender's prefill policy counted against the worker
    (policies.base.Choice.placed_s), which the receivers' policies count too."""


class RemoteCharges:
    """One worker's charges routed by other replicas, and the prefill tokens they add to
    its L_w. Keys are (replica, charge)."""

    __slots__ = ("_open", "tokens")

    def __init__(self) -> None:
        # key -> (tokens, at, gated): only charges counted in `tokens` are kept
        self._open: dict[tuple[bytes, int], tuple[int, float, bool]] = {}
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._open)

    def apply(self, replica: bytes, share: LoadShare, reported_at: float) -> None:
        """Take a share; `reported_at`: when the worker took its last report."""
        key = (replica, share.charge)
        old = self._open.pop(key, None)
        if old is not None:
            self.tokens -= old[0]
        gated = share.stage is Stage.GATED
        if gated or (share.stage is Stage.ADMITTED and share.at >= reported_at):
            self._open[key] = (share.tokens, share.at, gated)
            self.tokens += share.tokens

    def reported(self, at: float, ttl_s: float) -> None:
        """The worker took a report at `at`: it counts what was admitted before it; charges
        gated for longer than `ttl_s` belong to a replica that is gone."""
        drop = [
            key
            for key, (_, since, gated) in self._open.items()
            if (since < at and not gated) or since < at - ttl_s
        ]
        for key in drop:
            self.tokens -= self._open.pop(key)[0]

    def clear(self) -> None:
        self._open.clear()
        self.tokens = 0
