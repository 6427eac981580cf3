"""The cluster-wide prefix index of one model: which workers hold which KV blocks.

Data structure
    owners: dict[block hash -> int bitmask of worker slots]   (one bit per worker)
    blocks: per slot, the set of hashes that worker holds      (for purge / clear / snapshot)

Because block hashes are chained (core.hashing), block i of a prompt names its whole prefix,
so "worker w caches the first k blocks" is "w's bit is set in owners[h_0..h_{k-1}]". A match
walks the prompt's chain once, AND-ing the masks, and stops when no worker is left:

    mask = all live workers
    for i, h in enumerate(chain):
        kept = owners.get(h, 0) & mask
        workers in (mask - kept) have a longest prefix of exactly i blocks
        mask = kept; stop if empty
    workers still in mask hold the whole chain

Cost: one dict lookup and two int ops per block, independent of the number of workers
(Python ints are arbitrary-width bitsets). Memory is bounded by what the workers hold:
a removed block leaves `blocks[slot]`, and a hash whose mask becomes 0 leaves `owners`.

Offload tiers (core.events.BlockTiered): a block a worker holds only in a slower tier (host,
disk) is still in `owners` (a hit), and its bit is also set in that tier's mask map

    tiered[t]: dict[block hash -> int bitmask]   workers holding it in tier t, not on device

so `offloaded_blocks` tells, for the prefixes a match found, how many blocks of each must be
copied back rather than read in place. `stored` clears the tier bits (back on the device).
Nothing of this costs the match itself; the maps stay empty when no worker has tiers.

Sequence numbers (core.events.KVEventBatch.seq, +1 per batch per worker) keep the index
honest. Before a batch is applied:

    seq == last              duplicate            -> ignored
    seq > last + 1           gap (missed events)  -> purge the worker, mark stale, re-sync
    seq < last, seq == 0     worker restarted     -> purge the worker
    seq < last, seq > 0      regression           -> purge the worker, mark stale, re-sync,
                                                     and skip the batch (it may be a replay)
    unknown worker, seq > 0  joined mid-life      -> mark stale, re-sync
A batch whose first event is `AllBlocksCleared` is self-contained (it is how a worker answers
a re-sync: [cleared, stored(...), ...]), so it is applied whatever its seq and clears the
stale mark. Workers must also open their life (start or restart) with such a batch: a
restart whose first batch is a plain seq 0 cannot be told from a duplicate of seq 0.
A stale worker's entries are a subset of the truth (only events seen since the purge):
the index may under-estimate a stale worker's cache, never over-estimate it.

Threading: not thread-safe by itself; the store that owns it serialises writers and readers
with one lock (see router.routing.index.store).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping, Sequence

from core.events import (
    TIER_NAMES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    BlockTiered,
    KVEventBatch,
)

logger = logging.getLogger(__name__)


class ApplyOutcome(enum.Enum):
    """What `apply` did with a batch; the stores turn the `needs_resync` ones into requests."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    GAP = "gap"
    RESTART = "restart"
    REGRESSION = "regression"
    UNKNOWN = "unknown"

    @property
    def needs_resync(self) -> bool:
        return self in (ApplyOutcome.GAP, ApplyOutcome.REGRESSION, ApplyOutcome.UNKNOWN)


def classify_seq(last: int | None, seq: int, self_contained: bool) -> ApplyOutcome:
    """The sequence-number rule of the module docstring (shared with the Redis Lua script)."""
    if seq < 0:
        raise ValueError(f"KVEventBatch.seq must be >= 0, got {seq}")
    if last is None:
        return ApplyOutcome.APPLIED if seq == 0 or self_contained else ApplyOutcome.UNKNOWN
    if self_contained:  # idempotent, so even a repeated seq is applied
        return ApplyOutcome.RESTART if seq < last else ApplyOutcome.APPLIED
    if seq == last:
        return ApplyOutcome.DUPLICATE
    if seq < last:
        return ApplyOutcome.RESTART if seq == 0 else ApplyOutcome.REGRESSION
    if seq > last + 1:
        return ApplyOutcome.GAP
    return ApplyOutcome.APPLIED


