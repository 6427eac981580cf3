"""Whole steps through the static buffers of engine/step_graphs.py, on CPU under the Triton
interpreter: a capturer that "replays" by running the recorded step again gives everything
but the CUDA graph (token buckets, the fixed launch grids with their padding rows and tiles,
the scratch block, the chunk layout copied in). Greedy tokens equal transformers'. A layer's
written-event outlives the replay that recorded it (`ReplayedLayer`)."""

from __future__ import annotations

import itertools
import os
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from core.config import EngineConfig
from core.request import EngineRequest, RequestOutput
from core.sampling import SamplingParams
from engine import step_graphs
from engine.engine import LLMEngine
from engine.kernels import tuned
from engine.kernels.prefill_attention import launch_config
from engine.kv_connector import LayerHook
from engine.request import Request
from engine.step_graphs import ReplayedLayer, token_buckets
from tests.engine.test_parity import GREEDY, hf_greedy, make_prompts
from tests.support.graph_capturer import CountingCapturer
from tests.support.handoff import ParkingConnector, run_disaggregated


def make_engine(model_dir, capturer: CountingCapturer | None, **config: object) -> LLMEngine:
    settings: dict[str, object] = dict(
        num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=40, num_threads=1
    )
    return LLMEngine(model_dir, EngineConfig(**{**settings, **config}), capturer=capturer)


def test_token_buckets() -> None:
    assert token_buckets(16) == [16]
    assert token_buckets(40) == [16, 32, 40]
    assert token_buckets(2048) == [
        16, 32, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024,
        1280, 1536, 1792, 2048,
    ]  # fmt: skip
    # Past 256 tokens a step pads by at most a quarter.
    sizes = [s for s in token_buckets(8192) if s >= 256]
    assert all(b <= a * 1.25 for a, b in itertools.pairwise(sizes))


@pytest.fixture
def triton(monkeypatch) -> None:
    monkeypatch.setenv("BATON_ATTENTION", "triton")


def steps_until_done(
    engine: LLMEngine, prompts: list[list[int]], tag: str, params: SamplingParams = GREEDY
) -> list[list[int]]:
    outs = {f"{tag}{i}": RequestOutput(f"{tag}{i}", p) for i, p in enumerate(prompts)}
    for rid, p in zip(outs, prompts, strict=True):
        engine.add_request(rid, p, params)
    while engine.has_unfinished():
        for delta in engine.step():
            outs[delta.request_id].add(delta)
    engine.check_invariants()
    return [o.token_ids for o in outs.values()]


@pytest.fixture
def keys_read(request, monkeypatch) -> str:
    """How the prefill kernel reads keys: its default (gathered), or whole pages through a
    tuned table naming this (CPU) device, as a GPU's table would: two pages a step, in
    tiles of 16 query rows (the eager steps' layouts and the graphs' grids cut them so)."""
    if request.param == "whole_pages":
        monkeypatch.setattr(tuned, "device_name", lambda kind, index: "this cpu")
        monkeypatch.setattr(tuned, "_in_process", {})
        launch = dict(block_n=32, num_warps=4, num_stages=2, whole_pages=True, block_m=16)
        tuned.use("this cpu", {"prefill": {f"float32/{d}": launch for d in (16, 32, 64)}})
    return request.param


@pytest.mark.parametrize("keys_read", ["gather", "whole_pages"], indirect=True)
def test_every_step_replays_and_gives_transformers_tokens(
    tiny_model_dir, triton, keys_read
) -> None:
    model_dir = tiny_model_dir("llama")
    capturer = CountingCapturer()
    engine = make_engine(model_dir, capturer)
    layer = engine.runner.kv_cache[0]
    head_dim = layer.shape[-1]
    chosen = launch_config(torch.float32, head_dim, layer.device)
    assert chosen.whole_pages == (keys_read == "whole_pages"), (head_dim, chosen)
    graphs = engine.runner.step_graphs
    assert graphs is not None and graphs.sizes == [16, 32, 40]
    assert graphs.block_m == chosen.block_m == (16 if keys_read == "whole_pages" else 64)
    # Prompts of 33, 65 and 100 tokens in a 40-token budget: chunks alone, chunks beside
    # decodes, two chunks in one step; then the same prompts over their cached prefixes.
    prompts = [make_prompts(engine.model_config.vocab_size)[i] for i in (7, 11, 13)]
    want = [hf_greedy(str(model_dir), tuple(p)) for p in prompts]
    steps = engine.step_totals.steps
    assert steps_until_done(engine, prompts, "a") == want
    again = steps_until_done(engine, prompts[1:], "b")
    assert again == want[1:]
    buckets = capturer.by_bucket(engine)
    assert buckets[16] and buckets[40], buckets  # a chunk's tail padded, whole budgets
    # Every step replayed a graph: a step graph, or a decode graph for decode-only steps.
    replays = sum(buckets.values()) + sum(capturer.by_size(engine).values())
    assert replays == engine.step_totals.steps - steps


