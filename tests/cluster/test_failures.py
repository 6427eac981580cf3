"""Workers dying mid-stream (`ray.kill`): every request completes within its deadline,
retried on another worker from where it was, and its stream is exactly the fault-free one
(chunk by chunk: token ids and text, greedy and seeded); the pool returns to its desired
size."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import ray

from core.config import EngineConfig
from core.sampling import SamplingParams
from engine.engine import LLMEngine
from router.frontdoor.metrics import Metrics
from tests import oracle
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect, poll, prompts

pytestmark = pytest.mark.slow
LONG = 120
PARAMS = SamplingParams(max_tokens=LONG, temperature=0.0, ignore_eos=True)
KILL_AFTER = 10
"""Tokens every stream has before the kill."""
Chunks = list[tuple[list[int], str]]


def params_for(i: int) -> SamplingParams:
    """Greedy and seeded requests alternate: a retry must keep the seeded stream too."""
    if i % 2 == 0:
        return PARAMS
    return SamplingParams(max_tokens=LONG, temperature=1.0, seed=100 + i, ignore_eos=True)


def fault_free(model_dir, batch: list[list[int]]) -> list[Chunks]:
    """Each request's stream from one engine in this process, nothing failing."""
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=256, num_threads=1))
    streams: dict[str, Chunks] = {}
    for i, p in enumerate(batch):
        engine.add_request(f"k{i}", p, params_for(i))
        streams[f"k{i}"] = []
    while engine.has_unfinished():
        for delta in engine.step():
            streams[delta.request_id].append((delta.new_token_ids, delta.new_text))
    return list(streams.values())


def run_with_kill(cluster, loop_thread, batch, victim_role: str) -> list[Chunks]:
    backend = cluster.backend

    async def run() -> list[Chunks]:
        streams: list[Chunks] = [[] for _ in batch]
        tasks = [
            asyncio.create_task(
                collect(backend, f"k{i}", p, params_for(i), 90.0, chunks=streams[i])
            )
            for i, p in enumerate(batch)
        ]

        def under_way() -> bool:  # a retry has state to carry (or a request already failed)
            return min(map(len, streams)) >= KILL_AFTER or any(t.done() for t in tasks)

        await poll(under_way, 60, "every stream under way")
        victim = next(m for m in cluster.membership.workers.values() if m.role == victim_role)
        ray.kill(victim.handle, no_restart=True)
        await asyncio.gather(*tasks)  # strict: every request completes
        return streams

    return loop_thread.run(run(), timeout=180)


def wait_for_pools(cluster, loop_thread, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, members = ray.get(cluster.controller.get_members.remote(), timeout=30)
        desired = ray.get(cluster.controller.get_desired.remote(), timeout=30)
        ready = {p: sum(1 for m in members if m.role == p and m.state == "ready") for p in desired}
        if ready == desired:
            return
        time.sleep(0.5)
    raise AssertionError(f"pools did not return to {desired}: {ready}")


def check(streams: list[Chunks], batch: list, model_dir) -> None:
    """Each stream is the fault-free one, chunk by chunk; the greedy ones are also
    transformers' tokens."""
    for i, (stream, want) in enumerate(zip(streams, fault_free(model_dir, batch), strict=True)):
        assert stream == want, f"k{i}: the stream differs from the fault-free one"
        if params_for(i) is PARAMS:
            tokens = [t for ids, _ in stream for t in ids]
            assert tokens == oracle.hf_greedy(str(model_dir), tuple(batch[i]), LONG)


@pytest.mark.parametrize(
    ("victim", "num_prefill", "num_decode"),
    [("decode", 1, 2), ("prefill", 2, 1), ("decode", 1, 1)],
    ids=["decode", "prefill", "only-decode"],
)
def test_kill_worker_mid_stream(
    cluster_factory,
    loop_thread,
    tiny_model_dir,
    caplog,
    victim: str,
    num_prefill: int,
    num_decode: int,
) -> None:
    """With a spare worker the retry goes there at once; killing the only decode worker
    makes the retries wait for the controller's replacement, within the deadline. (Killing
    the prefill worker once every stream is decoding retries nothing: it checks that the
    pool recovers.)"""
    model_dir = tiny_model_dir("llama")
    spec = make_spec(model_dir, num_prefill=num_prefill, num_decode=num_decode)
    cluster = cluster_factory(spec, always_disaggregate())
    cluster.use_metrics(metrics := Metrics())
    batch = prompts(6, 1000, [30, 70, 120, 45, 90, 200], seed=31)
    with caplog.at_level(logging.WARNING, logger="router.cluster.request_path"):
        streams = run_with_kill(cluster, loop_thread, batch, victim)
    if victim == "decode":  # the streams on the dead worker moved mid-stream
        assert any("retrying with" in r.getMessage() for r in caplog.records)
    check(streams, batch, model_dir)
    wait_for_pools(cluster, loop_thread)
    # and the cluster serves again
    p = prompts(1, 1000, [50], seed=32)[0]
    out = loop_thread.run(collect(cluster.backend, "after", p, PARAMS))
    assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), LONG)
    # The replacement joins under a new id with an empty index entry: no worker is credited
    # with blocks it does not hold, so no prediction ran ahead of a worker's reuse, retries
    # and the request after them included (router.routing.accuracy).
    samples = [s for family in metrics.registry.collect() for s in family.samples]
    judged = [s for s in samples if s.name == "baton:router_prefix_predicted_blocks_total"]
    over = [
        s.labels["worker"] for s in samples
        if s.name == "baton:router_prefix_mispredictions_total"
        and s.labels["direction"] == "over" and s.value > 0
    ]  # fmt: skip
    assert judged and over == []
