"""What this front door's requests moved between the pools: counters the admin API and the
tests read (router.cluster.request_path keeps one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TransferStats:
    num_transfers: int = 0
    num_blocks_sent: int = 0
    num_blocks_skipped: int = 0
    """Prompt blocks the decode worker already held (multi-turn reuse): never sent."""
    prefill_on_decode: int = 0
    wait_s: float = 0.0
    """Total time decode workers waited for KV after the prefill's first token."""
    prefix_pulls: int = 0
    """Prefixes copied between prefill workers (router's PrefixPull) that arrived."""
    prefix_blocks_pulled: int = 0
    """Their blocks: reused by transfer, neither computed nor in P's own cache."""
    prefix_pulls_failed: int = 0
