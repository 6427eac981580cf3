"""Restore or recompute (engine/kv_cache/restore_rule.py): a worker keeps the KV offload tiers
whose copy back it measured cheaper than recomputing a block, host first, and none below
one that loses; without a host tier it preempts by recompute. Output never changes."""

from __future__ import annotations

import pytest

from core.sampling import SamplingParams
from engine import LLM
from engine.kv_cache import restore_rule
from tests import oracle
from tests.engine.test_parity import make_prompts

PARAMS = SamplingParams(max_tokens=12, temperature=0.0)


def test_on_a_cpu_copying_back_beats_recomputing_for_both_tiers(tiny_model_dir, tmp_path) -> None:
    llm = LLM(tiny_model_dir("llama"), num_kv_blocks=64, kv_offload_host_bytes=1 << 20,
              kv_offload_disk_bytes=1 << 20, kv_offload_dir=str(tmp_path))  # fmt: skip
    assert [t.name for t in llm.engine.kv.pool.offload.tiers] == ["host", "disk"]
    # The calibration left no trace: no tier holds a block, the cache is all free.
    assert not llm.engine.kv.pool.offload.hashes()
    assert llm.engine.kv.pool.num_free_blocks == 64


@pytest.mark.parametrize(
    ("slow_tier", "kept"), [(1, ["host"]), (0, [])], ids=["disk-loses", "host-loses"]
)
def test_a_tier_slower_than_recomputing_is_dropped_with_those_below_it(
    tiny_model_dir, tmp_path, monkeypatch, slow_tier: int, kept: list[str]
) -> None:
    measure = restore_rule._restore_s

    def slow(offload, tier: int, n: int) -> float:
        return 1.0 if tier == slow_tier else measure(offload, tier, n)  # a second a block

    monkeypatch.setattr(restore_rule, "_restore_s", slow)
    model_dir = tiny_model_dir("llama")
    llm = LLM(model_dir, num_kv_blocks=14, kv_offload_host_bytes=1 << 20,
              kv_offload_disk_bytes=1 << 20, kv_offload_dir=str(tmp_path))  # fmt: skip
    offload = llm.engine.kv.pool.offload
    assert ([t.name for t in offload.tiers] if offload else []) == kept
    # Preempting with the tiers left (swap), or by recompute when none is: same tokens.
    prompts = make_prompts(llm.engine.model_config.vocab_size)
    for p, out in zip(prompts, llm.generate(prompts, PARAMS), strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), 12)
    assert llm.engine.scheduler.num_preemptions > 0
    if offload is not None:
        assert offload.num_swapped_out > 0
    llm.engine.check_invariants()
