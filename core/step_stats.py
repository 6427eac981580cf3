"""Where a worker's engine steps go: totals since the worker started, reported with its load.

Totals rather than samples, so any reader (several front doors, a scrape every few seconds)
gets exact rates from two reports: mean forward time per step = Δforward_s / Δsteps, prefill
throughput = Δprefill_tokens / Δforward_s, and so on. `attention_s` is the part of
`forward_s` spent in attention; it is measured only where kernels run synchronously (CPU),
and stays 0 on GPUs, where a host timer would measure launches.
"""

from __future__ import annotations

import msgspec

PHASES = ("schedule", "forward", "attention", "sample", "output", "between")
"""The `*_s` fields, in step order (attention is inside forward; between is not a step's)."""


class StepTotals(msgspec.Struct):
    steps: int = 0
    overlapped_steps: int = 0
    """Steps launched while the step before was still on the device (engine/overlap.py):
    `steps` on a GPU serving plain decodes; fewer where rows needed their tokens first."""
    decode_rows: int = 0
    """Rows of one new token: a running request's next token."""
    prefill_tokens: int = 0
    """Tokens of prompt chunks (prefill work)."""
    prefill_pairs: int = 0
    """Their attention's size, `core.perf.attention_pairs` summed over the chunks (the part of a
    prefill that grows with its context: the router splits `attention_s` by it,
    router.routing.step_rate)."""
    schedule_s: float = 0.0
    forward_s: float = 0.0
    attention_s: float = 0.0
    sample_s: float = 0.0
    """LM head, logits processing and sampling."""
    output_s: float = 0.0
    """Detokenising, stop checks and building the deltas."""
    between_s: float = 0.0
    """The serving loop's time between two steps while the engine had work (engine.
    async_engine): publishing a step's outputs, after-step hooks, the commands run before
    the next step (admitting a transferred prompt, queueing a new one). Not in `busy_s`: a
    decode request waits through it between two tokens all the same, so a served step's
    pace is busy + between per step (0 offline, where nothing runs between steps)."""
    draft_tokens: int = 0
    """Speculative tokens verified (engine/spec); not in decode_rows or prefill_tokens."""
    accepted_tokens: int = 0
    """Of those, accepted: tokens a step emitted beyond its one per request."""
    spilled_blocks: int = 0
    """KV offload (engine/kv_cache/offload.py): blocks the cache evicted into the host tier,"""
    restored_blocks: int = 0
    """blocks copied back from any tier on a prefix hit instead of being recomputed,"""
    swapped_blocks: int = 0
    """and preempted requests' partial blocks swapped out (each comes back on resuming)."""
    tier_restored_blocks: list[int] = msgspec.field(default_factory=list)
    """Per offload tier (host, disk): blocks restored from it,"""
    tier_restore_s: list[float] = msgspec.field(default_factory=list)
    """and the seconds those copies took (what the router credits a hit in that tier by)."""

    def busy_s(self) -> float:
        """Seconds spent in steps, every phase (attention is inside forward)."""
        return self.schedule_s + self.forward_s + self.sample_s + self.output_s

    def seconds(self) -> dict[str, float]:
        return {phase: getattr(self, f"{phase}_s") for phase in PHASES}
