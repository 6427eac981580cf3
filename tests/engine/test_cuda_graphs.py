"""Decode steps through the static buffers of engine/cuda_graphs.py, on CPU: a capturer that
"replays" by running the recorded function again gives everything but the CUDA graph itself
(padding to a captured size, fixed-width block tables, the scratch block, copying a step in
and its real rows out). Greedy tokens must equal the eager path's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from core.config import EngineConfig
from core.request import RequestOutput
from core.sampling import SamplingParams
from engine.completion import run_to_completion
from engine.cuda_graphs import (
    RerunCapturer,
    capture_sizes,
    check_graph_memory,
    choose_capturer,
    record_all,
    records_cuda_graphs,
)
from engine.engine import LLMEngine
from tests.support.graph_capturer import CountingCapturer

# Lengths around block boundaries (block size 16), the longest spanning several blocks.
PROMPT_LENGTHS = [3, 17, 33, 9, 40, 1, 16]


def make_engine(
    model_dir: Path, capturer: CountingCapturer | None = None, **config: object
) -> LLMEngine:
    settings: dict[str, object] = dict(num_kv_blocks=64, max_num_seqs=8, num_threads=1)
    return LLMEngine(model_dir, EngineConfig(**{**settings, **config}), capturer=capturer)


def prompts(vocab_size: int) -> list[list[int]]:
    return [[(7 + 31 * i + 13 * n) % vocab_size for i in range(n)] for n in PROMPT_LENGTHS]


def generate(engine: LLMEngine, prompt_ids: list[list[int]]) -> list[list[int]]:
    # Different max_tokens: the decode batch shrinks step by step, through every size.
    for i, p in enumerate(prompt_ids):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=4 + 2 * i, temperature=0.0))
    outs = run_to_completion(engine, {f"r{i}": p for i, p in enumerate(prompt_ids)})
    assert not engine.has_unfinished()
    engine.check_invariants()
    return [outs[f"r{i}"].token_ids for i in range(len(prompt_ids))]


def test_capture_sizes() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(5) == [1, 2, 4, 5]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]


def test_who_captures() -> None:
    given = RerunCapturer()
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_capturer(EngineConfig(), cpu, "cpu") is None
    assert choose_capturer(EngineConfig(), cpu, "cpu", given) is given
    assert choose_capturer(EngineConfig(cuda_graphs=False), cpu, "cpu", given) is None
    # The torch backend would gather all of max_model_len per row: eager on CUDA too.
    assert choose_capturer(EngineConfig(), cuda, "torch") is None
    # What the KV sizing asks: CUDA graphs on CUDA with the Triton backend, where allowed.
    assert records_cuda_graphs(EngineConfig(), cuda, "triton")
    assert not records_cuda_graphs(EngineConfig(cuda_graphs=False), cuda, "triton")
    assert not records_cuda_graphs(EngineConfig(), cuda, "torch")
    assert not records_cuda_graphs(EngineConfig(), cpu, "triton")


def test_graphs_taking_more_than_left_them_warn(caplog: pytest.LogCaptureFixture) -> None:
    gib = 1 << 30
    with caplog.at_level(logging.WARNING, logger="engine.cuda_graphs"):
        check_graph_memory([gib // 2, gib // 4], gib)  # within what the sizing left
        check_graph_memory([2 * gib], 0)  # the cache's size was given: nothing was left
        check_graph_memory([None, None], gib)  # off CUDA
        assert caplog.records == []
        check_graph_memory([gib, gib // 2], gib)
    [record] = caplog.records
    assert "took 1.50 GiB, 0.50 GiB more than the KV sizing left" in record.getMessage()


def test_graphs_count_their_own_process_memory_only(monkeypatch) -> None:
    """Two workers capturing on one GPU at once: what the graphs took is what this
    process's allocator grew by (torch.cuda's answer given here), not the device's free
    memory, which the other worker's allocations move too."""
    reserved = [1 << 30]

    class Capturer:
        def capture(self, forward: Callable[[], None]) -> Callable[[], None]:
            reserved[0] += 1 << 20  # this graph's pool segment
            return forward

    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: reserved[0])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: pytest.fail("device-wide"))
    forwards = {8: lambda: None, 16: lambda: None}
    capturer: Any = Capturer()
    assert record_all(capturer, forwards, torch.device("cuda", 0)).graph_bytes == 2 << 20
    assert record_all(capturer, forwards, torch.device("cpu")).graph_bytes is None


