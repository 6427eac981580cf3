"""`baton make-tiny-model`: a random-weight checkpoint in real Hugging Face format.

The folder loads unchanged with transformers (`AutoModelForCausalLM`, `AutoTokenizer`) and
with our engine, so parity tests and demos need no download. It holds config.json,
generation_config.json, a byte-level BPE tokenizer trained on `engine/data/corpus.txt`
(tokenizer.json + tokenizer_config.json with a chat template) and model.safetensors, or
shards with model.safetensors.index.json.

Weights are drawn so that greedy decoding is numerically robust (see `draw_weights`).
Everything is deterministic: the same arguments give the same bytes.

    python -m engine.tiny_model /tmp/tiny --arch qwen3 --preset tiny
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import zlib
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {
        "vocab_size": 1024,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
    },
    "small": {  # ~125M parameters
        "vocab_size": 32000,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "intermediate_size": 2048,
        "max_position_embeddings": 4096,
    },
}
# Real checkpoints of each family tie embeddings like this at small sizes.
_DEFAULT_TIE = {"llama": False, "mistral": False, "qwen2": True, "qwen3": True}
_DTYPES = ("float32", "bfloat16", "float16")
_OVERRIDES = (
    *PRESETS["tiny"],
    "tie_word_embeddings",
    "head_dim",
    "rope_theta",
    "rope_scaling",  # "llama3" or None (llama only)
    "sliding_window",
    "shards",
    "force",
)
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
    **overrides: Any,
) -> Path:
    """Writes the model folder and returns its path. See the module docstring."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHITECTURES)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(_DTYPES)}")
    unknown = sorted(set(overrides) - set(_OVERRIDES))
    if unknown:
        raise ValueError(f"unknown override(s) {unknown}; allowed: {', '.join(_OVERRIDES)}")
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
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation)
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    (out / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    # Special tokens other than the two ends are kept out of greedy output (see draw_weights).
    specials = tokenizer.get_added_tokens_decoder()
    quiet = sorted(i for i in specials if i not in (eos, eot))
    weights = draw_weights(config, seed=seed, quiet_token_ids=quiet)
    write_safetensors(out, weights, dtype=dtype, shards=shards)
    return out


def build_config(arch: str, preset: str, dtype: str, **overrides: Any) -> dict[str, Any]:
    """The config.json dict for an arch and preset (written in the transformers 4.x spelling,
    `rope_theta` + `rope_scaling`, which transformers 5 reads too)."""
    size = {**PRESETS[preset], **{k: v for k, v in overrides.items() if k in PRESETS[preset]}}
    hidden, heads = size["hidden_size"], size["num_attention_heads"]
    if hidden % heads or heads % size["num_key_value_heads"]:
        raise ValueError(
            f"num_attention_heads ({heads}) must divide hidden_size ({hidden}) and be a "
            f"multiple of num_key_value_heads ({size['num_key_value_heads']})"
        )
    architecture, model_type = ARCHITECTURES[arch]
    # Qwen3 decouples head_dim from hidden/heads (0.6B: 1024 / 16 heads, head_dim 128).
    head_dim = overrides.get("head_dim") or (2 * hidden // heads if arch == "qwen3" else None)
    tie = overrides.get("tie_word_embeddings")
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        **size,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5 if arch == "llama" else 1e-6,
        "rope_theta": float(overrides.get("rope_theta") or (5e5 if arch == "llama" else 1e6)),
        "tie_word_embeddings": _DEFAULT_TIE[arch] if tie is None else bool(tie),
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": dtype,
    }
    if head_dim is not None:
        config["head_dim"] = int(head_dim)
    window = overrides.get("sliding_window")
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False)
        rope_scaling = overrides.get("rope_scaling", "llama3")
        if rope_scaling == "llama3":
            # Llama 3.1 shape; original context a quarter of the max so scaling matters.
            config["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": size["max_position_embeddings"] // 4,
            }
        elif rope_scaling is not None:
            raise ValueError(f"rope_scaling must be 'llama3' or None, got {rope_scaling!r}")
    elif overrides.get("rope_scaling") is not None:
        raise ValueError("rope_scaling is only offered for arch 'llama'")
    if arch == "mistral":
        config["sliding_window"] = window
    if arch in ("qwen2", "qwen3"):
        # As shipped by Qwen: a window is configured but off unless use_sliding_window.
        layers = size["num_hidden_layers"]
        config.update(
            use_sliding_window=window is not None,
            sliding_window=window if window is not None else size["max_position_embeddings"],
            max_window_layers=layers // 2 if window is not None else layers,
        )
        if arch == "qwen3":
            config["attention_bias"] = False
    elif arch == "llama" and window is not None:
        raise ValueError("sliding_window is offered for mistral, qwen2 and qwen3 only")
    return config


