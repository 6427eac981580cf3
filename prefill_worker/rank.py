"""A prefill worker's rank: its engine runs prompts, and its KV connector
(prefill_worker/connector.py) sends each layer of this rank's heads to the decode worker's
reserved blocks as soon as the model wrote it."""

from __future__ import annotations

from core.request import EngineRequest
from kv_transfer import TransferResult
from prefill_worker.connector import Destination, PrefillConnector, PrefillResult
from worker.group import RouteTo
from worker.rank import WorkerRank


class PrefillRank(WorkerRank):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.routes: dict[str, list[tuple[str, int | None]]] = {}
        """Decode worker id -> where this rank's KV goes there (`kv_route`)."""
        self.connector = PrefillConnector(self.engine, self.transport, self._route)
        self.engine.kv_connector = self.connector

    def kv_route(self, receiver: str, routes: list[list[RouteTo]]) -> None:
        """Connect to where receiving worker `receiver` takes this rank's KV (its answer to
        this worker's metadata, per sender rank: `WorkerBase.accept`)."""
        self.routes[receiver] = [
            (self.transport.add_peer(to.metadata), to.rank) for to in routes[self.tp_rank]
        ]

    def kv_remove_peer(self, peer_worker_id: str) -> None:
        for peer, _ in self.routes.pop(peer_worker_id, []):
            self.transport.remove_peer(peer)
        super().kv_remove_peer(peer_worker_id)

    def _route(self, receiver: str) -> list[tuple[str, int | None]]:
        """A prefill peer (prefix migration) is laid out alike: rank r to its rank r."""
        return self.routes.get(receiver) or [(self.peer_name(receiver), None)]

    def add_prefill(self, request: EngineRequest, dest: Destination) -> None:
        self.connector.add(request, dest)

    def set_destination(self, request_id: str, dst_block_ids: list[int], skip_blocks: int) -> None:
        self.connector.set_destination(request_id, dst_block_ids, skip_blocks)

    def take_prefilled(self) -> list[PrefillResult]:
        return self.connector.take_prefilled()

    def named_blocks(self, request_id: str) -> list[int] | None:
        """The receiving worker's blocks a prompt's KV goes to, once named."""
        return self.connector.named_blocks(request_id)

    def take_post_times(self, request_id: str) -> list[int]:
        """When each layer of a traced prompt's KV was posted (epoch ns), once."""
        return self.connector.take_post_times(request_id)

    def release(self, request_id: str, evict_first: bool = False) -> None:
        """Every rank's transfer of a parked prompt ended: free its blocks."""
        self.engine.release(request_id, evict_first)

    def import_prefix(self, request_id: str) -> int:
        """A reserved prefix landed from a peer: cache its blocks. Returns how many."""
        return self.engine.cache_landed(request_id)

    def kv_poll(self) -> list[TransferResult]:
        return self.connector.gather(super().kv_poll())

    def kv_cancel(self, request_id: str) -> None:
        self.connector.cancel(request_id)
        self.landings.cancel(request_id)
