"""The flat CPU forward (engine/cpu_forward.py) runs a step's kernels from one loop; its
hidden states must be the modules' bit for bit on every step: prompt chunks, decode rows and
both mixed, each architecture's layer options (Qwen2's QKV bias, Qwen3's q/k norm), both
dtypes, head sizes that take the AMX kernels and those that do not, row counts that pick
each GEMM kernel, rows that share a cascade prefix, the per-layer KV hook. Models it cannot
run keep their modules."""

from __future__ import annotations

import random

import pytest
import torch

from core.config import EngineConfig
from core.sampling import SamplingParams
from engine.attention import cascade
from engine.attention.backend import AttentionMetadata
from engine.attention.cpu_paged import load_kernel
from engine.completion import run_to_completion
from engine.cpu_forward import CPUForward
from engine.engine import LLMEngine
from engine.layers import cpu_gemm
from tests import oracle


def max_tokens(i: int) -> int:
    """Request i's: once every prompt is in, every batch size from the largest down to 1 as
    requests finish, through the GEMM kernels' thresholds (cpu_gemm: gemv below 3 rows with
    AMX, 8 without)."""
    return 16 + i


def skip_without_kernels(dtype: str = "float32") -> None:
    """The flat forward runs what the modules' CPU kernels run: none without a C++ toolchain,
    and no bfloat16 one without AVX-512 BF16 (oneDNN serves bfloat16 there)."""
    if not cpu_gemm.enabled(torch.device("cpu"), getattr(torch, dtype)) or load_kernel() is None:
        pytest.skip(f"no CPU kernels for {dtype} here")


def checked_engine(model_dir, monkeypatch, **config) -> tuple[LLMEngine, list[AttentionMetadata]]:
    """An engine whose flat forward, at every step, also runs the modules on the same step
    first and asserts the same hidden states; returns the engine and each step's metadata."""
    skip_without_kernels(str(config.get("dtype", "float32")))
    settings: dict[str, object] = dict(num_kv_blocks=256, max_num_seqs=16, num_threads=1)
    engine = LLMEngine(model_dir, EngineConfig(**{**settings, **config}))
    runner = engine.runner
    flat = runner.cpu_forward
    assert flat is not None, "the flat forward should run this model"
    steps: list[AttentionMetadata] = []
    real = flat.run

    def run(input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata):
        # The modules write the same K/V into the same slots first: the flat run rewrites them.
        want = runner.model(input_ids, positions, runner.kv_cache, meta)
        got = real(input_ids, positions, meta)
        assert torch.equal(got, want), f"differs from the modules: {describe(meta)}"
        steps.append(meta)
        return got

    monkeypatch.setattr(flat, "run", run)
    return engine, steps


def describe(meta: AttentionMetadata) -> str:
    return f"{meta.num_decodes} decode rows, chunks {[c.query_len for c in meta.prefills]}"


def generate(
    engine: LLMEngine, prompts: list[list[int]], ignore_eos: bool = True
) -> list[list[int]]:
    for i, p in enumerate(prompts):
        params = SamplingParams(max_tokens=max_tokens(i), temperature=0.0, ignore_eos=ignore_eos)
        engine.add_request(f"r{i}", p, params)
    outs = run_to_completion(engine, {f"r{i}": p for i, p in enumerate(prompts)})
    assert not engine.has_unfinished()
    return [outs[f"r{i}"].token_ids for i in range(len(prompts))]


def random_prompts(vocab: int, count: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(1, 40))] for _ in range(count)]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("head_dim", [16, 32])
def test_every_step_equals_the_modules(
    tiny_model_dir, monkeypatch, arch: str, dtype: str, head_dim: int
) -> None:
    model_dir = tiny_model_dir(arch, head_dim=head_dim)
    # A small token budget: prompts arrive in chunks, beside other requests' decode rows.
    engine, steps = checked_engine(model_dir, monkeypatch, dtype=dtype, max_num_batched_tokens=48)
    prompts = random_prompts(engine.model_config.vocab_size, 16)
    generate(engine, prompts)
    decode_rows = {m.num_decodes for m in steps if not m.prefills}
    assert decode_rows == set(range(1, 17)), f"decode-only steps' rows: {sorted(decode_rows)}"
    assert any(m.prefills and m.num_decodes for m in steps), "no mixed step"


