"""The skinny CPU GEMM (engine/cpu_kernels/skinny_gemm.cpp) and its dispatch against F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import cpu_kernels
from engine.layers import cpu_gemm

pytestmark = pytest.mark.skipif(
    cpu_gemm._kernel() is None, reason="no C++ toolchain or no AVX2 for the kernel"
)


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 16, 17, 64, 192])
@pytest.mark.parametrize(("n", "k"), [(1, 8), (2, 64), (3, 16), (7, 776), (130, 256)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear(rows: int, n: int, k: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    got = cpu_gemm._kernel().skinny_linear(x, w, b)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_dispatch_keeps_shapes_and_falls_back() -> None:
    w = torch.randn(12, 40)
    for x in (torch.randn(2, 3, 40), torch.randn(cpu_gemm.skinny_max_rows() + 1, 40)):
        torch.testing.assert_close(cpu_gemm.linear(x, w, None), F.linear(x, w))
    odd = torch.randn(12, 41)  # K not a multiple of 8: plain torch
    x = torch.randn(3, 41)
    torch.testing.assert_close(cpu_gemm.linear(x, odd, None), F.linear(x, odd))
    strided = torch.randn(40, 4)[:, 1]  # a non-contiguous row
    torch.testing.assert_close(cpu_gemm.linear(strided, w, None), F.linear(strided, w))


def test_bad_arguments_are_clear_errors() -> None:
    kernel = cpu_gemm._kernel()
    with pytest.raises(RuntimeError, match="K must be a multiple of 8"):
        kernel.skinny_linear(torch.randn(2, 12), torch.randn(3, 12), None)
    with pytest.raises(RuntimeError, match="float32"):
        kernel.skinny_linear(torch.randn(2, 8).double(), torch.randn(3, 8).double(), None)


needs_bf16 = pytest.mark.skipif(
    cpu_gemm._bf16_kernel() is None, reason="this CPU has no AVX-512 BF16 (oneDNN serves bf16)"
)


@needs_bf16
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
@pytest.mark.parametrize(("n", "k"), [(1, 8), (7, 33), (130, 256), (96, 770)])
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_kernel_sums_exact_bf16_products_in_float32(
    rows: int, n: int, k: int, bias: bool
) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16() if bias else None
    got = cpu_gemm._bf16_kernel().bf16_linear(x, w, b)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert got.dtype == torch.bfloat16
    # float32 sums of exact products, rounded once: within bf16's half step of the truth
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-4)


@needs_bf16
def test_bf16_dispatch_takes_the_kernel_for_few_rows_only() -> None:
    w = torch.randn(12, 40).bfloat16()
    most = cpu_gemm.bf16_gemv_max_rows()
    for rows in (1, most, most + 1):
        x = torch.randn(1, rows, 40).bfloat16()
        got = cpu_gemm.linear(x, w, None)
        assert got.shape == (1, rows, 12) and got.dtype == torch.bfloat16
        want = F.linear(x.float(), w.float())
        torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=1e-3)
    assert cpu_gemm.enabled(torch.device("cpu"), torch.bfloat16)
    if cpu_gemm._amx_kernel() is None:
        gemv = cpu_gemm._bf16_kernel().bf16_linear
        assert cpu_gemm.kernel_for(most, w) == gemv and cpu_gemm.kernel_for(most + 1, w) != gemv


@needs_bf16
def test_bf16_gemv_takes_more_rows_where_the_dot_instruction_is_fast() -> None:
    """Without AMX, bf16_gemv's reach follows the probe of `vdpbf16ps` against FMAs (only a
    clear verdict is checked: the probe is timed)."""
    most = cpu_gemm.bf16_gemv_max_rows()
    ratio = cpu_kernels.dpbf16_over_fma()
    if cpu_gemm._amx_kernel() is not None or ratio is None:
        assert most == cpu_gemm.BF16_MAX_ROWS
    elif ratio > cpu_gemm.DPBF16_OVER_FMA_FOR_FMA * 1.25:
        assert most == cpu_gemm.BF16_MAX_ROWS_FAST_DOT
    elif ratio < cpu_gemm.DPBF16_OVER_FMA_FOR_FMA * 0.8:
        assert most == cpu_gemm.BF16_MAX_ROWS


needs_amx = pytest.mark.skipif(
    cpu_gemm._amx_kernel() is None, reason="this CPU has no AMX (oneDNN serves those rows)"
)


@needs_amx
@pytest.mark.parametrize("rows", [1, 15, 16, 17, 33, 70])
@pytest.mark.parametrize(("n", "k"), [(32, 32), (96, 768), (1280, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_amx_kernel_sums_exact_bf16_products_in_float32(
    rows: int, n: int, k: int, bias: bool
) -> None:
    """Every 16-row block and its tail (rows past the batch are packed as zeros and never
    written), one or two blocks per pass, across several weight-row groups."""
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16() if bias else None
    got = cpu_gemm._amx_kernel().bf16_amx_linear(x, w, b)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-4)


@needs_amx
@pytest.mark.parametrize("rows", [5, 40])
def test_weight_groups_from_the_work_queue_give_the_one_thread_answer(rows: int) -> None:
    """The team takes 32-row weight groups in chunks from a shared queue
    (engine/cpu_kernels/work_queue.h): 37 groups, not a multiple of any chunk, each computed
    once, as one thread alone computes it; the fused SiLU-and-mul too."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=gen).bfloat16()
    w = torch.randn(37 * 32, 96, generator=gen).bfloat16()
    kernel, threads, outs = cpu_gemm._amx_kernel(), torch.get_num_threads(), []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append((kernel.bf16_amx_linear(x, w, None), kernel.bf16_amx_silu_mul_linear(x, w)))
    finally:
        torch.set_num_threads(threads)
    want = F.linear(x.float(), w.float())
    torch.testing.assert_close(outs[0][0].float(), want, rtol=2**-8, atol=1e-4)
    for linear, silu_mul in outs[1:]:
        assert torch.equal(linear, outs[0][0]) and torch.equal(silu_mul, outs[0][1])


