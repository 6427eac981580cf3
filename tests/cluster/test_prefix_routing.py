"""Prefix-aware routing end to end: shared prefixes land on the prefill worker that caches
them, and a decode worker is sent only the blocks it does not already hold."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.roles import WorkerRole
from core.sampling import SamplingParams
from router.routing.decision import PrefixPull
from router.routing.policies import base as policies_base
from router.routing.policies.base import Choice, Policy, RouteContext
from router.routing.route import RouterConfig
from router.routing.worker_state import WorkerState
from tests import oracle
from tests.cluster.conftest import MAX_TOKENS, always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts, wait_until_cached

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
SHARED = 256 + 20  # a shared 256-token prefix and a 20-token tail of its own


def prefill_stats(cluster) -> list:
    """The prefill workers' last load reports (their prompt and cached-token counters)."""
    return [s for s in cluster.membership.loads.values() if s.role == "prefill"]


def wait_for_prefill(cluster, done, timeout_s: float = 15.0) -> list:
    """Poll the prefill workers' reports (they come with the workers' next reports) until
    `done(stats)`; returns them."""
    deadline = time.monotonic() + timeout_s
    while not done(stats := prefill_stats(cluster)):
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)
    return stats


def burst_matches_oracle(loop_thread, backend, model_dir, prefix, tails, tag: str) -> None:
    """Send prefix + each tail at once; every output must be the oracle's."""

    async def burst() -> list:
        return await asyncio.gather(
            *(collect(backend, f"{tag}{i}", prefix + t, GREEDY) for i, t in enumerate(tails))
        )

    outs = loop_thread.run(burst())
    for tail, out in zip(tails, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(prefix + tail), MAX_TOKENS)


