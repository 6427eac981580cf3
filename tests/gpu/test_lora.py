"""LoRA adapters on the GPU: requests of two adapters and of none in one batch, their deltas
from the segmented Triton kernel (engine/kernels/lora.py), greedy tokens equal to
transformers + peft's on the same adapter folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.lora import lora_ref
from engine import LLM
from tests import oracle
from tests.engine.test_parity import GREEDY, MAX_TOKENS, make_prompts

pytestmark = pytest.mark.gpu
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_mixed_adapters_equal_peft_on_the_gpu(tiny_model_dir, tmp_path: Path) -> None:
    model_dir = tiny_model_dir("llama")
    folders = [
        oracle.make_lora_adapter(str(model_dir), str(tmp_path / "a"), 8, ALL, 1),
        oracle.make_lora_adapter(str(model_dir), str(tmp_path / "b"), 4, ALL[:4], 2),
    ]
    refs = [lora_ref(f"l{i}", f) for i, f in enumerate(folders)]
    llm = LLM(model_dir, device="cuda", dtype="float32", num_kv_blocks=512, max_loras=2,
              max_lora_rank=8, max_num_batched_tokens=64)  # fmt: skip
    prompts = make_prompts(llm.engine.model_config.vocab_size)[:9]
    which = [i % 3 for i in range(len(prompts))]  # 0, 1: the adapters; 2: the base model
    outs = llm.generate(prompts, GREEDY, lora=[refs[w] if w < 2 else None for w in which])
    for w, prompt, out in zip(which, prompts, outs, strict=True):
        if w == 2:
            want = oracle.hf_greedy(str(model_dir), tuple(prompt), MAX_TOKENS)
        else:
            want = oracle.peft_greedy(str(model_dir), folders[w], tuple(prompt), MAX_TOKENS)
        assert out.token_ids == want
