"""One rank of a worker: its engine shard and its KV transport.

A worker with `tp=N` runs N ranks in lockstep (tp=1: one, inside the worker actor). Each
rank owns the KV heads of its shard, so each registers its own cache with its own
transport and ships (or receives) only its heads, to the matching rank of a peer worker
laid out alike:

    prefill worker P (tp=2)                      decode worker D (tp=2)
      rank 0: heads [0, H/2)  --- transport --->   rank 0: heads [0, H/2)
      rank 1: heads [H/2, H)  --- transport --->   rank 1: heads [H/2, H)

and, from a prefill worker laid out otherwise (another TP size, block size or cache dtype),
into the landing areas of the ranks that hold those heads here (worker/landing.py).

The worker actor is the control plane: it tells every rank the same thing and aggregates
what each rank's transport reports (`kv_poll`). Block ids are the same on every rank because
the schedulers run in lockstep. Nothing here changes engine state on its own: a rank's
transport failure is only reported, and the worker aborts or releases on all ranks at once
(a rank freeing blocks on its own would make the schedulers diverge).

This is the part both roles share, receiving included (a decode worker receives prompts, a
prefill worker prefixes migrated from a peer): `reserve` blocks and `expect` their KV on the
transport. The role packages add their side: `prefill_worker.rank` the connector that sends
each written layer, `decode_worker.rank` admitting a prompt whose KV landed. The worker calls
these methods by reference through its `worker.group.RankGroup`; nothing reaches the engine
by name.
"""

from __future__ import annotations

from pathlib import Path

import torch

from core.config import EngineConfig
from core.errors import WorkerFailedError
from core.events import KVEventBatch, WorkerLoad
from core.kv_layout import KVLayout
from core.request import EngineRequest, OutputDelta
from engine import cpu_kernels
from engine.engine import LLMEngine
from engine.parallel import SINGLE, TPGroup
from kv_transfer import TransferResult, Transport, UnknownPeerError, create_transport
from worker.facts import worker_facts
from worker.landing import Landings
from worker.records import KVReservation, WorkerInfo, WorkerSpec
from worker.threads import bind_team, pin_threads, raise_team_priority


def rank_transport_name(worker_id: str, tp_rank: int, tp_size: int) -> str:
    """The transport (peer) name of one rank: the worker id itself at tp=1."""
    return worker_id if tp_size == 1 else f"{worker_id}.tp{tp_rank}"


