"""The autoscaler on a real cluster, decode pool: long outputs that fill the batch slots grow
it, and calm drains it back to its minimum while streams still run on the worker it drains.
That worker finishes them itself (none is retried elsewhere), no request is lost, every
output is exact, and both decisions keep the inputs they were made from.

Nothing here waits on a clock. One cycle:

    flood   FLOOD short streams, each replaced when it ends: one worker's slots are full
            (batch pressure over 1: the pool grows), then both workers' are, until the
            autoscaler has looked at the grown pool saturated (what a worker carries, which
            the scale-down's capacity check reads: capacity.py)
    feed    then FEED_TOKENS: long streams, each replaced when it ends, until a drain is
            seen; the flood's tail ends, and the pool is calm with the feed on both workers
    watch   the members: the decode worker seen draining, the streams in flight on it then,
            and its leaving
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest

from core.config import EngineConfig
from core.request import RequestOutput
from core.sampling import SamplingParams
from router.cluster.autoscale.policy import AutoscaleConfig
from router.frontdoor import door_trace
from tests import oracle
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts, wait_for

pytestmark = pytest.mark.slow

SLOTS = 8
"""Each decode worker's cap on running requests."""
FLOOD, FLOOD_TOKENS = 4 * SLOTS, 32
"""Short streams that fill two workers' slots with some to spare (a slot whose stream just
ended is taken again only once the next one's prompt has arrived, and on a loaded host more
of them are in the prefill pool at any look)."""
FEED_TOKENS = (192, 224, 256)
"""One long stream per length kept in flight (lengths apart, so they do not end together):
3 of 2 x SLOTS slots is calm (pressure 3 / 16 / 0.85 = 0.22, under `calm` 0.5), and 3 of one
worker's SLOTS is not over target, so the pool settles at one worker. Each is longer than a
flood stream, so the feed outlives the flood's tail."""
TRIES = 5
"""Cycles until a drain catches streams on its worker: the feed keeps one or two there, so a
drain in the gap between one stream's end and the next one's start is rare, not impossible
(3 cycles in a row missed it once in a full suite on two loaded cores)."""


def decode_config() -> AutoscaleConfig:
    # Only the batch-slot term can pass its target: TTFT / ITL targets nothing misses, KV far
    # from full, no look ahead; prefill fixed at one worker. Quick looks and short cool-downs;
    # full headroom: the one saturated look may have caught the batch filling, and the test is
    # about mechanics, not tuning.
    return AutoscaleConfig(
        ttft_slo_s=60.0,
        itl_slo_s=60.0,
        min_sizes={"prefill": 1, "decode": 1},
        max_sizes={"prefill": 1, "decode": 2},
        interval_s=0.25,
        up_cooldown_s=0.0,
        down_cooldown_s=1.0,
        calm_periods=3,
        lead_s=0.0,
        down_headroom=1.0,
    )


@dataclass
class Served:
    prompt: list[int]
    max_tokens: int
    door: door_trace.DoorTrace
    """Its record: the decode worker it was routed to, its retries."""
    out: RequestOutput | None = None


@dataclass
class Cycle:
    served: list[Served] = field(default_factory=list)
    drained: str = ""
    """The decode worker seen draining."""
    on_drained: list[Served] = field(default_factory=list)
    """The streams running on it when it was first seen draining (tokens came from it; one
    routed to it but not yet started there is routed again: core/errors.py DrainingError)."""


async def serve(cluster: Any, cycle: Cycle, rid: str, prompt: list[int], n: int) -> None:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    # A door's trace record (as the HTTP door opens one): where the request went, its retries.
    with door_trace.opened(cluster.tracing, True, {}, "", "test") as door:
        assert door is not None
        s = Served(prompt, n, door)
        cycle.served.append(s)
        s.out = await collect(cluster.backend, rid, prompt, params)


