"""A decode worker's rank: the decode side of the handoff. Reservations and receiving are
shared with the prefill rank (a prefill worker receives the prefixes it pulls) and live in
`worker.rank`; here a prompt whose KV landed joins the running batch, and a prompt this
worker prefills itself is queued."""

from __future__ import annotations

from core.request import EngineRequest, OutputDelta, TokenLogprob
from worker.rank import WorkerRank


class DecodeRank(WorkerRank):
    def admit(self, request_id: str, first_token: int, logprob: TokenLogprob | None) -> OutputDelta:
        """Every layer of the reservation's KV landed: join the batch with the first token."""
        return self.engine.admit(request_id, first_token, logprob)

    def enqueue(self, request: EngineRequest) -> None:
        """Prefill and decode here (unified mode; conditional disaggregation)."""
        self.engine.enqueue(request)
