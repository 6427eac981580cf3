"""`baton profile`'s measurements and fits (planner/measure.py, planner/profile.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from core.perf.fit import Sample
from planner import measure as pp


def test_a_prefill_fit_without_a_per_token_cost_is_measured_again(monkeypatch) -> None:
    # Noise: the longer prompts measured no slower.
    flat = [Sample((1, n, 0), 0.003 - n * 1e-7) for n in (16, 64, 160)]
    grows = [Sample((1, n, 0), 0.001 + n * 1e-5) for n in (16, 64, 160)]
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
    assert profile["kv_bytes_per_token"] > 0
    # The KV transfer, measured over shm between two processes with the model's blocks.
    assert profile["transfer_gbps"] > 0 and profile["transfer_latency_ms"] >= 0
    assert profile["transfer_source"].startswith("measured over shm on ")
    assert profile["transfer_block_bytes"] == 16 * profile["kv_bytes_per_token"]
    transfer = profile["samples"]["transfer"]
    assert {1, 4, 16, 64, 256} <= {s["blocks"] for s in transfer}
    assert all(s["ms"] > 0 and s["bytes"] == s["blocks"] * 16 * profile["kv_bytes_per_token"]
               for s in transfer)  # fmt: skip
    # The router simulator reads it as is.
    from core.perf import WorkerProfile

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


def _measured(*args, **kwargs):  # type: ignore[no-untyped-def]
    from core.perf.fit import Sample
    from planner.transfer import TransferProfile

    _measured.calls.append(args)
    return TransferProfile("shm", "h", 1024, [Sample((1024,), 1e-3)], 0.2, 5.0, 0.01)


@pytest.mark.parametrize(
    ("flags", "measures", "gbps", "latency", "source"),
    [
        ([], True, 5.0, 0.2, "measured over shm on h"),
        (
            ["--transfer-gbps", "12.5"],
            True,
            12.5,
            0.2,
            "measured over shm on h; transfer_gbps given",
        ),
        (["--transfer-gbps", "12.5", "--transfer-latency-ms", "0.05"], False, 12.5, 0.05, "given"),
        (["--no-measure-transfer"], False, 0.0, 0.0, "not measured"),
    ],
)
def test_given_transfer_figures_override_the_measured_ones(
    monkeypatch, flags, measures, gbps, latency, source
) -> None:
    import argparse

    from core.kv_layout import KVLayout
    from planner import profile as baton_profile

    _measured.calls = []
    monkeypatch.setattr(baton_profile, "measure_transfer", _measured)
    parser = argparse.ArgumentParser()
    baton_profile.add_profile_arguments(parser)
    args = parser.parse_args(["--model", "m", "--out", "o", *flags])
    layout = KVLayout(num_layers=2, num_blocks=8, block_size=16, num_kv_heads=2, head_dim=8)
    fields, samples = baton_profile.transfer_fields(args, layout, "m", "cpu")
    assert bool(_measured.calls) == measures
    if measures:
        assert _measured.calls[0][2] == "shm"  # a CPU engine: its workers share a host
        assert samples == [{"blocks": 1, "bytes": 1024, "ms": 1.0}]
    assert (fields["transfer_gbps"], fields["transfer_latency_ms"]) == (gbps, latency)
    assert fields["transfer_source"].startswith(source)


def test_a_transfer_that_cannot_be_measured_leaves_the_profile_standing(monkeypatch) -> None:
    import argparse

    from core.kv_layout import KVLayout
    from planner import profile as baton_profile

    def fails(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("transfer side 1 exited")

    monkeypatch.setattr(baton_profile, "measure_transfer", fails)
    parser = argparse.ArgumentParser()
    baton_profile.add_profile_arguments(parser)
    args = parser.parse_args(["--model", "m", "--out", "o", "--transfer-gbps", "3"])
    layout = KVLayout(num_layers=2, num_blocks=8, block_size=16, num_kv_heads=2, head_dim=8)
    fields, samples = baton_profile.transfer_fields(args, layout, "m", "cpu")
    assert samples == [] and fields["transfer_gbps"] == 3 and fields["transfer_latency_ms"] == 0
    assert fields["transfer_source"].startswith("not measured (transfer side 1 exited)")


def test_baton_profile_measures_each_tp_size_on_its_own_engine(
    tiny_model_dir, tmp_path, monkeypatch, capsys
) -> None:
    # TP 2 is a real tensor-parallel engine: two rank processes over gloo, each holding one
    # of the model's two KV heads (the spy reads rank 0's layout as the profile does). A wide
    # MLP gives each prompt token a cost that stands out from the collectives' noise (every
    # layer's all-reduce over loopback is about as slow as the rest of a tiny model's step).
    from engine.tp import TPEngine
    from router.cli.main import main

    rank_layouts = []
    kv_layout = TPEngine.kv_layout

    def spy(self):  # type: ignore[no-untyped-def]
        rank_layouts.append(kv_layout(self))
        return rank_layouts[-1]

    monkeypatch.setattr(TPEngine, "kv_layout", spy)
    out = tmp_path / "p.json"
    model = tiny_model_dir("llama", intermediate_size=2048)
    argv = ["profile", "--model", str(model), "--out", str(out), "--tp", "1", "2",
            "--lengths", "16", "128", "512", "--batches", "1", "4", "--contexts", "32", "96",
            "--decode-steps", "3", "--repeat", "1", "--no-measure-transfer"]  # fmt: skip
    assert main(argv) == 0
    paths = {tp: tmp_path / f"p_tp{tp}.json" for tp in (1, 2)}
    assert not out.exists() and f"profiles: {paths[1]} {paths[2]}" in capsys.readouterr().out
    profiles = {tp: json.loads(path.read_text()) for tp, path in paths.items()}
    assert [(r.tp_size, r.num_kv_heads) for r in rank_layouts] == [(2, 1)]
    for tp, profile in profiles.items():
        assert profile["tp"] == tp
        assert profile["token_ms"] > 0 and min(profile["step_ms"], profile["attn_ms"]) >= 0
        assert profile["decode"]["decode_step_ms"] > 0 and min(profile["decode"].values()) >= 0
        # The same shapes at every size.
        assert {(s["batch"], s["context"]) for s in profile["samples"]["decode"]} == {
            (b, c) for b in (1, 4) for c in (32, 96)
        }
        # 3 lengths, each without and with a cached prefix, a round; a fit that the noise
        # left without a cost per token takes another round (planner.measure.profile_prefill)
        rounds, partial = divmod(len(profile["samples"]["prefill"]), 6)
        assert rounds >= 1 and partial == 0
    assert "tp 2, 2 rank processes over gloo" in profiles[2]["source"]
    # The worker's KV per token is every rank's heads: the same at either size.
    assert profiles[2]["kv_bytes_per_token"] == profiles[1]["kv_bytes_per_token"]


@pytest.mark.parametrize("flag", ["--lengths", "--batches", "--contexts"])
def test_shapes_that_cannot_be_fitted_are_refused_before_measuring(capsys, flag) -> None:
    # One context cannot separate the decode step's cost per row from its cost per context
    # token (nor one batch size per step from per row, nor one length per token from the
    # attention): refused naming the flag, before the model (missing here) is loaded.
    from router.cli.main import main

    argv = ["profile", "--model", "/nonexistent", "--out", "p.json", flag, "128", "128"]
    assert main(argv) == 2
    assert f"{flag} needs at least two different values" in capsys.readouterr().err


def test_several_tp_sizes_write_one_profile_each_beside_out() -> None:
    from planner.profile import out_paths

    assert out_paths("runs/p.json", [4]) == {4: Path("runs/p.json")}
    assert out_paths("runs/p.json", [1, 2]) == {
        1: Path("runs/p_tp1.json"), 2: Path("runs/p_tp2.json")
    }  # fmt: skip
    assert out_paths("p", [1, 2])[2] == Path("p_tp2.json")
