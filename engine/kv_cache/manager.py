"""Per-request block tables on top of the block pool, and prefix-cache lookups.

A request's blocks cover its tokens in order; block i holds tokens [i*bs, (i+1)*bs):

    tokens  |0 ........ 15|16 ....... 31|32 .. 40      |
    blocks  |   b[0]      |   b[1]      |   b[2] (partial: no hash yet)
            `-- cached hit (num_cached) --'`-- computed this step --> hashed once full

Predicates pair with actions: `can_allocate` / `allocate_slots`. Nothing here touches tensors
but the offload tiers' copies (a prefix hit they hold is restored into a fresh block; a
preempted request's partial last block is swapped out and back).
"""

from __future__ import annotations

from core.device_event import DeviceEvent
from core.hashing import BlockHash, hash_prompt_blocks
from engine.kv_cache.block_pool import Block, BlockPool
from engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(
        self, num_blocks: int, block_size: int, root_hash: BlockHash, enable_caching: bool = True
    ) -> None:
        self.block_size = block_size
        self.root_hash = root_hash
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self._blocks: dict[str, list[Block]] = {}
        self._num_hashed: dict[str, int] = {}
        """Per request: how many of its leading blocks are already named in the cache."""
        self.num_prompt_tokens = 0
        self.num_cached_prompt_tokens = 0
        """Totals over this cache's life: its prefix-hit rate is their ratio."""

    # -- hashing -------------------------------------------------------------------------
    def update_hashes(self, req: Request) -> None:
        """Extend `req.block_hashes` to every full block of its tokens (each hashed once)."""
        start = len(req.block_hashes)
        if (start + 1) * self.block_size > req.num_tokens:
            return
        parent = req.block_hashes[-1] if start else None
        req.block_hashes.extend(
            hash_prompt_blocks(
                req.all_token_ids,
                self.block_size,
                self.root_hash,
                req.hash_extra,
                start_parent=parent,
                start_block=start,
            )
        )

    # -- prefix cache --------------------------------------------------------------------
    def get_computed_blocks(self, req: Request) -> list[Block]:
        """The longest run of cached blocks at the start of `req`'s tokens. Stops one token
        short of the end: the last token is always computed, to produce logits."""
        if not self.enable_caching:
            return []
        self.update_hashes(req)
        bs = self.block_size
        max_blocks = (req.num_tokens - 1) // bs
        pool, offload = self.pool, self.pool.offload
        hits: list[Block] = []
        pinned = False  # restoring allocates: from the first restore on, hits hold a ref
        for i, h in enumerate(req.block_hashes[:max_blocks]):
            tokens = tuple(req.all_token_ids[i * bs : (i + 1) * bs])
            block = pool.lookup(h, tokens)
            if block is None and offload is not None and offload.find(h, tokens) is not None:
                if not pinned:
                    pool.touch(hits)
                    pinned = True
                block = self._restore(h, tokens, req.block_hashes[i - 1] if i else None)
            elif block is not None and pinned:
                pool.touch([block])
            if block is None:
                break
            hits.append(block)
        if pinned:
            pool.release(list(reversed(hits)))  # tail first, as `free` does
        return hits

    def _restore(
        self, h: BlockHash, tokens: tuple[int, ...], parent: BlockHash | None
    ) -> Block | None:
        """Copy an offloaded block into a fresh device block and cache it there (ref 1);
        None if no block is free, or the allocation's own spill pushed it out of the tiers."""
        pool, offload = self.pool, self.pool.offload
        assert offload is not None
        if not pool.num_free_blocks:
            return None
        [fresh] = pool.allocate(1)  # evicting (spilling) another may move h down a tier
        if not offload.restore(h, tokens, fresh.block_id):
            pool.release([fresh])
            return None
        pool.cache_blocks([fresh], [h], [tokens], parent)
        return fresh

    def record_prompt(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        """A request's prefix-cache lookup is final (it was first scheduled or reserved)."""
        self.num_prompt_tokens += num_prompt_tokens
        self.num_cached_prompt_tokens += num_cached_tokens

    # -- allocation ----------------------------------------------------------------------
    def num_blocks_needed(self, req: Request, num_new_tokens: int, num_hit_blocks: int) -> int:
        held = len(self._blocks.get(req.request_id, ())) + num_hit_blocks
        computed = req.num_computed_tokens + num_hit_blocks * self.block_size
        return max(0, cdiv(computed + num_new_tokens, self.block_size) - held)

    def can_allocate(
        self, req: Request, num_new_tokens: int, hits: list[Block] | None = None
    ) -> bool:
        hits = hits or []
        # Hit blocks sitting in the free queue stop being allocatable once we take them.
        num_hits_free = sum(1 for b in hits if b.ref_cnt == 0)
        need = self.num_blocks_needed(req, num_new_tokens, len(hits))
        return need <= self.pool.num_free_blocks - num_hits_free

    def allocate_slots(
        self, req: Request, num_new_tokens: int, hits: list[Block] | None = None
    ) -> bool:
        """Give `req` blocks for `num_new_tokens` more tokens (after taking `hits`, its
        prefix-cache hit). False, and nothing changed, if the pool cannot."""
        hits = hits or []
        if not self.can_allocate(req, num_new_tokens, hits):
            return False
        need = self.num_blocks_needed(req, num_new_tokens, len(hits))
        blocks = self._blocks.setdefault(req.request_id, [])
        if hits:
            self.pool.touch(hits)
            blocks.extend(hits)
            self._num_hashed[req.request_id] = len(blocks)
        blocks.extend(self.pool.allocate(need))
        return True

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self._blocks.get(request_id, ())]

    def queued_copies(self) -> DeviceEvent | None:
        """An event after the offload tiers' queued copies (offload.py), None if none is
        pending: what blocks just allocated must wait for before anything writes them off
        the steps' stream (KV arriving from another worker)."""
        return None if self.pool.offload is None else self.pool.offload.last_copy()

    def cache_computed_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        """Name every block of `req` whose first `num_tokens` tokens (default: the computed
        ones) fill it, so later requests hit it.

        The scheduler calls this for the tokens a step *will* compute: a request admitted
        later in the same step may then hit those blocks, which is safe because every
        attention backend writes the whole step's K/V before any attention reads it.
        """
        if not self.enable_caching:
            return
        self.update_hashes(req)
        blocks = self._blocks.get(req.request_id)
        if not blocks:
            return
        if num_tokens is None:
            num_tokens = req.num_computed_tokens
        done = self._num_hashed.get(req.request_id, 0)
        full = min(num_tokens // self.block_size, len(req.block_hashes), len(blocks))
        if full <= done:
            return
        bs = self.block_size
        self.pool.cache_blocks(
            blocks[done:full],
            req.block_hashes[done:full],
            [tuple(req.all_token_ids[i * bs : (i + 1) * bs]) for i in range(done, full)],
            parent=req.block_hashes[done - 1] if done else None,
        )
        self._num_hashed[req.request_id] = full

    def free(self, req: Request, evict_first: bool = False) -> None:
        """Release `req`'s blocks, tail first, so its prefix outlives its tail in the LRU
        (and drop its swapped tail: it ended). `evict_first`: blocks no other request holds
        become the first the cache evicts (block_pool.BlockPool.release)."""
        if self.pool.offload is not None:
            self.pool.offload.drop_swap(req.request_id)
        self._release(req, evict_first)

    def preempt(self, req: Request) -> None:
        """Release a preempted request's blocks, swapping its partial last block out to the
        host tier first (with offload tiers): its full blocks stay cached, so on resuming
        it restores everything it had computed (`swapped_tail`, `resume_tail`)."""
        offload, blocks = self.pool.offload, self._blocks.get(req.request_id)
        if offload is not None and blocks and req.params.prompt_logprobs is None:
            full, partial = divmod(req.num_computed_tokens, self.block_size)
            if partial and full < len(blocks):
                start = full * self.block_size
                tokens = tuple(req.all_token_ids[start : req.num_computed_tokens])
                offload.swap_out(req.request_id, blocks[full].block_id, full, tokens)
        self._release(req)

    def swapped_tail(self, req: Request, num_hit_blocks: int) -> int:
        """How many tokens of `req`'s swapped-out tail can come back after a prefix hit of
        `num_hit_blocks` (0: none, or it does not follow that hit)."""
        offload = self.pool.offload
        entry = offload.swapped(req.request_id) if offload is not None else None
        if entry is None:
            return 0
        index, tokens = entry
        start = index * self.block_size
        held = tuple(req.all_token_ids[start : start + len(tokens)])
        return len(tokens) if index == num_hit_blocks and held == tokens else 0

    def resume_tail(self, req: Request, num_hit_blocks: int, tail: int) -> None:
        """`req` was admitted after a hit of `num_hit_blocks`: copy its swapped tail into
        the block after the hit if `swapped_tail` offered it (`tail` > 0), else let it go."""
        offload = self.pool.offload
        if offload is None:
            return
        if tail:
            offload.swap_in(req.request_id, self._blocks[req.request_id][num_hit_blocks].block_id)
        else:
            offload.drop_swap(req.request_id)

    def _release(self, req: Request, evict_first: bool = False) -> None:
        blocks = self._blocks.pop(req.request_id, [])
        self._num_hashed.pop(req.request_id, None)
        self.pool.release(list(reversed(blocks)), evict_first)

    @property
    def usage(self) -> float:
        return self.pool.num_used_blocks / self.pool.num_blocks
