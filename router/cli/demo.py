"""`baton demo`: two chat prompts through the engine in this process (no Ray, no servers)."""

from __future__ import annotations

import argparse
import time

from router.cli.model_dir import resolve_model

_MESSAGES = [
    [{"role": "user", "content": "Tell me about batons."}],
    [{"role": "user", "content": "What is a relay race?"}],
]


def run_demo(args: argparse.Namespace) -> int:
    from engine import LLM, SamplingParams

    model_dir = resolve_model(args.model, "demo")
    start = time.monotonic()
    llm = LLM(model_dir, num_threads=args.threads)
    prompts = [llm.tokenizer.encode_chat(m) for m in _MESSAGES]
    outs = llm.generate(prompts, SamplingParams(max_tokens=args.max_tokens, temperature=0.0))
    for m, out in zip(_MESSAGES, outs, strict=True):
        print(
            f"> {m[0]['content']}\n{out.text!r}  [{len(out.token_ids)} tokens, "
            f"{out.finish_reason}, ttft {out.timings.ttft_s:.3f} s]"
        )
    elapsed = time.monotonic() - start
    print(f"model {model_dir}, {elapsed:.1f} s")
    return 0
