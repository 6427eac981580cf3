"""Draft-model speculation and the KV offload tiers on the GPU: the draft runs through the
Triton backend on the worker's device (the target as its own draft: every greedy draft
holds, the oracle's tokens), and the restore rule times its copies with the device
synchronised (pinned host tier, CUDA cache) and keeps tiers that win."""

from __future__ import annotations

import pytest

from core.sampling import SamplingParams
from engine import LLM
from tests import oracle

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
PROMPTS = [[7, 8, 9, 10, 11] * 8, list(range(40, 90)), [21, 22, 23] * 5]


def test_the_target_as_its_own_draft_on_the_gpu(tiny_model_dir) -> None:
    model_dir = tiny_model_dir("llama")
    llm = LLM(model_dir, device="cuda", dtype="float32", num_kv_blocks=256,
              speculative="draft", speculative_model=str(model_dir),
              num_speculative_tokens=3)  # fmt: skip
    draft = llm.engine.scheduler.speculator.draft_model
    assert draft.kv_cache.is_cuda
    outs = llm.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert list(out.token_ids) == oracle.hf_greedy(str(model_dir), tuple(prompt), 16, "cuda")
    totals = llm.engine.step_totals
    assert totals.draft_tokens > 0 and totals.accepted_tokens == totals.draft_tokens


def test_the_restore_rule_on_the_gpu(tiny_model_dir, tmp_path) -> None:
    llm = LLM(tiny_model_dir("llama"), device="cuda", dtype="float32", num_kv_blocks=64,
              kv_offload_host_bytes=1 << 20, kv_offload_disk_bytes=1 << 20,
              kv_offload_dir=str(tmp_path))  # fmt: skip
    offload = llm.engine.kv.pool.offload
    # A tiny model's block recomputes in well over the microseconds a PCIe copy of it takes.
    assert offload is not None and offload.tiers[0].storage.is_pinned()
    assert offload.tiers[0].name == "host" and offload.queued
    assert offload.tiers[0].restore_block_s > 0


def test_queued_spills_and_restores_keep_greedy_exact(tiny_model_dir, tmp_path) -> None:
    """A cache of 8 blocks under prompts of 4-8: each prompt evicts the one before, every
    spill queued behind the step in flight (overlapped steps, the GPU's default) and read
    back on the repeats; greedy output stays transformers'."""
    model_dir = tiny_model_dir("llama")
    block_bytes = 4 * 2 * 16 * 2 * 16 * 4  # llama tiny: 4 layers, 2 KV heads of 16, fp32
    llm = LLM(model_dir, device="cuda", dtype="float32", num_kv_blocks=8 + 1,
              kv_offload_host_bytes=8 * block_bytes, kv_offload_disk_bytes=16 * block_bytes,
              kv_offload_dir=str(tmp_path))  # fmt: skip
    prompts = [list(range(10, 75)), list(range(100, 220)), list(range(10, 75)),
               list(range(300, 365)), list(range(100, 220))]  # fmt: skip
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    for prompt in prompts:  # one at a time: each evicts the one before
        [out] = llm.generate([prompt], greedy)
        assert list(out.token_ids) == oracle.hf_greedy(str(model_dir), tuple(prompt), 6, "cuda")
    tiers = llm.engine.kv.pool.offload.tiers
    assert tiers[0].stats.stored > 0 and sum(t.stats.restored for t in tiers) > 0
