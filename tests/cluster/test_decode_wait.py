"""A burst larger than the decode worker's KV cache: the requests that find it full wait in
its line (router/cluster/decode_line.py) for blocks the running ones free, and every one
completes with transformers' tokens; none is refused."""

from __future__ import annotations

import asyncio
import random

import pytest

from core.config import EngineConfig
from core.sampling import SamplingParams
from router.frontdoor.backend import GenerateRequest
from tests import oracle
from tests.cluster.conftest import always_disaggregate, make_spec

pytestmark = pytest.mark.slow
MAX_TOKENS = 24


def test_a_burst_past_the_decode_cache_waits_in_line_and_completes(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    model_dir = tiny_model_dir("llama")
    # 20 blocks of 16: each request needs 6 (64 prompt + 24 output tokens), so 3 fit.
    engine = EngineConfig(num_kv_blocks=20, max_num_batched_tokens=256, max_model_len=320)
    cluster = cluster_factory(make_spec(model_dir, engine=engine), always_disaggregate())
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 250) for _ in range(64)] for _ in range(9)]
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

    async def one(i: int) -> list[int]:
        tokens: list[int] = []
        request = GenerateRequest(f"w{i}", prompts[i], greedy, 120.0, priority=i % 2,
                                  tenant=f"t{i % 3}")  # fmt: skip
        async for delta in cluster.backend.generate(request):
            tokens += delta.new_token_ids
        return tokens

    async def run() -> list[list[int]]:
        return await asyncio.gather(*(one(i) for i in range(len(prompts))))

    outs = loop_thread.run(run())
    for prompt, out in zip(prompts, outs, strict=True):
        assert out == oracle.hf_greedy(str(model_dir), tuple(prompt), MAX_TOKENS, ignore_eos=True)
    assert not cluster.backend.decode_line.busy(next(iter(cluster.backend.membership.workers)))
