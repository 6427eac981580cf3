"""The engine's step totals (reported with its load): counts that add up, phases that nest."""

from __future__ import annotations

from core.config import EngineConfig
from core.sampling import SamplingParams
from engine.engine import LLMEngine


def test_step_totals_count_rows_and_tokens(tiny_model_dir) -> None:
    engine = LLMEngine(tiny_model_dir(), EngineConfig(num_kv_blocks=64))
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    prompts = [list(range(5, 25)), list(range(30, 42))]
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    t = engine.load().steps
    assert t.steps == steps
    assert t.prefill_tokens == sum(len(p) for p in prompts)
    assert t.decode_rows == len(prompts) * (params.max_tokens - 1)  # the first comes with prefill
    assert 0 < t.attention_s < t.forward_s  # on CPU attention is timed, inside the forward
    assert t.sample_s > 0 and t.output_s > 0 and t.schedule_s > 0


def test_the_reported_backlog_holds_a_chunked_prefill_until_its_last_chunk(tiny_model_dir) -> None:
    config = EngineConfig(num_kv_blocks=64, max_num_batched_tokens=32)
    engine = LLMEngine(tiny_model_dir(), config)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request("long", list(range(5, 85)), params)  # 80 tokens: three chunks
    backlog = [engine.load().num_waiting_tokens]
    while engine.has_unfinished():
        engine.step()
        backlog.append(engine.load().num_waiting_tokens)
    # Waiting, then running part-way through its prefill, then decoding: none left.
    assert backlog == [80, 48, 16, 0, 0, 0]
    # Each chunk's attention pairs: its n tokens over the c before them and each other.
    chunks = [(32, 0), (32, 32), (16, 64)]
    pairs = sum(n * c + n * (n + 1) // 2 for n, c in chunks)
    assert engine.load().steps.prefill_pairs == pairs == 80 * 81 // 2


def test_the_oldest_wait_holds_a_prompt_until_its_first_token(tiny_model_dir) -> None:
    """A prompt admitted into the batch still waits for its first token while its chunks
    run; a decoding request waits no more; the batch's slots are reported beside it."""
    config = EngineConfig(num_kv_blocks=64, max_num_batched_tokens=32, max_num_seqs=4)
    engine = LLMEngine(tiny_model_dir(), config)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request("long", list(range(5, 85)), params)  # 80 tokens: three chunks
    waits, running = [], []
    while engine.has_unfinished():
        engine.step()
        load = engine.load()
        waits.append(load.oldest_wait_s)
        running.append((load.num_running, load.num_waiting, load.batch_usage))
    # Running after chunks one and two (no token yet), then decoding.
    assert waits[0] > 0 and waits[1] >= waits[0]
    assert waits[2:] == [0.0] * (len(waits) - 2)
    assert running[0] == (1, 0, 0.25)
    assert engine.load().max_num_seqs == 4


def test_the_serving_loop_counts_its_time_between_steps_apart(tiny_model_dir) -> None:
    import asyncio
    import time

    from engine.async_engine import AsyncEngine

    engine = AsyncEngine(LLMEngine(tiny_model_dir(), EngineConfig(num_kv_blocks=64)))
    pause_s = 0.01
    engine.after_step.append(lambda: time.sleep(pause_s))  # work between two steps
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    try:

        async def main() -> int:
            engine.open_stream("r")
            await engine.call(lambda e: e.add_request("r", list(range(5, 25)), params))
            return sum([len(d.new_token_ids) async for d in engine.stream("r", timeout_s=30)])

        assert asyncio.run(main()) == 6
        t = engine.submit(lambda e: e.load().steps).result(timeout=30)
    finally:
        engine.stop()
    # Six steps with work; a pause after each of the first five comes before another step.
    assert t.steps == 6
    # Not the steps' time: at most a pause more (and a loaded host's oversleeping).
    assert 5 * pause_s <= engine.between_s < 6 * pause_s + t.busy_s() + 0.05
    assert t.between_s == 0.0  # the engine's own totals are its steps'; the worker adds it
