"""Priority through a real cluster: a request's priority travels from the door over Ray to the
worker's engine, which runs it ahead of those queued before it and preempts a running
lower-priority request for it; every output stays equal to transformers' (the preempted
one resumes exactly)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.config import EngineConfig
from core.sampling import SamplingParams
from router.frontdoor.backend import GenerateRequest
from tests import oracle
from tests.cluster.conftest import make_spec
from tests.cluster.helpers import prompts

pytestmark = pytest.mark.slow

LONG, SHORT = 150, 8
"""Output tokens of the request running first, and of the two queued behind it."""


async def serve_three(backend: Any, ps: list[list[int]]) -> tuple[dict[str, list[int]], list]:
    """`low1` (priority 5) starts alone on the worker's one slot; then `low2` (5) and `high`
    (0) arrive. Returns each one's tokens and the (request, event) order."""
    events: list[tuple[str, str]] = []
    started = asyncio.Event()

    async def one(rid: str, prompt: list[int], n: int, priority: int) -> list[int]:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        tokens: list[int] = []
        async for delta in backend.generate(GenerateRequest(rid, prompt, params, 120.0, priority)):
            if not tokens and delta.new_token_ids:
                events.append((rid, "first"))
                started.set()
            tokens += delta.new_token_ids
        events.append((rid, "done"))
        return tokens

    low1 = asyncio.create_task(one("low1", ps[0], LONG, 5))
    await asyncio.wait_for(started.wait(), 60)
    low2 = asyncio.create_task(one("low2", ps[1], SHORT, 5))
    high = asyncio.create_task(one("high", ps[2], SHORT, 0))
    outs = await asyncio.gather(low1, low2, high)
    return dict(zip(("low1", "low2", "high"), outs, strict=True)), events


def test_a_higher_priority_request_goes_first_and_preempts_on_a_real_cluster(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    model_dir = tiny_model_dir("llama")
    one_slot = EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512, max_num_seqs=1)
    # Prompts under the router's 256-token threshold: the decode worker prefills them, so
    # its engine's queue orders them (a prefill worker's gate is tests/router's).
    cluster = cluster_factory(make_spec(model_dir, num_prefill=1, num_decode=1,
                                        decode_engine=one_slot))  # fmt: skip
    ps = prompts(3, 1000, [40], seed=7)
    outs, events = loop_thread.run(serve_three(cluster.backend, ps), timeout=300)
    order = [e for e in events]
    # high took low1's slot (low1 had most of its 150 tokens to go) and went before low2.
    assert order.index(("high", "done")) < order.index(("low1", "done")), order
    assert order.index(("high", "first")) < order.index(("low2", "first")), order
    for (rid, n), prompt in zip(
        (("low1", LONG), ("low2", SHORT), ("high", SHORT)), ps, strict=True
    ):
        assert outs[rid] == oracle.hf_greedy(str(model_dir), tuple(prompt), n, ignore_eos=True), rid
