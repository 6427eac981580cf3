"""INT8 checkpoints: write one (`baton quantize`), and load one at the int8 model's size.

Quantizing on load (`--quantization int8`) reads the float checkpoint into float weights
first, so loading peaks at the float model's size. A checkpoint written here holds the
quantized weights themselves, in Hugging Face format, with config.json carrying

    "quantization_config": {"quant_method": "baton-int8", "bits": 8,
                            "scheme": "per-channel-symmetric"}

and, for each quantized layer X (every `model.layers.*_proj` and `lm_head`: the layers that
`--quantization int8` quantizes), in the scheme of engine/layers/quant.py:

    X.weight        int8 [out, in]    round(W / scale)
    X.weight_scale  float32 [out]     max_k |W[n, k]| / 127

Everything else is copied as it is (embedding, norms, biases). A tied head is untied: the
head gets its own int8 tensors and `tie_word_embeddings` becomes false, as the engine does
when it quantizes a tied head on load. Each source shard becomes one output shard, so
writing holds one shard at a time.

Loading (`prepare_int8_weights`, before the weights are read): each quantizable layer's
float weight is replaced by a zeroed int8 one and a float32 scale parameter, both with the
float weight's loader: the scales, one per output row, are cut like the rows (column-
parallel, merged, QKV layers and the head), and a row-parallel layer, which splits its
input columns, keeps all of them. Its TP ranks then use scales over the whole input row,
as TP 1 does (quantizing on load computes them over each rank's slice).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.checkpoint import INDEX_FILE, list_weight_files
from engine.layers.quant import quantizable, quantize_weight

QUANT_METHOD = "baton-int8"
QUANTIZATION_CONFIG = {"quant_method": QUANT_METHOD, "bits": 8, "scheme": "per-channel-symmetric"}


def is_quantized_layer(weight_name: str) -> bool:
    """The checkpoint weights `--quantization int8` turns into int8 (HF names)."""
    return weight_name == "lm_head.weight" or (
        weight_name.startswith("model.layers.") and weight_name.endswith("_proj.weight")
    )


def write_int8_checkpoint(src: str | Path, dst: str | Path) -> Path:
    """Write `src` (a float HF checkpoint folder) quantized to `dst` (created; must not
    exist or be empty). Returns `dst`."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    if config.get("quantization_config"):
        raise ValueError(f"{src} is already quantized ({config['quantization_config']})")
    files = list_weight_files(src)
    if dst.exists() and any(dst.iterdir()):
        raise FileExistsError(f"{dst} exists and is not empty")
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != INDEX_FILE:
            shutil.copy(path, dst / path.name)
    tied = bool(config.get("tie_word_embeddings"))
    config["tie_word_embeddings"] = False
    config["quantization_config"] = QUANTIZATION_CONFIG
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    weight_map: dict[str, str] = {}
    for path in files:
        tensors = load_file(str(path))
        if tied and "model.embed_tokens.weight" in tensors:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        out: dict[str, torch.Tensor] = {}
        for name, tensor in tensors.items():
            if is_quantized_layer(name):
                wq, scale = quantize_weight(tensor)
                out[name], out[f"{name}_scale"] = wq, scale
            else:
                out[name] = tensor.contiguous()
        save_file(out, str(dst / path.name), metadata={"format": "pt"})
        weight_map.update((name, path.name) for name in out)
        del tensors, out
    if len(files) > 1:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (dst / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return dst


def prepare_int8_weights(model: nn.Module, method: str) -> int:
    """Give every quantizable layer int8 storage and a scale to load into (the module
    docstring); returns how many. `method`: int8 or w8a8 (engine/layers/quant.py)."""
    from engine.layers.linear import RowParallelLinear, default_weight_loader

    layers = quantizable(model, method)
    for module in layers:
        weight = module.weight
        loader = getattr(weight, "weight_loader", default_weight_loader)
        wq = nn.Parameter(torch.zeros(weight.shape, dtype=torch.int8, device=weight.device), False)
        scale = nn.Parameter(torch.zeros(weight.shape[0], device=weight.device), False)
        wq.weight_loader = loader  # type: ignore[attr-defined]
        row_parallel = isinstance(module, RowParallelLinear)
        scale.weight_loader = default_weight_loader if row_parallel else loader  # type: ignore[attr-defined]
        module.weight = wq
        del module._buffers["weight_scale"]
        module.weight_scale = scale
    return len(layers)


def run_from_args(args: Any) -> int:
    """`baton quantize SRC DST`."""
    import sys

    try:
        out = write_int8_checkpoint(args.src, args.dst)
    except (OSError, ValueError) as exc:
        print(f"quantize: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0
