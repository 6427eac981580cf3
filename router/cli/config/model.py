"""The model group: which checkpoint serves, and the numbers its weights and KV cache are
held in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from core.config import KV_CACHE_DTYPES, EngineConfig
from router.cli.config.knob import default_of, knob


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
        "fp32's bytes in the cache and on the wire, plus the scales); auto: --dtype",
        choices=tuple(KV_CACHE_DTYPES),
    )
