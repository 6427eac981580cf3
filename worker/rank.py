"""One rank of a worker: its engine shard, its KV transport, and its KV connector.

A worker with `tp=N` runs N of these in lockstep (tp=1: one, inside the worker actor). Each
rank owns the KV heads of its shard, so each registers its own cache with its own
transport and ships (or receives) only its heads, to the matching rank of the peer worker:

    prefill worker P (tp=2)                      decode worker D (tp=2)
      rank 0: heads [0, H/2)  --- transport --->   rank 0: heads [0, H/2)
      rank 1: heads [H/2, H)  --- transport --->   rank 1: heads [H/2, H)

The worker actor is the control plane: it tells every rank the same thing (reserve these
tokens; send this request to peer D's blocks ...) and aggregates what each rank's transport
reports (`kv_poll`). Block ids are the same on every rank because the schedulers run in
lockstep. Nothing here changes engine state on its own: a rank's transport failure is only
reported, and the worker aborts or releases on all ranks at once (a rank freeing blocks on
its own would make the schedulers diverge).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import EngineConfig
from core.events import KVEventBatch, WorkerLoad
from core.sampling import SamplingParams
from engine.engine import LLMEngine, Reservation
from engine.kv_connector import LayerHook
from engine.parallel import SINGLE, TPGroup
from engine.request import Request

logger = logging.getLogger(__name__)


def rank_transport_name(worker_id: str, tp_rank: int, tp_size: int) -> str:
    """The transport (peer) name of one rank: the worker id itself at tp=1."""
    return worker_id if tp_size == 1 else f"{worker_id}.tp{tp_rank}"


@dataclass(frozen=True)
class EngineFacts:
    """What the worker actor needs to know of its engine (the same on every rank)."""

    model_id: str
    block_size: int
    num_kv_blocks: int
    max_model_len: int
    num_layers: int
    transport_backend: str


@dataclass(frozen=True)
class Destination:
    """Where a prompt's KV goes: the decode worker and the blocks it reserved; the first
    `skip_blocks` it already holds and are not sent."""

    peer_worker_id: str
    dst_block_ids: list[int]
    skip_blocks: int
    timeout_s: float


class WorkerRank:
    """Engine calls the worker does not wrap fall through to the `LLMEngine` (step, abort
    ...); the `kv_*` methods reach this rank's transport."""

    def __init__(
        self,
        model_dir: str,
        config: EngineConfig,
        worker_id: str,
        transport: str = "auto",
        num_threads: int = 1,
        tp: TPGroup = SINGLE,
    ) -> None:
        from kv_transfer import create_transport
        from worker.base import pin_threads

        pin_threads(num_threads)
        self.tp_rank, self.tp_size = tp.rank, tp.size
        self.engine = LLMEngine(Path(model_dir), config, tp=tp, worker_id=worker_id)
        # No failure hook: failures come back through kv_poll and the worker frees the
        # blocks on every rank at once.
        self.transport = create_transport(
            self.engine.runner.kv_cache,
            self.engine.runner.kv_layout,
            self.engine.model_config.model_id,
            backend=transport,
            name=rank_transport_name(worker_id, tp.rank, tp.size),
            loopback=True,
        )
        self.destinations: dict[str, Destination] = {}
        self._unsent: list[Any] = []  # TransferResults of sends that never started
        if config.role == "prefill":
            self.engine.kv_connector = self

    def __getattr__(self, name: str) -> Any:
        if name == "engine":  # not built yet: no recursion
            raise AttributeError(name)
        return getattr(self.engine, name)

    # -- facts and reports -------------------------------------------------------------
    def describe(self) -> EngineFacts:
        e = self.engine
        return EngineFacts(
            model_id=e.model_config.model_id,
            block_size=e.config.block_size,
            num_kv_blocks=e.kv.pool.num_blocks,
            max_model_len=e.max_model_len,
            num_layers=e.model_config.num_hidden_layers,
            transport_backend=self.transport.backend,
        )

    def report_state(self) -> tuple[KVEventBatch | None, WorkerLoad]:
        return self.engine.take_kv_events(), self.engine.load()

    def num_in_flight(self) -> int:
        return self.engine.scheduler.num_unfinished + len(self.engine._held)

    def request_ids(self) -> list[str]:
        return list(self.engine.requests)

    # -- peers ---------------------------------------------------------------------------
    def kv_metadata(self) -> bytes:
        return self.transport.local_metadata()

    def kv_add_peer(self, rank_metadata: list[bytes]) -> str:
        """Connect to the matching rank of a peer worker (`rank_metadata` is per rank)."""
        return self.transport.add_peer(rank_metadata[self.tp_rank])

    def kv_remove_peer(self, peer_worker_id: str) -> None:
        self.transport.remove_peer(rank_transport_name(peer_worker_id, self.tp_rank, self.tp_size))

    # -- decode side ---------------------------------------------------------------------
    def reserve(
        self, request_id: str, token_ids: list[int], params: SamplingParams, timeout_s: float
    ) -> Reservation:
        """Reserve blocks and arm this rank's transport to receive its heads of them."""
        res = self.engine.reserve(request_id, token_ids, params)
        skip = res.num_cached_tokens // self.engine.config.block_size
        try:
            self.transport.expect(
                request_id, res.block_ids[skip:], self.engine.model_config.num_hidden_layers,
                timeout_s,
            )  # fmt: skip
        except Exception:
            self.engine.abort(request_id)  # the same refusal on every rank: still in step
            raise
        return res

    # -- prefill side (engine.kv_connector.KVConnector) ----------------------------------
    def add_prefill(
        self, request_id: str, token_ids: list[int], params: SamplingParams, dest: Destination
    ) -> None:
        self.destinations[request_id] = dest
        try:
            self.engine.add_request(request_id, token_ids, params)
        except Exception:
            self.destinations.pop(request_id, None)
            raise

    def begin_step(self, completing: list[tuple[Request, list[int]]]) -> LayerHook | None:
        """Runs inside this rank's step: send each layer of this rank's heads as soon as the
        model wrote it, so the transfer overlaps the remaining layers."""
        from kv_transfer import Role, TransferResult

        sends = []
        for req, block_ids in completing:
            dest = self.destinations.pop(req.request_id, None)
            if dest is None:
                continue
            peer = rank_transport_name(dest.peer_worker_id, self.tp_rank, self.tp_size)
            src, dst = block_ids[dest.skip_blocks :], dest.dst_block_ids[dest.skip_blocks :]
            if len(block_ids) != len(dest.dst_block_ids) or not src:
                error = f"{len(block_ids)} source blocks for {len(dest.dst_block_ids)} reserved"
                self._unsent.append(
                    TransferResult(req.request_id, Role.SEND, False, peer, (), error)
                )
                continue
            sends.append([req.request_id, src, peer, dst, dest.timeout_s, 0])
        if not sends:
            return None

        def layer_done(layer: int) -> None:
            for send in sends:
                rid, src, peer, dst, timeout_s, num_posted = send
                if num_posted < 0:
                    continue  # this request's sending already failed
                try:
                    self.transport.send(rid, src, peer, dst, [layer], timeout_s)
                    send[5] = num_posted + 1
                except Exception as e:  # never fail the step (the other ranks go on)
                    logger.warning("%s: sending layer %d failed: %s", rid, layer, e)
                    send[5] = -1
                    if num_posted == 0:
                        self._unsent.append(TransferResult(rid, Role.SEND, False, peer, (), str(e)))
                    else:  # posted layers: the transport reports the failure itself
                        self.transport.cancel(rid)

        return layer_done

    def end_step(self) -> None:
        pass

    # -- both ----------------------------------------------------------------------------
    def kv_poll(self) -> list[Any]:
        """TransferResults (either role) finished on this rank since the last poll."""
        results, self._unsent = self._unsent, []
        return results + self.transport.poll()

    def kv_cancel(self, request_id: str) -> None:
        self.transport.cancel(request_id)

    def abort(self, request_id: str) -> bool:
        self.destinations.pop(request_id, None)
        self.transport.cancel(request_id)
        return self.engine.abort(request_id)

    def close(self) -> None:
        self.transport.close()
