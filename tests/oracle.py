"""The correctness oracle: Hugging Face `transformers` greedy generation on the same weights,
one prompt at a time (no padding, so the reference is exact)."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _hf_model(model_dir: str, device: str = "cpu", int8_activations: bool = False) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if int8_activations:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and (
                name == "lm_head" or name.endswith("_proj")
            ):
                module.register_forward_pre_hook(_fake_quantize_input)
    return model.to(device).eval()


def _fake_quantize_input(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A linear layer's input rows as W8A8 sees them: quantized per row, symmetric, and
    back to float (the arithmetic of engine/layers/quant.py's `quantize_activations`)."""
    import torch

    (x,) = args
    rows = x.reshape(-1, x.shape[-1]).float()
    sx = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127.0)
    return (torch.round(rows / sx).clamp_(-127, 127).mul_(sx).reshape(x.shape),)


@cache
def hf_greedy(
    model_dir: str,
    prompt: tuple[int, ...],
    max_tokens: int,
    device: str = "cpu",
    int8_activations: bool = False,
    ignore_eos: bool = False,
) -> list[int]:
    """`int8_activations`: every linear layer's input quantized per row first (the oracle of
    `quantization="w8a8"`, on a checkpoint from `write_fake_quantized`). `ignore_eos`: all
    `max_tokens`, an end-of-sequence token among them (SamplingParams' `ignore_eos`)."""
    import torch

    model = _hf_model(model_dir, device, int8_activations)
    ids = torch.tensor([prompt], device=device)
    until = {"eos_token_id": None} if ignore_eos else {}
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            **until,
        )
    return out[0, len(prompt) :].tolist()


@cache
def hf_prompt_logprobs(model_dir: str, prompt: tuple[int, ...]) -> Any:
    """[len(prompt) - 1, vocab]: row i is the log-softmax that predicts prompt[i + 1]."""
    import torch

    with torch.no_grad():
        logits = _hf_model(model_dir)(torch.tensor([prompt])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def write_fake_quantized(model_dir: str, out_dir: str) -> str:
    """A copy of the checkpoint whose linear layers their INT8-quantized values in float
    and LM head hold their INT8-quantized values in float (W := wq * scale, the scheme of
    engine/layers/quant.py): transformers on it is the oracle of the engine's
    `quantization="int8"`. A tied head gets its own copy; embedding and norms are unchanged."""
    import json
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    from engine.layers.quant import quantize_weight

    src, dst = Path(model_dir), Path(out_dir)
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy(path, dst / path.name)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    tied = bool(config.get("tie_word_embeddings"))
    if tied:  # untie in the copy: the head's int8 values differ from the embedding's rows
        config["tie_word_embeddings"] = False
        (dst / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert not (src / "model.safetensors.index.json").exists(), "one-file checkpoints only"
    for path in src.glob("*.safetensors"):
        tensors = load_file(str(path))
        if tied:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
        for name, t in tensors.items():
            if name == "lm_head.weight" or (
                name.startswith("model.layers.") and name.endswith("_proj.weight")
            ):
                wq, scale = quantize_weight(t)
                tensors[name] = (wq.float() * scale[:, None]).to(t.dtype)
        save_file(tensors, str(dst / path.name), metadata={"format": "pt"})
    return str(dst)


def make_lora_adapter(
    model_dir: str, out_dir: str, rank: int, targets: tuple[str, ...], seed: int, **config: Any
) -> str:
    """A PEFT LoRA adapter of `model_dir` with random A and B (PEFT's own init leaves B zero,
    an adapter that changes nothing), written by PEFT's `save_pretrained`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(r=rank, target_modules=list(targets), init_lora_weights=False, **config)
    model = get_peft_model(base, lora)
    with torch.no_grad():  # deltas large enough to change the greedy tokens
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5 / rank)
    model.save_pretrained(out_dir)
    return out_dir


@cache
def peft_greedy(
    model_dir: str, adapter_dir: str, prompt: tuple[int, ...], max_tokens: int
) -> list[int]:
    """Greedy tokens of `model_dir` under the PEFT adapter `adapter_dir` (transformers + peft)."""
    import torch

    model = _peft_model(model_dir, adapter_dir)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
            do_sample=False,
        )  # fmt: skip
    return out[0, len(prompt) :].tolist()


@cache
def _peft_model(model_dir: str, adapter_dir: str) -> Any:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).eval()
