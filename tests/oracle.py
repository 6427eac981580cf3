"""The correctness oracle: Hugging Face `transformers` greedy generation on the same weights,
one prompt at a time (no padding, so the reference is exact)."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _hf_model(model_dir: str, device: str = "cpu") -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()


@cache
def hf_greedy(
    model_dir: str, prompt: tuple[int, ...], max_tokens: int, device: str = "cpu"
) -> list[int]:
    import torch

    model = _hf_model(model_dir, device)
    ids = torch.tensor([prompt], device=device)
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
        )
    return out[0, len(prompt) :].tolist()


@cache
def hf_prompt_logprobs(model_dir: str, prompt: tuple[int, ...]) -> Any:
    """[len(prompt) - 1, vocab]: row i is the log-softmax that predicts prompt[i + 1]."""
    import torch

    with torch.no_grad():
        logits = _hf_model(model_dir)(torch.tensor([prompt])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)
