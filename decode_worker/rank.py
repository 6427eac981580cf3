"""A decode worker's rank: reserves blocks for a prompt another worker prefills, and arms
this rank's transport to receive its heads of them."""

from __future__ import annotations

from core.request import EngineRequest
from engine.engine import Reservation
from worker.rank import WorkerRank


class DecodeRank(WorkerRank):
    def reserve(self, request: EngineRequest, timeout_s: float, sender: str) -> Reservation:
        """Reserve blocks (reusing this engine's cached prefix, which is not sent) and
        expect the rest of the prompt's KV into them, from prefill worker `sender` only."""
        res = self.engine.reserve(request)
        skip = res.num_cached_tokens // self.engine.config.block_size
        try:
            self.transport.expect(
                request.request_id, res.block_ids[skip:],
                self.engine.model_config.num_hidden_layers, timeout_s, self.peer_name(sender),
            )  # fmt: skip
        except Exception:
            self.engine.abort(request.request_id)  # the same refusal on every rank: in step
            raise
        return res
