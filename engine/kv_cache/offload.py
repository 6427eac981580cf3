"""The KV offload tiers below the engine's block pool: cached blocks the pool evicts spill to
host memory, then to a file on local disk, and come back on a later prefix hit (the
LMCache / SGLang HiCache shape):

    device pool --evict--> host tier --full: its LRU--> disk tier --full: its LRU--> gone
         ^------------- restore on a prefix hit: copied into a fresh device block -------'

A tier is one tensor shaped like the device cache, with slots for blocks,

    [num_layers, num_slots, 2 (K, V), block_size, num_kv_heads, head_dim]

(host: plain memory, pinned when the cache is on a GPU; disk: `torch.from_file` over an
unlinked file, so the kernel pages it and nothing is left behind), and an LRU map from
block hash to its slot and tokens. A hash lives in at most one tier. It stays there after a
restore, so evicting that device block again costs no copy; the pool tells the router a
block is gone only once neither the device nor any tier holds it, and which tier holds a
block it no longer has on the device (block_pool.py): a hit costs what the copy back costs,
timed here per tier and reported with the worker's load.

Every copy is synchronous, at the moment of the eviction or the hit: an evicted block is
copied out before anyone can write its new owner's KV, a restored one is in place before
the step that reads it is scheduled. Nothing depends on timings, so the TP ranks (each with
its shard and its own tiers) decide identically in lockstep.

Swap preemption uses the host tier too: a preempted request's full blocks stay in the cache
(and spill here if evicted while it waits), and its partial last block, which has no hash,
is swapped into a host slot of its own until the request resumes (`swap_out` / `swap_in`).
Swaps may hold at most half the host tier, so spilled prefixes always keep room.

A hit is always restored from a tier the worker keeps; which tiers it keeps is measured at
start-up (restore_rule.py: a tier whose copy back costs more than recomputing the block is
dropped, with the tiers below it).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from core.hashing import BlockHash


@dataclass
class TierStats:
    stored: int = 0
    """Blocks copied into this tier (spilled from the device or demoted from above)."""
    restored: int = 0
    """Blocks copied back into the device cache from here."""
    dropped: int = 0
    """Blocks this tier let go of (to the tier below, or gone)."""
    restore_s: float = 0.0
    """Seconds the `restored` copies took (synchronous copies: a host timer measures them)."""


@dataclass
class Tier:
    name: str
    storage: torch.Tensor
    """[num_layers, num_slots, 2, block_size, num_kv_heads, head_dim]."""
    stats: TierStats = field(default_factory=TierStats)
    _lru: OrderedDict[BlockHash, tuple[int, tuple[int, ...]]] = field(default_factory=OrderedDict)
    _free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._free = list(range(self.num_slots - 1, -1, -1))

    @property
    def num_slots(self) -> int:
        return self.storage.shape[1]

    def __len__(self) -> int:
        return len(self._lru)

    def slot(self, block_hash: BlockHash, token_ids: tuple[int, ...]) -> int | None:
        """The slot holding this hash *and* these tokens (a hash collision is a miss)."""
        entry = self._lru.get(block_hash)
        return entry[0] if entry is not None and entry[1] == token_ids else None


class KVOffload:
    """The tiers of one engine (one TP rank), and the copies between them and its cache."""

    def __init__(
        self,
        kv_cache: torch.Tensor,
        host_blocks: int,
        disk_blocks: int = 0,
        disk_dir: str | None = None,
    ) -> None:
        if host_blocks < 1 or disk_blocks < 0:
            raise ValueError("the host tier needs a block at least; the disk tier none or more")
        self.kv = kv_cache
        shape = list(kv_cache.shape)
        shape[1] = host_blocks
        # Pageable: a block is a strided slice here and in the cache, so its copies go
        # through contiguous temporaries either way, and torch's pinned allocator rounds a
        # tier up to a power of two (a 65 GB tier would lock 128 GiB of host memory).
        host = torch.zeros(shape, dtype=kv_cache.dtype)
        self.tiers = [Tier("host", host)]
        if disk_blocks:
            shape[1] = disk_blocks
            self.tiers.append(Tier("disk", _file_tensor(shape, kv_cache.dtype, disk_dir)))
        self.on_dropped: Callable[[BlockHash], None] = lambda block_hash: None
        """Set by the pool: a hash left the last tier (it tells the router if it is gone)."""
        self.on_demoted: Callable[[BlockHash, int], None] = lambda block_hash, tier: None
        """Set by the pool: a hash moved down to tier number `tier` (1 host, 2 disk)."""
        self._swapped: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        """Preempted requests' partial last blocks: request id -> (host slot, the block's
        index in the request's table, its tokens)."""
        self.num_swapped_out = 0
        self.num_swapped_in = 0

    @classmethod
    def sized(
        cls, kv_cache: torch.Tensor, host_bytes: int, disk_bytes: int, disk_dir: str | None
    ) -> KVOffload:
        """Tiers of the given sizes in bytes (whole blocks; the host tier holds one at least)."""
        block = cls.block_bytes(kv_cache)
        return cls(kv_cache, max(1, host_bytes // block), disk_bytes // block, disk_dir)

    @staticmethod
    def block_bytes(kv_cache: torch.Tensor) -> int:
        """Bytes one block takes in a tier (every layer's K and V)."""
        return kv_cache[:, 0].numel() * kv_cache.element_size()

    def keep_tiers(self, count: int) -> None:
        """Keep the first `count` tiers (engine/kv_cache/restore_rule.py drops the others
        before any block is stored)."""
        if self.hashes() or self._swapped:
            raise RuntimeError("tiers are chosen before any block is stored")
        self.tiers = self.tiers[:count]

    # -- queries -------------------------------------------------------------------------
    def find(self, block_hash: BlockHash, token_ids: tuple[int, ...]) -> Tier | None:
        for tier in self.tiers:
            if tier.slot(block_hash, token_ids) is not None:
                return tier
        return None

    def holds(self, block_hash: BlockHash) -> bool:
        return any(block_hash in tier._lru for tier in self.tiers)

    def hashes(self) -> list[BlockHash]:
        return [h for tier in self.tiers for h in tier._lru]

    def hashes_by_tier(self) -> list[list[BlockHash]]:
        """What each tier holds, host first."""
        return [list(tier._lru) for tier in self.tiers]

    # -- moves ---------------------------------------------------------------------------
    def spill(self, block_id: int, block_hash: BlockHash, token_ids: tuple[int, ...]) -> int:
        """The pool evicts device block `block_id`: keep its KV (no copy if a tier has it).
        Returns the number of the tier that holds it now (1 host, 2 disk)."""
        for i, tier in enumerate(self.tiers):
            entry = tier._lru.get(block_hash)
            if entry is None:
                continue
            if entry[1] == token_ids:
                tier._lru.move_to_end(block_hash)
                return i + 1
            self._forget(tier, block_hash)  # a collision: the newer block wins the name
        self._put(0, block_hash, token_ids, self.kv[:, block_id])
        return 1

    def restore(self, block_hash: BlockHash, token_ids: tuple[int, ...], block_id: int) -> bool:
        """Copy a held block into device block `block_id`; False if no tier holds it."""
        for tier in self.tiers:
            slot = tier.slot(block_hash, token_ids)
            if slot is not None:
                start = time.perf_counter()
                self.kv[:, block_id].copy_(tier.storage[:, slot])
                tier.stats.restore_s += time.perf_counter() - start
                tier._lru.move_to_end(block_hash)
                tier.stats.restored += 1
                return True
        return False

    def swap_out(
        self, request_id: str, block_id: int, index: int, token_ids: tuple[int, ...]
    ) -> bool:
        """Keep device block `block_id`, block `index` of a preempted request, until it
        resumes; False (nothing kept) when swaps already hold half the host tier."""
        host = self.tiers[0]
        if len(self._swapped) >= host.num_slots // 2:
            return False
        slot = self._take_slot(0)
        host.storage[:, slot].copy_(self.kv[:, block_id])
        self._swapped[request_id] = (slot, index, token_ids)
        self.num_swapped_out += 1
        return True

    def swapped(self, request_id: str) -> tuple[int, tuple[int, ...]] | None:
        """(index in the request's table, tokens) of its swapped block, if it has one."""
        entry = self._swapped.get(request_id)
        return None if entry is None else (entry[1], entry[2])

    def swap_in(self, request_id: str, block_id: int) -> None:
        """Copy the request's swapped block into device block `block_id`, and let it go."""
        slot, _, _ = self._swapped.pop(request_id)
        self.kv[:, block_id].copy_(self.tiers[0].storage[:, slot])
        self.tiers[0]._free.append(slot)
        self.num_swapped_in += 1

    def drop_swap(self, request_id: str) -> None:
        entry = self._swapped.pop(request_id, None)
        if entry is not None:
            self.tiers[0]._free.append(entry[0])

    def clear(self) -> list[BlockHash]:
        """Drop everything (a prefix-cache reset); returns the hashes dropped."""
        dropped = self.hashes()
        for tier in self.tiers:
            while tier._lru:
                self._forget(tier, next(iter(tier._lru)))
        return dropped

    def _put(
        self, i: int, block_hash: BlockHash, token_ids: tuple[int, ...], src: torch.Tensor
    ) -> None:
        tier = self.tiers[i]
        slot = self._take_slot(i)
        tier.storage[:, slot].copy_(src)
        tier._lru[block_hash] = (slot, token_ids)
        tier.stats.stored += 1

    def _take_slot(self, i: int) -> int:
        """A free slot of tier i; when full, its least recently used block moves down a
        tier, or is gone. (Swapped blocks are not in the LRU: never taken.)"""
        tier = self.tiers[i]
        if tier._free:
            return tier._free.pop()
        old_hash, (slot, old_tokens) = tier._lru.popitem(last=False)
        tier.stats.dropped += 1
        if i + 1 < len(self.tiers):
            self._put(i + 1, old_hash, old_tokens, tier.storage[:, slot])
            self.on_demoted(old_hash, i + 2)
        else:
            self.on_dropped(old_hash)
        return slot

    def _forget(self, tier: Tier, block_hash: BlockHash) -> None:
        slot, _ = tier._lru.pop(block_hash)
        tier._free.append(slot)


def _file_tensor(shape: list[int], dtype: torch.dtype, directory: str | None) -> torch.Tensor:
    """A zeroed tensor backed by a file on local disk. The file is unlinked at once: the
    mapping keeps it alive, and a crash leaves nothing behind."""
    numel = 1
    for n in shape:
        numel *= n
    fd, path = tempfile.mkstemp(prefix="baton-kv-offload-", suffix=".bin", dir=directory)
    try:
        os.ftruncate(fd, numel * torch.empty((), dtype=dtype).element_size())
        flat = torch.from_file(path, shared=True, size=numel, dtype=dtype)
    finally:
        os.close(fd)
        os.unlink(path)
    return flat.view(shape)