@pytest.mark.parametrize("arch,backend", [("llama", "cpu"), ("llama", "torch"), ("qwen3", "cpu")])
def test_padded_replays_give_the_eager_tokens(tiny_model_dir, arch: str, backend: str) -> None:
    model_dir = tiny_model_dir(arch)
    eager = make_engine(model_dir, attention_backend=backend)
    assert eager.runner.decode_graphs is None
    prompt_ids = prompts(eager.model_config.vocab_size)
    want = generate(eager, prompt_ids)

    capturer = CountingCapturer()
    graphs = make_engine(model_dir, capturer, attention_backend=backend)
    assert graphs.kv.pool.num_blocks == eager.kv.pool.num_blocks - 1  # the scratch block
    assert generate(graphs, prompt_ids) == want
    # Decode batches of 7 down to 1 (7, 6, 5 padded to 8; 3 to 4): every size replayed.
    replays = capturer.by_size(graphs)
    assert sorted(replays) == [1, 2, 4, 8] and all(replays.values()), replays
    # Again, now over prefix-cache hits, from larger static buffers left by the first run.
    assert generate(graphs, prompt_ids[::-1]) == generate(eager, prompt_ids[::-1])


def test_the_flag_turns_graphs_off(tiny_model_dir) -> None:
    engine = make_engine(tiny_model_dir("llama"), CountingCapturer(), cuda_graphs=False)
    assert engine.runner.decode_graphs is None
    assert engine.kv.pool.num_blocks == engine.runner.kv_layout.num_blocks


def scripted_steps(
    engine: LLMEngine, replays: Callable[[], int]
) -> tuple[list[RequestOutput], list[int]]:
    """A 1-token prompt asking for prompt logprobs, then a 20-token prompt joining its
    decodes; returns both outputs and the replays of each of the first four steps."""
    b_prompt = list(range(10, 30))
    outs = {"a": RequestOutput("a", [5]), "b": RequestOutput("b", b_prompt)}
    per_step = []

    def step() -> None:
        before = replays()
        for delta in engine.step():
            outs[delta.request_id].add(delta)
        per_step.append(replays() - before)

    engine.add_request("a", [5], SamplingParams(max_tokens=8, temperature=0, prompt_logprobs=2))
    step()
    step()
    engine.add_request("b", b_prompt, SamplingParams(max_tokens=4, temperature=0))
    while engine.has_unfinished():
        step()
    return [outs["a"], outs["b"]], per_step[:4]


def test_prefill_chunks_and_prompt_logprobs_run_eagerly(tiny_model_dir) -> None:
    model_dir = tiny_model_dir("llama")
    capturer = CountingCapturer()
    got, replays = scripted_steps(make_engine(model_dir, capturer), lambda: sum(capturer.replays))
    # 1: a's only token looks like a decode but wants prompt logprobs; 2: a decodes;
    # 3: a decodes beside b's prompt; 4: both decode.
    assert replays == [0, 1, 0, 1]
    want, _ = scripted_steps(make_engine(model_dir), lambda: 0)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert got[0].prompt_logprobs == want[0].prompt_logprobs
    assert got[0].prompt_logprobs is not None and len(got[0].prompt_logprobs) == 1


def test_padding_rows_write_only_the_scratch_block(tiny_model_dir) -> None:
    capturer = CountingCapturer()
    engine = make_engine(tiny_model_dir("llama"), capturer)
    bs, kv = engine.config.block_size, engine.runner.kv_cache
    graphs = engine.runner.decode_graphs
    # The manager hands out ids below it only.
    assert graphs is not None and graphs.scratch_block == engine.kv.pool.num_blocks
    # 5 decodes (padded to 8), then 2 finish and 3 remain (padded to 4): row 3 of the
    # static buffers last held r3, whose blocks are free now.
    for i, (n, max_tokens) in enumerate([(5, 9), (20, 9), (33, 9), (17, 2), (40, 2)]):
        engine.add_request(f"r{i}", list(range(3, 3 + n)), SamplingParams(max_tokens=max_tokens))
    engine.step()  # the prompts
    engine.step()  # 5 decodes
    assert capturer.by_size(engine)[8] == 1 and len(engine.scheduler.running) == 3

    # Every slot but the running requests' context holds a sentinel: whatever a step writes
    # there is seen. Finite, as masked-out slots still enter attention as 0 * value.
    sentinel = 1234.5
    live = torch.zeros(kv.shape[1], bs, dtype=torch.bool)
    new_slots = set()
    for req in engine.scheduler.running:
        block_ids = engine.kv.block_ids(req.request_id)
        for pos in range(req.num_computed_tokens):
            live[block_ids[pos // bs], pos % bs] = True
        pos = req.num_computed_tokens
        new_slots.add((block_ids[pos // bs], pos % bs))
    kv.transpose(2, 3)[:, ~live] = sentinel  # [layer, block, offset, K/V, head, dim]
    engine.step()
    assert capturer.by_size(engine)[4] == 1

    written = ((kv != sentinel).transpose(2, 3).flatten(start_dim=3).any(-1).any(0)) & ~live
    written_slots = {(b, o) for b, o in written.nonzero().tolist()}
    # The real rows' new K/V, and the padding row's in the scratch block: nothing else.
    assert written_slots == new_slots | {(graphs.scratch_block, 0)}
