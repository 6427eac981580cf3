"""LoRA adapters served beside the base model: greedy tokens equal transformers + peft on the
same adapter folder, for requests of different adapters (and none) batched in one step,
through slot swaps (more adapters than slots), with prefix caching kept apart per adapter;
and an adapter that cannot be served is refused with the field at fault."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from core.config import EngineConfig
from core.errors import InvalidRequestError
from core.lora import lora_ref
from core.sampling import SamplingParams
from engine import LLM
from engine.completion import run_to_completion
from engine.tp import TPEngine
from tests import oracle

MAX_TOKENS = 10
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL = (*ATTN, "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def adapters(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Three adapters unlike in rank, targets and scaling."""
    out = tmp_path_factory.mktemp("adapters")
    return {
        "all-r8": oracle.make_lora_adapter(str(model_dir), str(out / "a"), 8, ALL, 1),
        "attn-r4": oracle.make_lora_adapter(
            str(model_dir), str(out / "b"), 4, ATTN, 2, lora_alpha=32
        ),
        "mlp-rs": oracle.make_lora_adapter(
            str(model_dir), str(out / "c"), 8, ("gate_proj", "down_proj"), 3, use_rslora=True
        ),
    }


def _prompts(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(40)]
    return [shared + [rng.randrange(3, vocab) for _ in range(5 + 7 * i)] for i in range(n)]


def _check(llm: LLM, model_dir: Path, adapters: dict[str, str], names: list[str | None]) -> None:
    prompts = _prompts(llm.engine.model_config.vocab_size, len(names))
    refs = [lora_ref(n, adapters[n]) if n else None for n in names]
    outs = llm.generate(prompts, GREEDY, lora=refs)
    for name, prompt, out in zip(names, prompts, outs, strict=True):
        if name is None:
            want = oracle.hf_greedy(str(model_dir), tuple(prompt), MAX_TOKENS)
        else:
            want = oracle.peft_greedy(str(model_dir), adapters[name], tuple(prompt), MAX_TOKENS)
        assert out.token_ids == want, f"adapter {name}"
    assert not llm.engine.has_unfinished()
    assert llm.engine.kv.pool.num_used_blocks == 0


def test_adapters_change_the_output(model_dir: Path, adapters: dict[str, str]) -> None:
    prompt = tuple(_prompts(256, 1)[0])
    base = oracle.hf_greedy(str(model_dir), prompt, MAX_TOKENS)
    for path in adapters.values():
        assert oracle.peft_greedy(str(model_dir), path, prompt, MAX_TOKENS) != base


def test_mixed_adapters_in_one_batch_equal_peft(model_dir: Path, adapters: dict[str, str]) -> None:
    llm = LLM(model_dir, num_kv_blocks=256, max_loras=3, max_lora_rank=8)
    names = ["all-r8", None, "attn-r4", "mlp-rs", "all-r8", None, "attn-r4", "mlp-rs"]
    _check(llm, model_dir, adapters, names)
    assert sorted(llm.engine.runner.lora.resident) == sorted(adapters)


def test_more_adapters_than_slots_swap_and_stay_exact(
    model_dir: Path, adapters: dict[str, str]
) -> None:
    llm = LLM(model_dir, num_kv_blocks=256, max_loras=1, max_lora_rank=8)
    _check(llm, model_dir, adapters, ["all-r8", "attn-r4", None, "mlp-rs", "attn-r4", "all-r8"])
    lora = llm.engine.runner.lora
    assert lora.loads >= 3 and len(lora.resident) == 1


def test_prefix_cache_hits_stay_within_an_adapter(
    model_dir: Path, adapters: dict[str, str]
) -> None:
    llm = LLM(model_dir, num_kv_blocks=256, max_loras=2, max_lora_rank=8)
    prompt = _prompts(llm.engine.model_config.vocab_size, 1)[0] + list(range(10, 40))
    a, b = lora_ref("all-r8", adapters["all-r8"]), lora_ref("attn-r4", adapters["attn-r4"])
    cached = [llm.generate([prompt], GREEDY, lora=ref)[0].num_cached_tokens
              for ref in (a, b, None, a, b, None)]  # fmt: skip
    assert cached[:3] == [0, 0, 0]  # a block hashed under one adapter serves no other
    assert all(c >= 64 for c in cached[3:])
    # The same name from other weights is another adapter: no stale hit.
    other = lora_ref("all-r8", adapters["mlp-rs"])
    assert llm.generate([prompt], GREEDY, lora=other)[0].num_cached_tokens == 0


