"""Writing a Hugging Face folder as a GGUF file the way llama.cpp's converter does (q / k
permuted for llama, tensors quantized), so the import can be checked against transformers
loading the same file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, quants
from safetensors.numpy import load_file

_NAMES = {
    "embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
}  # fmt: skip


def gguf_name(hf: str) -> str:
    parts = hf.split(".")
    if parts[1] == "layers":  # model.layers.N.<module>.<proj>.<weight|bias>
        return f"blk.{parts[2]}.{_NAMES[parts[-2]]}.{parts[-1]}"
    return f"{_NAMES[parts[-2]]}.{parts[-1]}"


def _permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's rotary layout: each head's two halves interleaved."""
    half = weight.shape[0] // num_heads // 2
    return (
        weight.reshape(num_heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_gguf(
    hf_dir: Path, path: Path, qtype: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    arch: str = "llama",
) -> Path:  # fmt: skip
    config = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tok_config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    writer = GGUFWriter(str(path), arch)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(config.get("head_dim", config["hidden_size"] // heads))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_vocab_size(config["vocab_size"])
    vocab = tok["model"]["vocab"] | {t["content"]: t["id"] for t in tok["added_tokens"]}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab[tok_config["bos_token"]])
    writer.add_eos_token_id(vocab[tok_config["eos_token"]])
    writer.add_add_bos_token(False)
    writer.add_chat_template(tok_config["chat_template"])
    for name, values in sorted(load_file(str(hf_dir / "model.safetensors")).items()):
        values = values.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            values = _permute(values, heads if "q_proj" in name else kv_heads)
        kind = qtype if values.ndim == 2 else GGMLQuantizationType.F32
        data = values if kind == GGMLQuantizationType.F32 else quants.quantize(values, kind)
        writer.add_tensor(gguf_name(name), data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_sentencepiece_vocab(path: Path, corpus: list[str], vocab_size: int = 500) -> Path:
    """A GGUF file whose vocabulary is SentencePiece BPE, as Llama 2's files hold one: <unk>,
    <s>, </s>, the 256 byte tokens, then the pieces with falling scores and no merges (one
    embedding tensor: enough to read the vocabulary)."""
    from tokenizers import SentencePieceBPETokenizer

    specials = ["<unk>", "<s>", "</s>"]
    trained = SentencePieceBPETokenizer(unk_token="<unk>", fuse_unk=True)
    trained.train_from_iterator(corpus, vocab_size=vocab_size, special_tokens=specials,
                                show_progress=False)  # fmt: skip
    vocab = json.loads(trained.to_str())["model"]["vocab"]
    pieces = [p for p, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if p not in specials]
    tokens = [*specials, *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))  # unknown, control, byte
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
