"""KV offload tiers (engine/kv_cache/offload.py): evicted blocks spill to host memory and then
to disk, come back on a later prefix hit bit for bit, and the router hears which tier holds a
block and that it is gone only when no tier holds it. Greedy output still equals
transformers through every path."""

from __future__ import annotations

import random

import pytest
import torch

from core.config import EngineConfig
from core.events import BlockRemoved, BlockStored, BlockTiered
from core.sampling import SamplingParams
from engine import LLM
from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.offload import KVOffload
from router.routing.index.prefix_index import PrefixIndex
from tests import oracle
from tests.engine.test_parity import make_prompts

MAX_TOKENS = 6
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


def fake_cache(num_blocks: int) -> torch.Tensor:
    return torch.zeros(2, num_blocks, 2, 4, 1, 3)  # [layers, blocks, K/V, bs, heads, dim]


def removed(pool: BlockPool) -> list[int]:
    return [h for e in pool.take_events() if isinstance(e, BlockRemoved) for h in e.block_hashes]


def cache(pool: BlockPool, kv: torch.Tensor, hashes: list[int]) -> None:
    """Compute blocks named `hashes` (each full of its hash's value) and cache them."""
    blocks = pool.allocate(len(hashes))
    for block, h in zip(blocks, hashes, strict=True):
        kv[:, block.block_id] = h
    pool.cache_blocks(blocks, hashes, [(h,) for h in hashes], parent=None)
    pool.release(blocks)


def test_evicted_blocks_move_down_the_tiers_and_leave_only_from_the_last(tmp_path) -> None:
    kv = fake_cache(2)
    offload = KVOffload(kv, host_blocks=1, disk_blocks=1, disk_dir=str(tmp_path))
    pool = BlockPool(2)
    pool.attach(offload)
    assert list(tmp_path.iterdir()) == []  # the disk tier's file is unlinked at once
    cache(pool, kv, [10, 11])
    pool.take_events()
    cache(pool, kv, [12, 13])  # evicts 10 (-> host), then 11 (-> host; 10 -> disk)
    assert removed(pool) == []
    assert [t.name for t in (offload.find(10, (10,)), offload.find(11, (11,)))] == ["disk", "host"]
    assert offload.find(10, (99,)) is None  # same hash, other tokens: a miss
    cache(pool, kv, [14])  # 12 -> host, 11 -> disk, 10 falls off the last tier
    assert removed(pool) == [10]
    assert sorted(pool.cached_hashes()) == [11, 12, 13, 14]
    [target] = pool.allocate(1)  # 13 -> host, 12 -> disk, 11 gone
    assert removed(pool) == [11]
    assert offload.restore(12, (12,), target.block_id)
    assert bool((kv[:, target.block_id] == 12).all())
    assert offload.tiers[1].stats.restored == 1
    pool.release([target])
    assert pool.reset_prefix_cache()
    assert sorted(removed(pool)) == [12, 13, 14]
    assert offload.hashes() == []


def test_the_events_say_which_tier_holds_a_block(tmp_path) -> None:
    kv = fake_cache(2)
    offload = KVOffload(kv, host_blocks=1, disk_blocks=1, disk_dir=str(tmp_path))
    pool = BlockPool(2)
    pool.attach(offload)
    cache(pool, kv, [10, 11])
    pool.take_events()
    cache(pool, kv, [12, 13])  # 10 -> host, then 11 -> host pushes 10 on to disk
    events = pool.take_events()
    assert events[:3] == [BlockTiered([10], 1), BlockTiered([10], 2), BlockTiered([11], 1)]
    assert events[3:] == [BlockStored(None, [12, 13])]
    cache(pool, kv, [14, 15])  # 12 -> host (11 -> disk, 10 gone), 13 -> host (12 -> disk)
    assert pool.take_events()[:4] == [
        BlockRemoved([10]),
        BlockTiered([11], 2),
        BlockTiered([12], 1),
        BlockRemoved([11]),
    ]
    assert pool.device_hashes() == [14, 15] and pool.tiered_hashes() == [[13], [12]]