def _copy_adapter(src: str, dst: Path, **config_changes: object) -> str:
    dst.mkdir()
    for f in Path(src).iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    config = json.loads((dst / "adapter_config.json").read_text())
    config.update(config_changes)
    (dst / "adapter_config.json").write_text(json.dumps(config))
    return str(dst)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"use_dora": True}, "use_dora"),
        ({"bias": "all"}, "bias"),
        ({"target_modules": ["embed_tokens", "q_proj"]}, "target_modules"),
    ],
)
def test_an_adapter_that_cannot_be_served_is_refused(
    model_dir: Path, adapters: dict[str, str], tmp_path: Path, change: dict, field: str
) -> None:
    llm = LLM(model_dir, num_kv_blocks=64, max_loras=1, max_lora_rank=8)
    ref = lora_ref("bad", _copy_adapter(adapters["all-r8"], tmp_path / "bad", **change))
    with pytest.raises(InvalidRequestError, match=field):
        llm.generate([[5, 6, 7]], GREEDY, lora=ref)
    assert not llm.engine.has_unfinished()


def test_refusals_name_the_limit(model_dir: Path, adapters: dict[str, str], tmp_path: Path):
    ref = lora_ref("all-r8", adapters["all-r8"])
    with pytest.raises(InvalidRequestError, match="max_loras=0"):
        LLM(model_dir, num_kv_blocks=64).generate([[5, 6, 7]], GREEDY, lora=ref)
    narrow = LLM(model_dir, num_kv_blocks=64, max_loras=1, max_lora_rank=4)
    with pytest.raises(InvalidRequestError, match="max_lora_rank 4"):
        narrow.generate([[5, 6, 7]], GREEDY, lora=ref)
    changed = _copy_adapter(adapters["attn-r4"], tmp_path / "changed")
    ref = lora_ref("changed", changed)
    weights = Path(changed) / "adapter_model.safetensors"
    weights.write_bytes(Path(adapters["all-r8"], "adapter_model.safetensors").read_bytes())
    with pytest.raises(InvalidRequestError, match="changed since it was loaded"):
        narrow.generate([[5, 6, 7]], GREEDY, lora=ref)
    with pytest.raises(InvalidRequestError, match="lora_path"):
        lora_ref("x", tmp_path / "nowhere")


@pytest.mark.parametrize("kv_heads", [2, 1])  # 1: the KV head replicated on both ranks
def test_tensor_parallel_ranks_hold_their_shard_of_each_adapter(
    tiny_model_dir, tmp_path: Path, kv_heads: int
) -> None:
    model_dir = tiny_model_dir("llama", num_key_value_heads=kv_heads)
    folder = oracle.make_lora_adapter(str(model_dir), str(tmp_path / "a"), 8, ALL, 5)
    ref = lora_ref("all-r8", folder)
    prompts = _prompts(256, 3)
    config = EngineConfig(tp_size=2, num_kv_blocks=128, num_threads=1, max_loras=1,
                          max_lora_rank=8)  # fmt: skip
    with TPEngine(model_dir, config) as engine:
        outs = engine.generate(prompts, GREEDY, ref)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == oracle.peft_greedy(str(model_dir), folder, tuple(prompt),
                                                   MAX_TOKENS)  # fmt: skip


def test_a_queued_request_keeps_its_adapter_when_the_folder_goes(
    model_dir: Path, adapters: dict[str, str], tmp_path: Path
) -> None:
    """Read once, on arrival: a step never reads the folder again (one slot, three adapters
    taking turns, their folders deleted while the requests wait)."""
    llm = LLM(model_dir, num_kv_blocks=256, max_loras=1, max_lora_rank=8)
    engine = llm.engine
    prompts = _prompts(engine.model_config.vocab_size, 3)
    copies = {n: _copy_adapter(p, tmp_path / n) for n, p in adapters.items()}
    for i, (name, folder) in enumerate(copies.items()):
        engine.add_request(f"r{i}", prompts[i], GREEDY, lora=lora_ref(name, folder))
    for folder in copies.values():
        shutil.rmtree(folder)
    outs = run_to_completion(engine, {f"r{i}": p for i, p in enumerate(prompts)})
    for i, name in enumerate(copies):
        want = oracle.peft_greedy(str(model_dir), adapters[name], tuple(prompts[i]), MAX_TOKENS)
        assert outs[f"r{i}"].token_ids == want
