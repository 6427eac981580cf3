"""`baton make-tiny-model --train`: a real HF folder with trained weights, cached by recipe.

Two training steps stand in for the few minutes a real run takes: what is tested is the
recipe (the data split, the folder, the cache), not the model's quality."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.sampling import SamplingParams
from engine.llm import LLM
from engine.tiny_model import train
from engine.tiny_model.cli import main
from tests import oracle


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("trained") / "m"
    assert main([str(out), "--train", "--train-steps", "2", "--preset", "draft"]) == 0
    return str(out)


def test_the_held_out_files_are_never_trained_on() -> None:
    files = train._stdlib_files()
    held = [p for p in files if train._held_out(p)]
    assert 0 < len(held) < len(files) / 5
    assert held[0].read_text(errors="replace")[:200] in train.heldout_text()
    assert held[0].read_text(errors="replace") not in train.training_text()


def test_the_folder_records_its_recipe_and_loss(trained_dir: str) -> None:
    stamp = json.loads((Path(trained_dir) / "training.json").read_text())
    assert stamp["recipe"] == train.RECIPE and stamp["steps"] == 2 and stamp["preset"] == "draft"
    assert stamp["final_loss"] > 0 and stamp["tokens"] > 100_000


def test_the_engine_matches_transformers_on_the_trained_weights(trained_dir: str) -> None:
    llm = LLM(trained_dir, num_kv_blocks=64)
    prompt = llm.tokenizer.encode("def main(argv):\n    return", add_special_tokens=False)
    out = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0))[0]
    assert list(out.token_ids) == oracle.hf_greedy(trained_dir, tuple(prompt), 12)


def test_the_same_recipe_is_kept_and_another_is_refused(trained_dir: str, capsys) -> None:
    weights = Path(trained_dir) / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert main([trained_dir, "--train", "--train-steps", "2", "--preset", "draft"]) == 0
    assert weights.stat().st_mtime_ns == before  # cached: not trained again
    assert main([trained_dir, "--train", "--train-steps", "3", "--preset", "draft"]) == 2
    assert "another recipe" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [["--hidden-size", "64"], ["--arch", "qwen3"], ["--preset", "small"]]
)
def test_training_refuses_what_the_recipe_fixes(tmp_path, capsys, argv: list[str]) -> None:
    assert main([str(tmp_path / "m"), "--train", *argv]) == 2
    assert "--train" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_a_draft_distilled_from_a_teacher_records_the_teachers_recipe(
    trained_dir: str, tmp_path, capsys
) -> None:
    out = tmp_path / "student"
    argv = [str(out), "--train", "--train-steps", "2", "--preset", "draft"]
    assert main([*argv, "--teacher", trained_dir]) == 0
    stamp = json.loads((out / "training.json").read_text())
    assert stamp["teacher"]["preset"] == "draft" and stamp["teacher"]["steps"] == 2
    assert "final_loss" not in stamp["teacher"]  # the recipe, not what it measured
    # Distilled and not: two recipes, so one folder does not pass for the other.
    assert main(argv) == 2 and "another recipe" in capsys.readouterr().err
    # A teacher must be a trained folder; --teacher alone (no --train) is refused.
    assert main([str(tmp_path / "x"), "--train", "--preset", "draft", "--teacher", "/"]) == 2
    assert "not a trained folder" in capsys.readouterr().err
    assert main([str(tmp_path / "y"), "--teacher", trained_dir]) == 2
    assert "--teacher goes with --train" in capsys.readouterr().err