async def run_cycle(cluster: Any, seed: int) -> Cycle:
    """One cycle (the module's docstring); returns once a decode worker has left."""
    cycle, saturated, drain_seen = Cycle(), asyncio.Event(), asyncio.Event()
    ids = itertools.count()

    async def keep(prompt: list[int], n: int, until: asyncio.Event) -> None:
        while not until.is_set():
            await serve(cluster, cycle, f"s{seed}-{next(ids)}", prompt, n)

    async def watch() -> None:
        seen: set[str] = set()
        while True:
            status = await cluster.controller.autoscale_status.remote()
            for d in status["latest"]:
                grown = d["pool"] == "decode" and d["signals"]["ready"] == d["size"] == 2
                if grown and d["pressure"] > 1:
                    saturated.set()
            _, members = await cluster.controller.get_members.remote()
            decode = {m.worker_id: m.state for m in members if m.role == "decode"}
            draining = [w for w, state in decode.items() if state == "draining"]
            if not drain_seen.is_set() and draining:
                cycle.drained = draining[0]
                cycle.on_drained = [
                    s for s in cycle.served
                    if s.out is None and s.door.record.decode_worker == cycle.drained
                    and s.door.record.output_tokens > 0
                ]  # fmt: skip
                drain_seen.set()
            left = seen - set(decode)
            if left:  # (one drained between two looks is caught with no stream)
                saturated.set()
                drain_seen.set()
                cycle.drained = cycle.drained or left.pop()
                return
            seen |= set(decode)
            await asyncio.sleep(0.05)

    async def flood_then_feed() -> None:
        flood = prompts(FLOOD, 1000, [24, 40, 32], seed=seed)
        await asyncio.gather(*(keep(p, FLOOD_TOKENS, saturated) for p in flood))
        feed = prompts(len(FEED_TOKENS), 1000, [40, 56], seed=seed + 1)
        await asyncio.gather(
            *(keep(p, n, drain_seen) for p, n in zip(feed, FEED_TOKENS, strict=True))
        )

    await asyncio.gather(watch(), flood_then_feed())
    return cycle


@functools.cache
def greedy(model_dir: str, prompt: tuple[int, ...], n: int) -> list[int]:
    return oracle.hf_greedy(model_dir, prompt, n, ignore_eos=True)


def test_long_outputs_grow_the_decode_pool_and_calm_drains_it_with_streams_in_flight(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    import ray

    model_dir = tiny_model_dir("llama")
    engine = EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512)
    spec = make_spec(
        model_dir, num_prefill=1, num_decode=1, engine=engine,
        decode_engine=EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512,
                                   max_num_seqs=SLOTS),
        autoscale=decode_config(),
    )  # fmt: skip
    cluster = cluster_factory(spec, always_disaggregate())
    cycles: list[Cycle] = []
    for attempt in range(TRIES):
        cycles.append(loop_thread.run(run_cycle(cluster, seed=100 * attempt), timeout=300))
        wait_for(cluster, "decode", 1)  # back to its minimum, the drained worker gone
        if cycles[-1].on_drained:
            break
    cycle = cycles[-1]
    assert cycle.on_drained, f"no drain in {TRIES} cycles caught a stream on its worker"

    # The drained worker finished every stream it held when the drain began: none was
    # retried on another worker (a retry would have moved its record's decode worker).
    for s in cycle.on_drained:
        assert s.out is not None and s.out.finished
        assert s.door.record.decode_worker == cycle.drained and s.door.record.retries == 0
    # Nothing lost, nothing changed: every request of every cycle finished, exact.
    for s in (s for c in cycles for s in c.served):
        assert s.out is not None and s.out.finished, s.door.record
        assert s.out.token_ids == greedy(str(model_dir), tuple(s.prompt), s.max_tokens)

    # Both decisions, with the inputs they were made from.
    status = ray.get(cluster.controller.autoscale_status.remote(), timeout=30)
    decode = [d for d in status["history"] if d["pool"] == "decode"]
    ups = [d for d in decode if (d["size"], d["target"]) == (1, 2)]
    downs = [d for d in decode if (d["size"], d["target"]) == (2, 1)]
    assert len(ups) >= len(cycles) and len(downs) >= len(cycles), decode
    up, down = ups[-1], downs[-1]
    assert up["reason"].endswith("over target") and up["pressure"] > 1
    assert up["terms"]["batch slots"] > 1
    assert up["signals"]["batch_usage"] > 0.85 and up["signals"]["ready"] == 1
    assert "calm" in down["reason"] and down["pressure"] < decode_config().calm
    assert down["signals"]["ready"] == 2 and {"batch slots", "kv usage"} <= set(down["terms"])
    assert down["min_size"] == 1 and down["max_size"] == 2
    assert up["at"] < down["at"]
