"""Prefix migration, the ttft policy's alternative to computing a prefix a peer holds.

Only with a transfer bandwidth (`kv_bytes_per_token` and `transfer_gbps`: the KV transport's
measured rate between prefill workers). Let c* be the longest cached prefix on any worker,
held by peer q (ties: the shorter queue; only reported blocks count: a block still being
computed cannot be sent yet). A worker with c_w < c* may instead pull blocks [c_w, c*) from q:

    X_w      = x0 + (c* - c_w) * B * kv_bytes_per_token / transfer_gbps      the transfer
    U'_w     = max(0, T - c* * B),  work'_w = work_w with U'_w for U_w
    cost'_w  = wait_w + X_w + (work'_w + pressure_w) / (1 - ρ)               (cost.py)

and takes it when cost'_w < cost_w. X_w is added to the wait, not divided by 1 - ρ: the
copy occupies the transport, not w's compute, so it delays no one queued behind. (An upper
bound: a copy that overlaps the queue wait costs less.) E_w is unchanged (the pulled blocks
are stored on w too). When q is busy, a worker with a short queue pulls q's prefix instead
of recomputing it or queueing behind q; when the bounded load takes q out, hot prefixes get
copied to the workers that take their overflow: replication under load, with no separate
mechanism.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from core.perf.model import TransferCost
from router.routing.policies.base import RouteContext
from router.routing.policies.ttft.cost import Estimate, Pricing


@dataclass(frozen=True, slots=True)
class Source:
    """The peer a pull copies from, this decision."""

    peer_id: str | None
    num_blocks: int
    """c*: its cached prefix of the prompt (0: nobody holds any)."""
    uncached: int
    """U' = max(0, T - c* * B): what a worker that pulls it still computes."""


class Migration:
    """Prices pulls; mutates nothing but its transfer rate (`set_kv_bytes_per_token`)."""

    def __init__(
        self, kv_bytes_per_token: float, transfer_gbps: float, transfer_latency_s: float
    ) -> None:
        self.transfer_gbps = transfer_gbps
        self.transfer_latency_s = transfer_latency_s
        self.transfer = TransferCost(transfer_latency_s, 0.0)
        """Seconds to copy KV between prefill workers (per token 0: no migration)."""
        self.set_kv_bytes_per_token(kv_bytes_per_token)

    def set_kv_bytes_per_token(self, num_bytes: float) -> None:
        self.transfer = TransferCost.at_rate(num_bytes, self.transfer_gbps, self.transfer_latency_s)

    def source(self, ctx: RouteContext) -> Source | None:
        """This decision's c* and q; None without a transfer rate (no migration)."""
        if not self.transfer.per_token:
            return None
        peer, top = holder(ctx)
        return Source(peer, top, max(0, ctx.num_prompt_tokens - top * ctx.block_size))

    def cheaper(self, est: Estimate, source: Source | None, pricing: Pricing) -> Estimate:
        """The estimate with a pull from `source` where that costs less, else `est`."""
        if source is None or source.num_blocks <= est.cached_blocks:
            return est
        block, tokens = pricing.ctx.block_size, pricing.ctx.num_prompt_tokens
        pull_blocks = source.num_blocks - est.cached_blocks
        x = self.transfer(pull_blocks * block)
        work = est.prefill(source.uncached, tokens - source.uncached) + est.restore
        cost = pricing.cost_s(est.wait, x, work, est.pressure)
        if cost < est.cost:
            return dataclasses.replace(
                est, cost=cost, work=work, uncached=source.uncached,
                pull_blocks=pull_blocks, transfer=x,
            )  # fmt: skip
        return est


def holder(ctx: RouteContext) -> tuple[str | None, int]:
    """The pool worker holding the longest reported prefix of the prompt, and its length in
    blocks (ties: the shorter queue, which serves a copy soonest on a real transport)."""
    best: tuple[int, int] = (0, 0)
    peer = None
    in_pool = {w.worker_id: w for w in ctx.workers}
    reported = ctx.cached_blocks if ctx.reported_blocks is None else ctx.reported_blocks
    for worker_id, hit in reported.items():
        w = in_pool.get(worker_id)
        if w is not None and hit > 0 and (hit, -w.queued_prefill_tokens) > best:
            best, peer = (hit, -w.queued_prefill_tokens), worker_id
    return peer, best[0]
