"""A prefill and a decode worker with real engines (tiny model, tp=1) in the test's process:
what the worker-level transfer tests share. Requests are one `PROMPT_BLOCKS`-block prompt."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import torch

from core.config import EngineConfig
from core.request import EngineRequest
from core.roles import WorkerRole
from core.sampling import SamplingParams
from decode_worker.worker import DecodeWorker
from engine.output_channel import is_final
from worker.records import WorkerSpec

BLOCK = 16
PROMPT_BLOCKS = 4
TIMEOUT_S = 30.0


def request(request_id: str, seed: int, max_tokens: int = 1) -> EngineRequest:
    rng = random.Random(seed)
    prompt = [rng.randrange(3, 200) for _ in range(PROMPT_BLOCKS * BLOCK - 4)]
    return EngineRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0))


def spec(
    worker_id: str, role: WorkerRole, model_dir: Any, num_blocks: int, transport: str
) -> WorkerSpec:
    engine = EngineConfig(
        block_size=BLOCK, num_kv_blocks=num_blocks, max_model_len=num_blocks * BLOCK
    )
    return WorkerSpec(worker_id, role, str(model_dir), engine, transport=transport)


def on_engine(worker: Any, fn: Callable[[Any], Any]) -> Any:
    """Run `fn(rank)` on the worker's engine thread."""
    return worker.engine.call(lambda g: fn(g.rank))


def cached_kv(rank: Any) -> dict[int, torch.Tensor]:
    """The KV of every cached full block, by its hash."""
    kv = rank.engine.runner.kv_cache
    pool = rank.engine.kv.pool
    return {b.block_hash: kv[:, b.block_id].clone() for b in pool.blocks if b.block_hash}


def same(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor], keys: Any) -> bool:
    return all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in keys)


async def connect_pair(prefill: Any, decode: DecodeWorker) -> None:
    """Connect a prefill and a decode worker as the controller does
    (router/cluster/pairing.py)."""
    await prefill.route(await decode.accept(prefill.info().transport_metadata))


async def handoff(prefill: Any, decode: DecodeWorker, req: EngineRequest) -> tuple[Any, Any, list]:
    """Prefill `req` on `prefill` and decode it on `decode` to its end, as the router's
    attempt does: (the decode worker's reservation, the prefill's reply, every token)."""
    res = await decode.reserve(req, TIMEOUT_S, prefill.worker_id)
    reply = await prefill.prefill(
        req, decode.worker_id, res.dst_block_ids, res.skip_blocks, TIMEOUT_S
    )
    return res, reply, await admit_and_decode(decode, req.request_id, reply.first_token)


async def admit_and_decode(
    decode: DecodeWorker, request_id: str, first_token: int, logprob: Any = None,
    timeout_s: float = TIMEOUT_S,
) -> list[int]:  # fmt: skip
    """Admit a prefilled request on the decode worker and read its tokens to its end (its
    first delta repeats the prefill's first token)."""
    channel = f"ch-{request_id}"
    await decode.admit(request_id, first_token, logprob, timeout_s, channel)
    tokens: list[int] = []
    stream = decode.outputs(channel)
    try:
        async for batch in stream:
            for rid, item in batch:
                assert not isinstance(item, BaseException), item
                if rid == request_id:
                    tokens += item.new_token_ids
                    if is_final(item):
                        return tokens
    finally:
        await stream.aclose()
    raise AssertionError("the stream ended early")


async def run_here(decode: DecodeWorker, req: EngineRequest) -> None:
    """Prefill and decode `req` on the decode worker itself, to its end."""
    channel = f"ch-{req.request_id}"
    await decode.generate(req, TIMEOUT_S, channel)
    stream = decode.outputs(channel)
    try:
        async for batch in stream:
            for request_id, item in batch:
                assert not isinstance(item, Exception), item
                if request_id == req.request_id and is_final(item):
                    return
    finally:
        await stream.aclose()


async def settled(worker: Any) -> None:
    """Poll until the worker holds no blocks and tracks no transfer."""
    for _ in range(400):
        used = await on_engine(worker, lambda r: r.engine.kv.pool.num_used_blocks)
        if used == 0 and not worker.tracker.pending:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"{worker.worker_id} still holds {used} blocks")
