"""The model configuration the engine runs on, read from a Hugging Face `config.json`.

`ModelConfig.from_dir` accepts what transformers 4.x and 5.x write: rope settings either as
`rope_theta` + `rope_scaling` (4.x) or as one `rope_parameters` dict (5.x), and the dtype as
`dtype` (5.x) or `torch_dtype` (4.x). Precedence follows transformers 5.23
(`RotaryEmbeddingConfigMixin.convert_rope_params_to_dict`): a `rope_scaling` dict wins over
`rope_parameters`, and `rope_theta` inside the dict wins over a top-level `rope_theta`.
Everything the engine cannot run faithfully is rejected here, with the file and field named,
rather than producing silently different outputs later.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.json_files import read_json_object, read_optional_json_object

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
# Rope types whose frequencies the engine computes; the required fields mirror transformers'
# `_validate_<type>_rope_parameters` (after `original_max_position_embeddings` is defaulted).
_ROPE_REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "llama3": (
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ),
}
_DEFAULT_ROPE_THETA = 10_000.0
_DEFAULT_EPS = 1e-6


class ModelConfigError(ValueError):
    """A model folder's config is missing, malformed or describes something we don't run."""


@dataclass(frozen=True)
class ModelConfig:
    model_dir: str
    model_id: str  # "<dir basename>-<first 16 hex of sha256(config.json bytes)>"
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # None for plain rope, else has "rope_type"
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias
    qk_norm: bool  # Qwen3: per-head RMSNorm on q and k before rope
    sliding_window: int | None  # window of the layers marked "sliding_attention"
    hidden_act: str
    dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # Beyond the q/k/v bias: Llama and Qwen3 put `attention_bias` on o_proj too, Qwen2 doesn't.
    o_proj_bias: bool = False
    mlp_bias: bool = False  # Llama's `mlp_bias`: gate/up/down carry a bias
    # One entry per layer, "full_attention" or "sliding_attention" (Qwen2/3 slide only the
    # layers from `max_window_layers` on; Mistral slides all of them when a window is set).
    layer_types: tuple[str, ...] = ()
    quantization: str | None = None
    """"int8": the checkpoint holds INT8 weights (engine/int8_checkpoint.py), None: float."""

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        folder = Path(model_dir)
        path = folder / "config.json"
        if not folder.is_dir():
            raise ModelConfigError(f"model folder {folder} does not exist or is not a folder")
        if not path.is_file():
            raise ModelConfigError(f"{path}: missing (not a Hugging Face model folder?)")
        raw_bytes = path.read_bytes()  # read once: parsed, and hashed into the model id
        raw = read_json_object(path, ModelConfigError, raw_bytes)
        generation = read_optional_json_object(folder / "generation_config.json", ModelConfigError)
        model_id = f"{folder.resolve().name}-{hashlib.sha256(raw_bytes).hexdigest()[:16]}"
        return _parse(raw, generation, str(folder), model_id, path)


class _Fields:
    """Typed access to config.json fields with errors that name the file and the field."""

    def __init__(self, raw: dict[str, Any], path: Path) -> None:
        self.raw = raw
        self.path = path

    def fail(self, field: str, problem: str) -> ModelConfigError:
        return ModelConfigError(f"{self.path}: field '{field}' {problem}")

    def int(self, field: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.raw.get(field)
        if value is None:
            if default is None:
                raise self.fail(field, "is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(field, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.fail(field, f"must be >= {minimum}, got {value}")
        return value

    def float(self, field: str, default: float) -> float:
        value = self.raw.get(field)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(field, f"must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise self.fail(field, f"must be a positive finite number, got {value!r}")
        return float(value)

    def bool(self, field: str, default: bool) -> bool:
        value = self.raw.get(field)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(field, f"must be true or false, got {value!r}")
        return value


def _parse(
    raw: dict[str, Any], generation: dict[str, Any], model_dir: str, model_id: str, path: Path
) -> ModelConfig:
    f = _Fields(raw, path)
    architectures = raw.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise f.fail("architectures", f"must be a non-empty list, got {architectures!r}")
    architecture = architectures[0]
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise f.fail(
            "architectures",
            f"names {architecture!r}, which is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})",
        )
    is_qwen2 = architecture == "Qwen2ForCausalLM"
    is_qwen3 = architecture == "Qwen3ForCausalLM"

    hidden_size = f.int("hidden_size")
    num_heads = f.int("num_attention_heads")
    num_layers = f.int("num_hidden_layers")
    num_kv_heads = f.int("num_key_value_heads", default=num_heads)
    if num_heads % num_kv_heads != 0:
        raise f.fail(
            "num_key_value_heads",
            f"({num_kv_heads}) must divide num_attention_heads ({num_heads})",
        )
    if "head_dim" in raw and raw["head_dim"] is not None:
        head_dim = f.int("head_dim")
    elif hidden_size % num_heads != 0:
        raise f.fail(
            "num_attention_heads",
            f"({num_heads}) must divide hidden_size ({hidden_size}) when head_dim is not given",
        )
    else:
        head_dim = hidden_size // num_heads
    if head_dim % 2 != 0:
        raise f.fail("head_dim", f"must be even for rotary embeddings, got {head_dim}")

    hidden_act = raw.get("hidden_act", "silu")
    if hidden_act not in ("silu", "swish"):
        raise f.fail("hidden_act", f"must be 'silu', got {hidden_act!r}")
    max_positions = f.int("max_position_embeddings")
    rope_theta, rope_scaling = _parse_rope(f, max_positions)
    sliding_window, layer_types = _parse_sliding_window(f, architecture, num_layers)

    attention_bias = True if is_qwen2 else f.bool("attention_bias", False)
    mlp_bias = f.bool("mlp_bias", False) if architecture == "LlamaForCausalLM" else False
    gen_path = path.parent / "generation_config.json"
    bos_token_id = _optional_token_id(raw, "bos_token_id", path)
    if bos_token_id is None:
        bos_token_id = _optional_token_id(generation, "bos_token_id", gen_path)
    eos_token_ids = _token_ids(raw.get("eos_token_id"), "eos_token_id", path)
    gen_eos = _token_ids(generation.get("eos_token_id"), "eos_token_id", gen_path)
    eos_token_ids = tuple(dict.fromkeys(eos_token_ids + gen_eos))  # ordered union

    return ModelConfig(
        model_dir=model_dir,
        model_id=model_id,
        architecture=architecture,
        model_type=str(raw.get("model_type", "")),
        vocab_size=f.int("vocab_size"),
        hidden_size=hidden_size,
        intermediate_size=f.int("intermediate_size"),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=f.float("rms_norm_eps", _DEFAULT_EPS),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=max_positions,
        tie_word_embeddings=f.bool("tie_word_embeddings", False),
        attention_bias=attention_bias,
        qk_norm=is_qwen3,
        sliding_window=sliding_window,
        hidden_act="silu",
        dtype=_parse_dtype(f),
        bos_token_id=bos_token_id,
        eos_token_ids=eos_token_ids,
        o_proj_bias=attention_bias and not is_qwen2,
        mlp_bias=mlp_bias,
        layer_types=layer_types,
        quantization=_parse_quantization(f),
    )


def _parse_quantization(f: _Fields) -> str | None:
    """None for a float checkpoint, "int8" for one `baton quantize` wrote; others refused."""
    qc = f.raw.get("quantization_config")
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method != "baton-int8":
        raise f.fail(
            "quantization_config",
            f"names quant_method {method!r}; only float checkpoints and baton-int8 ones "
            "(`baton quantize`) load",
        )
    if f.bool("tie_word_embeddings", False):
        raise f.fail("tie_word_embeddings", "must be false in an INT8 checkpoint (its own head)")
    return "int8"


def _parse_rope(f: _Fields, max_positions: int) -> tuple[float, dict[str, Any] | None]:
    """Returns (rope_theta, normalized scaling dict or None for plain rope)."""
    field = "rope_scaling" if f.raw.get("rope_scaling") else "rope_parameters"
    params = f.raw.get(field) or {}
    if not isinstance(params, dict):
        raise f.fail(field, f"must be an object, got {params!r}")
    if any(isinstance(v, dict) for v in params.values()):
        raise f.fail(field, "is nested per layer type, which is not supported")
    theta = params.get("rope_theta", f.raw.get("rope_theta"))
    if theta is None:
        theta = _DEFAULT_ROPE_THETA
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise f.fail(f"{field}.rope_theta", f"must be a positive number, got {theta!r}")
    partial = params.get("partial_rotary_factor", f.raw.get("partial_rotary_factor", 1.0))
    if partial not in (1, 1.0, None):
        raise f.fail("partial_rotary_factor", f"must be 1.0 (no partial rope), got {partial}")

    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type not in _ROPE_REQUIRED_FIELDS:
        raise f.fail(
            f"{field}.rope_type",
            f"is {rope_type!r}, which is not supported "
            f"(supported: default, {', '.join(_ROPE_REQUIRED_FIELDS)})",
        )
    scaling = {k: v for k, v in params.items() if k not in ("type", "rope_theta")}
    scaling["rope_type"] = rope_type
    if rope_type in ("llama3", "yarn"):
        # transformers prefers a top-level original_max_position_embeddings (Phi3 style),
        # then the dict's own value, then max_position_embeddings.
        top_level = f.raw.get("original_max_position_embeddings")
        if top_level is not None:
            scaling["original_max_position_embeddings"] = top_level
        scaling.setdefault("original_max_position_embeddings", max_positions)
    for name in _ROPE_REQUIRED_FIELDS[rope_type]:
        value = scaling.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            problem = f"is required for rope_type {rope_type!r}, got {value!r}"
            raise f.fail(f"{field}.{name}", problem)
    if scaling["factor"] < 1.0 and rope_type != "linear":
        raise f.fail(f"{field}.factor", f"must be >= 1, got {scaling['factor']}")
    if rope_type == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise f.fail(f"{field}.high_freq_factor", "must be greater than low_freq_factor")
    return float(theta), scaling


def _parse_sliding_window(
    f: _Fields, architecture: str, num_layers: int
) -> tuple[int | None, tuple[str, ...]]:
    window = f.raw.get("sliding_window")
    if window is not None:
        window = f.int("sliding_window")
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        # Qwen only slides when use_sliding_window is set, and then only the layers at or
        # above max_window_layers (transformers' Qwen2Config.__post_init__).
        if not f.bool("use_sliding_window", False):
            window = None
        explicit = f.raw.get("layer_types")
        if explicit is not None:
            if not isinstance(explicit, list) or len(explicit) != num_layers:
                raise f.fail("layer_types", f"must be a list of {num_layers} entries")
            bad = set(explicit) - {"full_attention", "sliding_attention"}
            if bad:
                raise f.fail("layer_types", f"has unsupported entries {sorted(bad)}")
            layer_types = tuple(explicit)
        else:
            first_sliding = f.int("max_window_layers", default=28, minimum=0)
            slides = [window is not None and i >= first_sliding for i in range(num_layers)]
            layer_types = tuple("sliding_attention" if s else "full_attention" for s in slides)
        if window is None and "sliding_attention" in layer_types:
            raise f.fail("layer_types", "marks sliding layers but no sliding_window is active")
        if "sliding_attention" not in layer_types:
            window = None
        return window, layer_types
    kind = "sliding_attention" if window is not None else "full_attention"
    return window, (kind,) * num_layers


def _parse_dtype(f: _Fields) -> str:
    field = "dtype" if f.raw.get("dtype") is not None else "torch_dtype"
    value = f.raw.get(field)
    if value is None:
        return "float32"  # what transformers loads when the config names no dtype
    if value not in SUPPORTED_DTYPES:
        raise f.fail(field, f"must be one of {', '.join(SUPPORTED_DTYPES)}, got {value!r}")
    return str(value)


def _optional_token_id(raw: dict[str, Any], field: str, where: Path) -> int | None:
    value = raw.get(field)
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelConfigError(f"{where}: field '{field}' must be a token id, got {value!r}")
    return value


def _token_ids(value: Any, field: str, where: Path) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ModelConfigError(
                f"{where}: field '{field}' must be a token id or a list of them, got {value!r}"
            )
    return tuple(values)
