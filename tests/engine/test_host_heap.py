"""engine/host_heap.py: a CPU engine's freed activations stay in the heap, so its next steps
reuse those pages instead of faulting fresh ones in."""

from __future__ import annotations

import concurrent.futures
import platform
import random
import resource

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's"
)


@pytest.mark.parametrize("on_a_thread", [False, True])
def test_prompt_steps_after_the_first_fault_few_pages_in(tiny_model_dir, on_a_thread) -> None:
    """8 prompts of 256 tokens a step (2,048 rows: the gate / up output alone is 8 MB in
    bfloat16), again and again: once the heap has grown, a step touches pages it already
    has. With glibc's default thresholds this model's steps faulted in ~10,000-12,000 pages
    each (40-48 MB); on a thread of its own (a served worker's engine), with the thresholds
    but a per-thread arena, ~4,700-6,300; with the engine's settings ~510 either way."""
    from core.config import EngineConfig
    from core.sampling import SamplingParams
    from engine.engine import LLMEngine
    from engine.host_heap import keep_freed_memory

    model = tiny_model_dir(
        "llama", hidden_size=256, intermediate_size=2048, num_hidden_layers=2, dtype="bfloat16"
    )
    rng = random.Random(0)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def steps() -> list[int]:
        engine = LLMEngine(model, EngineConfig(dtype="bfloat16", enable_prefix_caching=False))

        def faults_of_one_step() -> int:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(8):
                prompt = [rng.randrange(10, 200) for _t in range(256)]
                engine.add_request(f"{rng.random()}", prompt, params)
            while engine.has_unfinished():
                engine.step()
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

        for _ in range(3):
            faults_of_one_step()  # the heap grows to the steps' high-water mark
        return [faults_of_one_step() for _ in range(3)]

    if on_a_thread:  # built and stepped there, as a served worker's AsyncEngine does
        keep_freed_memory()  # as AsyncEngine does before starting its thread
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            steady = pool.submit(steps).result(timeout=300)
    else:
        steady = steps()
    assert max(steady) < 2_500, f"pages faulted in by steps of the same shape: {steady}"


def test_the_async_engine_sets_them_before_its_thread_starts(tiny_model_dir, monkeypatch) -> None:
    import threading

    from engine.async_engine import AsyncEngine
    from engine.engine import LLMEngine

    threads = []
    monkeypatch.setattr(
        "engine.async_engine.keep_freed_memory",
        lambda: threads.append({t.name for t in threading.enumerate()}) or True,
    )
    model = tiny_model_dir("llama")
    engine = AsyncEngine(lambda: LLMEngine(model))
    try:
        assert len(threads) == 1 and "engine-loop" not in threads[0]
    finally:
        engine.stop()


def test_the_engine_sets_them_on_cpu(tiny_model_dir, monkeypatch) -> None:
    from engine.engine import LLMEngine

    calls = []
    monkeypatch.setattr("engine.engine.keep_freed_memory", lambda: calls.append(1) or True)
    LLMEngine(tiny_model_dir("llama"))
    assert calls == [1]
