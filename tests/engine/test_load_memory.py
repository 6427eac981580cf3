"""Loading holds the weights and little else: parameters are made in the target dtype on the
target device, and checkpoint tensors are cast into them in place, so an fp32 checkpoint
loaded as bf16 never has a full fp32 model (or one whole fp32 tensor) next to the bf16 one.

Memory is counted exactly, not sampled: the profiler reports every allocation and free of
torch's CPU allocator with its size, and a running sum over them, in time order, gives the
peak of what torch held while the model loaded."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from core.config import EngineConfig
from engine.config import ModelConfig
from engine.layers.rotary import RotaryEmbedding
from engine.model_runner import ModelRunner

# Big enough that one tensor matters: the embedding and the untied LM head are 4.2M
# parameters each, two thirds of the 13M, so a full-size copy of either shows.
_SIZE = {
    "vocab_size": 8192,
    "hidden_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 1024,
    "max_position_embeddings": 1024,
}
_LIMIT = 1.1


def peak_allocated_bytes(fn: Callable[[], Any]) -> tuple[int, Any]:
    """(most bytes torch's CPU allocator held at once while `fn` ran, above what it held
    before; fn's result)."""
    # A free of memory allocated before would lower the count: collect what earlier tests
    # left in reference cycles (a parameter's weight_loader holds its module) now, not
    # while measuring.
    gc.collect()
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = fn()
    finally:
        gc.enable()
    # The raw events: `prof.events()` folds an op's allocations into the op, which loses
    # their order relative to the frees.
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        if event.device_type() == torch.autograd.DeviceType.CPU:
            held += event.nbytes()
            peak = max(peak, held)
    return peak, result


def test_peak_counts_a_temporary() -> None:
    """The accounting itself: a 4 MB temporary freed before an 8 MB tensor is made shows as
    8 MB at peak, both alive at once as 12 MB."""

    def apart() -> None:
        a = torch.ones(1 << 20)
        del a
        torch.ones(2 << 20)

    def together() -> torch.Tensor:
        a = torch.ones(1 << 20)
        b = torch.ones(2 << 20)
        return a + b[: 1 << 20]

    assert peak_allocated_bytes(apart)[0] == 8 << 20
    assert peak_allocated_bytes(together)[0] >= 12 << 20


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_loading_holds_at_most_the_weights_and_a_tenth(tiny_model_dir, dtype) -> None:
    folder: Path = tiny_model_dir("llama", **_SIZE)  # an fp32 checkpoint
    model_config = ModelConfig.from_dir(folder)
    # One KV block: the cache is not what this measures.
    config = EngineConfig(num_kv_blocks=1)
    peak, runner = peak_allocated_bytes(
        lambda: ModelRunner(model_config, config, torch.device("cpu"), dtype, "torch")
    )
    params = list(runner.model.parameters())
    assert {p.dtype for p in params} == {dtype}
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    embedding = runner.model.model.embed_tokens.weight
    assert embedding.numel() * embedding.element_size() > weight_bytes / 4
    assert peak >= weight_bytes  # the count saw every parameter being made
    ratio = peak / weight_bytes
    assert ratio <= _LIMIT, f"peak {peak / 2**20:.1f} MiB = {ratio:.2f} x the weights"
    # The rotary tables are still computed in float32 and only then cast, as HF does.
    rotary = runner.model.model.layers[0].self_attn.rotary
    mc = model_config
    reference = RotaryEmbedding(
        mc.head_dim, mc.max_position_embeddings, mc.rope_theta, mc.rope_scaling, torch.float32
    )
    assert torch.equal(rotary.cos, reference.cos.to(dtype))
    assert torch.equal(rotary.sin, reference.sin.to(dtype))
