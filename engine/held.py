"""The requests an engine holds outside its schedule, with their blocks: where KV crosses
the engine's boundary. Role-free: a decode worker reserves the prompts other workers
prefill, a prefill worker parks the prompts it prefilled and reserves the prefixes it pulls.

    reserved   its prompt KV is computed elsewhere: blocks allocated, those of a prefix this
               engine already caches reused (they need not arrive), WAITING_FOR_KV until it
               lands; then it joins the running batch (`LLMEngine.admit`) or, a prefix copied
               from a peer, is named in the prefix cache and freed (`LLMEngine.cache_landed`)
    parked     its prompt was computed here and its KV is leaving: out of the batch, its
               blocks held until `release` (a transfer may still read them)

Deals in requests and block ids only; the connector that moves the bytes is the worker's.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.device_event import DeviceEvent
from engine.kv_cache.manager import KVCacheManager
from engine.request import Request, RequestStatus


class NoCapacityError(RuntimeError):
    """The KV cache cannot hold this request now (a retryable condition)."""


@dataclass(frozen=True)
class Reservation:
    """Blocks reserved for a prompt (and any resumed output tokens: all of them
    `num_tokens`); the sender writes tokens [num_cached_tokens, num_tokens) into
    block_ids[num_cached_tokens // block_size:]."""

    request_id: str
    block_ids: list[int]
    num_cached_tokens: int
    num_tokens: int
    copies: DeviceEvent | None = None
    """Queued device work still touching the blocks (the offload tiers' copies of what
    they held) until this event completes: whatever writes them off the engine's stream
    (a transport) waits for it. None: nothing pending."""


class HeldRequests:
    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self._held: dict[str, Request] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._held

    def __len__(self) -> int:
        return len(self._held)

    def reserve(self, req: Request) -> Reservation:
        """Allocate `req`'s blocks for KV computed elsewhere, reusing the cached prefix."""
        hits = self.kv.get_computed_blocks(req)
        num_hit_tokens = len(hits) * self.kv.block_size
        if not self.kv.allocate_slots(req, req.num_tokens - num_hit_tokens, hits):
            raise NoCapacityError(
                f"no room for {req.num_tokens} prompt tokens "
                f"({self.kv.pool.num_free_blocks} free blocks)"
            )
        req.num_computed_tokens = num_hit_tokens
        req.num_cached_tokens = min(num_hit_tokens, req.num_prompt_tokens)
        self.kv.record_prompt(req.num_prompt_tokens, req.num_cached_tokens)
        req.status = RequestStatus.WAITING_FOR_KV
        self._held[req.request_id] = req
        block_ids = self.kv.block_ids(req.request_id)
        copies = self.kv.queued_copies()  # the spills this allocation made, an earlier restore
        return Reservation(req.request_id, block_ids, num_hit_tokens, req.num_tokens, copies)

    def land(self, request_id: str) -> Request:
        """The reservation whose KV has landed, taken off hold, its blocks named in the prefix
        cache. KeyError if there is none (aborted meanwhile)."""
        req = self._held.get(request_id)
        if req is None or req.status != RequestStatus.WAITING_FOR_KV:
            raise KeyError(f"no reservation waiting for KV under request id {request_id!r}")
        del self._held[request_id]
        req.num_computed_tokens = req.num_tokens
        self.kv.cache_computed_blocks(req)
        return req

    def park(self, req: Request) -> None:
        """Hold a request taken out of the batch, blocks and all, until `release`."""
        req.status = RequestStatus.FINISHED
        self._held[req.request_id] = req

    def release(self, request_id: str, evict_first: bool = False) -> None:
        """Free a parked request's blocks (they stay in the prefix cache; with `evict_first`,
        as its first victims)."""
        req = self._held.pop(request_id, None)
        if req is not None:
            self.kv.free(req, evict_first)

    def pop(self, request_id: str) -> Request | None:
        return self._held.pop(request_id, None)
