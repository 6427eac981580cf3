"""`baton make-tiny-model`: a random-weight (or, with --train, trained) checkpoint in real
Hugging Face format.

The folder loads unchanged with transformers (`AutoModelForCausalLM`, `AutoTokenizer`) and
with our engine, so parity tests and demos need no download. It holds config.json,
generation_config.json, a byte-level BPE tokenizer trained on `engine/data/corpus.txt`
(tokenizer.json + tokenizer_config.json with a chat template) and model.safetensors, or
shards with model.safetensors.index.json.

Weights are drawn so that greedy decoding is numerically robust (see `draw_weights`).
Everything is deterministic: the same arguments give the same bytes. `--train` trains the
`trained` preset (or `--preset draft`) on the Python standard library instead (train.py);
`--teacher DIR` distils it from a trained folder (a draft model for speculative decoding).

    python -m engine.tiny_model /tmp/tiny --arch qwen3 --preset tiny
    python -m engine.tiny_model /tmp/trained --train
    python -m engine.tiny_model /tmp/draft --train --preset draft --teacher /tmp/trained
"""

from __future__ import annotations

import argparse
import logging
import sys

from engine.tiny_model.make import make_tiny_model
from engine.tiny_model.presets import ARCHITECTURES, DTYPES, OVERRIDES, PRESETS
from engine.tiny_model.train import DEFAULT_STEPS, train_model

# make_tiny_model's overrides that have a flag of the same name (--rope-scaling maps
# "none" to None, so run_from_args passes it itself; rope_theta has no flag).
_OVERRIDE_ARGS = tuple(n for n in OVERRIDES if n not in ("rope_scaling", "rope_theta"))


def build_arg_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="output folder (created if missing)")
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="llama")
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="default: tiny; trained with --train",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
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
    training = parser.add_argument_group("training (a model that means something)")
    training.add_argument(
        "--train",
        action="store_true",
        help="train on the Python standard library's sources (a few minutes on two cores); "
        "a folder already holding the same recipe is kept",
    )
    training.add_argument("--train-steps", type=int, default=DEFAULT_STEPS)
    training.add_argument(
        "--teacher",
        default=None,
        metavar="DIR",
        help="distil from this trained folder (same tokenizer) instead of training on the "
        "text's next tokens: a draft model for speculative decoding, e.g. --preset draft "
        "--teacher <the trained folder>",
    )


def run_from_args(args: argparse.Namespace) -> int:
    if args.train:
        return _run_training(args)
    if args.teacher is not None:
        print("make-tiny-model: --teacher goes with --train", file=sys.stderr)
        return 2
    overrides = {n: getattr(args, n) for n in _OVERRIDE_ARGS if getattr(args, n, None) is not None}
    if args.rope_scaling is not None:
        overrides["rope_scaling"] = None if args.rope_scaling == "none" else args.rope_scaling
    try:
        out = make_tiny_model(
            args.dir,
            arch=args.arch,
            preset=args.preset or "tiny",
            seed=args.seed,
            dtype=args.dtype,
            **overrides,
        )
    except (ValueError, FileExistsError) as exc:
        print(f"make-tiny-model: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def _run_training(args: argparse.Namespace) -> int:
    sizes = [n for n in _OVERRIDE_ARGS if n not in ("shards", "force")]
    given = [n for n in sizes if getattr(args, n, None) is not None]
    if (
        given
        or args.rope_scaling is not None
        or args.arch != "llama"
        or args.dtype != "float32"
        or args.shards != 1
    ):
        print(
            "make-tiny-model: --train takes only --preset, --seed, --train-steps, --teacher and "
            "--force "
            "(the recipe fixes the rest)",
            file=sys.stderr,
        )
        return 2
    if args.preset not in (None, "trained", "draft"):
        print("make-tiny-model: --train trains --preset trained or draft", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        out = train_model(
            args.dir, args.preset or "trained", args.train_steps, args.seed, args.force,
            args.teacher,
        )  # fmt: skip
    except (ValueError, FileExistsError) as exc:
        print(f"make-tiny-model: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tiny_model", description=__doc__)
    build_arg_parser(parser)
    return run_from_args(parser.parse_args(argv))
