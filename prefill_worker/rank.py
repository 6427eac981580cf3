"""A prefill worker's rank: its engine runs prompts, and its KV connector
(prefill_worker/connector.py) sends each layer of this rank's heads to the decode worker's
reserved blocks as soon as the model wrote it."""

from __future__ import annotations

from core.request import EngineRequest
from kv_transfer import TransferResult
from prefill_worker.connector import Destination, PrefillConnector, PrefillResult
from worker.rank import WorkerRank


class PrefillRank(WorkerRank):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.connector = PrefillConnector(self.engine, self.transport, self.peer_name)
        self.engine.kv_connector = self.connector

    def add_prefill(self, request: EngineRequest, dest: Destination) -> None:
        self.connector.add(request, dest)

    def take_prefilled(self) -> list[PrefillResult]:
        return self.connector.take_prefilled()

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
        results, self.connector.unsent = self.connector.unsent, []
        return results + super().kv_poll()
