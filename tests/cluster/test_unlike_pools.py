"""Prefill and decode pools laid out otherwise (real local Ray, CPU, TP ranks over gloo): the
decode worker lands each prefill rank's KV in an area of that rank's layout and rewrites it
into its own blocks (worker/landing.py), so greedy output is one engine's, token for token:

    prefill tp=2, block 32, float32  ->  decode tp=1, block 16, float32 (heads joined, blocks
                                                                        cut): transformers'
    prefill tp=1, block 16, float32  ->  decode tp=2, block 32, int8   (heads split, blocks
                                                                        joined, quantized)

The second's oracle is one process that prefills with a float32 cache and decodes with an
int8 one from the quantized prompt KV (tests/support/handoff.py): an int8 engine's own
prefill attends to rounded values from its second layer on, so its KV, and on a
near-tie its tokens, differ from a float32 prefill's.

A prompt sent again finds its prefix in the decode worker's cache (its own block size): the
prefill worker skips those blocks of its own and sends the rest."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from core.config import EngineConfig
from core.request import EngineRequest
from core.sampling import SamplingParams
from engine.engine import LLMEngine
from tests import oracle
from tests.cluster.conftest import MAX_TOKENS, always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts
from tests.support.handoff import ParkingConnector, run_disaggregated

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
ENGINE = EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512)


def serve(cluster, loop_thread, batch: list[list[int]], tag: str) -> list[list[int]]:
    async def run() -> list:
        return await asyncio.gather(
            *(collect(cluster.backend, f"{tag}{i}", p, GREEDY) for i, p in enumerate(batch))
        )

    return [out.token_ids for out in loop_thread.run(run(), timeout=180)]


def test_prefill_tp1_to_decode_tp2_with_larger_blocks_and_an_int8_cache(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    model_dir = tiny_model_dir("llama")
    decode = replace(ENGINE, block_size=32, kv_cache_dtype="int8")
    spec = make_spec(model_dir, engine=ENGINE, decode_engine=decode, prefill_tp=1, decode_tp=2)
    cluster = cluster_factory(spec, always_disaggregate())
    # 1 token, a block of either side +1, several blocks of both.
    batch = prompts(5, 1000, [1, 17, 33, 90, 140], seed=21)
    outs = serve(cluster, loop_thread, batch, "split")
    prefill_engine = LLMEngine(model_dir, replace(decode, kv_cache_dtype="auto"))
    ParkingConnector(prefill_engine)
    decode_engine = LLMEngine(model_dir, decode)
    for i, (p, out) in enumerate(zip(batch, outs, strict=True)):
        deltas = run_disaggregated(prefill_engine, decode_engine, EngineRequest(f"r{i}", p, GREEDY))
        assert out == [t for d in deltas for t in d.new_token_ids]

    before = cluster.backend.transfers.num_blocks_skipped
    assert serve(cluster, loop_thread, [batch[-1]], "again") == [outs[-1]]
    # 140 tokens: the decode worker caches 4 blocks of 32 (128 tokens) = 8 of the prefill's.
    assert cluster.backend.transfers.num_blocks_skipped - before == 8
    assert cluster.backend.transfers.prefill_on_decode == 0


def test_prefill_tp2_to_decode_tp1_with_smaller_blocks(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    model_dir = tiny_model_dir("llama")
    prefill = replace(ENGINE, block_size=32)
    spec = make_spec(model_dir, engine=ENGINE, prefill_engine=prefill, prefill_tp=2, decode_tp=1)
    cluster = cluster_factory(spec, always_disaggregate())
    batch = prompts(4, 1000, [1, 33, 90, 140], seed=22)
    outs = serve(cluster, loop_thread, batch, "join")
    for p, out in zip(batch, outs, strict=True):
        assert out == oracle.hf_greedy(str(model_dir), tuple(p), MAX_TOKENS)
    assert cluster.backend.transfers.num_transfers == len(batch)
