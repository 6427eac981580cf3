"""The router's answer for one request, and the request as the decision sees it: typed,
frozen values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from router.routing.index.store import Prefixes


@dataclass(frozen=True, slots=True)
class PrefixPull:
    """Prompt blocks the prefill worker copies from a peer prefill worker's cache over the KV
    transport instead of computing them: blocks [its own cached prefix, + num_blocks) of the
    prompt, which `peer_id` held when the router decided (prefix migration)."""

    peer_id: str
    num_blocks: int


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    """Where a request goes and why.

    `prefill_worker_id` is None when the decode worker prefills the prompt itself
    (conditional disaggregation, a unified worker, or an empty prefill pool). Cached counts
    are prompt blocks, per the index at decision time (0 everywhere when `index_degraded`).
    `pull_from`, when set, names the peer prefill worker whose blocks follow the prefill
    worker's cached prefix and how many of them to pull (only a policy given a transfer
    bandwidth sets it; router.routing.policies.ttft).
    """

    request_id: str
    model: str
    prefill_worker_id: str | None
    decode_worker_id: str
    num_prompt_blocks: int
    num_prompt_tokens: int
    prefill_cached_blocks: int
    decode_cached_blocks: int
    reason: str
    terms: tuple[tuple[str, float], ...] = ()
    index_degraded: bool = False
    pull_from: PrefixPull | None = None
    prefill_reported_blocks: int = 0
    decode_reported_blocks: int = 0
    """The cached counts as the workers' own KV events report them, without the blocks
    promised to prefills still in flight (router.routing.accuracy judges the index on
    these)."""
    candidates: tuple[str, ...] = ()
    """The workers of both pools the policies chose among (the trace's routing span)."""
    cached_by_worker: Mapping[str, int] = field(default_factory=dict)
    """Cached prompt blocks per worker that holds any, per the index (read only)."""

    @property
    def prefill_on_decode(self) -> bool:
        return self.prefill_worker_id is None

    @property
    def cached_blocks(self) -> int:
        """Prompt blocks the prefilling worker does not recompute."""
        return self.decode_cached_blocks if self.prefill_on_decode else self.prefill_cached_blocks

    @property
    def pulled_blocks(self) -> int:
        """Prompt blocks copied from a peer (not computed, not in the prefill worker's cache)."""
        return self.pull_from.num_blocks if self.pull_from is not None else 0


@dataclass(frozen=True, slots=True)
class Lookup:
    """One request as a decision sees it: the prompt's size and what the index says each
    worker holds of it, all read before the decision takes the lock."""

    model: str
    block_size: int
    num_blocks: int
    num_tokens: int
    num_output_tokens: int
    request_id: str | None
    prefixes: Prefixes
    """Each worker's reported and cached (promises included) prefix and its offloaded part."""
    degraded: bool
    """The index did not answer: no worker holds anything as far as we know."""
    held_blocks: Mapping[str, int]
    """Blocks each worker's cache holds, for a policy that wants them (else empty)."""
    tail_age_s: Mapping[str, float]
    """The age of each worker's LRU tail where known, with `held_blocks`."""
    adapter: str | None = None
    """The request's LoRA adapter (router.routing.adapters), None for the base model."""