@needs_amx
def test_amx_kernel_takes_x_in_panels_each_row_as_alone() -> None:
    """Past a panel's bytes (1 MB: 20 blocks of 16 rows at K = 1,536) x is taken panel by
    panel: 680 rows are 43 blocks, panels of 20, 20 and 3 (an odd one: a pair, then a lone
    block) and a part-filled last block. Every row comes out as the same rows alone give it,
    bit for bit (each output sums its K products in the same order), across 1-2 threads."""
    gen = torch.Generator().manual_seed(680)
    x = torch.randn(680, 1536, generator=gen).bfloat16()
    w = torch.randn(96, 1536, generator=gen).bfloat16()
    kernel, threads = cpu_gemm._amx_kernel(), torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            linear, silu_mul = (
                kernel.bf16_amx_linear(x, w, None),
                kernel.bf16_amx_silu_mul_linear(x, w),
            )
            for begin, end in ((0, 16), (300, 340), (640, 672), (672, 680)):
                part = x[begin:end].contiguous()
                assert torch.equal(linear[begin:end], kernel.bf16_amx_linear(part, w, None))
                assert torch.equal(silu_mul[begin:end], kernel.bf16_amx_silu_mul_linear(part, w))
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(
        linear.float(), F.linear(x.float(), w.float()), rtol=2**-8, atol=1e-3
    )


@needs_amx
def test_amx_kernel_refuses_shapes_it_cannot_tile() -> None:
    kernel = cpu_gemm._amx_kernel()
    with pytest.raises(RuntimeError, match="K a multiple of 32"):
        kernel.bf16_amx_linear(torch.randn(8, 40).bfloat16(), torch.randn(32, 40).bfloat16(), None)
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernel.bf16_amx_linear(torch.randn(8, 32), torch.randn(32, 32), None)


@needs_amx
def test_bf16_dispatch_takes_amx_between_the_few_row_kernel_and_onednn() -> None:
    w, odd = torch.randn(64, 96).bfloat16(), torch.randn(40, 96).bfloat16()
    most = cpu_gemm.BF16_AMX_MAX_ROWS
    for rows in (cpu_gemm.BF16_AMX_MIN_ROWS, most, most + 9):
        x = torch.randn(rows, 96).bfloat16()
        for weight in (w, odd):  # 40 rows of weights cannot be tiled: oneDNN's
            got = cpu_gemm.linear(x, weight, None)
            want = F.linear(x.float(), weight.float())
            torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=1e-3)
    few = torch.randn(cpu_gemm.BF16_AMX_MIN_ROWS, 96).bfloat16()
    assert torch.equal(
        cpu_gemm.linear(few, w, None), cpu_gemm._amx_kernel().bf16_amx_linear(few, w, None)
    )


@needs_bf16
def test_bf16_decode_rows_score_as_the_prefill_does(tiny_model_dir) -> None:
    """A bfloat16 engine's decode rows (one per step: the kernel) give each token the log-prob
    its prefill rows (many per step: torch's bf16 linear) give it, up to bf16 rounding."""
    from core.sampling import SamplingParams
    from engine.llm import LLM

    llm = LLM(tiny_model_dir("llama"), dtype="bfloat16", num_kv_blocks=64)
    assert llm.engine.runner.model.lm_head.use_cpu_gemm
    prompt = list(range(40, 90))
    [out] = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, logprobs=0))
    decoded = [lp.logprob for lp in out.logprobs]
    scored = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    [again] = llm.generate([prompt + list(out.token_ids)], scored)
    prefilled = [lp.logprob for lp in again.prompt_logprobs[len(prompt) :]]
    torch.testing.assert_close(torch.tensor(decoded), torch.tensor(prefilled), atol=0.1, rtol=0)
