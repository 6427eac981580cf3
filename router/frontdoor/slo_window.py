"""Recent TTFT and inter-token latency as this front door measured them, for the autoscaler.

Prometheus histograms are cumulative since start; a planner needs what clients saw in the
last half minute. Samples of finished requests are kept `window_s` seconds (at most
`max_samples`, the newest) and read as a percentile. Thread-safe: gRPC and HTTP handlers
record from different threads.

A TTFT is also kept apart when a prefill pool computed the prompt: that pool's TTFT term
reads only those (a prompt its decode worker prefilled waited on the decode pool, and a
prefill worker more would not have served it sooner).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from core.roles import WorkerRole


class SloWindow:
    def __init__(
        self,
        window_s: float = 30.0,
        max_samples: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._ttft: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self._itl: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self._prefill_ttft: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, ttft_s: float | None, itl_s: float | None, prefilled_by: str = "") -> None:
        """`prefilled_by`: the pool that computed the prompt when another decoded it."""
        now = self._clock()
        with self._lock:
            if ttft_s is not None:
                self._ttft.append((now, ttft_s))
                if prefilled_by == WorkerRole.PREFILL:
                    self._prefill_ttft.append((now, ttft_s))
            if itl_s is not None:
                self._itl.append((now, itl_s))

    def percentiles(self, q: float = 0.9) -> tuple[float | None, float | None]:
        """(TTFT, ITL) at quantile `q` over the window; None where there is no sample."""
        now = self._clock()
        with self._lock:
            return self._quantile(self._ttft, now, q), self._quantile(self._itl, now, q)

    def prefill_pool_ttft(self, q: float = 0.9) -> float | None:
        """TTFT at quantile `q` of the requests a prefill pool prefilled (None: none lately)."""
        now = self._clock()
        with self._lock:
            return self._quantile(self._prefill_ttft, now, q)

    def _quantile(self, samples: deque[tuple[float, float]], now: float, q: float) -> float | None:
        while samples and samples[0][0] < now - self.window_s:
            samples.popleft()
        if not samples:
            return None
        values = sorted(v for _, v in samples)
        return values[min(len(values) - 1, int(q * len(values)))]