def test_greedy_tokens_equal_the_oracle_through_it(tiny_model_dir) -> None:
    skip_without_kernels()
    model_dir = tiny_model_dir("llama")
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=256, num_threads=1))
    prompts = random_prompts(engine.model_config.vocab_size, 6, seed=11)
    outs = generate(engine, prompts, ignore_eos=False)
    assert engine.runner.cpu_forward is not None and engine.runner.cpu_forward.steps > 0
    for i, (prompt, got) in enumerate(zip(prompts, outs, strict=True)):
        assert got == oracle.hf_greedy(str(model_dir), tuple(prompt), max_tokens(i))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_on_a_shared_prefix_take_the_cascade_path(
    tiny_model_dir, monkeypatch, dtype: str
) -> None:
    model_dir = tiny_model_dir("llama", head_dim=32)
    engine, steps = checked_engine(model_dir, monkeypatch, dtype=dtype, num_kv_blocks=512)
    merged = []
    real = cascade.merge_groups_into
    monkeypatch.setattr(cascade, "merge_groups_into", lambda *a: merged.append(1) or real(*a))
    rng = random.Random(5)
    vocab = engine.model_config.vocab_size
    # Enough rows x shared positions for either rule (cascade.FLASH_RULE, TILED_RULE).
    system = [rng.randrange(3, vocab) for _ in range(800)]
    prompts = [system + [rng.randrange(3, vocab) for _ in range(1 + 2 * n)] for n in range(16)]
    generate(engine, prompts)
    assert steps and merged, "no decode step merged a shared prefix"


def test_the_kv_hook_runs_after_each_layer(tiny_model_dir, monkeypatch) -> None:
    engine, _ = checked_engine(tiny_model_dir("llama"), monkeypatch)
    flat = engine.runner.cpu_forward
    real = flat.run
    done: list[list[int]] = []

    def hooked(input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata):
        layers: list[int] = []
        meta.layer_done = layers.append
        out = real(input_ids, positions, meta)  # the modules' run calls it first
        done.append(layers)
        return out

    monkeypatch.setattr(flat, "run", hooked)
    generate(engine, random_prompts(engine.model_config.vocab_size, 3))
    per_run = list(range(engine.model_config.num_hidden_layers))
    assert done and all(layers == per_run + per_run for layers in done)


def test_models_it_cannot_run_keep_their_modules(tiny_model_dir, monkeypatch) -> None:
    skip_without_kernels()
    model_dir = tiny_model_dir("llama")

    def flat(**config: object) -> CPUForward | None:
        return LLMEngine(model_dir, EngineConfig(num_kv_blocks=32, **config)).runner.cpu_forward

    assert flat(kv_cache_dtype="int8") is None  # a cache of another dtype
    assert flat(attention_backend="torch") is None
    assert flat(quantization="int8") is None
    monkeypatch.setenv("BATON_CPU_GEMM", "0")
    assert flat() is None
    monkeypatch.delenv("BATON_CPU_GEMM")
    monkeypatch.setenv("BATON_CPU_FORWARD", "0")
    assert flat() is None
    monkeypatch.delenv("BATON_CPU_FORWARD")
    assert flat() is not None


def test_the_gemm_kernels_are_the_ones_linear_runs() -> None:
    """The flat forward asks `kernel_for` once a step; `linear` asks it per call (with no
    kernel for a dtype here, None: torch's linear for both)."""
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.randn(64, 64).to(dtype)
        for rows in (1, 2, 3, 8, 64, 300):
            x = torch.randn(rows, 64).to(dtype)
            kernel = cpu_gemm.kernel_for(rows, weight)
            want = (
                torch.nn.functional.linear(x, weight) if kernel is None else kernel(x, weight, None)
            )
            assert torch.equal(cpu_gemm.linear(x, weight, None), want)
