"""Prefix migration in the router simulator: a worker copies a peer's blocks, counts them
apart from its cache hits and from computed tokens, and the run reports all three."""

from __future__ import annotations

from bench.routing import router_sim
from core.perf import WorkerProfile
from loadgen.traces import TraceRequest
from planner.sim.prefill import SimWorker
from planner.sim.prefill_pool import simulate

# 1 ms per token computed; 1,000 bytes per token at 1 GB/s: 1 us per token copied
PROFILE = WorkerProfile(
    step_ms=10.0,
    token_ms=1.0,
    chunk_tokens=256,
    kv_bytes_per_token=1000.0,
    transfer_gbps=1.0,
    transfer_latency_ms=2.0,
)


def test_a_worker_copies_its_peers_blocks_and_counts_them_apart() -> None:
    peer, w = SimWorker("p0", 8, PROFILE), SimWorker("p1", 8, PROFILE)
    peer.serve([1, 2, 3, 4])
    w.serve([1])
    hit, pulled, events, available = w.serve([1, 2, 3, 4, 5, 6], peer, pull_blocks=3)
    assert (hit, pulled, available) == (1, 3, 0.0)
    assert events[0].block_hashes == [2, 3, 4, 5, 6]  # copied blocks are cached now
    assert w.serve([1, 2, 3, 4, 9])[0] == 4
    # the copy (2 ms + 48 us) runs before the prefill of the 32 computed tokens
    finish = w.enqueue(0.0, prompt_tokens=96, uncached=32, transferred=48)
    assert finish == 2.0 + 48 * 1e-3 + PROFILE.prefill_ms(32, 64)
    load = w.load(1e6)
    assert load.num_prompt_tokens == 96 and load.num_cached_prompt_tokens == 16
    assert load.num_pulled_prompt_tokens == 48 and load.steps.prefill_tokens == 32


def test_the_peer_s_copy_of_a_pulled_prefix_is_its_first_to_evict() -> None:
    """As a real peer releases a prefix it handed over (prefill_worker.worker `hand_over`):
    the prefix moves rather than doubles, tail first out of the peer's cache."""
    peer, w = SimWorker("p0", 5, PROFILE), SimWorker("p1", 8, PROFILE)
    peer.serve([7])
    peer.serve([1, 2, 3, 4])
    assert list(peer.cache) == [7, 4, 3, 2, 1]  # least recently used first
    w.serve([1])
    assert w.serve([1, 2, 3, 4, 5], peer, pull_blocks=3)[:2] == (1, 3)
    assert list(peer.cache) == [4, 3, 2, 1, 7]
    assert peer.serve([8, 9])[2][1].block_hashes == [4, 3]  # the handed-over tail first


def test_a_pull_waits_for_blocks_the_peer_is_still_computing() -> None:
    peer, w = SimWorker("p0", 8, PROFILE), SimWorker("p1", 8, PROFILE)
    peer.serve([1, 2, 3, 4])
    done = peer.enqueue(0.0, prompt_tokens=64, uncached=64)
    peer.computed([1, 2, 3, 4], done, now_ms=0.0)
    hit, pulled, _, available = w.serve([1, 2, 3, 4, 5], peer, pull_blocks=4)
    assert (hit, pulled, available) == (0, 4, done)
    finish = w.enqueue(1.0, prompt_tokens=80, uncached=16, transferred=64, available_ms=available)
    assert finish == done + 2.0 + 64 * 1e-3 + PROFILE.prefill_ms(16, 64)


def test_a_stale_pull_copies_only_what_the_peer_still_holds() -> None:
    peer, w = SimWorker("p0", 3, PROFILE), SimWorker("p1", 8, PROFILE)
    peer.serve([1, 2, 3])
    peer.serve([7, 8])  # evicts 3 and 2 (tail first): the router's index may not know yet
    assert w.serve([1, 2, 3, 4], peer, pull_blocks=3)[:2] == (0, 1)


def _trace() -> list[TraceRequest]:
    """One 30-block prefix: one request computes it, then 20 arrive at once (after its
    holder reported it): the holder's queue grows, others pull."""
    prefix = list(range(1000, 1030))
    return [
        TraceRequest(
            arrival_ms=0 if k == 1 else 2000,
            input_length=32 * 16,
            output_length=1,
            hash_ids=prefix + [k, -k],
        )
        for k in range(1, 22)
    ]


def test_a_run_reports_computed_hit_and_transferred_tokens_apart() -> None:
    trace = _trace()
    results = {}
    for label in ("ttft", "ttft_no_pull"):
        name, args = router_sim.policy_config(label, PROFILE)
        routers = router_sim.make_routers(name, 4, 16, policy_args=args)
        results[label] = simulate(trace, routers, 4, 200, 16, PROFILE)
    pulled, local = results["ttft"], results["ttft_no_pull"]
    prompt = sum(r.input_length for r in trace)
    assert pulled["num_pulls"] > 0 and pulled["transferred_tokens"] > 0
    assert pulled["transfer_rate"] == pulled["transferred_tokens"] / prompt
    reused = pulled["hit_rate"] * prompt + pulled["transferred_tokens"]
    assert pulled["computed_tokens"] == round(prompt - reused)
    assert local["transferred_tokens"] == 0 and local["num_pulls"] == 0
    assert pulled["computed_tokens"] < local["computed_tokens"]  # migration saves compute


def test_late_binding_routes_every_request_once_a_worker_has_room() -> None:
    trace = _trace()
    prompt = sum(r.input_length for r in trace)
    for late in (False, True):
        routers = router_sim.make_routers("round_robin", 4, 16)
        res = simulate(trace, routers, 4, 200, 16, PROFILE, late_binding=late)
        reused = res["hit_rate"] * prompt + res["transferred_tokens"]
        assert res["computed_tokens"] == round(prompt - reused)
        assert routers[0].num_in_flight == 0  # every ticket routed, prefilled and closed
        # 20 at once on 4 workers: each takes one to run and one to wait; 12 wait unrouted
        assert res["num_bound_late"] == (12 if late else 0)
