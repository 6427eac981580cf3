"""Quantized KV cache (engine/kv_cache/quant.py): int8 and fp8 entries with a float16 scale
per (token, head), written and read by the torch and cpu attention backends; a quarter of
float32's bytes (plus the scales) in the cache, the tiers and the transfer."""

from __future__ import annotations

import random

import pytest
import torch

from core.config import EngineConfig
from core.kv_layout import KVLayout
from core.sampling import SamplingParams
from engine import LLM
from engine.attention.backend import AttentionMetadata, PrefillChunk
from engine.attention.torch_paged import TorchPagedAttention
from engine.device import check_cache_dtype
from engine.kv_cache import quant as kv_quant
from kv_transfer.handshake import CompatRecord, IncompatiblePeerError
from tests.engine.test_parity import make_prompts

QUANTIZED = [torch.int8, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", QUANTIZED)
def test_dequantized_entries_are_within_the_format_rounding(dtype: torch.dtype) -> None:
    x = torch.randn(7, 3, 64, generator=torch.Generator().manual_seed(0)) * 4
    x[2, 1] = 0.0  # a head of zeros stays zeros (its scale is clamped, never 0)
    entries = kv_quant.quantize(x, dtype)
    assert entries.shape == (7, 3, 66) and entries.dtype == dtype
    back = kv_quant.dequantize(entries, torch.float32)
    scale = kv_quant.scales(entries).float()
    if dtype == torch.int8:
        bound = scale / 2 + 1e-6  # round to the nearest step
    else:  # e4m3: 3 mantissa bits, and subnormals below 2^-6 (in units of the scale)
        bound = x.abs() / 16 + scale * 2.0**-9 + 1e-6
    assert bool(((back - x).abs() <= bound).all())
    assert bool((back[2, 1] == 0).all())
    assert torch.equal(kv_quant.quantize(back, dtype), entries)  # stored scales are exact


@pytest.mark.parametrize("dtype", ["int8", "float8_e4m3fn"])
def test_a_quantized_layout_counts_its_scales(dtype: str) -> None:
    fp32 = KVLayout(num_layers=2, num_blocks=4, block_size=16, num_kv_heads=2, head_dim=64,
                    dtype="float32")  # fmt: skip
    quantized = KVLayout(2, 4, 16, 2, 64, dtype=dtype)
    assert quantized.shape[-1] == 66
    assert quantized.block_bytes * 4 * 64 == fp32.block_bytes * 66  # a quarter, plus scales


@pytest.mark.parametrize("dtype", QUANTIZED)
def test_attention_over_a_quantized_cache_equals_attention_over_its_values(
    dtype: torch.dtype,
) -> None:
    """The torch backend on a quantized cache computes exactly what it computes on a float
    cache holding the dequantized values: decode rows and a chunk after a cached prefix."""
    gen = torch.Generator().manual_seed(1)
    bs, hk, hq, d, blocks = 4, 2, 4, 16, 6
    quantized = torch.zeros(blocks, 2, bs, hk, d + 2, dtype=dtype)
    plain = torch.zeros(blocks, 2, bs, hk, d)
    backend = TorchPagedAttention()
    # Sequence A: 10 cached tokens in blocks [1, 3, 5]; B: 5 in blocks [2, 4].
    a_blocks, b_blocks = torch.tensor([1, 3, 5]), torch.tensor([2, 4])
    slots = [(a_blocks[t // bs], t % bs) for t in range(10)] + [
        (b_blocks[t // bs], t % bs) for t in range(5)
    ]
    k, v = torch.randn(15, hk, d, generator=gen), torch.randn(15, hk, d, generator=gen)
    fill = AttentionMetadata(
        block_size=bs,
        slot_blocks=torch.tensor([int(b) for b, _ in slots]),
        slot_offsets=torch.tensor([o for _, o in slots]),
        num_decodes=0,
        decode_block_tables=torch.zeros(0, 1, dtype=torch.long),
        decode_seq_lens=torch.zeros(0, dtype=torch.long),
    )
    backend.write_kv(k, v, quantized, fill)
    plain_k = kv_quant.dequantize(kv_quant.quantize(k, dtype), torch.float32)
    plain_v = kv_quant.dequantize(kv_quant.quantize(v, dtype), torch.float32)
    backend.write_kv(plain_k, plain_v, plain, fill)
    # A step: B decodes its 6th token (slot 5 -> block 4 offset 1), A extends by 2 (10, 11).
    q = torch.randn(3, hq, d, generator=gen)
    nk, nv = torch.randn(3, hk, d, generator=gen), torch.randn(3, hk, d, generator=gen)
    step = AttentionMetadata(
        block_size=bs,
        slot_blocks=torch.tensor([4, 5, 5]),
        slot_offsets=torch.tensor([1, 2, 3]),
        num_decodes=1,
        decode_block_tables=torch.tensor([[2, 4]]),
        decode_seq_lens=torch.tensor([6]),
        prefills=[PrefillChunk(query_start=1, query_len=2, seq_len=12, block_ids=a_blocks)],
    )
    out_q = backend.forward(q, nk, nv, quantized, step, scale=0.25)
    nk_plain = kv_quant.dequantize(kv_quant.quantize(nk, dtype), torch.float32)
    nv_plain = kv_quant.dequantize(kv_quant.quantize(nv, dtype), torch.float32)
    out_p = backend.forward(q, nk_plain, nv_plain, plain, step, scale=0.25)
    torch.testing.assert_close(out_q, out_p, rtol=1e-5, atol=1e-5)


def test_an_int8_cache_serves_nearly_the_float32_logprobs(tiny_model_dir) -> None:
    """Chunks of 16 tokens: every chunk after the first reads its context from the cache."""
    model_dir = tiny_model_dir("llama")
    prompts = [p for p in make_prompts(1000, seed=8) if len(p) > 16]
    params = SamplingParams(max_tokens=8, temperature=0.0, prompt_logprobs=0)
    outs = {}
    for kv_dtype in ("auto", "int8"):
        llm = LLM(model_dir, kv_cache_dtype=kv_dtype, num_kv_blocks=64,
                  max_num_batched_tokens=16)  # fmt: skip
        outs[kv_dtype] = llm.generate(prompts, params)
        llm.engine.check_invariants()
    layout = llm.engine.runner.kv_layout
    assert (layout.dtype, layout.entry_dim) == ("int8", 16 + 2)
    for ref, got in zip(outs["auto"], outs["int8"], strict=True):
        assert got.token_ids == ref.token_ids
        pairs = zip(ref.prompt_logprobs[1:], got.prompt_logprobs[1:], strict=True)
        assert max(abs(a.logprob - b.logprob) for a, b in pairs) < 0.05


def test_an_fp8_cache_runs_through_the_engine(tiny_model_dir) -> None:
    llm = LLM(tiny_model_dir("llama"), kv_cache_dtype="fp8", num_kv_blocks=64)
    [out] = llm.generate(make_prompts(1000, seed=2)[:1], SamplingParams(max_tokens=6))
    assert len(out.token_ids) == 6
    assert llm.engine.runner.kv_cache.dtype == torch.float8_e4m3fn


def test_the_handshake_refuses_a_peer_with_another_kv_dtype() -> None:
    fp32 = KVLayout(2, 8, 16, 2, 64, dtype="float32")
    int8 = KVLayout(2, 8, 16, 2, 64, dtype="int8")
    with pytest.raises(IncompatiblePeerError) as err:
        CompatRecord.from_layout(int8, "m").check(CompatRecord.from_layout(fp32, "m"))
    assert err.value.field == "dtype"


def test_a_bad_kv_cache_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="int4")


def test_tp2_ranks_quantize_their_heads_as_one_rank_does(tiny_model_dir) -> None:
    """Scales are per (token, head), so a head quantizes the same on whichever rank holds it:
    TP=2 over an int8 cache gives the single-rank int8 engine's tokens."""
    import os

    from engine.tp import TPEngine

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    model_dir = tiny_model_dir("llama")
    prompts = [p for p in make_prompts(1000, seed=9) if len(p) > 40][:3]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    single = LLM(model_dir, kv_cache_dtype="int8", num_kv_blocks=64).generate(prompts, params)
    config = EngineConfig(tp_size=2, num_kv_blocks=64, num_threads=1, kv_cache_dtype="int8")
    with TPEngine(model_dir, config) as engine:
        outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in single]


def test_quantized_blocks_spill_and_come_back_with_their_scales(tiny_model_dir) -> None:
    model_dir = tiny_model_dir("llama")
    llm = LLM(model_dir, kv_cache_dtype="int8", num_kv_blocks=12, kv_offload_host_bytes=1 << 20)
    rng = random.Random(5)
    shared = [rng.randrange(3, 1000) for _ in range(96)]  # 6 blocks
    others = [[rng.randrange(3, 1000) for _ in range(150)] for _ in range(3)]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    for p in [shared + [7], *others]:  # each of the others evicts the whole cache
        llm.generate([p], params)
    [out] = llm.generate([shared + [4, 5]], params)
    assert out.num_cached_tokens == 96
    assert llm.engine.kv.pool.offload.tiers[0].stats.restored == 6
    fresh = LLM(model_dir, kv_cache_dtype="int8", num_kv_blocks=64)
    assert out.token_ids == fresh.generate([shared + [4, 5]], params)[0].token_ids


def test_an_fp8_cache_on_a_gpu_without_e4m3_is_refused_naming_it(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match=r"kv_cache_dtype fp8 .* NVIDIA A100 is 8\.0 \(use int8\)"):
        check_cache_dtype("fp8", torch.device("cuda"))
    check_cache_dtype("int8", torch.device("cuda"))  # int8 runs anywhere
    check_cache_dtype("fp8", torch.device("cpu"))  # the CPU converts in torch
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_cache_dtype("fp8", torch.device("cuda"))
