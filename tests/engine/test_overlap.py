"""Overlapped steps (engine/overlap.py) on CPU, where they are off unless asked for: each
step launched before the last one's tokens are processed gives the tokens, logprobs and
finishes of one step at a time, through batching, chunked prefill, preemption, stops, seeded
sampling, rows that need their tokens on the host, requests that join or leave while a step
is in flight, the hand-off to a decode engine and whole steps replayed from graphs."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest

from core.config import EngineConfig
from core.request import RequestOutput
from core.sampling import SamplingParams
from engine import LLM
from engine.engine import LLMEngine
from engine.overlap import overlap_enabled
from tests.engine.test_parity import GREEDY, check_parity, hand_off, hf_greedy, make_prompts
from tests.support.handoff import ParkingConnector
from tests.support.mixed_requests import mixed_params, run


def test_on_where_the_device_runs_asynchronously() -> None:
    assert overlap_enabled(EngineConfig(), "cuda")
    assert not overlap_enabled(EngineConfig(), "cpu")
    assert overlap_enabled(EngineConfig(overlap_steps=True), "cpu")
    assert not overlap_enabled(EngineConfig(overlap_steps=False), "cuda")
    assert not overlap_enabled(EngineConfig(speculative="ngram"), "cuda")


@pytest.mark.parametrize(
    "config",
    [
        dict(num_kv_blocks=512),  # batched, prefix cache
        dict(num_kv_blocks=512, max_num_batched_tokens=7),  # chunked prefill beside decodes
        dict(num_kv_blocks=14),  # preemption, some of it of requests running ahead
    ],
    ids=["batched", "chunked", "preempted"],
)
def test_greedy_tokens_equal_transformers(tiny_model_dir, config: dict) -> None:
    model_dir = tiny_model_dir("llama")
    llm = LLM(model_dir, overlap_steps=True, **config)
    prompts = make_prompts(llm.engine.model_config.vocab_size)
    check_parity(llm, model_dir, prompts)
    assert llm.engine.step_totals.overlapped_steps > 0
    if config["num_kv_blocks"] == 14:
        assert llm.engine.scheduler.num_preemptions > 0


def test_every_request_ends_as_with_one_step_at_a_time(tiny_model_dir) -> None:
    """Seeded draws, logprobs, min_tokens, stop tokens and strings, lengths of 1 and 2, and
    the rows that need their last token on the host (penalties, a grammar): the same output
    either way; the steps run ahead while no such row is running."""
    model_dir = tiny_model_dir("llama")
    outputs = []
    for overlap in (False, True):
        engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=256, overlap_steps=overlap))
        prompts = make_prompts(engine.model_config.vocab_size)[3:12]
        outputs.append(run(engine, prompts, mixed_params(), "r"))
        plain = run(engine, prompts[:4], [GREEDY] * 4, "p")
        cached = run(engine, prompts[:4], [GREEDY] * 4, "q")  # over their cached prefixes
        assert [o.token_ids for o in plain.values()] == [o.token_ids for o in cached.values()]
        if overlap:
            assert engine.step_totals.overlapped_steps > 0
    one_at_a_time, overlapped = outputs
    for rid, out in one_at_a_time.items():
        other = overlapped[rid]
        assert (other.token_ids, other.text, other.finish_reason) == (
            out.token_ids,
            out.text,
            out.finish_reason,
        ), rid
        assert other.logprobs == out.logprobs, rid


def test_rows_that_need_their_tokens_on_the_host_never_run_ahead(tiny_model_dir) -> None:
    engine = LLMEngine(tiny_model_dir("llama"), EngineConfig(overlap_steps=True))
    penalized = SamplingParams(max_tokens=8, temperature=0.0, frequency_penalty=0.5)
    out = run(engine, [[3, 4, 5], [6, 7, 8, 9]], [penalized, penalized], "r")
    assert engine.step_totals.overlapped_steps == 0
    assert [len(o.token_ids) for o in out.values()] == [8, 8]


def test_an_abort_while_its_step_is_in_flight_frees_its_blocks_after(tiny_model_dir) -> None:
    engine = LLMEngine(tiny_model_dir("llama"), EngineConfig(overlap_steps=True))
    engine.add_request("a", list(range(3, 40)), GREEDY)
    engine.add_request("b", list(range(5, 30)), GREEDY)
    out = RequestOutput("b", [])
    assert engine.step() == []  # both prompts: in flight
    # Their first decode launched, the prompts' first tokens processed.
    for delta in engine.step():
        if delta.request_id == "b":
            out.add(delta)
    assert engine.in_flight.launched is not None and out.token_ids
    held = set(engine.kv.block_ids("a"))
    assert engine.abort("a")
    # The step in flight still writes a's last slot: its blocks wait for it.
    assert held <= {b.block_id for b in engine.kv.pool.blocks if b.ref_cnt}
    while engine.has_unfinished():
        for delta in engine.step():
            assert delta.request_id == "b"
            out.add(delta)
    assert out.token_ids == hf_greedy(str(tiny_model_dir("llama")), tuple(range(5, 30)))
    engine.check_invariants()
    assert engine.kv.pool.num_used_blocks == 0


def test_a_decode_engine_overlaps_the_requests_handed_to_it(tiny_model_dir) -> None:
    model_dir = tiny_model_dir("llama")
    prefill = LLMEngine(model_dir, EngineConfig(num_kv_blocks=256, overlap_steps=True))
    ParkingConnector(prefill)  # a connector: its steps are processed one at a time
    decode = LLMEngine(
        model_dir, EngineConfig(num_kv_blocks=256, overlap_steps=True), worker_id="d"
    )
    prompts = make_prompts(prefill.model_config.vocab_size)[:8]
    got = hand_off(prefill, decode, prompts)
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == hf_greedy(str(model_dir), tuple(p)), f"prompt len {len(p)}"
    assert prefill.step_totals.overlapped_steps == 0 and decode.step_totals.overlapped_steps > 0
    for engine in (prefill, decode):
        engine.check_invariants()
        assert engine.kv.pool.num_used_blocks == 0


def test_replayed_steps_read_the_pending_tokens_on_the_device(tiny_model_dir, monkeypatch) -> None:
    """Whole steps through the graphs' static buffers (Triton under the interpreter): the
    pending tokens are written into the step's input ids before the replay copies them."""
    monkeypatch.setenv("BATON_ATTENTION", "triton")
    from tests.engine.test_step_graphs import make_engine, steps_until_done
    from tests.support.graph_capturer import CountingCapturer

    model_dir = tiny_model_dir("llama")
    capturer = CountingCapturer()
    engine = make_engine(model_dir, capturer, overlap_steps=True)
    prompts = [make_prompts(engine.model_config.vocab_size)[i] for i in (7, 11)]
    want = [hf_greedy(str(model_dir), tuple(p)) for p in prompts]
    assert steps_until_done(engine, prompts, "a") == want
    assert engine.step_totals.overlapped_steps > 0
    assert sum(capturer.by_bucket(engine).values()) + sum(capturer.by_size(engine).values())


