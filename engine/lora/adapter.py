"""A PEFT LoRA folder read into per-layer, per-projection (A, B) pairs.

PEFT adds `scaling * B(A(x))` to a target projection's output, `scaling = lora_alpha / r`
(`lora_alpha / sqrt(r)` with rsLoRA). Here `scaling` is folded into B once, at load. The
projections served are the decoder's seven (q, k, v, o, gate, up, down); an adapter that
changes anything else (embeddings, the LM head, `modules_to_save`, biases, DoRA's magnitudes)
is refused with the field that asks for it, since serving it without that part would give
other tokens than PEFT does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from core.errors import InvalidRequestError
from core.lora import LoRARef, digest_of, read_config, weight_file

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


@dataclass(frozen=True)
class LoRAAdapter:
    ref: LoRARef
    rank: int
    """The largest r of its projections."""
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    """(layer, projection) -> (A [r, in], B [out, r] with the scaling folded in)."""


def _refuse(field: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"lora adapter: {field}: {why}")


def _check_config(config: dict) -> float:
    """The adapter's lora_alpha, after refusing what it asks that is not served."""
    if config.get("use_dora"):
        raise _refuse("use_dora", "DoRA adapters are not served")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        raise _refuse("bias", "adapters that train biases are not served")
    if config.get("modules_to_save"):
        raise _refuse("modules_to_save", "adapters that replace whole modules are not served")
    if config.get("fan_in_fan_out"):
        raise _refuse("fan_in_fan_out", "transposed (Conv1D) weights are not served")
    if config.get("alpha_pattern"):
        raise _refuse("alpha_pattern", "per-module alphas are not served")
    targets = config.get("target_modules") or []
    # A string is a regular expression (PEFT's form): the tensors it made are checked instead.
    other = [] if isinstance(targets, str) else sorted(set(targets) - set(TARGETS))
    if other:
        raise _refuse("target_modules", f"{other} are not served (only {', '.join(TARGETS)})")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, int | float) or alpha <= 0:
        raise _refuse("lora_alpha", f"must be a positive number, got {alpha!r}")
    return float(alpha)


def _read_tensors(file: Path) -> dict[str, torch.Tensor]:
    if file.suffix == ".safetensors":
        return load_file(str(file))
    return torch.load(file, map_location="cpu", weights_only=True)


def read_adapter(
    ref: LoRARef, num_layers: int, shapes: dict[str, tuple[int, int]], dtype: torch.dtype
) -> LoRAAdapter:
    """Load `ref`'s folder for a model of `num_layers` layers whose projections have the
    full (unsharded) [out, in] `shapes`. Raises InvalidRequestError naming what is wrong."""
    folder = Path(ref.path)
    if digest_of(folder) != ref.digest:
        raise _refuse("weights", f"{ref.path} changed since it was loaded as {ref.name!r}")
    config = read_config(folder)
    alpha = _check_config(config)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in _read_tensors(weight_file(folder)).items():
        match = _KEY.search(key)
        if match is None or match.group(2) not in TARGETS:
            raise _refuse("weights", f"tensor {key!r} is not a served projection's lora_A/B")
        layer = int(match.group(1))
        if layer >= num_layers:
            raise _refuse("weights", f"tensor {key!r}: the model has {num_layers} layers")
        halves.setdefault((layer, match.group(2)), {})[match.group(3)] = tensor
    if not halves:
        raise _refuse("weights", f"{ref.path} holds no LoRA tensors")
    weights = {}
    for (layer, proj), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            raise _refuse("weights", f"layer {layer} {proj} has lora_{''.join(pair)} only")
        a, b = pair["A"], pair["B"]
        r = a.shape[0]
        out, inp = shapes[proj]
        if a.shape != (r, inp) or b.shape != (out, r):
            raise _refuse(
                "weights",
                f"layer {layer} {proj}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit "
                f"a [{out}, {inp}] projection",
            )
        scaling = alpha / (math.sqrt(r) if config.get("use_rslora") else r)
        weights[(layer, proj)] = (a.to(dtype), (b.float() * scaling).to(dtype))
    rank = max(a.shape[0] for a, _ in weights.values())
    return LoRAAdapter(ref, rank, weights)
