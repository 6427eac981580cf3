"""End-to-end on a real local Ray cluster: greedy output through the disaggregated path
(prefill worker -> KV transfer -> decode worker) equals transformers, token for token."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from core.sampling import SamplingParams
from tests import oracle
from tests.cluster.conftest import MAX_TOKENS, always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts, wait_until_offloaded, worker_loads

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


# shm: the same-host transport, the decode worker maps the prefill worker's cache.
@pytest.mark.parametrize(
    ("num_prefill", "num_decode", "transport"), [(1, 1, "auto"), (2, 2, "auto"), (1, 1, "shm")]
)
def test_greedy_matches_transformers(
    cluster_factory,
    loop_thread,
    tiny_model_dir,
    num_prefill: int,
    num_decode: int,
    transport: str,
) -> None:
    model_dir = tiny_model_dir("llama")
    cluster = cluster_factory(
        make_spec(model_dir, num_prefill=num_prefill, num_decode=num_decode, transport=transport),
        always_disaggregate(),
    )
    batch = prompts(8, 1000, [3, 17, 40, 90, 130, 33, 64, 200], seed=num_prefill)

    async def run() -> list:
        return await asyncio.gather(
            *(collect(cluster.backend, f"g{i}", p, GREEDY) for i, p in enumerate(batch))
        )

    outs = loop_thread.run(run())
    for p, out in zip(batch, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), MAX_TOKENS)
    assert cluster.backend.transfers.num_transfers == len(batch)
    assert cluster.backend.transfers.prefill_on_decode == 0


def test_int8_weights_through_the_disaggregated_path(
    cluster_factory, loop_thread, tiny_model_dir, tmp_path
) -> None:
    from core.config import EngineConfig

    model_dir = tiny_model_dir("llama")
    reference = oracle.write_fake_quantized(str(model_dir), str(tmp_path / "fake-int8"))
    engine = EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512, quantization="int8")
    cluster = cluster_factory(make_spec(model_dir, engine=engine), always_disaggregate())
    batch = prompts(4, 1000, [7, 60, 150, 25], seed=11)

    async def run() -> list:
        return await asyncio.gather(
            *(collect(cluster.backend, f"q{i}", p, GREEDY) for i, p in enumerate(batch))
        )

    for p, out in zip(batch, loop_thread.run(run()), strict=True):
        assert out.token_ids == oracle.hf_greedy(reference, tuple(p), MAX_TOKENS)
    assert cluster.backend.transfers.num_transfers == len(batch)


def disaggregated_matches_offline(
    cluster_factory, loop_thread, tiny_model_dir, options: dict, seed: int
) -> Any:
    """Three prompts through a 1P+1D cluster whose engines take `options`, each through the
    prefill pool, give the offline engine's tokens with the same options; the cluster."""
    from core.config import EngineConfig
    from engine import LLM

    model_dir = tiny_model_dir("llama")
    sizes = {"num_kv_blocks": 256, "max_num_batched_tokens": 512}
    engine = EngineConfig(**sizes, **options)
    cluster = cluster_factory(make_spec(model_dir, engine=engine), always_disaggregate())
    batch = prompts(3, 1000, [20, 90, 140], seed=seed)
    outs = [
        loop_thread.run(collect(cluster.backend, f"s{seed}-{i}", p, GREEDY))
        for i, p in enumerate(batch)
    ]
    offline = LLM(model_dir, **sizes, **options)
    for p, out in zip(batch, outs, strict=True):
        [ref] = offline.generate([p], GREEDY)
        assert out.token_ids == ref.token_ids
    return cluster