def test_an_overlapped_step_reads_nothing_on_the_host_but_its_tokens(
    tiny_model_dir, monkeypatch
) -> None:
    """What torch's sync debug mode lists on a GPU, looked for on the CPU (HostReads): whole
    steps through the graphs' static buffers with every kind of row that runs ahead (greedy,
    top-p from the nucleus kernel, seeded top-k with logprobs, min-p with a stop string). The
    one read is each step's tokens landing (on CUDA, pinned copies waited for by an event)."""
    monkeypatch.setenv("BATON_ATTENTION", "triton")
    from tests.engine.test_step_graphs import make_engine
    from tests.support.graph_capturer import CountingCapturer
    from tests.support.host_reads import HostReads

    engine = make_engine(tiny_model_dir("llama"), CountingCapturer(), overlap_steps=True)
    engine.runner.sampler.nucleus_on_device = True
    rows = [
        dict(temperature=0.0),
        dict(temperature=0.8, top_p=0.9),
        dict(temperature=0.8, top_k=20, seed=3, logprobs=2),
        dict(temperature=1.0, min_p=0.05, stop=["xyz"]),
    ]
    for i, row in enumerate(rows):
        params = SamplingParams(max_tokens=12, ignore_eos=True, **row)
        engine.add_request(f"r{i}", [5 + i, 9, 13, 17, 21, 25, 29, 33], params)
    for _ in range(3):  # the prompts, then decoding
        engine.step()
    overlapped = engine.step_totals.overlapped_steps
    with HostReads() as reads:
        for _ in range(4):
            engine.step()
    assert engine.step_totals.overlapped_steps == overlapped + 4
    assert reads.places and all(
        p.startswith("Tensor.tolist at") and "engine/sampler.py" in p for p in reads.places
    ), reads.places
