"""GGUF checkpoints (engine/gguf): imported as a Hugging Face folder whose greedy output
equals transformers loading the same GGUF file, token for token."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from safetensors.numpy import load_file

from core.sampling import SamplingParams
from engine import LLM
from engine.gguf import GGUFError, import_gguf, resolve_model
from engine.gguf.tensors import DEQUANTIZED, dequantize
from engine.gguf.tokenizer import hf_tokenizer
from tests.support.gguf_files import write_gguf, write_sentencepiece_vocab

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 77, 300, 12, 9, 800], list(range(20, 60))]


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


def _tiny(tiny_model_dir, arch: str) -> Path:
    return tiny_model_dir(arch, rope_scaling=None)  # GGUF rope scaling is not imported


def transformers_greedy(
    folder: Path, name: str | None, prompts: list[list[int]]
) -> list[list[int]]:
    """transformers' greedy output on the GGUF file `name` in `folder` (or on the folder)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # as ignore_eos: no stop, nothing masked
    outs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=GREEDY.max_tokens, do_sample=False)  # fmt: skip
        outs.append(out[0, len(prompt) :].tolist())
    return outs


@pytest.mark.parametrize(
    "qtype",
    sorted((t for t in DEQUANTIZED if t.name[0] == "Q"), key=lambda t: t.name),
    ids=lambda t: t.name,
)
def test_each_quantized_type_dequantizes_as_transformers_does(qtype) -> None:
    """Any bytes (scales included: a NaN where transformers has one) read as transformers
    reads them, so what a real file of that type holds imports exactly."""
    from gguf import GGML_QUANT_SIZES
    from transformers.integrations.gguf.dequant import dequantize as theirs

    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(0).integers(0, 256, (8, 4 * block_bytes), dtype=np.uint8)
    tensor = SimpleNamespace(name="t", tensor_type=qtype, data=raw,
                             shape=np.array([4 * block_values, 8]))  # fmt: skip
    want = theirs(torch.from_numpy(raw.reshape(-1)), int(qtype)).numpy().reshape(8, -1)
    np.testing.assert_array_equal(dequantize(tensor), want)


def test_an_f32_gguf_imports_as_the_checkpoint_it_was_written_from(tiny_model_dir, gguf_dir):
    """q / k un-permuted, every tensor under its Hugging Face name, values exact."""
    hf = _tiny(tiny_model_dir, "llama")
    src = write_gguf(hf, gguf_dir / "f32.gguf", GGMLQuantizationType.F32)
    out = import_gguf(src, gguf_dir / "f32")
    want, got = load_file(str(hf / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert want.keys() == got.keys()
    for name, values in want.items():
        np.testing.assert_array_equal(got[name], values.astype(np.float32), err_msg=name)


@pytest.mark.parametrize(
    "arch,qtype",
    [("llama", GGMLQuantizationType.Q8_0), ("llama", GGMLQuantizationType.Q4_0),
     ("llama", GGMLQuantizationType.Q4_1), ("qwen2", GGMLQuantizationType.Q8_0)],
)  # fmt: skip
def test_greedy_output_equals_transformers_on_the_same_gguf(
    tiny_model_dir, gguf_dir, arch: str, qtype: GGMLQuantizationType
) -> None:
    name = f"{arch}-{qtype.name}.gguf"
    src = write_gguf(_tiny(tiny_model_dir, arch), gguf_dir / name, qtype, arch=arch)
    llm = LLM(str(import_gguf(src, gguf_dir / f"{arch}-{qtype.name}")))
    ours = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert ours == transformers_greedy(gguf_dir, name, PROMPTS)


def test_a_qwen3_gguf_serves_its_checkpoint(tiny_model_dir, gguf_dir) -> None:
    """Qwen3 (q / k norms, a head size apart from hidden / heads): transformers reads no head
    size from a GGUF file, so the oracle is transformers on the checkpoint the exact (F32)
    file was written from."""
    hf = _tiny(tiny_model_dir, "qwen3")
    src = write_gguf(hf, gguf_dir / "qwen3.gguf", GGMLQuantizationType.F32, arch="qwen3")
    llm = LLM(str(import_gguf(src, gguf_dir / "qwen3")))
    ours = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert ours == transformers_greedy(hf, None, PROMPTS)


def test_the_vocabulary_encodes_as_transformers_reads_it(tiny_model_dir, gguf_dir) -> None:
    from transformers import AutoTokenizer

    src = write_gguf(_tiny(tiny_model_dir, "llama"), gguf_dir / "tok.gguf")
    llm = LLM(str(resolve_model(src)))
    theirs = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file="tok.gguf")
    for text in ("Hello world 123", "<|eot|> tabs\tand\nnewlines  x", "¿Qué tal? 日本語"):
        assert llm.tokenizer.encode(text) == theirs.encode(text)
    chat = [{"role": "user", "content": "hi"}]
    assert llm.tokenizer.apply_chat_template(chat) == theirs.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=False
    )


