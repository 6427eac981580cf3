"""The model group: which checkpoint serves, and the numbers its weights and KV cache are
held in."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from core.config import KV_CACHE_DTYPES, EngineConfig
from core.lora import parse_lora_module
from router.cli.config.knob import default_of, knob

DEFAULT_MAX_LORAS = 8


def parse_lora_modules(value: str) -> tuple[tuple[str, str], ...]:
    """`a=/x,b=/y` -> (("a", "/x"), ("b", "/y"))."""
    try:
        pairs = tuple(parse_lora_module(part) for part in value.split(",") if part.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"--lora-modules: a name appears twice in {value!r}")
    return pairs


@dataclass(frozen=True)
class ModelOptions:
    TITLE: ClassVar[str] = "model"
    ABOUT: ClassVar[str] = "the checkpoint every worker loads, and its numeric formats"

    model: str | None = knob(
        None,
        "local Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json); "
        "the same path on every node",
        default_doc="the tiny demo model, made on first run",
        metavar="DIR",
    )
    dtype: str = knob(
        default_of(EngineConfig, "dtype"),
        "float32, bfloat16, float16 or auto (float32 on CPU, the checkpoint's dtype on GPU)",
        metavar="DTYPE",
    )
    quantization: str | None = knob(
        default_of(EngineConfig, "quantization"),
        "int8: INT8 weight-only linear layers and LM head, quantized on load (a quarter of "
        "fp32's weight bytes per decode step; the embedding stays in --dtype); w8a8: the same "
        "weights, and each GEMM's input rows quantized to int8 on the fly so the products run "
        "on the CPU's int8 units (VNNI / AMX; CPU only)",
        choices=("int8", "w8a8"),
        default_doc="off",
    )
    kv_cache_dtype: str = knob(
        default_of(EngineConfig, "kv_cache_dtype"),
        "int8 or fp8 (e4m3): a quantized KV cache, one scale per token and head (a quarter of "
        "fp32's bytes in the cache and on the wire, plus the scales); auto: --dtype. fp8 on a "
        "GPU needs compute capability 8.9 or newer (Ada, Hopper)",
        choices=tuple(KV_CACHE_DTYPES),
    )
    lora_modules: tuple[tuple[str, str], ...] = knob(
        (),
        "LoRA adapters served beside the model, NAME=DIR pairs separated by commas (PEFT "
        "folders, the same path on every node): `model` in a request picks one; more load at "
        "run time through /v1/load_lora_adapter or the admin API",
        metavar="NAME=DIR[,...]",
        parse=parse_lora_modules,
        default_doc="none",
    )
    max_loras: int = knob(
        default_of(EngineConfig, "max_loras"),
        "LoRA adapters resident in each worker at once (a step runs at most this many; the "
        "least recently used leaves for a new one)",
        minimum=0,
        metavar="N",
        default_doc="as many as --lora-modules names, at most 8; 0 without adapters",
    )
    max_lora_rank: int = knob(
        default_of(EngineConfig, "max_lora_rank"),
        "the largest LoRA rank served (each worker allocates every slot this wide)",
        minimum=1,
        metavar="R",
    )

    def loras(self) -> int:
        """Each worker's adapter slots."""
        return self.max_loras or min(len(self.lora_modules), DEFAULT_MAX_LORAS)