def test_padding_rows_write_only_the_scratch_block(tiny_model_dir, triton) -> None:
    capturer = CountingCapturer()
    engine = make_engine(tiny_model_dir("llama"), capturer, max_num_batched_tokens=32)
    graphs = engine.runner.step_graphs
    assert graphs is not None and graphs.scratch_block == engine.kv.pool.num_blocks
    kv, bs = engine.runner.kv_cache, engine.config.block_size
    sentinel = 1234.5
    kv.fill_(sentinel)
    # 21 tokens: padded to the 32 bucket.
    engine.add_request("a", list(range(3, 24)), GREEDY)
    engine.step()
    assert capturer.by_bucket(engine)[32] == 1
    blocks = engine.kv.block_ids("a")
    want = {(blocks[p // bs], p % bs) for p in range(21)} | {(graphs.scratch_block, 0)}
    written = (kv != sentinel).transpose(2, 3).flatten(start_dim=3).any(-1).any(0)
    assert {(b, o) for b, o in written.nonzero().tolist()} == want


def test_steps_past_the_grids_run_eagerly(tiny_model_dir, triton) -> None:
    capturer = CountingCapturer()
    engine = make_engine(tiny_model_dir("llama"), capturer, max_num_seqs=2)
    graphs = engine.runner.step_graphs
    assert graphs is not None and graphs.max_chunks == 2
    # Prompt logprobs: eager (the hidden states of every prompt row are read).
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=2, prompt_logprobs=1))
    engine.step()
    assert sum(capturer.replays) == 0


SENTINEL = 1234.5


class HookedConnector(ParkingConnector):
    """Parks prompts as the prefill worker's connector does, and sees the layer hook: what
    each layer's slots hold when the hook is called for it."""

    def __init__(self, engine: LLMEngine) -> None:
        super().__init__(engine)
        self.calls: list[tuple[int, object]] = []
        self.seen: dict[int, torch.Tensor] = {}
        self.blocks: list[int] = []

    def begin_step(self, completing: list[tuple[Request, list[int]]]) -> LayerHook | None:
        blocks = [b for _, ids in completing for b in ids]
        self.blocks = blocks

        def hook(layer: int, event: object) -> None:
            self.calls.append((layer, event))
            self.seen[layer] = self.engine.runner.kv_cache[layer, blocks].clone()

        return hook if completing else None


def test_a_prefill_engine_sends_each_layer_from_its_replay(tiny_model_dir, triton) -> None:
    model_dir = tiny_model_dir("llama")
    capturer = CountingCapturer()
    prefill = make_engine(model_dir, capturer, decode_graphs=False)
    assert prefill.runner.decode_graphs is None and prefill.runner.step_graphs is not None
    connector = HookedConnector(prefill)
    prefill.runner.kv_cache.fill_(SENTINEL)
    decode = make_engine(model_dir, None)
    prompt = make_prompts(prefill.model_config.vocab_size)[9]  # 48 tokens: two chunks
    request = EngineRequest("r", prompt[:48], GREEDY)  # three whole blocks
    deltas = run_disaggregated(prefill, decode, request)
    assert [t for d in deltas for t in d.new_token_ids] == hf_greedy(
        str(model_dir), tuple(prompt[:48])
    )
    assert sum(capturer.by_bucket(prefill).values()) == 2  # both chunks replayed
    # The step completing the prompt called the hook once a layer, in order, each after its
    # layer was written (no event on CPU: the replay has run when the hook is called).
    layers = prefill.model_config.num_hidden_layers
    assert connector.calls == [(i, None) for i in range(layers)]
    for i in range(layers):
        assert torch.equal(connector.seen[i], prefill.runner.kv_cache[i, connector.blocks])
        assert not (connector.seen[i] == SENTINEL).any()  # every slot of the prompt written


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_a_quantized_cache_replays_as_it_runs_eagerly(
    tiny_model_dir, triton, kv_cache_dtype
) -> None:
    # The graphs' hidden states are the model's activations, whatever the cache holds.
    model_dir = tiny_model_dir("llama")
    prompts = [make_prompts(64)[i] for i in (7, 11)]
    eager = make_engine(model_dir, None, kv_cache_dtype=kv_cache_dtype, cuda_graphs=False)
    capturer = CountingCapturer()
    graphs = make_engine(model_dir, capturer, kv_cache_dtype=kv_cache_dtype)
    assert graphs.runner.step_graphs is not None and graphs.runner.decode_graphs is not None
    # Six tokens: the second prompt's chunks beside the first's decodes, then decodes alone.
    short = SamplingParams(max_tokens=6, temperature=0.0)
    assert steps_until_done(graphs, prompts, "g", short) == steps_until_done(
        eager, prompts, "e", short
    )
    assert sum(capturer.by_bucket(graphs).values()) and sum(capturer.by_size(graphs).values())


class StreamEvent:
    """A CUDA event on one stream, the stream's progress set by hand: it completes once the
    stream passed the position of its latest record."""

    def __init__(self, stream: list[int]) -> None:
        self.stream, self.at = stream, None

    def record(self, position: int) -> None:
        self.at = position

    def query(self) -> bool:
        return self.at is not None and self.stream[0] >= self.at

    def synchronize(self) -> None:
        assert self.query(), "would wait forever in this test"


def test_a_layer_event_of_an_earlier_replay_waits_for_that_replay_not_the_next() -> None:
    done = [0]  # how far the stream ran: replay r's layer i is at 10 r + i, its end 10 r + 9
    graphs = SimpleNamespace(events=[StreamEvent(done) for _ in range(3)], replays=0)

    def replay() -> list[ReplayedLayer]:
        graphs.replays += 1
        r = graphs.replays
        for i, event in enumerate(graphs.events):
            event.record(10 * r + i)
        ended = StreamEvent(done)
        ended.record(10 * r + 9)
        return [ReplayedLayer(graphs, r, i, ended) for i in range(3)]

    first = replay()
    done[0] = 11  # the first replay wrote layers 0 and 1
    assert [e.query() for e in first] == [True, True, False]
    second = replay()  # records every layer's event again before the first one ended
    assert [e.query() for e in first] == [False, False, False]  # its end is not reached yet
    done[0] = 19  # the first replay ended: all its layers are written, the second ran nothing
    assert [e.query() for e in first] == [True, True, True]
    assert not any(e.query() for e in second)
    first[2].synchronize()
    done[0] = 21
    assert [e.query() for e in second] == [True, True, False]


class Recorded:
    """A stand-in CUDA event on the CPU: counts its records, always complete."""

    def __init__(self) -> None:
        self.records = 0

    def record(self) -> None:
        self.records += 1

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class EventCapturer(CountingCapturer):
    def event(self) -> Recorded:
        return Recorded()


def test_a_replay_hands_each_layer_its_own_replayed_event(tiny_model_dir, triton, monkeypatch):
    # The CUDA wiring on the CPU: graph events that replays record, an end event after each
    # replay, and a device that records events at launch.
    monkeypatch.setattr(step_graphs, "records_at_launch", lambda *args: True)
    monkeypatch.setattr(step_graphs, "layer_written", lambda device: Recorded())
    prefill = make_engine(tiny_model_dir("llama"), EventCapturer(), decode_graphs=False)
    graphs = prefill.runner.step_graphs
    assert graphs is not None and graphs.layer_events
    connector = HookedConnector(prefill)
    decode = make_engine(tiny_model_dir("llama"), None)
    prompts = make_prompts(prefill.model_config.vocab_size)
    layers = prefill.model_config.num_hidden_layers
    handed = []
    for i, prompt in enumerate(prompts[9:11]):
        replays = graphs.replays
        run_disaggregated(prefill, decode, EngineRequest(f"r{i}", prompt[-32:], GREEDY))
        handed.append([event for _, event in connector.calls[-layers:]])
        assert graphs.replays > replays
        assert all(isinstance(e, ReplayedLayer) and e.replay == graphs.replays for e in handed[-1])
        assert [e._event() for e in handed[-1]] == graphs.events  # the graph's own, until...
    # ... a later replay records them again: the first prompt's layers read its replay's end.
    assert all(e._event() is e.ended for e in handed[0])
    assert all(e.records == graphs.replays for e in graphs.events)  # once a replay each


def test_a_replay_without_graph_events_hands_each_layer_its_end(
    tiny_model_dir, triton, monkeypatch
):
    # A re-running capturer (no graph events) on CUDA: the replay's end, never None (None
    # says "written": the layer would be sent while its kernels are still queued).
    ends: list[Recorded] = []

    def end(device) -> Recorded:  # type: ignore[no-untyped-def]
        ends.append(Recorded())
        return ends[-1]

    monkeypatch.setattr(step_graphs, "layer_written", end)
    prefill = make_engine(tiny_model_dir("llama"), CountingCapturer(), decode_graphs=False)
    graphs = prefill.runner.step_graphs
    assert graphs is not None and not graphs.layer_events
    connector = HookedConnector(prefill)
    decode = make_engine(tiny_model_dir("llama"), None)
    prompt = make_prompts(prefill.model_config.vocab_size)[9]
    run_disaggregated(prefill, decode, EngineRequest("r", prompt[-32:], GREEDY))
    layers = prefill.model_config.num_hidden_layers
    assert graphs.replays >= 1
    assert [event for _, event in connector.calls[-layers:]] == [ends[-1]] * layers