class PrefixIndex:
    """Per-model map block hash -> workers holding it, with per-worker sequence tracking."""

    def __init__(self, model: str = "") -> None:
        self.model = model
        self._owners: dict[int, int] = {}
        self._tiered: list[dict[int, int]] = [{} for _ in TIER_NAMES[1:]]
        self._slot_of: dict[str, int] = {}
        self._worker_of_slot: list[str | None] = []
        self._blocks: list[set[int]] = []
        self._free_slots: list[int] = []
        self._live_mask = 0
        self._last_seq: dict[str, int] = {}
        self._stale: set[str] = set()

    # ---- workers -------------------------------------------------------------------------

    def add_worker(self, worker_id: str) -> bool:
        """Give the worker a slot; returns False if it already had one."""
        if worker_id in self._slot_of:
            return False
        if self._free_slots:
            slot = self._free_slots.pop()
            self._worker_of_slot[slot] = worker_id
        else:
            slot = len(self._worker_of_slot)
            self._worker_of_slot.append(worker_id)
            self._blocks.append(set())
        self._slot_of[worker_id] = slot
        self._live_mask |= 1 << slot
        return True

    def remove_worker(self, worker_id: str) -> None:
        """Forget the worker: purge its entries, its sequence number, and free its slot."""
        slot = self._slot_of.pop(worker_id, None)
        if slot is None:
            return
        self._purge_slot(slot)
        self._worker_of_slot[slot] = None
        self._free_slots.append(slot)
        self._live_mask &= ~(1 << slot)
        self._last_seq.pop(worker_id, None)
        self._stale.discard(worker_id)

    def purge(self, worker_id: str) -> None:
        """Drop every entry of the worker (its slot and sequence number stay)."""
        slot = self._slot_of.get(worker_id)
        if slot is not None:
            self._purge_slot(slot)

    def _purge_slot(self, slot: int) -> None:
        clear = ~(1 << slot)
        owners = self._owners
        for h in self._blocks[slot]:
            m = owners[h] & clear
            if m:
                owners[h] = m
            else:
                del owners[h]
        self._untier(slot, self._blocks[slot])
        self._blocks[slot] = set()

    # ---- events --------------------------------------------------------------------------

    def apply(self, batch: KVEventBatch) -> ApplyOutcome:
        """Apply one worker's batch under the sequence rule; see the module docstring."""
        worker_id = batch.worker_id
        self_contained = bool(batch.events) and isinstance(batch.events[0], AllBlocksCleared)
        outcome = classify_seq(self._last_seq.get(worker_id), batch.seq, self_contained)
        if outcome is ApplyOutcome.DUPLICATE:
            return outcome
        self.add_worker(worker_id)
        if outcome is not ApplyOutcome.APPLIED:
            self.purge(worker_id)
        if outcome.needs_resync:
            self._stale.add(worker_id)
            logger.warning(
                "kv index %r: worker %s %s (seq %s after %s): purged, re-sync needed",
                self.model,
                worker_id,
                outcome.value,
                batch.seq,
                self._last_seq.get(worker_id),
            )
        elif self_contained or batch.seq == 0:
            self._stale.discard(worker_id)  # the worker's whole history is in this view
        self._last_seq[worker_id] = batch.seq
        if outcome is ApplyOutcome.REGRESSION:
            return outcome
        slot = self._slot_of[worker_id]
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(slot, event.block_hashes)
            elif isinstance(event, BlockTiered):
                self._tier(slot, event.block_hashes, event.tier)
            elif isinstance(event, BlockRemoved):
                self._remove(slot, event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self._purge_slot(slot)
            else:
                raise TypeError(f"unknown KV event {event!r}")
        return outcome

    def _store(self, slot: int, hashes: Iterable[int]) -> None:
        bit = 1 << slot
        owners = self._owners
        held = self._blocks[slot]
        for h in hashes:
            if h not in held:
                held.add(h)
                owners[h] = owners.get(h, 0) | bit
        self._untier(slot, hashes)

    def _tier(self, slot: int, hashes: Sequence[int], tier: int) -> None:
        """The worker holds these blocks in offload tier `tier` now, not on its device."""
        if not 1 <= tier <= len(self._tiered):
            raise ValueError(f"unknown KV tier {tier}; tiers are 1..{len(self._tiered)}")
        self._store(slot, hashes)
        bit = 1 << slot
        tiered = self._tiered[tier - 1]
        for h in hashes:
            tiered[h] = tiered.get(h, 0) | bit

    def _untier(self, slot: int, hashes: Iterable[int]) -> None:
        """Clear the worker's tier bits of these blocks (no work while no tier is used)."""
        clear = ~(1 << slot)
        for tiered in self._tiered:
            if not tiered:
                continue
            for h in hashes:
                m = tiered.get(h)
                if m is not None:
                    m &= clear
                    if m:
                        tiered[h] = m
                    else:
                        del tiered[h]

    def _remove(self, slot: int, hashes: Iterable[int]) -> None:
        clear = ~(1 << slot)
        owners = self._owners
        held = self._blocks[slot]
        for h in hashes:
            if h in held:
                held.discard(h)
                m = owners[h] & clear
                if m:
                    owners[h] = m
                else:
                    del owners[h]
        self._untier(slot, hashes)

    def load_worker(
        self,
        worker_id: str,
        seq: int | None,
        hashes: Iterable[int],
        stale: bool = False,
        tiers: Mapping[int, int] | None = None,
    ) -> None:
        """Replace the worker's entries by a snapshot taken at `seq` (Redis rebuild);
        `tiers` maps the blocks it holds in an offload tier to that tier's number."""
        self.add_worker(worker_id)
        self.purge(worker_id)
        slot = self._slot_of[worker_id]
        self._store(slot, hashes)
        for h, tier in (tiers or {}).items():
            self._tier(slot, [h], tier)
        if seq is None:
            self._last_seq.pop(worker_id, None)
        else:
            self._last_seq[worker_id] = seq
        if stale:
            self._stale.add(worker_id)
        else:
            self._stale.discard(worker_id)

    # ---- queries -------------------------------------------------------------------------

    def longest_prefixes(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Longest cached prefix (in blocks) of the chain on each worker; workers with 0 are
        left out. Does not modify the index."""
        owners_get = self._owners.get
        mask = self._live_mask
        found: dict[str, int] = {}
        for depth, h in enumerate(block_hashes):
            kept = owners_get(h, 0) & mask
            if kept != mask:
                if depth:
                    self._record(mask ^ kept, depth, found)  # kept is a subset of mask
                mask = kept
                if not mask:
                    return found
        if mask and block_hashes:
            self._record(mask, len(block_hashes), found)
        return found

    def offloaded_blocks(
        self, block_hashes: Sequence[int], prefixes: Mapping[str, int]
    ) -> dict[str, list[int]]:
        """Of each worker's prefix in `prefixes` (as `longest_prefixes` found it), the blocks
        only an offload tier holds, counted per tier (host, disk); workers with none are
        left out. O(1) while no worker reported a tier."""
        if not prefixes or not any(self._tiered):
            return {}
        tiers = [(t, tiered) for t, tiered in enumerate(self._tiered) if tiered]
        depth_of = {self._slot_of[w]: d for w, d in prefixes.items() if w in self._slot_of}
        found: dict[int, list[int]] = {}
        for depth, h in enumerate(block_hashes[: max(depth_of.values(), default=0)]):
            for t, tiered in tiers:
                bits = tiered.get(h, 0)
                while bits:
                    low = bits & -bits
                    bits ^= low
                    slot = low.bit_length() - 1
                    if depth < depth_of.get(slot, 0):
                        found.setdefault(slot, [0] * len(self._tiered))[t] += 1
        names = self._worker_of_slot
        return {names[slot]: counts for slot, counts in found.items()}  # type: ignore[misc]

    def _record(self, bits: int, depth: int, found: dict[str, int]) -> None:
        names = self._worker_of_slot
        while bits:
            low = bits & -bits
            found[names[low.bit_length() - 1]] = depth  # type: ignore[index]
            bits ^= low

    def worker_blocks(self, worker_id: str) -> frozenset[int]:
        slot = self._slot_of.get(worker_id)
        return frozenset() if slot is None else frozenset(self._blocks[slot])

    def num_blocks(self, worker_id: str) -> int:
        slot = self._slot_of.get(worker_id)
        return 0 if slot is None else len(self._blocks[slot])

    def block_counts(self) -> dict[str, int]:
        """Blocks each worker holds, as far as this view knows."""
        return {w: len(self._blocks[slot]) for w, slot in self._slot_of.items()}

    def last_seq(self, worker_id: str) -> int | None:
        return self._last_seq.get(worker_id)

    @property
    def workers(self) -> list[str]:
        return list(self._slot_of)

    @property
    def stale_workers(self) -> frozenset[str]:
        return frozenset(self._stale)

    @property
    def num_hashes(self) -> int:
        """Distinct block hashes indexed (memory is O(this + total entries))."""
        return len(self._owners)

    @property
    def num_entries(self) -> int:
        """(worker, block) pairs indexed."""
        return sum(len(b) for b in self._blocks)
