"""`baton demo`: a two-turn chat through both pools of a local cluster (one prefill and one
decode worker, no front door). Each turn's prompt is prefilled on the prefill worker, its KV
moves to the decode worker, which writes the answer; the follow-up turn sends the
conversation so far, and its prompt hits the prefix the first turn left in the prefill
worker's cache (the router sends it there: it caches the longest part of it)."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from router.cli.model_dir import resolve_model

TURNS = ("What is a relay race?", "Who carries the baton in one?")


async def _turn(backend: Any, messages: list[dict[str, str]], max_tokens: int) -> tuple[Any, float]:
    """The turn's output, streamed to the terminal, and the seconds to its first token."""
    from core.request import RequestOutput
    from core.sampling import SamplingParams
    from router.frontdoor.backend import GenerateRequest

    ids = backend.tokenizer.encode_chat(messages)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, repetition_penalty=1.1)
    out = RequestOutput(f"demo-{len(messages)}", ids)
    start, first = time.monotonic(), 0.0
    async for delta in backend.generate(GenerateRequest(out.request_id, ids, params)):
        first = first or time.monotonic() - start
        out.add(delta)
        print(delta.new_text, end="", flush=True)
    return out, first


async def chat(backend: Any, max_tokens: int) -> list[tuple[Any, float]]:
    """The demo's turns through `backend`, printed as they stream: each turn's output and
    the seconds to its first token."""
    messages: list[dict[str, str]] = []
    turns = []
    for question in TURNS:
        messages.append({"role": "user", "content": question})
        print(f"> {question}")
        out, ttft = await _turn(backend, messages, max_tokens)
        messages.append({"role": "assistant", "content": out.text})
        print(f"\n  [{len(out.prompt_token_ids)} prompt tokens, {out.num_cached_tokens} from "
              f"the prefill worker's cache; {len(out.token_ids)} tokens, "
              f"the first after {ttft:.2f} s]\n")  # fmt: skip
        turns.append((out, ttft))
    moved = backend.transfers.num_transfers
    print(f"{moved} prompts prefilled on the prefill worker, KV moved to the decode worker")
    return turns


async def _run(model_dir: str, max_tokens: int, threads: int) -> None:
    from core.config import EngineConfig
    from router.cluster.bringup import init_ray, start_cluster
    from router.cluster.spec import ClusterSpec
    from router.routing.route import RouterConfig

    started = time.monotonic()
    init_ray()
    engine = EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512)
    spec = ClusterSpec(model_dir, num_prefill=1, num_decode=1, engine=engine, num_threads=threads)
    # Every prompt through the prefill pool, however short (the demo's point).
    cluster = await start_cluster(spec, RouterConfig(disagg_min_uncached_tokens=0))
    print(f"cluster up in {time.monotonic() - started:.0f} s: 1 prefill + 1 decode worker, "
          f"{cluster.backend.model_name}\n")  # fmt: skip
    try:
        await chat(cluster.backend, max_tokens)
    finally:
        await cluster.close()


def run_demo(args: argparse.Namespace) -> int:
    model_dir = resolve_model(args.model, "demo")
    asyncio.run(_run(str(model_dir), args.max_tokens, args.threads))
    return 0
