"""The prefill side of the handoff: the engine's KV connector on a prefill worker's rank
(engine/kv_connector.py). Sends each layer of this rank's heads to the decode worker's
reserved blocks the moment the model wrote it, so the transfer overlaps the remaining
layers, and parks each prompt after its first token until its KV was handed over.

    add(request, dest)       a prompt and where its KV goes (before the engine queues it);
                             the blocks may come later, while the prompt computes
    set_destination(...)     the decode worker's blocks for a prompt added without them;
                             callable from another thread while the engine's step runs
                             (the worker names them at once, not behind the step)
    begin_step(completing)   the step that completes a prompt: plan its sends; the hook
                             posts every layer as it is written (or, while the blocks are
                             not known yet, keeps each layer's event until they are)
    request_prefilled(...)   its first token: park it, keep a PrefillResult for the worker
    take_prefilled()         the worker collects them after the step
    named_blocks(id)         the receiving worker's blocks for a prompt added here, once named
    take_post_times(id)      when each layer of a traced prompt was handed to the transport
    forget(request_id)       aborted: no send, no result
    gather(results)          the transport's results, a prompt's parts folded into one

A decode worker laid out otherwise takes the KV in landing areas (worker/landing.py): then
this rank may send each layer to several of its ranks, each a part of the prompt's transfer
under a wire id of its own (worker/fanin.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from core.device_event import DeviceEvent
from core.request import EngineRequest, OutputDelta, TokenLogprob
from engine.engine import LLMEngine
from engine.kv_connector import LayerHook
from engine.request import Request
from kv_transfer import Role, TransferResult, Transport
from worker.fanin import FanIn, wire_id

logger = logging.getLogger(__name__)

EARLY_TTL_S = 60.0
"""How long blocks named for a prompt not added (yet) are kept for it."""

PeerRoutes = Callable[[str], list[tuple[str, int | None]]]
"""A decode worker's id -> where this rank sends a prompt's KV there: per receiving rank, its
transport (peer) name and, when the KV lands there (worker/landing.py), that rank's index,
which names the part's wire id (worker/fanin.py); None: straight into its cache, under the
request's own id."""


@dataclass(frozen=True)
class Destination:
    """Where a prompt's KV goes: the decode worker, and the blocks there for this worker's
    blocks from `skip_blocks` on (the first `skip_blocks` it already holds: not sent).
    `dst_block_ids` None: the decode worker is still reserving them while the prompt
    computes (`PrefillConnector.set_destination` names them, within `timeout_s`)."""

    peer_worker_id: str
    dst_block_ids: list[int] | None
    skip_blocks: int
    timeout_s: float


@dataclass
class _Awaiting:
    """A prompt whose KV is written but whose destination blocks are not known yet: each
    written layer with its device event, sent once they are."""

    request_id: str
    block_ids: list[int]
    dest: Destination
    deadline: float
    """time.monotonic() past which no destination fails its transfer (the blocks go)."""
    layers: list[tuple[int, DeviceEvent | None]] = field(default_factory=list)
    sends: list[_Send] | None = None
    """Set once the blocks are named while the step still runs: its later layers go at once."""


@dataclass(frozen=True)
class PrefillResult:
    """A prompt's KV is in `block_ids` and its first token is sampled."""

    request_id: str
    first_token: int
    logprob: TokenLogprob | None
    block_ids: list[int]
    num_prompt_tokens: int
    num_cached_tokens: int
    output: OutputDelta
    """`finished` when the first token already ends the request (nothing left to decode;
    the blocks are still held until `release`)."""
    backlog: tuple[int, int, int]
    """(arrived, ended, tokens): a load report taken after n engine steps counted `tokens`
    of it in its prefill backlog iff arrived <= n < ended (its steps when it arrived and
    when its prefill ended), at most `tokens` once it had started. The router uses this to
    correct a report that reaches it after the prefill's reply (router.routing.load)."""


@dataclass
class _Send:
    """One request's per-layer sends to one receiving rank within a step, under `wire_id`;
    `num_posted` < 0 once one failed."""

    request_id: str
    wire_id: str
    src_block_ids: list[int]
    peer: str
    dst_block_ids: list[int]
    timeout_s: float
    num_posted: int = 0


