"""The host's CPUs in `baton plan`'s model (planner/sim/cluster.py): the serving work beside the
engines, and what it costs them when the cores are all taken.

A CPU worker's engine holds its cores while it steps. Everything else a served request costs
-- the door's HTTP and routing, the calls between door and workers, every output token's trip
back through the worker's output stream, the door and the client -- runs on the same cores.
While the engines leave a core free that work takes it and costs the engines nothing; once
engines and serving work want more cores than the host has, the serving threads (short,
woken often, favoured by the kernel's scheduler) take their share from the engines, whose
steps stretch by

    stretch = E / (E - lost) * (1 + co_run * others)
    lost    = s * B + max(0, (1 - s) * B - (C - E))

for E busy engine threads, B cores of serving demand, C cores, and `others` the engine
threads stepping on the other cores (two engines stepping together slow each other through
the caches and memory they share: 1.18-1.44x measured here, bench/planning/host_cpu.py). Not all of
the serving work finds the free cores: a share s of it runs on the stepping engines' cores
even while another core is idle (the threads an engine wakes -- its worker's output stream,
its event loop -- are woken on the waker's core, and move only when the kernel balances).
Measured here with one engine stepping and a core free: served decode steps 1.21x the
profile beside 0.31 cores of serving work, s = 0.56. A first token's serving overhead,
measured at idle, stretches by the same factor (its calls wait for the same cores). On the
earlier validation runs (docs/performance.md, "`baton plan` against a real run"): time per
output token 1.0-1.1x the profile with few requests in flight, 1.25-1.36x with 10-20, where
the output stream's tokens are most of the serving demand.

B is the serving CPU the workload asked for over the last `window_ms`: a base (Ray's and the
door's own loops) plus a cost per request and per output token, each measured on a live
server by bench/planning/host_cpu.py, as are s and co_run (`baton plan --host-cpu CORES BASE
REQUEST_MS TOKEN_MS SHARE CO_RUN`).

A GPU worker's engine thread is one core of its host: the same model applies with the
host's cores (`--host-cpu`), the kernel launches being its steps' CPU.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class HostCPU:
    cores: float
    base_cores: float = 0.0
    """Serving CPU with nothing to serve (cores)."""
    request_ms: float = 0.0
    """CPU per request: the door, routing, the calls that place it."""
    token_ms: float = 0.0
    """CPU per output token: the output stream, the door's events, the client."""
    engine_share: float = 0.0
    """Of the serving work, the share that runs on stepping engines' cores whatever is free."""
    co_run: float = 0.0
    """How much slower an engine steps for each other engine thread stepping beside it on
    the host's other cores (their shared caches and memory, or hyperthreads of one core)."""
    threads_per_worker: int = 1
    window_ms: float = 1000.0
    _spent: deque[tuple[float, float]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.cores <= 0 or self.window_ms <= 0 or self.threads_per_worker < 1:
            raise ValueError(f"not a usable host: {self}")
        if min(self.base_cores, self.request_ms, self.token_ms) < 0:
            raise ValueError(f"serving costs must be >= 0: {self}")
        if self.co_run < 0:
            raise ValueError(f"co_run must be >= 0: {self}")
        if not 0.0 <= self.engine_share <= 1.0:
            raise ValueError(f"engine_share must be within [0, 1]: {self}")

    def request(self, at_ms: float) -> None:
        self._spend(at_ms, self.request_ms)

    def tokens(self, at_ms: float, n: int) -> None:
        self._spend(at_ms, self.token_ms * n)

    def _spend(self, at_ms: float, cpu_ms: float) -> None:
        if cpu_ms > 0:
            self._spent.append((at_ms, cpu_ms))

    def demand(self, at_ms: float) -> float:
        """Cores of serving work wanted around `at_ms` (the last `window_ms` before it)."""
        # the model's clocks run nearly, not exactly, in step: keep a window's slack behind
        while self._spent and self._spent[0][0] <= at_ms - 2 * self.window_ms:
            self._spent.popleft()
        recent = sum(ms for t, ms in self._spent if at_ms - self.window_ms < t <= at_ms)
        return self.base_cores + recent / self.window_ms

    def stretch(self, at_ms: float, busy_workers: int) -> float:
        """How much longer than profiled an engine step (or a first token's serving overhead)
        takes at `at_ms` with `busy_workers` engines stepping."""
        engines = busy_workers * self.threads_per_worker
        if engines <= 0:
            return 1.0
        demand, share = self.demand(at_ms), self.engine_share
        lost = share * demand + max(0.0, (1 - share) * demand - (self.cores - engines))
        # the engines keep at least a tenth of their cores: a saturated host slows, not stops
        sliced = engines / max(engines - lost, 0.1 * engines)
        beside = min(engines, self.cores) - self.threads_per_worker  # others on their own cores
        return sliced * (1 + self.co_run * max(0.0, beside))
