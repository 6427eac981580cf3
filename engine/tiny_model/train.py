"""A small *trained* Llama for quality measurements (`baton make-tiny-model DIR --train`).

Random weights are fine for token-exactness but say nothing about quantization error or
speculative acceptance. This trains the `trained` preset (or `draft`, a smaller model with
the same tokenizer) on text every machine with Python already has: the standard library's
top-level modules, 9 in 10 of them (by a hash of the file name); the tenth is held out
(`heldout_text`) for perplexity; a quarter of the training rows are a span repeated
(`COPY_EVERY`), so the model learns to copy from its context. A fixed number of AdamW
steps on two cores takes a few minutes; the folder records its recipe in `training.json`,
and a folder that already holds the same recipe is kept as it is (the cache:
`trained_checkpoint` keeps one per recipe under ~/.cache/baton/trained). The output is the
same real Hugging Face folder make_tiny_model writes, with trained weights in place of
random ones.

Why transformers for the training loop: the engine has no backward pass, and the oracle
model is the one the engine must agree with anyway.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

from core import env
from core.cache_dir import cache_dir
from engine.tiny_model.make import make_tiny_model
from engine.tiny_model.weights import parameter_shapes, write_json, write_safetensors

logger = logging.getLogger(__name__)

RECIPE = "baton-train-v2"  # change when the recipe changes: cached models then miss
DEFAULT_STEPS = 300
DRAFT_STEPS = 600
"""Distillation steps of the draft model (a fifth of the trained model's size: each step
costs about the teacher's forward)."""
SEQ_LEN = 256
BATCH = 16
PEAK_LR = 3e-3
WARMUP_STEPS = 20
COPY_EVERY = 4
"""One training row in COPY_EVERY is a span followed by itself: a model this small learns
to copy from its context (induction) only slowly from code alone, and copying is what
prompt-lookup speculation and editing workloads exercise."""
_HELDOUT_ONE_IN = 10
_STAMP = "training.json"
_MEASURED = ("final_loss", "tokens")
"""What training.json records besides the recipe."""


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(root.glob("*.py"))


def _held_out(path: Path) -> bool:
    return int(hashlib.sha1(path.name.encode()).hexdigest(), 16) % _HELDOUT_ONE_IN == 0


def training_text() -> str:
    return "\n".join(p.read_text(errors="replace") for p in _stdlib_files() if not _held_out(p))


def heldout_text() -> str:
    """Text the trained models never saw (stdlib modules held out of training)."""
    return "\n".join(p.read_text(errors="replace") for p in _stdlib_files() if _held_out(p))


def recipe(preset: str, steps: int, seed: int, teacher: str | Path | None = None) -> dict[str, Any]:
    files = [p.name for p in _stdlib_files() if not _held_out(p)]
    corpus = hashlib.sha256("\n".join(files).encode()).hexdigest()[:16]
    distilled = {} if teacher is None else {"teacher": _teacher_recipe(teacher)}
    return {
        **distilled,
        "recipe": RECIPE,
        "preset": preset,
        "steps": steps,
        "seed": seed,
        "seq_len": SEQ_LEN,
        "batch": BATCH,
        "peak_lr": PEAK_LR,
        "copy_every": COPY_EVERY,
        "python": sys.version.split()[0],
        "corpus_files": len(files),
        "corpus_names": corpus,
    }


def _stamped_recipe(folder: str | Path) -> dict[str, Any] | None:
    """The recipe a trained folder records (its training.json less the measured fields);
    None if it records none."""
    stamp = Path(folder) / _STAMP
    if not stamp.is_file():
        return None
    have = json.loads(stamp.read_text(encoding="utf-8"))
    return {k: v for k, v in have.items() if k not in _MEASURED}


def _teacher_recipe(teacher: str | Path) -> dict[str, Any]:
    """A student of another teacher is another recipe."""
    found = _stamped_recipe(teacher)
    if found is None:
        raise ValueError(f"teacher {teacher} is not a trained folder (no {_STAMP})")
    return found


def _lr(step: int, steps: int) -> float:
    if step < WARMUP_STEPS:
        return PEAK_LR * (step + 1) / WARMUP_STEPS
    done = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return PEAK_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def train_model(
    out_dir: str | Path,
    preset: str = "trained",
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    force: bool = False,
    teacher: str | Path | None = None,
) -> Path:
    """Writes (or keeps, when it already holds this recipe) a trained model folder. With a
    `teacher` (a trained folder with the same tokenizer), the model is distilled: trained to
    match the teacher's next-token distributions (KL) instead of the text's next tokens, so a
    draft model's argmax agrees with its target's more often (DistillSpec, Zhou et al. 2023)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    out = Path(out_dir)
    wanted = recipe(preset, steps, seed, teacher)
    stamp = out / _STAMP
    if stamp.is_file() and not force:
        if _stamped_recipe(out) == wanted:
            return out
        raise FileExistsError(f"{out} holds a model trained with another recipe; use --force")
    # The random-weight folder gives config, tokenizer and the file layout; weights follow.
    make_tiny_model(out, arch="llama", preset=preset, seed=seed, force=force)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(out)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # std-0.02 init
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor(tokenizer(training_text(), add_special_tokens=False)["input_ids"])
    teacher_model = None
    if teacher is not None:
        teacher_model = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32).eval()
        if teacher_model.config.vocab_size != config.vocab_size:
            raise ValueError(f"teacher {teacher} has another vocabulary than --preset {preset}")
    loss = _train(model, ids, steps, seed, teacher_model)
    names = parameter_shapes(json.loads((out / "config.json").read_text(encoding="utf-8")))
    state = model.state_dict()
    write_safetensors(out, {n: state[n].detach() for n in names}, dtype="float32")
    write_json(stamp, {**wanted, "final_loss": round(loss, 4), "tokens": int(ids.numel())})
    return out


def _train(
    model: torch.nn.Module,
    ids: torch.Tensor,
    steps: int,
    seed: int,
    teacher: torch.nn.Module | None = None,
) -> float:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.01)
    model.train()
    start, smooth = time.monotonic(), float("nan")
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps)
        starts = torch.randint(0, ids.numel() - SEQ_LEN - 1, (BATCH,), generator=gen)
        batch = torch.stack([_row(ids, s, r) for r, s in enumerate(starts.tolist())])
        if teacher is None:
            loss = model(input_ids=batch, labels=batch).loss
        else:
            with torch.no_grad():
                target = torch.log_softmax(teacher(input_ids=batch).logits.flatten(0, 1), -1)
            guess = torch.log_softmax(model(input_ids=batch).logits.flatten(0, 1), -1)
            loss = torch.nn.functional.kl_div(guess, target, log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        smooth = value if math.isnan(smooth) else 0.9 * smooth + 0.1 * value
        if step % 25 == 0 or step == steps - 1:
            elapsed = time.monotonic() - start
            logger.info("train step %d/%d loss %.3f (%.0f s)", step + 1, steps, smooth, elapsed)
    model.eval()
    return smooth


def _row(ids: torch.Tensor, start: int, index: int) -> torch.Tensor:
    if index % COPY_EVERY:
        return ids[start : start + SEQ_LEN]
    half = ids[start : start + SEQ_LEN // 2]
    return torch.cat([half, half])


def cache_root() -> Path:
    return Path(env.TRAINED_CACHE.get() or cache_dir("trained"))


def trained_checkpoint(
    preset: str = "trained",
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    teacher: str | Path | None = None,
) -> Path:
    """The cached trained model of this recipe, trained first if missing (minutes)."""
    wanted = recipe(preset, steps, seed, teacher)
    key = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode())
    path = cache_root() / f"{preset}-{key.hexdigest()[:12]}"
    if (path / _STAMP).is_file():
        return path
    # Train into a private folder and rename: a reader never sees a half-written model.
    scratch = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        train_model(scratch, preset=preset, steps=steps, seed=seed, teacher=teacher)
        try:
            scratch.rename(path)
        except OSError:  # another process finished first: keep theirs
            if not (path / _STAMP).is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return path


def draft_checkpoint(steps: int = DRAFT_STEPS) -> Path:
    """The `draft` preset distilled from the default trained checkpoint (both cached): the
    draft model of bench/engine/spec.py."""
    return trained_checkpoint("draft", steps, teacher=trained_checkpoint())
