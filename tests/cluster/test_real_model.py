"""The default real model through the disaggregated path: SmolLM2-135M-Instruct's chat
prompts prefilled on one worker, their KV moved, decoded on another, token for token what
transformers generates on the same weights."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.config import EngineConfig
from core.sampling import SamplingParams
from engine.tokenizer import Tokenizer
from tests import oracle
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect

pytestmark = pytest.mark.slow
MAX_TOKENS = 24
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Write one sentence about a relay race.",
]


def test_chat_through_prefill_and_decode_equals_transformers(
    cluster_factory, loop_thread, smollm2_dir: Path
) -> None:
    engine = EngineConfig(num_kv_blocks=128, max_num_batched_tokens=256, num_threads=1)
    cluster = cluster_factory(make_spec(smollm2_dir, engine=engine), always_disaggregate())
    tokenizer = Tokenizer.from_dir(smollm2_dir)
    batch = [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)

    async def run() -> list:
        return await asyncio.gather(
            *(collect(cluster.backend, f"q{i}", p, greedy) for i, p in enumerate(batch))
        )

    outs = loop_thread.run(run())
    for prompt, out in zip(batch, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(smollm2_dir), tuple(prompt), MAX_TOKENS)
    assert "Paris" in tokenizer.decode(outs[0].token_ids)
    assert cluster.backend.transfers.num_transfers == len(batch)