def test_the_router_index_learns_which_tier_holds_each_block(tiny_model_dir, tmp_path) -> None:
    block_bytes = 4 * 2 * 16 * 2 * 16 * 4  # llama tiny: 4 layers, 2 KV heads of 16, fp32
    llm = LLM(
        tiny_model_dir("llama"),
        num_kv_blocks=8,
        kv_offload_host_bytes=2 * block_bytes,
        kv_offload_disk_bytes=16 * block_bytes,
        kv_offload_dir=str(tmp_path),
    )
    engine = llm.engine
    index = PrefixIndex("m")

    def feed() -> list[int]:
        batch = engine.take_kv_events()
        if batch is None:
            return []
        index.apply(batch)
        return [h for e in batch.events if isinstance(e, BlockStored) for h in e.block_hashes]

    a = list(range(10, 75))  # four full blocks and one token
    llm.generate([a], GREEDY)
    chain = feed()[:4]
    worker = engine.worker_id
    assert index.longest_prefixes(chain) == {worker: 4}
    assert index.offloaded_blocks(chain, {worker: 4}) == {}
    llm.generate([list(range(100, 220))], GREEDY)  # 8 blocks: a's go down the tiers
    feed()
    assert index.longest_prefixes(chain) == {worker: 4}  # a hit still, but not in place
    assert index.offloaded_blocks(chain, {worker: 4}) == {worker: [2, 2]}  # host, disk
    snapshot = engine.kv_snapshot()  # a re-sync tells the same
    rebuilt = PrefixIndex("m")
    rebuilt.apply(snapshot)
    assert rebuilt.offloaded_blocks(chain, {worker: 4}) == {worker: [2, 2]}
    index.apply(snapshot)  # it took a seq number
    llm.generate([a], GREEDY)  # the hit copies them back: stored on the device again
    feed()
    assert index.longest_prefixes(chain) == {worker: 4}
    assert index.offloaded_blocks(chain, {worker: 4}) == {} and not index.stale_workers
    steps = engine.load().steps  # what the router prices the next copies by
    # (each copy back takes a device block, whose spill can push the next one down a tier)
    assert sum(steps.tier_restored_blocks) == 4 and steps.tier_restored_blocks[1] >= 2
    assert all(s > 0 for s in steps.tier_restore_s)


class StandInEvent:
    """A device event whose copy is done once waited for (the CPU's copies are done at once)."""

    def __init__(self, waited: list[StandInEvent]) -> None:
        self.waited = waited

    def query(self) -> bool:
        return self in self.waited

    def synchronize(self) -> None:
        self.waited.append(self)


def queue_copies(offload: KVOffload) -> tuple[list[StandInEvent], list[StandInEvent]]:
    """Make `offload` queue its copies as on a GPU, with stand-in events: returns (the events
    made, those waited for), in order."""
    made: list[StandInEvent] = []
    waited: list[StandInEvent] = []

    def event() -> StandInEvent:
        made.append(StandInEvent(waited))
        return made[-1]

    offload.queued = True
    offload._event = event  # type: ignore[method-assign]
    return made, waited


def test_queued_copies_are_read_by_the_host_only_once_done(tmp_path) -> None:
    """On a GPU the copies between the cache and the host tier are queued on the steps'
    stream; the host reads a host slot (to move it down to disk) only once the event after
    its copy is done, and a queued restore counts what the start-up measured a copy takes."""
    kv = fake_cache(2)
    offload = KVOffload(kv, host_blocks=1, disk_blocks=1, disk_dir=str(tmp_path))
    assert not offload.queued  # a CPU cache: every copy synchronous
    made, waited = queue_copies(offload)
    host, disk = offload.tiers
    host.restore_block_s, disk.restore_block_s = 0.25, 0.5
    kv[:, 0], kv[:, 1] = 10, 11
    assert offload.spill(0, 10, (10,)) == 1
    assert len(made) == 1 and waited == []  # queued: nothing waited for
    assert offload.spill(1, 11, (11,)) == 1  # 10 goes down to disk: its copy waited for
    assert waited == [made[0]] and len(made) == 2
    assert [t.name for t in (offload.find(10, (10,)), offload.find(11, (11,)))] == ["disk", "host"]
    kv.zero_()
    assert offload.restore(11, (11,), 0) and offload.restore(10, (10,), 1)
    assert bool((kv[:, 0] == 11).all()) and bool((kv[:, 1] == 10).all())
    assert host.stats.restore_s == 0.25  # queued: the measured copy
    assert 0 < disk.stats.restore_s < 0.5  # synchronous: its own time
    assert waited == [made[0]]  # a restore from the host is queued behind the copy in


