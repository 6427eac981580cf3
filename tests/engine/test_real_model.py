"""What a real model makes measurable: SmolLM2-135M-Instruct, the default model, held to
JSON schemas finishes valid objects within a normal budget (a random-weight model writes
whitespace until max_tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from core.sampling import SamplingParams
from core.structured import StructuredOutput
from engine import LLM
from tests.support.real_schemas import SCHEMAS

pytestmark = pytest.mark.slow
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> LLM:
    return LLM(str(smollm2_dir), num_threads=1)


def test_twenty_json_schemas_get_finished_valid_objects(llm: LLM) -> None:
    """Greedy with a light repetition penalty: greedy alone, 18 of 20 finish (the 135M model
    repeats itself inside an email address and an order id until max_tokens)."""
    prompts, params = [], []
    for what, schema in SCHEMAS:
        prompts.append(
            llm.tokenizer.encode_chat([{"role": "user", "content": f"Give me {what} as JSON."}])
        )
        constraint = StructuredOutput.json_schema(schema, "response_format")
        params.append(
            SamplingParams(
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                repetition_penalty=1.1,
                structured_outputs=constraint,
            )
        )
    outs = llm.generate(prompts, params)
    for (what, schema), out in zip(SCHEMAS, outs, strict=True):
        assert out.finish_reason == "stop", (what, out.text)
        jsonschema.validate(json.loads(out.text), schema)
