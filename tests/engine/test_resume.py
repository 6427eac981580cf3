"""A request moved between engines mid-stream (`EngineRequest.resume`) streams exactly what
it would have streamed had it never moved: chunk by chunk, token ids and text.

Each test runs a request fault-free, then again split at output position k: the first k
tokens on one engine (then aborted, as when its worker dies), the rest on another engine
from the `ResumeState` of the deltas the client got. One test per piece of state a move
must keep: held-back bytes of a UTF-8 character, a stop string across the split,
penalties over output tokens, and the seeded random stream.
"""

from __future__ import annotations

import itertools
import pickle
from dataclasses import replace

import pytest

from core.config import EngineConfig
from core.errors import InvalidRequestError
from core.request import EngineRequest, OutputDelta
from core.resume import ResumeState
from core.sampling import SamplingParams
from engine.engine import LLMEngine
from tests.support.handoff import ParkingConnector, run_disaggregated

PROMPT = [10 + (7 * i) % 500 for i in range(20)]
_ids = itertools.count()


@pytest.fixture(scope="module")
def engines(tiny_model_dir) -> tuple[LLMEngine, LLMEngine]:
    """Two engines on one checkpoint: where a request starts, and where it moves to."""
    model_dir = tiny_model_dir("llama")
    config = EngineConfig(num_kv_blocks=128, num_threads=1)
    return LLMEngine(model_dir, config, worker_id="a"), LLMEngine(model_dir, config, worker_id="b")


def run(engine: LLMEngine, request: EngineRequest, num_tokens: int | None = None) -> list:
    """The deltas of `request` on `engine`: to the end, or (then aborted, as a dead worker
    leaves it) until `num_tokens` tokens were streamed."""
    engine.enqueue(request)
    deltas: list[OutputDelta] = []
    while engine.has_unfinished():
        deltas += [d for d in engine.step() if d.request_id == request.request_id]
        if num_tokens is not None and sum(len(d.new_token_ids) for d in deltas) >= num_tokens:
            engine.abort(request.request_id)
            break
    engine.check_invariants()
    return deltas


def request(params: SamplingParams, resume: ResumeState | None = None) -> EngineRequest:
    return EngineRequest(f"r{next(_ids)}", list(PROMPT), params, resume=resume or ResumeState())


def chunks(deltas: list[OutputDelta]) -> list[tuple[list[int], str]]:
    return [(d.new_token_ids, d.new_text) for d in deltas]


def ending(deltas: list[OutputDelta]) -> tuple:
    return deltas[-1].finished, deltas[-1].finish_reason, deltas[-1].stop_reason


def moved(engines: tuple[LLMEngine, LLMEngine], params: SamplingParams, k: int) -> list:
    """The client's stream of a request that moved from engine a to engine b after k tokens."""
    a, b = engines
    before = run(a, request(params), num_tokens=k)
    assert not before[-1].finished, "the split must come before the request ends"
    return before + run(b, request(params, ResumeState.from_deltas(before)))


def moved_as_prompt(engines: tuple[LLMEngine, LLMEngine], params: SamplingParams, k: int) -> list:
    """The same move done the old way (issue 19): the streamed tokens become prompt."""
    a, b = engines
    before = run(a, request(params), num_tokens=k)
    done = [t for d in before for t in d.new_token_ids]
    rest = replace(params, max_tokens=params.max_tokens - len(done))
    after = EngineRequest(f"r{next(_ids)}", PROMPT + done, rest)
    return before + run(b, after)


def assert_same_stream(moved_deltas: list, reference: list) -> None:
    assert chunks(moved_deltas) == chunks(reference)
    assert ending(moved_deltas) == ending(reference)


# ---------------------------------------------------------------- one test per field


def test_utf8_character_split_across_the_move(engines) -> None:
    """Held-back bytes: the split falls after a token that ends inside a character. Only
    sampling leads the random-weight model into lone byte tokens, so the seed is searched."""
    tokenizer = engines[0].tokenizer
    for seed in range(64):
        params = SamplingParams(max_tokens=32, temperature=1.0, seed=seed, ignore_eos=True)
        reference = run(engines[0], request(params))
        ids = [t for d in reference for t in d.new_token_ids]
        # Positions where the text so far ends in an incomplete character the next token
        # completes (a real multi-byte character, not an invalid byte).
        splits = [
            k
            for k in range(1, len(ids) - 1)
            if (text := tokenizer.decode(ids[:k])).endswith("\ufffd")
            and tokenizer.decode(ids[: k + 1])[len(text) - 1] not in ("\ufffd", " ")
        ]
        if splits:
            break
    else:
        pytest.fail("no sampled output splits a multi-byte character")
    for k in splits:
        assert_same_stream(moved(engines, params, k), reference)


