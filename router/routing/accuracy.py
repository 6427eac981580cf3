"""How right the router was: per routed request, the prompt blocks the router predicted a
worker would reuse against the blocks that worker reused (its reply says), per worker.

Two predictions are checked. What the router believed (`predicted`: the index's prefix,
extended by the blocks promised to in-flight prefills) is exported as it is: a promise the
engine has not yet made good counts as an over-estimate there, and that is the router's
error as the request saw it. Whether the index itself is true is judged on the
worker's reported prefix alone (`reported`, no promises): a worker that reuses fewer blocks
than its own KV events say it holds, on `max_over` of its last `window` requests, has a
view that went stale (events lost, a cache cleared behind the router's back), and is
resynced: it is asked for a snapshot of its cache, which replaces its entry
(router.cluster.membership). An eviction between the decision and the prefill is a real
but rare over-estimate of the same kind; the window keeps one from resyncing a worker.

Both are capped at what the engine can reuse: a prompt's last token is always computed
(engine/kv_cache/manager.py), so a prompt of exactly n blocks reuses at most n - 1.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from router.routing.decision import RoutingDecision

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AccuracyConfig:
    window: int = 16
    """Requests per worker the stale-view judgement looks back over."""
    max_over: int = 4
    """Over-estimates of the reported prefix within `window` that resync the worker."""
    cooldown_s: float = 10.0
    """Seconds after a resync before the same worker can be resynced again (its snapshot
    takes a poll to arrive, and the requests routed meanwhile judged the old view)."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not 1 <= self.max_over <= self.window:
            raise ValueError(f"max_over must be in [1, window={self.window}], got {self.max_over}")
        if self.cooldown_s < 0:
            raise ValueError(f"cooldown_s must be >= 0, got {self.cooldown_s}")


@dataclass(frozen=True, slots=True)
class Reuse:
    """One request on one worker, in prompt blocks."""

    worker_id: str
    predicted: int
    """The router's belief: reported prefix plus promised blocks plus pulled blocks."""
    reported: int
    """The worker's own events' prefix plus pulled blocks (no promises)."""
    reused: int
    """What the worker reused (its cache hit, pulled blocks included)."""

    @property
    def error(self) -> int:
        """predicted - reused: over 0 the router over-estimated, under 0 it under-estimated."""
        return self.predicted - self.reused

    @property
    def stale(self) -> bool:
        """The worker reused less than its own events said it held."""
        return self.reported > self.reused


def reuse(
    worker_id: str,
    predicted: int,
    reported: int,
    reused_tokens: int,
    num_prompt_tokens: int,
    block_size: int,
) -> Reuse:
    """A `Reuse` from a decision's block counts and a reply's reused tokens, the predictions
    capped at what the engine can reuse of this prompt."""
    cap = max(0, (num_prompt_tokens - 1) // block_size)
    return Reuse(worker_id, min(predicted, cap), min(reported, cap), reused_tokens // block_size)


def judge(decision: RoutingDecision, worker_id: str, reused_tokens: int, block_size: int) -> Reuse:
    """The decision's prediction for one of the workers it chose (the prefilling worker's
    includes the blocks it pulls from a peer) against the tokens that worker reused."""
    if worker_id == decision.prefill_worker_id:
        pulled = decision.pulled_blocks
        predicted = decision.prefill_cached_blocks + pulled
        reported = decision.prefill_reported_blocks + pulled
    else:
        predicted, reported = decision.decode_cached_blocks, decision.decode_reported_blocks
    return reuse(
        worker_id, predicted, reported, reused_tokens, decision.num_prompt_tokens, block_size
    )


class PredictionCheck:
    """Keeps each worker's last `window` judgements and says when to resync it."""

    def __init__(
        self, config: AccuracyConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or AccuracyConfig()
        self._clock = clock
        self._stale: dict[str, deque[bool]] = {}
        self._resynced_at: dict[str, float] = {}

    def observe(self, r: Reuse) -> bool:
        """Record one request; True when the worker's view should be resynced now (the
        worker's window then starts empty)."""
        cfg = self.config
        recent = self._stale.get(r.worker_id)
        if recent is None:
            recent = self._stale[r.worker_id] = deque(maxlen=cfg.window)
        recent.append(r.stale)
        if sum(recent) < cfg.max_over:
            return False
        now = self._clock()
        if now - self._resynced_at.get(r.worker_id, -float("inf")) < cfg.cooldown_s:
            return False
        self._resynced_at[r.worker_id] = now
        recent.clear()
        logger.warning(
            "router: %s reused fewer prompt blocks than its KV events say it holds on %d of "
            "its last %d requests: resyncing its index entry", r.worker_id, cfg.max_over,
            cfg.window,
        )  # fmt: skip
        return True

    def forget(self, worker_id: str) -> None:
        """The worker left."""
        self._stale.pop(worker_id, None)
        self._resynced_at.pop(worker_id, None)
