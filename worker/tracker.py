"""Aggregating the per-rank transfer results of a worker into one outcome per request.

A request's KV moves as `tp_size` independent transfers (one per rank). It is done when
every rank reported a result: ok if all are ok, else failed with the first error. On the
first failure the other ranks are cancelled (so they report quickly), but the outcome waits
for all of them: until a rank reports, its transport may still touch the request's blocks,
which therefore must not be freed yet. The same holds for an aborted request: `abandon`
answers its waiter at once, but its outcome still comes, and frees the blocks.

Used on the worker's engine thread only: no locks.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field

from kv_transfer import Role, TransferResult


@dataclass
class _Entry:
    future: concurrent.futures.Future[str | None]
    reported: set[int] = field(default_factory=set)
    error: str | None = None
    abandoned: bool = False


@dataclass(frozen=True)
class Outcome:
    request_id: str
    role: Role
    error: str | None
    """None: every rank's transfer succeeded."""
    abandoned: bool = False
    """The request was aborted meanwhile: free its blocks even if the transfer succeeded."""


class TransferTracker:
    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self._entries: dict[tuple[Role, str], _Entry] = {}

    @property
    def pending(self) -> bool:
        return bool(self._entries)

    def add(self, request_id: str, role: Role) -> concurrent.futures.Future[str | None]:
        """Track a request; the future resolves to its outcome's error (None: ok)."""
        entry = _Entry(concurrent.futures.Future())
        self._entries[(role, request_id)] = entry
        return entry.future

    def abandon(self, request_id: str) -> bool:
        """An aborted request whose transfer may still be running: answer its waiter now
        ("aborted") but keep collecting results, so the outcome (`abandoned`) says when
        its blocks may be freed. False if nothing is tracked for it."""
        found = False
        for role in Role:
            entry = self._entries.get((role, request_id))
            if entry is not None:
                found = entry.abandoned = True
                if not entry.future.done():
                    entry.future.set_result("aborted")
        return found

    def discard(self, request_id: str) -> None:
        """Stop tracking (aborted): later results for it are ignored."""
        for role in Role:
            entry = self._entries.pop((role, request_id), None)
            if entry is not None and not entry.future.done():
                entry.future.set_result("aborted")

    def feed(self, per_rank: list[list[TransferResult]]) -> tuple[list[str], list[Outcome]]:
        """Take every rank's new results. Returns (request ids to cancel on every rank,
        outcomes now complete). Futures are resolved by `resolve`, after the caller acted
        (freed blocks) on the outcome."""
        cancel: list[str] = []
        done: list[Outcome] = []
        for rank, results in enumerate(per_rank):
            for r in results:
                key = (r.role, r.request_id)
                entry = self._entries.get(key)
                if entry is None or rank in entry.reported:
                    continue
                entry.reported.add(rank)
                if not r.ok and entry.error is None:
                    entry.error = f"rank {rank}: {r.error}" if self.num_ranks > 1 else r.error
                    if len(entry.reported) < self.num_ranks:
                        cancel.append(r.request_id)
                if len(entry.reported) == self.num_ranks:
                    done.append(Outcome(r.request_id, r.role, entry.error, entry.abandoned))
        return cancel, done

    def resolve(self, outcome: Outcome) -> None:
        entry = self._entries.pop((outcome.role, outcome.request_id), None)
        if entry is not None and not entry.future.done():
            entry.future.set_result(outcome.error)