def test_shared_prefix_lands_on_the_caching_prefill_worker(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    model_dir = tiny_model_dir("llama")
    cluster = cluster_factory(
        make_spec(model_dir, num_prefill=2, num_decode=1), always_disaggregate()
    )
    backend = cluster.backend
    [prefix] = prompts(1, 1000, [256], seed=11)
    tails = prompts(6, 1000, [20], seed=12)

    async def run() -> list:
        outs = []
        for i, tail in enumerate(tails[1:]):
            outs.append(await collect(backend, f"next{i}", prefix + tail, GREEDY))
        return outs

    outs = [loop_thread.run(collect(backend, "first", prefix + tails[0], GREEDY))]
    # The router learns the first prompt's blocks from the prefill worker's KV events.
    model_id = cluster.membership.model.model_id
    wait_until_cached(cluster.router, model_id, prefix, len(prefix) // 16)
    outs += loop_thread.run(run())
    for tail, out in zip(tails, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(prefix + tail), MAX_TOKENS)

    stats = wait_for_prefill(
        cluster, lambda stats: sum(s.num_cached_prompt_tokens for s in stats) >= 5 * 256
    )
    hits = sorted(s.num_cached_prompt_tokens for s in stats)
    # Every later request reused the 256-token prefix on the same worker: 5 * 256 tokens.
    assert hits == [0, 5 * 256], hits
    busy = max(stats, key=lambda s: s.num_prompt_tokens)
    assert busy.prefix_hit_rate > 0.7


@pytest.mark.parametrize("late_binding", [False, True])
def test_a_burst_of_one_prefix_is_computed_once_per_worker(
    cluster_factory, loop_thread, tiny_model_dir, late_binding
) -> None:
    """Six requests sharing a 256-token prefix arrive together, before any KV event. Where
    several land on one prefill worker (sent by its promise or by load), only the first
    computes the prefix: its engine names the blocks when it schedules them, so the others,
    scheduled in the same step or after it, hit them. Every output is the oracle's, also
    when each request is routed only once a prefill worker has room (late binding)."""
    model_dir = tiny_model_dir("llama")
    config = RouterConfig(disagg_min_uncached_tokens=0, late_binding=late_binding)
    cluster = cluster_factory(make_spec(model_dir, num_prefill=2, num_decode=1), config)
    backend = cluster.backend
    [prefix] = prompts(1, 1000, [256], seed=41)
    tails = prompts(6, 1000, [20], seed=42)
    burst_matches_oracle(loop_thread, backend, model_dir, prefix, tails, "b")
    stats = wait_for_prefill(
        cluster, lambda stats: sum(s.num_prompt_tokens for s in stats) >= 6 * SHARED
    )
    for s in stats:
        requests = s.num_prompt_tokens // SHARED
        assert s.num_cached_prompt_tokens == max(0, requests - 1) * 256, stats


def test_late_binding_routes_waiting_requests_with_the_cache_as_it_is_then(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    """A gate of 128 tokens per prefill worker, six 276-token prompts sharing a 256-token
    prefix at once: the first two are routed at arrival (one to each worker: a worker with
    a prompt in flight has no room), the other four wait unrouted and are routed as
    prefills finish, to a worker whose cache holds the prefix by then. So the prefix is
    computed twice and hit four times, and every output is the oracle's."""
    from core.config import EngineConfig

    model_dir = tiny_model_dir("llama")
    engine = EngineConfig(num_kv_blocks=256, max_num_batched_tokens=64)  # gate: 2 x 64
    config = RouterConfig(disagg_min_uncached_tokens=0, late_binding=True)
    spec = make_spec(model_dir, num_prefill=2, num_decode=1, engine=engine)
    cluster = cluster_factory(spec, config)
    backend = cluster.backend
    [prefix] = prompts(1, 1000, [256], seed=51)
    tails = prompts(6, 1000, [20], seed=52)
    burst_matches_oracle(loop_thread, backend, model_dir, prefix, tails, "l")
    stats = wait_for_prefill(
        cluster, lambda stats: sum(s.num_prompt_tokens for s in stats) >= 6 * SHARED
    )
    assert sum(s.num_cached_prompt_tokens for s in stats) == 4 * 256, stats
    assert backend.gate.num_bound_late >= 1  # some did wait unrouted


def test_multi_turn_sends_only_new_blocks(cluster_factory, loop_thread, tiny_model_dir) -> None:
    model_dir = tiny_model_dir("llama")
    cluster = cluster_factory(
        make_spec(model_dir, num_prefill=1, num_decode=1), always_disaggregate()
    )
    backend = cluster.backend
    [turn1] = prompts(1, 1000, [100], seed=21)

    async def run() -> tuple:
        a = await collect(backend, "t1", turn1, GREEDY)
        sent_before = backend.transfers.num_blocks_sent
        turn2 = turn1 + list(a.token_ids) + prompts(1, 1000, [40], seed=22)[0]
        b = await collect(backend, "t2", turn2, GREEDY)
        return turn2, b, sent_before

    turn2, out2, sent_before = loop_thread.run(run())
    assert out2.token_ids == oracle.hf_greedy(str(model_dir), tuple(turn2), MAX_TOKENS)
    t = backend.transfers
    # turn 1's 6 full prompt blocks stayed cached on the decode worker: not sent again.
    assert t.num_blocks_skipped >= 6
    total_blocks = -(-len(turn2) // 16)
    assert t.num_blocks_sent - sent_before == total_blocks - t.num_blocks_skipped


class PullToOther(Policy):
    """Sends each prompt to the prefill worker caching the least of it, which pulls what the
    one caching the most holds: a prefix migration whenever a worker caches some."""

    def choose(self, ctx: RouteContext) -> Choice:
        def hit(w: WorkerState) -> int:
            return ctx.cached_blocks.get(w.worker_id, 0)

        ranked = sorted(ctx.workers, key=lambda w: (hit(w), w.worker_id))
        target, holder = ranked[0], ranked[-1]
        pull = PrefixPull(holder.worker_id, hit(holder) - hit(target))
        return Choice(target, "test_pull", pull=pull if pull.num_blocks > 0 else None)


@pytest.fixture
def pull_to_other(monkeypatch: pytest.MonkeyPatch) -> str:
    """PullToOther registered as a prefill policy for one test (the registry is global)."""
    monkeypatch.setitem(policies_base._REGISTRY, (WorkerRole.PREFILL, "test_pull"), PullToOther)
    return "test_pull"


def test_a_prefix_pulled_between_prefill_workers_gives_the_oracle_tokens(
    cluster_factory, loop_thread, tiny_model_dir, pull_to_other
) -> None:
    model_dir = tiny_model_dir("llama")
    config = RouterConfig(prefill_policy=pull_to_other, disagg_min_uncached_tokens=0)
    cluster = cluster_factory(make_spec(model_dir, num_prefill=2, num_decode=1), config)
    backend = cluster.backend
    [prefix] = prompts(1, 1000, [256], seed=31)
    tails = prompts(2, 1000, [20], seed=32)
    model_id = cluster.membership.model.model_id

    first = loop_thread.run(collect(backend, "first", prefix + tails[0], GREEDY))
    wait_until_cached(cluster.router, model_id, prefix, len(prefix) // 16)
    second = loop_thread.run(collect(backend, "second", prefix + tails[1], GREEDY))
    for tail, out in zip(tails, (first, second), strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(prefix + tail), MAX_TOKENS)
    t = backend.transfers
    assert (t.prefix_pulls, t.prefix_pulls_failed) == (1, 0)
    assert t.prefix_blocks_pulled == len(prefix) // 16

    # The holder sent the prefix from its cache (computing one token past it), and the
    # second prompt hit the pulled prefix on the other worker: their load reports say so.
    wait_for_prefill(
        cluster,
        lambda stats: sorted(s.num_cached_prompt_tokens for s in stats) == [len(prefix)] * 2,
    )
