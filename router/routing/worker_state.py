"""One worker as the router sees it: its last report plus what this router has routed to it
since, and the prefill load L_w the policies compare. Mutated only by `LoadTracker`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from core.roles import WorkerRole
from router.routing.load_share import RemoteCharges
from router.routing.step_rate import StepRate


@dataclass(slots=True)
class WorkerState:
    """Per-worker load; owned by LoadTracker, read by the policies.

    Prefill tokens routed to a worker move through three counters (router.routing.load):

        gated_prefill_tokens     routed, still waiting at this front door's prefill gate
                                 (the worker has not seen them: no report counts them)
        admitted_prefill_tokens  admitted, prefill not finished (what the gate caps)
        pending_prefill_tokens   admitted since the worker's last report (which does not
                                 count them yet; a new report resets it)

    and other router replicas' charges count in `remote` (router.routing.load_share).
    """

    worker_id: str
    role: WorkerRole
    model: str
    reported_waiting_tokens: int = 0
    reported_running: int = 0
    reported_free_blocks: int = 0
    total_blocks: int = 0
    """Both counted in blocks of the size the router hashes prompts by (`block_size`: the
    worker's own, 0 when it is that one; a decode pool's may differ: worker/landing.py)."""
    block_size: int = 0
    epoch: int = 0
    """Reports received: a charge taken back in another epoch is already in a report."""
    reported_at: float = -math.inf
    """When the worker took its last report (its wall clock, WorkerLoad.timestamp)."""
    reported_step: int = -1
    """Engine steps the worker had run when it took its last report."""
    prefilled: list[tuple[int, int, int]] = field(default_factory=list)
    """(arrived, ended, tokens) of prefills that ended after its last report's step: a
    report still on its way may count them (prefill_worker.connector.PrefillResult.backlog)."""
    gated_prefill_tokens: int = 0
    admitted_prefill_tokens: int = 0
    pending_prefill_tokens: int = 0
    pending_requests: int = 0
    pending_blocks: int = 0
    remote: RemoteCharges = field(default_factory=RemoteCharges)
    adapters: set[str] = field(default_factory=set)
    """LoRA adapters it holds: its last report's, and those routed to it since."""
    max_loras: int = 0
    """Its adapter slots, as reported."""
    step_rate: StepRate = field(default_factory=StepRate)
    """Its speed and cache reuse, from its reports' step totals (router.routing.step_rate)."""

    @property
    def has_adapter_room(self) -> bool:
        """A LoRA adapter it does not hold loads without evicting one."""
        return len(self.adapters) < self.max_loras

    @property
    def queued_prefill_tokens(self) -> int:
        """L_w: prefill work queued before a new request's (report + routed since)."""
        return prefill_load(self)

    @property
    def running(self) -> int:
        return self.reported_running + self.pending_requests

    @property
    def free_blocks(self) -> int:
        return max(0, self.reported_free_blocks - self.pending_blocks)


def prefill_load(worker: WorkerState) -> int:
    """L_w, the prefill pool's load: tokens the worker reported waiting, plus those admitted
    since that report, plus those still queued at this front door's gate for it, plus the
    same two of the other router replicas."""
    return (
        worker.reported_waiting_tokens
        + worker.pending_prefill_tokens
        + worker.gated_prefill_tokens
        + worker.remote.tokens
    )