def _prepare_folder(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    existing = [p for p in out.iterdir() if p.name in _WRITTEN or p.suffix == ".safetensors"]
    if existing and not force:
        raise FileExistsError(f"{out} already holds a model ({existing[0].name}); use --force")
    for path in existing:
        path.unlink()  # only files we write: never wipe a folder we didn't fill


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# -- tokenizer ---------------------------------------------------------------------------

SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eot|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|pad|>",
)
# Llama 3 style. `bos_token` comes first so the template matches what the tokenizer adds.
CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if tools %}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nTools you can call:\\n' }}\n"
    "{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}\n"
    "{{- '<|eot|>' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}\n"
    "{{- raise_exception('unknown role: ' ~ message['role']) }}\n"
    "{%- endif %}\n"
    "{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' }}\n"
    "{{- (message['content'] or '') | trim }}{{ '<|eot|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)
CORPUS_PATH = Path(__file__).parent / "data" / "corpus.txt"
# The Qwen2 pre-tokenizer: transformers 5 rebuilds Qwen2 tokenizers with exactly this pipeline
# (NFC, this split, byte-level) whatever tokenizer.json says, so using it for every arch keeps
# our folders' tokenizer.json and transformers in agreement. Digits split one by one.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TOKENIZER_RECIPE = "baton-bpe-v2"  # change when training changes: cached files then miss


def train_tokenizer(vocab_size: int, cache_dir: Path | None = None) -> Tokenizer:
    """A byte-level BPE (Llama 3 / Qwen2 style) with exactly `vocab_size` ids.

    Special tokens take ids 0..5; when the corpus runs out of merges before `vocab_size`,
    the rest is filled with `<|reserved_N|>` special tokens, as Llama 3 does. Training is
    single-threaded-deterministic in `tokenizers` (counts are summed, ties broken by pair),
    and the result is cached in `cache_dir`, keyed by corpus, size and recipe.
    """
    floor = len(SPECIAL_TOKENS) + 256
    if vocab_size < floor:
        raise ValueError(f"vocab_size must be >= {floor} (special tokens + 256 bytes)")
    corpus = CORPUS_PATH.read_bytes()
    key = hashlib.sha256(corpus + f"|{vocab_size}|{_TOKENIZER_RECIPE}".encode()).hexdigest()
    cached = cache_dir / f"bpe-{vocab_size}-{key[:16]}.json" if cache_dir else None
    if cached is not None and cached.is_file():
        return Tokenizer.from_file(str(cached))

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus.decode("utf-8").splitlines(keepends=True), trainer)
    shortfall = vocab_size - tokenizer.get_vocab_size(with_added_tokens=True)
    reserved = [f"<|reserved_{i}|>" for i in range(shortfall)]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in reserved])
    bos = SPECIAL_TOKENS[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B:1",
        special_tokens=[(bos, tokenizer.token_to_id(bos))],
    )
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(tokenizer.to_str(), encoding="utf-8")
    return tokenizer


# -- weights -----------------------------------------------------------------------------

# Scales chosen by measuring greedy decoding with transformers on 20 prompts x 48 tokens per
# arch: unit-RMS embeddings, fan-in scaled projections, and an output head whose logits
# spread with std ~LOGIT_STD, so top-1/top-2 gaps sit far above fp32 noise (median ~0.8,
# 1st percentile ~0.01). A tied head can't be both a unit-RMS input and a wide output: its
# input side then favours repeating the current token (greedy collapsed into one token for
# 17/20 prompts), so tied models get a small embedding and a final norm that restores the
# logit spread (collapse then 1-2/20).
EMBED_STD = 1.0
PROJ_GAIN = 1.0
LOGIT_STD = 4.0
NORM_JITTER = 0.05
BIAS_STD = 0.1
QUIET_ROW_SCALE = 0.01
TIED_EMBED_STD = 0.05