def test_a_reservation_names_the_queued_copies_its_blocks_wait_for(tiny_model_dir) -> None:
    """Blocks reserved for KV from another worker are written off the steps' stream (RDMA,
    a peer's copy stream): a queued spill of what they held must have run first. The
    reservation hands the transport the event after the last queued copy, waiting for
    nothing itself (on a GPU; stand-in events here)."""
    block_bytes = 4 * 2 * 16 * 2 * 16 * 4  # llama tiny: 4 layers, 2 KV heads of 16, fp32
    llm = LLM(tiny_model_dir("llama"), num_kv_blocks=8, kv_offload_host_bytes=8 * block_bytes)
    engine = llm.engine
    made, waited = queue_copies(engine.kv.pool.offload)
    llm.generate([list(range(10, 75))], GREEDY)  # four blocks cached
    assert made == []
    assert engine.reserve(engine.prepare("a", [1, 2, 3], GREEDY)).copies is None  # no spill
    res = engine.reserve(engine.prepare("r", list(range(100, 180)), GREEDY))  # 5 blocks: evicts
    assert made and res.copies is made[-1] and waited == []
    waited.append(made[-1])  # the device got there: nothing is pending any more
    assert engine.kv.queued_copies() is None


def test_swapped_blocks_hold_at_most_half_the_host_tier_and_come_back_bit_for_bit() -> None:
    kv = fake_cache(3)
    offload = KVOffload(kv, host_blocks=4)
    for block_id in range(3):
        kv[:, block_id] = 100 + block_id
    assert offload.swap_out("a", 0, index=2, token_ids=(1, 2))
    assert offload.swap_out("b", 1, index=0, token_ids=(3,))
    assert not offload.swap_out("c", 2, index=0, token_ids=(4,))  # half the tier is taken
    assert offload.swapped("a") == (2, (1, 2)) and offload.swapped("c") is None
    offload.spill(2, 7, (7,))  # spills still find room
    offload.spill(1, 8, (8,))
    assert offload.hashes() == [7, 8]  # swaps are no prefix blocks: never reported
    kv[:, 2] = 0
    offload.swap_in("a", 2)
    assert bool((kv[:, 2] == 100).all()) and offload.swapped("a") is None
    offload.drop_swap("b")  # its request ended while it waited
    assert sorted(offload.tiers[0]._free) == [0, 1] and offload.num_swapped_in == 1


def test_a_prefix_evicted_to_the_tiers_is_a_hit_again_with_the_oracle_tokens(
    tiny_model_dir, tmp_path
) -> None:
    model_dir = tiny_model_dir("llama")
    block_bytes = 4 * 2 * 16 * 2 * 16 * 4  # llama tiny: 4 layers, 2 KV heads of 16, fp32
    llm = LLM(
        model_dir,
        num_kv_blocks=12,
        kv_offload_host_bytes=4 * block_bytes,
        kv_offload_disk_bytes=40 * block_bytes,
        kv_offload_dir=str(tmp_path),
    )
    assert KVOffload.block_bytes(llm.engine.runner.kv_cache) == block_bytes
    rng = random.Random(5)
    vocab = llm.engine.model_config.vocab_size
    shared = [rng.randrange(3, vocab) for _ in range(96)]  # 6 blocks
    others = [[rng.randrange(3, vocab) for _ in range(150)] for _ in range(3)]
    prompts = [shared + [7, 8, 9], *others, shared + [4, 5]]
    pool = llm.engine.kv.pool
    outs = []
    for p in prompts:  # one at a time: each of the others evicts the whole cache
        outs += llm.generate([p], GREEDY)
    for p, out in zip(prompts, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), MAX_TOKENS)
    assert outs[-1].num_cached_tokens == 96  # every shared block came back from a tier
    stats = [t.stats for t in pool.offload.tiers]
    assert stats[1].restored > 0  # the oldest blocks had moved on to disk
    assert sum(s.restored for s in stats) == 6
    llm.engine.check_invariants()


