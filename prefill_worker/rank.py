"""A prefill worker's rank: its engine runs prompts, and this rank is the engine's KV
connector, sending each layer of this rank's heads to the decode worker's reserved blocks as
soon as the model wrote it, so the transfer overlaps the remaining layers."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core.device_event import DeviceEvent
from core.request import EngineRequest
from engine.kv_connector import LayerHook
from engine.request import Request
from kv_transfer import Role, TransferResult
from worker.rank import WorkerRank

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Destination:
    """Where a prompt's KV goes: the decode worker and the blocks it reserved; the first
    `skip_blocks` it already holds and are not sent."""

    peer_worker_id: str
    dst_block_ids: list[int]
    skip_blocks: int
    timeout_s: float


@dataclass
class _Send:
    """One request's per-layer sends within a step; `num_posted` < 0 once one failed."""

    request_id: str
    src_block_ids: list[int]
    peer: str
    dst_block_ids: list[int]
    timeout_s: float
    num_posted: int = 0


class PrefillRank(WorkerRank):
    """`engine.kv_connector.KVConnector` for this rank's engine."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.destinations: dict[str, Destination] = {}
        self._unsent: list[TransferResult] = []
        """Results of sends that never started: reported by the next kv_poll."""
        self.engine.kv_connector = self

    def add_prefill(self, request: EngineRequest, dest: Destination) -> None:
        self.destinations[request.request_id] = dest
        try:
            self.engine.enqueue(request)
        except Exception:
            self.destinations.pop(request.request_id, None)
            raise

    # -- engine.kv_connector.KVConnector -------------------------------------------------
    def begin_step(self, completing: list[tuple[Request, list[int]]]) -> LayerHook | None:
        """Runs inside this rank's step, with the requests whose prompt KV the step
        completes: returns the hook that sends each layer the moment it is written."""
        sends = [s for req, block_ids in completing if (s := self._plan(req, block_ids))]
        if not sends:
            return None

        def layer_done(layer: int, written: DeviceEvent | None) -> None:
            for send in sends:
                if send.num_posted >= 0:  # not failed yet
                    self._send_layer(send, layer, written)

        return layer_done

    def end_step(self) -> None:
        pass

    def _plan(self, req: Request, block_ids: list[int]) -> _Send | None:
        dest = self.destinations.pop(req.request_id, None)
        if dest is None:
            return None
        peer = self.peer_name(dest.peer_worker_id)
        src, dst = block_ids[dest.skip_blocks :], dest.dst_block_ids[dest.skip_blocks :]
        if len(block_ids) != len(dest.dst_block_ids) or not src:
            error = f"{len(block_ids)} source blocks for {len(dest.dst_block_ids)} reserved"
            self._unsent.append(TransferResult(req.request_id, Role.SEND, False, peer, (), error))
            return None
        return _Send(req.request_id, src, peer, dst, dest.timeout_s)

    def _send_layer(self, send: _Send, layer: int, written: DeviceEvent | None) -> None:
        try:
            # Offered once `written` completed: on a GPU the layer's kernels may still be
            # queued when the hook fires.
            self.transport.send(
                send.request_id, send.src_block_ids, send.peer, send.dst_block_ids, [layer],
                send.timeout_s, written,
            )  # fmt: skip
            send.num_posted += 1
        except Exception as e:  # never fail the step (the other ranks go on)
            logger.warning("%s: sending layer %d failed: %s", send.request_id, layer, e)
            if send.num_posted == 0:
                result = TransferResult(send.request_id, Role.SEND, False, send.peer, (), str(e))
                self._unsent.append(result)
            else:  # posted layers: the transport reports the failure itself
                self.transport.cancel(send.request_id)
            send.num_posted = -1

    # -- overrides -----------------------------------------------------------------------
    def kv_poll(self) -> list[TransferResult]:
        results, self._unsent = self._unsent, []
        return results + super().kv_poll()

    def abort(self, request_id: str) -> bool:
        self.destinations.pop(request_id, None)
        return super().abort(request_id)
