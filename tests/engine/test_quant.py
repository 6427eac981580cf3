"""INT8 quantization, weight-only and W8A8: the scheme, the CPU and Triton kernels against a
torch reference, and the engine's greedy output against transformers on the same quantized
weights (tests/oracle.py writes them as a float checkpoint, and for W8A8 quantizes each
linear layer's input the same way)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from core.sampling import SamplingParams
from engine.layers import quant
from engine.layers.linear import ColumnParallelLinear
from engine.llm import LLM
from tests import oracle


def _dequantized(wq: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return wq.float() * scale[:, None]


def test_quantization_is_symmetric_per_channel_within_half_a_step() -> None:
    w = torch.randn(37, 64) * torch.linspace(0.01, 3.0, 37)[:, None]
    wq, scale = quant.quantize_weight(w)
    assert wq.dtype == torch.int8 and scale.shape == (37,)
    assert int(wq.abs().max()) == 127  # each row's largest weight maps to +-127
    err = (w - _dequantized(wq, scale)).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-6).all())


# One row takes the kernel's batch-1 path (32 weights a load, then an 8-wide tail: K=72),
# 3 and 7 its row tiles and their remainder, 301 the float fallback.
@pytest.mark.parametrize("rows", [1, 3, 7, 200, 301])
@pytest.mark.parametrize("with_bias", [False, True])
def test_cpu_int8_linear_matches_the_dequantized_gemm(rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    wq, scale = quant.quantize_weight(torch.randn(50, 72, generator=gen))  # 50: not 3k rows
    x = torch.randn(rows, 72, generator=gen)
    bias = torch.randn(50, generator=gen) if with_bias else None
    got = quant.int8_linear(x, wq, scale, bias)
    want = F.linear(x, _dequantized(wq, scale), bias)
    assert got.shape == (rows, 50)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_the_cpu_kernel_is_built_here() -> None:
    # Without it every INT8 GEMM would take the widening fallback and be slower than fp32.
    assert quant._cpu_kernel() is not None


@pytest.mark.parametrize("rows", [1, 16, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_int8_linear_matches_its_reference(rows: int, dtype: torch.dtype) -> None:
    from engine.kernels.int8_linear import int8_linear, int8_linear_ref

    gen = torch.Generator().manual_seed(rows)
    wq, scale = quant.quantize_weight(torch.randn(80, 96, generator=gen))
    x = torch.randn(rows, 96, generator=gen).to(dtype)
    bias = torch.randn(80, generator=gen).to(dtype)
    got = int8_linear(x, wq, scale, bias)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, int8_linear_ref(x, wq, scale, bias), rtol=tol, atol=tol)


def test_triton_int8_linear_names_a_bad_argument() -> None:
    from engine.kernels.int8_linear import int8_linear

    wq, scale = quant.quantize_weight(torch.randn(8, 32))
    with pytest.raises(ValueError, match="wq"):
        int8_linear(torch.randn(2, 32), wq.float(), scale)
    with pytest.raises(ValueError, match="scale"):
        int8_linear(torch.randn(2, 32), wq, scale[:4])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: a tied head
def test_linear_layers_and_head_hold_int8_and_the_embedding_stays_float(
    tiny_model_dir, arch: str
) -> None:
    model = LLM(tiny_model_dir(arch), quantization="int8").engine.runner.model
    layer = model.model.layers[0]
    for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.down_proj):
        assert proj.weight.dtype == torch.int8 and proj.weight_scale.dtype == torch.float32
    assert model.lm_head.weight.dtype == torch.int8
    assert model.model.embed_tokens.weight.dtype == torch.float32


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_matches_transformers_on_the_quantized_weights(
    tiny_model_dir, tmp_path, arch: str
) -> None:
    model_dir = tiny_model_dir(arch)
    reference = oracle.write_fake_quantized(str(model_dir), str(tmp_path / "fake-int8"))
    llm = LLM(model_dir, quantization="int8", num_kv_blocks=128, max_num_batched_tokens=64)
    prompts = [[5, 9, 13, 200, 7], list(range(30, 130)), [11] * 40]  # 100 tokens: chunked
    params = SamplingParams(max_tokens=16, temperature=0.0)
    outs = llm.generate(prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        assert list(out.token_ids) == oracle.hf_greedy(reference, tuple(prompt), 16)


@pytest.mark.parametrize("rows", [1, 3, 40, 301])
@pytest.mark.parametrize("with_bias", [False, True])
def test_w8a8_linear_is_the_gemm_of_the_quantized_rows_and_weights(
    rows: int, with_bias: bool
) -> None:
    gen = torch.Generator().manual_seed(rows)
    wq, scale = quant.quantize_weight(torch.randn(50, 72, generator=gen))
    x = torch.randn(2, rows, 72, generator=gen) * torch.linspace(0.1, 4.0, rows)[:, None]
    bias = torch.randn(50, generator=gen) if with_bias else None
    got = quant.int8_linear(x, wq, scale, bias, int8_activations=True)
    xq, sx = quant.quantize_activations(x.reshape(-1, 72))
    assert xq.dtype == torch.int8 and int(xq.abs().amax(dim=1).min()) == 127
    want = F.linear((xq.float() * sx).view(2, rows, 72), _dequantized(wq, scale), bias)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize(("n", "k"), [(50, 72), (96, 64), (7, 200), (1280, 768)])
def test_the_vnni_kernel_gives_the_bits_of_the_onednn_path(rows: int, n: int, k: int) -> None:
    if quant._vnni_kernel() is None:
        pytest.skip("this CPU has no AVX-512 VNNI (the oneDNN path serves every row count)")
    gen = torch.Generator().manual_seed(rows * n + k)
    wq, scale = quant.quantize_weight(torch.randn(n, k, generator=gen))
    x = torch.randn(rows, k, generator=gen) * torch.logspace(-3, 2, rows)[:, None]
    bias = torch.randn(n, generator=gen)
    onednn = quant.int8_linear(x, wq, scale, bias, int8_activations=True)
    wsum = wq.sum(dim=1, dtype=torch.int32)
    vnni = quant.int8_linear(x, wq, scale, bias, int8_activations=True, weight_sum=wsum)
    assert torch.equal(vnni, onednn)


def test_w8a8_rows_do_not_depend_on_the_rows_batched_with_them() -> None:
    gen = torch.Generator().manual_seed(3)
    wq, scale = quant.quantize_weight(torch.randn(96, 64, generator=gen))
    batch = torch.randn(9, 64, generator=gen)
    together = quant.int8_linear(batch, wq, scale, None, int8_activations=True)
    for i in range(9):  # exact int32 sums, a scale per row: bit for bit the same
        alone = quant.int8_linear(batch[i : i + 1], wq, scale, None, int8_activations=True)
        assert torch.equal(alone[0], together[i])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_w8a8_follows_transformers_on_quantized_weights_and_inputs(
    tiny_model_dir, tmp_path, arch: str
) -> None:
    """Rounding a row to int8 jumps where a value sits on a rounding boundary, and two
    correct float implementations differ by ~1e-6, which moves a few values across one
    (transformers against itself with its embedding scaled by 1 + 1e-6 noise: a median
    log-prob change of 0.04 on these 64-wide random models). So token-exact greedy is no
    fair oracle here; teacher-forced, each position must predict what transformers does
    unless its top two are near a tie, and log-probs must stay within that noise."""
    import torch

    model_dir = tiny_model_dir(arch)
    reference = oracle.write_fake_quantized(str(model_dir), str(tmp_path / "fake-int8"))
    prompt = list(range(30, 130))
    seq = prompt + oracle.hf_greedy(reference, tuple(prompt), 60, int8_activations=True)
    with torch.no_grad():
        hf_model = oracle._hf_model(reference, "cpu", True)
        want = torch.log_softmax(hf_model(torch.tensor([seq])).logits[0, :-1].float(), -1)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    got = {}
    for mode in ("int8", "w8a8"):
        llm = LLM(model_dir, quantization=mode, num_kv_blocks=128, max_num_batched_tokens=64)
        [out] = llm.generate([seq], params)
        got[mode] = [lp for lp in out.prompt_logprobs or [] if lp is not None]
    down_proj = llm.engine.runner.model.model.layers[0].mlp.down_proj
    assert down_proj.int8_activations and down_proj.weight_sum.dtype == torch.int32
    assert len(got["w8a8"]) == len(seq) - 1
    top2 = want.topk(2, dim=-1)
    margins = top2.values[:, 0] - top2.values[:, 1]
    deltas, moved = [], []
    for i, lp in enumerate(got["w8a8"]):
        deltas.append(abs(lp.logprob - float(want[i, seq[i + 1]])))
        moved.append(abs(lp.logprob - got["int8"][i].logprob))
        if margins[i] > 0.25:
            assert lp.top[0][0] == int(top2.indices[i, 0]), f"position {i}"
    deltas.sort()
    moved.sort()
    assert deltas[len(deltas) // 2] < 0.1 and deltas[-1] < 1.0
    assert moved[len(moved) // 2] > 1e-3  # the inputs were quantized: not weight-only's output


def test_an_unknown_quantization_is_refused() -> None:
    from core.config import EngineConfig

    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="int4")


@pytest.mark.parametrize(("flags", "warned"), [({"avx2"}, True), ({"avx2", "avx512_vnni"}, False)])
def test_w8a8_warns_on_a_cpu_without_int8_units(monkeypatch, caplog, flags, warned) -> None:
    monkeypatch.setattr(quant.cpu_kernels, "cpu_flags", lambda: frozenset(flags))
    model = torch.nn.Sequential(ColumnParallelLinear(8, 4, bias=False))
    with caplog.at_level(logging.WARNING, logger=quant.__name__):
        quant.quantizable(model, "w8a8")
    assert ("without AVX-512 VNNI or AMX" in caplog.text) is warned
