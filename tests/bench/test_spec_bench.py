"""The speculative-decoding benchmark runs end to end and reports every method on every
workload (bench/engine/spec.py), here on the tiny model as its own draft (every greedy draft
right)."""

from __future__ import annotations

import json

from bench.engine import spec


def test_every_method_on_every_workload_with_identical_output(tiny_model_dir, tmp_path) -> None:
    model = str(tiny_model_dir("llama"))
    out = tmp_path / "spec.json"
    argv = ["--model", model, "--draft-model", model, "--samples", "1", "--max-tokens", "6",
            "--repeat", "1", "--threads", "1", "--out", str(out)]  # fmt: skip
    assert spec.main(argv) == 0
    doc = json.loads(out.read_text())
    assert set(doc["workloads"]) == {"editing", "sampled", "completion"}
    for name, result in doc["workloads"].items():
        assert result["identical_to_plain"], name
        assert set(result["methods"]) == {"ngram", "draft"}
    completion = doc["workloads"]["completion"]["methods"]["draft"]
    assert completion["acceptance"] == 1.0 and completion["drafted"] > 0
