"""Structured outputs on the real engine (tiny random-weight model, real xgrammar): a
random-weight model writes garbage unless the constraint holds, so every output that
parses and matches is the grammar's doing.

Covers: 24 seeded random JSON schemas under mixed sampling settings in one batch (greedy,
seeded random, penalties, top-k, top-p, unconstrained rows beside them), json_object,
regex, choice, EBNF and Lark grammars, stop strings, seeds, ignore_eos, refused
constraints, the compiled-grammar cache, a prefill/decode split and a mid-stream move
(resumed tokens replayed into the matcher), each equal to the unified run.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import jsonschema
import pytest
import torch

from core.config import EngineConfig
from core.errors import InvalidRequestError
from core.request import EngineRequest, FinishReason, OutputDelta
from core.resume import ResumeState
from core.sampling import SamplingParams
from core.structured import StructuredKind, StructuredOutput
from engine.engine import LLMEngine
from tests.support.handoff import ParkingConnector, run_disaggregated
from tests.support.json_schemas import random_schema

PROMPT = [10 + (7 * i) % 500 for i in range(12)]
_ids = itertools.count()

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def engine(model_dir) -> LLMEngine:
    return LLMEngine(model_dir, EngineConfig(num_kv_blocks=256, num_threads=1, seed=0))


def schema(value: object = SCHEMA, compact: bool = True) -> StructuredOutput:
    return StructuredOutput.json_schema(value, "test.schema", compact)


def constrained(kind: StructuredKind, spec: str = "", choices=()) -> StructuredOutput:
    return StructuredOutput(kind, spec, tuple(choices), field="test.field")


def request(params: SamplingParams, resume: ResumeState | None = None) -> EngineRequest:
    return EngineRequest(f"r{next(_ids)}", list(PROMPT), params, resume=resume or ResumeState())


def run_all(engine: LLMEngine, requests: list[EngineRequest]) -> list[list[OutputDelta]]:
    """Every request in one batch, to the end: each one's deltas."""
    for r in requests:
        engine.enqueue(r)
    deltas: dict[str, list[OutputDelta]] = {r.request_id: [] for r in requests}
    while engine.has_unfinished():
        for d in engine.step():
            deltas[d.request_id].append(d)
    engine.check_invariants()
    assert engine.kv.pool.num_used_blocks == 0
    return [deltas[r.request_id] for r in requests]


def run(engine: LLMEngine, params: SamplingParams) -> list[OutputDelta]:
    return run_all(engine, [request(params)])[0]


def text(deltas: list[OutputDelta]) -> str:
    return "".join(d.new_text for d in deltas)


def token_ids(deltas: list[OutputDelta]) -> list[int]:
    return [t for d in deltas for t in d.new_token_ids]


# ---------------------------------------------------------------- JSON


SAMPLING_MIXES = [
    {"temperature": 0.0},
    {"temperature": 1.0},
    {"temperature": 0.8, "top_k": 20},
    {"temperature": 1.2, "top_p": 0.9},
    {"temperature": 1.0, "presence_penalty": 1.5, "frequency_penalty": 0.5},
    {"temperature": 0.0, "repetition_penalty": 1.3},
    {"temperature": 1.0, "min_p": 0.05, "top_k": 50, "top_p": 0.95},
]


def test_random_schemas_every_output_validates(engine: LLMEngine) -> None:
    """24 random schemas in one batch, each under its own sampling settings, beside two
    unconstrained rows: every constrained output is strict JSON the schema accepts."""
    rng = random.Random(2026)
    schemas = [random_schema(rng) for _ in range(24)]
    requests = [
        request(
            SamplingParams(
                max_tokens=400, seed=i, structured_outputs=schema(s), **SAMPLING_MIXES[i % 7]
            )
        )
        for i, s in enumerate(schemas)
    ]
    free = [request(SamplingParams(max_tokens=20, seed=i, ignore_eos=True)) for i in range(2)]
    outputs = run_all(engine, requests + free)
    for s, deltas in zip(schemas, outputs, strict=False):
        assert deltas[-1].finish_reason == FinishReason.STOP, text(deltas)
        jsonschema.validate(json.loads(text(deltas)), s)
    assert sum(text(d) != "{}" for d in outputs[:24]) >= 16, "most outputs have properties"
    assert all(len(token_ids(d)) == 20 for d in outputs[24:])


