"""engine/host_heap.py: a CPU engine's freed activations stay in the heap, so its next steps
reuse those pages instead of faulting fresh ones in."""

from __future__ import annotations

import platform
import random
import resource

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's"
)


def test_prompt_steps_after_the_first_fault_few_pages_in(tiny_model_dir) -> None:
    """8 prompts of 256 tokens a step (2,048 rows: the gate / up output alone is 8 MB in
    bfloat16), again and again: once the heap has grown, a step touches pages it already
    has. With glibc's default thresholds this model's steps faulted in ~10,000-12,000 pages
    each (40-48 MB); with the engine's, ~500."""
    from core.config import EngineConfig
    from core.sampling import SamplingParams
    from engine.engine import LLMEngine

    model = tiny_model_dir(
        "llama", hidden_size=256, intermediate_size=2048, num_hidden_layers=2, dtype="bfloat16"
    )
    engine = LLMEngine(model, EngineConfig(dtype="bfloat16", enable_prefix_caching=False))
    rng = random.Random(0)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def faults_of_one_step() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(8):
            engine.add_request(
                f"{rng.random()}", [rng.randrange(10, 200) for _t in range(256)], params
            )
        while engine.has_unfinished():
            engine.step()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    for _ in range(3):
        faults_of_one_step()  # the heap grows to the steps' high-water mark
    steady = min(faults_of_one_step() for _ in range(3))
    assert steady < 2_500, f"{steady} pages faulted in by a step of the same shape"


def test_the_engine_sets_them_on_cpu(tiny_model_dir, monkeypatch) -> None:
    from engine.engine import LLMEngine

    calls = []
    monkeypatch.setattr("engine.engine.keep_freed_memory", lambda: calls.append(1) or True)
    LLMEngine(tiny_model_dir("llama"))
    assert calls == [1]
