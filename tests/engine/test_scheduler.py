"""Scheduler logic on ints only: budgets, chunking, FIFO admission, preemption."""

from core.config import EngineConfig
from core.hashing import model_root_hash
from core.sampling import SamplingParams
from engine.kv_cache.manager import KVCacheManager
from engine.request import Request, RequestStatus
from engine.scheduler import Scheduler

BS = 4


def make(num_blocks: int, **cfg: int) -> Scheduler:
    config = EngineConfig(block_size=BS, num_kv_blocks=num_blocks, **cfg)
    return Scheduler(config, KVCacheManager(num_blocks, BS, model_root_hash("t", BS)))


def advance(s: Scheduler) -> list[tuple[str, int]]:
    """One step with a fake model: every request that completes its tokens gets token 7."""
    batch = s.schedule()
    for req, n in batch.items:
        req.num_computed_tokens += n
        s.kv.cache_computed_blocks(req)
        if req.num_computed_tokens == req.num_tokens:
            req.append_token(7)
    return [(r.request_id, n) for r, n in batch.items]


def test_chunked_prefill_respects_budget() -> None:
    s = make(64, max_num_batched_tokens=8)
    s.add(Request("a", list(range(20)), SamplingParams()))
    assert advance(s) == [("a", 8)]
    assert advance(s) == [("a", 8)]
    assert advance(s) == [("a", 4)]
    assert s.running[0].output_token_ids == [7]
    assert advance(s) == [("a", 1)]


def test_decodes_come_first_and_share_the_budget() -> None:
    s = make(64, max_num_batched_tokens=10)
    s.add(Request("a", list(range(3)), SamplingParams()))
    advance(s)
    s.add(Request("b", list(range(100, 120)), SamplingParams()))
    assert advance(s) == [("a", 1), ("b", 9)]


def test_max_num_seqs_caps_running() -> None:
    s = make(64, max_num_seqs=2)
    for i in range(3):
        s.add(Request(str(i), [i + 1] * 5, SamplingParams()))
    assert [rid for rid, _ in advance(s)] == ["0", "1"]
    assert len(s.waiting) == 1


def test_preemption_by_recompute_when_blocks_run_out() -> None:
    s = make(4)  # 16 token slots
    s.add(Request("a", list(range(7)), SamplingParams()))
    s.add(Request("b", list(range(100, 107)), SamplingParams()))
    advance(s)  # a: 2 blocks, b: 2 blocks; pool full
    assert s.kv.pool.num_free_blocks == 0
    advance(s)  # position 7: both still fit their second block
    advance(s)  # a needs a 3rd block at position 8 -> preempts b (the newest)
    b = s.waiting.head()
    assert b is not None and b.request_id == "b"
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.num_preemptions == 1
    s.kv.pool.check_invariants()


def test_head_of_line_blocks_fifo() -> None:
    s = make(3)
    s.add(Request("big", list(range(40)), SamplingParams()))  # needs 11 blocks: never fits
    s.add(Request("small", [1, 2], SamplingParams()))
    assert advance(s) == []
