"""A graph capturer for CPU tests: replays re-run the recorded step on the static buffers
(engine.cuda_graphs.RerunCapturer), counted per captured batch size or token bucket."""

from __future__ import annotations

from collections.abc import Callable

from engine.cuda_graphs import RerunCapturer
from engine.engine import LLMEngine


class CountingCapturer(RerunCapturer):
    def __init__(self) -> None:
        self.replays: list[int] = []
        """Per recorded function, in capture order: the step graphs (largest bucket first),
        then the decode graphs (largest size first)."""

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        index = len(self.replays)
        self.replays.append(0)

        def replay() -> None:
            self.replays[index] += 1
            fn()

        return replay

    def by_size(self, engine: LLMEngine) -> dict[int, int]:
        """Decode-graph replays per batch size of `engine`, the engine this capturer
        recorded for."""
        graphs = engine.runner.decode_graphs
        assert graphs is not None
        steps = engine.runner.step_graphs
        first = 0 if steps is None else len(steps.sizes)
        counts = self.replays[first : first + len(graphs.sizes)]
        return dict(zip(reversed(graphs.sizes), counts, strict=True))

    def by_bucket(self, engine: LLMEngine) -> dict[int, int]:
        """Step-graph replays per token bucket of `engine`."""
        graphs = engine.runner.step_graphs
        assert graphs is not None
        counts = self.replays[: len(graphs.sizes)]
        return dict(zip(reversed(graphs.sizes), counts, strict=True))
