"""Landing areas: how a rank takes a prompt's KV from prefill ranks whose caches are laid out
otherwise (another TP size, block size or KV cache dtype).

The transport moves blocks byte for byte between caches of one layout (kv_transfer). So for
each rank of an unlike sender this rank keeps a small cache in that sender rank's layout, an
*area*, registered with a transport of its own: the sender writes into it exactly as into a
peer like itself. Once every part of a prompt landed, the rank rewrites it into its own
blocks (engine/kv_cache/remap.py: re-cut, heads joined or cut out, converted) and frees the
area's blocks:

    prefill P (tp=2, block 16, float32)         decode D (tp=1, block 32, int8)
      rank 0: heads [0, H/2) --> area "P rank 0" --+
      rank 1: heads [H/2, H) --> area "P rank 1" --+--> land() --> D's own blocks

A sender rank whose heads several ranks here need (prefill TP smaller than decode TP) sends
to each of their areas, every part a transport request of its own (worker/fanin.py).

What it costs: the KV crosses this host's memory twice (the area, then the cache), the
rewrite runs once all layers landed (not layer by layer), and a split sends a sender rank's
every head to each rank that needs some of them. Each area holds
`max_model_len + max_num_batched_tokens` tokens; a reservation that finds it full is refused
as a full cache is (the router tries again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from core.device_event import DeviceEvent
from core.kv_layout import KVLayout, first_holders, kv_head_range
from engine.engine import NoCapacityError, Reservation
from engine.kv_cache.remap import Source, land
from engine.kv_cache.tensor import allocate_kv_cache
from engine.kv_connector import layer_written
from kv_transfer import CompatRecord, Role, TransferResult, Transport, peer_compat
from worker.fanin import FanIn, wire_id

MakeTransport = Callable[[torch.Tensor, KVLayout, str], Transport]
"""(cache, layout, transport name) -> a transport registered over that cache."""


@dataclass
class _Area:
    """A cache in one sender rank's layout and the transport it is registered with."""

    compat: CompatRecord
    heads: range
    cache: torch.Tensor
    transport: Transport
    free: list[int]
    """Free blocks, shared by the areas of every rank of one sender layout."""


@dataclass(frozen=True)
class _Route:
    """How a sender worker's KV reaches this rank: its ranks' areas, with the sender rank's
    peer name on each, and the sender's block size."""

    areas: tuple[tuple[_Area, str], ...]
    block_size: int


@dataclass
class _Arriving:
    reservation: Reservation
    route: _Route
    staged: list[int]
    first_token: int
    read: DeviceEvent | None = None
    """On CUDA, after the copies out of the area (queued behind the step in flight)."""


