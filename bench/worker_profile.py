"""Measure a prefill worker's service-time profile from the engine's own step totals.

    python -m bench.worker_profile --model models/small --out bench/profiles/cpu_small.json

Runs the project's engine in the prefill role on one checkpoint, one prompt at a time (so no
queue: every step's time is that prompt's), with prefix caching off (every token computed),
and reads `core.step_stats.StepTotals` before and after each prompt, exactly as a router
reads them from two load reports. A least-squares fit over the prompts gives

    prefill_ms(U, C) = step_ms * ceil(U / chunk_tokens) + token_ms * U
                     + attn_ms * U * (C + U / 2) / 1000

for U new tokens after C cached ones (the last term: each new token attends to all before it),
where chunk_tokens is the engine's token budget per step (`max_num_batched_tokens`). The
fit takes the time of every phase of a step (schedule, forward, sample, output), since the
worker spends all of them before the first token leaves. This is what the router
simulator's queueing model replays (bench.sim_profile). `baton profile` measures the same
fit, with cached prefixes and decode steps too (engine/perf_profile.py, the shared terms).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from core.config import EngineConfig
from core.sampling import SamplingParams
from engine.perf_profile import least_squares, prefill_terms


def fit_fastest(
    samples: list[tuple[int, int, float]],
) -> tuple[float, float, float, list[tuple[int, int, float]]]:
    """Fit (step_s, token_s, attn_s) to the fastest run of each prompt length: on a shared
    machine the slower repeats measure the neighbours, not the engine."""
    best: dict[tuple[int, int], float] = {}
    for steps, n, t in samples:
        best[(steps, n)] = min(t, best.get((steps, n), t))
    fastest = [(steps, n, t) for (steps, n), t in sorted(best.items())]
    step_s, token_s, attn_s = least_squares(
        [prefill_terms(s, n, 0) for s, n, _ in fastest], [t for *_, t in fastest]
    )
    return step_s, token_s, attn_s, fastest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="a checkpoint folder")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 1024, 2048, 4000])
    parser.add_argument("--chunk-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from engine.engine import LLMEngine  # torch: only when measuring

    config = EngineConfig(
        role="prefill",
        enable_prefix_caching=False,
        max_num_batched_tokens=args.chunk_tokens,
        num_threads=args.threads,
        kv_cache_memory_bytes=1 << 29,
    )
    engine = LLMEngine(args.model, config, worker_id="profile")
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)
    samples: list[tuple[int, int, float]] = []  # (steps, tokens, seconds)
    started = time.perf_counter()
    for k in range(args.repeat + 1):
        for n in args.lengths:
            prompt = [rng.randrange(10, vocab) for _ in range(n)]
            before = engine.load().steps
            engine.add_request(f"r{k}-{n}", prompt, SamplingParams(max_tokens=1))
            while engine.has_unfinished():
                engine.step()
            for result in engine.take_prefilled():
                engine.release(result.request_id)
            after = engine.load().steps
            if k:  # the first round warms the kernels and allocator up
                sample = (after.steps - before.steps, after.prefill_tokens - before.prefill_tokens)
                samples.append((*sample, after.busy_s() - before.busy_s()))
    step_s, token_s, attn_s, best = fit_fastest(samples)
    device = engine.runner.device
    profile = {
        "source": (
            f"bench.worker_profile: Baton engine, prefill role, {Path(args.model).name}, "
            f"{engine.model_config.dtype} on {device}, {args.threads} thread(s), prompts "
            f"{args.lengths} x {args.repeat}, prefix cache off, fit of StepTotals deltas "
            "(fastest of the repeats per length: the machine is shared)"
        ),
        "step_ms": round(step_s * 1000, 3),
        "token_ms": round(token_s * 1000, 5),
        "attn_ms": round(attn_s * 1000, 6),
        "chunk_tokens": args.chunk_tokens,
        "samples": [{"steps": s, "tokens": n, "ms": round(t * 1000, 2)} for s, n, t in samples],
        "measured_s": round(time.perf_counter() - started, 1),
    }
    worst = max(
        abs(t - (step_s * steps + token_s * n + attn_s * prefill_terms(steps, n, 0)[2])) / t
        for steps, n, t in best
    )
    profile["max_fit_error"] = round(worst, 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(profile, indent=1) + "\n")
    print(json.dumps({k: v for k, v in profile.items() if k != "samples"}, indent=1))


if __name__ == "__main__":
    main()
