"""How fast one engine is on the hardware it runs on: the measurements behind `baton profile`
(and the planner and router simulator that replay them).

Everything is read from the engine's own step totals (core/step_stats.py), before and after
each measured piece of work, exactly as a router reads two load reports, so a profile
counts what a served step costs (schedule, forward, sampling, output), not a kernel alone.
Two fits, least squares over the fastest repeat of each shape (on a shared machine the
slower repeats measure the neighbours):

    prefill_ms(U, C)       = step_ms * ceil(U / chunk_tokens) + token_ms * U
                             + attn_ms * U * (C + U / 2) / 1000
    decode_step_ms(B, L)   = decode_step_ms + decode_row_ms * B + decode_ctx_ms * B * L / 1000

U new prompt tokens after C cached ones (each new token attends to everything before it),
B running requests of L tokens of context each.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from core.sampling import SamplingParams


def least_squares(rows: list[tuple[float, ...]], ys: list[float]) -> list[float]:
    """Non-negative least squares of ys ~ rows, no intercept: a cost is never negative.

    Clipping the unconstrained solution at 0 is not the constrained optimum (the other
    terms keep the share the clipped one took): the optimum is the unconstrained fit of
    some subset of the terms with the rest at 0, so every subset is tried (a handful of
    unknowns: at most 2^k - 1 small solves; no numpy needed here)."""
    k = len(rows[0])
    best: tuple[float, list[float]] | None = None
    for mask in range((1 << k) - 1, 0, -1):  # all the terms first: they must separate
        keep = [i for i in range(k) if mask >> i & 1]
        try:
            part = _solve(rows, ys, keep)
        except ValueError:
            if len(keep) == k:
                raise
            continue
        if min(part) < 0:
            continue
        coeffs = [0.0] * k
        for i, c in zip(keep, part, strict=True):
            coeffs[i] = c
        residual = sum((y - sum(c * x for c, x in zip(coeffs, r, strict=True))) ** 2
                       for r, y in zip(rows, ys, strict=True))  # fmt: skip
        if best is None or residual < best[0]:
            best = (residual, coeffs)
    return best[1] if best else [0.0] * k


def _solve(rows: list[tuple[float, ...]], ys: list[float], keep: Iterable[int]) -> list[float]:
    """The unconstrained least-squares coefficients of the terms in `keep`: the normal
    equations by Gauss-Jordan."""
    cols = list(keep)
    k = len(cols)
    a = [[sum(r[i] * r[j] for r in rows) for j in cols] for i in cols]
    b = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in cols]
    for col in range(k):
        pivot = max(range(col, k), key=lambda i: abs(a[i][col]))
        if abs(a[pivot][col]) < 1e-12:
            raise ValueError("the samples do not separate the terms: measure more shapes")
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for i in range(k):
            if i != col:
                f = a[i][col] / a[col][col]
                a[i] = [x - f * y for x, y in zip(a[i], a[col], strict=True)]
                b[i] -= f * b[col]
    return [b[i] / a[i][i] for i in range(k)]


@dataclass(frozen=True)
class Sample:
    shape: tuple[int, ...]
    """prefill: (steps, new tokens, cached tokens); decode: (batch, context)."""
    seconds: float
    """prefill: the prompt's whole prefill; decode: one step."""


def fastest(samples: list[Sample]) -> list[Sample]:
    best: dict[tuple[int, ...], float] = {}
    for s in samples:
        best[s.shape] = min(s.seconds, best.get(s.shape, s.seconds))
    return [Sample(shape, t) for shape, t in sorted(best.items())]


def prefill_terms(steps: int, tokens: int, cached: int) -> tuple[float, float, float]:
    return float(steps), float(tokens), tokens * (cached + tokens / 2) / 1000


def decode_terms(batch: int, context: float) -> tuple[float, float, float]:
    return 1.0, float(batch), batch * context / 1000


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
            while any(engine.requests[r].num_computed_tokens < context for r in ids):
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


def _fit(
    samples: list[Sample], terms: Callable[..., tuple[float, ...]], names: tuple[str, ...]
) -> dict[str, float]:
    """The terms' coefficients in ms (under `names`) and the worst relative error of the fit
    over the fastest sample of each shape."""
    best = fastest(samples)
    rows = [terms(*s.shape) for s in best]
    coeffs = least_squares(rows, [s.seconds for s in best])
    worst = max(
        abs(s.seconds - sum(c * x for c, x in zip(coeffs, row, strict=True))) / s.seconds
        for s, row in zip(best, rows, strict=True)
    )
    return {**{n: 1000 * c for n, c in zip(names, coeffs, strict=True)}, "max_fit_error": worst}


def fit_prefill(samples: list[Sample]) -> dict[str, float]:
    return _fit(samples, prefill_terms, ("step_ms", "token_ms", "attn_ms"))


def profile_prefill(  # type: ignore[no-untyped-def]
    engine, lengths: list[int], repeat: int, rng: random.Random, extra_rounds: int = 4
) -> tuple[list[Sample], dict[str, float]]:
    """The prefill samples and their fit, measured again (one round at a time, the fastest
    repeat of each shape kept) while the fit says a prompt token costs nothing: on a busy
    machine the neighbours' noise can swamp a small model's per-token cost, and a profile
    without one is no model of a prefill (bench.sim_profile refuses it)."""
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


def fit_decode(samples: list[Sample]) -> dict[str, float]:
    return _fit(samples, decode_terms, ("decode_step_ms", "decode_row_ms", "decode_ctx_ms"))
