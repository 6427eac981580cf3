"""How fast one engine is on the hardware it runs on: the measurements behind `baton profile`.

Everything is read from the engine's own step totals (core/step_stats.py), before and after
each measured piece of work, exactly as a router reads two load reports, so a profile
counts what a served step costs (schedule, forward, sampling, output), not a kernel alone.
The engine is anything with the `LLMEngine` calls used here (`add_request`, `step`,
`abort`, `has_unfinished`, `load`): an `LLMEngine`, or a `TPEngine` whose ranks step in
lockstep and whose rank 0 reports the totals. The samples are fitted to the performance
model (core/perf: its formulas and the fit).
"""

from __future__ import annotations

import random

from core.perf.fit import Sample, fit_prefill
from core.sampling import SamplingParams


def _random_prompt(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]


def _run_to_end(engine) -> None:  # type: ignore[no-untyped-def]
    while engine.has_unfinished():
        engine.step()


def measure_prefill(  # type: ignore[no-untyped-def]
    engine, lengths: list[int], repeat: int, rng: random.Random, warm_up: bool = True
) -> list[Sample]:
    """Each length alone (no queue: every step is that prompt's), with nothing cached and
    again after a cached prefix of the same length (prefix caching must be on). A first
    round warms the kernels and the allocator up and is not kept (`warm_up`)."""
    vocab = engine.model_config.vocab_size
    samples = []
    for k in range(0 if warm_up else 1, repeat + 1):
        for n in lengths:
            prefix = _random_prompt(rng, vocab, n)
            for cached_part, prompt in (
                ([], prefix),
                (prefix, prefix + _random_prompt(rng, vocab, n)),
            ):
                before = engine.load()
                engine.add_request(f"p{k}-{n}-{len(prompt)}", prompt, SamplingParams(max_tokens=1))
                _run_to_end(engine)
                after = engine.load()
                steps = after.steps.steps - before.steps.steps
                tokens = after.steps.prefill_tokens - before.steps.prefill_tokens
                cached = len(prompt) - tokens
                if k and (not cached_part or cached):
                    busy = after.steps.busy_s() - before.steps.busy_s()
                    samples.append(Sample((steps, tokens, cached), busy))
    return samples


def decode_max_tokens(batch: int, context: int, budget: int, steps: int) -> int:
    """What each of a decode shape's requests asks for (`measure_decode`): the steps the
    shape's prefill takes at `budget` tokens a step, the `steps` timed, and a margin."""
    return -(-batch * context // budget) + steps + 4


def measure_decode(
    engine, batches: list[int], contexts: list[int], steps: int, rng: random.Random
) -> list[Sample]:  # type: ignore[no-untyped-def]
    """`batch` requests of `context` prompt tokens prefilled together, then `steps` decode
    steps timed (mean per step). Aborted afterwards, so each shape starts from an empty
    batch. Each request asks for enough tokens to outlast the others' prefill: with chunked
    prefill the first prompts decode while the last are still being computed, and one that
    finished early would leave the timed steps a row short (the shape was then dropped, so
    the large batch x context shapes that load brings were missing from the fit)."""
    vocab = engine.model_config.vocab_size
    budget = engine.config.max_num_batched_tokens
    samples = []
    for context in contexts:
        for batch in batches:
            max_tokens = decode_max_tokens(batch, context, budget, steps)
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            ids = [f"d{batch}-{context}-{i}" for i in range(batch)]
            for rid in ids:
                engine.add_request(rid, _random_prompt(rng, vocab, context), params)
            while engine.load().num_waiting_tokens:  # prompt tokens not yet computed
                engine.step()
            engine.step()  # the first all-decode step (its shapes' first use)
            before = engine.load().steps
            for _ in range(steps):
                engine.step()
            after = engine.load().steps
            done = after.steps - before.steps
            if after.decode_rows - before.decode_rows == batch * done and done:
                samples.append(Sample((batch, context), (after.busy_s() - before.busy_s()) / done))
            for rid in ids:
                engine.abort(rid)
    return samples


def profile_prefill(  # type: ignore[no-untyped-def]
    engine, lengths: list[int], repeat: int, rng: random.Random, extra_rounds: int = 4
) -> tuple[list[Sample], dict[str, float]]:
    """The prefill samples and their fit, measured again (one round at a time, the fastest
    repeat of each shape kept) while the fit says a prompt token costs nothing: on a busy
    machine the neighbours' noise can swamp a small model's per-token cost, and a profile
    without one is no model of a prefill (`WorkerProfile.load` refuses it)."""
    samples = measure_prefill(engine, lengths, repeat, rng)
    fit = fit_prefill(samples)
    for _ in range(extra_rounds):
        if fit["token_ms"] > 0:
            break
        samples = samples + measure_prefill(engine, lengths, 1, rng, warm_up=False)
        fit = fit_prefill(samples)
    if fit["token_ms"] <= 0:
        raise ValueError(
            f"prefill time did not grow with prompt length over {repeat + extra_rounds} rounds "
            f"(fit: {fit}): measure longer prompts (--lengths) on a quieter machine"
        )
    return samples, fit
