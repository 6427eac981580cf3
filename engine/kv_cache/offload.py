"""The KV offload tiers below the engine's block pool: cached blocks the pool evicts spill to
host memory, then to a file on local disk, and come back on a later prefix hit (the
LMCache / SGLang HiCache shape):

    device pool --evict--> host tier --full: its LRU--> disk tier --full: its LRU--> gone
         ^------------- restore on a prefix hit: copied into a fresh device block -------'

A tier is one tensor of slots, each a block of every layer in one piece,

    [num_slots, num_layers, 2 (K, V), block_size, num_kv_heads, head_dim]

(host: plain memory, page-locked in place when the cache is on a GPU; disk:
`torch.from_file` over an unlinked file, so the kernel pages it and nothing is left behind),
and an LRU map from block hash to its slot and tokens. A hash lives in at most one tier. It
stays there after a restore, so evicting that device block again costs no copy; the pool
tells the router a block is gone only once neither the device nor any tier holds it, and
which tier holds a block it no longer has on the device (block_pool.py): a hit costs what
the copy back costs, timed here per tier and reported with the worker's load.

Every copy is made at the moment of the eviction or the hit. On a GPU the copies between the
cache and the host tier are queued on the stream the steps run on, behind the step in
flight (a blocking copy would wait for it and lose the overlap of host and device,
engine/overlap.py): an evicted block is copied out after its last writer and before its new
owner's KV is written, a restored one is in place before the step that reads it runs. The
host reads a host slot (to move it down to disk) only once its copy from the device is done
(an event per slot), and KV arriving from another worker (written off that stream: RDMA, a
peer's copy stream) lands in blocks just reserved only after the last queued copy
(`last_copy`, which the reservation hands to the transport). Elsewhere every copy is
synchronous. Nothing depends on timings, so the TP ranks (each with its shard and its own
tiers) decide identically in lockstep.

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
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from core.device_event import DeviceEvent
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
    """Seconds the `restored` copies took: a synchronous copy by a host timer, a queued one
    (host tier, GPU) as long as the start-up's measurement of a block's copy
    (`Tier.restore_block_s`, restore_rule.py)."""


@dataclass
class Tier:
    name: str
    storage: torch.Tensor
    """[num_slots, num_layers, 2, block_size, num_kv_heads, head_dim]."""
    stats: TierStats = field(default_factory=TierStats)
    restore_block_s: float = 0.0
    """A block's copy back to the device, as measured at start-up (restore_rule.py)."""
    _lru: OrderedDict[BlockHash, tuple[int, tuple[int, ...]]] = field(default_factory=OrderedDict)
    _free: list[int] = field(default_factory=list)
    _writing: dict[int, DeviceEvent] = field(default_factory=dict)
    """Slots a queued copy from the device may still be writing: the event after it."""

    def __post_init__(self) -> None:
        self._free = list(range(self.num_slots - 1, -1, -1))

    @property
    def num_slots(self) -> int:
        return self.storage.shape[0]

    def settled(self, slot: int) -> torch.Tensor:
        """The slot's block, for the host to read: once no queued copy is writing it."""
        event = self._writing.pop(slot, None)
        if event is not None:
            event.synchronize()
        return self.storage[slot]

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
        block = list(kv_cache[:, 0].shape)
        host = torch.zeros([host_blocks, *block], dtype=kv_cache.dtype)
        self.queued = kv_cache.is_cuda
        """Copies between the cache and the host tier are queued on the current stream."""
        self._last: DeviceEvent | None = None
        """The event after the last queued copy (None: none, or it completed)."""
        if self.queued:
            _pin(host)
            weakref.finalize(self, _unpin, host, kv_cache.device)  # holds the tier till then
        self.tiers = [Tier("host", host)]
        if disk_blocks:
            disk = _file_tensor([disk_blocks, *block], kv_cache.dtype, disk_dir)
            self.tiers.append(Tier("disk", disk))
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
        for i, tier in enumerate(self.tiers):
            slot = tier.slot(block_hash, token_ids)
            if slot is not None:
                start = time.perf_counter()
                queued = self._read(i, slot, block_id)
                took = tier.restore_block_s if queued else time.perf_counter() - start
                tier.stats.restore_s += took
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
        self._write(0, slot, self.kv[:, block_id])
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
        self._read(0, slot, block_id)
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
        self._write(i, slot, src)
        tier._lru[block_hash] = (slot, token_ids)
        tier.stats.stored += 1

    def _write(self, i: int, slot: int, src: torch.Tensor) -> None:
        """Copy a block into slot `slot` of tier i: the cache's into the host tier (queued),
        a host slot's into the disk tier."""
        tier = self.tiers[i]
        queued = self.queued and i == 0
        tier.storage[slot].copy_(src, non_blocking=queued)
        if queued:
            tier._writing[slot] = self._last = self._event()

    def _read(self, i: int, slot: int, block_id: int) -> bool:
        """Copy slot `slot` of tier i into the cache's block `block_id`; whether the copy was
        queued (a host slot: only a copy from the device writes one, on the same stream)."""
        queued = self.queued and i == 0
        self.kv[:, block_id].copy_(self.tiers[i].storage[slot], non_blocking=queued)
        if queued:
            self._last = self._event()
        return queued

    def last_copy(self) -> DeviceEvent | None:
        """An event after every copy queued so far (None: none is queued, or it completed)."""
        if self._last is not None and self._last.query():
            self._last = None
        return self._last

    def _event(self) -> DeviceEvent:
        """An event after the copies queued so far (a test stands in its own)."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.kv.device))
        return event

    def _take_slot(self, i: int) -> int:
        """A free slot of tier i; when full, its least recently used block moves down a
        tier, or is gone. (Swapped blocks are not in the LRU: never taken.)"""
        tier = self.tiers[i]
        if tier._free:
            return tier._free.pop()
        old_hash, (slot, old_tokens) = tier._lru.popitem(last=False)
        tier.stats.dropped += 1
        if i + 1 < len(self.tiers):
            self._put(i + 1, old_hash, old_tokens, tier.settled(slot))
            self.on_demoted(old_hash, i + 2)
        else:
            self.on_dropped(old_hash)
        return slot

    def _forget(self, tier: Tier, block_hash: BlockHash) -> None:
        slot, _ = tier._lru.pop(block_hash)
        tier._free.append(slot)


def _pin(host: torch.Tensor) -> None:
    """Page-lock a host tensor where it is (cudaHostRegister), so that copies to and from
    the GPU can be queued. Not torch's pinned allocator: that rounds an allocation up to a
    power of two (a 65 GB tier would lock 128 GiB of host memory)."""
    size = host.numel() * host.element_size()
    error = int(torch.cuda.cudart().cudaHostRegister(host.data_ptr(), size, 0))
    if error != 0:
        raise RuntimeError(
            f"could not page-lock the host KV tier's {size / 2**30:.2f} GiB (cudaHostRegister "
            f"error {error}): lower --kv-offload-host-gb"
        )


def _unpin(host: torch.Tensor, device: torch.device) -> None:
    torch.cuda.synchronize(device)  # no copy still queued into it
    torch.cuda.cudart().cudaHostUnregister(host.data_ptr())


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