def test_a_sentencepiece_vocabulary_encodes_as_transformers_reads_it(gguf_dir) -> None:
    """Llama 2 / Mistral files: SentencePiece BPE with byte fallback, merges from the scores."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    corpus = (Path(__file__).parents[2] / "README.md").read_text().splitlines() * 3
    src = write_sentencepiece_vocab(gguf_dir / "spm.gguf", corpus)
    ours = Tokenizer.from_str(hf_tokenizer(GGUFReader(src))[0])
    theirs = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file="spm.gguf")
    texts = ["Baton serves large language models", "  two  spaces and\nnewline",
             "héllo wörld ☃ 123", "The prefill pool"]  # fmt: skip
    for text in texts:
        ids = ours.encode(text).ids
        assert ids == theirs.encode(text), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_a_gguf_path_is_imported_once(tiny_model_dir, gguf_dir, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(gguf_dir / "cache"))
    src = write_gguf(_tiny(tiny_model_dir, "llama"), gguf_dir / "once.gguf")
    first = resolve_model(src)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(src) == first and (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert resolve_model(first) == first  # a folder is itself


def _writer(path: Path, arch: str) -> GGUFWriter:
    writer = GGUFWriter(str(path), arch)
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length"):
        getattr(writer, f"add_{key}")(32)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    return writer


def _close(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_what_is_not_handled_is_named(gguf_dir) -> None:
    writer = _writer(gguf_dir / "gpt2.gguf", "gpt2")
    _close(writer)
    with pytest.raises(GGUFError, match="architecture 'gpt2'"):
        import_gguf(gguf_dir / "gpt2.gguf", gguf_dir / "out")
    writer = _writer(gguf_dir / "iq.gguf", "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b"])
    writer.add_token_merges([])
    raw = np.zeros((32, 66), dtype=np.uint8)  # one IQ2_XXS row of 256 values is 66 bytes
    writer.add_tensor("token_embd.weight", raw, raw_dtype=GGMLQuantizationType.IQ2_XXS)
    _close(writer)
    with pytest.raises(GGUFError, match="IQ2_XXS"):
        import_gguf(gguf_dir / "iq.gguf", gguf_dir / "out")
    (gguf_dir / "not.gguf").write_bytes(b"PK\x03\x04")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        import_gguf(gguf_dir / "not.gguf", gguf_dir / "out")
    assert not (gguf_dir / "out").exists()


@pytest.mark.slow
def test_smollm2_answers_as_transformers_does(smollm2_dir: Path) -> None:
    """The default model, imported from its Q4_1 GGUF file: a real instruct model answers,
    token for token as transformers on the same file."""
    from router.cli.model_dir import default_gguf

    src = default_gguf()
    assert src is not None  # smollm2_dir skips without it
    llm = LLM(str(smollm2_dir))
    question = [
        {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
    ]
    ids = llm.tokenizer.encode_chat(question)
    out = llm.generate([ids], SamplingParams(max_tokens=16, temperature=0.0))[0]
    assert llm.tokenizer.decode(out.token_ids, skip_special_tokens=True).startswith(
        "The capital of France is Paris."
    )
    theirs = transformers_greedy(src.parent, src.name, [ids])[0]
    assert out.token_ids == theirs[: len(out.token_ids)]
