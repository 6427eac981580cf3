"""Driving a cluster backend from test code."""

from __future__ import annotations

import random
from typing import Any

from core.request import RequestOutput
from core.sampling import SamplingParams
from router.frontdoor.backend import GenerateRequest


async def collect(
    backend: Any,
    rid: str,
    prompt: list[int],
    params: SamplingParams,
    timeout_s: float = 120.0,
    started: Any = None,
) -> RequestOutput:
    """Run one request to the end; `started` (an asyncio.Event) is set at its first output."""
    last = None
    seen: list[int] = []
    async for out in backend.generate(GenerateRequest(rid, prompt, params, timeout_s)):
        if started is not None:
            started.set()
        # A stream never repeats or skips: each output extends the previous one.
        assert out.token_ids[: len(seen)] == seen, f"{rid}: stream went back"
        seen = list(out.token_ids)
        last = out
    assert last is not None and last.finished
    return last


def prompts(n: int, vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]
