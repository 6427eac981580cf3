"""Prefix migration in the `ttft` policy: a worker pulls a busy peer's cached prefix over the
KV transport when the copy beats both queueing behind the peer and recomputing; never when
the holder is idle, the transfer is slow, or no bandwidth is configured."""

from __future__ import annotations

from core.events import BlockStored, KVEventBatch, WorkerLoad
from router.routing.decision import PrefixPull
from router.routing.policies import RouteContext, make_policy
from router.routing.route import Router, RouterConfig
from router.routing.worker_state import WorkerState

B = 16
# 24 KiB of KV per token at 1 GB/s: a 16-token block copies in ~0.4 ms, computing it at the
# policy's prior (2 ms per token) takes 32 ms.
FAST = {"kv_bytes_per_token": 24576.0, "transfer_gbps": 1.0, "transfer_latency_s": 1e-3}
SLOW = {**FAST, "transfer_gbps": 1e-4}  # ~4 s per block: recomputing is cheaper


def ws(name: str, queued: int = 0) -> WorkerState:
    return WorkerState(name, "prefill", "m", reported_waiting_tokens=queued)


def ctx(workers: list[WorkerState], cached: dict[str, int], blocks: int = 40) -> RouteContext:
    return RouteContext(workers, cached, blocks, blocks * B, B)


def test_pulls_from_a_busy_holder_when_the_copy_is_cheaper() -> None:
    holder, idle = ws("a", queued=5000), ws("b")
    choice = make_policy("ttft", "prefill", **FAST).choose(ctx([holder, idle], {"a": 30}))
    terms = dict(choice.terms)
    assert choice.worker is idle and choice.pull == PrefixPull("a", 30)
    assert choice.reason == "ttft_pull"
    assert terms["pull_blocks"] == 30 and terms["uncached_tokens"] == 10 * B
    assert 0 < terms["transfer_s"] < 0.1


def test_pulls_only_the_blocks_the_worker_lacks() -> None:
    holder, partial = ws("a", queued=5000), ws("b")
    choice = make_policy("ttft", "prefill", **FAST).choose(
        ctx([holder, partial], {"a": 30, "b": 12})
    )
    assert choice.worker is partial and choice.pull == PrefixPull("a", 18)


def test_an_idle_holder_serves_its_own_prefix() -> None:
    for order in ("ab", "ba"):  # whatever the tie-break rotation
        holder, other = ws("a"), ws("b")
        workers = [holder, other] if order == "ab" else [other, holder]
        choice = make_policy("ttft", "prefill", **FAST).choose(ctx(workers, {"a": 30}))
        assert choice.worker is holder and choice.pull is None


def test_no_pull_when_the_transfer_is_slow_or_not_configured() -> None:
    for args in (SLOW, {}):
        holder, idle = ws("a", queued=5000), ws("b")
        choice = make_policy("ttft", "prefill", **args).choose(ctx([holder, idle], {"a": 30}))
        assert choice.worker is idle and choice.pull is None  # recomputes, no queue
        assert dict(choice.terms)["uncached_tokens"] == 40 * B


def test_the_decision_carries_the_pull_and_charges_only_computed_tokens() -> None:
    router = Router(
        RouterConfig(prefill_policy="ttft", prefill_policy_args=FAST, disagg_min_uncached_tokens=0)
    )
    for wid in ("p0", "p1"):
        router.add_worker(wid, "prefill", "m")
    router.add_worker("d0", "decode", "m")
    router.apply(KVEventBatch("p0", 0, [BlockStored(None, list(range(1, 31)))], model="m"))
    router.report_load(WorkerLoad("p0", "prefill", 1, 3, 5000, 100, 100, 1.0))
    ticket = router.route("m", block_hashes=list(range(1, 41)), num_prompt_tokens=40 * B)
    d = ticket.decision
    assert d.prefill_worker_id == "p1" and d.pull_from == PrefixPull("p0", 30)
    assert d.prefill_cached_blocks == 0 and d.pulled_blocks == 30
    assert router.worker_load("p1")[0] == 10 * B  # the pulled 30 blocks are not queued work
    ticket.close()


def test_a_hot_prefix_is_copied_to_the_workers_that_take_its_overflow() -> None:
    """One prefix, a long queue on its holder: the requests spread over the pool and every
    other worker pulls the prefix instead of computing it."""
    policy = make_policy("ttft", "prefill", **FAST)
    workers = [ws("a", queued=20_000), ws("b"), ws("c"), ws("d")]
    cached = {"a": 30}
    placed: dict[str, int] = {}
    for _ in range(12):
        choice = policy.choose(ctx(workers, cached))
        wid = choice.worker.worker_id
        placed[wid] = placed.get(wid, 0) + 1
        if wid != "a":
            assert choice.pull is not None and choice.pull.peer_id == "a"
        choice.worker.reported_waiting_tokens += int(dict(choice.terms)["uncached_tokens"])
    assert {"b", "c", "d"} <= placed.keys()
