"""The generator's inputs: arrival processes, hash-id -> token blocks, trace parsing, and the
synthetic workloads' shapes."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from loadgen import workloads as wl
from loadgen.traces import TraceRequest, read_azure_csv, read_jsonl

SPACE = wl.TokenSpace(16, 1000)


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times], times, strict=False)]


@pytest.mark.parametrize("rate", [0.5, 4.0, 50.0])
def test_poisson_arrivals_have_the_rate_and_exponential_gaps(rate: float) -> None:
    times = wl.poisson_arrivals(rate, 20_000, random.Random(7))
    gaps = _gaps(times)
    assert all(g > 0 for g in gaps)
    assert times == sorted(times)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / rate, rel=0.03)
    # An exponential distribution has a coefficient of variation of exactly 1.
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.04)


def test_poisson_arrivals_are_deterministic_per_seed() -> None:
    a = wl.poisson_arrivals(3.0, 50, random.Random(1))
    assert a == wl.poisson_arrivals(3.0, 50, random.Random(1))
    assert a != wl.poisson_arrivals(3.0, 50, random.Random(2))


def test_poisson_rejects_a_non_positive_rate() -> None:
    with pytest.raises(ValueError, match="rate"):
        wl.poisson_arrivals(0.0, 3, random.Random(0))


def test_with_poisson_arrivals_keeps_order_and_prompts() -> None:
    reqs = wl.fixed_lengths(30, 8, 4, SPACE, seed=1)
    timed = wl.with_poisson_arrivals(reqs, 2.0, seed=3)
    assert [r.prompt_token_ids for r in timed] == [r.prompt_token_ids for r in reqs]
    assert [r.arrival_s for r in timed] == sorted(r.arrival_s for r in timed)


def test_retime_scales_gaps_and_starts_at_zero() -> None:
    reqs = [TraceRequest.of_prompt(t, [20], 1) for t in (10.0, 12.0, 11.0)]
    out = wl.retime(reqs, 0.5)
    assert [r.arrival_s for r in out] == [0.0, 0.5, 1.0]


def test_block_tokens_are_a_pure_function_of_the_id() -> None:
    a = wl.block_tokens(42, 16, SPACE, seed=0)
    assert a == wl.block_tokens(42, 16, SPACE, seed=0)
    assert a != wl.block_tokens(43, 16, SPACE, seed=0)
    assert a != wl.block_tokens(42, 16, SPACE, seed=1)
    assert all(SPACE.low <= t < SPACE.high for t in a)


def test_shared_hash_ids_mean_shared_prefixes_and_distinct_ids_diverge() -> None:
    bs = 16
    a = wl.tokens_for_hash_ids([1, 2, 3, 4], 60, bs, SPACE)
    b = wl.tokens_for_hash_ids([1, 2, 9], 40, bs, SPACE)
    c = wl.tokens_for_hash_ids([5, 2, 3], 48, bs, SPACE)
    assert (len(a), len(b), len(c)) == (60, 40, 48)
    assert a[: 2 * bs] == b[: 2 * bs]  # ids 1, 2 shared
    assert a[2 * bs : 3 * bs] != b[2 * bs : 3 * bs]  # 3 vs 9
    assert a[:bs] != c[:bs]  # a different first id: nothing shared from the start
    assert a[bs : 3 * bs] == c[bs : 3 * bs]  # same ids, same blocks, wherever they sit


def test_a_short_hash_id_list_is_padded_to_the_length() -> None:
    out = wl.tokens_for_hash_ids([7], 50, 16, SPACE)
    assert len(out) == 50
    assert out[:16] == wl.block_tokens(7, 16, SPACE)
    assert wl.tokens_for_hash_ids([8], 50, 16, SPACE)[16:] != out[16:]


def test_mooncake_jsonl_is_parsed_and_scaled(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 1024, "output_length": 300, "hash_ids": [1, 2]},
        {"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [3, 4]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reqs = wl.mooncake_trace(path, SPACE, length_scale=1 / 32, max_output=128)
    assert [r.arrival_s for r in reqs] == [0.0, 1.5, 3.0]
    assert [len(r.prompt_token_ids) for r in reqs] == [31, 32, 19]
    assert [r.output_length for r in reqs] == [10, 128, 5]
    # Block size 512 / 32 = 16 tokens per id: the first two share both blocks.
    assert reqs[0].prompt_token_ids[:31] == reqs[1].prompt_token_ids[:31]
    assert reqs[0].prompt_token_ids[:16] != reqs[2].prompt_token_ids[:16]


def test_a_jsonl_line_missing_fields_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(ValueError, match="not a Mooncake-format trace line"):
        read_jsonl(path)


def test_azure_csv_is_parsed_time_ordered_and_unshared(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51.0000000,4000,1\n"
    )
    rows = list(read_azure_csv(path))
    assert [r.arrival_ms for r in rows] == [0, 4314, 4319]
    reqs = wl.azure_trace(path, SPACE, length_scale=0.25, output_scale=0.5, max_input=500)
    assert [len(r.prompt_token_ids) for r in reqs] == [94, 99, 500]
    assert [r.output_length for r in reqs] == [22, 54, 1]
    assert reqs[0].prompt_token_ids[:16] != reqs[1].prompt_token_ids[:16]
    timed = wl.retime(reqs, 0.1)
    assert [round(r.arrival_s, 4) for r in timed] == [0.0, 0.4314, 0.4319]


def test_the_shared_traces_parse() -> None:
    traces = Path(__file__).resolve().parents[3] / "shared" / "traces"
    if not traces.exists():
        pytest.skip("no shared traces on this machine")
    moon = wl.mooncake_trace(traces / "mooncake" / "synthetic_trace.jsonl", SPACE, limit=50)
    azure = wl.azure_trace(traces / "azure" / "AzureLLMInferenceTrace_code.csv", SPACE, limit=50)
    assert len(moon) == len(azure) == 50
    assert all(0 < len(r.prompt_token_ids) <= 3000 for r in moon + azure)


def test_shared_prefix_requests_share_their_tenants_system_prompt() -> None:
    reqs = wl.shared_prefix(40, SPACE, num_tenants=3, system_tokens=64, user_tokens=32)
    prefixes = {tuple(r.prompt_token_ids[:64]) for r in reqs}
    assert len(prefixes) == 3
    assert len({tuple(r.prompt_token_ids[64:96]) for r in reqs}) == 40  # unique user parts


def test_shared_prefix_runs_keep_their_tenants_but_no_whole_prompt() -> None:
    kw = {"num_tenants": 2, "system_tokens": 40, "user_tokens": 8, "prefix_seed": 5}
    a = wl.shared_prefix(20, SPACE, seed=1, **kw)
    b = wl.shared_prefix(20, SPACE, seed=2, **kw)
    assert {tuple(r.prompt_token_ids[:40]) for r in a} == {
        tuple(r.prompt_token_ids[:40]) for r in b
    }
    assert not {tuple(r.prompt_token_ids) for r in a} & {tuple(r.prompt_token_ids) for r in b}
    other = wl.shared_prefix(20, SPACE, seed=1, **{**kw, "prefix_seed": 6})
    assert not {tuple(r.prompt_token_ids[:16]) for r in a} & {
        tuple(r.prompt_token_ids[:16]) for r in other
    }


def test_multi_turn_turns_extend_a_previous_prompt() -> None:
    reqs = wl.multi_turn(5, SPACE, turns=(3, 3), session_rate_per_s=1.0)
    prompts = [r.prompt_token_ids for r in reqs]
    extending = [
        p for i, p in enumerate(prompts) if any(len(q) < len(p) and p[: len(q)] == q
                                                for q in prompts[:i])
    ]  # fmt: skip
    assert len(extending) >= 10  # every later turn of the 5 sessions (3 turns each)
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)


def test_long_prompt_mix_is_mostly_short_with_10_to_50x_longer_prompts() -> None:
    reqs = wl.long_prompt_mix(400, SPACE, long_fraction=0.2, max_input=10_000, seed=2)
    lengths = [len(r.prompt_token_ids) for r in reqs]
    long = [n for n in lengths if n > 96]
    assert 0.14 < len(long) / len(lengths) < 0.26
    assert min(long) >= 32 * 10 and max(long) <= 96 * 50


def test_distributed_lengths_stay_in_range() -> None:
    reqs = wl.distributed_lengths(200, 100, 40, SPACE, spread=0.5)
    assert all(50 <= len(r.prompt_token_ids) <= 150 for r in reqs)
    assert all(20 <= r.output_length <= 60 for r in reqs)
    assert len({len(r.prompt_token_ids) for r in reqs}) > 20