def test_schema_with_free_whitespace(engine: LLMEngine) -> None:
    """Without disable_any_whitespace the grammar allows any whitespace between tokens (as
    vLLM's default), which a random-weight model may pile up until max_tokens: every
    output that ends validates, and some end."""
    ended = 0
    for seed in range(8):
        params = SamplingParams(max_tokens=300, seed=seed, structured_outputs=schema(compact=False))
        deltas = run(engine, params)
        if deltas[-1].finish_reason == FinishReason.STOP:
            ended += 1
            jsonschema.validate(json.loads(text(deltas)), SCHEMA)
        else:
            assert not text(deltas).strip().endswith("}")
    assert ended >= 3


@pytest.mark.parametrize("compact", [True, False])
def test_json_object(engine: LLMEngine, compact: bool) -> None:
    """Any JSON object: strings and nesting are unbounded, so a random-weight model may
    run to max_tokens; every output that ends is an object, and some end."""
    so = StructuredOutput(StructuredKind.JSON_OBJECT, disable_any_whitespace=compact)
    params = [SamplingParams(max_tokens=256, seed=s, structured_outputs=so) for s in range(12)]
    outputs = run_all(engine, [request(p) for p in params])
    ended = [d for d in outputs if d[-1].finish_reason == FinishReason.STOP]
    for deltas in outputs:
        assert text(deltas).lstrip().startswith("{")
    for deltas in ended:
        assert isinstance(json.loads(text(deltas)), dict)
    assert len(ended) >= 2


def test_unconstrained_rows_are_untouched(engine: LLMEngine) -> None:
    """A seeded unconstrained request samples the same tokens beside constrained rows."""
    free = SamplingParams(max_tokens=16, temperature=1.0, seed=11, ignore_eos=True)
    alone = run(engine, free)
    mixed = run_all(
        engine,
        [
            request(SamplingParams(max_tokens=100, seed=1, structured_outputs=schema())),
            request(free),
        ],
    )
    assert token_ids(mixed[1]) == token_ids(alone)


# ---------------------------------------------------------------- regex, choice, grammars


@pytest.mark.parametrize(
    "pattern",
    [r"[a-z]{3}-\d{2}", r"(yes|no)!", r"\d{4}-\d{2}-\d{2}", r"[A-Z][a-z]{1,5}( [A-Z][a-z]{1,5})?"],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex(engine: LLMEngine, pattern: str, temperature: float) -> None:
    so = constrained(StructuredKind.REGEX, pattern)
    for seed in range(3):
        params = SamplingParams(
            max_tokens=64, temperature=temperature, seed=seed, structured_outputs=so
        )
        deltas = run(engine, params)
        assert deltas[-1].finish_reason == FinishReason.STOP
        assert re.fullmatch(pattern, text(deltas)), text(deltas)


def test_choice(engine: LLMEngine) -> None:
    choices = ["red", "green", "blue", "a longer choice", 'with "quotes"\n']
    so = constrained(StructuredKind.CHOICE, choices=choices)
    seen = set()
    for seed in range(12):
        deltas = run(engine, SamplingParams(max_tokens=32, seed=seed, structured_outputs=so))
        assert text(deltas) in choices
        seen.add(text(deltas))
    assert len(seen) >= 2, "sampling picks among the choices"


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?',  # EBNF (GBNF)
        'start: "(" NUM ("+" NUM)* ")"\nNUM: /[1-9][0-9]?/',  # Lark
    ],
)
def test_grammar(engine: LLMEngine, grammar: str) -> None:
    so = constrained(StructuredKind.GRAMMAR, grammar)
    for seed in range(3):
        deltas = run(engine, SamplingParams(max_tokens=64, seed=seed, structured_outputs=so))
        assert deltas[-1].finish_reason == FinishReason.STOP
        assert re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", text(deltas)), text(deltas)


