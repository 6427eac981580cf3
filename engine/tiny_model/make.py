"""make_tiny_model: one model folder, from its config through tokenizer to weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.tiny_model.bpe import CHAT_TEMPLATE, SPECIAL_TOKENS, train_tokenizer
from engine.tiny_model.presets import build_config, check_choices
from engine.tiny_model.weights import draw_weights, write_json, write_safetensors

# Every file make_tiny_model writes: the only ones it may replace (with force=True).
_WRITTEN = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
)


def make_tiny_model(
    out_dir: str | Path,
    arch: str = "llama",
    preset: str = "tiny",
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
    **overrides: Any,
) -> Path:
    """Writes the model folder and returns its path (weights drawn on `device`). See the
    package docstring."""
    check_choices(arch, preset, dtype, overrides)
    shards = int(overrides.pop("shards", 1) or 1)
    force = bool(overrides.pop("force", False))
    out = Path(out_dir)
    _prepare_folder(out, force)

    config = build_config(arch, preset, dtype, **overrides)
    tokenizer = train_tokenizer(config["vocab_size"], cache_dir=out / ".tokenizer-cache")
    ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    bos, eos, eot, pad = (
        ids[t] for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|eot|>", "<|pad|>")
    )
    config.update(bos_token_id=bos, eos_token_id=[eos, eot], pad_token_id=pad)
    generation = {"bos_token_id": bos, "eos_token_id": [eos, eot], "pad_token_id": pad}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot|>",
        "pad_token": "<|pad|>",
        "unk_token": None,  # byte-level BPE never needs one (and Qwen2Tokenizer would add one)
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", generation)
    write_json(out / "tokenizer_config.json", tokenizer_config)
    (out / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    # Special tokens other than the two ends are kept out of greedy output (see draw_weights).
    specials = tokenizer.get_added_tokens_decoder()
    quiet = sorted(i for i in specials if i not in (eos, eot))
    weights = draw_weights(config, seed=seed, quiet_token_ids=quiet, device=device)
    write_safetensors(out, weights, dtype=dtype, shards=shards)
    return out


def _prepare_folder(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    existing = [p for p in out.iterdir() if p.name in _WRITTEN or p.suffix == ".safetensors"]
    if existing and not force:
        raise FileExistsError(f"{out} already holds a model ({existing[0].name}); use --force")
    for path in existing:
        path.unlink()  # only files we write: never wipe a folder we didn't fill
