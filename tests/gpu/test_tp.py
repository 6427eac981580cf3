"""Tensor parallelism over NCCL: TP=2 on two GPUs of this machine gives TP=1's greedy tokens,
in float32 as the CPU test over gloo (tests/engine/test_tp.py) does: splitting the matmuls
over ranks only reorders their sums. Skipped with fewer than two GPUs."""

from __future__ import annotations

import pytest
import torch

from core.config import EngineConfig
from engine import LLM
from engine.tp import TPEngine
from tests.engine.test_parity import GREEDY, make_prompts

pytestmark = pytest.mark.gpu

CONFIG = dict(device="cuda", dtype="float32", num_kv_blocks=256, max_num_batched_tokens=64)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tp2_gives_the_tp1_tokens(tiny_model_dir, arch: str) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"TP=2 needs two GPUs; this machine has {torch.cuda.device_count()}")
    model_dir = tiny_model_dir(arch)
    single = LLM(model_dir, **CONFIG)
    prompts = make_prompts(single.engine.model_config.vocab_size)
    want = [o.token_ids for o in single.generate(prompts, GREEDY)]
    with TPEngine(model_dir, EngineConfig(tp_size=2, **CONFIG)) as engine:
        assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == want
        # Again, from each rank's prefix cache.
        assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == want
        engine.check_invariants()