class WorkerRank:
    """The engine calls the worker makes, and the `kv_*` methods of this rank's transport."""

    def __init__(self, spec: WorkerSpec, config: EngineConfig, tp: TPGroup = SINGLE) -> None:
        if spec.transport == "local":
            raise ValueError(
                "the 'local' KV transport moves KV within one process, and every worker is its "
                "own process: use auto, shm (one host), nixl or ucx"
            )
        pin_threads(spec.num_threads)
        self.spec = spec
        self.tp_rank, self.tp_size = tp.rank, tp.size
        self.engine = LLMEngine(Path(spec.model_dir), config, tp=tp, worker_id=spec.worker_id)
        # No failure hook: failures come back through kv_poll and the worker frees the
        # blocks on every rank at once.
        runner, name = self.engine.runner, rank_transport_name(spec.worker_id, tp.rank, tp.size)

        def transport(cache: torch.Tensor, layout: KVLayout, name: str) -> Transport:
            return create_transport(
                cache, layout, self.engine.model_config.model_id, backend=spec.transport,
                name=name, loopback=spec.local_cluster,
                # The shm backend's block copy (a C++ build): nothing a GPU cache moves by.
                block_copy=None if cache.is_cuda else cpu_kernels.load("copy_blocks"),
                require_network=not spec.local_cluster,
            )  # fmt: skip

        self.transport = transport(runner.kv_cache, runner.kv_layout, name)
        self.landings = Landings(
            tp.rank, self.engine.model_config.num_key_value_heads, runner.kv_cache,
            runner.kv_layout, self.engine.max_model_len + config.max_num_batched_tokens,
            transport, name,
        )  # fmt: skip
        if self.engine.runner.device.type == "cpu":  # on the thread that steps the engine
            raise_team_priority(spec.engine_nice)  # after the transport's thread started
            bind_team(spec.cpu_bind)

    def reserve(self, request: EngineRequest, timeout_s: float, sender: str) -> KVReservation:
        """Reserve blocks (reusing this engine's cached prefix, which is not sent) and
        expect the rest of the prompt's KV from worker `sender` only: into them, or, from a
        sender laid out otherwise, into a landing area first (worker/landing.py)."""
        res = self.engine.reserve(request)
        layers = self.engine.model_config.num_hidden_layers
        try:
            if self.landings.lands_from(sender):
                # The area's KV reaches the blocks on the steps' stream (after any queued
                # offload copy), so `res.copies` orders it already.
                skip, dst = self.landings.reserve(
                    request.request_id, sender, res, timeout_s, layers
                )
            else:
                skip = res.num_cached_tokens // self.engine.config.block_size
                dst = res.block_ids[skip:]
                self.transport.expect(
                    request.request_id, dst, layers, timeout_s, self.peer_name(sender),
                    ready=res.copies,
                )  # fmt: skip
        except Exception as e:
            self.engine.abort(request.request_id)  # the same refusal on every rank: in step
            if isinstance(e, UnknownPeerError):  # the sender left: retry elsewhere, blame none
                raise WorkerFailedError(f"prefill worker {sender} is no longer connected") from e
            raise
        return KVReservation(
            request.request_id, res.num_cached_tokens, skip, dst, len(res.block_ids)
        )

    # -- the engine ---------------------------------------------------------------------
    def step(self) -> list[OutputDelta]:
        return self.engine.step()

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def num_in_flight(self) -> int:
        return self.engine.num_in_flight()

    def abort(self, request_id: str) -> bool:
        """Cancel the request's transfer on this rank and drop it from the engine (its
        connector forgets it too): the one way a request leaves a rank early."""
        self.kv_cancel(request_id)
        return self.engine.abort(request_id)

    def check_invariants(self) -> None:
        self.engine.check_invariants()

    # -- facts and reports -------------------------------------------------------------
    def describe(self, transport_metadata: bytes, pid: int) -> WorkerInfo:
        """This worker as the cluster sees it (the same on every rank but the metadata,
        which the worker gathers from all of them)."""
        e, spec = self.engine, self.spec
        return WorkerInfo(
            worker_id=spec.worker_id,
            role=spec.role,
            model_id=e.model_config.model_id,
            vocab_size=e.model_config.vocab_size,
            block_size=e.config.block_size,
            num_kv_blocks=e.kv.pool.num_blocks,
            max_model_len=e.max_model_len,
            kv_bytes_per_block=e.runner.kv_layout.block_bytes_all_layers * self.tp_size,
            transport_backend=self.transport.backend,
            transport_metadata=transport_metadata,
            pid=pid,
            tp=spec.tp,
            facts=worker_facts(spec.model_dir, e, spec.tp),
        )

    def report_state(self) -> tuple[KVEventBatch | None, WorkerLoad]:
        return self.engine.take_kv_events(), self.engine.load()

    def kv_snapshot(self) -> KVEventBatch:
        return self.engine.kv_snapshot()

    # -- peers ---------------------------------------------------------------------------
    def kv_metadata(self) -> bytes:
        return self.transport.local_metadata()

    def kv_add_peer(self, rank_metadata: list[bytes]) -> str:
        """Connect to the matching rank of a peer worker of this pool (`rank_metadata` is
        per rank)."""
        return self.transport.add_peer(rank_metadata[self.tp_rank])

    def kv_accept(self, sender: str, sender_ranks: list[bytes]) -> tuple[bool, dict[int, bytes]]:
        """Take KV from sender worker `sender` (its ranks' metadata): straight into this
        rank's cache from its rank r when it is laid out alike, else through landing areas.
        Returns whether it lands, and per sender rank that sends here what it connects to."""
        if not self.landings.is_unlike(sender_ranks):
            self.transport.add_peer(sender_ranks[self.tp_rank])
            return False, {self.tp_rank: self.transport.local_metadata()}
        return True, self.landings.accept(sender, sender_ranks)

    def kv_remove_peer(self, peer_worker_id: str) -> None:
        self.transport.remove_peer(self.peer_name(peer_worker_id))
        self.landings.remove(peer_worker_id)

    def peer_name(self, peer_worker_id: str) -> str:
        """The transport name of the peer worker's rank that pairs with this one."""
        return rank_transport_name(peer_worker_id, self.tp_rank, self.tp_size)

    # -- transfers -----------------------------------------------------------------------
    def kv_poll(self) -> list[TransferResult]:
        """TransferResults (either role) finished on this rank since the last poll."""
        return self.transport.poll() + self.landings.poll()

    def is_parked(self, request_id: str) -> bool:
        """Held outside the schedule: reserved for KV in flight, or prefilled and held until
        its KV was handed over (a scheduled request's transfer has not started)."""
        return self.engine.is_held(request_id)

    def kv_cancel(self, request_id: str) -> None:
        self.transport.cancel(request_id)
        self.landings.cancel(request_id)

    def kv_ended(self, request_id: str) -> None:
        """Every rank's transfer of a reservation ended: free what staged it here."""
        self.landings.release(request_id)

    def close(self) -> None:
        self.landings.close()
        self.transport.close()
