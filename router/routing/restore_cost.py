"""What a prefix hit in a KV offload tier costs the worker that has it: the copies back.

A block a worker holds only in its host or disk tier (engine/kv_cache/offload.py; the index
learns it from `tiered` KV events) is still a hit: the engine copies it back instead of
computing it. The copy is not free, so the prefill policies credit such a hit by what it
saves, prefill time minus this:

    R_w = sum over tiers t of  n_wt * r_wt                                      (seconds)
    n_wt  blocks of w's cached prefix only tier t holds (IndexStore.longest_prefixes)
    r_wt  seconds w takes to copy one block back from tier t: measured by w itself (its
          load reports, router.routing.step_rate.restore_s_per_block), or, until it has
          restored from that tier, the prior  B * kv_bytes_per_token / (tier_gbps[t] * 1e9)

The priors are bandwidths, not times, so they hold across models: a host tier reads at about
memory (or pinned PCIe) speed, a disk tier at about an NVMe's. On a GPU a disk copy can cost
more than the prefill it saves; then a worker that must compute the blocks wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.routing.worker_state import WorkerState

DEFAULT_TIER_GBPS = (10.0, 2.0)
"""Prior copy-back bandwidth of the host and disk tiers, GB/s."""


class RestoreCost:
    def __init__(self, tier_gbps: Sequence[float] = DEFAULT_TIER_GBPS) -> None:
        if any(g <= 0 for g in tier_gbps):
            raise ValueError(f"tier bandwidths must be > 0 GB/s, got {tuple(tier_gbps)}")
        self.tier_gbps = tuple(tier_gbps)
        self.kv_bytes_per_token = 0.0

    def set_kv_bytes_per_token(self, num_bytes: float) -> None:
        self.kv_bytes_per_token = num_bytes

    def seconds(self, worker: WorkerState, counts: Sequence[int], block_size: int) -> float:
        """R_w: seconds for `worker` to copy back `counts[t]` blocks from each tier t."""
        measured = worker.step_rate.restore_s_per_block
        total = 0.0
        for t, n in enumerate(counts):
            if not n:
                continue
            r = measured[t] if t < len(measured) else 0.0
            if r <= 0 and t < len(self.tier_gbps):
                r = block_size * self.kv_bytes_per_token / (self.tier_gbps[t] * 1e9)
            total += n * r
        return total

    def for_pool(
        self,
        workers: Sequence[WorkerState],
        offloaded: Mapping[str, Sequence[int]],
        block_size: int,
    ) -> dict[str, float]:
        """R_w of each pool worker whose cached prefix is partly in a tier."""
        return {
            w.worker_id: self.seconds(w, offloaded[w.worker_id], block_size)
            for w in workers
            if w.worker_id in offloaded
        }
