"""An engine's admission by priority and by a token-weighted fair share between tenants
(core/fair_share.py, engine/wait_queue.py), its preemption of lower-priority requests for a
higher one, and greedy output through that preemption equal to transformers'."""

from __future__ import annotations

import itertools
import zlib

import pytest

from core.config import EngineConfig
from core.fair_share import FairShare, FairShareConfig, parse_weights
from core.hashing import model_root_hash
from core.sampling import SamplingParams
from engine import LLM
from engine.kv_cache.manager import KVCacheManager
from engine.request import Request, RequestStatus
from engine.scheduler import Scheduler
from tests import oracle
from tests.engine.test_scheduler import advance

BS = 4


def make(num_blocks: int, fair: FairShareConfig | None = None, **cfg: int) -> Scheduler:
    config = EngineConfig(block_size=BS, num_kv_blocks=num_blocks, **cfg,
                          fair_share=fair or FairShareConfig())  # fmt: skip
    return Scheduler(config, KVCacheManager(num_blocks, BS, model_root_hash("t", BS)))


def req(rid: str, n: int = 4, priority: int = 0, tenant: str = "") -> Request:
    # crc32, not hash(): str hashes change between processes, and requests whose tokens
    # collide share cached blocks, which changes what each is charged.
    token = zlib.crc32(rid.encode()) % 90 + 1
    return Request(rid, [token] * n, SamplingParams(), priority=priority, tenant=tenant)


def admitted(s: Scheduler, steps: int) -> list[str]:
    """The order requests were first scheduled over `steps` steps, each finishing with its
    first token (so a slot frees every time one is answered)."""
    order: list[str] = []
    for _ in range(steps):
        for rid, _ in advance(s):
            if rid not in order:
                order.append(rid)
        for r in [r for r in s.running if r.output_token_ids]:
            s.finish(r)
    return order


def test_a_lower_priority_number_is_admitted_first() -> None:
    s = make(64, max_num_seqs=1)
    for r in (req("late", priority=5), req("urgent", priority=-1), req("normal")):
        s.add(r)
    assert s.waiting.head().request_id == "urgent"
    s.schedule()
    assert [r.request_id for r in s.running] == ["urgent"]


def test_a_quiet_tenant_is_served_between_a_flooding_tenants_requests() -> None:
    # One admission a step (the batch cap frees a slot as each 1-token request finishes).
    s = make(256, max_num_seqs=1)
    for i in range(20):
        s.add(req(f"flood{i}", n=8, tenant="flood"))
    first = admitted(s, 6)  # the flood alone: first in, first out
    for i in range(2):
        s.add(req(f"quiet{i}", n=8, tenant="quiet"))
    rest = admitted(s, 60)
    # The quiet tenant rejoins at the flood's counter (no credit for its idle time), and
    # from there the two alternate: its two go within the next four, not after 14 floods.
    assert set(rest[:4]) >= {"quiet0", "quiet1"}, (first, rest)
    assert rest[4:] == [f"flood{i}" for i in range(8, 20)]


def test_without_fair_share_the_queue_is_first_in_first_out() -> None:
    s = make(256, FairShareConfig(enabled=False), max_num_seqs=1)
    for i in range(4):
        s.add(req(f"flood{i}", n=8, tenant="flood"))
    s.add(req("quiet0", n=8, tenant="quiet"))
    assert admitted(s, 40) == ["flood0", "flood1", "flood2", "flood3", "quiet0"]


def test_weights_share_what_is_served() -> None:
    fair = FairShare(FairShareConfig(weights=parse_weights("gold=3, free=1")))
    fair.charge("gold", prompt_tokens=30)
    fair.charge("free", prompt_tokens=10, output_tokens=5)
    assert fair.served("gold") == 10.0 and fair.served("free") == 20.0
    assert fair.next_class([(0, "free"), (0, "gold")]) == (0, "gold")
    assert fair.next_class([(0, "gold"), (-1, "free")]) == (-1, "free")  # priority first


@pytest.mark.parametrize("text", ["gold", "gold=0", "=2", "gold=x"])
def test_a_malformed_weight_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="tenant weight"):
        parse_weights(text)


def test_a_higher_priority_request_preempts_a_lower_one_when_blocks_run_out() -> None:
    s = make(4)  # 16 token slots
    s.add(req("low0", n=7, priority=1))
    s.add(req("low1", n=7, priority=1))
    advance(s)
    assert s.kv.pool.num_free_blocks == 0
    s.add(req("high", n=7, priority=0))
    batch = s.schedule()
    assert [r.request_id for r in batch.preempted] == ["low1"]  # the latest admitted
    assert "high" in [r.request_id for r, _ in batch.items]
    low1 = next(r for r in s.waiting if r.request_id == "low1")
    assert low1.status == RequestStatus.PREEMPTED and low1.num_computed_tokens == 0
    s.kv.pool.check_invariants()


def test_equal_priority_never_preempts_for_a_waiting_request() -> None:
    s = make(4)
    s.add(req("a", n=7))
    s.add(req("b", n=7))
    advance(s)
    s.add(req("c", n=7))
    batch = s.schedule()
    assert not batch.preempted and "c" not in [r.request_id for r, _ in batch.items]


def test_preempted_for_priority_the_output_equals_transformers(tiny_model_dir) -> None:
    model_dir = tiny_model_dir("llama")
    llm = LLM(model_dir, num_kv_blocks=10)  # 160 slots: two of these and nothing more
    engine = llm.engine
    vocab = engine.model_config.vocab_size
    prompts = {name: [(7 * i + k) % (vocab - 3) + 3 for i in range(60)]
               for k, name in enumerate(("low0", "low1", "high"))}  # fmt: skip
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    tokens: dict[str, list[int]] = {name: [] for name in prompts}
    engine.add_request("low0", prompts["low0"], greedy, priority=2)
    engine.add_request("low1", prompts["low1"], greedy, priority=2)
    for step in itertools.count():
        if step == 3:  # both low ones decoding: the cache has no room for a third
            engine.add_request("high", prompts["high"], greedy, priority=0)
        elif step > 3 and not engine.has_unfinished():
            break
        for delta in engine.step():
            tokens[delta.request_id] += delta.new_token_ids
    assert engine.scheduler.num_preemptions > 0
    for name, prompt in prompts.items():
        assert tokens[name] == oracle.hf_greedy(str(model_dir), tuple(prompt), 12), name
    assert engine.kv.pool.num_used_blocks == 0
