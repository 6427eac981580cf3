"""The pool of KV blocks: ref counts, the prefix-cache map, LRU eviction, KV events.

Every block is in exactly one of three states:

    free    ref_cnt == 0, no hash           in the free queue
    cached  ref_cnt == 0, hash set          in the free queue AND in the hash map
    used    ref_cnt >  0 (hash or not)      owned by running requests

so `num_free + num_cached + num_used == num_blocks` (checked by `check_invariants`).
The free queue is ordered least recently used first: allocation takes from the front, and a
cached block taken from there is evicted (its hash dropped, a `removed` event emitted). A
cached block that a new request hits is taken out of the queue wherever it sits.

With offload tiers (`offload`, engine/kv_cache/offload.py) an evicted block's KV is copied
down a tier first: a `tiered` event says which tier holds it now (and again when it moves
down to disk), a `stored` event when a hit brings it back, and the `removed` event waits
until no tier holds it either: the router counts what the worker can serve without
recomputing, and what each block costs to bring back.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from core.events import BlockRemoved, BlockStored, BlockTiered, KVEvent
from core.hashing import BlockHash
from engine.kv_cache.offload import KVOffload


@dataclass
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()
    """The block's tokens once it is full and hashed; compared on every cache hit."""


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[BlockHash, int] = {}
        self._events: list[KVEvent] = []
        self.offload: KVOffload | None = None

    def attach(self, offload: KVOffload) -> None:
        """Spill evicted blocks to `offload`'s tiers (before any block is cached)."""
        self.offload = offload
        offload.on_dropped = self._dropped
        offload.on_demoted = self._demoted

    # -- queries -----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (free + evictable cached)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return sum(1 for i in self._free if self.blocks[i].block_hash is not None)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def lookup(self, block_hash: BlockHash, token_ids: tuple[int, ...]) -> Block | None:
        """The cached block with this hash *and* these tokens (a hash collision is a miss)."""
        block_id = self._cached.get(block_hash)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        return block if block.token_ids == token_ids else None

    def eviction_order(self) -> list[BlockHash]:
        """The cached blocks no request holds, by their hashes, in the order the next
        allocations evict them."""
        blocks = self.blocks
        return [h for i in self._free if (h := blocks[i].block_hash) is not None]

    def cached_hashes(self) -> list[BlockHash]:
        """Every block this worker holds: in its cache, or in an offload tier."""
        return list(self._cached) + [h for hashes in self.tiered_hashes() for h in hashes]

    def device_hashes(self) -> list[BlockHash]:
        """The blocks its device cache holds."""
        return list(self._cached)

    def tiered_hashes(self) -> list[list[BlockHash]]:
        """Per offload tier (host, disk), the blocks it holds that the device cache does not."""
        if self.offload is None:
            return []
        cached = self._cached
        return [[h for h in tier if h not in cached] for tier in self.offload.hashes_by_tier()]

    # -- mutations ---------------------------------------------------------------------
    def allocate(self, n: int) -> list[Block]:
        """Take `n` blocks from the LRU end of the free queue, evicting cached ones."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self._free)} available")
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[Block]) -> None:
        """Take a reference on blocks found by `lookup` (removing them from the free queue)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def release(self, blocks: list[Block], evict_first: bool = False) -> None:
        """Drop one reference each; blocks reaching zero go to the MRU end of the free queue
        in the order given (so callers pass tail blocks first: they are evicted first).
        `evict_first`: to the LRU end instead, the next allocations' first victims, in the
        same order (the first given goes first)."""
        zeroed: list[int] = []
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id} released more often than taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    self._evict(block)
                self._free[block.block_id] = None
                zeroed.append(block.block_id)
        if evict_first:
            for block_id in reversed(zeroed):
                self._free.move_to_end(block_id, last=False)

    def cache_blocks(
        self,
        blocks: list[Block],
        hashes: list[BlockHash],
        tokens: list[tuple[int, ...]],
        parent: BlockHash | None,
    ) -> None:
        """Name newly filled blocks by their chained hashes (one `stored` event for the run).

        A hash already cached by another block keeps that block as its owner: this block
        stays anonymous and is reused as plain storage once released.
        """
        if not self.enable_caching or not blocks:
            return
        run: list[BlockHash] = []
        run_parent = parent
        prev = parent
        for block, h, toks in zip(blocks, hashes, tokens, strict=True):
            if block.block_hash is None and h not in self._cached:
                block.block_hash, block.token_ids = h, toks
                self._cached[h] = block.block_id
                if not run:
                    run_parent = prev
                run.append(h)
            elif run:
                # A `stored` event is one chain: close it where a block was skipped.
                self._events.append(BlockStored(parent=run_parent, block_hashes=run))
                run = []
            prev = h
        if run:
            self._events.append(BlockStored(parent=run_parent, block_hashes=run))

    def reset_prefix_cache(self) -> bool:
        """Drop every cached (unused) block's hash. False if some block is still in use."""
        if self.num_used_blocks:
            return False
        for block_id in self._free:
            self._evict(self.blocks[block_id], spill=False)
        if self.offload is not None:
            for h in self.offload.clear():
                self._dropped(h)
        return True

    def _evict(self, block: Block, spill: bool = True) -> None:
        h = block.block_hash
        if h is None:
            return
        if self._cached.get(h) == block.block_id:
            del self._cached[h]
            if spill and self.offload is not None:
                self._tiered(h, self.offload.spill(block.block_id, h, block.token_ids))
            else:
                self._dropped(h)
        block.block_hash, block.token_ids = None, ()

    def _dropped(self, block_hash: BlockHash) -> None:
        """A hash left the device or the last tier: gone, unless the other still holds it."""
        if block_hash not in self._cached and (
            self.offload is None or not self.offload.holds(block_hash)
        ):
            self._events.append(BlockRemoved(block_hashes=[block_hash]))

    def _demoted(self, block_hash: BlockHash, tier: int) -> None:
        """A tier moved a hash down: news only if the device does not hold it too."""
        if block_hash not in self._cached:
            self._tiered(block_hash, tier)

    def _tiered(self, block_hash: BlockHash, tier: int) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockTiered) and last.tier == tier:
            last.block_hashes.append(block_hash)  # one event per run of evictions
        else:
            self._events.append(BlockTiered(block_hashes=[block_hash], tier=tier))

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    def check_invariants(self) -> None:
        used = sum(1 for b in self.blocks if b.ref_cnt > 0)
        assert all(b.ref_cnt >= 0 for b in self.blocks), "negative ref count"
        assert all(self.blocks[i].ref_cnt == 0 for i in self._free), "used block in free queue"
        free = sum(1 for i in self._free if self.blocks[i].block_hash is None)
        assert free + self.num_cached_blocks + used == self.num_blocks, (
            f"free {free} + cached {self.num_cached_blocks} + used {used} != {self.num_blocks}"
        )
        for h, block_id in self._cached.items():
            assert self.blocks[block_id].block_hash == h, "hash map out of sync"
