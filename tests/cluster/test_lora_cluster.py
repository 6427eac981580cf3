"""LoRA adapters through the disaggregated path: each request's adapter travels with it to
its prefill worker and its decode worker (Ray actors, KV moved between them), and the
tokens equal transformers + peft on the same adapter folder; requests of two adapters and
the base model run side by side."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from core.config import EngineConfig
from core.lora import lora_ref
from core.request import RequestOutput
from core.sampling import SamplingParams
from router.frontdoor.backend import GenerateRequest
from tests import oracle
from tests.cluster.conftest import always_disaggregate, make_spec

pytestmark = pytest.mark.slow
MAX_TOKENS = 8


def test_adapters_travel_to_both_workers_and_equal_peft(
    cluster_factory, loop_thread, tiny_model_dir, tmp_path: Path
) -> None:
    model_dir = tiny_model_dir("llama")
    folders = {
        "a": oracle.make_lora_adapter(str(model_dir), str(tmp_path / "a"), 8,
                                      ("q_proj", "v_proj", "down_proj"), 21),
        "b": oracle.make_lora_adapter(str(model_dir), str(tmp_path / "b"), 4,
                                      ("k_proj", "o_proj", "up_proj"), 22),
    }  # fmt: skip
    engine = EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512, max_loras=2,
                          max_lora_rank=8)  # fmt: skip
    cluster = cluster_factory(make_spec(model_dir, engine=engine), always_disaggregate())
    rng = random.Random(3)
    names = ["a", None, "b", "a", "b", None]
    prompts = [[rng.randrange(3, 250) for _ in range(40 + 9 * i)] for i in range(len(names))]
    refs = [lora_ref(n, folders[n]) if n else None for n in names]
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)

    async def one(i: int) -> RequestOutput:
        whole = RequestOutput(f"r{i}", prompts[i])
        request = GenerateRequest(f"r{i}", prompts[i], greedy, 120.0, lora=refs[i])
        async for delta in cluster.backend.generate(request):
            whole.add(delta)
        return whole

    async def run() -> list[RequestOutput]:
        return await asyncio.gather(*(one(i) for i in range(len(names))))

    outs = loop_thread.run(run())
    for name, prompt, out in zip(names, prompts, outs, strict=True):
        if name is None:
            want = oracle.hf_greedy(str(model_dir), tuple(prompt), MAX_TOKENS)
        else:
            want = oracle.peft_greedy(str(model_dir), folders[name], tuple(prompt), MAX_TOKENS)
        assert out.token_ids == want, f"adapter {name}"
    assert cluster.backend.transfers.num_transfers == len(names)