def test_preempted_requests_come_back_from_the_tiers_with_the_oracle_tokens(
    tiny_model_dir,
) -> None:
    model_dir = tiny_model_dir("llama")
    # 14 blocks: running requests must be preempted; their full blocks stay cached (spilling
    # to the host tier if evicted) and their partial last blocks are swapped out, so they
    # resume with nothing to recompute: the step totals equal a run that never preempts.
    params = SamplingParams(max_tokens=12, temperature=0.0)

    def computed_tokens(llm: LLM) -> int:
        return llm.engine.step_totals.prefill_tokens + llm.engine.step_totals.decode_rows

    roomy = LLM(model_dir, num_kv_blocks=256)
    prompts = make_prompts(roomy.engine.model_config.vocab_size)  # as test_parity's preemption
    roomy.generate(prompts, params)
    recompute = LLM(model_dir, num_kv_blocks=14)
    recompute.generate(prompts, params)
    llm = LLM(model_dir, num_kv_blocks=14, kv_offload_host_bytes=1 << 20)
    outs = llm.generate(prompts, params)
    for p, out in zip(prompts, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), 12)
    assert llm.engine.scheduler.num_preemptions > 0
    offload = llm.engine.kv.pool.offload
    assert offload.num_swapped_in == offload.num_swapped_out > 0
    assert computed_tokens(llm) == computed_tokens(roomy) < computed_tokens(recompute)
    reported = llm.engine.load().steps  # what the front door's offload counters grow by
    assert reported.swapped_blocks == offload.num_swapped_out
    assert reported.restored_blocks == offload.tiers[0].stats.restored > 0
    llm.engine.check_invariants()
    assert llm.engine.kv.pool.num_used_blocks == 0
    assert offload.tiers[0]._free and not offload._swapped  # every swap slot came back


def test_the_stored_events_name_a_restored_block_again(tiny_model_dir) -> None:
    llm = LLM(tiny_model_dir("llama"), num_kv_blocks=8, kv_offload_host_bytes=1 << 20)
    pool = llm.engine.kv.pool
    a = list(range(10, 43))  # two full blocks and one token
    llm.generate([a], GREEDY)
    llm.generate([list(range(50, 170))], GREEDY)  # 8 blocks: a's spill to the host tier
    pool.take_events()
    llm.generate([a], GREEDY)
    stored = [h for e in pool.take_events() if isinstance(e, BlockStored) for h in e.block_hashes]
    # The two restored blocks, announced again (the router never heard them removed).
    assert pool.offload.tiers[0].stats.restored == 2
    assert len(stored) == 2 and all(h in pool.cached_hashes() for h in stored)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kv_offload_host_bytes": -1}, "must be >= 0"),
        ({"kv_offload_disk_bytes": 1 << 20}, "needs a host tier"),
        ({"kv_offload_host_bytes": 1 << 20, "enable_prefix_caching": False}, "prefix caching"),
    ],
)
def test_bad_offload_settings_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**fields)


def test_tp2_ranks_spill_and_restore_in_lockstep(tiny_model_dir) -> None:
    import os

    from engine.tp import TPEngine

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    model_dir = tiny_model_dir("llama")
    config = EngineConfig(tp_size=2, num_kv_blocks=12, num_threads=1, kv_offload_host_bytes=1 << 20)
    rng = random.Random(13)
    shared = [rng.randrange(3, 1000) for _ in range(96)]
    prompts = [shared + [3], [rng.randrange(3, 1000) for _ in range(170)], shared + [4, 5]]
    with TPEngine(model_dir, config) as engine:
        outs = [engine.generate([p], GREEDY)[0] for p in prompts]
        engine.check_invariants()
    for p, out in zip(prompts, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), MAX_TOKENS)
    assert outs[-1].num_cached_tokens == 96  # each rank restored its shard of the prefix