class PrefillConnector:
    """`engine.kv_connector.KVConnector` of one prefill rank: `routes` says where a decode
    worker takes this rank's KV."""

    def __init__(self, engine: LLMEngine, transport: Transport, routes: PeerRoutes) -> None:
        self.engine, self.transport, self.routes = engine, transport, routes
        self._lock = threading.RLock()
        """Held by every method: `set_destination` may run on another thread than the
        engine's, while the engine's step (its layer hook) runs."""
        self._early: dict[str, tuple[list[int], int, float]] = {}
        """Blocks named before the prompt was added (its `add` waits behind a step): what
        `add` applies; with the time they came, dropped after EARLY_TTL_S."""
        self.fan = FanIn()
        """Prompts sent to several receiving ranks, or landing in one's area: their parts."""
        self.destinations: dict[str, Destination] = {}
        """Prompts whose sends are not planned yet."""
        self.awaiting: dict[str, _Awaiting] = {}
        """Prompts computed before their destination blocks were known."""
        self._sending: set[str] = set()
        """Prompts parked after their first token."""
        self._prefilled: list[PrefillResult] = []
        self.unsent: list[TransferResult] = []
        """Results of sends (by wire id) that never started: the next `gather` has them."""
        self.post_times: dict[str, list[int]] = {}
        """Traced prompts only: the epoch ns each layer was posted, for the trace's
        kv_transfer span (one int a layer; taken when the transfer ends)."""

    def add(self, request: EngineRequest, dest: Destination) -> None:
        request_id = request.request_id
        with self._lock:
            early = self._early.pop(request_id, None)
            if early is not None and dest.dst_block_ids is None:
                dest = replace(dest, dst_block_ids=early[0], skip_blocks=early[1])
            self.destinations[request_id] = dest
            self._sending.add(request_id)
            if request.trace.traceparent:
                self.post_times[request_id] = []
        try:
            self.engine.enqueue(request)
        except Exception:
            self.forget(request_id)
            raise

    def named_blocks(self, request_id: str) -> list[int] | None:
        """The blocks a prompt added here goes to, once named (with it, or after: early)."""
        with self._lock:
            dest = self.destinations.get(request_id)
        return None if dest is None else dest.dst_block_ids

    def take_prefilled(self) -> list[PrefillResult]:
        with self._lock:
            results, self._prefilled = self._prefilled, []
        return results

    # -- scheduler side ------------------------------------------------------------------
    def request_prefilled(
        self, req: Request, first_token: int, logprob: TokenLogprob | None, delta: OutputDelta
    ) -> bool:
        with self._lock:
            if req.request_id not in self._sending:
                return False
            self._sending.discard(req.request_id)
            block_ids = self.engine.kv.block_ids(req.request_id)
            backlog = (req.arrival_step, self.engine.step_totals.steps, req.num_tokens - 1)
            self._prefilled.append(PrefillResult(
                req.request_id, first_token, logprob, block_ids, req.num_prompt_tokens,
                max(req.num_cached_tokens, 0), delta, backlog,
            ))  # fmt: skip
            return True

    def take_post_times(self, request_id: str) -> list[int]:
        with self._lock:
            return self.post_times.pop(request_id, [])

    def forget(self, request_id: str) -> None:
        with self._lock:
            self.destinations.pop(request_id, None)
            self.awaiting.pop(request_id, None)
            self._sending.discard(request_id)
            self.post_times.pop(request_id, None)

    def set_destination(self, request_id: str, dst_block_ids: list[int], skip_blocks: int) -> None:
        """The decode worker's blocks for a prompt added without them: planned with them
        when its step comes, or, computed already (wholly, or while its step still runs, on
        another thread), its written layers sent now and the rest as they are written. Kept
        a while for a prompt not added yet (its `add` waits behind the engine's step);
        nothing for one this rank no longer has (aborted, or its wait ran out)."""
        with self._lock:
            dest = self.destinations.get(request_id)
            if dest is not None:
                self.destinations[request_id] = replace(
                    dest, dst_block_ids=list(dst_block_ids), skip_blocks=skip_blocks
                )
                return
            waiting = self.awaiting.pop(request_id, None)
            if waiting is None:
                if request_id not in self._sending:  # not added yet, or gone
                    self._early[request_id] = (list(dst_block_ids), skip_blocks, time.monotonic())
                return
            self.destinations[request_id] = replace(
                waiting.dest, dst_block_ids=list(dst_block_ids), skip_blocks=skip_blocks
            )
            waiting.sends = self._plan(request_id, waiting.block_ids)
            for send in waiting.sends:
                for layer, written in waiting.layers:
                    if send.num_posted >= 0:
                        self._send_layer(send, layer, written)

    # -- results --------------------------------------------------------------------------
    def gather(self, results: list[TransferResult]) -> list[TransferResult]:
        """This rank's transfer results, with the unsent ones, the parts of a prompt (by wire
        id) folded into the prompt's one result once every part ended."""
        now = time.monotonic()
        with self._lock:
            for request_id, waiting in list(self.awaiting.items()):
                if now > waiting.deadline:
                    del self.awaiting[request_id]
                    self._fail_unsent(request_id, "no destination blocks named within "
                                      f"{waiting.dest.timeout_s:g} s")  # fmt: skip
            for request_id, (_, _, named_at) in list(self._early.items()):
                if now - named_at > EARLY_TTL_S:
                    del self._early[request_id]
            results, self.unsent = self.unsent + results, []
            out = []
            for result in results:
                part = (0, result.request_id)
                if not self.fan.owns(part):
                    out.append(result)
                elif (ended := self.fan.feed(part, result)) is not None:
                    out.append(ended)
            return out

    def cancel(self, request_id: str) -> None:
        """Stop a prompt's sends (each part reports its end)."""
        with self._lock:
            if self.awaiting.pop(request_id, None) is not None:
                self._fail_unsent(request_id, "cancelled before its destination was named")
            elif request_id in self.fan:
                self.fan.cancel(request_id)
            else:
                self.transport.cancel(request_id)

    # -- layer side ----------------------------------------------------------------------
    def begin_step(self, completing: list[tuple[Request, list[int]]]) -> LayerHook | None:
        """Runs inside this rank's step, with the requests whose prompt KV the step
        completes: returns the hook that sends each layer the moment it is written (or
        keeps it for when the prompt's destination is named)."""
        sends: list[_Send] = []
        waits: list[_Awaiting] = []
        with self._lock:
            for req, block_ids in completing:
                dest = self.destinations.get(req.request_id)
                if dest is not None and dest.dst_block_ids is None:
                    del self.destinations[req.request_id]
                    deadline = time.monotonic() + dest.timeout_s
                    waits.append(_Awaiting(req.request_id, block_ids, dest, deadline))
                    self.awaiting[req.request_id] = waits[-1]
                else:
                    sends += self._plan(req.request_id, block_ids)
        if not sends and not waits:
            return None

        def layer_done(layer: int, written: DeviceEvent | None) -> None:
            with self._lock:
                for send in sends:
                    if send.num_posted >= 0:  # not failed yet
                        self._send_layer(send, layer, written)
                for waiting in waits:
                    waiting.layers.append((layer, written))
                    for send in waiting.sends or ():  # named while the step runs
                        if send.num_posted >= 0:
                            self._send_layer(send, layer, written)

        return layer_done

    def end_step(self) -> None:
        pass

    def _plan(self, request_id: str, block_ids: list[int]) -> list[_Send]:
        dest = self.destinations.pop(request_id, None)
        if dest is None or dest.dst_block_ids is None:
            return []
        rid, routes = request_id, self.routes(dest.peer_worker_id)
        src = block_ids[dest.skip_blocks :]
        if len(src) != len(dest.dst_block_ids) or not src or not routes:
            error = f"{len(src)} source blocks to send, {len(dest.dst_block_ids)} reserved"
            if not routes:
                error = f"no route to {dest.peer_worker_id}"
            self._fail_unsent(rid, error)
            return []
        sends = [
            _Send(rid, rid if rank is None else wire_id(rid, rank), src, peer,
                  dest.dst_block_ids, dest.timeout_s)
            for peer, rank in routes
        ]  # fmt: skip
        if len(sends) > 1 or sends[0].wire_id != rid:
            self.fan.open(
                rid, Role.SEND, {(0, s.wire_id): self._canceller(s.wire_id) for s in sends}
            )
        return sends

    def _fail_unsent(self, request_id: str, error: str) -> None:
        self.unsent.append(TransferResult(request_id, Role.SEND, False, None, (), error))

    def _canceller(self, wire: str) -> Callable[[], None]:
        return lambda: self.transport.cancel(wire)

    def _send_layer(self, send: _Send, layer: int, written: DeviceEvent | None) -> None:
        try:
            # Offered once `written` completed: on a GPU the layer's kernels may still be
            # queued when the hook fires.
            self.transport.send(
                send.wire_id, send.src_block_ids, send.peer, send.dst_block_ids, [layer],
                send.timeout_s, written,
            )  # fmt: skip
            send.num_posted += 1
            posted = self.post_times.get(send.request_id)
            if posted is not None and send.num_posted > len(posted):
                posted.append(time.time_ns())
        except Exception as e:  # never fail the step (the other ranks go on)
            logger.warning("%s: sending layer %d failed: %s", send.wire_id, layer, e)
            if send.num_posted == 0:
                result = TransferResult(send.wire_id, Role.SEND, False, send.peer, (), str(e))
                self.unsent.append(result)
            else:  # posted layers: the transport reports the failure itself
                self.transport.cancel(send.wire_id)
            send.num_posted = -1