def test_stop_string_across_the_move(engines) -> None:
    """The stop checker's window: a stop string that starts before the split and ends
    after it still stops the request, and its start was never shown."""
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    free_deltas = run(engines[0], request(free))
    k = 12
    cut = sum(len(d.new_text) for d in free_deltas[:k])
    text = "".join(d.new_text for d in free_deltas)
    stop = text[cut - 2 : cut + 2]
    assert len(stop) == 4 and text.find(stop) == cut - 2, "pick another split"
    params = replace(free, stop=(stop,))
    reference = run(engines[0], request(params))
    assert ending(reference) == (True, "stop", stop)
    assert_same_stream(moved(engines, params, k), reference)
    assert chunks(moved_as_prompt(engines, params, k)) != chunks(reference)


@pytest.mark.parametrize(
    "penalty",
    [dict(presence_penalty=-2.0), dict(frequency_penalty=-2.0), dict(repetition_penalty=2.0)],
    ids=["presence", "frequency", "repetition"],
)
def test_penalties_count_the_resumed_output(engines, penalty) -> None:
    """Penalties: the resumed tokens are output. Presence and frequency count only output
    (negative values here, so a token streamed before the move is repeated after it: the
    random-weight model never repeats greedily on its own); repetition counts prompt and
    output alike, so only the exact stream is checked for it."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, **penalty)
    reference = run(engines[0], request(params))
    k = 17
    assert_same_stream(moved(engines, params, k), reference)
    if "repetition_penalty" not in penalty:
        assert chunks(moved_as_prompt(engines, params, k)) != chunks(reference)


@pytest.mark.parametrize("k", [1, 7, 15])
def test_seeded_sampling_across_the_move(engines, k: int) -> None:
    """The sampling position: a seeded token at output position i comes from (seed, i), so
    the new engine's draws continue the stream."""
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    reference = run(engines[0], request(params))
    assert len({t for d in reference for t in d.new_token_ids}) > 1
    assert_same_stream(moved(engines, params, k), reference)


def test_move_to_a_prefill_and_a_decode_worker(engines, tiny_model_dir) -> None:
    """A request that moves to a disaggregated pair: the prefill engine computes the KV of
    prompt + resumed tokens and samples the next one, the decode engine goes on from there."""
    model_dir = tiny_model_dir("llama")
    prefill = LLMEngine(model_dir, EngineConfig(num_kv_blocks=64, num_threads=1))
    ParkingConnector(prefill)
    decode = LLMEngine(model_dir, EngineConfig(num_kv_blocks=64, num_threads=1))
    params = SamplingParams(
        max_tokens=24, temperature=1.0, seed=5, presence_penalty=-1.0, ignore_eos=True
    )
    reference = run(engines[0], request(params))
    for k in (3, 16):  # the second resumes a full block of output beyond the prompt
        before = run(engines[0], request(params), num_tokens=k)
        after = run_disaggregated(prefill, decode, request(params, ResumeState.from_deltas(before)))
        assert_same_stream(before + after, reference)


def test_max_tokens_counts_the_resumed_output(engines) -> None:
    params = SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True)
    reference = run(engines[0], request(params))
    assert len(reference) == 9 and ending(reference)[1] == "length"
    assert_same_stream(moved(engines, params, 8), reference)


# ---------------------------------------------------------------- the state itself


def test_state_is_plain_data_and_comes_from_the_deltas() -> None:
    deltas = [
        OutputDelta(request_id="x", new_token_ids=[5], new_text="a"),
        OutputDelta(request_id="x", new_token_ids=[6, 7], new_text=""),
    ]
    state = ResumeState.from_deltas(deltas)
    assert state == ResumeState((5, 6, 7), "a") and state.num_output_tokens == 3
    assert pickle.loads(pickle.dumps(state)) == state
    assert not ResumeState() and EngineRequest("x", [1], SamplingParams()).resume == ResumeState()


def test_a_state_that_does_not_fit_is_refused(engines) -> None:
    engine = engines[1]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    before = run(engines[0], request(params), num_tokens=4)
    state = ResumeState.from_deltas(before)
    for bad in [
        replace(state, text=state.text + "?"),  # not the text the client has
        ResumeState(state.output_token_ids + (5,) * 8, ""),  # already past max_tokens
        ResumeState((10**7,), ""),  # outside the vocabulary
    ]:
        with pytest.raises(InvalidRequestError):
            engine.enqueue(request(params, bad))
    assert not engine.has_unfinished()
    engine.check_invariants()