def parameter_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF parameter names and shapes for a config dict, in checkpoint order."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    inter = config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // heads
    is_qwen2 = config["model_type"] == "qwen2"
    qkv_bias = is_qwen2 or config.get("attention_bias", False)
    o_bias = config.get("attention_bias", False) and not is_qwen2
    mlp_bias = config.get("mlp_bias", False)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        for proj, rows in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
            shapes[p + f"self_attn.{proj}_proj.weight"] = (rows * head_dim, hidden)
            if qkv_bias:
                shapes[p + f"self_attn.{proj}_proj.bias"] = (rows * head_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        if o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (hidden,)
        if config["model_type"] == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (head_dim,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        for proj, shape in (
            ("gate", (inter, hidden)),
            ("up", (inter, hidden)),
            ("down", (hidden, inter)),
        ):
            shapes[p + f"mlp.{proj}_proj.weight"] = shape
            if mlp_bias:
                shapes[p + f"mlp.{proj}_proj.bias"] = shape[:1]
    shapes["model.norm.weight"] = (hidden,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def draw_weights(
    config: dict[str, Any], seed: int, quiet_token_ids: list[int] | None = None
) -> dict[str, torch.Tensor]:
    """fp32 random weights. Each tensor has its own generator seeded by (seed, name), so a
    tensor doesn't change when unrelated options (layer count, biases) do.

    `quiet_token_ids` get output rows near zero, so greedy decoding practically never picks
    them (as with the untrained reserved tokens of real Llama 3 checkpoints): reserved
    padding and control tokens would otherwise fill demo output with invisible text.
    """
    hidden = config["hidden_size"]
    tied = config["tie_word_embeddings"]
    weights: dict[str, torch.Tensor] = {}
    for name, shape in parameter_shapes(config).items():
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name == "model.norm.weight" and tied:
            # The tied head is small (see TIED_EMBED_STD): the final norm restores the spread.
            gain = LOGIT_STD / (TIED_EMBED_STD * math.sqrt(hidden))
            weights[name] = gain * (1.0 + NORM_JITTER * noise)
        elif name.endswith("norm.weight"):
            weights[name] = 1.0 + NORM_JITTER * noise
        elif name.endswith(".bias"):
            weights[name] = BIAS_STD * noise
        elif name == "lm_head.weight":
            weights[name] = (LOGIT_STD / math.sqrt(hidden)) * noise
        elif tied and name == "model.embed_tokens.weight":
            weights[name] = TIED_EMBED_STD * noise
        elif name == "model.embed_tokens.weight":
            weights[name] = EMBED_STD * noise
        else:
            weights[name] = (PROJ_GAIN / math.sqrt(shape[1])) * noise
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    if quiet_token_ids:
        weights[head][torch.tensor(quiet_token_ids)] *= QUIET_ROW_SCALE
    return weights


def write_safetensors(
    out: Path, weights: dict[str, torch.Tensor], dtype: str, shards: int = 1
) -> list[Path]:
    """model.safetensors, or `shards` files of about equal size plus the HF index."""
    torch_dtype = getattr(torch, dtype)
    tensors = {name: t.to(torch_dtype).contiguous() for name, t in weights.items()}
    metadata = {"format": "pt"}
    if shards <= 1:
        path = out / "model.safetensors"
        save_file(tensors, str(path), metadata=metadata)
        return [path]
    if shards > len(tensors):
        raise ValueError(f"cannot split {len(tensors)} tensors into {shards} shards")
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    groups: list[dict[str, torch.Tensor]] = [{} for _ in range(shards)]
    done, names = 0, list(tensors)
    for pos, name in enumerate(names):
        # Fill shards in order by cumulative size, leaving at least one tensor per shard.
        shard = min(int(done * shards / total), shards - 1, pos)
        shard = max(shard, shards - (len(names) - pos))
        groups[shard][name] = tensors[name]
        done += tensors[name].numel() * tensors[name].element_size()
    files, weight_map = [], {}
    for k, group in enumerate(groups, start=1):
        path = out / f"model-{k:05d}-of-{shards:05d}.safetensors"
        save_file(group, str(path), metadata=metadata)
        files.append(path)
        weight_map.update({name: path.name for name in group})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    _write_json(out / "model.safetensors.index.json", index)
    return files


def build_arg_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="output folder (created if missing)")
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="llama")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=_DTYPES, default="float32")
    sizes = parser.add_argument_group("sizes (override the preset)")
    sizes.add_argument("--hidden-size", type=int, dest="hidden_size")
    sizes.add_argument("--num-layers", type=int, dest="num_hidden_layers")
    sizes.add_argument("--num-heads", type=int, dest="num_attention_heads")
    sizes.add_argument("--num-kv-heads", type=int, dest="num_key_value_heads")
    sizes.add_argument("--intermediate-size", type=int, dest="intermediate_size")
    sizes.add_argument("--vocab-size", type=int, dest="vocab_size")
    sizes.add_argument("--max-position", type=int, dest="max_position_embeddings")
    sizes.add_argument("--head-dim", type=int, dest="head_dim")
    parser.add_argument(
        "--tie", action=argparse.BooleanOptionalAction, default=None, dest="tie_word_embeddings"
    )
    parser.add_argument("--rope-scaling", choices=["llama3", "none"], default=None)
    parser.add_argument("--sliding-window", type=int, default=None)
    parser.add_argument("--shards", type=int, default=1, help="write N safetensors shards")
    parser.add_argument("--force", action="store_true", help="overwrite an existing model")


def run_from_args(args: argparse.Namespace) -> int:
    names = [
        *PRESETS["tiny"],
        "head_dim",
        "tie_word_embeddings",
        "sliding_window",
        "shards",
        "force",
    ]
    overrides = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    if args.rope_scaling is not None:
        overrides["rope_scaling"] = None if args.rope_scaling == "none" else args.rope_scaling
    try:
        out = make_tiny_model(
            args.dir,
            arch=args.arch,
            preset=args.preset,
            seed=args.seed,
            dtype=args.dtype,
            **overrides,
        )
    except (ValueError, FileExistsError) as exc:
        print(f"make-tiny-model: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tiny_model", description=__doc__)
    build_arg_parser(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