def test_w8a8_through_the_disaggregated_path(cluster_factory, loop_thread, tiny_model_dir) -> None:
    """W8A8 output is the offline W8A8 engine's, token for token: its GEMMs give a row the
    same bits whatever it is batched with, so prefill on one worker and decode on another
    change nothing (transformers is its oracle only within the rounding noise:
    tests/engine/test_quant.py)."""

    cluster = disaggregated_matches_offline(
        cluster_factory, loop_thread, tiny_model_dir, {"quantization": "w8a8"}, seed=13
    )
    assert cluster.backend.transfers.num_transfers == 3


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_decoding_on_the_decode_worker(
    cluster_factory, loop_thread, tiny_model_dir, method
) -> None:
    from core.config import EngineConfig

    model_dir = tiny_model_dir("llama")
    # The target as its own draft: every greedy draft is accepted.
    draft = str(model_dir) if method == "draft" else None
    engine = EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512, speculative=method,
                          speculative_model=draft)  # fmt: skip
    cluster = cluster_factory(make_spec(model_dir, engine=engine), always_disaggregate())
    # Repetitive prompts: prompt lookup finds drafts, some of which the model accepts.
    batch = [[7, 8, 9, 10, 11] * 8, [3, 4] * 30 + [5], prompts(1, 1000, [50], seed=5)[0]]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    async def run() -> list:
        return await asyncio.gather(
            *(collect(cluster.backend, f"s{i}", p, params) for i, p in enumerate(batch))
        )

    for p, out in zip(batch, loop_thread.run(run()), strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), 24)
    assert cluster.backend.transfers.num_transfers == len(batch)
    # Prefill workers never speculate (they sample first tokens only): all of it is decode's.
    assert sum(load.steps.accepted_tokens for load in worker_loads(cluster).values()) > 0


def test_kv_offload_tiers_through_the_disaggregated_path(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    from core.config import EngineConfig

    model_dir = tiny_model_dir("llama")
    # 16 blocks per worker: each filler prompt evicts the shared prefix into the host tier,
    # from which the prefill worker (and the decode worker, on reserving) restores it.
    engine = EngineConfig(num_kv_blocks=16, kv_offload_host_bytes=1 << 20)
    cluster = cluster_factory(make_spec(model_dir, engine=engine), always_disaggregate())
    [shared] = prompts(1, 1000, [96], seed=41)
    fillers = prompts(2, 1000, [200, 200], seed=42)
    batch = [shared + [5, 6], *fillers, shared + [7, 8, 9]]
    outs = [
        loop_thread.run(collect(cluster.backend, f"o{i}", p, GREEDY))
        for i, p in enumerate(batch[:-1])
    ]
    # The router heard where the prefix went: all six blocks in the prefill worker's host tier
    # (the decode worker's too, having evicted them alike; either may be heard of first).
    workers = cluster.membership.workers
    prefill_ids = {w for w, m in workers.items() if m.info.role == "prefill"}
    model = cluster.membership.model.model_id
    wait_until_offloaded(cluster.router, model, shared, [6, 0], among=prefill_ids)
    outs.append(loop_thread.run(collect(cluster.backend, "o3", batch[-1], GREEDY)))
    for p, out in zip(batch, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), MAX_TOKENS)
    prefill = [load for load in worker_loads(cluster).values() if load.role == "prefill"]
    assert [load.num_cached_prompt_tokens for load in prefill] == [96]
    assert sum(prefill[0].steps.tier_restored_blocks) == 6  # restored, then timed