# ---------------------------------------------------------------- with the other parameters


def test_stop_string_cuts_a_constrained_output(engine: LLMEngine) -> None:
    so = constrained(StructuredKind.REGEX, r"abc(d|e)fgh")
    deltas = run(engine, SamplingParams(max_tokens=32, stop=["fg"], structured_outputs=so))
    assert text(deltas) in ("abcd", "abce")
    assert deltas[-1].stop_reason == "fg"


def test_seeded_output_is_reproducible_alone_or_batched(engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=200, temperature=1.0, seed=42, structured_outputs=schema())
    alone = run(engine, params)
    others = [
        request(SamplingParams(max_tokens=100, seed=s, structured_outputs=schema()))
        for s in range(3)
    ]
    batched = run_all(engine, [*others, request(params)])[-1]
    assert token_ids(batched) == token_ids(alone)


def test_ignore_eos_ends_when_the_grammar_terminates(engine: LLMEngine) -> None:
    so = constrained(StructuredKind.CHOICE, choices=["alpha", "beta"])
    deltas = run(engine, SamplingParams(max_tokens=32, ignore_eos=True, structured_outputs=so))
    assert deltas[-1].finish_reason == FinishReason.STOP
    assert text(deltas) in ("alpha", "beta")


def test_max_tokens_still_applies(engine: LLMEngine) -> None:
    so = constrained(StructuredKind.REGEX, r"a{10}")
    deltas = run(engine, SamplingParams(max_tokens=3, structured_outputs=so))
    assert deltas[-1].finish_reason == FinishReason.LENGTH
    assert text(deltas) == "aaaaaaaaaa"[: len(text(deltas))]


# ---------------------------------------------------------------- refusals and the cache


@pytest.mark.parametrize(
    ("so", "reason"),
    [
        (StructuredOutput.json_schema({"type": "strin"}, "response_format.json_schema.schema"),
         "strin"),
        (StructuredOutput(StructuredKind.REGEX, "a(b", field="structured_outputs.regex"),
         "parenthesis"),
        (StructuredOutput(StructuredKind.GRAMMAR, 'root ::= "a" |', field="guided_grammar"),
         "EBNF"),
    ],
)  # fmt: skip
def test_a_constraint_that_does_not_compile_is_refused(
    engine: LLMEngine, so: StructuredOutput, reason: str
) -> None:
    with pytest.raises(InvalidRequestError) as e:
        engine.enqueue(request(SamplingParams(structured_outputs=so)))
    assert str(e.value).startswith(f"{so.field}: cannot be compiled: ")
    assert reason in str(e.value)
    assert "/project/" not in str(e.value), "xgrammar's source location is dropped"
    assert not engine.has_unfinished() and not engine.requests


def test_compiled_grammars_are_cached(model_dir) -> None:
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=64, num_threads=1))
    engine.grammars.max_entries = 2
    regexes = [constrained(StructuredKind.REGEX, p) for p in ("a+", "b+", "c+")]
    for so in (regexes[0], regexes[0], regexes[1], regexes[0], regexes[2], regexes[1]):
        engine.enqueue(request(SamplingParams(max_tokens=4, structured_outputs=so)))
    # a+ compiled, hit, b+ compiled, a+ hit, c+ compiled (evicts b+), b+ compiled again
    assert (engine.grammars.num_compiles, engine.grammars.num_hits) == (4, 2)
    assert len(engine.grammars) == 2
    while engine.has_unfinished():
        engine.step()


# ---------------------------------------------------------------- across engines


@pytest.fixture(scope="module")
def pair(model_dir) -> tuple[LLMEngine, LLMEngine]:
    prefill = LLMEngine(model_dir, EngineConfig(num_kv_blocks=64, num_threads=1))
    ParkingConnector(prefill)
    decode = LLMEngine(model_dir, EngineConfig(num_kv_blocks=64, num_threads=1))
    return prefill, decode


