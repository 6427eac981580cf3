"""Random-weight checkpoints in real Hugging Face format, for tests, demos and benches
(`baton make-tiny-model`, `python -m engine.tiny_model`; what a folder holds: cli.py).

    presets.py   sizes per preset, and the config.json of each architecture family
    bpe.py       the byte-level BPE tokenizer trained on engine/data/corpus.txt, chat template
    weights.py   random weights with HF names and shapes, written as safetensors (shards)
    make.py      make_tiny_model: one folder from config through tokenizer to weights
    cli.py       the command line
"""

from engine.tiny_model.bpe import CHAT_TEMPLATE, SPECIAL_TOKENS, train_tokenizer
from engine.tiny_model.cli import build_arg_parser, main, run_from_args
from engine.tiny_model.make import make_tiny_model
from engine.tiny_model.presets import ARCHITECTURES, PRESETS, build_config
from engine.tiny_model.weights import draw_weights, parameter_shapes, write_safetensors

__all__ = [
    "ARCHITECTURES",
    "CHAT_TEMPLATE",
    "PRESETS",
    "SPECIAL_TOKENS",
    "build_arg_parser",
    "build_config",
    "draw_weights",
    "main",
    "make_tiny_model",
    "parameter_shapes",
    "run_from_args",
    "train_tokenizer",
    "write_safetensors",
]
