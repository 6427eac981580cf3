"""bench/engine/prefill_tuning.py and decode_tuning.py: the candidates, their order, their scores
and a tuning cut short by its time."""

from __future__ import annotations

import dataclasses
import os
import time

# Read when `@triton.jit` runs: set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from bench.engine import prefill_tuning


def test_a_tuning_cut_short_has_tried_both_ways_of_reading_keys_first() -> None:
    launches = prefill_tuning.candidates(torch.bfloat16, 128)
    assert not launches[0].whole_pages and launches[1].whole_pages
    assert {c.block_m for c in launches} == {64, 128}
    assert {c.block_n for c in launches if c.whole_pages} == {16, 32, 64}


def test_no_candidate_starts_past_the_deadline() -> None:
    shapes = prefill_tuning.make_shapes(((1, 32),), 2, 1, 64, torch.float32, torch.device("cpu"))
    launches = prefill_tuning.candidates(torch.float32, 64)[:2]

    def timer(fn) -> float:
        raise AssertionError("a candidate ran past the deadline")

    rows = prefill_tuning.tune(torch.float32, torch.device("cpu"), 64, shapes, timer,
                               launches=launches, deadline=time.monotonic() - 1)  # fmt: skip
    assert [r["skipped"] for r in rows] == ["the tuning's time ran out"] * 2
    assert prefill_tuning.table_entry(rows) is None


def test_the_decode_tuning_checks_each_launch_and_scores_it_by_shape() -> None:
    from bench.engine import decode_tuning
    from engine.kernels.decode_attention import decode_launch

    launches = decode_tuning.candidates(torch.float32)
    assert launches[0] == decode_launch(torch.float32, 128) and len(set(launches)) == len(launches)
    cpu = torch.device("cpu")
    shapes = decode_tuning.make_shapes(((2, 32), (1, 48)), 4, 2, 64, torch.float32, cpu)
    # The first launch the best on one shape, 1.5x off on the other; the second 2x off.
    times = iter([1.0, 3.0, 2.0, 2.0])

    rows = decode_tuning.tune(shapes, lambda fn: next(times), launches[:2])
    assert [r["score"] for r in rows] == [1.25, 1.5]
    assert decode_tuning.table_entry(rows) == {k: rows[0][k] for k in
                                               ("block_n", "num_warps", "num_stages")}  # fmt: skip


def test_a_chunk_over_a_cached_prefix_is_checked_as_a_fresh_prompt_is() -> None:
    """The tuner's shapes: a fresh prompt, and the last tokens of one over a cached prefix
    (five pages before them: one left over after a step of four); each candidate's answer
    is held against SDPA's rows for those tokens before it is timed."""
    cpu = torch.device("cpu")
    shapes = prefill_tuning.make_shapes(((1, 32), (1, 112, 24)), 2, 1, 64, torch.float32, cpu)
    assert [(s.length, s.query, s.q.shape[0]) for s in shapes] == [(32, 32, 32), (112, 24, 24)]
    launches = [c for c in prefill_tuning.candidates(torch.float32, 64) if c.whole_pages][:1]
    rows = prefill_tuning.tune(torch.float32, cpu, 64, shapes, lambda fn: 1.0, launches=launches)
    assert rows[0]["ms"] == 2.0, rows  # both checked against SDPA, then "timed"
    wrong = dataclasses.replace(shapes[1], want=shapes[1].want + 1)
    rows = prefill_tuning.tune(torch.float32, cpu, 64, [wrong], lambda fn: 1.0, launches=launches)
    assert rows[0]["ms"] is None and "against SDPA" in rows[0]["error"]
