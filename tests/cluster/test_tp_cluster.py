"""Tensor parallelism through the cluster (real local Ray, CPU, gloo on 127.0.0.1): a prefill
and a decode worker with tp=2 each (ranks are actors in one STRICT_PACK placement group per
worker), KV moving from prefill rank r to decode rank r. Greedy output equals transformers.
(Pools of different TP sizes: tests/cluster/test_unlike_pools.py.)"""

from __future__ import annotations

import asyncio

import pytest

from core.sampling import SamplingParams
from tests import oracle
from tests.cluster.conftest import MAX_TOKENS, always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


def test_tp2_prefill_and_decode_match_transformers(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    import ray

    model_dir = tiny_model_dir("llama")
    cluster = cluster_factory(make_spec(model_dir, tp=2), always_disaggregate())
    # Mixed lengths: 1 token, block boundary +1, several blocks.
    batch = prompts(6, 1000, [1, 17, 40, 90, 33, 130], seed=7)

    async def run() -> list:
        return await asyncio.gather(
            *(collect(cluster.backend, f"tp{i}", p, GREEDY) for i, p in enumerate(batch))
        )

    outs = loop_thread.run(run(), timeout=180)
    for p, out in zip(batch, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), MAX_TOKENS)
    assert cluster.backend.transfers.num_transfers == len(batch)
    assert cluster.backend.transfers.prefill_on_decode == 0

    # Each worker is 2 rank actors packed in one placement group of {CPU: 1} bundles.
    _, members = ray.get(cluster.controller.get_members.remote(), timeout=30)
    assert sorted(m.role for m in members) == ["decode", "prefill"]
    for m in members:
        assert m.info.tp == 2
        table = ray.util.placement_group_table(m.placement)
        assert table["strategy"] == "STRICT_PACK"
        assert [b.get("CPU") for b in table["bundles"].values()] == [1.0, 1.0]
        assert table["bundles"][0][m.role] == 1.0


def test_tp_mismatch_between_workers_is_refused() -> None:
    # Two workers of one pool connect rank to rank: another TP size is refused, naming both
    # (defence in depth for workers started by hand or by another controller).
    from worker.group import decode_group_metadata, encode_group_metadata

    meta = encode_group_metadata("prefill-0", [b"rank0", b"rank1"])
    with pytest.raises(ValueError, match=r"prefill-0 runs tp=2 but decode-1 runs tp=1"):
        decode_group_metadata(meta, "decode-1", 1)
    assert decode_group_metadata(meta, "decode-1", 2).ranks == [b"rank0", b"rank1"]


def test_killing_a_decode_rank_fails_over_cleanly(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    """A rank actor dies mid-stream: the worker's engine is broken, the controller replaces
    the whole worker (and its placement group), and every request resumes on the new one:
    each completes with exactly the tokens it would have had without the fault."""
    import ray

    from tests.cluster.test_failures import wait_for_pools

    model_dir = tiny_model_dir("llama")
    cluster = cluster_factory(make_spec(model_dir, tp=2), always_disaggregate())
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    # The prompts of test_failures: greedy output has no EOS in the first 120 tokens.
    batch = prompts(3, 1000, [30, 70, 120], seed=31)
    backend = cluster.backend
    killed: list[str] = []

    async def run() -> list:
        started = [asyncio.Event() for _ in batch]
        tasks = [
            asyncio.create_task(collect(backend, f"kr{i}", p, params, 150.0, started[i]))
            for i, p in enumerate(batch)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        decode = next(m for m in cluster.membership.workers.values() if m.role == "decode")
        killed.append(decode.worker_id)
        ranks = await decode.handle.rank_actors.remote()
        assert len(ranks) == 2
        ray.kill(ranks[1], no_restart=True)
        return await asyncio.gather(*tasks, return_exceptions=True)

    outs = loop_thread.run(run(), timeout=200)
    for p, out in zip(batch, outs, strict=True):
        assert not isinstance(out, BaseException), f"not resumed: {out!r}"
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), 60)
    wait_for_pools(cluster, loop_thread)
    _, members = ray.get(cluster.controller.get_members.remote(), timeout=30)
    assert killed[0] not in {m.worker_id for m in members}  # replaced, not patched up
    p = prompts(1, 1000, [50], seed=32)[0]
    out = loop_thread.run(collect(backend, "after", p, params), timeout=120)
    assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), 60)
