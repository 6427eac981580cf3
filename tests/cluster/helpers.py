"""Driving a cluster backend from test code."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from core.request import RequestOutput
from core.sampling import SamplingParams
from router.frontdoor.backend import GenerateRequest


async def collect(
    backend: Any,
    rid: str,
    prompt: list[int],
    params: SamplingParams,
    timeout_s: float = 120.0,
    started: Any = None,
    chunks: list[tuple[list[int], str]] | None = None,
) -> RequestOutput:
    """Run one request to the end, its deltas accumulated; `started` (an asyncio.Event) is
    set at its first output; `chunks` gets each delta's (token ids, text) as it came."""
    whole = RequestOutput(rid, prompt)
    async for delta in backend.generate(GenerateRequest(rid, prompt, params, timeout_s)):
        if started is not None:
            started.set()
        if chunks is not None:
            chunks.append((delta.new_token_ids, delta.new_text))
        # A stream never repeats or skips: every step adds exactly one token, under the
        # client's request id (retries included).
        assert len(delta.new_token_ids) == 1 and delta.request_id == rid, f"{rid}: {delta}"
        whole.add(delta)
    assert whole.finished
    return whole


def prompts(n: int, vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def worker_loads(cluster: Any) -> dict[str, Any]:
    """worker id -> its current `WorkerLoad` (running, waiting, free and total blocks)."""
    import ray

    workers = list(cluster.membership.workers.items())
    reports = ray.get([m.handle.report.remote() for _, m in workers], timeout=30)
    return {wid: r.load for (wid, _), r in zip(workers, reports, strict=True)}


def wait_until_cached(
    router: Any,
    model: str,
    token_ids: list[int],
    num_blocks: int,
    num_workers: int = 1,
    timeout_s: float = 15.0,
) -> dict[str, int]:
    """Poll `router`'s index (its store synced each time) until `num_workers` workers are
    known to cache the first `num_blocks` blocks of `token_ids`, as KV events report them:
    what a test waits for instead of sleeping. Returns worker id -> cached blocks."""
    import time

    hashes = router.hash_blocks(model, token_ids)
    deadline = time.monotonic() + timeout_s
    while True:
        router.store.sync(1.0)
        prefixes = router.store.longest_prefixes(model, hashes)
        cached = prefixes[0] if prefixes is not None else {}  # as reported, not promised
        if sum(n >= num_blocks for n in cached.values()) >= num_workers:
            return cached
        if time.monotonic() > deadline:
            raise AssertionError(f"no worker known to cache {num_blocks} blocks: {cached}")
        time.sleep(0.02)


def wait_until_offloaded(
    router: Any,
    model: str,
    token_ids: list[int],
    counts: list[int],
    among: set[str] | None = None,
    timeout_s: float = 15.0,
) -> str:
    """Poll `router`'s index until some worker (of `among`, if given) has `counts` blocks of
    its cached prefix of `token_ids` in each offload tier (host, disk), as its `tiered` KV
    events say; returns it."""
    import time

    hashes = router.hash_blocks(model, token_ids)
    deadline = time.monotonic() + timeout_s
    while True:
        router.store.sync(1.0)
        prefixes = router.store.longest_prefixes(model, hashes)
        offloaded = dict(prefixes.offloaded) if prefixes is not None else {}
        for worker, found in offloaded.items():
            if list(found) == counts and (among is None or worker in among):
                return worker
        if time.monotonic() > deadline:
            raise AssertionError(f"no worker known to hold {counts} in its tiers: {offloaded}")
        time.sleep(0.02)


def desired(cluster: Any) -> dict[str, int]:
    """The controller's desired pool sizes."""
    import ray

    return ray.get(cluster.controller.get_desired.remote(), timeout=30)


def wait_for(cluster: Any, pool: str, size: int, timeout_s: float = 90.0) -> None:
    """Wait until `pool` is meant to have `size` workers and has exactly that many, all
    ready (a drained worker gone, a started one up)."""
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        _, members = ray.get(cluster.controller.get_members.remote(), timeout=30)
        mine = [m for m in members if m.role == pool]
        settled = len(mine) == size and all(m.state == "ready" for m in mine)
        if settled and desired(cluster)[pool] == size:
            return
        assert time.monotonic() < deadline, (pool, size, [(m.worker_id, m.state) for m in mine])
        time.sleep(0.1)


async def poll(predicate: Any, timeout_s: float, what: str) -> None:
    """Wait on the running loop until `predicate()` holds; AssertionError naming `what`
    past `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)
