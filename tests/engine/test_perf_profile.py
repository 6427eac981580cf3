"""`baton profile`'s measurements and fits (engine/perf_profile.py, router/cli/profile.py)."""

from __future__ import annotations

import json
import random

import pytest

from engine import perf_profile as pp


def test_least_squares_recovers_the_terms_it_was_built_from() -> None:
    rng = random.Random(1)
    rows = [(1.0, float(n), n * (c + n / 2) / 1000) for n in (16, 64, 300, 900) for c in (0, 500)]
    truth = (0.004, 0.0002, 0.00003)
    ys = [sum(t * x for t, x in zip(truth, r)) * (1 + rng.uniform(-1e-9, 1e-9)) for r in rows]
    assert pp.least_squares(rows, ys) == pytest.approx(truth, rel=1e-4)
    with pytest.raises(ValueError, match="separate"):
        pp.least_squares([(1.0, 2.0), (2.0, 4.0)], [1.0, 2.0])  # one shape, two unknowns


def test_least_squares_is_the_non_negative_optimum_not_a_clipped_one() -> None:
    # Unconstrained, the first term fits negative; clipping it at 0 would leave the second
    # term's share as fitted beside a negative first. The optimum refits the second alone.
    rows = [(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]
    ys = [1.0, 4.0, 6.0]  # unconstrained: -1.333 + 2.5 x
    fit = pp.least_squares(rows, ys)
    assert fit[0] == 0.0
    assert fit[1] == pytest.approx(sum(x * y for (_, x), y in zip(rows, ys)) / 14)  # 2.285..
    grid = [(a / 100, b / 100) for a in range(0, 200) for b in range(100, 300)]

    def sse(c):  # type: ignore[no-untyped-def]
        return sum((y - c[0] * r[0] - c[1] * r[1]) ** 2 for r, y in zip(rows, ys))

    assert sse(fit) <= min(sse(c) for c in grid) + 1e-9


def test_a_prefill_fit_without_a_per_token_cost_is_measured_again(monkeypatch) -> None:
    # Noise: the longer prompts measured no slower.
    flat = [pp.Sample((1, n, 0), 0.003 - n * 1e-7) for n in (16, 64, 160)]
    grows = [pp.Sample((1, n, 0), 0.001 + n * 1e-5) for n in (16, 64, 160)]
    rounds = iter([flat, flat, grows])
    calls = []

    def measure(engine, lengths, repeat, rng, warm_up=True):  # type: ignore[no-untyped-def]
        calls.append((repeat, warm_up))
        return next(rounds)

    monkeypatch.setattr(pp, "measure_prefill", measure)
    samples, fit = pp.profile_prefill(None, [16, 64, 160], 2, random.Random(0))
    assert calls == [(2, True), (1, False), (1, False)]  # the later rounds skip the warm-up
    assert fit["token_ms"] == pytest.approx(0.01) and len(samples) == 9
    monkeypatch.setattr(pp, "measure_prefill", lambda *a, **k: list(flat))
    with pytest.raises(ValueError, match="did not grow with prompt length"):
        pp.profile_prefill(None, [16, 64, 160], 2, random.Random(0), extra_rounds=2)


def test_the_fit_takes_the_fastest_repeat_of_each_shape() -> None:
    samples = [pp.Sample((1, 16, 0), 0.9), pp.Sample((1, 16, 0), 0.2), pp.Sample((2, 8), 0.1)]
    assert pp.fastest(samples) == [pp.Sample((1, 16, 0), 0.2), pp.Sample((2, 8), 0.1)]


def test_baton_profile_measures_the_engine_and_writes_a_profile(tiny_model_dir, tmp_path) -> None:
    from router.cli.main import main

    out = tmp_path / "profile.json"
    argv = ["profile", "--model", str(tiny_model_dir("llama")), "--out", str(out),
            "--lengths", "16", "64", "160", "--batches", "1", "3", "8",
            "--contexts", "32", "96", "--decode-steps", "3", "--repeat", "1"]  # fmt: skip
    assert main(argv) == 0
    profile = json.loads(out.read_text())
    prefill = profile["samples"]["prefill"]
    assert {(s["tokens"], s["cached"]) for s in prefill} == {
        (16, 0), (16, 16), (64, 0), (64, 64), (160, 0), (160, 160)
    }  # fmt: skip
    assert all(s["steps"] == 1 and s["ms"] > 0 for s in prefill)
    decode = profile["samples"]["decode"]
    assert {(s["batch"], s["context"]) for s in decode} == {
        (b, c) for b in (1, 3, 8) for c in (32, 96)
    }
    # Fitted costs are never negative (a loaded machine can make a term's best fit 0).
    assert min(profile[k] for k in ("step_ms", "token_ms", "attn_ms")) >= 0
    assert min(profile["decode"].values()) >= 0
    assert profile["kv_bytes_per_token"] > 0 and profile["transfer_gbps"] == 0.0
    # The router simulator reads it as is.
    from bench.sim_profile import WorkerProfile

    assert WorkerProfile.load(out).chunk_tokens == 2048


def test_decode_shapes_whose_prefill_spans_many_steps_are_measured(tiny_model_dir, tmp_path):
    # 8 x 96 prompt tokens at 64 a step: 12 prefill steps, more than the rows' 3 timed steps
    # + 4; the first rows must still be running when the timed steps come. (Three prompt
    # lengths, as above: with two, the per-token and attention terms are nearly collinear and
    # on a noisy machine the fit gave the tokens none of the time, which the profile refuses.)
    from router.cli.main import main

    out = tmp_path / "profile.json"
    argv = ["profile", "--model", str(tiny_model_dir("llama")), "--out", str(out),
            "--lengths", "16", "64", "160", "--batches", "1", "8", "--contexts", "32", "96",
            "--decode-steps", "3", "--repeat", "1", "--chunk-tokens", "64"]  # fmt: skip
    assert main(argv) == 0
    decode = json.loads(out.read_text())["samples"]["decode"]
    assert {(s["batch"], s["context"]) for s in decode} == {
        (b, c) for b in (1, 8) for c in (32, 96)
    }
