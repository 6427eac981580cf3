"""Where a routing policy's misses come from, block by block, against the pooled-LRU oracle.

For each request, just before the chosen worker w serves it (planner.sim.prefill_pool.simulate calls
`observe`), with the prompt's chain of n blocks:

    h   blocks w holds as a prefix (its hit)          a   the longest prefix any worker holds
    s   the longest prefix of blocks seen before      o   the pooled oracle's hit (in lockstep)

    [0 ........ h) hit   [h ....... a) routed away   [a ........ s) evicted   [s ..... n) cold
                          another worker held them    computed before, no     never seen:
                          (split: its queue was       worker holds them now   every cache
                          longer than w's, or not)                            misses them

The gap to the oracle is  o - h = (a - h) + (o - a): blocks routed away from their holder,
plus blocks the pooled cache kept and no single worker did (capacity lost to copies of the
same block on several workers, to one worker's cache churning faster than another's, or to
a prompt longer than one worker's cache). `dup` samples how many of the blocks the workers
hold are copies (1 - unique / held). Counts are blocks; the table prints shares of all
prompt blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from loadgen.traces import TraceRequest
from planner.sim.prefill import SimWorker, prefix_length, store_chain


@dataclass
class MissLedger:
    capacity: int
    """The oracle's capacity: every worker's blocks pooled."""
    sample_every: int = 50
    blocks: int = 0
    hit: int = 0
    transferred: int = 0
    away_busy: int = 0
    away_other: int = 0
    evicted: int = 0
    cold: int = 0
    oracle_hit: int = 0
    pooled_kept: int = 0
    """Blocks the oracle hit beyond any worker's longest prefix (o - a where positive)."""
    dup_samples: list[float] = field(default_factory=list)
    _oracle: OrderedDict[int, None] = field(default_factory=OrderedDict)
    _seen: set[int] = field(default_factory=set)
    _n: int = 0

    def observe(
        self,
        r: TraceRequest,
        chosen: SimWorker,
        workers: list[SimWorker],
        now_ms: float,
        pulled: int = 0,
    ) -> None:
        """Called before `chosen` serves `r`; `pulled` blocks come from a peer by transfer."""
        hashes = r.hash_ids
        prefixes = {w.worker_id: prefix_length(hashes, w.cache) for w in workers}
        h = prefixes[chosen.worker_id]
        holder = max(workers, key=lambda w: prefixes[w.worker_id])
        a = prefixes[holder.worker_id]
        s = prefix_length(hashes, self._seen)
        reused = max(h, min(a, h + pulled))
        self.blocks += len(hashes)
        self.hit += h
        self.transferred += reused - h
        if a > reused:
            if holder.busy_until > max(now_ms, chosen.busy_until):
                self.away_busy += a - reused
            else:
                self.away_other += a - reused
        self.evicted += s - a
        self.cold += len(hashes) - s
        o = prefix_length(hashes, self._oracle)
        self.oracle_hit += o
        self.pooled_kept += max(0, o - a)
        store_chain(self._oracle, hashes, self.capacity)
        self._seen.update(hashes)
        self._n += 1
        if self._n % self.sample_every == 0:
            held = sum(len(w.cache) for w in workers)
            unique = len(set().union(*(w.cache.keys() for w in workers)))
            self.dup_samples.append(1 - unique / held if held else 0.0)

    def summary(self) -> dict[str, float]:
        """Shares of all prompt blocks (the oracle's figures too, for the gap)."""
        total = self.blocks or 1
        dup = self.dup_samples
        return {
            "hit": self.hit / total,
            "transferred": self.transferred / total,
            "routed_away_holder_busier": self.away_busy / total,
            "routed_away_other": self.away_other / total,
            "evicted_everywhere": self.evicted / total,
            "cold": self.cold / total,
            "oracle_hit": self.oracle_hit / total,
            "pooled_kept_no_worker_did": self.pooled_kept / total,
            "duplicate_share": sum(dup) / len(dup) if dup else 0.0,
        }