SPLIT_CASES = [
    SamplingParams(max_tokens=200, temperature=1.0, seed=3, structured_outputs=schema()),
    SamplingParams(max_tokens=200, temperature=0.0, structured_outputs=schema()),
    SamplingParams(
        max_tokens=64,
        temperature=1.0,
        seed=9,
        presence_penalty=1.0,
        structured_outputs=constrained(StructuredKind.REGEX, r"[a-z]{2,8}(-[0-9]{1,3}){2}"),
    ),
]


def chunks(deltas: list[OutputDelta]) -> list[tuple[list[int], str]]:
    return [(d.new_token_ids, d.new_text) for d in deltas]


@pytest.mark.parametrize("params", SPLIT_CASES)
def test_prefill_decode_split_gives_the_unified_output(engine, pair, params) -> None:
    """The prefill engine samples the first token under the grammar; the decode engine's
    matcher takes it at admission and goes on: the same stream as one unified engine."""
    reference = run(engine, params)
    split = run_disaggregated(*pair, request(params))
    assert chunks(split) == chunks(reference)
    assert split[-1].finish_reason == reference[-1].finish_reason == FinishReason.STOP


@pytest.mark.parametrize("params", SPLIT_CASES)
def test_a_move_mid_stream_replays_the_sent_tokens(engine, pair, model_dir, params) -> None:
    """A retry on other workers: the resumed tokens are replayed into the new matcher, in
    unified and in prefill/decode form, and the stream goes on exactly as before."""
    reference = run(engine, params)
    k = len(reference) // 2
    state = ResumeState.from_deltas(reference[:k])
    other = LLMEngine(model_dir, EngineConfig(num_kv_blocks=64, num_threads=1))
    assert chunks(reference[:k] + run_all(other, [request(params, state)])[0]) == chunks(reference)
    split = run_disaggregated(*pair, request(params, state))
    assert chunks(reference[:k] + split) == chunks(reference)


def test_resumed_tokens_off_the_grammar_are_refused(engine: LLMEngine) -> None:
    so = constrained(StructuredKind.REGEX, r"[0-9]+")
    letters = engine.tokenizer.encode("abc", add_special_tokens=False)
    state = ResumeState(tuple(letters), "abc")
    with pytest.raises(InvalidRequestError, match="does not fit"):
        engine.enqueue(request(SamplingParams(structured_outputs=so), state))
    assert not engine.has_unfinished()


# ---------------------------------------------------------------- the sampler's side


def test_the_mask_binds_every_sampling_path(engine: LLMEngine) -> None:
    """Sampler level: a row allowed only tokens {7, 9} samples one of them whatever its
    settings, while the logprobs stay the model's own (of the raw logits)."""
    from engine.grammar.matcher import TokenMask
    from engine.sampler import Sampler, SamplingRow

    vocab = engine.model_config.vocab_size
    sampler = Sampler(vocab, seed=0)
    allowed = [7, 9]
    bitmask = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)
    for t in allowed:
        bitmask[0, t // 32] |= 1 << (t % 32)
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
    for mix in [*SAMPLING_MIXES, {"temperature": 1.0, "logprobs": 2}]:
        for seed in range(5):
            params = SamplingParams(seed=seed, **mix)
            row = SamplingRow(params, PROMPT, [7, 7, 9])
            out = sampler(logits, [row], TokenMask(bitmask.clone(), [0], vocab))
            assert out.token_ids[0] in allowed, mix
            if params.logprobs:
                expected = logits.log_softmax(-1)[0, out.token_ids[0]].item()
                assert out.logprobs[0].logprob == pytest.approx(expected, abs=1e-5)


def test_xgrammar_is_loaded_only_for_a_constrained_request(model_dir) -> None:
    """Importing xgrammar costs seconds (it loads transformers): an engine that never sees
    a constrained request never pays it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from engine.engine import LLMEngine\n"
        "from core.config import EngineConfig\n"
        f"e = LLMEngine({str(model_dir)!r}, EngineConfig(num_kv_blocks=16, num_threads=1))\n"
        "e.add_request('a', 'hi')\n"
        "while e.has_unfinished(): e.step()\n"
        "print('xgrammar' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.strip() == "False"
