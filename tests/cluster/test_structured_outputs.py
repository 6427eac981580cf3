"""Structured outputs on a real local Ray cluster, prefill and decode on different workers:
the prefill worker samples the first token under the grammar, the decode worker's matcher
takes it at admission; the outputs validate and equal one unified in-process engine's,
token for token. A schema the workers cannot compile is a clear InvalidRequestError."""

from __future__ import annotations

import asyncio
import json
import random

import jsonschema
import pytest

from core.config import EngineConfig
from core.errors import InvalidRequestError
from core.request import EngineRequest
from core.sampling import SamplingParams
from core.structured import StructuredKind, StructuredOutput
from engine.engine import LLMEngine
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts
from tests.support.json_schemas import random_schema

pytestmark = pytest.mark.slow


def unified_token_ids(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> list[int]:
    engine.enqueue(EngineRequest(f"ref{id(params)}", prompt, params))
    token_ids: list[int] = []
    while engine.has_unfinished():
        token_ids += [t for d in engine.step() for t in d.new_token_ids]
    return token_ids


def test_constrained_requests_across_prefill_and_decode_workers(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    model_dir = tiny_model_dir("llama")
    cluster = cluster_factory(
        make_spec(model_dir, num_prefill=1, num_decode=1), always_disaggregate()
    )
    rng = random.Random(21)
    schemas = [random_schema(rng) for _ in range(6)]
    regex = StructuredOutput(StructuredKind.REGEX, r"[a-z]{2,6}-[0-9]{2,4}")
    params = [
        SamplingParams(
            max_tokens=300,
            temperature=0.0 if i % 3 == 0 else 1.0,
            seed=i,
            structured_outputs=StructuredOutput.json_schema(s, "schema", True),
        )
        for i, s in enumerate(schemas)
    ] + [SamplingParams(max_tokens=40, seed=9, structured_outputs=regex)]
    batch = prompts(len(params), 1000, [5, 40, 90], seed=4)

    async def run() -> list:
        return await asyncio.gather(
            *(
                collect(cluster.backend, f"s{i}", p, sp)
                for i, (p, sp) in enumerate(zip(batch, params))
            )
        )

    outs = loop_thread.run(run())
    assert cluster.backend.transfers.num_transfers == len(params)
    for schema, out in zip(schemas, outs, strict=False):
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), schema)
    reference = LLMEngine(model_dir, EngineConfig(num_kv_blocks=256, num_threads=1))
    for prompt, sp, out in zip(batch, params, outs, strict=True):
        assert out.token_ids == unified_token_ids(reference, prompt, sp)

    bad = SamplingParams(
        structured_outputs=StructuredOutput.json_schema({"type": "strin"}, "guided_json")
    )
    with pytest.raises(InvalidRequestError, match="guided_json: cannot be compiled"):
        loop_thread.run(collect(cluster.backend, "bad", batch[0], bad))
