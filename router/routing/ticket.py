"""One request, one ticket: everything a routed request holds in the control plane.

`Router.route` returns a Ticket. It owns the request's load charge (router.routing.load)
and, once the prefill gate admits it, its gate slot; every path a request can take ends in
`close()`, which releases whatever is still held, exactly once:

    ticket = router.route(...)
    with ticket:                                  # close() on the way out, however it ends
        await gate.admit(ticket, timeout)         # ticket.admit(on_release=...)
        ... prefill ...
        ticket.prefill_done()                     # the gate slot frees here
        ... decode ...

The router may ask to hear when the prefill ends (`on_prefill_end`: True when it is done,
False when the ticket closes without one, or with one the decode worker ran itself); it
hears it once.

Calls come from the front door's event loop; the ledger itself is guarded by the router's
lock, so router threads (a Redis store's, a benchmark's) may route concurrently.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from router.routing.decision import RoutingDecision
from router.routing.load import Charge, LoadTracker, Stage


class Ticket:
    __slots__ = ("_charge", "_loads", "_lock", "_on_end", "_on_release", "decision")

    def __init__(
        self,
        decision: RoutingDecision,
        charge: Charge,
        loads: LoadTracker,
        lock: threading.Lock,
    ) -> None:
        self.decision = decision
        self._charge = charge
        self._loads = loads
        self._lock = lock
        self._on_release: Callable[[], None] | None = None
        self._on_end: Callable[[bool], None] | None = None

    def on_prefill_end(self, callback: Callable[[bool], None]) -> None:
        """`callback(done)` runs once, when the prefill is done (True) or the ticket closes
        before that (False; True for a prefill its decode worker ran)."""
        self._on_end = callback

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens the prefilling worker computes (its uncached part)."""
        return self._charge.prefill_tokens

    def admit(self, on_release: Callable[[], None] | None = None) -> None:
        """The prefill gate admitted the request. `on_release` runs once, when the admitted
        tokens are freed again (prefill done, or the ticket closed first)."""
        with self._lock:
            self._loads.admit(self._charge)
        self._on_release = on_release

    def prefill_done(self, backlog: tuple[int, int, int] | None = None) -> None:
        """`backlog`: when the worker's reports counted the request (PrefillReply.backlog)."""
        with self._lock:
            first = self._charge.stage < Stage.PREFILLED
            freed = self._loads.prefill_done(self._charge, backlog)
        if freed:
            self._released()
        if first:
            self._ended(True)

    def close(self) -> None:
        """Release everything still held. Idempotent."""
        with self._lock:
            first = self._charge.stage < Stage.PREFILLED
            freed = self._loads.close(self._charge)
        if freed:
            self._released()
        if first:
            self._ended(self.decision.prefill_on_decode)

    def _ended(self, done: bool) -> None:
        callback, self._on_end = self._on_end, None
        if callback is not None:
            callback(done)

    def _released(self) -> None:
        callback, self._on_release = self._on_release, None
        if callback is not None:
            callback()

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