def test_int8_kv_cache_through_the_disaggregated_path(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    """The decode worker receives quantized blocks with their scales and decodes from them as
    the offline engine decodes from its own int8 cache: the same tokens."""
    cluster = disaggregated_matches_offline(
        cluster_factory, loop_thread, tiny_model_dir, {"kv_cache_dtype": "int8"}, seed=12
    )
    assert cluster.backend.transfers.num_transfers == 3
    # 4 layers x (K, V) x 16 tokens x 2 heads x (16 int8 values + a float16 scale)
    per_block = {m.info.kv_bytes_per_block for m in cluster.membership.workers.values()}
    assert per_block == {4 * 2 * 16 * 2 * 18}


def test_unified_mode_and_conditional_disaggregation(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    model_dir = tiny_model_dir("llama")
    # Default router config: prompts shorter than the threshold prefill on the decode worker.
    cluster = cluster_factory(make_spec(model_dir, num_prefill=1, num_decode=1))
    # engine_nice above the test's own (0): asking for it needs no privilege.
    unified = cluster_factory(
        make_spec(model_dir, mode="unified", num_prefill=0, num_decode=1, engine_nice=4)
    )
    batch = prompts(4, 1000, [5, 300, 20, 400], seed=3)

    async def run(backend) -> list:
        return await asyncio.gather(
            *(collect(backend, f"u{i}", p, GREEDY) for i, p in enumerate(batch))
        )

    for c in (cluster, unified):
        outs = loop_thread.run(run(c.backend))
        for p, out in zip(batch, outs, strict=True):
            assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), MAX_TOKENS)
        # The door charges a TTFT to the prefill pool only where that pool computed it.
        want = ["", "prefill", "", "prefill"] if c is cluster else [""] * 4
        assert [out.prefilled_by for out in outs] == want
    t = cluster.backend.transfers
    assert t.num_transfers == 2 and t.prefill_on_decode == 2  # the two long ones moved KV
    assert unified.backend.transfers.num_transfers == 0
    # The unified worker's engine thread runs at the nice asked for, its others 10 behind it
    # (worker/threads.py), none left at Ray's 15.
    (member,) = unified.membership.workers.values()
    nice = []
    for task in Path(f"/proc/{member.info.pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            nice.append(os.getpriority(os.PRIO_PROCESS, int(task.name)))
    assert set(nice) == {4, 14}, nice


def test_bad_request_is_a_clear_error(cluster_factory, loop_thread, tiny_model_dir) -> None:
    from core.errors import InvalidRequestError

    cluster = cluster_factory(make_spec(tiny_model_dir("llama")), always_disaggregate())
    with pytest.raises(InvalidRequestError, match="context"):
        loop_thread.run(collect(cluster.backend, "long", [5] * 5000, GREEDY))
    with pytest.raises(InvalidRequestError, match="empty"):
        loop_thread.run(collect(cluster.backend, "empty", [], GREEDY))
    # and the cluster still serves
    out = loop_thread.run(collect(cluster.backend, "ok", [5, 6, 7], GREEDY))
    assert len(out.token_ids) == MAX_TOKENS


def test_burst_beyond_decode_kv_queues_instead_of_refusing(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    """Eight 200-token prompts at once against 32 KV blocks per worker (two requests' worth):
    the prefill gate and the reservation wait queue them; none is refused, all are exact."""
    from core.config import EngineConfig

    model_dir = tiny_model_dir("llama")
    spec = make_spec(model_dir, engine=EngineConfig(num_kv_blocks=32, max_num_batched_tokens=256))
    cluster = cluster_factory(spec, always_disaggregate())
    assert cluster.backend.gate.max_tokens == 512
    batch = prompts(8, 1000, [200, 190, 210, 180], seed=41)

    async def run() -> list:
        return await asyncio.gather(
            *(collect(cluster.backend, f"q{i}", p, GREEDY, 240.0) for i, p in enumerate(batch))
        )

    outs = loop_thread.run(run(), timeout=300)
    for p, out in zip(batch, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), MAX_TOKENS)
    assert cluster.backend.transfers.num_transfers == len(batch)
    assert cluster.backend.gate.num_waiting() == 0


def test_a_worker_without_its_transport_fails_bring_up_naming_why(
    ray_session, loop_thread, tiny_model_dir
) -> None:
    """`local` moves KV within one process: every worker refuses it at start, and bring-up
    ends with the reason instead of waiting out its timeout in silence."""
    from router.cluster.bringup import start_cluster

    spec = make_spec(tiny_model_dir("llama"), transport="local")
    with pytest.raises(RuntimeError, match="'local' KV transport moves KV within one process"):
        loop_thread.run(
            start_cluster(spec, ready_timeout_s=20, controller_name="ctl-local-transport"),
            timeout=120,
        )
    # Nothing to clean up: the controller was not detached, and went with its last handle.


def test_a_worker_no_node_can_place_fails_bring_up_naming_what_it_needs(
    ray_session, loop_thread, tiny_model_dir
) -> None:
    """Ray keeps an actor it cannot place pending in silence: bring-up names what it asked."""
    from router.cluster.bringup import start_cluster

    spec = make_spec(tiny_model_dir("llama"), device="cuda", worker_start_timeout_s=2.0)
    with pytest.raises(RuntimeError, match=r"not up within 2 s .*1 GPU free"):
        loop_thread.run(
            start_cluster(spec, ready_timeout_s=20, controller_name="ctl-unplaceable"),
            timeout=120,
        )