class Landings:
    """The landing areas of one rank (one per unlike sender rank layout, made on the first
    sender of that layout) and the prompts on their way through them."""

    def __init__(
        self,
        rank: int,
        total_kv_heads: int,
        own_cache: torch.Tensor,
        own_layout: KVLayout,
        capacity_tokens: int,
        make_transport: MakeTransport,
        name: str,
    ) -> None:
        self.rank = rank
        self.total_kv_heads = total_kv_heads
        self.cache, self.layout = own_cache, own_layout
        self.heads = kv_head_range(total_kv_heads, own_layout.tp_size, own_layout.tp_rank)
        self.capacity_tokens = capacity_tokens
        self._make_transport, self._name = make_transport, name
        self._areas: dict[CompatRecord, _Area] = {}
        self._free: dict[tuple[int, str, int], list[int]] = {}
        self._sizes: dict[tuple[int, str, int], int] = {}
        self._routes: dict[str, _Route] = {}
        self._arriving: dict[str, _Arriving] = {}
        self._ended: dict[str, _Arriving] = {}
        """Landed or failed here, their area blocks held until `release`."""
        self._fan = FanIn()

    def is_unlike(self, sender_ranks: list[bytes]) -> bool:
        """Whether a sender worker (its ranks' transport metadata) is laid out otherwise
        than this rank's own cache, which is when its KV lands here."""
        own = CompatRecord.from_layout(self.layout, "")
        if len(sender_ranks) != self.layout.tp_size:
            return True
        theirs = peer_compat(sender_ranks[self.layout.tp_rank])
        same = ("block_size", "dtype", "num_kv_heads", "tp_rank", "tp_size")
        return any(getattr(own, f) != getattr(theirs, f) for f in same)

    def accept(self, sender: str, sender_ranks: list[bytes]) -> dict[int, bytes]:
        """Connect the areas that sender worker `sender`'s ranks write into (made on first
        need); returns, per sender rank that sends here, the metadata it connects to."""
        compats = [peer_compat(meta) for meta in sender_ranks]
        areas, answer = [], {}
        for p in first_holders(self.heads, [self._held(c) for c in compats]):
            area = self._area(compats[p])
            areas.append((area, area.transport.add_peer(sender_ranks[p])))
            answer[p] = area.transport.local_metadata()
        self._routes[sender] = _Route(tuple(areas), compats[0].block_size)
        return answer

    def lands_from(self, sender: str) -> bool:
        """Whether `sender`'s KV lands here (it is laid out otherwise)."""
        return sender in self._routes

    def remove(self, sender: str) -> None:
        route = self._routes.pop(sender, None)
        for area, peer in route.areas if route else ():
            area.transport.remove_peer(peer)

    def reserve(
        self, request_id: str, sender: str, res: Reservation, timeout_s: float, num_layers: int
    ) -> tuple[int, list[int]]:
        """Stage `res` (this rank's reservation) for sender `sender`: returns the sender's
        blocks to skip (this rank caches them) and the area blocks the rest go to, the same
        on every rank of this worker (their areas change in lockstep: see `release`)."""
        route = self._routes[sender]
        block = route.block_size
        skip = res.num_cached_tokens // block
        count = -(-res.num_tokens // block) - skip
        free = route.areas[0][0].free  # one list for every area of the sender's layout
        if count > len(free):
            raise NoCapacityError(
                f"no room to land {count} blocks of {block} tokens ({len(free)} free in the "
                "landing area of an unlike prefill worker)"
            )
        staged = free[:count]
        del free[:count]
        wire = wire_id(request_id, self.rank)
        parts = {}
        try:
            for area, peer in route.areas:
                area.transport.expect(wire, staged, num_layers, timeout_s, peer)
                parts[(area.compat, wire)] = _canceller(area.transport, wire)
        except Exception:
            for cancel in parts.values():
                cancel()
            free[:0] = staged
            raise
        self._arriving[request_id] = _Arriving(res, route, staged, skip * block)
        self._fan.open(request_id, Role.RECV, parts)
        return skip, staged

    def cancel(self, request_id: str) -> None:
        self._fan.cancel(request_id)

    def poll(self) -> list[TransferResult]:
        """Prompts every part of which ended: landed in this rank's blocks (ok), or failed.
        Their area blocks stay taken until `release`."""
        done = []
        for area in self._areas.values():
            for result in area.transport.poll():
                part = (area.compat, result.request_id)
                if self._fan.owns(part) and (ended := self._fan.feed(part, result)):
                    done.append(self._end(ended))
        return done

    def release(self, request_id: str) -> None:
        """Free the area blocks of a prompt whose transfer ended on every rank. The worker
        calls it on all its ranks at once (as it frees engine blocks: worker/rank.py), so
        their areas stay alike and stage the next prompt in the same blocks; a rank freeing
        them as its own parts end could stage it elsewhere than its peers."""
        arriving = self._ended.pop(request_id, None)
        if arriving is not None:
            if arriving.read is not None:
                # The next prompt's transfer into these blocks is on no stream after the
                # copies out of them: they must have run.
                arriving.read.synchronize()
            arriving.route.areas[0][0].free[:0] = arriving.staged

    def num_staged(self) -> int:
        """Area blocks holding a prompt on its way (0 when none is)."""
        return sum(self._sizes[family] - len(free) for family, free in self._free.items())

    def close(self) -> None:
        for area in self._areas.values():
            area.transport.close()

    # -- internals -------------------------------------------------------------------------
    def _held(self, compat: CompatRecord) -> range:
        return kv_head_range(self.total_kv_heads, compat.tp_size, compat.tp_rank)

    def _area(self, compat: CompatRecord) -> _Area:
        area = self._areas.get(compat)
        if area is None:
            num_blocks = max(1, self.capacity_tokens // compat.block_size)
            layout = KVLayout(
                compat.num_layers, num_blocks, compat.block_size, compat.num_kv_heads,
                compat.head_dim, compat.dtype, compat.tp_rank, compat.tp_size,
            )  # fmt: skip
            cache = allocate_kv_cache(layout, self.cache.device)
            name = f"{self._name}.land{len(self._areas)}"
            transport = self._make_transport(cache, layout, name)
            # The ranks of one sender layout stage a prompt in the same blocks: one free list.
            family = (compat.block_size, compat.dtype, compat.tp_size)
            free = self._free.setdefault(family, list(range(num_blocks)))
            self._sizes[family] = num_blocks
            area = _Area(compat, self._held(compat), cache, transport, free)
            self._areas[compat] = area
        return area

    def _end(self, ended: TransferResult) -> TransferResult:
        arriving = self._arriving.pop(ended.request_id)
        self._ended[ended.request_id] = arriving
        res = arriving.reservation
        if ended.ok:
            sources = [
                Source(area.cache, arriving.staged, arriving.first_token, area.heads)
                for area, _ in arriving.route.areas
            ]
            tokens = range(res.num_cached_tokens, res.num_tokens)
            land(self.cache, res.block_ids, self.heads, tokens, sources)
            arriving.read = layer_written(self.cache.device)  # None off CUDA
        skip = res.num_cached_tokens // self.layout.block_size
        return TransferResult(
            ended.request_id, Role.RECV, ended.ok, ended.peer, tuple(res.block_ids[skip:]),
            ended.error,
        )  # fmt: skip


def _canceller(transport: Transport, wire: str) -> Callable[[], None]:
    return lambda: transport.cancel(wire)
